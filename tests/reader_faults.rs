//! `Reader` behaviour under connection faults, with a TCP proxy between the reader and
//! tansu: connections cut while fetches are in flight must neither lose nor repeat a
//! message.
//!
//! The test starts its own tansu advertising the proxy's address, so every connection the
//! reader makes — bootstrap, metadata, list offsets and fetch — goes through the proxy.
//! Test data is produced directly to the broker.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use common::proxy::Proxy;
use kafkapipe::conn::{Conn, ProduceOptions};
use kafkapipe::reader::{Reader, ReaderConfig};
use kafkapipe::record::Record;

async fn proxied_broker() -> (Proxy, common::TestBroker) {
    let (proxy, listener) = Proxy::bind().await;
    let addr = proxy.addr.clone();
    let broker = tokio::task::spawn_blocking(move || common::TestBroker::start_advertised(&addr))
        .await
        .unwrap();
    proxy.run(listener, broker.addr.clone());
    (proxy, broker)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_cuts_mid_fetch_lose_and_repeat_nothing() {
    let (proxy, broker) = proxied_broker().await;
    let topic = common::unique_topic("reader-cut");
    let direct = Conn::connect(&broker.addr).await.unwrap();
    direct.create_topic(&topic, 2, 1).await.unwrap();
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
    for chunk in 0..10 {
        produce(chunk * 200, 200).await;
    }
    let mut reader = Reader::new(
        ReaderConfig::new([proxy.addr.clone()])
            .topic(&topic)
            .max_wait(Duration::from_millis(100))
            .max_partition_bytes(4096)
            .queue_capacity(300)
            .read_backoff(Duration::from_millis(10), Duration::from_millis(50)),
    )
    .await
    .unwrap();
    let total = 2 * 4000;
    let mut next = [0i64; 2];
    let mut cuts = 0;
    for n in 0..total {
        let m = tokio::time::timeout(Duration::from_secs(15), reader.next_message())
            .await
            .unwrap_or_else(|_| panic!("no message within 15 s at {n}: {:?}", reader.stats()));
        let m = match m {
            Ok(m) => m,
            // Errors are yielded only after max_attempts failures; tolerate but count.
            Err(e) => panic!("unexpected error after a cut: {e}"),
        };
        let p = m.partition as usize;
        assert_eq!(m.offset, next[p], "partition {p}: gap or repeat");
        assert_eq!(
            m.value.as_deref(),
            Some(format!("{p}-{}", m.offset).as_bytes())
        );
        next[p] += 1;
        if n % 700 == 350 {
            // Cut while fetches are in flight (the buffer is small, so one always is).
            proxy.cut();
            cuts += 1;
        }
        if n == 3000 {
            // More data arrives while reading.
            for chunk in 10..20 {
                produce(chunk * 200, 200).await;
            }
        }
    }
    assert_eq!(next, [4000, 4000]);
    assert!(cuts >= 10);
    let extra = tokio::time::timeout(Duration::from_millis(300), reader.next_message()).await;
    assert!(extra.is_err(), "unexpected extra item {extra:?}");
    eprintln!("cuts: {cuts}, stats: {:?}", reader.stats());
    assert!(reader.stats().errors > 0, "the cuts were noticed");
    reader.close().await;
}
