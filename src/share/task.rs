//! The share reader's background task: ShareGroupHeartbeat membership with the group
//! coordinator, one share session per partition leader (ShareFetch with the
//! acknowledgements of that leader's partitions piggy-backed; ShareAcknowledge when
//! there is no room to fetch or for partitions no longer assigned; lock renewals in
//! ShareAcknowledge v2 with `IsRenewAck`, ahead of other requests), and on close the
//! last acknowledgements, closed sessions (epoch -1) and leaving the group (epoch -1).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use futures::StreamExt;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tracing::{debug, warn};

use super::{Counters, Ledger, ShareReaderConfig, Tp};
use crate::admin::Admin;
use crate::cluster::Cluster;
use crate::error::{Error, ErrorKind, Result};
use crate::group::coordinator::Coordinator;
use crate::protocol::messages::{ShareAcknowledgeResponse, ShareFetchResponse};
use crate::protocol::ErrorCode;
use crate::reader::Message;

mod acks;
mod close;
mod fetch;
mod membership;

/// Acknowledgements sent in one request, by partition: `(offset, type)`.
type Acks = BTreeMap<Tp, Vec<(i64, i8)>>;

/// One share session with a partition leader.
#[derive(Debug, Default)]
struct Session {
    /// The next epoch to send: 0 opens a session.
    epoch: i32,
    /// The partitions the broker has in the session.
    parts: BTreeSet<Tp>,
    /// A request is in flight.
    busy: bool,
    /// No request before this (after a failure).
    retry_at: Option<Instant>,
}

fn next_epoch(e: i32) -> i32 {
    if e == i32::MAX {
        1
    } else {
        e + 1
    }
}

enum Reply {
    Fetch {
        broker: i32,
        sent_epoch: i32,
        /// When it was sent: the locks of what it acquires started after this.
        sent: Instant,
        parts: BTreeSet<Tp>,
        acks: Acks,
        result: Result<ShareFetchResponse>,
    },
    Ack {
        broker: i32,
        acks: Acks,
        result: Result<ShareAcknowledgeResponse>,
    },
    Renew {
        broker: i32,
        renew: BTreeMap<Tp, Vec<i64>>,
        sent: Instant,
        result: Result<ShareAcknowledgeResponse>,
    },
}

pub(crate) struct ShareTask {
    config: ShareReaderConfig,
    cluster: Cluster,
    admin: Admin,
    coord: Coordinator,
    ledger: Arc<Ledger>,
    counters: Arc<Counters>,
    tx: mpsc::UnboundedSender<Result<Message>>,
    close_rx: watch::Receiver<bool>,
    member_id: String,
    epoch: i32,
    hb_interval: Duration,
    assigned: BTreeSet<Tp>,
    names: HashMap<[u8; 16], Arc<str>>,
    leaders: HashMap<Tp, i32>,
    sessions: HashMap<i32, Session>,
    metadata_stale: bool,
    /// When to look for locks due for renewal next (None: nothing held to renew).
    renew_at: Option<Instant>,
    /// Lock renewal is off (configured so, or the broker refused it).
    renew_off: bool,
}

impl ShareTask {
    pub(crate) fn new(
        config: ShareReaderConfig,
        ledger: Arc<Ledger>,
        counters: Arc<Counters>,
        tx: mpsc::UnboundedSender<Result<Message>>,
        close_rx: watch::Receiver<bool>,
    ) -> Result<Self> {
        let mut conn = config.connection.clone();
        conn.request_timeout = conn.request_timeout.saturating_add(config.max_wait);
        let cluster = Cluster::new(config.brokers.clone(), conn)?;
        let admin = Admin::new(cluster.clone());
        let coord = Coordinator::new(
            config.group_id.clone(),
            cluster.clone(),
            config.connection.request_timeout,
        );
        let renew_off = config.max_lock_hold.is_zero();
        Ok(ShareTask {
            config,
            cluster,
            admin,
            coord,
            ledger,
            counters,
            tx,
            close_rx,
            member_id: crate::group::new_member_id(),
            epoch: 0,
            hb_interval: Duration::from_secs(5),
            assigned: BTreeSet::new(),
            names: HashMap::new(),
            leaders: HashMap::new(),
            sessions: HashMap::new(),
            metadata_stale: true,
            renew_at: None,
            renew_off,
        })
    }

    fn group(&self) -> &str {
        &self.config.group_id
    }

    pub(crate) async fn run(mut self) -> Result<()> {
        let mut inflight: FuturesUnordered<BoxFuture<'static, Reply>> = FuturesUnordered::new();
        let result = self.main(&mut inflight).await;
        if let Err(e) = &result {
            warn!(group = %self.group(), error = %e, "share reader failed");
            let _ = self.tx.send(Err(e.clone()));
            self.ledger.begin_close(false);
        }
        self.shutdown(inflight).await;
        result
    }

    fn closing(&self) -> bool {
        *self.close_rx.borrow()
    }

    async fn main(
        &mut self,
        inflight: &mut FuturesUnordered<BoxFuture<'static, Reply>>,
    ) -> Result<()> {
        let mut next_hb = Instant::now();
        loop {
            if self.closing() {
                return Ok(());
            }
            if Instant::now() >= next_hb {
                next_hb = Instant::now() + self.heartbeat().await?;
            }
            if self.metadata_stale {
                self.refresh_metadata().await;
            }
            self.dispatch(inflight, true);
            let retry = self
                .sessions
                .values()
                .filter_map(|s| s.retry_at)
                .chain(self.renew_at)
                .min()
                .map_or(next_hb, |r| r.min(next_hb));
            tokio::select! {
                _ = self.close_rx.changed() => {}
                _ = tokio::time::sleep_until(retry) => {}
                _ = self.ledger.changed.notified() => {}
                Some(reply) = inflight.next(), if !inflight.is_empty() => self.handle(reply)?,
            }
        }
    }

    /// Start a request on every idle broker that has something to do: acknowledgements
    /// of partitions it no longer fetches first (ShareAcknowledge), else a ShareFetch
    /// (acknowledgements piggy-backed) while there is room, else ShareAcknowledge for
    /// what is waiting.
    fn dispatch(
        &mut self,
        inflight: &mut FuturesUnordered<BoxFuture<'static, Reply>>,
        fetch: bool,
    ) {
        let now = Instant::now();
        let room = self
            .config
            .max_in_flight
            .saturating_sub(self.ledger.outstanding());
        let mut wanted: BTreeMap<i32, BTreeSet<Tp>> = BTreeMap::new();
        if fetch {
            for tp in &self.assigned {
                if let (Some(b), true) = (self.leaders.get(tp), self.names.contains_key(&tp.0)) {
                    wanted.entry(*b).or_default().insert(*tp);
                }
            }
        }
        let mut ack_brokers: BTreeMap<i32, BTreeSet<Tp>> = BTreeMap::new();
        for tp in self.ledger.ack_partitions() {
            if let Some(b) = self.leaders.get(&tp) {
                ack_brokers.entry(*b).or_default().insert(tp);
            }
        }
        let mut renew_brokers: BTreeMap<i32, BTreeMap<Tp, Vec<i64>>> = BTreeMap::new();
        let policy = self.renew_policy();
        if policy.is_none() {
            self.renew_at = None;
        }
        if let Some(policy) = policy.filter(|_| self.renew_at.is_some_and(|r| r <= now)) {
            let (due, next) = self.ledger.due_renewals(now, policy);
            for (tp, offsets) in due {
                if let Some(b) = self.leaders.get(&tp) {
                    renew_brokers.entry(*b).or_default().insert(tp, offsets);
                }
            }
            // a broker busy now is asked again shortly (its request ends within
            // max_wait); otherwise when the next lock falls due
            self.renew_at = if renew_brokers.is_empty() {
                next
            } else {
                Some(now + Duration::from_millis(100))
            };
        }
        let brokers: BTreeSet<i32> = wanted
            .keys()
            .chain(ack_brokers.keys())
            .chain(self.sessions.keys())
            .copied()
            .collect();
        for b in brokers {
            let s = self.sessions.entry(b).or_default();
            if s.busy || s.retry_at.is_some_and(|r| r > now) {
                continue;
            }
            s.retry_at = None;
            let want = wanted.remove(&b).unwrap_or_default();
            let acked = ack_brokers.remove(&b).unwrap_or_default();
            let open = s.epoch > 0;
            let stray: BTreeSet<Tp> = acked.difference(&want).copied().collect();
            let renew = renew_brokers.remove(&b);
            if let (true, Some(renew)) = (open, renew) {
                // renewals first: a lock about to run out costs a redelivery
                self.send_renew(inflight, b, renew);
            } else if open && !stray.is_empty() {
                let acks = self.ledger.take_acks(|tp| stray.contains(tp));
                self.send_ack(inflight, b, acks, false);
            } else if fetch && room > 0 && !want.is_empty() {
                let acks = if open {
                    self.ledger.take_acks(|tp| want.contains(tp))
                } else {
                    Acks::new()
                };
                self.send_fetch(inflight, b, want, acks, room);
            } else if open && !acked.is_empty() {
                let acks = self.ledger.take_acks(|tp| acked.contains(tp));
                self.send_ack(inflight, b, acks, false);
            } else if open && want.is_empty() && !s.parts.is_empty() && fetch {
                // nothing assigned here any more: an empty fetch forgets the partitions
                // (it asks for no records: the session has none left to fetch from)
                self.send_fetch(inflight, b, BTreeSet::new(), Acks::new(), 1);
            }
        }
    }

    fn handle(&mut self, reply: Reply) -> Result<()> {
        match reply {
            Reply::Renew {
                broker,
                renew,
                sent,
                result,
            } => {
                if let Some(s) = self.sessions.get_mut(&broker) {
                    s.busy = false;
                }
                self.handle_renew(broker, renew, sent, result);
            }
            Reply::Ack {
                broker,
                acks,
                result,
            } => {
                if let Some(s) = self.sessions.get_mut(&broker) {
                    s.busy = false;
                }
                let resp = match result {
                    Ok(r) => r,
                    Err(e) => {
                        self.failed(broker, acks, &e);
                        return Ok(());
                    }
                };
                if let Some(code) = ErrorCode::non_zero(resp.error_code) {
                    self.failed(broker, acks, &Error::kafka(code));
                    return Ok(());
                }
                if let Some(s) = self.sessions.get_mut(&broker) {
                    s.epoch = next_epoch(s.epoch);
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
                self.acked(&acks, &errors);
            }
            Reply::Fetch {
                broker,
                sent_epoch,
                sent,
                parts,
                acks,
                result,
            } => {
                if let Some(s) = self.sessions.get_mut(&broker) {
                    s.busy = false;
                }
                let resp = match result {
                    Ok(r) => r,
                    Err(e) => {
                        if e.kind() == ErrorKind::UnsupportedVersion {
                            return Err(Error::new(
                                ErrorKind::UnsupportedVersion,
                                format!("share group {}: broker {broker} offers no ShareFetch v1 (share groups need Apache Kafka 4.2+): {e}", self.group()),
                            ));
                        }
                        self.failed(broker, acks, &e);
                        return Ok(());
                    }
                };
                if let Some(code) = ErrorCode::non_zero(resp.error_code) {
                    let e = Error::kafka(code);
                    if matches!(
                        code,
                        ErrorCode::GroupAuthorizationFailed | ErrorCode::TopicAuthorizationFailed
                    ) {
                        return Err(e);
                    }
                    self.failed(broker, acks, &e);
                    return Ok(());
                }
                self.counters.fetches.fetch_add(1, Ordering::Relaxed);
                if resp.acquisition_lock_timeout_ms > 0 {
                    self.counters
                        .lock_timeout_ms
                        .store(resp.acquisition_lock_timeout_ms, Ordering::Relaxed);
                }
                if let Some(s) = self.sessions.get_mut(&broker) {
                    s.epoch = next_epoch(sent_epoch.max(0));
                    s.parts = parts;
                }
                let mut ack_errors = HashMap::new();
                for t in resp.responses {
                    for p in t.partitions {
                        let tp = (t.topic_id, p.partition_index);
                        ack_errors.insert(tp, p.acknowledge_error_code);
                        if let Some(code) = ErrorCode::non_zero(p.error_code) {
                            debug!(group = %self.group(), partition = tp.1, error = %Error::kafka(code), "share fetch partition error");
                            self.metadata_stale = true;
                            if let Some(s) = self.sessions.get_mut(&broker) {
                                s.parts.remove(&tp);
                            }
                        }
                        self.deliver(tp, p.records, &p.acquired_records, sent);
                    }
                }
                self.acked(&acks, &ack_errors);
            }
        }
        Ok(())
    }
}
