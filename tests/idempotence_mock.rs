//! The idempotent writer's recovery (KIP-360, as the Java client does it) and its up to
//! five batches in flight per partition, against exact faults of
//! `kafkapipe::mock::MockCluster`: lost producer state, out-of-order sequences after an
//! ambiguous failure, a retriable or a fatal error in the middle of five batches in
//! flight. Every case checks the partition's log: each record once, in order.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use kafkapipe::mock::{Fault, MockCluster};
use kafkapipe::protocol::{ApiKey, ErrorCode};
use kafkapipe::record::decode_batches;
use kafkapipe::writer::{Message, Writer, WriterConfig};

const TOPIC: &str = "t";

async fn cluster() -> MockCluster {
    MockCluster::builder()
        .topic(TOPIC, 1)
        .start()
        .await
        .unwrap()
}

/// Idempotence is the default; batches of 10 messages, up to 5 in flight.
fn writer(cluster: &MockCluster) -> Writer {
    Writer::new(
        WriterConfig::new(cluster.bootstrap())
            .topic(TOPIC)
            .batch_size(10)
            .batch_timeout(Duration::from_millis(2))
            .backoff(Duration::from_millis(5), Duration::from_millis(20)),
    )
    .unwrap()
}

fn numbered(from: usize, to: usize) -> Vec<Message> {
    (from..to)
        .map(|i| Message::new(format!("{i:05}")).with_partition(0))
        .collect()
}

fn expected(ranges: &[(usize, usize)]) -> Vec<Bytes> {
    ranges
        .iter()
        .flat_map(|(a, b)| *a..*b)
        .map(|i| Bytes::from(format!("{i:05}")))
        .collect()
}

/// (producer id, epoch, base sequence, values) of every batch in the log.
fn log(cluster: &MockCluster) -> Vec<(i64, i16, i32, Vec<Bytes>)> {
    cluster
        .batches(TOPIC, 0)
        .into_iter()
        .flat_map(|b| decode_batches(b, 1 << 24).unwrap().batches)
        .map(|b| {
            let values = b.records.into_iter().map(|r| r.value.unwrap()).collect();
            (b.producer_id, b.producer_epoch, b.base_sequence, values)
        })
        .collect()
}

fn values(cluster: &MockCluster) -> Vec<Bytes> {
    log(cluster).into_iter().flat_map(|b| b.3).collect()
}

/// Let the first `n` produce requests through, then apply `fault` to the next one.
fn fault_request(cluster: &MockCluster, n: u32, fault: Fault) {
    if n > 0 {
        cluster.fault(ApiKey::PRODUCE, Fault::Delay(Duration::ZERO), n);
    }
    cluster.fault(ApiKey::PRODUCE, fault, 1);
}

#[tokio::test]
async fn unknown_producer_id_bumps_the_epoch_without_loss_or_duplicate() {
    let cluster = cluster().await;
    let mut w = writer(&cluster);
    w.write_messages(numbered(0, 30)).await.unwrap();
    // The broker forgets the producer; the next 30 records (3 batches, in flight
    // together) are answered UNKNOWN_PRODUCER_ID.
    assert_eq!(cluster.expire_producers(TOPIC, 0), Some(1));
    w.write_messages(numbered(30, 60)).await.unwrap();
    w.write_messages(numbered(60, 70)).await.unwrap();
    w.close().await.unwrap();
    assert_eq!(values(&cluster), expected(&[(0, 70)]));
    let log = log(&cluster);
    let pid = log[0].0;
    assert!(log.iter().all(|b| b.0 == pid), "one producer id: {log:?}");
    assert_eq!(log.last().map(|b| (b.1, b.2)), Some((1, 30)), "{log:?}");
    assert_eq!(
        log.iter().map(|b| (b.1, b.2)).collect::<Vec<_>>(),
        [(0, 0), (0, 10), (0, 20), (1, 0), (1, 10), (1, 20), (1, 30)],
        "epoch bumped locally, sequences restarted at 0"
    );
    assert_eq!(
        cluster.requests(ApiKey::INIT_PRODUCER_ID),
        1,
        "the idempotent epoch is bumped locally, as the Java client does"
    );
}

#[tokio::test]
async fn out_of_order_sequence_for_the_next_batch_bumps_the_epoch() {
    let cluster = cluster().await;
    let mut w = writer(&cluster);
    w.write_messages(numbered(0, 10)).await.unwrap();
    // The broker says the next expected batch is out of order: a gap it cannot fill.
    fault_request(
        &cluster,
        0,
        Fault::Error(ErrorCode::OutOfOrderSequenceNumber),
    );
    w.write_messages(numbered(10, 20)).await.unwrap();
    w.close().await.unwrap();
    assert_eq!(values(&cluster), expected(&[(0, 20)]));
    let epochs: Vec<(i16, i32)> = log(&cluster).iter().map(|b| (b.1, b.2)).collect();
    assert_eq!(epochs, [(0, 0), (1, 0)]);
    assert_eq!(cluster.requests(ApiKey::INIT_PRODUCER_ID), 1);
}

/// Five batches in flight; the second meets `fault`; the others must still be written
/// once each and in order, under the first epoch (no bump needed: the later batches'
/// OUT_OF_ORDER_SEQUENCE_NUMBER only says the second is missing).
async fn five_in_flight_with_a_fault_on_batch_2(fault: ErrorCode) {
    let cluster = cluster().await;
    cluster.capture(ApiKey::PRODUCE);
    let mut w = writer(&cluster);
    fault_request(&cluster, 1, Fault::Error(fault));
    w.write_messages(numbered(0, 50)).await.unwrap();
    w.close().await.unwrap();
    assert_eq!(values(&cluster), expected(&[(0, 50)]), "{fault:?}");
    let log = log(&cluster);
    assert!(log.iter().all(|b| b.1 == 0), "{fault:?}: {log:?}");
    // 5 requests went out at once: batches 3..5 came back OUT_OF_ORDER and were sent
    // again after batch 2 (with one batch in flight there would be 6 requests).
    assert_eq!(cluster.requests(ApiKey::PRODUCE), 9, "{fault:?}");
}

#[tokio::test]
async fn five_in_flight_with_a_retriable_error_on_batch_2_keeps_order() {
    five_in_flight_with_a_fault_on_batch_2(ErrorCode::NotLeaderOrFollower).await;
}

/// REQUEST_TIMED_OUT is ambiguous (the batch may be written); here it was not, so the
/// broker answers the three batches after it OUT_OF_ORDER_SEQUENCE_NUMBER.
#[tokio::test]
async fn out_of_order_sequence_after_an_ambiguous_failure_is_retried_in_order() {
    five_in_flight_with_a_fault_on_batch_2(ErrorCode::RequestTimedOut).await;
}

/// A non-retriable error on batch 2 of 5 in flight: batch 2 fails, the epoch is bumped
/// and batches 3..5 are renumbered from 0 and written (Java's
/// `requestEpochBumpForPartition` for the idempotent producer).
#[tokio::test]
async fn a_fatal_error_on_batch_2_of_5_bumps_the_epoch_and_writes_the_rest() {
    let cluster = cluster().await;
    let mut w = writer(&cluster);
    let mut deliveries = w.deliveries();
    fault_request(&cluster, 1, Fault::Error(ErrorCode::InvalidRecord));
    let err = w.write_messages(numbered(0, 50)).await.unwrap_err();
    assert_eq!(err.kafka_code(), Some(ErrorCode::InvalidRecord), "{err}");
    let mut failed = Vec::new();
    for _ in 0..50 {
        let d = deliveries.next().await.unwrap();
        if d.result.is_err() {
            failed.push(d.message.value.unwrap());
        }
    }
    assert_eq!(failed, expected(&[(10, 20)]));
    w.close().await.unwrap();
    assert_eq!(values(&cluster), expected(&[(0, 10), (20, 50)]));
    let epochs: Vec<(i16, i32)> = log(&cluster).iter().map(|b| (b.1, b.2)).collect();
    assert_eq!(epochs, [(0, 0), (1, 0), (1, 10), (1, 20)]);
}

/// A batch given up after an ambiguous failure (here: its request hangs past the
/// delivery timeout) leaves its sequence unresolved; with nothing after it in flight the
/// epoch is bumped (Java's `maybeResolveSequences`), not the producer id renewed, and the
/// next batch is written.
#[tokio::test]
async fn an_expired_ambiguous_batch_is_resolved_by_an_epoch_bump() {
    let cluster = cluster().await;
    let mut w = Writer::new(
        WriterConfig::new(cluster.bootstrap())
            .topic(TOPIC)
            .batch_size(10)
            .batch_timeout(Duration::from_millis(2))
            .request_timeout(Duration::from_millis(300))
            .delivery_timeout(Duration::from_millis(200))
            .backoff(Duration::from_millis(5), Duration::from_millis(20)),
    )
    .unwrap();
    w.write_messages(numbered(0, 10)).await.unwrap();
    fault_request(&cluster, 0, Fault::Hang);
    let err = w.write_messages(numbered(10, 20)).await.unwrap_err();
    assert!(err.to_string().contains("delivery timeout"), "{err}");
    w.write_messages(numbered(20, 30)).await.unwrap();
    w.close().await.unwrap();
    assert_eq!(values(&cluster), expected(&[(0, 10), (20, 30)]));
    let epochs: Vec<(i16, i32)> = log(&cluster).iter().map(|b| (b.1, b.2)).collect();
    assert_eq!(epochs, [(0, 0), (1, 0)]);
    assert_eq!(cluster.requests(ApiKey::INIT_PRODUCER_ID), 1);
}

#[tokio::test]
async fn one_in_flight_per_partition_still_works() {
    let cluster = cluster().await;
    let mut w = Writer::new(
        WriterConfig::new(cluster.bootstrap())
            .topic(TOPIC)
            .batch_size(10)
            .max_in_flight_per_partition(1)
            .backoff(Duration::from_millis(5), Duration::from_millis(20)),
    )
    .unwrap();
    fault_request(&cluster, 1, Fault::Error(ErrorCode::NotLeaderOrFollower));
    w.write_messages(numbered(0, 50)).await.unwrap();
    w.close().await.unwrap();
    assert_eq!(values(&cluster), expected(&[(0, 50)]));
    assert_eq!(cluster.requests(ApiKey::PRODUCE), 6, "one batch at a time");
}

/// Issue 26: a fresh partition refuses its first batch with a retriable error (here
/// NOT_LEADER_OR_FOLLOWER: it is not ready yet) while the next four are in flight behind
/// it. The partition, ready a moment later and without state for the producer, would take
/// the second batch as the producer's first (Kafka >= 2.5 accepts any sequence then), and
/// the retried first batch would be refused OUT_OF_ORDER_SEQUENCE_NUMBER ("0 (incoming
/// seq. number), 49 (current end sequence number)") — and re-appended after the others
/// with success reported. The first batch of a producer id/epoch on a partition goes
/// alone, so the others wait for it: written once each, in order, under one epoch.
#[tokio::test]
async fn a_fresh_partition_refusing_its_first_batch_keeps_order() {
    let cluster = cluster().await;
    let mut w = writer(&cluster);
    fault_request(&cluster, 0, Fault::Error(ErrorCode::NotLeaderOrFollower));
    let written = w.write_messages(numbered(0, 50)).await;
    w.close().await.unwrap();
    let log = log(&cluster);
    let batches: Vec<(i16, i32)> = log.iter().map(|b| (b.1, b.2)).collect();
    assert_eq!(
        values(&cluster),
        expected(&[(0, 50)]),
        "each record once and in order (writer said {written:?}): {batches:?}"
    );
    written.unwrap();
    assert_eq!(batches, [(0, 0), (0, 10), (0, 20), (0, 30), (0, 40)]);
}

/// Requirement: a batch overtaken by its successors is never re-appended after them with
/// success reported. Here the guard above cannot help: the partition acknowledged the
/// first batch, then forgot the producer (as Kafka >= 2.5 does once retention removed its
/// batches); the next batch is refused (retriable) while four are in flight behind it,
/// those four are taken, and its retry is refused OUT_OF_ORDER_SEQUENCE_NUMBER. Its
/// messages fail with that error; the rest are written once each, and the partition goes
/// on without an epoch bump.
#[tokio::test]
async fn a_batch_overtaken_by_its_successors_fails_instead_of_being_re_appended() {
    let cluster = cluster().await;
    let mut w = writer(&cluster);
    let mut deliveries = w.deliveries();
    w.write_messages(numbered(0, 10)).await.unwrap();
    assert_eq!(cluster.forget_producers(TOPIC, 0), Some(1));
    fault_request(&cluster, 0, Fault::Error(ErrorCode::NotLeaderOrFollower));
    let err = w.write_messages(numbered(10, 60)).await.unwrap_err();
    assert_eq!(
        err.kafka_code(),
        Some(ErrorCode::OutOfOrderSequenceNumber),
        "{err}"
    );
    assert!(err.to_string().contains("order is broken"), "{err}");
    let mut failed = Vec::new();
    for _ in 0..60 {
        let d = deliveries.next().await.unwrap();
        if d.result.is_err() {
            failed.push(d.message.value.unwrap());
        }
    }
    assert_eq!(failed, expected(&[(10, 20)]), "exactly the overtaken batch");
    w.write_messages(numbered(60, 70)).await.unwrap();
    w.close().await.unwrap();
    assert_eq!(values(&cluster), expected(&[(0, 10), (20, 70)]));
    let batches: Vec<(i16, i32)> = log(&cluster).iter().map(|b| (b.1, b.2)).collect();
    assert_eq!(
        batches,
        [(0, 0), (0, 20), (0, 30), (0, 40), (0, 50), (0, 60)],
        "no epoch bump: the next batch follows the acknowledged ones"
    );
}

/// The same hazard after an epoch bump: sequences restart at 0 under the new epoch, and
/// a partition with no state for the producer (forgotten, Kafka >= 2.5) takes any of
/// them first. Partition 0's rejected batch bumps the epoch; partition 1, which forgot the
/// producer, refuses the first batch of the new epoch (retriable) with four behind it. The
/// first batch of the new epoch goes alone, so nothing overtakes it.
#[tokio::test]
async fn the_first_batch_after_an_epoch_bump_is_not_overtaken() {
    let cluster = MockCluster::builder()
        .topic(TOPIC, 2)
        .start()
        .await
        .unwrap();
    let mut w = writer(&cluster);
    let on = |p: i32, from: usize, to: usize| -> Vec<Message> {
        numbered(from, to)
            .into_iter()
            .map(|m| m.with_partition(p))
            .collect()
    };
    w.write_messages(on(0, 0, 10).into_iter().chain(on(1, 0, 10)))
        .await
        .unwrap();
    cluster.fault_partition(ApiKey::PRODUCE, TOPIC, 0, ErrorCode::InvalidRecord, 1);
    let err = w.write_messages(on(0, 10, 20)).await.unwrap_err();
    assert_eq!(err.kafka_code(), Some(ErrorCode::InvalidRecord), "{err}");
    assert_eq!(cluster.forget_producers(TOPIC, 1), Some(1));
    cluster.fault_partition(ApiKey::PRODUCE, TOPIC, 1, ErrorCode::NotLeaderOrFollower, 1);
    let written = w.write_messages(on(1, 10, 60)).await;
    w.close().await.unwrap();
    let p1: Vec<(i16, i32, Vec<Bytes>)> = cluster
        .batches(TOPIC, 1)
        .into_iter()
        .flat_map(|b| decode_batches(b, 1 << 24).unwrap().batches)
        .map(|b| {
            let values = b.records.into_iter().map(|r| r.value.unwrap()).collect();
            (b.producer_epoch, b.base_sequence, values)
        })
        .collect();
    let order: Vec<(i16, i32)> = p1.iter().map(|b| (b.0, b.1)).collect();
    let values: Vec<Bytes> = p1.into_iter().flat_map(|b| b.2).collect();
    assert_eq!(
        values,
        expected(&[(0, 60)]),
        "partition 1 in order (writer said {written:?}): {order:?}"
    );
    written.unwrap();
    assert_eq!(
        order,
        [(0, 0), (1, 0), (1, 10), (1, 20), (1, 30), (1, 40)],
        "the new epoch restarts at 0"
    );
}
