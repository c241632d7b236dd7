//! Feature `metrics` against Apache Kafka: the Prometheus endpoint of
//! `examples/metrics_prometheus.rs` is scraped over HTTP during a run, its exposition text
//! parsed, and the numbers checked against what moved: the producer's send counter, the
//! per-partition lag gauge (the whole backlog while the application has read nothing, 0
//! once it has read everything) and the consumer's record counter. Then the producer's
//! per-topic counters and queue time against what a writer did on two topics, and a
//! KIP-848 member's rebalance count and latency against the rebalance a second member
//! caused.
//!
//! One recorder serves the whole process (a recorder is installed once); each test
//! tells its clients apart by `client_id`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

#[path = "../examples/metrics_prometheus.rs"]
#[allow(dead_code)]
mod example;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use futures::{SinkExt, TryStreamExt};
use kafkapipe::compression::Compression;
use kafkapipe::group::GroupProtocol;
use kafkapipe::reader::{Reader, ReaderConfig, TopicPartition};
use kafkapipe::writer::{Message, Writer, WriterConfig};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// One sample of the exposition text: name, labels, value.
#[derive(Debug)]
struct Sample {
    name: String,
    labels: HashMap<String, String>,
    value: f64,
}

/// Parse Prometheus text exposition format 0.0.4 (the subset the exporter writes:
/// `name{k="v",...} value` lines, `#` comments).
fn parse(text: &str) -> Vec<Sample> {
    let mut out = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (series, value) = line.rsplit_once(' ').unwrap();
        let value: f64 = value
            .parse()
            .unwrap_or_else(|_| panic!("value of {line:?}"));
        let (name, labels) = match series.split_once('{') {
            None => (series.to_string(), HashMap::new()),
            Some((name, rest)) => {
                let body = rest.strip_suffix('}').unwrap();
                let labels = body
                    .split("\",")
                    .filter(|kv| !kv.is_empty())
                    .map(|kv| {
                        let (k, v) = kv.split_once("=\"").unwrap();
                        (k.to_string(), v.trim_end_matches('"').to_string())
                    })
                    .collect();
                (name.to_string(), labels)
            }
        };
        out.push(Sample {
            name,
            labels,
            value,
        });
    }
    out
}

/// GET /metrics over HTTP/1.1, parsed.
async fn scrape(addr: std::net::SocketAddr) -> Vec<Sample> {
    let mut sock = TcpStream::connect(addr).await.unwrap();
    sock.write_all(b"GET /metrics HTTP/1.1\r\nhost: test\r\n\r\n")
        .await
        .unwrap();
    let mut resp = String::new();
    sock.read_to_string(&mut resp).await.unwrap();
    let (head, body) = resp.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    parse(body)
}

/// The samples named `name` of client `client`.
fn of<'a>(samples: &'a [Sample], name: &str, client: &str) -> Vec<&'a Sample> {
    samples
        .iter()
        .filter(|s| s.name == name && s.labels.get("client_id").map(String::as_str) == Some(client))
        .collect()
}

fn value(samples: &[Sample], name: &str, client: &str) -> Option<f64> {
    of(samples, name, client).first().map(|s| s.value)
}

/// The process's recorder, installed by the first test that asks.
fn recorder() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| PrometheusBuilder::new().install_recorder().unwrap())
        .clone()
}

/// The samples named `name` of client `client` and topic `topic`.
fn topic_value(samples: &[Sample], name: &str, client: &str, topic: &str) -> Option<f64> {
    of(samples, name, client)
        .into_iter()
        .find(|s| s.labels.get("topic").map(String::as_str) == Some(topic))
        .map(|s| s.value)
}

/// Render the recorder's exposition text until `ok` holds (or 30 s passed: then fail,
/// showing the last rendering's samples of `client`).
async fn render_until(
    handle: &PrometheusHandle,
    client: &str,
    what: &str,
    ok: impl Fn(&[Sample]) -> bool,
) -> Vec<Sample> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let samples = parse(&handle.render());
        if ok(&samples) {
            return samples;
        }
        if Instant::now() > deadline {
            let mine: Vec<_> = samples
                .iter()
                .filter(|s| s.labels.get("client_id").map(String::as_str) == Some(client))
                .collect();
            panic!("{what}: not seen within 30 s; last rendering: {mine:#?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Scrape until `ok` holds (or 30 s passed: then fail, showing the last scrape).
async fn scrape_until(
    addr: std::net::SocketAddr,
    what: &str,
    ok: impl Fn(&[Sample]) -> bool,
) -> Vec<Sample> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let samples = scrape(addr).await;
        if ok(&samples) {
            return samples;
        }
        if Instant::now() > deadline {
            let kafka: Vec<_> = samples
                .iter()
                .filter(|s| s.name.starts_with("kafka_"))
                .collect();
            panic!("{what}: not seen within 30 s; last scrape: {kafka:#?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scraped_metrics_match_what_moved_and_lag_goes_to_zero() {
    const N: usize = 300;
    let broker = &common::shared().addr;
    let topic = format!("metrics-scrape-{}", std::process::id());
    common::create_topic(broker, &topic, 2, 1);

    let handle = recorder();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(example::serve_metrics(listener, handle));

    // produce N: the send counter says N once the writer is closed
    let mut writer = Writer::new(
        WriterConfig::new([broker.clone()])
            .topic(&topic)
            .client_id("mt-writer")
            .metrics_interval(Duration::from_millis(100)),
    )
    .unwrap();
    let msgs: Vec<Message> = (0..N).map(|i| Message::new(format!("m{i}"))).collect();
    writer.write_messages(msgs).await.unwrap();
    writer.close().await.unwrap();
    let s = scrape_until(addr, "producer counters after close", |s| {
        value(s, "kafka_producer_record_send_total", "mt-writer") == Some(N as f64)
    })
    .await;
    assert_eq!(
        value(&s, "kafka_producer_record_error_total", "mt-writer"),
        Some(0.0)
    );
    let requests = value(&s, "kafka_producer_request_total", "mt-writer").unwrap();
    assert!(requests >= 1.0, "{requests}");
    assert!(value(&s, "kafka_producer_batch_size_avg", "mt-writer").unwrap() > 0.0);
    let available = value(&s, "kafka_producer_buffer_available_bytes", "mt-writer").unwrap();
    let total = value(&s, "kafka_producer_buffer_total_bytes", "mt-writer").unwrap();
    assert_eq!(available, total, "nothing buffered after the close");

    // a group reader prefetches; the application has read nothing: lag is the backlog
    let mut reader = Reader::new(
        ReaderConfig::new([broker.clone()])
            .group_id(format!("{topic}-g"))
            .topic(&topic)
            .client_id("mt-reader")
            .metrics_interval(Duration::from_millis(100)),
    )
    .await
    .unwrap();
    let lag_sum = |s: &[Sample]| -> (usize, f64) {
        let lags = of(s, "kafka_consumer_records_lag", "mt-reader");
        (lags.len(), lags.iter().map(|l| l.value).sum())
    };
    let s = scrape_until(addr, "the whole backlog as lag", |s| {
        lag_sum(s) == (2, N as f64)
    })
    .await;
    let lags = of(&s, "kafka_consumer_records_lag", "mt-reader");
    let mut partitions: Vec<&str> = lags
        .iter()
        .map(|l| l.labels["partition"].as_str())
        .collect();
    partitions.sort();
    assert_eq!(partitions, ["0", "1"]);
    assert!(lags.iter().all(|l| l.labels["topic"] == topic));
    let max = value(&s, "kafka_consumer_records_lag_max", "mt-reader").unwrap();
    assert_eq!(max, lags.iter().map(|l| l.value).fold(0.0, f64::max));
    assert_eq!(
        value(&s, "kafka_consumer_assigned_partitions", "mt-reader"),
        Some(2.0)
    );
    let excerpt: Vec<String> = s
        .iter()
        .filter(|x| {
            x.name.starts_with("kafka_consumer_records")
                || x.name == "kafka_producer_record_send_total"
        })
        .map(|x| format!("{} {:?} {}", x.name, x.labels, x.value))
        .collect();
    eprintln!("scrape during the run:\n{}", excerpt.join("\n"));

    // read everything: lag goes to 0 and the consumed counter says N
    let mut read = 0;
    while read < N {
        let m = tokio::time::timeout(Duration::from_secs(30), reader.try_next())
            .await
            .expect("a message within 30 s")
            .unwrap();
        if m.is_some() {
            read += 1;
        }
    }
    let s = scrape_until(addr, "lag 0 after reading everything", |s| {
        lag_sum(s) == (2, 0.0)
            && value(s, "kafka_consumer_records_consumed_total", "mt-reader") == Some(N as f64)
    })
    .await;
    assert_eq!(
        value(&s, "kafka_consumer_records_lag_max", "mt-reader"),
        Some(0.0)
    );
    assert!(value(&s, "kafka_consumer_fetch_total", "mt-reader").unwrap() >= 1.0);
    assert!(value(&s, "kafka_consumer_rebalance_total", "mt-reader").unwrap() >= 1.0);
    assert!(value(&s, "kafka_consumer_group_generation", "mt-reader").unwrap() >= 1.0);
    let connected: f64 = of(&s, "kafka_consumer_connection_count", "mt-reader")
        .iter()
        .map(|c| c.value)
        .sum();
    assert!(connected >= 1.0, "{connected}");
    reader.close().await;
}

/// The producer-topic metrics count each topic's records, bytes and failures as the
/// writer did (their sums are the client-wide counters), the compression rate is the
/// topic's, and a batch that lingered shows its wait in the queue time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_topic_counters_and_queue_time_match_what_the_writer_did() {
    const CLIENT: &str = "mt-topics";
    let (to_a, to_b) = (30usize, 70usize);
    let handle = recorder();
    let broker = &common::shared().addr;
    let a = format!("metrics-topic-a-{}", std::process::id());
    let b = format!("metrics-topic-b-{}", std::process::id());
    common::create_topic(broker, &a, 1, 1);
    common::create_topic(broker, &b, 1, 1);

    let linger = Duration::from_millis(200);
    let mut writer = Writer::new(
        WriterConfig::new([broker.clone()])
            .client_id(CLIENT)
            .batch_timeout(linger)
            .compression(Compression::Lz4)
            .metrics_interval(Duration::from_millis(100)),
    )
    .unwrap();
    // `produce` does not flush: every batch waits out the linger. Topic a gets varied
    // values, topic b runs of one byte (which LZ4 shrinks to almost nothing).
    let sends = (0..to_a + to_b).map(|i| {
        let msg = if i < to_a {
            Message::new(format!("a-{i}-{}", i * 7919)).with_topic(&a)
        } else {
            Message::new(vec![b'x'; 1000]).with_topic(&b)
        };
        writer.produce(msg)
    });
    futures::future::try_join_all(sends).await.unwrap();
    // one message too large for a batch fails for good, counted against topic a
    let too_large = Message::new(vec![0u8; 2 << 20]).with_topic(&a);
    assert!(writer.produce(too_large).await.is_err());
    let stats = writer.stats();
    assert!(
        stats.queue_time_max >= linger,
        "WriterStats::queue_time_max {:?} < linger {linger:?}",
        stats.queue_time_max
    );
    writer.close().await.unwrap();

    let s = render_until(&handle, CLIENT, "per-topic send totals after close", |s| {
        topic_value(s, "kafka_producer_topic_record_send_total", CLIENT, &a) == Some(to_a as f64)
            && topic_value(s, "kafka_producer_topic_record_send_total", CLIENT, &b)
                == Some(to_b as f64)
            && topic_value(s, "kafka_producer_topic_record_error_total", CLIENT, &a) == Some(1.0)
    })
    .await;
    let topic = |name: &str, t: &str| topic_value(&s, name, CLIENT, t).unwrap();
    let client = |name: &str| value(&s, name, CLIENT).unwrap();
    assert_eq!(topic("kafka_producer_topic_record_error_total", &b), 0.0);
    assert_eq!(
        topic("kafka_producer_topic_record_send_total", &a)
            + topic("kafka_producer_topic_record_send_total", &b),
        client("kafka_producer_record_send_total")
    );
    assert_eq!(client("kafka_producer_record_error_total"), 1.0);
    let (bytes_a, bytes_b) = (
        topic("kafka_producer_topic_byte_total", &a),
        topic("kafka_producer_topic_byte_total", &b),
    );
    assert!(bytes_b >= (to_b * 1000) as f64, "{bytes_b}");
    assert_eq!(bytes_a + bytes_b, client("kafka_producer_byte_total"));
    let (rate_a, rate_b) = (
        topic("kafka_producer_topic_compression_rate", &a),
        topic("kafka_producer_topic_compression_rate", &b),
    );
    assert!(
        rate_b > 0.0 && rate_b < 0.2,
        "compression rate of b: {rate_b}"
    );
    assert!(rate_a > rate_b, "compression rates: a {rate_a}, b {rate_b}");
    // every batch lingered: the longest and the mean wait are at least the linger
    let linger_ms = linger.as_millis() as f64;
    let max = client("kafka_producer_record_queue_time_max");
    let avg = client("kafka_producer_record_queue_time_avg");
    assert!(
        max >= linger_ms && avg >= linger_ms && avg <= max,
        "avg {avg}, max {max}"
    );
    assert!(
        (max - stats.queue_time_max.as_secs_f64() * 1000.0).abs() < 1.0,
        "the gauge {max} ms is WriterStats::queue_time_max {:?}",
        stats.queue_time_max
    );
}

/// A KIP-848 member times its reconciliations as rebalances: its join, then the
/// revocation a second member causes, which takes at least the revoke hook's sleep.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kip848_rebalances_are_counted_and_timed() {
    if common::kafka::skip_before((4, 0), "kip848_rebalances_are_counted_and_timed") {
        return;
    }
    const CLIENT: &str = "mt-848";
    let handle = recorder();
    let broker = &common::shared().addr;
    let topic = format!("metrics-848-{}", std::process::id());
    common::create_topic(broker, &topic, 2, 1);
    let config = |client: &str| {
        ReaderConfig::new([broker.clone()])
            .group_id(format!("{topic}-g"))
            .topic(&topic)
            .group_protocol(GroupProtocol::Consumer)
            .client_id(client)
            .metrics_interval(Duration::from_millis(100))
    };
    let hook = Duration::from_millis(500);
    let revocations = Arc::new(AtomicUsize::new(0));
    let counted = revocations.clone();
    let mut first = Reader::new(config(CLIENT).on_revoke(move |_: Vec<TopicPartition>| {
        let counted = counted.clone();
        async move {
            tokio::time::sleep(hook).await;
            counted.fetch_add(1, Ordering::SeqCst);
        }
    }))
    .await
    .unwrap();
    let s = render_until(&handle, CLIENT, "the join timed", |s| {
        value(s, "kafka_consumer_assigned_partitions", CLIENT) == Some(2.0)
            && value(s, "kafka_consumer_rebalance_total", CLIENT).is_some_and(|n| n >= 1.0)
    })
    .await;
    let joins = value(&s, "kafka_consumer_rebalance_total", CLIENT).unwrap();
    let total = value(&s, "kafka_consumer_rebalance_latency_total", CLIENT).unwrap();
    let max = value(&s, "kafka_consumer_rebalance_latency_max", CLIENT).unwrap();
    assert!(max > 0.0, "the join's reconciliation took {max} ms");
    assert!(
        value(&s, "kafka_consumer_rebalance_latency_avg", CLIENT).unwrap() > 0.0,
        "{s:?}"
    );
    assert_eq!(revocations.load(Ordering::SeqCst), 0);

    let mut second = Reader::new(config("mt-848-second")).await.unwrap();
    let s = render_until(&handle, CLIENT, "the revocation timed", |s| {
        value(s, "kafka_consumer_assigned_partitions", CLIENT) == Some(1.0)
            && value(s, "kafka_consumer_rebalance_total", CLIENT) == Some(joins + 1.0)
    })
    .await;
    assert_eq!(revocations.load(Ordering::SeqCst), 1);
    let hook_ms = hook.as_millis() as f64;
    let max = value(&s, "kafka_consumer_rebalance_latency_max", CLIENT).unwrap();
    assert!(
        max >= hook_ms,
        "the revocation took {max} ms, its hook {hook_ms} ms"
    );
    let grown = value(&s, "kafka_consumer_rebalance_latency_total", CLIENT).unwrap() - total;
    assert!(grown >= hook_ms - 1.0, "latency total grew by {grown} ms");
    second.close().await;
    first.close().await;
}
