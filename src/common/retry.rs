//! The reader's retry policy, shared by the fetch task and the group task: which errors
//! are fatal (yielded at once) and which transient (retried with backoff until
//! [`ReaderConfig::retry_timeout`], then yielded), the run of consecutive failures each
//! partition and the group membership keep, and the rate limit of the `warn` lines that
//! make retried failures visible. See [`ReaderConfig::retry_timeout`] for the policy.
//! The knobs come through [`RetryPolicy`] (which `ReaderConfig` implements), so this
//! module sits below both of its users.
//!
//! [`ReaderConfig::retry_timeout`]: crate::reader::ReaderConfig::retry_timeout

use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::error::{Error, ErrorKind};
use crate::protocol::ErrorCode;

/// The knobs of a retry: how long a run of transient failures is retried before the
/// error is yielded, and the backoff after the `failures`th failure in a row.
pub(crate) trait RetryPolicy {
    /// How long a run of transient failures lasts before its error is yielded.
    fn retry_timeout(&self) -> Duration;
    /// The backoff after the `failures`th failure in a row.
    fn backoff_for(&self, failures: u32) -> Duration;
}

/// At most one `warn` line about retried failures per this long per reader.
const WARN_EVERY: Duration = Duration::from_secs(10);

/// Whether `e` is fatal for a reader: retrying cannot help until someone changes the
/// cluster's or the client's configuration, so it is yielded at once. Everything else is
/// transient. Undecodable record data is fatal too, but is recognised where it is decoded
/// (a request-level `Protocol` error is a garbled frame: transient).
pub(crate) fn is_fatal(e: &Error) -> bool {
    if e.is_authentication() {
        return true;
    }
    match e.kind() {
        ErrorKind::UnsupportedVersion | ErrorKind::Config | ErrorKind::Encode => true,
        ErrorKind::Kafka(c) => matches!(
            c,
            ErrorCode::TopicAuthorizationFailed
                | ErrorCode::GroupAuthorizationFailed
                | ErrorCode::ClusterAuthorizationFailed
                | ErrorCode::UnsupportedVersion
                | ErrorCode::UnsupportedCompressionType
                | ErrorCode::FencedInstanceId
                | ErrorCode::InconsistentGroupProtocol
                | ErrorCode::InvalidGroupId
                | ErrorCode::InvalidSessionTimeout
                | ErrorCode::GroupMaxSizeReached
        ),
        _ => false,
    }
}

/// `now + after`, or a time so far ahead that it never comes (for `Duration::MAX`).
pub(crate) fn deadline_after(after: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(after)
        .or_else(|| now.checked_add(Duration::from_secs(100 * 365 * 24 * 3600)))
        .unwrap_or(now)
}

/// A run of consecutive transient failures of one thing: a partition's fetches and
/// lookups, or the group membership's joins.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Streak {
    /// Failures in a row (for the backoff).
    pub(crate) failures: u32,
    /// When the current window began: the first failure of the run, or the last time
    /// the error was yielded.
    since: Option<Instant>,
}

impl Streak {
    /// A transient failure at `now`: the backoff before the next attempt, and whether the
    /// run has lasted `retry_timeout` (the error is then yielded and the window starts
    /// over).
    pub(crate) fn fail(&mut self, now: Instant, config: &impl RetryPolicy) -> (Duration, bool) {
        self.failures = self.failures.saturating_add(1);
        let since = *self.since.get_or_insert(now);
        let expired = now.saturating_duration_since(since) >= config.retry_timeout();
        if expired {
            self.since = Some(now);
        }
        (config.backoff_for(self.failures), expired)
    }

    /// A fatal failure: counted for the backoff, the window untouched.
    pub(crate) fn fail_fatally(&mut self) {
        self.failures = self.failures.saturating_add(1);
    }

    /// Something succeeded: the run is over.
    pub(crate) fn reset(&mut self) {
        *self = Streak::default();
    }

    /// How long the current window has lasted.
    pub(crate) fn failing_for(&self, now: Instant) -> Duration {
        self.since
            .map_or(Duration::ZERO, |s| now.saturating_duration_since(s))
    }
}

#[derive(Debug, Default)]
struct LimitState {
    last_warn: Option<Instant>,
    suppressed: u64,
}

/// The rate limit of `warn` lines about retried failures: one per 10 s (the others go to
/// `debug`), each saying how many were left out. The fetch task and the group task have
/// one each, so neither hides the other's failures.
#[derive(Debug, Default)]
pub(crate) struct WarnLimit(Mutex<LimitState>);

impl WarnLimit {
    /// `Some(lines left out since the last warn)` if a `warn` line may be written now.
    pub(crate) fn permit(&self, now: Instant) -> Option<u64> {
        let mut st = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match st.last_warn {
            Some(t) if now.saturating_duration_since(t) < WARN_EVERY => {
                st.suppressed = st.suppressed.saturating_add(1);
                None
            }
            _ => {
                st.last_warn = Some(now);
                Some(std::mem::take(&mut st.suppressed))
            }
        }
    }
}

/// The last failure a reader saw (fetch task or group task), for
/// [`ReaderStats::last_error`](crate::reader::ReaderStats::last_error).
#[derive(Debug, Default)]
pub(crate) struct LastError(Mutex<Option<String>>);

impl LastError {
    pub(crate) fn set(&self, e: &Error) {
        *self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(e.to_string());
    }

    pub(crate) fn get(&self) -> Option<String> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reader::ReaderConfig;

    fn config(retry_timeout: Duration) -> ReaderConfig {
        ReaderConfig::new(["b:9092"])
            .read_backoff(Duration::from_millis(100), Duration::from_secs(1))
            .retry_timeout(retry_timeout)
    }

    #[test]
    fn transient_failures_back_off_and_expire_after_the_timeout() {
        let c = config(Duration::from_secs(60));
        let t0 = Instant::now();
        let mut s = Streak::default();
        assert_eq!(s.fail(t0, &c), (Duration::from_millis(100), false));
        assert_eq!(
            s.fail(t0 + Duration::from_secs(1), &c),
            (Duration::from_millis(200), false)
        );
        for i in 2..20 {
            let (backoff, expired) = s.fail(t0 + Duration::from_secs(i), &c);
            assert!(backoff <= Duration::from_secs(1));
            assert!(!expired);
        }
        assert_eq!(
            s.failing_for(t0 + Duration::from_secs(30)),
            Duration::from_secs(30)
        );
        // the run lasted the timeout: yield, and the window starts over
        assert!(s.fail(t0 + Duration::from_secs(60), &c).1);
        assert!(!s.fail(t0 + Duration::from_secs(61), &c).1);
        assert!(s.fail(t0 + Duration::from_secs(120), &c).1);
        s.reset();
        assert_eq!(s, Streak::default());
        assert!(!s.fail(t0 + Duration::from_secs(500), &c).1);
    }

    #[test]
    fn zero_yields_every_failure_and_max_never() {
        let now = Instant::now();
        let mut s = Streak::default();
        assert!(s.fail(now, &config(Duration::ZERO)).1);
        assert!(s.fail(now, &config(Duration::ZERO)).1);
        let mut s = Streak::default();
        let c = config(Duration::MAX);
        assert!(!s.fail(now, &c).1);
        assert!(!s.fail(now + Duration::from_secs(1_000_000), &c).1);
        assert!(deadline_after(Duration::MAX) > now + Duration::from_secs(1_000_000));
    }

    #[test]
    fn fatal_and_transient_errors() {
        for fatal in [
            Error::kafka(ErrorCode::TopicAuthorizationFailed),
            Error::kafka(ErrorCode::GroupAuthorizationFailed),
            Error::kafka(ErrorCode::SaslAuthenticationFailed),
            Error::kafka(ErrorCode::FencedInstanceId),
            Error::kafka(ErrorCode::UnsupportedVersion),
            Error::new(ErrorKind::UnsupportedVersion, "no Fetch"),
            Error::new(ErrorKind::Tls, "bad certificate"),
            Error::new(ErrorKind::Authentication, "bad server signature"),
        ] {
            assert!(is_fatal(&fatal), "{fatal}");
        }
        for transient in [
            Error::kafka(ErrorCode::NotLeaderOrFollower),
            Error::kafka(ErrorCode::UnknownTopicOrPartition),
            Error::kafka(ErrorCode::CoordinatorNotAvailable),
            Error::kafka(ErrorCode::UnknownServerError),
            Error::kafka(ErrorCode::RequestTimedOut),
            Error::new(ErrorKind::Io, "connect failed"),
            Error::new(ErrorKind::Timeout, "fetch timed out"),
            Error::closed("connection closed"),
            Error::new(ErrorKind::Metadata, "no leader"),
            Error::protocol("garbled frame"),
        ] {
            assert!(!is_fatal(&transient), "{transient}");
        }
    }

    #[test]
    fn warn_lines_are_rate_limited() {
        let limit = WarnLimit::default();
        let t0 = Instant::now();
        assert_eq!(limit.permit(t0), Some(0));
        assert_eq!(limit.permit(t0 + Duration::from_secs(1)), None);
        assert_eq!(limit.permit(t0 + Duration::from_secs(2)), None);
        assert_eq!(limit.permit(t0 + WARN_EVERY), Some(2));
        let last = LastError::default();
        assert_eq!(last.get(), None);
        last.set(&Error::closed("gone"));
        assert_eq!(last.get().as_deref(), Some("gone"));
    }
}
