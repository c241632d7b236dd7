//! Admin routing and retry against `crate::mock::MockCluster` (feature `mock`): the
//! broker side decodes our requests and encodes its answers with the same protocol
//! types.

use std::time::Duration;

use bytes::Bytes;

use super::*;
use crate::compression::Compression;
use crate::mock::MockCluster;
use crate::protocol::messages::*;
use crate::protocol::{ApiKey, ErrorCode};
use crate::record::RecordBatchBuilder;

fn admin(cluster: &MockCluster) -> Admin {
    Admin::connect(cluster.bootstrap())
        .unwrap()
        .with_retries(4, Duration::from_millis(1))
}

/// `n` records for a partition, in one batch.
fn records(n: usize) -> Bytes {
    let mut b = RecordBatchBuilder::new(Compression::None);
    for _ in 0..n {
        b.append(0, None, Some(b"v"), &[]).unwrap();
    }
    b.build().unwrap()
}

#[tokio::test]
async fn describe_groups_finds_the_coordinator_again_after_not_coordinator() {
    let cluster = MockCluster::builder().topic("t", 1).start().await.unwrap();
    // The group exists (empty) once offsets are committed for it.
    admin(&cluster)
        .commit_group_offsets("g", &[(TopicPartition::new("t", 0), 0)])
        .await
        .unwrap();
    let finds = cluster.requests(ApiKey::FIND_COORDINATOR);
    let admin = admin(&cluster);
    cluster.fault_group(ApiKey::DESCRIBE_GROUPS, "g", ErrorCode::NotCoordinator, 1);
    let r = admin.describe_groups(&["g"]).await.unwrap();
    let g = r[0].1.as_ref().unwrap();
    assert_eq!(g.state, "Empty");
    assert_eq!(g.coordinator, 1);
    assert_eq!(cluster.requests(ApiKey::DESCRIBE_GROUPS), 2);
    assert_eq!(cluster.requests(ApiKey::FIND_COORDINATOR) - finds, 2);
    // The coordinator is cached now.
    admin.describe_groups(&["g"]).await.unwrap()[0]
        .1
        .as_ref()
        .unwrap();
    assert_eq!(cluster.requests(ApiKey::DESCRIBE_GROUPS), 3);
    assert_eq!(cluster.requests(ApiKey::FIND_COORDINATOR) - finds, 2);
}

#[tokio::test]
async fn incremental_alter_falls_back_to_alter_configs() {
    // No IncrementalAlterConfigs in the broker's API list.
    let cluster = MockCluster::builder()
        .without_api(ApiKey::INCREMENTAL_ALTER_CONFIGS)
        .start()
        .await
        .unwrap();
    let admin = admin(&cluster);
    let created = admin
        .create_topics(
            &[crate::conn::NewTopic::new("t", 1)
                .config("retention.ms", "1000")
                .config("cleanup.policy", "delete")],
            false,
        )
        .await
        .unwrap();
    assert!(created[0].1.is_ok(), "{created:?}");
    cluster.capture(ApiKey::ALTER_CONFIGS);
    let ops = vec![
        AlterConfigOp::Delete("retention.ms".into()),
        AlterConfigOp::Append("cleanup.policy".into(), "compact".into()),
        AlterConfigOp::Set("max.message.bytes".into(), "2048".into()),
    ];
    let r = admin
        .incremental_alter_configs(&[(ConfigResource::topic("t"), ops)], false)
        .await
        .unwrap();
    assert!(r[0].1.is_ok(), "{r:?}");
    let sent = cluster.captured::<AlterConfigsRequest>();
    assert_eq!(sent.len(), 1, "AlterConfigs sent once");
    let configs: Vec<(String, Option<String>)> = sent[0].resources[0]
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
    let cluster = MockCluster::builder().topic("t", 2).start().await.unwrap();
    cluster.append_raw("t", 0, records(100)).unwrap();
    cluster.append_raw("t", 1, records(101)).unwrap();
    cluster.fault_partition(
        ApiKey::LIST_OFFSETS,
        "t",
        1,
        ErrorCode::NotLeaderOrFollower,
        1,
    );
    cluster.capture(ApiKey::LIST_OFFSETS);
    let r = admin(&cluster)
        .list_offsets(&[
            (TopicPartition::new("t", 0), OffsetSpec::Latest),
            (TopicPartition::new("t", 1), OffsetSpec::Latest),
        ])
        .await
        .unwrap();
    let offsets: Vec<i64> = r.iter().map(|(_, r)| r.as_ref().unwrap().offset).collect();
    assert_eq!(offsets, vec![100, 101]);
    let calls: Vec<Vec<i32>> = cluster
        .captured::<ListOffsetsRequest>()
        .iter()
        .map(|r| {
            r.topics[0]
                .partitions
                .iter()
                .map(|p| p.partition_index)
                .collect()
        })
        .collect();
    assert_eq!(calls, vec![vec![0, 1], vec![1]]);
}

#[tokio::test]
async fn missing_api_is_reported_by_name() {
    let cluster = MockCluster::builder()
        .topic("t", 1)
        .without_api(ApiKey::CREATE_PARTITIONS)
        .start()
        .await
        .unwrap();
    let e = admin(&cluster)
        .create_partitions(&[("t", 3)], false)
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::UnsupportedVersion);
    assert!(e.to_string().contains("CreatePartitions"), "{e}");
}

#[tokio::test]
async fn describe_cluster_falls_back_to_metadata_and_old_find_coordinator_works() {
    // A broker without DescribeCluster (the mock serves none) and with FindCoordinator
    // only up to v3 (one key per request, answered in the top-level fields).
    let cluster = MockCluster::builder()
        .api_versions(ApiKey::FIND_COORDINATOR, 0, 3)
        .start()
        .await
        .unwrap();
    cluster.capture(ApiKey::FIND_COORDINATOR);
    let admin = admin(&cluster);
    let c = admin.describe_cluster().await.unwrap();
    assert_eq!(c.cluster_id.as_deref(), Some("kafkapipe-mock"));
    assert_eq!(c.controller_id, 1);
    assert_eq!(c.brokers.len(), 1);
    assert_eq!(c.brokers[0].addr(), cluster.bootstrap()[0]);
    assert_eq!(admin.find_coordinator("g").await.unwrap(), 1);
    let finds = cluster.captured_versions::<FindCoordinatorRequest>();
    let versions: Vec<i16> = finds.iter().map(|(_, v, _)| *v).collect();
    assert_eq!(versions, vec![3]);
    assert_eq!(finds[0].2.key, "g");
    let v = admin.api_versions().await.unwrap();
    let ranges = v[0].1.as_ref().unwrap();
    assert!(!ranges.iter().any(|r| r.api_key == ApiKey::DESCRIBE_CLUSTER));
}

#[tokio::test]
async fn group_calls_are_batched_per_coordinator_with_per_group_results() {
    let cluster = MockCluster::builder().topic("t", 1).start().await.unwrap();
    let admin = admin(&cluster);
    for g in ["a", "b", "idle"] {
        admin
            .commit_group_offsets(g, &[(TopicPartition::new("t", 0), 0)])
            .await
            .unwrap();
    }
    cluster.capture(ApiKey::DESCRIBE_GROUPS);
    // GroupAuthorizationFailed for one of them.
    cluster.fault_group(
        ApiKey::DESCRIBE_GROUPS,
        "secret",
        ErrorCode::GroupAuthorizationFailed,
        1,
    );
    let r = admin.describe_groups(&["a", "secret", "b"]).await.unwrap();
    let requests: Vec<Vec<String>> = cluster
        .captured::<DescribeGroupsRequest>()
        .into_iter()
        .map(|r| r.groups)
        .collect();
    assert_eq!(
        requests,
        vec![vec!["a".to_string(), "secret".into(), "b".into()]]
    );
    assert_eq!(r[0].1.as_ref().unwrap().group_id, "a");
    assert_eq!(r[0].1.as_ref().unwrap().state, "Empty");
    assert_eq!(
        r[1].1.as_ref().unwrap_err().kafka_code(),
        Some(ErrorCode::GroupAuthorizationFailed)
    );
    assert_eq!(r[2].0, "b");
    // NonEmptyGroup for one of them.
    cluster.fault_group(ApiKey::DELETE_GROUPS, "busy", ErrorCode::NonEmptyGroup, 1);
    let d = admin.delete_groups(&["busy", "idle"]).await.unwrap();
    assert_eq!(
        d[0].1.as_ref().unwrap_err().kafka_code(),
        Some(ErrorCode::NonEmptyGroup)
    );
    assert!(d[1].1.is_ok(), "{d:?}");
    let gone = admin.delete_groups(&["idle"]).await.unwrap();
    assert_eq!(
        gone[0].1.as_ref().unwrap_err().kafka_code(),
        Some(ErrorCode::GroupIdNotFound)
    );
}

#[tokio::test]
async fn stable_offset_fetch_sends_require_stable_and_retries_unstable_partitions() {
    let cluster = MockCluster::builder().topic("t", 2).start().await.unwrap();
    let admin = admin(&cluster);
    let committed = [
        (TopicPartition::new("t", 0), 5),
        (TopicPartition::new("t", 1), 7),
    ];
    admin.commit_group_offsets("g", &committed).await.unwrap();
    cluster.capture(ApiKey::OFFSET_FETCH);
    // A transaction still committing offsets of partition 1, for two answers.
    cluster.fault_partition(
        ApiKey::OFFSET_FETCH,
        "t",
        1,
        ErrorCode::UnstableOffsetCommit,
        2,
    );
    let stable = OffsetFetchOptions::new().require_stable(true);
    let r = admin
        .fetch_group_offsets_with("g", Some(&["t"]), &stable)
        .await
        .unwrap();
    let offsets: Vec<(i32, i64)> = r
        .into_iter()
        .map(|(tp, r)| (tp.partition, r.unwrap().offset))
        .collect();
    assert_eq!(offsets, [(0, 5), (1, 7)]);
    let sent = cluster.captured::<OffsetFetchRequest>();
    assert_eq!(sent.len(), 3, "asked again while unstable");
    assert!(sent.iter().all(|r| r.require_stable));

    // The default read is not stable; unstable past the retries is the partition's error.
    cluster.fault_partition(
        ApiKey::OFFSET_FETCH,
        "t",
        1,
        ErrorCode::UnstableOffsetCommit,
        u32::MAX,
    );
    let r = admin.fetch_group_offsets("g", Some(&["t"])).await.unwrap();
    assert_eq!(r[0].1.as_ref().unwrap().offset, 5);
    let e = r[1].1.as_ref().unwrap_err();
    assert_eq!(e.kafka_code(), Some(ErrorCode::UnstableOffsetCommit));
    let sent = cluster.captured::<OffsetFetchRequest>();
    assert_eq!(sent.len(), 3 + 4, "4 attempts");
    assert!(sent[3..].iter().all(|r| !r.require_stable));
}

/// A coordinator still loading its groups (`COORDINATOR_LOAD_IN_PROGRESS`, e.g. a fresh
/// broker loading `__consumer_offsets`) is waited for within the admin's timeout, as
/// Java's admin does, not given up after the retry attempts (4 here).
#[tokio::test]
async fn a_loading_coordinator_is_waited_for_beyond_the_attempts() {
    let cluster = MockCluster::builder().topic("t", 1).start().await.unwrap();
    admin(&cluster)
        .commit_group_offsets("g", &[(TopicPartition::new("t", 0), 0)])
        .await
        .unwrap();
    let describes = cluster.requests(ApiKey::DESCRIBE_GROUPS);
    cluster.fault_group(
        ApiKey::DESCRIBE_GROUPS,
        "g",
        ErrorCode::CoordinatorLoadInProgress,
        8,
    );
    let r = admin(&cluster).describe_groups(&["g"]).await.unwrap();
    assert_eq!(r[0].1.as_ref().unwrap().state, "Empty");
    assert_eq!(cluster.requests(ApiKey::DESCRIBE_GROUPS) - describes, 9);
}
