//! Log truncation detection (KIP-320): which leader epoch the records a partition fetched
//! were written in, and what to do once the partition's new leader has said where that
//! epoch ends in its log.
//!
//! Every fetch request carries the leader epoch the partition's leader was looked up with,
//! so a broker that is not (or not yet) that epoch's leader refuses it
//! (`FENCED_LEADER_EPOCH`: look the leader up again; `UNKNOWN_LEADER_EPOCH`: retry). When a
//! lookup finds a new leader or a new leader epoch, the fetch position is validated before
//! the next fetch: OffsetForLeaderEpoch asks the leader where the epoch of the last record
//! fetched ends in its log. An end before the fetch position means the log was truncated
//! there (an unclean leader election: the records from that offset on are gone, and new
//! ones may take their offsets). What the reader then does follows the Java consumer
//! (`SubscriptionState::maybeCompleteValidation`):
//!
//! - records fetched but not yet yielded past the end are dropped and fetched again from
//!   the position (nothing the application saw is affected);
//! - if the application has been given records past the end, then under
//!   [`OffsetReset::Earliest`] or [`OffsetReset::Latest`] the partition continues at the
//!   end (the first offset known to diverge: the new records at the offsets the
//!   application has seen are yielded), or, when the leader knows no epoch that old, is
//!   reset per the policy; under [`OffsetReset::Error`] the partition stops with an error
//!   whose source is a [`LogTruncation`] naming the offsets, until the application seeks.
//!
//! Both are logged at `warn` and counted in [`ReaderStats::log_truncations`](super::ReaderStats::log_truncations).

use std::collections::VecDeque;
use std::fmt;

use super::OffsetReset;

/// How many epoch changes a partition remembers: the epochs of the records between the
/// group's committed offset and the fetch position. Leader epochs change rarely.
const MAX_MARKS: usize = 32;

/// The leader epochs of a partition's fetched records: `(first offset, epoch)` where the
/// epoch changes, in offset order.
#[derive(Debug, Default, Clone)]
pub(crate) struct Epochs {
    marks: VecDeque<(i64, i32)>,
}

impl Epochs {
    /// Records from `offset` on were written in `epoch` (until the next mark).
    pub(crate) fn record(&mut self, offset: i64, epoch: i32) {
        // a later mark at or before `offset` is overtaken (a fetch that starts again)
        while self.marks.back().is_some_and(|(o, _)| *o >= offset) {
            self.marks.pop_back();
        }
        if self.marks.back().is_some_and(|(_, e)| *e == epoch) {
            return;
        }
        self.marks.push_back((offset, epoch));
        while self.marks.len() > MAX_MARKS {
            self.marks.pop_front();
        }
    }

    /// Record a fetch's marks (see `FetchedBatches::epochs`).
    pub(crate) fn extend(&mut self, marks: &[(i64, i32)]) {
        for &(offset, epoch) in marks {
            self.record(offset, epoch);
        }
    }

    /// The epoch of the record at `offset`, if known (legacy messages and brokers
    /// without epochs have none).
    pub(crate) fn epoch_of(&self, offset: i64) -> Option<i32> {
        if offset < 0 {
            return None;
        }
        self.marks
            .iter()
            .rev()
            .find(|(o, _)| *o <= offset)
            .map(|(_, e)| *e)
            .filter(|e| *e >= 0)
    }

    /// Forget the marks of records at `offset` and after (they are fetched again).
    pub(crate) fn forget_from(&mut self, offset: i64) {
        while self.marks.back().is_some_and(|(o, _)| *o >= offset) {
            self.marks.pop_back();
        }
    }

    /// Forget everything (a seek).
    pub(crate) fn clear(&mut self) {
        self.marks.clear();
    }
}

/// A partition's log was truncated below what this reader had read: the records from
/// `divergent_offset` on are not the ones it read (KIP-320; Java's
/// `LogTruncationException`). The source of the error a reader with
/// [`OffsetReset::Error`] yields for it.
///
/// ```
/// use kafkapipe::reader::LogTruncation;
/// # fn demo(err: &kafkapipe::Error) {
/// let t = std::error::Error::source(err).and_then(|s| s.downcast_ref::<LogTruncation>());
/// if let Some(t) = t {
///     eprintln!(
///         "{}/{}: read up to offset {}, the log now diverges from offset {:?}",
///         t.topic, t.partition, t.position, t.divergent_offset
///     );
/// }
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LogTruncation {
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: i32,
    /// The reader's position: the offset after the last message it yielded.
    pub position: i64,
    /// Where the reader was fetching from (the position plus what it had fetched and not
    /// yielded yet).
    pub fetch_offset: i64,
    /// The leader epoch of the last record fetched, which the leader was asked about.
    pub epoch: i32,
    /// The first offset known to diverge: where `epoch` (or the largest earlier epoch the
    /// leader knows) ends in the leader's log. `None` if the leader knows no epoch at or
    /// before `epoch`.
    pub divergent_offset: Option<i64>,
    /// The epoch the leader's answer is about (`epoch` or the largest earlier one it
    /// knows), if any.
    pub divergent_epoch: Option<i32>,
    /// The leader epoch of the leader that answered.
    pub leader_epoch: i32,
}

impl fmt::Display for LogTruncation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}/{}: read up to offset {} (fetching from {}) in leader epoch {}, ",
            self.topic, self.partition, self.position, self.fetch_offset, self.epoch
        )?;
        match (self.divergent_offset, self.divergent_epoch) {
            (Some(o), Some(e)) => write!(
                f,
                "but leader epoch {e} ends at offset {o} in the log of the leader (epoch {})",
                self.leader_epoch
            ),
            _ => write!(
                f,
                "which the leader (epoch {}) no longer knows",
                self.leader_epoch
            ),
        }
    }
}

impl std::error::Error for LogTruncation {}

/// What to do with a partition whose position was validated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// The log holds everything fetched: go on.
    Valid,
    /// Records fetched past `.0` are gone but none was yielded: drop what is buffered and
    /// fetch again from the position.
    Refetch,
    /// Yielded records are gone: continue at this offset (the divergent one).
    SeekTo(i64),
    /// Yielded records are gone and the leader knows no epoch that old: reset per policy.
    Reset,
    /// Yielded records are gone and the policy is [`OffsetReset::Error`]: park.
    Fail,
}

/// Decide (Java's `maybeCompleteValidation`) from the leader's answer `(end_epoch,
/// end_offset)` for a partition at `position` (yielded up to) fetching from `fetch`.
pub(crate) fn outcome(
    policy: OffsetReset,
    position: i64,
    fetch: i64,
    end_epoch: i32,
    end_offset: i64,
) -> Outcome {
    let known = end_epoch >= 0 && end_offset >= 0;
    if known && end_offset >= fetch {
        return Outcome::Valid;
    }
    if known && position <= end_offset {
        return Outcome::Refetch;
    }
    match (policy, known) {
        (OffsetReset::Error, _) => Outcome::Fail,
        (_, true) => Outcome::SeekTo(end_offset),
        (_, false) => Outcome::Reset,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn epochs_answer_the_epoch_of_an_offset() {
        let mut e = Epochs::default();
        assert_eq!(e.epoch_of(5), None);
        e.extend(&[(0, 1), (10, 3)]);
        e.extend(&[(20, 3)]);
        assert_eq!(e.epoch_of(9), Some(1));
        assert_eq!(e.epoch_of(10), Some(3));
        assert_eq!(e.epoch_of(100), Some(3));
        e.forget_from(10);
        assert_eq!(e.epoch_of(15), Some(1));
        e.record(12, -1);
        assert_eq!(e.epoch_of(12), None, "legacy records have no epoch");
        e.clear();
        assert_eq!(e.epoch_of(0), None);
        for i in 0..100 {
            e.record(i, i as i32);
        }
        assert_eq!(e.marks.len(), MAX_MARKS);
        assert_eq!(e.epoch_of(99), Some(99));
    }

    #[test]
    fn outcomes_follow_the_java_consumer() {
        use OffsetReset::*;
        // the end of our epoch is at or past what we fetched
        assert_eq!(outcome(Error, 10, 20, 0, 20), Outcome::Valid);
        assert_eq!(outcome(Error, 10, 20, 0, 25), Outcome::Valid);
        // only records not yet yielded are gone
        assert_eq!(outcome(Error, 10, 20, 0, 15), Outcome::Refetch);
        assert_eq!(outcome(Error, 10, 20, 0, 10), Outcome::Refetch);
        // yielded records are gone
        assert_eq!(outcome(Error, 12, 20, 0, 10), Outcome::Fail);
        assert_eq!(outcome(Earliest, 12, 20, 0, 10), Outcome::SeekTo(10));
        assert_eq!(outcome(Latest, 12, 20, 0, 10), Outcome::SeekTo(10));
        // the leader knows no epoch that old
        assert_eq!(outcome(Earliest, 12, 20, -1, -1), Outcome::Reset);
        assert_eq!(outcome(Error, 12, 20, -1, -1), Outcome::Fail);
    }

    #[test]
    fn the_truncation_names_the_offsets() {
        let t = LogTruncation {
            topic: "t".into(),
            partition: 0,
            position: 20,
            fetch_offset: 25,
            epoch: 0,
            divergent_offset: Some(10),
            divergent_epoch: Some(0),
            leader_epoch: 1,
        };
        let s = t.to_string();
        for part in [
            "t/0",
            "offset 20",
            "from 25",
            "epoch 0",
            "offset 10",
            "(epoch 1)",
        ] {
            assert!(s.contains(part), "{s}");
        }
    }
}
