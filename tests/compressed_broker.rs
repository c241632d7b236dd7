//! Real-broker tests of compressed partitions whose fetch responses decompress to more
//! than one response's decompression budget (`32 × max_bytes`, at least 64 MiB): the
//! `Reader` with default settings and `Conn::fetch` must make progress through them
//! (they used to discard such a response and fetch the same bytes forever).
//!
//! Two layouts, 1 000 000 records of 100 bytes each:
//! - zstd, batches of 10 000 records on a default topic: constant values compress ~75×,
//!   so one 1 MiB (compressed) partition response holds ~75 MiB of records;
//! - lz4, one batch of all the records on a topic allowing 16 MiB batches: lz4 reaches
//!   only ~22× on these records, so with Kafka's default 1 MiB `max.message.bytes` it
//!   never crosses the budget; a single ~5 MB batch holding ~111 MB does.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::{Duration, Instant};

use kafkapipe::compression::Compression;
use kafkapipe::conn::{Conn, FetchOptions, NewTopic, ProduceOptions};
use kafkapipe::reader::{Reader, ReaderConfig};
use kafkapipe::record::Record;

const N: usize = 1_000_000;
const VALUE: [u8; 100] = [b'x'; 100];

async fn admin() -> Conn {
    Conn::connect(&common::shared().addr).await.unwrap()
}

/// A one-partition topic with `configs`, holding `N` records of `codec`, produced in
/// batches of `batch` records.
async fn compressed_topic(
    prefix: &str,
    configs: &[(&str, &str)],
    codec: Compression,
    batch: usize,
) -> String {
    let topic = common::unique_topic(prefix);
    let conn = admin().await;
    let mut t = NewTopic::new(&topic, 1).replication_factor(1);
    for (k, v) in configs {
        t = t.config(*k, *v);
    }
    for (name, r) in conn.create_topics(&[t]).await.unwrap() {
        r.unwrap_or_else(|e| panic!("create {name}: {e}"));
    }
    common::wait_for_topic(&conn, &topic, 1).await;
    let opts = ProduceOptions::default().compression(codec);
    let started = Instant::now();
    let value = bytes::Bytes::from_static(&VALUE);
    let mut i = 0;
    while i < N {
        let end = (i + batch).min(N);
        let records: Vec<Record> = (i..end)
            .map(|_| Record {
                offset: 0,
                timestamp: -1,
                key: None,
                value: Some(value.clone()),
                headers: Vec::new(),
            })
            .collect();
        let base = conn.produce(&topic, 0, &records, &opts).await.unwrap();
        assert_eq!(base, i as i64);
        i = end;
    }
    assert_eq!(conn.last_offset(&topic, 0).await.unwrap(), N as i64);
    eprintln!(
        "{codec}: produced {N} records in batches of {batch} in {:?}",
        started.elapsed()
    );
    conn.close().await;
    topic
}

/// Read `topic` to its end with a `Reader` with default settings, checking that every
/// offset arrives once, in order, and no error is yielded.
async fn read_all_with_defaults(topic: &str, codec: Compression) {
    let started = Instant::now();
    let mut reader = Reader::new(ReaderConfig::new([common::shared().addr.clone()]).topic(topic))
        .await
        .unwrap();
    let mut expect = 0i64;
    while expect < N as i64 {
        // A hang detector, not a speed check: before the fix nothing ever arrived.
        let m = match tokio::time::timeout(Duration::from_secs(60), reader.next_message()).await {
            Ok(m) => m.unwrap_or_else(|e| panic!("{codec}: error at offset {expect}: {e}")),
            Err(_) => panic!(
                "{codec}: no message within 60 s at offset {expect}; stats {:?}",
                reader.stats()
            ),
        };
        assert_eq!(m.offset, expect, "{codec}: offsets not contiguous");
        assert_eq!(m.value.as_deref(), Some(&VALUE[..]));
        expect += 1;
    }
    let elapsed = started.elapsed();
    let stats = reader.stats();
    assert_eq!(stats.messages, N as u64, "{stats:?}");
    assert_eq!(stats.errors, 0, "{stats:?}");
    assert_eq!(reader.lag(), 0);
    eprintln!(
        "{codec}: read {N} records with default settings in {elapsed:?} ({} fetches, peak rss {} MiB)",
        stats.fetches,
        common::proc_memory_mib("self", "VmHWM").unwrap_or(0)
    );
    reader.close().await;
}

/// `Conn::fetch` with default options from `from`: must return a non-empty, contiguous
/// prefix starting at `from`, and `next_offset` right after it.
async fn fetch_makes_progress(conn: &Conn, topic: &str, from: i64) -> i64 {
    let f = conn
        .fetch(topic, 0, from, &FetchOptions::default())
        .await
        .unwrap_or_else(|e| panic!("fetch {topic} at {from}: {e}"));
    assert!(!f.records.is_empty(), "no progress at {from}");
    for (k, r) in f.records.iter().enumerate() {
        assert_eq!(r.offset, from + k as i64);
    }
    let last = f.records.last().map(|r| r.offset).unwrap();
    assert_eq!(f.next_offset, last + 1);
    assert_eq!(f.high_watermark, N as i64);
    f.next_offset
}

/// The zstd topic: batches of 10 000 records on a default topic. Shared by the tests of
/// this binary (produced once).
async fn zstd_topic() -> &'static str {
    static TOPIC: tokio::sync::OnceCell<String> = tokio::sync::OnceCell::const_new();
    TOPIC
        .get_or_init(|| compressed_topic("compressed-zstd", &[], Compression::Zstd, 10_000))
        .await
}

/// The lz4 topic: one batch of all `N` records, on a topic allowing 16 MiB batches.
async fn lz4_topic() -> &'static str {
    static TOPIC: tokio::sync::OnceCell<String> = tokio::sync::OnceCell::const_new();
    TOPIC
        .get_or_init(|| {
            compressed_topic(
                "compressed-lz4",
                &[("max.message.bytes", "16777216")],
                Compression::Lz4,
                N,
            )
        })
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reader_with_defaults_reads_a_million_zstd_records_past_the_budget() {
    read_all_with_defaults(zstd_topic().await, Compression::Zstd).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reader_with_defaults_reads_a_million_lz4_records_in_one_huge_batch() {
    read_all_with_defaults(lz4_topic().await, Compression::Lz4).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conn_fetch_makes_progress_past_the_budget() {
    let conn = admin().await;
    // zstd: each response holds more than the budget; a prefix of its batches comes
    // back, and the next fetch continues right after it.
    let topic = zstd_topic().await;
    let mut at = 0;
    let mut fetches = 0;
    while at < N as i64 {
        let next = fetch_makes_progress(&conn, topic, at).await;
        assert!(next > at, "{next}");
        at = next;
        fetches += 1;
    }
    assert_eq!(at, N as i64);
    eprintln!("zstd: Conn::fetch read {N} records in {fetches} fetches");
    // lz4: the response is one batch larger than the budget, under the hard cap.
    assert_eq!(
        fetch_makes_progress(&conn, lz4_topic().await, 0).await,
        N as i64
    );
    conn.close().await;
}
