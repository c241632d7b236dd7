//! The consumer: [`Reader`], a `Stream<Item = Result<Message>>` over explicitly assigned
//! partitions (no consumer group), with bounded prefetch.
//!
//! # Design
//!
//! - **One fetch task per reader, one Fetch request in flight per broker.** The task
//!   (see `task.rs`) groups the assigned partitions by leader and sends each broker one
//!   Fetch request covering all its partitions that are ready (leader and offset known,
//!   not backing off, buffer not full) — as librdkafka and franz-go do, rather than
//!   kafka-go's one goroutine per partition. Leader and start-offset lookups (Metadata,
//!   ListOffsets) run concurrently with fetches. Everything is a future inside that one
//!   task, so closing the reader aborts one task and nothing is left running.
//! - **Per-partition buffers, merged round robin.** Fetched messages go to their
//!   partition's buffer; the stream takes one message from each partition with buffered
//!   messages in turn, so a hot partition cannot starve the others.
//! - **Bounded prefetch.** No fetch is started while the buffers together hold
//!   [`ReaderConfig::queue_capacity`] messages or
//!   [`ReaderConfig::queue_capacity_bytes`] bytes. Memory is thus bounded by the
//!   configuration (capacity plus at most one response per broker, each at most
//!   [`ReaderConfig::max_bytes`] on the wire), not by the backlog. When the application
//!   stops polling, fetching stops. Compressed batches count at their decompressed size
//!   once buffered, but the response that overshoots the capacity is decompressed whole:
//!   with highly compressible data the overshoot can reach the compression ratio times
//!   `max_bytes` (each partition's decompression is capped at 32 × its
//!   `max_partition_bytes`, at least 64 MiB). Lower `max_bytes` to tighten this.
//! - **Epochs instead of kafka-go's versions.** Each partition has an epoch bumped by
//!   [`Reader::seek`], [`Reader::seek_to_time`] and re-assignment; a result that was in
//!   flight across the change is dropped, and the partition's buffer is cleared under the
//!   same lock, so nothing from before a seek is yielded after it returns.
//! - **Dynamic assignment.** [`Reader::assign`] and [`Reader::unassign`] add and revoke
//!   partitions at runtime without disturbing the others; a revoked partition's buffered
//!   messages are dropped. Consumer groups will drive these.
//! - **Failures.** Connection errors and leadership errors (`NotLeaderOrFollower`,
//!   `UnknownTopicOrPartition`, …) invalidate the topic's metadata, forget the leader and
//!   retry with exponential backoff ([`ReaderConfig::read_backoff_min`] to
//!   [`ReaderConfig::read_backoff_max`]) from the next unfetched offset — which, since the
//!   buffer survives, is the last yielded offset + 1 plus whatever is buffered: nothing is
//!   skipped or repeated. Every [`ReaderConfig::max_attempts`] consecutive failures of a
//!   partition the error is also yielded (the stream goes on afterwards).
//!   `OffsetOutOfRange` resets per [`ReaderConfig::offset_reset`], logged at `warn`.
//!
//! # Limits
//!
//! Fetch requests use at most version 12 (topics by name) and are full requests every
//! time: no fetch sessions (KIP-227), no leader-epoch fencing or log-truncation detection
//! (`current_leader_epoch` is -1), no preferred read replica (KIP-392). Records are
//! decoded on the fetch task before they are buffered, so the next Fetch to a broker is
//! sent only after its previous response is decoded.

mod config;
mod message;
mod state;
mod task;

use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use futures::Stream;
use tokio::task::JoinHandle;

pub use config::{OffsetReset, ReaderConfig, StartOffset, TopicPartition};
pub use message::Message;

use crate::cluster::Cluster;
use crate::conn::Conn;
use crate::error::{Error, Result};
use crate::protocol::ErrorCode;
pub(crate) use state::Shared;
use state::{Counters, Position, State};

use crate::group::{Committer, GroupEvents, GroupShared, GroupTask};

/// A snapshot of a reader's counters and gauges (like kafka-go's `ReaderStats`; the
/// counters here are cumulative, not reset by reading them).
///
/// ```no_run
/// # async fn demo(reader: kafkapipe::reader::Reader) {
/// let s = reader.stats();
/// println!("{} messages in {} fetches, {} buffered, lag {}", s.messages, s.fetches, s.queue_length, s.lag);
/// # }
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReaderStats {
    /// Fetch requests sent (kafka-go `Fetches`).
    pub fetches: u64,
    /// Messages fetched (kafka-go `Messages`).
    pub messages: u64,
    /// Bytes (see [`Message::size`]) of fetched messages (kafka-go `Bytes`).
    pub bytes: u64,
    /// Failed fetch or lookup attempts (kafka-go `Errors`).
    pub errors: u64,
    /// `OffsetOutOfRange` resets.
    pub offset_resets: u64,
    /// Assigned partitions.
    pub partitions: usize,
    /// Messages fetched and not yet yielded (kafka-go `QueueLength`).
    pub queue_length: usize,
    /// Bytes of messages fetched and not yet yielded.
    pub queue_bytes: usize,
    /// [`ReaderConfig::queue_capacity`] (kafka-go `QueueCapacity`).
    pub queue_capacity: usize,
    /// [`ReaderConfig::queue_capacity_bytes`].
    pub queue_capacity_bytes: usize,
    /// [`Reader::lag`] (kafka-go `Lag`).
    pub lag: i64,
    /// Fetch tasks running: 1 while the reader is open, 0 after [`Reader::close`].
    pub fetch_tasks: usize,
}

/// A Kafka consumer over explicit partitions: a `Stream` of messages.
///
/// ```no_run
/// use futures::TryStreamExt;
/// use kafkapipe::reader::{Reader, ReaderConfig, StartOffset};
///
/// # async fn demo() -> kafkapipe::Result<()> {
/// let mut reader = Reader::new(
///     ReaderConfig::new(["127.0.0.1:9092"])
///         .topic("events")
///         .start_offset(StartOffset::First),
/// )
/// .await?;
/// while let Some(m) = reader.try_next().await? {
///     println!("{}/{}@{}: {} bytes", m.topic, m.partition, m.offset, m.size());
///     if m.offset >= 100 {
///         break;
///     }
/// }
/// reader.close().await;
/// # Ok(()) }
/// ```
///
/// The stream ends (`None`) only after [`Reader::close`]. Errors are items: the stream
/// goes on after yielding one.
///
/// # Cancellation safety
///
/// `poll_next` and [`Reader::next_message`] are cancel safe: a message leaves the buffer
/// only when it is returned, so dropping a pending `next()` loses nothing.
pub struct Reader {
    shared: Arc<Shared>,
    task: Option<JoinHandle<()>>,
    group: Option<Arc<GroupShared>>,
    group_task: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Reader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reader")
            .field("brokers", &self.shared.config.brokers)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl Reader {
    /// Start a reader: look up the partitions of topics given without partitions, assign
    /// everything at [`ReaderConfig::start_offset`] and spawn the fetch task (so it must
    /// be called within a tokio runtime).
    ///
    /// ```no_run
    /// # use kafkapipe::reader::{Reader, ReaderConfig};
    /// # async fn demo() -> kafkapipe::Result<()> {
    /// let reader = Reader::new(ReaderConfig::new(["127.0.0.1:9092"]).partition("events", 0)).await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// `Config` for an invalid configuration; the metadata error (e.g.
    /// `UnknownTopicOrPartition`) of a topic given without partitions, after
    /// [`ReaderConfig::max_attempts`] tries for retriable ones.
    ///
    /// # Cancellation safety
    ///
    /// Cancel safe: the fetch task is spawned only after the last await, so a dropped
    /// call leaves nothing running (metadata connections close with their last handle).
    pub async fn new(config: ReaderConfig) -> Result<Reader> {
        config.validate()?;
        let cluster = Cluster::new(config.brokers.clone(), config.connection_config())?
            .with_refresh_backoff(config.read_backoff_min);
        let mut state = State::default();
        let group_topics: &[_] = if config.group_id.is_some() {
            &[]
        } else {
            &config.topics
        };
        for sel in group_topics {
            let partitions = match &sel.partitions {
                Some(p) => p.clone(),
                None => topic_partitions(&cluster, &config, &sel.topic).await?,
            };
            for p in partitions {
                state.assign(TopicPartition::new(&sel.topic, p), config.start_offset);
            }
        }
        let shared = Arc::new(Shared {
            state: Mutex::new(state),
            wake_task: tokio::sync::Notify::new(),
            config,
            cluster,
            counters: Counters::default(),
        });
        let group = shared.config.group_id.clone().map(|id| {
            let admin = crate::admin::Admin::new(shared.cluster.clone());
            Arc::new(GroupShared::new(
                &shared.config,
                id,
                admin,
                shared.cluster.clone(),
            ))
        });
        let task = tokio::spawn(task::run(shared.clone()));
        let group_task = group.clone().map(|group| {
            tokio::spawn(
                GroupTask {
                    group,
                    reader: shared.clone(),
                }
                .run(),
            )
        });
        Ok(Reader {
            shared,
            task: Some(task),
            group,
            group_task,
        })
    }

    /// The commit sink of a group reader (see [`Committer`]); `None` without
    /// [`ReaderConfig::group_id`]. Creating one turns on contiguous-ack tracking (with
    /// [`ReaderConfig::commit_contiguous`]) for messages yielded from then on; acks of
    /// messages yielded before are merged, but never past the first tracked message.
    ///
    /// ```no_run
    /// use futures::{SinkExt, TryStreamExt};
    /// # async fn demo(mut reader: kafkapipe::reader::Reader) -> kafkapipe::Result<()> {
    /// let Some(mut committer) = reader.committer() else { return Ok(()) };
    /// while let Some(m) = reader.try_next().await? {
    ///     // ... process m ...
    ///     committer.feed(&m).await?;
    /// }
    /// # Ok(()) }
    /// ```
    pub fn committer(&self) -> Option<Committer> {
        self.group.clone().map(Committer::new)
    }

    /// The next message, acked to the group's commits as it is returned (kafka-go
    /// `ReadMessage` in a group): committed by the next interval tick, or, with
    /// [`CommitMode::Sync`](crate::group::CommitMode::Sync), before this returns. The
    /// message counts as processed before the application has seen it, so a crash
    /// while processing loses it (at most once for that message). The recommended path
    /// is [`Reader::next_message`] (or the stream) plus [`Reader::committer`] after
    /// processing. Without a group this is [`Reader::next_message`].
    ///
    /// ```no_run
    /// # async fn demo(mut reader: kafkapipe::reader::Reader) -> kafkapipe::Result<()> {
    /// let m = reader.read_message().await?;
    /// println!("{}@{} (already marked processed)", m.partition, m.offset);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As for [`Reader::next_message`]; in sync mode also the commit's error (the message
    /// is then not returned, but stays acked).
    ///
    /// # Cancellation safety
    ///
    /// Cancel safe until a message is taken; in sync mode a call dropped while
    /// committing loses that message (it stays acked and is committed later).
    pub async fn read_message(&mut self) -> Result<Message> {
        let m = self.next_message().await?;
        if let Some(g) = &self.group {
            g.ack(crate::group::Offset::from(&m));
            if g.mode == crate::group::CommitMode::Sync {
                g.commit_pending(None).await?;
            }
        }
        Ok(m)
    }

    /// The rebalance events of a group reader (see [`GroupEvents`]); `None` without
    /// [`ReaderConfig::group_id`].
    ///
    /// ```no_run
    /// use futures::StreamExt;
    /// # async fn demo(reader: kafkapipe::reader::Reader) {
    /// if let Some(mut events) = reader.events() {
    ///     tokio::spawn(async move {
    ///         while let Some(e) = events.next().await {
    ///             println!("{e:?}");
    ///         }
    ///     });
    /// }
    /// # }
    /// ```
    pub fn events(&self) -> Option<GroupEvents> {
        self.group.clone().map(GroupEvents::new)
    }

    /// The next message (kafka-go `ReadMessage` / `FetchMessage`, which are the same here:
    /// offsets are committed through [`Reader::committer`] after processing).
    ///
    /// ```no_run
    /// # async fn demo(mut reader: kafkapipe::reader::Reader) -> kafkapipe::Result<()> {
    /// let m = reader.next_message().await?;
    /// println!("offset {}", m.offset);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// A fetch error (see the module docs), or `Closed` after [`Reader::close`].
    ///
    /// # Cancellation safety
    ///
    /// Cancel safe: a dropped call loses no message.
    pub async fn next_message(&mut self) -> Result<Message> {
        match futures::StreamExt::next(self).await {
            Some(r) => r,
            None => Err(Error::closed("reader is closed")),
        }
    }

    /// Start reading `partitions`, each from its own start offset, without disturbing the
    /// partitions already assigned. A partition that is already assigned is reset to the
    /// given start, dropping its buffered messages.
    ///
    /// A group reader's assignment belongs to its group: calling this (or
    /// [`Reader::unassign`]) there reads partitions the group did not give this member.
    ///
    /// ```no_run
    /// # use kafkapipe::reader::{Reader, StartOffset, TopicPartition};
    /// # fn demo(reader: &Reader) {
    /// reader.assign([(TopicPartition::new("events", 4), StartOffset::At(1000))]);
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
    /// them is yielded after this returns. Unknown partitions are ignored.
    ///
    /// ```no_run
    /// # use kafkapipe::reader::{Reader, TopicPartition};
    /// # fn demo(reader: &Reader) {
    /// reader.unassign(&[TopicPartition::new("events", 4)]);
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
    /// # fn demo(reader: &kafkapipe::reader::Reader) {
    /// for tp in reader.assignment() { println!("{tp}"); }
    /// # }
    /// ```
    pub fn assignment(&self) -> Vec<TopicPartition> {
        let mut v: Vec<TopicPartition> = self.shared.lock().index.keys().cloned().collect();
        v.sort();
        v
    }

    /// Continue `topic`/`partition` at `offset` (kafka-go `SetOffset`). No message from
    /// before the seek is yielded after this returns.
    ///
    /// ```no_run
    /// # fn demo(reader: &kafkapipe::reader::Reader) -> kafkapipe::Result<()> {
    /// reader.seek("events", 0, 42)?;
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
    /// task. No message from before the seek is yielded after this returns.
    ///
    /// ```no_run
    /// # fn demo(reader: &kafkapipe::reader::Reader) -> kafkapipe::Result<()> {
    /// reader.seek_to_time("events", 0, 1_700_000_000_000)?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As for [`Reader::seek`].
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
    /// # fn demo(reader: &kafkapipe::reader::Reader) {
    /// println!("{:?}", reader.position("events", 0));
    /// # }
    /// ```
    pub fn position(&self, topic: &str, partition: i32) -> Option<i64> {
        let st = self.shared.lock();
        let id = st.index.get(&TopicPartition::new(topic, partition))?;
        st.parts.get(id).map(|p| p.position).filter(|p| *p >= 0)
    }

    /// Messages not yet yielded, summed over the assigned partitions: the last high-water
    /// mark a fetch reported minus the position (kafka-go `Lag`). Partitions not fetched
    /// yet count 0. No request is made.
    ///
    /// ```no_run
    /// # fn demo(reader: &kafkapipe::reader::Reader) {
    /// println!("lag {}", reader.lag());
    /// # }
    /// ```
    pub fn lag(&self) -> i64 {
        lag_of(&self.shared.lock())
    }

    /// [`Reader::lag`] of one partition, if it is assigned and has been fetched.
    ///
    /// ```no_run
    /// # fn demo(reader: &kafkapipe::reader::Reader) {
    /// println!("{:?}", reader.partition_lag("events", 0));
    /// # }
    /// ```
    pub fn partition_lag(&self, topic: &str, partition: i32) -> Option<i64> {
        let st = self.shared.lock();
        let p = st
            .parts
            .get(st.index.get(&TopicPartition::new(topic, partition))?)?;
        (p.high_watermark >= 0 && p.position >= 0)
            .then(|| p.high_watermark.saturating_sub(p.position).max(0))
    }

    /// Like [`Reader::lag`], but asks each partition's leader for its end offset with
    /// ListOffsets (kafka-go `ReadLag`). Partitions whose position is unknown count 0.
    ///
    /// ```no_run
    /// # async fn demo(reader: &kafkapipe::reader::Reader) -> kafkapipe::Result<()> {
    /// println!("lag {}", reader.read_lag().await?);
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
                .values()
                .filter(|p| p.position >= 0)
                .map(|p| (p.topic.to_string(), p.partition, p.position))
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

    /// A snapshot of the counters and gauges.
    ///
    /// ```no_run
    /// # fn demo(reader: &kafkapipe::reader::Reader) {
    /// assert!(reader.stats().queue_length <= reader.stats().queue_capacity + 100_000);
    /// # }
    /// ```
    pub fn stats(&self) -> ReaderStats {
        let c = &self.shared.counters;
        let config = &self.shared.config;
        let st = self.shared.lock();
        ReaderStats {
            fetches: c.fetches.load(Ordering::Relaxed),
            messages: c.messages.load(Ordering::Relaxed),
            bytes: c.bytes.load(Ordering::Relaxed),
            errors: c.errors.load(Ordering::Relaxed),
            offset_resets: c.resets.load(Ordering::Relaxed),
            partitions: st.parts.len(),
            queue_length: st.buffered,
            queue_bytes: st.buffered_bytes,
            queue_capacity: config.queue_capacity,
            queue_capacity_bytes: config.queue_capacity_bytes,
            lag: lag_of(&st),
            fetch_tasks: c.tasks_running.load(Ordering::SeqCst),
        }
    }

    /// Stop fetching, drop buffered messages and close the broker connections. When this
    /// returns the fetch task has ended; the stream then yields `None`.
    ///
    /// A group reader first commits every pending offset (what its committers were sent)
    /// and leaves the group — static members (with
    /// [`ReaderConfig::group_instance_id`]) stay, so a restart keeps their partitions —
    /// waiting at most twice [`ReaderConfig::request_timeout`] for that; the
    /// [`Reader::events`] stream then ends. Dropping a group reader without closing it is
    /// a crash as far as the group knows: no final commit, and its partitions move only
    /// after the session timeout.
    ///
    /// ```no_run
    /// # async fn demo(mut reader: kafkapipe::reader::Reader) {
    /// reader.close().await;
    /// assert_eq!(reader.stats().fetch_tasks, 0);
    /// # }
    /// ```
    ///
    /// # Cancellation safety
    ///
    /// If dropped midway the task is already aborted; only closing the connections may
    /// not have happened (they close when their last handle is dropped). A group task
    /// told to close finishes its commit and LeaveGroup on its own.
    pub async fn close(&mut self) {
        if let (Some(group), Some(mut task)) = (&self.group, self.group_task.take()) {
            // the group task commits what is pending and leaves the group
            group.closing.store(true, Ordering::SeqCst);
            group.wake.notify_one();
            let limit = self.shared.config.request_timeout.saturating_mul(2);
            if tokio::time::timeout(limit, &mut task).await.is_err() {
                tracing::warn!(group = %group.group_id, "group task did not stop in time; aborted");
                task.abort();
            }
            group.close_events();
        }
        let waker = {
            let mut st = self.shared.lock();
            st.closed = true;
            st.ready.clear();
            for p in st.parts.values_mut() {
                p.buf.clear();
                p.buf_bytes = 0;
            }
            st.buffered = 0;
            st.buffered_bytes = 0;
            st.consumer.take()
        };
        if let Some(w) = waker {
            w.wake();
        }
        if let Some(task) = self.task.take() {
            task.abort();
            let _ = task.await;
        }
        self.shared.cluster.close().await;
    }
}

/// The partitions of `topic`, retrying retriable errors (e.g. `LeaderNotAvailable` right
/// after the topic was created) up to `max_attempts` times with the read backoff.
async fn topic_partitions(
    cluster: &Cluster,
    config: &ReaderConfig,
    topic: &str,
) -> Result<Vec<i32>> {
    let mut failures = 0;
    loop {
        match cluster.partitions(topic).await {
            Ok(p) => return Ok(p),
            Err(e) if e.is_retriable() && failures + 1 < config.max_attempts => {
                failures += 1;
                tracing::debug!(topic, failures, error = %e, "listing partitions failed; retrying");
                cluster.invalidate(topic);
                tokio::time::sleep(config.backoff_for(failures)).await;
            }
            Err(e) => return Err(e),
        }
    }
}

fn lag_of(st: &State) -> i64 {
    st.parts
        .values()
        .filter(|p| p.high_watermark >= 0 && p.position >= 0)
        .map(|p| p.high_watermark.saturating_sub(p.position).max(0))
        .fold(0i64, i64::saturating_add)
}

impl Drop for Reader {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
        if let Some(task) = self.group_task.take() {
            task.abort();
        }
    }
}

impl Stream for Reader {
    type Item = Result<Message>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let shared = &self.shared;
        let mut st = shared.lock();
        if let Some(e) = st.errors.pop_front() {
            return Poll::Ready(Some(Err(e)));
        }
        if st.closed {
            return Poll::Ready(None);
        }
        if let Some((m, freed)) = st.pop(&shared.config) {
            drop(st);
            if let Some(g) = &self.group {
                g.delivered(&m.topic, m.partition, m.offset);
            }
            if freed {
                shared.wake_task.notify_one();
            }
            return Poll::Ready(Some(Ok(m)));
        }
        match &st.consumer {
            Some(w) if w.will_wake(cx.waker()) => {}
            _ => st.consumer = Some(cx.waker().clone()),
        }
        Poll::Pending
    }
}

#[cfg(test)]
mod tests;
