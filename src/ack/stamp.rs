//! When a group reader yielded a message, for
//! [`ReaderStats::oldest_unacked`](crate::reader::ReaderStats::oldest_unacked).
//!
//! Every message a group reader yields is stamped, so the clock is read once per message.
//! `Instant::now` (the vDSO's `CLOCK_MONOTONIC`) cost about 20 ns a read on the
//! benchmark machine, 11% of a group reader's CPU on 100-byte records. On Linux the
//! stamp reads `CLOCK_MONOTONIC_COARSE` instead: the same clock as the kernel saw it at
//! its last tick (1–10 ms ago, by its `HZ`), read without the time-stamp counter. An age
//! is measured to the precise clock (read only when stats are taken), so it is
//! overstated by less than one tick and never understated: plenty for a gauge of stuck
//! messages.
//! Elsewhere it is `Instant`.

use std::time::Duration;

/// A point on a monotonic clock, coarse on Linux (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Stamp(u64);

impl Stamp {
    /// Now.
    #[inline]
    pub(crate) fn now() -> Stamp {
        Stamp(now_ns())
    }

    /// How long ago this was, never less than the time that really passed since
    /// [`now`](Self::now) was read: measured to the precise clock, against which a
    /// coarse stamp is early by up to one tick, so the age is overstated by less than a
    /// tick rather than understated (a message stuck for a second shows at least a
    /// second).
    pub(crate) fn elapsed(self) -> Duration {
        Duration::from_nanos(precise_ns().saturating_sub(self.0))
    }
}

/// `CLOCK_MONOTONIC_COARSE`: the monotonic clock as of the kernel's last tick.
#[cfg(any(target_os = "linux", target_os = "android"))]
#[inline]
fn now_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC_COARSE)
}

/// The same clock as [`now_ns`], read to the nanosecond: `CLOCK_MONOTONIC`, of which
/// `CLOCK_MONOTONIC_COARSE` is the value at the last tick (so never ahead of it).
#[cfg(any(target_os = "linux", target_os = "android"))]
fn precise_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}

#[cfg(any(target_os = "linux", target_os = "android"))]
#[allow(unsafe_code)]
#[inline]
fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; both monotonic clocks exist on every
    // Linux since 2.6.32 and cannot fail with a valid pointer.
    let rc = unsafe { libc::clock_gettime(clock, &mut ts) };
    if rc != 0 {
        return fallback_ns();
    }
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}

#[cfg(not(any(target_os = "linux", target_os = "android")))]
#[inline]
fn now_ns() -> u64 {
    fallback_ns()
}

#[cfg(not(any(target_os = "linux", target_os = "android")))]
fn precise_ns() -> u64 {
    fallback_ns()
}

/// Nanoseconds on `Instant`'s clock since the first call.
#[cold]
fn fallback_ns() -> u64 {
    use std::sync::OnceLock;
    use std::time::Instant;
    static BASE: OnceLock<Instant> = OnceLock::new();
    let base = *BASE.get_or_init(Instant::now);
    u64::try_from(base.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An age is never less than the time that passed since the stamp (a stuck pipeline
    /// must not look younger than it is): with both ends read from the coarse clock, an
    /// age came out up to one tick short (999.99998 ms after a 1 s wait, in
    /// `pipeline_broker`).
    #[test]
    fn an_age_is_never_less_than_the_time_that_passed() {
        for _ in 0..200 {
            let stamp = Stamp::now();
            let since = std::time::Instant::now();
            std::thread::sleep(Duration::from_micros(700));
            let passed = since.elapsed();
            let age = stamp.elapsed();
            assert!(age >= passed, "age {age:?} < {passed:?} passed");
        }
    }

    #[test]
    fn a_stamp_ages_with_the_clock_and_never_goes_back() {
        let first = Stamp::now();
        let mut last = first;
        for _ in 0..1000 {
            let s = Stamp::now();
            assert!(s >= last, "the clock went back: {s:?} after {last:?}");
            last = s;
        }
        std::thread::sleep(Duration::from_millis(30));
        let age = first.elapsed();
        // At least the sleep, less one coarse tick (at most 10 ms); at most a lot more
        // on a loaded machine, but not a wrong unit.
        assert!(age >= Duration::from_millis(20), "age {age:?}");
        assert!(age < Duration::from_secs(60), "age {age:?}");
    }
}
