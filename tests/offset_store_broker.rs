//! `ReaderConfig::offset_store` on Apache Kafka: the application's own offsets decide where
//! a group reader's assigned partitions start; partitions the store leaves out start at
//! the group's committed offset; a failing store is retried like a failed OffsetFetch.
//! (`examples/sqlite_offsets.rs`, run by tests/examples_broker.rs, crashes a worker
//! mid-transaction and checks nothing is lost or repeated.)

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kafkapipe::admin::Admin;
use kafkapipe::conn::{Conn, ProduceOptions};
use kafkapipe::reader::{Reader, ReaderConfig, TopicPartition};
use kafkapipe::record::Record;
use kafkapipe::{Error, ErrorKind};

async fn topic_with_records(prefix: &str, partitions: i32, n: usize) -> String {
    let topic = common::unique_topic(prefix);
    let conn = Conn::connect(&common::shared().addr).await.unwrap();
    conn.create_topic(&topic, partitions, 1).await.unwrap();
    common::wait_for_topic(&conn, &topic, partitions).await;
    for p in 0..partitions {
        let records: Vec<Record> = (0..n)
            .map(|i| Record::new(format!("k{i}"), format!("{p}-{i}")))
            .collect();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            match conn
                .produce(&topic, p, &records, &ProduceOptions::default())
                .await
            {
                Ok(_) => break,
                Err(e) if e.is_retriable() && std::time::Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(50)).await
                }
                Err(e) => panic!("produce: {e}"),
            }
        }
    }
    conn.close().await;
    topic
}

fn config(group: &str, topic: &str) -> ReaderConfig {
    ReaderConfig::new([common::shared().addr.clone()])
        .group_id(group)
        .topic(topic)
        .max_wait(Duration::from_millis(50))
        .session_timeout(Duration::from_secs(6))
        .heartbeat_interval(Duration::from_millis(300))
        .join_backoff(Duration::from_millis(100))
        .read_backoff(Duration::from_millis(50), Duration::from_millis(200))
}

/// The first offset read of each partition, once every partition delivered one.
async fn first_offsets(reader: &mut Reader, partitions: usize) -> BTreeMap<i32, i64> {
    let mut first = BTreeMap::new();
    while first.len() < partitions {
        let m = tokio::time::timeout(Duration::from_secs(30), reader.next())
            .await
            .expect("a message in time")
            .expect("the stream goes on")
            .unwrap_or_else(|e| panic!("reader error: {e}"));
        first.entry(m.partition).or_insert(m.offset);
    }
    first
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_decides_where_partitions_start_and_the_group_covers_the_rest() {
    common::init_log();
    let topic = topic_with_records("store-start", 3, 100).await;
    let group = common::unique_topic("store-start-g");
    // the group committed 10 on every partition...
    let admin = Admin::connect([common::shared().addr.clone()]).unwrap();
    let commits: Vec<(kafkapipe::admin::TopicPartition, i64)> = (0..3)
        .map(|p| (kafkapipe::admin::TopicPartition::new(&topic, p), 10))
        .collect();
    for (_, r) in admin.commit_group_offsets(&group, &commits).await.unwrap() {
        r.unwrap();
    }
    // ...and the store knows partitions 0 (at 50) and 2 (at 99)
    let asked = Arc::new(std::sync::Mutex::new(Vec::new()));
    let store_topic = topic.clone();
    let seen = asked.clone();
    let mut reader = Reader::new(config(&group, &topic).offset_store(
        move |partitions: Vec<TopicPartition>| {
            seen.lock().unwrap().push(partitions.clone());
            let known = HashMap::from([
                (TopicPartition::new(&store_topic, 0), 50),
                (TopicPartition::new(&store_topic, 2), 99),
            ]);
            async move { Ok(known) }
        },
    ))
    .await
    .unwrap();
    let first = first_offsets(&mut reader, 3).await;
    reader.close().await;
    assert_eq!(first, BTreeMap::from([(0, 50), (1, 10), (2, 99)]));
    let mut asked_for: Vec<TopicPartition> = asked.lock().unwrap().concat();
    asked_for.sort_by_key(|tp| tp.partition);
    assert_eq!(
        asked_for,
        (0..3)
            .map(|p| TopicPartition::new(&topic, p))
            .collect::<Vec<_>>(),
        "the store is asked about exactly the assigned partitions"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_store_is_retried_and_a_negative_offset_is_an_error() {
    common::init_log();
    let topic = topic_with_records("store-fail", 1, 20).await;

    // fails twice, then answers: the reader starts where it said, with no error item
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = calls.clone();
    let store_topic = topic.clone();
    let mut reader = Reader::new(
        config(&common::unique_topic("store-fail-g"), &topic).offset_store(
            move |_: Vec<TopicPartition>| {
                let call = counted.fetch_add(1, Ordering::SeqCst);
                let tp = TopicPartition::new(&store_topic, 0);
                async move {
                    if call < 2 {
                        Err(Error::new(ErrorKind::Io, "database is restarting"))
                    } else {
                        Ok(HashMap::from([(tp, 15)]))
                    }
                }
            },
        ),
    )
    .await
    .unwrap();
    assert_eq!(
        first_offsets(&mut reader, 1).await,
        BTreeMap::from([(0, 15)])
    );
    reader.close().await;
    assert!(calls.load(Ordering::SeqCst) >= 3);

    // a negative answer is the store's bug: an error item names it, nothing is read
    let store_topic = topic.clone();
    let mut reader = Reader::new(
        config(&common::unique_topic("store-neg-g"), &topic)
            .retry_timeout(Duration::from_millis(500))
            .offset_store(move |_: Vec<TopicPartition>| {
                let tp = TopicPartition::new(&store_topic, 0);
                async move { Ok(HashMap::from([(tp, -3)])) }
            }),
    )
    .await
    .unwrap();
    let item = tokio::time::timeout(Duration::from_secs(30), reader.next())
        .await
        .expect("an item in time")
        .expect("the stream goes on");
    let err = item.expect_err("no record may be read from an invalid start");
    assert!(err.to_string().contains("-3"), "{err}");
    reader.close().await;
}

#[tokio::test]
async fn a_reader_without_a_group_refuses_a_store() {
    let Err(err) = Reader::new(
        ReaderConfig::new(["127.0.0.1:1"])
            .topic("t")
            .offset_store(|_: Vec<TopicPartition>| async { Ok(HashMap::new()) }),
    )
    .await
    else {
        panic!("a reader without a group took an offset store");
    };
    assert_eq!(err.kind(), ErrorKind::Config, "{err}");
}
