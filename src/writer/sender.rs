//! The task's sender: which sealed batch of each partition may go now, the produce
//! requests that carry them to each partition's leader, and what their answers do (the
//! Java producer's `Sender`, franz-go's `sink.go`).
//!
//! Owns the in-flight limits (per partition and per broker, one request while a broker
//! connects), request size (`max_request_bytes`), the order of requests and answers per
//! broker, retries with backoff, splitting on MESSAGE_TOO_LARGE, giving a batch up, and
//! finishing it: flush groups, ack tokens, stats, delivery reports, freed bytes.
//!
//! May not: build or fill batches (the accumulator's), choose sequence numbers or decide
//! epoch bumps (`producer.rs`: the sender stamps a batch with the partition's next
//! sequence and hands sequence errors to [`PartState::sequence_error`]), or change the
//! transaction state other than by failing it ([`Task::txn_failed`]).

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::oneshot;
use tracing::{debug, trace, warn, Instrument};

use super::accumulator::{batch_capacity, recycle, split, Msg, PartState, Sealed};
use super::producer::{next_sequence, stamp};
use super::task::{after, expired_error, Event, Task};
use super::txn;
use super::Delivery;
use crate::cluster::Cluster;
use crate::conn::{Connection, RequiredAcks};
use crate::error::{Error, Result};
use crate::protocol::messages::{
    ApiVersionsRequest, ProducePartitionData, ProduceRequest, ProduceResponse, ProduceTopicData,
};
use crate::protocol::ErrorCode;
use crate::record::BatchBytes;
use crate::util::duration_ms;

/// Highest Produce version used: v13 addresses topics by id, which buys nothing here.
const MAX_PRODUCE_VERSION: i16 = 12;

/// One partition's answer in a produce response: the base offset or the error, and the
/// log start offset the broker reported (-1 if none).
pub(super) type Outcome = (Result<i64>, i64);

/// Sending: which batches may go, and the produce requests that carry them.
impl Task {
    /// Most batches of one partition in flight: transactional writers keep one (a failed
    /// batch aborts the transaction, and the batches after it must not be written).
    pub(super) fn max_in_flight_per_partition(&self) -> usize {
        // acks=0: a batch is "delivered" once written; keep those in order simply.
        if self.txn.is_some() || self.cfg.required_acks == RequiredAcks::None {
            1
        } else {
            self.cfg.max_in_flight_per_partition.max(1)
        }
    }

    /// Which batch of `ps` may be sent now, if any (its index in `ps.sealed`):
    /// - a batch sent before goes again only from the front, with nothing of the
    ///   partition in flight (order through retries; Java's "first in-flight sequence");
    /// - a new batch goes while fewer than the partition's limit are in flight, no batch
    ///   waits to be sent again before it, no epoch bump is pending, no sequence is
    ///   unresolved, and (idempotent writers) the partition's numbering is under the
    ///   writer's producer or can restart under it (nothing numbered is left), and the
    ///   partition's first batch under that producer is acknowledged or none is in
    ///   flight (the first batch of a producer id and epoch goes alone).
    pub(super) fn sendable(
        &self,
        ps: &PartState,
        now: Instant,
        conn: Option<&Connection>,
    ) -> Option<usize> {
        // While the epoch is exhausted and a new producer id is on its way, a partition
        // wanting the bump still counts as ready, so dispatch asks for the id (nothing
        // is sent before it comes, and then the bump is done).
        if ps.retry_at.is_some_and(|at| at > now) || (ps.bump && !self.renew_for_bump) {
            return None;
        }
        let i = ps.sealed.iter().position(|b| !b.in_flight)?;
        let b = ps.sealed.get(i)?;
        if b.sent {
            return (i == 0 && ps.in_flight == 0).then_some(i);
        }
        if ps.in_flight >= self.max_in_flight_per_partition() || ps.unresolved.is_some() {
            return None;
        }
        if ps.in_flight > 0 && !ps.conn.as_ref().zip(conn).is_some_and(|(a, b)| a.same(b)) {
            return None;
        }
        if self.producer.is_some() && ps.producer != self.producer && i > 0 {
            return None;
        }
        // Idempotent writers: a partition's first batch under a producer id and epoch
        // goes alone, and the next only once it is acknowledged. Until then the broker
        // may have no state for the producer there (a new partition, an epoch bump, state
        // expired), and Kafka >= 2.5 takes any sequence as such a producer's first: a
        // first batch refused while its partition becomes ready (NOT_LEADER_OR_FOLLOWER)
        // would be overtaken by the batches in flight behind it, and could then only
        // fail OUT_OF_ORDER_SEQUENCE_NUMBER. Once one is acknowledged, the broker holds
        // the sequence and refuses any batch that is not the next.
        if self.producer.is_some() && ps.awaits_first_ack() {
            return None;
        }
        Some(i)
    }

    /// Send what every ready partition may send, in requests of at most
    /// `max_request_bytes` per leader, up to the broker's in-flight limit; a partition
    /// adds one batch per request.
    pub(super) fn dispatch(&mut self, now: Instant) {
        self.maybe_resolve();
        self.maybe_bump();
        let mut by_broker: HashMap<i32, Vec<(Arc<str>, i32)>> = HashMap::new();
        // Each leader's open connection, if any.
        let mut open: HashMap<i32, Option<Connection>> = HashMap::new();
        let mut need_meta = Vec::new();
        for (name, t) in &self.topics {
            let mut leaderless = false;
            for (p, ps) in &t.parts {
                if ps.sealed.is_empty() {
                    continue;
                }
                let Some(leader) = self.cluster.cached_leader(name, *p) else {
                    if self.sendable(ps, now, None).is_some() {
                        leaderless = true;
                    }
                    continue;
                };
                if self.connecting.contains(&leader) {
                    continue;
                }
                let conn = open
                    .entry(leader)
                    .or_insert_with(|| self.cluster.open_connection(leader));
                if self.sendable(ps, now, conn.as_ref()).is_some() {
                    by_broker
                        .entry(leader)
                        .or_default()
                        .push((name.clone(), *p));
                }
            }
            if leaderless && !t.meta_pending && t.meta_retry_at.is_none_or(|at| at <= now) {
                need_meta.push(name.clone());
            }
        }
        for name in need_meta {
            // Cached metadata without a leader is useless: ask again (the cluster spaces
            // refreshes of one topic by its refresh backoff).
            self.cluster.invalidate(&name);
            self.spawn_metadata(name, false);
        }
        let fatal = self.txn.as_ref().and_then(|txn| {
            let m = txn.shared.lock();
            (m.state() == txn::TransactionState::FatalError).then(|| m.fail_error())
        });
        if let Some(e) = fatal {
            // Fenced: nothing more is written.
            self.fail_pending(&e);
            return;
        }
        if let Some(txn) = &self.txn {
            let Some(producer) = self.producer else {
                return;
            };
            // Partitions not in the transaction yet are added first (one request for all
            // of them); their batches wait meanwhile. Transactions v2: Produce adds them.
            let v2 = txn.shared.lock().v2();
            let mut to_add = Vec::new();
            for parts in by_broker.values_mut() {
                parts.retain(|tp| {
                    let added = v2 || txn.added.contains(tp);
                    if !added {
                        to_add.push(tp.clone());
                    }
                    added
                });
            }
            if !to_add.is_empty() && !txn.adding {
                self.spawn_add_partitions(producer, to_add);
            }
        } else if self.cfg.is_idempotent() && self.producer.is_none() {
            // Nothing goes out before the producer id is known.
            if let Some(broker) = by_broker.keys().next() {
                self.spawn_init_producer(*broker, now);
            }
            return;
        }
        let max = self.cfg.max_in_flight_per_broker;
        let limit = self.cfg.max_request_bytes;
        for (broker, mut parts) in by_broker {
            let conn = open.get(&broker).cloned().flatten();
            // As many requests as the broker's in-flight limit allows, each of at most
            // `max_request_bytes` (but at least one batch); one while connecting.
            while !parts.is_empty() {
                if self.in_flight.get(&broker).is_some_and(|n| *n >= max) {
                    break;
                }
                let Some((batches, sent)) =
                    self.build_request(&mut parts, limit, now, conn.as_ref())
                else {
                    break;
                };
                self.send_request(broker, batches, sent, conn.clone());
                if conn.is_none() {
                    break;
                }
            }
        }
    }

    /// One request's worth from `parts`: one batch per partition that may send, while
    /// the batches fit in `limit` bytes together (the first always does). Stamps new
    /// batches (idempotent writers) and marks them in flight; partitions left with
    /// nothing to send are removed from `parts`, and those that did not fit move to its
    /// front for the next request.
    #[allow(clippy::type_complexity)]
    fn build_request(
        &mut self,
        parts: &mut Vec<(Arc<str>, i32)>,
        limit: usize,
        now: Instant,
        conn: Option<&Connection>,
    ) -> Option<(Vec<(Arc<str>, i32, BatchBytes)>, Vec<(Arc<str>, i32, u64)>)> {
        let mut batches = Vec::new();
        // The batches actually carried, in the order of `batches`.
        let mut sent = Vec::new();
        let mut size = 0usize;
        let mut keep = Vec::new();
        let mut left_over = Vec::new();
        let transactional = self.txn.is_some();
        let producer = self.producer;
        for (name, p) in parts.drain(..) {
            if !left_over.is_empty() {
                left_over.push((name, p));
                continue;
            }
            let Some(i) = self
                .topics
                .get(&name)
                .and_then(|t| t.parts.get(&p))
                .and_then(|ps| self.sendable(ps, now, conn))
            else {
                continue;
            };
            let Some(ps) = self.topics.get_mut(&name).and_then(|t| t.parts.get_mut(&p)) else {
                continue;
            };
            let Some(len) = ps.sealed.get(i).map(|b| b.data.len()) else {
                continue;
            };
            if !batches.is_empty() && size.saturating_add(len) > limit {
                left_over.push((name, p));
                continue;
            }
            if let Some((id, epoch)) = producer {
                if ps.sealed.get(i).is_some_and(|b| !b.sent) {
                    if ps.producer != producer {
                        // Nothing numbered under the old producer is left (see
                        // `sendable`): restart at 0.
                        ps.producer = producer;
                        ps.next_seq = 0;
                        ps.last_acked = None;
                        ps.unresolved = None;
                    }
                    let seq = ps.next_seq;
                    let Some(b) = ps.sealed.get_mut(i) else {
                        continue;
                    };
                    if !stamp(&mut b.data, id, epoch, seq, transactional) {
                        continue;
                    }
                    b.stamp = Some((id, epoch, seq));
                    ps.next_seq = next_sequence(seq, b.count);
                }
            }
            let Some(b) = ps.sealed.get_mut(i) else {
                continue;
            };
            if !b.sent {
                self.shared.stats.batch_sent(b.accepted, now);
            }
            b.in_flight = true;
            b.sent = true;
            b.attempts += 1;
            ps.in_flight += 1;
            ps.conn = conn.cloned();
            ps.retry_at = None;
            size = size.saturating_add(len);
            batches.push((name.clone(), p, b.data.clone()));
            sent.push((name.clone(), p, b.id));
            keep.push((name, p));
        }
        // Partitions that did not fit first, then those that sent (they may send more).
        left_over.append(&mut keep);
        *parts = left_over;
        (!batches.is_empty()).then_some((batches, sent))
    }

    /// Send one produce request to `broker`; its answer comes back as an event.
    fn send_request(
        &mut self,
        broker: i32,
        batches: Vec<(Arc<str>, i32, BatchBytes)>,
        parts: Vec<(Arc<str>, i32, u64)>,
        conn: Option<Connection>,
    ) {
        *self.in_flight.entry(broker).or_default() += 1;
        self.requests += 1;
        self.shared.stats.writes.fetch_add(1, Ordering::Relaxed);
        trace!(
            broker_id = broker,
            partitions = parts.len(),
            "sending produce request"
        );
        let cluster = self.cluster.clone();
        let tx = self.events_tx.clone();
        let acks = self.cfg.required_acks;
        let timeout = self.cfg.connection.request_timeout;
        let shared = self.shared.clone();
        let txn_id = self.txn.as_ref().map(|t| t.shared.id.clone());
        let versions = match &self.txn {
            Some(t) => {
                // The coordinator may know of the transaction now (transactions v2:
                // this request adds its partitions): ending it takes an EndTxn.
                t.shared.lock().touch();
                t.shared.produce_versions()
            }
            None => (0, MAX_PRODUCE_VERSION),
        };
        // On an open connection the request is queued now, so requests to one broker go
        // out in the order they were built (a partition's batches in sequence order);
        // otherwise the spawned task connects first (and nothing else goes to the broker
        // meanwhile, see `dispatch`).
        if conn.is_none() {
            self.connecting.insert(broker);
        }
        // acks=0 has no response to await: written through `produce`.
        let queued = conn.filter(|_| acks != RequiredAcks::None).map(|conn| {
            let req = produce_version(&conn, versions).and_then(|version| {
                let req = produce_request(&batches, acks, timeout, txn_id.as_deref());
                conn.queue_request(&req, version)
            });
            (conn, req)
        });
        let (answered, answer_next) = oneshot::channel::<()>();
        let previous = self.answered_in_order.insert(broker, answer_next);
        tokio::spawn(async move {
            let started = Instant::now();
            let span =
                tracing::debug_span!("produce", broker_id = broker, partitions = batches.len());
            let result = match queued {
                Some((conn, Ok(response))) => {
                    // time held back by a broker quota (KIP-219) does not count
                    match conn
                        .timeout_unthrottled(timeout, response)
                        .instrument(span)
                        .await
                    {
                        Some(Ok(resp)) => {
                            shared.stats.throttle.record(resp.throttle_time_ms);
                            Ok(produce_outcomes(&resp, &batches, conn.broker()))
                        }
                        Some(Err(e)) => Err(e),
                        None => Err(produce_timeout(broker, timeout)),
                    }
                }
                Some((_, Err(e))) => Err(e),
                None => produce(&cluster, broker, &batches, acks, timeout, txn_id, versions)
                    .instrument(span)
                    .await
                    .map(|(outcomes, throttle_ms)| {
                        if let Some(ms) = throttle_ms {
                            shared.stats.throttle.record(ms);
                        }
                        outcomes
                    }),
            };
            if result.is_ok() {
                let micros = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
                let c = &shared.stats;
                c.answered.fetch_add(1, Ordering::Relaxed);
                c.write_micros.fetch_add(micros, Ordering::Relaxed);
                c.write_micros_max.fetch_max(micros, Ordering::Relaxed);
            }
            if let Some(previous) = previous {
                // sent (or dropped) once the earlier request's answer is in
                let _ = previous.await;
            }
            // Let go of the batches' bytes before the task hears of the answer, so an
            // acknowledged batch's buffer is the task's alone (and can be reused).
            drop(batches);
            let _ = tx.send(Event::Produced {
                broker,
                parts,
                result,
            });
            let _ = answered.send(());
        });
    }

    /// With `acks=0` nothing tells us the broker has read our produce requests, and
    /// closing a socket the broker still sends to (some brokers answer even acks=0
    /// requests) resets it, which can discard requests not yet processed. A broker
    /// handles one connection's requests in order, so one answered request per connection
    /// proves every earlier produce was handled.
    pub(super) async fn barrier(&self) {
        for broker in self.in_flight.keys() {
            let Some(conn) = self.cluster.open_connection(*broker) else {
                continue;
            };
            let req = ApiVersionsRequest {
                client_software_name: "kafkapipe".into(),
                client_software_version: env!("CARGO_PKG_VERSION").into(),
                ..ApiVersionsRequest::default()
            };
            let done =
                tokio::time::timeout(self.cfg.connection.request_timeout, conn.send(&req)).await;
            if !matches!(done, Ok(Ok(_))) {
                debug!(broker_id = *broker, "no answer to the acks=0 close barrier");
            }
        }
    }
}

/// Answers: the outcome of each batch sent, retries, and the reports of what is done.
impl Task {
    /// A produce request to `broker` carrying batch `id` of each `(topic, partition, id)`
    /// of `parts` was answered with `result` (one outcome per batch, or one error).
    pub(super) fn on_produced(
        &mut self,
        broker: i32,
        parts: Vec<(Arc<str>, i32, u64)>,
        result: Result<Vec<Outcome>>,
    ) {
        self.requests = self.requests.saturating_sub(1);
        self.connecting.remove(&broker);
        if let Some(n) = self.in_flight.get_mut(&broker) {
            *n = n.saturating_sub(1);
        }
        match result {
            Ok(outcomes) => {
                let mut outcomes = outcomes.into_iter();
                for (name, p, id) in parts {
                    match outcomes.next() {
                        Some((outcome, log_start)) => {
                            self.complete(&name, p, id, outcome, log_start, true);
                        }
                        None => {
                            let e = Error::protocol(format!(
                                "broker {broker} gave no outcome for the partition"
                            ))
                            .with_topic(&*name)
                            .with_partition(p);
                            self.complete(&name, p, id, Err(e), -1, false);
                        }
                    }
                }
            }
            Err(e) => {
                for (name, p, id) in parts {
                    let e = e.clone().with_topic(&*name).with_partition(p);
                    self.complete(&name, p, id, Err(e), -1, false);
                }
            }
        }
    }

    /// A request carrying batch `id` of `name`/`p` came back with `outcome` (and the log
    /// start offset the broker reported); `answered` says whether it is the broker's
    /// answer for that partition (rather than an error of the whole request, or a
    /// response that could not be matched to the partition).
    ///
    /// Idempotent writers follow the Java client's `canRetry`/`handleFailedBatch`
    /// (KIP-360): `UNKNOWN_PRODUCER_ID` bumps the epoch and retries (the broker lost the
    /// producer's state); `OUT_OF_ORDER_SEQUENCE_NUMBER` is retried after the batches
    /// before it when one of them is not acknowledged yet, and bumps the epoch when the
    /// batch is the next one expected (a real gap) or the one after an unresolved
    /// sequence; a batch failed for good bumps the epoch (its sequence numbers are
    /// dropped) or, if its fate is unknown, leaves its sequence unresolved.
    pub(super) fn complete(
        &mut self,
        name: &Arc<str>,
        p: i32,
        id: u64,
        outcome: Result<i64>,
        log_start: i64,
        answered: bool,
    ) {
        let max_attempts = self.cfg.max_attempts;
        let idempotent = self.txn.is_none() && self.cfg.is_idempotent();
        let Some(ps) = self.topics.get_mut(name).and_then(|t| t.parts.get_mut(&p)) else {
            return;
        };
        let Some(i) = ps.sealed.iter().position(|b| b.id == id && b.in_flight) else {
            return;
        };
        ps.in_flight = ps.in_flight.saturating_sub(1);
        if ps.in_flight == 0 {
            ps.conn = None;
        }
        let Some(b) = ps.sealed.get_mut(i) else {
            return;
        };
        b.in_flight = false;
        let attempts = b.attempts;
        let now = Instant::now();
        let expired = b.expires <= now;
        // The batch's sequence numbers, if numbered under the partition's producer.
        let seq = b
            .stamp
            .filter(|(pid, epoch, _)| ps.producer == Some((*pid, *epoch)))
            .map(|(_, _, seq)| seq);
        let last_seq = seq.map(|s| next_sequence(s, b.count.saturating_sub(1)));
        // The broker already has this batch (an earlier attempt got through).
        let outcome = match outcome {
            Err(e) if answered && e.kafka_code() == Some(ErrorCode::DuplicateSequenceNumber) => {
                Ok(-1)
            }
            other => other,
        };
        let code = outcome
            .as_ref()
            .err()
            .filter(|_| answered)
            .and_then(Error::kafka_code);
        // Idempotence: errors that are retried whatever their retriability says
        // (`recover`), and OUT_OF_ORDER_SEQUENCE_NUMBER for a batch the broker acknowledged
        // later batches past (`overtaken`): see `PartState::sequence_error`.
        let (recover, overtaken) = if idempotent && !expired && attempts < max_attempts {
            ps.sequence_error(code, seq, log_start)
        } else {
            (false, false)
        };
        match outcome {
            Err(e) if overtaken => {
                let e = e.with_message(format!(
                    "later batches of the partition were written before this one (the \
                     broker had no state for the producer and took them first): its {} \
                     messages were not written, the partition's order is broken",
                    ps.sealed.get(i).map_or(0, |b| b.count)
                ));
                warn!(topic = %name, partition = p, attempts, error = %e, "produce failed: overtaken by later batches");
                if let Some(b) = ps.sealed.remove(i) {
                    self.finish(name, b, Err(&e));
                }
            }
            Ok(base_offset) => {
                if let Some(last) = last_seq {
                    if ps.last_acked.is_none_or(|l| last > l) {
                        ps.last_acked = Some(last);
                    }
                }
                if let Some(b) = ps.sealed.remove(i) {
                    self.finish(name, b, Ok(base_offset));
                }
            }
            Err(e)
                if answered
                    && e.kafka_code() == Some(ErrorCode::MessageTooLarge)
                    && ps.sealed.get(i).is_some_and(|b| b.count > 1) =>
            {
                // The broker's limit is below ours: split the batch in two and send the
                // halves in order (as the Java client does), so only a message that is
                // too large on its own fails. The rejected batch was not written: its
                // halves take its sequence numbers.
                let Some(b) = ps.sealed.remove(i) else {
                    return;
                };
                let count = b.count;
                let stamp_of = b.stamp;
                match split(b, self.cfg.compression) {
                    Ok((mut first, mut second)) => {
                        debug!(topic = %name, partition = p, messages = count, "batch too large for the broker, split");
                        first.id = ps.next_id;
                        second.id = ps.next_id + 1;
                        ps.next_id += 2;
                        if let Some((pid, epoch, seq)) = stamp_of {
                            let transactional = self.txn.is_some();
                            let seq2 = next_sequence(seq, first.count);
                            for (half, s) in [(&mut first, seq), (&mut second, seq2)] {
                                if stamp(&mut half.data, pid, epoch, s, transactional) {
                                    half.stamp = Some((pid, epoch, s));
                                }
                                half.sent = true;
                            }
                        }
                        ps.sealed.insert(i, second);
                        ps.sealed.insert(i, first);
                    }
                    Err(failed) => {
                        let (b, split_err) = *failed;
                        warn!(topic = %name, partition = p, error = %split_err, "cannot split a batch the broker rejected");
                        self.give_up(name, p, b, &e, true);
                    }
                }
            }
            Err(e) if recover || (e.is_retriable() && attempts < max_attempts && !expired) => {
                let backoff = self.cfg.backoff_for(attempts);
                ps.retry_at = Some(after(now, backoff));
                self.shared.stats.retries.fetch_add(1, Ordering::Relaxed);
                debug!(
                    topic = %name,
                    partition = p,
                    attempt = attempts,
                    backoff_ms = backoff.as_millis() as u64,
                    error = %e,
                    "produce failed, retrying"
                );
                if e.is_retriable() {
                    self.cluster.invalidate(name);
                }
                if let Some(b) = ps.sealed.get_mut(i) {
                    b.last_error = Some(e);
                }
            }
            Err(e) => {
                let e = if e.is_retriable() && expired {
                    let what = format!("after {attempts} attempts");
                    expired_error(Some(&e), self.cfg.delivery_timeout, &what)
                } else {
                    e
                };
                warn!(topic = %name, partition = p, attempts, error = %e, "produce failed");
                if e.is_retriable() {
                    self.cluster.invalidate(name);
                }
                // Only the broker's own error code for this partition proves the batch
                // was not written; anything else after sending (a broken or undecodable
                // response, a whole-request error, a retriable error) leaves it unknown.
                let rejected = answered
                    && e.kafka_code().is_some()
                    && !e.is_retriable()
                    && !(self.txn.is_some()
                        && matches!(
                            e.kafka_code(),
                            Some(
                                ErrorCode::OutOfOrderSequenceNumber
                                    | ErrorCode::UnknownProducerId
                                    | ErrorCode::InvalidProducerEpoch
                            )
                        ));
                if let Some(b) = ps.sealed.remove(i) {
                    self.give_up(name, p, b, &e, rejected);
                }
            }
        }
    }

    /// `name`/`p`'s batch `b` fails for good with `err`. Every failure path goes through
    /// here so an idempotent writer's sequence numbers stay consistent with the broker's:
    /// a batch numbered under the partition's producer was sent, so
    /// - if the broker `rejected` it for its partition, its sequence numbers are dropped
    ///   by an epoch bump (Java's `requestEpochBumpForPartition`) — transactional
    ///   writers, which send one batch per partition at a time, reuse them instead;
    /// - otherwise it may have been written: its sequence is left unresolved until the
    ///   batches before it are done (idempotent writers), or the transaction's epoch is
    ///   bumped after the abort (transactional writers).
    ///
    /// A batch never stamped (never sent) used no sequence numbers.
    pub(super) fn give_up(
        &mut self,
        name: &Arc<str>,
        p: i32,
        b: Sealed,
        err: &Error,
        rejected: bool,
    ) {
        if let Some((id, epoch, seq)) = b.stamp {
            if let Some(ps) = self.topics.get_mut(name).and_then(|t| t.parts.get_mut(&p)) {
                if ps.producer == Some((id, epoch)) {
                    let after_it = next_sequence(seq, b.count);
                    if let Some(txn) = &self.txn {
                        if rejected && ps.next_seq == after_it {
                            ps.next_seq = seq;
                        } else if !rejected {
                            // The transaction is aborted; the epoch is bumped after the abort.
                            debug!(topic = %name, partition = p, "batch may have been written: epoch bump after the abort");
                            txn.shared.lock().need_bump();
                        }
                    } else if rejected {
                        debug!(topic = %name, partition = p, "batch rejected: epoch bump");
                        ps.bump = true;
                    } else {
                        debug!(topic = %name, partition = p, "batch may have been written: sequence unresolved");
                        ps.unresolved = Some(after_it);
                    }
                }
            }
        }
        self.txn_failed(err);
        self.finish(name, b, Err(err));
    }

    /// The counters of `topic` (feature `metrics`).
    #[cfg(feature = "metrics")]
    pub(super) fn topic_counters(&mut self, topic: &str) -> Arc<super::shared::TopicCounters> {
        match self.topics.get_mut(topic) {
            Some(t) => t
                .counters
                .get_or_insert_with(|| self.shared.topic_counters(topic))
                .clone(),
            None => self.shared.topic_counters(topic),
        }
    }

    /// A batch of `topic` is done: tell its callers, count it, report its messages if
    /// asked, free its bytes. `result` is the base offset the broker assigned (-1 with
    /// acks=0).
    pub(super) fn finish(
        &mut self,
        topic: &str,
        mut b: Sealed,
        result: std::result::Result<i64, &Error>,
    ) {
        #[cfg(feature = "metrics")]
        self.topic_counters(topic)
            .finished(b.count, b.bytes, b.data.len(), result.is_ok());
        #[cfg(not(feature = "metrics"))]
        let _ = topic;
        let stats = &self.shared.stats;
        match result {
            Ok(_) => {
                stats.batches.fetch_add(1, Ordering::Relaxed);
                stats.messages.fetch_add(b.count as u64, Ordering::Relaxed);
                stats.bytes.fetch_add(b.bytes as u64, Ordering::Relaxed);
                let encoded = b.data.len() as u64;
                stats
                    .batch_bytes_total
                    .fetch_add(encoded, Ordering::Relaxed);
                stats.batch_bytes_max.fetch_max(encoded, Ordering::Relaxed);
                stats
                    .batch_messages_max
                    .fetch_max(b.count as u64, Ordering::Relaxed);
            }
            Err(_) => {
                stats.errors.fetch_add(b.count as u64, Ordering::Relaxed);
            }
        }
        let error = result.err();
        // The tokens first (a failed batch's fail as they drop), then the flush groups:
        // whoever a flush answer wakes (an exactly-once commit checking the processed
        // offsets at once) must find the tokens of its messages settled.
        let acks = std::mem::take(&mut b.acks);
        if error.is_none() {
            for (_, ack) in acks {
                ack.ack();
            }
        } else {
            drop(acks);
        }
        // Runs are in batch order: a run's first message is at the base + the messages
        // before it (what a `Writer::produce` call's group learns).
        let mut index = 0i64;
        for (g, n) in &b.runs {
            if let Ok(base) = result {
                g.written_at(if base >= 0 {
                    base.saturating_add(index)
                } else {
                    -1
                });
            }
            g.done(*n, error);
            index = index.saturating_add(*n as i64);
        }
        if let Ok(buf) = b.data.take_head().try_into_mut() {
            // Not the bytes of a compacted batch, smaller than any new batch wants.
            if buf.capacity() >= batch_capacity(&self.cfg, 0) {
                recycle(&mut self.spare_buffers, buf);
            }
        }
        let kept_bytes: usize = b.kept.iter().map(|(_, _, size)| size).sum();
        self.shared
            .release_messages(b.count, b.bytes.saturating_sub(kept_bytes));
        for (index, message, size) in b.kept {
            let result = match result {
                Ok(base) if base >= 0 => Ok(base.saturating_add(i64::from(index))),
                Ok(_) => Ok(-1),
                Err(e) => Err(e.clone()),
            };
            self.report(Delivery { message, result }, size);
        }
    }

    /// Fail one message that never made it into a batch.
    pub(super) fn reject(&mut self, m: Msg, err: Error) {
        debug!(error = %err, "message rejected");
        self.txn_failed(&err);
        self.shared.stats.errors.fetch_add(1, Ordering::Relaxed);
        #[cfg(feature = "metrics")]
        {
            let cfg = Arc::clone(&self.cfg);
            if let Some(topic) = m.msg.topic.as_deref().or(cfg.topic.as_deref()) {
                self.topic_counters(topic).finished(1, 0, 0, false);
            }
        }
        m.group.done(1, Some(&err));
        self.shared.release_messages(1, 0);
        let delivery = Delivery {
            message: m.msg,
            result: Err(err),
        };
        self.report(delivery, m.size);
    }

    /// Hand a report to the application; its bytes stay accounted until it is consumed.
    /// Without a (live) report stream the bytes are released at once.
    pub(super) fn report(&mut self, delivery: Delivery, size: usize) {
        if let Some(tx) = &self.reports {
            if tx.send((delivery, size)).is_ok() {
                return;
            }
            self.reports = None;
        }
        self.shared.release(size);
    }
}

/// The Produce version to use on `conn`, within `(lowest, highest)` (a transactional
/// writer's range: see `TxnShared::produce_versions`).
fn produce_version(conn: &Connection, (lowest, highest): (i16, i16)) -> Result<i16> {
    let v = conn
        .version_for::<ProduceRequest>()?
        .min(highest)
        .min(MAX_PRODUCE_VERSION);
    if v < lowest {
        return Err(Error::new(
            crate::error::ErrorKind::UnsupportedVersion,
            format!("transactions v2 needs Produce v{lowest}; the broker shares up to v{v}"),
        )
        .with_broker(conn.broker()));
    }
    Ok(v)
}

/// The Produce request carrying `batches` (at most one per partition).
fn produce_request(
    batches: &[(Arc<str>, i32, BatchBytes)],
    acks: RequiredAcks,
    timeout: Duration,
    transactional_id: Option<&str>,
) -> ProduceRequest {
    let mut topic_data: Vec<ProduceTopicData> = Vec::new();
    for (name, p, data) in batches {
        let part = ProducePartitionData {
            index: *p,
            records: Some(data.clone()),
            ..Default::default()
        };
        match topic_data.iter_mut().find(|t| *t.name == **name) {
            Some(t) => t.partition_data.push(part),
            None => topic_data.push(ProduceTopicData {
                name: name.to_string(),
                partition_data: vec![part],
                ..Default::default()
            }),
        }
    }
    ProduceRequest {
        transactional_id: transactional_id.map(str::to_string),
        acks: acks.code(),
        timeout_ms: duration_ms(timeout),
        topic_data,
        ..Default::default()
    }
}

/// One outcome per batch of `batches`, in order, from `resp` (answered by `broker`).
fn produce_outcomes(
    resp: &ProduceResponse,
    batches: &[(Arc<str>, i32, BatchBytes)],
    broker: &str,
) -> Vec<Outcome> {
    batches
        .iter()
        .map(|(name, p, _)| {
            let found = resp
                .responses
                .iter()
                .filter(|t| *t.name == **name)
                .flat_map(|t| t.partition_responses.iter())
                .find(|r| r.index == *p);
            match found {
                None => (
                    Err(
                        Error::protocol("produce response does not mention the partition")
                            .with_topic(&**name)
                            .with_partition(*p)
                            .with_broker(broker.to_string()),
                    ),
                    -1,
                ),
                Some(r) if r.error_code == 0 => (Ok(r.base_offset), r.log_start_offset),
                Some(r) => {
                    let mut e = Error::kafka(ErrorCode::from(r.error_code))
                        .with_topic(&**name)
                        .with_partition(*p)
                        .with_broker(broker.to_string());
                    if let Some(m) = &r.error_message {
                        e = e.with_message(m.clone());
                    }
                    (Err(e), r.log_start_offset)
                }
            }
        })
        .collect()
}

fn produce_timeout(broker: i32, timeout: Duration) -> Error {
    Error::timeout(format!(
        "produce request to broker {broker} timed out after {} ms",
        timeout.as_millis()
    ))
}

/// Send one produce request carrying `batches` to broker `broker`, connecting first if
/// needed; one outcome per batch, in order, and the response's throttle time (none with
/// `acks=0`), or one error for the whole request.
async fn produce(
    cluster: &Cluster,
    broker: i32,
    batches: &[(Arc<str>, i32, BatchBytes)],
    acks: RequiredAcks,
    timeout: Duration,
    transactional_id: Option<Arc<str>>,
    versions: (i16, i16),
) -> Result<(Vec<Outcome>, Option<i32>)> {
    let work = async {
        let conn = cluster.connection(broker).await?;
        let version = produce_version(&conn, versions)?;
        let req = produce_request(batches, acks, timeout, transactional_id.as_deref());
        if acks == RequiredAcks::None {
            conn.send_no_response(&req, version).await?;
            return Ok((batches.iter().map(|_| (Ok(-1), -1)).collect(), None));
        }
        let resp = conn.send_version(&req, version).await?;
        Ok((
            produce_outcomes(&resp, batches, conn.broker()),
            Some(resp.throttle_time_ms),
        ))
    };
    match tokio::time::timeout(timeout, work).await {
        Ok(r) => r,
        Err(_) => Err(produce_timeout(broker, timeout)),
    }
}
