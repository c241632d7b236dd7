//! The task's accumulator: where each message goes and the batches it goes into (the
//! Java producer's `RecordAccumulator`).
//!
//! Owns placing messages into partitions (the balancer, the partition checks, the size
//! limit), each partition's open batch, the messages held un-encoded while the encoded
//! bytes are over the budget ([`Task::encode_ahead`]), sealing (linger, size, count,
//! flush) into the partition's queue of [`Sealed`] batches, splitting a batch the broker
//! found too large, and the spare batch buffers. It also declares the per-partition
//! [`PartState`], whose batches the sender sends and whose sequence fields
//! `producer.rs` keeps.
//!
//! May not: send, number or finish a batch — once sealed, a batch belongs to the sender
//! (`sender.rs`), which reads the in-flight fields of [`PartState`]; the accumulator
//! only reads them in [`Task::seal_expired`], to keep a batch that could not go open.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use tracing::warn;

use super::metadata::TopicState;
use super::task::{after, Cmd, Task};
use super::{Group, Message, Shared, WriterConfig};
use crate::ack::HeldAck;
use crate::compression::Compression;
use crate::conn::Connection;
use crate::error::{Error, Result};
use crate::protocol::ErrorCode;
use crate::record::{decode_batches, BatchBytes, RecordBatchBuilder};

/// Size of a RecordBatch v2 header (everything before the records).
pub(super) const BATCH_OVERHEAD: usize = 61;

/// Buffers of acknowledged batches kept for the next batches: a busy writer then fills
/// memory it touched before instead of fresh pages (a page fault each 4 KiB).
pub(super) const SPARE_BATCH_BUFFERS: usize = 64;

/// Most capacity kept in spare batch buffers: a request's worth of 1 MiB batches for 16
/// partitions is reused whole (4 buffers made 12 of 16 partitions' batches fresh, page-
/// faulted memory on every round), with their headers and [`BATCH_SLACK`].
pub(super) const SPARE_BATCH_BYTES: usize = 17 << 20;

/// Room a new batch buffer has beyond its records' bytes (and the header): the framing
/// a codec adds to data that hardly compresses (an LZ4 frame of 1 MiB adds some 80
/// bytes), so that such a batch does not outgrow its buffer when compressed in place.
pub(super) const BATCH_SLACK: usize = 1 << 10;

/// Messages of at least this many accounted bytes ([`Message::size`]) may wait
/// un-encoded in their partition's `held` queue (see [`Task::encode_ahead`]). A waiting
/// message costs its [`Msg`] (some 200 bytes) beside the value it already holds, which
/// for small values is more than their encoded form: those are encoded at once, unless a
/// held message is ahead of them in their partition.
const HOLD_MIN: usize = 512;

/// How many full batches' bytes ([`WriterConfig::batch_bytes`]) are encoded ahead of the
/// acknowledgements before large messages wait un-encoded (see [`Task::encode_ahead`]),
/// and the least number of bytes that is (small batches keep several in flight).
pub(super) const ENCODE_AHEAD_BATCHES: usize = 2;

pub(super) const ENCODE_AHEAD_MIN: usize = 2 << 20;

/// One accepted message on its way to the task.
pub(crate) struct Msg {
    pub(crate) msg: Message,
    pub(crate) size: usize,
    pub(crate) group: Arc<Group>,
    /// The consumed messages this one was made from: acked when it is written.
    pub(crate) ack: HeldAck,
    /// When the handle accepted it (or the task took it off the queue, a moment later):
    /// its delivery timeout runs from here.
    pub(crate) accepted: Instant,
}

impl Msg {
    /// A message taken off the queue at `accepted`, of the flush group `group` (one
    /// that nobody waits for if no `Cmd::Group` came, which the senders never do).
    pub(super) fn taken(
        mut msg: Message,
        group: &mut Option<Arc<Group>>,
        accepted: Instant,
    ) -> Msg {
        let ack = HeldAck::new(std::mem::take(&mut msg.ack));
        Msg {
            size: msg.size(),
            group: group.get_or_insert_with(Group::open).clone(),
            ack,
            accepted,
            msg,
        }
    }
}

/// A message being placed into a batch: owned (a [`Msg`]: from `write_messages`, a
/// waiting list or a held queue), or still where the command queue's segment holds it
/// ([`Queued`]), moved out only when it must be kept (held, waiting, rejected, or kept
/// for its delivery report). A message placed from the queue is encoded where it lies:
/// the moves of its 170-byte struct out of the segment and into a `Msg` were a tenth of
/// the producer's CPU with 100-byte values.
trait Incoming {
    fn message(&self) -> &Message;
    /// Its accounted size ([`Message::size`]).
    fn size(&self) -> usize;
    fn accepted(&self) -> Instant;
    /// Its flush group.
    fn group(&self) -> &Arc<Group>;
    /// Its ack token, if it tracks anything.
    fn take_ack(&mut self) -> Option<HeldAck>;
    fn into_msg(self) -> Msg;
    /// The message itself (for its delivery report).
    fn into_message(self) -> Message;
    /// Encoded and not kept: let go of its key, value and headers now (a queued
    /// message's would otherwise live until the segment is cleared).
    fn encoded(self);
}

impl Incoming for Msg {
    fn message(&self) -> &Message {
        &self.msg
    }
    fn size(&self) -> usize {
        self.size
    }
    fn accepted(&self) -> Instant {
        self.accepted
    }
    fn group(&self) -> &Arc<Group> {
        &self.group
    }
    fn take_ack(&mut self) -> Option<HeldAck> {
        self.ack.is_tracked().then(|| std::mem::take(&mut self.ack))
    }
    fn into_msg(self) -> Msg {
        self
    }
    fn into_message(self) -> Message {
        self.msg
    }
    fn encoded(self) {}
}

/// A message in the command queue's segment (see [`Incoming`]).
struct Queued<'a> {
    msg: &'a mut Message,
    size: usize,
    group: &'a Arc<Group>,
    accepted: Instant,
}

impl Incoming for Queued<'_> {
    fn message(&self) -> &Message {
        self.msg
    }
    fn size(&self) -> usize {
        self.size
    }
    fn accepted(&self) -> Instant {
        self.accepted
    }
    fn group(&self) -> &Arc<Group> {
        self.group
    }
    fn take_ack(&mut self) -> Option<HeldAck> {
        let ack = HeldAck::new(std::mem::take(&mut self.msg.ack));
        ack.is_tracked().then_some(ack)
    }
    fn into_msg(self) -> Msg {
        let mut msg = std::mem::take(self.msg);
        Msg {
            ack: HeldAck::new(std::mem::take(&mut msg.ack)),
            size: self.size,
            group: self.group.clone(),
            accepted: self.accepted,
            msg,
        }
    }
    fn into_message(self) -> Message {
        std::mem::take(self.msg)
    }
    fn encoded(self) {
        self.msg.key = None;
        self.msg.value = None;
        self.msg.headers = Vec::new();
    }
}

/// Which waiting callers a batch's messages belong to: `(group, count)` runs.
pub(super) type Runs = Vec<(Arc<Group>, usize)>;

pub(super) fn add_run(runs: &mut Runs, group: &Arc<Group>) {
    match runs.last_mut() {
        Some((g, n)) if Arc::ptr_eq(g, group) => *n += 1,
        _ => runs.push((group.clone(), 1)),
    }
}

/// Messages kept for delivery reports: index in the batch, message, accounted size.
pub(super) type Kept = Vec<(u32, Message, usize)>;

/// The ack tokens of a batch's messages that carry one: index in the batch, token.
pub(super) type Acks = Vec<(u32, HeldAck)>;

pub(super) struct OpenBatch {
    pub(super) builder: RecordBatchBuilder,
    pub(super) runs: Runs,
    pub(super) kept: Kept,
    pub(super) acks: Acks,
    pub(super) count: usize,
    pub(super) bytes: usize,
    pub(super) deadline: Instant,
    /// Acceptance time of its oldest message: the batch's delivery timeout runs from here.
    pub(super) first_accepted: Instant,
    /// Past its linger but kept open by [`Task::seal_expired`] until it can be sent: the
    /// loop's timer then waits for its delivery timeout, not the deadline.
    pub(super) held: bool,
}

pub(super) struct Sealed {
    /// Tells the partition's batches apart (responses may come for any in flight).
    pub(super) id: u64,
    pub(super) data: BatchBytes,
    /// Counts `data` in the task's encoded bytes while the batch lives.
    pub(super) encoded: Encoded,
    pub(super) runs: Runs,
    pub(super) kept: Kept,
    pub(super) acks: Acks,
    /// Producer id, epoch and base sequence written into `data` (idempotent writers).
    pub(super) stamp: Option<(i64, i16, i32)>,
    pub(super) count: usize,
    pub(super) bytes: usize,
    pub(super) attempts: u32,
    /// When the batch fails for good unless acknowledged (delivery timeout).
    pub(super) expires: Instant,
    /// Acceptance time of its oldest message: its queue time runs from here until it is
    /// first sent.
    pub(super) accepted: Instant,
    /// The last retriable error it met, reported if it expires.
    pub(super) last_error: Option<Error>,
    /// In a produce request right now.
    pub(super) in_flight: bool,
    /// Sent before (or holding sequence numbers that must go out in order): it is sent
    /// again only from the front of its partition, with nothing else in flight there.
    pub(super) sent: bool,
}

/// A sealed batch's share of the task's encoded bytes (the bytes of every batch sealed
/// and not done yet), counted from its seal until it is dropped, whichever way it goes.
pub(super) struct Encoded {
    bytes: usize,
    shared: Arc<Shared>,
}

impl Encoded {
    pub(super) fn new(shared: &Arc<Shared>, bytes: usize) -> Encoded {
        shared.encoded.fetch_add(bytes, Ordering::Relaxed);
        Encoded {
            bytes,
            shared: shared.clone(),
        }
    }
}

impl Drop for Encoded {
    fn drop(&mut self) {
        self.shared.encoded.fetch_sub(self.bytes, Ordering::Relaxed);
    }
}

/// One partition's state in the task. Its fields are kept by the parts named in the
/// comments; the others only read them.
#[derive(Default)]
pub(super) struct PartState {
    // The accumulator's.
    pub(super) open: Option<OpenBatch>,
    /// Large messages of the partition waiting to be encoded, oldest first: the task
    /// holds the encoded bytes of its sealed batches to [`Task::encode_ahead`], so a batch
    /// is encoded shortly before it is sent (while its buffer is still in the cache) and
    /// the producer's memory is the messages' values rather than copies of them. Every
    /// later message of the partition waits behind them (order). Messages are held only
    /// while the partition has a sealed batch: its answer or expiry releases them (see
    /// [`releasable`]), and their delivery timeout then runs out in their own batch.
    pub(super) held: VecDeque<Msg>,
    /// A flush came while messages were held: seal their batch once they are placed.
    pub(super) seal_held: bool,
    // Sealed by the accumulator, sent and finished by the sender (`sender.rs`).
    /// Batches not done yet, oldest first; those in requests and those sent before
    /// (idempotent writers: those with sequence numbers) come first.
    pub(super) sealed: VecDeque<Sealed>,
    /// How many of `sealed` are in requests right now.
    pub(super) in_flight: usize,
    /// The connection those requests were queued on, if known: a new batch joins them
    /// only on the same connection, so the broker gets the partition's batches in order.
    pub(super) conn: Option<Connection>,
    /// Retry backoff: nothing of the partition is sent before then.
    pub(super) retry_at: Option<Instant>,
    // The accumulator's.
    /// Id of the next batch sealed.
    pub(super) next_id: u64,
    /// Bytes the last batch sealed wrote into its buffer (before compression; values
    /// spliced in by reference not counted): the next one's buffer starts that large, so
    /// a busy partition's batches rarely grow theirs.
    pub(super) last_len: usize,
    // The producer state's (`producer.rs`): idempotent writers' numbering.
    /// Idempotence: the producer id and epoch the sequence numbers below count under.
    /// When the writer's producer differs (an epoch bump or a new id), the partition
    /// restarts at sequence 0 once none of its batches numbered under this one is left
    /// (Java's `maybeUpdateProducerIdAndEpoch`).
    pub(super) producer: Option<(i64, i16)>,
    /// The sequence number of the next batch stamped (idempotent writers).
    pub(super) next_seq: i32,
    /// The last sequence number the broker acknowledged under `producer`.
    pub(super) last_acked: Option<i32>,
    /// A batch was given up while its fate was unknown: the sequence number after it.
    /// No new batch is numbered until the batches before it are resolved; then, unless
    /// a later batch proved it written, the epoch is bumped (Java's
    /// `maybeResolveSequences`).
    pub(super) unresolved: Option<i32>,
    /// An epoch bump is wanted for this partition: once none of its batches is in
    /// flight, the epoch is bumped and its batches renumbered from 0 (Java's
    /// `requestEpochBumpForPartition`).
    pub(super) bump: bool,
}

/// A map by partition id, hashed with one multiplication (every message looks its
/// partition up) rather than SipHash: the ids come from the cluster's metadata and are
/// as many as the topic's partitions, so colliding ids could only slow the lookups of
/// that bounded set.
pub(super) type PartMap<V> = HashMap<i32, V, crate::util::Fib>;

impl Task {
    /// What placing messages takes ([`Placing`], keeping them for reports if `keep`),
    /// borrowed beside the topics it places into and the current flush group.
    fn placing(
        &mut self,
        keep: bool,
    ) -> (
        Placing<'_>,
        &mut HashMap<Arc<str>, TopicState>,
        &mut Option<Arc<Group>>,
    ) {
        let Task {
            cfg,
            shared,
            unreported,
            topics,
            group,
            spare_buffers,
            encode_ahead,
            ..
        } = self;
        let cfg: &WriterConfig = cfg;
        let cx = Placing {
            cfg,
            shared,
            encode_ahead: *encode_ahead,
            unreported,
            keep,
            spare_buffers,
        };
        (cx, topics, group)
    }

    /// Handle the commands received in one wake. Each run of messages is placed without
    /// a lookup per message: a topic's state is found once per change of topic.
    ///
    /// The messages' delivery timeouts count from now (one clock read for all of them):
    /// they were accepted at most one turn of the task's loop earlier.
    pub(super) fn on_cmds(&mut self, buf: &mut Vec<Cmd>, ts: i64) {
        let accepted = Instant::now();
        let mut cmds = std::mem::take(buf);
        // Messages are placed where they lie in the segment (see [`Incoming`]); what is
        // left of them is dropped with the segment's other commands at the end.
        let mut next = 0;
        let mut rejected: Vec<(Msg, Error)> = Vec::new();
        loop {
            let mut other = None;
            // Again after each command: a `Reports` ahead of messages wants them kept.
            let keep = self.keeps_reports();
            {
                let (mut cx, topics, group) = self.placing(keep);
                let mut cur: Option<(Arc<str>, &mut TopicState)> = None;
                while let Some(cmd) = cmds.get_mut(next) {
                    next += 1;
                    let msg = match cmd {
                        Cmd::One(msg) => msg,
                        Cmd::Group(g) => {
                            *group = Some(g.clone());
                            continue;
                        }
                        // Taken out (an inert `Flush` left in its place) and handled below.
                        cmd => {
                            other = Some(std::mem::replace(cmd, Cmd::Flush));
                            break;
                        }
                    };
                    let m = Queued {
                        size: msg.size(),
                        msg,
                        group: group.get_or_insert_with(Group::open),
                        accepted,
                    };
                    let Some(name) = m.msg.topic.as_deref().or(cx.cfg.topic.as_deref()) else {
                        let e = Error::config(
                            "message has no topic and the writer has no default topic",
                        );
                        rejected.push((m.into_msg(), e));
                        continue;
                    };
                    if cur.as_ref().is_none_or(|(k, _)| **k != *name) {
                        let key: Arc<str> = match topics.get_key_value(name) {
                            Some((k, _)) => k.clone(),
                            None => {
                                let k: Arc<str> = Arc::from(name);
                                topics.insert(k.clone(), TopicState::default());
                                k
                            }
                        };
                        cur = topics.get_mut(&key).map(|t| (key, t));
                    }
                    let Some((key, t)) = cur.as_mut() else {
                        // Not reached: the topic's state was found or made just above.
                        let e = Error::closed("the writer lost the topic's state");
                        rejected.push((m.into_msg(), e));
                        continue;
                    };
                    if t.meta.is_none() {
                        t.waiting.push(m.into_msg());
                        continue;
                    }
                    if let Err(r) = place(&mut cx, key, t, m, ts) {
                        rejected.push(*r);
                    }
                }
            }
            for (m, e) in rejected.drain(..) {
                self.reject(m, e);
            }
            match other {
                Some(cmd) => self.on_cmd(cmd, ts),
                None => break,
            }
        }
        cmds.clear();
        *buf = cmds;
    }

    pub(super) fn accept(&mut self, m: Msg, ts: i64) {
        let name = match (&m.msg.topic, &self.cfg.topic) {
            (Some(t), _) | (None, Some(t)) => t.as_str(),
            (None, None) => {
                let e = Error::config("message has no topic and the writer has no default topic");
                return self.reject(m, e);
            }
        };
        let key: Arc<str> = match self.topics.get_key_value(name) {
            Some((k, _)) => k.clone(),
            None => {
                let k: Arc<str> = Arc::from(name);
                self.topics.insert(k.clone(), TopicState::default());
                k
            }
        };
        let Some(t) = self.topics.get_mut(&key) else {
            return;
        };
        if t.meta.is_none() {
            t.waiting.push(m);
            return;
        }
        self.assign(&key, m, ts);
    }

    /// Put a message of a topic with known partitions into its partition's open batch.
    pub(super) fn assign(&mut self, topic: &Arc<str>, m: Msg, ts: i64) {
        let keep = self.keeps_reports();
        let (mut cx, topics, _) = self.placing(keep);
        let Some(t) = topics.get_mut(topic) else {
            return;
        };
        if let Err(rejected) = place(&mut cx, topic, t, m, ts) {
            let (m, e) = *rejected;
            self.reject(m, e);
        }
    }

    /// Whether accepted messages are kept for delivery reports.
    fn keeps_reports(&self) -> bool {
        self.reports.as_ref().is_some_and(|r| !r.is_closed())
    }

    pub(super) fn seal_all(&mut self) {
        for (name, t) in &mut self.topics {
            if !t.waiting.is_empty() {
                t.seal_when_assigned = true;
            }
            for (p, ps) in &mut t.parts {
                if !ps.held.is_empty() {
                    ps.seal_held = true;
                }
                if ps.open.is_some() {
                    self.unreported.extend(seal(
                        ps,
                        &self.shared,
                        self.cfg.delivery_timeout,
                        &mut self.spare_buffers,
                        name,
                        *p,
                    ));
                }
            }
        }
    }

    /// Append held messages (see [`PartState::held`]) to their partitions' batches while
    /// the encoded bytes are under [`Task::encode_ahead`], or while the partition has no
    /// batch left to wait for. A partition flushed while it held messages has its batch
    /// sealed once they are in.
    pub(super) fn release_held(&mut self) {
        let keep = self.keeps_reports();
        let mut rejected = Vec::new();
        let (mut cx, topics, _) = self.placing(keep);
        for (name, t) in topics.iter_mut() {
            for (p, ps) in &mut t.parts {
                while releasable(ps, cx.over_budget()) {
                    let Some(m) = ps.held.pop_front() else {
                        break;
                    };
                    let ts = m.msg.timestamp.unwrap_or_default();
                    match append(&mut cx, name, ps, *p, m, ts, true) {
                        Ok(None) => {}
                        Ok(Some(m)) => {
                            ps.held.push_front(m);
                            break;
                        }
                        Err(r) => rejected.push(*r),
                    }
                }
                // Flushed: the last of them go as soon as they are in (earlier ones went
                // in full batches).
                if ps.seal_held && ps.held.is_empty() {
                    ps.seal_held = false;
                    cx.seal(ps, name, *p);
                }
            }
        }
        for (m, e) in rejected {
            self.reject(m, e);
        }
    }

    /// Seal the open batches whose linger is over, except those that could not be sent
    /// now anyway: a batch of a partition with queued batches, at its in-flight limit, or
    /// led by a broker at its in-flight limit keeps taking messages until it can go (or
    /// is full, or its delivery timeout is due), as the Java client appends to a batch
    /// until its sender drains it. Sealing it at once would queue a train of small
    /// batches, each then waiting for a request of its own. Whether anything was sealed.
    pub(super) fn seal_expired(&mut self, now: Instant) -> bool {
        let per_partition = self.max_in_flight_per_partition();
        let per_broker = self.cfg.max_in_flight_per_broker;
        let delivery_timeout = self.cfg.delivery_timeout;
        let numbered = self.producer.is_some();
        let mut sealed = false;
        for (name, t) in &mut self.topics {
            for (p, ps) in &mut t.parts {
                let first_unacked = numbered && ps.awaits_first_ack();
                let Some(o) = ps.open.as_mut() else {
                    continue;
                };
                if o.deadline > now {
                    continue;
                }
                let blocked = ps.sealed.iter().any(|b| !b.in_flight)
                    || ps.in_flight >= per_partition
                    || first_unacked
                    || self
                        .cluster
                        .cached_leader(name, *p)
                        .and_then(|leader| self.in_flight.get(&leader))
                        .is_some_and(|n| *n >= per_broker);
                o.held = blocked;
                if blocked && after(o.first_accepted, delivery_timeout) > now {
                    continue;
                }
                self.unreported.extend(seal(
                    ps,
                    &self.shared,
                    self.cfg.delivery_timeout,
                    &mut self.spare_buffers,
                    name,
                    *p,
                ));
                sealed = true;
            }
        }
        sealed
    }
}

/// Whether partition `ps` holds messages that may be appended now: it has no batch left
/// to wait for, or the encoded bytes are under the budget. [`Task::release_held`] leaves
/// none such, and [`Task::next_deadline`] wakes the loop at once for any it finds (a
/// batch may go after the release in a turn: expired, or finished by an epoch bump).
pub(super) fn releasable(ps: &PartState, over_budget: bool) -> bool {
    !ps.held.is_empty() && (ps.sealed.is_empty() || !over_budget)
}

/// What `place` needs of the task besides the topic.
struct Placing<'a> {
    cfg: &'a WriterConfig,
    shared: &'a Arc<Shared>,
    /// [`Task::encode_ahead`].
    encode_ahead: usize,
    /// Reports of messages whose batch could not be built.
    unreported: &'a mut Vec<(Kept, Error)>,
    /// Keep the messages for delivery reports.
    keep: bool,
    /// Buffers for new batches.
    spare_buffers: &'a mut Vec<BytesMut>,
}

impl Placing<'_> {
    /// Whether the encoded bytes have reached [`Task::encode_ahead`].
    fn over_budget(&self) -> bool {
        self.shared.encoded.load(Ordering::Relaxed) >= self.encode_ahead
    }

    /// Seal partition `partition`'s open batch (see [`seal`]); the messages of one that
    /// could not be built are kept for their reports.
    fn seal(&mut self, ps: &mut PartState, topic: &str, partition: i32) {
        self.unreported.extend(seal(
            ps,
            self.shared,
            self.cfg.delivery_timeout,
            self.spare_buffers,
            topic,
            partition,
        ));
    }
}

/// Put a message of topic `topic` (state `t`, partitions known) into its partition's open
/// batch, or give it back with the error to reject it with.
fn place<M: Incoming>(
    cx: &mut Placing<'_>,
    topic: &Arc<str>,
    t: &mut TopicState,
    m: M,
    ts: i64,
) -> std::result::Result<(), Box<(Msg, Error)>> {
    let cfg = cx.cfg;
    let partition = match m.message().partition {
        Some(p) if t.ids.binary_search(&p).is_ok() => p,
        // The partition may have been added since the metadata was asked for: look
        // again before failing the message.
        Some(_) if t.meta_asked.is_none_or(|asked| asked < m.accepted()) => {
            t.recheck.push(m.into_msg());
            return Ok(());
        }
        Some(p) => {
            let e = Error::kafka(ErrorCode::UnknownTopicOrPartition)
                .with_topic(&**topic)
                .with_partition(p);
            return Err(Box::new((m.into_msg(), e)));
        }
        None if t.ids.is_empty() => {
            let e = Error::kafka(ErrorCode::UnknownTopicOrPartition)
                .with_message("topic has no partitions")
                .with_topic(&**topic);
            return Err(Box::new((m.into_msg(), e)));
        }
        None => cfg.balancer.partition(m.message(), &t.ids),
    };
    let ps = t.parts.entry(partition).or_default();
    let msg = m.message();
    let ts = msg.timestamp.unwrap_or(ts);
    let (key, value, headers) = (msg.key.as_deref(), msg.value.as_deref(), &msg.headers);
    let size = m.size();
    // `Message::size` plus slack bounds the record's encoded size; only messages near
    // the limit pay for the exact computation.
    let alone = if size.saturating_add(64 + BATCH_OVERHEAD) <= cfg.batch_bytes {
        Ok(0)
    } else {
        RecordBatchBuilder::new(cfg.compression)
            .record_size(ts, key, value, headers)
            .map(|n| n + BATCH_OVERHEAD)
    };
    match alone {
        Ok(n) if n > cfg.batch_bytes => {
            let e = Error::kafka(ErrorCode::MessageTooLarge)
                .with_message(format!(
                    "message of {n} bytes (as a batch) exceeds batch_bytes = {}",
                    cfg.batch_bytes
                ))
                .with_topic(&**topic)
                .with_partition(partition);
            return Err(Box::new((m.into_msg(), e)));
        }
        Ok(_) => {}
        Err(e) => {
            return Err(Box::new((
                m.into_msg(),
                e.with_topic(&**topic).with_partition(partition),
            )))
        }
    }
    let large = size >= HOLD_MIN;
    if !ps.held.is_empty() || (large && !ps.sealed.is_empty() && cx.over_budget()) {
        hold(ps, m.into_msg(), partition, ts);
        return Ok(());
    }
    if let Some(m) = append(cx, topic, ps, partition, m, ts, large)? {
        hold(ps, m, partition, ts);
    }
    Ok(())
}

/// Queue `m` in its partition's `held` list, its partition and timestamp fixed now
/// ([`Task::release_held`] appends it later).
fn hold(ps: &mut PartState, mut m: Msg, partition: i32, ts: i64) {
    m.msg.partition = Some(partition);
    m.msg.timestamp = Some(ts);
    ps.held.push_back(m);
}

/// Append message `m` (its size checked against `batch_bytes`) to partition
/// `partition`'s open batch, opening one if needed and sealing it when full, or give it
/// back with the error to reject it with. With `may_hold`, a message that fills the open
/// batch is given back as `Ok(Some(m))` when sealing that batch used up the encoding
/// budget: it is held rather than left alone in a new batch (which the linger or a
/// flush would send as a batch of one, every time the budget runs out).
fn append<M: Incoming>(
    cx: &mut Placing<'_>,
    topic: &Arc<str>,
    ps: &mut PartState,
    partition: i32,
    mut m: M,
    ts: i64,
    may_hold: bool,
) -> std::result::Result<Option<Msg>, Box<(Msg, Error)>> {
    let cfg = cx.cfg;
    let msg = m.message();
    let (key, value, headers) = (msg.key.as_deref(), msg.value.as_deref(), &msg.headers);
    if let Some(open) = &ps.open {
        let more = open
            .builder
            .record_size(ts, key, value, headers)
            .unwrap_or(usize::MAX);
        if open.builder.estimated_size().saturating_add(more) > cfg.batch_bytes {
            cx.seal(ps, topic, partition);
            if may_hold && cx.over_budget() {
                return Ok(Some(m.into_msg()));
            }
        }
    }
    let (size, accepted) = (m.size(), m.accepted());
    let last_len = ps.last_len;
    let spare = &mut *cx.spare_buffers;
    let open = ps.open.get_or_insert_with(|| OpenBatch {
        builder: {
            let want = batch_capacity(cfg, last_len);
            match crate::bufpool::take_best_fit(spare, want, BytesMut::capacity) {
                Some(buf) => RecordBatchBuilder::with_buffer(cfg.compression, buf),
                None => RecordBatchBuilder::with_capacity(cfg.compression, want),
            }
        },
        runs: Vec::new(),
        kept: Vec::new(),
        acks: Vec::new(),
        count: 0,
        bytes: 0,
        deadline: after(Instant::now(), cfg.batch_timeout),
        first_accepted: accepted,
        held: false,
    });
    open.first_accepted = open.first_accepted.min(accepted);
    if let Err(e) = open
        .builder
        .append_shared(ts, key, msg.value.as_ref(), headers)
    {
        return Err(Box::new((
            m.into_msg(),
            e.with_topic(&**topic).with_partition(partition),
        )));
    }
    add_run(&mut open.runs, m.group());
    m.group().placed(partition);
    if let Some(ack) = m.take_ack() {
        let index = u32::try_from(open.count).unwrap_or(u32::MAX);
        open.acks.push((index, ack));
    }
    if cx.keep {
        let mut msg = m.into_message();
        msg.topic = Some(topic.to_string());
        msg.partition = Some(partition);
        msg.timestamp = Some(ts);
        open.kept
            .push((u32::try_from(open.count).unwrap_or(u32::MAX), msg, size));
    } else {
        m.encoded();
    }
    open.count += 1;
    open.bytes += size;
    if open.count >= cfg.batch_size {
        cx.seal(ps, topic, partition);
    }
    Ok(None)
}

/// Take every batch of `ps` not in a request, oldest first.
pub(super) fn take_idle(ps: &mut PartState) -> Vec<Sealed> {
    let (busy, idle): (VecDeque<Sealed>, VecDeque<Sealed>) = std::mem::take(&mut ps.sealed)
        .into_iter()
        .partition(|b| b.in_flight);
    ps.sealed = busy;
    idle.into()
}

/// Seal the partition's open batch (if any) into its queue. A compressed batch much
/// smaller than its buffer gives the buffer back to `spare` at once.
/// If the batch cannot be built its messages fail; those kept for delivery reports are
/// returned with the error.
pub(super) fn seal(
    ps: &mut PartState,
    shared: &Arc<Shared>,
    delivery_timeout: Duration,
    spare: &mut Vec<BytesMut>,
    topic: &str,
    partition: i32,
) -> Option<(Kept, Error)> {
    let open = ps.open.take()?;
    ps.last_len = open.builder.buffer_len();
    match open.builder.build_compact() {
        Ok((data, emptied)) => {
            if let Some(buf) = emptied {
                recycle(spare, buf);
            }
            let id = ps.next_id;
            ps.next_id += 1;
            ps.sealed.push_back(Sealed {
                id,
                in_flight: false,
                sent: false,
                encoded: Encoded::new(shared, data.len()),
                data,
                runs: open.runs,
                kept: open.kept,
                acks: open.acks,
                stamp: None,
                count: open.count,
                bytes: open.bytes,
                attempts: 0,
                expires: after(open.first_accepted, delivery_timeout),
                accepted: open.first_accepted,
                last_error: None,
            });
            None
        }
        Err(e) => {
            let e = e.with_topic(topic).with_partition(partition);
            warn!(topic, partition, error = %e, "building a record batch failed");
            shared
                .stats
                .errors
                .fetch_add(open.count as u64, Ordering::Relaxed);
            #[cfg(feature = "metrics")]
            shared
                .topic_counters(topic)
                .errors
                .fetch_add(open.count as u64, Ordering::Relaxed);
            // The tokens fail before the flush groups are answered (as in `finish`).
            drop(open.acks);
            for (g, n) in &open.runs {
                g.done(*n, Some(&e));
            }
            let kept_bytes: usize = open.kept.iter().map(|(_, _, size)| size).sum();
            shared.release_messages(open.count, open.bytes.saturating_sub(kept_bytes));
            Some((open.kept, e))
        }
    }
}

/// Room for the records of a new batch of a partition whose last batch was `last_len`
/// bytes: a quarter more than that, since batches sealed for size end within a record
/// of `batch_bytes` and one sized to the last would often grow (a `Vec` doubling: a copy,
/// and twice the memory, mostly fresh pages); never more than `batch_bytes` (which no
/// batch of records outgrows) and [`BATCH_SLACK`] for a codec's framing.
pub(super) fn batch_capacity(cfg: &WriterConfig, last_len: usize) -> usize {
    cfg.batch_size
        .saturating_mul(64)
        .max(last_len.saturating_add(last_len / 4))
        .min(cfg.batch_bytes)
        .saturating_add(BATCH_SLACK)
}

/// Keep `buf` for the next batches, within [`SPARE_BATCH_BUFFERS`] and
/// [`SPARE_BATCH_BYTES`]: when they are exceeded, the smallest buffers go (the bytes of a
/// compacted batch, a few KiB, must not crowd out the large buffers new batches want).
pub(super) fn recycle(spare: &mut Vec<BytesMut>, buf: BytesMut) {
    if buf.capacity() == 0 || buf.capacity() > SPARE_BATCH_BYTES {
        return;
    }
    spare.push(buf);
    crate::bufpool::keep_largest(
        spare,
        SPARE_BATCH_BUFFERS,
        SPARE_BATCH_BYTES,
        BytesMut::capacity,
    );
}

/// Split a sealed batch into two halves (re-encoded from its bytes), keeping the order,
/// the callers' groups, the reported messages and the byte accounting. Gives the batch back
/// with the reason if it cannot be split.
pub(super) fn split(
    b: Sealed,
    compression: Compression,
) -> std::result::Result<(Sealed, Sealed), Box<(Sealed, Error)>> {
    let halves = (|| {
        // One contiguous copy (a rare path): the halves' spliced values are slices of it,
        // so it lives until both are done.
        let decoded = decode_batches(b.data.to_bytes(), usize::MAX >> 1)?;
        let records: Vec<_> = decoded
            .batches
            .into_iter()
            .flat_map(|x| x.records)
            .collect();
        if records.len() != b.count || b.count < 2 {
            return Err(Error::encode("batch does not hold the expected records"));
        }
        let mid = b.count / 2;
        let build = |rs: &[crate::record::Record]| -> Result<BatchBytes> {
            let mut builder = RecordBatchBuilder::new(compression);
            for r in rs {
                builder.append_shared(
                    r.timestamp,
                    r.key.as_deref(),
                    r.value.as_ref(),
                    &r.headers,
                )?;
            }
            Ok(builder.build_compact()?.0)
        };
        Ok((build(&records[..mid])?, build(&records[mid..])?, mid))
    })();
    let (first, second, mid) = match halves {
        Ok(h) => h,
        Err(e) => return Err(Box::new((b, e))),
    };
    let shared = b.encoded.shared.clone();
    let mut runs1 = Vec::new();
    let mut runs2 = Vec::new();
    let mut seen = 0;
    for (g, n) in b.runs {
        let take = n.min(mid.saturating_sub(seen));
        if take > 0 {
            runs1.push((g.clone(), take));
        }
        if n > take {
            runs2.push((g, n - take));
        }
        seen += n;
    }
    let limit = u32::try_from(mid).unwrap_or(u32::MAX);
    let (kept1, kept2): (Kept, Kept) = b.kept.into_iter().partition(|(i, _, _)| *i < limit);
    let kept2 = kept2
        .into_iter()
        .map(|(i, m, size)| (i - limit, m, size))
        .collect();
    let (acks1, acks2): (Acks, Acks) = b.acks.into_iter().partition(|(i, _)| *i < limit);
    let acks2 = acks2.into_iter().map(|(i, a)| (i - limit, a)).collect();
    let bytes1 = split_bytes(b.bytes, b.count, mid, &kept1, &kept2);
    Ok((
        Sealed {
            id: 0,
            in_flight: false,
            sent: false,
            encoded: Encoded::new(&shared, first.len()),
            data: first,
            runs: runs1,
            kept: kept1,
            acks: acks1,
            stamp: None,
            count: mid,
            bytes: bytes1,
            attempts: 0,
            expires: b.expires,
            accepted: b.accepted,
            last_error: b.last_error.clone(),
        },
        Sealed {
            id: 0,
            in_flight: false,
            sent: false,
            encoded: Encoded::new(&shared, second.len()),
            data: second,
            runs: runs2,
            kept: kept2,
            acks: acks2,
            stamp: None,
            count: b.count - mid,
            bytes: b.bytes.saturating_sub(bytes1),
            attempts: 0,
            expires: b.expires,
            accepted: b.accepted,
            last_error: b.last_error,
        },
    ))
}

/// The accounted bytes of the first `mid` of `count` messages totalling `bytes`, when
/// `kept1`/`kept2` are the messages kept for reports in each half. Each half must hold at
/// least its kept messages' sizes (those are released one by one as reports are taken),
/// so only the bytes of messages not kept are shared out, by message count; the halves
/// then add up to exactly `bytes`.
fn split_bytes(bytes: usize, count: usize, mid: usize, kept1: &Kept, kept2: &Kept) -> usize {
    let sum = |k: &Kept| k.iter().map(|(_, _, size)| *size).sum::<usize>();
    let (k1, k2) = (sum(kept1), sum(kept2));
    let rest = bytes.saturating_sub(k1.saturating_add(k2));
    let n1 = mid.saturating_sub(kept1.len());
    let n2 = count.saturating_sub(mid).saturating_sub(kept2.len());
    let rest1 = match n1.checked_add(n2) {
        Some(n) if n > 0 => {
            let share = u128::from(rest as u64) * n1 as u128 / n as u128;
            usize::try_from(share).unwrap_or(rest)
        }
        _ => 0,
    };
    k1.saturating_add(rest1).min(bytes)
}
