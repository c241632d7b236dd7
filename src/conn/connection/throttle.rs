//! KIP-219 client-side quota throttling of a [`Connection`].
//!
//! A response whose `throttle_time_ms` the client must honour (see
//! [`crate::protocol::throttle`]) opens a window, counted from the response's arrival,
//! during which the driver writes nothing (the Java client's per-node `throttleUntil`).
//! This file owns that window ([`Throttle`]: until when, and the total throttled time)
//! and the request timeout that does not count the time a request was held back by it
//! ([`Connection::timeout_unthrottled`]). May not: read responses or hold the writer —
//! the driver (`driver.rs`) reports each throttle time here and asks whether to wait.
//!
//! Reference: KIP-219 (<https://cwiki.apache.org/confluence/display/KAFKA/KIP-219>).

use std::time::Duration;

use super::driver::State;
use super::{lock, Connection};

/// A connection's quota throttle: until when nothing may be written, and the total
/// throttled time so far (each throttle counting only what it added to the window), from
/// which a request's timeout learns how long it was held back.
#[derive(Debug, Default)]
pub(super) struct Throttle {
    until: Option<tokio::time::Instant>,
    total: Duration,
}

/// Where the throttle stood when a request started (see [`State::throttled_since`]).
struct ThrottleMark {
    total: Duration,
    remaining: Duration,
}

impl State {
    /// The broker asked for `ms` of quiet from `now` on: extend the throttle window.
    pub(super) fn throttle(&self, now: tokio::time::Instant, ms: i32) {
        let until = now + Duration::from_millis(u64::try_from(ms).unwrap_or(0));
        let mut t = lock(&self.throttle);
        let from = t.until.map_or(now, |u| u.max(now));
        if until > from {
            t.total += until - from;
            t.until = Some(until);
        }
    }

    /// The end of the running throttle, if one runs.
    pub(super) fn throttled_until(&self) -> Option<tokio::time::Instant> {
        lock(&self.throttle)
            .until
            .filter(|u| *u > tokio::time::Instant::now())
    }

    fn throttle_mark(&self, now: tokio::time::Instant) -> ThrottleMark {
        let t = lock(&self.throttle);
        ThrottleMark {
            total: t.total,
            remaining: t
                .until
                .map_or(Duration::ZERO, |u| u.saturating_duration_since(now)),
        }
    }

    /// How much throttled time falls after `mark` was taken (an upper bound: the rest of
    /// the throttle then running, and every throttle added since).
    fn throttled_since(&self, mark: &ThrottleMark) -> Duration {
        let total = lock(&self.throttle).total;
        mark.remaining + total.saturating_sub(mark.total)
    }
}

impl Connection {
    /// Until when the broker throttles this connection (KIP-219): `Some` while a quota
    /// throttle time is running, during which no request is written. See
    /// [`crate::protocol::throttle`].
    ///
    /// ```no_run
    /// # async fn f(conn: kafkapipe::conn::Connection) {
    /// if let Some(until) = conn.throttled_until() {
    ///     println!("throttled for {:?} more", until - tokio::time::Instant::now());
    /// }
    /// # }
    /// ```
    pub fn throttled_until(&self) -> Option<tokio::time::Instant> {
        self.shared.state.throttled_until()
    }

    /// Run `work` for at most `timeout`, not counting the time this connection is
    /// throttled by a quota meanwhile (KIP-219): a request held back by the throttle has
    /// its whole timeout once it may go. `None` if the time ran out.
    pub(crate) async fn timeout_unthrottled<F: std::future::Future>(
        &self,
        timeout: Duration,
        work: F,
    ) -> Option<F::Output> {
        let state = &self.shared.state;
        let start = tokio::time::Instant::now();
        let mark = state.throttle_mark(start);
        tokio::pin!(work);
        // A timeout too large to add to an instant (`Duration::MAX` settings) never ends.
        let deadline = || {
            start
                .checked_add(timeout)
                .and_then(|d| d.checked_add(state.throttled_since(&mark)))
        };
        loop {
            let Some(at) = deadline() else {
                return Some(work.await);
            };
            if let Ok(out) = tokio::time::timeout_at(at, &mut work).await {
                return Some(out);
            }
            if deadline().is_some_and(|at| at <= tokio::time::Instant::now()) {
                return None;
            }
        }
    }
}
