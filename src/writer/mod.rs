//! The producer: [`Writer`], a batching, backpressured `futures::Sink<Message>`.
//!
//! A port of kafka-go's `Writer` onto a `Sink`:
//!
//! * [`start_send`](futures::Sink::start_send) hands the message to a background task,
//!   which assigns its partition (the message's own, or the configured [`Balancer`]'s
//!   choice) and appends it to that partition's open batch. A batch is sealed when it
//!   holds [`WriterConfig::batch_size`] messages or [`WriterConfig::batch_bytes`] bytes, or
//!   [`WriterConfig::batch_timeout`] after its first message (a timer per open batch).
//!   Large messages (512 bytes or more) are appended only while the batches sealed and
//!   not yet acknowledged hold less than two batches' worth (at least 2 MiB), or their
//!   partition has none: otherwise they wait as they are, in order, and are encoded as
//!   acknowledgements make room (see [`WriterConfig::max_buffered_bytes`]). In an
//!   uncompressed batch a value of 8 KiB or more is not copied: the batch holds the
//!   message's own [`Bytes`](bytes::Bytes) until it is acknowledged, and the produce
//!   request writes it from there (a vectored write; see [`crate::record::BatchBytes`]).
//! * The sealed batches of all partitions led by one broker travel in **one** produce
//!   request (as the Java client and franz-go do; kafka-go sends one per partition) of at
//!   most [`WriterConfig::max_request_bytes`] (the rest go in the next request), with
//!   at most [`WriterConfig::max_in_flight_per_broker`] requests in flight per broker and
//!   at most [`WriterConfig::max_in_flight_per_partition`] batches (5) in flight per
//!   partition, queued on one connection in order; with idempotence (the default),
//!   per-partition order survives retries.
//! * [`poll_ready`](futures::Sink::poll_ready) is pending while the bytes accepted but not
//!   yet acknowledged exceed [`WriterConfig::max_buffered_bytes`]; acknowledgements wake it.
//!   It also waits while the background task is more than 4096 messages behind taking
//!   what was accepted (the task wakes it as it catches up), and while it holds 16384
//!   messages waiting for metadata (a topic's first lookup, or a partition it does not
//!   know yet): nothing of theirs can be sent before it comes, and a message waits as
//!   its whole struct, twice what it takes once encoded.
//! * [`poll_ready`](futures::Sink::poll_ready) also returns, once, the first delivery
//!   failure among the messages accepted since the last flush, so a `forward` stops soon
//!   after a message fails for good rather than at the final flush (which reports it too).
//! * [`poll_flush`](futures::Sink::poll_flush) seals every open batch and resolves when
//!   every message accepted since the previous flush is acknowledged (per
//!   [`WriterConfig::required_acks`]), or with the first delivery error, which names the
//!   topic and partition. [`poll_close`](futures::Sink::poll_close) flushes, then stops
//!   the background task and closes the broker connections.
//! * A `Writer` is `Clone`: each clone is a sink of its own (its own flush) over the same
//!   task, so several pipelines can `forward` into one writer; the last open clone's
//!   close stops the task. [`Writer::handle`] gives a [`WriterHandle`] that closes the
//!   writer for every clone from outside (every accepted message is delivered, later
//!   sends fail with a closed error) and reads the stats.
//! * Retriable errors (`NotLeaderOrFollower`, `LeaderNotAvailable`, timeouts, broken
//!   connections, a broker that is down, a topic not in metadata yet, …) mark the topic's
//!   metadata stale and retry the batch after an exponential backoff until the message's
//!   [`WriterConfig::delivery_timeout`] (120 s from acceptance, as Java's
//!   `delivery.timeout.ms`) expires, so a leader election or broker restart is ridden
//!   out; [`WriterConfig::max_attempts`] optionally bounds the sends too. Other errors
//!   (`MessageTooLarge`, authorization, invalid records, …) fail exactly the messages of
//!   the affected batch. A message larger than `batch_bytes` is rejected on its own with
//!   `MessageTooLarge` before anything is sent; a batch the broker rejects as too large
//!   (its limit below `batch_bytes`) is split in halves and resent, down to single
//!   messages, as the Java client does.
//! * Topic metadata is looked up again after [`WriterConfig::metadata_max_age`] (30 s),
//!   so balanced messages reach partitions added meanwhile; a message for a partition
//!   the cached metadata lacks refreshes it first, and fails only if it is still missing.
//! * [`Writer::deliveries`] optionally reports each message's offset or error as a
//!   `Stream`; [`Writer::produce`] (also on [`WriterHandle`]) writes one message and
//!   resolves to its own partition and offset, for request/response callers;
//!   [`Writer::stats`] gives counters like kafka-go's `WriterStats`.
//!
//! Idempotence is on by default with `acks=all`, as in the Java client since 3.0 (see
//! [`WriterConfig::idempotent`]; asking for `acks` 0 or 1 turns it off unless it was
//! asked for explicitly, which is then a configuration error). The writer obtains a
//! producer id and stamps each batch with its partition's next sequence number when it is
//! first sent (a retry resends the same bytes), so the broker drops the duplicates; a
//! retried batch goes out again before any later batch of its partition. Without
//! idempotence a retry after a lost response can write a batch twice, and with more than
//! one batch in flight a retried batch can land after a later one, as with kafka-go and
//! the Java client with `enable.idempotence=false`.
//!
//! Recovery follows the Java client (KIP-360): when a broker has lost the producer's
//! state (`UNKNOWN_PRODUCER_ID`), reports a real gap (`OUT_OF_ORDER_SEQUENCE_NUMBER` for
//! the next expected batch), or rejects a batch for good, the writer bumps its producer
//! epoch locally (a new producer id only once the epoch is exhausted) and renumbers that
//! partition's unfinished batches from 0; out-of-order answers for batches behind a
//! missing one are just retried after it. A batch given up while its fate is unknown (a
//! broken response, a timeout) leaves its partition's sequence unresolved: the partition
//! takes no new batch until the batches before it are done, and then bumps the epoch
//! unless a later batch proved it written. Transactional writers keep one batch per
//! partition in flight; a failure there makes the transaction abortable, and the epoch
//! is bumped by InitProducerId after the abort.
//!
//! ```no_run
//! use futures::{stream, SinkExt, StreamExt};
//! use kafkapipe::writer::{Message, Writer, WriterConfig};
//!
//! # async fn demo() -> kafkapipe::Result<()> {
//! let mut writer = Writer::new(WriterConfig::new(["127.0.0.1:9092"]).topic("events"))?;
//! let messages = (0..1000).map(|i| Ok(Message::keyed(format!("k{}", i % 10), format!("v{i}"))));
//! stream::iter(messages).forward(&mut writer).await?;
//! writer.close().await?;
//! # Ok(()) }
//! ```

mod accumulator;
mod balancer;
mod config;
mod flush;
mod message;
mod metadata;
#[cfg(feature = "metrics")]
mod metrics;
mod producer;
mod sender;
mod shared;
mod task;
mod timer;
mod transactional;
mod txn;
// The transactional writer's unit tests run against MockCluster.
#[cfg(all(test, feature = "mock"))]
mod txn_tests;

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll, Waker};

use tokio::sync::{mpsc, oneshot, Notify};

pub use balancer::{Balancer, Crc32, Hash, LeastBytes, Murmur2, ReferenceHash, RoundRobin, Sticky};
pub use config::{TransactionProtocol, WriterConfig};
// The exactly-once pipeline sits above the reader and the writer (DESIGN.md, "Layers");
// its types keep their public paths here.
pub use crate::eos::{ExactlyOnceSink, PipelineConfig, PipelineStats};
pub use message::Message;
pub use transactional::{GroupMetadata, TransactionalWriter};
pub use txn::TransactionState;

use crate::ack::HeldAck;
use crate::cluster::Cluster;
use crate::coordinator::Coordinator;
use crate::error::{Error, Result};
use accumulator::Msg;
pub(crate) use flush::Group;
use shared::*;
use task::{Cmd, Task};

/// What [`WriterConfig::max_buffered_bytes`] counts for each message beyond its
/// [`Message::size`]: the memory of the message itself, so that the bound is one on memory
/// and not only on payload (a 32 MiB bound held over 300 000 messages of 100 bytes, and
/// several times that in memory).
pub(crate) const MESSAGE_OVERHEAD: usize = std::mem::size_of::<Message>();

/// The outcome of one message, from [`Writer::deliveries`].
#[derive(Debug, Clone)]
pub struct Delivery {
    /// The message, with `topic`, `partition` and `timestamp` filled in as written.
    pub message: Message,
    /// The offset the broker gave it (`-1` with [`RequiredAcks::None`](crate::conn::RequiredAcks::None)),
    /// or why it failed.
    pub result: Result<i64>,
}

/// The stream of delivery reports returned by [`Writer::deliveries`].
///
/// A report's message stays counted against [`WriterConfig::max_buffered_bytes`] until the
/// report is taken from this stream, so a writer whose reports are not consumed stops
/// accepting messages (backpressure instead of an unbounded queue). Dropping the stream
/// ends reporting and frees what it held. It ends after the writer is closed (or dropped)
/// and every report was taken.
pub struct Deliveries {
    rx: mpsc::UnboundedReceiver<(Delivery, usize)>,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Deliveries {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Deliveries").finish_non_exhaustive()
    }
}

impl futures::Stream for Deliveries {
    type Item = Delivery;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Delivery>> {
        let this = self.get_mut();
        match ready!(this.rx.poll_recv(cx)) {
            Some((delivery, size)) => {
                this.shared.release(size);
                Poll::Ready(Some(delivery))
            }
            None => Poll::Ready(None),
        }
    }
}

impl Drop for Deliveries {
    fn drop(&mut self) {
        self.rx.close();
        while let Ok((_, size)) = self.rx.try_recv() {
            self.shared.release(size);
        }
    }
}

/// A snapshot of a writer's counters (cumulative since the writer was created), like
/// kafka-go's `WriterStats`; see [`Writer::stats`].
///
/// ```no_run
/// # fn demo(writer: &kafkapipe::writer::Writer) {
/// let s = writer.stats();
/// let mean_batch = s.messages as f64 / s.batches.max(1) as f64;
/// println!("{} messages in {} requests, {mean_batch:.1} per batch", s.messages, s.writes);
/// # }
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WriterStats {
    /// Produce requests sent.
    pub writes: u64,
    /// Record batches acknowledged.
    pub batches: u64,
    /// Messages acknowledged.
    pub messages: u64,
    /// Bytes (see [`Message::size`]) of acknowledged messages.
    pub bytes: u64,
    /// Messages that failed for good.
    pub errors: u64,
    /// Batch retries after retriable errors.
    pub retries: u64,
    /// Bytes accepted and not yet acknowledged or failed, each message counting its
    /// [`Message::size`] plus the size of the message struct (the backpressure gauge of
    /// [`WriterConfig::max_buffered_bytes`]).
    pub buffered_bytes: u64,
    /// Messages accepted and not yet acknowledged or failed (kafka-go `QueueLength`).
    pub queued_messages: u64,
    /// Largest acknowledged batch, in messages.
    pub batch_messages_max: u64,
    /// Largest acknowledged batch, in encoded (possibly compressed) bytes.
    pub batch_bytes_max: u64,
    /// Encoded bytes of all acknowledged batches (divide by `batches` for the mean).
    pub batch_bytes_total: u64,
    /// Mean time from sending a produce request to its answer.
    pub write_time_avg: std::time::Duration,
    /// Longest time from sending a produce request to its answer.
    pub write_time_max: std::time::Duration,
    /// Mean quota throttle time the brokers reported in produce responses, over every
    /// answered produce request (Java `produce-throttle-time-avg`). While a broker
    /// throttles a connection, nothing more is sent on it (KIP-219, see
    /// [`Connection::throttled_until`](crate::conn::Connection::throttled_until)), so
    /// a producer over its quota writes at about the quota's rate.
    pub throttle_time_avg: std::time::Duration,
    /// Longest quota throttle time reported in a produce response (Java
    /// `produce-throttle-time-max`).
    pub throttle_time_max: std::time::Duration,
    /// Mean time a batch waited in the writer before it was first sent: from when its
    /// oldest message was accepted (a message fed to the sink: when the writer's task
    /// took it off its queue, a moment later) to the produce request that carried it,
    /// over every batch sent (Java `record-queue-time-avg`). Linger, a full in-flight
    /// window, a metadata lookup or a producer id all count.
    pub queue_time_avg: std::time::Duration,
    /// Longest such wait of a batch (Java `record-queue-time-max`).
    pub queue_time_max: std::time::Duration,
}

type SpaceFuture = Pin<Box<dyn Future<Output = ()> + Send + Sync>>;

/// A batching, backpressured Kafka producer; see the [module docs](self).
///
/// Use it as a `Sink<Message>` (with `futures::SinkExt`: `send`, `send_all`,
/// `stream.forward(writer)`), or call [`Writer::write_messages`], which may be used
/// concurrently from many tasks through `&Writer`.
///
/// Dropping a writer without closing it lets the background task deliver what was
/// accepted and then end; nobody learns about failures. Close it to be sure.
///
/// # Sharing
///
/// A writer is `Clone`: each clone is a sink of its own over the same background task
/// (batches, connections and buffer bound are shared), so several pipelines can
/// `forward` into one writer. A clone's `flush` waits for the messages *it* accepted;
/// its `close` flushes them and retires the clone, and the last open clone's close stops
/// the writer (the task delivers what is pending and closes the connections), like
/// dropping the last sender of a channel. To stop every clone at once from outside —
/// a Ctrl-C handler, say — use [`Writer::handle`] and [`WriterHandle::close`].
///
/// ```no_run
/// use futures::SinkExt;
/// use kafkapipe::writer::{Message, Writer, WriterConfig};
///
/// # async fn demo() -> kafkapipe::Result<()> {
/// let mut writer = Writer::new(WriterConfig::new(["127.0.0.1:9092"]).topic("events"))?;
/// writer.send(Message::keyed("k", "v")).await?; // send = feed + flush: waits for the ack
/// writer.feed(Message::new("batched")).await?; // feed: only waits for buffer space
/// writer.flush().await?;
/// writer.close().await?;
/// assert_eq!(writer.stats().messages, 2);
/// # Ok(()) }
/// ```
///
/// # Cancellation safety
///
/// What happens to a message when the future driving the sink (`send`, `feed`, `flush`,
/// `close`, `send_all`, `forward`, or a `select!`/`timeout` around one) is dropped
/// depends only on whether the writer had *accepted* it, that is whether
/// [`start_send`](futures::Sink::start_send) had taken it:
///
/// - **Not accepted yet** — the future was waiting in
///   [`poll_ready`](futures::Sink::poll_ready) for buffer space (a `send`/`feed` future,
///   or the item `send_all`/`forward` took from its stream and holds): the message is
///   dropped with the future and never written. Its [`AckToken`](crate::group::AckToken),
///   if it carries one, is dropped too, and a dropped token counts as processed once the
///   reader is polled again — so the consumed message it came from **may be committed
///   without having been written**. Where a send can be cancelled, wait for space first
///   and hand the message over only once the writer is ready (below), or fail the token
///   yourself when you give up on a message.
/// - **Accepted** — `start_send` is synchronous and hands the message to the background
///   task: from then on it is delivered (retried until
///   [`WriterConfig::delivery_timeout`]) whether or not any future is polled, even if
///   this `Writer` is dropped; its token is acked when the broker acknowledges it and
///   failed otherwise. Dropping the future only means nobody awaits the outcome here.
/// - **`poll_flush`** (`flush`, and the flush inside `send`, `send_all`, `forward` and
///   `close`): the flush under way — the messages it waits for, and the task's order to
///   seal their batches — is kept in the `Writer`, not in the future, so after a dropped
///   flush the next `flush` or `close` of this clone resumes it and still returns its
///   first delivery error. Nothing is lost or sent twice; batches are sealed after
///   [`WriterConfig::batch_timeout`] anyway.
/// - **`poll_close`**: it flushes as above (a close dropped during that flush leaves
///   this clone open, to be closed again); then this clone is closed and, if it was the
///   last open one, the writer stops accepting messages and its task is told to deliver
///   what it holds and stop, before the first wait. A close dropped after that goes on
///   without it; closing again only waits.
///
/// Waiting for space without putting a message at stake, then sending without an await:
///
/// ```no_run
/// use std::time::Duration;
/// use futures::{future::poll_fn, SinkExt};
/// use kafkapipe::writer::{Message, Writer};
///
/// # async fn demo(writer: &mut Writer, message: Message) -> kafkapipe::Result<()> {
/// let ready = tokio::time::timeout(Duration::from_secs(5), poll_fn(|cx| writer.poll_ready_unpin(cx)));
/// match ready.await {
///     Ok(r) => {
///         r?;
///         writer.start_send_unpin(message)?; // accepted: delivered whatever happens next
///     }
///     Err(_) => message.ack.fail(), // timed out: not written, so not committed either
/// }
/// # Ok(()) }
/// ```
pub struct Writer {
    shared: Arc<Shared>,
    sink_group: Option<Arc<Group>>,
    /// Messages accepted into `sink_group`: the group learns the count when sealed.
    sink_count: usize,
    space: Option<SpaceFuture>,
    flushing: Option<oneshot::Receiver<Result<()>>>,
    /// The last open clone's close, stopping the task.
    closing: Option<SpaceFuture>,
    close_result: Option<Result<()>>,
    /// This clone is closed.
    closed: bool,
}

impl Clone for Writer {
    /// Another sink over the same background task (see [Sharing](Writer#sharing)).
    ///
    /// ```no_run
    /// use futures::{stream, StreamExt};
    /// use kafkapipe::writer::{Message, Writer, WriterConfig};
    /// # async fn demo() -> kafkapipe::Result<()> {
    /// let writer = Writer::new(WriterConfig::new(["127.0.0.1:9092"]).topic("events"))?;
    /// let a = stream::iter(["a1", "a2"]).map(|v| Ok(Message::new(v))).forward(writer.clone());
    /// let b = stream::iter(["b1", "b2"]).map(|v| Ok(Message::new(v))).forward(writer);
    /// let (a, b) = futures::join!(a, b); // the last of them to close stops the writer
    /// a?;
    /// b?;
    /// # Ok(()) }
    /// ```
    fn clone(&self) -> Self {
        self.shared.writers.fetch_add(1, Ordering::AcqRel);
        Writer::attach(self.shared.clone())
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        // The last open clone gone: the task delivers what it has and ends.
        if !self.closed && self.shared.detach() {
            self.shared.close_queue(None);
        }
    }
}

/// A cloneable handle to a [`Writer`] (from [`Writer::handle`]) that closes it from
/// outside the sinks that use it, and reads its stats. It does not keep the writer open:
/// when every clone of the writer is closed or dropped, the writer stops as usual.
///
/// ```no_run
/// use futures::{stream, StreamExt};
/// use kafkapipe::writer::{Message, Writer, WriterConfig};
/// # async fn demo() -> kafkapipe::Result<()> {
/// let writer = Writer::new(WriterConfig::new(["127.0.0.1:9092"]).topic("events"))?;
/// let handle = writer.handle();
/// tokio::spawn(async move {
///     let _ = tokio::signal::ctrl_c().await;
///     handle.close().await; // the forward below fails with a closed error
/// });
/// let endless = stream::repeat_with(|| Ok(Message::new("tick")));
/// let e = endless.forward(writer).await.unwrap_err();
/// assert!(e.is_closed());
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct WriterHandle {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for WriterHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WriterHandle")
            .field("stats", &self.stats())
            .field("closed", &self.is_closed())
            .finish()
    }
}

impl WriterHandle {
    /// Close the writer for every clone: from now on sends (`poll_ready`, `start_send`,
    /// [`Writer::write_messages`]) fail with a closed error; every message accepted
    /// before is delivered (retried as usual) and the task stops, closing its
    /// connections — this returns then. Each clone's `flush` still reports the outcome of
    /// the messages it accepted, and [`Writer::deliveries`] reports every message; a
    /// delivery failure is not returned here. Closing again, or concurrently, waits for
    /// the same end.
    ///
    /// ```no_run
    /// # async fn demo(handle: kafkapipe::writer::WriterHandle) {
    /// handle.close().await;
    /// assert!(handle.is_closed());
    /// # }
    /// ```
    ///
    /// # Cancellation safety
    ///
    /// Once started the close goes on without this future: dropping it only stops the
    /// waiting.
    pub async fn close(&self) {
        self.shared.clone().close_all().await;
    }

    /// Whether the writer no longer accepts messages: closed (by a handle or its last
    /// open clone), every clone dropped, or its task gone.
    ///
    /// ```no_run
    /// # fn demo(handle: &kafkapipe::writer::WriterHandle) {
    /// if handle.is_closed() { println!("writer closed"); }
    /// # }
    /// ```
    pub fn is_closed(&self) -> bool {
        !self.shared.accepting()
    }

    /// Write one message and wait for its partition and offset, as
    /// [`Writer::produce`] (which see) — from a handle, which is `Clone` and does not keep
    /// the writer open: once every clone of the writer is closed or dropped this fails
    /// with a closed error.
    ///
    /// ```no_run
    /// use kafkapipe::writer::{Message, WriterHandle};
    /// # async fn demo(handle: WriterHandle) -> kafkapipe::Result<()> {
    /// let (partition, offset) = handle.produce(Message::keyed("order-7", "paid")).await?;
    /// println!("stored at {partition}/{offset}");
    /// # Ok(()) }
    /// ```
    ///
    /// # Cancellation safety
    ///
    /// As for [`Writer::produce`]: once the message is accepted, dropping the future
    /// loses only its report; the message is still delivered.
    pub async fn produce(&self, msg: Message) -> Result<(i32, i64)> {
        self.shared.clone().produce(msg).await
    }

    /// The writer's counters, over every clone.
    ///
    /// ```no_run
    /// # fn demo(handle: &kafkapipe::writer::WriterHandle) {
    /// println!("{} messages written", handle.stats().messages);
    /// # }
    /// ```
    pub fn stats(&self) -> WriterStats {
        self.shared.stats()
    }
}

impl std::fmt::Debug for Writer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Writer")
            .field("stats", &self.stats())
            .field("closed", &self.closed)
            .finish()
    }
}

fn closed_error() -> Error {
    Error::closed("writer is closed")
}

impl Writer {
    /// Start a writer: validates `config` and spawns its background task on the current
    /// Tokio runtime. Brokers are contacted on the first message.
    ///
    /// # Errors
    ///
    /// `Config` for an invalid configuration, one with a
    /// [`transactional_id`](WriterConfig::transactional_id) (that is for
    /// [`TransactionalWriter`]), or when called outside a Tokio runtime.
    pub fn new(config: WriterConfig) -> Result<Writer> {
        if config.transactional_id.is_some() {
            return Err(Error::config(
                "WriterConfig::transactional_id is set: use TransactionalWriter::new",
            ));
        }
        Writer::start(Arc::new(config), None).map(|(w, _, _)| w)
    }

    /// Validate `config`, spawn the task; for a transactional writer (`txn`) also the
    /// transaction coordinator it shares with the task.
    #[allow(clippy::type_complexity)]
    fn start(
        config: Arc<WriterConfig>,
        txn: Option<Arc<txn::TxnShared>>,
    ) -> Result<(Writer, Cluster, Option<Arc<Coordinator>>)> {
        config.validate()?;
        let handle = tokio::runtime::Handle::try_current()
            .map_err(|_| Error::config("Writer::new must be called within a Tokio runtime"))?;
        let cluster = Cluster::new(config.brokers.clone(), config.connection_config())?
            .with_auto_create_topics(config.allow_auto_topic_creation)
            .with_metadata_max_age(config.metadata_max_age);
        let shared = Arc::new(Shared::new(config.max_buffered_bytes));
        shared.writers.store(1, Ordering::Release);
        let mut task = Task::new(config.clone(), cluster.clone(), shared.clone());
        let coordinator = txn.map(|txn| {
            let coordinator = Arc::new(Coordinator::transaction(
                txn.id.to_string(),
                cluster.clone(),
                config.connection.request_timeout,
            ));
            task.set_txn(txn, coordinator.clone());
            coordinator
        });
        #[cfg(feature = "metrics")]
        let task = {
            // the collector publishes a last time when the task has ended
            let (ended, done) = tokio::sync::oneshot::channel::<()>();
            metrics::spawn(&shared, &cluster, &config, async move {
                let _ = done.await;
            });
            let run = task.run();
            async move {
                run.await;
                drop(ended);
            }
        };
        #[cfg(not(feature = "metrics"))]
        let task = task.run();
        handle.spawn(task);
        Ok((Writer::attach(shared), cluster, coordinator))
    }

    fn attach(shared: Arc<Shared>) -> Writer {
        Writer {
            shared,
            sink_group: None,
            sink_count: 0,
            space: None,
            flushing: None,
            closing: None,
            close_result: None,
            closed: false,
        }
    }

    /// A handle that closes this writer (every clone) from outside the sinks using it,
    /// and reads its stats; see [`WriterHandle`].
    ///
    /// ```no_run
    /// use kafkapipe::writer::{Writer, WriterConfig};
    /// # async fn demo() -> kafkapipe::Result<()> {
    /// let writer = Writer::new(WriterConfig::new(["127.0.0.1:9092"]).topic("events"))?;
    /// let handle = writer.handle();
    /// // ... writer (or clones of it) moved into pipelines ...
    /// handle.close().await;
    /// # Ok(()) }
    /// ```
    pub fn handle(&self) -> WriterHandle {
        WriterHandle {
            shared: self.shared.clone(),
        }
    }

    /// Write `msgs` and wait until all are acknowledged (kafka-go `WriteMessages`).
    /// Waits first while the buffer bound is exceeded; the call's messages are then
    /// accepted together (so one very large call can overshoot the bound). Messages are
    /// batched with
    /// everything else the writer is sending; the call returns after at most about
    /// [`WriterConfig::batch_timeout`] plus a round trip when nothing fails.
    ///
    /// # Errors
    ///
    /// The first delivery error among `msgs` (naming topic and partition); the other
    /// messages were still attempted. `Closed` if the writer was closed.
    ///
    /// ```no_run
    /// use kafkapipe::writer::{Message, Writer, WriterConfig};
    /// # async fn demo() -> kafkapipe::Result<()> {
    /// let writer = Writer::new(WriterConfig::new(["127.0.0.1:9092"]).topic("events"))?;
    /// writer.write_messages([Message::new("one"), Message::new("two")]).await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Cancellation safety
    ///
    /// Dropped while it waits for buffer space (the only wait before the messages are
    /// accepted), the call drops `msgs` unwritten — with their
    /// [`AckToken`](crate::group::AckToken)s, which then count as processed (see
    /// [Cancellation safety](Writer#cancellation-safety)). Once accepted, every message is
    /// delivered even if the call is dropped, and its token is acked or failed by the
    /// outcome; only the returned error is lost ([`Writer::deliveries`] still reports
    /// each message).
    pub async fn write_messages<I>(&self, msgs: I) -> Result<()>
    where
        I: IntoIterator<Item = Message>,
    {
        let msgs: Vec<Message> = msgs.into_iter().collect();
        if msgs.is_empty() {
            return Ok(());
        }
        if self.closed || !self.shared.accepting() {
            return Err(closed_error());
        }
        self.shared.clone().wait_for_space().await;
        if !self.shared.accepting() {
            return Err(closed_error());
        }
        let group = Group::open();
        let (tx, rx) = oneshot::channel();
        group.seal(msgs.len(), tx);
        let accepted = std::time::Instant::now();
        let batch: Vec<Msg> = msgs
            .into_iter()
            .map(|mut msg| {
                let size = msg.size();
                self.shared.reserve(size);
                Msg {
                    ack: HeldAck::new(std::mem::take(&mut msg.ack)),
                    msg,
                    size,
                    group: group.clone(),
                    accepted,
                }
            })
            .collect();
        drop(group);
        if let Err(cmd) = self.shared.send(Cmd::Batch(batch)) {
            if let Cmd::Batch(batch) = *cmd {
                self.shared
                    .release_messages(batch.len(), batch.iter().map(|m| m.size).sum());
            }
            return Err(closed_error());
        }
        rx.await.unwrap_or_else(|_| Err(closed_error()))
    }

    /// Write one message and wait for its outcome: the partition and offset the broker
    /// stored it at, or the error it failed with (for request/response services that
    /// answer once their record is stored; rust-rdkafka's `FutureProducer::send`,
    /// franz-go's `ProduceSync` for one record). The message is batched with everything
    /// else the writer sends, so many concurrent calls (from `&Writer`, or from
    /// [`WriterHandle`]s in other tasks) share batches and requests. The offset is `-1`
    /// with [`RequiredAcks::None`](crate::conn::RequiredAcks::None). This works whether
    /// or not [`Writer::deliveries`] is taken (the message is reported there too).
    ///
    /// Named `produce`, not `send`: `futures::SinkExt::send` is the `Sink`'s (it flushes
    /// every message this clone accepted, and tells no offset).
    ///
    /// ```no_run
    /// use kafkapipe::writer::{Message, Writer, WriterConfig};
    /// # async fn demo() -> kafkapipe::Result<()> {
    /// let writer = Writer::new(WriterConfig::new(["127.0.0.1:9092"]).topic("orders"))?;
    /// let (partition, offset) = writer.produce(Message::keyed("order-7", "paid")).await?;
    /// println!("stored at {partition}/{offset}");
    /// // concurrent calls, each with its own answer
    /// let answers = futures::future::join_all(
    ///     (0..10).map(|i| writer.produce(Message::keyed(format!("order-{i}"), "new"))),
    /// )
    /// .await;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// The message's own delivery error (naming topic and partition): for example
    /// `MessageTooLarge`, an authorization failure, or the last retriable error once
    /// [`WriterConfig::delivery_timeout`] expired. `Closed` if the writer was closed
    /// before the message was accepted, or its task ended.
    ///
    /// # Cancellation safety
    ///
    /// The future does nothing until polled. At its first poll it waits for buffer space
    /// (as [`Writer::write_messages`] does), then hands the message to the writer:
    /// dropped during that wait, the message is dropped unsent (with its
    /// [`AckToken`](crate::group::AckToken), see
    /// [Cancellation safety](Writer#cancellation-safety)). Once handed over — at once
    /// when there is space — the message **is delivered whether or not the future is
    /// polled again**; dropping the future then loses only the report of where it went
    /// (or why it failed).
    pub async fn produce(&self, msg: Message) -> Result<(i32, i64)> {
        if self.closed {
            return Err(closed_error());
        }
        self.shared.clone().produce(msg).await
    }

    /// Report the outcome — offset or error — of every message accepted from now on, as a
    /// stream of [`Delivery`] (in acknowledgement order: per partition in write order,
    /// partitions interleaved). Calling it again replaces the previous stream, which then
    /// ends.
    ///
    /// ```no_run
    /// use futures::{SinkExt, StreamExt};
    /// use kafkapipe::writer::{Message, Writer, WriterConfig};
    ///
    /// # async fn demo() -> kafkapipe::Result<()> {
    /// let mut writer = Writer::new(WriterConfig::new(["127.0.0.1:9092"]).topic("events"))?;
    /// let mut deliveries = writer.deliveries();
    /// writer.send(Message::keyed("k", "v")).await?;
    /// let d = deliveries.next().await.expect("one report");
    /// println!("partition {:?} offset {}", d.message.partition, d.result?);
    /// # Ok(()) }
    /// ```
    pub fn deliveries(&self) -> Deliveries {
        let (tx, rx) = mpsc::unbounded_channel();
        let _ = self.shared.send(Cmd::Reports(tx));
        Deliveries {
            rx,
            shared: self.shared.clone(),
        }
    }

    /// The writer's counters (over every clone).
    ///
    /// ```no_run
    /// # fn demo(writer: &kafkapipe::writer::Writer) {
    /// println!("{} messages written", writer.stats().messages);
    /// # }
    /// ```
    pub fn stats(&self) -> WriterStats {
        self.shared.stats()
    }

    fn poll_space(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        loop {
            if self.shared.has_space() || self.shared.is_gone() {
                self.space = None;
                return Poll::Ready(());
            }
            let fut = self
                .space
                .get_or_insert_with(|| Box::pin(self.shared.clone().wait_for_space()));
            ready!(fut.as_mut().poll(cx));
            self.space = None;
        }
    }

    /// Wait for the flush in progress (if any), then flush what was accepted since, until
    /// every accepted message is done. Returns the first error.
    /// Also after the writer was closed from outside: those messages were accepted
    /// before the close, which delivers them. Should the task die, the messages it held
    /// are dropped with their flush groups, whose waiters then answer `Closed`.
    fn poll_flush_inner(&mut self, cx: &mut Context<'_>) -> Poll<Result<()>> {
        // The task ended without being closed (it panicked): nothing can be delivered.
        if self.shared.died() {
            self.flushing = None;
            self.sink_group = None;
            self.sink_count = 0;
            return Poll::Ready(Err(closed_error()));
        }
        loop {
            if let Some(rx) = self.flushing.as_mut() {
                let result = ready!(Pin::new(rx).poll(cx));
                self.flushing = None;
                result.unwrap_or_else(|_| Err(closed_error()))?;
            }
            let Some(group) = self.sink_group.take() else {
                return Poll::Ready(Ok(()));
            };
            let (tx, rx) = oneshot::channel();
            group.seal(std::mem::take(&mut self.sink_count), tx);
            tracing::debug!("writer flush");
            // Refused once closed: the close seals every batch anyway.
            let _ = self.shared.send(Cmd::Flush);
            self.flushing = Some(rx);
        }
    }
}

impl futures::Sink<Message> for Writer {
    type Error = Error;

    fn poll_ready(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<()>> {
        let this = self.get_mut();
        if this.closed || !this.shared.accepting() {
            return Poll::Ready(Err(closed_error()));
        }
        // Fail fast: a delivery failure among the messages accepted since the last flush
        // stops a `forward` at once instead of at the final flush.
        if let Some(e) = this.sink_group.as_ref().and_then(|g| g.surface_error()) {
            return Poll::Ready(Err(e));
        }
        // Take part in Tokio's cooperative budget: a producer whose stream is always ready
        // yields now and then, so the writer's task (and everything else on a
        // current-thread runtime) gets to run before the buffer bound is reached.
        let coop = ready!(tokio::task::coop::poll_proceed(cx));
        ready!(this.poll_space(cx));
        coop.made_progress();
        // Closed while waiting for space, or the task is gone (it panicked): nothing
        // would ever be delivered.
        if !this.shared.accepting() {
            return Poll::Ready(Err(closed_error()));
        }
        Poll::Ready(Ok(()))
    }

    fn start_send(self: Pin<&mut Self>, msg: Message) -> Result<()> {
        let this = self.get_mut();
        if this.closed {
            return Err(closed_error());
        }
        // The task counts the message's delivery timeout from when it takes it off the
        // queue (one clock read per batch of commands), and computes the same size.
        let size = msg.size();
        let group = this.sink_group.get_or_insert_with(Group::open);
        this.shared.reserve(size);
        if let Err(mut msg) = this.shared.send_msg(group, msg) {
            std::mem::take(&mut msg.ack).fail();
            this.shared.release_messages(1, size);
            return Err(closed_error());
        }
        this.sink_count += 1;
        Ok(())
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<()>> {
        self.get_mut().poll_flush_inner(cx)
    }

    fn poll_close(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<()>> {
        let this = self.get_mut();
        if !this.closed {
            let flushed = ready!(this.poll_flush_inner(cx));
            this.close_result = Some(flushed);
            this.closed = true;
            if this.shared.detach() {
                // the last open clone: stop the writer
                this.closing = Some(Box::pin(this.shared.clone().close_all()));
            }
        }
        if let Some(closing) = this.closing.as_mut() {
            ready!(closing.as_mut().poll(cx));
            this.closing = None;
        }
        Poll::Ready(this.close_result.take().unwrap_or(Ok(())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_outside_a_runtime_is_a_config_error() {
        let e = Writer::new(WriterConfig::new(["127.0.0.1:1"])).unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::Config);
    }

    #[test]
    fn group_reports_the_first_error_once_all_are_done() {
        let g = Group::open();
        let (tx, mut rx) = oneshot::channel();
        g.seal(3, tx);
        g.done(1, None);
        g.done(1, Some(&Error::config("first")));
        assert!(rx.try_recv().is_err(), "one message still pending");
        g.done(1, Some(&Error::config("second")));
        let e = rx.try_recv().unwrap().unwrap_err();
        assert_eq!(e.to_string(), "first");
    }

    #[test]
    fn sealing_an_empty_group_answers_at_once() {
        let g = Group::open();
        let (tx, mut rx) = oneshot::channel();
        g.seal(0, tx);
        assert!(rx.try_recv().unwrap().is_ok());
    }

    /// Senders wait while the task is `BACKLOG_MAX` commands behind, and are woken when
    /// it takes them; the queue hands them over in order, in segments.
    #[tokio::test]
    async fn a_full_backlog_waits_for_the_task_to_take_it() {
        let shared = Arc::new(Shared::new(usize::MAX));
        let group = Group::open();
        // The first message comes after its group's marker: BACKLOG_MAX commands in all.
        for i in 0..BACKLOG_MAX - 1 {
            assert!(shared.has_space(), "room before message {i}");
            let msg = Message::new(i.to_string());
            assert!(shared.send_msg(&group, msg).is_ok());
        }
        assert!(!shared.has_space(), "the backlog is full");
        let waiting = tokio::spawn(shared.clone().wait_for_space());
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        let mut segments = Vec::new();
        let waker = futures::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        assert!(shared.poll_take(&mut cx, &mut segments).is_ready());
        tokio::time::timeout(std::time::Duration::from_secs(5), waiting)
            .await
            .expect("the sender was not woken")
            .unwrap();
        assert!(shared.has_space());
        let mut values = segments.iter().flatten().filter_map(|c| match c {
            Cmd::One(m) => m.value.clone(),
            _ => None,
        });
        assert!(matches!(segments[0].first(), Some(Cmd::Group(_))));
        for i in 0..BACKLOG_MAX - 1 {
            assert_eq!(values.next().as_deref(), Some(i.to_string().as_bytes()));
        }
        assert_eq!(values.next(), None);
        shared.give_back(&mut segments);
        assert!(shared.queue().spare.len() <= SPARE_SEGMENTS);
    }

    /// Senders wait while the task holds `WAITING_MAX` messages waiting for metadata, and
    /// are woken when fewer are left.
    #[tokio::test]
    async fn senders_wait_while_too_many_messages_wait_for_metadata() {
        let shared = Arc::new(Shared::new(usize::MAX));
        shared.set_waiting(WAITING_MAX - 1);
        assert!(shared.has_space());
        shared.set_waiting(WAITING_MAX);
        assert!(!shared.has_space(), "too many messages wait for metadata");
        let waiting = tokio::spawn(shared.clone().wait_for_space());
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        shared.set_waiting(WAITING_MAX + 1);
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        shared.set_waiting(0);
        tokio::time::timeout(std::time::Duration::from_secs(5), waiting)
            .await
            .expect("the sender was not woken")
            .unwrap();
        assert!(shared.has_space());
    }

    /// Queue time (Java `record-queue-time-avg/max`): a batch waits its linger before
    /// it is sent, so its queue time is at least the linger and at most the wait of the
    /// `produce` call; a flushed batch goes at once, and brings the mean down.
    #[cfg(feature = "mock")]
    #[tokio::test]
    async fn queue_time_is_the_wait_of_a_batch_before_it_is_sent() {
        use futures::SinkExt;
        use std::time::{Duration, Instant};
        let cluster = crate::mock::MockCluster::builder()
            .topic("t", 1)
            .start()
            .await
            .unwrap();
        let linger = Duration::from_millis(300);
        let mut w = Writer::new(
            WriterConfig::new(cluster.bootstrap())
                .topic("t")
                .batch_timeout(linger),
        )
        .unwrap();
        // the metadata first: the lingering batch below then waits for nothing else
        w.send(Message::new("warm-up")).await.unwrap();
        let before = w.stats();
        assert_eq!(before.messages, 1);
        assert!(before.queue_time_max < linger, "{before:?}");
        let started = Instant::now();
        w.produce(Message::new("lingers")).await.unwrap();
        let waited = started.elapsed();
        let s = w.stats();
        assert_eq!(s.messages, 2);
        assert!(
            s.queue_time_max >= linger && s.queue_time_max <= waited,
            "queue time {:?}, linger {linger:?}, produce took {waited:?}",
            s.queue_time_max
        );
        // two batches sent: the mean is between the flushed one's and the lingered one's
        assert!(
            s.queue_time_avg < s.queue_time_max && s.queue_time_avg >= linger / 2,
            "{s:?}"
        );
        w.close().await.unwrap();
    }

    #[tokio::test]
    async fn unreachable_broker_fails_the_flush_and_frees_the_buffer() {
        use futures::SinkExt;
        let mut w = Writer::new(
            WriterConfig::new(["127.0.0.1:1"])
                .topic("t")
                .max_attempts(2)
                .backoff(
                    std::time::Duration::from_millis(1),
                    std::time::Duration::from_millis(5),
                )
                .connect_timeout(std::time::Duration::from_millis(200)),
        )
        .unwrap();
        w.feed(Message::new("v")).await.unwrap();
        let e = w.flush().await.unwrap_err();
        assert!(e.is_retriable(), "{e}");
        assert_eq!(e.topic(), Some("t"));
        let s = w.stats();
        assert_eq!((s.errors, s.buffered_bytes), (1, 0), "{s:?}");
        // A failed flush reports once; the writer can still be closed.
        w.close().await.unwrap();
        assert!(w.feed(Message::new("late")).await.unwrap_err().is_closed());
    }
}
