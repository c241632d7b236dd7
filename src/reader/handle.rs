//! [`ReaderHandle`]: the control surface of a [`Reader`](super::Reader) — seek, lag,
//! stats, assignment, pause/resume, close — usable from any task while the reader itself
//! is inside a pipeline (`reader.map_ok(..).forward(writer)` holds it). The `Reader`'s
//! own methods of the same names delegate here, so each has one implementation.
//!
//! Closing is shared too: the fetch and group tasks are spawned once and awaited through
//! shared futures, so `Reader::close` and any number of handle closes, concurrent or
//! repeated, all wait for the same ends.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use futures::future::{BoxFuture, FutureExt, Shared as SharedFuture};
use tokio::task::AbortHandle;

use super::state::{Position, Shared, State};
use super::{ReaderStats, StartOffset, TopicPartition};
use crate::conn::Conn;
use crate::error::{Error, Result};
use crate::group::GroupShared;
use crate::protocol::ErrorCode;

/// A spawned task: abortable, and awaitable by any number of closers.
pub(crate) struct TaskEnd {
    abort: AbortHandle,
    done: SharedFuture<BoxFuture<'static, ()>>,
}

impl TaskEnd {
    pub(crate) fn spawn(f: impl std::future::Future<Output = ()> + Send + 'static) -> Self {
        let task = tokio::spawn(f);
        TaskEnd {
            abort: task.abort_handle(),
            done: task.map(|_| ()).boxed().shared(),
        }
    }

    /// Resolves when the task has ended.
    #[cfg(feature = "metrics")]
    pub(crate) fn ended(&self) -> SharedFuture<BoxFuture<'static, ()>> {
        self.done.clone()
    }
}

/// The reader's background tasks.
pub(crate) struct Tasks {
    pub(crate) fetch: TaskEnd,
    pub(crate) group: Option<TaskEnd>,
    /// The close, once started: a task of its own, so dropping a `close()` future does
    /// not stop it halfway (say, before the group task was told to close). Once set,
    /// dropping the `Reader` (say, `forward` finishing after the close ended its stream)
    /// must not abort the group task's final commit.
    closing: std::sync::OnceLock<SharedFuture<BoxFuture<'static, ()>>>,
}

impl Tasks {
    pub(crate) fn new(fetch: TaskEnd, group: Option<TaskEnd>) -> Self {
        Tasks {
            fetch,
            group,
            closing: std::sync::OnceLock::new(),
        }
    }

    /// The reader was dropped: without a close under way that is a crash (no final
    /// commit, no LeaveGroup), and the tasks stop now.
    pub(crate) fn dropped(&self) {
        if self.closing.get().is_none() {
            self.fetch.abort.abort();
            if let Some(g) = &self.group {
                g.abort.abort();
            }
        }
    }
}

/// A cloneable handle to control a [`Reader`](super::Reader) from other tasks while the
/// reader is consumed elsewhere — a Ctrl-C handler, a metrics task, an admin endpoint.
/// It is `Clone + Send + Sync`; every method takes `&self`.
///
/// ```no_run
/// use futures::{StreamExt, TryStreamExt};
/// use kafkapipe::reader::{Reader, ReaderConfig};
/// use kafkapipe::writer::{self, Writer, WriterConfig};
///
/// # async fn demo() -> kafkapipe::Result<()> {
/// let reader = Reader::new(ReaderConfig::new(["127.0.0.1:9092"]).group_id("g").topic("in")).await?;
/// let writer = Writer::new(WriterConfig::new(["127.0.0.1:9092"]).topic("out"))?;
/// let handle = reader.handle();
/// tokio::spawn({
///     let handle = handle.clone();
///     async move {
///         let _ = tokio::signal::ctrl_c().await;
///         handle.close().await; // the stream ends; forward closes the writer
///     }
/// });
/// reader.map_ok(writer::Message::from).forward(writer).await?;
/// # Ok(()) }
/// ```
///
/// A handle outliving its reader controls nothing that matters: dropping the `Reader`
/// without a close stops its tasks (see [`Reader::close`](super::Reader::close)).
#[derive(Clone)]
pub struct ReaderHandle {
    pub(crate) shared: Arc<Shared>,
    pub(crate) group: Option<Arc<GroupShared>>,
    pub(crate) tasks: Arc<Tasks>,
}

impl std::fmt::Debug for ReaderHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReaderHandle")
            .field("brokers", &self.shared.config.brokers)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl ReaderHandle {
    /// Start reading `partitions`, each from its own start offset, without disturbing the
    /// partitions already assigned. A partition that is already assigned is reset to the
    /// given start, dropping its buffered messages.
    ///
    /// A group reader's assignment belongs to its group: calling this (or
    /// [`ReaderHandle::unassign`]) there reads partitions the group did not give this
    /// member.
    ///
    /// ```no_run
    /// # use kafkapipe::reader::{ReaderHandle, StartOffset, TopicPartition};
    /// # fn demo(handle: &ReaderHandle) {
    /// handle.assign([(TopicPartition::new("events", 4), StartOffset::At(1000))]);
    /// # }
    /// ```
    pub fn assign(&self, partitions: impl IntoIterator<Item = (TopicPartition, StartOffset)>) {
        {
            let mut st = self.shared.lock();
            for (tp, start) in partitions {
                st.assign(tp, start);
            }
        }
        self.shared.wake_task.notify_one();
    }

    /// Stop reading `partitions`; their buffered messages are dropped and no message of
    /// them is yielded after this returns, except the one a poll of the reader already
    /// under way on another thread may be returning. Unknown partitions are ignored.
    ///
    /// ```no_run
    /// # use kafkapipe::reader::{ReaderHandle, TopicPartition};
    /// # fn demo(handle: &ReaderHandle) {
    /// handle.unassign(&[TopicPartition::new("events", 4)]);
    /// # }
    /// ```
    pub fn unassign(&self, partitions: &[TopicPartition]) {
        let mut st = self.shared.lock();
        for tp in partitions {
            st.unassign(tp);
        }
        drop(st);
        self.shared.wake_task.notify_one();
    }

    /// The assigned partitions, sorted.
    ///
    /// ```no_run
    /// # fn demo(handle: &kafkapipe::reader::ReaderHandle) {
    /// for tp in handle.assignment() { println!("{tp}"); }
    /// # }
    /// ```
    pub fn assignment(&self) -> Vec<TopicPartition> {
        let mut v: Vec<TopicPartition> = self.shared.lock().index.keys().cloned().collect();
        v.sort();
        v
    }

    /// A group reader's current membership — group id, generation, member id, instance
    /// id — for [`TransactionalWriter::send_offsets_to_transaction`](crate::writer::TransactionalWriter::send_offsets_to_transaction)
    /// (Java `consumer.groupMetadata()`): the group refuses the transactional offset
    /// commit of a member whose generation is over (KIP-447). `None` without a group, or
    /// while the reader is not a member (before its first join, during a rejoin after
    /// the membership was lost).
    ///
    /// ```no_run
    /// # fn demo(handle: &kafkapipe::reader::ReaderHandle) {
    /// if let Some(meta) = handle.group_metadata() {
    ///     println!("{} generation {}", meta.member_id, meta.generation_id);
    /// }
    /// # }
    /// ```
    pub fn group_metadata(&self) -> Option<crate::writer::GroupMetadata> {
        self.group.as_ref().and_then(|g| g.group_metadata())
    }

    /// Rewind every partition this group member owns to its committed offset (the
    /// exactly-once pipeline's abort): buffered and in-flight messages are dropped, and
    /// a new track per partition makes every message yielded before stale (its token
    /// changes nothing). Partitions no longer assigned (being given up) are not read
    /// again, but their deliveries become stale too. Returns how many were rewound.
    pub(crate) fn rewind_to_committed(&self) -> usize {
        let Some(g) = &self.group else {
            return 0;
        };
        let mut n = 0;
        {
            let mut c = g.commits();
            let owned: Vec<(TopicPartition, std::sync::Arc<crate::group::Track>)> = c
                .parts
                .iter()
                .flat_map(|(t, ps)| {
                    ps.iter()
                        .map(|(p, tr)| (TopicPartition::new(t.clone(), *p), tr.clone()))
                })
                .collect();
            let mut st = self.shared.lock();
            for (tp, old) in owned {
                if !st.index.contains_key(&tp) {
                    // being given up (unassigned, not yet disowned): what it yielded
                    // before is stale already
                    old.restart();
                    continue;
                }
                old.restart();
                let at = old.committed_offset();
                let track = g.new_track(at);
                c.own(&tp, track.clone());
                st.assign(
                    tp.clone(),
                    if at >= 0 {
                        StartOffset::At(at)
                    } else {
                        self.shared.config.start_offset
                    },
                );
                st.set_track(&tp, Some(track));
                n += 1;
            }
        }
        self.shared.wake_task.notify_one();
        n
    }

    /// Stop fetching and yielding `partitions` (Java `pause`, librdkafka `pause`, franz-go
    /// `PauseFetchPartitions`) while keeping their position and buffered messages; the
    /// other partitions go on. No message of a paused partition is yielded after this
    /// returns (but the one a poll already under way on another thread may be
    /// returning); a fetch already in flight for it still lands in its buffer. Its buffered
    /// messages stop counting against [`ReaderConfig::queue_capacity`](super::ReaderConfig::queue_capacity),
    /// so a paused partition never stalls the others. Partitions not assigned are
    /// ignored.
    ///
    /// A pause lasts until [`ReaderHandle::resume`], a [`ReaderHandle::seek`] keeps it,
    /// and it ends with the partition's assignment: in a group, a revoked partition loses
    /// its pause (as in the Java client) — with the eager protocol every rebalance revokes
    /// every partition; the cooperative protocol keeps the pause of the partitions the
    /// member keeps. Watch [`Reader::events`](super::Reader::events) to pause again.
    ///
    /// ```no_run
    /// # use kafkapipe::reader::{ReaderHandle, TopicPartition};
    /// # fn demo(handle: &ReaderHandle) {
    /// let slow = [TopicPartition::new("events", 2)];
    /// handle.pause(&slow);
    /// // ... the downstream of partition 2 catches up ...
    /// handle.resume(&slow);
    /// # }
    /// ```
    pub fn pause(&self, partitions: &[TopicPartition]) {
        {
            let mut st = self.shared.lock();
            for tp in partitions {
                st.pause(tp);
            }
        }
        // The paused buffers no longer count as full: other partitions may fetch.
        self.shared.wake_task.notify_one();
    }

    /// Fetch and yield paused `partitions` again, exactly where they stopped: their
    /// buffered messages first, then from their next offset — nothing skipped or
    /// repeated. Partitions not paused are ignored.
    ///
    /// ```no_run
    /// # use kafkapipe::reader::{ReaderHandle, TopicPartition};
    /// # fn demo(handle: &ReaderHandle) {
    /// handle.resume(&[TopicPartition::new("events", 2)]);
    /// # }
    /// ```
    pub fn resume(&self, partitions: &[TopicPartition]) {
        let waker = {
            let mut st = self.shared.lock();
            let mut any = false;
            for tp in partitions {
                any |= st.resume(tp);
            }
            if any {
                st.consumer.take()
            } else {
                None
            }
        };
        if let Some(w) = waker {
            w.wake();
        }
        self.shared.wake_task.notify_one();
    }

    /// The paused partitions, sorted.
    ///
    /// ```no_run
    /// # fn demo(handle: &kafkapipe::reader::ReaderHandle) {
    /// for tp in handle.paused() { println!("{tp} is paused"); }
    /// # }
    /// ```
    pub fn paused(&self) -> Vec<TopicPartition> {
        let st = self.shared.lock();
        let mut v: Vec<TopicPartition> = st
            .parts
            .values()
            .filter(|p| p.paused)
            .map(|p| TopicPartition::new(&*p.topic, p.partition))
            .collect();
        v.sort();
        v
    }

    /// Continue `topic`/`partition` at `offset` (kafka-go `SetOffset`). No message from
    /// before the seek is yielded after this returns, but the one a poll of the reader
    /// already under way on another thread may be returning.
    ///
    /// ```no_run
    /// # fn demo(handle: &kafkapipe::reader::ReaderHandle) -> kafkapipe::Result<()> {
    /// handle.seek("events", 0, 42)?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// `UnknownTopicOrPartition` if the partition is not assigned; `Config` for a negative
    /// offset.
    pub fn seek(&self, topic: &str, partition: i32, offset: i64) -> Result<()> {
        if offset < 0 {
            return Err(Error::config("seek offset must not be negative"));
        }
        self.reposition(topic, partition, Position::Offset(offset))
    }

    /// Continue `topic`/`partition` at the first offset whose timestamp is at or after
    /// `timestamp_ms` (kafka-go `SetOffsetAt`), looked up with ListOffsets by the fetch
    /// task. No message from before the seek is yielded after this returns, but the one
    /// a poll of the reader already under way on another thread may be returning.
    ///
    /// ```no_run
    /// # fn demo(handle: &kafkapipe::reader::ReaderHandle) -> kafkapipe::Result<()> {
    /// handle.seek_to_time("events", 0, 1_700_000_000_000)?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As for [`ReaderHandle::seek`].
    pub fn seek_to_time(&self, topic: &str, partition: i32, timestamp_ms: i64) -> Result<()> {
        if timestamp_ms < 0 {
            return Err(Error::config("seek timestamp must not be negative"));
        }
        self.reposition(
            topic,
            partition,
            Position::Start(StartOffset::AtTimestamp(timestamp_ms)),
        )
    }

    fn reposition(&self, topic: &str, partition: i32, to: Position) -> Result<()> {
        {
            let mut st = self.shared.lock();
            let Some(id) = st
                .index
                .get(&TopicPartition::new(topic, partition))
                .copied()
            else {
                return Err(Error::kafka(ErrorCode::UnknownTopicOrPartition)
                    .with_topic(topic)
                    .with_partition(partition)
                    .with_message("partition is not assigned to this reader"));
            };
            st.reset(id, to);
        }
        self.shared.wake_task.notify_one();
        Ok(())
    }

    /// The offset of the next message to yield from `topic`/`partition` (last yielded
    /// + 1), if assigned and known.
    ///
    /// ```no_run
    /// # fn demo(handle: &kafkapipe::reader::ReaderHandle) {
    /// println!("{:?}", handle.position("events", 0));
    /// # }
    /// ```
    pub fn position(&self, topic: &str, partition: i32) -> Option<i64> {
        let st = self.shared.lock();
        let id = st.index.get(&TopicPartition::new(topic, partition))?;
        st.parts
            .get(id)
            .map(|p| st.position_of(*id, p))
            .filter(|p| *p >= 0)
    }

    /// Messages not yet yielded, summed over the assigned partitions: the last high-water
    /// mark a fetch reported minus the position (kafka-go `Lag`). Partitions not fetched
    /// yet count 0. No request is made.
    ///
    /// ```no_run
    /// # fn demo(handle: &kafkapipe::reader::ReaderHandle) {
    /// println!("lag {}", handle.lag());
    /// # }
    /// ```
    pub fn lag(&self) -> i64 {
        lag_of(&self.shared.lock())
    }

    /// [`ReaderHandle::lag`] of one partition, if it is assigned and has been fetched.
    ///
    /// ```no_run
    /// # fn demo(handle: &kafkapipe::reader::ReaderHandle) {
    /// println!("{:?}", handle.partition_lag("events", 0));
    /// # }
    /// ```
    pub fn partition_lag(&self, topic: &str, partition: i32) -> Option<i64> {
        let st = self.shared.lock();
        let id = *st.index.get(&TopicPartition::new(topic, partition))?;
        let p = st.parts.get(&id)?;
        let position = st.position_of(id, p);
        (p.high_watermark >= 0 && position >= 0)
            .then(|| p.high_watermark.saturating_sub(position).max(0))
    }

    /// Like [`ReaderHandle::lag`], but asks each partition's leader for its end offset
    /// with ListOffsets (kafka-go `ReadLag`). Partitions whose position is unknown count 0.
    ///
    /// ```no_run
    /// # async fn demo(handle: &kafkapipe::reader::ReaderHandle) -> kafkapipe::Result<()> {
    /// println!("lag {}", handle.read_lag().await?);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// The first lookup error (metadata, connection, ListOffsets).
    ///
    /// # Cancellation safety
    ///
    /// Cancel safe: it only reads.
    pub async fn read_lag(&self) -> Result<i64> {
        let positions: Vec<(String, i32, i64)> = {
            let st = self.shared.lock();
            st.parts
                .iter()
                .map(|(id, p)| (p, st.position_of(*id, p)))
                .filter(|(_, position)| *position >= 0)
                .map(|(p, position)| (p.topic.to_string(), p.partition, position))
                .collect()
        };
        let cluster = &self.shared.cluster;
        let mut lag = 0;
        for (topic, partition, position) in positions {
            let leader = cluster.leader_for(&topic, partition).await?;
            let conn = Conn::from_connection(cluster.connection(leader).await?);
            let end = conn.last_offset(&topic, partition).await?;
            lag = end.saturating_sub(position).max(0).saturating_add(lag);
        }
        Ok(lag)
    }
}

/// Closing.
impl ReaderHandle {
    /// Close the reader gracefully, from wherever it is consumed. In order:
    ///
    /// 1. The stream ends: it yields `None` from now on (pending errors and buffered
    ///    messages are dropped), so a `forward` completes and closes its sink — a
    ///    [`Writer`](crate::writer::Writer) then delivers what it holds, acknowledging
    ///    the consumed messages' [`AckToken`](crate::group::AckToken)s.
    /// 2. Fetching stops: when this returns the fetch task has ended. The incremental
    ///    fetch sessions brokers hold for the reader are closed (a Fetch with epoch -1 to
    ///    each, as the Java consumer sends), beside step 3, so they do not keep slots of
    ///    the brokers' session caches; a broker whose connection still has the last fetch
    ///    waiting gets that request over a short-lived connection of its own.
    /// 3. A group reader with a pre-revoke hook
    ///    ([`ReaderConfig::on_revoke`](super::ReaderConfig::on_revoke)) runs it with every
    ///    partition it owns (at most the rebalance timeout), so stages flush what they
    ///    hold. It keeps heartbeating while it waits for the messages it yielded
    ///    to be processed (until no [`AckToken`](crate::group::AckToken) is still held
    ///    — acked, failed and dropped ones do not count), at most
    ///    [`ReaderConfig::rebalance_timeout`](super::ReaderConfig::rebalance_timeout);
    ///    then it commits every processed offset and leaves the group (static members,
    ///    with [`ReaderConfig::group_instance_id`](super::ReaderConfig::group_instance_id),
    ///    stay so that a restart keeps their partitions), and the
    ///    [`Reader::events`](super::Reader::events) stream ends. So the final commit
    ///    includes what the downstream writer acknowledged while it closed. Drop or
    ///    [`fail`](crate::group::AckToken::fail) the tokens of messages you will not
    ///    process before closing, or the close waits for the timeout.
    /// 4. The broker connections close.
    ///
    /// Closing again, or from several handles at once, waits for the same close.
    ///
    /// ```no_run
    /// # async fn demo(handle: kafkapipe::reader::ReaderHandle) {
    /// handle.close().await;
    /// assert_eq!(handle.stats().fetch_tasks, 0);
    /// # }
    /// ```
    ///
    /// # Cancellation safety
    ///
    /// Cancel safe. Before its first await it ends the stream and stops fetching; the
    /// remaining steps run in a task of their own, started by the first call: dropping
    /// this future (a `select!` or `timeout` around it) stops only the waiting,
    /// never the close — the stream has ended, and the final commit and LeaveGroup follow
    /// on their own, even when the `Reader` is dropped meanwhile. Closing again waits
    /// for the same close. The close is bounded on its own: the pre-revoke hook and the
    /// wait for held tokens each by
    /// [`ReaderConfig::rebalance_timeout`](super::ReaderConfig::rebalance_timeout), the
    /// whole group part by that plus the final commit's retry budget and two request
    /// timeouts, after which the group task is aborted.
    ///
    /// Connections not closed yet close with their last handle.
    pub async fn close(&self) {
        // The close task is registered first, so a `Reader` dropped from here on leaves
        // the group task to it; its steps wait for the fetch task, which ends below.
        let closing = self
            .tasks
            .closing
            .get_or_init(|| {
                let this = self.clone();
                tokio::spawn(async move { this.close_steps().await })
                    .map(|_| ())
                    .boxed()
                    .shared()
            })
            .clone();
        // Before any await: the stream ends and fetching stops, however soon this future
        // is dropped.
        let waker = self.shared.lock().close();
        if let Some(w) = waker {
            w.wake();
        }
        self.tasks.fetch.abort.abort();
        closing.await;
    }

    /// The steps of [`ReaderHandle::close`], run once, in a task of their own.
    async fn close_steps(&self) {
        self.tasks.fetch.done.clone().await;
        // The fetch sessions close beside the group's leaving, not before it: a broker
        // answers the close after any fetch the ended task left waiting on it.
        let sessions = super::task::close_sessions(&self.shared);
        let group = async {
            let (Some(group), Some(task)) = (&self.group, &self.tasks.group) else {
                return;
            };
            // the pre-revoke hook, while the membership goes on as usual
            group.before_close().await;
            group.closing.store(true, Ordering::SeqCst);
            group.wake.notify_one();
            let limit = group.close_bound(&self.shared.config);
            if tokio::time::timeout(limit, task.done.clone())
                .await
                .is_err()
            {
                tracing::warn!(group = %group.group_id, "group task did not stop in time; aborted");
                task.abort.abort();
                task.done.clone().await;
            }
            group.close_events();
        };
        futures::join!(sessions, group);
        self.shared.cluster.close().await;
    }
}

/// Statistics.
impl ReaderHandle {
    /// A snapshot of the counters and gauges.
    ///
    /// ```no_run
    /// # fn demo(handle: &kafkapipe::reader::ReaderHandle) {
    /// let s = handle.stats();
    /// println!("{} buffered, lag {}, {} unacked", s.queue_length, s.lag, s.unacked);
    /// # }
    /// ```
    pub fn stats(&self) -> ReaderStats {
        let c = &self.shared.counters;
        let config = &self.shared.config;
        let (unacked, oldest_unacked) = self
            .group
            .as_ref()
            .map(|g| g.commits().unacked())
            .unwrap_or_default();
        let st = self.shared.lock();
        ReaderStats {
            fetches: c.fetches.load(Ordering::Relaxed),
            messages: c.messages.load(Ordering::Relaxed),
            bytes: c.bytes.load(Ordering::Relaxed),
            errors: c.errors.load(Ordering::Relaxed),
            offset_resets: c.resets.load(Ordering::Relaxed),
            retries: c.retries.load(Ordering::Relaxed),
            last_error: c.last_error.get(),
            partitions: st.parts.len(),
            queue_length: st.queued().0,
            queue_bytes: st.queued().1,
            queue_capacity: config.queue_capacity,
            queue_capacity_bytes: config.queue_capacity_bytes,
            lag: lag_of(&st),
            fetch_tasks: c.tasks_running.load(Ordering::SeqCst),
            unacked,
            oldest_unacked,
            parked_partitions: st
                .parts
                .values()
                .filter(|p| p.fetch == Position::Parked)
                .count(),
            log_truncations: c.log_truncations.load(Ordering::Relaxed),
            incremental_fetches: c.incremental_fetches.load(Ordering::Relaxed),
            fetch_sessions_lost: c.sessions_lost.load(Ordering::Relaxed),
            throttle_time_avg: c.throttle.avg(),
            throttle_time_max: c.throttle.max(),
        }
    }
}

pub(crate) fn lag_of(st: &State) -> i64 {
    st.parts
        .iter()
        .map(|(id, p)| (p.high_watermark, st.position_of(*id, p)))
        .filter(|(hw, position)| *hw >= 0 && *position >= 0)
        .map(|(hw, position)| hw.saturating_sub(position).max(0))
        .fold(0i64, i64::saturating_add)
}
