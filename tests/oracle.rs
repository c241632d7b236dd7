//! Differential tests against the `kafka-protocol` crate (generated from Apache Kafka's
//! message schemas): for every API and version we speak, encode with ours and decode
//! with theirs, check key fields, re-encode with theirs and require identical bytes, and
//! decode their bytes with ours back to the original value. A few messages are also
//! built from scratch with theirs and decoded with ours.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::fmt::Debug;

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages as kp;
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use kafkapipe::protocol::messages::*;
use kafkapipe::protocol::{Decode, Encode, TaggedFields};
use uuid::Uuid;

#[path = "oracle/admin.rs"]
mod admin;
#[path = "oracle/consumer.rs"]
mod consumer;
#[path = "oracle/consumer_group.rs"]
mod consumer_group;
#[path = "oracle/quotas.rs"]
mod quotas;
#[path = "oracle/security.rs"]
mod security;
#[path = "oracle/share.rs"]
mod share;
#[path = "oracle/txn.rs"]
mod txn;

const ID: [u8; 16] = [7, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15];

fn unknown(flexible: bool) -> TaggedFields {
    if flexible {
        TaggedFields(vec![(42, Bytes::from_static(b"zz"))])
    } else {
        TaggedFields::new()
    }
}

fn s(v: &StrBytes) -> &str {
    v.as_str()
}

/// Ours → theirs → bytes → ours; returns their decoded value for field checks.
fn check<O, T>(ours: &O, v: i16) -> T
where
    O: Encode + Decode + PartialEq + Debug,
    T: Encodable + Decodable,
{
    let mut b = BytesMut::new();
    Encode::encode(ours, &mut b, v).unwrap();
    let ours_bytes = b.freeze();
    let mut r = ours_bytes.clone();
    let theirs = <T as Decodable>::decode(&mut r, v)
        .unwrap_or_else(|e| panic!("kafka-protocol failed to decode our v{v}: {e}"));
    assert!(r.is_empty(), "v{v}: kafka-protocol left {} bytes", r.len());
    let mut tb = BytesMut::new();
    Encodable::encode(&theirs, &mut tb, v).unwrap();
    let their_bytes = tb.freeze();
    assert_eq!(their_bytes, ours_bytes, "v{v}: re-encoding differs");
    let mut r = their_bytes.clone();
    let back = <O as Decode>::decode(&mut r, v).unwrap();
    assert!(r.is_empty());
    assert_eq!(&back, ours, "v{v}");
    theirs
}

/// Theirs built from scratch → bytes → ours.
fn from_theirs<T: Encodable, O: Decode>(theirs: &T, v: i16) -> O {
    let mut b = BytesMut::new();
    Encodable::encode(theirs, &mut b, v).unwrap();
    let mut r = b.freeze();
    let o = <O as Decode>::decode(&mut r, v).unwrap();
    assert!(r.is_empty(), "v{v}: {} bytes left", r.len());
    o
}

#[test]
fn api_versions() {
    for v in 0..=4 {
        let flexible = v >= 3;
        let req = ApiVersionsRequest {
            client_software_name: if flexible {
                "kafkapipe".into()
            } else {
                String::new()
            },
            client_software_version: if flexible {
                "0.1".into()
            } else {
                String::new()
            },
            tagged_fields: unknown(flexible),
        };
        let t: kp::ApiVersionsRequest = check(&req, v);
        if flexible {
            assert_eq!(s(&t.client_software_name), "kafkapipe");
        }
        let resp = ApiVersionsResponse {
            error_code: 35,
            api_keys: vec![ApiVersionRange {
                api_key: kafkapipe::protocol::ApiKey(1),
                min_version: 4,
                max_version: 17,
                tagged_fields: unknown(flexible),
            }],
            throttle_time_ms: if v >= 1 { 9 } else { 0 },
            tagged_fields: TaggedFields::new(),
        };
        let t: kp::ApiVersionsResponse = check(&resp, v);
        assert_eq!(t.error_code, 35);
        assert_eq!(t.api_keys[0].max_version, 17);
    }
}

#[test]
fn metadata() {
    for v in 4..=13 {
        let flexible = v >= 9;
        let req = MetadataRequest {
            topics: Some(vec![MetadataRequestTopic {
                topic_id: if v >= 10 { ID } else { [0; 16] },
                name: Some("events".into()),
                tagged_fields: unknown(flexible),
            }]),
            allow_auto_topic_creation: false,
            include_cluster_authorized_operations: (8..=10).contains(&v),
            include_topic_authorized_operations: v >= 8,
            tagged_fields: unknown(flexible),
        };
        let t: kp::MetadataRequest = check(&req, v);
        let topics = t.topics.unwrap();
        assert_eq!(topics[0].name.as_ref().map(|n| s(&n.0)), Some("events"));
        assert!(!t.allow_auto_topic_creation);
        let all = MetadataRequest {
            topics: None,
            ..MetadataRequest::default()
        };
        let t: kp::MetadataRequest = check(&all, v);
        assert!(t.topics.is_none());

        let resp = MetadataResponse {
            throttle_time_ms: 5,
            brokers: vec![MetadataBroker {
                node_id: 2,
                host: "b2.local".into(),
                port: 9093,
                rack: Some("r1".into()),
                tagged_fields: unknown(flexible),
            }],
            cluster_id: Some("cid".into()),
            controller_id: 2,
            topics: vec![MetadataTopic {
                error_code: 0,
                name: Some("events".into()),
                topic_id: if v >= 10 { ID } else { [0; 16] },
                is_internal: false,
                partitions: vec![MetadataPartition {
                    error_code: 0,
                    partition_index: 3,
                    leader_id: 2,
                    leader_epoch: if v >= 7 { 11 } else { -1 },
                    replica_nodes: vec![2, 3],
                    isr_nodes: vec![2],
                    offline_replicas: if v >= 5 { vec![3] } else { vec![] },
                    tagged_fields: unknown(flexible),
                }],
                topic_authorized_operations: if v >= 8 { 0x0f } else { i32::MIN },
                tagged_fields: unknown(flexible),
            }],
            cluster_authorized_operations: if (8..=10).contains(&v) { 7 } else { i32::MIN },
            error_code: if v >= 13 { 41 } else { 0 },
            tagged_fields: unknown(flexible),
        };
        let t: kp::MetadataResponse = check(&resp, v);
        assert_eq!(t.brokers[0].port, 9093);
        assert_eq!(s(&t.brokers[0].host), "b2.local");
        assert_eq!(t.controller_id.0, 2);
        let p = &t.topics[0].partitions[0];
        assert_eq!((p.partition_index, p.leader_id.0), (3, 2));
        assert_eq!(p.isr_nodes.len(), 1);
        if v >= 10 {
            assert_eq!(t.topics[0].topic_id, Uuid::from_bytes(ID));
        }
        if v >= 13 {
            assert_eq!(t.error_code, 41);
        }

        // theirs from scratch
        let theirs = kp::MetadataResponse::default()
            .with_throttle_time_ms(1)
            .with_brokers(vec![
                kp::metadata_response::MetadataResponseBroker::default()
                    .with_node_id(kp::BrokerId(4))
                    .with_host(StrBytes::from_static_str("h"))
                    .with_port(1),
            ])
            .with_topics(vec![kp::metadata_response::MetadataResponseTopic::default(
            )
            .with_name(Some(kp::TopicName(StrBytes::from_static_str("t"))))
            .with_partitions(vec![
                kp::metadata_response::MetadataResponsePartition::default()
                    .with_partition_index(9)
                    .with_leader_id(kp::BrokerId(4)),
            ])]);
        let ours: MetadataResponse = from_theirs(&theirs, v);
        assert_eq!(ours.brokers[0].node_id, 4);
        assert_eq!(ours.topics[0].name.as_deref(), Some("t"));
        assert_eq!(ours.topics[0].partitions[0].partition_index, 9);
    }
}

#[test]
fn produce() {
    for v in 3..=13 {
        let flexible = v >= 9;
        let req = ProduceRequest {
            transactional_id: Some("tx".into()),
            acks: -1,
            timeout_ms: 30_000,
            topic_data: vec![ProduceTopicData {
                name: if v <= 12 {
                    "events".into()
                } else {
                    String::new()
                },
                topic_id: if v >= 13 { ID } else { [0; 16] },
                partition_data: vec![ProducePartitionData {
                    index: 1,
                    records: Some(Bytes::from_static(b"\x00\x01batch").into()),
                    tagged_fields: unknown(flexible),
                }],
                tagged_fields: unknown(flexible),
            }],
            tagged_fields: unknown(flexible),
        };
        let t: kp::ProduceRequest = check(&req, v);
        assert_eq!(t.acks, -1);
        assert_eq!(t.timeout_ms, 30_000);
        let td = &t.topic_data[0];
        if v <= 12 {
            assert_eq!(s(&td.name.0), "events");
        } else {
            assert_eq!(td.topic_id, Uuid::from_bytes(ID));
        }
        assert_eq!(
            td.partition_data[0].records.as_deref(),
            Some(&b"\x00\x01batch"[..])
        );

        let resp = ProduceResponse {
            responses: vec![ProduceTopicResponse {
                name: if v <= 12 {
                    "events".into()
                } else {
                    String::new()
                },
                topic_id: if v >= 13 { ID } else { [0; 16] },
                partition_responses: vec![ProducePartitionResponse {
                    index: 1,
                    error_code: 6,
                    base_offset: 1000,
                    log_append_time_ms: 1_700_000_000_000,
                    log_start_offset: if v >= 5 { 10 } else { -1 },
                    record_errors: if v >= 8 {
                        vec![BatchIndexAndErrorMessage {
                            batch_index: 2,
                            batch_index_error_message: Some("bad".into()),
                            tagged_fields: unknown(flexible),
                        }]
                    } else {
                        vec![]
                    },
                    error_message: if v >= 8 { Some("oops".into()) } else { None },
                    current_leader: (v >= 10).then(|| LeaderIdAndEpoch {
                        leader_id: 5,
                        leader_epoch: 8,
                        tagged_fields: TaggedFields::new(),
                    }),
                    tagged_fields: unknown(flexible),
                }],
                tagged_fields: unknown(flexible),
            }],
            throttle_time_ms: 3,
            node_endpoints: (v >= 10).then(|| {
                vec![NodeEndpoint {
                    node_id: 5,
                    host: "b5".into(),
                    port: 9092,
                    rack: None,
                    tagged_fields: TaggedFields::new(),
                }]
            }),
            tagged_fields: unknown(flexible),
        };
        let t: kp::ProduceResponse = check(&resp, v);
        let p = &t.responses[0].partition_responses[0];
        assert_eq!((p.index, p.error_code, p.base_offset), (1, 6, 1000));
        if v >= 10 {
            assert_eq!(p.current_leader.leader_id.0, 5);
            assert_eq!(p.current_leader.leader_epoch, 8);
            assert_eq!(t.node_endpoints[0].port, 9092);
        }
        if v >= 8 {
            assert_eq!(p.record_errors[0].batch_index, 2);
        }
    }
}

#[test]
fn fetch() {
    for v in 4..=18 {
        let flexible = v >= 12;
        let req = FetchRequest {
            cluster_id: flexible.then(|| "cid".to_string()),
            replica_id: -1,
            replica_state: (v >= 15).then(|| ReplicaState {
                replica_id: 3,
                replica_epoch: 44,
                tagged_fields: TaggedFields::new(),
            }),
            max_wait_ms: 500,
            min_bytes: 1,
            max_bytes: 52_428_800,
            isolation_level: 1,
            session_id: if v >= 7 { 77 } else { 0 },
            session_epoch: if v >= 7 { 2 } else { -1 },
            topics: vec![FetchTopic {
                topic: if v <= 12 {
                    "events".into()
                } else {
                    String::new()
                },
                topic_id: if v >= 13 { ID } else { [0; 16] },
                partitions: vec![FetchPartition {
                    partition: 4,
                    current_leader_epoch: if v >= 9 { 6 } else { -1 },
                    fetch_offset: 12345,
                    last_fetched_epoch: if v >= 12 { 5 } else { -1 },
                    log_start_offset: if v >= 5 { 0 } else { -1 },
                    partition_max_bytes: 1 << 20,
                    replica_directory_id: (v >= 17).then_some(ID),
                    high_watermark: (v >= 18).then_some(999),
                    tagged_fields: unknown(flexible),
                }],
                tagged_fields: unknown(flexible),
            }],
            forgotten_topics_data: if v >= 7 {
                vec![ForgottenTopic {
                    topic: if v <= 12 { "old".into() } else { String::new() },
                    topic_id: if v >= 13 { ID } else { [0; 16] },
                    partitions: vec![1, 2],
                    tagged_fields: unknown(flexible),
                }]
            } else {
                vec![]
            },
            rack_id: if v >= 11 {
                "rack-a".into()
            } else {
                String::new()
            },
            tagged_fields: unknown(flexible),
        };
        let t: kp::FetchRequest = check(&req, v);
        assert_eq!((t.max_wait_ms, t.min_bytes, t.isolation_level), (500, 1, 1));
        let p = &t.topics[0].partitions[0];
        assert_eq!((p.partition, p.fetch_offset), (4, 12345));
        if v >= 7 {
            assert_eq!((t.session_id, t.session_epoch), (77, 2));
            assert_eq!(t.forgotten_topics_data[0].partitions, vec![1, 2]);
        }
        if v >= 11 {
            assert_eq!(s(&t.rack_id), "rack-a");
        }
        if flexible {
            assert_eq!(t.cluster_id.as_ref().map(s), Some("cid"));
        }
        if v >= 15 {
            assert_eq!(t.replica_state.replica_epoch, 44);
        }
        if v >= 18 {
            assert_eq!(p.high_watermark, 999);
        }

        let resp = FetchResponse {
            throttle_time_ms: 0,
            error_code: 0,
            session_id: if v >= 7 { 77 } else { 0 },
            responses: vec![FetchableTopicResponse {
                topic: if v <= 12 {
                    "events".into()
                } else {
                    String::new()
                },
                topic_id: if v >= 13 { ID } else { [0; 16] },
                partitions: vec![FetchPartitionData {
                    partition_index: 4,
                    error_code: 0,
                    high_watermark: 2000,
                    last_stable_offset: 1990,
                    log_start_offset: if v >= 5 { 5 } else { -1 },
                    diverging_epoch: flexible.then(|| EpochEndOffset {
                        epoch: 3,
                        end_offset: 100,
                        tagged_fields: TaggedFields::new(),
                    }),
                    current_leader: flexible.then(|| LeaderIdAndEpoch {
                        leader_id: 1,
                        leader_epoch: 6,
                        tagged_fields: TaggedFields::new(),
                    }),
                    snapshot_id: flexible.then(|| SnapshotId {
                        end_offset: 50,
                        epoch: 2,
                        tagged_fields: TaggedFields::new(),
                    }),
                    aborted_transactions: Some(vec![AbortedTransaction {
                        producer_id: 9001,
                        first_offset: 1500,
                        tagged_fields: unknown(flexible),
                    }]),
                    preferred_read_replica: if v >= 11 { 2 } else { -1 },
                    records: Some(Bytes::from_static(b"records")),
                    tagged_fields: unknown(flexible),
                }],
                tagged_fields: unknown(flexible),
            }],
            node_endpoints: (v >= 16).then(|| {
                vec![NodeEndpoint {
                    node_id: 1,
                    host: "b1".into(),
                    port: 9092,
                    rack: Some("r".into()),
                    tagged_fields: TaggedFields::new(),
                }]
            }),
            tagged_fields: unknown(flexible),
        };
        let t: kp::FetchResponse = check(&resp, v);
        let p = &t.responses[0].partitions[0];
        assert_eq!((p.high_watermark, p.last_stable_offset), (2000, 1990));
        let ab = p.aborted_transactions.as_ref().unwrap();
        assert_eq!((ab[0].producer_id.0, ab[0].first_offset), (9001, 1500));
        assert_eq!(p.records.as_deref(), Some(&b"records"[..]));
        if flexible {
            assert_eq!(p.diverging_epoch.end_offset, 100);
            assert_eq!(p.current_leader.leader_epoch, 6);
            assert_eq!(p.snapshot_id.end_offset, 50);
        }
        if v >= 16 {
            assert_eq!(s(&t.node_endpoints[0].host), "b1");
        }

        // theirs from scratch
        let theirs = kp::FetchResponse::default().with_responses(vec![
            kp::fetch_response::FetchableTopicResponse::default()
                .with_topic(kp::TopicName(StrBytes::from_static_str(if v <= 12 {
                    "t"
                } else {
                    ""
                })))
                .with_partitions(vec![kp::fetch_response::PartitionData::default()
                    .with_partition_index(1)
                    .with_high_watermark(10)]),
        ]);
        let ours: FetchResponse = from_theirs(&theirs, v);
        let p = &ours.responses[0].partitions[0];
        assert_eq!((p.partition_index, p.high_watermark), (1, 10));
        assert!(p.aborted_transactions.is_some());
    }
}

#[test]
fn list_offsets() {
    for v in 1..=10 {
        let flexible = v >= 6;
        let req = ListOffsetsRequest {
            replica_id: -1,
            isolation_level: if v >= 2 { 1 } else { 0 },
            topics: vec![ListOffsetsTopic {
                name: "events".into(),
                partitions: vec![ListOffsetsPartition {
                    partition_index: 2,
                    current_leader_epoch: if v >= 4 { 7 } else { -1 },
                    timestamp: -2,
                    tagged_fields: unknown(flexible),
                }],
                tagged_fields: unknown(flexible),
            }],
            timeout_ms: if v >= 10 { 1000 } else { 0 },
            tagged_fields: unknown(flexible),
        };
        let t: kp::ListOffsetsRequest = check(&req, v);
        assert_eq!(t.replica_id.0, -1);
        let p = &t.topics[0].partitions[0];
        assert_eq!((p.partition_index, p.timestamp), (2, -2));
        if v >= 4 {
            assert_eq!(p.current_leader_epoch, 7);
        }
        if v >= 10 {
            assert_eq!(t.timeout_ms, 1000);
        }

        let resp = ListOffsetsResponse {
            throttle_time_ms: if v >= 2 { 4 } else { 0 },
            topics: vec![ListOffsetsTopicResponse {
                name: "events".into(),
                partitions: vec![ListOffsetsPartitionResponse {
                    partition_index: 2,
                    error_code: 0,
                    timestamp: 1_700_000_000_000,
                    offset: 42,
                    leader_epoch: if v >= 4 { 7 } else { -1 },
                    tagged_fields: unknown(flexible),
                }],
                tagged_fields: unknown(flexible),
            }],
            tagged_fields: unknown(flexible),
        };
        let t: kp::ListOffsetsResponse = check(&resp, v);
        let p = &t.topics[0].partitions[0];
        assert_eq!((p.offset, p.timestamp), (42, 1_700_000_000_000));
        assert_eq!(s(&t.topics[0].name.0), "events");
    }
}

#[test]
fn create_topics() {
    for v in 2..=7 {
        let flexible = v >= 5;
        let req = CreateTopicsRequest {
            topics: vec![CreatableTopic {
                name: "new".into(),
                num_partitions: -1,
                replication_factor: -1,
                assignments: vec![CreatableReplicaAssignment {
                    partition_index: 0,
                    broker_ids: vec![1, 2, 3],
                    tagged_fields: unknown(flexible),
                }],
                configs: vec![CreatableTopicConfig {
                    name: "cleanup.policy".into(),
                    value: Some("compact".into()),
                    tagged_fields: unknown(flexible),
                }],
                tagged_fields: unknown(flexible),
            }],
            timeout_ms: 5000,
            validate_only: true,
            tagged_fields: unknown(flexible),
        };
        let t: kp::CreateTopicsRequest = check(&req, v);
        assert!(t.validate_only);
        let tp = &t.topics[0];
        assert_eq!(s(&tp.name.0), "new");
        assert_eq!(tp.assignments[0].broker_ids.len(), 3);
        assert_eq!(tp.configs[0].value.as_ref().map(s), Some("compact"));

        let resp = CreateTopicsResponse {
            throttle_time_ms: 1,
            topics: vec![CreatableTopicResult {
                name: "new".into(),
                topic_id: if v >= 7 { ID } else { [0; 16] },
                error_code: 36,
                error_message: Some("exists".into()),
                topic_config_error_code: flexible.then_some(29),
                num_partitions: if flexible { 3 } else { -1 },
                replication_factor: if flexible { 2 } else { -1 },
                configs: flexible.then(|| {
                    vec![CreatableTopicConfigs {
                        name: "cleanup.policy".into(),
                        value: Some("compact".into()),
                        read_only: false,
                        config_source: 1,
                        is_sensitive: false,
                        tagged_fields: unknown(flexible),
                    }]
                }),
                tagged_fields: unknown(flexible),
            }],
            tagged_fields: unknown(flexible),
        };
        let t: kp::CreateTopicsResponse = check(&resp, v);
        let r = &t.topics[0];
        assert_eq!(r.error_code, 36);
        assert_eq!(r.error_message.as_ref().map(s), Some("exists"));
        if flexible {
            assert_eq!(r.topic_config_error_code, 29);
            assert_eq!((r.num_partitions, r.replication_factor), (3, 2));
        }
        if v >= 7 {
            assert_eq!(r.topic_id, Uuid::from_bytes(ID));
        }
    }
}

#[test]
fn delete_topics() {
    for v in 1..=6 {
        let flexible = v >= 4;
        let req = DeleteTopicsRequest {
            topics: if v >= 6 {
                vec![
                    DeleteTopicState {
                        name: Some("a".into()),
                        topic_id: [0; 16],
                        tagged_fields: unknown(true),
                    },
                    DeleteTopicState {
                        name: None,
                        topic_id: ID,
                        tagged_fields: TaggedFields::new(),
                    },
                ]
            } else {
                vec![]
            },
            topic_names: if v < 6 {
                vec!["a".into(), "b".into()]
            } else {
                vec![]
            },
            timeout_ms: 3000,
            tagged_fields: unknown(flexible),
        };
        let t: kp::DeleteTopicsRequest = check(&req, v);
        assert_eq!(t.timeout_ms, 3000);
        if v >= 6 {
            assert_eq!(t.topics[1].topic_id, Uuid::from_bytes(ID));
            assert!(t.topics[1].name.is_none());
        } else {
            assert_eq!(s(&t.topic_names[1].0), "b");
        }

        let resp = DeleteTopicsResponse {
            throttle_time_ms: 0,
            responses: vec![DeletableTopicResult {
                name: Some("a".into()),
                topic_id: if v >= 6 { ID } else { [0; 16] },
                error_code: 3,
                error_message: if v >= 5 { Some("unknown".into()) } else { None },
                tagged_fields: unknown(flexible),
            }],
            tagged_fields: unknown(flexible),
        };
        let t: kp::DeleteTopicsResponse = check(&resp, v);
        let r = &t.responses[0];
        assert_eq!(r.error_code, 3);
        assert_eq!(r.name.as_ref().map(|n| s(&n.0)), Some("a"));
        if v >= 5 {
            assert_eq!(r.error_message.as_ref().map(s), Some("unknown"));
        }
    }
}

#[test]
fn init_producer_id() {
    for v in 0..=5 {
        let flexible = v >= 2;
        let req = InitProducerIdRequest {
            transactional_id: if v % 2 == 0 {
                None
            } else {
                Some("tx-1".into())
            },
            transaction_timeout_ms: 60_000,
            producer_id: if v >= 3 { 77 } else { -1 },
            producer_epoch: if v >= 3 { 3 } else { -1 },
            tagged_fields: unknown(flexible),
        };
        let t: kp::InitProducerIdRequest = check(&req, v);
        assert_eq!(t.transaction_timeout_ms, 60_000);
        assert_eq!(
            t.transactional_id.as_ref().map(|x| s(&x.0)),
            req.transactional_id.as_deref()
        );
        if v >= 3 {
            assert_eq!(t.producer_id.0, 77);
            assert_eq!(t.producer_epoch, 3);
        }

        let resp = InitProducerIdResponse {
            throttle_time_ms: 5,
            error_code: 0,
            producer_id: 4242,
            producer_epoch: 1,
            tagged_fields: unknown(flexible),
        };
        let t: kp::InitProducerIdResponse = check(&resp, v);
        assert_eq!(t.producer_id.0, 4242);
        assert_eq!(t.producer_epoch, 1);
        assert_eq!(t.throttle_time_ms, 5);
    }
}

/// The consumer protocol's embedded bytes: our encoding is the version followed by the
/// kafka-protocol encoding of the same value at that version, both ways.
#[test]
fn consumer_protocol() {
    use kafka_protocol::messages::consumer_protocol_assignment as kpa;
    use kafka_protocol::messages::consumer_protocol_subscription as kps;
    use kafkapipe::protocol::consumer_protocol::{Assignment, Subscription, TopicPartitions};

    let tps = vec![TopicPartitions {
        topic: "events".into(),
        partitions: vec![0, 3],
    }];
    for v in 0..=3i16 {
        let ours = Subscription {
            version: v,
            topics: vec!["events".into(), "audit".into()],
            user_data: Some(Bytes::from_static(b"\x00sticky")),
            owned_partitions: if v >= 1 { tps.clone() } else { vec![] },
            generation_id: if v >= 2 { 7 } else { -1 },
            rack_id: if v >= 3 { Some("r1".into()) } else { None },
        };
        let bytes = ours.encode(v).unwrap();
        assert_eq!(&bytes[..2], &v.to_be_bytes());
        let mut body = bytes.slice(2..);
        let theirs = kps::ConsumerProtocolSubscription::decode(&mut body, v).unwrap();
        assert!(body.is_empty());
        assert_eq!(theirs.topics.len(), 2);
        let mut tb = BytesMut::from(&v.to_be_bytes()[..]);
        theirs.encode(&mut tb, v).unwrap();
        assert_eq!(tb.freeze(), bytes, "subscription v{v}");

        let ours = Assignment {
            version: v,
            partitions: tps.clone(),
            user_data: None,
        };
        let theirs = kpa::ConsumerProtocolAssignment::default().with_assigned_partitions(vec![
            kpa::TopicPartition::default()
                .with_topic(kp::TopicName(StrBytes::from_static_str("events")))
                .with_partitions(vec![0, 3]),
        ]);
        let mut tb = BytesMut::from(&v.to_be_bytes()[..]);
        theirs.encode(&mut tb, v).unwrap();
        assert_eq!(Assignment::decode(tb.freeze()).unwrap(), ours);
        let mut body = ours.encode(v).unwrap().slice(2..);
        let back = kpa::ConsumerProtocolAssignment::decode(&mut body, v).unwrap();
        assert_eq!(back, theirs);
    }
}

#[test]
fn sasl_handshake() {
    for v in 0..=1 {
        let req = SaslHandshakeRequest {
            mechanism: "SCRAM-SHA-512".into(),
        };
        let t: kp::SaslHandshakeRequest = check(&req, v);
        assert_eq!(s(&t.mechanism), "SCRAM-SHA-512");
        let resp = SaslHandshakeResponse {
            error_code: 33,
            mechanisms: vec!["SCRAM-SHA-256".into(), "OAUTHBEARER".into()],
        };
        let t: kp::SaslHandshakeResponse = check(&resp, v);
        assert_eq!(t.error_code, 33);
        assert_eq!(s(&t.mechanisms[1]), "OAUTHBEARER");
        let theirs = kp::SaslHandshakeResponse::default()
            .with_mechanisms(vec![StrBytes::from_static_str("PLAIN")]);
        let ours: SaslHandshakeResponse = from_theirs(&theirs, v);
        assert_eq!(ours.mechanisms, vec!["PLAIN".to_string()]);
    }
}

#[test]
fn sasl_authenticate() {
    for v in 0..=2 {
        let flexible = v >= 2;
        let req = SaslAuthenticateRequest {
            auth_bytes: Bytes::from_static(b"n,,n=user,r=abc"),
            tagged_fields: unknown(flexible),
        };
        let t: kp::SaslAuthenticateRequest = check(&req, v);
        assert_eq!(&t.auth_bytes[..], b"n,,n=user,r=abc");
        let resp = SaslAuthenticateResponse {
            error_code: 58,
            error_message: Some("bad password".into()),
            auth_bytes: Bytes::from_static(b"v=xyz"),
            session_lifetime_ms: if v >= 1 { 3_600_000 } else { 0 },
            tagged_fields: unknown(flexible),
        };
        let t: kp::SaslAuthenticateResponse = check(&resp, v);
        assert_eq!(t.error_code, 58);
        assert_eq!(t.error_message.as_ref().map(s), Some("bad password"));
        assert_eq!(&t.auth_bytes[..], b"v=xyz");
        if v >= 1 {
            assert_eq!(t.session_lifetime_ms, 3_600_000);
        }
        let theirs = kp::SaslAuthenticateResponse::default()
            .with_auth_bytes(Bytes::from_static(b"r=n,s=c2FsdA==,i=4096"))
            .with_session_lifetime_ms(5);
        let ours: SaslAuthenticateResponse = from_theirs(&theirs, v);
        assert_eq!(&ours.auth_bytes[..], b"r=n,s=c2FsdA==,i=4096");
        assert_eq!(ours.session_lifetime_ms, if v >= 1 { 5 } else { 0 });
    }
}

/// Our API key, version range and header versions of `O` equal kafka-protocol's for `T`.
fn same_api<O, T>()
where
    O: kafkapipe::protocol::Request,
    T: kafka_protocol::protocol::Request,
{
    use kafka_protocol::protocol::HeaderVersion;
    let name = std::any::type_name::<O>();
    assert_eq!(O::API_KEY.0, T::KEY, "{name}");
    assert_ne!(O::API_KEY.name(), "Unknown", "{name}");
    assert_eq!(O::MIN_VERSION, T::VERSIONS.min, "{name}");
    assert_eq!(O::MAX_VERSION, T::VERSIONS.max, "{name}");
    for v in O::MIN_VERSION..=O::MAX_VERSION {
        assert_eq!(
            O::request_header_version(v),
            T::header_version(v),
            "{name} v{v}"
        );
        assert_eq!(
            O::response_header_version(v),
            <T::Response as HeaderVersion>::header_version(v),
            "{name} v{v}"
        );
    }
}

#[test]
fn transaction_and_kip848_api_ranges() {
    same_api::<AddPartitionsToTxnRequest, kp::AddPartitionsToTxnRequest>();
    same_api::<AddOffsetsToTxnRequest, kp::AddOffsetsToTxnRequest>();
    same_api::<EndTxnRequest, kp::EndTxnRequest>();
    same_api::<TxnOffsetCommitRequest, kp::TxnOffsetCommitRequest>();
    same_api::<InitProducerIdRequest, kp::InitProducerIdRequest>();
    same_api::<ConsumerGroupHeartbeatRequest, kp::ConsumerGroupHeartbeatRequest>();
    same_api::<ConsumerGroupDescribeRequest, kp::ConsumerGroupDescribeRequest>();
}

#[test]
fn end_txn_v5_returns_the_bumped_producer() {
    let theirs = kp::EndTxnResponse::default()
        .with_error_code(0)
        .with_producer_id(kp::ProducerId(77))
        .with_producer_epoch(4);
    let ours: EndTxnResponse = from_theirs(&theirs, 5);
    assert_eq!((ours.producer_id, ours.producer_epoch), (77, 4));
    // before v5 the fields are absent and keep their -1 defaults
    let ours: EndTxnResponse = from_theirs(&kp::EndTxnResponse::default(), 4);
    assert_eq!((ours.producer_id, ours.producer_epoch), (-1, -1));
}

#[test]
fn add_partitions_to_txn_batched_and_classic() {
    use kp::add_partitions_to_txn_request as r;
    let topic = r::AddPartitionsToTxnTopic::default()
        .with_name(kp::TopicName(StrBytes::from_static_str("events")))
        .with_partitions(vec![0, 2]);
    let theirs = kp::AddPartitionsToTxnRequest::default().with_transactions(vec![
        r::AddPartitionsToTxnTransaction::default()
            .with_transactional_id(kp::TransactionalId(StrBytes::from_static_str("tx")))
            .with_producer_id(kp::ProducerId(9))
            .with_producer_epoch(2)
            .with_verify_only(true)
            .with_topics(vec![topic.clone()]),
    ]);
    for v in 4..=5 {
        let ours: AddPartitionsToTxnRequest = from_theirs(&theirs, v);
        let t = &ours.transactions[0];
        assert_eq!((t.transactional_id.as_str(), t.producer_id), ("tx", 9));
        assert!(t.verify_only);
        assert_eq!(t.topics[0].partitions, vec![0, 2]);
    }
    let theirs = kp::AddPartitionsToTxnRequest::default()
        .with_v3_and_below_transactional_id(kp::TransactionalId(StrBytes::from_static_str("tx")))
        .with_v3_and_below_producer_id(kp::ProducerId(9))
        .with_v3_and_below_topics(vec![topic]);
    for v in 0..=3 {
        let ours: AddPartitionsToTxnRequest = from_theirs(&theirs, v);
        assert_eq!(ours.v3_and_below_transactional_id, "tx");
        assert_eq!(ours.v3_and_below_topics[0].name, "events");
    }
}

#[test]
fn txn_offset_commit_kip447_member_fields() {
    let req = TxnOffsetCommitRequest {
        transactional_id: "tx".into(),
        group_id: "g".into(),
        producer_id: 5,
        producer_epoch: 1,
        generation_id: 12,
        member_id: "m-1".into(),
        group_instance_id: Some("i-1".into()),
        ..TxnOffsetCommitRequest::default()
    };
    for v in 3..=5 {
        let t: kp::TxnOffsetCommitRequest = check(&req, v);
        assert_eq!(t.generation_id, 12);
        assert_eq!(s(&t.member_id), "m-1");
        assert_eq!(t.group_instance_id.as_ref().map(s), Some("i-1"));
    }
}

#[test]
fn consumer_group_heartbeat_assignment_topic_ids() {
    use kp::consumer_group_heartbeat_response as r;
    let theirs = kp::ConsumerGroupHeartbeatResponse::default()
        .with_member_id(Some(StrBytes::from_static_str("m")))
        .with_member_epoch(3)
        .with_heartbeat_interval_ms(5000)
        .with_assignment(Some(r::Assignment::default().with_topic_partitions(vec![
            r::TopicPartitions::default()
                .with_topic_id(Uuid::from_bytes(ID))
                .with_partitions(vec![1, 4]),
        ])));
    for v in 0..=1 {
        let ours: ConsumerGroupHeartbeatResponse = from_theirs(&theirs, v);
        assert_eq!(ours.member_id.as_deref(), Some("m"));
        let a = ours.assignment.as_ref().expect("assignment");
        assert_eq!(a.topic_partitions[0].topic_id, ID);
        assert_eq!(a.topic_partitions[0].partitions, vec![1, 4]);
        // no assignment: the null marker
        let none: ConsumerGroupHeartbeatResponse =
            from_theirs(&kp::ConsumerGroupHeartbeatResponse::default(), v);
        assert_eq!(none.assignment, None);
    }
    // a request that leaves the group: epoch -1, everything else null
    let leave = ConsumerGroupHeartbeatRequest {
        group_id: "g".into(),
        member_id: "m".into(),
        member_epoch: -1,
        ..ConsumerGroupHeartbeatRequest::default()
    };
    for v in 0..=1 {
        let t: kp::ConsumerGroupHeartbeatRequest = check(&leave, v);
        assert_eq!(t.member_epoch, -1);
        assert!(t.subscribed_topic_names.is_none() && t.topic_partitions.is_none());
        assert_eq!(t.rebalance_timeout_ms, -1);
    }
}
