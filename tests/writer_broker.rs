//! Real-broker tests of the `Writer` sink against tansu: bulk delivery with per-key order,
//! linger, codecs, per-message topics and per-message failures. Messages are read back
//! with the low-level `Conn::fetch`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::{stream, SinkExt, StreamExt};
use kafkapipe::compression::Compression;
use kafkapipe::conn::{Conn, FetchOptions};
use kafkapipe::protocol::ErrorCode;
use kafkapipe::record::Record;
use kafkapipe::writer::{Hash, Message, Writer, WriterConfig};
use kafkapipe::ErrorKind;

async fn admin() -> Conn {
    Conn::connect(&common::shared().addr).await.unwrap()
}

async fn new_topic(prefix: &str, partitions: i32) -> String {
    let topic = common::unique_topic(prefix);
    admin()
        .await
        .create_topic(&topic, partitions, 1)
        .await
        .unwrap();
    topic
}

fn config(topic: &str) -> WriterConfig {
    WriterConfig::new([common::shared().addr.clone()]).topic(topic)
}

fn fetch_opts() -> FetchOptions {
    FetchOptions {
        max_bytes: 8 << 20,
        max_wait: Duration::from_millis(10),
        ..FetchOptions::default()
    }
}

/// The partition's high-water mark as reported by Fetch. (tansu 0.6 answers ListOffsets
/// "latest" with one past the *base* offset of the last batch, so `Conn::last_offset`
/// undercounts multi-record batches there.)
async fn high_watermark(conn: &Conn, topic: &str, partition: i32) -> i64 {
    let end = conn.last_offset(topic, partition).await.unwrap();
    let f = conn
        .fetch(topic, partition, (end - 1).max(0), &fetch_opts())
        .await
        .unwrap();
    f.high_watermark.max(f.next_offset).max(end)
}

/// Everything in `topic`/`partition` up to its high-water mark.
async fn read_partition(conn: &Conn, topic: &str, partition: i32) -> Vec<Record> {
    let end = high_watermark(conn, topic, partition).await;
    let mut out = Vec::new();
    let mut offset = 0;
    while offset < end {
        let f = conn
            .fetch(topic, partition, offset, &fetch_opts())
            .await
            .unwrap();
        assert!(f.next_offset > offset, "no progress at {offset}");
        offset = f.next_offset;
        out.extend(f.records);
    }
    out
}

#[tokio::test]
async fn write_messages_round_trip() {
    let topic = new_topic("writer-basic", 1).await;
    let writer = Writer::new(config(&topic)).unwrap();
    writer
        .write_messages([
            Message::keyed("k1", "v1").with_header("h", "x"),
            Message::new("v2").with_timestamp(1_700_000_000_000),
        ])
        .await
        .unwrap();
    let got = read_partition(&admin().await, &topic, 0).await;
    assert_eq!(got.len(), 2);
    assert_eq!(got[0].key.as_deref(), Some(&b"k1"[..]));
    assert_eq!(got[0].value.as_deref(), Some(&b"v1"[..]));
    assert_eq!(got[0].headers[0].key, "h");
    assert_eq!(got[1].key, None);
    assert_eq!(got[1].timestamp, 1_700_000_000_000);
    let s = writer.stats();
    assert_eq!((s.messages, s.errors, s.buffered_bytes), (2, 0, 0), "{s:?}");
}

#[tokio::test]
async fn forward_200k_keyed_messages_over_8_partitions() {
    const N: usize = 200_000;
    const KEYS: usize = 1000;
    let topic = new_topic("writer-bulk", 8).await;
    let mut writer = Writer::new(
        config(&topic)
            .balancer(Hash::default())
            .batch_size(1000)
            .max_buffered_bytes(4 << 20),
    )
    .unwrap();
    let started = Instant::now();
    let msgs = (0..N).map(|i| {
        Ok(Message::keyed(
            format!("key-{}", i % KEYS),
            format!("{}", i / KEYS),
        ))
    });
    stream::iter(msgs).forward(&mut writer).await.unwrap();
    writer.close().await.unwrap();
    let elapsed = started.elapsed();
    let stats = writer.stats();
    eprintln!(
        "wrote {N} messages in {elapsed:?} ({:.0} msg/s): {stats:?}",
        N as f64 / elapsed.as_secs_f64()
    );
    assert_eq!(stats.messages, N as u64);
    assert_eq!(stats.errors, 0);
    assert_eq!(stats.buffered_bytes, 0);

    let conn = admin().await;
    let mut total = 0;
    let mut key_partition: HashMap<Bytes, i32> = HashMap::new();
    for p in 0..8 {
        let records = read_partition(&conn, &topic, p).await;
        total += records.len();
        let mut next_seq: HashMap<Bytes, u64> = HashMap::new();
        for r in records {
            let key = r.key.clone().unwrap();
            let seq: u64 = std::str::from_utf8(r.value.as_deref().unwrap())
                .unwrap()
                .parse()
                .unwrap();
            let prev = key_partition.insert(key.clone(), p);
            assert!(
                prev.is_none() || prev == Some(p),
                "key {key:?} in two partitions"
            );
            let want = next_seq.entry(key.clone()).or_default();
            assert_eq!(
                seq, *want,
                "key {key:?} out of order or duplicated in partition {p}"
            );
            *want += 1;
        }
        for (key, n) in next_seq {
            assert_eq!(n as usize, N / KEYS, "key {key:?} incomplete");
        }
    }
    assert_eq!(total, N);
    assert_eq!(key_partition.len(), KEYS);
    let used: std::collections::HashSet<i32> = key_partition.values().copied().collect();
    assert_eq!(used.len(), 8, "keys spread over every partition");
}

#[tokio::test]
async fn linger_sends_a_lone_message() {
    let topic = new_topic("writer-linger", 1).await;
    let linger = Duration::from_millis(200);
    let mut writer = Writer::new(config(&topic).batch_timeout(linger)).unwrap();
    // Warm up metadata and the connection so only the linger is measured.
    writer.write_messages([Message::new("warm")]).await.unwrap();

    let started = Instant::now();
    writer.feed(Message::new("lone")).await.unwrap();
    let conn = admin().await;
    loop {
        if high_watermark(&conn, &topic, 0).await == 2 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "lone message never sent"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let took = started.elapsed();
    assert!(took >= linger, "sent after {took:?}, before the linger");
    assert!(
        took < linger + Duration::from_secs(1),
        "sent only after {took:?}"
    );

    // A full batch does not wait for the linger.
    let mut writer = Writer::new(
        config(&topic)
            .batch_timeout(Duration::from_secs(60))
            .batch_size(10),
    )
    .unwrap();
    let started = Instant::now();
    for i in 0..10 {
        writer
            .feed(Message::new(format!("full-{i}")))
            .await
            .unwrap();
    }
    loop {
        if high_watermark(&conn, &topic, 0).await >= 12 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "full batch waited for the linger"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn every_codec_end_to_end() {
    let topic = new_topic("writer-codecs", Compression::ALL.len() as i32).await;
    for (p, codec) in Compression::ALL.iter().enumerate() {
        let mut writer = Writer::new(config(&topic).compression(*codec)).unwrap();
        let msgs: Vec<Message> = (0..500)
            .map(|i| {
                Message::keyed(format!("k{i}"), format!("{codec:?}-value-{i}-").repeat(5))
                    .with_partition(p as i32)
            })
            .collect();
        stream::iter(msgs.clone().into_iter().map(Ok))
            .forward(&mut writer)
            .await
            .unwrap();
        writer.close().await.unwrap();
        let got = read_partition(&admin().await, &topic, p as i32).await;
        assert_eq!(got.len(), msgs.len(), "{codec:?}");
        for (g, m) in got.iter().zip(&msgs) {
            assert_eq!(g.key, m.key, "{codec:?}");
            assert_eq!(g.value, m.value, "{codec:?}");
        }
    }
}

#[tokio::test]
async fn oversize_message_fails_alone() {
    let topic = new_topic("writer-oversize", 1).await;
    let writer = Writer::new(config(&topic).batch_bytes(1024)).unwrap();
    let err = writer
        .write_messages([
            Message::new("small-1"),
            Message::new(vec![b'x'; 4096]),
            Message::new("small-2"),
        ])
        .await
        .unwrap_err();
    assert_eq!(err.kafka_code(), Some(ErrorCode::MessageTooLarge), "{err}");
    assert_eq!(err.topic(), Some(topic.as_str()));
    assert_eq!(err.partition(), Some(0));
    assert!(err.to_string().contains("batch_bytes"), "{err}");
    let got = read_partition(&admin().await, &topic, 0).await;
    let values: Vec<_> = got.iter().map(|r| r.value.clone().unwrap()).collect();
    assert_eq!(values, [Bytes::from("small-1"), Bytes::from("small-2")]);
    let s = writer.stats();
    assert_eq!((s.messages, s.errors), (2, 1), "{s:?}");
}

#[tokio::test]
async fn per_message_topics_and_missing_topic() {
    let a = new_topic("writer-multi-a", 2).await;
    let b = new_topic("writer-multi-b", 3).await;
    let mut writer = Writer::new(WriterConfig::new([common::shared().addr.clone()])).unwrap();
    for i in 0..30 {
        let t = if i % 2 == 0 { &a } else { &b };
        writer
            .feed(Message::new(format!("v{i}")).with_topic(t.clone()))
            .await
            .unwrap();
    }
    writer.flush().await.unwrap();
    let conn = admin().await;
    let mut counts = (0, 0);
    for p in 0..2 {
        counts.0 += read_partition(&conn, &a, p).await.len();
    }
    for p in 0..3 {
        counts.1 += read_partition(&conn, &b, p).await.len();
    }
    assert_eq!(counts, (15, 15));

    writer.feed(Message::new("nowhere")).await.unwrap();
    let err = writer.flush().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Config, "{err}");
    writer.close().await.unwrap();
    let err = writer.feed(Message::new("late")).await.unwrap_err();
    assert!(err.is_closed(), "{err}");
}

#[tokio::test]
async fn unknown_topic_and_partition_fail_with_clear_errors() {
    let topic = new_topic("writer-unknown", 2).await;
    let writer = Writer::new(
        config(&topic)
            .max_attempts(3)
            .backoff(Duration::from_millis(10), Duration::from_millis(50)),
    )
    .unwrap();
    let err = writer
        .write_messages([Message::new("v").with_partition(5)])
        .await
        .unwrap_err();
    assert_eq!(
        err.kafka_code(),
        Some(ErrorCode::UnknownTopicOrPartition),
        "{err}"
    );
    assert_eq!(err.partition(), Some(5));

    let missing = common::unique_topic("writer-missing");
    let started = Instant::now();
    let err = writer
        .write_messages([Message::new("v").with_topic(missing.clone())])
        .await
        .unwrap_err();
    assert_eq!(
        err.kafka_code(),
        Some(ErrorCode::UnknownTopicOrPartition),
        "{err}"
    );
    assert_eq!(err.topic(), Some(missing.as_str()));
    assert!(started.elapsed() < Duration::from_secs(5));
    // The writer still works for other messages.
    writer.write_messages([Message::new("ok")]).await.unwrap();
}
