//! Real-broker tests of consumer groups against tansu: membership and rebalances of
//! several kafkapipe readers, committed offsets (never regressing, ending at the log end),
//! dropping revoked partitions' buffered messages, commit on close and restart from the
//! committed offsets.
//!
//! tansu's first group join takes a few seconds, so each test sizes its timeouts
//! generously and the tests run concurrently (one topic and group each).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use kafkapipe::admin::Admin;
use kafkapipe::conn::{Conn, ProduceOptions};
use kafkapipe::group::{CommitMode, GroupEvent};
use kafkapipe::reader::{Message, Reader, ReaderConfig, TopicPartition};
use kafkapipe::record::Record;

async fn conn() -> Conn {
    Conn::connect(&common::shared().addr).await.unwrap()
}

async fn new_topic(prefix: &str, partitions: i32) -> String {
    let topic = common::unique_topic(prefix);
    conn()
        .await
        .create_topic(&topic, partitions, 1)
        .await
        .unwrap();
    topic
}

fn group_config(group: &str, topic: &str) -> ReaderConfig {
    ReaderConfig::new([common::shared().addr.clone()])
        .group_id(group)
        .topic(topic)
        .max_wait(Duration::from_millis(50))
        .session_timeout(Duration::from_secs(6))
        .heartbeat_interval(Duration::from_millis(300))
        .rebalance_timeout(Duration::from_secs(5))
        .join_backoff(Duration::from_millis(200))
}

/// Produce `n` records `"{partition}-{i}"` to every partition of `topic`.
async fn produce(topic: &str, partitions: i32, from: usize, n: usize) {
    let conn = conn().await;
    for p in 0..partitions {
        let mut i = from;
        while i < from + n {
            let end = (i + 500).min(from + n);
            let records: Vec<Record> = (i..end)
                .map(|k| Record::new(format!("k{k}"), format!("{p}-{k}")))
                .collect();
            conn.produce(topic, p, &records, &ProduceOptions::default())
                .await
                .unwrap();
            i = end;
        }
    }
}

async fn committed(group: &str, topic: &str) -> BTreeMap<i32, i64> {
    let admin = Admin::connect([common::shared().addr.clone()]).unwrap();
    let mut out = BTreeMap::new();
    for (tp, r) in admin
        .fetch_group_offsets(group, Some(&[topic]))
        .await
        .unwrap()
    {
        out.insert(tp.partition, r.unwrap().offset);
    }
    out
}

async fn next(reader: &mut Reader, within: Duration) -> Message {
    tokio::time::timeout(within, reader.next_message())
        .await
        .expect("a message in time")
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_member_commits_on_close_and_restarts_from_commit() {
    let topic = new_topic("group-single", 2).await;
    let group = common::unique_topic("group-single-g");
    produce(&topic, 2, 0, 10).await;

    let mut reader = Reader::new(group_config(&group, &topic).commit_mode(CommitMode::Sync))
        .await
        .unwrap();
    let mut events = reader.events().unwrap();
    let mut committer = reader.committer().unwrap();
    let mut seen = Vec::new();
    // 7 from each partition: acked, then close must commit them
    while seen.len() < 20 {
        let m = next(&mut reader, Duration::from_secs(30)).await;
        seen.push((m.partition, m.offset));
        if m.offset < 7 {
            committer.feed(&m).await.unwrap();
        }
    }
    match events.next().await.unwrap() {
        GroupEvent::Assigned { partitions, .. } => assert_eq!(
            partitions,
            vec![
                TopicPartition::new(&topic, 0),
                TopicPartition::new(&topic, 1)
            ]
        ),
        other => panic!("{other:?}"),
    }
    reader.close().await;
    assert_eq!(
        committed(&group, &topic).await,
        BTreeMap::from([(0, 7), (1, 7)])
    );

    // a new member resumes at the commit
    let mut reader = Reader::new(group_config(&group, &topic)).await.unwrap();
    let mut again = HashSet::new();
    while again.len() < 6 {
        let m = next(&mut reader, Duration::from_secs(30)).await;
        assert!(m.offset >= 7, "{m:?} was committed");
        again.insert((m.partition, m.offset));
    }
    reader.close().await;
}
