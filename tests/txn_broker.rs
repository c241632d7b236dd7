//! Real-broker tests of the transactional writer against Apache Kafka (the shared
//! single-node test broker, with `transaction.state.log.replication.factor=1`): records of
//! committed transactions are visible to read_committed readers, aborted ones only to
//! read_uncommitted; a second writer with the same transactional id fences the first;
//! offsets sent to a transaction are committed with it; illegal calls are errors.
//!
//! Protocol paths exercised: every scenario runs twice (`NAME::v1`, `NAME::v2`), on the
//! v1 transaction protocol (FindCoordinator key type 1, InitProducerId with a
//! transactional id, AddPartitionsToTxn ≤ v3, AddOffsetsToTxn, TxnOffsetCommit ≤ v4,
//! EndTxn ≤ v4, Produce ≤ v11 with transactional batches) and on KIP-890 transactions v2
//! (Produce v12, TxnOffsetCommit v5, EndTxn v5 whose new epoch each next transaction
//! uses), on a broker that finalizes `transaction.version=2`. librdkafka, as an independent reader, sees
//! exactly the committed records with read_committed.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use futures::{SinkExt, StreamExt};
use kafkapipe::admin::{Admin, TopicPartition};
use kafkapipe::conn::{Conn, IsolationLevel};
use kafkapipe::protocol::ErrorCode;
use kafkapipe::reader::{Reader, ReaderConfig, StartOffset};
use kafkapipe::writer::{
    GroupMetadata, Message, TransactionProtocol, TransactionState, TransactionalWriter, Writer,
    WriterConfig,
};
use kafkapipe::ErrorKind;

fn addr() -> String {
    common::shared().addr.clone()
}

async fn topic(prefix: &str, partitions: i32) -> String {
    let topic = common::unique_topic(prefix);
    let conn = Conn::connect(&addr()).await.unwrap();
    conn.create_topic(&topic, partitions, 1).await.unwrap();
    common::wait_for_topic(&conn, &topic, partitions).await;
    conn.close().await;
    topic
}

fn config(topic: &str, txn_id: &str) -> WriterConfig {
    WriterConfig::new([addr()])
        .topic(topic)
        // transactions over several partitions
        .balancer(kafkapipe::writer::RoundRobin::default())
        .transactional_id(txn_id)
        .transaction_timeout(Duration::from_secs(20))
        .transaction_protocol(common::txn_protocol())
}

// Every scenario runs on both transaction protocols (`NAME::v1`, `NAME::v2`).
crate::on_both_txn_protocols!(
    committed_records_are_visible_and_aborted_ones_only_read_uncommitted,
    aborted_records_that_were_written_are_visible_to_read_uncommitted,
    a_second_writer_with_the_same_id_fences_the_first,
    offsets_sent_to_a_transaction_are_committed_with_it,
    illegal_calls_are_errors_not_hangs,
    librdkafka_read_committed_sees_exactly_our_committed_records,
    a_fenced_writer_cannot_add_a_new_partition,
    a_group_members_offsets_commit_with_the_transaction,
);

async fn writer(topic: &str, txn_id: &str) -> TransactionalWriter {
    let mut w = TransactionalWriter::new(config(topic, txn_id)).unwrap();
    tokio::time::timeout(Duration::from_secs(60), w.init_transactions())
        .await
        .expect("init_transactions in time")
        .unwrap();
    assert_eq!(w.protocol(), Some(protocol_in_use()));
    w
}

/// The protocol the scenario's writers speak: Kafka 4.x finalizes
/// `transaction.version=2`, so `Auto` is v2 there, and v1 on 3.x (`scripts/matrix.sh`).
fn protocol_in_use() -> TransactionProtocol {
    match common::txn_protocol() {
        TransactionProtocol::Auto if common::kafka::version_major_minor() < (4, 0) => {
            TransactionProtocol::V1
        }
        TransactionProtocol::Auto => TransactionProtocol::V2,
        p => p,
    }
}

/// Every value in `topic` read with `level`, waiting until `expected` were read, then a
/// little longer to catch extra records.
async fn read_values(topic: &str, level: IsolationLevel, expected: usize) -> BTreeSet<String> {
    let mut reader = Reader::new(
        ReaderConfig::new([addr()])
            .topic(topic)
            .isolation_level(level)
            .start_offset(StartOffset::First)
            .max_wait(Duration::from_millis(50)),
    )
    .await
    .unwrap();
    let mut out = BTreeSet::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let wait = if out.len() >= expected {
            Duration::from_millis(700)
        } else {
            deadline.saturating_duration_since(Instant::now())
        };
        match tokio::time::timeout(wait, reader.next()).await {
            Ok(Some(m)) => {
                let m = m.unwrap();
                out.insert(String::from_utf8(m.value.unwrap().to_vec()).unwrap());
            }
            Ok(None) => break,
            Err(_) => break,
        }
    }
    reader.close().await;
    out
}

fn values(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}-{i}")).collect()
}

fn messages(prefix: &str, n: usize) -> Vec<Message> {
    values(prefix, n).into_iter().map(Message::new).collect()
}

async fn committed_records_are_visible_and_aborted_ones_only_read_uncommitted() {
    common::init_log();
    let topic = topic("txn-vis", 3).await;
    let mut w = writer(&topic, &common::unique_topic("txn-vis-id")).await;
    assert_eq!(w.state(), TransactionState::Ready);

    w.begin_transaction().unwrap();
    assert_eq!(w.state(), TransactionState::InTransaction);
    w.write_messages(messages("c0", 20)).await.unwrap();
    w.commit_transaction().await.unwrap();
    assert_eq!(w.state(), TransactionState::Ready);

    // Through the Sink, with messages still buffered when the abort comes.
    w.begin_transaction().unwrap();
    for m in messages("a", 20) {
        w.feed(m).await.unwrap();
    }
    w.abort_transaction().await.unwrap();
    assert_eq!(w.state(), TransactionState::Ready);

    w.begin_transaction().unwrap();
    for m in messages("c1", 20) {
        w.feed(m).await.unwrap();
    }
    w.commit_transaction().await.unwrap();
    w.close().await.unwrap();

    let committed: BTreeSet<String> = values("c0", 20)
        .into_iter()
        .chain(values("c1", 20))
        .collect();
    let got = read_values(&topic, IsolationLevel::ReadCommitted, committed.len()).await;
    assert_eq!(
        got, committed,
        "read_committed sees exactly the committed records"
    );
    let got = read_values(&topic, IsolationLevel::ReadUncommitted, 40).await;
    assert!(got.is_superset(&committed), "read_uncommitted: {got:?}");
    // The aborted messages that reached the broker before the abort are visible to
    // read_uncommitted (some may have been dropped unsent).
    assert!(
        got.iter()
            .all(|v| !v.starts_with("a-") || values("a", 20).contains(v)),
        "{got:?}"
    );
}

async fn aborted_records_that_were_written_are_visible_to_read_uncommitted() {
    let topic = topic("txn-abort", 1).await;
    let mut w = writer(&topic, &common::unique_topic("txn-abort-id")).await;
    w.begin_transaction().unwrap();
    // Acknowledged: certainly written before the abort.
    w.write_messages(messages("a", 5)).await.unwrap();
    w.abort_transaction().await.unwrap();
    w.begin_transaction().unwrap();
    w.write_messages(messages("c", 5)).await.unwrap();
    w.commit_transaction().await.unwrap();
    w.close().await.unwrap();
    let committed: BTreeSet<String> = values("c", 5).into_iter().collect();
    let all: BTreeSet<String> = values("a", 5).into_iter().chain(values("c", 5)).collect();
    assert_eq!(
        read_values(&topic, IsolationLevel::ReadCommitted, 5).await,
        committed
    );
    assert_eq!(
        read_values(&topic, IsolationLevel::ReadUncommitted, 10).await,
        all
    );
}

async fn a_second_writer_with_the_same_id_fences_the_first() {
    common::init_log();
    let topic = topic("txn-fence", 2).await;
    let id = common::unique_topic("txn-fence-id");
    let mut first = writer(&topic, &id).await;
    first.begin_transaction().unwrap();
    first
        .write_messages([Message::new("first-before").with_partition(0)])
        .await
        .unwrap();

    // The second writer's InitProducerId aborts the first's open transaction and bumps
    // the epoch.
    let mut second = writer(&topic, &id).await;

    // The first writer can no longer write: to a partition already in its transaction
    // (the broker rejects the old epoch) or to a new one (the coordinator does).
    let e = first
        .write_messages([Message::new("first-after").with_partition(0)])
        .await
        .unwrap_err();
    assert!(
        matches!(
            e.kafka_code(),
            Some(ErrorCode::ProducerFenced | ErrorCode::InvalidProducerEpoch)
        ),
        "{e}"
    );
    assert_eq!(first.state(), TransactionState::FatalError);
    let e = first.commit_transaction().await.unwrap_err();
    assert!(e.to_string().contains(&id), "the error names the id: {e}");
    assert!(
        matches!(
            e.kafka_code(),
            Some(ErrorCode::ProducerFenced | ErrorCode::InvalidProducerEpoch)
        ),
        "{e}"
    );
    // Everything afterwards fails fast with the fatal error.
    for e in [
        first.begin_transaction().unwrap_err(),
        first.abort_transaction().await.unwrap_err(),
        tokio::time::timeout(
            Duration::from_secs(5),
            first.write_messages([Message::new("first-late").with_partition(1)]),
        )
        .await
        .expect("fails fast")
        .unwrap_err(),
        first
            .feed(Message::new("first-late-sink"))
            .await
            .unwrap_err(),
    ] {
        assert!(e.to_string().contains(&id), "{e}");
    }

    second.begin_transaction().unwrap();
    second.write_messages(messages("second", 4)).await.unwrap();
    second.commit_transaction().await.unwrap();
    second.close().await.unwrap();
    let _ = first.close().await;

    let committed: BTreeSet<String> = values("second", 4).into_iter().collect();
    assert_eq!(
        read_values(&topic, IsolationLevel::ReadCommitted, 4).await,
        committed
    );
    let mut all = committed.clone();
    all.insert("first-before".to_string());
    assert_eq!(
        read_values(&topic, IsolationLevel::ReadUncommitted, 5).await,
        all,
        "the fenced writer wrote nothing after the fence"
    );
}

/// The group's committed offset of `topic`/0, `None` if it has none.
async fn group_offset(group: &str, topic: &str) -> Option<i64> {
    let admin = Admin::connect([addr()]).unwrap();
    admin
        .fetch_group_offsets(group, Some(&[topic]))
        .await
        .unwrap()
        .into_iter()
        .filter(|(tp, _)| tp.partition == 0)
        .map(|(_, r)| r.unwrap().offset)
        .find(|o| *o >= 0)
}

async fn offsets_sent_to_a_transaction_are_committed_with_it() {
    common::init_log();
    let source = topic("txn-src", 1).await;
    let sink = topic("txn-sink", 1).await;
    let group = common::unique_topic("txn-group");
    let meta = GroupMetadata::new(&group);
    let mut w = writer(&sink, &common::unique_topic("txn-offsets-id")).await;

    // Aborted: the offset is not committed.
    w.begin_transaction().unwrap();
    w.write_messages(messages("x", 3)).await.unwrap();
    w.send_offsets_to_transaction([(TopicPartition::new(&source, 0), 7)], &meta)
        .await
        .unwrap();
    w.abort_transaction().await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(group_offset(&group, &source).await, None);

    // Committed: the offset is committed once the transaction's markers are written.
    w.begin_transaction().unwrap();
    w.write_messages(messages("y", 3)).await.unwrap();
    w.send_offsets_to_transaction([(TopicPartition::new(&source, 0), 5)], &meta)
        .await
        .unwrap();
    // Not before the commit.
    assert_eq!(group_offset(&group, &source).await, None);
    w.commit_transaction().await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let got = group_offset(&group, &source).await;
        if got == Some(5) {
            break;
        }
        assert!(Instant::now() < deadline, "offset not committed: {got:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Offsets alone (no records) make a transaction too.
    w.begin_transaction().unwrap();
    w.send_offsets_to_transaction([(TopicPartition::new(&source, 0), 9)], &meta)
        .await
        .unwrap();
    w.commit_transaction().await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while group_offset(&group, &source).await != Some(9) {
        assert!(Instant::now() < deadline, "offsets-only commit");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // A stale membership (KIP-447): the group rejects the commit, the transaction is
    // abortable, and the writer goes on after the abort.
    w.begin_transaction().unwrap();
    let stale = GroupMetadata::new(&group)
        .generation_id(42)
        .member_id("nobody");
    let e = w
        .send_offsets_to_transaction([(TopicPartition::new(&source, 0), 11)], &stale)
        .await
        .unwrap_err();
    assert!(matches!(e.kind(), ErrorKind::Kafka(_)), "{e}");
    assert_eq!(w.state(), TransactionState::AbortableError);
    assert!(
        w.commit_transaction().await.is_err(),
        "only abort is allowed"
    );
    w.abort_transaction().await.unwrap();
    assert_eq!(group_offset(&group, &source).await, Some(9));
    w.begin_transaction().unwrap();
    w.write_messages(messages("z", 1)).await.unwrap();
    w.commit_transaction().await.unwrap();
    w.close().await.unwrap();
}

async fn illegal_calls_are_errors_not_hangs() {
    let topic = topic("txn-illegal", 1).await;
    let id = common::unique_topic("txn-illegal-id");
    let within = |d| Duration::from_secs(d);

    // A plain Writer refuses a transactional configuration.
    let e = Writer::new(config(&topic, &id)).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Config, "{e}");

    let mut w = TransactionalWriter::new(config(&topic, &id)).unwrap();
    assert_eq!(w.state(), TransactionState::Uninitialized);
    assert!(w.begin_transaction().is_err());
    let e = tokio::time::timeout(within(5), w.write_messages([Message::new("x")]))
        .await
        .expect("no hang")
        .unwrap_err();
    assert!(e.to_string().contains("transaction"), "{e}");
    assert!(w.feed(Message::new("x")).await.is_err());
    assert!(w.commit_transaction().await.is_err());
    assert!(w.abort_transaction().await.is_err());

    w.init_transactions().await.unwrap();
    assert!(w.init_transactions().await.is_err(), "init twice");
    assert!(w.commit_transaction().await.is_err(), "commit outside");
    assert!(w.abort_transaction().await.is_err(), "abort outside");
    assert!(w.write_messages([Message::new("x")]).await.is_err());
    assert!(w
        .send_offsets_to_transaction(
            [(TopicPartition::new(&topic, 0), 1)],
            &GroupMetadata::new("g")
        )
        .await
        .is_err());
    w.begin_transaction().unwrap();
    assert!(w.begin_transaction().is_err(), "begin twice");
    assert_eq!(w.state(), TransactionState::InTransaction);
    // An empty transaction commits without the coordinator.
    tokio::time::timeout(within(10), w.commit_transaction())
        .await
        .expect("no hang")
        .unwrap();
    assert_eq!(w.state(), TransactionState::Ready);
    w.close().await.unwrap();
}

/// The values librdkafka (confluent-kafka) reads from `topic` with `isolation`, stopping
/// after `expect`.
fn librdkafka_values(topic: &str, isolation: &str, expect: usize) -> Vec<String> {
    let out =
        std::process::Command::new(std::env::var("PYTHON").unwrap_or_else(|_| "python3".into()))
            .arg(format!(
                "{}/tests/interop/consume_check.py",
                env!("CARGO_MANIFEST_DIR")
            ))
            .args([
                "--broker",
                &addr(),
                "--topic",
                topic,
                "--isolation",
                isolation,
            ])
            .args(["--expect", &expect.to_string(), "--timeout", "30"])
            .output()
            .expect("run consume_check.py");
    assert!(
        out.status.success(),
        "librdkafka {isolation} consumer failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).expect("json line");
            v["value"].as_str().expect("utf-8 value").to_string()
        })
        .collect()
}

async fn librdkafka_read_committed_sees_exactly_our_committed_records() {
    let topic = topic("txn-interop", 1).await;
    let mut w = writer(&topic, &common::unique_topic("txn-interop-id")).await;
    for (t, commit) in [(0, true), (1, false), (2, true), (3, false), (4, true)] {
        w.begin_transaction().unwrap();
        w.write_messages(messages(&format!("t{t}"), 5))
            .await
            .unwrap();
        if commit {
            w.commit_transaction().await.unwrap();
        } else {
            w.abort_transaction().await.unwrap();
        }
    }
    w.close().await.unwrap();
    // One partition: records come in offset order, so an aborted record that leaked would
    // show among the first ten.
    let want: Vec<String> = ["t0", "t2", "t4"]
        .iter()
        .flat_map(|t| values(t, 5))
        .collect();
    assert_eq!(librdkafka_values(&topic, "read_committed", 15), want);
    let all: Vec<String> = (0..5).flat_map(|t| values(&format!("t{t}"), 5)).collect();
    assert_eq!(librdkafka_values(&topic, "read_uncommitted", 25), all);
}

async fn a_fenced_writer_cannot_add_a_new_partition() {
    let topic = topic("txn-fence-new", 2).await;
    let id = common::unique_topic("txn-fence-new-id");
    let mut first = writer(&topic, &id).await;
    first.begin_transaction().unwrap();
    first
        .write_messages([Message::new("first-before").with_partition(0)])
        .await
        .unwrap();
    let mut second = writer(&topic, &id).await;
    // Partition 1 is not in the first writer's transaction: the coordinator refuses to add
    // it.
    let e = first
        .write_messages([Message::new("first-after").with_partition(1)])
        .await
        .unwrap_err();
    assert!(
        matches!(
            e.kafka_code(),
            Some(ErrorCode::ProducerFenced | ErrorCode::InvalidProducerEpoch)
        ),
        "{e}"
    );
    assert!(e.to_string().contains(&id), "{e}");
    assert_eq!(first.state(), TransactionState::FatalError);
    second.begin_transaction().unwrap();
    second
        .write_messages([Message::new("second").with_partition(1)])
        .await
        .unwrap();
    second.commit_transaction().await.unwrap();
    second.close().await.unwrap();
    let _ = first.close().await;
    let all: BTreeSet<String> = ["first-before", "second"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    assert_eq!(
        read_values(&topic, IsolationLevel::ReadUncommitted, 2).await,
        all
    );
}

async fn a_group_members_offsets_commit_with_the_transaction() {
    use kafkapipe::conn::ProduceOptions;
    use kafkapipe::group::CommitMode;
    use kafkapipe::record::Record;
    let source = topic("txn-member-src", 1).await;
    let sink = topic("txn-member-sink", 1).await;
    let group = common::unique_topic("txn-member-g");
    let conn = Conn::connect(&addr()).await.unwrap();
    let records: Vec<Record> = (0..10).map(|i| Record::new("k", format!("{i}"))).collect();
    conn.produce(&source, 0, &records, &ProduceOptions::default())
        .await
        .unwrap();
    conn.close().await;

    let mut reader = Reader::new(
        ReaderConfig::new([addr()])
            .group_id(&group)
            .topic(&source)
            .start_offset(StartOffset::First)
            .max_wait(Duration::from_millis(50))
            .commit_mode(CommitMode::Interval(Duration::from_secs(3600))),
    )
    .await
    .unwrap();
    assert_eq!(
        reader.group_metadata(),
        None,
        "not a member before the join"
    );
    let mut w = writer(&sink, &common::unique_topic("txn-member-id")).await;
    w.begin_transaction().unwrap();
    let mut next = 0;
    for _ in 0..4 {
        let m = tokio::time::timeout(Duration::from_secs(30), reader.next())
            .await
            .expect("a message in time")
            .unwrap()
            .unwrap();
        w.write_messages([Message::new(m.value.clone().unwrap())])
            .await
            .unwrap();
        next = m.offset + 1;
    }
    let meta = reader.group_metadata().expect("a member after reading");
    assert_eq!(meta.group_id, group);
    assert!(
        meta.generation_id >= 1 && !meta.member_id.is_empty(),
        "{meta:?}"
    );
    w.send_offsets_to_transaction([(TopicPartition::new(&source, 0), next)], &meta)
        .await
        .unwrap();
    w.commit_transaction().await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while group_offset(&group, &source).await != Some(next) {
        assert!(
            Instant::now() < deadline,
            "the member's offsets were not committed"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // A generation that is over is refused (KIP-447): the transaction must be aborted.
    w.begin_transaction().unwrap();
    let stale = meta.clone().generation_id(meta.generation_id - 1);
    let e = w
        .send_offsets_to_transaction([(TopicPartition::new(&source, 0), next + 1)], &stale)
        .await
        .unwrap_err();
    assert_eq!(e.kafka_code(), Some(ErrorCode::IllegalGeneration), "{e}");
    assert_eq!(w.state(), TransactionState::AbortableError);
    w.abort_transaction().await.unwrap();
    assert_eq!(group_offset(&group, &source).await, Some(next));
    w.close().await.unwrap();
    reader.close().await;
}

#[tokio::test]
async fn the_test_broker_finalizes_transactions_v2_and_auto_chooses_it() {
    // on 3.x tests/version_broker.rs checks that Auto chooses v1
    if common::kafka::skip_before((4, 0), "the_test_broker_finalizes_transactions_v2") {
        return;
    }
    let c = kafkapipe::conn::Connection::connect(&addr(), Default::default())
        .await
        .unwrap();
    let v = c.api_versions().expect("versions negotiated");
    assert_eq!(
        v.finalized_level("transaction.version"),
        2,
        "{:?}",
        v.finalized_features()
    );
    c.close().await;
    // Outside a scenario the protocol is Auto: the writer chooses v2 here.
    assert_eq!(common::txn_protocol(), TransactionProtocol::Auto);
    let topic = topic("txn-auto", 1).await;
    let mut w = writer(&topic, &common::unique_topic("txn-auto-id")).await;
    assert_eq!(w.protocol(), Some(TransactionProtocol::V2));
    w.close().await.unwrap();
}

/// (producer id, epoch, transactional, control) of every batch of `topic`/0, read raw
/// (Fetch v12, read_uncommitted).
async fn raw_batches(topic: &str) -> Vec<(i64, i16, bool, bool)> {
    use kafkapipe::protocol::messages::{FetchPartition, FetchRequest, FetchTopic};
    let c = kafkapipe::conn::Connection::connect(&addr(), Default::default())
        .await
        .unwrap();
    let req = FetchRequest {
        replica_id: -1,
        max_wait_ms: 100,
        min_bytes: 1,
        max_bytes: 1 << 20,
        isolation_level: 0,
        session_epoch: -1,
        topics: vec![FetchTopic {
            topic: topic.to_string(),
            partitions: vec![FetchPartition {
                partition: 0,
                current_leader_epoch: -1,
                fetch_offset: 0,
                last_fetched_epoch: -1,
                log_start_offset: -1,
                partition_max_bytes: 1 << 20,
                ..Default::default()
            }],
            ..Default::default()
        }],
        ..Default::default()
    };
    let resp = c.send_version(&req, 12).await.unwrap();
    c.close().await;
    let data = resp.responses[0].partitions[0]
        .records
        .clone()
        .unwrap_or_default();
    kafkapipe::record::decode_batches(data, 1 << 20)
        .unwrap()
        .batches
        .into_iter()
        .map(|b| {
            (
                b.producer_id,
                b.producer_epoch,
                b.is_transactional,
                b.is_control,
            )
        })
        .collect()
}

/// Transactions v2 on Kafka: every EndTxn v5 (commit or abort) bumps the epoch and the
/// next transaction writes with the epoch it answered — the broker accepts it and its
/// markers carry it — while the v1 protocol keeps one epoch. A v2 writer that kept its
/// old epoch would be refused (INVALID_PRODUCER_EPOCH) from the second transaction on.
#[tokio::test]
async fn v2_each_transaction_writes_with_the_epoch_the_previous_end_txn_returned() {
    for protocol in [TransactionProtocol::V1, TransactionProtocol::V2] {
        if protocol == TransactionProtocol::V2
            && common::kafka::skip_before((4, 0), "v2_each_transaction_writes…::V2")
        {
            continue;
        }
        let topic = topic("txn-epochs", 1).await;
        let id = common::unique_topic("txn-epochs-id");
        let mut w =
            TransactionalWriter::new(config(&topic, &id).transaction_protocol(protocol)).unwrap();
        w.init_transactions().await.unwrap();
        assert_eq!(w.protocol(), Some(protocol));
        for (i, commit) in [true, false, true, true].into_iter().enumerate() {
            w.begin_transaction().unwrap();
            w.write_messages([Message::new(format!("m-{i}"))])
                .await
                .unwrap();
            if commit {
                w.commit_transaction().await.unwrap();
            } else {
                w.abort_transaction().await.unwrap();
            }
        }
        w.close().await.unwrap();
        let got = read_values(&topic, IsolationLevel::ReadCommitted, 3).await;
        assert_eq!(
            got,
            values("m", 4).into_iter().filter(|v| v != "m-1").collect()
        );
        // Data batch, then its marker, per transaction.
        let batches = raw_batches(&topic).await;
        assert_eq!(batches.len(), 8, "{protocol:?}: {batches:?}");
        let pid = batches[0].0;
        let epoch = batches[0].1;
        for (t, pair) in batches.chunks(2).enumerate() {
            let want = match protocol {
                TransactionProtocol::V2 => epoch + i16::try_from(t).unwrap(),
                _ => epoch,
            };
            assert_eq!(
                pair[0],
                (pid, want, true, false),
                "{protocol:?}: {batches:?}"
            );
            assert_eq!(
                (pair[1].0, pair[1].2, pair[1].3),
                (pid, true, true),
                "{batches:?}"
            );
        }
        // Cost per transaction of one message to two partitions (v1: one
        // AddPartitionsToTxn round trip more), committed one after another.
        let rate_topic = crate::topic("txn-rate", 2).await;
        let mut w = TransactionalWriter::new(
            config(&rate_topic, &common::unique_topic("txn-rate-id"))
                .transaction_protocol(protocol),
        )
        .unwrap();
        w.init_transactions().await.unwrap();
        const N: usize = 30;
        let started = Instant::now();
        for i in 0..N {
            w.begin_transaction().unwrap();
            w.write_messages([
                Message::new(format!("r-{i}")).with_partition(0),
                Message::new(format!("s-{i}")).with_partition(1),
            ])
            .await
            .unwrap();
            w.commit_transaction().await.unwrap();
        }
        let per = started.elapsed() / u32::try_from(N).unwrap();
        w.close().await.unwrap();
        eprintln!("{protocol:?}: {N} transactions (2 partitions, 1 message each): {per:?} per transaction");
        assert_eq!(
            read_values(&rate_topic, IsolationLevel::ReadCommitted, 2 * N)
                .await
                .len(),
            2 * N
        );
    }
}
