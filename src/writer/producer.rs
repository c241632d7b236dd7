//! The task's producer state for idempotence (the producer-id part of the Java
//! producer's `TransactionManager`): the producer id and epoch, each partition's sequence
//! numbers, and the KIP-360 recovery that bumps the epoch when the numbering is lost.
//!
//! Owns InitProducerId for idempotent writers (transactional writers get their id from
//! `txn.rs`), stamping producer fields into a sealed batch ([`stamp`]), the sequence
//! fields of [`PartState`] (`producer`, `next_seq`, `last_acked`, `unresolved`, `bump`),
//! resolving a sequence left unknown by a batch given up, local epoch bumps and the
//! renumbering they take, and the rule that a partition's first batch under a producer
//! id and epoch goes alone ([`PartState::awaits_first_ack`]).
//!
//! May not: send produce requests or finish batches except those an epoch bump proves
//! written; its decisions are flags and numbers the sender reads.

use std::time::{Duration, Instant};

use tracing::{debug, warn};

use super::accumulator::{take_idle, PartState, Sealed, BATCH_OVERHEAD};
use super::task::{after, Event, Task};
use crate::cluster::Cluster;
use crate::error::{Error, Result};
use crate::protocol::messages::InitProducerIdRequest;
use crate::protocol::ErrorCode;
use crate::record::BatchBytes;

impl PartState {
    /// Idempotent writers: whether the partition's first batch under its producer id and
    /// epoch is in flight, unacknowledged: nothing else of it goes until it is (see
    /// [`Task::sendable`]).
    pub(super) fn awaits_first_ack(&self) -> bool {
        self.in_flight > 0 && self.last_acked.is_none()
    }

    /// Whether `seq` is the sequence number right after the last acknowledged one.
    fn is_next(&self, seq: i32) -> bool {
        match self.last_acked {
            None => seq == 0,
            Some(last) => next_sequence(last, 1) == seq,
        }
    }

    /// Idempotent writers: what error `code`, the broker's answer for a batch numbered from
    /// `seq` under the partition's producer (with the log start offset it reported),
    /// means for the partition's numbering — the Java client's `canRetry` and
    /// `handleFailedBatch` (KIP-360). Returns `(recover, overtaken)`: `recover`, the batch
    /// is retried whatever the error's retriability says; `overtaken`, it got an
    /// OUT_OF_ORDER_SEQUENCE_NUMBER after the broker acknowledged later batches past it,
    /// and fails. Marks the partition for an epoch bump where the numbering is lost.
    pub(super) fn sequence_error(
        &mut self,
        code: Option<ErrorCode>,
        seq: Option<i32>,
        log_start: i64,
    ) -> (bool, bool) {
        let mut recover = false;
        let mut overtaken = false;
        match code {
            Some(ErrorCode::UnknownProducerId) => {
                // Without a log start offset the broker may not know the partition
                // any more: just retry (Java). Otherwise its state for us is gone:
                // bump the epoch, unless this batch was renumbered since.
                if log_start >= 0 && seq.is_some() {
                    self.bump = true;
                }
                recover = true;
            }
            Some(ErrorCode::OutOfOrderSequenceNumber) => {
                let next = seq.is_some_and(|s| self.is_next(s));
                // At or before the acknowledged sequence: the broker took a later
                // batch first (it accepts any first sequence from a producer it has
                // no state for: this batch was refused, say NOT_LEADER, by a
                // partition that had lost our state, and the batches in flight
                // behind it were taken). Had this batch been written, the broker
                // would have found it among its last 5 and answered
                // DUPLICATE_SEQUENCE: it was not, and written now it would land after
                // its successors. It fails (`overtaken`), never re-appended; its
                // sequence numbers lie behind the acknowledged ones, so the next
                // batch still follows on and no bump is needed. (A partition's first
                // batch under an epoch goes alone, see `sendable`, so this takes a
                // broker that lost the producer's state mid-stream.)
                let behind = seq
                    .zip(self.last_acked)
                    .is_some_and(|(s, acked)| !next && !sequence_after(s, acked));
                match self.unresolved {
                    _ if behind => overtaken = true,
                    // A batch before this one is not acknowledged yet: it goes first.
                    None if !next => {}
                    // A real gap, or the batch right after an unresolved one that
                    // was not written.
                    None => self.bump = true,
                    Some(u) if seq == Some(u) => self.bump = true,
                    Some(_) => {}
                }
                recover = !overtaken;
            }
            _ => {}
        }
        (recover, overtaken)
    }
}

impl Task {
    /// Idempotent writers: partitions with a sequence left unresolved by a batch given
    /// up, once nothing numbered before it is left, are either resolved (a later batch
    /// was acknowledged, so it was written) or get an epoch bump.
    pub(super) fn maybe_resolve(&mut self) {
        if self.txn.is_some() {
            return;
        }
        for t in self.topics.values_mut() {
            for ps in t.parts.values_mut() {
                if ps.unresolved.is_none() || ps.sealed.iter().any(|b| b.sent) {
                    continue;
                }
                if ps.is_next(ps.next_seq) {
                    ps.unresolved = None;
                } else {
                    debug!(
                        next_sequence = ps.next_seq,
                        last_acked = ?ps.last_acked,
                        "unresolved sequence: bumping the epoch"
                    );
                    ps.bump = true;
                }
            }
        }
    }

    /// Idempotent writers: bump the producer epoch (locally, as the Java client does for
    /// a non-transactional producer; the broker accepts a higher epoch starting at
    /// sequence 0) once no partition wanting the bump has a batch in flight, and renumber
    /// those partitions' batches from 0. An exhausted epoch takes a new producer id
    /// (InitProducerId) instead.
    pub(super) fn maybe_bump(&mut self) {
        if self.txn.is_some() || self.renew_for_bump {
            return;
        }
        let mut wanted = false;
        for t in self.topics.values() {
            for ps in t.parts.values() {
                if ps.bump {
                    if ps.in_flight > 0 {
                        return;
                    }
                    wanted = true;
                }
            }
        }
        let Some((id, epoch)) = self.producer.filter(|_| wanted) else {
            return;
        };
        if epoch == i16::MAX {
            debug!(
                producer_id = id,
                "producer epoch exhausted: asking for a new producer id"
            );
            self.producer = None;
            self.renew_for_bump = true;
            return;
        }
        let bumped = (id, epoch + 1);
        debug!(
            producer_id = id,
            producer_epoch = bumped.1,
            "producer epoch bumped"
        );
        self.producer = Some(bumped);
        self.renumber_bumped(bumped);
    }

    /// Renumber every partition wanting a bump from sequence 0 under `producer`.
    ///
    /// A batch waiting for a retry after an unknown outcome (a timeout, a lost
    /// connection) whose sequences the broker already acknowledged past (a later batch of
    /// the same epoch was acked, and the broker appends only in sequence) is written: it
    /// is finished, not renumbered, which would write it twice. A batch the broker
    /// refused (e.g. NOT_LEADER) is renumbered: a broker with no state for the producer
    /// takes a later batch as its first.
    ///
    /// A partition with a batch in flight is left as it is (still wanting the bump): a
    /// request carrying its old numbering is out. Only a new producer id for an exhausted
    /// epoch meets one ([`maybe_bump`](Self::maybe_bump) waits for none to be in flight,
    /// but a partition may come to want the bump while the id is on its way); it is
    /// bumped under the new id once its requests are answered.
    fn renumber_bumped(&mut self, producer: (i64, i16)) {
        let mut written = Vec::new();
        for (name, t) in &mut self.topics {
            for ps in t.parts.values_mut() {
                if !ps.bump || ps.in_flight > 0 {
                    continue;
                }
                if let (Some(old), Some(acked)) = (ps.producer, ps.last_acked) {
                    let proven = |b: &Sealed| {
                        b.stamp.is_some_and(|(pid, epoch, seq)| {
                            (pid, epoch) == old
                                && b.last_error.as_ref().is_some_and(may_have_been_written)
                                && !sequence_after(seq, acked)
                                && !sequence_after(
                                    next_sequence(seq, b.count.saturating_sub(1)),
                                    acked,
                                )
                        })
                    };
                    let mut i = 0;
                    while i < ps.sealed.len() {
                        if ps.sealed.get(i).is_some_and(|b| !b.in_flight && proven(b)) {
                            if let Some(b) = ps.sealed.remove(i) {
                                written.push((name.clone(), b));
                            }
                        } else {
                            i += 1;
                        }
                    }
                }
                let mut seq = 0;
                for b in ps.sealed.iter_mut().filter(|b| b.stamp.is_some()) {
                    if stamp(&mut b.data, producer.0, producer.1, seq, false) {
                        b.stamp = Some((producer.0, producer.1, seq));
                        seq = next_sequence(seq, b.count);
                    }
                }
                ps.producer = Some(producer);
                ps.next_seq = seq;
                ps.last_acked = None;
                ps.unresolved = None;
                ps.bump = false;
            }
        }
        for (name, b) in written {
            debug!(
                messages = b.count,
                "batch acknowledged past by a later one: written, not renumbered"
            );
            self.finish(&name, b, Ok(-1));
        }
    }

    pub(super) fn spawn_init_producer(&mut self, broker: i32, now: Instant) {
        if self.producer_pending || self.producer_retry_at.is_some_and(|at| at > now) {
            return;
        }
        self.producer_pending = true;
        self.producer_retry_at = None;
        let cluster = self.cluster.clone();
        let tx = self.events_tx.clone();
        let timeout = self.cfg.connection.request_timeout;
        tokio::spawn(async move {
            let result = init_producer_id(&cluster, broker, timeout).await;
            let _ = tx.send(Event::Producer(result));
        });
    }

    pub(super) fn on_producer(&mut self, result: Result<(i64, i16)>) {
        self.producer_pending = false;
        match result {
            Ok((id, epoch)) => {
                debug!(
                    producer_id = id,
                    producer_epoch = epoch,
                    "idempotent producer ready"
                );
                self.producer = Some((id, epoch));
                self.producer_attempts = 0;
                self.producer_error = None;
                // Each partition restarts at sequence 0 under the new producer once none
                // of its batches numbered under the old one is left (see `sendable`);
                // those that wanted an epoch bump are renumbered now.
                if std::mem::take(&mut self.renew_for_bump) {
                    self.renumber_bumped((id, epoch));
                }
            }
            Err(e) => {
                self.producer_attempts = self.producer_attempts.saturating_add(1);
                let attempts = self.producer_attempts;
                self.producer_error = Some(e.clone());
                if e.is_retriable() && attempts < self.cfg.max_attempts {
                    debug!(attempt = attempts, error = %e, "InitProducerId failed, retrying");
                    self.producer_retry_at =
                        Some(after(Instant::now(), self.cfg.backoff_for(attempts)));
                    return;
                }
                warn!(attempts, error = %e, "InitProducerId failed for good");
                self.producer_attempts = 0;
                let mut failed = Vec::new();
                for (name, t) in &mut self.topics {
                    for (p, ps) in &mut t.parts {
                        failed.extend(take_idle(ps).into_iter().map(|b| (name.clone(), *p, b)));
                        ps.retry_at = None;
                    }
                }
                for (name, p, b) in failed {
                    self.give_up(&name, p, b, &e, false);
                }
            }
        }
    }
}

/// The sequence number after a batch of `count` records starting at `seq` (sequences wrap
/// from `i32::MAX` to 0).
pub(super) fn next_sequence(seq: i32, count: usize) -> i32 {
    let next = (i64::from(seq) + count as i64) % (i64::from(i32::MAX) + 1);
    i32::try_from(next).unwrap_or(0)
}

/// Whether sequence `a` comes after `b`, allowing for the wrap from `i32::MAX` to 0: `a`
/// is after `b` when it is less than half the sequence space ahead of it.
pub(super) fn sequence_after(a: i32, b: i32) -> bool {
    let distance = (i64::from(a) - i64::from(b)).rem_euclid(i64::from(i32::MAX) + 1);
    distance != 0 && distance < 1 << 30
}

/// Whether `e`, the last failure of a sent batch, leaves open that the broker wrote it
/// (no answer, or an answer that does not say it was not appended).
fn may_have_been_written(e: &Error) -> bool {
    match e.kafka_code() {
        Some(code) => matches!(
            code,
            ErrorCode::RequestTimedOut | ErrorCode::NotEnoughReplicasAfterAppend
        ),
        None => e.is_timeout() || e.is_closed(),
    }
}

/// Set producer id, epoch and base sequence in `data` (one RecordBatch v2; and the
/// transactional attribute, for transactional writers) and recompute its CRC-32C; false
/// (and `data` unchanged) if it is too short to be a batch. The header is changed in
/// place when nothing else holds it (a batch not sent yet), else copied first; values
/// spliced into the batch are read for the CRC, never copied.
pub(super) fn stamp(
    data: &mut BatchBytes,
    producer_id: i64,
    epoch: i16,
    base_sequence: i32,
    transactional: bool,
) -> bool {
    if data.head().len() < BATCH_OVERHEAD {
        return false;
    }
    let mut b = match data.take_head().try_into_mut() {
        Ok(b) => b,
        Err(shared) => bytes::BytesMut::from(&shared[..]),
    };
    let stamped = stamp_fields(&mut b, producer_id, epoch, base_sequence, transactional);
    if stamped.is_some() {
        let crc = crate::record::crc32c_of(&b, data.spliced_values(), 21);
        b[17..21].copy_from_slice(&crc.to_be_bytes());
    }
    data.set_head(b.freeze());
    stamped.is_some()
}

/// Write the producer fields into the header of batch `b` (its CRC is left to the caller).
fn stamp_fields(
    b: &mut bytes::BytesMut,
    producer_id: i64,
    epoch: i16,
    base_sequence: i32,
    transactional: bool,
) -> Option<()> {
    if transactional {
        let attributes = i16::from_be_bytes([*b.get(21)?, *b.get(22)?]) | 0x10;
        b.get_mut(21..23)?
            .copy_from_slice(&attributes.to_be_bytes());
    }
    b.get_mut(43..51)?
        .copy_from_slice(&producer_id.to_be_bytes());
    b.get_mut(51..53)?.copy_from_slice(&epoch.to_be_bytes());
    b.get_mut(53..57)?
        .copy_from_slice(&base_sequence.to_be_bytes());
    Some(())
}

/// Ask broker `broker` for a producer id (idempotent, not transactional).
async fn init_producer_id(cluster: &Cluster, broker: i32, timeout: Duration) -> Result<(i64, i16)> {
    let work = async {
        let conn = cluster.connection(broker).await?;
        let req = InitProducerIdRequest {
            transaction_timeout_ms: 60_000,
            ..InitProducerIdRequest::default()
        };
        let resp = conn.send(&req).await?;
        if resp.error_code != 0 {
            return Err(Error::kafka(ErrorCode::from(resp.error_code)).with_broker(conn.broker()));
        }
        Ok((resp.producer_id, resp.producer_epoch))
    };
    match tokio::time::timeout(timeout, work).await {
        Ok(r) => r,
        Err(_) => Err(Error::timeout("InitProducerId timed out")),
    }
}
