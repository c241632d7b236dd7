//! The state a [`Writer`]'s clones, its handles and its background task share: the
//! command queue to the task (segments reused, one wake-up per empty-to-busy change), the
//! byte bound behind `poll_ready`'s backpressure (and the queue and waiting-message
//! bounds), and the counters behind [`WriterStats`].

use super::*;

#[derive(Default)]
pub(super) struct Counters {
    pub(super) writes: AtomicU64,
    pub(super) batches: AtomicU64,
    pub(super) messages: AtomicU64,
    pub(super) bytes: AtomicU64,
    pub(super) errors: AtomicU64,
    pub(super) retries: AtomicU64,
    pub(super) queued: AtomicU64,
    pub(super) batch_messages_max: AtomicU64,
    pub(super) batch_bytes_max: AtomicU64,
    pub(super) batch_bytes_total: AtomicU64,
    /// Answered produce requests and their total and largest latency, in microseconds.
    pub(super) answered: AtomicU64,
    pub(super) write_micros: AtomicU64,
    pub(super) write_micros_max: AtomicU64,
    /// `throttle_time_ms` of produce responses.
    pub(super) throttle: crate::util::ThrottleTimes,
    /// Batches sent for the first time, and their total and largest queue time (from
    /// the oldest message's acceptance to the send), in microseconds.
    pub(super) sent_batches: AtomicU64,
    pub(super) queue_micros: AtomicU64,
    pub(super) queue_micros_max: AtomicU64,
}

impl Counters {
    /// A batch whose oldest message was accepted at `accepted` is sent for the first
    /// time at `now`.
    pub(super) fn batch_sent(&self, accepted: std::time::Instant, now: std::time::Instant) {
        let us =
            u64::try_from(now.saturating_duration_since(accepted).as_micros()).unwrap_or(u64::MAX);
        self.sent_batches.fetch_add(1, Ordering::Relaxed);
        self.queue_micros.fetch_add(us, Ordering::Relaxed);
        self.queue_micros_max.fetch_max(us, Ordering::Relaxed);
    }
}

/// One topic's share of the counters (feature `metrics`): the Java producer's
/// `producer-topic-metrics`, kept only when the metrics are published.
#[cfg(feature = "metrics")]
#[derive(Default)]
pub(super) struct TopicCounters {
    /// Messages acknowledged, and their bytes ([`Message::size`]).
    pub(super) records: AtomicU64,
    pub(super) bytes: AtomicU64,
    /// Messages failed for good.
    pub(super) errors: AtomicU64,
    /// Encoded bytes of the acknowledged batches (for the compression rate).
    pub(super) batch_bytes: AtomicU64,
}

#[cfg(feature = "metrics")]
impl TopicCounters {
    /// `count` messages of `bytes` ([`Message::size`]) in a batch of `batch_bytes`
    /// encoded bytes are done: acknowledged if `ok`, failed for good if not.
    pub(super) fn finished(&self, count: usize, bytes: usize, batch_bytes: usize, ok: bool) {
        if ok {
            self.records.fetch_add(count as u64, Ordering::Relaxed);
            self.bytes.fetch_add(bytes as u64, Ordering::Relaxed);
            self.batch_bytes
                .fetch_add(batch_bytes as u64, Ordering::Relaxed);
        } else {
            self.errors.fetch_add(count as u64, Ordering::Relaxed);
        }
    }
}

/// State shared by the writer's clones, handles and task.
pub(super) struct Shared {
    pub(super) buffered: AtomicUsize,
    pub(super) max_buffered: usize,
    pub(super) space: Notify,
    /// The background task has ended (closed, or died): nothing will free space any more.
    pub(super) gone: AtomicBool,
    pub(super) stats: Counters,
    /// The way to the task. Senders push under its lock and the close marks it closed
    /// under the same lock, so every message accepted before the close is queued ahead
    /// of `Close`, and none after it.
    pub(super) queue: Mutex<Queue>,
    /// `queue.closed`, readable without the lock (`poll_ready` asks for every message).
    pub(super) closed: AtomicBool,
    /// `queue.len`, readable without the lock.
    pub(super) backlog: AtomicUsize,
    /// Messages the task holds waiting for metadata (published once a turn of its loop).
    pub(super) waiting: AtomicUsize,
    /// Writer clones not closed or dropped yet.
    pub(super) writers: AtomicUsize,
    /// Bytes of the task's batches sealed and not done yet (kept by `accumulator::Encoded`).
    pub(super) encoded: AtomicUsize,
    /// Each topic's counters, for the metrics collector (the task keeps a topic's
    /// `Arc` in its `TopicState`, so the lock is taken once per topic, and by the
    /// collector).
    #[cfg(feature = "metrics")]
    pub(super) topics: Mutex<std::collections::HashMap<Arc<str>, Arc<TopicCounters>>>,
}

/// Commands per segment of the [`Queue`]: small enough to come from the allocator's heap
/// (a few tens of KiB), large enough that a segment change is rare.
pub(super) const SEGMENT: usize = 256;
/// Emptied segments kept for reuse. Each holds 256 commands of 168 bytes (43 KiB): 16
/// of them, and a backlog of as many, are 1.4 MB; 64 were 5.5 MB, a fifth of a 100-byte
/// producer's peak memory, for no measurable CPU.
pub(super) const SPARE_SEGMENTS: usize = 16;
/// Commands queued and not taken by the task yet beyond which senders wait (as for
/// buffer space) until the task takes them: a sender faster than the task does not pile
/// up megabytes of queue (fresh memory, a page fault each 4 KiB) ahead of it, and the
/// queue fits the spare segments.
pub(super) const BACKLOG_MAX: usize = SEGMENT * SPARE_SEGMENTS;
/// Messages the task holds waiting for metadata (a topic's first lookup, or a partition
/// it does not know yet) beyond which senders wait (as for buffer space) until some are
/// placed or fail. Nothing of theirs can be sent before the metadata comes, so holding
/// more buys nothing, and a waiting message takes its whole struct (232 bytes), twice
/// what it takes once encoded in a batch: a writer whose first lookup lagged filled its
/// 32 MiB bound with 120 000 of them, 27 MB (16 384 take 3.8 MB).
pub(super) const WAITING_MAX: usize = 16 * 1024;

/// The commands on their way to the task, in the order they were sent, in segments of
/// [`SEGMENT`]. The task takes all of them at once and gives the emptied segments back
/// for reuse, so neither side allocates (nor touches fresh memory) in the steady state;
/// a sender wakes the task only when the queue was empty: while the task is busy,
/// messages pile up without a wake-up or a cross-thread handoff each.
#[derive(Default)]
pub(super) struct Queue {
    /// The segment being filled.
    pub(super) cmds: Vec<Cmd>,
    /// Full segments, oldest first, all before `cmds`.
    pub(super) full: Vec<Vec<Cmd>>,
    /// Empty segments to fill next.
    pub(super) spare: Vec<Vec<Cmd>>,
    /// Commands in `full` and `cmds`.
    pub(super) len: usize,
    /// Closed by a [`WriterHandle`] or the last open clone, or every clone dropped: no
    /// command is taken any more; the task still takes those queued.
    pub(super) closed: bool,
    /// The task has ended (closed, or it panicked): nothing is taken.
    pub(super) ended: bool,
    /// The group of the last [`Cmd::One`] queued: a [`Cmd::Group`] announces a change,
    /// so a message does not carry its group (nor bump its reference count).
    pub(super) group: Option<Arc<Group>>,
    /// The task, waiting for the queue to fill.
    pub(super) waker: Option<Waker>,
}

impl Queue {
    pub(super) fn is_empty(&self) -> bool {
        self.cmds.is_empty() && self.full.is_empty()
    }

    // Inlined: the 176-byte command is then written into the segment where the caller
    // built it, not moved once more through this call.
    #[inline(always)]
    pub(super) fn push(&mut self, cmd: Cmd) {
        if self.cmds.len() >= SEGMENT {
            let next = self
                .spare
                .pop()
                .unwrap_or_else(|| Vec::with_capacity(SEGMENT));
            let full = std::mem::replace(&mut self.cmds, next);
            self.full.push(full);
        }
        self.cmds.push(cmd);
        self.len += 1;
    }
}

impl Shared {
    pub(super) fn new(max_buffered: usize) -> Shared {
        Shared {
            buffered: AtomicUsize::new(0),
            max_buffered,
            space: Notify::new(),
            gone: AtomicBool::new(false),
            stats: Counters::default(),
            queue: Mutex::new(Queue::default()),
            closed: AtomicBool::new(false),
            backlog: AtomicUsize::new(0),
            waiting: AtomicUsize::new(0),
            writers: AtomicUsize::new(0),
            encoded: AtomicUsize::new(0),
            #[cfg(feature = "metrics")]
            topics: Mutex::default(),
        }
    }

    /// The counters of `topic`, made on first use (feature `metrics`).
    #[cfg(feature = "metrics")]
    pub(super) fn topic_counters(&self, topic: &str) -> Arc<TopicCounters> {
        let mut topics = self
            .topics
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(c) = topics.get(topic) {
            return c.clone();
        }
        let c = Arc::new(TopicCounters::default());
        topics.insert(Arc::from(topic), c.clone());
        c
    }

    /// Every topic's counters so far (feature `metrics`).
    #[cfg(feature = "metrics")]
    pub(super) fn topics(&self) -> Vec<(Arc<str>, Arc<TopicCounters>)> {
        self.topics
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    pub(super) fn queue(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The locked queue if it still takes commands, and whether it is empty.
    pub(super) fn open_queue(&self) -> Option<(std::sync::MutexGuard<'_, Queue>, bool)> {
        let q = self.queue();
        if q.closed || q.ended {
            return None;
        }
        let was_empty = q.is_empty();
        Some((q, was_empty))
    }

    /// After pushing onto `q`: publish the backlog, unlock, and wake the task if the queue
    /// was empty (otherwise it is awake or already woken).
    pub(super) fn pushed(&self, mut q: std::sync::MutexGuard<'_, Queue>, was_empty: bool) {
        self.backlog.store(q.len, Ordering::Release);
        let waker = if was_empty { q.waker.take() } else { None };
        drop(q);
        if let Some(w) = waker {
            w.wake();
        }
    }

    /// Hand `cmd` to the task; gives it back if the writer is closed.
    pub(super) fn send(&self, cmd: Cmd) -> std::result::Result<(), Box<Cmd>> {
        let Some((mut q, was_empty)) = self.open_queue() else {
            return Err(Box::new(cmd));
        };
        q.push(cmd);
        self.pushed(q, was_empty);
        Ok(())
    }

    /// Hand one message of the flush group `group` to the task; gives it back if the
    /// writer is closed.
    // The message comes back only when refused; boxing it would cost every send.
    #[allow(clippy::result_large_err)]
    pub(super) fn send_msg(
        &self,
        group: &Arc<Group>,
        msg: Message,
    ) -> std::result::Result<(), Message> {
        let Some((mut q, was_empty)) = self.open_queue() else {
            return Err(msg);
        };
        if !q.group.as_ref().is_some_and(|g| Arc::ptr_eq(g, group)) {
            q.group = Some(group.clone());
            q.push(Cmd::Group(group.clone()));
        }
        q.push(Cmd::One(msg));
        self.pushed(q, was_empty);
        Ok(())
    }

    /// The task takes every queued command, as segments appended to `segments`: how
    /// many segments, 0 once the writer is closed and nothing is left; pending while
    /// nothing is queued.
    pub(super) fn poll_take(
        &self,
        cx: &mut Context<'_>,
        segments: &mut Vec<Vec<Cmd>>,
    ) -> Poll<usize> {
        let mut q = self.queue();
        if !q.is_empty() {
            let before = segments.len();
            let q = &mut *q;
            segments.append(&mut q.full);
            if !q.cmds.is_empty() {
                let next = q.spare.pop().unwrap_or_else(|| Vec::with_capacity(SEGMENT));
                segments.push(std::mem::replace(&mut q.cmds, next));
            }
            let was_full = q.len >= BACKLOG_MAX;
            q.len = 0;
            self.backlog.store(0, Ordering::Release);
            if was_full {
                self.space.notify_waiters();
            }
            return Poll::Ready(segments.len() - before);
        }
        if q.closed {
            return Poll::Ready(0);
        }
        if !q.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
            q.waker = Some(cx.waker().clone());
        }
        Poll::Pending
    }

    /// The task gives back segments it emptied, for reuse.
    pub(super) fn give_back(&self, segments: &mut Vec<Vec<Cmd>>) {
        let mut q = self.queue();
        for mut segment in segments.drain(..) {
            if q.spare.len() >= SPARE_SEGMENTS || segment.capacity() != SEGMENT {
                break;
            }
            segment.clear();
            q.spare.push(segment);
        }
        drop(q);
        segments.clear();
    }

    /// Stop accepting commands, after `last` if given; whether this closed the queue
    /// (false if it was closed already).
    pub(super) fn close_queue(&self, last: Option<Cmd>) -> bool {
        let mut q = self.queue();
        if q.closed {
            return false;
        }
        q.closed = true;
        self.closed.store(true, Ordering::Release);
        if let Some(cmd) = last {
            if !q.ended {
                q.push(cmd);
            }
        }
        let waker = q.waker.take();
        drop(q);
        if let Some(w) = waker {
            w.wake();
        }
        true
    }

    /// The task ended: refuse commands from now on and drop those it never took (a
    /// message's ack token fails, its flush group learns it is lost when dropped).
    pub(super) fn queue_ended(&self) {
        let mut q = self.queue();
        q.ended = true;
        let mut cmds = std::mem::take(&mut q.full);
        cmds.push(std::mem::take(&mut q.cmds));
        q.spare.clear();
        let group = q.group.take();
        drop(q);
        for cmd in cmds.into_iter().flatten() {
            if let Cmd::One(mut m) = cmd {
                std::mem::take(&mut m.ack).fail();
            }
        }
        drop(group);
    }

    /// Whether messages are still accepted: not closed, and the task alive.
    pub(super) fn accepting(&self) -> bool {
        !self.is_gone() && !self.closed.load(Ordering::Acquire)
    }

    /// The task ended without being closed (it panicked).
    pub(super) fn died(&self) -> bool {
        self.is_gone() && !self.closed.load(Ordering::Acquire)
    }

    /// A clone is closed or dropped; whether it was the last open one.
    pub(super) fn detach(&self) -> bool {
        self.writers
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                Some(n.saturating_sub(1))
            })
            .unwrap_or(0)
            == 1
    }

    /// Stop accepting, let the task deliver what was accepted and stop; wait for that.
    /// Closing again, or concurrently, waits for the same end.
    pub(super) async fn close_all(self: Arc<Self>) {
        let (done, _) = oneshot::channel();
        self.close_queue(Some(Cmd::Close(done)));
        loop {
            let notified = self.space.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.is_gone() {
                return;
            }
            notified.await;
        }
    }

    pub(super) fn stats(&self) -> WriterStats {
        let c = &self.stats;
        WriterStats {
            writes: c.writes.load(Ordering::Relaxed),
            batches: c.batches.load(Ordering::Relaxed),
            messages: c.messages.load(Ordering::Relaxed),
            bytes: c.bytes.load(Ordering::Relaxed),
            errors: c.errors.load(Ordering::Relaxed),
            retries: c.retries.load(Ordering::Relaxed),
            buffered_bytes: self.buffered.load(Ordering::Relaxed) as u64,
            queued_messages: c.queued.load(Ordering::Relaxed),
            batch_messages_max: c.batch_messages_max.load(Ordering::Relaxed),
            batch_bytes_max: c.batch_bytes_max.load(Ordering::Relaxed),
            batch_bytes_total: c.batch_bytes_total.load(Ordering::Relaxed),
            write_time_avg: std::time::Duration::from_micros(
                c.write_micros.load(Ordering::Relaxed) / c.answered.load(Ordering::Relaxed).max(1),
            ),
            write_time_max: std::time::Duration::from_micros(
                c.write_micros_max.load(Ordering::Relaxed),
            ),
            throttle_time_avg: c.throttle.avg(),
            throttle_time_max: c.throttle.max(),
            queue_time_avg: std::time::Duration::from_micros(
                c.queue_micros.load(Ordering::Relaxed)
                    / c.sent_batches.load(Ordering::Relaxed).max(1),
            ),
            queue_time_max: std::time::Duration::from_micros(
                c.queue_micros_max.load(Ordering::Relaxed),
            ),
        }
    }

    /// One message of `bytes` bytes ([`Message::size`]) is accepted: it counts
    /// [`MESSAGE_OVERHEAD`] more, for the message itself.
    pub(super) fn reserve(&self, bytes: usize) {
        self.buffered
            .fetch_add(bytes.saturating_add(MESSAGE_OVERHEAD), Ordering::AcqRel);
        self.stats.queued.fetch_add(1, Ordering::Relaxed);
    }

    /// `messages` messages of `bytes` bytes are done (delivered or failed); their
    /// overhead is released with them (the bytes of a message kept for a delivery report
    /// may be released later, with [`release`](Self::release)).
    pub(super) fn release_messages(&self, messages: usize, bytes: usize) {
        self.stats
            .queued
            .fetch_sub(messages as u64, Ordering::Relaxed);
        self.release(bytes.saturating_add(messages.saturating_mul(MESSAGE_OVERHEAD)));
    }

    pub(super) fn release(&self, bytes: usize) {
        // Saturating: releasing more than was reserved is a bug (caught in debug builds),
        // but must not wrap the gauge and block every writer call forever.
        let before = self
            .buffered
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |b| {
                Some(b.saturating_sub(bytes))
            })
            .unwrap_or_else(|b| b);
        debug_assert!(
            before >= bytes,
            "writer released {bytes} bytes with only {before} buffered"
        );
        if before > self.max_buffered && before.saturating_sub(bytes) <= self.max_buffered {
            self.space.notify_waiters();
        }
    }

    /// The task holds `n` messages waiting for metadata: senders waiting for fewer than
    /// [`WAITING_MAX`] are woken when it drops below.
    pub(super) fn set_waiting(&self, n: usize) {
        let before = self.waiting.swap(n, Ordering::AcqRel);
        if before >= WAITING_MAX && n < WAITING_MAX {
            self.space.notify_waiters();
        }
    }

    /// Within the byte budget, the task not too far behind, and not too many messages
    /// waiting for metadata.
    pub(super) fn has_space(&self) -> bool {
        self.buffered.load(Ordering::Acquire) <= self.max_buffered
            && self.backlog.load(Ordering::Acquire) < BACKLOG_MAX
            && self.waiting.load(Ordering::Acquire) < WAITING_MAX
    }

    pub(super) fn task_gone(&self) {
        self.gone.store(true, Ordering::Release);
        self.space.notify_waiters();
    }

    pub(super) fn is_gone(&self) -> bool {
        self.gone.load(Ordering::Acquire)
    }

    /// [`Writer::produce`]: accept `msg` once there is room, and wait for its outcome.
    pub(super) async fn produce(self: Arc<Self>, mut msg: Message) -> Result<(i32, i64)> {
        if !self.accepting() {
            return Err(closed_error());
        }
        self.clone().wait_for_space().await;
        if !self.accepting() {
            return Err(closed_error());
        }
        let group = Group::new(true);
        let (tx, rx) = oneshot::channel();
        group.seal(1, tx);
        let size = msg.size();
        self.reserve(size);
        let one = Msg {
            ack: HeldAck::new(std::mem::take(&mut msg.ack)),
            msg,
            size,
            group: group.clone(),
            accepted: std::time::Instant::now(),
        };
        if self.send(Cmd::Batch(vec![one])).is_err() {
            self.release_messages(1, size);
            return Err(closed_error());
        }
        rx.await.unwrap_or_else(|_| Err(closed_error()))?;
        group
            .position()
            .ok_or_else(|| Error::protocol("message acknowledged without a position"))
    }

    pub(super) async fn wait_for_space(self: Arc<Self>) {
        loop {
            let notified = self.space.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.has_space() || self.is_gone() {
                return;
            }
            notified.await;
        }
    }
}
