use super::*;
use crate::conn::{Broker, PartitionInfo, TopicInfo};

fn md(leader_of_1: i32, topic_error: Option<ErrorCode>) -> Metadata {
    let part = |id: i32, leader: i32| PartitionInfo {
        id,
        leader,
        leader_epoch: 0,
        replicas: vec![leader],
        isr: vec![leader],
        error: None,
    };
    Metadata {
        cluster_id: None,
        controller_id: 1,
        brokers: vec![
            Broker {
                id: 1,
                host: "h1".into(),
                port: 9092,
                rack: None,
            },
            Broker {
                id: 2,
                host: "h2".into(),
                port: 9093,
                rack: None,
            },
        ],
        topics: vec![TopicInfo {
            name: "t".into(),
            id: [0; 16],
            internal: false,
            partitions: vec![part(0, 1), part(1, leader_of_1), part(2, 2)],
            error: topic_error,
        }],
    }
}

fn cluster() -> Cluster {
    Cluster::new(["127.0.0.1:1"], ConnectionConfig::default()).unwrap()
}

#[test]
fn empty_bootstrap_is_a_config_error() {
    let e = Cluster::new(Vec::<String>::new(), ConnectionConfig::default()).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Config);
}

#[test]
fn stores_brokers_and_leaders() {
    let c = cluster();
    c.store(&["t"], md(2, None));
    assert_eq!(c.broker_addr(1).as_deref(), Some("h1:9092"));
    assert_eq!(c.broker_addr(2).as_deref(), Some("h2:9093"));
    assert_eq!(c.broker_addr(3), None);
    assert_eq!(c.cached_leader("t", 0), Some(1));
    assert_eq!(c.cached_leader("t", 1), Some(2));
    assert_eq!(c.cached_leader("t", 9), None);
    let t = c.cached_topic("t", Instant::now()).unwrap().unwrap();
    assert_eq!(t.partition_ids(), vec![0, 1, 2]);
}

#[test]
fn invalidate_forces_a_refresh() {
    let c = cluster();
    c.store(&["t"], md(2, None));
    c.invalidate("t");
    assert!(c.cached_topic("t", Instant::now()).is_none());
    assert_eq!(c.cached_leader("t", 0), None);
    c.store(&["t"], md(1, None));
    assert_eq!(c.cached_leader("t", 1), Some(1));
}

#[test]
fn leaderless_partition_has_no_leader() {
    let c = cluster();
    c.store(&["t"], md(-1, None));
    assert_eq!(c.cached_leader("t", 1), None);
}

#[test]
fn metadata_expires_after_max_age() {
    let c = cluster().with_metadata_max_age(Duration::from_secs(1));
    c.store(&["t"], md(2, None));
    let later = Instant::now() + Duration::from_secs(2);
    assert!(c.cached_topic("t", later).is_none());
}

#[test]
fn topic_errors_are_cached_only_for_the_backoff() {
    let c = cluster().with_refresh_backoff(Duration::from_millis(100));
    c.store(
        &["t", "missing"],
        md(2, Some(ErrorCode::LeaderNotAvailable)),
    );
    let e = c.cached_topic("t", Instant::now()).unwrap().unwrap_err();
    assert_eq!(e.kafka_code(), Some(ErrorCode::LeaderNotAvailable));
    assert_eq!(e.topic(), Some("t"));
    let e = c
        .cached_topic("missing", Instant::now())
        .unwrap()
        .unwrap_err();
    assert_eq!(e.kafka_code(), Some(ErrorCode::UnknownTopicOrPartition));
    let later = Instant::now() + Duration::from_millis(200);
    assert!(c.cached_topic("t", later).is_none());
}

#[tokio::test]
async fn unreachable_bootstrap_fails_with_the_connect_error() {
    let config = ConnectionConfig {
        connect_timeout: Duration::from_millis(200),
        ..ConnectionConfig::default()
    };
    let c = Cluster::new(["127.0.0.1:1"], config).unwrap();
    let e = c.partitions("t").await.unwrap_err();
    assert!(e.is_retriable(), "{e}");
    assert_eq!(e.broker(), Some("127.0.0.1:1"));
}
