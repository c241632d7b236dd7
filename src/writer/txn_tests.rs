//! The transactional writer against `crate::mock::MockCluster` (feature `mock`): request
//! versions and fields of the v1 path, retries of coordinator errors, and the failures a
//! real broker does not show on demand (injected as faults).

use std::time::Duration;

use bytes::Bytes;

use super::{
    GroupMetadata, Message, TransactionProtocol, TransactionState, TransactionalWriter,
    WriterConfig,
};
use crate::admin::TopicPartition;
use crate::mock::{Fault, MockCluster};
use crate::protocol::messages::*;
use crate::protocol::{ApiKey, ErrorCode};
use crate::record::decode_batches;

const ID: &str = "tx-fake";

/// One broker hosting topic "t" (two partitions) and "in"; every request the writer's
/// transaction protocol sends is captured.
async fn start() -> (TransactionalWriter, MockCluster) {
    start_with(|c| c).await
}

async fn start_with(
    tweak: impl FnOnce(WriterConfig) -> WriterConfig,
) -> (TransactionalWriter, MockCluster) {
    start_on(MockCluster::builder(), tweak).await
}

/// Like [`start_with`], on a mock that finalizes `transaction.version=2` (as Kafka 4.x).
async fn start_tv2(
    tweak: impl FnOnce(WriterConfig) -> WriterConfig,
) -> (TransactionalWriter, MockCluster) {
    start_on(
        MockCluster::builder().finalized_feature("transaction.version", 2),
        tweak,
    )
    .await
}

async fn start_on(
    builder: crate::mock::MockClusterBuilder,
    tweak: impl FnOnce(WriterConfig) -> WriterConfig,
) -> (TransactionalWriter, MockCluster) {
    let mock = builder.topic("t", 2).topic("in", 4).start().await.unwrap();
    for api in [
        ApiKey::FIND_COORDINATOR,
        ApiKey::INIT_PRODUCER_ID,
        ApiKey::ADD_PARTITIONS_TO_TXN,
        ApiKey::ADD_OFFSETS_TO_TXN,
        ApiKey::TXN_OFFSET_COMMIT,
        ApiKey::END_TXN,
        ApiKey::PRODUCE,
    ] {
        mock.capture(api);
    }
    let w = TransactionalWriter::new(tweak(
        WriterConfig::new(mock.bootstrap())
            .topic("t")
            .transactional_id(ID)
            .transaction_timeout(Duration::from_secs(9))
            .max_attempts(1)
            .backoff(Duration::from_millis(1), Duration::from_millis(5))
            .delivery_timeout(Duration::from_secs(10)),
    ))
    .unwrap();
    (w, mock)
}

/// Every captured InitProducerId: (id, pid, epoch, timeout).
fn inits(mock: &MockCluster) -> Vec<(Option<String>, i64, i16, i32)> {
    mock.captured::<InitProducerIdRequest>()
        .into_iter()
        .map(|r| {
            (
                r.transactional_id,
                r.producer_id,
                r.producer_epoch,
                r.transaction_timeout_ms,
            )
        })
        .collect()
}

/// An AddPartitionsToTxn as sent: (version, id, pid, epoch, partitions).
type Add = (i16, String, i64, i16, Vec<(String, Vec<i32>)>);

/// A produced batch as sent: (version, transactional id, pid, epoch, sequence,
/// transactional, records).
type Produced = (i16, Option<String>, i64, i16, i32, bool, usize);

/// Every captured AddPartitionsToTxn.
fn adds(mock: &MockCluster) -> Vec<Add> {
    mock.captured_versions::<AddPartitionsToTxnRequest>()
        .into_iter()
        .map(|(_, v, r)| {
            (
                v,
                r.v3_and_below_transactional_id,
                r.v3_and_below_producer_id,
                r.v3_and_below_producer_epoch,
                r.v3_and_below_topics
                    .into_iter()
                    .map(|t| (t.name, t.partitions))
                    .collect(),
            )
        })
        .collect()
}

/// Every captured produced batch.
fn produces(mock: &MockCluster) -> Vec<Produced> {
    mock.captured_versions::<ProduceRequest>()
        .into_iter()
        .flat_map(|(_, v, r)| {
            let id = r.transactional_id.clone();
            r.topic_data
                .into_iter()
                .flat_map(|t| t.partition_data)
                .map(move |p| {
                    let d = decode_batches(
                        p.records.map(|r| r.to_bytes()).unwrap_or_default(),
                        1 << 20,
                    )
                    .unwrap();
                    let b = &d.batches[0];
                    (
                        v,
                        id.clone(),
                        b.producer_id,
                        b.producer_epoch,
                        b.base_sequence,
                        b.is_transactional,
                        b.records.len(),
                    )
                })
        })
        .collect()
}

/// Every captured EndTxn: (version, commit, pid, epoch).
fn ends(mock: &MockCluster) -> Vec<(i16, bool, i64, i16)> {
    mock.captured_versions::<EndTxnRequest>()
        .into_iter()
        .map(|(_, v, r)| (v, r.committed, r.producer_id, r.producer_epoch))
        .collect()
}

#[tokio::test]
async fn the_v1_path_with_its_versions_fields_and_retries() {
    let (mut w, mock) = start().await;
    let retry = |api, code| mock.fault(api, Fault::Error(code), 1);
    retry(ApiKey::INIT_PRODUCER_ID, ErrorCode::ConcurrentTransactions);
    retry(
        ApiKey::INIT_PRODUCER_ID,
        ErrorCode::CoordinatorLoadInProgress,
    );
    retry(
        ApiKey::ADD_PARTITIONS_TO_TXN,
        ErrorCode::ConcurrentTransactions,
    );
    retry(ApiKey::END_TXN, ErrorCode::ConcurrentTransactions);
    w.init_transactions().await.unwrap();
    let finds: Vec<(i8, String)> = mock
        .captured::<FindCoordinatorRequest>()
        .into_iter()
        .map(|r| {
            (
                r.key_type,
                r.coordinator_keys.first().cloned().unwrap_or(r.key),
            )
        })
        .collect();
    assert_eq!(finds, [(1, ID.to_string())]);
    let init = (Some(ID.to_string()), -1, -1, 9000);
    assert_eq!(
        inits(&mock),
        [init.clone(), init.clone(), init],
        "CONCURRENT_TRANSACTIONS and COORDINATOR_LOAD_IN_PROGRESS are retried"
    );
    w.begin_transaction().unwrap();
    w.write_messages([
        Message::new("a").with_partition(0),
        Message::new("b").with_partition(0),
    ])
    .await
    .unwrap();
    w.send_offsets_to_transaction(
        [(TopicPartition::new("in", 3), 42)],
        &GroupMetadata::new("g")
            .generation_id(5)
            .member_id("m-1")
            .group_instance_id(Some("i-1".into())),
    )
    .await
    .unwrap();
    w.commit_transaction().await.unwrap();
    let pid = produces(&mock)[0].2;
    let add = (3, ID.to_string(), pid, 0, vec![("t".to_string(), vec![0])]);
    assert_eq!(adds(&mock), [add.clone(), add]);
    assert_eq!(
        produces(&mock),
        [(11, Some(ID.to_string()), pid, 0, 0, true, 2)]
    );
    let offsets: Vec<_> = mock
        .captured_versions::<AddOffsetsToTxnRequest>()
        .into_iter()
        .map(|(_, v, r)| (v, r.group_id))
        .collect();
    assert_eq!(offsets, [(4, "g".to_string())]);
    let finds = mock.captured::<FindCoordinatorRequest>();
    let last = finds.last().unwrap();
    assert_eq!(
        (
            last.key_type,
            last.coordinator_keys
                .first()
                .cloned()
                .unwrap_or(last.key.clone())
        ),
        (0, "g".to_string())
    );
    let commits: Vec<_> = mock
        .captured_versions::<TxnOffsetCommitRequest>()
        .into_iter()
        .map(|(_, v, r)| {
            let offsets: Vec<(String, i32, i64)> = r
                .topics
                .iter()
                .flat_map(|t| {
                    t.partitions
                        .iter()
                        .map(|p| (t.name.clone(), p.partition_index, p.committed_offset))
                })
                .collect();
            (
                v,
                r.group_id,
                r.generation_id,
                r.member_id,
                r.group_instance_id,
                offsets,
            )
        })
        .collect();
    assert_eq!(
        commits,
        [(
            4,
            "g".to_string(),
            5,
            "m-1".to_string(),
            Some("i-1".to_string()),
            vec![("in".to_string(), 3, 42)]
        )]
    );
    assert_eq!(ends(&mock), [(4, true, pid, 0), (4, true, pid, 0)]);
    assert_eq!(mock.committed("g", "in", 3), Some(42));
    // The next transaction adds its partitions again; sequences go on.
    w.begin_transaction().unwrap();
    w.write_messages([Message::new("c").with_partition(0)])
        .await
        .unwrap();
    w.commit_transaction().await.unwrap();
    assert_eq!(adds(&mock).len(), 3);
    assert_eq!(adds(&mock)[2].4, vec![("t".to_string(), vec![0])]);
    assert_eq!(
        produces(&mock)[1],
        (11, Some(ID.to_string()), pid, 0, 2, true, 1)
    );
    assert_eq!(ends(&mock).len(), 3);
    w.close().await.unwrap();
}

#[tokio::test]
async fn a_rejected_produce_is_abortable_and_an_unknown_one_bumps_the_epoch() {
    let (mut w, mock) = start().await;
    mock.fault_partition(ApiKey::PRODUCE, "t", 1, ErrorCode::InvalidRecord, 1);
    w.init_transactions().await.unwrap();
    let mut reports = w.deliveries();
    w.begin_transaction().unwrap();
    let e = w
        .write_messages([Message::new("a").with_partition(1)])
        .await
        .unwrap_err();
    assert_eq!(e.kafka_code(), Some(ErrorCode::InvalidRecord), "{e}");
    let d = futures::StreamExt::next(&mut reports).await.unwrap();
    assert_eq!(
        d.result.unwrap_err().kafka_code(),
        Some(ErrorCode::InvalidRecord)
    );
    assert_eq!(w.state(), TransactionState::AbortableError);
    let e = w.commit_transaction().await.unwrap_err();
    assert!(e.to_string().contains("must be aborted"), "{e}");
    w.abort_transaction().await.unwrap();
    let pid = produces(&mock)[0].2;
    assert_eq!(ends(&mock), [(4, false, pid, 0)]);
    assert_eq!(
        inits(&mock).len(),
        1,
        "a rejected batch needs no epoch bump"
    );

    // A produce whose answer leaves the partition out: the batch may be written.
    mock.omit_from_produce_response("t", 1, 1);
    w.begin_transaction().unwrap();
    assert!(w
        .write_messages([Message::new("b").with_partition(1)])
        .await
        .is_err());
    w.abort_transaction().await.unwrap();
    assert_eq!(ends(&mock).last(), Some(&(4, false, pid, 0)));
    assert_eq!(
        inits(&mock).last(),
        Some(&(Some(ID.to_string()), pid, 0, 9000)),
        "the epoch is bumped after the abort"
    );
    // The next transaction writes with the new epoch from sequence 0.
    w.begin_transaction().unwrap();
    w.write_messages([Message::new("c").with_partition(1)])
        .await
        .unwrap();
    w.commit_transaction().await.unwrap();
    assert_eq!(
        produces(&mock).last(),
        Some(&(11, Some(ID.to_string()), pid, 1, 0, true, 1))
    );
    w.close().await.unwrap();
}

#[tokio::test]
async fn fenced_when_adding_a_partition_is_fatal_and_nothing_more_is_sent() {
    let (mut w, mock) = start().await;
    mock.fault(
        ApiKey::ADD_PARTITIONS_TO_TXN,
        Fault::Error(ErrorCode::ProducerFenced),
        1,
    );
    w.init_transactions().await.unwrap();
    w.begin_transaction().unwrap();
    let e = w
        .write_messages([Message::new("a").with_partition(0)])
        .await
        .unwrap_err();
    assert_eq!(e.kafka_code(), Some(ErrorCode::ProducerFenced), "{e}");
    assert!(e.to_string().contains(ID), "{e}");
    assert_eq!(w.state(), TransactionState::FatalError);
    for e in [
        w.write_messages([Message::new("b")]).await.unwrap_err(),
        w.commit_transaction().await.unwrap_err(),
        w.abort_transaction().await.unwrap_err(),
        w.begin_transaction().unwrap_err(),
    ] {
        assert_eq!(e.kafka_code(), Some(ErrorCode::ProducerFenced), "{e}");
    }
    w.close().await.unwrap();
    assert_eq!(mock.requests(ApiKey::PRODUCE), 0);
    assert_eq!(mock.requests(ApiKey::END_TXN), 0);
}

#[tokio::test]
async fn a_fatal_end_txn_names_the_id() {
    let (mut w, mock) = start().await;
    mock.fault(
        ApiKey::END_TXN,
        Fault::Error(ErrorCode::InvalidProducerEpoch),
        1,
    );
    w.init_transactions().await.unwrap();
    w.begin_transaction().unwrap();
    w.write_messages([Message::new("a")]).await.unwrap();
    let e = w.commit_transaction().await.unwrap_err();
    assert_eq!(e.kafka_code(), Some(ErrorCode::InvalidProducerEpoch), "{e}");
    assert!(e.to_string().contains(ID), "{e}");
    assert_eq!(w.state(), TransactionState::FatalError);
}

#[tokio::test]
async fn a_commit_that_does_not_get_through_can_be_retried() {
    let (mut w, mock) = start_with(|c| c.delivery_timeout(Duration::from_millis(600))).await;
    w.init_transactions().await.unwrap();
    w.begin_transaction().unwrap();
    w.write_messages([Message::new("a")]).await.unwrap();
    mock.fault(
        ApiKey::END_TXN,
        Fault::Error(ErrorCode::CoordinatorLoadInProgress),
        u32::MAX,
    );
    let e = w.commit_transaction().await.unwrap_err();
    assert_eq!(
        e.kafka_code(),
        Some(ErrorCode::CoordinatorLoadInProgress),
        "{e}"
    );
    assert_eq!(w.state(), TransactionState::Committing);
    assert!(
        w.abort_transaction().await.is_err(),
        "a commit is in progress"
    );
    mock.clear_faults();
    let before = ends(&mock).len();
    w.commit_transaction().await.unwrap();
    assert_eq!(w.state(), TransactionState::Ready);
    let pid = produces(&mock)[0].2;
    assert_eq!(ends(&mock)[before..], [(4, true, pid, 0)]);
}

#[test]
fn finalized_features_of_the_api_versions_response() {
    use crate::protocol::primitives::{put_empty_tagged_fields, put_string, put_uvarint};
    use crate::protocol::TaggedFields;
    use bytes::BufMut;
    let mut raw = bytes::BytesMut::new();
    put_uvarint(&mut raw, 3); // two elements
    for (name, level) in [("metadata.version", 27i16), ("transaction.version", 2)] {
        put_string(&mut raw, name, true).unwrap();
        raw.put_i16(level);
        raw.put_i16(level);
        put_empty_tagged_fields(&mut raw);
    }
    let resp = ApiVersionsResponse {
        tagged_fields: TaggedFields(vec![(1, Bytes::from_static(&[0; 8])), (2, raw.freeze())]),
        ..Default::default()
    };
    let fs = resp.finalized_features().unwrap();
    assert_eq!(fs.len(), 2);
    assert_eq!(fs[1].name, "transaction.version");
    assert_eq!(resp.finalized_level("transaction.version"), 2);
    assert_eq!(resp.finalized_level("group.version"), 0);
    let bad = ApiVersionsResponse {
        tagged_fields: TaggedFields(vec![(2, Bytes::from_static(&[9, 1]))]),
        ..Default::default()
    };
    assert!(bad.finalized_features().is_err());
    assert_eq!(bad.finalized_level("transaction.version"), 0);
}

#[tokio::test]
async fn an_abort_drops_unsent_messages_and_reports_them() {
    use futures::{SinkExt, StreamExt};
    let (mut w, mock) = start_with(|c| c.batch_timeout(Duration::from_secs(30))).await;
    w.init_transactions().await.unwrap();
    let mut reports = w.deliveries();
    w.begin_transaction().unwrap();
    for v in ["a", "b", "c"] {
        w.feed(Message::new(v)).await.unwrap();
    }
    w.abort_transaction().await.unwrap();
    for _ in 0..3 {
        let d = reports.next().await.unwrap();
        let e = d.result.unwrap_err();
        assert!(e.is_closed() && e.to_string().contains("aborted"), "{e}");
    }
    assert_eq!(w.stats().buffered_bytes, 0);
    // Nothing reached the coordinator: no EndTxn either.
    assert_eq!(mock.requests(ApiKey::ADD_PARTITIONS_TO_TXN), 0);
    assert_eq!(mock.requests(ApiKey::PRODUCE), 0);
    assert_eq!(mock.requests(ApiKey::END_TXN), 0);
    // The next transaction goes through, from sequence 0.
    w.begin_transaction().unwrap();
    w.send(Message::new("d")).await.unwrap();
    w.commit_transaction().await.unwrap();
    let sent = produces(&mock);
    assert_eq!(sent.len(), 1);
    assert_eq!(
        (sent[0].0, sent[0].3, sent[0].4, sent[0].5),
        (11, 0, 0, true)
    );
    assert_eq!(mock.records("t", 0).len() + mock.records("t", 1).len(), 1);
    drop(reports);
    w.close().await.unwrap();
}

fn v2(c: WriterConfig) -> WriterConfig {
    c.transaction_protocol(TransactionProtocol::V2)
}

/// Every captured TxnOffsetCommit: (version, group, pid, epoch).
fn offset_commits(mock: &MockCluster) -> Vec<(i16, String, i64, i16)> {
    mock.captured_versions::<TxnOffsetCommitRequest>()
        .into_iter()
        .map(|(_, v, r)| (v, r.group_id, r.producer_id, r.producer_epoch))
        .collect()
}

#[tokio::test]
async fn the_v2_path_joins_through_produce_and_takes_each_epoch_from_end_txn() {
    // Chosen from the finalized feature (Auto), or forced.
    let auto: fn(WriterConfig) -> WriterConfig = |c| c;
    for tweak in [auto, v2] {
        v2_path(tweak).await;
    }
}

async fn v2_path(tweak: fn(WriterConfig) -> WriterConfig) {
    let (mut w, mock) = start_tv2(tweak).await;
    assert_eq!(w.protocol(), None, "chosen by init_transactions");
    w.init_transactions().await.unwrap();
    assert_eq!(w.protocol(), Some(TransactionProtocol::V2));
    w.begin_transaction().unwrap();
    w.write_messages([
        Message::new("a").with_partition(0),
        Message::new("b").with_partition(0),
        Message::new("c").with_partition(1),
    ])
    .await
    .unwrap();
    w.send_offsets_to_transaction(
        [(TopicPartition::new("in", 3), 42)],
        &GroupMetadata::new("g"),
    )
    .await
    .unwrap();
    w.commit_transaction().await.unwrap();
    let pid = produces(&mock)[0].2;
    let mut sent = produces(&mock);
    sent.sort_by_key(|p| p.6);
    assert_eq!(
        sent,
        [
            (12, Some(ID.to_string()), pid, 0, 0, true, 1),
            (12, Some(ID.to_string()), pid, 0, 0, true, 2)
        ]
    );
    assert_eq!(offset_commits(&mock), [(5, "g".to_string(), pid, 0)]);
    assert_eq!(ends(&mock), [(5, true, pid, 0)]);
    assert_eq!(mock.committed("g", "in", 3), Some(42));
    // Every transaction runs with the epoch the previous EndTxn returned, its sequences
    // from 0; an abort bumps the epoch too (no InitProducerId).
    for (epoch, commit) in [(1, true), (2, false), (3, true)] {
        w.begin_transaction().unwrap();
        w.write_messages([Message::new("d").with_partition(0)])
            .await
            .unwrap();
        if commit {
            w.commit_transaction().await.unwrap();
        } else {
            w.abort_transaction().await.unwrap();
        }
        assert_eq!(
            produces(&mock).last(),
            Some(&(12, Some(ID.to_string()), pid, epoch, 0, true, 1))
        );
        assert_eq!(ends(&mock).last(), Some(&(5, commit, pid, epoch)));
    }
    assert_eq!(mock.requests(ApiKey::ADD_PARTITIONS_TO_TXN), 0);
    assert_eq!(mock.requests(ApiKey::ADD_OFFSETS_TO_TXN), 0);
    assert_eq!(inits(&mock).len(), 1);
    // The markers went into both partitions: read_committed sees the committed ones.
    let committed: usize = [0, 1]
        .iter()
        .map(|p| {
            mock.batches("t", *p)
                .into_iter()
                .flat_map(|b| decode_batches(b, 1 << 20).unwrap().batches)
                .filter(|b| b.is_control)
                .count()
        })
        .sum();
    assert_eq!(committed, 5, "one marker per partition and transaction");
    w.close().await.unwrap();
}

#[tokio::test]
async fn auto_uses_v1_without_the_finalized_feature() {
    let (mut w, mock) = start().await;
    w.init_transactions().await.unwrap();
    assert_eq!(w.protocol(), Some(TransactionProtocol::V1));
    w.begin_transaction().unwrap();
    w.write_messages([Message::new("a")]).await.unwrap();
    w.commit_transaction().await.unwrap();
    assert_eq!(mock.requests(ApiKey::ADD_PARTITIONS_TO_TXN), 1);
    assert_eq!(produces(&mock)[0].0, 11);
    assert_eq!(ends(&mock)[0].0, 4);
}

#[tokio::test]
async fn a_forced_v2_without_its_versions_fails_init_clearly() {
    let without_feature = MockCluster::builder();
    let old_end_txn = MockCluster::builder()
        .finalized_feature("transaction.version", 2)
        .api_versions(ApiKey::END_TXN, 0, 4);
    for (builder, why) in [
        (without_feature, "transaction.version=0"),
        (old_end_txn, "EndTxn v5"),
    ] {
        let mock = builder.topic("t", 1).start().await.unwrap();
        let mut w = TransactionalWriter::new(v2(WriterConfig::new(mock.bootstrap())
            .topic("t")
            .transactional_id(ID)))
        .unwrap();
        let e = w.init_transactions().await.unwrap_err();
        assert!(e.to_string().contains(why), "{e}");
        assert!(e.to_string().contains(ID), "{e}");
        assert_eq!(w.state(), TransactionState::Uninitialized);
        assert_eq!(mock.requests(ApiKey::INIT_PRODUCER_ID), 0);
        w.close().await.unwrap();
    }
}

/// TRANSACTION_ABORTABLE (error 120) on a produce makes the transaction abortable, not
/// the writer fatal: the abort works and the next transaction commits — on both paths.
#[tokio::test]
async fn transaction_abortable_is_abortable_on_both_paths() {
    for protocol in [TransactionProtocol::V1, TransactionProtocol::V2] {
        let (mut w, mock) = start_tv2(|c| c.transaction_protocol(protocol)).await;
        w.init_transactions().await.unwrap();
        mock.fault_partition(ApiKey::PRODUCE, "t", 0, ErrorCode::TransactionAbortable, 1);
        w.begin_transaction().unwrap();
        let e = w
            .write_messages([Message::new("a").with_partition(0)])
            .await
            .unwrap_err();
        assert_eq!(e.kafka_code(), Some(ErrorCode::TransactionAbortable), "{e}");
        assert_eq!(w.state(), TransactionState::AbortableError, "{protocol:?}");
        assert!(w.commit_transaction().await.is_err());
        w.abort_transaction().await.unwrap();
        w.begin_transaction().unwrap();
        w.write_messages([Message::new("b").with_partition(0)])
            .await
            .unwrap();
        w.commit_transaction().await.unwrap();
        let values: Vec<_> = mock
            .batches("t", 0)
            .into_iter()
            .flat_map(|b| decode_batches(b, 1 << 20).unwrap().batches)
            .filter(|b| !b.is_control)
            .flat_map(|b| b.records)
            .filter_map(|r| r.value)
            .collect();
        assert_eq!(values, [Bytes::from_static(b"b")], "{protocol:?}");
        w.close().await.unwrap();
    }
}

/// Fencing on the v2 path: the produce of a writer whose epoch is older than the
/// coordinator's is refused, and the writer ends with the fatal error naming the id.
#[tokio::test]
async fn a_fenced_v2_writer_gets_the_fatal_error() {
    let (mut w, mock) = start_tv2(v2).await;
    w.init_transactions().await.unwrap();
    let mut newer = TransactionalWriter::new(v2(WriterConfig::new(mock.bootstrap())
        .topic("t")
        .transactional_id(ID)))
    .unwrap();
    newer.init_transactions().await.unwrap();
    w.begin_transaction().unwrap();
    let e = w
        .write_messages([Message::new("a").with_partition(0)])
        .await
        .unwrap_err();
    assert!(e.to_string().contains(ID), "{e}");
    assert_eq!(w.state(), TransactionState::FatalError, "{e}");
    assert!(w.begin_transaction().is_err());
    newer.close().await.unwrap();
    w.close().await.unwrap();
}

/// Transactions v2 when EndTxn's answer is lost (the coordinator committed and bumped
/// the epoch): the retry carries the old epoch, as Kafka expects of a retry, and the next
/// transaction the epoch the retry's answer gave.
#[tokio::test]
async fn a_v2_commit_whose_answer_was_lost_is_retried_with_the_old_epoch() {
    let (mut w, mock) = start_tv2(v2).await;
    w.init_transactions().await.unwrap();
    w.begin_transaction().unwrap();
    w.write_messages([Message::new("a").with_partition(0)])
        .await
        .unwrap();
    mock.fault(ApiKey::END_TXN, Fault::CloseMidResponse, 1);
    w.commit_transaction().await.unwrap();
    let pid = produces(&mock)[0].2;
    assert_eq!(ends(&mock), [(5, true, pid, 0), (5, true, pid, 0)]);
    w.begin_transaction().unwrap();
    w.write_messages([Message::new("b").with_partition(0)])
        .await
        .unwrap();
    w.commit_transaction().await.unwrap();
    assert_eq!(ends(&mock).last(), Some(&(5, true, pid, 1)));
    let markers = mock
        .batches("t", 0)
        .into_iter()
        .flat_map(|b| decode_batches(b, 1 << 20).unwrap().batches)
        .filter(|b| b.is_control)
        .count();
    assert_eq!(markers, 2, "one marker per transaction, none for the retry");
    w.close().await.unwrap();
}

/// Transactions v2 when the epoch is exhausted: EndTxn v5 answers a new producer id with
/// epoch 0, and the next transaction writes under it from sequence 0.
#[tokio::test]
async fn an_exhausted_epoch_moves_to_the_new_producer_id_end_txn_answers() {
    let (mut w, mock) = start_tv2(v2).await;
    let old = mock.set_transaction_epoch(ID, i16::MAX - 3);
    w.init_transactions().await.unwrap();
    for _ in 0..3 {
        w.begin_transaction().unwrap();
        w.write_messages([Message::new("a").with_partition(0)])
            .await
            .unwrap();
        w.commit_transaction().await.unwrap();
    }
    let sent = produces(&mock);
    assert_eq!((sent[0].2, sent[0].3), (old, i16::MAX - 2));
    assert_eq!((sent[1].2, sent[1].3, sent[1].4), (old, i16::MAX - 1, 0));
    let new = sent[2].2;
    assert_ne!(new, old, "a new producer id");
    assert_eq!((sent[2].3, sent[2].4), (0, 0));
    assert_eq!(ends(&mock).last(), Some(&(5, true, new, 0)));
    assert_eq!(mock.records("t", 0).len(), 3);
    w.close().await.unwrap();
}

/// Compiles only if the writer's futures can be spawned on a multi-threaded runtime (an
/// `async fn` would not state the `Send` bound).
#[allow(dead_code, clippy::manual_async_fn)]
fn the_futures_are_send(
    mut w: TransactionalWriter,
) -> impl std::future::Future<Output = ()> + Send {
    async move {
        let _ = w.init_transactions().await;
        let _ = w.begin_transaction();
        let _ = w.write_messages([Message::new("a")]).await;
        let _ = w
            .send_offsets_to_transaction(
                [(TopicPartition::new("t", 0), 1)],
                &GroupMetadata::new("g"),
            )
            .await;
        let _ = w.commit_transaction().await;
        let _ = w.abort_transaction().await;
        let _ = w.close().await;
    }
}

#[test]
fn the_writer_is_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<TransactionalWriter>();
}
