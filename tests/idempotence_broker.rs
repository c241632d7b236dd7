//! The idempotent writer (on by default, up to 5 batches in flight per partition) on real
//! Apache Kafka: connections cut mid-request by a TCP proxy, and the partition leader of
//! a 3-node cluster (RF 3, min.insync.replicas 2) SIGKILLed mid-produce. Read back, each
//! partition must hold every record exactly once and in the order written.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::proxy::proxied_broker;
use futures::SinkExt;
use kafkapipe::conn::Conn;
use kafkapipe::writer::{Message, Writer, WriterConfig};

/// Every value of a partition, in offset order, read from `conn` (its leader).
async fn values(conn: &Conn, topic: &str, partition: i32) -> Vec<u64> {
    common::read_values(conn, topic, partition).await
}

/// Checks one partition's values are exactly `0..n` in order; returns (duplicates, lost).
fn check(partition: i32, got: &[u64], n: u64) -> (usize, usize) {
    let mut seen = vec![0u32; n as usize];
    for v in got {
        if let Some(c) = seen.get_mut(*v as usize) {
            *c += 1;
        }
    }
    let dups = seen.iter().map(|c| c.saturating_sub(1) as usize).sum();
    if let Some(first) = seen.iter().position(|c| *c > 1) {
        let at: Vec<usize> = got
            .iter()
            .enumerate()
            .filter(|(_, v)| **v == first as u64)
            .map(|(i, _)| i)
            .collect();
        eprintln!("partition {partition}: value {first} first duplicated, at offsets {at:?}");
    }
    let lost = seen.iter().filter(|c| **c == 0).count();
    if dups == 0 && lost == 0 {
        assert!(
            got.windows(2).all(|w| w[0] < w[1]),
            "partition {partition}: out of order"
        );
    }
    (dups, lost)
}

/// The message with sequence `seq` of `partition`.
fn msg(partition: i32, seq: u64) -> Message {
    Message::new(format!("{seq:07}")).with_partition(partition)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_cut_mid_request_leave_no_duplicate_and_no_gap() {
    common::init_log();
    let (proxy, broker) = proxied_broker().await;
    let direct = Conn::connect(&broker.addr).await.unwrap();
    let topic = common::unique_topic("idem-cuts");
    const PARTITIONS: i32 = 3;
    const N: u64 = 50_000;
    direct.create_topic(&topic, PARTITIONS, 1).await.unwrap();
    common::wait_for_topic(&direct, &topic, PARTITIONS).await;

    // Defaults: idempotent, acks=all, 5 batches in flight per partition. Small batches
    // keep many requests in flight when the proxy cuts.
    let config = WriterConfig::new([proxy.addr.clone()])
        .topic(&topic)
        .batch_size(200)
        .backoff(Duration::from_millis(5), Duration::from_millis(50))
        .request_timeout(Duration::from_secs(5));
    assert!(config.is_idempotent());
    let mut writer = Writer::new(config).unwrap();

    let done = Arc::new(AtomicBool::new(false));
    let cutter = {
        let done = done.clone();
        let proxy = Arc::new(proxy);
        let p = proxy.clone();
        tokio::spawn(async move {
            let mut cuts = 0u32;
            while !done.load(Ordering::Relaxed) {
                tokio::time::sleep(Duration::from_millis(40)).await;
                p.cut();
                cuts += 1;
            }
            cuts
        })
    };
    let started = Instant::now();
    for i in 0..N * PARTITIONS as u64 {
        let p = (i % PARTITIONS as u64) as i32;
        writer.feed(msg(p, i / PARTITIONS as u64)).await.unwrap();
    }
    writer.close().await.unwrap();
    done.store(true, Ordering::Relaxed);
    let cuts = cutter.await.unwrap();
    let stats = writer.stats();
    eprintln!(
        "{} records in {:?} with {cuts} cuts: {stats:?}",
        N * 3,
        started.elapsed()
    );
    assert_eq!(stats.errors, 0, "{stats:?}");
    assert_eq!(stats.messages, N * PARTITIONS as u64);
    assert!(
        stats.retries > 0,
        "the cuts hit requests in flight: {stats:?}"
    );
    for p in 0..PARTITIONS {
        let got = values(&direct, &topic, p).await;
        assert_eq!(
            check(p, &got, N),
            (0, 0),
            "partition {p}: (duplicates, lost)"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_sigkill_mid_produce_leaves_no_duplicate_and_no_gap() {
    common::init_log();
    let mut cluster = tokio::task::block_in_place(|| common::TestCluster::start(3));
    let topic = common::unique_topic("idem-kill");
    tokio::task::block_in_place(|| cluster.create_topic(&topic, 1));
    let bootstrap = cluster.addrs();
    const N: u64 = 50_000;

    let leader = {
        let conn = Conn::connect(&bootstrap[0]).await.unwrap();
        let md = conn.metadata(Some(&[topic.as_str()])).await.unwrap();
        md.topic(&topic).unwrap().partitions[0].leader
    };
    let mut writer = Writer::new(
        WriterConfig::new(bootstrap.clone())
            .topic(&topic)
            .batch_size(200)
            // A small buffer paces the feed by the acknowledgements, so requests are in
            // flight when the leader dies.
            .max_buffered_bytes(64 * 1024)
            .backoff(Duration::from_millis(20), Duration::from_millis(500)),
    )
    .unwrap();
    let started = Instant::now();
    let mut killed = false;
    for i in 0..N {
        if !killed && writer.stats().messages >= N / 3 {
            tokio::task::block_in_place(|| cluster.node(leader).kill());
            killed = true;
            eprintln!(
                "killed leader {leader} at {i} accepted, {} acknowledged, after {:?}",
                writer.stats().messages,
                started.elapsed()
            );
        }
        writer.feed(msg(0, i)).await.unwrap();
    }
    writer.close().await.unwrap();
    let stats = writer.stats();
    eprintln!("{N} records in {:?}: {stats:?}", started.elapsed());
    assert_eq!(stats.errors, 0, "{stats:?}");
    assert_eq!(stats.messages, N);
    assert!(
        killed && stats.retries > 0,
        "the kill hit requests: {stats:?}"
    );

    let live = cluster.live_addr();
    let conn = Conn::dial_leader(&live, &topic, 0, Default::default())
        .await
        .unwrap();
    let got = values(&conn, &topic, 0).await;
    assert_eq!(check(0, &got, N), (0, 0), "(duplicates, lost)");
}
