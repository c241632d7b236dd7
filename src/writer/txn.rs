//! Transactions, the manager's side (the Java producer's `TransactionManager`): the
//! [`TransactionState`] machine shared by the [`TransactionalWriter`](super::TransactionalWriter)
//! handle and the writer's task, the choice of the transaction protocol (v1 or KIP-890
//! transactions v2, [`TransactionProtocol`]), the coordinator request loop with its
//! retries ([`txn_call`]), and the task's side of a transaction.
//!
//! The writer's background task does the produce side (v1: it adds each partition to the
//! transaction with AddPartitionsToTxn before its first batch; v2: Produce v12 adds it;
//! either way it stamps batches as transactional and reports failures into the state
//! machine): [`TaskTxn`] and its `impl Task` block here. The handle
//! (`transactional.rs`) does the rest — InitProducerId, EndTxn, AddOffsetsToTxn (v1) and
//! TxnOffsetCommit — on the caller's task, through the same state machine.
//!
//! Transactions v2 as the Java client does it (KIP-890 part 2, `isTransactionV2Enabled`):
//! chosen once, by `init_transactions`, when the transaction coordinator finalizes
//! `transaction.version` >= 2 and supports Produce v12, EndTxn v5 and TxnOffsetCommit v5.
//! Every EndTxn v5 (commit or abort) has the coordinator bump the epoch and answers the
//! producer id and epoch of the next transaction (a new producer id when the epoch is
//! exhausted); the writer takes them over and its sequence numbers restart at 0, so an
//! abort needs no InitProducerId to bump the epoch.
//!
//! May not: build, send or finish batches (the task's accumulator and sender do; the
//! task's side here only adds partitions, answers drains and fails the transaction).

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;
use tracing::{debug, trace, warn};

use super::accumulator::take_idle;
use super::task::{Event, Task};
use super::{TransactionProtocol, WriterConfig};
use crate::conn::Connection;
use crate::coordinator::Coordinator;
use crate::error::{Error, ErrorKind, Result};
use crate::protocol::messages::{
    AddPartitionsToTxnRequest, AddPartitionsToTxnTopic, EndTxnRequest, ProduceRequest,
    TxnOffsetCommitRequest,
};
use crate::protocol::ErrorCode;

/// Highest AddPartitionsToTxn version: v4+ is the broker-to-broker (batched) form, and a
/// client of the v1 protocol stays at v3 — Kafka 4.x accepts it even with
/// `transaction.version=2` finalized.
const MAX_ADD_PARTITIONS_VERSION: i16 = 3;
/// Highest EndTxn version: v5 is transactions v2 (KIP-890), where every EndTxn bumps
/// the epoch.
pub(super) const MAX_END_TXN_VERSION: i16 = 4;
/// Highest TxnOffsetCommit version: v5 adds the group to the transaction implicitly
/// (transactions v2).
pub(super) const MAX_TXN_OFFSET_COMMIT_VERSION: i16 = 4;
/// Highest Produce version of a transactional writer of the v1 protocol: v12 tells the
/// broker the client speaks transactions v2 (partitions added implicitly).
pub(crate) const MAX_TXN_PRODUCE_VERSION: i16 = 11;
/// The versions transactions v2 needs: Produce v12 (partitions join implicitly), EndTxn
/// v5 (epoch bump, new producer id/epoch in the response), TxnOffsetCommit v5 (the group
/// joins implicitly).
pub(crate) const V2_PRODUCE_VERSION: i16 = 12;
pub(super) const V2_END_TXN_VERSION: i16 = 5;
pub(super) const V2_TXN_OFFSET_COMMIT_VERSION: i16 = 5;
/// The finalized feature level of `transaction.version` that enables transactions v2.
const V2_FEATURE_LEVEL: i16 = 2;

/// Where a [`TransactionalWriter`](super::TransactionalWriter) is in its life.
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
    /// Created;
    /// [`TransactionalWriter::init_transactions`](super::TransactionalWriter::init_transactions)
    /// not done yet.
    Uninitialized,
    /// Initialized, no transaction open:
    /// [`TransactionalWriter::begin_transaction`](super::TransactionalWriter::begin_transaction)
    /// next.
    Ready,
    /// A transaction is open: messages and offsets may be sent.
    InTransaction,
    /// A commit is under way (or was interrupted: call commit again).
    Committing,
    /// An abort is under way (or was interrupted: call abort again).
    Aborting,
    /// Something in the open transaction failed (a produce, an offset commit): only
    /// [`TransactionalWriter::abort_transaction`](super::TransactionalWriter::abort_transaction)
    /// is allowed.
    AbortableError,
    /// The writer is fenced by a newer one with the same transactional id, or not
    /// authorized: every call fails; make a new writer.
    FatalError,
}

/// Whether `e` ends the transactional writer for good (as the Java client's fatal
/// errors): fenced, unauthorized, or the broker cannot do transactions.
pub(super) fn is_fatal(e: &Error) -> bool {
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
    pub(super) producer: Option<(i64, i16)>,
    /// The coordinator knows of the open transaction (a partition or a group was added):
    /// ending it takes an EndTxn.
    pub(super) touched: bool,
    /// A batch of the transaction may or may not have been written (or its sequence
    /// numbers were used and dropped): after the abort the epoch is bumped, which restarts
    /// every partition's sequence numbers.
    pub(super) needs_bump: bool,
    /// The protocol chosen by `init_transactions` (`None` before).
    pub(super) protocol: Option<TransactionProtocol>,
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

    pub(super) fn illegal(&self, call: &str) -> Error {
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

    pub(super) fn start_init(&self) -> Result<()> {
        match self.state {
            TransactionState::Uninitialized => Ok(()),
            _ => Err(self.illegal("init_transactions")),
        }
    }

    pub(super) fn initialized(&mut self, producer: (i64, i16)) {
        self.producer = Some(producer);
        self.needs_bump = false;
        if self.state == TransactionState::Uninitialized {
            self.state = TransactionState::Ready;
        }
    }

    pub(super) fn begin(&mut self) -> Result<()> {
        match self.state {
            TransactionState::Ready => {
                self.state = TransactionState::InTransaction;
                self.touched = false;
                Ok(())
            }
            _ => Err(self.illegal("begin_transaction")),
        }
    }

    pub(super) fn start_commit(&mut self) -> Result<()> {
        match self.state {
            TransactionState::InTransaction | TransactionState::Committing => {
                self.state = TransactionState::Committing;
                Ok(())
            }
            _ => Err(self.illegal("commit_transaction")),
        }
    }

    pub(super) fn start_abort(&mut self) -> Result<()> {
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

    pub(super) fn check_in_transaction(&self, call: &str) -> Result<(i64, i16)> {
        match (self.state, self.producer) {
            (TransactionState::InTransaction, Some(p)) => Ok(p),
            _ => Err(self.illegal(call)),
        }
    }

    /// The commit or abort is done: ready for the next transaction.
    pub(super) fn completed(&mut self) {
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

/// How long one coordinator request may take.
pub(super) fn attempt_timeout(cfg: &WriterConfig) -> Duration {
    cfg.connection.request_timeout
}

/// The protocol `wanted` comes to on coordinator `c`: `Auto` is v2 where `c` supports it;
/// a forced `V2` it does not support is a `Config` error naming the reason.
pub(super) fn choose_protocol(
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
pub(super) fn v2_version(c: &Connection, api: &str, have: i16, need: i16) -> Result<i16> {
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
pub(super) fn check(code: i16, c: &Connection) -> Result<()> {
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
                    let better = first
                        .as_ref()
                        .is_none_or(|f| f.kafka_code() == Some(ErrorCode::OperationNotAttempted));
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

// The writer task's side of a transaction (see `task.rs`).

/// A transactional writer's side of the transaction in the task.
pub(super) struct TaskTxn {
    pub(super) shared: Arc<TxnShared>,
    coordinator: Arc<Coordinator>,
    /// Partitions added to the open transaction.
    pub(super) added: std::collections::HashSet<(Arc<str>, i32)>,
    /// An AddPartitionsToTxn is under way.
    pub(super) adding: bool,
    /// Callers waiting for a drain.
    pub(super) drains: Vec<oneshot::Sender<()>>,
}

/// The task's side of a transaction: the produce half of the transaction manager.
impl Task {
    /// Make the task transactional: producer ids come from the handle
    /// ([`Cmd::Producer`]), partitions join the transaction before their first batch, and
    /// failures are reported to `shared`.
    pub(crate) fn set_txn(&mut self, shared: Arc<TxnShared>, coordinator: Arc<Coordinator>) {
        self.txn = Some(TaskTxn {
            shared,
            coordinator,
            added: std::collections::HashSet::new(),
            adding: false,
            drains: Vec::new(),
        });
    }

    /// Answer the drain waiters once nothing is left to deliver.
    pub(super) fn check_drains(&mut self) {
        let drained = self.idle();
        let Some(txn) = self.txn.as_mut() else {
            return;
        };
        if txn.drains.is_empty() {
            return;
        }
        if drained {
            for w in txn.drains.drain(..) {
                let _ = w.send(());
            }
        } else {
            // Messages assigned since the drain began (they waited for metadata) are
            // sealed at once.
            self.seal_all();
        }
    }

    /// A transactional writer's message failed with `err`: the transaction is abortable
    /// (or the writer fenced).
    pub(super) fn txn_failed(&mut self, err: &Error) {
        if let Some(txn) = &self.txn {
            txn.shared.lock().fail(err);
        }
    }

    /// Transactions v1: add `parts` to the transaction (AddPartitionsToTxn) in the
    /// background, answered by an `Event::Added`.
    pub(super) fn spawn_add_partitions(
        &mut self,
        producer: (i64, i16),
        parts: Vec<(Arc<str>, i32)>,
    ) {
        let Some(txn) = self.txn.as_mut() else {
            return;
        };
        txn.adding = true;
        let coordinator = txn.coordinator.clone();
        let id = txn.shared.id.clone();
        let cfg = self.cfg.clone();
        let tx = self.events_tx.clone();
        tokio::spawn(async move {
            let result = add_partitions(&coordinator, &cfg, &id, producer, &parts).await;
            let _ = tx.send(Event::Added { parts, result });
        });
    }

    /// The answer to AddPartitionsToTxn for `parts`: they join the transaction, or their
    /// batches fail and so does the transaction.
    pub(super) fn on_added(&mut self, parts: Vec<(Arc<str>, i32)>, result: Result<()>) {
        let Some(txn) = self.txn.as_mut() else {
            return;
        };
        txn.adding = false;
        match result {
            Ok(()) => {
                txn.shared.lock().touch();
                trace!(
                    partitions = parts.len(),
                    "partitions added to the transaction"
                );
                txn.added.extend(parts);
            }
            Err(e) => {
                warn!(error = %e, "AddPartitionsToTxn failed");
                let e = txn.shared.lock().fail(&e);
                let mut failed = Vec::new();
                for (name, p) in parts {
                    if let Some(ps) = self.topics.get_mut(&name).and_then(|t| t.parts.get_mut(&p)) {
                        failed.extend(take_idle(ps).into_iter().map(|b| (name.clone(), p, b)));
                        ps.retry_at = None;
                    }
                }
                for (name, p, b) in failed {
                    let e = e.clone().with_topic(&*name).with_partition(p);
                    self.give_up(&name, p, b, &e, true);
                }
            }
        }
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
}
