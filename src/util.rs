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
