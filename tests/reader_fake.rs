//! `Reader` fault cases with exact timing, against the scripted fake cluster in
//! `common/fake_broker.rs`: OffsetOutOfRange under each reset policy, start and seek by
//! timestamp, start at the last offset, leader moves between brokers, errors yielded after
//! `max_attempts`, and close stopping all fetching.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use common::fake_broker::FakeCluster;
use kafkapipe::protocol::ErrorCode;
use kafkapipe::reader::{Message, OffsetReset, Reader, ReaderConfig, StartOffset};

fn config(fake: &FakeCluster) -> ReaderConfig {
    ReaderConfig::new([fake.bootstrap()])
        .max_wait(Duration::from_millis(20))
        .read_backoff(Duration::from_millis(5), Duration::from_millis(20))
}

async fn next(reader: &mut Reader) -> Message {
    tokio::time::timeout(Duration::from_secs(5), reader.next_message())
        .await
        .expect("a message within 5 s")
        .unwrap()
}

async fn offsets(reader: &mut Reader, n: usize) -> Vec<i64> {
    let mut v = Vec::new();
    for _ in 0..n {
        v.push(next(reader).await.offset);
    }
    v
}

#[tokio::test]
async fn offset_out_of_range_resets_to_earliest() {
    let fake = FakeCluster::start(1).await;
    fake.add("t", 0, 1, 10, 15);
    let mut reader = Reader::new(
        config(&fake)
            .partition("t", 0)
            .start_offset(StartOffset::At(3)),
    )
    .await
    .unwrap();
    assert_eq!(offsets(&mut reader, 5).await, vec![10, 11, 12, 13, 14]);
    assert_eq!(reader.stats().offset_resets, 1);
    let asked: Vec<i64> = fake
        .state
        .lock()
        .unwrap()
        .list_offsets
        .iter()
        .map(|l| l.2)
        .collect();
    assert_eq!(asked, vec![-2], "one ListOffsets(earliest)");
    reader.close().await;
}

#[tokio::test]
async fn offset_out_of_range_resets_to_latest() {
    let fake = FakeCluster::start(1).await;
    fake.add("t", 0, 1, 0, 15);
    let mut reader = Reader::new(
        config(&fake)
            .partition("t", 0)
            .start_offset(StartOffset::At(100))
            .offset_reset(OffsetReset::Latest),
    )
    .await
    .unwrap();
    while reader.position("t", 0) != Some(15) {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    fake.set_end("t", 0, 18);
    assert_eq!(offsets(&mut reader, 3).await, vec![15, 16, 17]);
    reader.close().await;
}

#[tokio::test]
async fn offset_out_of_range_with_error_policy_is_yielded_and_parks_until_seek() {
    let fake = FakeCluster::start(1).await;
    fake.add("t", 0, 1, 10, 15);
    let mut reader = Reader::new(
        config(&fake)
            .partition("t", 0)
            .start_offset(StartOffset::At(3))
            .offset_reset(OffsetReset::Error),
    )
    .await
    .unwrap();
    let err = reader.next_message().await.unwrap_err();
    assert_eq!(err.kafka_code(), Some(ErrorCode::OffsetOutOfRange));
    assert_eq!((err.topic(), err.partition()), (Some("t"), Some(0)));
    // Parked: no further fetches of the partition until the application seeks.
    let fetches = fake.fetches();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(fake.fetches(), fetches);
    reader.seek("t", 0, 12).unwrap();
    assert_eq!(offsets(&mut reader, 3).await, vec![12, 13, 14]);
    reader.close().await;
}

#[tokio::test]
async fn starts_and_seeks_by_timestamp() {
    let fake = FakeCluster::start(1).await;
    fake.add("t", 0, 1, 0, 40);
    fake.state
        .lock()
        .unwrap()
        .time_offsets
        .insert(("t".to_string(), 0), 12);
    let mut reader = Reader::new(
        config(&fake)
            .partition("t", 0)
            .start_offset(StartOffset::AtTimestamp(1_700_000_000_012)),
    )
    .await
    .unwrap();
    assert_eq!(offsets(&mut reader, 2).await, vec![12, 13]);
    fake.state
        .lock()
        .unwrap()
        .time_offsets
        .insert(("t".to_string(), 0), 30);
    reader.seek_to_time("t", 0, 1_700_000_000_030).unwrap();
    // Whatever was buffered from 14 on is gone.
    assert_eq!(offsets(&mut reader, 3).await, vec![30, 31, 32]);
    let asked: Vec<i64> = fake
        .state
        .lock()
        .unwrap()
        .list_offsets
        .iter()
        .map(|l| l.2)
        .collect();
    assert_eq!(asked, vec![1_700_000_000_012, 1_700_000_000_030]);
    // No record at or after the timestamp: start at the end.
    fake.state.lock().unwrap().time_offsets.clear();
    reader.seek_to_time("t", 0, 1_800_000_000_000).unwrap();
    while reader.position("t", 0) != Some(40) {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    fake.set_end("t", 0, 41);
    assert_eq!(next(&mut reader).await.offset, 40);
    reader.close().await;
}

#[tokio::test]
async fn starts_at_the_last_offset() {
    let fake = FakeCluster::start(1).await;
    fake.add("t", 0, 1, 0, 25);
    let mut reader = Reader::new(
        config(&fake)
            .partition("t", 0)
            .start_offset(StartOffset::Last),
    )
    .await
    .unwrap();
    while reader.position("t", 0).is_none() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(reader.position("t", 0), Some(25));
    fake.set_end("t", 0, 27);
    assert_eq!(offsets(&mut reader, 2).await, vec![25, 26]);
    reader.close().await;
}

#[tokio::test]
async fn follows_a_leader_move_without_gap_or_repeat() {
    let fake = FakeCluster::start(2).await;
    fake.add("t", 0, 1, 0, 40);
    fake.add("t", 1, 2, 0, 40);
    let mut reader = Reader::new(config(&fake).topic("t").queue_capacity(4))
        .await
        .unwrap();
    let mut seen: Vec<Vec<i64>> = vec![Vec::new(), Vec::new()];
    let mut moved = false;
    while seen.iter().map(Vec::len).sum::<usize>() < 80 {
        let m = next(&mut reader).await;
        assert_eq!(
            m.value.as_deref(),
            Some(format!("v{}", m.offset).as_bytes())
        );
        seen[m.partition as usize].push(m.offset);
        if !moved && seen[0].len() == 7 {
            // Both partitions swap leaders while fetches are going on.
            fake.set_leader("t", 0, 2);
            fake.set_leader("t", 1, 1);
            moved = true;
        }
    }
    assert_eq!(seen[0], (0..40).collect::<Vec<_>>());
    assert_eq!(seen[1], (0..40).collect::<Vec<_>>());
    let per_broker = fake.state.lock().unwrap().fetches.clone();
    assert!(per_broker[&1] > 0 && per_broker[&2] > 0);
    assert!(
        reader.stats().errors > 0,
        "the move was noticed through NotLeader errors"
    );
    reader.close().await;
}

#[tokio::test]
async fn yields_an_error_after_max_attempts_and_keeps_trying() {
    let fake = FakeCluster::start(1).await;
    // Led by broker 7, which does not exist: every attempt fails.
    fake.add("t", 0, 7, 0, 5);
    let mut reader = Reader::new(config(&fake).partition("t", 0).max_attempts(2))
        .await
        .unwrap();
    let err = tokio::time::timeout(Duration::from_secs(5), reader.next_message())
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(err.partition(), Some(0));
    assert!(reader.stats().errors >= 2);
    // The broker comes back as leader: reading continues.
    fake.set_leader("t", 0, 1);
    assert_eq!(offsets(&mut reader, 5).await, vec![0, 1, 2, 3, 4]);
    reader.close().await;
}

#[tokio::test]
async fn close_stops_all_fetching() {
    let fake = FakeCluster::start(2).await;
    fake.add("t", 0, 1, 0, 1000);
    fake.add("t", 1, 2, 0, 0);
    let mut reader = Reader::new(config(&fake).topic("t")).await.unwrap();
    next(&mut reader).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(reader.stats().fetch_tasks, 1);
    reader.close().await;
    assert_eq!(reader.stats().fetch_tasks, 0);
    let fetches = fake.fetches();
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert_eq!(fake.fetches(), fetches, "a fetch was sent after close");
    assert!(reader.next_message().await.is_err());
}

#[tokio::test]
async fn unknown_topic_fails_new_after_max_attempts() {
    let fake = FakeCluster::start(1).await;
    let started = std::time::Instant::now();
    let err = Reader::new(config(&fake).topic("missing").max_attempts(3))
        .await
        .unwrap_err();
    assert_eq!(err.kafka_code(), Some(ErrorCode::UnknownTopicOrPartition));
    assert_eq!(err.topic(), Some("missing"));
    // Two backoffs (5 ms, 10 ms) between three attempts, not a hang.
    assert!(started.elapsed() < Duration::from_secs(2));
}

#[tokio::test]
async fn dropping_the_reader_stops_fetching() {
    let fake = FakeCluster::start(1).await;
    fake.add("t", 0, 1, 0, 0);
    let reader = Reader::new(config(&fake).topic("t")).await.unwrap();
    while fake.fetches() < 2 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    drop(reader);
    // The aborted task's last fetch may still be answered; no new one is sent.
    tokio::time::sleep(Duration::from_millis(60)).await;
    let fetches = fake.fetches();
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert_eq!(fake.fetches(), fetches, "a fetch was sent after drop");
}

#[tokio::test]
async fn a_failing_partition_queues_one_error_at_a_time() {
    let fake = FakeCluster::start(1).await;
    fake.add("t", 0, 7, 0, 5);
    let mut reader = Reader::new(config(&fake).partition("t", 0).max_attempts(1))
        .await
        .unwrap();
    // Every attempt fails; with max_attempts 1 each failure would yield an error.
    while reader.stats().errors < 6 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(reader.next_message().await.is_err());
    fake.set_leader("t", 0, 1);
    // One error was queued meanwhile (not one per failure), then the messages come.
    let mut errors = 0;
    let mut got = Vec::new();
    while got.len() < 5 {
        match tokio::time::timeout(Duration::from_secs(5), reader.next_message())
            .await
            .unwrap()
        {
            Ok(m) => got.push(m.offset),
            Err(_) => errors += 1,
        }
    }
    // (A second one can come from an attempt that was already under way.)
    assert!(errors <= 2, "{errors} queued errors");
    assert_eq!(got, vec![0, 1, 2, 3, 4]);
    reader.close().await;
}

#[tokio::test]
async fn resumes_after_a_broker_restart_without_gap_or_repeat() {
    let fake = FakeCluster::start(1).await;
    fake.add("t", 0, 1, 0, 30);
    let mut reader = Reader::new(config(&fake).partition("t", 0).queue_capacity(4))
        .await
        .unwrap();
    let mut got = offsets(&mut reader, 8).await;
    fake.stop(1);
    // While it is down: what is buffered still comes, then nothing; reconnects fail.
    tokio::time::sleep(Duration::from_millis(150)).await;
    let errors = reader.stats().errors;
    assert!(errors > 0, "connection failures not noticed");
    fake.restart(1).await;
    while got.len() < 30 {
        match tokio::time::timeout(Duration::from_secs(5), reader.next_message())
            .await
            .unwrap()
        {
            Ok(m) => got.push(m.offset),
            // Down for several backoffs: the error is yielded every max_attempts failures.
            Err(e) => assert!(e.kafka_code().is_none(), "{e}"),
        }
    }
    assert_eq!(got, (0..30).collect::<Vec<_>>());
    reader.close().await;
}

#[tokio::test]
async fn read_committed_reader_starts_at_the_last_stable_offset() {
    // A read-committed reader starting "at the end" must ask for the last stable offset
    // (ListOffsets with isolation level 1), or it would skip transactions still open that
    // commit later.
    let fake = FakeCluster::start(1).await;
    fake.add("t", 0, 1, 0, 15);
    let mut reader = Reader::new(
        config(&fake)
            .partition("t", 0)
            .start_offset(StartOffset::Last)
            .isolation_level(kafkapipe::conn::IsolationLevel::ReadCommitted),
    )
    .await
    .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while fake.state.lock().unwrap().list_offsets_isolation.is_empty() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no ListOffsets request"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(fake.state.lock().unwrap().list_offsets_isolation, vec![1]);
    reader.close().await;
}
