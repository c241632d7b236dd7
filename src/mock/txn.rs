//! The transaction coordinator: InitProducerId with a transactional id,
//! AddPartitionsToTxn, AddOffsetsToTxn, TxnOffsetCommit and EndTxn, which writes the
//! COMMIT or ABORT marker into every partition of the transaction (the logs then report
//! the last stable offset and the aborted transactions from those markers) and applies the
//! transaction's offsets to their groups on commit.

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
            t.epoch = t.epoch.wrapping_add(1);
            (t.producer_id, t.epoch)
        }
        None => (-1, -1),
    }
}

/// Why `tid` with this producer cannot act, if it cannot.
fn check(st: &State, id: i32, tid: &str, producer_id: i64, epoch: i16) -> Option<ErrorCode> {
    if st.coordinator(tid).map_or(true, |b| b.id != id) {
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

pub(super) fn end(
    id: i32,
    st: &mut State,
    req: &EndTxnRequest,
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
    if error.is_none() {
        finish(st, &req.transactional_id, req.committed);
    }
    EndTxnResponse {
        error_code: error.map_or(0, ErrorCode::code),
        producer_id: req.producer_id,
        producer_epoch: req.producer_epoch,
        ..EndTxnResponse::default()
    }
}
