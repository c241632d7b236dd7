//! Fault cases of the low-level `Conn` API against `kafkapipe::mock::MockCluster`:
//! broker error codes, read-committed filtering, garbage on the wire, unsupported
//! versions, topic ids.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use bytes::Bytes;
use kafkapipe::compression::Compression;
use kafkapipe::conn::{
    Conn, ConnectionConfig, FetchOptions, IsolationLevel, ProduceOptions, RequiredAcks,
};
use kafkapipe::mock::{Fault, MockCluster, MockClusterBuilder};
use kafkapipe::protocol::messages::{FetchRequest, ProduceRequest};
use kafkapipe::protocol::{ApiKey, ErrorCode, Request};
use kafkapipe::record::{ControlRecord, Record, RecordBatchBuilder};
use kafkapipe::{Error, ErrorKind};

const TOPIC: &str = "events";
const PARTITION: i32 = 2;
/// Bounds every client call: a fault must end in an error, never a hang.
const NO_HANG: Duration = Duration::from_secs(10);

/// One broker hosting `TOPIC` with three partitions; every Fetch is captured.
async fn start(builder: MockClusterBuilder) -> MockCluster {
    let cluster = builder.topic(TOPIC, 3).start().await.unwrap();
    cluster.capture(ApiKey::FETCH);
    cluster
}

fn addr(cluster: &MockCluster) -> String {
    cluster.bootstrap()[0].clone()
}

async fn connect(cluster: &MockCluster) -> Conn {
    let config = ConnectionConfig::new().request_timeout(Duration::from_secs(20));
    Conn::connect_with(&addr(cluster), config)
        .await
        .expect("connect to the mock broker")
}

async fn fetch(
    conn: &Conn,
    offset: i64,
    isolation_level: IsolationLevel,
) -> kafkapipe::Result<kafkapipe::conn::Fetched> {
    let opts = FetchOptions::default()
        .isolation_level(isolation_level)
        .max_wait(Duration::from_millis(10));
    tokio::time::timeout(NO_HANG, conn.fetch(TOPIC, PARTITION, offset, &opts))
        .await
        .expect("fetch hung")
}

fn assert_context(e: &Error, cluster: &MockCluster) {
    assert_eq!(e.topic(), Some(TOPIC), "{e}");
    assert_eq!(e.partition(), Some(PARTITION), "{e}");
    assert_eq!(e.broker(), Some(addr(cluster).as_str()), "{e}");
}

#[tokio::test]
async fn fetch_partition_error_codes_become_errors_with_context() {
    let cases = [
        (ErrorCode::UnknownTopicOrPartition, true),
        (ErrorCode::NotLeaderOrFollower, true),
        (ErrorCode::OffsetOutOfRange, false),
    ];
    // v4 (non-flexible), v12 (flexible, names), 13 (topic ids) and the newest.
    for max_version in [4, 12, 13, FetchRequest::MAX_VERSION] {
        for (code, retriable) in cases {
            let cluster =
                start(MockCluster::builder().api_versions(ApiKey::FETCH, 4, max_version)).await;
            cluster.fault_partition(ApiKey::FETCH, TOPIC, PARTITION, code, 1);
            let conn = connect(&cluster).await;
            let e = fetch(&conn, 100, IsolationLevel::ReadUncommitted)
                .await
                .expect_err("fetch should fail");
            assert_eq!(e.kafka_code(), Some(code), "v{max_version}: {e}");
            assert_eq!(
                code.code(),
                match code {
                    ErrorCode::UnknownTopicOrPartition => 3,
                    ErrorCode::NotLeaderOrFollower => 6,
                    _ => 1,
                }
            );
            assert_context(&e, &cluster);
            assert_eq!(e.is_retriable(), retriable, "{code:?}");

            let fetches = cluster.captured_versions::<FetchRequest>();
            assert_eq!(fetches.len(), 1);
            let (_, version, req) = &fetches[0];
            assert_eq!(*version, max_version);
            assert_eq!(req.topics[0].partitions[0].fetch_offset, 100);
            if max_version >= 13 {
                assert_eq!(Some(req.topics[0].topic_id), cluster.topic_id(TOPIC));
            } else {
                assert_eq!(req.topics[0].topic, TOPIC);
            }
        }
    }
}

#[tokio::test]
async fn fetch_top_level_error_code_becomes_error_with_context() {
    let cluster = start(MockCluster::builder()).await;
    cluster.fault(
        ApiKey::FETCH,
        Fault::Error(ErrorCode::NotLeaderOrFollower),
        1,
    );
    let conn = connect(&cluster).await;
    let e = fetch(&conn, 0, IsolationLevel::ReadUncommitted)
        .await
        .expect_err("fetch should fail");
    assert_eq!(e.kafka_code(), Some(ErrorCode::NotLeaderOrFollower));
    assert!(e.is_retriable());
    assert_context(&e, &cluster);
}

#[tokio::test]
async fn produce_message_too_large_carries_broker_message() {
    const MSG: &str = "batch of 2000000 bytes exceeds max.message.bytes";
    // v8 is the first with error_message; the newest uses topic ids.
    for max_version in [8, 12, ProduceRequest::MAX_VERSION] {
        let cluster =
            start(MockCluster::builder().api_versions(ApiKey::PRODUCE, 3, max_version)).await;
        cluster.capture(ApiKey::PRODUCE);
        cluster.fault(
            ApiKey::PRODUCE,
            Fault::ErrorWithMessage(ErrorCode::MessageTooLarge, MSG.to_string()),
            1,
        );
        let conn = connect(&cluster).await;
        let opts = ProduceOptions::default().acks(RequiredAcks::Leader);
        let e = tokio::time::timeout(
            NO_HANG,
            conn.produce(TOPIC, PARTITION, &[Record::new("k", "v")], &opts),
        )
        .await
        .expect("produce hung")
        .expect_err("produce should fail");
        assert_eq!(e.kafka_code(), Some(ErrorCode::MessageTooLarge), "{e}");
        assert!(!e.is_retriable());
        assert!(e.to_string().contains(MSG), "v{max_version}: {e}");
        assert_context(&e, &cluster);
        let versions: Vec<i16> = cluster
            .captured_versions::<ProduceRequest>()
            .iter()
            .map(|(_, v, _)| *v)
            .collect();
        assert_eq!(versions, [max_version]);
    }
}

const P: i64 = 1000;
const Q: i64 = 2000;

/// One encoded batch (the mock assigns the offsets).
fn wire_batch(
    values: &[&str],
    producer: i64,
    transactional: bool,
    compression: Compression,
) -> Vec<u8> {
    let mut b = RecordBatchBuilder::new(compression)
        .producer(producer, 0, 0)
        .transactional(transactional);
    for v in values {
        b.append(1_700_000_000_000, None, Some(v.as_bytes()), &[])
            .unwrap();
    }
    b.build().unwrap().to_vec()
}

fn wire_marker(producer: i64, kind: ControlRecord) -> Vec<u8> {
    let mut b = RecordBatchBuilder::new(Compression::None)
        .producer(producer, 0, -1)
        .transactional(true)
        .control(true);
    b.append(
        1_700_000_000_000,
        Some(&kind.key()),
        Some(&[0, 0, 0, 0, 0, 0]),
        &[],
    )
    .unwrap();
    b.build().unwrap().to_vec()
}

/// Offsets 0-1: P txn (aborted), 2-3: Q txn (committed, gzip), 4: P, 5: P ABORT,
/// 6: Q COMMIT, 7: plain record, 8: P txn (open, in the log beyond the LSO).
fn transactional_log() -> Bytes {
    let mut data = Vec::new();
    data.extend(wire_batch(&["p0", "p1"], P, true, Compression::None));
    data.extend(wire_batch(&["q2", "q3"], Q, true, Compression::Gzip));
    data.extend(wire_batch(&["p4"], P, true, Compression::Lz4));
    data.extend(wire_marker(P, ControlRecord::Abort));
    data.extend(wire_marker(Q, ControlRecord::Commit));
    data.extend(wire_batch(&["plain7"], -1, false, Compression::Zstd));
    data.extend(wire_batch(&["p8"], P, true, Compression::None));
    Bytes::from(data)
}

#[tokio::test]
async fn read_committed_fetch_hides_aborted_transaction() {
    for max_version in [4, 12, FetchRequest::MAX_VERSION] {
        let cluster =
            start(MockCluster::builder().api_versions(ApiKey::FETCH, 4, max_version)).await;
        assert_eq!(
            cluster.append_raw(TOPIC, PARTITION, transactional_log()),
            Some(0)
        );
        let conn = connect(&cluster).await;
        let values = |f: &kafkapipe::conn::Fetched| -> Vec<(i64, String)> {
            f.records
                .iter()
                .map(|r| {
                    let v = r.value.as_deref().unwrap_or_default();
                    (r.offset, String::from_utf8_lossy(v).into_owned())
                })
                .collect()
        };

        let committed = fetch(&conn, 0, IsolationLevel::ReadCommitted)
            .await
            .unwrap();
        assert_eq!(
            values(&committed),
            [(2, "q2".into()), (3, "q3".into()), (7, "plain7".into())],
            "v{max_version}"
        );
        assert_eq!(committed.next_offset, 8);
        assert_eq!(committed.high_watermark, 9);
        assert_eq!(committed.last_stable_offset, 8);

        let uncommitted = fetch(&conn, 0, IsolationLevel::ReadUncommitted)
            .await
            .unwrap();
        assert_eq!(
            values(&uncommitted),
            [
                (0, "p0".into()),
                (1, "p1".into()),
                (2, "q2".into()),
                (3, "q3".into()),
                (4, "p4".into()),
                (7, "plain7".into()),
                (8, "p8".into())
            ],
            "v{max_version}"
        );
        assert_eq!(uncommitted.next_offset, 9);

        // Fetching from the middle: the aborted txn still hides offset 4.
        let mid = fetch(&conn, 3, IsolationLevel::ReadCommitted)
            .await
            .unwrap();
        assert_eq!(values(&mid), [(3, "q3".into()), (7, "plain7".into())]);

        let levels: Vec<i8> = cluster
            .captured::<FetchRequest>()
            .iter()
            .map(|r| r.isolation_level)
            .collect();
        assert_eq!(levels, [1, 0, 1]);
    }
}

/// A broker that answers Metadata properly and then `fault`s the fetch.
async fn garbage_case(fault: Fault) -> Error {
    let cluster = start(MockCluster::builder()).await;
    cluster.append_raw(TOPIC, PARTITION, transactional_log());
    cluster.fault(ApiKey::FETCH, fault, 1);
    let conn = connect(&cluster).await;
    let e = fetch(&conn, 0, IsolationLevel::ReadUncommitted)
        .await
        .expect_err("garbage must fail the fetch");
    assert_eq!(e.kind(), ErrorKind::Protocol, "{e}");
    assert_eq!(e.broker(), Some(addr(&cluster).as_str()), "{e}");
    e
}

#[tokio::test]
async fn garbage_frame_size_fails_fetch_with_protocol_error() {
    let e = garbage_case(Fault::Raw(Bytes::from(vec![0xff; 32]))).await;
    assert!(e.to_string().contains("frame size"), "{e}");
}

#[tokio::test]
async fn garbage_body_fails_fetch_with_protocol_error() {
    // A well-framed response to the right correlation id, whose body is junk.
    garbage_case(Fault::GarbageBody).await;
}

#[tokio::test]
async fn truncated_body_fails_fetch_with_protocol_error() {
    // A valid response cut short inside its own frame (size prefix adjusted).
    garbage_case(Fault::Truncate(30)).await;
}

#[tokio::test]
/// A response out of step with the requests drops the connection; what was in flight
/// fails with a retriable `Closed` error (before: a non-retriable `Protocol` error, so a
/// writer gave up on a batch that may have been written).
async fn unknown_correlation_id_kills_connection() {
    let cluster = start(MockCluster::builder()).await;
    cluster.fault(ApiKey::FETCH, Fault::Corrupt, 1);
    let conn = connect(&cluster).await;
    let e = fetch(&conn, 0, IsolationLevel::ReadUncommitted)
        .await
        .expect_err("unknown correlation id");
    assert_eq!(e.kind(), ErrorKind::Closed, "{e}");
    assert!(
        e.is_retriable(),
        "the request's fate is unknown, as after a cut: {e}"
    );
    assert!(e.to_string().contains("correlation id"), "{e}");
    assert!(conn.connection().is_closed());
    // Later calls fail at once with the same reason.
    let again = fetch(&conn, 0, IsolationLevel::ReadUncommitted)
        .await
        .expect_err("dead connection");
    assert_eq!(again.kind(), ErrorKind::Closed, "{again}");
}

#[tokio::test]
async fn hang_up_mid_request_is_retriable_closed_error() {
    let cluster = start(MockCluster::builder()).await;
    cluster.fault(ApiKey::FETCH, Fault::CloseOnRequest, 1);
    let conn = connect(&cluster).await;
    let e = fetch(&conn, 0, IsolationLevel::ReadUncommitted)
        .await
        .expect_err("hang-up");
    assert!(e.is_closed(), "{e}");
    assert!(e.is_retriable());
}

#[tokio::test]
async fn broker_with_only_fetch_v0_to_v3_is_unsupported_version() {
    let cluster = start(MockCluster::builder().api_versions(ApiKey::FETCH, 0, 3)).await;
    let conn = connect(&cluster).await;
    let e = fetch(&conn, 0, IsolationLevel::ReadUncommitted)
        .await
        .expect_err("Fetch v0-3 only");
    assert_eq!(e.kind(), ErrorKind::UnsupportedVersion, "{e}");
    let msg = e.to_string();
    assert!(msg.contains("Fetch"), "{msg}");
    assert!(msg.contains("0..=3"), "{msg}");
    assert_eq!(e.broker(), Some(addr(&cluster).as_str()));
    assert_eq!(cluster.requests(ApiKey::FETCH), 0);
    assert_eq!(cluster.requests(ApiKey::METADATA), 0);
    assert_eq!(
        cluster.requests(ApiKey::API_VERSIONS),
        1,
        "only the ApiVersions handshake"
    );
    assert!(!conn.connection().is_closed());
}

#[tokio::test]
async fn unknown_topic_id_falls_back_to_fetch_v12_by_name() {
    // A broker that speaks Fetch v13+ but reports no topic ids (all zeros).
    let cluster = start(
        MockCluster::builder()
            .api_versions(ApiKey::FETCH, 4, FetchRequest::MAX_VERSION)
            .topic_ids(false),
    )
    .await;
    let conn = connect(&cluster).await;
    let f = fetch(&conn, 0, IsolationLevel::ReadUncommitted)
        .await
        .unwrap();
    assert!(f.records.is_empty());
    let fetches = cluster.captured_versions::<FetchRequest>();
    assert_eq!(fetches[0].1, 12);
    assert_eq!(fetches[0].2.topics[0].topic, TOPIC);
}

#[tokio::test]
async fn unknown_topic_id_with_broker_requiring_ids_is_unknown_topic() {
    let cluster = start(
        MockCluster::builder()
            .api_versions(ApiKey::FETCH, 13, FetchRequest::MAX_VERSION)
            .api_versions(ApiKey::PRODUCE, 13, ProduceRequest::MAX_VERSION)
            .topic_ids(false),
    )
    .await;
    let conn = connect(&cluster).await;
    let e = fetch(&conn, 0, IsolationLevel::ReadUncommitted)
        .await
        .expect_err("no usable fetch version");
    assert_eq!(
        e.kafka_code(),
        Some(ErrorCode::UnknownTopicOrPartition),
        "{e}"
    );
    assert_context(&e, &cluster);
    let e = conn
        .produce(
            TOPIC,
            PARTITION,
            &[Record::new("k", "v")],
            &ProduceOptions::default(),
        )
        .await
        .expect_err("no usable produce version");
    assert_eq!(
        e.kafka_code(),
        Some(ErrorCode::UnknownTopicOrPartition),
        "{e}"
    );
    assert_context(&e, &cluster);
    assert_eq!(cluster.requests(ApiKey::FETCH), 0);
}
