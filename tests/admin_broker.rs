//! Real-broker tests of the `Admin` client against Apache Kafka (the shared single-node
//! broker of `tests/common`).
//!
//! Kafka applies topic and config changes through the controller and the brokers' metadata
//! caches catch up asynchronously, so a test that uses what it just created waits for it
//! ([`ready`], [`wait_config`]) instead of assuming the change is visible at once.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use kafkapipe::admin::{Admin, AlterConfigOp, ConfigResource, OffsetSpec, TopicPartition};
use kafkapipe::conn::{Conn, NewTopic, ProduceOptions};
use kafkapipe::protocol::{ApiKey, ErrorCode};
use kafkapipe::record::Record;

/// An admin client whose retries (about 5 s in all) outlast the loading of
/// `__consumer_offsets` partitions, which the first group request of the binary starts
/// (COORDINATOR_NOT_AVAILABLE, then COORDINATOR_LOAD_IN_PROGRESS until loaded).
fn admin() -> Admin {
    Admin::connect([common::shared().addr.clone()])
        .unwrap()
        .with_retries(10, Duration::from_millis(50))
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// Produce `n` single-record batches to `topic`/`partition`, `timestamp` each.
async fn produce(conn: &Conn, topic: &str, partition: i32, n: usize, timestamp: i64) {
    for i in 0..n {
        let mut r = Record::new(format!("k{i}"), format!("v{i}"));
        r.timestamp = timestamp;
        conn.produce(topic, partition, &[r], &ProduceOptions::default())
            .await
            .unwrap();
    }
}

/// Waits until the broker's metadata shows `topic` with `partitions` partitions, each led.
async fn ready(topic: &str, partitions: i32) {
    let conn = Conn::connect(&common::shared().addr).await.unwrap();
    common::wait_for_topic(&conn, topic, partitions).await;
    conn.close().await;
}

/// Creates `topic` through the Admin client and waits until it is usable.
async fn create(admin: &Admin, topic: &str, partitions: i32) {
    admin
        .create_topics(&[NewTopic::new(topic, partitions)], false)
        .await
        .unwrap()[0]
        .1
        .clone()
        .unwrap();
    ready(topic, partitions).await;
}

/// The value of config `name` of `resource` as described now.
async fn config_value(admin: &Admin, resource: &ConfigResource, name: &str) -> Option<String> {
    let described = admin
        .describe_configs(std::slice::from_ref(resource), Some(&[name]))
        .await
        .unwrap();
    let entries = described[0].1.as_ref().unwrap();
    assert!(entries.iter().all(|e| e.name == name), "{entries:?}");
    entries
        .iter()
        .find(|e| e.name == name)
        .unwrap_or_else(|| panic!("{name} not described: {entries:?}"))
        .value
        .clone()
}

/// Waits (10 s at most) until `name` of `resource` is described as `want`: the broker
/// serves DescribeConfigs from its metadata cache, which applies an alteration shortly
/// after the controller accepted it.
async fn wait_config(admin: &Admin, resource: &ConfigResource, name: &str, want: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let got = config_value(admin, resource, name).await;
        if got.as_deref() == Some(want) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{name} of {resource:?} is {got:?}, expected {want}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits (10 s at most) until `list_topics` shows none of `names`.
async fn wait_topics_gone(admin: &Admin, names: &[&str]) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let listed = admin.list_topics().await.unwrap();
        if !listed.iter().any(|t| names.contains(&t.name.as_str())) {
            return;
        }
        assert!(Instant::now() < deadline, "{names:?} still listed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn topics_create_list_describe_delete() {
    let admin = admin();
    let a = common::unique_topic("admin-a");
    let b = common::unique_topic("admin-b");

    let created = admin
        .create_topics(
            &[
                NewTopic::new(&a, 3).config("retention.ms", "3600000"),
                NewTopic::new(&b, 1).replication_factor(1),
            ],
            false,
        )
        .await
        .unwrap();
    assert_eq!(created.len(), 2);
    for (name, r) in &created {
        assert!(r.is_ok(), "{name}: {r:?}");
    }

    // One failing topic does not fail the other.
    let c = common::unique_topic("admin-c");
    let again = admin
        .create_topics(&[NewTopic::new(&a, 3), NewTopic::new(&c, 2)], false)
        .await
        .unwrap();
    let e = again[0].1.as_ref().unwrap_err();
    assert_eq!(e.kafka_code(), Some(ErrorCode::TopicAlreadyExists), "{e}");
    assert_eq!(e.topic(), Some(a.as_str()));
    assert!(again[1].1.is_ok(), "{:?}", again[1]);

    // validate-only: the broker checks the request and creates nothing. A bad request
    // is refused just as it would be without the flag.
    let v = common::unique_topic("admin-validate");
    let validated = admin
        .create_topics(
            &[
                NewTopic::new(&v, 2),
                NewTopic::new(&a, 1),
                NewTopic::new(common::unique_topic("admin-validate-bad"), 1)
                    .config("retention.ms", "not-a-number"),
            ],
            true,
        )
        .await
        .unwrap();
    assert!(validated[0].1.is_ok(), "{validated:?}");
    let e = validated[1].1.as_ref().unwrap_err();
    assert_eq!(e.kafka_code(), Some(ErrorCode::TopicAlreadyExists), "{e}");
    let e = validated[2].1.as_ref().unwrap_err();
    assert_eq!(e.kafka_code(), Some(ErrorCode::InvalidConfig), "{e}");

    for (name, partitions) in [(&a, 3), (&b, 1), (&c, 2)] {
        ready(name, partitions).await;
    }
    // Everything created before the validate-only request is visible by now, so v would
    // be too had it been created.
    let e = admin
        .describe_topics(&[&v])
        .await
        .unwrap()
        .remove(0)
        .1
        .unwrap_err();
    assert_eq!(
        e.kafka_code(),
        Some(ErrorCode::UnknownTopicOrPartition),
        "{e}"
    );

    let listed = admin.list_topics().await.unwrap();
    let la = listed.iter().find(|t| t.name == a).expect("listed");
    assert_eq!(la.partitions, 3);
    assert!(!la.internal);
    assert!(listed.iter().any(|t| t.name == c));

    let missing = common::unique_topic("admin-missing");
    let described = admin.describe_topics(&[&a, &missing]).await.unwrap();
    let da = described[0].1.as_ref().unwrap();
    assert_eq!(da.partitions.len(), 3);
    let broker = admin.describe_cluster().await.unwrap().brokers[0].id;
    for p in &da.partitions {
        assert_eq!(p.leader, broker);
        assert_eq!(p.replicas, vec![broker]);
        assert_eq!(p.isr, vec![broker]);
    }
    let e = described[1].1.as_ref().unwrap_err();
    assert_eq!(e.kafka_code(), Some(ErrorCode::UnknownTopicOrPartition));

    let deleted = admin.delete_topics(&[&a, &b, &c]).await.unwrap();
    assert!(deleted.iter().all(|(_, r)| r.is_ok()), "{deleted:?}");
    wait_topics_gone(&admin, &[&a, &b, &c]).await;
    let e = admin
        .delete_topics(&[&a])
        .await
        .unwrap()
        .remove(0)
        .1
        .unwrap_err();
    assert_eq!(
        e.kafka_code(),
        Some(ErrorCode::UnknownTopicOrPartition),
        "{e}"
    );
}

#[tokio::test]
async fn create_partitions_grows_a_topic() {
    let admin = admin();
    let topic = common::unique_topic("admin-partitions");
    create(&admin, &topic, 1).await;

    // validate-only changes nothing; shrinking is refused.
    let r = admin.create_partitions(&[(&topic, 3)], true).await.unwrap();
    assert!(r[0].1.is_ok(), "{r:?}");
    let r = admin
        .create_partitions(&[(&topic, 1)], false)
        .await
        .unwrap();
    let e = r[0].1.as_ref().unwrap_err();
    assert_eq!(e.kafka_code(), Some(ErrorCode::InvalidPartitions), "{e}");
    assert_eq!(e.topic(), Some(topic.as_str()));

    let r = admin
        .create_partitions(&[(&topic, 3)], false)
        .await
        .unwrap();
    assert!(r[0].1.is_ok(), "{r:?}");
    ready(&topic, 3).await;
    let described = admin.describe_topics(&[&topic]).await.unwrap();
    assert_eq!(described[0].1.as_ref().unwrap().partitions.len(), 3);
    // The earlier validate-only request did not add partitions beyond the 3 asked now.
    let r = admin
        .create_partitions(&[(&topic, 3)], false)
        .await
        .unwrap();
    let e = r[0].1.as_ref().unwrap_err();
    assert_eq!(e.kafka_code(), Some(ErrorCode::InvalidPartitions), "{e}");

    let missing = common::unique_topic("admin-partitions-missing");
    let r = admin
        .create_partitions(&[(&missing, 2)], false)
        .await
        .unwrap();
    let e = r[0].1.as_ref().unwrap_err();
    assert_eq!(
        e.kafka_code(),
        Some(ErrorCode::UnknownTopicOrPartition),
        "{e}"
    );
}

#[tokio::test]
async fn legacy_alter_configs_replaces_the_set() {
    let admin = admin();
    let topic = common::unique_topic("admin-alter");
    admin
        .create_topics(
            &[NewTopic::new(&topic, 1).config("retention.ms", "3600000")],
            false,
        )
        .await
        .unwrap()[0]
        .1
        .clone()
        .unwrap();
    ready(&topic, 1).await;
    let resource = ConfigResource::topic(&topic);
    wait_config(&admin, &resource, "retention.ms", "3600000").await;

    // AlterConfigs replaces every explicitly set config: retention.ms goes back to the
    // broker default because it is not listed.
    let r = admin
        .alter_configs(
            &[(
                resource.clone(),
                vec![("cleanup.policy".into(), "compact".into())],
            )],
            false,
        )
        .await
        .unwrap();
    assert!(r[0].1.is_ok(), "{r:?}");
    wait_config(&admin, &resource, "cleanup.policy", "compact").await;
    wait_config(&admin, &resource, "retention.ms", "604800000").await;

    let r = admin
        .alter_configs(
            &[(
                resource.clone(),
                vec![("retention.ms".into(), "not-a-number".into())],
            )],
            false,
        )
        .await
        .unwrap();
    let e = r[0].1.as_ref().unwrap_err();
    assert_eq!(e.kafka_code(), Some(ErrorCode::InvalidConfig), "{e}");
}

#[tokio::test]
async fn delete_group_offsets_of_an_empty_group() {
    let admin = admin();
    let topic = common::unique_topic("admin-offdel");
    create(&admin, &topic, 2).await;
    let group = common::unique_topic("admin-offdel-group");
    let tp0 = TopicPartition::new(&topic, 0);
    let tp1 = TopicPartition::new(&topic, 1);

    let missing = common::unique_topic("admin-offdel-missing");
    let e = admin
        .delete_group_offsets(&missing, std::slice::from_ref(&tp0))
        .await
        .unwrap_err();
    assert_eq!(e.kafka_code(), Some(ErrorCode::GroupIdNotFound), "{e}");

    let committed = admin
        .commit_group_offsets(&group, &[(tp0.clone(), 5), (tp1.clone(), 7)])
        .await
        .unwrap();
    assert!(committed.iter().all(|(_, r)| r.is_ok()), "{committed:?}");
    let deleted = admin
        .delete_group_offsets(&group, std::slice::from_ref(&tp0))
        .await
        .unwrap();
    assert_eq!(deleted.len(), 1);
    assert!(deleted[0].1.is_ok(), "{deleted:?}");

    let fetched = admin
        .fetch_group_offsets(&group, Some(&[&topic]))
        .await
        .unwrap();
    let offsets: Vec<(TopicPartition, i64)> = fetched
        .iter()
        .map(|(tp, r)| (tp.clone(), r.as_ref().unwrap().offset))
        .collect();
    assert_eq!(offsets, vec![(tp0, -1), (tp1, 7)]);
}

#[tokio::test]
async fn configs_describe_and_incremental_alter() {
    let admin = admin();
    let topic = common::unique_topic("admin-cfg");
    create(&admin, &topic, 1).await;
    let resource = ConfigResource::topic(&topic);

    let altered = admin
        .incremental_alter_configs(
            &[(
                resource.clone(),
                vec![AlterConfigOp::Set("retention.ms".into(), "7200000".into())],
            )],
            false,
        )
        .await
        .unwrap();
    assert!(altered[0].1.is_ok(), "{altered:?}");
    wait_config(&admin, &resource, "retention.ms", "7200000").await;

    // Delete goes back to the default; validate-only changes nothing.
    let altered = admin
        .incremental_alter_configs(
            &[(
                resource.clone(),
                vec![AlterConfigOp::Set("segment.ms".into(), "3600000".into())],
            )],
            true,
        )
        .await
        .unwrap();
    assert!(altered[0].1.is_ok(), "{altered:?}");
    let altered = admin
        .incremental_alter_configs(
            &[(
                resource.clone(),
                vec![AlterConfigOp::Delete("retention.ms".into())],
            )],
            false,
        )
        .await
        .unwrap();
    assert!(altered[0].1.is_ok(), "{altered:?}");
    wait_config(&admin, &resource, "retention.ms", "604800000").await;
    assert_eq!(
        config_value(&admin, &resource, "segment.ms")
            .await
            .as_deref(),
        Some("604800000")
    );

    // Broker configs go to that broker.
    let broker = admin.describe_cluster().await.unwrap().brokers[0].id;
    let r = admin
        .describe_configs(&[ConfigResource::broker(broker), resource], None)
        .await
        .unwrap();
    assert_eq!(r.len(), 2);
    assert!(r.iter().all(|(_, r)| r.is_ok()), "{r:?}");
}

#[tokio::test]
async fn list_offsets_grouped_per_leader() {
    let admin = admin();
    let topic = common::unique_topic("admin-offsets");
    create(&admin, &topic, 3).await;
    let conn = Conn::connect(&common::shared().addr).await.unwrap();
    let t0 = now_ms() - 60_000;
    produce(&conn, &topic, 0, 3, t0).await;
    produce(&conn, &topic, 1, 1, t0 + 1000).await;
    produce(&conn, &topic, 0, 2, t0 + 2000).await;

    let mut specs = Vec::new();
    for p in 0..3 {
        specs.push((TopicPartition::new(&topic, p), OffsetSpec::Earliest));
        specs.push((TopicPartition::new(&topic, p), OffsetSpec::Latest));
    }
    specs.push((
        TopicPartition::new(&topic, 0),
        OffsetSpec::Timestamp(t0 + 1500),
    ));
    specs.push((TopicPartition::new(&topic, 2), OffsetSpec::Offset(7)));
    specs.push((TopicPartition::new(&topic, 9), OffsetSpec::Latest));
    let got = admin.list_offsets(&specs).await.unwrap();
    assert_eq!(got.len(), specs.len());
    let offset = |i: usize| {
        assert_eq!(got[i].0, specs[i].0);
        got[i].1.as_ref().unwrap().offset
    };
    // Latest is the high-water mark.
    assert_eq!(
        (0..6).map(offset).collect::<Vec<_>>(),
        vec![0, 5, 0, 1, 0, 0]
    );
    // The first record at or after the timestamp.
    assert_eq!(offset(6), 3);
    assert_eq!(got[6].1.as_ref().unwrap().timestamp, t0 + 2000);
    assert_eq!(offset(7), 7);
    let e = got[8].1.as_ref().unwrap_err();
    assert_eq!(
        e.kafka_code(),
        Some(ErrorCode::UnknownTopicOrPartition),
        "{e}"
    );
}

#[tokio::test]
async fn delete_records_reports_per_partition() {
    let admin = admin();
    let topic = common::unique_topic("admin-delrec");
    create(&admin, &topic, 1).await;
    let conn = Conn::connect(&common::shared().addr).await.unwrap();
    produce(&conn, &topic, 0, 4, -1).await;
    let tp = TopicPartition::new(&topic, 0);
    let r = admin.delete_records(&[(tp.clone(), 2)]).await.unwrap();
    // The new log start offset.
    assert_eq!(*r[0].1.as_ref().unwrap(), 2);
    let earliest = admin
        .list_offsets(&[(tp.clone(), OffsetSpec::Earliest)])
        .await
        .unwrap();
    assert_eq!(earliest[0].1.as_ref().unwrap().offset, 2);
    // Beyond the high-water mark is out of range.
    let r = admin.delete_records(&[(tp, 9)]).await.unwrap();
    let e = r[0].1.as_ref().unwrap_err();
    assert_eq!(e.kafka_code(), Some(ErrorCode::OffsetOutOfRange), "{e}");
}

#[tokio::test]
async fn group_offsets_commit_fetch_reset_and_delete_group() {
    let admin = admin();
    let topic = common::unique_topic("admin-grp-topic");
    let group = common::unique_topic("admin-grp");
    create(&admin, &topic, 2).await;
    let conn = Conn::connect(&common::shared().addr).await.unwrap();
    let t0 = now_ms() - 60_000;
    produce(&conn, &topic, 0, 4, t0).await;
    produce(&conn, &topic, 1, 2, t0).await;

    let coordinator = admin.find_coordinator(&group).await.unwrap();
    let cluster = admin.describe_cluster().await.unwrap();
    assert!(cluster.brokers.iter().any(|b| b.id == coordinator));

    let tp0 = TopicPartition::new(&topic, 0);
    let tp1 = TopicPartition::new(&topic, 1);
    let committed = admin
        .commit_group_offsets(&group, &[(tp0.clone(), 3), (tp1.clone(), 1)])
        .await
        .unwrap();
    assert!(committed.iter().all(|(_, r)| r.is_ok()), "{committed:?}");

    let fetched = admin
        .fetch_group_offsets(&group, Some(&[&topic]))
        .await
        .unwrap();
    let offsets: Vec<(TopicPartition, i64)> = fetched
        .iter()
        .map(|(tp, r)| (tp.clone(), r.as_ref().unwrap().offset))
        .collect();
    assert_eq!(offsets, vec![(tp0.clone(), 3), (tp1.clone(), 1)]);
    let all = admin.fetch_group_offsets(&group, None).await.unwrap();
    assert_eq!(all.len(), 2, "{all:?}");

    let groups = admin.list_groups().await.unwrap();
    assert!(groups.iter().any(|g| g.group_id == group), "{groups:?}");
    let described = admin.describe_groups(&[&group]).await.unwrap();
    let d = described[0].1.as_ref().unwrap();
    assert_eq!(d.group_id, group);
    assert_eq!(d.state, "Empty");
    assert!(d.members.is_empty());
    assert_eq!(d.coordinator, coordinator);

    let reset = admin
        .reset_group_offsets(&group, &topic, OffsetSpec::Earliest)
        .await
        .unwrap();
    assert_eq!(
        reset
            .iter()
            .map(|(_, r)| *r.as_ref().unwrap())
            .collect::<Vec<_>>(),
        vec![0, 0]
    );
    let reset = admin
        .reset_group_offsets(&group, &topic, OffsetSpec::Latest)
        .await
        .unwrap();
    assert_eq!(
        reset
            .iter()
            .map(|(_, r)| *r.as_ref().unwrap())
            .collect::<Vec<_>>(),
        vec![4, 2]
    );
    let reset = admin
        .reset_group_offsets(&group, &topic, OffsetSpec::Offset(1))
        .await
        .unwrap();
    assert!(reset.iter().all(|(_, r)| *r.as_ref().unwrap() == 1));
    // Every record is older than this: the broker finds none, so the reset goes to the end.
    let reset = admin
        .reset_group_offsets(&group, &topic, OffsetSpec::Timestamp(now_ms() + 60_000))
        .await
        .unwrap();
    let got: Vec<i64> = reset.iter().map(|(_, r)| *r.as_ref().unwrap()).collect();
    assert_eq!(got, vec![4, 2]);
    // Every record is at or after this one: the reset goes to the start.
    let reset = admin
        .reset_group_offsets(&group, &topic, OffsetSpec::Timestamp(t0 - 1000))
        .await
        .unwrap();
    let start: Vec<i64> = reset.iter().map(|(_, r)| *r.as_ref().unwrap()).collect();
    assert_eq!(start, vec![0, 0]);
    let reset = admin
        .reset_group_offsets(&group, &topic, OffsetSpec::Timestamp(now_ms() + 60_000))
        .await
        .unwrap();
    assert_eq!(reset.len(), 2);
    let fetched = admin
        .fetch_group_offsets(&group, Some(&[&topic]))
        .await
        .unwrap();
    assert_eq!(
        fetched
            .iter()
            .map(|(_, r)| r.as_ref().unwrap().offset)
            .collect::<Vec<_>>(),
        got
    );

    let deleted = admin.delete_groups(&[&group]).await.unwrap();
    assert!(deleted[0].1.is_ok(), "{deleted:?}");
    let groups = admin.list_groups().await.unwrap();
    assert!(!groups.iter().any(|g| g.group_id == group), "{groups:?}");
}

#[tokio::test]
async fn describe_cluster_and_api_versions() {
    let admin = admin();
    let broker = common::shared();
    let c = admin.describe_cluster().await.unwrap();
    assert!(c.cluster_id.as_deref().is_some_and(|id| !id.is_empty()));
    assert_eq!(c.brokers.len(), 1);
    assert_eq!(c.brokers[0].addr(), broker.addr);
    assert!(c.controller_id >= 0);

    let versions = admin.api_versions().await.unwrap();
    assert_eq!(versions.len(), 1);
    let ranges = versions[0].1.as_ref().unwrap();
    assert!(ranges.iter().any(|r| r.api_key == ApiKey::FETCH));
    assert!(ranges.iter().any(|r| r.api_key == ApiKey::DESCRIBE_CLUSTER));
}

/// Join a classic consumer group by hand (JoinGroup v1 + SyncGroup v0 over raw frames;
/// the membership APIs are not part of this crate yet) and check that DescribeGroups
/// shows the member (with its subscription and assignment decoded, where the broker
/// returns them).
#[tokio::test]
async fn describe_group_with_a_joined_member() {
    use bytes::{BufMut, Bytes, BytesMut};
    use kafkapipe::protocol::consumer_protocol::{Assignment, Subscription, TopicPartitions};
    use kafkapipe::protocol::primitives::{get_array, get_bytes, get_i16, get_i32, get_string};

    let broker = common::shared();
    let admin = admin();
    let group = common::unique_topic("admin-members");
    let topic = common::unique_topic("admin-members-topic");
    let subscription = Subscription {
        version: 1,
        topics: vec![topic.clone()],
        user_data: Some(Bytes::from_static(b"ud")),
        owned_partitions: vec![],
        ..Subscription::default()
    };
    let assignment = Assignment {
        version: 0,
        partitions: vec![TopicPartitions {
            topic: topic.clone(),
            partitions: vec![0, 1],
        }],
        user_data: None,
    };
    let str16 = |b: &mut BytesMut, s: &str| {
        b.put_i16(s.len() as i16);
        b.put_slice(s.as_bytes());
    };
    let bytes32 = |b: &mut BytesMut, d: &[u8]| {
        b.put_i32(d.len() as i32);
        b.put_slice(d);
    };

    // The coordinator (this broker: it is the only one) answers FindCoordinator before it
    // has loaded the group's partition of __consumer_offsets (created on first use); until
    // then JoinGroup gets NOT_COORDINATOR (16), COORDINATOR_NOT_AVAILABLE (15) or
    // COORDINATOR_LOAD_IN_PROGRESS (14), so the raw request is repeated while it does.
    assert_eq!(
        admin.find_coordinator(&group).await.unwrap(),
        admin.describe_cluster().await.unwrap().brokers[0].id
    );
    // JoinGroup v1 is answered directly (MEMBER_ID_REQUIRED only from v4).
    let mut join = BytesMut::new();
    str16(&mut join, &group);
    join.put_i32(6_000); // session timeout
    join.put_i32(500); // rebalance timeout (v1)
    str16(&mut join, "");
    str16(&mut join, "consumer");
    join.put_i32(1);
    str16(&mut join, "range");
    bytes32(&mut join, &subscription.encode(1).unwrap());
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let mut r = loop {
        let addr = broker.addr.clone();
        let body = join.clone();
        let resp = tokio::task::spawn_blocking(move || {
            common::raw_request(&addr, 11, 1, &body, Duration::from_secs(10))
        })
        .await
        .unwrap()
        .unwrap();
        let r = Bytes::from(resp).slice(4..);
        let code = i16::from_be_bytes([r[0], r[1]]);
        if matches!(code, 14..=16) && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        }
        break r;
    };
    assert_eq!(get_i16(&mut r).unwrap(), 0, "JoinGroup error");
    let generation = get_i32(&mut r).unwrap();
    let _protocol = get_string(&mut r, false).unwrap();
    let leader = get_string(&mut r, false).unwrap();
    let member_id = get_string(&mut r, false).unwrap();
    assert_eq!(leader, member_id);
    let members = get_array(&mut r, false, 6, |b| {
        Ok((get_string(b, false)?, get_bytes(b, false)?))
    })
    .unwrap();
    assert_eq!(members.len(), 1);

    let mut sync = BytesMut::new();
    str16(&mut sync, &group);
    sync.put_i32(generation);
    str16(&mut sync, &member_id);
    sync.put_i32(1);
    str16(&mut sync, &member_id);
    bytes32(&mut sync, &assignment.encode(0).unwrap());
    let addr = broker.addr.clone();
    let resp = tokio::task::spawn_blocking(move || {
        common::raw_request(&addr, 14, 0, &sync, Duration::from_secs(10))
    })
    .await
    .unwrap()
    .unwrap();
    let mut r = Bytes::from(resp).slice(4..);
    assert_eq!(get_i16(&mut r).unwrap(), 0, "SyncGroup error");

    let described = admin.describe_groups(&[&group]).await.unwrap();
    let d = described[0].1.as_ref().unwrap();
    assert_eq!(d.state, "Stable");
    assert_eq!(d.protocol_type, "consumer");
    assert_eq!(d.members.len(), 1);
    let m = &d.members[0];
    assert_eq!(m.member_id, member_id);
    assert_eq!(d.protocol, "range");
    assert_eq!(m.client_id, "kafkapipe-test");
    assert!(!m.client_host.is_empty(), "{m:?}");
    assert_eq!(m.subscription.as_ref(), Some(&subscription));
    assert_eq!(m.decoded_assignment.as_ref(), Some(&assignment));

    // Listed although it never committed an offset.
    let listed = admin.list_groups().await.unwrap();
    let g = listed
        .iter()
        .find(|g| g.group_id == group)
        .unwrap_or_else(|| panic!("{group} not listed: {listed:?}"));
    assert_eq!(g.protocol_type, "consumer");
    // A group with a member cannot be deleted.
    let deleted = admin.delete_groups(&[&group]).await.unwrap();
    let e = deleted[0].1.as_ref().unwrap_err();
    assert_eq!(e.kafka_code(), Some(ErrorCode::NonEmptyGroup), "{e}");
}

/// Client quotas (KIP-546): set on a client id and on a user + client id pair, described
/// by exact and strict filters, one key removed, validate-only changes nothing, an unknown
/// key is refused per entity. Describe is answered from the broker's metadata, which
/// catches up with the controller asynchronously: it is polled until it shows the change.
#[tokio::test]
async fn client_quotas_set_describe_remove() {
    use kafkapipe::admin::{QuotaEntity, QuotaEntityType, QuotaFilter, QuotaMatch, QuotaOp};
    let admin = admin();
    let id = format!("quota-admin-{}", std::process::id());
    let alone = QuotaEntity::new().client_id(&id);
    let paired = QuotaEntity::new().user("quota-user").client_id(&id);
    let r = admin
        .alter_client_quotas(
            &[
                (
                    alone.clone(),
                    vec![
                        QuotaOp::set("producer_byte_rate", 1024.0),
                        QuotaOp::set("consumer_byte_rate", 2048.0),
                    ],
                ),
                (
                    paired.clone(),
                    vec![QuotaOp::set("request_percentage", 50.0)],
                ),
            ],
            false,
        )
        .await
        .unwrap();
    assert!(r.iter().all(|(_, r)| r.is_ok()), "{r:?}");
    let by_id =
        QuotaFilter::all().component(QuotaEntityType::ClientId, QuotaMatch::Exact(id.clone()));
    let describe = |filter: QuotaFilter, want: usize| {
        let admin = admin.clone();
        async move {
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                let got = admin.describe_client_quotas(&filter).await.unwrap();
                if got.len() == want || Instant::now() > deadline {
                    return got;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    let got = describe(by_id.clone(), 2).await;
    let sorted = |e: &QuotaEntity| {
        let mut e = e.clone();
        e.components.sort();
        e
    };
    assert_eq!(got.len(), 2, "{got:?}");
    let alone_values = &got.iter().find(|(e, _)| *e == sorted(&alone)).unwrap().1;
    assert_eq!(alone_values.get("producer_byte_rate"), Some(&1024.0));
    assert_eq!(alone_values.get("consumer_byte_rate"), Some(&2048.0));
    let paired_values = &got.iter().find(|(e, _)| *e == sorted(&paired)).unwrap().1;
    assert_eq!(paired_values.get("request_percentage"), Some(&50.0));
    // strict: only entities made of a client id alone
    let strict = admin
        .describe_client_quotas(&by_id.clone().strict(true))
        .await
        .unwrap();
    assert_eq!(strict.len(), 1, "{strict:?}");
    assert_eq!(strict[0].0, alone);

    // validate-only changes nothing; an unknown key fails for its entity only
    let r = admin
        .alter_client_quotas(
            &[
                (alone.clone(), vec![QuotaOp::set("producer_byte_rate", 1.0)]),
                (
                    QuotaEntity::new().client_id("x"),
                    vec![QuotaOp::set("no_such_quota", 1.0)],
                ),
            ],
            true,
        )
        .await
        .unwrap();
    assert!(r[0].1.is_ok(), "{r:?}");
    let e = r[1].1.as_ref().unwrap_err();
    assert_eq!(e.kafka_code(), Some(ErrorCode::InvalidRequest), "{e}");

    // remove one key, then the rest
    admin
        .alter_client_quotas(
            &[(alone.clone(), vec![QuotaOp::remove("consumer_byte_rate")])],
            false,
        )
        .await
        .unwrap()[0]
        .1
        .clone()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let got = admin
            .describe_client_quotas(&by_id.clone().strict(true))
            .await
            .unwrap();
        let values = got[0].1.clone();
        if !values.contains_key("consumer_byte_rate") {
            assert_eq!(
                values.get("producer_byte_rate"),
                Some(&1024.0),
                "validate-only changed it"
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "consumer_byte_rate never removed: {got:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    admin
        .alter_client_quotas(
            &[
                (alone, vec![QuotaOp::remove("producer_byte_rate")]),
                (paired, vec![QuotaOp::remove("request_percentage")]),
            ],
            false,
        )
        .await
        .unwrap();
    assert!(describe(by_id, 0).await.is_empty());
}
