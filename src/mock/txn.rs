//! The transaction coordinator: InitProducerId with a transactional id,
//! AddPartitionsToTxn, AddOffsetsToTxn, TxnOffsetCommit and EndTxn, which writes the
//! COMMIT or ABORT marker into every partition of the transaction (the logs then report
//! the last stable offset and the aborted transactions from those markers) and applies the
//! transaction's offsets to their groups on commit. Transactions v2 (KIP-890, when the
//! cluster finalizes `transaction.version` >= 2): Produce v12 joins partitions (`join`),
//! EndTxn v5 bumps the epoch and answers the next producer id and epoch.

use std::collections::BTreeSet;

use bytes::Bytes;

use super::State;
use crate::compression::Compression;
use crate::protocol::messages::*;
use crate::protocol::ErrorCode;
use crate::record::{ControlRecord, RecordBatchBuilder};

/// One transactional id's producer and its ongoing transaction.
#[derive(Debug, Default)]
pub(super) struct Txn {
    pub producer_id: i64,
    pub epoch: i16,
    partitions: BTreeSet<(String, i32)>,
    /// (group, topic, partition, offset, metadata) committed within the transaction.
    offsets: Vec<(String, String, i32, i64, Option<String>)>,
    /// Transactions v2: how the last transaction ended (commit?) by an EndTxn v5 that
    /// bumped the epoch, until the next one starts — so a retry of that EndTxn (the
    /// previous epoch) is answered as Kafka does, with success and the current epoch.
    ended_v2: Option<bool>,
}

/// The control batch marking the end of `producer`'s transaction.
fn marker(producer: i64, epoch: i16, kind: ControlRecord) -> Option<Bytes> {
    let mut b = RecordBatchBuilder::new(Compression::None)
        .producer(producer, epoch, -1)
        .transactional(true)
        .control(true);
    // value: version 0, coordinator epoch 0
    b.append(0, Some(&kind.key()), Some(&[0, 0, 0, 0, 0, 0]), &[])
        .ok()?;
    b.build().ok()
}

/// End the transaction of `tid`: markers into its partitions, offsets into their groups
/// on commit.
fn finish(st: &mut State, tid: &str, commit: bool) {
    let Some(txn) = st.transactions.get_mut(tid) else {
        return;
    };
    let partitions = std::mem::take(&mut txn.partitions);
    let offsets = std::mem::take(&mut txn.offsets);
    let (pid, epoch) = (txn.producer_id, txn.epoch);
    let kind = if commit {
        ControlRecord::Commit
    } else {
        ControlRecord::Abort
    };
    if let Some(m) = marker(pid, epoch, kind) {
        for (topic, p) in partitions {
            if let Some(log) = st.partition_mut(&topic, p) {
                log.append_raw(&m);
            }
        }
    }
    if commit {
        for (group, topic, p, offset, metadata) in offsets {
            st.groups
                .entry(group)
                .or_default()
                .commit(topic, p, offset, metadata);
        }
    }
}

/// InitProducerId for a transactional id: the same producer id with the next epoch; an
/// ongoing transaction is aborted first.
pub(super) fn init(st: &mut State, tid: &str) -> (i64, i16) {
    if st.transactions.contains_key(tid) {
        finish(st, tid, false);
    } else {
        st.next_producer_id += 1;
        let producer_id = st.next_producer_id;
        st.transactions.insert(
            tid.to_string(),
            Txn {
                producer_id,
                epoch: -1,
                ..Txn::default()
            },
        );
    }
    match st.transactions.get_mut(tid) {
        Some(t) => {
            t.ended_v2 = None;
            t.epoch = t.epoch.wrapping_add(1);
            (t.producer_id, t.epoch)
        }
        None => (-1, -1),
    }
}

/// Why `tid` with this producer cannot act, if it cannot.
fn check(st: &State, id: i32, tid: &str, producer_id: i64, epoch: i16) -> Option<ErrorCode> {
    if st.coordinator(tid).is_none_or(|b| b.id != id) {
        return Some(ErrorCode::NotCoordinator);
    }
    match st.transactions.get(tid) {
        None => Some(ErrorCode::InvalidProducerIdMapping),
        Some(t) if t.producer_id != producer_id => Some(ErrorCode::InvalidProducerIdMapping),
        Some(t) if epoch < t.epoch => Some(ErrorCode::ProducerFenced),
        Some(t) if epoch != t.epoch => Some(ErrorCode::InvalidProducerEpoch),
        Some(_) => None,
    }
}

fn add_topics(
    st: &mut State,
    tid: &str,
    error: Option<ErrorCode>,
    verify_only: bool,
    topics: &[AddPartitionsToTxnTopic],
) -> Vec<AddPartitionsToTxnTopicResult> {
    topics
        .iter()
        .map(|t| AddPartitionsToTxnTopicResult {
            name: t.name.clone(),
            results_by_partition: t
                .partitions
                .iter()
                .map(|&p| {
                    let e = error.or_else(|| {
                        st.partition(&t.name, p)
                            .is_none()
                            .then_some(ErrorCode::UnknownTopicOrPartition)
                    });
                    if e.is_none() && !verify_only {
                        if let Some(txn) = st.transactions.get_mut(tid) {
                            txn.partitions.insert((t.name.clone(), p));
                        }
                    }
                    AddPartitionsToTxnPartitionResult {
                        partition_index: p,
                        partition_error_code: e.map_or(0, ErrorCode::code),
                        ..AddPartitionsToTxnPartitionResult::default()
                    }
                })
                .collect(),
            ..AddPartitionsToTxnTopicResult::default()
        })
        .collect()
}

pub(super) fn add_partitions(
    id: i32,
    st: &mut State,
    req: &AddPartitionsToTxnRequest,
    version: i16,
    forced: Option<ErrorCode>,
) -> AddPartitionsToTxnResponse {
    if version <= 3 {
        let tid = req.v3_and_below_transactional_id.clone();
        let error = forced.or_else(|| {
            check(
                st,
                id,
                &tid,
                req.v3_and_below_producer_id,
                req.v3_and_below_producer_epoch,
            )
        });
        let results = add_topics(st, &tid, error, false, &req.v3_and_below_topics);
        return AddPartitionsToTxnResponse {
            results_by_topic_v3_and_below: results,
            ..AddPartitionsToTxnResponse::default()
        };
    }
    let results = req
        .transactions
        .iter()
        .map(|t| {
            let error = forced
                .or_else(|| check(st, id, &t.transactional_id, t.producer_id, t.producer_epoch));
            AddPartitionsToTxnResult {
                transactional_id: t.transactional_id.clone(),
                topic_results: add_topics(st, &t.transactional_id, error, t.verify_only, &t.topics),
                ..AddPartitionsToTxnResult::default()
            }
        })
        .collect();
    AddPartitionsToTxnResponse {
        results_by_transaction: results,
        ..AddPartitionsToTxnResponse::default()
    }
}

pub(super) fn add_offsets(
    id: i32,
    st: &State,
    req: &AddOffsetsToTxnRequest,
    forced: Option<ErrorCode>,
) -> AddOffsetsToTxnResponse {
    let error = forced.or_else(|| {
        check(
            st,
            id,
            &req.transactional_id,
            req.producer_id,
            req.producer_epoch,
        )
    });
    AddOffsetsToTxnResponse {
        error_code: error.map_or(0, ErrorCode::code),
        ..AddOffsetsToTxnResponse::default()
    }
}

/// TxnOffsetCommit: kept with the transaction, applied to the group when it commits.
/// (Kafka sends it to the group coordinator; the mock accepts it on any broker.)
pub(super) fn offset_commit(
    st: &mut State,
    req: &TxnOffsetCommitRequest,
    forced: Option<ErrorCode>,
) -> TxnOffsetCommitResponse {
    let error = forced.or_else(|| match st.transactions.get(&req.transactional_id) {
        Some(t) if t.producer_id == req.producer_id && t.epoch == req.producer_epoch => None,
        Some(t) if t.producer_id == req.producer_id && req.producer_epoch < t.epoch => {
            Some(ErrorCode::ProducerFenced)
        }
        _ => Some(ErrorCode::InvalidProducerIdMapping),
    });
    let topics = req
        .topics
        .iter()
        .map(|t| TxnOffsetCommitResponseTopic {
            name: t.name.clone(),
            partitions: t
                .partitions
                .iter()
                .map(|p| {
                    if error.is_none() {
                        if let Some(txn) = st.transactions.get_mut(&req.transactional_id) {
                            txn.ended_v2 = None;
                            txn.offsets.push((
                                req.group_id.clone(),
                                t.name.clone(),
                                p.partition_index,
                                p.committed_offset,
                                p.committed_metadata.clone(),
                            ));
                        }
                    }
                    TxnOffsetCommitResponsePartition {
                        partition_index: p.partition_index,
                        error_code: error.map_or(0, ErrorCode::code),
                        ..TxnOffsetCommitResponsePartition::default()
                    }
                })
                .collect(),
            ..TxnOffsetCommitResponseTopic::default()
        })
        .collect();
    TxnOffsetCommitResponse {
        topics,
        ..TxnOffsetCommitResponse::default()
    }
}

/// Produce v12+ of `tid` (transactions v2): the partition joins the transaction if the
/// batch's producer id and epoch are the transaction's (read from the batch header).
pub(super) fn join(
    st: &mut State,
    tid: &str,
    topic: &str,
    partition: i32,
    records: &[u8],
) -> Option<ErrorCode> {
    // Producer id at byte 43 and epoch at 51 of a v2 record batch.
    let (Some(pid), Some(epoch)) = (records.get(43..51), records.get(51..53)) else {
        return Some(ErrorCode::CorruptMessage);
    };
    let pid = i64::from_be_bytes(pid.try_into().unwrap_or_default());
    let epoch = i16::from_be_bytes(epoch.try_into().unwrap_or_default());
    match st.transactions.get_mut(tid) {
        Some(t) if t.producer_id == pid && t.epoch == epoch => {
            t.ended_v2 = None;
            t.partitions.insert((topic.to_string(), partition));
            None
        }
        Some(t) if t.producer_id == pid => Some(ErrorCode::InvalidProducerEpoch),
        _ => Some(ErrorCode::InvalidProducerIdMapping),
    }
}

pub(super) fn end(
    id: i32,
    st: &mut State,
    req: &EndTxnRequest,
    version: i16,
    forced: Option<ErrorCode>,
) -> EndTxnResponse {
    let error = forced.or_else(|| {
        check(
            st,
            id,
            &req.transactional_id,
            req.producer_id,
            req.producer_epoch,
        )
    });
    let mut next = (req.producer_id, req.producer_epoch);
    // Transactions v2: a retry of the EndTxn that ended the last transaction (its answer
    // was lost) carries the previous epoch; it succeeds with the current one.
    let retried = error.is_some_and(|e| e != ErrorCode::NotCoordinator)
        && forced.is_none()
        && version >= 5
        && st.transactions_v2()
        && st.transactions.get(&req.transactional_id).is_some_and(|t| {
            t.producer_id == req.producer_id
                && req.producer_epoch.checked_add(1) == Some(t.epoch)
                && t.ended_v2 == Some(req.committed)
        });
    if retried {
        if let Some(t) = st.transactions.get(&req.transactional_id) {
            return EndTxnResponse {
                producer_id: t.producer_id,
                producer_epoch: t.epoch,
                ..EndTxnResponse::default()
            };
        }
    }
    if error.is_none() {
        finish(st, &req.transactional_id, req.committed);
        // Transactions v2: every EndTxn bumps the epoch; an exhausted epoch gets a new
        // producer id (epoch 0), as Kafka's coordinator does.
        if version >= 5 && st.transactions_v2() {
            let fresh = st.next_producer_id + 1;
            if let Some(t) = st.transactions.get_mut(&req.transactional_id) {
                if t.epoch >= i16::MAX - 1 {
                    t.producer_id = fresh;
                    t.epoch = 0;
                } else {
                    t.epoch += 1;
                }
                t.ended_v2 = Some(req.committed);
                next = (t.producer_id, t.epoch);
            }
            if next.0 == fresh {
                st.next_producer_id = fresh;
            }
        }
    }
    EndTxnResponse {
        error_code: error.map_or(0, ErrorCode::code),
        producer_id: next.0,
        producer_epoch: next.1,
        ..EndTxnResponse::default()
    }
}
