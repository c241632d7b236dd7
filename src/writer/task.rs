//! The writer's background task: one loop that owns every accepted message and batch
//! between the handle ([`Writer`](super::Writer)) and the brokers.
//!
//! The loop wakes on the handle's commands, on the answers of the work it spawned
//! (produce requests, metadata and producer id lookups, AddPartitionsToTxn) and on its
//! own deadlines (linger, retry backoff, delivery timeouts), and after each wake runs one
//! turn in a fixed order: release held messages, seal what is due, expire what timed
//! out, ask for metadata, send. This file owns that loop, the commands and events, the
//! deadlines and closing; everything else is one concern per file, each an `impl Task`
//! block over the state this file declares (as the Java producer splits its work into
//! `RecordAccumulator`, `Sender` and `TransactionManager`, and franz-go into its sink and
//! metadata files):
//!
//! | file | owns |
//! | --- | --- |
//! | `task.rs` | the loop and the order of a turn; commands, events, deadlines (`next_deadline`, `expire`), closing |
//! | `accumulator.rs` | placing messages into partitions; open, held and sealed batches; the encoding budget and spare buffers |
//! | `metadata.rs` | each topic's metadata and partitions, the messages waiting for them, the lookups and their retries |
//! | `sender.rs` | which batch may go, per-broker produce requests and in-flight limits, answers, retries, delivery reports |
//! | `producer.rs` | idempotence: producer id and epoch, sequence numbers, KIP-360 epoch bumps, the first batch alone |
//! | `txn.rs` | transactions: the task's side (partitions added to the transaction, drains) beside the state machine |
//!
//! The other files call each other's methods but do not decide the order of a turn, and
//! none changes state another file owns except through that file's methods (the
//! per-partition [`PartState`](super::accumulator::PartState) is shared: each of its
//! fields says which part keeps it). Nothing here blocks: network work runs in spawned
//! tasks that answer with an [`Event`].

use crate::util::now_ms;
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use tokio::sync::{mpsc, oneshot};
use tracing::{debug, warn};

use super::accumulator::{
    releasable, take_idle, Kept, Msg, Sealed, ENCODE_AHEAD_BATCHES, ENCODE_AHEAD_MIN,
};
use super::metadata::{msg_expiry, MsgChunks, MsgQueue, TopicState};
use super::sender::Outcome;
use super::timer::Timer;
use super::txn::TaskTxn;
use super::{Delivery, Group, Message, Shared, WriterConfig};
use crate::cluster::{Cluster, TopicMetadata};
use crate::conn::RequiredAcks;
use crate::error::{Error, Result};
use crate::protocol::ErrorCode;

/// What the writer handle tells its task.
// `One` is the per-message hot path: boxing it would cost an allocation per message, and
// the queue's slots hold one `Cmd` either way.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Cmd {
    /// A message of the group of the last `Group` before it (its ack token still in it).
    One(Message),
    /// The `One`s after this belong to this flush group.
    Group(Arc<Group>),
    Batch(Vec<Msg>),
    /// Seal every open batch now.
    Flush,
    /// Deliver what is pending, then stop; answer when stopped.
    Close(oneshot::Sender<()>),
    /// Report every message accepted from now on here.
    Reports(ReportSender),
    /// Transactional writers: use this producer id and epoch (sequences restart at 0).
    Producer((i64, i16)),
    /// Transactional writers: a transaction begins (no partition is in it yet).
    TxnBegin,
    /// Transactional writers: deliver every accepted message — or, with `abort`, drop
    /// those not in a request — and answer when none is left.
    Drain {
        abort: bool,
        reply: oneshot::Sender<()>,
    },
}

/// Where delivery reports go, each with the bytes it keeps accounted until consumed.
pub(crate) type ReportSender = mpsc::UnboundedSender<(Delivery, usize)>;

pub(super) enum Event {
    Produced {
        broker: i32,
        /// Topic, partition and batch id of each batch carried.
        parts: Vec<(Arc<str>, i32, u64)>,
        result: Result<Vec<Outcome>>,
    },
    Meta {
        topic: Arc<str>,
        result: Result<Arc<TopicMetadata>>,
    },
    /// The answer to InitProducerId: producer id and epoch.
    Producer(Result<(i64, i16)>),
    /// The answer to AddPartitionsToTxn for `parts`.
    Added {
        parts: Vec<(Arc<str>, i32)>,
        result: Result<()>,
    },
}

/// The task's state. Each part keeps its own fields (the comments name the file); the
/// per-topic and per-partition state in `topics` is shared the same way, field by field.
pub(crate) struct Task {
    // The loop's (this file).
    pub(super) cfg: Arc<WriterConfig>,
    pub(super) cluster: Cluster,
    pub(super) shared: Arc<Shared>,
    /// The flush group of the messages taken next (from the last `Cmd::Group`).
    pub(super) group: Option<Arc<Group>>,
    pub(super) events_tx: mpsc::UnboundedSender<Event>,
    pub(super) events_rx: mpsc::UnboundedReceiver<Event>,
    /// Every topic written to: its metadata (`metadata.rs`) and its partitions' batches.
    pub(super) topics: HashMap<Arc<str>, TopicState>,
    // The sender's (`sender.rs`).
    /// Produce requests in flight per broker.
    pub(super) in_flight: HashMap<i32, usize>,
    /// Brokers a produce request is connecting to: nothing else is sent to them until it
    /// is answered (requests queued on one open connection keep their order).
    pub(super) connecting: std::collections::HashSet<i32>,
    /// Produce requests in flight in all.
    pub(super) requests: usize,
    /// Per broker, the signal that its latest produce request's answer was handed to the
    /// task: each request's answer waits for the one before it, so answers (and with them
    /// delivery reports and acks) come back in the order the requests went out, as the
    /// broker answers them — the spawned request tasks would otherwise race.
    pub(super) answered_in_order: HashMap<i32, oneshot::Receiver<()>>,
    // Closing (this file).
    pub(super) closing: bool,
    pub(super) close_waiters: Vec<oneshot::Sender<()>>,
    // Delivery reports (`sender.rs`; the accumulator adds those of batches it could not build).
    pub(super) reports: Option<ReportSender>,
    /// Reports of messages whose batch could not be built, to send from the loop.
    pub(super) unreported: Vec<(Kept, Error)>,
    // The producer state's (`producer.rs`).
    /// Idempotence: the producer id and epoch, once known.
    pub(super) producer: Option<(i64, i16)>,
    pub(super) producer_pending: bool,
    pub(super) producer_attempts: u32,
    pub(super) producer_retry_at: Option<Instant>,
    /// The last failed InitProducerId's error, reported if batches expire waiting for it.
    pub(super) producer_error: Option<Error>,
    /// An epoch bump found the epoch exhausted: the partitions wanting the bump are
    /// renumbered under the next producer id.
    pub(super) renew_for_bump: bool,
    /// Transactional writers only (`txn.rs`).
    pub(super) txn: Option<TaskTxn>,
    // The accumulator's (`accumulator.rs`).
    /// Buffers of acknowledged batches, for new batches (at most `SPARE_BATCH_BUFFERS` of
    /// `SPARE_BATCH_BYTES` together).
    pub(super) spare_buffers: Vec<BytesMut>,
    /// While the bytes of the batches sealed and not done (in requests or not) reach
    /// this, a large message (`HOLD_MIN`) of a partition that has such a batch waits in
    /// the partition's `held` queue instead of being encoded: batches are encoded shortly
    /// before they can be sent, not up to `max_buffered_bytes` ahead of the socket (cold
    /// in the cache by then, and a copy of every value in memory).
    /// [`ENCODE_AHEAD_BATCHES`] full batches, at least [`ENCODE_AHEAD_MIN`]. A partition
    /// without such a batch always takes its messages, so each busy partition keeps at
    /// least one batch on its way.
    pub(super) encode_ahead: usize,
}

enum Wake {
    Event(Event),
    Cmds(usize),
    Timer,
}

impl Task {
    pub(crate) fn new(cfg: Arc<WriterConfig>, cluster: Cluster, shared: Arc<Shared>) -> Task {
        let (events_tx, events_rx) = mpsc::unbounded_channel();
        Task {
            cluster,
            shared,
            group: None,
            events_tx,
            events_rx,
            topics: HashMap::new(),
            in_flight: HashMap::new(),
            connecting: std::collections::HashSet::new(),
            requests: 0,
            answered_in_order: HashMap::new(),
            closing: false,
            close_waiters: Vec::new(),
            reports: None,
            unreported: Vec::new(),
            producer: None,
            producer_pending: false,
            producer_attempts: 0,
            producer_retry_at: None,
            producer_error: None,
            renew_for_bump: false,
            txn: None,
            spare_buffers: Vec::new(),
            encode_ahead: cfg
                .batch_bytes
                .saturating_mul(ENCODE_AHEAD_BATCHES)
                .max(ENCODE_AHEAD_MIN),
            cfg,
        }
    }

    pub(crate) async fn run(mut self) {
        let mut segments = Vec::new();
        let shared = self.shared.clone();
        // Precise to well under a millisecond (Tokio's timer is not: see timer.rs), and
        // kept across turns: a turn that leaves the deadline where it was costs nothing.
        let mut timer = Timer::new();
        loop {
            timer.set(self.next_deadline(Instant::now()));
            let wake = tokio::select! {
                biased;
                Some(ev) = self.events_rx.recv() => Wake::Event(ev),
                n = std::future::poll_fn(|cx| shared.poll_take(cx, &mut segments)), if !self.closing => {
                    Wake::Cmds(n)
                }
                () = std::future::poll_fn(|cx| timer.poll_fire(cx)) => Wake::Timer,
            };
            match wake {
                Wake::Event(ev) => self.on_event(ev),
                Wake::Cmds(0) => self.start_closing(),
                Wake::Cmds(_) => {
                    let ts = now_ms();
                    for segment in &mut segments {
                        self.on_cmds(segment, ts);
                    }
                    self.shared.give_back(&mut segments);
                }
                Wake::Timer => {}
            }
            let now = Instant::now();
            self.release_held();
            self.seal_expired(now);
            self.expire(now);
            self.request_metadata(now);
            self.dispatch(now);
            // Batches held by `seal_expired` for a slot that this dispatch left free.
            if self.seal_expired(now) {
                self.dispatch(now);
            }
            for (kept, e) in std::mem::take(&mut self.unreported) {
                for (_, message, size) in kept {
                    let result = Err(e.clone());
                    self.report(Delivery { message, result }, size);
                }
            }
            self.publish_waiting();
            self.check_drains();
            if self.closing && self.idle() {
                break;
            }
        }
        if self.cfg.required_acks == RequiredAcks::None {
            self.barrier().await;
        }
        self.cluster.close().await;
        for w in self.close_waiters.drain(..) {
            let _ = w.send(());
        }
        debug!("writer task stopped");
    }

    pub(super) fn on_cmd(&mut self, cmd: Cmd, ts: i64) {
        match cmd {
            Cmd::One(msg) => {
                let m = Msg::taken(msg, &mut self.group, Instant::now());
                self.accept(m, ts);
            }
            Cmd::Group(g) => self.group = Some(g),
            Cmd::Batch(ms) => {
                for m in ms {
                    self.accept(m, ts);
                }
            }
            Cmd::Flush => self.seal_all(),
            Cmd::Close(tx) => {
                self.close_waiters.push(tx);
                self.start_closing();
            }
            Cmd::Reports(tx) => self.reports = Some(tx),
            Cmd::Producer(producer) => self.on_producer(Ok(producer)),
            Cmd::TxnBegin => {
                if let Some(txn) = self.txn.as_mut() {
                    txn.added.clear();
                }
            }
            Cmd::Drain { abort, reply } => {
                if let Some(txn) = self.txn.as_mut() {
                    txn.drains.push(reply);
                }
                if abort {
                    let id = self.txn.as_ref().map(|t| t.shared.id.clone());
                    let e = Error::closed(format!(
                        "the transaction of transactional id '{}' was aborted before the \
                         message was sent",
                        id.as_deref().unwrap_or("")
                    ));
                    self.fail_pending(&e);
                }
                self.seal_all();
            }
        }
    }

    fn on_event(&mut self, ev: Event) {
        match ev {
            Event::Producer(result) => self.on_producer(result),
            Event::Added { parts, result } => self.on_added(parts, result),
            Event::Meta { topic, result } => self.on_metadata(topic, result),
            Event::Produced {
                broker,
                parts,
                result,
            } => self.on_produced(broker, parts, result),
        }
    }

    /// Tell the senders how many messages wait for metadata (they wait while too many
    /// do).
    fn publish_waiting(&mut self) {
        let n = self
            .topics
            .values()
            .map(|t| t.waiting.len() + t.recheck.len())
            .sum();
        self.shared.set_waiting(n);
    }

    /// Nothing left to deliver and no background work (produce request, metadata or
    /// producer id lookup) that could still dial a broker after close returns.
    pub(super) fn idle(&self) -> bool {
        self.requests == 0
            && !self.producer_pending
            && !self.txn.as_ref().is_some_and(|t| t.adding)
            && self.topics.values().all(|t| {
                !t.meta_pending
                    && t.waiting.is_empty()
                    && t.recheck.is_empty()
                    && t.parts
                        .values()
                        .all(|p| p.open.is_none() && p.sealed.is_empty() && p.held.is_empty())
            })
    }

    fn start_closing(&mut self) {
        self.closing = true;
        self.seal_all();
    }

    /// When the loop must wake up on its own: the earliest linger deadline or retry time
    /// still ahead. Retry times already due were acted on by the last `dispatch`; if
    /// they could not be (no leader yet, broker at its in-flight limit), an event — a
    /// metadata answer or a produce response — wakes the loop, so they must not make the
    /// timer fire again at once.
    fn next_deadline(&self, now: Instant) -> Option<Instant> {
        let mut next: Option<Instant> = None;
        let mut consider = |t: Instant| {
            next = Some(next.map_or(t, |n| n.min(t)));
        };
        if let Some(at) = self.producer_retry_at.filter(|at| *at > now) {
            consider(at);
        }
        let over_budget = self.shared.encoded.load(Ordering::Relaxed) >= self.encode_ahead;
        for t in self.topics.values() {
            if let Some(at) = t.meta_retry_at.filter(|at| *at > now) {
                consider(at);
            }
            for accepted in t.waiting.earliest.into_iter().chain(t.recheck.earliest) {
                consider(msg_expiry(&self.cfg, t, accepted));
            }
            for p in t.parts.values() {
                if let Some(o) = &p.open {
                    // A batch past its linger waits for a free slot, which a produce
                    // answer (an event) brings; its delivery timeout still wakes the loop.
                    // A linger that ended after the last `seal_expired` still fires
                    // (at once) and seals the batch there.
                    if o.held {
                        consider(after(o.first_accepted, self.cfg.delivery_timeout));
                    } else {
                        consider(o.deadline);
                    }
                }
                if let Some(at) = p.retry_at.filter(|at| *at > now) {
                    consider(at);
                }
                if let Some(b) = p.sealed.front().filter(|b| !b.in_flight) {
                    consider(b.expires);
                }
                // Held messages wait for a batch of their partition (whose answer or
                // expiry is an event or a deadline above), or go now.
                if releasable(p, over_budget) {
                    consider(now);
                }
            }
        }
        next
    }

    /// Fail what reached its delivery timeout: messages still waiting for metadata, and
    /// queued batches not in a request (a request in flight is awaited: its batch may have
    /// been written).
    fn expire(&mut self, now: Instant) {
        let cfg = self.cfg.clone();
        let mut rejected: Vec<(Msg, Error)> = Vec::new();
        let mut batches: Vec<(Arc<str>, i32, Sealed, Error)> = Vec::new();
        for (name, t) in &mut self.topics {
            for recheck in [false, true] {
                let list = if recheck { &t.recheck } else { &t.waiting };
                // Only when the earliest message is due: no scan on every wake.
                if list.earliest.is_none_or(|a| msg_expiry(&cfg, t, a) > now) {
                    continue;
                }
                let list = if recheck {
                    t.recheck.take()
                } else {
                    t.waiting.take()
                };
                // The messages kept go straight into a new queue (in chunks, as they came).
                let mut due = Vec::new();
                let mut keep = MsgQueue::default();
                for m in list.into_iter().flatten() {
                    if msg_expiry(&cfg, t, m.accepted) <= now {
                        due.push(m);
                    } else {
                        keep.push(m);
                    }
                }
                let queue = if recheck {
                    &mut t.recheck
                } else {
                    &mut t.waiting
                };
                *queue = keep;
                for m in due {
                    let e = if after(m.accepted, cfg.delivery_timeout) > now {
                        // Expired early: the topic is unknown past `unknown_topic_timeout`.
                        let waited = cfg.unknown_topic_timeout.unwrap_or_default();
                        t.last_error
                            .clone()
                            .unwrap_or_else(|| Error::kafka(ErrorCode::UnknownTopicOrPartition))
                            .with_message(format!(
                                "topic not in metadata within unknown_topic_timeout of {} ms",
                                waited.as_millis()
                            ))
                    } else {
                        let what = if recheck {
                            "looking for the partition in metadata"
                        } else {
                            "waiting for the topic's metadata"
                        };
                        expired_error(t.last_error.as_ref(), cfg.delivery_timeout, what)
                    };
                    let e = match m.msg.partition {
                        Some(p) if recheck => e.with_topic(&**name).with_partition(p),
                        _ => e.with_topic(&**name),
                    };
                    rejected.push((m, e));
                }
            }
            for (p, ps) in &mut t.parts {
                while ps
                    .sealed
                    .front()
                    .is_some_and(|b| !b.in_flight && b.expires <= now)
                {
                    let Some(b) = ps.sealed.pop_front() else {
                        break;
                    };
                    ps.retry_at = None;
                    let last = b
                        .last_error
                        .as_ref()
                        .or(t.last_error.as_ref())
                        .or(self.producer_error.as_ref());
                    let what = format!("after {} attempts", b.attempts);
                    let e = expired_error(last, cfg.delivery_timeout, &what)
                        .with_topic(&**name)
                        .with_partition(*p);
                    batches.push((name.clone(), *p, b, e));
                }
            }
        }
        for (m, e) in rejected {
            warn!(error = %e, "message expired before it had a partition");
            self.reject(m, e);
        }
        for (name, p, b, e) in batches {
            warn!(topic = %name, partition = p, messages = b.count, error = %e, "batch expired");
            self.give_up(&name, p, b, &e, false);
        }
    }

    /// Fail every message and batch not in a request with `err` (an abort, or a fatal
    /// error: nothing more may be written).
    pub(super) fn fail_pending(&mut self, err: &Error) {
        self.seal_all();
        let mut msgs = MsgChunks::new();
        let mut held = Vec::new();
        let mut batches = Vec::new();
        for (name, t) in &mut self.topics {
            msgs.append(&mut t.waiting.take());
            msgs.append(&mut t.recheck.take());
            t.seal_when_assigned = false;
            for (p, ps) in &mut t.parts {
                for b in take_idle(ps).into_iter().rev() {
                    batches.push((name.clone(), *p, b));
                }
                ps.retry_at = None;
                ps.seal_held = false;
                held.extend(ps.held.drain(..));
            }
        }
        for m in msgs.into_iter().flatten() {
            self.reject(m, err.clone());
        }
        // Oldest first, so reports keep each partition's order.
        batches.reverse();
        for (name, p, b) in batches {
            self.give_up(&name, p, b, err, false);
        }
        // Behind every batch of their partitions.
        for m in held {
            self.reject(m, err.clone());
        }
    }
}

impl Drop for Task {
    /// However the task ends — closed, or unwinding from a panic (say in a user's
    /// `Balancer`) — callers waiting for buffer space must wake up and see it is gone.
    fn drop(&mut self) {
        self.shared.queue_ended();
        self.shared.task_gone();
    }
}

/// The error of something whose delivery timeout `timeout` expired `what` ("after 12
/// attempts"): the last error it met, restated (kind and context kept), or a `Timeout`.
pub(super) fn expired_error(last: Option<&Error>, timeout: Duration, what: &str) -> Error {
    let head = format!(
        "delivery timeout of {} ms expired {what}",
        timeout.as_millis()
    );
    match last {
        None => Error::timeout(head),
        Some(e) => {
            let message = match (e.kafka_code(), e.message()) {
                (_, Some(m)) => format!("{head}; last error: {m}"),
                (Some(_), None) => head,
                (None, None) => format!("{head}; last error: {:?}", e.kind()),
            };
            e.clone().with_message(message)
        }
    }
}

/// `now + d`, saturating at a year from now (user durations may be huge).
pub(crate) fn after(now: Instant, d: Duration) -> Instant {
    now.checked_add(d)
        .or_else(|| now.checked_add(Duration::from_secs(365 * 86_400)))
        .unwrap_or(now)
}

#[cfg(test)]
#[path = "task_tests.rs"]
mod tests;
