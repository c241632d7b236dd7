//! The share task's acknowledgements and lock renewals: ShareAcknowledge requests, what
//! the broker said of them, failed requests' acknowledgements sent again, and renewing
//! held records' locks (KIP-1222, `IsRenewAck`).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::Ordering;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use futures::FutureExt;
use tokio::time::Instant;
use tracing::{debug, warn};

use super::{next_epoch, Acks, Reply, ShareTask};
use crate::error::{Error, ErrorKind, Result};
use crate::protocol::messages::{
    ShareAcknowledgePartition, ShareAcknowledgeRequest, ShareAcknowledgeResponse,
    ShareAcknowledgeTopic, ShareAcknowledgementBatch,
};
use crate::protocol::ErrorCode;
use crate::share::{ack_batches, RenewPolicy, Renewal, Tp, RENEW};

impl ShareTask {
    pub(super) fn send_ack(
        &mut self,
        inflight: &mut FuturesUnordered<BoxFuture<'static, Reply>>,
        broker: i32,
        acks: Acks,
        close: bool,
    ) {
        let Some(s) = self.sessions.get_mut(&broker) else {
            return;
        };
        s.busy = true;
        let req = ack_request(
            &self.config.group_id,
            &self.member_id,
            if close { -1 } else { s.epoch },
            &acks,
        );
        let cluster = self.cluster.clone();
        inflight.push(
            async move {
                let result = async {
                    let c = cluster.connection(broker).await?;
                    let v = c.version_for::<ShareAcknowledgeRequest>()?;
                    c.send_version(&req, v).await
                }
                .await;
                Reply::Ack {
                    broker,
                    acks,
                    result,
                }
            }
            .boxed(),
        );
    }

    /// Count what the broker said of acknowledgements sent.
    pub(super) fn acked(&self, acks: &Acks, errors: &HashMap<Tp, i16>) {
        for (tp, v) in acks {
            match errors.get(tp).and_then(|c| ErrorCode::non_zero(*c)) {
                Some(code) => {
                    self.counters
                        .ack_errors
                        .fetch_add(v.len() as u64, Ordering::Relaxed);
                    warn!(group = %self.group(), partition = tp.1, records = v.len(), error = %Error::kafka(code), "acknowledgements refused (lock expired?)");
                }
                None => {
                    for (_, k) in v {
                        self.counters.sent(*k, 1);
                    }
                }
            }
        }
    }

    /// A request failed as a whole: the session is gone; its acknowledgements go again.
    pub(super) fn failed(&mut self, broker: i32, acks: Acks, e: &Error) {
        debug!(group = %self.group(), broker, error = %e, "share session request failed");
        if let Some(s) = self.sessions.get_mut(&broker) {
            s.epoch = 0;
            s.parts.clear();
            s.retry_at = Some(Instant::now() + Duration::from_millis(200));
        }
        if matches!(
            e.kind(),
            ErrorKind::Io | ErrorKind::Closed | ErrorKind::Timeout
        ) || e.kafka_code().is_some_and(|c| {
            matches!(
                c,
                ErrorCode::NotLeaderOrFollower | ErrorCode::UnknownTopicOrPartition
            )
        }) {
            self.metadata_stale = true;
        }
        self.ledger.requeue(acks);
    }

    /// Lock renewal applies (the broker told the lock duration, renewal is on).
    pub(super) fn renew_policy(&self) -> Option<RenewPolicy> {
        let lock = self.counters.lock_timeout_ms.load(Ordering::Relaxed);
        (!self.renew_off && lock > 0).then(|| RenewPolicy {
            lock: Duration::from_millis(lock as u64),
            max_hold: self.config.max_lock_hold,
        })
    }

    /// Records acquired by a request sent at `sent`: look for renewals by the time
    /// their locks are half gone.
    pub(super) fn locks_start(&mut self, sent: Instant) {
        if let Some(p) = self.renew_policy() {
            let at = sent + p.lock / 2;
            self.renew_at = Some(self.renew_at.map_or(at, |r| r.min(at)));
        }
    }

    /// Renew the locks of `renew` (ShareAcknowledge v2, `IsRenewAck`).
    pub(super) fn send_renew(
        &mut self,
        inflight: &mut FuturesUnordered<BoxFuture<'static, Reply>>,
        broker: i32,
        renew: BTreeMap<Tp, Vec<i64>>,
    ) {
        let Some(s) = self.sessions.get_mut(&broker) else {
            return;
        };
        s.busy = true;
        self.ledger.renewing(&renew);
        let acks: Acks = renew
            .iter()
            .map(|(tp, v)| (*tp, v.iter().map(|o| (*o, RENEW)).collect()))
            .collect();
        let mut req = ack_request(&self.config.group_id, &self.member_id, s.epoch, &acks);
        req.is_renew_ack = true;
        let cluster = self.cluster.clone();
        let sent = Instant::now();
        debug!(group = %self.group(), broker, records = renew.values().map(Vec::len).sum::<usize>(), "renewing acquisition locks");
        inflight.push(
            async move {
                let result = async {
                    let c = cluster.connection(broker).await?;
                    let v = c.version_for::<ShareAcknowledgeRequest>()?;
                    if v < 2 {
                        return Err(Error::new(
                            ErrorKind::UnsupportedVersion,
                            format!("broker {broker} offers ShareAcknowledge v{v}: lock renewal needs v2 (KIP-1222, Apache Kafka 4.2+)"),
                        ));
                    }
                    c.send_version(&req, v).await
                }
                .await;
                Reply::Renew {
                    broker,
                    renew,
                    sent,
                    result,
                }
            }
            .boxed(),
        );
    }

    /// What the broker said of lock renewals.
    pub(super) fn handle_renew(
        &mut self,
        broker: i32,
        renew: BTreeMap<Tp, Vec<i64>>,
        sent: Instant,
        result: Result<ShareAcknowledgeResponse>,
    ) {
        // a renewal that failed as a whole is tried again once the session may be used
        // again (a failed request holds it for 200 ms): without a new time the records
        // would wait for the next lock to start elsewhere, and their locks run out
        let retry = |task: &mut Self| {
            for (tp, v) in &renew {
                task.ledger.renewed(*tp, v, Renewal::Retry);
            }
            let at = Instant::now() + Duration::from_millis(200);
            task.renew_at = Some(task.renew_at.map_or(at, |r| r.min(at)));
        };
        let resp = match result {
            Ok(r) => r,
            Err(e) if e.kind() == ErrorKind::UnsupportedVersion => {
                // nothing was sent: the session is as it was
                warn!(group = %self.group(), broker, error = %e, "lock renewal not supported; records held longer than the lock are redelivered");
                self.renew_off = true;
                retry(self);
                return;
            }
            Err(e) => {
                self.failed(broker, Acks::new(), &e);
                retry(self);
                return;
            }
        };
        if let Some(code) = ErrorCode::non_zero(resp.error_code) {
            if matches!(
                code,
                ErrorCode::InvalidRequest | ErrorCode::UnsupportedVersion
            ) {
                warn!(group = %self.group(), broker, error = %Error::kafka(code), "the broker refused lock renewal; records held longer than the lock are redelivered");
                self.renew_off = true;
            }
            self.failed(broker, Acks::new(), &Error::kafka(code));
            retry(self);
            return;
        }
        if let Some(s) = self.sessions.get_mut(&broker) {
            s.epoch = next_epoch(s.epoch);
        }
        if resp.acquisition_lock_timeout_ms > 0 {
            self.counters
                .lock_timeout_ms
                .store(resp.acquisition_lock_timeout_ms, Ordering::Relaxed);
        }
        let errors: HashMap<Tp, i16> = resp
            .responses
            .iter()
            .flat_map(|t| {
                t.partitions
                    .iter()
                    .map(move |p| ((t.topic_id, p.partition_index), p.error_code))
            })
            .collect();
        for (tp, v) in &renew {
            match errors.get(tp).and_then(|c| ErrorCode::non_zero(*c)) {
                Some(code) => {
                    self.counters
                        .renew_errors
                        .fetch_add(v.len() as u64, Ordering::Relaxed);
                    warn!(group = %self.group(), partition = tp.1, records = v.len(), error = %Error::kafka(code), "lock renewal refused (lock expired?)");
                    self.ledger.renewed(*tp, v, Renewal::Lost);
                }
                None => {
                    self.counters
                        .renewed
                        .fetch_add(v.len() as u64, Ordering::Relaxed);
                    self.ledger.renewed(*tp, v, Renewal::Locked(sent));
                }
            }
        }
        self.locks_start(sent);
    }
}

pub(super) fn ack_request(
    group: &str,
    member: &str,
    epoch: i32,
    acks: &Acks,
) -> ShareAcknowledgeRequest {
    let mut topics: BTreeMap<[u8; 16], Vec<ShareAcknowledgePartition>> = BTreeMap::new();
    for (tp, v) in acks {
        topics
            .entry(tp.0)
            .or_default()
            .push(ShareAcknowledgePartition {
                partition_index: tp.1,
                acknowledgement_batches: ack_batches(v)
                    .into_iter()
                    .map(|(first, last, kind)| ShareAcknowledgementBatch {
                        first_offset: first,
                        last_offset: last,
                        acknowledge_types: vec![kind],
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            });
    }
    ShareAcknowledgeRequest {
        group_id: Some(group.to_string()),
        member_id: Some(member.to_string()),
        share_session_epoch: epoch,
        topics: topics
            .into_iter()
            .map(|(topic_id, partitions)| ShareAcknowledgeTopic {
                topic_id,
                partitions,
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    }
}
