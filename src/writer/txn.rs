//! Transactions: [`TransactionalWriter`], its state machine and the calls to the
//! transaction and group coordinators, over the v1 transaction protocol or KIP-890
//! transactions v2 ([`TransactionProtocol`]).
//!
//! The writer's background task does the produce side (v1: it adds each partition to the
//! transaction with AddPartitionsToTxn before its first batch; v2: Produce v12 adds it;
//! either way it stamps batches as transactional and reports failures into the state
//! machine); this module does the rest — InitProducerId, EndTxn, AddOffsetsToTxn (v1) and
//! TxnOffsetCommit — on the caller's task, and keeps the [`TransactionState`] both sides
//! consult.
//!
//! Transactions v2 as the Java client does it (KIP-890 part 2, `isTransactionV2Enabled`):
//! chosen once, by `init_transactions`, when the transaction coordinator finalizes
//! `transaction.version` >= 2 and supports Produce v12, EndTxn v5 and TxnOffsetCommit v5.
//! Every EndTxn v5 (commit or abort) has the coordinator bump the epoch and answers the
//! producer id and epoch of the next transaction (a new producer id when the epoch is
//! exhausted); the writer takes them over and its sequence numbers restart at 0, so an
//! abort needs no InitProducerId to bump the epoch.
//!
//! Why a separate type rather than methods on [`Writer`]: a `Writer` is `Clone`, and
//! transaction boundaries shared by clones would be a trap (one clone's commit would
//! take another's half-written work with it). A `TransactionalWriter` is one owner of the
//! boundaries: `begin`/`commit`/`abort` take `&mut self`, so no send can race a commit,
//! and a plain `Writer` never carries methods that could only fail.

use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use std::{future::Future, pin::Pin};

use tokio::sync::oneshot;
use tracing::{debug, info, warn, Instrument};

use super::task::Cmd;
use super::{closed_error, Message, TransactionProtocol, Writer, WriterConfig, WriterStats};
use crate::admin::TopicPartition;
use crate::cluster::Cluster;
use crate::conn::Connection;
use crate::error::{Error, ErrorKind, Result};
use crate::group::coordinator::Coordinator;
use crate::protocol::messages::{
    AddOffsetsToTxnRequest, AddPartitionsToTxnRequest, AddPartitionsToTxnTopic, EndTxnRequest,
    InitProducerIdRequest, ProduceRequest, TxnOffsetCommitRequest, TxnOffsetCommitRequestPartition,
    TxnOffsetCommitRequestTopic,
};
use crate::protocol::ErrorCode;

/// Highest AddPartitionsToTxn version: v4+ is the broker-to-broker (batched) form, and a
/// client of the v1 protocol stays at v3 — Kafka 4.x accepts it even with
/// `transaction.version=2` finalized.
const MAX_ADD_PARTITIONS_VERSION: i16 = 3;
/// Highest EndTxn version: v5 is transactions v2 (KIP-890), where every EndTxn bumps
/// the epoch.
const MAX_END_TXN_VERSION: i16 = 4;
/// Highest TxnOffsetCommit version: v5 adds the group to the transaction implicitly
/// (transactions v2).
const MAX_TXN_OFFSET_COMMIT_VERSION: i16 = 4;
/// Highest Produce version of a transactional writer of the v1 protocol: v12 tells the
/// broker the client speaks transactions v2 (partitions added implicitly).
pub(crate) const MAX_TXN_PRODUCE_VERSION: i16 = 11;
/// The versions transactions v2 needs: Produce v12 (partitions join implicitly), EndTxn
/// v5 (epoch bump, new producer id/epoch in the response), TxnOffsetCommit v5 (the group
/// joins implicitly).
pub(crate) const V2_PRODUCE_VERSION: i16 = 12;
const V2_END_TXN_VERSION: i16 = 5;
const V2_TXN_OFFSET_COMMIT_VERSION: i16 = 5;
/// The finalized feature level of `transaction.version` that enables transactions v2.
const V2_FEATURE_LEVEL: i16 = 2;

/// Where a [`TransactionalWriter`] is in its life.
///
/// ```no_run
/// use kafkapipe::writer::TransactionState;
/// # fn demo(writer: &kafkapipe::writer::TransactionalWriter) {
/// if writer.state() == TransactionState::AbortableError {
///     println!("the transaction failed: abort it");
/// }
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransactionState {
    /// Created; [`TransactionalWriter::init_transactions`] not done yet.
    Uninitialized,
    /// Initialized, no transaction open: [`TransactionalWriter::begin_transaction`] next.
    Ready,
    /// A transaction is open: messages and offsets may be sent.
    InTransaction,
    /// A commit is under way (or was interrupted: call commit again).
    Committing,
    /// An abort is under way (or was interrupted: call abort again).
    Aborting,
    /// Something in the open transaction failed (a produce, an offset commit): only
    /// [`TransactionalWriter::abort_transaction`] is allowed.
    AbortableError,
    /// The writer is fenced by a newer one with the same transactional id, or not
    /// authorized: every call fails; make a new writer.
    FatalError,
}

/// Whether `e` ends the transactional writer for good (as the Java client's fatal
/// errors): fenced, unauthorized, or the broker cannot do transactions.
fn is_fatal(e: &Error) -> bool {
    match e.kind() {
        ErrorKind::Kafka(c) => matches!(
            c,
            ErrorCode::ProducerFenced
                | ErrorCode::InvalidProducerEpoch
                | ErrorCode::TransactionalIdAuthorizationFailed
                | ErrorCode::ClusterAuthorizationFailed
                | ErrorCode::InvalidTxnState
                | ErrorCode::UnsupportedForMessageFormat
                | ErrorCode::UnsupportedVersion
        ),
        ErrorKind::UnsupportedVersion => true,
        _ => false,
    }
}

/// The transaction state machine, shared by the handle and the writer's task.
#[derive(Debug)]
pub(crate) struct Machine {
    id: String,
    state: TransactionState,
    /// Why the state is `AbortableError` or `FatalError`.
    error: Option<Error>,
    /// Producer id and epoch, once initialized.
    producer: Option<(i64, i16)>,
    /// The coordinator knows of the open transaction (a partition or a group was added):
    /// ending it takes an EndTxn.
    touched: bool,
    /// A batch of the transaction may or may not have been written (or its sequence
    /// numbers were used and dropped): after the abort the epoch is bumped, which restarts
    /// every partition's sequence numbers.
    needs_bump: bool,
    /// The protocol chosen by `init_transactions` (`None` before).
    protocol: Option<TransactionProtocol>,
}

impl Machine {
    pub(crate) fn new(id: impl Into<String>) -> Machine {
        Machine {
            id: id.into(),
            state: TransactionState::Uninitialized,
            error: None,
            producer: None,
            touched: false,
            needs_bump: false,
            protocol: None,
        }
    }

    /// Transactions v2 was chosen: partitions join the transaction through Produce v12.
    pub(crate) fn v2(&self) -> bool {
        self.protocol == Some(TransactionProtocol::V2)
    }

    pub(crate) fn state(&self) -> TransactionState {
        self.state
    }

    fn illegal(&self, call: &str) -> Error {
        if let Some(e) = &self.error {
            if self.state == TransactionState::FatalError {
                return e.clone();
            }
            if self.state == TransactionState::AbortableError {
                return e.clone().with_message(format!(
                    "{call}: the transaction of transactional id '{}' failed and must be aborted ({})",
                    self.id,
                    e.message().unwrap_or("see the cause")
                ));
            }
        }
        let hint = match self.state {
            TransactionState::Uninitialized => "call init_transactions first",
            TransactionState::Ready => "no transaction is open: call begin_transaction first",
            TransactionState::InTransaction => "a transaction is already open",
            TransactionState::Committing => "a commit is in progress: call commit_transaction",
            TransactionState::Aborting => "an abort is in progress: call abort_transaction",
            TransactionState::AbortableError => "the transaction must be aborted",
            TransactionState::FatalError => "the writer is unusable: create a new one",
        };
        Error::config(format!(
            "{call} is not allowed for transactional id '{}' in state {:?}: {hint}",
            self.id, self.state
        ))
    }

    /// The error of a failed state (else an illegal-state error).
    pub(crate) fn fail_error(&self) -> Error {
        self.error
            .clone()
            .unwrap_or_else(|| self.illegal("writing a message"))
    }

    /// Messages may be sent: a transaction is open.
    pub(crate) fn check_send(&self) -> Result<()> {
        match self.state {
            TransactionState::InTransaction => Ok(()),
            _ => Err(self.illegal("sending a message")),
        }
    }

    fn start_init(&self) -> Result<()> {
        match self.state {
            TransactionState::Uninitialized => Ok(()),
            _ => Err(self.illegal("init_transactions")),
        }
    }

    fn initialized(&mut self, producer: (i64, i16)) {
        self.producer = Some(producer);
        self.needs_bump = false;
        if self.state == TransactionState::Uninitialized {
            self.state = TransactionState::Ready;
        }
    }

    fn begin(&mut self) -> Result<()> {
        match self.state {
            TransactionState::Ready => {
                self.state = TransactionState::InTransaction;
                self.touched = false;
                Ok(())
            }
            _ => Err(self.illegal("begin_transaction")),
        }
    }

    fn start_commit(&mut self) -> Result<()> {
        match self.state {
            TransactionState::InTransaction | TransactionState::Committing => {
                self.state = TransactionState::Committing;
                Ok(())
            }
            _ => Err(self.illegal("commit_transaction")),
        }
    }

    fn start_abort(&mut self) -> Result<()> {
        match self.state {
            TransactionState::InTransaction
            | TransactionState::AbortableError
            | TransactionState::Aborting => {
                self.state = TransactionState::Aborting;
                Ok(())
            }
            _ => Err(self.illegal("abort_transaction")),
        }
    }

    fn check_in_transaction(&self, call: &str) -> Result<(i64, i16)> {
        match (self.state, self.producer) {
            (TransactionState::InTransaction, Some(p)) => Ok(p),
            _ => Err(self.illegal(call)),
        }
    }

    /// The commit or abort is done: ready for the next transaction.
    fn completed(&mut self) {
        self.state = TransactionState::Ready;
        self.touched = false;
        self.error = None;
    }

    /// The coordinator has the transaction (a partition or group was added).
    pub(crate) fn touch(&mut self) {
        self.touched = true;
    }

    /// A batch may have been written without being acknowledged, or its sequence numbers
    /// were given up: bump the epoch after the abort.
    pub(crate) fn need_bump(&mut self) {
        self.needs_bump = true;
    }

    /// Something failed with `e`: a fatal error ends the writer, any other error during
    /// an open transaction or a commit makes it abortable. Returns the error to report
    /// (naming the transactional id when fatal).
    pub(crate) fn fail(&mut self, e: &Error) -> Error {
        if self.state == TransactionState::FatalError {
            return self.error.clone().unwrap_or_else(|| e.clone());
        }
        if is_fatal(e) {
            let e = e.clone().with_message(format!(
                "transactional id '{}' can no longer be used (fenced by a newer producer with \
                 the same id, or not authorized): {}",
                self.id,
                e.message()
                    .map_or_else(|| format!("{:?}", e.kind()), str::to_string)
            ));
            warn!(transactional_id = %self.id, error = %e, "transactional writer failed for good");
            self.state = TransactionState::FatalError;
            self.error = Some(e.clone());
            return e;
        }
        if matches!(
            self.state,
            TransactionState::InTransaction | TransactionState::Committing
        ) {
            debug!(transactional_id = %self.id, error = %e, "transaction must be aborted");
            self.state = TransactionState::AbortableError;
            self.error = Some(e.clone());
        }
        e.clone()
    }
}

/// The state machine and transactional id, shared by the handle and the task.
pub(crate) struct TxnShared {
    pub(crate) id: Arc<str>,
    machine: Mutex<Machine>,
}

impl TxnShared {
    pub(crate) fn new(id: &str) -> TxnShared {
        TxnShared {
            id: Arc::from(id),
            machine: Mutex::new(Machine::new(id)),
        }
    }

    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, Machine> {
        self.machine
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The Produce versions (lowest, highest) the writer's task may use: v12 or later
    /// for transactions v2 (the broker then adds partitions to the transaction itself),
    /// at most v11 for the v1 protocol.
    pub(crate) fn produce_versions(&self) -> (i16, i16) {
        if self.lock().v2() {
            (V2_PRODUCE_VERSION, i16::MAX)
        } else {
            (0, MAX_TXN_PRODUCE_VERSION)
        }
    }
}

/// Whether `c` (the transaction coordinator) can do transactions v2: `transaction.version`
/// finalized at level 2 or higher and the versions v2 needs; the reason when it cannot.
fn v2_support(c: &Connection) -> std::result::Result<(), String> {
    let level = c
        .api_versions()
        .map_or(0, |a| a.finalized_level("transaction.version"));
    if level < V2_FEATURE_LEVEL {
        return Err(format!(
            "the cluster finalizes transaction.version={level} (transactions v2 needs {V2_FEATURE_LEVEL})"
        ));
    }
    let version = |v: Result<i16>| v.unwrap_or(-1);
    let needs = [
        (
            "Produce",
            version(c.version_for::<ProduceRequest>()),
            V2_PRODUCE_VERSION,
        ),
        (
            "EndTxn",
            version(c.version_for::<EndTxnRequest>()),
            V2_END_TXN_VERSION,
        ),
        (
            "TxnOffsetCommit",
            version(c.version_for::<TxnOffsetCommitRequest>()),
            V2_TXN_OFFSET_COMMIT_VERSION,
        ),
    ];
    for (api, have, need) in needs {
        if have < need {
            return Err(format!(
                "{api} v{need} is needed, the broker and this client share only up to v{have}"
            ));
        }
    }
    Ok(())
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

/// How long one coordinator request may take.
fn attempt_timeout(cfg: &WriterConfig) -> Duration {
    cfg.write_timeout
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

/// The protocol `wanted` comes to on coordinator `c`: `Auto` is v2 where `c` supports it;
/// a forced `V2` it does not support is a `Config` error naming the reason.
fn choose_protocol(
    wanted: TransactionProtocol,
    c: &Connection,
    id: &str,
) -> Result<TransactionProtocol> {
    let support = v2_support(c);
    let level = c
        .api_versions()
        .map_or(0, |a| a.finalized_level("transaction.version"));
    let chosen = match (wanted, support) {
        (TransactionProtocol::V1, _) => TransactionProtocol::V1,
        (_, Ok(())) => TransactionProtocol::V2,
        (TransactionProtocol::Auto, Err(why)) => {
            debug!(transactional_id = %id, reason = %why, "transactions v2 unavailable");
            TransactionProtocol::V1
        }
        (TransactionProtocol::V2, Err(why)) => {
            return Err(Error::config(format!(
                "transactional id '{id}': TransactionProtocol::V2 was asked for, but the \
                 transaction coordinator (broker {}) cannot do transactions v2: {why}",
                c.broker()
            )))
        }
    };
    debug!(transactional_id = %id, transaction_version = level, protocol = ?chosen, "transaction protocol chosen");
    Ok(chosen)
}

/// `have` (the version shared with `c`) if it is at least `need`, the version
/// transactions v2 needs, else an `UnsupportedVersion` error (the coordinator moved to a
/// broker without it).
fn v2_version(c: &Connection, api: &str, have: i16, need: i16) -> Result<i16> {
    if have >= need {
        Ok(have)
    } else {
        Err(Error::new(
            ErrorKind::UnsupportedVersion,
            format!("transactions v2 needs {api} v{need}; broker shares up to v{have}"),
        )
        .with_broker(c.broker()))
    }
}

/// `Ok` for error code 0, else the broker's error.
fn check(code: i16, c: &Connection) -> Result<()> {
    match ErrorCode::non_zero(code) {
        None => Ok(()),
        Some(code) => Err(Error::kafka(code).with_broker(c.broker())),
    }
}

/// Run `f` on `coordinator` until it succeeds, fails for good or `deadline` passes: a
/// lost, moved or loading coordinator is found again ([`Coordinator::call`]), and
/// `CONCURRENT_TRANSACTIONS` (the previous transaction's markers are still being
/// written) is retried after a backoff from 20 ms doubling to `backoff_max`.
pub(crate) async fn txn_call<T, F, Fut>(
    coordinator: &Coordinator,
    op: &'static str,
    deadline: Instant,
    cfg: &WriterConfig,
    f: F,
) -> Result<T>
where
    F: Fn(Connection) -> Fut,
    Fut: Future<Output = Result<T>>,
{
    let mut backoff = Duration::from_millis(20);
    loop {
        let r = coordinator
            .call(op, deadline, attempt_timeout(cfg), &f)
            .await;
        match r {
            Err(e)
                if e.kafka_code() == Some(ErrorCode::ConcurrentTransactions)
                    && Instant::now() + backoff < deadline =>
            {
                debug!(op, error = %e, "concurrent transaction operation; retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(cfg.backoff_max.max(Duration::from_millis(20)));
            }
            r => return r,
        }
    }
}

/// AddPartitionsToTxn (v1 path, ≤ v3) for `parts` on the transaction coordinator: `Ok`
/// when all were added, else the first real error (not `OPERATION_NOT_ATTEMPTED`).
pub(crate) async fn add_partitions(
    coordinator: &Coordinator,
    cfg: &WriterConfig,
    id: &str,
    producer: (i64, i16),
    parts: &[(Arc<str>, i32)],
) -> Result<()> {
    let mut topics: Vec<AddPartitionsToTxnTopic> = Vec::new();
    for (name, p) in parts {
        match topics.iter_mut().find(|t| *t.name == **name) {
            Some(t) => t.partitions.push(*p),
            None => topics.push(AddPartitionsToTxnTopic {
                name: name.to_string(),
                partitions: vec![*p],
                ..Default::default()
            }),
        }
    }
    let req = AddPartitionsToTxnRequest {
        v3_and_below_transactional_id: id.to_string(),
        v3_and_below_producer_id: producer.0,
        v3_and_below_producer_epoch: producer.1,
        v3_and_below_topics: topics,
        ..Default::default()
    };
    let req = &req;
    let deadline = super::task::after(Instant::now(), cfg.delivery_timeout);
    txn_call(
        coordinator,
        "AddPartitionsToTxn",
        deadline,
        cfg,
        |c| async move {
            let v = c
                .version_for::<AddPartitionsToTxnRequest>()?
                .min(MAX_ADD_PARTITIONS_VERSION);
            let resp = c.send_version(req, v).await?;
            check(resp.error_code, &c)?;
            let mut first: Option<Error> = None;
            for t in &resp.results_by_topic_v3_and_below {
                for p in &t.results_by_partition {
                    let Some(code) = ErrorCode::non_zero(p.partition_error_code) else {
                        continue;
                    };
                    let e = Error::kafka(code)
                        .with_topic(t.name.clone())
                        .with_partition(p.partition_index)
                        .with_broker(c.broker());
                    let better = first.as_ref().map_or(true, |f| {
                        f.kafka_code() == Some(ErrorCode::OperationNotAttempted)
                    });
                    if better {
                        first = Some(e);
                    }
                }
            }
            first.map_or(Ok(()), Err)
        },
    )
    .await
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

#[cfg(test)]
mod tests {
    use super::*;
    use TransactionState::*;

    fn ready() -> Machine {
        let mut m = Machine::new("tx-1");
        m.start_init().unwrap();
        m.initialized((7, 0));
        m
    }

    #[test]
    fn the_happy_path() {
        let mut m = Machine::new("tx-1");
        assert_eq!(m.state(), Uninitialized);
        m.start_init().unwrap();
        m.initialized((7, 0));
        assert_eq!(m.state(), Ready);
        for commit in [true, false] {
            m.begin().unwrap();
            assert_eq!(m.state(), InTransaction);
            m.check_send().unwrap();
            assert_eq!(m.check_in_transaction("x").unwrap(), (7, 0));
            m.touch();
            if commit {
                m.start_commit().unwrap();
                assert_eq!(m.state(), Committing);
            } else {
                m.start_abort().unwrap();
                assert_eq!(m.state(), Aborting);
            }
            m.completed();
            assert_eq!(m.state(), Ready);
            assert!(!m.touched);
        }
    }

    #[test]
    fn illegal_calls_name_the_state_and_the_id() {
        let mut m = Machine::new("tx-1");
        for e in [
            m.check_send().unwrap_err(),
            m.begin().unwrap_err(),
            m.start_commit().unwrap_err(),
            m.start_abort().unwrap_err(),
            m.check_in_transaction("send_offsets_to_transaction")
                .unwrap_err(),
        ] {
            assert_eq!(e.kind(), ErrorKind::Config, "{e}");
            assert!(e.to_string().contains("tx-1"), "{e}");
            assert!(e.to_string().contains("init_transactions"), "{e}");
        }
        assert_eq!(m.state(), Uninitialized);
        let mut m = ready();
        assert!(m.start_init().is_err(), "init twice");
        assert!(m.check_send().is_err(), "send outside a transaction");
        assert!(m.start_commit().is_err(), "commit outside a transaction");
        assert!(m.start_abort().is_err(), "abort outside a transaction");
        m.begin().unwrap();
        let e = m.begin().unwrap_err();
        assert!(e.to_string().contains("already open"), "{e}");
        assert_eq!(m.state(), InTransaction);
    }

    #[test]
    fn an_interrupted_commit_or_abort_can_be_resumed_but_not_switched() {
        let mut m = ready();
        m.begin().unwrap();
        m.start_commit().unwrap();
        assert!(m.start_abort().is_err(), "abort during a commit");
        assert!(m.check_send().is_err(), "send during a commit");
        m.start_commit().unwrap();
        m.completed();
        m.begin().unwrap();
        m.start_abort().unwrap();
        assert!(m.start_commit().is_err(), "commit during an abort");
        m.start_abort().unwrap();
        assert_eq!(m.state(), Aborting);
    }

    #[test]
    fn a_failure_in_a_transaction_allows_only_abort() {
        let mut m = ready();
        m.begin().unwrap();
        let e = Error::kafka(ErrorCode::NotEnoughReplicas).with_topic("t");
        let got = m.fail(&e);
        assert_eq!(got.kafka_code(), Some(ErrorCode::NotEnoughReplicas));
        assert_eq!(m.state(), AbortableError);
        assert!(m.check_send().is_err());
        assert!(m.begin().is_err());
        let e = m.start_commit().unwrap_err();
        assert_eq!(e.kafka_code(), Some(ErrorCode::NotEnoughReplicas), "{e}");
        assert!(e.to_string().contains("aborted"), "{e}");
        m.start_abort().unwrap();
        // Failures of what the abort drops change nothing.
        m.fail(&Error::closed("dropped by the abort"));
        assert_eq!(m.state(), Aborting);
        m.completed();
        assert_eq!(m.state(), Ready);
        assert!(m.error.is_none());
        // A failure while committing makes the commit fail and the transaction abortable.
        m.begin().unwrap();
        m.start_commit().unwrap();
        m.fail(&Error::kafka(ErrorCode::TransactionAbortable));
        assert_eq!(m.state(), AbortableError);
        // Outside a transaction an error is only returned.
        let mut m = ready();
        m.fail(&Error::timeout("coordinator"));
        assert_eq!(m.state(), Ready);
    }

    #[test]
    fn fencing_is_fatal_and_sticky() {
        for code in [
            ErrorCode::ProducerFenced,
            ErrorCode::InvalidProducerEpoch,
            ErrorCode::TransactionalIdAuthorizationFailed,
        ] {
            for state_before in [Ready, InTransaction, Committing, Aborting] {
                let mut m = ready();
                match state_before {
                    InTransaction => m.begin().unwrap(),
                    Committing => {
                        m.begin().unwrap();
                        m.start_commit().unwrap();
                    }
                    Aborting => {
                        m.begin().unwrap();
                        m.start_abort().unwrap();
                    }
                    _ => {}
                }
                let e = m.fail(&Error::kafka(code));
                assert_eq!(m.state(), FatalError);
                assert_eq!(e.kafka_code(), Some(code));
                assert!(e.to_string().contains("'tx-1'"), "{e}");
                // Everything afterwards fails with the same error, at once.
                for later in [
                    m.begin().unwrap_err(),
                    m.check_send().unwrap_err(),
                    m.start_commit().unwrap_err(),
                    m.start_abort().unwrap_err(),
                    m.start_init().unwrap_err(),
                    m.fail(&Error::kafka(ErrorCode::NotEnoughReplicas)),
                ] {
                    assert_eq!(later.kafka_code(), Some(code), "{later}");
                    assert!(later.to_string().contains("'tx-1'"), "{later}");
                }
                assert_eq!(m.state(), FatalError);
            }
        }
    }

    #[test]
    fn a_bump_is_remembered_until_the_next_init() {
        let mut m = ready();
        m.begin().unwrap();
        m.need_bump();
        m.start_abort().unwrap();
        assert!(m.needs_bump);
        m.initialized((7, 1));
        assert!(!m.needs_bump);
        assert_eq!(m.producer, Some((7, 1)));
        assert_eq!(m.state(), Aborting, "a bump does not end the abort");
        m.completed();
        assert_eq!(m.state(), Ready);
    }

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
