//! Stable-Rust fuzz smoke test: every decoder is fed mutated copies of real, valid frames
//! (each response and request of every API at every version, record batches of every
//! codec, legacy messages, compressed payloads) plus random bytes, and must return a
//! `Result` — never panic, hang or allocate without bound.
//!
//! Mutations are deterministic (a fixed-seed xorshift generator), so a failure reproduces.
//! `KAFKAPIPE_SMOKE_ITERS` (default 500) sets the mutations per seed frame; raise it for a
//! longer local run. The cargo-fuzz targets in `fuzz/` do the same coverage-guided.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::fmt::Debug;

use bytes::{Bytes, BytesMut};
use kafkapipe::compression::Compression;
use kafkapipe::protocol::messages::*;
use kafkapipe::protocol::{
    ApiKey, Decode, Encode, Request, RequestHeader, ResponseHeader, TaggedFields,
};
use kafkapipe::record::{decode_batches, ControlRecord, Header, RecordBatchBuilder};

const MB: usize = 1 << 20;

/// xorshift64*: tiny, deterministic, good enough to pick mutations.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next() % n as u64) as usize
        }
    }
}

fn iterations() -> usize {
    std::env::var("KAFKAPIPE_SMOKE_ITERS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(500)
}

/// Values that make length and count fields interesting.
const INTERESTING: [u32; 12] = [
    0,
    1,
    0x7f,
    0x80,
    0xff,
    0x7fff,
    0xffff,
    0x7fff_ffff,
    0x8000_0000,
    0xffff_fffe,
    0xffff_ffff,
    0x0010_0000,
];

/// One to four mutations of `seed`.
fn mutate(seed: &[u8], rng: &mut Rng) -> Vec<u8> {
    let mut v = seed.to_vec();
    for _ in 0..=rng.below(4) {
        match rng.below(9) {
            0 if !v.is_empty() => {
                let i = rng.below(v.len());
                v[i] ^= 1 << rng.below(8);
            }
            1 if !v.is_empty() => {
                let i = rng.below(v.len());
                v[i] = [0x00, 0xff, 0x7f, 0x80, 0x01][rng.below(5)];
            }
            2 if v.len() >= 4 => {
                // An interesting 32-bit (or 16-bit, or 8-bit) value at a random place.
                let value = INTERESTING[rng.below(INTERESTING.len())].to_be_bytes();
                let width = [1, 2, 4][rng.below(3)];
                let i = rng.below(v.len() - width + 1);
                v[i..i + width].copy_from_slice(&value[4 - width..]);
            }
            3 => {
                let cut = rng.below(v.len() + 1);
                v.truncate(cut);
            }
            4 if !v.is_empty() => {
                let i = rng.below(v.len());
                let n = 1 + rng.below(8.min(v.len() - i));
                v.drain(i..i + n);
            }
            5 => {
                let i = rng.below(v.len() + 1);
                let n = 1 + rng.below(8);
                let bytes: Vec<u8> = (0..n).map(|_| rng.next() as u8).collect();
                v.splice(i..i, bytes);
            }
            6 if !v.is_empty() => {
                // Duplicate a chunk.
                let i = rng.below(v.len());
                let n = 1 + rng.below(32.min(v.len() - i));
                let chunk = v[i..i + n].to_vec();
                let at = rng.below(v.len() + 1);
                v.splice(at..at, chunk);
            }
            7 if !v.is_empty() => {
                // A varint-ish run of continuation bytes.
                let i = rng.below(v.len());
                let n = 1 + rng.below(10.min(v.len() - i));
                for b in &mut v[i..i + n] {
                    *b |= 0x80;
                }
            }
            _ => {
                let i = rng.below(v.len() + 1);
                v.truncate(i);
                v.extend((0..rng.below(16)).map(|_| rng.next() as u8));
            }
        }
    }
    v
}

/// Decode `data` as `T` at `version`; whatever decodes must re-encode without panicking.
fn decode_at<T: Decode + Encode + Debug>(data: &[u8], version: i16) {
    let mut b = Bytes::copy_from_slice(data);
    if let Ok(v) = T::decode(&mut b, version) {
        let _ = v.encode(&mut BytesMut::new(), version);
        let _ = format!("{v:?}");
    }
}

/// The versions of `R`, plus a few out of range (must be errors, not panics).
fn versions<R: Request>() -> impl Iterator<Item = i16> {
    (R::MIN_VERSION..=R::MAX_VERSION).chain([-1, R::MIN_VERSION - 1, R::MAX_VERSION + 1])
}

/// Whether the seeds of [`smoke`] are responses or requests of `R`.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Side {
    Response,
    Request,
}

/// With `KAFKAPIPE_FUZZ_CORPUS=DIR`, write `bytes` as `DIR/<target>/<name>`: seed inputs
/// for the cargo-fuzz targets in `fuzz/`.
fn dump(target: &str, name: &str, bytes: &[u8]) {
    if let Some(dir) = std::env::var_os("KAFKAPIPE_FUZZ_CORPUS") {
        let dir = std::path::Path::new(&dir).join(target);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(name), bytes).unwrap();
    }
}

/// The `response_frame` fuzz target's input for a seed: selector byte (type in the high
/// 3 bits, version offset in the low 5), then header and body.
fn dump_frame<R: Request>(side: Side, name: &str, version: i16, body: &[u8]) {
    let index: u8 = match R::API_KEY {
        ApiKey::API_VERSIONS => 0,
        ApiKey::METADATA => 1,
        ApiKey::PRODUCE => 2,
        ApiKey::FETCH => 3,
        ApiKey::LIST_OFFSETS => 4,
        ApiKey::CREATE_TOPICS => 5,
        _ => 6,
    };
    let mut b = BytesMut::new();
    match side {
        Side::Response => {
            b.extend_from_slice(&[(index << 5) | (version - R::MIN_VERSION) as u8]);
            ResponseHeader {
                correlation_id: 1,
                tagged_fields: TaggedFields::new(),
            }
            .encode(&mut b, R::response_header_version(version))
            .unwrap();
        }
        Side::Request => {
            b.extend_from_slice(&[7 << 5]);
            RequestHeader {
                api_key: R::API_KEY,
                api_version: version,
                correlation_id: 1,
                client_id: Some("fuzz".into()),
                tagged_fields: TaggedFields::new(),
            }
            .encode(&mut b, R::request_header_version(version))
            .unwrap();
        }
    }
    b.extend_from_slice(body);
    dump("response_frame", &format!("{name}-v{version}"), &b);
}

/// Mutate every seed and decode each mutant at its own version and at every other one.
fn smoke<T: Decode + Encode + Debug, R: Request>(name: &str, seeds: &[(i16, Vec<u8>)]) {
    assert!(!seeds.is_empty(), "{name}: no seeds");
    let side = if name.ends_with("Request") {
        Side::Request
    } else {
        Side::Response
    };
    for (version, seed) in seeds {
        dump_frame::<R>(side, name, *version, seed);
    }
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ name.len() as u64);
    for (version, seed) in seeds {
        // The seed itself must decode: it came from our own encoder.
        let mut b = Bytes::copy_from_slice(seed);
        T::decode(&mut b, *version)
            .unwrap_or_else(|e| panic!("{name} v{version}: valid seed does not decode: {e}"));
        for _ in 0..iterations() {
            let m = mutate(seed, &mut rng);
            decode_at::<T>(&m, *version);
            let other =
                R::MIN_VERSION + rng.below((R::MAX_VERSION - R::MIN_VERSION + 1) as usize) as i16;
            decode_at::<T>(&m, other);
        }
        for v in versions::<R>() {
            decode_at::<T>(seed, v);
        }
    }
    // Pure noise.
    for _ in 0..iterations() {
        let n = rng.below(64);
        let noise: Vec<u8> = (0..n).map(|_| rng.next() as u8).collect();
        for v in versions::<R>() {
            decode_at::<T>(&noise, v);
        }
    }
}

/// Encode `value` at every version of `R` that accepts it.
fn encode_all<T: Encode, R: Request>(value: &T) -> Vec<(i16, Vec<u8>)> {
    let out: Vec<_> = (R::MIN_VERSION..=R::MAX_VERSION)
        .filter_map(|v| {
            let mut b = BytesMut::new();
            value.encode(&mut b, v).ok().map(|()| (v, b.to_vec()))
        })
        .collect();
    assert!(!out.is_empty(), "{} encodes at no version", R::API_KEY);
    out
}

fn tagged() -> TaggedFields {
    TaggedFields(vec![(77, Bytes::from_static(b"\x01\x02\x03"))])
}

fn codecs() -> Vec<Compression> {
    [
        Compression::None,
        Compression::Gzip,
        Compression::Snappy,
        Compression::Lz4,
        Compression::Zstd,
    ]
    .into_iter()
    .filter(|c| c.is_available())
    .collect()
}

/// Record batches as a broker would return them: every codec, transactional, control.
fn batches() -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for c in codecs() {
        let mut b = RecordBatchBuilder::new(c).producer(42, 1, 7);
        for i in 0..5u8 {
            let value = vec![b'a' + i; 20 + usize::from(i) * 10];
            b.append(
                1_700_000_000_000 + i64::from(i),
                (i % 2 == 0).then_some(&[i, i][..]),
                Some(&value[..]),
                &[
                    Header::new("h", vec![i]),
                    Header {
                        key: "n".into(),
                        value: None,
                    },
                ],
            )
            .unwrap();
        }
        out.push(b.build().unwrap().to_vec());
    }
    let mut txn = RecordBatchBuilder::new(Compression::None)
        .producer(9, 0, 0)
        .transactional(true);
    txn.append(1, Some(b"k"), None, &[]).unwrap();
    out.push(txn.build().unwrap().to_vec());
    let mut marker = RecordBatchBuilder::new(Compression::None)
        .producer(9, 0, -1)
        .transactional(true)
        .control(true);
    marker
        .append(2, Some(&ControlRecord::Abort.key()), Some(&[0; 6]), &[])
        .unwrap();
    out.push(marker.build().unwrap().to_vec());
    // Legacy messages and the cross-client fixtures.
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");
    for name in [
        "v2_none.bin",
        "v2_gzip.bin",
        "v2_snappy.bin",
        "v2_lz4.bin",
        "v2_zstd.bin",
        "legacy_v0_none.bin",
        "legacy_v0_gzip.bin",
        "legacy_v1_none.bin",
        "legacy_v1_gzip.bin",
        "legacy_v1_snappy.bin",
    ] {
        out.push(std::fs::read(format!("{dir}/{name}")).unwrap());
    }
    out
}

/// Recompute the CRC-32C of a v2 batch (so a mutation reaches the decompressor and the
/// record decoder instead of stopping at the checksum).
fn fix_crc(batch: &mut [u8]) {
    if batch.len() > 21 && batch[16] == 2 {
        let crc = crc32c_of(&batch[21..]);
        batch[17..21].copy_from_slice(&crc.to_be_bytes());
    }
}

/// CRC-32C (Castagnoli), bitwise; the crate's own implementation is private.
fn crc32c_of(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0x82f6_3b78
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

#[test]
fn crc_helper_matches_real_batches() {
    for b in batches() {
        if b[16] == 2 {
            let mut fixed = b.clone();
            fixed[17..21].fill(0);
            fix_crc(&mut fixed);
            assert_eq!(fixed, b);
        }
    }
}

#[test]
fn record_batches_survive_mutation() {
    let mut rng = Rng(0x5eed);
    let seeds = batches();
    let all: Vec<u8> = seeds.iter().flatten().copied().collect();
    for (i, seed) in seeds.iter().enumerate() {
        dump("record_batch", &format!("batch-{i}"), seed);
    }
    dump("record_batch", "all", &all);
    for seed in seeds.iter().chain([&all]) {
        decode_batches(Bytes::copy_from_slice(seed), MB).expect("valid seed decodes");
        for i in 0..iterations() * 2 {
            let mut m = mutate(seed, &mut rng);
            if i % 2 == 0 {
                fix_crc(&mut m);
            }
            // A small limit too: decompression must stop at it, not allocate past it.
            for limit in [MB, 300] {
                if let Ok(d) = decode_batches(Bytes::from(m.clone()), limit) {
                    for b in &d.batches {
                        let _ = b.control_record();
                        let _ = b.next_offset();
                        let payload: usize = b
                            .records
                            .iter()
                            .map(|r| {
                                r.key.as_ref().map_or(0, Bytes::len)
                                    + r.value.as_ref().map_or(0, Bytes::len)
                            })
                            .sum();
                        assert!(
                            payload <= m.len().max(limit),
                            "{payload} bytes from {}",
                            m.len()
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn decompressors_survive_mutation() {
    let mut rng = Rng(0xdec0de);
    let input: Vec<u8> = (0..4000u32)
        .map(|i| (i % 251) as u8 ^ (i / 97) as u8)
        .collect();
    for c in codecs() {
        let mut compressed = BytesMut::new();
        c.compress(&input, &mut compressed).unwrap();
        let out = c.decompress(&compressed, MB).unwrap();
        assert_eq!(&out[..], &input[..], "{}", c.name());
        assert!(
            c.decompress(&compressed, 100).is_err() || c == Compression::None,
            "{}: limit not enforced",
            c.name()
        );
        for _ in 0..iterations() * 2 {
            let m = mutate(&compressed, &mut rng);
            if let Ok(out) = c.decompress(&m, 8192) {
                assert!(out.len() <= 8192 || c == Compression::None, "{}", c.name());
            }
        }
    }
}

#[test]
fn api_versions_survive_mutation() {
    let resp = ApiVersionsResponse {
        error_code: 0,
        api_keys: vec![
            ApiVersionRange {
                api_key: ApiKey::FETCH,
                min_version: 4,
                max_version: 17,
                tagged_fields: tagged(),
            },
            ApiVersionRange {
                api_key: ApiKey::PRODUCE,
                min_version: 3,
                max_version: 12,
                tagged_fields: TaggedFields::new(),
            },
        ],
        throttle_time_ms: 5,
        tagged_fields: tagged(),
    };
    smoke::<ApiVersionsResponse, ApiVersionsRequest>(
        "ApiVersionsResponse",
        &encode_all::<_, ApiVersionsRequest>(&resp),
    );
    let req = ApiVersionsRequest {
        client_software_name: "kafkapipe".into(),
        client_software_version: "0.1.0".into(),
        tagged_fields: tagged(),
    };
    smoke::<ApiVersionsRequest, ApiVersionsRequest>(
        "ApiVersionsRequest",
        &encode_all::<_, ApiVersionsRequest>(&req),
    );
}

#[test]
fn metadata_survives_mutation() {
    let partition = |i| MetadataPartition {
        error_code: 0,
        partition_index: i,
        leader_id: 1,
        leader_epoch: 3,
        replica_nodes: vec![1, 2, 3],
        isr_nodes: vec![1, 2],
        offline_replicas: vec![3],
        tagged_fields: tagged(),
    };
    let resp = MetadataResponse {
        throttle_time_ms: 1,
        brokers: vec![MetadataBroker {
            node_id: 1,
            host: "broker-1.example".into(),
            port: 9092,
            rack: Some("r1".into()),
            tagged_fields: tagged(),
        }],
        cluster_id: Some("cluster".into()),
        controller_id: 1,
        topics: vec![
            MetadataTopic {
                error_code: 0,
                name: Some("events".into()),
                topic_id: [3; 16],
                is_internal: false,
                partitions: vec![partition(0), partition(1)],
                topic_authorized_operations: 0x0f,
                tagged_fields: tagged(),
            },
            MetadataTopic {
                error_code: 3,
                name: None,
                ..MetadataTopic::default()
            },
        ],
        cluster_authorized_operations: -2147483648,
        error_code: 0,
        tagged_fields: tagged(),
    };
    smoke::<MetadataResponse, MetadataRequest>(
        "MetadataResponse",
        &encode_all::<_, MetadataRequest>(&resp),
    );
    let req = MetadataRequest {
        topics: Some(vec![MetadataRequestTopic {
            topic_id: [0; 16],
            name: Some("events".into()),
            tagged_fields: tagged(),
        }]),
        ..MetadataRequest::default()
    };
    smoke::<MetadataRequest, MetadataRequest>(
        "MetadataRequest",
        &encode_all::<_, MetadataRequest>(&req),
    );
}

#[test]
fn produce_survives_mutation() {
    let resp = ProduceResponse {
        responses: vec![ProduceTopicResponse {
            name: "events".into(),
            topic_id: [4; 16],
            partition_responses: vec![ProducePartitionResponse {
                index: 0,
                error_code: 10,
                base_offset: 1234,
                log_append_time_ms: -1,
                log_start_offset: 0,
                record_errors: vec![BatchIndexAndErrorMessage {
                    batch_index: 2,
                    batch_index_error_message: Some("bad".into()),
                    tagged_fields: TaggedFields::new(),
                }],
                error_message: Some("too large".into()),
                current_leader: Some(LeaderIdAndEpoch {
                    leader_id: 2,
                    leader_epoch: 9,
                    tagged_fields: TaggedFields::new(),
                }),
                tagged_fields: tagged(),
            }],
            tagged_fields: tagged(),
        }],
        throttle_time_ms: 3,
        node_endpoints: Some(vec![NodeEndpoint {
            node_id: 2,
            host: "b2".into(),
            port: 9093,
            rack: None,
            tagged_fields: TaggedFields::new(),
        }]),
        tagged_fields: tagged(),
    };
    smoke::<ProduceResponse, ProduceRequest>(
        "ProduceResponse",
        &encode_all::<_, ProduceRequest>(&resp),
    );
    let req = ProduceRequest {
        transactional_id: Some("tx".into()),
        acks: -1,
        timeout_ms: 30_000,
        topic_data: vec![ProduceTopicData {
            name: "events".into(),
            topic_id: [4; 16],
            partition_data: vec![ProducePartitionData {
                index: 0,
                records: Some(Bytes::from(batches().swap_remove(1)).into()),
                tagged_fields: tagged(),
            }],
            tagged_fields: tagged(),
        }],
        tagged_fields: tagged(),
    };
    smoke::<ProduceRequest, ProduceRequest>(
        "ProduceRequest",
        &encode_all::<_, ProduceRequest>(&req),
    );
}

#[test]
fn fetch_survives_mutation() {
    let records: Vec<u8> = batches().into_iter().take(7).flatten().collect();
    let partition = |i, with_records: bool| FetchPartitionData {
        partition_index: i,
        error_code: 0,
        high_watermark: 100,
        last_stable_offset: 90,
        log_start_offset: 0,
        diverging_epoch: Some(EpochEndOffset {
            epoch: 2,
            end_offset: 50,
            tagged_fields: TaggedFields::new(),
        }),
        current_leader: Some(LeaderIdAndEpoch {
            leader_id: 1,
            leader_epoch: 2,
            tagged_fields: TaggedFields::new(),
        }),
        snapshot_id: Some(SnapshotId {
            end_offset: 10,
            epoch: 1,
            tagged_fields: TaggedFields::new(),
        }),
        aborted_transactions: Some(vec![AbortedTransaction {
            producer_id: 9,
            first_offset: 5,
            tagged_fields: tagged(),
        }]),
        preferred_read_replica: -1,
        records: with_records.then(|| Bytes::from(records.clone())),
        tagged_fields: tagged(),
    };
    let resp = FetchResponse {
        throttle_time_ms: 0,
        error_code: 0,
        session_id: 77,
        responses: vec![FetchableTopicResponse {
            topic: "events".into(),
            topic_id: [5; 16],
            partitions: vec![partition(0, true), partition(1, false)],
            tagged_fields: tagged(),
        }],
        node_endpoints: Some(Vec::new()),
        tagged_fields: tagged(),
    };
    let seeds = encode_all::<_, FetchRequest>(&resp);
    smoke::<FetchResponse, FetchRequest>("FetchResponse", &seeds);

    // What Conn does with a fetch response: decode it, then the records of each partition.
    let mut rng = Rng(0xfe7c4);
    for (version, seed) in &seeds {
        for _ in 0..iterations() {
            let m = mutate(seed, &mut rng);
            if let Ok(r) = FetchResponse::decode(&mut Bytes::from(m), *version) {
                for p in r.responses.iter().flat_map(|t| &t.partitions) {
                    if let Some(data) = &p.records {
                        let _ = decode_batches(data.clone(), MB);
                    }
                }
            }
        }
    }

    let req = FetchRequest {
        cluster_id: Some("c".into()),
        replica_state: Some(ReplicaState::default()),
        topics: vec![FetchTopic {
            topic: "events".into(),
            topic_id: [5; 16],
            partitions: vec![FetchPartition {
                partition: 0,
                fetch_offset: 42,
                replica_directory_id: Some([1; 16]),
                high_watermark: Some(100),
                tagged_fields: tagged(),
                ..FetchPartition::default()
            }],
            tagged_fields: tagged(),
        }],
        forgotten_topics_data: vec![ForgottenTopic {
            topic: "old".into(),
            topic_id: [6; 16],
            partitions: vec![1, 2],
            tagged_fields: TaggedFields::new(),
        }],
        rack_id: "r1".into(),
        ..FetchRequest::default()
    };
    smoke::<FetchRequest, FetchRequest>("FetchRequest", &encode_all::<_, FetchRequest>(&req));
}

#[test]
fn list_offsets_survives_mutation() {
    let resp = ListOffsetsResponse {
        throttle_time_ms: 0,
        topics: vec![ListOffsetsTopicResponse {
            name: "events".into(),
            partitions: vec![ListOffsetsPartitionResponse {
                partition_index: 0,
                error_code: 0,
                timestamp: 1_700_000_000_000,
                offset: 99,
                leader_epoch: 4,
                tagged_fields: tagged(),
            }],
            tagged_fields: tagged(),
        }],
        tagged_fields: tagged(),
    };
    smoke::<ListOffsetsResponse, ListOffsetsRequest>(
        "ListOffsetsResponse",
        &encode_all::<_, ListOffsetsRequest>(&resp),
    );
    let req = ListOffsetsRequest {
        topics: vec![ListOffsetsTopic {
            name: "events".into(),
            partitions: vec![ListOffsetsPartition {
                partition_index: 0,
                timestamp: -1,
                ..ListOffsetsPartition::default()
            }],
            tagged_fields: tagged(),
        }],
        ..ListOffsetsRequest::default()
    };
    smoke::<ListOffsetsRequest, ListOffsetsRequest>(
        "ListOffsetsRequest",
        &encode_all::<_, ListOffsetsRequest>(&req),
    );
}

#[test]
fn create_topics_survives_mutation() {
    let resp = CreateTopicsResponse {
        throttle_time_ms: 0,
        topics: vec![CreatableTopicResult {
            name: "events".into(),
            topic_id: [8; 16],
            error_code: 36,
            error_message: Some("exists".into()),
            topic_config_error_code: Some(0),
            num_partitions: 3,
            replication_factor: 1,
            configs: Some(vec![CreatableTopicConfigs {
                name: "retention.ms".into(),
                value: Some("1000".into()),
                read_only: false,
                config_source: 5,
                is_sensitive: false,
                tagged_fields: TaggedFields::new(),
            }]),
            tagged_fields: tagged(),
        }],
        tagged_fields: tagged(),
    };
    smoke::<CreateTopicsResponse, CreateTopicsRequest>(
        "CreateTopicsResponse",
        &encode_all::<_, CreateTopicsRequest>(&resp),
    );
    let req = CreateTopicsRequest {
        topics: vec![CreatableTopic {
            name: "events".into(),
            num_partitions: -1,
            replication_factor: -1,
            assignments: vec![CreatableReplicaAssignment {
                partition_index: 0,
                broker_ids: vec![1, 2],
                tagged_fields: TaggedFields::new(),
            }],
            configs: vec![CreatableTopicConfig {
                name: "cleanup.policy".into(),
                value: Some("compact".into()),
                tagged_fields: TaggedFields::new(),
            }],
            tagged_fields: tagged(),
        }],
        timeout_ms: 1000,
        validate_only: true,
        tagged_fields: tagged(),
    };
    smoke::<CreateTopicsRequest, CreateTopicsRequest>(
        "CreateTopicsRequest",
        &encode_all::<_, CreateTopicsRequest>(&req),
    );
}

#[test]
fn delete_topics_survives_mutation() {
    let resp = DeleteTopicsResponse {
        throttle_time_ms: 0,
        responses: vec![DeletableTopicResult {
            name: Some("events".into()),
            topic_id: [9; 16],
            error_code: 0,
            error_message: Some("ok".into()),
            tagged_fields: tagged(),
        }],
        tagged_fields: tagged(),
    };
    smoke::<DeleteTopicsResponse, DeleteTopicsRequest>(
        "DeleteTopicsResponse",
        &encode_all::<_, DeleteTopicsRequest>(&resp),
    );
    let req = DeleteTopicsRequest {
        topics: vec![DeleteTopicState {
            name: Some("events".into()),
            topic_id: [9; 16],
            tagged_fields: TaggedFields::new(),
        }],
        topic_names: vec!["events".into()],
        timeout_ms: 1000,
        tagged_fields: tagged(),
    };
    smoke::<DeleteTopicsRequest, DeleteTopicsRequest>(
        "DeleteTopicsRequest",
        &encode_all::<_, DeleteTopicsRequest>(&req),
    );
}

#[test]
fn headers_survive_mutation() {
    let mut rng = Rng(0x4ead);
    let mut seeds = Vec::new();
    for v in 0..=2 {
        let mut b = BytesMut::new();
        RequestHeader {
            api_key: ApiKey::FETCH,
            api_version: 12,
            correlation_id: 7,
            client_id: Some("kafkapipe".into()),
            tagged_fields: tagged(),
        }
        .encode(&mut b, v)
        .unwrap();
        seeds.push((v, b.to_vec()));
    }
    for v in 0..=1 {
        let mut b = BytesMut::new();
        ResponseHeader {
            correlation_id: 7,
            tagged_fields: tagged(),
        }
        .encode(&mut b, v)
        .unwrap();
        seeds.push((v + 10, b.to_vec()));
    }
    for (v, seed) in &seeds {
        for _ in 0..iterations() {
            let m = Bytes::from(mutate(seed, &mut rng));
            for hv in 0..=2 {
                let _ = RequestHeader::decode(&mut m.clone(), hv);
                let _ = RequestHeader::peek(&m);
            }
            for hv in 0..=1 {
                let _ = ResponseHeader::decode(&mut m.clone(), hv);
            }
            let _ = ControlRecord::parse(&m);
            let _ = v;
        }
    }
}

#[test]
fn sasl_messages_survive_mutation() {
    let handshake = SaslHandshakeResponse {
        error_code: 33,
        mechanisms: vec!["SCRAM-SHA-256".into(), "SCRAM-SHA-512".into()],
    };
    smoke::<SaslHandshakeResponse, SaslHandshakeRequest>(
        "SaslHandshakeResponse",
        &encode_all::<_, SaslHandshakeRequest>(&handshake),
    );
    let req = SaslHandshakeRequest {
        mechanism: "OAUTHBEARER".into(),
    };
    smoke::<SaslHandshakeRequest, SaslHandshakeRequest>(
        "SaslHandshakeRequest",
        &encode_all::<_, SaslHandshakeRequest>(&req),
    );
    let resp = SaslAuthenticateResponse {
        error_code: 0,
        error_message: Some("ok".into()),
        auth_bytes: Bytes::from_static(b"r=abc,s=c2FsdA==,i=4096"),
        session_lifetime_ms: 3_600_000,
        tagged_fields: TaggedFields::new(),
    };
    smoke::<SaslAuthenticateResponse, SaslAuthenticateRequest>(
        "SaslAuthenticateResponse",
        &encode_all::<_, SaslAuthenticateRequest>(&resp),
    );
    let req = SaslAuthenticateRequest {
        auth_bytes: Bytes::from_static(b"n,,n=user,r=abc"),
        tagged_fields: TaggedFields::new(),
    };
    smoke::<SaslAuthenticateRequest, SaslAuthenticateRequest>(
        "SaslAuthenticateRequest",
        &encode_all::<_, SaslAuthenticateRequest>(&req),
    );
}
