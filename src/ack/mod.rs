//! Acknowledgement tokens: every message a group [`Reader`](crate::reader::Reader) yields
//! carries an [`AckToken`] that says when the message is processed, and one [`Track`] per
//! owned partition turns those answers into the offset to commit.
//!
//! # Model
//!
//! A message is *processed* when its token is
//! - acked: [`AckToken::ack`], sending the message (or its [`Offset`](crate::group::Offset)) to
//!   a [`Committer`](crate::group::Committer), or a [`Writer`](crate::writer::Writer) receiving
//!   the broker's acknowledgement of a message that carries the token;
//! - or dropped, and the reader polled afterwards. A message a `filter` drops counts
//!   because the filter goes on to poll the reader for the next one; a message dropped by
//!   a stage that failed and ended the pipeline does not, as nothing polls the reader
//!   after the error. A token dropped while its thread panics counts as failed.
//!   (So a concurrent stage must keep the token with its work:
//!   [`Tracked`](crate::reader::Tracked), [`MessageStreamExt`](crate::reader::MessageStreamExt).)
//!
//! A token that [`fail`](AckToken::fail)ed (or whose writer delivery failed) holds its
//! partition's commit before it until a rebalance or a restart delivers the message again.
//! With contiguous tracking (the default) a partition's commit only passes a message once
//! it and every message yielded before it are processed; each partition tracks at most
//! [`ReaderConfig::max_unacked`](crate::reader::ReaderConfig::max_unacked) messages and
//! the reader stops yielding a partition at that bound, so memory stays bounded and a
//! stuck pipeline shows in [`ReaderStats`](crate::reader::ReaderStats).
//!
//! Each track belongs to one ownership of a partition: a token from an earlier assignment
//! (the partition was revoked, then assigned to this member again) never moves the new
//! assignment's commit.
//!
//! A seek moves only the fetch position: messages yielded before it stay tracked (held
//! ones keep holding the commit); only the exactly-once rewind forgets deliveries.
//!
//! A [share group](crate::share) record's token follows the same rules and says how the
//! record is acknowledged: processed (acked, carried into a written message the broker
//! acknowledged, or dropped and the reader polled afterwards) is ACCEPT;
//! [`fail`](AckToken::fail)/[`release`](AckToken::release), a failed writer delivery, a
//! panic, or a drop the reader never confirms (the pipeline ended) is RELEASE;
//! [`reject`](AckToken::reject) is REJECT.
//!
//! Owned below the reader, the writer, the group and share groups, which all hand tokens
//! around (the public types are re-exported as `group::AckToken` and `group::SharedAck`);
//! this module imports nothing of the crate.

use futures::task::AtomicWaker;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

mod stamp;
pub(crate) use stamp::Stamp;

/// Shared by a group reader and its tracks: how often the reader was polled, and its
/// consumer's waker for when a track frees room or a parked reader must confirm drops.
#[derive(Debug, Default)]
pub(crate) struct Pulse {
    /// The poll count (shifted left by 2) with [`PARKED`] and [`MISSED`] in the low
    /// bits: one word, so that a poll clears the flags and moves the count in one step,
    /// and each of `polled`, `park` and `nudge` costs one atomic read-modify-write in the
    /// common case (they run once or twice per message).
    word: AtomicU64,
    waker: AtomicWaker,
}

/// The reader returned `Pending` and waits for a wake.
const PARKED: u64 = 1;
/// A nudge came since the last poll while the reader was not parked: the poll under way
/// may have missed what it was for, so the park that ends it wakes at once.
const MISSED: u64 = 2;
/// The flag bits of [`Pulse::word`]; the poll count is above them.
const FLAGS: u64 = PARKED | MISSED;

impl Pulse {
    /// The reader is being polled: every token dropped before now counts as processed.
    #[inline]
    pub(crate) fn polled(&self) {
        // The flags clear as the count moves, atomically: a token dropped after this
        // is stamped with the new count (this poll does not confirm it), and its
        // nudge's `MISSED` comes after the clear, so the park that ends this poll sees
        // it and wakes. `(w | FLAGS) + 1` is `w` with the flags cleared and the count
        // one higher.
        let _ = self
            .word
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |w| {
                Some((w | FLAGS).wrapping_add(1))
            });
    }

    /// The reader returned `Pending` to the consumer whose waker is in `cx`. A nudge
    /// that came during the poll (a track made room after the poll found it full, a
    /// token dropped after the poll counted the drops) wakes the consumer now: nothing
    /// else would.
    pub(crate) fn park(&self, waker: &std::task::Waker) {
        self.waker.register(waker);
        if self.word.fetch_or(PARKED, Ordering::SeqCst) & MISSED != 0
            // Unless a nudge took the park meanwhile (and woke the consumer itself).
            && self.word.fetch_and(!FLAGS, Ordering::SeqCst) & PARKED != 0
        {
            waker.wake_by_ref();
        }
    }

    pub(crate) fn polls(&self) -> u64 {
        self.word.load(Ordering::SeqCst) >> 2
    }

    /// Wake a parked reader (so that it is polled and confirms dropped tokens, or
    /// yields from a partition that has room again).
    fn nudge(&self) {
        // `MISSED` and the check for `PARKED` in one step: a park before it is seen here
        // (and woken), a park after it sees `MISSED` (and wakes); never neither. Of a
        // nudge and a park racing to clear `PARKED`, one wins and wakes.
        if self.word.fetch_or(MISSED, Ordering::SeqCst) & PARKED != 0
            && self.word.fetch_and(!PARKED, Ordering::SeqCst) & PARKED != 0
        {
            self.waker.wake();
        }
    }
}

const PENDING: u64 = u64::MAX;
const DONE: u64 = u64::MAX - 1;
const FAILED: u64 = u64::MAX - 2;

#[derive(Debug)]
struct Slot {
    offset: i64,
    /// The offset to commit once this message is processed: `offset + 1`, or beyond
    /// when nothing to yield follows it (control records, aborted transactions).
    commit_to: i64,
    /// `PENDING`, `DONE`, `FAILED`, or the reader's poll count when the token was
    /// dropped (processed once the reader was polled after that).
    state: u64,
    /// When it was yielded.
    at: Stamp,
}

#[derive(Debug)]
struct TrackState {
    /// The last offset the broker accepted from this member (-1: none).
    committed: i64,
    /// The next offset to commit (processed message + 1), -1 while nothing is pending.
    pending: i64,
    /// The sequence number of `slots[0]`.
    base: u64,
    /// Yielded messages not yet known processed, in delivery order.
    slots: VecDeque<Slot>,
    /// False once the partition is given up: tokens change nothing any more.
    active: bool,
    /// The reader found the track full and waits for room.
    blocked: bool,
    /// How many times the track was restarted (a seek or reset of its partition, a
    /// rewind) or given up: a loan made before refuses its messages (see
    /// [`Track::deliver_lent`]).
    restarts: u64,
    /// Whether `slots` are in offset order (false after a seek back re-yielded offsets
    /// while earlier deliveries were outstanding; true again once they are empty).
    sorted: bool,
}

/// How a token ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Settle {
    Ack,
    Fail,
    Drop,
    /// Given up for good ([`AckToken::reject`]): a share group archives the record; for
    /// a consumer group's commit it counts as processed.
    Reject,
}

/// How a share-group record's token ended (see [`crate::share`]): what the share
/// reader acknowledges it as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ShareOutcome {
    /// Processed: ACCEPT.
    Accept,
    /// Not processed ([`AckToken::fail`], [`AckToken::release`], a panic): RELEASE.
    Release,
    /// Given up ([`AckToken::reject`]): REJECT.
    Reject,
    /// Dropped: ACCEPT once the reader is polled afterwards (or RELEASE in explicit
    /// mode), RELEASE if the reader closes first.
    Dropped,
}

/// The share reader's record of the records it acquired: a share token settles its
/// record there.
pub(crate) trait ShareLedger: Send + Sync + std::fmt::Debug {
    /// Record `id` ended as `how`.
    fn settle(&self, id: u64, how: ShareOutcome);
}

/// The commit bookkeeping of one ownership of one partition.
#[derive(Debug)]
pub(crate) struct Track {
    pub(crate) id: u64,
    contiguous: bool,
    max_unacked: usize,
    pulse: Arc<Pulse>,
    state: Mutex<TrackState>,
}

static NEXT_TRACK: AtomicU64 = AtomicU64::new(1);

/// Why [`Track::deliver`] refused a message.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Full;

/// Why [`Track::deliver_lent`] refused a message: the track is full, or it was restarted
/// or given up since the loan was made.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Refused;

impl Track {
    pub(crate) fn new(
        committed: i64,
        contiguous: bool,
        max_unacked: usize,
        pulse: Arc<Pulse>,
    ) -> Self {
        Track {
            id: NEXT_TRACK.fetch_add(1, Ordering::Relaxed),
            contiguous,
            max_unacked: max_unacked.max(1),
            pulse,
            state: Mutex::new(TrackState {
                committed,
                pending: committed,
                base: 0,
                slots: VecDeque::new(),
                active: true,
                blocked: false,
                restarts: 0,
                sorted: true,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, TrackState> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Move the pending offset past every processed message at the front (contiguous)
    /// or past the last processed one (not contiguous).
    fn advance(&self, s: &mut TrackState) {
        let polls = self.pulse.polls();
        let processed = |state: u64| state == DONE || state < polls;
        if self.contiguous {
            while let Some(front) = s.slots.front() {
                if !processed(front.state) {
                    break;
                }
                s.pending = s.pending.max(front.commit_to);
                s.slots.pop_front();
                s.base += 1;
            }
        } else if let Some(last) = s.slots.iter().rposition(|sl| processed(sl.state)) {
            if let Some(sl) = s.slots.get(last) {
                s.pending = s.pending.max(sl.commit_to);
            }
            s.slots.drain(..=last);
            s.base += last as u64 + 1;
        }
        if s.slots.is_empty() {
            s.sorted = true;
        }
        if s.blocked && s.slots.len() < self.max_unacked {
            s.blocked = false;
            self.pulse.nudge();
        }
    }

    /// The reader yields the message at `offset`, after which nothing is to be yielded
    /// before `commit_to`: its sequence number, or `Full` when `max_unacked` messages of
    /// this partition are not processed yet.
    pub(crate) fn deliver(&self, offset: i64, commit_to: i64) -> Result<u64, Full> {
        self.deliver_in(&mut self.lock(), offset, commit_to)
    }

    /// [`deliver`](Self::deliver) for a message the consumer yields from a loan, without
    /// the reader's lock: refused when the track is full, and when it was restarted (a
    /// seek, a reset) or given up since the loan was made (`restarts`, as
    /// [`restarts`](Self::restarts) said then), which the reader's lock orders for
    /// messages yielded under it. The consumer then goes on under the lock.
    pub(crate) fn deliver_lent(
        &self,
        offset: i64,
        commit_to: i64,
        restarts: u64,
    ) -> Result<u64, Refused> {
        let mut s = self.lock();
        if !s.active || s.restarts != restarts {
            return Err(Refused);
        }
        self.deliver_in(&mut s, offset, commit_to)
            .map_err(|Full| Refused)
    }

    /// See [`deliver_lent`](Self::deliver_lent).
    pub(crate) fn restarts(&self) -> u64 {
        self.lock().restarts
    }

    fn deliver_in(&self, s: &mut TrackState, offset: i64, commit_to: i64) -> Result<u64, Full> {
        if s.slots.len() >= self.max_unacked {
            self.advance(s);
            if s.slots.len() >= self.max_unacked {
                s.blocked = true;
                return Err(Full);
            }
        }
        if s.slots.back().is_some_and(|sl| sl.offset >= offset) {
            // A seek back re-yields offsets while earlier deliveries are outstanding:
            // they still decide the commit (see `seek`), in delivery order.
            s.sorted = false;
        }
        s.slots.push_back(Slot {
            offset,
            commit_to: commit_to.max(offset.saturating_add(1)),
            state: PENDING,
            at: Stamp::now(),
        });
        Ok(s.base + s.slots.len() as u64 - 1)
    }

    /// Whether [`deliver`](Self::deliver) would take a message now (else the track
    /// wakes the reader when it has room, as after a refused delivery).
    pub(crate) fn has_room(&self) -> bool {
        let mut s = self.lock();
        if s.slots.len() < self.max_unacked {
            return true;
        }
        self.advance(&mut s);
        if s.slots.len() >= self.max_unacked {
            s.blocked = true;
            return false;
        }
        true
    }

    fn forget(s: &mut TrackState) {
        s.base += s.slots.len() as u64;
        s.slots.clear();
        s.sorted = true;
    }

    /// Nothing is to be yielded from `from` up to `to` (a fetch returned only control
    /// records or aborted ones): once everything yielded before `from` is processed, the
    /// commit may move to `to`.
    pub(crate) fn gap(&self, from: i64, to: i64) {
        let mut s = self.lock();
        let pending = s.pending;
        match s.slots.back_mut() {
            Some(last) if last.commit_to == from => last.commit_to = last.commit_to.max(to),
            Some(_) => {}
            None if pending == from => s.pending = pending.max(to),
            None => {}
        }
    }

    /// A seek (or an offset reset) of the partition: only the fetch position moves.
    /// Messages yielded before it stay tracked — a held token still holds the commit,
    /// counts in the stats and is waited for by a close — and the commit moves past
    /// what is yielded after the seek only once they are settled too (contiguous
    /// mode). It never moves backwards. A loan made before is refused.
    pub(crate) fn seek(&self) {
        self.lock().restarts += 1;
    }

    /// The exactly-once rewind to the committed offsets: deliveries so far no longer
    /// decide the commit (their tokens change nothing, [`is_current`](Self::is_current)
    /// says false), as the rewound reader delivers them again.
    pub(crate) fn restart(&self) {
        let mut s = self.lock();
        s.restarts += 1;
        Self::forget(&mut s);
    }

    fn settle(&self, seq: u64, offset: i64, how: Settle) {
        let mut s = self.lock();
        if !s.active || seq < s.base {
            return;
        }
        let polls = self.pulse.polls();
        let idx = (seq - s.base) as usize;
        let Some(slot) = s.slots.get_mut(idx) else {
            return;
        };
        if slot.offset != offset {
            return;
        }
        let how = if how == Settle::Reject {
            Settle::Ack
        } else {
            how
        };
        match how {
            Settle::Ack => slot.state = DONE,
            Settle::Fail if slot.state != DONE => slot.state = FAILED,
            Settle::Drop if slot.state == PENDING => slot.state = polls,
            _ => {}
        }
        match how {
            Settle::Ack if idx == 0 || !self.contiguous => self.advance(&mut s),
            // A dropped token counts once the reader is polled again; a parked reader is
            // woken for that (and would otherwise keep the last drops uncommitted).
            Settle::Drop => {
                drop(s);
                self.pulse.nudge();
            }
            _ => {}
        }
    }

    /// An explicit ack of `offset` (an [`Offset`](crate::group::Offset) sent to a committer).
    /// Returns whether the pending offset moved.
    pub(crate) fn ack_offset(&self, offset: i64) -> bool {
        let mut s = self.lock();
        if !s.active {
            return false;
        }
        let before = s.pending;
        let found = if s.sorted {
            s.slots.binary_search_by_key(&offset, |sl| sl.offset).ok()
        } else {
            // after a seek back: the latest delivery of that offset not yet acked
            s.slots
                .iter()
                .rposition(|sl| sl.offset == offset && sl.state != DONE)
        };
        match found {
            Some(i) => {
                if let Some(sl) = s.slots.get_mut(i) {
                    sl.state = DONE;
                }
                self.advance(&mut s);
            }
            // Not tracked: yielded before this assignment's tracking began, already
            // processed, or never yielded. It moves the commit (the application's
            // explicit commit, as the Java client's `commitSync(offsets)`), but never
            // past a tracked message that is not processed — also one yielded before a
            // seek, which a seek no longer forgets.
            None => {
                let lowest = s.slots.iter().map(|sl| sl.offset).min();
                if lowest.is_some_and(|l| offset >= l) {
                    tracing::debug!(offset, "ack of an offset this reader did not yield ignored");
                } else {
                    let upto = offset.saturating_add(1).min(lowest.unwrap_or(i64::MAX));
                    s.pending = s.pending.max(upto);
                }
            }
        }
        s.pending != before
    }

    /// The offset to commit, if it is ahead of what the broker has.
    pub(crate) fn due(&self) -> Option<i64> {
        let mut s = self.lock();
        self.advance(&mut s);
        (s.active && s.pending > s.committed).then_some(s.pending)
    }

    /// The broker accepted `offset`: never moves backwards.
    pub(crate) fn committed(&self, offset: i64) {
        let mut s = self.lock();
        s.committed = s.committed.max(offset);
    }

    /// The partition was given up: tokens of this ownership change nothing any more.
    pub(crate) fn deactivate(&self) {
        let mut s = self.lock();
        s.active = false;
        s.restarts += 1;
        Self::forget(&mut s);
        if s.blocked {
            s.blocked = false;
            drop(s);
            self.pulse.nudge();
        }
    }

    /// Whether this ownership still counts (the partition was not given up).
    pub(crate) fn active(&self) -> bool {
        self.lock().active
    }

    /// The last offset the broker accepted (-1: none).
    pub(crate) fn committed_offset(&self) -> i64 {
        self.lock().committed
    }

    /// The next offset to commit: past every processed message (-1: nothing yet).
    pub(crate) fn pending_offset(&self) -> i64 {
        let mut s = self.lock();
        self.advance(&mut s);
        s.pending
    }

    /// Whether the message delivered as `seq` still decides this track: the partition
    /// is still owned and no rewind ([`restart`](Self::restart)) forgot the deliveries
    /// since (a seek does not).
    pub(crate) fn is_current(&self, seq: u64) -> bool {
        let s = self.lock();
        s.active && seq >= s.base
    }

    /// Messages yielded whose token is still held: neither acked, failed nor dropped
    /// (a close waits for these before its final commit).
    pub(crate) fn held(&self) -> usize {
        let s = self.lock();
        if !s.active {
            return 0;
        }
        s.slots.iter().filter(|sl| sl.state == PENDING).count()
    }

    /// Messages yielded and not known processed, and the oldest of them (offset, when
    /// it was yielded).
    pub(crate) fn unacked(&self) -> (usize, Option<(i64, Stamp)>) {
        let mut s = self.lock();
        self.advance(&mut s);
        (s.slots.len(), s.slots.front().map(|sl| (sl.offset, sl.at)))
    }
}

/// Says when a message a group [`Reader`](crate::reader::Reader) yielded is processed, so
/// the group commits past it only then. Every such message carries one
/// ([`Message::ack_token`](crate::reader::Message::ack_token)); messages of a reader
/// without a group, and clones of messages, carry an inert one.
///
/// - [`ack`](AckToken::ack): processed.
/// - [`fail`](AckToken::fail): not processed; the partition's commit stays before this
///   message until a rebalance or restart delivers it again.
/// - dropped: processed once the reader is polled again (a `filter` that drops a message
///   goes on polling; a stage that fails and ends the pipeline does not, so the failed
///   message is not committed). Dropped during a panic: failed. A pipeline that ends
///   right after dropping a message without polling the reader again —
///   `reader.take(n).try_filter(p)`, where `take` ends the stream — leaves that one
///   message uncommitted, to be read again (at least once); put `take` after the filter.
///   Concurrent stages (`buffer_unordered`, `try_for_each_concurrent`) poll the reader
///   while earlier messages are still being worked on: keep the token with the work —
///   [`map_tracked`](crate::reader::MessageStreamExt::map_tracked) instead of
///   `map_ok(|m| m.value)`, or
///   [`process_concurrent`](crate::reader::MessageStreamExt::process_concurrent) — or
///   the group commits messages still being processed.
/// - carried by a [`writer::Message`](crate::writer::Message)
///   ([`with_ack`](crate::writer::Message::with_ack)): acked when the broker acknowledges
///   the written message, failed when its delivery fails (at-least-once
///   consume → produce).
///
/// One-to-many: [`share`](AckToken::share) gives a cloneable [`SharedAck`] that is processed
/// once every clone is. Many-to-one: collect tokens into one (`FromIterator`).
///
/// ```
/// use kafkapipe::group::AckToken;
/// # fn demo(mut m: kafkapipe::reader::Message) {
/// let token = m.take_ack_token();
/// // ... hand the work elsewhere, then:
/// token.ack();
/// # }
/// let merged: AckToken = vec![AckToken::default(), AckToken::default()].into_iter().collect();
/// assert!(!merged.is_tracked());
/// ```
#[derive(Debug, Default)]
pub struct AckToken(Kind);

#[derive(Debug, Default)]
enum Kind {
    #[default]
    Inert,
    One {
        track: Arc<Track>,
        seq: u64,
        offset: i64,
    },
    Shared(SharedAck),
    Many(Vec<AckToken>),
    /// A record acquired from a share group.
    Share {
        ledger: Arc<dyn ShareLedger>,
        id: u64,
    },
}

impl AckToken {
    pub(crate) fn tracked(track: Arc<Track>, seq: u64, offset: i64) -> Self {
        AckToken(Kind::One { track, seq, offset })
    }

    /// The token of record `id` of a share reader's `ledger`.
    pub(crate) fn share_record(ledger: Arc<dyn ShareLedger>, id: u64) -> Self {
        AckToken(Kind::Share { ledger, id })
    }

    /// Whether this token decides a commit (false for messages of readers without a
    /// group, clones, and tokens already taken).
    ///
    /// ```
    /// assert!(!kafkapipe::group::AckToken::default().is_tracked());
    /// ```
    pub fn is_tracked(&self) -> bool {
        match &self.0 {
            Kind::Inert => false,
            Kind::One { .. } | Kind::Shared(_) | Kind::Share { .. } => true,
            Kind::Many(v) => v.iter().any(AckToken::is_tracked),
        }
    }

    /// Every consumed message this token stands for: its track, sequence number and
    /// offset (through shared and merged tokens).
    pub(crate) fn sources(&self, out: &mut Vec<(Arc<Track>, u64, i64)>) {
        match &self.0 {
            Kind::Inert | Kind::Share { .. } => {}
            Kind::One { track, seq, offset } => out.push((track.clone(), *seq, *offset)),
            Kind::Shared(s) => {
                s.0.token
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .sources(out)
            }
            Kind::Many(v) => v.iter().for_each(|t| t.sources(out)),
        }
    }

    /// The ownership this token's message was yielded under.
    pub(crate) fn assignment(&self) -> Option<u64> {
        match &self.0 {
            Kind::One { track, .. } => Some(track.id),
            _ => None,
        }
    }

    fn settle(&mut self, how: Settle) {
        match std::mem::take(&mut self.0) {
            Kind::Inert => {}
            Kind::One { track, seq, offset } => track.settle(seq, offset, how),
            Kind::Shared(s) => s.settle(how),
            Kind::Share { ledger, id } => ledger.settle(
                id,
                match how {
                    Settle::Ack => ShareOutcome::Accept,
                    Settle::Fail => ShareOutcome::Release,
                    Settle::Reject => ShareOutcome::Reject,
                    Settle::Drop => ShareOutcome::Dropped,
                },
            ),
            Kind::Many(v) => {
                for mut t in v {
                    t.settle(how);
                }
            }
        }
    }

    /// The message is processed.
    ///
    /// ```
    /// # fn demo(mut m: kafkapipe::reader::Message) {
    /// m.take_ack_token().ack();
    /// # }
    /// ```
    pub fn ack(mut self) {
        self.settle(Settle::Ack);
    }

    pub(crate) fn ack_ref(&self) {
        match &self.0 {
            Kind::One { track, seq, offset } => track.settle(*seq, *offset, Settle::Ack),
            Kind::Share { ledger, id } => ledger.settle(*id, ShareOutcome::Accept),
            _ => {}
        }
    }

    /// The message was not processed and should be delivered again: the same as
    /// [`fail`](AckToken::fail). For a [share group](crate::share) record this is a
    /// RELEASE: the broker hands the record out again (to any member), its delivery
    /// count one higher.
    ///
    /// ```
    /// # fn demo(mut m: kafkapipe::reader::Message) {
    /// m.take_ack_token().release();
    /// # }
    /// ```
    pub fn release(self) {
        self.fail();
    }

    /// The message is given up for good. For a [share group](crate::share) record this
    /// is a REJECT: the broker archives the record and never delivers it again (a poison
    /// message). For a consumer group it counts as processed (the commit passes it): the
    /// group protocol has no way to skip a record other than committing past it.
    ///
    /// ```
    /// # fn demo(mut m: kafkapipe::reader::Message) {
    /// m.take_ack_token().reject();
    /// # }
    /// ```
    pub fn reject(mut self) {
        self.settle(Settle::Reject);
    }

    /// The message was not processed: its partition's commit stays before it.
    ///
    /// ```
    /// # fn demo(mut m: kafkapipe::reader::Message) {
    /// m.take_ack_token().fail();
    /// # }
    /// ```
    pub fn fail(mut self) {
        self.settle(Settle::Fail);
    }

    /// A cloneable token for one-to-many transforms: processed when every clone is
    /// (acked or dropped), failed if any clone failed.
    ///
    /// ```
    /// # fn demo(mut m: kafkapipe::reader::Message) {
    /// let shared = m.take_ack_token().share();
    /// let (a, b) = (shared.clone(), shared);
    /// a.ack();
    /// b.ack(); // now the message is processed
    /// # }
    /// ```
    pub fn share(mut self) -> SharedAck {
        SharedAck(Arc::new(SharedInner {
            token: Mutex::new(std::mem::take(&mut self)),
            failed: AtomicBool::new(false),
            acked: AtomicBool::new(false),
            rejected: AtomicBool::new(false),
        }))
    }
}

/// A token inside a [`Writer`](crate::writer::Writer): acked when the broker acknowledges
/// its message; however else it goes (the message rejected, its delivery failed, the
/// writer dropped) it fails, so a message is never taken as processed because a writer
/// lost what was made of it.
#[derive(Debug, Default)]
pub(crate) struct HeldAck(AckToken);

impl HeldAck {
    pub(crate) fn new(token: AckToken) -> Self {
        HeldAck(token)
    }

    pub(crate) fn is_tracked(&self) -> bool {
        self.0.is_tracked()
    }

    pub(crate) fn ack(mut self) {
        std::mem::take(&mut self.0).ack();
    }
}

impl Drop for HeldAck {
    fn drop(&mut self) {
        std::mem::take(&mut self.0).fail();
    }
}

impl Drop for AckToken {
    fn drop(&mut self) {
        if matches!(self.0, Kind::Inert) {
            return;
        }
        self.settle(if std::thread::panicking() {
            Settle::Fail
        } else {
            Settle::Drop
        });
    }
}

impl FromIterator<AckToken> for AckToken {
    fn from_iter<I: IntoIterator<Item = AckToken>>(iter: I) -> Self {
        let v: Vec<AckToken> = iter.into_iter().filter(AckToken::is_tracked).collect();
        if v.is_empty() {
            AckToken::default()
        } else {
            AckToken(Kind::Many(v))
        }
    }
}

impl From<SharedAck> for AckToken {
    fn from(s: SharedAck) -> Self {
        AckToken(Kind::Shared(s))
    }
}

/// A cloneable [`AckToken`] (from [`AckToken::share`]): the message is processed when
/// every clone is acked or dropped, failed if any clone failed. Convert a clone into an
/// `AckToken` to hand it to a [`writer::Message`](crate::writer::Message).
///
/// ```
/// # fn demo(mut m: kafkapipe::reader::Message) {
/// use kafkapipe::writer;
/// let shared = m.take_ack_token().share();
/// let out: Vec<writer::Message> = ["a", "b"]
///     .into_iter()
///     .map(|v| writer::Message::new(v).with_ack(shared.clone()))
///     .collect();
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct SharedAck(Arc<SharedInner>);

#[derive(Debug)]
struct SharedInner {
    token: Mutex<AckToken>,
    failed: AtomicBool,
    /// Some clone was acked explicitly (so the end is an ack, not a drop).
    acked: AtomicBool,
    /// Some clone was rejected (and none failed): the end is a reject.
    rejected: AtomicBool,
}

impl SharedAck {
    fn settle(self, how: Settle) {
        match how {
            Settle::Fail => self.0.failed.store(true, Ordering::SeqCst),
            Settle::Ack => self.0.acked.store(true, Ordering::SeqCst),
            Settle::Reject => self.0.rejected.store(true, Ordering::SeqCst),
            Settle::Drop => {}
        }
        // The last clone decides when it goes (SharedInner's drop).
    }

    /// This part is processed.
    ///
    /// ```
    /// # fn demo(s: kafkapipe::group::SharedAck) {
    /// s.ack();
    /// # }
    /// ```
    pub fn ack(self) {
        self.settle(Settle::Ack);
    }

    /// This part was not processed: neither is the message.
    ///
    /// ```
    /// # fn demo(s: kafkapipe::group::SharedAck) {
    /// s.fail();
    /// # }
    /// ```
    pub fn fail(self) {
        self.settle(Settle::Fail);
    }
}

impl Drop for SharedInner {
    fn drop(&mut self) {
        let mut token = std::mem::take(
            self.token
                .get_mut()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        let how = if self.failed.load(Ordering::SeqCst) || std::thread::panicking() {
            Settle::Fail
        } else if self.rejected.load(Ordering::SeqCst) {
            Settle::Reject
        } else if self.acked.load(Ordering::SeqCst) {
            Settle::Ack
        } else {
            Settle::Drop
        };
        token.settle(how);
    }
}

#[cfg(test)]
mod tests;
