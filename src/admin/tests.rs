//! Admin routing and retry against a scripted fake broker on loopback: the broker side
//! decodes our requests and encodes its answers with the same protocol types.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use super::*;
use crate::protocol::messages::*;
use crate::protocol::{ApiKey, Encode, Request, RequestHeader, ResponseHeader, TaggedFields};

type Reply = Option<(i16, BytesMut)>;

fn reply<R: Request>(version: i16, resp: &R::Response) -> Reply {
    let mut b = BytesMut::new();
    resp.encode(&mut b, version).unwrap();
    Some((R::response_header_version(version), b))
}

fn parse<R: Request>(mut frame: Bytes, version: i16) -> R {
    RequestHeader::decode(&mut frame, R::request_header_version(version)).unwrap();
    let r = R::decode(&mut frame, version).unwrap();
    assert!(frame.is_empty());
    r
}

fn range<R: Request>() -> ApiVersionRange {
    ApiVersionRange {
        api_key: R::API_KEY,
        min_version: R::MIN_VERSION,
        max_version: R::MAX_VERSION,
        tagged_fields: TaggedFields::new(),
    }
}

fn default_apis() -> Vec<ApiVersionRange> {
    vec![
        range::<ApiVersionsRequest>(),
        range::<MetadataRequest>(),
        range::<FindCoordinatorRequest>(),
        range::<DescribeGroupsRequest>(),
        range::<DescribeConfigsRequest>(),
        range::<AlterConfigsRequest>(),
        range::<ListOffsetsRequest>(),
    ]
}

/// Start a one-broker fake (node 1) hosting `topics` (name, partitions); ApiVersions and
/// Metadata are answered here, everything else by `handler` (`None` closes the
/// connection).
async fn fake<H>(apis: Vec<ApiVersionRange>, topics: Vec<(&'static str, i32)>, handler: H) -> String
where
    H: Fn(ApiKey, i16, Bytes) -> Reply + Send + Sync + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let handler = Arc::new(handler);
    let apis = Arc::new(apis);
    tokio::spawn(async move {
        while let Ok((mut sock, _)) = listener.accept().await {
            let handler = handler.clone();
            let apis = apis.clone();
            let topics = topics.clone();
            tokio::spawn(async move {
                loop {
                    let Ok(size) = sock.read_i32().await else {
                        return;
                    };
                    let mut frame = vec![0u8; size as usize];
                    if sock.read_exact(&mut frame).await.is_err() {
                        return;
                    }
                    let frame = Bytes::from(frame);
                    let (key, version, corr) = RequestHeader::peek(&frame).unwrap();
                    let r = match key {
                        ApiKey::API_VERSIONS => reply::<ApiVersionsRequest>(
                            version,
                            &ApiVersionsResponse {
                                api_keys: apis.to_vec(),
                                ..Default::default()
                            },
                        ),
                        ApiKey::METADATA => {
                            let _ = parse::<MetadataRequest>(frame, version);
                            reply::<MetadataRequest>(
                                version,
                                &MetadataResponse {
                                    brokers: vec![MetadataBroker {
                                        node_id: 1,
                                        host: "127.0.0.1".into(),
                                        port: i32::from(port),
                                        rack: None,
                                        tagged_fields: TaggedFields::new(),
                                    }],
                                    cluster_id: Some("fake".into()),
                                    controller_id: 1,
                                    topics: topics
                                        .iter()
                                        .map(|(name, n)| MetadataTopic {
                                            name: Some((*name).into()),
                                            partitions: (0..*n)
                                                .map(|p| MetadataPartition {
                                                    partition_index: p,
                                                    leader_id: 1,
                                                    replica_nodes: vec![1],
                                                    isr_nodes: vec![1],
                                                    ..Default::default()
                                                })
                                                .collect(),
                                            ..Default::default()
                                        })
                                        .collect(),
                                    ..Default::default()
                                },
                            )
                        }
                        _ => handler(key, version, frame),
                    };
                    let Some((header_version, body)) = r else {
                        return;
                    };
                    let mut out = BytesMut::new();
                    ResponseHeader {
                        correlation_id: corr,
                        tagged_fields: TaggedFields::new(),
                    }
                    .encode(&mut out, header_version)
                    .unwrap();
                    out.extend_from_slice(&body);
                    let mut framed = BytesMut::new();
                    framed.put_i32(out.len() as i32);
                    framed.extend_from_slice(&out);
                    if sock.write_all(&framed).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    format!("127.0.0.1:{port}")
}

fn admin(addr: &str) -> Admin {
    Admin::connect([addr.to_string()])
        .unwrap()
        .with_retries(4, Duration::from_millis(1))
}

fn find_coordinator(version: i16, frame: Bytes) -> Reply {
    let req = parse::<FindCoordinatorRequest>(frame, version);
    reply::<FindCoordinatorRequest>(
        version,
        &FindCoordinatorResponse {
            node_id: 1,
            host: "127.0.0.1".into(),
            coordinators: req
                .coordinator_keys
                .iter()
                .map(|k| Coordinator {
                    key: k.clone(),
                    node_id: 1,
                    host: "127.0.0.1".into(),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        },
    )
}

#[tokio::test]
async fn describe_groups_finds_the_coordinator_again_after_not_coordinator() {
    let finds = Arc::new(AtomicUsize::new(0));
    let describes = Arc::new(AtomicUsize::new(0));
    let (f, d) = (finds.clone(), describes.clone());
    let addr = fake(
        default_apis(),
        vec![],
        move |key, version, frame| match key {
            ApiKey::FIND_COORDINATOR => {
                f.fetch_add(1, Ordering::SeqCst);
                find_coordinator(version, frame)
            }
            ApiKey::DESCRIBE_GROUPS => {
                let req = parse::<DescribeGroupsRequest>(frame, version);
                let first = d.fetch_add(1, Ordering::SeqCst) == 0;
                reply::<DescribeGroupsRequest>(
                    version,
                    &DescribeGroupsResponse {
                        groups: vec![DescribedGroup {
                            error_code: if first { 16 } else { 0 },
                            group_id: req.groups[0].clone(),
                            group_state: "Stable".into(),
                            protocol_type: "consumer".into(),
                            ..Default::default()
                        }],
                        ..Default::default()
                    },
                )
            }
            _ => None,
        },
    )
    .await;
    let admin = admin(&addr);
    let r = admin.describe_groups(&["g"]).await.unwrap();
    let g = r[0].1.as_ref().unwrap();
    assert_eq!(g.state, "Stable");
    assert_eq!(g.coordinator, 1);
    assert_eq!(describes.load(Ordering::SeqCst), 2);
    assert_eq!(finds.load(Ordering::SeqCst), 2);
    // The coordinator is cached now.
    admin.describe_groups(&["g"]).await.unwrap()[0]
        .1
        .as_ref()
        .unwrap();
    assert_eq!(describes.load(Ordering::SeqCst), 3);
    assert_eq!(finds.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn incremental_alter_falls_back_to_alter_configs() {
    let seen: Arc<Mutex<Option<AlterConfigsRequest>>> = Arc::default();
    let s = seen.clone();
    // No IncrementalAlterConfigs in the broker's API list.
    let addr = fake(
        default_apis(),
        vec![("t", 1)],
        move |key, version, frame| match key {
            ApiKey::DESCRIBE_CONFIGS => {
                let req = parse::<DescribeConfigsRequest>(frame, version);
                let entry = |name: &str, value: &str, source: i8| DescribeConfigsResourceResult {
                    name: name.into(),
                    value: Some(value.into()),
                    config_source: source,
                    ..Default::default()
                };
                reply::<DescribeConfigsRequest>(
                    version,
                    &DescribeConfigsResponse {
                        results: vec![DescribeConfigsResult {
                            resource_type: 2,
                            resource_name: req.resources[0].resource_name.clone(),
                            configs: vec![
                                entry("retention.ms", "1000", 1),
                                entry("cleanup.policy", "delete", 1),
                                entry("segment.ms", "604800000", 5),
                            ],
                            ..Default::default()
                        }],
                        ..Default::default()
                    },
                )
            }
            ApiKey::ALTER_CONFIGS => {
                let req = parse::<AlterConfigsRequest>(frame, version);
                let resource = req.resources[0].clone();
                *s.lock().unwrap() = Some(req);
                reply::<AlterConfigsRequest>(
                    version,
                    &AlterConfigsResponse {
                        responses: vec![AlterConfigsResourceResponse {
                            resource_type: resource.resource_type,
                            resource_name: resource.resource_name,
                            ..Default::default()
                        }],
                        ..Default::default()
                    },
                )
            }
            _ => None,
        },
    )
    .await;
    let ops = vec![
        AlterConfigOp::Delete("retention.ms".into()),
        AlterConfigOp::Append("cleanup.policy".into(), "compact".into()),
        AlterConfigOp::Set("max.message.bytes".into(), "2048".into()),
    ];
    let r = admin(&addr)
        .incremental_alter_configs(&[(ConfigResource::topic("t"), ops)], false)
        .await
        .unwrap();
    assert!(r[0].1.is_ok(), "{r:?}");
    let req = seen.lock().unwrap().take().expect("AlterConfigs sent");
    let configs: Vec<(String, Option<String>)> = req.resources[0]
        .configs
        .iter()
        .map(|c| (c.name.clone(), c.value.clone()))
        .collect();
    // Defaults are not written back; explicit configs are, with the changes applied.
    assert_eq!(
        configs,
        vec![
            (
                "cleanup.policy".to_string(),
                Some("delete,compact".to_string())
            ),
            ("max.message.bytes".to_string(), Some("2048".to_string())),
        ]
    );
}

#[tokio::test]
async fn list_offsets_retries_only_the_failed_partition() {
    let calls: Arc<Mutex<Vec<Vec<i32>>>> = Arc::default();
    let c = calls.clone();
    let addr = fake(
        default_apis(),
        vec![("t", 2)],
        move |key, version, frame| match key {
            ApiKey::LIST_OFFSETS => {
                let req = parse::<ListOffsetsRequest>(frame, version);
                let parts: Vec<i32> = req.topics[0]
                    .partitions
                    .iter()
                    .map(|p| p.partition_index)
                    .collect();
                let first = {
                    let mut c = c.lock().unwrap();
                    c.push(parts.clone());
                    c.len() == 1
                };
                reply::<ListOffsetsRequest>(
                    version,
                    &ListOffsetsResponse {
                        topics: vec![ListOffsetsTopicResponse {
                            name: "t".into(),
                            partitions: parts
                                .iter()
                                .map(|&p| ListOffsetsPartitionResponse {
                                    partition_index: p,
                                    error_code: if first && p == 1 { 6 } else { 0 },
                                    offset: 100 + i64::from(p),
                                    ..Default::default()
                                })
                                .collect(),
                            ..Default::default()
                        }],
                        ..Default::default()
                    },
                )
            }
            _ => None,
        },
    )
    .await;
    let r = admin(&addr)
        .list_offsets(&[
            (TopicPartition::new("t", 0), OffsetSpec::Latest),
            (TopicPartition::new("t", 1), OffsetSpec::Latest),
        ])
        .await
        .unwrap();
    let offsets: Vec<i64> = r.iter().map(|(_, r)| r.as_ref().unwrap().offset).collect();
    assert_eq!(offsets, vec![100, 101]);
    assert_eq!(*calls.lock().unwrap(), vec![vec![0, 1], vec![1]]);
}

#[tokio::test]
async fn missing_api_is_reported_by_name() {
    let addr = fake(default_apis(), vec![("t", 1)], |_, _, _| None).await;
    let e = admin(&addr)
        .create_partitions(&[("t", 3)], false)
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::UnsupportedVersion);
    assert!(e.to_string().contains("CreatePartitions"), "{e}");
}

#[tokio::test]
async fn describe_cluster_falls_back_to_metadata_and_old_find_coordinator_works() {
    // A broker without DescribeCluster and with FindCoordinator only up to v3 (one key
    // per request, answered in the top-level fields).
    let mut apis = default_apis();
    for r in &mut apis {
        if r.api_key == ApiKey::FIND_COORDINATOR {
            r.max_version = 3;
        }
    }
    let versions = Arc::new(Mutex::new(Vec::new()));
    let v = versions.clone();
    let addr = fake(apis, vec![], move |key, version, frame| match key {
        ApiKey::FIND_COORDINATOR => {
            v.lock().unwrap().push(version);
            let req = parse::<FindCoordinatorRequest>(frame, version);
            assert_eq!(req.key, "g");
            reply::<FindCoordinatorRequest>(
                version,
                &FindCoordinatorResponse {
                    node_id: 1,
                    host: "127.0.0.1".into(),
                    ..Default::default()
                },
            )
        }
        _ => None,
    })
    .await;
    let admin = admin(&addr);
    let c = admin.describe_cluster().await.unwrap();
    assert_eq!(c.cluster_id.as_deref(), Some("fake"));
    assert_eq!(c.controller_id, 1);
    assert_eq!(c.brokers.len(), 1);
    assert_eq!(c.brokers[0].addr(), addr);
    assert_eq!(admin.find_coordinator("g").await.unwrap(), 1);
    assert_eq!(*versions.lock().unwrap(), vec![3]);
    let v = admin.api_versions().await.unwrap();
    let ranges = v[0].1.as_ref().unwrap();
    assert!(!ranges.iter().any(|r| r.api_key == ApiKey::DESCRIBE_CLUSTER));
}

#[tokio::test]
async fn group_calls_are_batched_per_coordinator_with_per_group_results() {
    let requests: Arc<Mutex<Vec<Vec<String>>>> = Arc::default();
    let r = requests.clone();
    let addr = fake(
        {
            let mut apis = default_apis();
            apis.push(range::<DeleteGroupsRequest>());
            apis
        },
        vec![],
        move |key, version, frame| match key {
            ApiKey::FIND_COORDINATOR => find_coordinator(version, frame),
            ApiKey::DESCRIBE_GROUPS => {
                let req = parse::<DescribeGroupsRequest>(frame, version);
                r.lock().unwrap().push(req.groups.clone());
                reply::<DescribeGroupsRequest>(
                    version,
                    &DescribeGroupsResponse {
                        groups: req
                            .groups
                            .iter()
                            .map(|g| DescribedGroup {
                                // GroupAuthorizationFailed for one of them.
                                error_code: if g == "secret" { 30 } else { 0 },
                                group_id: g.clone(),
                                group_state: "Empty".into(),
                                ..Default::default()
                            })
                            .collect(),
                        ..Default::default()
                    },
                )
            }
            ApiKey::DELETE_GROUPS => {
                let req = parse::<DeleteGroupsRequest>(frame, version);
                reply::<DeleteGroupsRequest>(
                    version,
                    &DeleteGroupsResponse {
                        results: req
                            .groups_names
                            .iter()
                            .map(|g| DeletableGroupResult {
                                group_id: g.clone(),
                                // NonEmptyGroup for one of them.
                                error_code: if g == "busy" { 68 } else { 0 },
                                ..Default::default()
                            })
                            .collect(),
                        ..Default::default()
                    },
                )
            }
            _ => None,
        },
    )
    .await;
    let admin = admin(&addr);
    let r = admin.describe_groups(&["a", "secret", "b"]).await.unwrap();
    assert_eq!(
        *requests.lock().unwrap(),
        vec![vec!["a".to_string(), "secret".into(), "b".into()]]
    );
    assert_eq!(r[0].1.as_ref().unwrap().group_id, "a");
    assert_eq!(
        r[1].1.as_ref().unwrap_err().kafka_code(),
        Some(crate::protocol::ErrorCode::GroupAuthorizationFailed)
    );
    assert_eq!(r[2].0, "b");
    let d = admin.delete_groups(&["busy", "idle"]).await.unwrap();
    assert_eq!(
        d[0].1.as_ref().unwrap_err().kafka_code(),
        Some(crate::protocol::ErrorCode::NonEmptyGroup)
    );
    assert!(d[1].1.is_ok());
}
