use super::*;
use crate::bufpool::KEPT_SCRATCH;
use crate::ErrorKind;
use bytes::BytesMut;
use proptest::prelude::*;

const MB: usize = 1 << 20;

fn fixture(name: &str) -> Bytes {
    let path = format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
    Bytes::from(std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}")))
}

fn decode_one(data: Bytes) -> RecordBatch {
    let d = decode_batches(data, MB).unwrap();
    assert!(!d.truncated);
    assert_eq!(d.batches.len(), 1);
    d.batches.into_iter().next().unwrap()
}

/// Recompute the CRC-32C of a v2 batch after a test edited it.
fn fix_crc(batch: &mut [u8]) {
    let crc = crc32c::crc32c(&batch[21..]);
    batch[17..21].copy_from_slice(&crc.to_be_bytes());
}

/// The records `tests/fixtures/gen_fixtures.py` writes (`RECORDS` there).
fn fixture_records(offsets: [i64; 3], with_headers: bool) -> Vec<Record> {
    let b = |s: &[u8]| Some(Bytes::copy_from_slice(s));
    let hdrs = |h: Vec<Header>| if with_headers { h } else { Vec::new() };
    vec![
        Record {
            offset: offsets[0],
            timestamp: 1_700_000_000_000,
            key: b(b"key-0"),
            value: b(&b"value-0 ".repeat(20)),
            headers: hdrs(vec![
                Header::new("h1", "v1"),
                Header {
                    key: "hnull".into(),
                    value: None,
                },
            ]),
        },
        Record {
            offset: offsets[1],
            timestamp: 1_700_000_000_007,
            key: None,
            value: b(&b"value-1 ".repeat(20)),
            headers: Vec::new(),
        },
        Record {
            offset: offsets[2],
            timestamp: 1_699_999_999_990,
            key: b(b"key-2"),
            value: None,
            headers: hdrs(vec![Header::new("\u{fc}", "")]),
        },
    ]
}

// ---- fixtures from a real peer (kafka-python, see tests/fixtures/gen_fixtures.py) ------

#[test]
fn v2_fixtures_from_kafka_python_decode_exactly() {
    for c in Compression::ALL {
        let batch = decode_one(fixture(&format!("v2_{}.bin", c.name())));
        assert_eq!(batch.compression, c);
        assert_eq!(batch.magic, 2);
        assert_eq!(batch.base_offset, 1000);
        assert_eq!(batch.partition_leader_epoch, 0);
        assert_eq!(batch.timestamp_type, TimestampType::CreateTime);
        assert!(batch.is_transactional);
        assert!(!batch.is_control);
        assert_eq!(batch.last_offset_delta, 2);
        assert_eq!(batch.base_timestamp, 1_700_000_000_000);
        assert_eq!(batch.max_timestamp, 1_700_000_000_007);
        assert_eq!(
            (batch.producer_id, batch.producer_epoch, batch.base_sequence),
            (4242, 3, 17)
        );
        assert_eq!(
            batch.records,
            fixture_records([1000, 1001, 1002], true),
            "{c}"
        );
        assert_eq!(batch.next_offset(), 1003);
        assert_eq!(batch.control_record().unwrap(), None);
    }
}

#[test]
fn our_encoding_is_byte_identical_to_kafka_python() {
    let mut expected = BytesMut::from(&fixture("v2_none.bin")[..]);
    expected[..8].copy_from_slice(&0i64.to_be_bytes());
    let mut b = RecordBatchBuilder::new(Compression::None)
        .producer(4242, 3, 17)
        .transactional(true)
        .partition_leader_epoch(0);
    for r in fixture_records([0, 1, 2], true) {
        b.append(
            r.timestamp,
            r.key.as_deref(),
            r.value.as_deref(),
            &r.headers,
        )
        .unwrap();
    }
    assert_eq!(&b.build().unwrap()[..], &expected[..]);
}

#[test]
fn legacy_fixtures_from_kafka_python_decode_exactly() {
    let no_ts = |mut v: Vec<Record>| {
        v.iter_mut().for_each(|r| r.timestamp = NO_TIMESTAMP);
        v
    };
    // uncompressed: one batch per message
    for (name, magic) in [("legacy_v0_none.bin", 0), ("legacy_v1_none.bin", 1)] {
        let d = decode_batches(fixture(name), MB).unwrap();
        assert!(!d.truncated);
        let mut expected = fixture_records([50, 51, 52], false);
        if magic == 0 {
            expected = no_ts(expected);
        }
        assert_eq!(d.batches.len(), 3, "{name}");
        for (batch, rec) in d.batches.iter().zip(expected) {
            assert_eq!(batch.magic, magic);
            assert_eq!(batch.compression, Compression::None);
            assert_eq!(batch.base_offset, rec.offset);
            assert_eq!(batch.last_offset_delta, 0);
            assert_eq!(batch.records, vec![rec]);
        }
    }
    // v0 gzip wrapper: inner offsets absolute
    let batch = decode_one(fixture("legacy_v0_gzip.bin"));
    assert_eq!((batch.magic, batch.compression), (0, Compression::Gzip));
    assert_eq!(batch.records, no_ts(fixture_records([50, 51, 52], false)));
    assert_eq!((batch.base_offset, batch.next_offset()), (50, 53));
    // v1 wrappers: inner offsets 0..2 relative to the wrapper's 100
    for (name, c) in [
        ("legacy_v1_gzip.bin", Compression::Gzip),
        ("legacy_v1_snappy.bin", Compression::Snappy),
    ] {
        let batch = decode_one(fixture(name));
        assert_eq!((batch.magic, batch.compression), (1, c));
        assert_eq!(
            batch.records,
            fixture_records([98, 99, 100], false),
            "{name}"
        );
        assert_eq!(batch.last_offset_delta, 2);
        assert_eq!(batch.max_timestamp, 1_700_000_000_007);
    }
}

#[test]
fn java_style_xerial_snappy_blob_decompresses() {
    let blob = fixture("xerial_snappy.bin");
    assert!(blob.starts_with(b"\x82SNAPPY\0"));
    let expected: Vec<u8> = (0..10000)
        .flat_map(|i| format!("kafkapipe {i}\n").into_bytes())
        .collect();
    let got = Compression::Snappy.decompress(&blob, MB).unwrap();
    assert_eq!(got.len(), expected.len());
    assert_eq!(&got[..], &expected[..]);
    assert!(Compression::Snappy
        .decompress(&blob, expected.len() - 1)
        .is_err());
}

#[test]
fn mixed_concatenated_batches_decode_in_order() {
    let mut all = BytesMut::new();
    for name in [
        "legacy_v1_gzip.bin",
        "v2_none.bin",
        "v2_zstd.bin",
        "legacy_v0_none.bin",
    ] {
        all.extend_from_slice(&fixture(name));
    }
    let d = decode_batches(all.freeze(), MB).unwrap();
    let magics: Vec<i8> = d.batches.iter().map(|b| b.magic).collect();
    assert_eq!(magics, [1, 2, 2, 0, 0, 0]);
    assert!(!d.truncated);
}

// ---- a hand-verified batch -------------------------------------------------------------

/// One record, key "k", value "v", no headers, at 2023-11-14T22:13:20Z; CRC-32C
/// computed independently (kafka-python's pure-Python `_crc32c`).
const HAND_BATCH: &[u8] = &[
    0, 0, 0, 0, 0, 0, 0, 0, // base offset 0
    0, 0, 0, 58, // batch length: 49 header bytes after this field + 9 record bytes
    0xff, 0xff, 0xff, 0xff, // partition leader epoch -1
    2,    // magic
    0xe9, 0x9b, 0x8d, 0xd8, // CRC-32C of attributes..end
    0, 0, // attributes: no compression, CreateTime, not transactional, not control
    0, 0, 0, 0, // last offset delta
    0, 0, 0x01, 0x8b, 0xcf, 0xe5, 0x68, 0x00, // base timestamp 1_700_000_000_000
    0, 0, 0x01, 0x8b, 0xcf, 0xe5, 0x68, 0x00, // max timestamp
    0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, // producer id -1
    0xff, 0xff, // producer epoch -1
    0xff, 0xff, 0xff, 0xff, // base sequence -1
    0, 0, 0, 1,    // one record
    0x10, // record length 8 (zigzag)
    0,    // record attributes
    0,    // timestamp delta 0
    0,    // offset delta 0
    0x02, b'k', // key length 1, key
    0x02, b'v', // value length 1, value
    0,    // no headers
];

#[test]
fn hand_verified_batch_decodes_and_encodes() {
    let batch = decode_one(Bytes::from_static(HAND_BATCH));
    assert_eq!(
        batch,
        RecordBatch {
            base_offset: 0,
            partition_leader_epoch: -1,
            magic: 2,
            compression: Compression::None,
            timestamp_type: TimestampType::CreateTime,
            is_transactional: false,
            is_control: false,
            last_offset_delta: 0,
            base_timestamp: 1_700_000_000_000,
            max_timestamp: 1_700_000_000_000,
            producer_id: -1,
            producer_epoch: -1,
            base_sequence: -1,
            records: vec![Record {
                offset: 0,
                timestamp: 1_700_000_000_000,
                key: Some(Bytes::from_static(b"k")),
                value: Some(Bytes::from_static(b"v")),
                headers: vec![],
            }],
        }
    );
    let mut b = RecordBatchBuilder::new(Compression::None);
    assert_eq!(
        b.record_size(1_700_000_000_000, Some(b"k"), Some(b"v"), &[])
            .unwrap(),
        9
    );
    b.append(1_700_000_000_000, Some(b"k"), Some(b"v"), &[])
        .unwrap();
    assert_eq!(b.estimated_size(), HAND_BATCH.len());
    assert_eq!(&b.build().unwrap()[..], HAND_BATCH);
}

#[test]
fn zero_copy_slices_of_the_input() {
    let data = Bytes::from_static(HAND_BATCH);
    let range = data.as_ptr() as usize..data.as_ptr() as usize + data.len();
    let batch = decode_one(data.clone());
    let key = batch.records[0].key.as_ref().unwrap();
    assert!(range.contains(&(key.as_ptr() as usize)));
}

// ---- other encoder features ------------------------------------------------------------

#[test]
fn control_batches_and_markers() {
    for marker in [ControlRecord::Commit, ControlRecord::Abort] {
        let mut b = RecordBatchBuilder::new(Compression::None)
            .producer(7, 1, -1)
            .transactional(true)
            .control(true);
        b.append(5, Some(&marker.key()), Some(&[0, 0, 0, 0, 0, 3]), &[])
            .unwrap();
        let batch = decode_one(b.build().unwrap());
        assert!(batch.is_control && batch.is_transactional);
        assert_eq!(batch.control_record().unwrap(), Some(marker));
    }
    assert_eq!(
        ControlRecord::parse(&[0, 0, 0, 2]).unwrap(),
        ControlRecord::Unknown(2)
    );
    assert!(ControlRecord::parse(&[0xff, 0xff, 0, 0]).is_err());
}

#[test]
fn log_append_time_overrides_record_timestamps() {
    let mut b =
        RecordBatchBuilder::new(Compression::Lz4).timestamp_type(TimestampType::LogAppendTime);
    b.append(10, None, Some(b"a"), &[]).unwrap();
    b.append(30, None, Some(b"b"), &[]).unwrap();
    b.append(20, None, Some(b"c"), &[]).unwrap();
    let batch = decode_one(b.build().unwrap());
    assert_eq!(batch.max_timestamp, 30);
    assert!(batch.records.iter().all(|r| r.timestamp == 30));
}

#[test]
fn empty_batch_roundtrips() {
    let batch = decode_one(RecordBatchBuilder::new(Compression::Gzip).build().unwrap());
    assert!(batch.records.is_empty());
    assert_eq!((batch.base_timestamp, batch.max_timestamp), (-1, -1));
}

// ---- negative cases --------------------------------------------------------------------

#[test]
fn crc_mismatch_names_the_offsets() {
    let mut v2 = BytesMut::from(&fixture("v2_none.bin")[..]);
    let n = v2.len();
    v2[n - 10] ^= 0x01;
    let err = decode_batches(v2.freeze(), MB).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Protocol);
    let msg = err.to_string();
    assert!(msg.contains("CRC") && msg.contains("1000..=1002"), "{msg}");

    let mut legacy = BytesMut::from(&fixture("legacy_v1_gzip.bin")[..]);
    let n = legacy.len();
    legacy[n - 3] ^= 0x40;
    let err = decode_batches(legacy.freeze(), MB).unwrap_err();
    assert!(
        err.to_string()
            .contains("CRC mismatch in legacy message at offset 100"),
        "{err}"
    );
}

#[test]
fn crcs_are_not_checked_when_the_reader_turns_checks_off() {
    // A flipped bit in a record's value: the stored CRC no longer matches.
    let mut v2 = BytesMut::from(&fixture("v2_none.bin")[..]);
    let n = v2.len();
    v2[n - 10] ^= 0x01;
    let v2 = v2.freeze();
    let checked = decode_batches_lazy(v2.clone(), MB, MB, None, true).unwrap_err();
    assert!(checked.to_string().contains("CRC"), "{checked}");
    let d = decode_batches_lazy(v2, MB, MB, None, false).expect("decodes unchecked");
    let (records, _) = lazy_records(d.batches).expect("records decode");
    assert_eq!(records.len(), 3);
    assert_eq!(records[0].offset, 1000);

    let mut legacy = BytesMut::from(&fixture("legacy_v1_gzip.bin")[..]);
    let n = legacy.len();
    legacy[n - 3] ^= 0x40;
    let legacy = legacy.freeze();
    assert!(decode_batches_lazy(legacy.clone(), MB, MB, None, true).is_err());
    // The flipped bit is in the wrapper's compressed value: unchecked, the batch gets
    // past the CRC and either decompresses or fails there, never panics.
    let _ = decode_batches_lazy(legacy, MB, MB, None, false);
}

#[test]
fn truncated_last_batch_keeps_the_previous_ones() {
    let first = fixture("v2_none.bin");
    let second = fixture("v2_gzip.bin");
    for cut in [1, 10, second.len() - 12] {
        let mut all = BytesMut::from(&first[..]);
        all.extend_from_slice(&second[..second.len() - cut]);
        let d = decode_batches(all.freeze(), MB).unwrap();
        assert_eq!(d.batches.len(), 1, "cut {cut}");
        assert_eq!(d.batches[0].records.len(), 3);
        assert!(d.truncated);
        assert_eq!(d.truncated_batch_size, Some(second.len()));
    }
    // cut inside the offset/length prefix: size unknown
    let mut all = BytesMut::from(&first[..]);
    all.extend_from_slice(&second[..5]);
    let d = decode_batches(all.freeze(), MB).unwrap();
    assert_eq!(
        (d.batches.len(), d.truncated, d.truncated_batch_size),
        (1, true, None)
    );
}

#[test]
fn first_batch_larger_than_buffer_reports_needed_size() {
    let v2 = fixture("v2_none.bin");
    let d = decode_batches(v2.slice(..100), MB).unwrap();
    assert!(d.batches.is_empty());
    assert!(d.truncated);
    assert_eq!(d.truncated_batch_size, Some(v2.len()));
    // and an empty buffer is simply empty
    assert_eq!(
        decode_batches(Bytes::new(), MB).unwrap(),
        DecodedBatches::default()
    );
}

#[test]
fn oversized_record_count_is_rejected() {
    let mut v2 = BytesMut::from(HAND_BATCH);
    v2[57..61].copy_from_slice(&1_000_000i32.to_be_bytes());
    fix_crc(&mut v2);
    let err = decode_batches(v2.freeze(), MB).unwrap_err();
    assert!(err.to_string().contains("record count 1000000"), "{err}");

    let mut v2 = BytesMut::from(HAND_BATCH);
    v2[57..61].copy_from_slice(&(-5i32).to_be_bytes());
    fix_crc(&mut v2);
    assert!(decode_batches(v2.freeze(), MB).is_err());

    // a count that fits the bytes but does not match them
    let mut v2 = BytesMut::from(&fixture("v2_none.bin")[..]);
    v2[57..61].copy_from_slice(&4i32.to_be_bytes());
    fix_crc(&mut v2);
    assert!(decode_batches(v2.freeze(), MB).is_err());
}

#[test]
fn negative_batch_length_and_unknown_magic_are_errors() {
    let mut v2 = BytesMut::from(HAND_BATCH);
    v2[8..12].copy_from_slice(&(-1i32).to_be_bytes());
    assert!(decode_batches(v2.freeze(), MB).is_err());
    let mut v2 = BytesMut::from(HAND_BATCH);
    v2[16] = 3;
    assert!(decode_batches(v2.freeze(), MB).is_err());
}

#[test]
fn corrupt_compressed_payload_is_an_error() {
    for c in Compression::ALL.into_iter().skip(1) {
        let mut v2 = BytesMut::from(&fixture(&format!("v2_{}.bin", c.name()))[..]);
        let n = v2.len();
        for b in &mut v2[n - 20..n - 4] {
            *b ^= 0x5a;
        }
        fix_crc(&mut v2);
        let err = decode_batches(v2.freeze(), MB).unwrap_err();
        assert!(
            matches!(err.kind(), ErrorKind::Compression | ErrorKind::Protocol),
            "{c}: {err}"
        );
    }
}

#[test]
fn zip_bomb_is_bounded() {
    let zeros = vec![0u8; 10 * MB];
    let mut b = RecordBatchBuilder::new(Compression::Gzip);
    b.append(0, None, Some(&zeros), &[]).unwrap();
    let bytes = b.build().unwrap();
    assert!(bytes.len() < 100_000);
    let err = decode_batches(bytes.clone(), MB).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Compression, "{err}");
    assert!(err.to_string().contains("offset 0"), "{err}");
    assert_eq!(
        decode_one_with(bytes, 11 * MB).records[0]
            .value
            .as_ref()
            .unwrap()
            .len(),
        10 * MB
    );
}

/// A batch of `n` records holding `value`, compressed with `c`, at base offset `base`
/// (not covered by the CRC: brokers write it after the producer built the batch), and
/// the size its records section decompresses to.
fn batch_at(c: Compression, base: i64, n: usize, value: &[u8]) -> (Bytes, usize) {
    let mut b = RecordBatchBuilder::new(c);
    for _ in 0..n {
        b.append(0, None, Some(value), &[]).unwrap();
    }
    let payload = b.estimated_size() - BATCH_HEADER_LEN;
    let mut bytes = BytesMut::from(&b.build().unwrap()[..]);
    bytes[0..8].copy_from_slice(&base.to_be_bytes());
    (bytes.freeze(), payload)
}

/// Decode `data` like a consumer: take what one call returns, continue after the last
/// decoded batch, until everything is read. Returns the base offsets seen and the number
/// of calls.
fn decode_all(mut data: Bytes, soft: usize, hard: usize) -> (Vec<i64>, usize) {
    let mut bases = Vec::new();
    let mut calls = 0;
    while !data.is_empty() {
        calls += 1;
        let d = decode_batches_within(data.clone(), soft, hard).unwrap();
        assert!(!d.batches.is_empty(), "no progress");
        assert!(!d.truncated);
        let mut used = 0;
        for b in &d.batches {
            bases.push(b.base_offset);
            used += 12 + i32::from_be_bytes(data[used + 8..used + 12].try_into().unwrap()) as usize;
        }
        assert_eq!(d.limited, used < data.len());
        data = data.slice(used..);
    }
    (bases, calls)
}

#[test]
fn response_over_the_limit_returns_the_batches_that_fit() {
    // Many small compressed batches, each well under the limit, must not add up past it
    // (the decoded records keep every decompressed payload alive) — and must not be
    // thrown away either: the batches that fit come back, the rest on the next call.
    let zeros = vec![0u8; 300 * 1024];
    for c in Compression::ALL.into_iter().skip(1) {
        let mut all = BytesMut::new();
        for i in 0..8 {
            all.extend_from_slice(&batch_at(c, i, 1, &zeros).0);
        }
        let all = all.freeze();
        let d = decode_batches(all.clone(), 4 * MB).unwrap();
        assert_eq!((d.batches.len(), d.limited), (8, false), "{c}");
        let d = decode_batches(all.clone(), MB).unwrap();
        let bases: Vec<i64> = d.batches.iter().map(|b| b.base_offset).collect();
        assert_eq!(bases, [0, 1, 2], "{c}");
        assert!(d.limited && !d.truncated, "{c}");
        assert_eq!(decode_all(all, MB, MB), ((0..8).collect(), 3), "{c}");
    }
    // Uncompressed batches are slices of the input and take nothing from the budget.
    let mut all = BytesMut::new();
    for i in 0..8 {
        all.extend_from_slice(&batch_at(Compression::None, i, 1, &zeros).0);
    }
    let d = decode_batches(all.freeze(), MB).unwrap();
    assert_eq!((d.batches.len(), d.limited), (8, false));
}

#[test]
fn legacy_decompression_counts_against_the_total() {
    let gz = fixture("legacy_v1_gzip.bin");
    let one = decode_batches(gz.clone(), MB).unwrap();
    let size: usize = one.batches[0]
        .records
        .iter()
        .map(|r| r.value.as_ref().map_or(0, Bytes::len) + r.key.as_ref().map_or(0, Bytes::len))
        .sum();
    let mut twice = BytesMut::from(&gz[..]);
    twice.extend_from_slice(&gz);
    // Enough for one inner message set (records plus 34 bytes of v1 overhead each), not
    // for two: the second is left for the next call.
    let limit = size + 200;
    assert_eq!(decode_batches(gz.clone(), limit).unwrap().batches.len(), 1);
    let d = decode_batches(twice.freeze(), limit).unwrap();
    assert_eq!((d.batches.len(), d.limited), (1, true));
    // A first message set over both limits is an error naming it.
    let err = decode_batches_within(gz, size / 2, size / 2).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Compression, "{err}");
    assert!(
        err.to_string().contains("legacy message at offset"),
        "{err}"
    );
}

#[test]
fn first_batch_over_the_soft_limit_is_decoded_up_to_the_hard_limit() {
    let zeros = vec![0u8; 10 * MB];
    for c in Compression::ALL.into_iter().skip(1) {
        let (big, _) = batch_at(c, 40, 1, &zeros);
        let (small, _) = batch_at(c, 41, 1, b"small");
        // Alone: decoded whole, so a consumer always progresses.
        let d = decode_batches_within(big.clone(), MB, 16 * MB).unwrap();
        assert_eq!(
            d.batches[0].records[0].value.as_ref().unwrap().len(),
            10 * MB
        );
        assert!(!d.limited);
        // Followed by more: the big one used the budget up, the next waits.
        let mut two = BytesMut::from(&big[..]);
        two.extend_from_slice(&small);
        let d = decode_batches_within(two.freeze(), MB, 16 * MB).unwrap();
        assert_eq!((d.batches.len(), d.limited), (1, true), "{c}");
        // A hard limit below the soft one does not lower it.
        assert!(decode_batches_within(big.clone(), 11 * MB, 0).is_ok());
        // Over the hard limit: an error naming the batch, not a partial batch.
        let err = decode_batches_within(big, MB, 4 * MB).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Compression, "{c}: {err}");
        assert!(!err.is_retriable());
        let msg = err.to_string();
        assert!(
            msg.contains("offset 40") && msg.contains("4194304"),
            "{c}: {msg}"
        );
    }
}

#[test]
fn a_compressed_batch_after_uncompressed_ones_waits_for_the_next_call() {
    let (plain, _) = batch_at(Compression::None, 0, 3, b"plain");
    let (packed, _) = batch_at(Compression::Zstd, 3, 1, &vec![1u8; 2 * MB]);
    let mut data = BytesMut::from(&plain[..]);
    data.extend_from_slice(&packed);
    let data = data.freeze();
    let d = decode_batches_within(data.clone(), MB, 16 * MB).unwrap();
    assert_eq!((d.batches.len(), d.limited), (1, true));
    assert_eq!(d.batches[0].next_offset(), 3);
    // Uncompressed batches stay zero-copy slices of the input.
    let v = d.batches[0].records[0].value.as_ref().unwrap();
    assert!(data.as_ptr_range().contains(&v.as_ptr()));
}

fn decode_one_with(data: Bytes, max: usize) -> RecordBatch {
    decode_batches(data, max).unwrap().batches.remove(0)
}

// ---- properties ------------------------------------------------------------------------

fn header() -> impl Strategy<Value = Header> {
    (
        ".{0,8}",
        proptest::option::of(proptest::collection::vec(any::<u8>(), 0..16)),
    )
        .prop_map(|(key, value)| Header {
            key,
            value: value.map(Bytes::from),
        })
}

type RecordInput = (i64, Option<Vec<u8>>, Option<Vec<u8>>, Vec<Header>);

fn record_input() -> impl Strategy<Value = RecordInput> {
    (
        prop_oneof![any::<i64>(), 1_600_000_000_000i64..1_800_000_000_000],
        proptest::option::of(proptest::collection::vec(any::<u8>(), 0..32)),
        proptest::option::of(proptest::collection::vec(any::<u8>(), 0..300)),
        proptest::collection::vec(header(), 0..4),
    )
}

fn compression() -> impl Strategy<Value = Compression> {
    proptest::sample::select(Compression::ALL.to_vec())
}

proptest! {
    #[test]
    fn roundtrip_every_codec(
        records in proptest::collection::vec(record_input(), 0..20),
        compression in compression(),
        producer in (any::<i64>(), any::<i16>(), any::<i32>()),
        transactional: bool,
        control: bool,
        log_append: bool,
        epoch: i32,
    ) {
        let tt = if log_append { TimestampType::LogAppendTime } else { TimestampType::CreateTime };
        let mut b = RecordBatchBuilder::new(compression)
            .producer(producer.0, producer.1, producer.2)
            .transactional(transactional)
            .control(control)
            .timestamp_type(tt)
            .partition_leader_epoch(epoch);
        let mut size = b.estimated_size();
        for (ts, k, v, h) in &records {
            size += b.record_size(*ts, k.as_deref(), v.as_deref(), h).unwrap();
            b.append(*ts, k.as_deref(), v.as_deref(), h).unwrap();
            prop_assert_eq!(b.estimated_size(), size);
        }
        prop_assert_eq!(b.len(), records.len());
        let bytes = b.build().unwrap();
        let d = decode_batches(bytes, MB).unwrap();
        prop_assert!(!d.truncated);
        prop_assert_eq!(d.batches.len(), 1);
        let batch = &d.batches[0];
        let max_ts = records.iter().map(|r| r.0).max().unwrap_or(-1);
        prop_assert_eq!(batch.compression, compression);
        prop_assert_eq!(batch.timestamp_type, tt);
        prop_assert_eq!((batch.is_transactional, batch.is_control), (transactional, control));
        prop_assert_eq!((batch.producer_id, batch.producer_epoch, batch.base_sequence), producer);
        prop_assert_eq!(batch.partition_leader_epoch, epoch);
        prop_assert_eq!(batch.max_timestamp, max_ts);
        prop_assert_eq!(batch.base_timestamp, records.first().map_or(-1, |r| r.0));
        prop_assert_eq!(batch.next_offset(), records.len().max(1) as i64);
        let expected: Vec<Record> = records
            .into_iter()
            .enumerate()
            .map(|(i, (ts, k, v, h))| Record {
                offset: i as i64,
                timestamp: if log_append { max_ts } else { ts },
                key: k.map(Bytes::from),
                value: v.map(Bytes::from),
                headers: h,
            })
            .collect();
        prop_assert_eq!(&batch.records, &expected);
    }

    #[test]
    fn arbitrary_bytes_never_panic(data: Vec<u8>, max in 0usize..4096, hard in 0usize..8192) {
        let _ = decode_batches(Bytes::from(data.clone()), max);
        let _ = decode_batches_within(Bytes::from(data), max, hard);
    }

    /// Several batches of random codecs and sizes under random soft and hard limits: the
    /// result is exactly what the rule predicts — the prefix that fits (the first batch
    /// up to the hard limit), never more decompressed bytes than the larger limit, an
    /// error only for a first batch over both — and decoding call after call from where
    /// the last one stopped reads every batch.
    #[test]
    fn bounded_decoding_returns_the_prefix_that_fits(
        specs in proptest::collection::vec(
            (compression(), 0usize..40, 0usize..3000, any::<u8>()),
            1..8,
        ),
        soft in 0usize..60_000,
        hard in 0usize..120_000,
    ) {
        let mut data = BytesMut::new();
        let mut sizes = Vec::new();
        let mut base = 0i64;
        for (c, n, len, fill) in &specs {
            let value: Vec<u8> = (0..*len).map(|i| fill.wrapping_add((i % 7) as u8)).collect();
            let (bytes, payload) = batch_at(*c, base, *n, &value);
            data.extend_from_slice(&bytes);
            sizes.push(if *c == Compression::None { 0 } else { payload });
            base += (*n).max(1) as i64;
        }
        let data = data.freeze();
        // The model: batches fit while their decompressed sizes stay within the budget;
        // the first may use the larger of both limits.
        let mut budget = soft;
        let mut fit = 0;
        let mut first_too_big = false;
        for size in &sizes {
            let limit = if fit == 0 { budget.max(hard) } else { budget };
            if *size > limit {
                first_too_big = fit == 0;
                break;
            }
            budget = budget.saturating_sub(*size);
            fit += 1;
        }
        match decode_batches_within(data.clone(), soft, hard) {
            Err(e) => {
                prop_assert!(first_too_big, "unexpected error {}", e);
                prop_assert_eq!(e.kind(), ErrorKind::Compression);
                prop_assert!(e.to_string().contains("offset 0"), "{}", e);
            }
            Ok(d) => {
                prop_assert!(!first_too_big);
                prop_assert_eq!(d.batches.len(), fit);
                prop_assert_eq!(d.limited, fit < sizes.len());
                prop_assert!(!d.truncated);
                let kept: usize = sizes[..fit].iter().sum();
                prop_assert!(kept <= soft.max(hard));
                for (b, (_, n, len, _)) in d.batches.iter().zip(&specs) {
                    prop_assert_eq!(b.records.len(), *n);
                    prop_assert!(b.records.iter().all(|r| r.value.as_ref().map(Bytes::len) == Some(*len)));
                }
                // Consumer view: every batch arrives, in order, if each fits the larger limit.
                if sizes.iter().all(|s| *s <= soft.max(hard)) {
                    let (bases, _) = decode_all(data, soft, hard);
                    prop_assert_eq!(bases.len(), sizes.len());
                    prop_assert!(bases.windows(2).all(|w| w[0] < w[1]));
                }
            }
        }
    }

    #[test]
    fn mutated_batches_never_panic(
        name in proptest::sample::select(vec![
            "v2_none.bin", "v2_gzip.bin", "v2_snappy.bin", "v2_lz4.bin", "v2_zstd.bin",
            "legacy_v0_gzip.bin", "legacy_v1_snappy.bin", "legacy_v1_none.bin",
        ]),
        edits in proptest::collection::vec((any::<proptest::sample::Index>(), any::<u8>()), 1..6),
        recrc: bool,
        cut in any::<proptest::sample::Index>(),
    ) {
        let mut data = BytesMut::from(&fixture(name)[..]);
        for (i, v) in edits {
            let i = i.index(data.len());
            data[i] = v;
        }
        if recrc && data.len() > 61 && data[16] == 2 {
            fix_crc(&mut data);
        }
        let data = data.freeze();
        let _ = decode_batches(data.clone(), MB);
        let _ = decode_batches(data.slice(..cut.index(data.len() + 1)), MB);
        let _ = decode_batches_within(data.clone(), 100, 300);
        // Lazy decoding finds the same records, or an error where eager decoding does
        // (at the batch or at one of its records).
        let eager = decode_batches(data.clone(), MB);
        let lazy = decode_batches_lazy(data, MB, MB, None, true).and_then(|d| lazy_records(d.batches));
        match eager {
            Ok(e) if !e.limited => {
                let want: Vec<Record> = e.batches.into_iter().flat_map(|b| b.records).collect();
                prop_assert_eq!(lazy.ok().map(|(r, _)| r), Some(want));
            }
            Ok(_) => {}
            Err(_) => prop_assert!(lazy.is_err()),
        }
    }
}

/// A plain reference decoder of a v2 batch's uncompressed records (field by field with the
/// `Bytes` primitives, as the decoder did before its one-pass cursor): `None` where the
/// records are malformed.
fn reference_records(batch: &[u8]) -> Option<Vec<Record>> {
    use crate::protocol::primitives::{get_i8, get_varint, get_varlong};
    fn varbytes(r: &mut Bytes) -> Option<Option<Bytes>> {
        let n = get_varint(r).ok()?;
        if n == -1 {
            return Some(None);
        }
        let n = usize::try_from(n).ok().filter(|n| *n <= r.len())?;
        Some(Some(r.split_to(n)))
    }
    let base_offset = i64::from_be_bytes(batch[0..8].try_into().ok()?);
    let base_ts = i64::from_be_bytes(batch[27..35].try_into().ok()?);
    let count = usize::try_from(i32::from_be_bytes(batch[57..61].try_into().ok()?)).ok()?;
    let mut buf = Bytes::copy_from_slice(&batch[61..]);
    let mut out = Vec::new();
    for _ in 0..count {
        let len = usize::try_from(get_varint(&mut buf).ok()?).ok()?;
        if len > buf.len() {
            return None;
        }
        let mut r = buf.split_to(len);
        get_i8(&mut r).ok()?;
        let ts = get_varlong(&mut r).ok()?;
        let delta = get_varint(&mut r).ok()?;
        let key = varbytes(&mut r)?;
        let value = varbytes(&mut r)?;
        let n = usize::try_from(get_varint(&mut r).ok()?).ok()?;
        let mut headers = Vec::new();
        for _ in 0..n {
            let k = varbytes(&mut r)??;
            let key = String::from_utf8(k.to_vec()).ok()?;
            headers.push(Header {
                key,
                value: varbytes(&mut r)?,
            });
        }
        if !r.is_empty() {
            return None;
        }
        out.push(Record {
            offset: base_offset.wrapping_add(i64::from(delta)),
            timestamp: base_ts.wrapping_add(ts),
            key,
            value,
            headers,
        });
    }
    buf.is_empty().then_some(out)
}

proptest! {
    /// The one-pass record decoder agrees with the reference decoder on uncompressed
    /// batches whose record bytes were mutated (CRC recomputed, so the records are
    /// decoded): the same records, or an error exactly when the reference finds them
    /// malformed.
    #[test]
    fn record_decoding_matches_the_reference_on_mutated_records(
        records in proptest::collection::vec(record_input(), 1..12),
        edits in proptest::collection::vec((any::<proptest::sample::Index>(), any::<u8>()), 0..4),
    ) {
        let mut b = RecordBatchBuilder::new(Compression::None);
        for (ts, k, v, h) in &records {
            b.append(*ts, k.as_deref(), v.as_deref(), h).unwrap();
        }
        let mut data = BytesMut::from(&b.build().unwrap()[..]);
        let body = data.len() - BATCH_HEADER_LEN;
        for (i, v) in edits {
            if body > 0 {
                data[BATCH_HEADER_LEN + i.index(body)] = v;
            }
        }
        fix_crc(&mut data);
        let expected = reference_records(&data);
        match decode_batches(data.freeze(), MB) {
            Ok(d) => {
                prop_assert_eq!(d.batches.len(), 1);
                prop_assert_eq!(Some(d.batches[0].records.clone()), expected);
            }
            Err(e) => {
                prop_assert_eq!(e.kind(), ErrorKind::Protocol);
                prop_assert!(expected.is_none(), "decoder failed ({}) where the reference did not", e);
            }
        }
    }
}

/// A batch that does not decode after good ones: the good ones are returned (`limited`,
/// the rest left undecoded), and decoding from the bad batch alone reports its error. Before,
/// the whole response was an error and a reader lost the records before the bad batch.
#[test]
fn an_undecodable_batch_after_good_ones_keeps_the_good_ones() {
    let first = fixture("v2_none.bin");
    let mut bad = BytesMut::from(&fixture("v2_none.bin")[..]);
    let last = bad.len() - 1;
    bad[last] ^= 0xff; // covered by the CRC
    let bad = bad.freeze();
    let mut all = BytesMut::from(&first[..]);
    all.extend_from_slice(&bad);
    let d = decode_batches(all.freeze(), MB).unwrap();
    assert_eq!(d.batches.len(), 1);
    assert!(d.limited, "the rest is left for the next decode");
    assert!(!d.truncated);
    let e = decode_batches(bad, MB).unwrap_err();
    assert!(e.to_string().contains("CRC"), "{e}");
    // an unknown magic after a good batch likewise
    let mut odd = BytesMut::from(&first[..]);
    odd[16] = 7;
    let mut all = BytesMut::from(&first[..]);
    all.extend_from_slice(&odd);
    let d = decode_batches(all.freeze(), MB).unwrap();
    assert_eq!((d.batches.len(), d.limited), (1, true));
}

/// A compressed batch is built in the builder's own buffer (compressed over its records),
/// so the writer can reuse that buffer for the next batch; it decodes back.
#[test]
fn a_compressed_batch_stays_in_the_builders_buffer() {
    for c in Compression::ALL
        .into_iter()
        .filter(|c| *c != Compression::None && c.is_available())
    {
        let mut b = RecordBatchBuilder::with_capacity(c, 1 << 20);
        for i in 0..1000 {
            b.append(i, None, Some(format!("value {i}").as_bytes()), &[])
                .unwrap();
        }
        let data = b.build().unwrap();
        let values: Vec<_> = decode_batches(data.clone(), MB).unwrap().batches[0]
            .records
            .iter()
            .map(|r| r.value.clone().unwrap())
            .collect();
        assert_eq!(values.len(), 1000, "{c}");
        assert_eq!(&values[999][..], b"value 999", "{c}");
        drop(values);
        let buf = data.try_into_mut().expect("one owner");
        assert!(
            buf.capacity() >= 1 << 20,
            "{c}: capacity {}",
            buf.capacity()
        );
    }
}

/// Every record of `batches` (lazily decoded ones decoded now), with their encoded sizes.
fn lazy_records(batches: Vec<LazyBatch>) -> Result<(Vec<Record>, usize)> {
    let mut out = Vec::new();
    let mut bytes = 0;
    for b in batches {
        match b.encoded {
            Some(mut e) => {
                assert!(b.batch.records.is_empty());
                let total = e.bytes();
                while e.len() > 0 {
                    e.decode_next(|r, len| {
                        bytes += len;
                        out.push(r);
                    })?;
                }
                e.finish()?;
                assert_eq!(e.bytes(), 0);
                assert!(bytes >= total);
            }
            None => out.extend(b.batch.records),
        }
    }
    Ok((out, bytes))
}

#[test]
fn lazy_decoding_yields_the_records_and_headers_of_eager_decoding() {
    let mut all = BytesMut::new();
    for f in [
        "v2_none.bin",
        "v2_gzip.bin",
        "v2_zstd.bin",
        "legacy_v1_gzip.bin",
        "legacy_v0_none.bin",
    ] {
        all.extend_from_slice(&fixture(f));
    }
    let mut control = RecordBatchBuilder::new(Compression::None)
        .producer(7, 0, -1)
        .transactional(true)
        .control(true);
    control
        .append(
            1,
            Some(&[0, 0, 0, 0][..]),
            Some(&[0, 0, 0, 0, 0, 0][..]),
            &[],
        )
        .unwrap();
    all.extend_from_slice(&control.build().unwrap());
    let all = all.freeze();
    let eager = decode_batches(all.clone(), MB).unwrap();
    let lazy = decode_batches_lazy(all.clone(), MB, MB, None, true).unwrap();
    assert_eq!(lazy.batches.len(), eager.batches.len());
    // v2 data batches are left encoded; control batches and legacy messages are not
    let encoded: Vec<bool> = lazy.batches.iter().map(|b| b.encoded.is_some()).collect();
    assert_eq!(encoded[..3], [true; 3]);
    assert!(!encoded[3..].contains(&true));
    for (l, e) in lazy.batches.iter().zip(&eager.batches) {
        let mut header = e.clone();
        if l.encoded.is_some() {
            header.records.clear();
        }
        assert_eq!(l.batch, header);
    }
    let want: Vec<Record> = eager.batches.into_iter().flat_map(|b| b.records).collect();
    let (got, _) = lazy_records(lazy.batches).unwrap();
    assert_eq!(got, want);
}

#[test]
fn lazily_decoded_records_add_up_to_the_payload_and_trailing_bytes_are_an_error() {
    let mut b = RecordBatchBuilder::new(Compression::None);
    for i in 0..5u8 {
        b.append(
            i64::from(i),
            None,
            Some(&[i; 30][..]),
            &[Header::new("h", "v")],
        )
        .unwrap();
    }
    let raw = b.build().unwrap();
    let d = decode_batches_lazy(raw.clone(), MB, MB, None, true).unwrap();
    let payload = raw.len() - BATCH_HEADER_LEN;
    assert_eq!(
        d.batches[0].encoded.as_ref().map(|e| e.bytes()),
        Some(payload)
    );
    let (records, bytes) = lazy_records(d.batches).unwrap();
    assert_eq!((records.len(), bytes), (5, payload));
    // One record fewer declared: the last one's bytes trail, found once the others are
    // decoded (eagerly: at once).
    let mut short = BytesMut::from(&raw[..]);
    short[57..61].copy_from_slice(&4i32.to_be_bytes());
    fix_crc(&mut short);
    let short = short.freeze();
    assert!(decode_batches(short.clone(), MB).is_err());
    let d = decode_batches_lazy(short, MB, MB, None, true).unwrap();
    let err = lazy_records(d.batches).unwrap_err();
    assert!(
        err.to_string().contains("trailing bytes after 4 records"),
        "{err}"
    );
}

#[test]
fn skipping_before_an_offset_leaves_the_records_from_it() {
    let mut b = RecordBatchBuilder::new(Compression::Zstd);
    for i in 0..10u8 {
        b.append(0, None, Some(&[i][..]), &[]).unwrap();
    }
    let d = decode_batches_lazy(b.build().unwrap(), MB, MB, None, true).unwrap();
    let mut batches = d.batches;
    let e = batches[0].encoded.as_mut().unwrap();
    e.skip_before(7).unwrap();
    assert_eq!(e.len(), 3);
    let (records, _) = lazy_records(batches).unwrap();
    let offsets: Vec<i64> = records.iter().map(|r| r.offset).collect();
    assert_eq!(offsets, [7, 8, 9]);
}

/// An unusually large compressed batch does not pin its size in the thread's compression
/// buffer; an ordinary one keeps it for the next batch.
#[test]
fn the_per_thread_compression_buffer_keeps_at_most_kept_scratch() {
    let batch = |len: usize| {
        // incompressible: the compressed output is as large as the records
        let value = crate::util::noise(len, 0x2545_F491_4F6C_DD1D);
        let mut b = RecordBatchBuilder::new(Compression::Gzip);
        b.append(0, None, Some(&value), &[]).unwrap();
        b.build().unwrap()
    };
    let kept = || super::encode::COMPRESSED.with(|c| c.borrow().capacity());
    batch(100_000);
    assert!(kept() >= 100_000, "{}", kept());
    batch(2 * KEPT_SCRATCH);
    assert!(kept() <= KEPT_SCRATCH, "{}", kept());
}

/// Two batches of `codec` at offsets 0 and 50, 50 records of 100 bytes each.
fn two_compressible_batches(codec: Compression) -> (Bytes, Vec<Record>) {
    let mut all = BytesMut::new();
    for base in [0i64, 50] {
        let mut b = RecordBatchBuilder::new(codec);
        for i in 0..50u8 {
            b.append(0, None, Some(&[i; 100][..]), &[]).unwrap();
        }
        let mut raw = BytesMut::from(&b.build().unwrap()[..]);
        raw[..8].copy_from_slice(&base.to_be_bytes());
        all.extend_from_slice(&raw);
    }
    let all = all.freeze();
    let eager = decode_batches(all.clone(), MB).unwrap();
    (
        all,
        eager.batches.into_iter().flat_map(|b| b.records).collect(),
    )
}

#[test]
fn small_compressed_batches_are_decompressed_when_their_first_record_is_decoded() {
    for codec in [
        Compression::Gzip,
        Compression::Snappy,
        Compression::Lz4,
        Compression::Zstd,
    ] {
        let (all, want) = two_compressible_batches(codec);
        // No decompression budget at all: neither batch spends any of it yet.
        let d = decode_batches_lazy(all.clone(), 0, MB, None, true).unwrap();
        assert!(!d.limited, "{codec}");
        assert_eq!(d.batches.len(), 2, "{codec}");
        for b in &d.batches {
            let e = b.encoded.as_ref().unwrap();
            assert!(e.is_compressed(), "{codec}");
            assert_eq!(e.len(), 50);
            assert!(e.bytes() < 50 * 100 / 4, "{codec}: {} bytes", e.bytes());
        }
        let (got, bytes) = lazy_records(d.batches).unwrap();
        assert_eq!(got, want, "{codec}");
        assert!(bytes > 2 * 50 * 100, "{codec}: decompressed bytes {bytes}");
        // The hard limit holds when it is decompressed.
        let d = decode_batches_lazy(all, 0, 1_000, None, true).unwrap();
        let err = lazy_records(d.batches).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Compression, "{codec}: {err}");
        assert!(
            err.to_string().contains("record batch at offset 0")
                && err.to_string().contains("1000-byte limit"),
            "{codec}: {err}"
        );
    }
}

#[test]
fn large_compressed_batches_are_decompressed_at_once() {
    let mut b = RecordBatchBuilder::new(Compression::Lz4);
    let value = crate::util::noise(DEFER_MAX + 1, 7);
    b.append(0, None, Some(&value[..]), &[]).unwrap();
    let d = decode_batches_lazy(b.build().unwrap(), MB, MB, None, true).unwrap();
    let e = d.batches[0].encoded.as_ref().unwrap();
    assert!(!e.is_compressed());
    let (got, _) = lazy_records(d.batches).unwrap();
    assert_eq!(got[0].value.as_deref(), Some(&value[..]));
}

#[test]
fn a_batch_left_compressed_holds_its_own_copy_of_the_payload() {
    // A fetch response's records are one buffer: a batch left compressed must not keep
    // all of it alive (it counts only its own compressed size).
    let (all, _) = two_compressible_batches(Compression::Lz4);
    let d = decode_batches_lazy(all.clone(), 0, MB, None, true).unwrap();
    let whole = all.as_ptr_range();
    for b in &d.batches {
        let e = b.encoded.as_ref().unwrap();
        assert!(e.is_compressed());
        assert!(
            !whole.contains(&e.payload().as_ptr()),
            "a slice of the response"
        );
    }
}

#[test]
fn a_compressed_batch_claiming_more_records_than_offsets_is_an_error_at_once() {
    // Kafka's batches hold at most last_offset_delta + 1 records; one claiming more is
    // not left to be found out when it is taken (it would count that many messages).
    let (all, _) = two_compressible_batches(Compression::Zstd);
    let first = 12 + i32::from_be_bytes(all[8..12].try_into().unwrap()) as usize;
    let mut bad = BytesMut::from(&all[..first]);
    bad[57..61].copy_from_slice(&i32::MAX.to_be_bytes());
    fix_crc(&mut bad);
    let err = decode_batches_lazy(bad.freeze(), 0, MB, None, true).unwrap_err();
    assert!(err.to_string().contains("record count"), "{err}");
}

proptest! {
    /// Values appended as shared bytes: an uncompressed batch keeps the large ones by
    /// reference and its bytes are exactly those of the batch with every value copied
    /// (same CRC); a compressed batch compresses them from where they are, into exactly
    /// the bytes of the batch with every value copied, and keeps none.
    #[test]
    fn shared_values_make_the_same_batch_as_copied_ones(
        sizes in proptest::collection::vec(
            prop_oneof![
                0..100usize,
                super::encode::COMPRESSED_SHARE_MIN - 2..super::encode::COMPRESSED_SHARE_MIN + 2,
                VALUE_SPLICE_MIN - 2..VALUE_SPLICE_MIN + 2,
                20_000..20_100usize,
                70_000..70_100usize,
            ],
            1..12,
        ),
        compression in proptest::sample::select(
            Compression::ALL.into_iter().filter(|c| c.is_available()).collect::<Vec<_>>(),
        ),
    ) {
        let (mut shared, mut copied) = (
            RecordBatchBuilder::new(compression),
            RecordBatchBuilder::new(compression),
        );
        let values: Vec<Bytes> = sizes
            .iter()
            .enumerate()
            .map(|(i, n)| (0..*n).map(|j| (i * 31 + j) as u8).collect())
            .collect();
        for (i, v) in values.iter().enumerate() {
            let headers = [Header::new("h", format!("{i}"))];
            shared.append_shared(i as i64, Some(b"k"), Some(v), &headers).unwrap();
            copied.append(i as i64, Some(b"k"), Some(v), &headers).unwrap();
            prop_assert_eq!(shared.estimated_size(), copied.estimated_size());
        }
        let large = sizes.iter().filter(|n| **n >= VALUE_SPLICE_MIN).count();
        let (batch, _) = shared.build_compact().unwrap();
        let expected = if compression == Compression::None { large } else { 0 };
        prop_assert_eq!(batch.spliced_values().len(), expected);
        let copied = copied.build().unwrap();
        prop_assert_eq!(&batch.to_bytes(), &copied);
        let decoded = decode_batches(batch.to_bytes(), 1 << 30).unwrap();
        let got: Vec<_> = decoded.batches[0].records.iter().map(|r| r.value.clone().unwrap()).collect();
        prop_assert_eq!(got, values);
    }
}

/// An uncompressed batch of large shared values writes a few bytes around them into its
/// buffer: those are copied out and the large buffer comes back for the next batch.
#[test]
fn a_batch_of_spliced_values_gives_its_large_buffer_back() {
    let value = Bytes::from(vec![b'x'; 10_000]);
    let mut b = RecordBatchBuilder::with_capacity(Compression::None, 1 << 20);
    for i in 0..100 {
        b.append_shared(1_700_000_000_000 + i, None, Some(&value), &[])
            .unwrap();
    }
    assert_eq!(b.estimated_size(), b.buffer_len() + 100 * value.len());
    let (data, emptied) = b.build_compact().unwrap();
    let emptied = emptied.expect("the buffer comes back");
    assert!(emptied.is_empty() && emptied.capacity() >= 1 << 20);
    assert_eq!(data.spliced_values().len(), 100);
    assert!(data.head().len() < 2_000, "{}", data.head().len());
    let batch = decode_one(data.to_bytes());
    assert_eq!(batch.records.len(), 100);
    assert!(batch
        .records
        .iter()
        .all(|r| r.value.as_ref() == Some(&value)));
}

/// A compressed batch far smaller than its buffer is copied out to bytes of its size and
/// the buffer handed back for the next batch; an uncompressed batch, or one filling a good
/// part of its buffer, keeps it.
#[cfg(feature = "lz4")]
#[test]
fn a_small_compressed_batch_gives_its_large_buffer_back() {
    let fill = |compression, value: &[u8]| {
        let mut b = RecordBatchBuilder::with_capacity(compression, 1 << 20);
        for i in 0..100 {
            b.append(1_700_000_000_000 + i, None, Some(value), &[])
                .unwrap();
        }
        b
    };
    let value = vec![b'x'; 10_000];
    let (data, emptied) = fill(Compression::Lz4, &value).build_compact().unwrap();
    let emptied = emptied.expect("the buffer comes back");
    assert!(emptied.is_empty() && emptied.capacity() >= 1 << 20);
    assert!(data.len() < 64 << 10, "{}", data.len());
    let batch = decode_one(data.to_bytes());
    assert_eq!(batch.records.len(), 100);
    assert!(batch
        .records
        .iter()
        .all(|r| r.value.as_deref() == Some(&value[..])));

    let (data, emptied) = fill(Compression::None, &value).build_compact().unwrap();
    assert!(emptied.is_none(), "uncompressed records fill their buffer");
    assert_eq!(decode_one(data.to_bytes()).records.len(), 100);

    let mut b = RecordBatchBuilder::with_capacity(Compression::Lz4, 1 << 20);
    let mut x = 0x2545_f491_u32;
    for i in 0..100 {
        let noise: Vec<u8> = (0..10_000)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                x as u8
            })
            .collect();
        b.append(1_700_000_000_000 + i, None, Some(&noise), &[])
            .unwrap();
    }
    let (_, emptied) = b.build_compact().unwrap();
    assert!(
        emptied.is_none(),
        "a batch that hardly compresses keeps its buffer"
    );
}
