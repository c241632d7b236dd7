//! The state shared by the [`Reader`](super::Reader) handle and its fetch task: one entry
//! per assigned partition with its own buffer, plus the round-robin queue of partitions
//! that have buffered messages.
//!
//! Every partition carries an `epoch`. Fetch and offset lookups record the epoch they
//! were planned under; [`seek`](super::Reader::seek), re-assignment and revocation bump
//! it (or remove the partition), so a response that was in flight across such a change
//! is recognised as stale and dropped. Because the partition's buffer is cleared under
//! the same lock, nothing fetched before a seek can be yielded after it.
//!
//! The consumer takes runs of a partition's messages under one lock (a [`Loan`]); they
//! count as buffered until it settles them, and anything that must stop them bumps
//! [`Lent::gen`] under the lock, which the consumer checks before each lent message.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::Waker;
use std::time::Instant;

use tokio::sync::Notify;

use super::retry::{LastError, Streak, WarnLimit};
use super::validate::Epochs;
use super::{Message, ReaderConfig, StartOffset, TopicPartition};
use crate::bufpool::BufPool;
use crate::cluster::Cluster;
use crate::error::Error;
use crate::group::{AckToken, Track};
use crate::record::{EncodedRecords, Record};

mod fill;
mod take;

/// Where the next fetch of a partition starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Position {
    /// At this offset.
    Offset(i64),
    /// To be looked up with ListOffsets first.
    Start(StartOffset),
    /// Not fetched until the application seeks (after `OffsetReset::Error`).
    Parked,
}

impl Position {
    pub(crate) fn from_start(start: StartOffset) -> Self {
        match start {
            StartOffset::At(o) => Position::Offset(o),
            s => Position::Start(s),
        }
    }
}

/// A fetched batch whose records are still to be yielded, decoded into messages only as
/// the consumer takes them (at most [`RUN`] at a time), behind [`Part::buf`].
pub(crate) struct Pending {
    records: PendingRecords,
    /// Which push it came with (unique per reader), to match a decompression to it.
    serial: u64,
    /// The partition's high-water mark when the batch was fetched.
    high_watermark: i64,
    /// The batch's partition leader epoch (-1 unknown).
    leader_epoch: i32,
    /// Records and bytes of it still counted as buffered.
    n: usize,
    bytes: usize,
    /// The fetch that brought it (its offset and broker), named by the error of a record
    /// that does not decode.
    fetched_at: i64,
    broker: i32,
}

impl Pending {
    /// Whether its records wait in a payload still compressed.
    #[cfg(test)]
    pub(crate) fn is_compressed(&self) -> bool {
        matches!(&self.records, PendingRecords::Encoded(e) if e.is_compressed())
    }

    /// For a batch still compressed: the offset its records start from.
    fn compressed_from(&self) -> Option<i64> {
        match &self.records {
            PendingRecords::Encoded(e) if e.is_compressed() => Some(e.base_offset()),
            _ => None,
        }
    }
}

enum PendingRecords {
    /// A RecordBatch v2's records, still encoded.
    Encoded(EncodedRecords),
    /// Records decoded with their batch (legacy messages).
    Decoded(std::vec::IntoIter<Record>),
}

/// The bytes a decoded `Record` of a legacy message counts (it has no record encoding of
/// its own): key, value and headers, as [`Message::size`].
fn record_size(r: &Record) -> usize {
    r.key.as_ref().map_or(0, |k| k.len())
        + r.value.as_ref().map_or(0, |v| v.len())
        + r.headers
            .iter()
            .map(|h| h.key.len() + h.value.as_ref().map_or(0, |v| v.len()))
            .sum::<usize>()
}

pub(crate) struct Part {
    pub(crate) topic: Arc<str>,
    pub(crate) partition: i32,
    pub(crate) epoch: u64,
    pub(crate) fetch: Position,
    /// The leader's broker id, once looked up.
    pub(crate) leader: Option<i32>,
    /// The leader epoch the leader was looked up with (-1: unknown), sent with every
    /// fetch and offset lookup (KIP-320).
    pub(crate) leader_epoch: i32,
    /// The leader epochs of the records fetched (see `validate.rs`).
    pub(crate) epochs: Epochs,
    /// The fetch position is to be validated with OffsetForLeaderEpoch before the next
    /// fetch: the leader or its epoch changed.
    pub(crate) validate: bool,
    /// A fetch or lookup for this partition is in flight.
    pub(crate) busy: bool,
    pub(crate) retry_at: Option<Instant>,
    /// The current run of failed fetches and lookups (see `retry.rs`).
    pub(crate) streak: Streak,
    /// Messages decoded and not yet yielded (at most [`RUN`], unless put back by a loan)...
    pub(crate) buf: VecDeque<Message>,
    pub(crate) buf_bytes: usize,
    /// ... then the fetched batches still to decode, and their records and bytes.
    pub(crate) lazy: VecDeque<Pending>,
    pub(crate) lazy_n: usize,
    pub(crate) lazy_bytes: usize,
    pub(crate) in_ready: bool,
    /// The offset of the next message to yield (last yielded + 1), -1 while unknown.
    pub(crate) position: i64,
    /// The last high-water mark a fetch reported, -1 while unknown.
    pub(crate) high_watermark: i64,
    /// Group readers: the commit track of this ownership, which gives every yielded
    /// message its [`AckToken`](crate::group::AckToken).
    pub(crate) track: Option<Arc<Track>>,
    /// Paused ([`ReaderHandle::pause`](super::ReaderHandle::pause)): neither fetched nor
    /// yielded; buffer and position kept.
    pub(crate) paused: bool,
    /// Why the partition was parked, to yield once the messages buffered before that
    /// point have been yielded (so a seek past it loses none of them).
    pub(crate) parked_error: Option<Error>,
}

impl Part {
    fn new(tp: &TopicPartition, start: StartOffset) -> Self {
        let fetch = Position::from_start(start);
        Part {
            topic: Arc::from(tp.topic.as_str()),
            partition: tp.partition,
            epoch: 0,
            fetch,
            leader: None,
            leader_epoch: -1,
            epochs: Epochs::default(),
            validate: false,
            busy: false,
            retry_at: None,
            streak: Streak::default(),
            buf: VecDeque::new(),
            buf_bytes: 0,
            lazy: VecDeque::new(),
            lazy_n: 0,
            lazy_bytes: 0,
            in_ready: false,
            position: match fetch {
                Position::Offset(o) => o,
                _ => -1,
            },
            high_watermark: -1,
            track: None,
            paused: false,
            parked_error: None,
        }
    }

    /// Whether nothing fetched is left to yield (decoded or not; a loan aside).
    pub(crate) fn is_empty(&self) -> bool {
        self.buf.is_empty() && self.lazy.is_empty()
    }

    /// Messages and bytes buffered (decoded or not; a loan aside).
    pub(crate) fn queued(&self) -> (usize, usize) {
        (
            self.buf.len() + self.lazy_n,
            self.buf_bytes + self.lazy_bytes,
        )
    }

    /// Drop everything buffered; returns the messages and bytes dropped.
    fn clear(&mut self) -> (usize, usize) {
        let q = self.queued();
        self.buf.clear();
        self.buf_bytes = 0;
        self.clear_lazy();
        q
    }

    /// Drop the batches still encoded; returns the messages and bytes they counted.
    fn clear_lazy(&mut self) -> (usize, usize) {
        let q = (self.lazy_n, self.lazy_bytes);
        self.lazy.clear();
        self.lazy_n = 0;
        self.lazy_bytes = 0;
        q
    }
}

/// The hasher of the maps keyed by partition id (this reader's own sequential counter),
/// looked up for every message yielded.
pub(crate) type Ids = crate::util::Fib;

#[derive(Default)]
pub(crate) struct State {
    /// By partition id: a sequential counter of this reader (see [`Ids`]).
    pub(crate) parts: HashMap<u64, Part, Ids>,
    pub(crate) index: HashMap<TopicPartition, u64>,
    next_id: u64,
    /// Partitions with buffered messages, served round robin: one message at a time, or
    /// a run lent to the consumer (see [`Loan`]).
    pub(crate) ready: VecDeque<u64>,
    /// Partitions with buffered messages whose track is full
    /// ([`ReaderConfig::max_unacked`]): tried again at the next poll.
    pub(crate) blocked: Vec<u64>,
    /// Paused partitions: their buffers do not count against the queue capacity.
    paused: HashSet<u64, Ids>,
    /// Errors to yield before the next message.
    pub(crate) errors: VecDeque<Error>,
    pub(crate) buffered: usize,
    pub(crate) buffered_bytes: usize,
    pub(crate) consumer: Option<Waker>,
    pub(crate) closed: bool,
    /// The group cannot go on (the broker refuses its protocol): the stream ends once
    /// the queued errors and messages are out.
    pub(crate) ended: bool,
    /// What the consumer reads of its current [`Loan`] without the lock, and the
    /// generation that tells it to come back to the lock.
    pub(crate) lent: Arc<Lent>,
    /// The partition (id, epoch) of the consumer's current [`Loan`], if any.
    loan_of: Option<(u64, u64)>,
    /// Messages and bytes of that loan (yielded ones included until it is settled):
    /// they still count against the queue capacity.
    lent_n: usize,
    lent_bytes: usize,
    /// Errors of records that did not decode when taken, for the fetch task's counters
    /// (see [`State::take_decode_errors`]).
    decode_errors: Vec<Error>,
    /// The last [`Pending::serial`] given.
    serials: u64,
    /// Empty message buffers (with their capacity) for the next partition to decode a
    /// run into: a partition's buffer goes to the consumer's [`Loan`] and the loan's old
    /// one comes here, so the capacity of a run ([`RUN`] messages, 11 KiB) follows the
    /// runs rather than stay with every partition that ever had one (28 MB over 2,500
    /// partitions).
    spare_bufs: Vec<VecDeque<Message>>,
}

/// The most empty buffers [`State`] keeps for runs (one is in use by the loan).
const SPARE_BUFS: usize = 2;

/// The most messages [`State::pop_or_inflate`] lends the consumer from one partition at a
/// time.
pub(crate) const RUN: usize = 64;

/// What [`State::pop_or_inflate`] found.
pub(crate) enum Popped {
    Message(Message),
    /// A compressed batch whose partition's turn it is: decompress it without the lock,
    /// [`install`](State::install) the result, and pop again.
    Inflate(Inflate),
    Nothing,
}

/// The decompression of partition `id`'s first pending batch (see [`Popped::Inflate`]).
pub(crate) struct Inflate {
    id: u64,
    epoch: u64,
    /// The batch's [`Pending::serial`].
    serial: u64,
    job: crate::record::Decompression,
}

impl Inflate {
    /// Decompress (no lock needed).
    pub(crate) fn run(&self) -> crate::error::Result<bytes::Bytes> {
        self.job.run()
    }
}

/// How [`State::decode_run`] ended.
enum Run {
    Decoded,
    /// It starts with a compressed batch.
    Inflate(Inflate),
    /// A record or batch did not decode: the partition is parked.
    Failed,
}

/// The part of the consumer's [`Loan`] shared with the handle, read without the lock.
#[derive(Default)]
pub(crate) struct Lent {
    /// Bumped (under the state lock) by everything after which the consumer must not go
    /// on yielding lent messages without the lock: a seek, reset, unassignment, pause,
    /// re-tracking or close of the lent partition, and every error queued (errors are
    /// yielded before the next message).
    pub(crate) gen: AtomicU64,
    /// Set by the fetch task while it waits for buffer space: the consumer then checks,
    /// after each lent message, whether it freed enough to wake the task.
    pub(crate) starved: AtomicBool,
    /// The lent partition's position: the offset after the last message yielded.
    pos: AtomicI64,
    /// Messages and bytes of the loan yielded so far.
    yielded: AtomicUsize,
    yielded_bytes: AtomicUsize,
}

/// The buffer of one partition, moved out of it (swapped, not copied) under the lock by
/// [`State::pop_or_inflate`], of which the consumer yields up to [`RUN`]` - 1` messages
/// without locking while [`Lent::gen`] stays the same. A group partition's messages are
/// delivered to its track as they are yielded ([`Track::deliver_lent`]); a full track, or
/// one restarted since, ends the loan early. They count as buffered until
/// [`State::settle`] (the next time the consumer takes the lock), which puts back those
/// not yielded — or drops them, if the partition was reset or unassigned meanwhile, so
/// nothing fetched before a seek is yielded after it.
#[derive(Default)]
pub(crate) struct Loan {
    msgs: VecDeque<Message>,
    /// A group partition's track, and its restart count when the loan was made: each
    /// lent message is delivered to it as it is yielded.
    track: Option<(Arc<Track>, u64)>,
    active: bool,
    id: u64,
    epoch: u64,
    gen: u64,
    n: usize,
    bytes: usize,
    yielded: usize,
    yielded_bytes: usize,
    /// How many more may be yielded before the next partition's turn.
    left: usize,
    /// The position after the last message lent (the next fetch's offset when it was
    /// the last one buffered, as in [`State::pop`]).
    tail_next: i64,
    /// The position after the last message yielded.
    next: i64,
}

impl Loan {
    /// Whether a lent message is ready to be yielded: the loan is not used up and
    /// [`Lent::gen`] did not move on (else the consumer takes the lock and
    /// [`State::settle`]s). When it is, the message is delivered to its track, counted as
    /// yielded and given its token; the caller then [`take`](Self::take)s it. Split in two
    /// so that the caller can move the message straight from the loan into its return
    /// value: the struct is too large for copies to be free (reading 100-byte records
    /// took 0.80× the CPU after this split, BENCHMARKS.md).
    #[inline]
    pub(crate) fn ready(&mut self, lent: &Lent) -> bool {
        if self.left == 0 {
            return false;
        }
        let last = self.msgs.len() == 1;
        let Some(m) = self.msgs.front_mut() else {
            return false;
        };
        if lent.gen.load(Ordering::Acquire) != self.gen {
            return false;
        }
        let next = if last {
            self.tail_next
        } else {
            m.offset.saturating_add(1)
        };
        if let Some((t, restarts)) = &self.track {
            match t.deliver_lent(m.offset, next, *restarts) {
                Ok(seq) => m.set_ack_token(AckToken::tracked(t.clone(), seq, m.offset)),
                // full, or restarted: the lock path decides
                Err(_) => return false,
            }
        }
        self.left -= 1;
        self.next = next;
        self.yielded += 1;
        self.yielded_bytes += m.queued_size();
        lent.pos.store(self.next, Ordering::Relaxed);
        lent.yielded.store(self.yielded, Ordering::Relaxed);
        lent.yielded_bytes
            .store(self.yielded_bytes, Ordering::Relaxed);
        true
    }

    /// The message [`ready`](Self::ready) made ready (`None` only if called without it).
    #[inline(always)]
    pub(crate) fn take(&mut self) -> Option<Message> {
        self.msgs.pop_front()
    }

    /// The next lent message (see [`ready`](Self::ready)).
    #[cfg(test)]
    pub(crate) fn next(&mut self, lent: &Lent) -> Option<Message> {
        if self.ready(lent) {
            self.take()
        } else {
            None
        }
    }
}

impl State {
    /// Tell the consumer to come back to the lock before yielding another lent message.
    fn recall(&self) {
        self.lent.gen.fetch_add(1, Ordering::Release);
    }

    /// Whether the consumer holds partition `id`'s buffer on loan (its `buf` then looks
    /// empty although messages are still to be yielded).
    pub(crate) fn is_lent(&self, id: u64) -> bool {
        self.loan_of.is_some_and(|(l, _)| l == id)
    }

    /// Forget the consumer's loan (its partition is reset, unassigned or closed): its
    /// messages are dropped when it settles, and stop counting now.
    fn cancel_loan_of(&mut self, id: u64) {
        if self.loan_of.is_some_and(|(l, _)| l == id) {
            self.loan_of = None;
            self.lent_n = 0;
            self.lent_bytes = 0;
            self.recall();
        }
    }

    /// Whether [`take_decode_errors`](Self::take_decode_errors) has any.
    #[inline]
    pub(crate) fn has_decode_errors(&self) -> bool {
        !self.decode_errors.is_empty()
    }

    /// The errors of records that did not decode when taken since the last call.
    pub(crate) fn take_decode_errors(&mut self) -> Vec<Error> {
        std::mem::take(&mut self.decode_errors)
    }

    /// Queue `e` to be yielded before the next message.
    pub(crate) fn push_error(&mut self, e: Error) {
        self.errors.push_back(e);
        self.recall();
    }

    /// Messages and bytes fetched and not yet yielded (lent ones included).
    pub(crate) fn queued(&self) -> (usize, usize) {
        if self.loan_of.is_none() {
            return (self.buffered, self.buffered_bytes);
        }
        let n = self
            .lent_n
            .saturating_sub(self.lent.yielded.load(Ordering::Relaxed));
        let bytes = self
            .lent_bytes
            .saturating_sub(self.lent.yielded_bytes.load(Ordering::Relaxed));
        (self.buffered + n, self.buffered_bytes + bytes)
    }

    /// Partition `id`'s position: the offset after the last message yielded, counting
    /// messages yielded from a loan.
    pub(crate) fn position_of(&self, id: u64, p: &Part) -> i64 {
        if self.loan_of == Some((id, p.epoch)) {
            p.position.max(self.lent.pos.load(Ordering::Relaxed))
        } else {
            p.position
        }
    }

    /// Settle the consumer's `loan` (under the lock): its yielded messages stop counting
    /// and move the partition's position; the others go back to the front of the
    /// partition's buffer, unless the loan was cancelled (reset, unassigned, closed) —
    /// then they are dropped.
    pub(crate) fn settle(&mut self, loan: &mut Loan) {
        if !loan.active {
            return;
        }
        loan.active = false;
        loan.track = None;
        if self.loan_of != Some((loan.id, loan.epoch)) {
            loan.msgs.clear();
            return;
        }
        self.loan_of = None;
        self.lent_n = 0;
        self.lent_bytes = 0;
        let Some(p) = self.parts.get_mut(&loan.id) else {
            loan.msgs.clear();
            return;
        };
        p.position = p.position.max(loan.next);
        let (n, bytes) = (
            loan.msgs.len(),
            loan.bytes.saturating_sub(loan.yielded_bytes),
        );
        // The rest goes before what was fetched meanwhile: move the shorter of the two.
        if n <= p.buf.len() {
            while let Some(m) = loan.msgs.pop_back() {
                p.buf.push_front(m);
            }
        } else {
            loan.msgs.append(&mut p.buf);
            std::mem::swap(&mut loan.msgs, &mut p.buf);
        }
        p.buf_bytes += bytes;
        self.buffered += n;
        self.buffered_bytes += bytes;
        if p.is_empty() {
            // Everything fetched is yielded: the position moves to the next fetch's
            // offset (past control records), as `pop` does for the last message, and
            // so may the group's commit (a fetch of only control records ended while
            // the run was lent: `fetched_to` left it to this).
            if let Position::Offset(f) = p.fetch {
                if f > p.position {
                    if let Some(t) = &p.track {
                        t.gap(p.position, f);
                    }
                }
                p.position = p.position.max(f);
            }
            if let Some(e) = p.parked_error.take() {
                self.errors.push_back(e);
            }
        } else if !p.in_ready && !p.paused {
            // behind the partitions that waited during the run
            p.in_ready = true;
            self.ready.push_back(loan.id);
        }
    }

    /// Assign `tp` starting at `start`; an assigned partition is reset to `start`.
    pub(crate) fn assign(&mut self, tp: TopicPartition, start: StartOffset) {
        if let Some(id) = self.index.get(&tp).copied() {
            self.reset(id, Position::from_start(start));
            return;
        }
        let id = self.next_id;
        self.next_id += 1;
        self.parts.insert(id, Part::new(&tp, start));
        self.index.insert(tp, id);
    }

    /// A fetch of partition `id` from `from` ended at `next` (its next fetch offset): with
    /// nothing buffered, the position moves there (past control records and aborted
    /// transactions) and so may the group's commit.
    pub(crate) fn fetched_to(&mut self, id: u64, from: i64, next: i64) {
        if self.is_lent(id) {
            // the rest of the run is with the consumer: `settle` moves on from there
            return;
        }
        let Some(p) = self.parts.get_mut(&id) else {
            return;
        };
        if p.is_empty() && next > p.position && p.position == from {
            p.position = next;
            if let Some(t) = &p.track {
                t.gap(from, next);
            }
        }
    }

    /// `tp` (just assigned at `offset`) continues after a record of leader epoch
    /// `epoch` (a group's committed offset and epoch): validate the offset before
    /// fetching (KIP-320).
    pub(crate) fn validate_from(&mut self, tp: &TopicPartition, offset: i64, epoch: i32) {
        let Some(p) = self.index.get(tp).and_then(|id| self.parts.get_mut(id)) else {
            return;
        };
        if p.fetch == Position::Offset(offset) {
            p.epochs.record(offset - 1, epoch);
            p.validate = true;
        }
    }

    /// Give the messages of `tp` (assigned) tokens of `track` from now on.
    pub(crate) fn set_track(&mut self, tp: &TopicPartition, track: Option<Arc<Track>>) {
        let Some(id) = self.index.get(tp).copied() else {
            return;
        };
        if let Some(p) = self.parts.get_mut(&id) {
            p.track = track;
        }
        if self.loan_of.is_some_and(|(l, _)| l == id) {
            // lent messages must get the new track's tokens: back to the buffer
            self.recall();
        }
    }

    /// Stop reading `tp` and drop its buffered messages. Returns whether it was assigned.
    pub(crate) fn unassign(&mut self, tp: &TopicPartition) -> bool {
        let Some(id) = self.index.remove(tp) else {
            return false;
        };
        // A pause ends with the assignment (as in the Java client).
        self.paused.remove(&id);
        self.cancel_loan_of(id);
        if let Some(p) = self.parts.remove(&id) {
            let (n, bytes) = p.queued();
            self.buffered = self.buffered.saturating_sub(n);
            self.buffered_bytes = self.buffered_bytes.saturating_sub(bytes);
        }
        true
    }

    /// Move partition `id` to `fetch`: bump its epoch (in-flight results become stale),
    /// drop its buffered messages, forget failures.
    pub(crate) fn reset(&mut self, id: u64, fetch: Position) {
        self.cancel_loan_of(id);
        let Some(p) = self.parts.get_mut(&id) else {
            return;
        };
        p.epoch += 1;
        p.fetch = fetch;
        p.position = match fetch {
            Position::Offset(o) => o,
            _ => -1,
        };
        p.epochs.clear();
        p.validate = false;
        p.retry_at = None;
        p.streak.reset();
        if let Some(t) = &p.track {
            // only the fetch position moves: what was yielded still decides the commit
            t.seek();
        }
        p.parked_error = None;
        let (n, bytes) = p.clear();
        self.buffered = self.buffered.saturating_sub(n);
        self.buffered_bytes = self.buffered_bytes.saturating_sub(bytes);
    }

    /// Partition `id`'s log was truncated after its position (nothing yielded is gone):
    /// drop what is buffered and fetch again from the position. Unlike a
    /// [`reset`](Self::reset), the group's track goes on: every message yielded stays
    /// valid. Returns the position.
    pub(crate) fn refetch(&mut self, id: u64) -> i64 {
        let Some(position) = self.parts.get(&id).map(|p| self.position_of(id, p)) else {
            return -1;
        };
        self.cancel_loan_of(id);
        let Some(p) = self.parts.get_mut(&id) else {
            return -1;
        };
        p.epoch += 1;
        p.fetch = Position::Offset(position);
        p.position = position;
        p.epochs.forget_from(position);
        p.parked_error = None;
        let (n, bytes) = p.clear();
        self.buffered = self.buffered.saturating_sub(n);
        self.buffered_bytes = self.buffered_bytes.saturating_sub(bytes);
        position
    }

    /// Whether the prefetch buffer is too full to fetch (fetching pauses): see
    /// [`fetch_room`](Self::fetch_room).
    pub(crate) fn full(&self, config: &ReaderConfig) -> bool {
        self.fetch_room(config).is_none()
    }

    /// How many bytes new fetches may bring: what is left of
    /// [`ReaderConfig::queue_capacity_bytes`], or `None` (fetching pauses) while the
    /// buffers hold [`ReaderConfig::queue_capacity`] messages or half the byte capacity.
    /// Fetching resumes only under half, so each response brings at least the other
    /// half rather than a batch at a time, and the buffers stay within the capacity
    /// (a response carries at least one batch, KIP-74, so a lone large batch may pass
    /// it). Paused partitions' buffers do not count: they hold at most what was
    /// buffered or in flight when the partition was paused, and must not stall the
    /// others.
    pub(crate) fn fetch_room(&self, config: &ReaderConfig) -> Option<usize> {
        let (mut n, mut bytes) = self.queued();
        for p in self.paused.iter().filter_map(|id| self.parts.get(id)) {
            let (pn, pbytes) = p.queued();
            n = n.saturating_sub(pn);
            bytes = bytes.saturating_sub(pbytes);
        }
        let capacity = config.queue_capacity_bytes;
        let half = capacity - capacity / 2;
        if n >= config.queue_capacity || bytes >= half {
            return None;
        }
        Some(capacity - bytes)
    }

    /// Pause `tp` (if assigned): neither fetched nor yielded until resumed.
    pub(crate) fn pause(&mut self, tp: &TopicPartition) {
        if let Some(id) = self.index.get(tp).copied() {
            if let Some(p) = self.parts.get_mut(&id) {
                p.paused = true;
                self.paused.insert(id);
            }
            if self.loan_of.is_some_and(|(l, _)| l == id) {
                // lent messages go back to the (paused) buffer
                self.recall();
            }
        }
    }

    /// Resume `tp`; its buffered messages are queued again. Returns whether it was paused.
    pub(crate) fn resume(&mut self, tp: &TopicPartition) -> bool {
        let Some(id) = self.index.get(tp).copied() else {
            return false;
        };
        let Some(p) = self.parts.get_mut(&id) else {
            return false;
        };
        if !p.paused {
            return false;
        }
        p.paused = false;
        self.paused.remove(&id);
        if !p.in_ready && !p.is_empty() {
            p.in_ready = true;
            self.ready.push_back(id);
        }
        true
    }

    /// Close: the stream ends (nothing buffered or pending is yielded any more). Returns
    /// the consumer's waker, to wake outside the lock.
    pub(crate) fn close(&mut self) -> Option<Waker> {
        self.closed = true;
        self.errors.clear();
        self.ready.clear();
        self.blocked.clear();
        for p in self.parts.values_mut() {
            p.clear();
            p.in_ready = false;
        }
        self.buffered = 0;
        self.buffered_bytes = 0;
        self.loan_of = None;
        self.lent_n = 0;
        self.lent_bytes = 0;
        self.recall();
        self.consumer.take()
    }

    /// Park partition `id` (no fetching until a seek) and yield `err` once its buffered
    /// messages are out: at once if there are none. Returns whether `err` was queued now.
    pub(crate) fn park(&mut self, id: u64, err: Error) -> bool {
        let Some(p) = self.parts.get_mut(&id) else {
            return false;
        };
        p.fetch = Position::Parked;
        // Lent messages were fetched before this point too: `settle` queues the error.
        let lent = self.loan_of.is_some_and(|(l, _)| l == id);
        if p.is_empty() && !lent {
            self.push_error(err);
            true
        } else {
            p.parked_error = Some(err);
            false
        }
    }
}

#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) fetches: AtomicU64,
    /// Fetches sent as incremental fetch session requests (KIP-227).
    pub(crate) incremental_fetches: AtomicU64,
    /// Incremental fetches the broker refused for a session it lost (or an epoch it
    /// did not expect), each followed by a full fetch.
    pub(crate) sessions_lost: AtomicU64,
    pub(crate) messages: AtomicU64,
    pub(crate) bytes: AtomicU64,
    pub(crate) errors: AtomicU64,
    pub(crate) resets: AtomicU64,
    /// Log truncations below the position (see `validate.rs`).
    pub(crate) log_truncations: AtomicU64,
    /// Transient failures retried (fetch task and group task).
    pub(crate) retries: AtomicU64,
    /// The fetch task's `warn` rate limit of retried failures.
    pub(crate) warn_limit: WarnLimit,
    /// The last failure of the fetch task or the group task.
    pub(crate) last_error: LastError,
    pub(crate) tasks_running: AtomicUsize,
    /// `throttle_time_ms` of fetch responses.
    pub(crate) throttle: crate::util::ThrottleTimes,
    /// Fetch request times, for the metrics collector.
    #[cfg(feature = "metrics")]
    pub(crate) fetch_latency: crate::metrics::Latency,
}

pub(crate) struct Shared {
    pub(crate) state: Mutex<State>,
    /// Wakes the fetch task: assignment changed, seek, buffer space freed, close.
    pub(crate) wake_task: Notify,
    pub(crate) config: ReaderConfig,
    pub(crate) cluster: Cluster,
    pub(crate) counters: Counters,
    /// Reused buffers for decompressed batch payloads.
    pub(crate) pool: Arc<BufPool>,
    /// The fetch sessions (KIP-227) brokers hold for this reader, by broker id: kept by
    /// the fetch task, closed by [`ReaderHandle::close`](super::ReaderHandle::close).
    pub(crate) fetch_sessions: Mutex<HashMap<i32, super::session::Held>>,
}

impl Shared {
    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}
