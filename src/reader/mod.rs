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
//!   partition's buffer; the stream takes from each partition with buffered messages in
//!   turn, so a hot partition cannot starve the others: one message at a time from a
//!   group reader's partitions, runs of up to 64 otherwise. A run is taken under one lock
//!   and yielded without locking again; a seek, reset, pause, unassignment or close from
//!   a [`ReaderHandle`], and every error queued, call back what is left of it (a
//!   generation counter checked per message), so the guarantees below hold per message.
//! - **Bounded prefetch.** No fetch is started while the buffers together hold
//!   [`ReaderConfig::queue_capacity`] messages or half of
//!   [`ReaderConfig::queue_capacity_bytes`], and a fetch asks the broker for at most the
//!   bytes left under that capacity (shared among the brokers fetched from). Memory is
//!   thus bounded by the configuration (the capacity, plus a batch per response when a
//!   single batch is larger than what was asked for), not by the backlog. When the application
//!   stops polling, fetching stops. Compressed batches count at their decompressed size
//!   once buffered, but the response that overshoots the capacity is decompressed whole:
//!   with highly compressible data the overshoot can reach the compression ratio times
//!   `max_bytes` (each partition's decompression is capped at 32 × its
//!   `max_partition_bytes`, at least 64 MiB). Lower `max_bytes` to tighten this.
//! - **Decoded as taken.** The fetch task checks each batch (CRC), decompresses it and
//!   drops control batches and aborted transactions; the batches are buffered with their
//!   records still encoded, and the stream decodes them into [`Message`]s only as it takes
//!   them, at most 64 at a time per partition, so a large backlog costs its encoded bytes
//!   and not a `Message` per record. A record that does not decode (in a batch that
//!   passed its CRC check) is yielded as an error after the messages before it, and its
//!   partition is paused until a seek, as when a fetched batch does not decode.
//! - **Buffers reused, not reallocated.** Messages are zero-copy slices of the response
//!   frame (or of a batch's decompressed payload). Those buffers go back to a small pool
//!   once the last message pointing into them is dropped, and the next fetch reuses them
//!   instead of faulting in fresh multi-megabyte allocations: one pool per broker
//!   connection for frames of 64 KiB and more, one per reader for decompressed payloads,
//!   each keeping at most 8 buffers and 34 MiB, and never a buffer over 17 MiB (a
//!   response for 16 partitions at 1 MiB each is a little over 16 MiB).
//! - **Epochs instead of kafka-go's versions.** Each partition has an epoch bumped by
//!   [`Reader::seek`], [`Reader::seek_to_time`] and re-assignment; a result that was in
//!   flight across the change is dropped, and the partition's buffer is cleared under the
//!   same lock, so nothing from before a seek is yielded after it returns (but the one
//!   message a poll already under way on another thread may be returning: the
//!   consumer yields a run of a partition's messages without the lock, checking a
//!   generation the seek bumps before each).
//! - **Dynamic assignment.** [`Reader::assign`] and [`Reader::unassign`] add and revoke
//!   partitions at runtime without disturbing the others; a revoked partition's buffered
//!   messages are dropped. Consumer groups drive these.
//! - **Control while piping.** A pipeline holds the reader (`reader.map_ok(..)
//!   .forward(writer)`), so everything that controls it — seek, lag, stats, assignment,
//!   pause/resume, close — is on a cloneable [`ReaderHandle`] ([`Reader::handle`]); the
//!   `Reader`'s methods of the same names delegate to it. A handle's close ends the
//!   stream, so `forward` completes and closes its sink, before a group reader's final
//!   commit.
//! - **Pause.** [`ReaderHandle::pause`] stops fetching and yielding partitions while
//!   keeping their buffers and positions; their buffers stop counting against the
//!   capacity, so the other partitions go on. [`ReaderHandle::resume`] continues exactly
//!   where they stopped.
//! - **Failures.** Connection errors and leadership errors (`NotLeaderOrFollower`,
//!   `UnknownTopicOrPartition`, …) invalidate the topic's metadata, forget the leader and
//!   retry with exponential backoff ([`ReaderConfig::read_backoff_min`] to
//!   [`ReaderConfig::read_backoff_max`]) from the next unfetched offset — which, since the
//!   buffer survives, is the last yielded offset + 1 plus whatever is buffered: nothing is
//!   skipped or repeated. Transient failures are retried for
//!   [`ReaderConfig::retry_timeout`] (default 5 minutes) before the error is also yielded
//!   (the stream goes on afterwards); fatal ones (authentication, authorization,
//!   unsupported version, undecodable records, …) are yielded at once. See
//!   [`ReaderConfig::retry_timeout`] for which is which.
//!   `OffsetOutOfRange` resets per [`ReaderConfig::offset_reset`], logged at `warn`.
//!
//! # Limits
//!
//! Fetch requests use at most version 12 (topics by name) and are full requests every
//! time: no fetch sessions (KIP-227), no leader-epoch fencing or log-truncation detection
//! (`current_leader_epoch` is -1), no preferred read replica (KIP-392). Batches are
//! checked and decompressed on the fetch task before they are buffered, so the next
//! Fetch to a broker is sent only after its previous response is decompressed.

mod config;
mod handle;
mod message;
#[cfg(feature = "metrics")]
mod metrics;
pub(crate) use crate::common::retry;
mod session;
mod state;
mod task;
mod tracked;
mod validate;

use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use futures::Stream;

pub use config::{OffsetReset, ReaderConfig, StartOffset, TopicPartition};
pub use handle::ReaderHandle;
pub use message::Message;
pub use tracked::{MapTracked, MessageStreamExt, ProcessConcurrent, Tracked};
pub use validate::LogTruncation;

use crate::cluster::Cluster;
use crate::error::{Error, Result};
use handle::{TaskEnd, Tasks};
pub(crate) use state::Shared;
use state::{Counters, Lent, Loan, Popped, State};

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
    /// Bytes of fetched messages, counted as [`ReaderConfig::queue_capacity_bytes`]
    /// counts them when they are fetched: their encoded size, or for a small compressed
    /// batch its compressed size (kafka-go `Bytes`).
    pub bytes: u64,
    /// Failed fetch or lookup attempts (kafka-go `Errors`).
    pub errors: u64,
    /// `OffsetOutOfRange` resets.
    pub offset_resets: u64,
    /// Transient failures retried: fetches, lookups, and a group reader's joins, offset
    /// fetches and heartbeats (see [`ReaderConfig::retry_timeout`]).
    pub retries: u64,
    /// The last failure of a fetch, lookup or group request (retried or yielded), as text.
    pub last_error: Option<String>,
    /// Assigned partitions.
    pub partitions: usize,
    /// Messages fetched and not yet yielded (kafka-go `QueueLength`).
    pub queue_length: usize,
    /// Bytes of messages fetched and not yet yielded, counted as
    /// [`ReaderConfig::queue_capacity_bytes`] counts them.
    pub queue_bytes: usize,
    /// [`ReaderConfig::queue_capacity`] (kafka-go `QueueCapacity`).
    pub queue_capacity: usize,
    /// [`ReaderConfig::queue_capacity_bytes`].
    pub queue_capacity_bytes: usize,
    /// [`Reader::lag`] (kafka-go `Lag`).
    pub lag: i64,
    /// Fetch tasks running: 1 while the reader is open, 0 after [`Reader::close`].
    pub fetch_tasks: usize,
    /// Group readers: messages yielded and not yet known processed (see
    /// [`AckToken`](crate::group::AckToken)), over every owned partition.
    pub unacked: usize,
    /// Group readers: the oldest message yielded and not yet known processed, with its
    /// age — where a stuck pipeline is stuck.
    pub oldest_unacked: Option<crate::group::Unacked>,
    /// Partitions not fetched until the application seeks them: after `OffsetOutOfRange`
    /// under [`OffsetReset::Error`], or at records that cannot be decoded (corrupt, or a
    /// batch decompressing past [`MAX_BATCH_DECOMPRESSED`](crate::record::MAX_BATCH_DECOMPRESSED)).
    /// Each was reported once as an error item.
    pub parked_partitions: usize,
    /// Log truncations detected below what the application had been given (KIP-320: the
    /// partition's new leader no longer has records it yielded, after an unclean leader
    /// election): each continued per [`ReaderConfig::offset_reset`] or was yielded as a
    /// [`LogTruncation`] error.
    pub log_truncations: u64,
    /// Fetch requests sent as incremental fetch session requests (KIP-227), listing only
    /// the partitions whose fetch position changed (see
    /// [`ReaderConfig::fetch_sessions`]); the others of [`fetches`](Self::fetches) were
    /// full requests.
    pub incremental_fetches: u64,
    /// Incremental fetches a broker refused because it no longer knew the session
    /// (`FETCH_SESSION_ID_NOT_FOUND`, `INVALID_FETCH_SESSION_EPOCH`), each followed at
    /// once by a full fetch.
    pub fetch_sessions_lost: u64,
    /// Mean quota throttle time the brokers reported in fetch responses, over every
    /// answered fetch (Java `fetch-throttle-time-avg`). While a broker throttles a
    /// connection nothing more is sent on it (KIP-219, see
    /// [`Connection::throttled_until`](crate::conn::Connection::throttled_until)).
    pub throttle_time_avg: std::time::Duration,
    /// Longest quota throttle time reported in a fetch response (Java
    /// `fetch-throttle-time-max`).
    pub throttle_time_max: std::time::Duration,
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
/// The stream ends (`None`) only after [`Reader::close`] or [`ReaderHandle::close`].
/// Errors are items: the stream goes on after yielding one.
///
/// # Cancellation safety
///
/// `poll_next` and [`Reader::next_message`] are cancel safe: a message (or an error) leaves
/// the buffer only when it is returned, so dropping a pending `next()` — in a `select!`
/// loop, under a `timeout` — loses nothing and skips nothing. A group reader's message
/// takes its [`AckToken`](crate::group::AckToken) with it when returned; every poll,
/// including one whose future is then dropped, confirms as processed the tokens dropped
/// before it.
pub struct Reader {
    handle: ReaderHandle,
    /// Messages taken from one partition's buffer under one lock (see [`state::Loan`]).
    loan: Loan,
    lent: Arc<Lent>,
}

impl std::fmt::Debug for Reader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reader")
            .field("brokers", &self.handle.shared.config.brokers)
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
    /// `UnknownTopicOrPartition`) of a topic given without partitions: at once if fatal,
    /// after retrying for [`ReaderConfig::retry_timeout`] if transient.
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
        let lent = state.lent.clone();
        let shared = Arc::new(Shared {
            state: Mutex::new(state),
            wake_task: tokio::sync::Notify::new(),
            config,
            cluster,
            counters: Counters::default(),
            pool: crate::bufpool::BufPool::for_fetches(),
            fetch_sessions: Mutex::default(),
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
        if let Some(g) = &group {
            // the group commits the leader epoch of the record before each offset
            let weak = Arc::downgrade(&shared);
            let _ = g
                .offset_epochs
                .set(Box::new(move |topic, partition, offset| {
                    let shared = weak.upgrade()?;
                    let st = shared.lock();
                    let id = st.index.get(&TopicPartition::new(topic, partition))?;
                    st.parts.get(id)?.epochs.epoch_of(offset)
                }));
        }
        let fetch = TaskEnd::spawn(task::run(shared.clone()));
        let group_task = group.clone().map(|group| {
            TaskEnd::spawn(
                GroupTask {
                    group,
                    reader: shared.clone(),
                }
                .run(),
            )
        });
        #[cfg(feature = "metrics")]
        {
            let fetch_end = fetch.ended();
            let group_end = group_task.as_ref().map(TaskEnd::ended);
            metrics::spawn(&shared, group.as_ref(), async move {
                fetch_end.await;
                if let Some(g) = group_end {
                    g.await;
                }
            });
        }
        Ok(Reader {
            handle: ReaderHandle {
                shared,
                group,
                tasks: Arc::new(Tasks::new(fetch, group_task)),
            },
            loan: Loan::default(),
            lent,
        })
    }

    /// The commit sink of a group reader (see [`Committer`]); `None` without
    /// [`ReaderConfig::group_id`]. Every message a group reader yields carries an
    /// [`AckToken`](crate::group::AckToken); sending it to a committer acks it.
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
        self.handle.group.clone().map(Committer::new)
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
        if let Some(g) = &self.handle.group {
            m.ack_token().ack_ref();
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
        self.handle.group.clone().map(GroupEvents::new)
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
    #[inline]
    pub fn next_message(&mut self) -> impl std::future::Future<Output = Result<Message>> + '_ {
        // A plain poll function rather than an `async fn` around `StreamExt::next`: one
        // less state machine, and fewer moves of each message.
        std::future::poll_fn(move |cx| {
            self.poll_lent(cx, Ok, |this, cx| {
                this.poll_locked(cx)
                    .map(|item| item.unwrap_or_else(|| Err(Error::closed("reader is closed"))))
            })
        })
    }

    /// A cloneable handle to control this reader (seek, lag, stats, pause/resume, close…)
    /// from other tasks while the reader itself is consumed elsewhere, e.g. moved into a
    /// `forward`. See [`ReaderHandle`].
    ///
    /// ```no_run
    /// # async fn demo(reader: kafkapipe::reader::Reader) {
    /// let handle = reader.handle();
    /// tokio::spawn(async move {
    ///     loop {
    ///         tokio::time::sleep(std::time::Duration::from_secs(10)).await;
    ///         println!("lag {}", handle.lag());
    ///     }
    /// });
    /// # }
    /// ```
    pub fn handle(&self) -> ReaderHandle {
        self.handle.clone()
    }

    /// See [`ReaderHandle::assign`].
    ///
    /// ```no_run
    /// # use kafkapipe::reader::{Reader, StartOffset, TopicPartition};
    /// # fn demo(reader: &Reader) {
    /// reader.assign([(TopicPartition::new("events", 4), StartOffset::At(1000))]);
    /// # }
    /// ```
    pub fn assign(&self, partitions: impl IntoIterator<Item = (TopicPartition, StartOffset)>) {
        self.handle.assign(partitions);
    }

    /// See [`ReaderHandle::unassign`].
    ///
    /// ```no_run
    /// # use kafkapipe::reader::{Reader, TopicPartition};
    /// # fn demo(reader: &Reader) {
    /// reader.unassign(&[TopicPartition::new("events", 4)]);
    /// # }
    /// ```
    pub fn unassign(&self, partitions: &[TopicPartition]) {
        self.handle.unassign(partitions);
    }

    /// See [`ReaderHandle::assignment`].
    ///
    /// ```no_run
    /// # fn demo(reader: &kafkapipe::reader::Reader) {
    /// for tp in reader.assignment() { println!("{tp}"); }
    /// # }
    /// ```
    pub fn assignment(&self) -> Vec<TopicPartition> {
        self.handle.assignment()
    }

    /// See [`ReaderHandle::group_metadata`].
    ///
    /// ```no_run
    /// # async fn demo(
    /// #     reader: &kafkapipe::reader::Reader,
    /// #     writer: &mut kafkapipe::writer::TransactionalWriter,
    /// # ) -> kafkapipe::Result<()> {
    /// use kafkapipe::admin::TopicPartition;
    /// if let Some(meta) = reader.group_metadata() {
    ///     writer
    ///         .send_offsets_to_transaction([(TopicPartition::new("in", 0), 42)], &meta)
    ///         .await?;
    /// }
    /// # Ok(()) }
    /// ```
    pub fn group_metadata(&self) -> Option<crate::writer::GroupMetadata> {
        self.handle.group_metadata()
    }
}

/// Flow control, positions, lag and closing (as on [`ReaderHandle`]).
impl Reader {
    /// See [`ReaderHandle::pause`].
    ///
    /// ```no_run
    /// # use kafkapipe::reader::{Reader, TopicPartition};
    /// # fn demo(reader: &Reader) {
    /// reader.pause(&[TopicPartition::new("events", 2)]);
    /// # }
    /// ```
    pub fn pause(&self, partitions: &[TopicPartition]) {
        self.handle.pause(partitions);
    }

    /// See [`ReaderHandle::resume`].
    ///
    /// ```no_run
    /// # use kafkapipe::reader::{Reader, TopicPartition};
    /// # fn demo(reader: &Reader) {
    /// reader.resume(&[TopicPartition::new("events", 2)]);
    /// # }
    /// ```
    pub fn resume(&self, partitions: &[TopicPartition]) {
        self.handle.resume(partitions);
    }

    /// See [`ReaderHandle::paused`].
    ///
    /// ```no_run
    /// # fn demo(reader: &kafkapipe::reader::Reader) {
    /// println!("{:?}", reader.paused());
    /// # }
    /// ```
    pub fn paused(&self) -> Vec<TopicPartition> {
        self.handle.paused()
    }

    /// See [`ReaderHandle::seek`].
    ///
    /// ```no_run
    /// # fn demo(reader: &kafkapipe::reader::Reader) -> kafkapipe::Result<()> {
    /// reader.seek("events", 0, 42)?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As for [`ReaderHandle::seek`].
    pub fn seek(&self, topic: &str, partition: i32, offset: i64) -> Result<()> {
        self.handle.seek(topic, partition, offset)
    }

    /// See [`ReaderHandle::seek_to_time`].
    ///
    /// ```no_run
    /// # fn demo(reader: &kafkapipe::reader::Reader) -> kafkapipe::Result<()> {
    /// reader.seek_to_time("events", 0, 1_700_000_000_000)?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As for [`ReaderHandle::seek`].
    pub fn seek_to_time(&self, topic: &str, partition: i32, timestamp_ms: i64) -> Result<()> {
        self.handle.seek_to_time(topic, partition, timestamp_ms)
    }

    /// See [`ReaderHandle::position`].
    ///
    /// ```no_run
    /// # fn demo(reader: &kafkapipe::reader::Reader) {
    /// println!("{:?}", reader.position("events", 0));
    /// # }
    /// ```
    pub fn position(&self, topic: &str, partition: i32) -> Option<i64> {
        self.handle.position(topic, partition)
    }

    /// See [`ReaderHandle::lag`].
    ///
    /// ```no_run
    /// # fn demo(reader: &kafkapipe::reader::Reader) {
    /// println!("lag {}", reader.lag());
    /// # }
    /// ```
    pub fn lag(&self) -> i64 {
        self.handle.lag()
    }

    /// See [`ReaderHandle::partition_lag`].
    ///
    /// ```no_run
    /// # fn demo(reader: &kafkapipe::reader::Reader) {
    /// println!("{:?}", reader.partition_lag("events", 0));
    /// # }
    /// ```
    pub fn partition_lag(&self, topic: &str, partition: i32) -> Option<i64> {
        self.handle.partition_lag(topic, partition)
    }

    /// See [`ReaderHandle::read_lag`].
    ///
    /// ```no_run
    /// # async fn demo(reader: &kafkapipe::reader::Reader) -> kafkapipe::Result<()> {
    /// println!("lag {}", reader.read_lag().await?);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As for [`ReaderHandle::read_lag`].
    ///
    /// # Cancellation safety
    ///
    /// Cancel safe: it only reads.
    pub async fn read_lag(&self) -> Result<i64> {
        self.handle.read_lag().await
    }

    /// See [`ReaderHandle::stats`].
    ///
    /// ```no_run
    /// # fn demo(reader: &kafkapipe::reader::Reader) {
    /// assert!(reader.stats().queue_length <= reader.stats().queue_capacity + 100_000);
    /// # }
    /// ```
    pub fn stats(&self) -> ReaderStats {
        self.handle.stats()
    }

    /// Close the reader: the stream ends, fetching stops, a group reader waits for what
    /// it yielded to be processed, commits and leaves the group — see
    /// [`ReaderHandle::close`], which this is. Dropping a group reader without closing it
    /// is a crash as far as the group knows: no final commit, and its partitions move
    /// only after the session timeout.
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
    /// As for [`ReaderHandle::close`].
    pub async fn close(&mut self) {
        self.handle.close().await;
    }
}

/// The partitions of `topic`, retrying transient errors (e.g. `LeaderNotAvailable` right
/// after the topic was created, a broker restarting) with the read backoff for up to
/// `retry_timeout`.
async fn topic_partitions(
    cluster: &Cluster,
    config: &ReaderConfig,
    topic: &str,
) -> Result<Vec<i32>> {
    let mut streak = retry::Streak::default();
    let limit = retry::WarnLimit::default();
    loop {
        match cluster.partitions(topic).await {
            Ok(p) => return Ok(p),
            Err(e) if !retry::is_fatal(&e) => {
                let now = std::time::Instant::now();
                let (backoff, expired) = streak.fail(now, config);
                if expired {
                    return Err(e);
                }
                let failures = streak.failures;
                match limit.permit(now) {
                    Some(suppressed) => {
                        tracing::warn!(topic, failures, suppressed, error = %e, "listing partitions failed; retrying")
                    }
                    None => {
                        tracing::debug!(topic, failures, error = %e, "listing partitions failed; retrying")
                    }
                }
                cluster.invalidate(topic);
                tokio::time::sleep(backoff).await;
            }
            Err(e) => return Err(e),
        }
    }
}

impl Drop for Reader {
    fn drop(&mut self) {
        self.handle.tasks.dropped();
    }
}

impl Stream for Reader {
    type Item = Result<Message>;

    #[inline]
    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        // Lent messages need no lock while nothing recalled them.
        this.poll_lent(cx, |m| Some(Ok(m)), |this, cx| this.poll_locked(cx))
    }
}

impl Reader {
    /// The body of `poll_next` and `next_message`: a lent message if there is one (made
    /// into the caller's item type by `lent`, so it is moved once), else `locked`.
    #[inline]
    fn poll_lent<T>(
        &mut self,
        cx: &mut Context<'_>,
        lent: impl FnOnce(Message) -> T,
        locked: impl FnOnce(&mut Self, &mut Context<'_>) -> Poll<T>,
    ) -> Poll<T> {
        // Tokio's cooperative budget: a consumer loop over a full buffer would otherwise
        // never yield, starving the fetch and group tasks on a current-thread runtime.
        let coop = std::task::ready!(tokio::task::coop::poll_proceed(cx));
        if let Some(g) = &self.handle.group {
            // Every token dropped before this poll now counts as processed.
            g.pulse.polled();
        }
        if self.loan.ready(&self.lent) {
            if self.lent.starved.load(Ordering::Relaxed) {
                self.wake_if_freed();
            }
            // Taken last, so the message moves from the loan into the return value once.
            if let Some(m) = self.loan.take() {
                coop.made_progress();
                return Poll::Ready(lent(m));
            }
        }
        let item = locked(self, cx);
        if item.is_ready() {
            coop.made_progress();
        }
        item
    }
}

impl Reader {
    /// The fetch task waits for buffer space: wake it if the last lent message made some.
    #[cold]
    fn wake_if_freed(&self) {
        let shared = &self.handle.shared;
        if !shared.lock().full(&shared.config) {
            shared.wake_task.notify_one();
        }
    }

    /// `poll_next` under the lock: settle the loan, then the next error or message.
    #[inline(never)]
    fn poll_locked(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Message>>> {
        let shared = &self.handle.shared;
        let mut st = shared.lock();
        let was_full = st.full(&shared.config);
        st.settle(&mut self.loan);
        if st.closed {
            return Poll::Ready(None);
        }
        let item = loop {
            if let Some(e) = st.errors.pop_front() {
                break Some(Err(e));
            }
            match st.pop_or_inflate(Some(&mut self.loan)) {
                Popped::Message(m) => break Some(Ok(m)),
                // A record that does not decode queues its error instead of a message.
                Popped::Nothing => break st.errors.pop_front().map(Err),
                // Decompressed without the lock, which the fetch task and the handles
                // take meanwhile; a batch stale by then is dropped by `install`.
                Popped::Inflate(job) => {
                    drop(st);
                    let result = job.run();
                    st = shared.lock();
                    st.install(job, result);
                    if st.closed {
                        return Poll::Ready(None);
                    }
                }
            }
        };
        if st.has_decode_errors() {
            for e in st.take_decode_errors() {
                shared.counters.errors.fetch_add(1, Ordering::Relaxed);
                shared.counters.last_error.set(&e);
            }
        }
        // `starved` is read under the lock the fetch task set it under: a lent message that
        // freed space unseen by the lock-free check above is caught here at the latest,
        // before the consumer could wait.
        let freed =
            (was_full || st.lent.starved.load(Ordering::Relaxed)) && !st.full(&shared.config);
        if item.is_none() && st.ended {
            return Poll::Ready(None);
        }
        if item.is_none() {
            match &st.consumer {
                Some(w) if w.will_wake(cx.waker()) => {}
                _ => st.consumer = Some(cx.waker().clone()),
            }
        }
        drop(st);
        if freed {
            shared.wake_task.notify_one();
        }
        if item.is_some() {
            return Poll::Ready(item);
        }
        if let Some(g) = &self.handle.group {
            g.pulse.park(cx.waker());
        }
        Poll::Pending
    }
}

#[cfg(test)]
mod tests;
