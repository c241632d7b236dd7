//! Peak memory of bounded record decoding, measured as the growth of this process's peak
//! RSS (`VmHWM`, reset through `/proc/self/clear_refs` before each decode): a
//! decompression bomb, and a response of many batches that each decompress to a few MiB,
//! must cost about the decompression limits, not the hundreds of MiB they expand to.
//! (Linux only; each case runs in this binary's single test, so nothing else allocates.)

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use bytes::{Bytes, BytesMut};
use kafkapipe::compression::Compression;
use kafkapipe::record::{decode_batches_within, RecordBatchBuilder};
use kafkapipe::ErrorKind;

const MB: usize = 1 << 20;

fn status_kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap()
}

/// How much the peak RSS grew, in MiB, while `f` ran.
fn peak_growth_mib<T>(f: impl FnOnce() -> T) -> (T, u64) {
    std::fs::write("/proc/self/clear_refs", "5").expect("reset VmHWM (Linux 4.0+)");
    let before = status_kib("VmRSS");
    let out = f();
    let peak = status_kib("VmHWM");
    (out, peak.saturating_sub(before) / 1024)
}

/// A batch at `base` holding one record of `len` zero bytes, compressed with `c`.
fn zeros_batch(c: Compression, base: i64, len: usize) -> Bytes {
    let mut b = RecordBatchBuilder::new(c);
    b.append(0, None, Some(&vec![0u8; len]), &[]).unwrap();
    let mut bytes = BytesMut::from(&b.build().unwrap()[..]);
    bytes[0..8].copy_from_slice(&base.to_be_bytes());
    bytes.freeze()
}

#[test]
fn bombs_and_many_expanding_batches_cost_about_the_limits() {
    const SOFT: usize = 4 * MB;
    const HARD: usize = 16 * MB;
    // Unbounded decoding would take 128 MiB or more in each case below.
    const BOUND_MIB: u64 = 48;
    for c in Compression::ALL.into_iter().skip(1) {
        let bomb = zeros_batch(c, 0, 128 * MB);
        let mut many = BytesMut::new();
        for i in 0..32 {
            many.extend_from_slice(&zeros_batch(c, i, 4 * MB));
        }
        let many = many.freeze();
        let mut small_then_bomb = BytesMut::from(&zeros_batch(c, 0, 1000)[..]);
        small_then_bomb.extend_from_slice(&zeros_batch(c, 1, 128 * MB));
        let small_then_bomb = small_then_bomb.freeze();

        let mut grown = Vec::new();
        let (r, grew) = peak_growth_mib(|| decode_batches_within(bomb.clone(), SOFT, HARD));
        grown.push(grew);
        let err = r.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Compression, "{c}: {err}");
        assert!(
            grew < BOUND_MIB,
            "{c}: bomb grew the peak RSS by {grew} MiB"
        );

        let (r, grew) = peak_growth_mib(|| decode_batches_within(many.clone(), SOFT, HARD));
        grown.push(grew);
        let d = r.unwrap();
        assert!(
            d.limited && d.batches.len() == 1,
            "{c}: {}",
            d.batches.len()
        );
        assert!(
            grew < BOUND_MIB,
            "{c}: 32 × 4 MiB grew the peak RSS by {grew} MiB"
        );
        drop(d);

        let (r, grew) = peak_growth_mib(|| decode_batches_within(small_then_bomb, SOFT, HARD));
        grown.push(grew);
        let d = r.unwrap();
        assert!(d.limited && d.batches.len() == 1, "{c}");
        assert!(
            grew < BOUND_MIB,
            "{c}: small then bomb grew the peak by {grew} MiB"
        );
        eprintln!("{c}: peak RSS grew by {grown:?} MiB (bomb, many, small then bomb)");
    }
}
