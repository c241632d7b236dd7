//! Fault cases of the low-level `Conn` API against a scripted fake broker over real TCP
//! (`tests/fake_broker`): broker error codes, read-committed filtering, garbage on the
//! wire, unsupported versions.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod fake_broker;

use std::time::Duration;

use bytes::Bytes;
use fake_broker::{
    client_ranges, metadata_reply, ranges_with, raw_frame, respond, Action, FakeBroker, Incoming,
    Req,
};
use kafkapipe::compression::Compression;
use kafkapipe::conn::{
    Conn, ConnectionConfig, FetchOptions, IsolationLevel, ProduceOptions, RequiredAcks,
};
use kafkapipe::protocol::messages::{
    AbortedTransaction, FetchPartitionData, FetchRequest, FetchResponse, FetchableTopicResponse,
    ProducePartitionResponse, ProduceRequest, ProduceResponse, ProduceTopicResponse,
};
use kafkapipe::protocol::{ApiKey, ErrorCode, Request, TaggedFields};
use kafkapipe::record::{ControlRecord, Record, RecordBatchBuilder};
use kafkapipe::{Error, ErrorKind};

const TOPIC: &str = "events";
const TOPIC_ID: [u8; 16] = [7; 16];
const PARTITION: i32 = 2;
/// Bounds every client call: a fault must end in an error, never a hang.
const NO_HANG: Duration = Duration::from_secs(10);

async fn connect(broker: &FakeBroker) -> Conn {
    let config = ConnectionConfig {
        request_timeout: Duration::from_secs(20),
        ..ConnectionConfig::default()
    };
    Conn::connect_with(&broker.addr, config)
        .await
        .expect("connect to fake broker")
}

async fn fetch(
    conn: &Conn,
    offset: i64,
    isolation_level: IsolationLevel,
) -> kafkapipe::Result<kafkapipe::conn::Fetched> {
    let opts = FetchOptions {
        isolation_level,
        ..FetchOptions::default()
    };
    tokio::time::timeout(NO_HANG, conn.fetch(TOPIC, PARTITION, offset, &opts))
        .await
        .expect("fetch hung")
}

/// A Fetch answer for the one topic the request names, holding `data`.
fn fetch_reply(inc: &Incoming, data: FetchPartitionData) -> Action {
    let Req::Fetch(req) = &inc.req else {
        panic!("not a fetch: {inc:?}")
    };
    let t = &req.topics[0];
    let resp = FetchResponse {
        responses: vec![FetchableTopicResponse {
            topic: t.topic.clone(),
            topic_id: t.topic_id,
            partitions: vec![data],
            tagged_fields: TaggedFields::new(),
        }],
        ..FetchResponse::default()
    };
    Action::Write(respond::<FetchRequest>(&inc.header, &resp))
}

/// A script: Metadata is answered (so v13+ requests learn the topic id), Fetch and
/// Produce by `on_data`.
fn script(
    on_data: impl Fn(&Incoming) -> Action + Send + Sync + 'static,
) -> impl Fn(&Incoming) -> Action + Send + Sync + 'static {
    move |inc| match &inc.req {
        Req::Metadata(_) => metadata_reply(inc, TOPIC, TOPIC_ID, 3),
        Req::Fetch(_) | Req::Produce(_) => on_data(inc),
        other => panic!("unexpected request {other:?}"),
    }
}

fn assert_context(e: &Error, broker: &FakeBroker) {
    assert_eq!(e.topic(), Some(TOPIC), "{e}");
    assert_eq!(e.partition(), Some(PARTITION), "{e}");
    assert_eq!(e.broker(), Some(broker.addr.as_str()), "{e}");
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
            let broker = FakeBroker::start(
                ranges_with(ApiKey::FETCH, 4, max_version),
                script(move |inc| {
                    fetch_reply(
                        inc,
                        FetchPartitionData {
                            partition_index: PARTITION,
                            error_code: code.code(),
                            ..FetchPartitionData::default()
                        },
                    )
                }),
            )
            .await;
            let conn = connect(&broker).await;
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
            assert_context(&e, &broker);
            assert_eq!(e.is_retriable(), retriable, "{code:?}");

            let fetches = broker.fetches();
            assert_eq!(fetches.len(), 1);
            let (header, req) = &fetches[0];
            assert_eq!(header.api_version, max_version);
            assert_eq!(req.topics[0].partitions[0].fetch_offset, 100);
            if max_version >= 13 {
                assert_eq!(req.topics[0].topic_id, TOPIC_ID);
            } else {
                assert_eq!(req.topics[0].topic, TOPIC);
            }
        }
    }
}

#[tokio::test]
async fn fetch_top_level_error_code_becomes_error_with_context() {
    let broker = FakeBroker::start(
        client_ranges(),
        script(|inc| {
            let resp = FetchResponse {
                error_code: ErrorCode::NotLeaderOrFollower.code(),
                ..FetchResponse::default()
            };
            Action::Write(respond::<FetchRequest>(&inc.header, &resp))
        }),
    )
    .await;
    let conn = connect(&broker).await;
    let e = fetch(&conn, 0, IsolationLevel::ReadUncommitted)
        .await
        .expect_err("fetch should fail");
    assert_eq!(e.kafka_code(), Some(ErrorCode::NotLeaderOrFollower));
    assert!(e.is_retriable());
    assert_context(&e, &broker);
}

#[tokio::test]
async fn produce_message_too_large_carries_broker_message() {
    const MSG: &str = "batch of 2000000 bytes exceeds max.message.bytes";
    // v8 is the first with error_message; the newest uses topic ids.
    for max_version in [8, 12, ProduceRequest::MAX_VERSION] {
        let broker = FakeBroker::start(
            ranges_with(ApiKey::PRODUCE, 3, max_version),
            script(|inc| {
                let Req::Produce(req) = &inc.req else {
                    panic!("not a produce")
                };
                let t = &req.topic_data[0];
                let resp = ProduceResponse {
                    responses: vec![ProduceTopicResponse {
                        name: t.name.clone(),
                        topic_id: t.topic_id,
                        partition_responses: vec![ProducePartitionResponse {
                            index: t.partition_data[0].index,
                            error_code: ErrorCode::MessageTooLarge.code(),
                            error_message: Some(MSG.to_string()),
                            ..ProducePartitionResponse::default()
                        }],
                        tagged_fields: TaggedFields::new(),
                    }],
                    ..ProduceResponse::default()
                };
                Action::Write(respond::<ProduceRequest>(&inc.header, &resp))
            }),
        )
        .await;
        let conn = connect(&broker).await;
        let opts = ProduceOptions {
            acks: RequiredAcks::Leader,
            ..ProduceOptions::default()
        };
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
        assert_context(&e, &broker);
    }
}

const P: i64 = 1000;
const Q: i64 = 2000;

/// One encoded batch moved to `base` (the base offset is outside the CRC).
fn wire_batch(
    base: i64,
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
    let mut raw = b.build().unwrap().to_vec();
    raw[..8].copy_from_slice(&base.to_be_bytes());
    raw
}

fn wire_marker(offset: i64, producer: i64, kind: ControlRecord) -> Vec<u8> {
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
    let mut raw = b.build().unwrap().to_vec();
    raw[..8].copy_from_slice(&offset.to_be_bytes());
    raw
}

/// Offsets 0-1: P txn (aborted), 2-3: Q txn (committed, gzip), 4: P, 5: P ABORT,
/// 6: Q COMMIT, 7: plain record, 8: P txn (open, in the log beyond the LSO).
fn transactional_log() -> Bytes {
    let mut data = Vec::new();
    data.extend(wire_batch(0, &["p0", "p1"], P, true, Compression::None));
    data.extend(wire_batch(2, &["q2", "q3"], Q, true, Compression::Gzip));
    data.extend(wire_batch(4, &["p4"], P, true, Compression::Lz4));
    data.extend(wire_marker(5, P, ControlRecord::Abort));
    data.extend(wire_marker(6, Q, ControlRecord::Commit));
    data.extend(wire_batch(7, &["plain7"], -1, false, Compression::Zstd));
    Bytes::from(data)
}

#[tokio::test]
async fn read_committed_fetch_hides_aborted_transaction() {
    for max_version in [4, 12, FetchRequest::MAX_VERSION] {
        let broker = FakeBroker::start(
            ranges_with(ApiKey::FETCH, 4, max_version),
            script(|inc| {
                fetch_reply(
                    inc,
                    FetchPartitionData {
                        partition_index: PARTITION,
                        high_watermark: 9,
                        last_stable_offset: 8,
                        log_start_offset: 0,
                        // A real broker sends the list only to read-committed fetches; the
                        // client must ignore it otherwise.
                        aborted_transactions: Some(vec![AbortedTransaction {
                            producer_id: P,
                            first_offset: 0,
                            tagged_fields: TaggedFields::new(),
                        }]),
                        records: Some(transactional_log()),
                        ..FetchPartitionData::default()
                    },
                )
            }),
        )
        .await;
        let conn = connect(&broker).await;
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
                (7, "plain7".into())
            ],
            "v{max_version}"
        );
        assert_eq!(uncommitted.next_offset, 8);

        // Fetching from the middle: the aborted txn still hides offset 4.
        let mid = fetch(&conn, 3, IsolationLevel::ReadCommitted)
            .await
            .unwrap();
        assert_eq!(values(&mid), [(3, "q3".into()), (7, "plain7".into())]);

        let levels: Vec<i8> = broker
            .fetches()
            .iter()
            .map(|(_, r)| r.isolation_level)
            .collect();
        assert_eq!(levels, [1, 0, 1]);
    }
}

/// A broker that answers Metadata properly and then sends `garbage` for the fetch.
async fn garbage_case(garbage: impl Fn(&Incoming) -> Vec<u8> + Send + Sync + 'static) -> Error {
    let broker = FakeBroker::start(
        client_ranges(),
        script(move |inc| Action::Write(garbage(inc))),
    )
    .await;
    let conn = connect(&broker).await;
    let e = fetch(&conn, 0, IsolationLevel::ReadUncommitted)
        .await
        .expect_err("garbage must fail the fetch");
    assert_eq!(e.kind(), ErrorKind::Protocol, "{e}");
    assert_eq!(e.broker(), Some(broker.addr.as_str()), "{e}");
    e
}

#[tokio::test]
async fn garbage_frame_size_fails_fetch_with_protocol_error() {
    let e = garbage_case(|_| vec![0xff; 32]).await;
    assert!(e.to_string().contains("frame size"), "{e}");
}

#[tokio::test]
async fn garbage_body_fails_fetch_with_protocol_error() {
    // A well-framed response to the right correlation id, whose body is junk.
    garbage_case(|inc| {
        let mut payload = inc.header.correlation_id.to_be_bytes().to_vec();
        payload.push(0); // empty tagged fields of response header v1
        payload.extend([0xff; 40]);
        raw_frame(&payload)
    })
    .await;
}

#[tokio::test]
async fn truncated_body_fails_fetch_with_protocol_error() {
    // A valid response cut short inside its own frame (size prefix adjusted).
    garbage_case(|inc| {
        let whole = match fetch_reply(
            inc,
            FetchPartitionData {
                partition_index: PARTITION,
                records: Some(transactional_log()),
                ..FetchPartitionData::default()
            },
        ) {
            Action::Write(b) => b,
            _ => unreachable!(),
        };
        raw_frame(&whole[4..whole.len() - 30])
    })
    .await;
}

#[tokio::test]
async fn unknown_correlation_id_kills_connection() {
    let broker = FakeBroker::start(
        client_ranges(),
        script(|inc| {
            let resp = FetchResponse::default();
            let mut header = inc.header.clone();
            header.correlation_id = header.correlation_id.wrapping_add(1000);
            Action::Write(respond::<FetchRequest>(&header, &resp))
        }),
    )
    .await;
    let conn = connect(&broker).await;
    let e = fetch(&conn, 0, IsolationLevel::ReadUncommitted)
        .await
        .expect_err("unknown correlation id");
    assert_eq!(e.kind(), ErrorKind::Protocol, "{e}");
    assert!(conn.connection().is_closed());
    // Later calls fail at once with the same reason.
    let again = fetch(&conn, 0, IsolationLevel::ReadUncommitted)
        .await
        .expect_err("dead connection");
    assert_eq!(again.kind(), ErrorKind::Protocol, "{again}");
}

#[tokio::test]
async fn hang_up_mid_request_is_retriable_closed_error() {
    let broker = FakeBroker::start(client_ranges(), script(|_| Action::HangUp)).await;
    let conn = connect(&broker).await;
    let e = fetch(&conn, 0, IsolationLevel::ReadUncommitted)
        .await
        .expect_err("hang-up");
    assert!(e.is_closed(), "{e}");
    assert!(e.is_retriable());
}

#[tokio::test]
async fn broker_with_only_fetch_v0_to_v3_is_unsupported_version() {
    let broker = FakeBroker::start(
        ranges_with(ApiKey::FETCH, 0, 3),
        script(|inc| panic!("no request expected, got {inc:?}")),
    )
    .await;
    let conn = connect(&broker).await;
    let e = fetch(&conn, 0, IsolationLevel::ReadUncommitted)
        .await
        .expect_err("Fetch v0-3 only");
    assert_eq!(e.kind(), ErrorKind::UnsupportedVersion, "{e}");
    let msg = e.to_string();
    assert!(msg.contains("Fetch"), "{msg}");
    assert!(msg.contains("0..=3"), "{msg}");
    assert_eq!(e.broker(), Some(broker.addr.as_str()));
    assert!(broker.fetches().is_empty());
    assert_eq!(broker.seen().len(), 1, "only the ApiVersions handshake");
    assert!(!conn.connection().is_closed());
}

#[tokio::test]
async fn unknown_topic_id_falls_back_to_fetch_v12_by_name() {
    let broker = FakeBroker::start(client_ranges(), |inc: &Incoming| match &inc.req {
        // A broker that reports no topic ids (all zeros).
        Req::Metadata(_) => metadata_reply(inc, TOPIC, [0; 16], 3),
        Req::Fetch(_) => fetch_reply(
            inc,
            FetchPartitionData {
                partition_index: PARTITION,
                high_watermark: 0,
                ..FetchPartitionData::default()
            },
        ),
        other => panic!("unexpected request {other:?}"),
    })
    .await;
    let conn = connect(&broker).await;
    let f = fetch(&conn, 0, IsolationLevel::ReadUncommitted)
        .await
        .unwrap();
    assert!(f.records.is_empty());
    let fetches = broker.fetches();
    assert_eq!(fetches[0].0.api_version, 12);
    assert_eq!(fetches[0].1.topics[0].topic, TOPIC);
}

#[tokio::test]
async fn unknown_topic_id_with_broker_requiring_ids_is_unknown_topic() {
    let ranges = ranges_with(ApiKey::FETCH, 13, FetchRequest::MAX_VERSION);
    let ranges: Vec<_> = ranges
        .into_iter()
        .map(|r| {
            if r.api_key == ApiKey::PRODUCE {
                fake_broker::range(ApiKey::PRODUCE, 13, ProduceRequest::MAX_VERSION)
            } else {
                r
            }
        })
        .collect();
    let broker = FakeBroker::start(ranges, |inc: &Incoming| match &inc.req {
        Req::Metadata(_) => metadata_reply(inc, TOPIC, [0; 16], 3),
        other => panic!("unexpected request {other:?}"),
    })
    .await;
    let conn = connect(&broker).await;
    let e = fetch(&conn, 0, IsolationLevel::ReadUncommitted)
        .await
        .expect_err("no usable fetch version");
    assert_eq!(
        e.kafka_code(),
        Some(ErrorCode::UnknownTopicOrPartition),
        "{e}"
    );
    assert_context(&e, &broker);
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
    assert_context(&e, &broker);
    assert!(broker.fetches().is_empty());
}
