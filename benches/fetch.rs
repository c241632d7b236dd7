//! Decode of whole fetch responses per codec, as the `Reader` does it for every response:
//! `cargo bench --bench fetch`. A v12 Fetch response of 6 partitions, each holding 4
//! batches of 1000 records (200-byte values, one header), is decoded frame-first
//! (`FetchResponse::decode`) and then record batches (`decode_batches`) per partition.
//! Prints MB/s of uncompressed record values, std-only like `benches/record.rs` (no
//! criterion in the dependency set). Under `cargo test` it runs each case once.

use std::hint::black_box;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use kafkapipe::compression::Compression;
use kafkapipe::protocol::messages::{FetchPartitionData, FetchResponse, FetchableTopicResponse};
use kafkapipe::protocol::{Decode, Encode};
use kafkapipe::record::{decode_batches, Header, RecordBatchBuilder};

const PARTITIONS: i32 = 6;
const BATCHES: i64 = 4;
const RECORDS: i64 = 1000;
const VALUE_LEN: usize = 200;
const VERSION: i16 = 12;

fn batch(c: Compression, base: i64, value: &[u8]) -> kafkapipe::Result<Bytes> {
    let headers = [Header::new("trace-id", "0123456789abcdef")];
    let mut b = RecordBatchBuilder::with_capacity(c, RECORDS as usize * (VALUE_LEN + 40));
    for i in 0..RECORDS {
        let key = (base + i).to_be_bytes();
        b.append(1_700_000_000_000 + i, Some(&key), Some(value), &headers)?;
    }
    let mut bytes = BytesMut::from(&b.build()?[..]);
    // The base offset is not covered by the CRC.
    bytes[..8].copy_from_slice(&base.to_be_bytes());
    Ok(bytes.freeze())
}

fn response(c: Compression, value: &[u8]) -> kafkapipe::Result<Bytes> {
    let mut partitions = Vec::new();
    for p in 0..PARTITIONS {
        let mut records = BytesMut::new();
        for b in 0..BATCHES {
            records.extend_from_slice(&batch(c, b * RECORDS, value)?);
        }
        partitions.push(FetchPartitionData {
            partition_index: p,
            high_watermark: BATCHES * RECORDS,
            records: Some(records.freeze()),
            ..FetchPartitionData::default()
        });
    }
    let resp = FetchResponse {
        responses: vec![FetchableTopicResponse {
            topic: "bench".to_string(),
            partitions,
            ..FetchableTopicResponse::default()
        }],
        ..FetchResponse::default()
    };
    let mut buf = BytesMut::new();
    resp.encode(&mut buf, VERSION)?;
    Ok(buf.freeze())
}

/// Decode the response and all its batches; return the records seen.
fn decode(frame: &Bytes) -> kafkapipe::Result<usize> {
    let mut buf = frame.clone();
    let resp = FetchResponse::decode(&mut buf, VERSION)?;
    let mut n = 0;
    for t in resp.responses {
        for p in t.partitions {
            let d = decode_batches(p.records.unwrap_or_default(), 64 << 20)?;
            n += d.batches.iter().map(|b| b.records.len()).sum::<usize>();
        }
    }
    Ok(n)
}

/// Mean time per call over about half a second; once under `cargo test`.
fn time(mut f: impl FnMut()) -> Duration {
    f();
    if !std::env::args().any(|a| a == "--bench") {
        let start = Instant::now();
        f();
        return start.elapsed();
    }
    let start = Instant::now();
    let mut n = 0u32;
    while start.elapsed() < Duration::from_millis(500) {
        f();
        n += 1;
    }
    start.elapsed() / n.max(1)
}

fn main() -> kafkapipe::Result<()> {
    let value: Vec<u8> = (0..VALUE_LEN)
        .map(|i| b"kafkapipe record value "[i % 23])
        .collect();
    let records = (i64::from(PARTITIONS) * BATCHES * RECORDS) as usize;
    let raw = (records * VALUE_LEN) as f64;
    for c in Compression::ALL.into_iter().filter(|c| c.is_available()) {
        let frame = response(c, &value)?;
        if decode(&frame)? != records {
            return Err(kafkapipe::Error::protocol("wrong record count"));
        }
        let d = time(|| {
            black_box(decode(black_box(&frame)).ok());
        });
        println!(
            "{:<7} response {:>9} bytes  decode {:>9.1?}  {:>6.0} MB/s  {:>5.2} M records/s",
            c.name(),
            frame.len(),
            d,
            raw / d.as_secs_f64() / 1e6,
            records as f64 / d.as_secs_f64() / 1e6
        );
    }
    Ok(())
}
