//! Real-broker tests of `Cluster` (metadata cache, per-broker connections) against
//! Apache Kafka.
//!
//! `Cluster` caches what Metadata answers and does not wait for topics to appear, so the
//! tests wait until a topic they created is served before looking it up: Kafka creates
//! topics through the controller and the broker's metadata catches up asynchronously.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use kafkapipe::cluster::Cluster;
use kafkapipe::conn::{Conn, ConnectionConfig};
use kafkapipe::protocol::ErrorCode;

fn cluster() -> Cluster {
    Cluster::new([common::shared().addr.clone()], ConnectionConfig::default()).unwrap()
}

#[tokio::test]
async fn partitions_leaders_and_connections() {
    let broker = common::shared();
    let topic = common::unique_topic("cluster-meta");
    let admin = Conn::connect(&broker.addr).await.unwrap();
    admin.create_topic(&topic, 3, 1).await.unwrap();
    common::wait_for_topic(&admin, &topic, 3).await;

    let c = cluster();
    assert_eq!(c.partitions(&topic).await.unwrap(), vec![0, 1, 2]);
    let leader = c.leader_for(&topic, 1).await.unwrap();
    assert_eq!(c.cached_leader(&topic, 1), Some(leader));
    assert_eq!(c.broker_addr(leader).as_deref(), Some(broker.addr.as_str()));

    let a = c.connection(leader).await.unwrap();
    let b = c.connection(leader).await.unwrap();
    assert_eq!(a.broker(), broker.addr);
    // Same connection reused while it is open...
    a.close().await;
    assert!(b.is_closed());
    // ...and replaced once closed.
    let fresh = c.connection(leader).await.unwrap();
    assert!(!fresh.is_closed());

    let e = c.leader_for(&topic, 7).await.unwrap_err();
    assert_eq!(e.kafka_code(), Some(ErrorCode::UnknownTopicOrPartition));
    c.close().await;
    assert!(fresh.is_closed());
}

#[tokio::test]
async fn unknown_topic_then_created_is_found_after_invalidate() {
    let broker = common::shared();
    let topic = common::unique_topic("cluster-late");
    let c = cluster();
    let e = c.partitions(&topic).await.unwrap_err();
    assert_eq!(
        e.kafka_code(),
        Some(ErrorCode::UnknownTopicOrPartition),
        "{e}"
    );
    assert_eq!(e.topic(), Some(topic.as_str()));

    let admin = Conn::connect(&broker.addr).await.unwrap();
    admin.create_topic(&topic, 2, 1).await.unwrap();
    common::wait_for_topic(&admin, &topic, 2).await;
    c.invalidate(&topic);
    assert_eq!(c.partitions(&topic).await.unwrap(), vec![0, 1]);
    // A known topic is served from the cache until invalidated.
    let res = admin.delete_topics(&[topic.as_str()]).await.unwrap();
    assert!(res[0].1.is_ok(), "{res:?}");
    assert_eq!(c.partitions(&topic).await.unwrap(), vec![0, 1]);
}

#[tokio::test]
async fn concurrent_lookups_share_one_refresh() {
    let broker = common::shared();
    let topic = common::unique_topic("cluster-conc");
    let admin = Conn::connect(&broker.addr).await.unwrap();
    admin.create_topic(&topic, 4, 1).await.unwrap();
    common::wait_for_topic(&admin, &topic, 4).await;
    let c = cluster();
    let lookups = (0..16).map(|_| {
        let c = c.clone();
        let t = topic.clone();
        tokio::spawn(async move { c.partitions(&t).await })
    });
    for r in futures::future::join_all(lookups).await {
        assert_eq!(r.unwrap().unwrap().len(), 4);
    }
}
