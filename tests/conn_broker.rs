//! Real-broker tests of the low-level `Conn` API against Apache Kafka, plus interop with
//! librdkafka (the confluent-kafka Python wheel) in both directions.
//!
//! `Conn` sends one request per call and does not retry, so after creating a topic the
//! tests wait until the broker serves it ([`create`]): Kafka creates topics through the
//! controller and the broker's metadata catches up asynchronously.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use bytes::Bytes;
use kafkapipe::compression::Compression;
use kafkapipe::conn::{Conn, FetchOptions, ProduceOptions, RequiredAcks};
use kafkapipe::protocol::messages::{
    ApiVersionsRequest, CreateTopicsRequest, DeleteTopicsRequest, FetchRequest, ListOffsetsRequest,
    MetadataRequest, ProduceRequest,
};
use kafkapipe::protocol::{Decode, ErrorCode, Request};
use kafkapipe::record::{Header, Record};

const CODECS: [Compression; 5] = [
    Compression::None,
    Compression::Gzip,
    Compression::Snappy,
    Compression::Lz4,
    Compression::Zstd,
];

async fn conn() -> Conn {
    Conn::connect(&common::shared().addr)
        .await
        .expect("connect")
}

/// Creates `topic` through `conn` and waits until every partition is served.
async fn create(conn: &Conn, topic: &str, partitions: i32) {
    conn.create_topic(topic, partitions, 1)
        .await
        .expect("create");
    common::wait_for_topic(conn, topic, partitions).await;
}

fn sample_records(n: usize, tag: &str) -> Vec<Record> {
    let base_ts = 1_700_000_000_000i64;
    (0..n)
        .map(|i| Record {
            offset: 0,
            timestamp: base_ts + i as i64 * 7,
            key: if i % 5 == 4 {
                None
            } else {
                Some(Bytes::from(format!("{tag}-key-{i}")))
            },
            value: if i % 7 == 6 {
                None
            } else {
                Some(Bytes::from(format!("{tag}-value-{i}-").repeat(i % 13 + 1)))
            },
            headers: (0..i % 3)
                .map(|h| Header {
                    key: format!("h{h}"),
                    value: if h == 1 {
                        None
                    } else {
                        Some(Bytes::from(vec![h as u8, 0, 255, i as u8]))
                    },
                })
                .collect(),
        })
        .collect()
}

async fn fetch_all(conn: &Conn, topic: &str, partition: i32, from: i64, until: i64) -> Vec<Record> {
    let mut out = Vec::new();
    let mut offset = from;
    while offset < until {
        let f = conn
            .fetch(topic, partition, offset, &FetchOptions::default())
            .await
            .expect("fetch");
        assert!(
            f.next_offset > offset || !f.records.is_empty(),
            "fetch made no progress at {offset}"
        );
        offset = f.next_offset;
        out.extend(f.records);
    }
    out
}

#[tokio::test]
async fn negotiates_versions_within_both_ranges() {
    let conn = conn().await;
    let c = conn.connection();
    let broker = c.api_versions().expect("handshake done");
    fn check<R: Request>(
        c: &kafkapipe::conn::Connection,
        broker: &kafkapipe::protocol::messages::ApiVersionsResponse,
    ) -> i16 {
        let v = c.version_for::<R>().expect("a shared version");
        let (bmin, bmax) = broker.range(R::API_KEY).expect("broker supports the api");
        assert!(
            v >= R::MIN_VERSION && v <= R::MAX_VERSION,
            "{} v{v}",
            R::API_KEY
        );
        assert!(
            v >= bmin && v <= bmax,
            "{} v{v} outside broker {bmin}..={bmax}",
            R::API_KEY
        );
        assert_eq!(
            v,
            R::MAX_VERSION.min(bmax),
            "{} must use the highest shared version",
            R::API_KEY
        );
        v
    }
    let versions = [
        ("ApiVersions", check::<ApiVersionsRequest>(c, broker)),
        ("Metadata", check::<MetadataRequest>(c, broker)),
        ("Produce", check::<ProduceRequest>(c, broker)),
        ("Fetch", check::<FetchRequest>(c, broker)),
        ("ListOffsets", check::<ListOffsetsRequest>(c, broker)),
        ("CreateTopics", check::<CreateTopicsRequest>(c, broker)),
        ("DeleteTopics", check::<DeleteTopicsRequest>(c, broker)),
    ];
    eprintln!("negotiated with Kafka: {versions:?}");
}

#[tokio::test]
async fn create_list_delete_topic() {
    let conn = conn().await;
    let topic = common::unique_topic("conn-create");
    create(&conn, &topic, 4).await;
    let again = conn
        .create_topic(&topic, 4, 1)
        .await
        .expect_err("duplicate create must fail");
    assert_eq!(
        again.kafka_code(),
        Some(ErrorCode::TopicAlreadyExists),
        "{again}"
    );

    let md = conn
        .metadata(Some(&[topic.as_str()]))
        .await
        .expect("metadata");
    let t = md.topic(&topic).expect("topic listed");
    assert_eq!(t.error, None);
    assert_eq!(
        t.partitions.iter().map(|p| p.id).collect::<Vec<_>>(),
        vec![0, 1, 2, 3]
    );
    for p in &t.partitions {
        assert!(
            md.broker(p.leader).is_some(),
            "partition {} leader {} is a listed broker",
            p.id,
            p.leader
        );
    }
    let all = conn.metadata(None).await.expect("metadata all");
    assert!(all.topic(&topic).is_some());

    let res = conn.delete_topics(&[topic.as_str()]).await.expect("delete");
    assert!(res[0].1.is_ok(), "{:?}", res[0].1);
    // The deletion reaches the broker's metadata shortly after the controller took it.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let md = conn
            .metadata(Some(&[topic.as_str()]))
            .await
            .expect("metadata after delete");
        let gone = md.topic(&topic).map(|t| t.error);
        if matches!(gone, None | Some(Some(ErrorCode::UnknownTopicOrPartition))) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "deleted topic still listed: {gone:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let res = conn.delete_topics(&[topic.as_str()]).await.expect("delete");
    assert_eq!(
        res[0].1.as_ref().unwrap_err().kafka_code(),
        Some(ErrorCode::UnknownTopicOrPartition)
    );
}

#[tokio::test]
async fn produce_and_fetch_every_codec_byte_exact() {
    let conn = conn().await;
    let topic = common::unique_topic("conn-codecs");
    create(&conn, &topic, CODECS.len() as i32).await;
    for (partition, codec) in CODECS.iter().enumerate() {
        let partition = partition as i32;
        let opts = ProduceOptions::default().compression(*codec);
        let mut sent = Vec::new();
        let mut next = 0;
        for batch in 0..3 {
            let records = sample_records(40 + batch * 17, &format!("{codec:?}-{batch}"));
            let base = conn
                .produce(&topic, partition, &records, &opts)
                .await
                .expect("produce");
            assert_eq!(base, next, "{codec:?}: base offset of batch {batch}");
            next += records.len() as i64;
            sent.extend(records);
        }
        let got = fetch_all(&conn, &topic, partition, 0, next).await;
        assert_eq!(got.len(), sent.len(), "{codec:?}");
        for (i, (g, s)) in got.iter().zip(&sent).enumerate() {
            assert_eq!(g.offset, i as i64, "{codec:?}");
            assert_eq!(g.timestamp, s.timestamp, "{codec:?} record {i}");
            assert_eq!(g.key, s.key, "{codec:?} record {i}");
            assert_eq!(g.value, s.value, "{codec:?} record {i}");
            assert_eq!(g.headers, s.headers, "{codec:?} record {i}");
        }
        let at_end = FetchOptions::default().max_wait(Duration::from_millis(50));
        let hw = conn
            .fetch(&topic, partition, next, &at_end)
            .await
            .expect("fetch at end")
            .high_watermark;
        assert_eq!(hw, next, "{codec:?}");
    }
}

#[tokio::test]
async fn fetch_from_inside_a_batch_skips_leading_records() {
    let conn = conn().await;
    let topic = common::unique_topic("conn-mid");
    create(&conn, &topic, 1).await;
    let records = sample_records(10, "mid");
    conn.produce(&topic, 0, &records, &ProduceOptions::default())
        .await
        .expect("produce");
    let f = conn
        .fetch(&topic, 0, 6, &FetchOptions::default())
        .await
        .expect("fetch");
    assert_eq!(
        f.records.iter().map(|r| r.offset).collect::<Vec<_>>(),
        vec![6, 7, 8, 9]
    );
    assert_eq!(f.records[0].value, records[6].value);
    assert_eq!(f.next_offset, 10);
    assert_eq!(f.high_watermark, 10);
    // at the end of the log: empty, not an error, after at most max_wait
    let opts = FetchOptions::default().max_wait(Duration::from_millis(100));
    let f = conn
        .fetch(&topic, 0, 10, &opts)
        .await
        .expect("fetch at end");
    assert!(f.records.is_empty());
    assert_eq!(f.next_offset, 10);
}

#[tokio::test]
async fn list_offsets_first_last_and_by_time() {
    let conn = conn().await;
    let topic = common::unique_topic("conn-offsets");
    create(&conn, &topic, 1).await;
    assert_eq!(conn.first_offset(&topic, 0).await.expect("first"), 0);
    assert_eq!(conn.last_offset(&topic, 0).await.expect("last"), 0);
    for i in 0..6i64 {
        let r = Record {
            timestamp: 1_000_000 + i * 1000,
            ..Record::new(format!("k{i}"), format!("v{i}"))
        };
        assert_eq!(
            conn.produce(&topic, 0, &[r], &ProduceOptions::default())
                .await
                .expect("produce"),
            i
        );
        assert_eq!(conn.last_offset(&topic, 0).await.expect("last"), i + 1);
    }
    // Latest is the high-water mark, also after a batch of several records.
    let batch: Vec<Record> = (6..10i64)
        .map(|i| Record {
            timestamp: 1_000_000 + i * 1000,
            ..Record::new(format!("k{i}"), format!("v{i}"))
        })
        .collect();
    assert_eq!(
        conn.produce(&topic, 0, &batch, &ProduceOptions::default())
            .await
            .expect("produce"),
        6
    );
    assert_eq!(conn.last_offset(&topic, 0).await.expect("last"), 10);
    assert_eq!(conn.first_offset(&topic, 0).await.expect("first"), 0);
    // The first record at or after the timestamp, inside a batch too.
    for (ts, want) in [
        (0, Some(0)),
        (1_003_000, Some(3)),
        (1_002_500, Some(3)),
        (1_008_000, Some(8)),
        (1_009_000, Some(9)),
        (1_009_001, None),
    ] {
        let at = conn.offset_for_time(&topic, 0, ts).await.expect("by time");
        assert_eq!(at, want, "timestamp {ts}");
    }
    assert!(
        conn.offset_for_time(&topic, 0, -5).await.is_err(),
        "negative timestamps are rejected"
    );
}

#[tokio::test]
async fn acks_none_produce_is_delivered() {
    let conn = conn().await;
    let topic = common::unique_topic("conn-acks0");
    create(&conn, &topic, 1).await;
    let opts = ProduceOptions::default().acks(RequiredAcks::None);
    for i in 0..5 {
        let off = conn
            .produce(&topic, 0, &[Record::new(format!("k{i}"), "v")], &opts)
            .await
            .expect("produce");
        assert_eq!(off, -1);
    }
    // a request with acks is answered after the earlier ones on the same connection
    conn.produce(
        &topic,
        0,
        &[Record::new("last", "v")],
        &ProduceOptions::default(),
    )
    .await
    .expect("produce");
    let got = fetch_all(&conn, &topic, 0, 0, 6).await;
    assert_eq!(got.len(), 6);
    assert_eq!(got[5].key.as_deref(), Some(&b"last"[..]));
}

#[tokio::test]
async fn dial_leader_finds_the_partition_leader() {
    let topic = common::unique_topic("conn-leader");
    create(&conn().await, &topic, 2).await;
    let leader = Conn::dial_leader(&common::shared().addr, &topic, 1, Default::default())
        .await
        .expect("dial");
    leader
        .produce(
            &topic,
            1,
            &[Record::new("a", "b")],
            &ProduceOptions::default(),
        )
        .await
        .expect("produce");
    let err = Conn::dial_leader(&common::shared().addr, &topic, 9, Default::default())
        .await
        .expect_err("no partition 9");
    assert_eq!(err.kafka_code(), Some(ErrorCode::UnknownTopicOrPartition));
}

// ---------------------------------------------------------------------------------------
// interop with librdkafka

fn python() -> Command {
    Command::new(std::env::var("PYTHON").unwrap_or_else(|_| "python3".into()))
}

fn interop_script(name: &str) -> String {
    format!("{}/tests/interop/{name}", env!("CARGO_MANIFEST_DIR"))
}

#[tokio::test]
async fn librdkafka_consumes_what_we_produce_with_every_codec() {
    let conn = conn().await;
    for codec in CODECS {
        let topic = common::unique_topic(&format!("interop-out-{codec:?}"));
        create(&conn, &topic, 1).await;
        let records = sample_records(30, &format!("{codec:?}"));
        let opts = ProduceOptions::default().compression(codec);
        conn.produce(&topic, 0, &records[..12], &opts)
            .await
            .expect("produce");
        conn.produce(&topic, 0, &records[12..], &opts)
            .await
            .expect("produce");
        let out = python()
            .arg(interop_script("consume_check.py"))
            .args([
                "--broker",
                &common::shared().addr,
                "--topic",
                &topic,
                "--expect",
                "30",
                "--timeout",
                "30",
            ])
            .output()
            .expect("run consume_check.py");
        assert!(
            out.status.success(),
            "{codec:?}: librdkafka consumer failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| serde_json::from_str(l).expect("json line"))
            .collect();
        assert_eq!(lines.len(), 30, "{codec:?}");
        for (i, (line, rec)) in lines.iter().zip(&records).enumerate() {
            assert_eq!(line["offset"], i as i64, "{codec:?}");
            assert_eq!(line["timestamp"], rec.timestamp, "{codec:?}");
            let key = rec
                .key
                .as_ref()
                .map(|k| String::from_utf8_lossy(k).to_string());
            assert_eq!(
                line["key"].as_str().map(str::to_string),
                key,
                "{codec:?} record {i}"
            );
            let value = rec
                .value
                .as_ref()
                .map(|k| String::from_utf8_lossy(k).to_string());
            assert_eq!(
                line["value"].as_str().map(str::to_string),
                value,
                "{codec:?} record {i}"
            );
            let headers = line["headers"].as_array().expect("headers array");
            assert_eq!(headers.len(), rec.headers.len(), "{codec:?} record {i}");
            for (h, want) in headers.iter().zip(&rec.headers) {
                assert_eq!(h[0], want.key.as_str());
                match &want.value {
                    None => assert!(h[1].is_null()),
                    Some(v) => assert_eq!(
                        h[1]["hex"].as_str(),
                        Some(hex(v).as_str()),
                        "{codec:?} record {i}"
                    ),
                }
            }
        }
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[tokio::test]
async fn we_decode_what_librdkafka_produces_with_every_codec() {
    let conn = conn().await;
    for codec in ["none", "gzip", "snappy", "lz4", "zstd"] {
        let topic = common::unique_topic(&format!("interop-in-{codec}"));
        create(&conn, &topic, 1).await;
        let out = python()
            .arg(interop_script("produce.py"))
            .args([
                "--broker",
                &common::shared().addr,
                "--topic",
                &topic,
                "--count",
                "50",
            ])
            .args(["--compression", codec, "--partition", "0"])
            .output()
            .expect("run produce.py");
        assert!(
            out.status.success(),
            "{codec}: librdkafka producer failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let delivered: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| serde_json::from_str(l).expect("json line"))
            .collect();
        assert_eq!(delivered.len(), 50);
        let got = fetch_all(&conn, &topic, 0, 0, 50).await;
        assert_eq!(got.len(), 50, "{codec}");
        for (i, r) in got.iter().enumerate() {
            assert_eq!(r.offset, i as i64);
            assert_eq!(
                r.key.as_deref(),
                Some(format!("key-{i}").as_bytes()),
                "{codec}"
            );
            assert_eq!(
                r.value.as_deref(),
                Some(format!("value-{i}").as_bytes()),
                "{codec}"
            );
            assert_eq!(
                r.headers,
                vec![
                    Header {
                        key: "h-index".into(),
                        value: Some(Bytes::from(i.to_string()))
                    },
                    Header {
                        key: "h-bin".into(),
                        value: Some(Bytes::from(vec![(i % 256) as u8, 0, 255]))
                    },
                ],
                "{codec}"
            );
            let d = delivered
                .iter()
                .find(|d| d["offset"] == i as i64)
                .expect("delivery report");
            assert_eq!(
                d["timestamp"], r.timestamp,
                "{codec}: timestamp of record {i}"
            );
        }
    }
}

/// What a [`Recording`] stream saw: request frames as they started to be written, and
/// response frames once wholly read.
#[derive(Default)]
struct Wire {
    /// (first byte written at, api key, api version, correlation id)
    requests: Vec<(Instant, i16, i16, i32)>,
    /// (last byte read at, correlation id, body after the correlation id)
    responses: Vec<(Instant, i32, Vec<u8>)>,
}

/// Splits a byte stream into size-prefixed frames, keeping the first `keep` bytes of each.
struct Frames {
    keep: usize,
    head: Vec<u8>,
    remaining: usize,
    current: Vec<u8>,
}

impl Frames {
    fn new(keep: usize) -> Self {
        Frames {
            keep,
            head: Vec::new(),
            remaining: 0,
            current: Vec::new(),
        }
    }

    /// Feed `bytes`; calls `started` when a frame's first byte goes by and `done` with
    /// the kept bytes once a frame is complete.
    fn feed(&mut self, mut bytes: &[u8], mut started: impl FnMut(), mut done: impl FnMut(Vec<u8>)) {
        while !bytes.is_empty() {
            if self.remaining == 0 {
                if self.head.is_empty() {
                    started();
                }
                let take = (4 - self.head.len()).min(bytes.len());
                self.head.extend_from_slice(&bytes[..take]);
                bytes = &bytes[take..];
                if self.head.len() == 4 {
                    let size = i32::from_be_bytes(self.head[..4].try_into().unwrap());
                    self.remaining = size as usize;
                    self.head.clear();
                    self.current.clear();
                }
                continue;
            }
            let take = self.remaining.min(bytes.len());
            let room = self.keep.saturating_sub(self.current.len()).min(take);
            self.current.extend_from_slice(&bytes[..room]);
            bytes = &bytes[take..];
            self.remaining -= take;
            if self.remaining == 0 {
                done(std::mem::take(&mut self.current));
            }
        }
    }
}

/// A TCP stream that records the request and response frames going through it.
struct Recording {
    inner: tokio::net::TcpStream,
    wire: std::sync::Arc<std::sync::Mutex<Wire>>,
    written: Frames,
    read: Frames,
    /// When the request frames being written started.
    starts: std::collections::VecDeque<Instant>,
}

impl tokio::io::AsyncWrite for Recording {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let this = &mut *self;
        let r = std::pin::Pin::new(&mut this.inner).poll_write(cx, buf);
        if let std::task::Poll::Ready(Ok(n)) = &r {
            let now = Instant::now();
            let wire = &this.wire;
            let starts = std::cell::RefCell::new(&mut this.starts);
            this.written.feed(
                &buf[..*n],
                || starts.borrow_mut().push_back(now),
                |head| {
                    let at = starts.borrow_mut().pop_front().unwrap_or(now);
                    let key = i16::from_be_bytes([head[0], head[1]]);
                    let version = i16::from_be_bytes([head[2], head[3]]);
                    let id = i32::from_be_bytes(head[4..8].try_into().unwrap());
                    wire.lock().unwrap().requests.push((at, key, version, id));
                },
            );
        }
        r
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

impl tokio::io::AsyncRead for Recording {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let this = &mut *self;
        let before = buf.filled().len();
        let r = std::pin::Pin::new(&mut this.inner).poll_read(cx, buf);
        if let std::task::Poll::Ready(Ok(())) = &r {
            let now = Instant::now();
            let wire = &this.wire;
            this.read.feed(
                &buf.filled()[before..],
                || {},
                |frame| {
                    let id = i32::from_be_bytes(frame[..4].try_into().unwrap());
                    wire.lock()
                        .unwrap()
                        .responses
                        .push((now, id, frame[4..].to_vec()));
                },
            );
        }
        r
    }
}

/// KIP-219 on a real broker: over its 1 MB/s producer quota, the client gets produce
/// responses with a throttle time and writes no request on the connection until that time
/// has passed — so the broker never has to hold a request of ours behind its muted
/// channel. Checked on the bytes the client wrote, recorded below the connection.
#[tokio::test]
async fn a_throttled_connection_writes_nothing_until_the_throttle_ends() {
    let broker = common::shared();
    let client_id = format!("quota-conn-{}", std::process::id());
    common::set_client_quota(
        &broker.addr,
        &client_id,
        "producer_byte_rate",
        Some(1_000_000.0),
    )
    .await;
    let topic = common::unique_topic("quota-conn");
    create(&conn().await, &topic, 1).await;

    let wire = std::sync::Arc::new(std::sync::Mutex::new(Wire::default()));
    let stream = Recording {
        inner: tokio::net::TcpStream::connect(&broker.addr).await.unwrap(),
        wire: wire.clone(),
        written: Frames::new(8),
        read: Frames::new(usize::MAX),
        starts: Default::default(),
    };
    let config = kafkapipe::conn::ConnectionConfig::new().client_id(client_id.clone());
    let connection = kafkapipe::conn::Connection::from_stream(stream, broker.addr.clone(), config)
        .await
        .unwrap();
    let conn = Conn::from_connection(connection);
    // 12 requests of 256 KiB, 4 in flight at a time: 3 MiB against a 1 MB/s quota.
    let value = Bytes::from(vec![7u8; 64 * 1024]);
    let records: Vec<Record> = (0..4)
        .map(|_| Record {
            offset: 0,
            timestamp: -1,
            key: None,
            value: Some(value.clone()),
            headers: Vec::new(),
        })
        .collect();
    let started = Instant::now();
    let opts = ProduceOptions::default();
    use futures::StreamExt;
    let results: Vec<_> = futures::stream::iter(0..12)
        .map(|_| conn.produce(&topic, 0, &records, &opts))
        .buffer_unordered(4)
        .collect()
        .await;
    let elapsed = started.elapsed();
    for r in results {
        r.unwrap();
    }
    conn.close().await;

    let wire = wire.lock().unwrap();
    let produce_versions: std::collections::HashMap<i32, i16> = wire
        .requests
        .iter()
        .filter(|r| r.1 == ProduceRequest::API_KEY.0)
        .map(|r| (r.3, r.2))
        .collect();
    let mut throttles = Vec::new();
    for (at, id, body) in &wire.responses {
        let Some(&version) = produce_versions.get(id) else {
            continue;
        };
        let mut body = Bytes::from(body.clone());
        if version >= 9 {
            body = body.slice(1..); // response header v1: empty tagged fields
        }
        let resp =
            kafkapipe::protocol::messages::ProduceResponse::decode(&mut body, version).unwrap();
        if resp.throttle_time_ms > 0 {
            throttles.push((*at, Duration::from_millis(resp.throttle_time_ms as u64)));
        }
    }
    eprintln!(
        "{} requests, {} throttled responses {:?}, {elapsed:?}",
        wire.requests.len(),
        throttles.len(),
        throttles.iter().map(|t| t.1).collect::<Vec<_>>()
    );
    assert!(!throttles.is_empty(), "3 MiB at 1 MB/s was never throttled");
    // 5 ms of slack either side: the response's last byte is recorded just before the
    // connection reads the throttle time from it.
    let slack = Duration::from_millis(5);
    for (at, throttle) in &throttles {
        let window = (*at + slack)..(*at + *throttle).checked_sub(slack).unwrap_or(*at);
        let inside: Vec<_> = wire
            .requests
            .iter()
            .filter(|r| window.contains(&r.0))
            .map(|r| (r.0 - *at, r.3))
            .collect();
        assert!(
            inside.is_empty(),
            "requests written {inside:?} after a response throttling for {throttle:?}"
        );
    }
}
