//! A tiny std-only benchmark of record batch encode/decode per codec:
//! `cargo bench --bench record`. Prints MB/s of uncompressed record bytes, and the same
//! decode done by the `kafka-protocol` crate (a dev-dependency) in the same run as the
//! baseline, with the ratio (>1: kafkapipe is faster).

use std::hint::black_box;
use std::time::{Duration, Instant};

use kafkapipe::compression::Compression;
use kafkapipe::record::{decode_batches, Header, RecordBatchBuilder};

const RECORDS: usize = 1000;
const VALUE_LEN: usize = 200;

fn build(
    compression: Compression,
    value: &[u8],
    headers: &[Header],
) -> kafkapipe::Result<bytes::Bytes> {
    let mut b = RecordBatchBuilder::with_capacity(compression, RECORDS * (VALUE_LEN + 40));
    for i in 0..RECORDS {
        let key = (i as u64).to_be_bytes();
        b.append(
            1_700_000_000_000 + i as i64,
            Some(&key),
            Some(value),
            headers,
        )?;
    }
    b.build()
}

/// Run `f` repeatedly for about half a second; return the mean time per call. Under
/// `cargo test` (no `--bench` argument) run it once: a smoke test, not a measurement.
fn time(mut f: impl FnMut()) -> Duration {
    f(); // warm up
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
    let headers = [Header::new("trace-id", "0123456789abcdef")];
    let raw_bytes = (RECORDS * VALUE_LEN) as f64;
    for c in Compression::ALL.into_iter().filter(|c| c.is_available()) {
        let batch = build(c, &value, &headers)?;
        let enc = time(|| {
            black_box(build(c, black_box(&value), &headers).ok());
        });
        let dec = time(|| {
            black_box(decode_batches(black_box(batch.clone()), 64 << 20).ok());
        });
        let base = time(|| {
            let mut b = black_box(batch.clone());
            black_box(kafka_protocol::records::RecordBatchDecoder::decode_all(&mut b).ok());
        });
        let mbps = |d: Duration| raw_bytes / d.as_secs_f64() / 1e6;
        println!(
            "{:<7} {:>7} bytes  encode {:>9.1?} ({:>6.0} MB/s)  decode {:>9.1?} ({:>6.0} MB/s)  \
             kafka-protocol decode {:>9.1?} ({:>6.0} MB/s)  ratio {:.2}",
            c.name(),
            batch.len(),
            enc,
            mbps(enc),
            dec,
            mbps(dec),
            base,
            mbps(base),
            base.as_secs_f64() / dec.as_secs_f64()
        );
    }
    Ok(())
}
