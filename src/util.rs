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

/// Quota throttle times reported by the broker in one kind of response (produce or fetch),
/// for the `throttle_time_avg`/`throttle_time_max` stats: every answered request counts,
/// throttled or not, as the Java client's `produce-throttle-time-avg` does.
#[derive(Debug, Default)]
pub(crate) struct ThrottleTimes {
    responses: std::sync::atomic::AtomicU64,
    total_ms: std::sync::atomic::AtomicU64,
    max_ms: std::sync::atomic::AtomicU64,
}

impl ThrottleTimes {
    /// One response's `throttle_time_ms` (negative counts as 0).
    pub(crate) fn record(&self, throttle_time_ms: i32) {
        use std::sync::atomic::Ordering::Relaxed;
        let ms = u64::try_from(throttle_time_ms).unwrap_or(0);
        self.responses.fetch_add(1, Relaxed);
        self.total_ms.fetch_add(ms, Relaxed);
        self.max_ms.fetch_max(ms, Relaxed);
    }

    /// The mean throttle time over every recorded response.
    pub(crate) fn avg(&self) -> Duration {
        use std::sync::atomic::Ordering::Relaxed;
        let n = self.responses.load(Relaxed).max(1);
        Duration::from_micros(self.total_ms.load(Relaxed).saturating_mul(1000) / n)
    }

    /// Responses recorded and the sum of their throttle times in ms (for interval means).
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    pub(crate) fn totals(&self) -> (u64, u64) {
        use std::sync::atomic::Ordering::Relaxed;
        (self.responses.load(Relaxed), self.total_ms.load(Relaxed))
    }

    /// The longest throttle time recorded.
    pub(crate) fn max(&self) -> Duration {
        Duration::from_millis(self.max_ms.load(std::sync::atomic::Ordering::Relaxed))
    }
}
