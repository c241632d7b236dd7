//! Small crate-private helpers shared by the client layers.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A duration as the `INT32` milliseconds of a request field (timeouts, max wait),
/// saturating at `i32::MAX`.
pub(crate) fn duration_ms(d: Duration) -> i32 {
    i32::try_from(d.as_millis()).unwrap_or(i32::MAX)
}

/// Milliseconds since the Unix epoch (0 if the clock is before it).
pub(crate) fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// Fibonacci hashing (one multiplication) for maps keyed by small integers the crate
/// makes or bounds itself: the reader's partition ids (its own counter) and the writer's
/// partition numbers (as many as a topic's partitions). Their lookups are per message,
/// where SipHash showed in the profiles; such keys cannot be chosen by the network or the
/// application to collide. Other input is folded in byte by byte.
#[derive(Default, Clone, Copy)]
pub(crate) struct FibHasher(u64);

const FIB: u64 = 0x9E37_79B9_7F4A_7C15;

impl std::hash::Hasher for FibHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(*b)).wrapping_mul(FIB);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0 ^ n).wrapping_mul(FIB);
    }

    fn write_i32(&mut self, n: i32) {
        self.write_u64(u64::from(u32::from_ne_bytes(n.to_ne_bytes())));
    }
}

/// [`BuildHasher`](std::hash::BuildHasher) of [`FibHasher`].
pub(crate) type Fib = std::hash::BuildHasherDefault<FibHasher>;

/// `len` incompressible bytes (xorshift64 from `seed`), for tests that need payloads no
/// codec can shrink.
#[cfg(test)]
pub(crate) fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.max(1);
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}
