//! Unit tests of the fetch decoding: control batches, the records before the fetch
//! offset, aborted transactions, the decompression budget.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use bytes::Bytes;

use super::fetch::*;
use crate::compression::Compression;
use crate::protocol::messages::AbortedTransaction;
use crate::protocol::TaggedFields;
use crate::record::{ControlRecord, Record, RecordBatch, RecordBatchBuilder};

const P: i64 = 7;
const Q: i64 = 9;

/// A RecordBatch v2 on the wire at `base` with `n` records (values `"{tag}{i}"`),
/// built by the producer-side builder and decoded back, as a fetch would see it.
fn batch(base: i64, n: usize, producer: i64, transactional: bool) -> RecordBatch {
    let mut b = RecordBatchBuilder::new(Compression::None)
        .producer(producer, 0, 0)
        .transactional(transactional);
    for i in 0..n {
        b.append(
            1_000 + i as i64,
            None,
            Some(format!("v{}", base + i as i64).as_bytes()),
            &[],
        )
        .unwrap();
    }
    decode_one(b.build().unwrap(), base)
}

/// A transaction marker (control batch with one control record) at `offset`.
fn marker(offset: i64, producer: i64, kind: ControlRecord) -> RecordBatch {
    let mut b = RecordBatchBuilder::new(Compression::None)
        .producer(producer, 0, -1)
        .transactional(true)
        .control(true);
    b.append(1_000, Some(&kind.key()), Some(&[0, 0, 0, 0, 0, 0]), &[])
        .unwrap();
    decode_one(b.build().unwrap(), offset)
}

/// Decode one encoded batch after moving it to base offset `base` (the base offset is
/// not covered by the CRC, so the broker rewrites it in place like this).
fn decode_one(bytes: Bytes, base: i64) -> RecordBatch {
    let mut raw = bytes.to_vec();
    raw[..8].copy_from_slice(&base.to_be_bytes());
    let mut d = crate::record::decode_batches(Bytes::from(raw), 1 << 20).unwrap();
    assert_eq!(d.batches.len(), 1);
    d.batches.remove(0)
}

fn aborted(producer_id: i64, first_offset: i64) -> AbortedTransaction {
    AbortedTransaction {
        producer_id,
        first_offset,
        tagged_fields: TaggedFields::new(),
    }
}

fn offsets(records: &[Record]) -> Vec<i64> {
    records.iter().map(|r| r.offset).collect()
}

#[test]
fn control_batches_are_hidden() {
    let batches = vec![
        batch(0, 2, P, true),
        marker(2, P, ControlRecord::Commit),
        batch(3, 1, -1, false),
        marker(4, P, ControlRecord::Abort),
    ];
    let (records, next) = visible_records(batches, 0, &[]);
    assert_eq!(offsets(&records), [0, 1, 3]);
    assert_eq!(records[2].value.as_deref(), Some(&b"v3"[..]));
    assert_eq!(next, 5);
}

#[test]
fn records_before_from_are_skipped() {
    // The broker returns whole batches: one starting before the requested offset.
    let batches = vec![batch(10, 5, -1, false), batch(15, 2, -1, false)];
    let (records, next) = visible_records(batches, 12, &[]);
    assert_eq!(offsets(&records), [12, 13, 14, 15, 16]);
    assert_eq!(next, 17);
}

#[test]
fn batch_entirely_before_from_contributes_nothing() {
    let batches = vec![batch(0, 3, -1, false), batch(3, 2, -1, false)];
    let (records, next) = visible_records(batches, 4, &[]);
    assert_eq!(offsets(&records), [4]);
    assert_eq!(next, 5);
}

#[test]
fn next_offset_advances_past_control_only_batch() {
    let (records, next) = visible_records(vec![marker(41, P, ControlRecord::Commit)], 41, &[]);
    assert!(records.is_empty());
    assert_eq!(next, 42);
}

#[test]
fn nothing_fetched_keeps_requested_offset() {
    let (records, next) = visible_records(Vec::new(), 99, &[aborted(P, 3)]);
    assert!(records.is_empty());
    assert_eq!(next, 99);
}

/// Offsets: 0-1 P (aborted txn), 2-3 Q (committed txn), 4 P, 5 P ABORT, 6 Q COMMIT,
/// 7-8 P (new txn, not aborted), 9 P COMMIT.
fn interleaved() -> Vec<RecordBatch> {
    vec![
        batch(0, 2, P, true),
        batch(2, 2, Q, true),
        batch(4, 1, P, true),
        marker(5, P, ControlRecord::Abort),
        marker(6, Q, ControlRecord::Commit),
        batch(7, 2, P, true),
        marker(9, P, ControlRecord::Commit),
    ]
}

#[test]
fn read_committed_hides_aborted_txn_keeps_interleaved_committed_txn() {
    let (records, next) = visible_records(interleaved(), 0, &[aborted(P, 0)]);
    assert_eq!(offsets(&records), [2, 3, 7, 8]);
    assert_eq!(next, 10);
}

#[test]
fn read_uncommitted_shows_aborted_records() {
    let (records, next) = visible_records(interleaved(), 0, &[]);
    assert_eq!(offsets(&records), [0, 1, 2, 3, 4, 7, 8]);
    assert_eq!(next, 10);
}

#[test]
fn aborted_txn_beyond_fetched_batches_hides_nothing() {
    let (records, _) = visible_records(interleaved(), 0, &[aborted(P, 10)]);
    assert_eq!(offsets(&records), [0, 1, 2, 3, 4, 7, 8]);
    let (records, _) = visible_records(interleaved(), 0, &[aborted(P, 1_000)]);
    assert_eq!(offsets(&records), [0, 1, 2, 3, 4, 7, 8]);
}

#[test]
fn two_aborted_txns_of_same_producer_in_sequence() {
    // 0-1 P, 2 P ABORT, 3 Q (plain), 4-5 P, 6 P ABORT, 7 P (txn 3, committed), 8 COMMIT
    let batches = vec![
        batch(0, 2, P, true),
        marker(2, P, ControlRecord::Abort),
        batch(3, 1, Q, false),
        batch(4, 2, P, true),
        marker(6, P, ControlRecord::Abort),
        batch(7, 1, P, true),
        marker(8, P, ControlRecord::Commit),
    ];
    // Listed out of order on purpose: the consumer sorts by first offset.
    let list = [aborted(P, 4), aborted(P, 0)];
    let (records, next) = visible_records(batches, 0, &list);
    assert_eq!(offsets(&records), [3, 7]);
    assert_eq!(next, 9);
}

#[test]
fn aborted_txn_activates_when_batch_last_offset_reaches_first_offset() {
    // Java: a producer is aborted once firstOffset <= batch.lastOffset(), so a batch
    // that merely *ends* at the first offset is already hidden.
    let batches = || vec![batch(10, 3, P, true), marker(13, P, ControlRecord::Abort)];
    let (records, _) = visible_records(batches(), 10, &[aborted(P, 12)]);
    assert!(records.is_empty(), "{records:?}");
    let (records, _) = visible_records(batches(), 10, &[aborted(P, 13)]);
    assert_eq!(offsets(&records), [10, 11, 12]);
}

#[test]
fn idempotent_batches_of_aborted_producer_stay_visible() {
    // Only transactional batches are removed; a non-transactional batch with the same
    // producer id is not part of the aborted transaction.
    let batches = vec![
        batch(0, 1, P, true),
        batch(1, 1, P, false),
        marker(2, P, ControlRecord::Abort),
    ];
    let (records, _) = visible_records(batches, 0, &[aborted(P, 0)]);
    assert_eq!(offsets(&records), [1]);
}

#[test]
fn aborted_txn_started_before_fetch_offset() {
    // The txn began before the fetch window: its list entry has a first offset lower
    // than every fetched batch and still hides P until its marker.
    let batches = vec![
        batch(20, 2, P, true),
        batch(22, 1, Q, true),
        marker(23, P, ControlRecord::Abort),
        marker(24, Q, ControlRecord::Commit),
        batch(25, 1, P, true),
    ];
    let (records, next) = visible_records(batches, 21, &[aborted(P, 5)]);
    assert_eq!(offsets(&records), [22, 25]);
    assert_eq!(next, 26);
}

#[test]
fn decompress_limit_is_bounded() {
    assert_eq!(decompress_limit(-5), 64 * 1024 * 1024);
    assert_eq!(decompress_limit(1024 * 1024), 64 * 1024 * 1024);
    assert_eq!(decompress_limit(i32::MAX), 1024 * 1024 * 1024);
}
