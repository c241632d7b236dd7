//! What the client negotiates with the broker version under test (the shared single-node
//! broker: the pom's Apache Kafka by default, another release under `scripts/matrix.sh`,
//! which sets `KAFKAPIPE_KAFKA_VERSION`).
//!
//! Every test runs on every version and asserts that version's behaviour: the broker the
//! harness started is the one asked for (its finalized `metadata.version`); a
//! `GroupProtocol::Consumer` reader joins a KIP-848 group on Kafka 4.x and, on Kafka 3.9
//! (no KIP-848 consumer groups by default), fails at once with an error that names the
//! missing feature and the ApiVersions evidence; transactions choose v2 where the cluster
//! finalizes `transaction.version=2` (4.x) and v1 where it does not (3.9), where a forced
//! v2 is refused with a reason; a share-group reader (KIP-932) reads on Kafka 4.2+ and is
//! refused with the reason before.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use futures::StreamExt;
use kafkapipe::conn::{Conn, IsolationLevel};
use kafkapipe::group::{CommitMode, GroupProtocol};
use kafkapipe::reader::{Reader, ReaderConfig, StartOffset};
use kafkapipe::share::{ShareReader, ShareReaderConfig};
use kafkapipe::writer::{Message, TransactionProtocol, TransactionalWriter, WriterConfig};
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

/// The broker's ApiVersions answer (v3, with its finalized features).
async fn api_versions() -> kafkapipe::protocol::messages::ApiVersionsResponse {
    let c = kafkapipe::conn::Connection::connect(&addr(), Default::default())
        .await
        .unwrap();
    let v = c.api_versions().expect("versions negotiated").clone();
    c.close().await;
    v
}

/// The harness started the release it was asked for: the cluster's finalized
/// `metadata.version` belongs to it (a fresh cluster finalizes its own release's latest
/// production level), and the release names it.
#[tokio::test]
async fn the_broker_is_the_release_under_test() {
    let version = common::kafka::kafka_version();
    let v = api_versions().await;
    let level = v.finalized_level("metadata.version");
    let release = kafkapipe::protocol::messages::metadata_version_release(level)
        .unwrap_or_else(|| panic!("metadata.version level {level} has no known release"));
    eprintln!("Kafka {version}: metadata.version {level} ({release})");
    let (major, minor) = common::kafka::version_major_minor();
    assert!(
        release.starts_with(&format!("{major}.{minor}-")),
        "asked for Kafka {version}, the broker finalizes metadata.version {level} ({release})"
    );
}

/// KIP-848 consumer groups: on Kafka 4.x a `GroupProtocol::Consumer` reader joins and reads;
/// on 3.9 (which lists ConsumerGroupHeartbeat v0 but leaves the protocol off by default)
/// the first read fails at once with an error naming KIP-848, ConsumerGroupHeartbeat and
/// what ApiVersions said, and the reader does not retry: the stream ends after the error.
#[tokio::test]
async fn consumer_group_protocol_joins_or_is_refused_with_the_reason() {
    common::init_log();
    let topic = topic("ver-kip848", 1).await;
    let group = common::unique_topic("ver-kip848-g");
    let mut w = kafkapipe::writer::Writer::new(WriterConfig::new([addr()]).topic(&topic)).unwrap();
    futures::SinkExt::send(&mut w, Message::new("one"))
        .await
        .unwrap();
    futures::SinkExt::close(&mut w).await.unwrap();
    let mut r = Reader::new(
        ReaderConfig::new([addr()])
            .group_id(&group)
            .topic(&topic)
            .group_protocol(GroupProtocol::Consumer)
            .commit_mode(CommitMode::Interval(Duration::from_millis(100)))
            .max_wait(Duration::from_millis(50))
            .join_backoff(Duration::from_millis(200)),
    )
    .await
    .unwrap();
    let first = tokio::time::timeout(Duration::from_secs(30), r.next())
        .await
        .expect("a record or an error within 30 s, not a hang")
        .expect("the stream yields something");
    if common::kafka::version_major_minor() >= (4, 0) {
        let m = first.unwrap();
        assert_eq!(m.value.as_deref(), Some(&b"one"[..]));
    } else {
        let e = first.expect_err("Kafka 3.9 has no KIP-848 consumer groups by default");
        let text = e.to_string();
        eprintln!("refused: {text}");
        assert_eq!(e.kind(), ErrorKind::UnsupportedVersion, "{text}");
        for want in [
            "KIP-848",
            "ConsumerGroupHeartbeat",
            "metadata.version",
            "3.9",
            "GroupProtocol::Classic",
        ] {
            assert!(text.contains(want), "{want:?} missing from: {text}");
        }
        // No retries: the stream ends after the error instead of yielding it again
        // every join_backoff (the joins sent are counted in group::kip848_tests; the
        // reader's retry counter also counts FindCoordinator while __consumer_offsets
        // is created).
        let started = Instant::now();
        let rest = tokio::time::timeout(Duration::from_secs(10), r.next())
            .await
            .expect("the stream ends after a refused protocol");
        assert!(
            rest.is_none(),
            "after {:?}: {:?}",
            started.elapsed(),
            rest.map(|r| r.map(|m| m.offset).map_err(|e| e.to_string()))
        );
    }
    r.close().await;
}

/// Share groups (KIP-932): on Kafka 4.2+ a `ShareReader` joins and reads (the group set
/// to start at the earliest offset); on an older release the first item is an
/// `UnsupportedVersion` error that names share groups' minimum release and the API the
/// broker lacks, and the stream ends after it instead of retrying.
#[tokio::test]
async fn share_groups_read_or_are_refused_with_the_reason() {
    common::init_log();
    let topic = topic("ver-share", 1).await;
    let group = common::unique_topic("ver-share-g");
    let supported = common::kafka::version_major_minor() >= (4, 2);
    if supported {
        let admin = kafkapipe::admin::Admin::new(
            kafkapipe::cluster::Cluster::new([addr()], Default::default()).unwrap(),
        );
        let ops = vec![kafkapipe::admin::AlterConfigOp::Set(
            "share.auto.offset.reset".into(),
            "earliest".into(),
        )];
        for (_, r) in admin
            .incremental_alter_configs(
                &[(kafkapipe::admin::ConfigResource::group(&group), ops)],
                false,
            )
            .await
            .unwrap()
        {
            r.unwrap();
        }
        admin.close().await;
    }
    let mut w = kafkapipe::writer::Writer::new(WriterConfig::new([addr()]).topic(&topic)).unwrap();
    futures::SinkExt::send(&mut w, Message::new("one"))
        .await
        .unwrap();
    futures::SinkExt::close(&mut w).await.unwrap();
    let mut r = ShareReader::new(
        ShareReaderConfig::new([addr()], &group)
            .topic(&topic)
            .max_wait(Duration::from_millis(200))
            .close_timeout(Duration::from_secs(5)),
    )
    .await
    .unwrap();
    let first = tokio::time::timeout(Duration::from_secs(60), r.next())
        .await
        .expect("a record or an error within 60 s, not a hang")
        .expect("the stream yields something");
    if supported {
        let m = first.unwrap();
        assert_eq!(m.value.as_deref(), Some(&b"one"[..]));
    } else {
        let e = first.expect_err("share groups need Kafka 4.2+");
        let text = e.to_string();
        eprintln!("refused: {text}");
        assert_eq!(e.kind(), ErrorKind::UnsupportedVersion, "{text}");
        for want in ["share group", "4.2", "ShareGroupHeartbeat"] {
            assert!(text.contains(want), "{want:?} missing from: {text}");
        }
        let rest = tokio::time::timeout(Duration::from_secs(10), r.next())
            .await
            .expect("the stream ends after share groups were refused");
        assert!(
            rest.is_none(),
            "{:?}",
            rest.map(|r| r.map(|m| m.offset).map_err(|e| e.to_string()))
        );
    }
    // After a refusal the close only reports that the reader had already failed.
    let closed = r.close().await;
    if supported {
        closed.unwrap();
    }
}

/// Every value of `topic`, read committed, once `expected` were read.
async fn read_committed(topic: &str, expected: usize) -> BTreeSet<String> {
    let mut reader = Reader::new(
        ReaderConfig::new([addr()])
            .topic(topic)
            .isolation_level(IsolationLevel::ReadCommitted)
            .start_offset(StartOffset::First)
            .max_wait(Duration::from_millis(50)),
    )
    .await
    .unwrap();
    let mut out = BTreeSet::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while out.len() < expected {
        let wait = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(wait, reader.next()).await {
            Ok(Some(m)) => {
                let m = m.unwrap();
                out.insert(String::from_utf8(m.value.unwrap().to_vec()).unwrap());
            }
            Ok(None) | Err(_) => break,
        }
    }
    reader.close().await;
    out
}

/// Transactions: `Auto` chooses v2 where the cluster finalizes `transaction.version=2`
/// (Kafka 4.x) and v1 where it does not (3.9), and a committed and an aborted
/// transaction behave alike on either; a forced v2 on 3.9 is refused by
/// `init_transactions` with the reason (the finalized level).
#[tokio::test]
async fn transactions_negotiate_the_protocol_the_broker_finalizes() {
    common::init_log();
    let v4 = common::kafka::version_major_minor() >= (4, 0);
    let level = api_versions().await.finalized_level("transaction.version");
    assert_eq!(level, if v4 { 2 } else { 0 });
    let topic = topic("ver-txn", 2).await;
    let config = |id: &str| {
        WriterConfig::new([addr()])
            .topic(&topic)
            .balancer(kafkapipe::writer::RoundRobin::default())
            .transactional_id(id)
            .transaction_timeout(Duration::from_secs(20))
    };
    let mut w = TransactionalWriter::new(config(&common::unique_topic("ver-txn-id"))).unwrap();
    tokio::time::timeout(Duration::from_secs(60), w.init_transactions())
        .await
        .expect("init_transactions in time")
        .unwrap();
    let want = if v4 {
        TransactionProtocol::V2
    } else {
        TransactionProtocol::V1
    };
    assert_eq!(w.protocol(), Some(want));
    w.begin_transaction().unwrap();
    w.write_messages([Message::new("kept-0"), Message::new("kept-1")])
        .await
        .unwrap();
    w.commit_transaction().await.unwrap();
    w.begin_transaction().unwrap();
    w.write_messages([Message::new("dropped")]).await.unwrap();
    w.abort_transaction().await.unwrap();
    w.begin_transaction().unwrap();
    w.write_messages([Message::new("kept-2")]).await.unwrap();
    w.commit_transaction().await.unwrap();
    w.close().await.unwrap();
    let got = read_committed(&topic, 3).await;
    assert_eq!(
        got,
        ["kept-0", "kept-1", "kept-2"]
            .into_iter()
            .map(String::from)
            .collect::<BTreeSet<_>>()
    );
    if !v4 {
        let mut w = TransactionalWriter::new(
            config(&common::unique_topic("ver-txn-v2"))
                .transaction_protocol(TransactionProtocol::V2),
        )
        .unwrap();
        let e = tokio::time::timeout(Duration::from_secs(60), w.init_transactions())
            .await
            .expect("init_transactions in time")
            .expect_err("transactions v2 on Kafka 3.9");
        let text = e.to_string();
        eprintln!("refused: {text}");
        assert!(text.contains("transaction.version"), "{text}");
        let _ = w.close().await;
    }
}
