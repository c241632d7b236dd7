//! Incremental fetch sessions (KIP-227): what the reader's fetch task has told each
//! broker, so that a Fetch lists only the partitions that are new or changed.
//!
//! A broker caches a session's partitions with the fetch offset, leader epoch, maximum
//! bytes and log start offset last sent for each. The first request asks for a session
//! (id 0, epoch 0) and lists every partition; a response with a non-zero session id
//! establishes it. Each following request names the session and its next epoch (1, 2, …,
//! wrapping from `i32::MAX` to 1), lists only the partitions whose sent data changed or
//! that are new to the session, and forgets those the round did not plan (a paused,
//! backed-off or moved partition must be forgotten, or the broker keeps answering for
//! it). The broker answers for every partition of the session that has news, listed or
//! not, so the fetch task maps the response onto the whole planned set.
//!
//! After a failed request the session starts over with a full request: id 0 when the
//! broker no longer knows it (`FETCH_SESSION_ID_NOT_FOUND`), else the old id with epoch 0,
//! which closes the old session and opens a new one (as Java's `FetchSessionHandler`),
//! so a broker does not hold on to a session nobody uses. A broker that answers a full
//! request with id 0 (sessions disabled, or its session cache full) gets full requests.
//! With sessions off ([`ReaderConfig::fetch_sessions`](super::ReaderConfig::fetch_sessions))
//! every request is sessionless: id 0, epoch -1.

use std::collections::HashMap;
use std::sync::Arc;

use crate::protocol::ErrorCode;

/// A session a broker holds, as the reader's close sees it.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Held {
    /// The session id.
    pub(crate) id: i32,
    /// A fetch is waiting on the broker's connection: a request sent after it would be
    /// answered only after it (up to `max_wait` later).
    pub(crate) waiting: bool,
}

/// A partition of a session: topic and partition index.
pub(super) type Key = (Arc<str>, i32);

/// What a request tells the broker about one partition; a partition is listed again when
/// any of it changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Sent {
    pub(super) fetch_offset: i64,
    pub(super) leader_epoch: i32,
    pub(super) max_bytes: i32,
    pub(super) log_start_offset: i64,
}

/// The session fields of one request and the partitions it writes on the wire.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Request {
    pub(super) session_id: i32,
    pub(super) epoch: i32,
    /// Whether every planned partition is listed (a new session, or no session).
    pub(super) full: bool,
    /// Indexes into the planned partitions of those to list.
    pub(super) send: Vec<usize>,
    /// Partitions of the session to drop from it.
    pub(super) forgotten: Vec<Key>,
}

/// The fetch session with one broker.
#[derive(Debug, Default)]
pub(super) struct Session {
    /// The session id, 0 when there is none.
    id: i32,
    /// The epoch of the next request; 0 asks for a new session.
    epoch: i32,
    /// Whether the request in flight is a full one.
    full_in_flight: bool,
    /// What the session holds: per partition, what was last sent.
    parts: HashMap<Key, Sent>,
}

/// The epoch after `epoch`: 1 follows `i32::MAX` (0 would ask for a new session).
fn next_epoch(epoch: i32) -> i32 {
    if epoch == i32::MAX {
        1
    } else {
        epoch + 1
    }
}

impl Session {
    /// The request for this round's `planned` partitions (each at most once), with
    /// sessions `enabled` or not. The session then holds exactly `planned`.
    pub(super) fn request(&mut self, enabled: bool, planned: &[(Key, Sent)]) -> Request {
        let all = || (0..planned.len()).collect();
        if !enabled {
            self.reset(false);
            self.full_in_flight = true;
            return Request {
                session_id: 0,
                epoch: -1,
                full: true,
                send: all(),
                forgotten: Vec::new(),
            };
        }
        let incremental = self.id != 0 && self.epoch > 0;
        self.full_in_flight = !incremental;
        if !incremental {
            self.parts = planned.iter().cloned().collect();
            return Request {
                session_id: self.id,
                epoch: 0,
                full: true,
                send: all(),
                forgotten: Vec::new(),
            };
        }
        let mut send = Vec::new();
        let mut next = HashMap::with_capacity(planned.len());
        for (i, (key, sent)) in planned.iter().enumerate() {
            if self.parts.remove(key) != Some(*sent) {
                send.push(i);
            }
            next.insert(key.clone(), *sent);
        }
        let mut forgotten: Vec<Key> = std::mem::replace(&mut self.parts, next)
            .into_keys()
            .collect();
        forgotten.sort();
        Request {
            session_id: self.id,
            epoch: self.epoch,
            full: false,
            send,
            forgotten,
        }
    }

    /// The broker answered the request in flight without a top-level error, naming
    /// `session_id`.
    pub(super) fn answered(&mut self, session_id: i32) {
        if session_id == 0 {
            // Sessions disabled, the broker's cache full, or the session closed: the
            // next request is full again.
            self.reset(false);
        } else if self.full_in_flight {
            self.id = session_id;
            self.epoch = 1;
        } else {
            self.epoch = next_epoch(self.epoch);
        }
    }

    /// The request in flight failed (`code`: the top-level error, if the broker sent
    /// one), or a partition lost its leader: the next request is a full one.
    pub(super) fn failed(&mut self, code: Option<ErrorCode>) {
        self.reset(code != Some(ErrorCode::FetchSessionIdNotFound));
    }

    /// The id of the session the broker holds (0: none, or not known yet). Kept after a
    /// failure that did not lose it, until the next full request closes it.
    pub(super) fn id(&self) -> i32 {
        self.id
    }

    /// Start over; `close`: the next (full) request closes the old session by its id.
    fn reset(&mut self, close: bool) {
        if !close {
            self.id = 0;
        }
        self.epoch = 0;
        self.parts.clear();
    }

    /// Whether a top-level error of the request in flight means only that the session
    /// must start over: the partitions are fetched again at once by a full request, with
    /// no backoff. A full request failing so is an ordinary failure.
    pub(super) fn only_session_lost(&self, code: Option<ErrorCode>) -> bool {
        !self.full_in_flight
            && matches!(
                code,
                Some(ErrorCode::FetchSessionIdNotFound | ErrorCode::InvalidFetchSessionEpoch)
            )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part(topic: &str, partition: i32, offset: i64) -> (Key, Sent) {
        (
            (Arc::from(topic), partition),
            Sent {
                fetch_offset: offset,
                leader_epoch: 3,
                max_bytes: 1 << 20,
                log_start_offset: -1,
            },
        )
    }

    fn key(topic: &str, partition: i32) -> Key {
        (Arc::from(topic), partition)
    }

    /// A session established by a full request for `planned`, answered with id 77.
    fn established(planned: &[(Key, Sent)]) -> Session {
        let mut s = Session::default();
        let r = s.request(true, planned);
        assert_eq!((r.session_id, r.epoch, r.full), (0, 0, true));
        s.answered(77);
        s
    }

    #[test]
    fn the_first_request_asks_for_a_session_and_lists_everything() {
        let planned = [part("a", 0, 5), part("a", 1, 9), part("b", 0, 0)];
        let mut s = Session::default();
        let r = s.request(true, &planned);
        assert_eq!(
            r,
            Request {
                session_id: 0,
                epoch: 0,
                full: true,
                send: vec![0, 1, 2],
                forgotten: vec![],
            }
        );
        s.answered(77);
        let r = s.request(true, &planned);
        assert_eq!((r.session_id, r.epoch, r.full), (77, 1, false));
        assert!(r.send.is_empty() && r.forgotten.is_empty(), "{r:?}");
    }

    #[test]
    fn an_incremental_request_lists_new_and_changed_partitions_and_forgets_the_unplanned() {
        let mut s = established(&[part("a", 0, 5), part("a", 1, 9), part("b", 0, 0)]);
        // a/0 moved on, a/1 unchanged, b/0 not planned (paused), b/1 new.
        let mut epoch_changed = part("a", 1, 9);
        epoch_changed.1.leader_epoch = 4;
        let r = s.request(true, &[part("a", 0, 8), part("a", 1, 9), part("b", 1, 0)]);
        assert_eq!((r.session_id, r.epoch, r.full), (77, 1, false));
        assert_eq!(r.send, vec![0, 2]);
        assert_eq!(r.forgotten, vec![key("b", 0)]);
        s.answered(77);
        // A changed leader epoch (or maximum bytes) is sent again; b/0 comes back as new.
        let r = s.request(
            true,
            &[epoch_changed.clone(), part("b", 1, 0), part("b", 0, 0)],
        );
        assert_eq!(r.epoch, 2);
        assert_eq!(r.send, vec![0, 2]);
        assert_eq!(r.forgotten, vec![key("a", 0)]);
        s.answered(77);
        let mut smaller = part("b", 1, 0);
        smaller.1.max_bytes = 1024;
        let r = s.request(true, &[epoch_changed, smaller, part("b", 0, 0)]);
        assert_eq!((r.epoch, r.send.clone()), (3, vec![1]));
        assert!(r.forgotten.is_empty());
    }

    #[test]
    fn the_epoch_wraps_from_max_to_one() {
        let planned = [part("a", 0, 0)];
        let mut s = established(&planned);
        s.epoch = i32::MAX - 1;
        assert_eq!(s.request(true, &planned).epoch, i32::MAX - 1);
        s.answered(77);
        assert_eq!(s.request(true, &planned).epoch, i32::MAX);
        s.answered(77);
        let r = s.request(true, &planned);
        assert_eq!((r.session_id, r.epoch, r.full), (77, 1, false));
    }

    #[test]
    fn a_lost_session_starts_over_with_a_new_one() {
        let planned = [part("a", 0, 0), part("a", 1, 0)];
        let mut s = established(&planned);
        s.request(true, &planned);
        assert!(s.only_session_lost(Some(ErrorCode::FetchSessionIdNotFound)));
        assert!(s.only_session_lost(Some(ErrorCode::InvalidFetchSessionEpoch)));
        assert!(!s.only_session_lost(Some(ErrorCode::NotLeaderOrFollower)));
        assert!(!s.only_session_lost(None));
        s.failed(Some(ErrorCode::FetchSessionIdNotFound));
        let r = s.request(true, &planned);
        assert_eq!(
            (r.session_id, r.epoch, r.full, r.send),
            (0, 0, true, vec![0, 1])
        );
        // The same error for a full request is an ordinary failure.
        assert!(!s.only_session_lost(Some(ErrorCode::FetchSessionIdNotFound)));
        s.answered(78);
        assert_eq!(s.request(true, &planned).session_id, 78);
    }

    #[test]
    fn any_other_failure_closes_the_session_and_opens_a_new_one() {
        let planned = [part("a", 0, 0)];
        for code in [Some(ErrorCode::InvalidFetchSessionEpoch), None] {
            let mut s = established(&planned);
            s.request(true, &[part("a", 0, 1)]);
            s.failed(code);
            // The old id with epoch 0: close it, open a new one; everything listed.
            let r = s.request(true, &planned);
            assert_eq!(
                (r.session_id, r.epoch, r.full, r.send),
                (77, 0, true, vec![0])
            );
            assert!(r.forgotten.is_empty());
            s.answered(90);
            let r = s.request(true, &planned);
            assert_eq!((r.session_id, r.epoch, r.full), (90, 1, false));
            assert!(r.send.is_empty());
        }
    }

    #[test]
    fn a_broker_without_sessions_gets_full_requests() {
        let planned = [part("a", 0, 0)];
        let mut s = Session::default();
        for _ in 0..3 {
            let r = s.request(true, &planned);
            assert_eq!(
                (r.session_id, r.epoch, r.full, r.send),
                (0, 0, true, vec![0])
            );
            s.answered(0);
        }
        // A session the broker closes in an incremental response starts over too.
        let mut s = established(&planned);
        s.request(true, &planned);
        s.answered(0);
        let r = s.request(true, &planned);
        assert_eq!((r.session_id, r.epoch, r.full), (0, 0, true));
    }

    #[test]
    fn sessions_off_sends_sessionless_requests() {
        let planned = [part("a", 0, 0), part("a", 1, 0)];
        let mut s = Session::default();
        for _ in 0..2 {
            let r = s.request(false, &planned);
            assert_eq!(
                (r.session_id, r.epoch, r.full, r.send),
                (0, -1, true, vec![0, 1])
            );
            s.answered(0);
        }
    }
}
