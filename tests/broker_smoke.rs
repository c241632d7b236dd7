//! Smoke tests of the real-broker harness (`tests/common`): the tansu broker starts,
//! answers ApiVersions, creates topics through its CLI and is stopped on drop.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use common::{api_versions, raw_request, shared, unique_topic, TestBroker};
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
    eprintln!("tansu on {} started in {:?}", broker.addr, broker.startup);
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
fn create_topic_cli_is_visible_in_metadata() {
    let broker = shared();
    let topic = unique_topic("smoke");
    let t0 = Instant::now();
    broker.create_topic_cli(&topic, 3);
    let created = t0.elapsed();
    // Visible to the very next Metadata request: no polling needed with tansu.
    let topics = metadata_topics(&broker.addr);
    eprintln!("topic create took {created:?}; metadata lists {topics:?}");
    assert!(
        topics.contains(&(topic.clone(), 3)),
        "{topic} with 3 partitions not in {topics:?}"
    );

    let err = broker.try_create_topic_cli(&topic, 3).unwrap_err();
    assert!(err.contains("already exists"), "{err}");
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
