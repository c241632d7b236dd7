//! Feature `metrics` against Apache Kafka: the Prometheus endpoint of
//! `examples/metrics_prometheus.rs` is scraped over HTTP during a run, its exposition text
//! parsed, and the numbers checked against what moved: the producer's send counter, the
//! per-partition lag gauge (the whole backlog while the application has read nothing, 0
//! once it has read everything) and the consumer's record counter.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

#[path = "../examples/metrics_prometheus.rs"]
#[allow(dead_code)]
mod example;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use futures::{SinkExt, TryStreamExt};
use kafkapipe::reader::{Reader, ReaderConfig};
use kafkapipe::writer::{Message, Writer, WriterConfig};
use metrics_exporter_prometheus::PrometheusBuilder;
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

    let handle = PrometheusBuilder::new().install_recorder().unwrap();
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
