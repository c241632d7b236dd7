//! `kafkapipe::mock::MockCluster` (feature `mock`) driven by the crate's own clients:
//! Writer → Reader round trips over several brokers, a consumer group splitting
//! partitions, and every fault hook as the client sees it.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::SinkExt;
use kafkapipe::admin::Admin;
use kafkapipe::cluster::Cluster;
use kafkapipe::compression::Compression;
use kafkapipe::conn::{Conn, ConnectionConfig, FetchOptions, ProduceOptions};
use kafkapipe::mock::{Fault, MockCluster};
use kafkapipe::protocol::{ApiKey, ErrorCode};
use kafkapipe::reader::{Message, Reader, ReaderConfig};
use kafkapipe::record::{Record, RecordBatchBuilder};
use kafkapipe::writer::{Message as Out, RoundRobin, Writer, WriterConfig};
use kafkapipe::ErrorKind;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Round robin (the tests spread their unkeyed messages over every partition and broker).
fn writer(cluster: &MockCluster, topic: &str) -> WriterConfig {
    WriterConfig::new(cluster.bootstrap())
        .topic(topic)
        .balancer(RoundRobin::default())
        .batch_timeout(Duration::from_millis(2))
        .backoff(Duration::from_millis(5), Duration::from_millis(50))
}

fn reader(cluster: &MockCluster) -> ReaderConfig {
    ReaderConfig::new(cluster.bootstrap())
        .max_wait(Duration::from_millis(100))
        .read_backoff(Duration::from_millis(5), Duration::from_millis(50))
}

async fn next(reader: &mut Reader) -> Message {
    tokio::time::timeout(Duration::from_secs(10), reader.next_message())
        .await
        .expect("a message within 10 s")
        .unwrap()
}

async fn write(cluster: &MockCluster, topic: &str, values: impl IntoIterator<Item = Out>) {
    let mut w = Writer::new(writer(cluster, topic)).unwrap();
    w.write_messages(values).await.unwrap();
    w.close().await.unwrap();
}

fn numbered(from: usize, to: usize) -> Vec<Out> {
    (from..to).map(|i| Out::new(format!("{i:05}"))).collect()
}

/// Read `n` messages; per partition, the offsets must run without gap or repeat.
async fn read_all(reader: &mut Reader, n: usize) -> BTreeMap<i32, Vec<(i64, Bytes)>> {
    let mut seen: BTreeMap<i32, Vec<(i64, Bytes)>> = BTreeMap::new();
    for _ in 0..n {
        let m = next(reader).await;
        let part = seen.entry(m.partition).or_default();
        if let Some((last, _)) = part.last() {
            assert_eq!(
                m.offset,
                last + 1,
                "partition {} gap or repeat",
                m.partition
            );
        }
        part.push((m.offset, m.value.unwrap()));
    }
    seen
}

fn values(seen: &BTreeMap<i32, Vec<(i64, Bytes)>>) -> BTreeSet<Bytes> {
    seen.values().flatten().map(|(_, v)| v.clone()).collect()
}

fn expected(from: usize, to: usize) -> BTreeSet<Bytes> {
    (from..to).map(|i| Bytes::from(format!("{i:05}"))).collect()
}

#[tokio::test]
async fn writer_to_reader_round_trip_over_three_brokers() {
    let cluster = MockCluster::builder()
        .brokers(3)
        .topic("t", 6)
        .start()
        .await
        .unwrap();
    let leaders: BTreeSet<i32> = (0..6).filter_map(|p| cluster.leader("t", p)).collect();
    assert_eq!(leaders, BTreeSet::from([1, 2, 3]));
    write(&cluster, "t", numbered(0, 600)).await;
    let hw: i64 = (0..6)
        .map(|p| cluster.high_watermark("t", p).unwrap())
        .sum();
    assert_eq!(hw, 600);
    let mut r = Reader::new(reader(&cluster).topic("t")).await.unwrap();
    let seen = read_all(&mut r, 600).await;
    assert_eq!(values(&seen), expected(0, 600));
    assert_eq!(seen.len(), 6, "every partition was written and read");
    for id in 1..=3 {
        assert!(cluster.requests_to(id, ApiKey::FETCH) > 0, "broker {id}");
        assert!(cluster.requests_to(id, ApiKey::PRODUCE) > 0, "broker {id}");
    }
    r.close().await;
}

#[tokio::test]
async fn a_group_of_two_readers_splits_the_partitions() {
    let cluster = MockCluster::builder()
        .brokers(2)
        .topic("g", 4)
        .start()
        .await
        .unwrap();
    let config = || {
        reader(&cluster)
            .topic("g")
            .group_id("grp")
            .session_timeout(Duration::from_secs(2))
            .heartbeat_interval(Duration::from_millis(50))
            .rebalance_timeout(Duration::from_secs(2))
    };
    let mut a = Reader::new(config()).await.unwrap();
    let mut b = Reader::new(config()).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (x, y) = (a.assignment(), b.assignment());
        if !x.is_empty() && !y.is_empty() && x.len() + y.len() == 4 {
            let all: BTreeSet<_> = x.iter().chain(y.iter()).collect();
            assert_eq!(all.len(), 4, "disjoint: {x:?} {y:?}");
            break;
        }
        assert!(Instant::now() < deadline, "no split: {x:?} {y:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(cluster.members("grp").len(), 2);
    write(&cluster, "g", numbered(0, 80)).await;
    let mut got = BTreeSet::new();
    let (mut from_a, mut from_b) = (0, 0);
    while got.len() < 80 {
        let m = tokio::time::timeout(Duration::from_secs(10), async {
            tokio::select! {
                m = a.next_message() => (true, m),
                m = b.next_message() => (false, m),
            }
        })
        .await
        .expect("messages keep coming");
        let (is_a, m) = (m.0, m.1.unwrap());
        if is_a {
            from_a += 1;
        } else {
            from_b += 1;
        }
        assert!(got.insert(m.value.unwrap()), "a message read twice");
    }
    assert!(from_a > 0 && from_b > 0, "{from_a} {from_b}");
    a.close().await;
    b.close().await;
    assert!(cluster.members("grp").is_empty(), "both left the group");
}

#[tokio::test]
async fn not_leader_twice_then_the_produce_succeeds() {
    let cluster = MockCluster::builder().topic("t", 1).start().await.unwrap();
    cluster.fault(
        ApiKey::PRODUCE,
        Fault::Error(ErrorCode::NotLeaderOrFollower),
        2,
    );
    let mut w = Writer::new(writer(&cluster, "t")).unwrap();
    w.send(Out::new("x")).await.unwrap();
    assert_eq!(cluster.requests(ApiKey::PRODUCE), 3);
    assert_eq!(w.stats().retries, 2);
    assert_eq!(cluster.high_watermark("t", 0), Some(1));
    w.close().await.unwrap();
}

#[tokio::test]
async fn a_non_retriable_error_fails_the_write() {
    let cluster = MockCluster::builder().topic("t", 1).start().await.unwrap();
    cluster.fault(
        ApiKey::PRODUCE,
        Fault::Error(ErrorCode::TopicAuthorizationFailed),
        1,
    );
    let mut w = Writer::new(writer(&cluster, "t")).unwrap();
    let err = w.send(Out::new("x")).await.unwrap_err();
    assert_eq!(err.kafka_code(), Some(ErrorCode::TopicAuthorizationFailed));
    assert_eq!(cluster.high_watermark("t", 0), Some(0));
}

#[tokio::test]
async fn a_hung_request_times_out() {
    let cluster = MockCluster::builder().topic("t", 1).start().await.unwrap();
    let conn = Conn::connect_with(
        &cluster.bootstrap()[0],
        ConnectionConfig::new().request_timeout(Duration::from_millis(200)),
    )
    .await
    .unwrap();
    cluster.fault(ApiKey::LIST_OFFSETS, Fault::Hang, 1);
    let started = Instant::now();
    let err = conn.last_offset("t", 0).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Timeout, "{err}");
    assert!(started.elapsed() >= Duration::from_millis(200));
    // A new connection is answered again.
    let conn = Conn::connect(&cluster.bootstrap()[0]).await.unwrap();
    assert_eq!(conn.last_offset("t", 0).await.unwrap(), 0);
}

#[tokio::test]
async fn a_hung_produce_is_retried_after_the_request_timeout() {
    let cluster = MockCluster::builder().topic("t", 1).start().await.unwrap();
    cluster.fault(ApiKey::PRODUCE, Fault::Hang, 1);
    let mut w = Writer::new(
        writer(&cluster, "t")
            .request_timeout(Duration::from_millis(200))
            .idempotent(true),
    )
    .unwrap();
    let started = Instant::now();
    w.send(Out::new("x")).await.unwrap();
    assert!(started.elapsed() >= Duration::from_millis(200));
    assert_eq!(cluster.requests(ApiKey::PRODUCE), 2);
    assert_eq!(cluster.high_watermark("t", 0), Some(1));
    w.close().await.unwrap();
}

#[tokio::test]
async fn a_delay_is_waited_out() {
    let cluster = MockCluster::builder().topic("t", 1).start().await.unwrap();
    let conn = Conn::connect(&cluster.bootstrap()[0]).await.unwrap();
    cluster.fault(
        ApiKey::LIST_OFFSETS,
        Fault::Delay(Duration::from_millis(300)),
        1,
    );
    let started = Instant::now();
    assert_eq!(conn.first_offset("t", 0).await.unwrap(), 0);
    assert!(started.elapsed() >= Duration::from_millis(300));
}

#[tokio::test]
async fn closed_connections_are_retried_by_an_idempotent_writer_without_duplicates() {
    for fault in [Fault::CloseOnRequest, Fault::CloseMidResponse] {
        let cluster = MockCluster::builder().topic("t", 1).start().await.unwrap();
        cluster.fault(ApiKey::PRODUCE, fault.clone(), 1);
        let mut w = Writer::new(writer(&cluster, "t").idempotent(true)).unwrap();
        w.send(Out::new("x")).await.unwrap();
        w.send(Out::new("y")).await.unwrap();
        w.close().await.unwrap();
        // Mid-response: the first produce was appended, its retry is a duplicate
        // answered with the same offset.
        assert_eq!(cluster.high_watermark("t", 0), Some(2), "{fault:?}");
        assert!(cluster.requests(ApiKey::PRODUCE) >= 3, "{fault:?}");
        let mut r = Reader::new(reader(&cluster).partition("t", 0))
            .await
            .unwrap();
        assert_eq!(next(&mut r).await.value.as_deref(), Some(&b"x"[..]));
        assert_eq!(next(&mut r).await.value.as_deref(), Some(&b"y"[..]));
        r.close().await;
    }
}

/// A produce response with an unknown correlation id desynchronizes the connection: it is
/// dropped, and the batch, whose fate is unknown (it was appended), is retried on a new
/// connection; idempotence makes the retry a duplicate the broker answers with the same
/// offset. Before, the send failed with a non-retriable `Protocol` error.
#[tokio::test]
async fn a_corrupt_produce_response_is_retried_without_a_duplicate() {
    let cluster = MockCluster::builder().topic("t", 1).start().await.unwrap();
    cluster.fault(ApiKey::PRODUCE, Fault::Corrupt, 1);
    let mut w = Writer::new(writer(&cluster, "t").idempotent(true)).unwrap();
    w.send(Out::new("x")).await.unwrap();
    w.close().await.unwrap();
    assert_eq!(cluster.high_watermark("t", 0), Some(1), "appended once");
    assert!(cluster.requests(ApiKey::PRODUCE) >= 2, "retried");
}

#[tokio::test]
async fn a_broken_fetch_connection_is_recovered_without_gap_or_repeat() {
    let cluster = MockCluster::builder().topic("t", 1).start().await.unwrap();
    write(&cluster, "t", numbered(0, 50)).await;
    cluster.fault(ApiKey::FETCH, Fault::CloseMidResponse, 1);
    cluster.fault(ApiKey::FETCH, Fault::Corrupt, 1);
    cluster.fault(
        ApiKey::FETCH,
        Fault::Error(ErrorCode::NotLeaderOrFollower),
        1,
    );
    let mut r = Reader::new(reader(&cluster).partition("t", 0))
        .await
        .unwrap();
    let seen = read_all(&mut r, 50).await;
    assert_eq!(values(&seen), expected(0, 50));
    assert!(r.stats().errors >= 3, "{:?}", r.stats());
    r.close().await;
}

#[tokio::test]
async fn the_reader_follows_a_leader_move_without_gap_or_repeat() {
    let cluster = MockCluster::builder()
        .brokers(2)
        .topic("t", 1)
        .start()
        .await
        .unwrap();
    let first = cluster.leader("t", 0).unwrap();
    let other = 3 - first;
    write(&cluster, "t", numbered(0, 100)).await;
    let mut r = Reader::new(reader(&cluster).partition("t", 0).queue_capacity(10))
        .await
        .unwrap();
    let mut seen = read_all(&mut r, 30).await;
    cluster.move_leader("t", 0, other).unwrap();
    write(&cluster, "t", numbered(100, 200)).await;
    let rest = read_all(&mut r, 170).await;
    let all: Vec<i64> = seen
        .remove(&0)
        .unwrap()
        .into_iter()
        .chain(rest[&0].iter().cloned())
        .map(|(o, _)| o)
        .collect();
    assert_eq!(all, (0..200).collect::<Vec<_>>());
    assert!(cluster.requests_to(other, ApiKey::FETCH) > 0);
    assert!(cluster.requests_to(other, ApiKey::PRODUCE) > 0);
    r.close().await;
}

#[tokio::test]
async fn a_killed_broker_moves_its_partitions_and_restarts_on_its_port() {
    let cluster = MockCluster::builder()
        .brokers(2)
        .topic("t", 2)
        .start()
        .await
        .unwrap();
    let addr = cluster.broker_addr(1).unwrap();
    write(&cluster, "t", numbered(0, 50)).await;
    let mut r = Reader::new(reader(&cluster).topic("t")).await.unwrap();
    let mut seen = read_all(&mut r, 50).await;
    cluster.kill(1);
    assert!(tokio::net::TcpStream::connect(&addr).await.is_err());
    assert_eq!(cluster.leader("t", 0), Some(2));
    assert_eq!(cluster.leader("t", 1), Some(2));
    write(&cluster, "t", numbered(50, 100)).await;
    for (p, v) in read_all(&mut r, 50).await {
        seen.entry(p).or_default().extend(v);
    }
    cluster.restart(1).await.unwrap();
    cluster.move_leader("t", 0, 1).unwrap();
    write(&cluster, "t", numbered(100, 150)).await;
    for (p, v) in read_all(&mut r, 50).await {
        seen.entry(p).or_default().extend(v);
    }
    assert_eq!(values(&seen), expected(0, 150));
    for v in seen.values() {
        let offsets: Vec<i64> = v.iter().map(|(o, _)| *o).collect();
        assert_eq!(offsets, (0..offsets.len() as i64).collect::<Vec<_>>());
    }
    assert!(cluster.requests_to(1, ApiKey::FETCH) > 0);
    r.close().await;
}

#[tokio::test]
async fn idempotent_sequences_duplicates_and_gaps() {
    let cluster = MockCluster::builder().topic("t", 1).start().await.unwrap();
    let conn = Conn::connect(&cluster.bootstrap()[0]).await.unwrap();
    let batch = |seq: i32, n: usize| {
        let mut b = RecordBatchBuilder::new(Compression::None).producer(77, 0, seq);
        for i in 0..n {
            b.append(1, None, Some(format!("{seq}-{i}").as_bytes()), &[])
                .unwrap();
        }
        b.build().unwrap()
    };
    let opts = ProduceOptions::default();
    assert_eq!(
        conn.produce_batch("t", 0, batch(0, 3), &opts)
            .await
            .unwrap(),
        0
    );
    assert_eq!(
        conn.produce_batch("t", 0, batch(3, 2), &opts)
            .await
            .unwrap(),
        3
    );
    // The same batch again: the offset it got the first time, nothing appended.
    assert_eq!(
        conn.produce_batch("t", 0, batch(3, 2), &opts)
            .await
            .unwrap(),
        3
    );
    assert_eq!(cluster.high_watermark("t", 0), Some(5));
    // A gap.
    let err = conn
        .produce_batch("t", 0, batch(9, 1), &opts)
        .await
        .unwrap_err();
    assert_eq!(err.kafka_code(), Some(ErrorCode::OutOfOrderSequenceNumber));
    assert_eq!(
        conn.produce_batch("t", 0, batch(5, 1), &opts)
            .await
            .unwrap(),
        5
    );
    // A corrupt batch.
    let mut bad = batch(6, 1).to_vec();
    let last = bad.len() - 1;
    bad[last] ^= 0xff;
    let err = conn
        .produce_batch("t", 0, bad.into(), &opts)
        .await
        .unwrap_err();
    assert_eq!(err.kafka_code(), Some(ErrorCode::CorruptMessage));
    assert_eq!(cluster.batches("t", 0).len(), 3);
}

#[tokio::test]
async fn fetch_long_polls_and_honours_max_bytes() {
    let cluster = MockCluster::builder().topic("t", 1).start().await.unwrap();
    let conn = Conn::connect(&cluster.bootstrap()[0]).await.unwrap();
    let opts = FetchOptions::default().max_wait(Duration::from_secs(5));
    let producer = {
        let addr = cluster.bootstrap()[0].clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(200)).await;
            let c = Conn::connect(&addr).await.unwrap();
            c.produce(
                "t",
                0,
                &[Record::new("k", "late")],
                &ProduceOptions::default(),
            )
            .await
            .unwrap();
        })
    };
    let started = Instant::now();
    let f = conn.fetch("t", 0, 0, &opts).await.unwrap();
    let waited = started.elapsed();
    assert_eq!(f.records.len(), 1);
    assert!(
        waited >= Duration::from_millis(150) && waited < Duration::from_secs(3),
        "{waited:?}"
    );
    producer.await.unwrap();
    // Nothing new: the full MaxWait.
    let started = Instant::now();
    let short = FetchOptions::default().max_wait(Duration::from_millis(300));
    assert!(conn
        .fetch("t", 0, 1, &short)
        .await
        .unwrap()
        .records
        .is_empty());
    assert!(started.elapsed() >= Duration::from_millis(280));
    // Three batches of ~1 KB; max bytes 1500 gets one; max bytes 1 still gets one.
    for _ in 0..3 {
        conn.produce(
            "t",
            0,
            &[Record::new("k", vec![7u8; 1000])],
            &ProduceOptions::default(),
        )
        .await
        .unwrap();
    }
    for max in [1, 1500] {
        let o = FetchOptions::default().max_bytes(max);
        let f = conn.fetch("t", 0, 1, &o).await.unwrap();
        assert_eq!(f.records.len(), 1, "max bytes {max}");
        assert_eq!(f.next_offset, 2);
    }
    let f = conn
        .fetch("t", 0, 1, &FetchOptions::default())
        .await
        .unwrap();
    assert_eq!(f.records.len(), 3);
}

#[tokio::test]
async fn list_offsets_earliest_latest_and_by_timestamp() {
    let cluster = MockCluster::builder().topic("t", 1).start().await.unwrap();
    let conn = Conn::connect(&cluster.bootstrap()[0]).await.unwrap();
    let records: Vec<Record> = (0..5)
        .map(|i| {
            let mut r = Record::new("k", format!("v{i}"));
            r.timestamp = 1_000 + i * 10;
            r
        })
        .collect();
    conn.produce("t", 0, &records, &ProduceOptions::default())
        .await
        .unwrap();
    assert_eq!(conn.first_offset("t", 0).await.unwrap(), 0);
    assert_eq!(conn.last_offset("t", 0).await.unwrap(), 5);
    assert_eq!(conn.offset_for_time("t", 0, 1_015).await.unwrap(), Some(2));
    assert_eq!(conn.offset_for_time("t", 0, 1_000).await.unwrap(), Some(0));
}

#[tokio::test]
async fn admin_creates_grows_and_deletes_topics() {
    let cluster = MockCluster::builder().brokers(3).start().await.unwrap();
    let admin = Admin::new(Cluster::new(cluster.bootstrap(), ConnectionConfig::default()).unwrap());
    let created = admin
        .create_topics(
            &[kafkapipe::conn::NewTopic::new("a", 3).replication_factor(3)],
            false,
        )
        .await
        .unwrap();
    assert!(created[0].1.is_ok(), "{created:?}");
    let again = admin
        .create_topics(&[kafkapipe::conn::NewTopic::new("a", 3)], false)
        .await
        .unwrap();
    assert_eq!(
        again[0].1.as_ref().unwrap_err().kafka_code(),
        Some(ErrorCode::TopicAlreadyExists)
    );
    assert_eq!(cluster.partitions("a"), Some(3));
    let grown = admin.create_partitions(&[("a", 5)], false).await.unwrap();
    assert!(grown[0].1.is_ok(), "{grown:?}");
    assert_eq!(cluster.partitions("a"), Some(5));
    let deleted = admin.delete_topics(&["a"]).await.unwrap();
    assert!(deleted[0].1.is_ok(), "{deleted:?}");
    assert_eq!(cluster.partitions("a"), None);
}

#[tokio::test]
async fn group_commits_are_stored_and_fetched() {
    let cluster = MockCluster::builder().topic("t", 2).start().await.unwrap();
    write(&cluster, "t", numbered(0, 20)).await;
    let config = reader(&cluster)
        .topic("t")
        .group_id("c")
        .session_timeout(Duration::from_secs(2))
        .heartbeat_interval(Duration::from_millis(50));
    let mut r = Reader::new(config.clone()).await.unwrap();
    for _ in 0..20 {
        // read_message acks what it returns
        tokio::time::timeout(Duration::from_secs(10), r.read_message())
            .await
            .unwrap()
            .unwrap();
    }
    r.close().await;
    let total: i64 = (0..2).filter_map(|p| cluster.committed("c", "t", p)).sum();
    assert_eq!(total, 20, "the close committed what was read");
    // A new member starts at the commits.
    write(&cluster, "t", numbered(20, 22)).await;
    let mut r = Reader::new(config).await.unwrap();
    let seen = read_all(&mut r, 2).await;
    assert_eq!(values(&seen), expected(20, 22));
    r.close().await;
}

#[tokio::test]
async fn a_member_that_stops_heartbeating_expires() {
    let cluster = MockCluster::builder().topic("t", 2).start().await.unwrap();
    let config = reader(&cluster)
        .topic("t")
        .group_id("e")
        .session_timeout(Duration::from_millis(500))
        .heartbeat_interval(Duration::from_millis(50));
    let r = Reader::new(config).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while cluster.members("e").is_empty() {
        assert!(Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Dropped without a close: no LeaveGroup, the session runs out.
    drop(r);
    while !cluster.members("e").is_empty() {
        assert!(Instant::now() < deadline, "still a member");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn raw_request(addr: &str, frame: &[u8]) -> Option<Vec<u8>> {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(frame).await.unwrap();
    let mut len = [0u8; 4];
    tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut len))
        .await
        .unwrap()
        .ok()?;
    let mut body = vec![0u8; i32::from_be_bytes(len) as usize];
    s.read_exact(&mut body).await.ok()?;
    Some(body)
}

#[tokio::test]
async fn api_versions_of_an_unknown_version_is_answered_at_v0() {
    let cluster = MockCluster::builder().start().await.unwrap();
    // ApiVersions v99, correlation id 7, client id "x", no body we understand.
    let mut frame = vec![0, 0, 0, 0, 0, 18, 0, 99, 0, 0, 0, 7, 0, 1, b'x', 0];
    let len = (frame.len() - 4) as i32;
    frame[..4].copy_from_slice(&len.to_be_bytes());
    let body = raw_request(&cluster.bootstrap()[0], &frame).await.unwrap();
    assert_eq!(
        &body[..4],
        &7i32.to_be_bytes(),
        "v0 header: correlation id only"
    );
    assert_eq!(&body[4..6], &35i16.to_be_bytes(), "UNSUPPORTED_VERSION");
}

#[tokio::test]
async fn garbage_closes_the_connection_and_the_broker_keeps_serving() {
    let cluster = MockCluster::builder().topic("t", 1).start().await.unwrap();
    let addr = cluster.bootstrap()[0].clone();
    for frame in [
        // a negative size
        vec![0xff, 0xff, 0xff, 0xff],
        // a Produce v9 whose body is cut short
        vec![0, 0, 0, 10, 0, 0, 0, 9, 0, 0, 0, 1, 0, 0],
        // an API the mock does not serve
        vec![0, 0, 0, 10, 0, 99, 0, 0, 0, 0, 0, 1, 0, 0],
        // a huge size
        vec![0x7f, 0xff, 0xff, 0xff, 1, 2, 3],
        // a Metadata request with an array length beyond the frame
        vec![
            0, 0, 0, 14, 0, 3, 0, 4, 0, 0, 0, 1, 0, 0, 0x7f, 0xff, 0xff, 0xff,
        ],
    ] {
        assert!(raw_request(&addr, &frame).await.is_none(), "{frame:?}");
    }
    let conn = Conn::connect(&addr).await.unwrap();
    assert_eq!(conn.last_offset("t", 0).await.unwrap(), 0);
}

#[tokio::test]
async fn faults_target_one_broker_and_run_out() {
    let cluster = MockCluster::builder()
        .brokers(2)
        .topic("t", 1)
        .start()
        .await
        .unwrap();
    let leader = cluster.leader("t", 0).unwrap();
    let conn = Conn::connect(&cluster.broker_addr(leader).unwrap())
        .await
        .unwrap();
    cluster.fault_on(
        3 - leader,
        ApiKey::LIST_OFFSETS,
        Fault::Error(ErrorCode::UnknownServerError),
        u32::MAX,
    );
    cluster.fault_on(
        leader,
        ApiKey::LIST_OFFSETS,
        Fault::Error(ErrorCode::LeaderNotAvailable),
        1,
    );
    let err = conn.last_offset("t", 0).await.unwrap_err();
    assert_eq!(err.kafka_code(), Some(ErrorCode::LeaderNotAvailable));
    assert_eq!(conn.last_offset("t", 0).await.unwrap(), 0);
    cluster.clear_faults();
}

/// Encode `req` as a whole request frame (size, header, body) at `version`.
fn frame<R: kafkapipe::protocol::Request>(req: &R, version: i16) -> Vec<u8> {
    use kafkapipe::protocol::{RequestHeader, TaggedFields};
    let mut body = bytes::BytesMut::new();
    RequestHeader {
        api_key: R::API_KEY,
        api_version: version,
        correlation_id: 1,
        client_id: Some("fuzz".into()),
        tagged_fields: TaggedFields::new(),
    }
    .encode(&mut body, R::request_header_version(version))
    .unwrap();
    req.encode(&mut body, version).unwrap();
    let mut out = (body.len() as i32).to_be_bytes().to_vec();
    out.extend_from_slice(&body);
    out
}

/// Mutated and truncated frames of every API the mock serves: no handler panics (a
/// panic in a connection task would only close that connection, so a panic hook counts
/// the ones raised in src/mock), and the brokers keep serving.
#[tokio::test]
async fn mutated_requests_never_panic_the_mock() {
    use kafkapipe::protocol::messages::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    let panics = Arc::new(AtomicUsize::new(0));
    {
        let panics = panics.clone();
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if info
                .location()
                .is_some_and(|l| l.file().contains("src/mock"))
            {
                panics.fetch_add(1, Ordering::SeqCst);
            }
            previous(info);
        }));
    }
    let cluster = MockCluster::builder().topic("t", 2).start().await.unwrap();
    {
        // a transactional id for the transaction requests to find
        let conn = Conn::connect(&cluster.bootstrap()[0]).await.unwrap();
        conn.connection()
            .send(&InitProducerIdRequest {
                transactional_id: Some("tx".into()),
                producer_id: -1,
                producer_epoch: -1,
                ..Default::default()
            })
            .await
            .unwrap();
    }
    let mut b = RecordBatchBuilder::new(Compression::None).producer(5, 0, 0);
    b.append(1, Some(b"k"), Some(b"v"), &[]).unwrap();
    let batch = b.build().unwrap();
    let frames = vec![
        frame(
            &ProduceRequest {
                acks: -1,
                timeout_ms: 1000,
                topic_data: vec![ProduceTopicData {
                    name: "t".into(),
                    partition_data: vec![ProducePartitionData {
                        index: 0,
                        records: Some(batch.into()),
                        ..Default::default()
                    }],
                    ..Default::default()
                }],
                ..Default::default()
            },
            9,
        ),
        frame(
            &FetchRequest {
                max_wait_ms: 10,
                max_bytes: 1 << 20,
                topics: vec![FetchTopic {
                    topic: "t".into(),
                    partitions: vec![FetchPartition {
                        partition: 0,
                        partition_max_bytes: 1 << 20,
                        ..Default::default()
                    }],
                    ..Default::default()
                }],
                ..Default::default()
            },
            12,
        ),
        frame(&MetadataRequest::default(), 12),
        frame(
            &ListOffsetsRequest {
                topics: vec![ListOffsetsTopic {
                    name: "t".into(),
                    partitions: vec![ListOffsetsPartition {
                        partition_index: 1,
                        timestamp: 5,
                        ..Default::default()
                    }],
                    ..Default::default()
                }],
                ..Default::default()
            },
            7,
        ),
        frame(
            &JoinGroupRequest {
                group_id: "g".into(),
                session_timeout_ms: 100,
                rebalance_timeout_ms: 100,
                member_id: "m".into(),
                protocol_type: "consumer".into(),
                protocols: vec![JoinGroupRequestProtocol {
                    name: "range".into(),
                    metadata: Bytes::from_static(b"x"),
                    ..Default::default()
                }],
                ..Default::default()
            },
            5,
        ),
        frame(
            &OffsetCommitRequest {
                group_id: "g".into(),
                generation_id_or_member_epoch: -1,
                topics: vec![OffsetCommitRequestTopic {
                    name: "t".into(),
                    partitions: vec![OffsetCommitRequestPartition {
                        partition_index: 0,
                        committed_offset: 3,
                        ..Default::default()
                    }],
                    ..Default::default()
                }],
                ..Default::default()
            },
            8,
        ),
        frame(
            &CreateTopicsRequest {
                topics: vec![CreatableTopic {
                    name: "new".into(),
                    num_partitions: 2,
                    replication_factor: 1,
                    ..Default::default()
                }],
                timeout_ms: 100,
                ..Default::default()
            },
            7,
        ),
        frame(&ApiVersionsRequest::default(), 3),
        frame(
            &EndTxnRequest {
                transactional_id: "tx".into(),
                producer_id: 1001,
                committed: true,
                ..Default::default()
            },
            3,
        ),
        frame(
            &AddPartitionsToTxnRequest {
                v3_and_below_transactional_id: "tx".into(),
                v3_and_below_producer_id: 1001,
                v3_and_below_topics: vec![AddPartitionsToTxnTopic {
                    name: "t".into(),
                    partitions: vec![0, 1],
                    ..Default::default()
                }],
                ..Default::default()
            },
            3,
        ),
    ];
    let addr = cluster.bootstrap()[0].clone();
    let mut seed: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for f in &frames {
        for i in 0..120 {
            let mut m = f.clone();
            if i % 10 == 9 {
                // cut short, the size prefix saying so
                let keep = 4 + (next() as usize) % (m.len() - 4);
                m.truncate(keep);
                let len = (keep - 4) as i32;
                m[..4].copy_from_slice(&len.to_be_bytes());
            } else {
                // flip one to three bytes after the size prefix
                for _ in 0..1 + next() % 3 {
                    let at = 4 + (next() as usize) % (m.len() - 4);
                    m[at] = next() as u8;
                }
            }
            let mut s = tokio::net::TcpStream::connect(&addr).await.unwrap();
            s.write_all(&m).await.unwrap();
            let mut buf = [0u8; 64];
            let _ = tokio::time::timeout(Duration::from_millis(5), s.read(&mut buf)).await;
        }
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(panics.load(Ordering::SeqCst), 0, "the mock panicked");
    let conn = Conn::connect(&addr).await.unwrap();
    conn.metadata(None).await.unwrap();
    conn.last_offset("t", 0).await.unwrap();
}

#[tokio::test]
async fn transactions_commit_abort_and_fence() {
    use kafkapipe::conn::IsolationLevel;
    use kafkapipe::protocol::messages::*;

    let cluster = MockCluster::builder().topic("t", 1).start().await.unwrap();
    let conn = Conn::connect(&cluster.bootstrap()[0]).await.unwrap();
    let c = conn.connection();
    let init = || InitProducerIdRequest {
        transactional_id: Some("tx".into()),
        transaction_timeout_ms: 60_000,
        producer_id: -1,
        producer_epoch: -1,
        ..Default::default()
    };
    let r = c.send(&init()).await.unwrap();
    assert_eq!((r.error_code, r.producer_epoch), (0, 0));
    let (pid, epoch) = (r.producer_id, r.producer_epoch);
    let add = |epoch: i16| {
        let topics = vec![AddPartitionsToTxnTopic {
            name: "t".into(),
            partitions: vec![0],
            ..Default::default()
        }];
        AddPartitionsToTxnRequest {
            transactions: vec![AddPartitionsToTxnTransaction {
                transactional_id: "tx".into(),
                producer_id: pid,
                producer_epoch: epoch,
                topics: topics.clone(),
                ..Default::default()
            }],
            v3_and_below_transactional_id: "tx".into(),
            v3_and_below_producer_id: pid,
            v3_and_below_producer_epoch: epoch,
            v3_and_below_topics: topics,
            ..Default::default()
        }
    };
    let produce = |seq: i32, value: &'static str| {
        let mut b = RecordBatchBuilder::new(Compression::None)
            .producer(pid, epoch, seq)
            .transactional(true);
        b.append(1, None, Some(value.as_bytes()), &[]).unwrap();
        let batch = b.build().unwrap();
        let conn = &conn;
        async move {
            conn.produce_batch("t", 0, batch, &ProduceOptions::default())
                .await
                .unwrap()
        }
    };
    let end = |epoch: i16, committed: bool| EndTxnRequest {
        transactional_id: "tx".into(),
        producer_id: pid,
        producer_epoch: epoch,
        committed,
        ..Default::default()
    };
    let committed_values = || async {
        let opts = FetchOptions::default()
            .isolation_level(IsolationLevel::ReadCommitted)
            .max_wait(Duration::from_millis(1));
        let f = conn.fetch("t", 0, 0, &opts).await.unwrap();
        let values: Vec<Bytes> = f.records.into_iter().map(|r| r.value.unwrap()).collect();
        (values, f.last_stable_offset)
    };

    // A committed transaction with an offset commit in it.
    c.send(&add(epoch)).await.unwrap();
    assert_eq!(produce(0, "a").await, 0);
    let (nothing, lso) = committed_values().await;
    assert!(nothing.is_empty(), "{nothing:?}");
    assert_eq!(lso, 0, "the open transaction holds the LSO");
    let offsets = TxnOffsetCommitRequest {
        transactional_id: "tx".into(),
        group_id: "g".into(),
        producer_id: pid,
        producer_epoch: epoch,
        generation_id: -1,
        topics: vec![TxnOffsetCommitRequestTopic {
            name: "t".into(),
            partitions: vec![TxnOffsetCommitRequestPartition {
                partition_index: 0,
                committed_offset: 7,
                ..Default::default()
            }],
            ..Default::default()
        }],
        ..Default::default()
    };
    assert_eq!(
        c.send(&offsets).await.unwrap().topics[0].partitions[0].error_code,
        0
    );
    assert_eq!(
        cluster.committed("g", "t", 0),
        None,
        "not before the commit"
    );
    assert_eq!(c.send(&end(epoch, true)).await.unwrap().error_code, 0);
    assert_eq!(cluster.committed("g", "t", 0), Some(7));
    assert_eq!(committed_values().await, (vec![Bytes::from("a")], 2));

    // An aborted one: hidden from read-committed fetches.
    c.send(&add(epoch)).await.unwrap();
    assert_eq!(produce(1, "b").await, 2);
    assert_eq!(c.send(&end(epoch, false)).await.unwrap().error_code, 0);
    assert_eq!(committed_values().await, (vec![Bytes::from("a")], 4));
    let all = conn
        .fetch("t", 0, 0, &FetchOptions::default())
        .await
        .unwrap();
    assert_eq!(all.records.len(), 2, "read uncommitted sees both");

    // A new InitProducerId bumps the epoch: the old one is fenced.
    let r = c.send(&init()).await.unwrap();
    assert_eq!((r.producer_id, r.producer_epoch), (pid, 1));
    assert_eq!(
        c.send(&end(epoch, true)).await.unwrap().error_code,
        ErrorCode::ProducerFenced.code()
    );
}

#[tokio::test]
async fn truncated_fetches_cut_the_last_batch_and_readers_still_progress() {
    let cluster = MockCluster::builder()
        .topic("t", 1)
        .truncate_fetches(true)
        .start()
        .await
        .unwrap();
    let conn = Conn::connect(&cluster.bootstrap()[0]).await.unwrap();
    for i in 0..20 {
        conn.produce(
            "t",
            0,
            &[Record::new("k", format!("{i:05}").repeat(100))],
            &ProduceOptions::default(),
        )
        .await
        .unwrap();
    }
    let one = cluster.batches("t", 0)[0].len();
    // Room for one and a half batches: one whole, the cut rest dropped by the decoder.
    let opts = FetchOptions::default().max_bytes((one + one / 2) as i32);
    let f = conn.fetch("t", 0, 0, &opts).await.unwrap();
    assert_eq!((f.records.len(), f.next_offset), (1, 1));
    let mut r = Reader::new(
        reader(&cluster)
            .partition("t", 0)
            .max_partition_bytes((one + one / 3) as i32),
    )
    .await
    .unwrap();
    let seen = read_all(&mut r, 20).await;
    assert_eq!(seen[&0].len(), 20);
    r.close().await;
}

/// The crate's `TransactionalWriter` through the mock's transaction coordinator: a
/// committed transaction with offsets, an aborted one, and a fenced writer.
#[tokio::test]
async fn transactional_writer_commits_aborts_and_is_fenced() {
    use kafkapipe::admin::TopicPartition;
    use kafkapipe::conn::IsolationLevel;
    use kafkapipe::writer::{GroupMetadata, TransactionalWriter};

    let cluster = MockCluster::builder()
        .brokers(3)
        .topic("out", 2)
        .topic("in", 1)
        .start()
        .await
        .unwrap();
    let config = || writer(&cluster, "out").transactional_id("etl-1");
    let mut w = TransactionalWriter::new(config()).unwrap();
    w.init_transactions().await.unwrap();
    w.begin_transaction().unwrap();
    w.write_messages(numbered(0, 30)).await.unwrap();
    w.send_offsets_to_transaction(
        [(TopicPartition::new("in", 0), 42)],
        &GroupMetadata::new("etl"),
    )
    .await
    .unwrap();
    assert_eq!(
        cluster.committed("etl", "in", 0),
        None,
        "not before the commit"
    );
    w.commit_transaction().await.unwrap();
    assert_eq!(cluster.committed("etl", "in", 0), Some(42));

    w.begin_transaction().unwrap();
    w.write_messages(numbered(30, 40)).await.unwrap();
    w.abort_transaction().await.unwrap();

    // read_committed: the 30 committed messages, none of the aborted ten.
    let mut r = Reader::new(
        reader(&cluster)
            .topic("out")
            .isolation_level(IsolationLevel::ReadCommitted),
    )
    .await
    .unwrap();
    let mut got = BTreeSet::new();
    for _ in 0..30 {
        got.insert(next(&mut r).await.value.unwrap());
    }
    assert_eq!(got, expected(0, 30));
    let more = tokio::time::timeout(Duration::from_millis(300), r.next_message()).await;
    assert!(more.is_err(), "an aborted message was read: {more:?}");
    r.close().await;

    // A second writer with the same id fences the first.
    let mut newer = TransactionalWriter::new(config()).unwrap();
    newer.init_transactions().await.unwrap();
    w.begin_transaction().unwrap();
    let fenced = async {
        w.write_messages(numbered(40, 41)).await?;
        w.commit_transaction().await
    };
    let err = fenced.await.unwrap_err();
    assert!(
        matches!(
            err.kafka_code(),
            Some(ErrorCode::ProducerFenced | ErrorCode::InvalidProducerEpoch)
        ),
        "{err}"
    );
    newer.close().await.unwrap();
}

/// The exactly-once pipeline merged from main (group Reader → filter/map →
/// `ExactlyOnceSink`) through the mock's group and transaction coordinators: every
/// kept input appears once in the read_committed output and the group's commits reach
/// the end of the input.
/// A read-committed group reader of "in" (group `group`, from the first offset) and an
/// exactly-once sink into "out" with transactional id `txn_id`.
async fn eos_pipeline(
    cluster: &MockCluster,
    group: &str,
    txn_id: &str,
    config: kafkapipe::writer::PipelineConfig,
) -> (Reader, kafkapipe::writer::ExactlyOnceSink) {
    use kafkapipe::conn::IsolationLevel;
    use kafkapipe::reader::StartOffset;
    use kafkapipe::writer::TransactionalWriter;
    let input = Reader::new(
        reader(cluster)
            .group_id(group)
            .topic("in")
            .start_offset(StartOffset::First)
            .isolation_level(IsolationLevel::ReadCommitted)
            .session_timeout(Duration::from_secs(5))
            .heartbeat_interval(Duration::from_millis(100)),
    )
    .await
    .unwrap();
    let sink = TransactionalWriter::new(writer(cluster, "out").transactional_id(txn_id))
        .unwrap()
        .pipeline(&input.handle(), config)
        .await
        .unwrap();
    (input, sink)
}

#[tokio::test]
async fn an_exactly_once_pipeline_through_the_mock() {
    use futures::{future, StreamExt, TryStreamExt};
    use kafkapipe::conn::IsolationLevel;
    use kafkapipe::writer::PipelineConfig;

    const N: usize = 1000;
    let cluster = MockCluster::builder()
        .brokers(3)
        .topic("in", 3)
        .topic("out", 3)
        .start()
        .await
        .unwrap();
    write(&cluster, "in", numbered(0, N)).await;
    let (input, mut sink) = eos_pipeline(&cluster, "eos", "eos-1", PipelineConfig::new()).await;
    let handle = input.handle();
    let committed =
        |c: &MockCluster| -> i64 { (0..3).filter_map(|p| c.committed("eos", "in", p)).sum() };
    let stopper = async {
        let deadline = Instant::now() + Duration::from_secs(30);
        while committed(&cluster) < N as i64 {
            assert!(
                Instant::now() < deadline,
                "committed {}",
                committed(&cluster)
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        handle.close().await;
    };
    let keep = |v: &[u8]| !v.contains(&b'7');
    let pipeline = input
        .try_filter(|m| future::ready(keep(m.value.as_deref().unwrap_or_default())))
        .map_ok(|mut m| {
            let v = String::from_utf8_lossy(m.value.as_deref().unwrap_or_default()).to_lowercase();
            Out::new(format!("out-{v}")).with_ack(m.take_ack_token())
        })
        .forward(&mut sink);
    let (done, ()) = tokio::join!(pipeline, stopper);
    done.unwrap();
    let expected: BTreeSet<Bytes> = (0..N)
        .map(|i| format!("{i:05}"))
        .filter(|v| keep(v.as_bytes()))
        .map(|v| Bytes::from(format!("out-{v}")))
        .collect();
    let mut check = Reader::new(
        reader(&cluster)
            .topic("out")
            .isolation_level(IsolationLevel::ReadCommitted),
    )
    .await
    .unwrap();
    let mut seen = BTreeSet::new();
    for _ in 0..expected.len() {
        assert!(
            seen.insert(next(&mut check).await.value.unwrap()),
            "a duplicate"
        );
    }
    let more = tokio::time::timeout(Duration::from_millis(300), check.next_message()).await;
    assert!(more.is_err(), "more output than expected: {more:?}");
    assert_eq!(seen, expected);
    check.close().await;
}

/// A commit deferred because an input's token was still held (here acked by hand, late,
/// after the last input) is retried once it can go through, though no input follows to
/// prompt it.
#[tokio::test]
async fn an_exactly_once_commit_deferred_for_a_token_acked_late_by_hand_goes_through() {
    use futures::{StreamExt, TryStreamExt};
    use kafkapipe::writer::PipelineConfig;

    const N: usize = 50;
    let cluster = MockCluster::builder()
        .brokers(1)
        .topic("in", 1)
        .topic("out", 1)
        .start()
        .await
        .unwrap();
    write(&cluster, "in", numbered(0, N)).await;
    let config = PipelineConfig::new().commit_interval(Duration::from_millis(50));
    let (input, mut sink) = eos_pipeline(&cluster, "late", "late-1", config).await;
    let handle = input.handle();
    let stopper = async {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let committed = cluster.committed("late", "in", 0).unwrap_or(-1);
            if committed == N as i64 {
                break;
            }
            assert!(Instant::now() < deadline, "committed {committed} of {N}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        handle.close().await;
    };
    let pipeline = input
        .map_ok(|mut m| {
            let shared = m.take_ack_token().share();
            if m.offset == N as i64 - 1 {
                // a side task still busy with the last input: it acks by hand, later
                let late = shared.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    late.ack();
                });
            }
            Out::new(format!("out-{}", m.offset)).with_ack(shared)
        })
        .forward(&mut sink);
    let (done, ()) = tokio::join!(pipeline, stopper);
    done.unwrap();
}

/// The reader's byte capacity bounds what its fetches bring, whatever `max_bytes` says:
/// with 16 partitions of backlog and the default 50 MiB `max_bytes`, one response used
/// to bring 16 × 1 MiB into a reader whose capacity was 1 MiB.
#[tokio::test]
async fn a_fetch_asks_for_no_more_than_the_buffer_has_room_for() {
    let cluster = MockCluster::builder()
        .topic("wide", 16)
        .start()
        .await
        .unwrap();
    // 16 × 1,200 messages of 1 KB: 1.2 MB of backlog per partition, in batches of ~100 KB.
    let value = vec![b'v'; 1000];
    let mut w = Writer::new(writer(&cluster, "wide").batch_size(100)).unwrap();
    w.write_messages((0..16 * 1200).map(|_| Out::new(value.clone())))
        .await
        .unwrap();
    w.close().await.unwrap();

    let cap_bytes = 1 << 20;
    let mut reader = Reader::new(
        reader(&cluster)
            .topic("wide")
            .queue_capacity_bytes(cap_bytes),
    )
    .await
    .unwrap();
    next(&mut reader).await;
    // Not polling any more: the buffer fills to the capacity and no further.
    let slack = 128 * 1024; // one batch past the capacity (KIP-74)
    let deadline = Instant::now() + Duration::from_millis(800);
    let mut most = 0;
    while Instant::now() < deadline {
        let s = reader.stats();
        most = most.max(s.queue_bytes);
        assert!(s.queue_bytes <= cap_bytes + slack, "{s:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        most >= cap_bytes / 2,
        "the buffer never filled: {most} bytes"
    );
    // Reading on, every message arrives once and in order, the bound held throughout.
    let seen = read_all_bounded(&mut reader, 16 * 1200 - 1, cap_bytes + slack).await;
    assert_eq!(seen.values().map(Vec::len).sum::<usize>(), 16 * 1200 - 1);
    reader.close().await;
}

/// [`read_all`], checking after each message that the buffer holds at most `bound` bytes.
async fn read_all_bounded(reader: &mut Reader, n: usize, bound: usize) -> BTreeMap<i32, Vec<i64>> {
    let mut seen: BTreeMap<i32, Vec<i64>> = BTreeMap::new();
    for _ in 0..n {
        let m = next(reader).await;
        let part = seen.entry(m.partition).or_default();
        if let Some(last) = part.last() {
            assert_eq!(
                m.offset,
                last + 1,
                "partition {} gap or repeat",
                m.partition
            );
        }
        part.push(m.offset);
        let s = reader.stats();
        assert!(s.queue_bytes <= bound, "{s:?}");
    }
    seen
}
