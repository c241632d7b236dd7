//! Writer behaviour under broker faults, with a TCP proxy between the writer and Apache
//! Kafka: a stalled broker (backpressure) and connections cut mid-stream (retries).
//!
//! Each test starts its own Kafka broker advertising the proxy's address, so every
//! connection the writer makes — bootstrap, metadata and produce — goes through the proxy.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::proxy::proxied_broker;
use common::read_partition;
use futures::SinkExt;
use kafkapipe::conn::Conn;
use kafkapipe::writer::{Hash, Message, Writer, WriterConfig};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_broker_applies_backpressure_then_resumes() {
    let (proxy, broker) = proxied_broker().await;
    let direct = Conn::connect(&broker.addr).await.unwrap();
    let topic = common::unique_topic("faults-stall");
    direct.create_topic(&topic, 1, 1).await.unwrap();
    common::wait_for_topic(&direct, &topic, 1).await;

    const BOUND: usize = 64 * 1024;
    let mut writer = Writer::new(
        WriterConfig::new([proxy.addr.clone()])
            .topic(&topic)
            .max_buffered_bytes(BOUND)
            .batch_timeout(Duration::from_millis(1))
            .request_timeout(Duration::from_secs(60)),
    )
    .unwrap();
    writer.write_messages([Message::new("warm")]).await.unwrap();

    proxy.pause(true);
    let value = vec![b'v'; 1000];
    // The bound counts each message's size plus the message struct itself.
    let msg_size = Message::new(value.clone()).size() + std::mem::size_of::<Message>();
    let mut accepted = 0usize;
    loop {
        let feed = writer.feed(Message::new(value.clone()));
        match tokio::time::timeout(Duration::from_millis(300), feed).await {
            Ok(r) => {
                r.unwrap();
                accepted += 1;
                assert!(accepted < 1000, "no backpressure after {accepted} messages");
            }
            Err(_) => break,
        }
    }
    let stats = writer.stats();
    eprintln!("stalled after {accepted} messages: {stats:?}");
    assert!(
        accepted >= BOUND / msg_size,
        "bound reached too early: {accepted}"
    );
    assert!(
        stats.buffered_bytes as usize <= BOUND + msg_size,
        "buffer exceeded its bound: {stats:?}"
    );
    // Still stalled a while later: nothing moves while the broker is unreachable.
    let feed = writer.feed(Message::new(value.clone()));
    assert!(tokio::time::timeout(Duration::from_millis(500), feed)
        .await
        .is_err());

    proxy.pause(false);
    let started = Instant::now();
    for _ in 0..100 {
        writer.feed(Message::new(value.clone())).await.unwrap();
    }
    writer.close().await.unwrap();
    eprintln!("resumed and drained in {:?}", started.elapsed());
    let stats = writer.stats();
    assert_eq!(stats.messages as usize, 1 + accepted + 100, "{stats:?}");
    assert_eq!(stats.buffered_bytes, 0);
    let got = read_partition(&direct, &topic, 0).await;
    assert_eq!(got.len(), 1 + accepted + 100);
}

/// Write 40k keyed messages while cutting every proxied connection four times; return
/// the number of duplicates read back (retried batches written twice).
async fn cut_connections_mid_stream(idempotent: bool) -> (usize, u64) {
    let (proxy, broker) = proxied_broker().await;
    let direct = Conn::connect(&broker.addr).await.unwrap();
    let topic = common::unique_topic("faults-cut");
    direct.create_topic(&topic, 4, 1).await.unwrap();
    common::wait_for_topic(&direct, &topic, 4).await;

    const N: usize = 40_000;
    const KEYS: usize = 100;
    let mut writer = Writer::new(
        WriterConfig::new([proxy.addr.clone()])
            .topic(&topic)
            .balancer(Hash::default())
            .max_buffered_bytes(256 * 1024)
            .backoff(Duration::from_millis(10), Duration::from_millis(100))
            .request_timeout(Duration::from_secs(5))
            .idempotent(idempotent),
    )
    .unwrap();
    let mut stalled = false;
    for i in 0..N {
        if i > 0 && i % (N / 5) == 0 {
            // Stall the proxy so produce requests are stuck in it when it cuts: every cut
            // then hits requests in flight, and the writer must retry them.
            proxy.pause(true);
            stalled = true;
        }
        let msg = Message::keyed(format!("key-{}", i % KEYS), format!("{}", i / KEYS));
        loop {
            // Stalled: a full buffer for 200 ms means requests are stuck in the proxy.
            // Not stalled: the broker answers, if slowly (a cold JVM's first produce to
            // fresh partitions on a busy machine can take a second); only a writer that
            // stays stuck past its write timeout is wrong.
            let patience = if stalled {
                Duration::from_millis(200)
            } else {
                Duration::from_secs(10)
            };
            let fed = tokio::time::timeout(patience, writer.feed(msg.clone())).await;
            match fed {
                Ok(r) => {
                    r.unwrap();
                    break;
                }
                // The buffer is full of unacknowledged messages: requests are stuck in
                // the stalled proxy. Cut them, resume, and feed this message again.
                Err(_) if stalled => {
                    proxy.cut();
                    proxy.pause(false);
                    stalled = false;
                }
                Err(_) => panic!(
                    "writer stalled without a stalled proxy at {i}: {:?}",
                    writer.stats()
                ),
            }
        }
    }
    if stalled {
        proxy.cut();
        proxy.pause(false);
    }
    writer.close().await.unwrap();
    let stats = writer.stats();
    eprintln!("after 4 cuts: {stats:?}");
    assert_eq!(stats.messages as usize, N);
    assert_eq!(stats.errors, 0);

    // Every message present; per key, first occurrences in order. Without idempotence a
    // batch whose response was lost in a cut may have been written twice: duplicates are
    // counted, not failed.
    let mut dups = 0;
    let mut total = 0;
    for p in 0..4 {
        let mut next: HashMap<bytes::Bytes, u64> = HashMap::new();
        for r in read_partition(&direct, &topic, p).await {
            total += 1;
            let key = r.key.clone().unwrap();
            let seq: u64 = std::str::from_utf8(r.value.as_deref().unwrap())
                .unwrap()
                .parse()
                .unwrap();
            let want = next.entry(key.clone()).or_default();
            if seq < *want {
                dups += 1;
            } else {
                assert_eq!(seq, *want, "key {key:?}: gap in partition {p}");
                *want += 1;
            }
        }
        for (key, n) in next {
            assert_eq!(n as usize, N / KEYS, "key {key:?} incomplete");
        }
    }
    eprintln!(
        "idempotent={idempotent}: {total} records read, {dups} duplicates from retried batches"
    );
    assert_eq!(total - dups, N);
    (dups, stats.retries)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_cut_mid_stream_lose_nothing() {
    cut_connections_mid_stream(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotent_writer_writes_retried_batches_once() {
    let (dups, retries) = cut_connections_mid_stream(true).await;
    assert!(retries > 0, "the cuts caused retries");
    assert_eq!(
        dups, 0,
        "idempotence must drop the duplicates of retried batches"
    );
}

/// Forward 20k numbered messages with a writer of default settings (acks=all) through a
/// 10-second outage of its only broker: SIGKILL once a quarter of the stream is accepted,
/// the stream goes on while the broker is down, restart after 10 s, the rest after it.
/// Returns how often each number was read back.
async fn forward_through_broker_outage(idempotent: bool) -> Vec<u32> {
    use futures::StreamExt;
    use std::sync::Arc;
    use tokio::sync::{watch, Notify};

    const N: usize = 20_000;
    const PARTITIONS: i32 = 3;
    let mut broker = tokio::task::spawn_blocking(common::TestBroker::start)
        .await
        .unwrap();
    let addr = broker.addr.clone();
    let direct = Conn::connect(&addr).await.unwrap();
    let topic = common::unique_topic("faults-outage");
    direct.create_topic(&topic, PARTITIONS, 1).await.unwrap();
    common::wait_for_topic(&direct, &topic, PARTITIONS).await;
    direct.close().await;

    let mut config = WriterConfig::new([addr.clone()]).topic(&topic);
    if idempotent {
        config = config.idempotent(true);
    }
    let mut writer = Writer::new(config).unwrap();
    // Count acknowledgements, so the broker is killed only once the writer is writing.
    let mut deliveries = writer.deliveries();
    let writing = Arc::new(Notify::new());
    let acked = writing.clone();
    let reports = tokio::spawn(async move {
        let (mut ok, mut failed) = (0usize, 0usize);
        while let Some(d) = deliveries.next().await {
            match d.result {
                Ok(_) => ok += 1,
                Err(_) => failed += 1,
            }
            if ok == N / 8 {
                acked.notify_one();
            }
        }
        (ok, failed)
    });
    // Phase 0: broker up; 1: broker killed; 2: broker restarted.
    let (phase_tx, phase_rx) = watch::channel(0u8);
    let quarter = Arc::new(Notify::new());
    let reached = quarter.clone();
    let messages = futures::stream::iter(0..N).then(move |i| {
        let mut phase = phase_rx.clone();
        let reached = reached.clone();
        async move {
            if i == N / 4 {
                reached.notify_one();
                phase.wait_for(|p| *p >= 1).await.unwrap();
            }
            if i == N / 2 {
                phase.wait_for(|p| *p >= 2).await.unwrap();
            }
            Ok(Message::new(i.to_string()))
        }
    });
    let forward = tokio::spawn(async move {
        let result = messages.forward(&mut writer).await;
        (result, writer)
    });

    quarter.notified().await;
    writing.notified().await;
    let mut broker = tokio::task::spawn_blocking(move || {
        broker.node.kill();
        broker
    })
    .await
    .unwrap();
    let _ = phase_tx.send(1);
    eprintln!("broker killed; down for 10 s");
    tokio::time::sleep(Duration::from_secs(10)).await;
    let broker = tokio::task::spawn_blocking(move || {
        broker.node.restart();
        broker
    })
    .await
    .unwrap();
    eprintln!("broker restarted in {:?}", broker.node.startup);
    let _ = phase_tx.send(2); // no receiver left if the stream already failed

    let (result, mut writer) = forward.await.unwrap();
    result.unwrap_or_else(|e| panic!("the writer gave up: {e}; {:?}", writer.stats()));
    writer.close().await.unwrap();
    let stats = writer.stats();
    eprintln!("idempotent={idempotent}: {stats:?}");
    assert_eq!(stats.messages as usize, N, "{stats:?}");
    assert_eq!(stats.errors, 0, "{stats:?}");
    assert!(stats.retries > 0, "the outage caused retries: {stats:?}");
    assert_eq!(reports.await.unwrap(), (N, 0), "delivery reports");

    let direct = Conn::connect(&broker.addr).await.unwrap();
    let mut seen = vec![0u32; N];
    for p in 0..PARTITIONS {
        for r in read_partition(&direct, &topic, p).await {
            let i: usize = std::str::from_utf8(r.value.as_deref().unwrap())
                .unwrap()
                .parse()
                .unwrap();
            seen[i] += 1;
        }
    }
    let lost: Vec<usize> = (0..N).filter(|i| seen[*i] == 0).collect();
    let dups: u32 = seen.iter().map(|n| n.saturating_sub(1)).sum();
    eprintln!(
        "idempotent={idempotent}: {} lost, {dups} duplicates",
        lost.len()
    );
    assert!(
        lost.is_empty(),
        "{} messages lost, e.g. {:?}",
        lost.len(),
        &lost[..lost.len().min(10)]
    );
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_writer_keeps_writing_through_a_broker_outage() {
    forward_through_broker_outage(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotent_writer_writes_once_through_a_broker_outage() {
    let seen = forward_through_broker_outage(true).await;
    assert!(
        seen.iter().all(|n| *n == 1),
        "idempotence must drop the duplicates of retried batches"
    );
}
