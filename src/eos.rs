//! [`ExactlyOnceSink`]: the consume → transform → produce pipeline, exactly once.
//!
//! A group [`Reader`](crate::reader::Reader) → the user's combinators → this sink, which
//! writes the derived messages in a transaction of its [`TransactionalWriter`] and commits
//! the consumed offsets in the same transaction (KIP-447: with the group's generation and
//! member id), so each consumed message's results are committed together with its offset,
//! or not at all. See the type's documentation for the rules.
//!
//! The pipeline joins a group reader's handle and a transactional writer, so it sits
//! above both (DESIGN.md, "Layers"); its public types keep their paths
//! `writer::ExactlyOnceSink`, `writer::PipelineConfig` and `writer::PipelineStats`
//! (re-exports).

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::future::BoxFuture;
use futures::{Sink, SinkExt};
use tokio::time::Instant;
use tracing::{debug, warn};

use crate::ack::Track;
use crate::admin::TopicPartition;
use crate::error::{Error, Result};
use crate::group::GroupShared;
use crate::reader::ReaderHandle;
use crate::writer::{Message, TransactionState, TransactionalWriter};

/// When an [`ExactlyOnceSink`] commits its transaction: after `commit_every_messages`
/// messages, or `commit_interval` after the transaction began, whichever comes first (and
/// on close, and on [`ExactlyOnceSink::commit`]).
///
/// The defaults (1000 messages, 100 ms — the Kafka Streams exactly-once commit interval)
/// bound how long read_committed consumers of the output wait for the results.
///
/// ```no_run
/// use std::time::Duration;
/// use kafkapipe::writer::PipelineConfig;
/// let config = PipelineConfig::new()
///     .commit_every_messages(5000)
///     .commit_interval(Duration::from_millis(500));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PipelineConfig {
    /// Commit once the transaction holds this many messages (at least 1).
    pub commit_every_messages: usize,
    /// Commit once the transaction is this old.
    pub commit_interval: Duration,
}

impl Default for PipelineConfig {
    fn default() -> Self {
        PipelineConfig {
            commit_every_messages: 1000,
            commit_interval: Duration::from_millis(100),
        }
    }
}

impl PipelineConfig {
    /// The defaults: 1000 messages, 100 ms.
    ///
    /// ```no_run
    /// let config = kafkapipe::writer::PipelineConfig::new();
    /// ```
    pub fn new() -> Self {
        Self::default()
    }

    /// Set [`PipelineConfig::commit_every_messages`] (0 is taken as 1).
    ///
    /// ```no_run
    /// let config = kafkapipe::writer::PipelineConfig::new().commit_every_messages(100);
    /// ```
    pub fn commit_every_messages(mut self, n: usize) -> Self {
        self.commit_every_messages = n.max(1);
        self
    }

    /// Set [`PipelineConfig::commit_interval`].
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// let config = kafkapipe::writer::PipelineConfig::new().commit_interval(Duration::from_secs(1));
    /// ```
    pub fn commit_interval(mut self, interval: Duration) -> Self {
        self.commit_interval = interval;
        self
    }
}

/// What an [`ExactlyOnceSink`] did so far.
///
/// ```no_run
/// # fn demo(sink: &kafkapipe::writer::ExactlyOnceSink) {
/// let s = sink.stats();
/// println!("{} transactions, {} messages committed", s.transactions_committed, s.messages_committed);
/// # }
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PipelineStats {
    /// Transactions committed (offsets-only ones included).
    pub transactions_committed: u64,
    /// Transactions aborted (a revoke, a failure, a stale membership).
    pub transactions_aborted: u64,
    /// Messages written in committed transactions.
    pub messages_committed: u64,
    /// Messages written in aborted transactions (their inputs are read again).
    pub messages_aborted: u64,
    /// Messages dropped unwritten because their input was read before an abort or a
    /// revoke (the reader delivers that input again, or its new owner does).
    pub stale_dropped: u64,
}

enum Outcome {
    Committed,
    /// A written message's input is not covered by the processed offsets yet (an earlier
    /// input of its partition is still being processed): the transaction stays open.
    Deferred,
    MustAbort(&'static str),
    Aborted {
        answer: Option<u64>,
    },
    Closed,
}

type Op = BoxFuture<'static, (TransactionalWriter, Result<Outcome>)>;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// `poll_ready`/`poll_flush`: commit when due.
    Due,
    /// [`ExactlyOnceSink::commit`]: commit what is open now.
    Now,
    /// Closing: commit what is open (abort it if it cannot be committed).
    Close,
}

/// A transactional `Sink<writer::Message>` for `group reader → combinators → Kafka`,
/// exactly once (from [`TransactionalWriter::pipeline`]).
///
/// It begins a transaction with the first message, writes the messages, and after
/// [`PipelineConfig::commit_every_messages`] messages or
/// [`PipelineConfig::commit_interval`] (and on close) it waits until every written
/// message is acknowledged, sends the group's processed offsets into the transaction
/// (`TxnOffsetCommit` with the reader's generation and member id: a member fenced by a
/// rebalance cannot commit) and commits it.
///
/// **Which offsets.** The consumed positions come from the
/// [`AckToken`](crate::group::AckToken)s the written messages carry, through the
/// acknowledgement model: per partition, the next offset after the processed prefix of
/// what the reader yielded. A message a `filter` dropped counts as processed (the reader
/// was polled after it), so inputs that produce nothing move the committed offset too;
/// a transaction with no message but such offsets is committed the same way. Every message
/// written must carry the token of its input(s) ([`Message::with_ack`],
/// `Message::from(reader::Message)`; a [`SharedAck`](crate::group::SharedAck) for one input
/// → many outputs, a collected token for many → one); a message without one is refused
/// with a `Config` error. A commit whose written messages are not all covered by the
/// processed prefix (an earlier input of the same partition still in a concurrent stage)
/// is deferred until they are, so no result is committed without its input's offset.
/// Tracking must be contiguous ([`ReaderConfig::commit_contiguous`](crate::reader::ReaderConfig::commit_contiguous),
/// the default).
///
/// **The group's own commits are off** once the sink is made, for the life of the reader:
/// no interval commit, no commit of revoked partitions or on close, and
/// [`Committer::commit`](crate::group::Committer::commit) returns a `Config` error
/// (explicit acks through a `Committer` are ignored) — offsets reach the group only in the
/// pipeline's transactions.
///
/// **Rebalances and failures.** Before the group gives partitions up (eager or
/// cooperative revoke, a lost membership) it asks the sink to end its transaction and
/// waits (at most the rebalance timeout, at least 5 s): the sink aborts the open
/// transaction, drops what it buffered, and rewinds every partition the member keeps to
/// its committed offset; messages already on their way from before are dropped unwritten
/// ([`PipelineStats::stale_dropped`]). A transaction that fails abortably (a stale
/// generation — `ILLEGAL_GENERATION` from the offset commit —, a failed produce) is
/// aborted and rewound the same way and the pipeline goes on; a fatal failure (fenced by
/// another writer with the same transactional id, authorization) ends it with the error.
/// Dropping the sink without closing it is a crash: the open transaction is aborted by
/// the coordinator after the transaction timeout, or at once by the next writer with the
/// same transactional id ([`TransactionalWriter::init_transactions`] fences this one).
///
/// **Flush and close.** `poll_flush` (which `forward` calls at every idle moment of the
/// stream) commits when the transaction is due and otherwise arms a timer for the
/// interval, so an idle pipeline commits within [`PipelineConfig::commit_interval`];
/// [`ExactlyOnceSink::commit`] commits at once; `poll_close` commits what is open and
/// closes the writer. Close the *reader* to stop (its stream ends, `forward` closes the
/// sink): the group keeps its membership until the last transaction ended.
///
/// ```no_run
/// use futures::{future, StreamExt, TryStreamExt};
/// use kafkapipe::conn::IsolationLevel;
/// use kafkapipe::reader::{Reader, ReaderConfig};
/// use kafkapipe::writer::{Message, PipelineConfig, TransactionalWriter, WriterConfig};
///
/// # async fn demo() -> kafkapipe::Result<()> {
/// let reader = Reader::new(
///     ReaderConfig::new(["127.0.0.1:9092"])
///         .group_id("upper")
///         .topic("in")
///         .isolation_level(IsolationLevel::ReadCommitted),
/// )
/// .await?;
/// let writer = TransactionalWriter::new(
///     WriterConfig::new(["127.0.0.1:9092"]).topic("out").transactional_id("upper-1"),
/// )?;
/// let sink = writer.pipeline(&reader.handle(), PipelineConfig::new()).await?;
/// reader
///     .try_filter(|m| future::ready(!m.value.as_deref().unwrap_or_default().is_empty()))
///     .map_ok(|mut m| {
///         let upper = m.value.as_deref().unwrap_or_default().to_ascii_uppercase();
///         Message::new(upper).with_ack(m.take_ack_token())
///     })
///     .forward(sink)
///     .await?;
/// # Ok(()) }
/// ```
pub struct ExactlyOnceSink {
    /// `None` while an operation (commit, abort, close) owns it.
    writer: Option<TransactionalWriter>,
    op: Option<Op>,
    reader: ReaderHandle,
    group: Arc<GroupShared>,
    config: PipelineConfig,
    /// Per track written from: the track and one past the highest input offset written.
    written: HashMap<u64, (Arc<Track>, i64)>,
    /// Messages in the open transaction.
    messages: usize,
    /// When the open transaction began (`None`: none open).
    begun: Option<Instant>,
    /// The last deferred commit: messages and reader polls then (retried once either
    /// changed).
    deferred: Option<(usize, u64)>,
    /// A message mixed stale and current inputs: abort and rewind before anything else.
    rewind: bool,
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
    writer_closed: bool,
    stats: PipelineStats,
}

impl std::fmt::Debug for ExactlyOnceSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExactlyOnceSink")
            .field("group", &self.group.group_id)
            .field("config", &self.config)
            .field("messages", &self.messages)
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl TransactionalWriter {
    /// The transactional sink of a consume → transform → produce pipeline fed from the
    /// group reader behind `reader` (see [`ExactlyOnceSink`]). Initializes the writer's
    /// transactions if not done yet (fencing an earlier writer with the same
    /// transactional id), and takes over the group's commits for good.
    ///
    /// ```no_run
    /// use kafkapipe::reader::{Reader, ReaderConfig};
    /// use kafkapipe::writer::{PipelineConfig, TransactionalWriter, WriterConfig};
    /// # async fn demo() -> kafkapipe::Result<()> {
    /// let reader = Reader::new(ReaderConfig::new(["127.0.0.1:9092"]).group_id("g").topic("in")).await?;
    /// let sink = TransactionalWriter::new(
    ///     WriterConfig::new(["127.0.0.1:9092"]).topic("out").transactional_id("g-out-1"),
    /// )?
    /// .pipeline(&reader.handle(), PipelineConfig::new())
    /// .await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// `Config` for a reader without a group, with non-contiguous tracking, already
    /// feeding another pipeline, or a writer not in the `Ready` state after init; the
    /// errors of [`TransactionalWriter::init_transactions`].
    ///
    /// # Cancellation safety
    ///
    /// Dropping the future drops the writer (mid-init: as
    /// [`TransactionalWriter::init_transactions`] says); the reader is untouched until it
    /// completes.
    pub async fn pipeline(
        mut self,
        reader: &ReaderHandle,
        config: PipelineConfig,
    ) -> Result<ExactlyOnceSink> {
        let Some(group) = reader.group.clone() else {
            return Err(Error::config(
                "an exactly-once pipeline needs a group reader (ReaderConfig::group_id)",
            ));
        };
        if !group.contiguous {
            return Err(Error::config(
                "an exactly-once pipeline needs contiguous tracking (ReaderConfig::commit_contiguous(true))",
            ));
        }
        if self.state() == TransactionState::Uninitialized {
            self.init_transactions().await?;
        }
        if self.state() != TransactionState::Ready {
            return Err(Error::config(format!(
                "an exactly-once pipeline needs a writer with no transaction open (state {:?})",
                self.state()
            )));
        }
        if !group.txn.attach() {
            return Err(Error::config(format!(
                "group reader {} already feeds an exactly-once pipeline",
                group.group_id
            )));
        }
        Ok(ExactlyOnceSink {
            writer: Some(self),
            op: None,
            reader: reader.clone(),
            group,
            config: PipelineConfig {
                commit_every_messages: config.commit_every_messages.max(1),
                ..config
            },
            written: HashMap::new(),
            messages: 0,
            begun: None,
            deferred: None,
            rewind: false,
            timer: None,
            writer_closed: false,
            stats: PipelineStats::default(),
        })
    }
}

impl ExactlyOnceSink {
    /// What the sink did so far.
    ///
    /// ```no_run
    /// # fn demo(sink: &kafkapipe::writer::ExactlyOnceSink) {
    /// println!("{:?}", sink.stats());
    /// # }
    /// ```
    pub fn stats(&self) -> PipelineStats {
        self.stats.clone()
    }

    /// Commit the open transaction now (with the offsets processed so far), or do
    /// nothing if none is open. A commit that must wait for earlier inputs still being
    /// processed (see the type's documentation) leaves the transaction open.
    ///
    /// ```no_run
    /// # async fn demo(mut sink: kafkapipe::writer::ExactlyOnceSink) -> kafkapipe::Result<()> {
    /// sink.commit().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// A fatal transaction failure (fenced, authorization). Abortable failures abort the
    /// transaction and rewind the reader instead.
    ///
    /// # Cancellation safety
    ///
    /// Cancel safe: the commit (or abort) runs on in the sink and is finished by the next
    /// call of any of its methods; nothing is committed twice or lost.
    pub async fn commit(&mut self) -> Result<()> {
        futures::future::poll_fn(|cx| self.poll_work(cx, Mode::Now)).await
    }

    fn start(&mut self, f: impl FnOnce(TransactionalWriter) -> Op) {
        if let Some(w) = self.writer.take() {
            self.op = Some(f(w));
        }
    }

    fn start_commit(&mut self) {
        let group = self.group.clone();
        let written: Vec<(Arc<Track>, i64)> = self.written.values().cloned().collect();
        self.start(move |mut w| {
            Box::pin(async move {
                let r = commit(&mut w, &group, written).await;
                (w, r)
            })
        });
    }

    fn start_abort(&mut self, answer: Option<u64>) {
        self.start(move |mut w| {
            Box::pin(async move {
                let r = match w.state() {
                    TransactionState::InTransaction
                    | TransactionState::AbortableError
                    | TransactionState::Aborting => w.abort_transaction().await,
                    _ => Ok(()),
                };
                (w, r.map(|()| Outcome::Aborted { answer }))
            })
        });
    }

    fn start_close(&mut self) {
        self.start(|mut w| {
            Box::pin(async move {
                let r = w.close().await;
                (w, r.map(|()| Outcome::Closed))
            })
        });
    }

    fn end_transaction(&mut self) {
        self.written.clear();
        self.messages = 0;
        self.begun = None;
        self.deferred = None;
        self.group.txn.set_open(false);
    }

    /// An operation ended: account for it, maybe start the next one.
    fn finish(&mut self, r: Result<Outcome>) -> Result<()> {
        match r {
            Ok(Outcome::Committed) => {
                debug!(group = %self.group.group_id, messages = self.messages, "transaction committed");
                self.stats.transactions_committed += 1;
                self.stats.messages_committed += self.messages as u64;
                self.end_transaction();
            }
            Ok(Outcome::Deferred) => {
                debug!(group = %self.group.group_id, "commit deferred: earlier inputs are still being processed");
                self.deferred = Some((self.messages, self.group.pulse.polls()));
            }
            Ok(Outcome::MustAbort(why)) => {
                warn!(group = %self.group.group_id, why, "aborting the transaction");
                self.start_abort(None);
            }
            Ok(Outcome::Aborted { answer }) => {
                let rewound = self.reader.rewind_to_committed();
                debug!(group = %self.group.group_id, messages = self.messages, rewound, "transaction aborted; partitions rewound to their committed offsets");
                self.stats.transactions_aborted += 1;
                self.stats.messages_aborted += self.messages as u64;
                self.rewind = false;
                self.end_transaction();
                if let Some(n) = answer {
                    self.group.txn.answer(n);
                }
            }
            Ok(Outcome::Closed) => self.writer_closed = true,
            Err(e) => {
                let abortable = matches!(
                    self.writer.as_ref().map(TransactionalWriter::state),
                    Some(TransactionState::AbortableError | TransactionState::InTransaction)
                );
                if abortable && self.begun.is_some() {
                    warn!(group = %self.group.group_id, error = %e, "transaction failed; aborting it and reading again from the committed offsets");
                    self.start_abort(None);
                } else {
                    self.group.txn.detach();
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    /// Run operations to their end, answer the group, commit when due (per `mode`).
    /// Ready once nothing is to be done now.
    fn poll_work(&mut self, cx: &mut Context<'_>, mode: Mode) -> Poll<Result<()>> {
        loop {
            self.group.txn.register(cx.waker());
            if let Some(op) = self.op.as_mut() {
                let (w, r) = futures::ready!(op.as_mut().poll(cx));
                self.op = None;
                self.writer = Some(w);
                self.finish(r)?;
                continue;
            }
            if self.writer_closed {
                return Poll::Ready(Ok(()));
            }
            if self.writer.is_none() {
                return Poll::Ready(Err(Error::config("the exactly-once sink failed earlier")));
            }
            if self.rewind {
                self.start_abort(None);
                continue;
            }
            if let Some(n) = self.group.txn.pending_request() {
                if self.begun.is_some() {
                    self.start_abort(Some(n));
                } else {
                    self.group.txn.answer(n);
                }
                continue;
            }
            if self.begun.is_none() && self.group.has_due() {
                // inputs processed without output (filtered out): their offsets commit
                // in a transaction of their own
                self.begin()?;
            }
            let Some(begun) = self.begun else {
                return Poll::Ready(Ok(()));
            };
            let changed = self
                .deferred
                .is_none_or(|(m, polls)| m != self.messages || polls != self.group.pulse.polls());
            let due = self.messages >= self.config.commit_every_messages
                || begun.elapsed() >= self.config.commit_interval;
            match mode {
                _ if changed && (due || mode != Mode::Due) => {
                    self.start_commit();
                    continue;
                }
                Mode::Close if !changed => {
                    // cannot be committed (inputs still held upstream): the pipeline is
                    // ending, so their results go with an abort
                    self.start_abort(None);
                    continue;
                }
                _ => {}
            }
            if !due {
                let at = begun + self.config.commit_interval;
                let timer = self
                    .timer
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(at)));
                if timer.deadline() != at {
                    timer.as_mut().reset(at);
                }
                if timer.as_mut().poll(cx).is_ready() {
                    continue;
                }
            }
            return Poll::Ready(Ok(()));
        }
    }

    fn begin(&mut self) -> Result<()> {
        let w = self.writer.as_mut().ok_or_else(|| {
            Error::config("the exactly-once sink is busy (call poll_ready first)")
        })?;
        w.begin_transaction()?;
        self.begun = Some(Instant::now());
        self.deferred = None;
        self.group.txn.set_open(true);
        Ok(())
    }
}

/// Flush, check that every written message's input is covered by the processed offsets,
/// send the offsets into the transaction, commit.
async fn commit(
    w: &mut TransactionalWriter,
    group: &GroupShared,
    written: Vec<(Arc<Track>, i64)>,
) -> Result<Outcome> {
    // every message acknowledged: the tokens it carries are acked
    SinkExt::<Message>::flush(w).await?;
    for (track, upto) in &written {
        if !track.active() {
            return Ok(Outcome::MustAbort(
                "a partition written from was given up before the commit",
            ));
        }
        if track.pending_offset() < *upto {
            return Ok(Outcome::Deferred);
        }
    }
    let mut tracks = Vec::new();
    let mut offsets = Vec::new();
    for (topic, parts) in &group.commits().parts {
        for (partition, track) in parts {
            let at = track.pending_offset();
            if at > track.committed_offset() {
                offsets.push((TopicPartition::new(topic, *partition), at));
                tracks.push((track.clone(), at));
            }
        }
    }
    if !offsets.is_empty() {
        let Some(meta) = group.group_metadata() else {
            return Ok(Outcome::MustAbort("the reader is not a group member"));
        };
        w.send_offsets_to_transaction(offsets, &meta).await?;
    }
    w.commit_transaction().await?;
    for (track, at) in tracks {
        track.committed(at);
    }
    Ok(Outcome::Committed)
}

impl Drop for ExactlyOnceSink {
    fn drop(&mut self) {
        self.group.txn.detach();
    }
}

impl Sink<Message> for ExactlyOnceSink {
    type Error = Error;

    fn poll_ready(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<()>> {
        let this = self.get_mut();
        futures::ready!(this.poll_work(cx, Mode::Due))?;
        if this.begun.is_none() {
            // a message is coming: the transactional writer takes sends only in a
            // transaction (one with nothing in it commits without a round trip)
            this.begin()?;
        }
        match this.writer.as_mut() {
            Some(w) => Pin::new(w).poll_ready(cx),
            None => Poll::Ready(Err(Error::config("the exactly-once sink is closed"))),
        }
    }

    fn start_send(self: Pin<&mut Self>, msg: Message) -> Result<()> {
        let this = self.get_mut();
        if this.writer_closed {
            return Err(Error::config("the exactly-once sink is closed"));
        }
        let mut sources = Vec::new();
        msg.ack.sources(&mut sources);
        if sources.is_empty() {
            return Err(Error::config(
                "a message written by an exactly-once pipeline must carry the ack token of the \
                 consumed message(s) it was made from (writer::Message::with_ack): its position \
                 is what the transaction commits",
            ));
        }
        let current = sources
            .iter()
            .filter(|(t, seq, _)| t.is_current(*seq))
            .count();
        if current < sources.len() {
            // read before an abort or a revoke: the reader (or the partition's new
            // owner) delivers the input again
            this.stats.stale_dropped += 1;
            if current > 0 {
                this.rewind = true;
            }
            debug!(group = %this.group.group_id, "message of an input read before the last abort dropped");
            return Ok(());
        }
        if this.begun.is_none() {
            this.begin()?;
        }
        for (track, _, offset) in sources {
            let e = this
                .written
                .entry(track.id)
                .or_insert_with(|| (track.clone(), 0));
            e.1 = e.1.max(offset.saturating_add(1));
        }
        let w = this.writer.as_mut().ok_or_else(|| {
            Error::config("the exactly-once sink is busy (call poll_ready first)")
        })?;
        Pin::new(w).start_send(msg)?;
        this.messages += 1;
        Ok(())
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<()>> {
        self.get_mut().poll_work(cx, Mode::Due)
    }

    fn poll_close(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<()>> {
        let this = self.get_mut();
        loop {
            futures::ready!(this.poll_work(cx, Mode::Close))?;
            if this.writer_closed {
                this.group.txn.detach();
                return Poll::Ready(Ok(()));
            }
            this.start_close();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sink_and_its_config_are_send() {
        fn check<T: Send + Unpin>() {}
        check::<ExactlyOnceSink>();
        check::<PipelineConfig>();
    }

    #[test]
    fn config_defaults_and_bounds() {
        let c = PipelineConfig::new();
        assert_eq!(c.commit_every_messages, 1000);
        assert_eq!(c.commit_interval, Duration::from_millis(100));
        assert_eq!(c.commit_every_messages(0).commit_every_messages, 1);
    }
}
