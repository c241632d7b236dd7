//! Smoke tests of the real-broker harness (`tests/common`): the Apache Kafka broker starts,
//! answers ApiVersions, creates topics, is killed on drop, and a 3-node cluster survives
//! the SIGKILL and restart of a node.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use common::{
    api_versions, metadata_brokers, raw_request, shared, unique_topic, TestBroker, TestCluster,
};
use kafka_protocol::messages::{ApiVersionsResponse, MetadataRequest, MetadataResponse};
use kafka_protocol::protocol::{Decodable, Encodable};

const TIMEOUT: Duration = Duration::from_secs(5);

/// Topic names listed by a Metadata v1 request for all topics.
fn metadata_topics(addr: &str) -> Vec<(String, usize)> {
    let version = 1;
    let mut body = BytesMut::new();
    MetadataRequest::default()
        .with_topics(None)
        .encode(&mut body, version)
        .unwrap();
    let resp = raw_request(addr, 3, version, &body, TIMEOUT).unwrap();
    // Response header v0 is the correlation id only.
    let mut buf = Bytes::from(resp).split_off(4);
    let md = MetadataResponse::decode(&mut buf, version).unwrap();
    md.topics
        .iter()
        .filter(|t| t.error_code == 0)
        .filter_map(|t| Some((t.name.as_ref()?.0.to_string(), t.partitions.len())))
        .collect()
}

#[test]
fn broker_answers_api_versions() {
    let broker = shared();
    eprintln!("kafka on {} started in {:?}", broker.addr, broker.startup);
    let keys = api_versions(&broker.addr, TIMEOUT).unwrap();
    assert!(!keys.is_empty());
    let produce = keys
        .iter()
        .find(|k| k.api_key == 0)
        .expect("Produce listed");
    let fetch = keys.iter().find(|k| k.api_key == 1).expect("Fetch listed");
    assert!(
        produce.max_version >= 3,
        "Produce v3+ (RecordBatch): {produce:?}"
    );
    assert!(fetch.max_version >= 4, "Fetch v4+: {fetch:?}");
    assert!(keys.iter().any(|k| k.api_key == 18), "ApiVersions listed");

    // Cross-check the hand decoding with kafka-protocol's ApiVersionsResponse v0.
    let resp = raw_request(&broker.addr, 18, 0, &[], TIMEOUT).unwrap();
    let mut buf = Bytes::from(resp).split_off(4);
    let theirs = ApiVersionsResponse::decode(&mut buf, 0).unwrap();
    assert_eq!(theirs.error_code, 0);
    assert_eq!(theirs.api_keys.len(), keys.len());
    for (a, b) in theirs.api_keys.iter().zip(&keys) {
        assert_eq!(
            (a.api_key, a.min_version, a.max_version),
            (b.api_key, b.min_version, b.max_version)
        );
    }
}

#[test]
fn created_topic_is_visible_in_metadata() {
    let broker = shared();
    let topic = unique_topic("smoke");
    let t0 = Instant::now();
    broker.create_topic(&topic, 3);
    let created = t0.elapsed();
    let topics = metadata_topics(&broker.addr);
    eprintln!("topic create took {created:?}; metadata lists {topics:?}");
    assert!(
        topics.contains(&(topic.clone(), 3)),
        "{topic} with 3 partitions not in {topics:?}"
    );
}

#[test]
fn cluster_of_three_survives_a_killed_node() {
    let mut cluster = TestCluster::start(3);
    for n in &cluster.nodes {
        eprintln!(
            "node {} on {} ready in {:?} (rss {} MiB)",
            n.id,
            n.addr,
            n.startup,
            n.rss_mib().unwrap_or(0)
        );
    }
    for addr in cluster.addrs() {
        let mut ids = metadata_brokers(&addr, TIMEOUT).unwrap();
        ids.sort();
        assert_eq!(ids, vec![1, 2, 3], "brokers listed by {addr}");
    }
    let topic = unique_topic("smoke-rf3");
    cluster.create_topic(&topic, 3);

    let t0 = Instant::now();
    cluster.node(2).kill();
    assert!(api_versions(&cluster.node(2).addr.clone(), Duration::from_millis(500)).is_err());
    // The survivors fence node 2 once its session times out.
    let addr1 = cluster.node(1).addr.clone();
    loop {
        let ids = metadata_brokers(&addr1, TIMEOUT).unwrap();
        if !ids.contains(&2) {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "node 2 still listed: {ids:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    eprintln!("node 2 fenced {:?} after SIGKILL", t0.elapsed());
    cluster.node(2).restart();
    eprintln!("node 2 restarted in {:?}", cluster.node(2).startup);
    let mut ids = metadata_brokers(&addr1, TIMEOUT).unwrap();
    ids.sort();
    assert_eq!(ids, vec![1, 2, 3]);
}

#[test]
fn unique_topic_names_differ() {
    let a = unique_topic("t");
    let b = unique_topic("t");
    assert_ne!(a, b);
    assert!(a.starts_with("t-"));
}

#[test]
fn dropping_a_broker_stops_it() {
    let broker = TestBroker::start();
    let addr = broker.addr.clone();
    assert_ne!(addr, shared().addr);
    api_versions(&addr, TIMEOUT).unwrap();
    drop(broker);
    assert!(
        api_versions(&addr, Duration::from_millis(500)).is_err(),
        "broker on {addr} still answers after drop"
    );
}

/// The harness never hands out one port twice in a process (two listeners of one broker
/// once got the same port, and Kafka refused to start).
#[test]
fn free_ports_are_distinct_within_a_process() {
    let ports: Vec<u16> = (0..3000).map(|_| common::free_port()).collect();
    let distinct: std::collections::HashSet<u16> = ports.iter().copied().collect();
    assert_eq!(distinct.len(), ports.len());
}
