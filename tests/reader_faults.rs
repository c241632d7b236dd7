//! `Reader` behaviour under connection faults, with a TCP proxy between the reader and
//! Apache Kafka: connections cut while fetches are in flight must neither lose nor repeat
//! a message.
//!
//! The test starts its own Kafka broker advertising the proxy's address, so every connection the
//! reader makes — bootstrap, metadata, list offsets and fetch — goes through the proxy.
//! Test data is produced directly to the broker.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use common::proxy::proxied_broker;
use kafkapipe::conn::{Conn, ProduceOptions};
use kafkapipe::reader::{Reader, ReaderConfig};
use kafkapipe::record::Record;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_cuts_mid_fetch_lose_and_repeat_nothing() {
    let (proxy, broker) = proxied_broker().await;
    let topic = common::unique_topic("reader-cut");
    let direct = Conn::connect(&broker.addr).await.unwrap();
    direct.create_topic(&topic, 2, 1).await.unwrap();
    common::wait_for_topic(&direct, &topic, 2).await;
    let produce = |from: usize, n: usize| {
        let topic = topic.clone();
        let direct = &direct;
        async move {
            for p in 0..2 {
                let records: Vec<Record> = (from..from + n)
                    .map(|i| Record::new(format!("k{i}"), format!("{p}-{i}")))
                    .collect();
                direct
                    .produce(&topic, p, &records, &ProduceOptions::default())
                    .await
                    .unwrap();
            }
        }
    };
    // Small batches and small fetches: many fetches, so many chances to cut one.
    for chunk in 0..100 {
        produce(chunk * 20, 20).await;
    }
    let mut reader = Reader::new(
        ReaderConfig::new([proxy.addr.clone()])
            .topic(&topic)
            .max_wait(Duration::from_millis(100))
            .max_partition_bytes(512)
            .max_bytes(1024)
            .queue_capacity(100)
            .read_backoff(Duration::from_millis(10), Duration::from_millis(50)),
    )
    .await
    .unwrap();
    let total = 2 * 4000;
    let mut next = [0i64; 2];
    let mut cuts = 0;
    let mut mid_fetch = 0u32;
    let mut paused_at: Option<u64> = None;
    let mut n = 0;
    while n < total {
        if let Some(sent) = paused_at {
            // A fetch was sent into the stalled proxy (or the buffer ran dry, so one is
            // waiting there): cut it mid-flight. Its response, if any, is lost.
            let s = reader.stats();
            if s.fetches > sent || s.queue_length == 0 {
                tokio::time::sleep(Duration::from_millis(20)).await;
                mid_fetch += u32::from(reader.stats().fetches > sent);
                proxy.cut();
                proxy.pause(false);
                paused_at = None;
                cuts += 1;
            }
        }
        let m = tokio::time::timeout(Duration::from_secs(15), reader.next_message())
            .await
            .unwrap_or_else(|_| panic!("no message within 15 s at {n}: {:?}", reader.stats()));
        // Cut connections are transient failures: retried, never yielded (within the
        // default 5 minute retry timeout).
        let m = m.unwrap_or_else(|e| panic!("a transient error was yielded at {n}: {e}"));
        let p = m.partition as usize;
        assert_eq!(m.offset, next[p], "partition {p}: gap or repeat");
        assert_eq!(
            m.value.as_deref(),
            Some(format!("{p}-{}", m.offset).as_bytes())
        );
        next[p] += 1;
        n += 1;
        if n % 200 == 100 && paused_at.is_none() {
            proxy.pause(true);
            paused_at = Some(reader.stats().fetches);
        }
        if n == 3000 {
            // More data arrives while reading.
            for chunk in 100..200 {
                produce(chunk * 20, 20).await;
            }
        }
    }
    assert_eq!(next, [4000, 4000]);
    // Typically 40 cuts. `mid_fetch` counts those where a fetch was seen being sent into
    // the stalled proxy (2 to 30 per run); a fetch sent just before the stall is stuck
    // there too but not counted. `retries` below proves requests died.
    assert!(
        cuts >= 10,
        "{cuts} cuts ({mid_fetch} mid-fetch) {:?}",
        reader.stats()
    );
    assert!(
        mid_fetch >= 1,
        "only {mid_fetch} cuts hit a fetch in flight"
    );
    let extra = tokio::time::timeout(Duration::from_millis(300), reader.next_message()).await;
    assert!(extra.is_err(), "unexpected extra item {extra:?}");
    eprintln!(
        "cuts: {cuts} ({mid_fetch} mid-fetch), stats: {:?}",
        reader.stats()
    );
    let stats = reader.stats();
    assert!(
        stats.errors > 0 && stats.retries > 0,
        "the cuts were noticed: {stats:?}"
    );
    reader.close().await;
    direct.close().await;
    proxy.cut();
}
