//! `Reader` fault cases with exact timing, against `kafkapipe::mock::MockCluster`:
//! OffsetOutOfRange under each reset policy, start and seek by timestamp, start at the
//! last offset, leader moves between brokers, transient errors retried silently and
//! yielded after `retry_timeout`, close stopping all fetching, and log truncation
//! detection (KIP-320): leader epochs in fetches, FENCED/UNKNOWN_LEADER_EPOCH, position
//! validation after a leader change, truncation below and above the position.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use kafkapipe::compression::Compression;
use kafkapipe::mock::MockCluster;
use kafkapipe::protocol::messages::{FetchRequest, ListOffsetsRequest, OffsetCommitRequest};
use kafkapipe::protocol::{ApiKey, ErrorCode};
use kafkapipe::reader::{LogTruncation, Message, OffsetReset, Reader, ReaderConfig, StartOffset};
use kafkapipe::record::{Record, RecordBatchBuilder};

/// `n` brokers, topic `t` with `partitions` partitions (partition p led by broker
/// p % n + 1).
async fn cluster(n: i32, partitions: i32) -> MockCluster {
    MockCluster::builder()
        .brokers(n)
        .topic("t", partitions)
        .start()
        .await
        .unwrap()
}

/// One batch holding offsets `from..to`: key `"k{offset}"`, value `"v{offset}"`,
/// timestamp 1_700_000_000_000 + offset.
fn batch(from: i64, to: i64) -> Bytes {
    let mut b = RecordBatchBuilder::new(Compression::None);
    for o in from..to {
        b.append(
            1_700_000_000_000 + o,
            Some(format!("k{o}").as_bytes()),
            Some(format!("v{o}").as_bytes()),
            &[],
        )
        .unwrap();
    }
    let mut bytes = BytesMut::from(&b.build().unwrap()[..]);
    // The base offset is not covered by the CRC.
    bytes[..8].copy_from_slice(&from.to_be_bytes());
    bytes.freeze()
}

/// Fill a partition up to offset `to`, in batches of at most 5 records.
fn fill(cluster: &MockCluster, partition: i32, to: i64) {
    let mut o = cluster.high_watermark("t", partition).unwrap();
    while o < to {
        let end = to.min(o + 5);
        assert_eq!(cluster.append_raw("t", partition, batch(o, end)), Some(o));
        o = end;
    }
}

/// Fetches are limited to one batch per partition (every batch these tests write fits
/// in the size of the largest), so a reader moves through a log a few records at a time.
fn config(cluster: &MockCluster) -> ReaderConfig {
    ReaderConfig::new(cluster.bootstrap())
        .max_partition_bytes(batch(995, 1000).len() as i32)
        .max_wait(Duration::from_millis(20))
        .read_backoff(Duration::from_millis(5), Duration::from_millis(20))
}

fn fetch_count(cluster: &MockCluster) -> u64 {
    cluster.requests(ApiKey::FETCH)
}

/// The timestamps asked for by the ListOffsets requests captured so far.
fn list_offsets_asked(cluster: &MockCluster) -> Vec<i64> {
    cluster
        .captured::<ListOffsetsRequest>()
        .iter()
        .flat_map(|r| r.topics.iter())
        .flat_map(|t| t.partitions.iter())
        .map(|p| p.timestamp)
        .collect()
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
    let mock = cluster(1, 1).await;
    fill(&mock, 0, 15);
    mock.delete_records("t", 0, 10);
    mock.capture(ApiKey::LIST_OFFSETS);
    let mut reader = Reader::new(
        config(&mock)
            .partition("t", 0)
            .start_offset(StartOffset::At(3)),
    )
    .await
    .unwrap();
    assert_eq!(offsets(&mut reader, 5).await, vec![10, 11, 12, 13, 14]);
    assert_eq!(reader.stats().offset_resets, 1);
    let asked = list_offsets_asked(&mock);
    assert_eq!(asked, vec![-2], "one ListOffsets(earliest)");
    reader.close().await;
}

#[tokio::test]
async fn offset_out_of_range_resets_to_latest() {
    let mock = cluster(1, 1).await;
    fill(&mock, 0, 15);
    let mut reader = Reader::new(
        config(&mock)
            .partition("t", 0)
            .start_offset(StartOffset::At(100))
            .offset_reset(OffsetReset::Latest),
    )
    .await
    .unwrap();
    while reader.position("t", 0) != Some(15) {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    fill(&mock, 0, 18);
    assert_eq!(offsets(&mut reader, 3).await, vec![15, 16, 17]);
    reader.close().await;
}

#[tokio::test]
async fn offset_out_of_range_with_error_policy_is_yielded_and_parks_until_seek() {
    let mock = cluster(1, 1).await;
    fill(&mock, 0, 15);
    mock.delete_records("t", 0, 10);
    let mut reader = Reader::new(
        config(&mock)
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
    let fetches = fetch_count(&mock);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(fetch_count(&mock), fetches);
    reader.seek("t", 0, 12).unwrap();
    assert_eq!(offsets(&mut reader, 3).await, vec![12, 13, 14]);
    reader.close().await;
}

#[tokio::test]
async fn starts_and_seeks_by_timestamp() {
    // Record o has timestamp 1_700_000_000_000 + o.
    let mock = cluster(1, 1).await;
    fill(&mock, 0, 40);
    mock.capture(ApiKey::LIST_OFFSETS);
    let mut reader = Reader::new(
        config(&mock)
            .partition("t", 0)
            .start_offset(StartOffset::AtTimestamp(1_700_000_000_012)),
    )
    .await
    .unwrap();
    assert_eq!(offsets(&mut reader, 2).await, vec![12, 13]);
    reader.seek_to_time("t", 0, 1_700_000_000_030).unwrap();
    // Whatever was buffered from 14 on is gone.
    assert_eq!(offsets(&mut reader, 3).await, vec![30, 31, 32]);
    let asked = list_offsets_asked(&mock);
    assert_eq!(asked, vec![1_700_000_000_012, 1_700_000_000_030]);
    // No record at or after the timestamp: start at the end.
    reader.seek_to_time("t", 0, 1_800_000_000_000).unwrap();
    while reader.position("t", 0) != Some(40) {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    fill(&mock, 0, 41);
    assert_eq!(next(&mut reader).await.offset, 40);
    reader.close().await;
}

#[tokio::test]
async fn starts_at_the_last_offset() {
    let mock = cluster(1, 1).await;
    fill(&mock, 0, 25);
    let mut reader = Reader::new(
        config(&mock)
            .partition("t", 0)
            .start_offset(StartOffset::Last),
    )
    .await
    .unwrap();
    while reader.position("t", 0).is_none() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(reader.position("t", 0), Some(25));
    fill(&mock, 0, 27);
    assert_eq!(offsets(&mut reader, 2).await, vec![25, 26]);
    reader.close().await;
}

#[tokio::test]
async fn follows_a_leader_move_without_gap_or_repeat() {
    let mock = cluster(2, 2).await;
    fill(&mock, 0, 40);
    fill(&mock, 1, 40);
    let mut reader = Reader::new(config(&mock).topic("t").queue_capacity(4))
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
            mock.move_leader("t", 0, 2).unwrap();
            mock.move_leader("t", 1, 1).unwrap();
            moved = true;
        }
    }
    assert_eq!(seen[0], (0..40).collect::<Vec<_>>());
    assert_eq!(seen[1], (0..40).collect::<Vec<_>>());
    assert!(mock.requests_to(1, ApiKey::FETCH) > 0 && mock.requests_to(2, ApiKey::FETCH) > 0);
    assert!(
        reader.stats().errors > 0,
        "the move was noticed through NotLeader errors"
    );
    reader.close().await;
}

#[tokio::test]
async fn transient_errors_are_retried_without_yielding_them() {
    let mock = cluster(1, 1).await;
    fill(&mock, 0, 5);
    // Every fetch of the partition fails, transiently.
    mock.fault_partition(
        ApiKey::FETCH,
        "t",
        0,
        ErrorCode::NotLeaderOrFollower,
        u32::MAX,
    );
    let mut reader = Reader::new(config(&mock).partition("t", 0)).await.unwrap();
    while reader.stats().retries < 6 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Failing for far less than the 5 minute retry timeout: no error item.
    let nothing = tokio::time::timeout(Duration::from_millis(100), reader.next_message()).await;
    assert!(nothing.is_err(), "unexpected item {nothing:?}");
    let stats = reader.stats();
    assert!(stats.errors >= 6 && stats.retries >= 6, "{stats:?}");
    assert!(
        stats
            .last_error
            .as_deref()
            .is_some_and(|e| e.contains("partition 0")),
        "{stats:?}"
    );
    mock.clear_faults();
    assert_eq!(offsets(&mut reader, 5).await, vec![0, 1, 2, 3, 4]);
    reader.close().await;
}

#[tokio::test]
async fn yields_an_error_after_retry_timeout_and_keeps_trying() {
    let mock = cluster(1, 1).await;
    fill(&mock, 0, 5);
    // Every fetch of the partition fails, transiently.
    mock.fault_partition(
        ApiKey::FETCH,
        "t",
        0,
        ErrorCode::NotLeaderOrFollower,
        u32::MAX,
    );
    let mut reader = Reader::new(
        config(&mock)
            .partition("t", 0)
            .retry_timeout(Duration::from_millis(50)),
    )
    .await
    .unwrap();
    let err = tokio::time::timeout(Duration::from_secs(5), reader.next_message())
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(err.partition(), Some(0));
    assert!(reader.stats().errors >= 2);
    // The broker comes back as leader: reading continues.
    mock.clear_faults();
    assert_eq!(offsets(&mut reader, 5).await, vec![0, 1, 2, 3, 4]);
    reader.close().await;
}

/// A fatal partition error (here an authorization failure) is yielded at once, not after
/// the retry timeout; the partition is retried (slowly) and recovers once it is fixed.
#[tokio::test]
async fn fatal_errors_are_yielded_at_once_and_retried() {
    let mock = cluster(1, 1).await;
    fill(&mock, 0, 5);
    mock.fault_partition(
        ApiKey::FETCH,
        "t",
        0,
        ErrorCode::TopicAuthorizationFailed,
        u32::MAX,
    );
    let mut reader = Reader::new(config(&mock).partition("t", 0)).await.unwrap();
    let err = tokio::time::timeout(Duration::from_secs(5), reader.next_message())
        .await
        .expect("the fatal error well before the 5 minute retry timeout")
        .unwrap_err();
    assert_eq!(err.kafka_code(), Some(ErrorCode::TopicAuthorizationFailed));
    assert_eq!(err.partition(), Some(0));
    assert_eq!(
        reader.stats().retries,
        0,
        "a fatal error is not retried as transient"
    );
    // the ACL is fixed: reading goes on
    mock.clear_faults();
    let mut got = Vec::new();
    while got.len() < 5 {
        match tokio::time::timeout(Duration::from_secs(5), reader.next_message())
            .await
            .unwrap()
        {
            Ok(m) => got.push(m.offset),
            // (a second failure may have been queued before the fix)
            Err(e) => assert_eq!(e.kafka_code(), Some(ErrorCode::TopicAuthorizationFailed)),
        }
    }
    assert_eq!(got, vec![0, 1, 2, 3, 4]);
    reader.close().await;
}

/// Partition t-0 holds offsets 0..12 where offset 7 is alone in a batch whose last byte
/// (covered by the CRC) is flipped.
async fn log_with_a_corrupt_batch_at_7() -> MockCluster {
    let mock = cluster(1, 1).await;
    fill(&mock, 0, 7);
    let mut bad = BytesMut::from(&batch(7, 8)[..]);
    let last = bad.len() - 1;
    bad[last] ^= 0xff;
    assert_eq!(mock.append_raw("t", 0, bad.freeze()), Some(7));
    fill(&mock, 0, 12);
    mock
}

/// A record batch failing its CRC cannot be skipped by the reader: the error is yielded
/// at once, the partition stops there (no error storm, nothing past it), and a seek past
/// the bad batch resumes reading.
#[tokio::test]
async fn corrupt_batch_is_yielded_at_once_and_parks_until_seek() {
    let mock = log_with_a_corrupt_batch_at_7().await;
    let mut reader = Reader::new(config(&mock).partition("t", 0)).await.unwrap();
    assert_eq!(offsets(&mut reader, 7).await, vec![0, 1, 2, 3, 4, 5, 6]);
    let err = tokio::time::timeout(Duration::from_secs(5), reader.next_message())
        .await
        .expect("the corrupt batch is reported at once")
        .unwrap_err();
    assert_eq!(err.kind(), kafkapipe::ErrorKind::Protocol, "{err}");
    assert!(err.to_string().contains("CRC"), "{err}");
    assert_eq!(err.partition(), Some(0));
    // parked: nothing more, no more errors, no more fetches of it
    let fetches = fetch_count(&mock);
    let nothing = tokio::time::timeout(Duration::from_millis(200), reader.next_message()).await;
    assert!(nothing.is_err(), "unexpected item {nothing:?}");
    assert_eq!(
        fetch_count(&mock),
        fetches,
        "a parked partition was fetched"
    );
    reader.seek("t", 0, 8).unwrap();
    assert_eq!(offsets(&mut reader, 4).await, vec![8, 9, 10, 11]);
    reader.close().await;
}

/// Good batches and a corrupt one in the same fetch response: the records before the
/// corrupt batch are yielded, then its error, and the partition parks. Before, the whole
/// response was the error: records 0–6 were never yielded, a seek past the bad batch lost
/// them and a seek to 0 repeated the error.
#[tokio::test]
async fn records_before_a_corrupt_batch_in_the_same_response_are_yielded() {
    let mock = log_with_a_corrupt_batch_at_7().await;
    // No per-partition byte cap: one response holds every batch.
    let mut reader = Reader::new(config(&mock).max_partition_bytes(1 << 20).partition("t", 0))
        .await
        .unwrap();
    assert_eq!(offsets(&mut reader, 7).await, vec![0, 1, 2, 3, 4, 5, 6]);
    let err = tokio::time::timeout(Duration::from_secs(5), reader.next_message())
        .await
        .expect("the corrupt batch is reported at once")
        .unwrap_err();
    assert!(err.to_string().contains("CRC"), "{err}");
    reader.seek("t", 0, 8).unwrap();
    assert_eq!(offsets(&mut reader, 4).await, vec![8, 9, 10, 11]);
    reader.close().await;
}

#[tokio::test]
async fn close_stops_all_fetching() {
    let mock = cluster(2, 2).await;
    fill(&mock, 0, 1000);
    let mut reader = Reader::new(config(&mock).topic("t")).await.unwrap();
    next(&mut reader).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(reader.stats().fetch_tasks, 1);
    reader.close().await;
    assert_eq!(reader.stats().fetch_tasks, 0);
    let fetches = fetch_count(&mock);
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert_eq!(fetch_count(&mock), fetches, "a fetch was sent after close");
    assert!(reader.next_message().await.is_err());
}

#[tokio::test]
async fn unknown_topic_fails_new_after_retry_timeout() {
    let mock = MockCluster::builder().start().await.unwrap();
    let err = tokio::time::timeout(
        Duration::from_secs(5),
        Reader::new(
            config(&mock)
                .topic("missing")
                .retry_timeout(Duration::from_millis(50)),
        ),
    )
    .await
    .expect("Reader::new gives up after the retry timeout")
    .unwrap_err();
    assert_eq!(err.kafka_code(), Some(ErrorCode::UnknownTopicOrPartition));
    assert_eq!(err.topic(), Some("missing"));
}

#[tokio::test]
async fn dropping_the_reader_stops_fetching() {
    let mock = cluster(1, 1).await;
    let reader = Reader::new(config(&mock).topic("t")).await.unwrap();
    while fetch_count(&mock) < 2 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    drop(reader);
    // The aborted task's last fetch may still be answered; no new one is sent.
    tokio::time::sleep(Duration::from_millis(60)).await;
    let fetches = fetch_count(&mock);
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert_eq!(fetch_count(&mock), fetches, "a fetch was sent after drop");
}

#[tokio::test]
async fn a_failing_partition_queues_one_error_at_a_time() {
    let mock = cluster(1, 1).await;
    fill(&mock, 0, 5);
    mock.fault_partition(
        ApiKey::FETCH,
        "t",
        0,
        ErrorCode::NotLeaderOrFollower,
        u32::MAX,
    );
    let mut reader = Reader::new(
        config(&mock)
            .partition("t", 0)
            .retry_timeout(Duration::ZERO),
    )
    .await
    .unwrap();
    // Every attempt fails; with a zero retry timeout each failure would yield an error.
    while reader.stats().errors < 6 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(reader.next_message().await.is_err());
    mock.clear_faults();
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
    let mock = cluster(1, 1).await;
    fill(&mock, 0, 30);
    let mut reader = Reader::new(config(&mock).partition("t", 0).queue_capacity(4))
        .await
        .unwrap();
    let mut got = offsets(&mut reader, 8).await;
    mock.kill(1);
    // While it is down: what is buffered still comes, then nothing; reconnects fail.
    tokio::time::sleep(Duration::from_millis(150)).await;
    let errors = reader.stats().errors;
    assert!(errors > 0, "connection failures not noticed");
    mock.restart(1).await.unwrap();
    while got.len() < 30 {
        match tokio::time::timeout(Duration::from_secs(5), reader.next_message())
            .await
            .unwrap()
        {
            Ok(m) => got.push(m.offset),
            Err(e) => panic!("a transient error was yielded: {e}"),
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
    let mock = cluster(1, 1).await;
    fill(&mock, 0, 15);
    mock.capture(ApiKey::LIST_OFFSETS);
    let mut reader = Reader::new(
        config(&mock)
            .partition("t", 0)
            .start_offset(StartOffset::Last)
            .isolation_level(kafkapipe::conn::IsolationLevel::ReadCommitted),
    )
    .await
    .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while mock.captured::<ListOffsetsRequest>().is_empty() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no ListOffsets request"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let isolation: Vec<i8> = mock
        .captured::<ListOffsetsRequest>()
        .iter()
        .map(|r| r.isolation_level)
        .collect();
    assert_eq!(isolation, vec![1]);
    reader.close().await;
}

/// A batch at `base` whose CRC-32C is recomputed after the caller edited it.
fn recrc(mut b: BytesMut) -> Bytes {
    let crc = crc32c::crc32c(&b[21..]);
    b[17..21].copy_from_slice(&crc.to_be_bytes());
    b.freeze()
}

#[tokio::test]
async fn undecodable_records_are_yielded_once_after_what_precedes_them_and_park_the_partition() {
    use kafkapipe::ErrorKind;

    let mock = cluster(1, 2).await;
    fill(&mock, 0, 5);
    fill(&mock, 1, 5);
    // Partition 0 serves a batch with a wrong CRC at offset 5; partition 1 an lz4 batch
    // whose payload is no lz4 frame.
    let mut bad_crc = BytesMut::from(&batch(5, 10)[..]);
    bad_crc[20] ^= 0xff;
    let mut b = RecordBatchBuilder::new(Compression::Lz4);
    b.append(0, None, Some(b"v"), &[]).unwrap();
    let mut bad_lz4 = BytesMut::from(&b.build().unwrap()[..61]);
    bad_lz4.extend_from_slice(b"this is not an lz4 frame");
    let len = (bad_lz4.len() - 12) as i32;
    bad_lz4[0..8].copy_from_slice(&5i64.to_be_bytes());
    bad_lz4[8..12].copy_from_slice(&len.to_be_bytes());
    assert_eq!(mock.append_raw("t", 0, bad_crc.freeze()), Some(5));
    assert_eq!(mock.append_raw("t", 1, recrc(bad_lz4)), Some(5));
    fill(&mock, 0, 15);
    fill(&mock, 1, 15);
    let mut reader = Reader::new(config(&mock).topic("t")).await.unwrap();
    // Each partition: its messages before the bad batch, then exactly one error.
    let mut got: [Vec<i64>; 2] = [Vec::new(), Vec::new()];
    let mut errors = Vec::new();
    while errors.len() < 2 {
        match tokio::time::timeout(Duration::from_secs(5), reader.next_message())
            .await
            .expect("an item within 5 s: the reader must not loop silently")
        {
            Ok(m) => {
                assert!(!errors
                    .iter()
                    .any(|e: &kafkapipe::Error| e.partition() == Some(m.partition)));
                got[m.partition as usize].push(m.offset);
            }
            Err(e) => {
                let p = e.partition().expect("error names the partition") as usize;
                assert_eq!(
                    got[p],
                    vec![0, 1, 2, 3, 4],
                    "error before the messages: {e}"
                );
                errors.push(e);
            }
        }
    }
    errors.sort_by_key(|e| e.partition());
    assert_eq!(errors[0].kind(), ErrorKind::Protocol, "{}", errors[0]);
    assert_eq!(errors[1].kind(), ErrorKind::Compression, "{}", errors[1]);
    for e in &errors {
        assert!(!e.is_retriable(), "{e}");
        assert_eq!(e.topic(), Some("t"));
        assert!(e.to_string().contains("offset 5"), "{e}");
    }
    assert_eq!(reader.stats().parked_partitions, 2);
    // Parked: the bad bytes are not fetched again, and nothing more is yielded. (The lz4
    // batch is found bad when the stream reaches it, so a fetch of the partition past it
    // may still be in flight then: count from the end of a first quiet window.)
    let more = tokio::time::timeout(Duration::from_millis(150), reader.next_message()).await;
    assert!(more.is_err(), "unexpected {more:?}");
    let fetches = fetch_count(&mock);
    let more = tokio::time::timeout(Duration::from_millis(150), reader.next_message()).await;
    assert!(more.is_err(), "unexpected {more:?}");
    assert_eq!(fetch_count(&mock), fetches);
    // Seeking past the bad batch resumes.
    reader.seek("t", 0, 10).unwrap();
    reader.seek("t", 1, 6).unwrap();
    let mut rest = offsets(&mut reader, 14).await;
    rest.sort();
    assert_eq!(
        rest,
        vec![6, 7, 8, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14]
    );
    assert_eq!(reader.stats().parked_partitions, 0);
    reader.close().await;
}

// The consumer takes up to 64 messages of a partition under one lock and yields them
// without locking again. Whatever another task does to that partition meanwhile must
// hold as if every message were taken under the lock on its own.

/// A reader of `partitions` partitions of 300 records each, all of them buffered.
async fn buffered_reader(mock: &MockCluster, partitions: i32) -> Reader {
    for p in 0..partitions {
        fill(mock, p, 300);
    }
    let reader = Reader::new(
        ReaderConfig::new(mock.bootstrap())
            .topic("t")
            .max_wait(Duration::from_millis(20)),
    )
    .await
    .unwrap();
    let all = 300 * partitions as usize;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while reader.stats().queue_length < all {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{:?}",
            reader.stats()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    reader
}

#[tokio::test]
async fn a_seek_from_another_task_drops_the_messages_taken_with_the_last_one() {
    let mock = cluster(1, 1).await;
    let mut reader = buffered_reader(&mock, 1).await;
    assert_eq!(offsets(&mut reader, 2).await, vec![0, 1]);
    let handle = reader.handle();
    tokio::spawn(async move { handle.seek("t", 0, 200).unwrap() })
        .await
        .unwrap();
    assert_eq!(offsets(&mut reader, 3).await, vec![200, 201, 202]);
    assert_eq!(reader.position("t", 0), Some(203));
    reader.close().await;
}

#[tokio::test]
async fn an_unassign_from_another_task_stops_the_partition_at_once() {
    let mock = cluster(1, 2).await;
    let mut reader = buffered_reader(&mock, 2).await;
    let first = next(&mut reader).await;
    let handle = reader.handle();
    let tp = kafkapipe::reader::TopicPartition::new("t", first.partition);
    tokio::spawn(async move { handle.unassign(&[tp]) })
        .await
        .unwrap();
    let rest: Vec<Message> = {
        let mut v = Vec::new();
        for _ in 0..300 {
            v.push(next(&mut reader).await);
        }
        v
    };
    assert!(rest.iter().all(|m| m.partition != first.partition));
    assert_eq!(rest.last().map(|m| m.offset), Some(299));
    assert_eq!(reader.stats().queue_length, 0);
    reader.close().await;
}

#[tokio::test]
async fn a_pause_from_another_task_stops_yielding_and_resume_goes_on_without_gap() {
    let mock = cluster(1, 2).await;
    let mut reader = buffered_reader(&mock, 2).await;
    let first = next(&mut reader).await;
    let p = first.partition;
    let handle = reader.handle();
    let tp = kafkapipe::reader::TopicPartition::new("t", p);
    let h = handle.clone();
    let paused = tp.clone();
    tokio::spawn(async move { h.pause(&[paused]) })
        .await
        .unwrap();
    let mut seen: Vec<Vec<i64>> = vec![Vec::new(), Vec::new()];
    seen[p as usize].push(first.offset);
    for _ in 0..300 {
        let m = next(&mut reader).await;
        assert_ne!(m.partition, p, "paused partition yielded {}", m.offset);
        seen[m.partition as usize].push(m.offset);
    }
    handle.resume(&[tp]);
    for _ in 0..299 {
        let m = next(&mut reader).await;
        seen[m.partition as usize].push(m.offset);
    }
    let want: Vec<i64> = (0..300).collect();
    assert_eq!(seen[0], want);
    assert_eq!(seen[1], want);
    reader.close().await;
}

#[tokio::test]
async fn position_lag_and_queue_length_follow_every_message() {
    let mock = cluster(1, 1).await;
    let mut reader = buffered_reader(&mock, 1).await;
    for o in 0..150 {
        assert_eq!(next(&mut reader).await.offset, o);
        assert_eq!(reader.position("t", 0), Some(o + 1));
        assert_eq!(reader.lag(), 300 - (o + 1));
        assert_eq!(reader.partition_lag("t", 0), Some(300 - (o + 1)));
        let s = reader.stats();
        assert_eq!(s.queue_length as i64, 300 - (o + 1));
        // key "k{offset}" and value "v{offset}", counted encoded: plus each record's
        // framing (length, attributes, timestamp and offset deltas, key and value
        // lengths, header count: 7 to 12 bytes here)
        let left = (300 - (o + 1)) as usize;
        let bytes: usize = (o + 1..300).map(|x| 2 * (1 + x.to_string().len())).sum();
        assert!(
            (bytes + 7 * left..=bytes + 12 * left).contains(&s.queue_bytes),
            "{} queued bytes for {left} records of {bytes} key and value bytes",
            s.queue_bytes
        );
    }
    reader.close().await;
}

#[tokio::test]
async fn a_close_from_another_task_ends_the_stream_at_once() {
    let mock = cluster(1, 1).await;
    let mut reader = buffered_reader(&mock, 1).await;
    assert_eq!(offsets(&mut reader, 1).await, vec![0]);
    let handle = reader.handle();
    tokio::spawn(async move { handle.close().await })
        .await
        .unwrap();
    let end = reader.next_message().await;
    assert!(end.as_ref().is_err_and(|e| e.is_closed()), "{end:?}");
    reader.close().await;
}

// ---- log truncation (KIP-320) ----

/// Produce records `from..to` to `t`/0 through the mock's log, which stamps them with the
/// partition's current leader epoch: key `"k{offset}"`, value `"{tag}{offset}"`, 5 per
/// batch.
fn produce_tagged(mock: &MockCluster, tag: &str, from: i64, to: i64) {
    let mut o = from;
    while o < to {
        let end = to.min(o + 5);
        let records: Vec<Record> = (o..end)
            .map(|i| Record::new(format!("k{i}"), format!("{tag}{i}")))
            .collect();
        assert_eq!(mock.produce("t", 0, &records).unwrap(), o);
        o = end;
    }
}

fn value(m: &Message) -> String {
    String::from_utf8_lossy(m.value.as_deref().unwrap_or_default()).into_owned()
}

/// Reads `n` messages as `(offset, value)`.
async fn tagged(reader: &mut Reader, n: usize) -> Vec<(i64, String)> {
    let mut v = Vec::new();
    for _ in 0..n {
        let m = next(reader).await;
        v.push((m.offset, value(&m)));
    }
    v
}

fn expect(tag: &str, range: std::ops::Range<i64>) -> Vec<(i64, String)> {
    range.map(|o| (o, format!("{tag}{o}"))).collect()
}

/// Waits until `cond` holds (5 s at most).
async fn until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while !cond() {
        assert!(tokio::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// An unclean election onto a replica that had only offsets 0..10, after the reader had
/// read 0..20; the new leader takes writes up to offset 30. Under `OffsetReset::Error`
/// the reader yields the truncation with its offsets and parks the partition.
#[tokio::test]
async fn log_truncation_below_the_position_is_reported_with_the_offsets() {
    let mock = cluster(1, 1).await;
    produce_tagged(&mock, "old", 0, 20);
    let mut reader = Reader::new(
        config(&mock)
            .partition("t", 0)
            .offset_reset(OffsetReset::Error),
    )
    .await
    .unwrap();
    let m = next(&mut reader).await;
    assert_eq!((m.offset, m.leader_epoch()), (0, Some(0)));
    assert_eq!(tagged(&mut reader, 19).await, expect("old", 1..20));
    assert_eq!(mock.truncate("t", 0, 10).unwrap(), (10, 1));
    produce_tagged(&mock, "new", 10, 30);
    let got = tokio::time::timeout(Duration::from_secs(5), reader.next_message())
        .await
        .expect("an item within 5 s");
    let err = match got {
        Ok(m) => panic!(
            "read {}@{} from the truncated log without noticing the truncation",
            value(&m),
            m.offset
        ),
        Err(e) => e,
    };
    assert_eq!(err.kafka_code(), Some(ErrorCode::OffsetOutOfRange), "{err}");
    let t = std::error::Error::source(&err)
        .and_then(|s| s.downcast_ref::<LogTruncation>())
        .unwrap_or_else(|| panic!("no LogTruncation in {err}"));
    assert_eq!((t.topic.as_str(), t.partition), ("t", 0));
    assert_eq!((t.position, t.fetch_offset, t.epoch), (20, 20, 0));
    assert_eq!((t.divergent_offset, t.divergent_epoch), (Some(10), Some(0)));
    assert_eq!(t.leader_epoch, 1);
    assert!(err.to_string().contains("ends at offset 10"), "{err}");
    let stats = reader.stats();
    assert_eq!((stats.log_truncations, stats.parked_partitions), (1, 1));
    // the application decides: here it reads the new records from the divergent offset
    reader.seek("t", 0, 10).unwrap();
    let m = next(&mut reader).await;
    assert_eq!(
        (m.offset, value(&m), m.leader_epoch()),
        (10, "new10".into(), Some(1))
    );
    reader.close().await;
}

/// As above under a reset policy (the default, `Earliest`): the reader continues at the
/// first offset known to diverge, as the Java consumer does, so the records that took
/// the offsets it had read are yielded, not skipped.
#[tokio::test]
async fn log_truncation_below_the_position_continues_at_the_divergent_offset() {
    let mock = cluster(1, 1).await;
    produce_tagged(&mock, "old", 0, 20);
    let mut reader = Reader::new(config(&mock).partition("t", 0)).await.unwrap();
    assert_eq!(tagged(&mut reader, 20).await, expect("old", 0..20));
    mock.truncate("t", 0, 10).unwrap();
    produce_tagged(&mock, "new", 10, 30);
    assert_eq!(tagged(&mut reader, 20).await, expect("new", 10..30));
    assert_eq!(reader.stats().log_truncations, 1);
    reader.close().await;
}

/// Records fetched past the truncation point but not yet yielded are dropped and fetched
/// again: the application sees the old records it had not read yet up to the
/// divergent offset, then the new ones, and no error.
#[tokio::test]
async fn log_truncation_above_the_position_drops_the_prefetched_records() {
    let mock = cluster(1, 1).await;
    produce_tagged(&mock, "old", 0, 20);
    let mut reader = Reader::new(config(&mock).partition("t", 0)).await.unwrap();
    assert_eq!(tagged(&mut reader, 5).await, expect("old", 0..5));
    until("all 20 fetched", || reader.stats().messages >= 20).await;
    mock.truncate("t", 0, 10).unwrap();
    produce_tagged(&mock, "new", 10, 30);
    // the batch 5..10 fetched again
    until("fetched again from the position", || {
        reader.stats().messages >= 25
    })
    .await;
    let mut want = expect("old", 5..10);
    want.extend(expect("new", 10..30));
    assert_eq!(tagged(&mut reader, 25).await, want);
    assert_eq!(reader.stats().log_truncations, 0);
    reader.close().await;
}

/// A leader change without truncation: the position is validated with
/// OffsetForLeaderEpoch and fetching goes on without a gap or a repeat.
#[tokio::test]
async fn a_leader_change_without_truncation_is_validated_and_reading_goes_on() {
    let mock = cluster(2, 1).await;
    produce_tagged(&mock, "old", 0, 20);
    let mut reader = Reader::new(config(&mock).partition("t", 0)).await.unwrap();
    assert_eq!(tagged(&mut reader, 10).await, expect("old", 0..10));
    mock.move_leader("t", 0, 2).unwrap();
    produce_tagged(&mock, "new", 20, 30);
    let mut want = expect("old", 10..20);
    want.extend(expect("new", 20..30));
    assert_eq!(tagged(&mut reader, 20).await, want);
    assert!(
        mock.requests(ApiKey::OFFSET_FOR_LEADER_EPOCH) >= 1,
        "the position was not validated after the leader change"
    );
    assert_eq!(reader.stats().log_truncations, 0);
    reader.close().await;
}

/// A new leader epoch on the same broker: the reader's fetch, sent with the old epoch, is
/// refused with FENCED_LEADER_EPOCH; the reader refreshes its metadata and fetches on
/// with the new epoch.
#[tokio::test]
async fn fenced_leader_epoch_refreshes_metadata_and_fetching_goes_on() {
    let mock = cluster(1, 1).await;
    produce_tagged(&mock, "a", 0, 10);
    mock.capture(ApiKey::FETCH);
    let mut reader = Reader::new(config(&mock).partition("t", 0)).await.unwrap();
    assert_eq!(tagged(&mut reader, 5).await, expect("a", 0..5));
    let metadata = mock.requests(ApiKey::METADATA);
    mock.move_leader("t", 0, 1).unwrap();
    produce_tagged(&mock, "b", 10, 15);
    let mut want = expect("a", 5..10);
    want.extend(expect("b", 10..15));
    assert_eq!(tagged(&mut reader, 10).await, want);
    let epochs: Vec<i32> = mock
        .captured::<FetchRequest>()
        .iter()
        .flat_map(|r| r.topics.iter())
        .flat_map(|t| t.partitions.iter())
        .map(|p| p.current_leader_epoch)
        .collect();
    assert!(
        epochs.first() == Some(&0) && epochs.last() == Some(&1),
        "fetches sent with leader epochs {epochs:?}"
    );
    assert!(
        mock.requests(ApiKey::METADATA) > metadata,
        "no metadata refresh after FENCED_LEADER_EPOCH"
    );
    assert!(reader.stats().errors >= 1);
    reader.close().await;
}

/// UNKNOWN_LEADER_EPOCH (the broker is behind the reader's metadata) is retried after the
/// backoff without a metadata refresh.
#[tokio::test]
async fn unknown_leader_epoch_is_retried_without_a_metadata_refresh() {
    let mock = cluster(1, 1).await;
    produce_tagged(&mock, "a", 0, 10);
    let mut reader = Reader::new(config(&mock).partition("t", 0)).await.unwrap();
    assert_eq!(tagged(&mut reader, 5).await, expect("a", 0..5));
    let metadata = mock.requests(ApiKey::METADATA);
    mock.fault_partition(ApiKey::FETCH, "t", 0, ErrorCode::UnknownLeaderEpoch, 3);
    produce_tagged(&mock, "a", 10, 15);
    assert_eq!(tagged(&mut reader, 10).await, expect("a", 5..15));
    assert!(reader.stats().errors >= 3);
    assert_eq!(mock.requests(ApiKey::METADATA), metadata);
    reader.close().await;
}

/// A group member commits the leader epoch of the record before its offset; the member
/// that takes the partition over after an unclean election validates the committed
/// offset with it and finds the truncation, instead of starting at the committed offset
/// in the new log.
#[tokio::test]
async fn a_committed_offset_is_validated_with_its_leader_epoch() {
    let mock = cluster(1, 1).await;
    produce_tagged(&mock, "old", 0, 20);
    mock.capture(ApiKey::OFFSET_COMMIT);
    let group = || {
        config(&mock)
            .topic("t")
            .group_id("g")
            .offset_reset(OffsetReset::Error)
            .session_timeout(Duration::from_secs(2))
            .heartbeat_interval(Duration::from_millis(50))
    };
    let mut reader = Reader::new(group()).await.unwrap();
    for _ in 0..20 {
        // acked as returned
        tokio::time::timeout(Duration::from_secs(10), reader.read_message())
            .await
            .expect("a message within 10 s")
            .unwrap();
    }
    reader.close().await;
    assert_eq!(mock.committed("g", "t", 0), Some(20));
    let epochs: Vec<(i64, i32)> = mock
        .captured::<OffsetCommitRequest>()
        .iter()
        .flat_map(|r| r.topics.iter())
        .flat_map(|t| t.partitions.iter())
        .map(|p| (p.committed_offset, p.committed_leader_epoch))
        .collect();
    assert_eq!(epochs.last(), Some(&(20, 0)), "committed {epochs:?}");
    mock.truncate("t", 0, 10).unwrap();
    produce_tagged(&mock, "new", 10, 30);
    let mut reader = Reader::new(group()).await.unwrap();
    let got = tokio::time::timeout(Duration::from_secs(10), reader.next_message())
        .await
        .expect("an item within 10 s");
    let err = match got {
        Ok(m) => panic!(
            "started at {}@{} in the truncated log without noticing the truncation",
            value(&m),
            m.offset
        ),
        Err(e) => e,
    };
    let t = std::error::Error::source(&err)
        .and_then(|s| s.downcast_ref::<LogTruncation>())
        .unwrap_or_else(|| panic!("no LogTruncation in {err}"));
    assert_eq!((t.position, t.epoch, t.divergent_offset), (20, 0, Some(10)));
    reader.close().await;
}

/// The mock keeps fetch sessions as Kafka does. With records appended while reading, the
/// broker refusing an incremental fetch once with `FETCH_SESSION_ID_NOT_FOUND` and once
/// with `INVALID_FETCH_SESSION_EPOCH`: the reader recovers with a full fetch each time (no
/// error counted) and yields every record once, in order.
#[tokio::test]
async fn a_lost_fetch_session_is_recovered_by_a_full_fetch_without_loss() {
    let cluster = cluster(1, 8).await;
    for p in 0..8 {
        fill(&cluster, p, 20);
    }
    let config = ReaderConfig::new(cluster.bootstrap())
        .topic("t")
        .max_wait(Duration::from_millis(20));
    let mut reader = Reader::new(config).await.unwrap();
    let mut next = [0i64; 8];
    let mut got = 0;
    for round in 0..3 {
        let want = 8 * 20 * (round + 1);
        while got < want {
            let m = tokio::time::timeout(Duration::from_secs(10), reader.next_message())
                .await
                .expect("a message within 10 s")
                .unwrap();
            let p = m.partition as usize;
            assert_eq!(m.offset, next[p], "partition {p}");
            assert_eq!(
                m.value.as_deref(),
                Some(format!("v{}", m.offset).as_bytes())
            );
            next[p] += 1;
            got += 1;
        }
        let s = reader.stats();
        assert!(s.incremental_fetches > 0, "round {round}: {s:?}");
        // The fault set last round applies to the fetch after the one that was waiting
        // (it brought this round's records): let it be used before setting the next.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while reader.stats().fetch_sessions_lost < round as u64 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{:?}",
                reader.stats()
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let code = match round {
            0 => ErrorCode::FetchSessionIdNotFound,
            _ => ErrorCode::InvalidFetchSessionEpoch,
        };
        if round == 2 {
            break;
        }
        cluster.fault(ApiKey::FETCH, kafkapipe::mock::Fault::Error(code), 1);
        for p in 0..8 {
            fill(&cluster, p, 20 * (round as i64 + 2));
        }
    }
    let extra = tokio::time::timeout(Duration::from_millis(300), reader.next_message()).await;
    assert!(extra.is_err(), "a message more than appended: {extra:?}");
    let s = reader.stats();
    assert_eq!(
        s.fetches - s.incremental_fetches,
        3,
        "one full fetch each to open, after 70, after 71: {s:?}"
    );
    assert_eq!(s.fetch_sessions_lost, 2, "{s:?}");
    assert_eq!(s.errors, 0, "{s:?}");
}

/// Closing a reader closes the fetch sessions it opened (a Fetch with epoch -1 to each
/// broker, as the Java consumer sends on close), so brokers do not keep a slot of their
/// session cache (`max.incremental.fetch.session.cache.slots`) for a reader that is gone.
#[tokio::test]
async fn closing_a_reader_closes_its_fetch_sessions() {
    let cluster = cluster(2, 4).await;
    for p in 0..4 {
        fill(&cluster, p, 10);
    }
    let config = ReaderConfig::new(cluster.bootstrap())
        .topic("t")
        .max_wait(Duration::from_millis(20));
    let mut reader = Reader::new(config).await.unwrap();
    for _ in 0..40 {
        tokio::time::timeout(Duration::from_secs(10), reader.next_message())
            .await
            .expect("a message within 10 s")
            .unwrap();
    }
    // Both brokers lead partitions; each holds this reader's session once it answered
    // an incremental fetch.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while reader.stats().incremental_fetches < 2 || cluster.fetch_sessions() < 2 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{:?}",
            reader.stats()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(cluster.fetch_sessions(), 2);
    reader.close().await;
    assert_eq!(
        cluster.fetch_sessions(),
        0,
        "sessions left open after close"
    );
}
