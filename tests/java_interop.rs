//! Interop with the Java client (`kafka-clients`, the reference implementation) on Apache
//! Kafka, with every codec, both ways: records written by kafkapipe's `Writer` are read by
//! a Java `KafkaConsumer`, and records written by an idempotent Java `KafkaProducer` are
//! read by kafkapipe's `Reader`. Records are compared by content (key, value, headers) and
//! per-partition order.
//!
//! The Java side is `tests/interop/JavaInterop.java`, run in source-file mode with the test
//! broker's jars on the class path (one JVM per direction, serving every codec's topic).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use kafkapipe::compression::Compression;
use kafkapipe::conn::RequiredAcks;
use kafkapipe::reader::{Reader, ReaderConfig, StartOffset};
use kafkapipe::writer::{Message, Writer, WriterConfig};

const COUNT: usize = 2000;
const PARTITIONS: i32 = 3;

const CODECS: [(Compression, &str); 5] = [
    (Compression::None, "none"),
    (Compression::Gzip, "gzip"),
    (Compression::Snappy, "snappy"),
    (Compression::Lz4, "lz4"),
    (Compression::Zstd, "zstd"),
];

/// Runs `JavaInterop.java` with `args`; returns stdout, panicking with stderr on failure.
fn java(args: &[&str]) -> String {
    let libs = common::kafka::kafka_libs();
    let out = Command::new("java")
        .arg("-cp")
        .arg(format!("{}/*", libs.display()))
        .arg("-Dorg.slf4j.simpleLogger.defaultLogLevel=warn")
        .arg("-Dlog4j2.level=warn")
        .arg(format!(
            "{}/tests/interop/JavaInterop.java",
            env!("CARGO_MANIFEST_DIR")
        ))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run java");
    assert!(
        out.status.success(),
        "java {args:?} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8 output")
}

/// One consumed record: (partition, offset, key, value, headers).
type Row = (i32, i64, String, String, String);

/// The Java consumer's lines, by topic.
fn parse_rows(text: &str) -> BTreeMap<String, Vec<Row>> {
    let mut by_topic: BTreeMap<String, Vec<Row>> = BTreeMap::new();
    for l in text.lines().filter(|l| l.contains('\t')) {
        let f: Vec<&str> = l.split('\t').collect();
        assert_eq!(f.len(), 6, "bad line {l:?}");
        by_topic.entry(f[0].to_string()).or_default().push((
            f[1].parse().unwrap(),
            f[2].parse().unwrap(),
            f[3].to_string(),
            f[4].to_string(),
            f[5].to_string(),
        ));
    }
    by_topic
}

/// Every index 0..COUNT exactly once, and within each partition increasing indexes at
/// increasing offsets (the order the producer sent them in).
fn check_exactly_once_in_order(label: &str, rows: &[(i32, i64, usize)]) {
    let mut seen = vec![0u32; COUNT];
    let mut by_partition: BTreeMap<i32, Vec<(i64, usize)>> = BTreeMap::new();
    for &(p, off, i) in rows {
        seen[i] += 1;
        by_partition.entry(p).or_default().push((off, i));
    }
    let lost = seen.iter().filter(|&&n| n == 0).count();
    let dup = seen.iter().filter(|&&n| n > 1).count();
    assert_eq!(
        (lost, dup),
        (0, 0),
        "{label}: lost {lost}, duplicated {dup}"
    );
    for (p, mut recs) in by_partition {
        recs.sort();
        assert!(
            recs.windows(2).all(|w| w[0].1 < w[1].1),
            "{label}: partition {p} out of order"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn java_consumer_reads_what_our_writer_produces_with_every_codec() {
    let broker = common::shared();
    let mut topics = Vec::new();
    for (codec, name) in CODECS {
        let topic = common::unique_topic(&format!("java-in-{name}"));
        broker.create_topic(&topic, PARTITIONS);
        let mut writer = Writer::new(
            WriterConfig::new([broker.addr.clone()])
                .topic(&topic)
                .compression(codec)
                .required_acks(RequiredAcks::All)
                .batch_size(100),
        )
        .unwrap();
        for i in 0..COUNT {
            let m = Message::keyed(format!("k{i}"), format!("rust-{name}-{i}"))
                .with_header("i", i.to_string());
            writer.feed(m).await.unwrap();
        }
        writer.close().await.unwrap();
        topics.push((topic, name));
    }

    let out = tokio::task::spawn_blocking({
        let mut args = vec![
            "consume".to_string(),
            broker.addr.clone(),
            COUNT.to_string(),
            "60000".to_string(),
        ];
        args.extend(topics.iter().map(|(t, _)| t.clone()));
        move || java(&args.iter().map(String::as_str).collect::<Vec<_>>())
    })
    .await
    .unwrap();
    let mut by_topic = parse_rows(&out);
    for (topic, name) in topics {
        let rows = by_topic.remove(&topic).unwrap_or_default();
        assert_eq!(
            rows.len(),
            COUNT,
            "{name}: java consumed {} records",
            rows.len()
        );
        let mut checked = Vec::new();
        for (p, off, key, value, headers) in rows {
            let i: usize = key.strip_prefix('k').unwrap().parse().unwrap();
            assert_eq!(value, format!("rust-{name}-{i}"), "{name}");
            assert_eq!(headers, format!("i={i}"), "{name}");
            checked.push((p, off, i));
        }
        check_exactly_once_in_order(name, &checked);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_reader_reads_what_the_java_producer_produces_with_every_codec() {
    let broker = common::shared();
    let topics: Vec<(String, &str)> = CODECS
        .iter()
        .map(|(_, name)| (common::unique_topic(&format!("java-out-{name}")), *name))
        .collect();
    for (topic, _) in &topics {
        broker.create_topic(topic, PARTITIONS);
    }
    let out = tokio::task::spawn_blocking({
        let mut args = vec![
            "produce".to_string(),
            broker.addr.clone(),
            COUNT.to_string(),
        ];
        args.extend(topics.iter().map(|(t, name)| format!("{t}={name}")));
        move || java(&args.iter().map(String::as_str).collect::<Vec<_>>())
    })
    .await
    .unwrap();
    for (topic, name) in topics {
        assert!(
            out.contains(&format!("produced {COUNT} {topic}")),
            "{name}: {out}"
        );
        let mut reader = Reader::new(
            ReaderConfig::new([broker.addr.clone()])
                .partitions(&topic, 0..PARTITIONS)
                .start_offset(StartOffset::First)
                .max_wait(Duration::from_millis(100)),
        )
        .await
        .unwrap();
        let mut checked = Vec::new();
        while checked.len() < COUNT {
            let m = tokio::time::timeout(Duration::from_secs(30), reader.next())
                .await
                .unwrap_or_else(|_| panic!("{name}: stalled after {} records", checked.len()))
                .expect("stream ended")
                .unwrap();
            let key = String::from_utf8(m.key.unwrap().to_vec()).unwrap();
            let i: usize = key.strip_prefix('k').unwrap().parse().unwrap();
            assert_eq!(
                m.value.as_deref(),
                Some(format!("java-{name}-{i}").as_bytes()),
                "{name}"
            );
            assert_eq!(m.headers.len(), 1, "{name}");
            assert_eq!(m.headers[0].key, "i");
            assert_eq!(
                m.headers[0].value.as_deref(),
                Some(i.to_string().as_bytes())
            );
            checked.push((m.partition, m.offset, i));
        }
        reader.close().await;
        check_exactly_once_in_order(name, &checked);
    }
}
