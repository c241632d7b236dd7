//! The transactional writer's handle: [`TransactionalWriter`] (a [`Writer`] plus the
//! transaction calls, also a `Sink<Message>`) and [`GroupMetadata`], with the coordinator
//! requests behind the calls — InitProducerId, AddOffsetsToTxn (v1), TxnOffsetCommit and
//! EndTxn — run on the caller's task through the state machine of `txn.rs`.
//!
//! Why a separate type rather than methods on [`Writer`]: a `Writer` is `Clone`, and
//! transaction boundaries shared by clones would be a trap (one clone's commit would
//! take another's half-written work with it). A `TransactionalWriter` is one owner of the
//! boundaries: `begin`/`commit`/`abort` take `&mut self`, so no send can race a commit,
//! and a plain `Writer` never carries methods that could only fail.
//!
//! May not: change the transaction state other than through the state machine's
//! transitions, or touch the task's batches: it talks to the task by commands
//! ([`Cmd::Producer`], [`Cmd::TxnBegin`], [`Cmd::Drain`]).

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use tokio::sync::oneshot;
use tracing::{debug, info, warn, Instrument};

use super::task::Cmd;
use super::txn::{
    attempt_timeout, check, choose_protocol, is_fatal, txn_call, v2_version, TransactionState,
    TxnShared, MAX_END_TXN_VERSION, MAX_TXN_OFFSET_COMMIT_VERSION, V2_END_TXN_VERSION,
    V2_TXN_OFFSET_COMMIT_VERSION,
};
use super::{closed_error, Message, TransactionProtocol, Writer, WriterConfig, WriterStats};
use crate::admin::TopicPartition;
use crate::cluster::Cluster;
use crate::coordinator::Coordinator;
use crate::error::{Error, Result};
use crate::protocol::messages::{
    AddOffsetsToTxnRequest, EndTxnRequest, InitProducerIdRequest, TxnOffsetCommitRequest,
    TxnOffsetCommitRequestPartition, TxnOffsetCommitRequestTopic,
};
use crate::protocol::ErrorCode;

/// A [`Writer`] whose messages are written in transactions: all of a transaction's
/// messages (over any number of partitions), and optionally a consumer group's offsets,
/// become visible to `read_committed` readers together when it commits, and never when
/// it aborts (Java's transactional `KafkaProducer`).
///
/// Life: [`new`](Self::new) (a [`WriterConfig`] with
/// [`transactional_id`](WriterConfig::transactional_id)), [`init_transactions`](Self::init_transactions)
/// once, then per transaction [`begin_transaction`](Self::begin_transaction), messages
/// (as a `Sink<Message>`, or [`write_messages`](Self::write_messages)), optionally
/// [`send_offsets_to_transaction`](Self::send_offsets_to_transaction), and
/// [`commit_transaction`](Self::commit_transaction) or
/// [`abort_transaction`](Self::abort_transaction). Calls out of this order fail at once
/// with a `Config` error naming the state. A failed send or offset commit makes the
/// transaction abortable ([`TransactionState::AbortableError`]: only abort is allowed);
/// being fenced by a newer writer with the same id (`PRODUCER_FENCED`,
/// `INVALID_PRODUCER_EPOCH`) or unauthorized is fatal: that error, naming the
/// transactional id, is returned by every later call.
///
/// Protocol ([`WriterConfig::transaction_protocol`], chosen by `init_transactions`):
/// KIP-890 transactions v2 where the transaction coordinator finalizes
/// `transaction.version` >= 2 (Kafka 4.x) — partitions join through Produce v12, the group
/// through TxnOffsetCommit v5, and every EndTxn v5 bumps the epoch, its answer giving the
/// producer of the next transaction; otherwise the v1 protocol (AddPartitionsToTxn ≤ v3
/// before the first batch of each partition in a transaction, AddOffsetsToTxn +
/// TxnOffsetCommit ≤ v4 for offsets, EndTxn ≤ v4). `TRANSACTION_ABORTABLE` makes the
/// transaction abortable on both.
///
/// ```no_run
/// use futures::SinkExt;
/// use kafkapipe::writer::{Message, TransactionalWriter, WriterConfig};
///
/// # async fn demo() -> kafkapipe::Result<()> {
/// let config = WriterConfig::new(["127.0.0.1:9092"]).topic("out").transactional_id("etl-1");
/// let mut writer = TransactionalWriter::new(config)?;
/// writer.init_transactions().await?;
/// writer.begin_transaction()?;
/// writer.feed(Message::new("a")).await?;
/// writer.feed(Message::new("b")).await?;
/// match writer.commit_transaction().await {
///     Ok(()) => {}
///     Err(e) if writer.state() == kafkapipe::writer::TransactionState::AbortableError => {
///         eprintln!("aborting: {e}");
///         writer.abort_transaction().await?;
///     }
///     Err(e) => return Err(e),
/// }
/// writer.close().await?;
/// # Ok(()) }
/// ```
pub struct TransactionalWriter {
    inner: Writer,
    txn: Arc<TxnShared>,
    coordinator: Arc<Coordinator>,
    cluster: Cluster,
    cfg: Arc<WriterConfig>,
}

impl std::fmt::Debug for TransactionalWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TransactionalWriter")
            .field("transactional_id", &self.txn.id)
            .field("state", &self.state())
            .field("stats", &self.inner.stats())
            .finish_non_exhaustive()
    }
}

impl TransactionalWriter {
    /// Start a transactional writer: validates `config` (which must have a
    /// [`transactional_id`](WriterConfig::transactional_id)) and spawns its background
    /// task on the current Tokio runtime. Nothing is sent before
    /// [`init_transactions`](Self::init_transactions).
    ///
    /// # Errors
    ///
    /// `Config` for an invalid configuration, one without a transactional id, or when
    /// called outside a Tokio runtime.
    ///
    /// ```no_run
    /// use kafkapipe::writer::{TransactionalWriter, WriterConfig};
    /// # fn demo() -> kafkapipe::Result<()> {
    /// let writer = TransactionalWriter::new(
    ///     WriterConfig::new(["127.0.0.1:9092"]).topic("out").transactional_id("etl-1"),
    /// )?;
    /// # Ok(()) }
    /// ```
    pub fn new(config: WriterConfig) -> Result<TransactionalWriter> {
        let Some(id) = config.transactional_id.clone() else {
            return Err(Error::config(
                "TransactionalWriter needs WriterConfig::transactional_id",
            ));
        };
        let txn = Arc::new(TxnShared::new(&id));
        let cfg = Arc::new(config);
        let (inner, cluster, coordinator) = Writer::start(cfg.clone(), Some(txn.clone()))?;
        let coordinator = coordinator.ok_or_else(closed_error)?;
        Ok(TransactionalWriter {
            inner,
            txn,
            coordinator,
            cluster,
            cfg,
        })
    }

    /// The state of the writer's transaction.
    ///
    /// ```no_run
    /// # fn demo(writer: &kafkapipe::writer::TransactionalWriter) {
    /// println!("{:?}", writer.state());
    /// # }
    /// ```
    pub fn state(&self) -> TransactionState {
        self.txn.lock().state()
    }

    /// The transaction protocol in use: `V1` or `V2` once
    /// [`init_transactions`](Self::init_transactions) chose it (never `Auto`), `None`
    /// before.
    ///
    /// ```no_run
    /// use kafkapipe::writer::TransactionProtocol;
    /// # fn demo(writer: &kafkapipe::writer::TransactionalWriter) {
    /// if writer.protocol() == Some(TransactionProtocol::V2) {
    ///     println!("KIP-890 transactions v2");
    /// }
    /// # }
    /// ```
    pub fn protocol(&self) -> Option<TransactionProtocol> {
        self.txn.lock().protocol
    }

    /// The writer's counters.
    ///
    /// ```no_run
    /// # fn demo(writer: &kafkapipe::writer::TransactionalWriter) {
    /// println!("{} messages written", writer.stats().messages);
    /// # }
    /// ```
    pub fn stats(&self) -> WriterStats {
        self.inner.stats()
    }

    /// Report the outcome of every message accepted from now on (see
    /// [`Writer::deliveries`]). Messages dropped by an abort are reported with a
    /// `Closed` error.
    ///
    /// ```no_run
    /// use futures::StreamExt;
    /// # async fn demo(writer: kafkapipe::writer::TransactionalWriter) {
    /// let mut deliveries = writer.deliveries();
    /// while let Some(d) = deliveries.next().await {
    ///     println!("{:?}", d.result);
    /// }
    /// # }
    /// ```
    pub fn deliveries(&self) -> super::Deliveries {
        self.inner.deliveries()
    }

    /// Register the transactional id with its transaction coordinator (found with
    /// FindCoordinator) and get the producer id and epoch (InitProducerId). This fences
    /// every earlier writer with the same id and completes (aborts) a transaction it left
    /// open. Retries `CONCURRENT_TRANSACTIONS`, `COORDINATOR_LOAD_IN_PROGRESS` and a
    /// moved or unavailable coordinator with a backoff, for at most
    /// [`WriterConfig::delivery_timeout`].
    ///
    /// # Errors
    ///
    /// `Config` if already initialized; the coordinator's error otherwise (a retriable
    /// one leaves the writer uninitialized: call again).
    ///
    /// ```no_run
    /// # async fn demo(mut writer: kafkapipe::writer::TransactionalWriter) -> kafkapipe::Result<()> {
    /// writer.init_transactions().await?;
    /// # Ok(()) }
    /// ```
    pub async fn init_transactions(&mut self) -> Result<()> {
        self.txn.lock().start_init()?;
        let (producer, protocol) = match self.init_producer(None).await {
            Ok(p) => p,
            Err(e) => return Err(self.txn.lock().fail(&e)),
        };
        info!(transactional_id = %self.txn.id, producer_id = producer.0, producer_epoch = producer.1, ?protocol, "transactional writer initialized");
        {
            let mut m = self.txn.lock();
            m.protocol = Some(protocol);
            m.initialized(producer);
        }
        self.send_cmd(Cmd::Producer(producer))
    }

    /// Open a transaction (no request: the coordinator learns of it with its first
    /// partition or group).
    ///
    /// # Errors
    ///
    /// `Config` unless the writer is initialized with no transaction open; the fatal
    /// error after one.
    ///
    /// ```no_run
    /// # fn demo(mut writer: kafkapipe::writer::TransactionalWriter) -> kafkapipe::Result<()> {
    /// writer.begin_transaction()?;
    /// # Ok(()) }
    /// ```
    pub fn begin_transaction(&mut self) -> Result<()> {
        self.txn.lock().begin()?;
        self.send_cmd(Cmd::TxnBegin)
    }

    /// Write `msgs` in the open transaction and wait until all are acknowledged (see
    /// [`Writer::write_messages`]). Acknowledged messages are in the log but visible to
    /// `read_committed` readers only once the transaction commits.
    ///
    /// # Errors
    ///
    /// `Config` outside a transaction; the first delivery error (the transaction is then
    /// abortable, or the writer fenced).
    ///
    /// ```no_run
    /// use kafkapipe::writer::Message;
    /// # async fn demo(mut writer: kafkapipe::writer::TransactionalWriter) -> kafkapipe::Result<()> {
    /// writer.begin_transaction()?;
    /// writer.write_messages([Message::new("a"), Message::new("b")]).await?;
    /// writer.commit_transaction().await?;
    /// # Ok(()) }
    /// ```
    pub async fn write_messages<I>(&self, msgs: I) -> Result<()>
    where
        I: IntoIterator<Item = Message>,
    {
        self.txn.lock().check_send()?;
        let r = self.inner.write_messages(msgs).await;
        // A fatal error is reported as such, naming the transactional id.
        r.map_err(|e| self.txn.lock().fail(&e))
    }

    /// Commit the consumed `offsets` (the offset of the next message to read, per
    /// partition) of `group` with the open transaction (v1: AddOffsetsToTxn to the
    /// transaction coordinator, then TxnOffsetCommit to the group coordinator; v2:
    /// TxnOffsetCommit v5 alone; carrying the membership for KIP-447 fencing). The group sees them when the transaction
    /// commits, never if it aborts.
    ///
    /// # Errors
    ///
    /// `Config` outside a transaction; the coordinators' errors (a stale membership —
    /// `ILLEGAL_GENERATION`, `UNKNOWN_MEMBER_ID`, `FENCED_INSTANCE_ID` — makes the
    /// transaction abortable).
    ///
    /// ```no_run
    /// use kafkapipe::admin::TopicPartition;
    /// use kafkapipe::writer::GroupMetadata;
    /// # async fn demo(mut writer: kafkapipe::writer::TransactionalWriter) -> kafkapipe::Result<()> {
    /// writer.begin_transaction()?;
    /// // ... messages made from records up to offset 41 of in/0 ...
    /// writer
    ///     .send_offsets_to_transaction([(TopicPartition::new("in", 0), 42)], &GroupMetadata::new("etl"))
    ///     .await?;
    /// writer.commit_transaction().await?;
    /// # Ok(()) }
    /// ```
    pub async fn send_offsets_to_transaction<I>(
        &mut self,
        offsets: I,
        group: &GroupMetadata,
    ) -> Result<()>
    where
        I: IntoIterator<Item = (TopicPartition, i64)>,
    {
        let (producer_id, producer_epoch) = self
            .txn
            .lock()
            .check_in_transaction("send_offsets_to_transaction")?;
        let offsets: Vec<(TopicPartition, i64)> = offsets.into_iter().collect();
        let r = self
            .send_offsets(producer_id, producer_epoch, offsets, group)
            .await;
        r.map_err(|e| self.txn.lock().fail(&e))
    }

    /// Commit the open transaction: wait until every message sent in it is acknowledged
    /// (as a flush does), then EndTxn(commit). After `Ok` its messages and offsets are
    /// visible to `read_committed` readers (the coordinator writes the commit markers
    /// right after answering). A transaction with nothing in it commits without a
    /// request.
    ///
    /// # Errors
    ///
    /// `Config` outside a transaction; the first failed message of the transaction or
    /// EndTxn's error — the transaction is then abortable (call
    /// [`abort_transaction`](Self::abort_transaction)) or, if fenced, the writer is done.
    /// A retriable EndTxn error that outlasted [`WriterConfig::delivery_timeout`]
    /// (coordinator unreachable, timeouts) leaves the state `Committing`: call
    /// `commit_transaction` again.
    ///
    /// # Cancellation safety
    ///
    /// Dropped midway, the state stays `Committing`: call `commit_transaction` again.
    ///
    /// ```no_run
    /// # async fn demo(mut writer: kafkapipe::writer::TransactionalWriter) -> kafkapipe::Result<()> {
    /// writer.begin_transaction()?;
    /// writer.commit_transaction().await?;
    /// # Ok(()) }
    /// ```
    pub async fn commit_transaction(&mut self) -> Result<()> {
        self.txn.lock().start_commit()?;
        self.drain(false).await?;
        let touched = {
            let m = self.txn.lock();
            if m.state() != TransactionState::Committing {
                return Err(m.illegal("commit_transaction"));
            }
            m.touched
        };
        if touched {
            match self.end_txn(true).await {
                Ok(next) => self.next_producer(next)?,
                // The coordinator may have the commit (or may get it on a retry): the
                // state stays `Committing`, and calling commit again resends it, as the
                // Java client allows after a commit timeout.
                Err(e) if e.is_retriable() && !is_fatal(&e) => {
                    warn!(transactional_id = %self.txn.id, error = %e, "EndTxn(commit) did not get through; commit_transaction may be called again");
                    return Err(e);
                }
                Err(e) => return Err(self.txn.lock().fail(&e)),
            }
        }
        debug!(transactional_id = %self.txn.id, "transaction committed");
        self.txn.lock().completed();
        Ok(())
    }

    /// Abort the open (or failed) transaction: messages not sent yet are dropped (they
    /// fail with a `Closed` error in [`Writer::deliveries`]-style reports), those in
    /// flight are awaited, then EndTxn(abort) has the coordinator write abort markers.
    /// If a message's fate was unknown, the epoch is bumped (InitProducerId again) so
    /// the next transaction's sequence numbers start afresh.
    ///
    /// # Errors
    ///
    /// `Config` with no transaction open; EndTxn's error (a retriable one leaves the
    /// state `Aborting`: call again).
    ///
    /// ```no_run
    /// # async fn demo(mut writer: kafkapipe::writer::TransactionalWriter) -> kafkapipe::Result<()> {
    /// writer.begin_transaction()?;
    /// writer.abort_transaction().await?;
    /// # Ok(()) }
    /// ```
    pub async fn abort_transaction(&mut self) -> Result<()> {
        self.txn.lock().start_abort()?;
        self.drain(true).await?;
        let (touched, bump, producer) = {
            let m = self.txn.lock();
            if m.state() != TransactionState::Aborting {
                return Err(m.illegal("abort_transaction"));
            }
            (m.touched, m.needs_bump, m.producer)
        };
        if touched {
            match self.end_txn(false).await {
                Ok(next) => self.next_producer(next)?,
                Err(e) => return Err(self.txn.lock().fail(&e)),
            }
        }
        // Transactions v2: EndTxn bumped the epoch already.
        let bump = bump && self.txn.lock().needs_bump;
        if bump {
            match self.init_producer(producer).await {
                Ok((p, _)) => {
                    debug!(transactional_id = %self.txn.id, producer_id = p.0, producer_epoch = p.1, "epoch bumped after the abort");
                    self.txn.lock().initialized(p);
                    self.send_cmd(Cmd::Producer(p))?;
                }
                Err(e) => return Err(self.txn.lock().fail(&e)),
            }
        }
        debug!(transactional_id = %self.txn.id, "transaction aborted");
        self.txn.lock().completed();
        Ok(())
    }

    /// Abort an open transaction (as the Java producer does on close), then close the
    /// writer: the task stops and the connections close. Closing through the `Sink`
    /// (`SinkExt::close`) does not abort: the coordinator aborts a transaction left
    /// open after [`WriterConfig::transaction_timeout`], and `read_committed` readers
    /// wait until then.
    ///
    /// # Errors
    ///
    /// The abort's error; the writer is closed anyway.
    ///
    /// ```no_run
    /// # async fn demo(mut writer: kafkapipe::writer::TransactionalWriter) -> kafkapipe::Result<()> {
    /// writer.close().await?;
    /// # Ok(()) }
    /// ```
    pub async fn close(&mut self) -> Result<()> {
        let open = matches!(
            self.state(),
            TransactionState::InTransaction
                | TransactionState::AbortableError
                | TransactionState::Aborting
        );
        let aborted = if open {
            self.abort_transaction().await
        } else {
            Ok(())
        };
        let closed = futures::SinkExt::close(&mut self.inner).await;
        self.coordinator.close().await;
        aborted.and(if self.state() == TransactionState::FatalError {
            Ok(())
        } else {
            closed
        })
    }
}

/// The calls behind the public ones: the transaction coordinator's requests with their
/// retries, and the commands to the writer's task.
impl TransactionalWriter {
    async fn send_offsets(
        &self,
        producer_id: i64,
        producer_epoch: i16,
        offsets: Vec<(TopicPartition, i64)>,
        group: &GroupMetadata,
    ) -> Result<()> {
        let deadline = super::task::after(Instant::now(), self.cfg.delivery_timeout);
        let id = self.txn.id.to_string();
        let v2 = self.txn.lock().v2();
        if v2 {
            // TxnOffsetCommit v5 adds the group: the transaction may be started by it
            // even if its answer is lost.
            self.txn.lock().touch();
        } else {
            self.add_offsets(&id, producer_id, producer_epoch, group, deadline)
                .await?;
        }
        let mut topics: Vec<TxnOffsetCommitRequestTopic> = Vec::new();
        for (tp, offset) in offsets {
            let part = TxnOffsetCommitRequestPartition {
                partition_index: tp.partition,
                committed_offset: offset,
                ..Default::default()
            };
            match topics.iter_mut().find(|t| t.name == tp.topic) {
                Some(t) => t.partitions.push(part),
                None => topics.push(TxnOffsetCommitRequestTopic {
                    name: tp.topic,
                    partitions: vec![part],
                    ..Default::default()
                }),
            }
        }
        let req = TxnOffsetCommitRequest {
            transactional_id: id,
            group_id: group.group_id.clone(),
            producer_id,
            producer_epoch,
            generation_id: group.generation_id,
            member_id: group.member_id.clone(),
            group_instance_id: group.group_instance_id.clone(),
            topics,
            ..Default::default()
        };
        let req = &req;
        let group_coordinator = Coordinator::new(
            group.group_id.clone(),
            self.cluster.clone(),
            attempt_timeout(&self.cfg),
        );
        let r = txn_call(
            &group_coordinator,
            "TxnOffsetCommit",
            deadline,
            &self.cfg,
            |c| async move {
                let v = c.version_for::<TxnOffsetCommitRequest>()?;
                let v = if v2 {
                    v2_version(&c, "TxnOffsetCommit", v, V2_TXN_OFFSET_COMMIT_VERSION)?
                } else {
                    v.min(MAX_TXN_OFFSET_COMMIT_VERSION)
                };
                let resp = c.send_version(req, v).await?;
                for t in &resp.topics {
                    for p in &t.partitions {
                        if let Some(code) = ErrorCode::non_zero(p.error_code) {
                            return Err(Error::kafka(code)
                                .with_topic(t.name.clone())
                                .with_partition(p.partition_index)
                                .with_broker(c.broker()));
                        }
                    }
                }
                Ok(())
            },
        )
        .await;
        group_coordinator.close().await;
        r
    }

    /// AddOffsetsToTxn (v1): the group joins the transaction before TxnOffsetCommit.
    async fn add_offsets(
        &self,
        id: &str,
        producer_id: i64,
        producer_epoch: i16,
        group: &GroupMetadata,
        deadline: Instant,
    ) -> Result<()> {
        let req = AddOffsetsToTxnRequest {
            transactional_id: id.to_string(),
            producer_id,
            producer_epoch,
            group_id: group.group_id.clone(),
            ..Default::default()
        };
        let req = &req;
        txn_call(
            &self.coordinator,
            "AddOffsetsToTxn",
            deadline,
            &self.cfg,
            |c| async move {
                let resp = c.send(req).await?;
                check(resp.error_code, &c)
            },
        )
        .await?;
        self.txn.lock().touch();
        Ok(())
    }

    /// Transactions v2: take the producer id and epoch EndTxn answered for the next
    /// transaction (the task restarts every partition's sequence numbers at 0).
    fn next_producer(&self, next: Option<(i64, i16)>) -> Result<()> {
        let Some(p) = next else {
            return Ok(());
        };
        debug!(transactional_id = %self.txn.id, producer_id = p.0, producer_epoch = p.1, "next transaction's producer (transactions v2)");
        self.txn.lock().initialized(p);
        self.send_cmd(Cmd::Producer(p))
    }

    fn send_cmd(&self, cmd: Cmd) -> Result<()> {
        self.inner.shared.send(cmd).map_err(|_| closed_error())
    }

    /// Have the task deliver (or, with `abort`, drop what is not in flight) every message
    /// accepted so far, and wait for it.
    async fn drain(&mut self, abort: bool) -> Result<()> {
        let (tx, rx) = oneshot::channel();
        self.send_cmd(Cmd::Drain { abort, reply: tx })?;
        rx.await.map_err(|_| closed_error())?;
        // Everything this sink accepted is done; its failures are in the state machine.
        self.inner.sink_group = None;
        self.inner.sink_count = 0;
        self.inner.flushing = None;
        Ok(())
    }

    /// EndTxn with the current producer. Transactions v2 (EndTxn v5): the coordinator
    /// bumped the epoch and answers the producer id and epoch of the next transaction.
    async fn end_txn(&self, commit: bool) -> Result<Option<(i64, i16)>> {
        let (producer, v2) = {
            let m = self.txn.lock();
            (m.producer.ok_or_else(|| m.illegal("EndTxn")), m.v2())
        };
        let (producer_id, producer_epoch) = producer?;
        let req = EndTxnRequest {
            transactional_id: self.txn.id.to_string(),
            producer_id,
            producer_epoch,
            committed: commit,
            ..Default::default()
        };
        let req = &req;
        let deadline = super::task::after(Instant::now(), self.cfg.delivery_timeout);
        txn_call(
            &self.coordinator,
            "EndTxn",
            deadline,
            &self.cfg,
            |c| async move {
                let v = c.version_for::<EndTxnRequest>()?;
                let v = if v2 {
                    v2_version(&c, "EndTxn", v, V2_END_TXN_VERSION)?
                } else {
                    v.min(MAX_END_TXN_VERSION)
                };
                let resp = c.send_version(req, v).await?;
                check(resp.error_code, &c)?;
                if !v2 {
                    return Ok(None);
                }
                if resp.producer_id < 0 || resp.producer_epoch < 0 {
                    return Err(Error::protocol(format!(
                        "EndTxn v{v} answered no producer for the next transaction (id {}, epoch {})",
                        resp.producer_id, resp.producer_epoch
                    ))
                    .with_broker(c.broker()));
                }
                Ok(Some((resp.producer_id, resp.producer_epoch)))
            },
        )
        .instrument(tracing::debug_span!(
            "end_txn",
            transactional_id = %self.txn.id,
            producer_id,
            epoch = producer_epoch,
            commit
        ))
        .await
    }

    /// InitProducerId with the transactional id; `current` (after an abort) asks for an
    /// epoch bump of that producer (KIP-360, v3+), which older brokers do anyway for a
    /// transactional id.
    async fn init_producer(
        &self,
        current: Option<(i64, i16)>,
    ) -> Result<((i64, i16), TransactionProtocol)> {
        let deadline = super::task::after(Instant::now(), self.cfg.delivery_timeout);
        let timeout_ms =
            i32::try_from(self.cfg.transaction_timeout.as_millis()).unwrap_or(i32::MAX);
        let id = self.txn.id.to_string();
        let id = &id;
        let wanted = self.cfg.transaction_protocol;
        let chosen = self.txn.lock().protocol;
        txn_call(
            &self.coordinator,
            "InitProducerId",
            deadline,
            &self.cfg,
            |c| async move {
                // The protocol is chosen once, from the coordinator of the first init.
                let protocol = match chosen {
                    Some(p) => p,
                    None => choose_protocol(wanted, &c, id)?,
                };
                let v = c.version_for::<InitProducerIdRequest>()?;
                let (producer_id, producer_epoch) = match current {
                    Some(p) if v >= 3 => p,
                    _ => (-1, -1),
                };
                let req = InitProducerIdRequest {
                    transactional_id: Some(id.clone()),
                    transaction_timeout_ms: timeout_ms,
                    producer_id,
                    producer_epoch,
                    ..Default::default()
                };
                let resp = c.send_version(&req, v).await?;
                check(resp.error_code, &c)?;
                Ok(((resp.producer_id, resp.producer_epoch), protocol))
            },
        )
        .await
    }
}

impl futures::Sink<Message> for TransactionalWriter {
    type Error = Error;

    fn poll_ready(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<()>> {
        let this = self.get_mut();
        this.txn.lock().check_send()?;
        Pin::new(&mut this.inner)
            .poll_ready(cx)
            .map_err(|e| this.txn.lock().fail(&e))
    }

    fn start_send(self: Pin<&mut Self>, msg: Message) -> Result<()> {
        let this = self.get_mut();
        this.txn.lock().check_send()?;
        Pin::new(&mut this.inner).start_send(msg)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<()>> {
        let this = self.get_mut();
        Pin::new(&mut this.inner)
            .poll_flush(cx)
            .map_err(|e| this.txn.lock().fail(&e))
    }

    fn poll_close(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_close(cx)
    }
}

/// The consumer group whose offsets a transaction commits
/// ([`TransactionalWriter::send_offsets_to_transaction`]), with the membership the group
/// checks (KIP-447): a member that lost its partitions in a rebalance has an old
/// generation, so its transactional offset commit is refused and its transaction must be
/// aborted — zombies are fenced by the group, not by one transactional id per partition.
///
/// ```no_run
/// use kafkapipe::writer::GroupMetadata;
/// let meta = GroupMetadata::new("etl")
///     .generation_id(7)
///     .member_id("consumer-1-5b0c")
///     .group_instance_id(Some("host-a".to_string()));
/// assert_eq!(meta.generation_id, 7);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupMetadata {
    /// The group id.
    pub group_id: String,
    /// The member's generation; `-1` (default) for offsets committed without group
    /// membership (the group then checks nothing).
    pub generation_id: i32,
    /// The member id; empty (default) without membership.
    pub member_id: String,
    /// The static member's instance id, if any.
    pub group_instance_id: Option<String>,
}

impl GroupMetadata {
    /// `group_id` without membership (generation `-1`, no member id), like the Java
    /// client's `new ConsumerGroupMetadata(groupId)`.
    ///
    /// ```no_run
    /// let meta = kafkapipe::writer::GroupMetadata::new("etl");
    /// assert_eq!(meta.generation_id, -1);
    /// ```
    pub fn new(group_id: impl Into<String>) -> Self {
        GroupMetadata {
            group_id: group_id.into(),
            generation_id: -1,
            member_id: String::new(),
            group_instance_id: None,
        }
    }

    /// Set [`GroupMetadata::generation_id`].
    ///
    /// ```no_run
    /// let meta = kafkapipe::writer::GroupMetadata::new("etl").generation_id(3);
    /// ```
    pub fn generation_id(mut self, generation: i32) -> Self {
        self.generation_id = generation;
        self
    }

    /// Set [`GroupMetadata::member_id`].
    ///
    /// ```no_run
    /// let meta = kafkapipe::writer::GroupMetadata::new("etl").member_id("m-1");
    /// ```
    pub fn member_id(mut self, member_id: impl Into<String>) -> Self {
        self.member_id = member_id.into();
        self
    }

    /// Set [`GroupMetadata::group_instance_id`].
    ///
    /// ```no_run
    /// let meta = kafkapipe::writer::GroupMetadata::new("etl").group_instance_id(Some("a".into()));
    /// ```
    pub fn group_instance_id(mut self, id: Option<String>) -> Self {
        self.group_instance_id = id;
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;
    use TransactionState::*;

    #[tokio::test]
    async fn calls_before_init_fail_without_a_broker() {
        use futures::SinkExt;
        let mut w = TransactionalWriter::new(
            WriterConfig::new(["127.0.0.1:1"])
                .topic("t")
                .transactional_id("tx-9"),
        )
        .unwrap();
        assert_eq!(w.state(), Uninitialized);
        let e = w.write_messages([Message::new("x")]).await.unwrap_err();
        assert!(e.to_string().contains("tx-9"), "{e}");
        assert!(w.feed(Message::new("x")).await.is_err());
        assert!(w.begin_transaction().is_err());
        assert!(w.commit_transaction().await.is_err());
        assert!(w.abort_transaction().await.is_err());
        assert!(w
            .send_offsets_to_transaction(
                [(TopicPartition::new("t", 0), 1)],
                &GroupMetadata::new("g")
            )
            .await
            .is_err());
        w.close().await.unwrap();
    }

    #[test]
    fn a_transactional_config_needs_the_transactional_writer() {
        let cfg = WriterConfig::new(["127.0.0.1:1"]).transactional_id("t");
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let e = Writer::new(cfg).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::Config);
            assert!(e.to_string().contains("TransactionalWriter"), "{e}");
            let e = TransactionalWriter::new(WriterConfig::new(["127.0.0.1:1"])).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::Config);
        });
    }
}
