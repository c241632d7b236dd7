//! The producer: [`Writer`], a batching, backpressured `futures::Sink<Message>`.
//!
//! A port of kafka-go's `Writer` onto a `Sink`:
//!
//! * [`start_send`](futures::Sink::start_send) hands the message to a background task,
//!   which assigns its partition (the message's own, or the configured [`Balancer`]'s
//!   choice) and appends it to that partition's open batch. A batch is sealed when it
//!   holds [`WriterConfig::batch_size`] messages or [`WriterConfig::batch_bytes`] bytes, or
//!   [`WriterConfig::batch_timeout`] after its first message (a timer per open batch).
//! * The sealed batches of all partitions led by one broker travel in **one** produce
//!   request (as the Java client and franz-go do; kafka-go sends one per partition), with
//!   at most [`WriterConfig::max_in_flight_per_broker`] requests in flight per broker and
//!   at most one batch in flight per partition, so per-partition order survives retries.
//! * [`poll_ready`](futures::Sink::poll_ready) is pending while the bytes accepted but not
//!   yet acknowledged exceed [`WriterConfig::max_buffered_bytes`]; acknowledgements wake it.
//! * [`poll_flush`](futures::Sink::poll_flush) seals every open batch and resolves when
//!   every message accepted since the previous flush is acknowledged (per
//!   [`WriterConfig::required_acks`]), or with the first delivery error, which names the
//!   topic and partition. [`poll_close`](futures::Sink::poll_close) flushes, then stops
//!   the background task and closes the broker connections.
//! * Retriable errors (`NotLeaderOrFollower`, `LeaderNotAvailable`, timeouts, broken
//!   connections, …) mark the topic's metadata stale and retry the batch after an
//!   exponential backoff, up to [`WriterConfig::max_attempts`] sends. Other errors
//!   (`MessageTooLarge`, authorization, invalid records, …) fail exactly the messages of
//!   the affected batch. A message larger than `batch_bytes` is rejected on its own with
//!   `MessageTooLarge` before anything is sent.
//!
//! Without idempotence (not implemented yet) a retry after a lost response can write a
//! batch twice, as with kafka-go and the Java client with `enable.idempotence=false`.
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

mod balancer;
mod config;
mod message;
mod task;

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll};

use tokio::sync::{mpsc, oneshot, Notify};

pub use balancer::{Balancer, Crc32, Hash, LeastBytes, Murmur2, ReferenceHash, RoundRobin};
pub use config::WriterConfig;
pub use message::Message;

use crate::cluster::Cluster;
use crate::error::{Error, Result};
use task::{Cmd, Msg, Task};

/// A snapshot of a writer's counters (cumulative since the writer was created), like
/// kafka-go's `WriterStats`.
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
    /// Bytes accepted and not yet acknowledged or failed (the backpressure gauge).
    pub buffered_bytes: u64,
}

#[derive(Default)]
struct Counters {
    writes: AtomicU64,
    batches: AtomicU64,
    messages: AtomicU64,
    bytes: AtomicU64,
    errors: AtomicU64,
    retries: AtomicU64,
}

/// State shared by the writer handle and its task.
struct Shared {
    buffered: AtomicUsize,
    max_buffered: usize,
    space: Notify,
    stats: Counters,
}

impl Shared {
    fn reserve(&self, bytes: usize) {
        self.buffered.fetch_add(bytes, Ordering::AcqRel);
    }

    fn release(&self, bytes: usize) {
        let before = self.buffered.fetch_sub(bytes, Ordering::AcqRel);
        if before > self.max_buffered && before.saturating_sub(bytes) <= self.max_buffered {
            self.space.notify_waiters();
        }
    }

    fn has_space(&self) -> bool {
        self.buffered.load(Ordering::Acquire) <= self.max_buffered
    }

    async fn wait_for_space(self: Arc<Self>) {
        loop {
            let notified = self.space.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.has_space() {
                return;
            }
            notified.await;
        }
    }
}

/// Messages whose delivery one caller waits for: those accepted by the sink between two
/// flushes, or one `write_messages` call.
pub(crate) struct Group {
    state: Mutex<GroupState>,
}

struct GroupState {
    pending: usize,
    sealed: bool,
    error: Option<Error>,
    waiter: Option<oneshot::Sender<Result<()>>>,
}

impl Group {
    fn open() -> Arc<Group> {
        Arc::new(Group {
            state: Mutex::new(GroupState {
                pending: 0,
                sealed: false,
                error: None,
                waiter: None,
            }),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, GroupState> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn add(&self, n: usize) {
        self.lock().pending += n;
    }

    /// No more messages join; `waiter` hears once all are done.
    fn seal(&self, waiter: oneshot::Sender<Result<()>>) {
        let mut s = self.lock();
        s.sealed = true;
        s.waiter = Some(waiter);
        s.finish_if_done();
    }

    /// `n` messages finished, successfully or with `error`.
    pub(crate) fn done(&self, n: usize, error: Option<&Error>) {
        let mut s = self.lock();
        s.pending = s.pending.saturating_sub(n);
        if let (Some(e), None) = (error, &s.error) {
            s.error = Some(e.clone());
        }
        s.finish_if_done();
    }
}

impl GroupState {
    fn finish_if_done(&mut self) {
        if self.sealed && self.pending == 0 {
            if let Some(w) = self.waiter.take() {
                let _ = w.send(self.error.take().map_or(Ok(()), Err));
            }
        }
    }
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
pub struct Writer {
    cmds: mpsc::UnboundedSender<Cmd>,
    shared: Arc<Shared>,
    sink_group: Option<Arc<Group>>,
    space: Option<SpaceFuture>,
    flushing: Option<oneshot::Receiver<Result<()>>>,
    closing: Option<oneshot::Receiver<()>>,
    close_result: Option<Result<()>>,
    closed: bool,
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
    /// `Config` for an invalid configuration or when called outside a Tokio runtime.
    pub fn new(config: WriterConfig) -> Result<Writer> {
        config.validate()?;
        let handle = tokio::runtime::Handle::try_current()
            .map_err(|_| Error::config("Writer::new must be called within a Tokio runtime"))?;
        let cluster = Cluster::new(config.brokers.clone(), config.connection_config())?;
        let shared = Arc::new(Shared {
            buffered: AtomicUsize::new(0),
            max_buffered: config.max_buffered_bytes,
            space: Notify::new(),
            stats: Counters::default(),
        });
        let (tx, rx) = mpsc::unbounded_channel();
        let task = Task::new(Arc::new(config), cluster, shared.clone(), rx);
        handle.spawn(task.run());
        Ok(Writer {
            cmds: tx,
            shared,
            sink_group: None,
            space: None,
            flushing: None,
            closing: None,
            close_result: None,
            closed: false,
        })
    }

    /// Write `msgs` and wait until all are acknowledged (kafka-go `WriteMessages`).
    /// Waits first while the buffer bound is exceeded. Messages are batched with
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
    pub async fn write_messages<I>(&self, msgs: I) -> Result<()>
    where
        I: IntoIterator<Item = Message>,
    {
        let msgs: Vec<Message> = msgs.into_iter().collect();
        if msgs.is_empty() {
            return Ok(());
        }
        if self.closed || self.cmds.is_closed() {
            return Err(closed_error());
        }
        self.shared.clone().wait_for_space().await;
        let group = Group::open();
        group.add(msgs.len());
        let (tx, rx) = oneshot::channel();
        group.seal(tx);
        let batch: Vec<Msg> = msgs
            .into_iter()
            .map(|msg| {
                let size = msg.size();
                self.shared.reserve(size);
                Msg {
                    msg,
                    size,
                    group: group.clone(),
                }
            })
            .collect();
        drop(group);
        if let Err(mpsc::error::SendError(Cmd::Batch(batch))) = self.cmds.send(Cmd::Batch(batch)) {
            self.shared.release(batch.iter().map(|m| m.size).sum());
            return Err(closed_error());
        }
        rx.await.unwrap_or_else(|_| Err(closed_error()))
    }

    /// The writer's counters.
    pub fn stats(&self) -> WriterStats {
        let c = &self.shared.stats;
        WriterStats {
            writes: c.writes.load(Ordering::Relaxed),
            batches: c.batches.load(Ordering::Relaxed),
            messages: c.messages.load(Ordering::Relaxed),
            bytes: c.bytes.load(Ordering::Relaxed),
            errors: c.errors.load(Ordering::Relaxed),
            retries: c.retries.load(Ordering::Relaxed),
            buffered_bytes: self.shared.buffered.load(Ordering::Relaxed) as u64,
        }
    }

    fn poll_space(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        loop {
            if self.shared.has_space() {
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

    fn poll_flush_inner(&mut self, cx: &mut Context<'_>) -> Poll<Result<()>> {
        if self.flushing.is_none() {
            let Some(group) = self.sink_group.take() else {
                return Poll::Ready(Ok(()));
            };
            let (tx, rx) = oneshot::channel();
            group.seal(tx);
            tracing::debug!("writer flush");
            let _ = self.cmds.send(Cmd::Flush);
            self.flushing = Some(rx);
        }
        let Some(rx) = self.flushing.as_mut() else {
            return Poll::Ready(Ok(()));
        };
        let result = ready!(Pin::new(rx).poll(cx));
        self.flushing = None;
        Poll::Ready(result.unwrap_or_else(|_| Err(closed_error())))
    }
}

impl futures::Sink<Message> for Writer {
    type Error = Error;

    fn poll_ready(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<()>> {
        let this = self.get_mut();
        if this.closed {
            return Poll::Ready(Err(closed_error()));
        }
        ready!(this.poll_space(cx));
        Poll::Ready(Ok(()))
    }

    fn start_send(self: Pin<&mut Self>, msg: Message) -> Result<()> {
        let this = self.get_mut();
        if this.closed {
            return Err(closed_error());
        }
        let size = msg.size();
        let group = this.sink_group.get_or_insert_with(Group::open).clone();
        group.add(1);
        this.shared.reserve(size);
        if this.cmds.send(Cmd::One(Msg { msg, size, group })).is_err() {
            this.shared.release(size);
            return Err(closed_error());
        }
        Ok(())
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<()>> {
        self.get_mut().poll_flush_inner(cx)
    }

    fn poll_close(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<()>> {
        let this = self.get_mut();
        if this.closing.is_none() && !this.closed {
            let flushed = ready!(this.poll_flush_inner(cx));
            this.close_result = Some(flushed);
            let (tx, rx) = oneshot::channel();
            if this.cmds.send(Cmd::Close(tx)).is_ok() {
                this.closing = Some(rx);
            }
            this.closed = true;
        }
        if let Some(rx) = this.closing.as_mut() {
            let _ = ready!(Pin::new(rx).poll(cx));
            this.closing = None;
        }
        Poll::Ready(this.close_result.take().unwrap_or(Ok(())))
    }
}
