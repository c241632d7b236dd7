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
use futures::{FutureExt, StreamExt};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::{
    ack_batches, Counters, Ledger, RenewPolicy, Renewal, ShareReaderConfig, Tp, REJECT, RENEW,
};
use crate::admin::Admin;
use crate::cluster::Cluster;
use crate::error::{Error, ErrorKind, Result};
use crate::group::coordinator::{coordinator_lost, Coordinator, Lane};
use crate::group::AckToken;
use crate::protocol::messages::{
    ShareAcknowledgePartition, ShareAcknowledgeRequest, ShareAcknowledgeResponse,
    ShareAcknowledgeTopic, ShareAcknowledgementBatch, ShareFetchAcknowledgementBatch,
    ShareFetchPartition, ShareFetchRequest, ShareFetchResponse, ShareFetchTopic,
    ShareForgottenTopic, ShareGroupHeartbeatRequest,
};
use crate::protocol::ErrorCode;
use crate::reader::Message;
use crate::record::decode_batches_within;

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

    /// One heartbeat; the wait before the next. Errors are fatal.
    async fn heartbeat(&mut self) -> Result<Duration> {
        let req = ShareGroupHeartbeatRequest {
            group_id: self.config.group_id.clone(),
            member_id: self.member_id.clone(),
            member_epoch: self.epoch,
            rack_id: self.config.client_rack.clone(),
            subscribed_topic_names: (self.epoch == 0).then(|| self.config.topics.clone()),
            ..Default::default()
        };
        let soon = Duration::from_millis(500);
        let c = match self.coord.connection(Lane::Membership).await {
            Ok(c) => c,
            Err(e) => {
                debug!(group = %self.group(), error = %e, "share group coordinator not reachable");
                return Ok(soon);
            }
        };
        let v = c.version_for::<ShareGroupHeartbeatRequest>().map_err(|e| {
            Error::new(
                ErrorKind::UnsupportedVersion,
                format!(
                    "share group {}: broker {} offers no ShareGroupHeartbeat v1 (share groups need Apache Kafka 4.2+): {e}",
                    self.group(),
                    c.broker()
                ),
            )
        })?;
        let timeout = self.config.connection.request_timeout;
        let resp = match tokio::time::timeout(timeout, c.send_version(&req, v)).await {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => {
                if coordinator_lost(&e) {
                    self.coord.mark_unknown(&c, &e);
                }
                debug!(group = %self.group(), error = %e, "ShareGroupHeartbeat failed");
                return Ok(soon);
            }
            Err(_) => {
                let e = Error::new(ErrorKind::Timeout, "ShareGroupHeartbeat timed out");
                self.coord.mark_unknown(&c, &e);
                return Ok(soon);
            }
        };
        match ErrorCode::non_zero(resp.error_code) {
            None => {}
            Some(ErrorCode::UnknownMemberId | ErrorCode::FencedMemberEpoch) => {
                warn!(group = %self.group(), member_id = %self.member_id, epoch = self.epoch, code = ?resp.error_code, "fenced from the share group; joining again");
                self.epoch = 0;
                self.set_assignment(BTreeSet::new());
                return Ok(Duration::ZERO);
            }
            Some(code) => {
                let e = Error::kafka(code).with_broker(c.broker());
                if coordinator_lost(&e) {
                    self.coord.mark_unknown(&c, &e);
                    return Ok(soon);
                }
                if code.is_retriable() {
                    return Ok(soon);
                }
                if code == ErrorCode::UnsupportedVersion {
                    // Kafka 4.0/4.1 list ShareGroupHeartbeat (the share-group preview) and
                    // refuse it unless the cluster finalizes share.version
                    let level = c
                        .api_versions()
                        .map_or(0, |v| v.finalized_level("share.version"));
                    return Err(Error::new(
                        ErrorKind::UnsupportedVersion,
                        format!(
                            "share group {}: broker {} refused ShareGroupHeartbeat with UNSUPPORTED_VERSION: share groups need Apache Kafka 4.2+, or a cluster that finalizes the share.version feature (this one finalizes share.version={level})",
                            self.group(),
                            c.broker()
                        ),
                    ));
                }
                return Err(Error::new(
                    e.kind(),
                    format!(
                        "share group {}: ShareGroupHeartbeat: {e}{}",
                        self.group(),
                        resp.error_message
                            .map(|m| format!(" ({m})"))
                            .unwrap_or_default()
                    ),
                ));
            }
        }
        if self.epoch == 0 {
            info!(group = %self.group(), member_id = %self.member_id, epoch = resp.member_epoch, "joined share group");
        }
        self.epoch = resp.member_epoch;
        self.counters
            .member_epoch
            .store(self.epoch, Ordering::Relaxed);
        if resp.heartbeat_interval_ms > 0 {
            self.hb_interval = Duration::from_millis(resp.heartbeat_interval_ms as u64);
        }
        if let Some(a) = resp.assignment {
            let set: BTreeSet<Tp> = a
                .topic_partitions
                .iter()
                .flat_map(|t| t.partitions.iter().map(move |p| (t.topic_id, *p)))
                .collect();
            self.set_assignment(set);
        }
        Ok(self.hb_interval)
    }

    fn set_assignment(&mut self, set: BTreeSet<Tp>) {
        if set != self.assigned {
            info!(group = %self.group(), partitions = set.len(), "share group assignment");
            if set.iter().any(|(id, _)| !self.names.contains_key(id))
                || set.iter().any(|tp| !self.leaders.contains_key(tp))
            {
                self.metadata_stale = true;
            }
            self.assigned = set;
            self.counters
                .assigned
                .store(self.assigned.len(), Ordering::Relaxed);
        }
    }

    async fn refresh_metadata(&mut self) {
        let topics: Vec<&str> = self.config.topics.iter().map(String::as_str).collect();
        let timeout = self.config.connection.request_timeout;
        match tokio::time::timeout(timeout, self.admin.metadata(Some(&topics))).await {
            Ok(Ok(md)) => {
                for t in md.topics {
                    if t.id == [0; 16] || t.error.is_some() {
                        continue;
                    }
                    let name: Arc<str> = Arc::from(t.name.as_str());
                    self.names.insert(t.id, name);
                    for p in t.partitions {
                        if p.leader >= 0 {
                            self.leaders.insert((t.id, p.id), p.leader);
                        } else {
                            self.leaders.remove(&(t.id, p.id));
                        }
                    }
                }
                self.metadata_stale = false;
            }
            Ok(Err(e)) => debug!(group = %self.group(), error = %e, "share reader metadata failed"),
            Err(_) => debug!(group = %self.group(), "share reader metadata timed out"),
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

    fn send_fetch(
        &mut self,
        inflight: &mut FuturesUnordered<BoxFuture<'static, Reply>>,
        broker: i32,
        want: BTreeSet<Tp>,
        acks: Acks,
        room: usize,
    ) {
        let Some(s) = self.sessions.get_mut(&broker) else {
            return;
        };
        s.busy = true;
        let sent_epoch = s.epoch;
        let forgotten: BTreeSet<Tp> = s.parts.difference(&want).copied().collect();
        let mut topics: BTreeMap<[u8; 16], Vec<ShareFetchPartition>> = BTreeMap::new();
        for tp in want
            .iter()
            .chain(acks.keys().filter(|tp| !want.contains(tp)))
        {
            let batches = acks
                .get(tp)
                .map(|v| {
                    ack_batches(v)
                        .into_iter()
                        .map(|(first, last, kind)| ShareFetchAcknowledgementBatch {
                            first_offset: first,
                            last_offset: last,
                            acknowledge_types: vec![kind],
                            ..Default::default()
                        })
                        .collect()
                })
                .unwrap_or_default();
            topics.entry(tp.0).or_default().push(ShareFetchPartition {
                partition_index: tp.1,
                acknowledgement_batches: batches,
                ..Default::default()
            });
        }
        let mut forgotten_topics: BTreeMap<[u8; 16], Vec<i32>> = BTreeMap::new();
        for (id, p) in &forgotten {
            forgotten_topics.entry(*id).or_default().push(*p);
        }
        let max_records = i32::try_from(room.min(self.config.max_records)).unwrap_or(i32::MAX);
        let req = ShareFetchRequest {
            group_id: Some(self.config.group_id.clone()),
            member_id: Some(self.member_id.clone()),
            share_session_epoch: sent_epoch,
            max_wait_ms: i32::try_from(self.config.max_wait.as_millis()).unwrap_or(i32::MAX),
            min_bytes: 1,
            max_bytes: self.config.max_bytes,
            max_records,
            batch_size: max_records,
            // record-limit: MaxRecords is a hard bound (v2; v1 brokers may exceed it to
            // the batch boundary)
            share_acquire_mode: 1,
            topics: topics
                .into_iter()
                .map(|(topic_id, partitions)| ShareFetchTopic {
                    topic_id,
                    partitions,
                    ..Default::default()
                })
                .collect(),
            forgotten_topics_data: forgotten_topics
                .into_iter()
                .map(|(topic_id, partitions)| ShareForgottenTopic {
                    topic_id,
                    partitions,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        };
        let cluster = self.cluster.clone();
        let sent = Instant::now();
        // a new session holds exactly what this request names; an open one keeps the
        // partitions not forgotten
        let mut parts = want;
        if sent_epoch != 0 {
            parts.extend(s.parts.difference(&forgotten).copied());
        }
        inflight.push(
            async move {
                let result = async {
                    let c = cluster.connection(broker).await?;
                    let v = c.version_for::<ShareFetchRequest>()?;
                    c.send_version(&req, v).await
                }
                .await;
                Reply::Fetch {
                    broker,
                    sent_epoch,
                    sent,
                    parts,
                    acks,
                    result,
                }
            }
            .boxed(),
        );
    }

    /// Lock renewal applies (the broker told the lock duration, renewal is on).
    fn renew_policy(&self) -> Option<RenewPolicy> {
        let lock = self.counters.lock_timeout_ms.load(Ordering::Relaxed);
        (!self.renew_off && lock > 0).then(|| RenewPolicy {
            lock: Duration::from_millis(lock as u64),
            max_hold: self.config.max_lock_hold,
        })
    }

    /// Records acquired by a request sent at `sent`: look for renewals by the time
    /// their locks are half gone.
    fn locks_start(&mut self, sent: Instant) {
        if let Some(p) = self.renew_policy() {
            let at = sent + p.lock / 2;
            self.renew_at = Some(self.renew_at.map_or(at, |r| r.min(at)));
        }
    }

    /// Renew the locks of `renew` (ShareAcknowledge v2, `IsRenewAck`).
    fn send_renew(
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
    fn handle_renew(
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

    fn send_ack(
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
    fn acked(&self, acks: &Acks, errors: &HashMap<Tp, i16>) {
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
    fn failed(&mut self, broker: i32, acks: Acks, e: &Error) {
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

    /// Yield the acquired records of a partition's fetched data; acquired offsets with
    /// nothing to yield are acknowledged GAP.
    fn deliver(
        &mut self,
        tp: Tp,
        records: Option<bytes::Bytes>,
        acquired: &[crate::protocol::messages::AcquiredRecords],
        sent: Instant,
    ) {
        if acquired.is_empty() {
            return;
        }
        self.locks_start(sent);
        let Some(topic) = self.names.get(&tp.0).cloned() else {
            // cannot happen (only named partitions are fetched): let the locks expire
            self.metadata_stale = true;
            return;
        };
        let range_of = |o: i64| {
            acquired
                .iter()
                .find(|a| a.first_offset <= o && o <= a.last_offset)
                .map(|a| a.delivery_count)
        };
        let mut yielded = BTreeSet::new();
        let data = records.unwrap_or_default();
        let limit = usize::try_from(self.config.max_bytes)
            .unwrap_or(usize::MAX)
            .max(1 << 20);
        match decode_batches_within(data, limit, crate::record::MAX_BATCH_DECOMPRESSED) {
            Ok(d) => {
                for b in d.batches {
                    if b.is_control {
                        continue;
                    }
                    let epoch = b.partition_leader_epoch;
                    for r in b.records {
                        let Some(count) = range_of(r.offset) else {
                            continue;
                        };
                        let offset = r.offset;
                        if !yielded.insert(offset) {
                            continue;
                        }
                        let id = self.ledger.acquire(tp, offset, sent);
                        self.counters.acquired.fetch_add(1, Ordering::Relaxed);
                        let mut m = Message::from_record(&topic, tp.1, -1, epoch, r, 0);
                        m.set_delivery_count(count);
                        m.set_ack_token(AckToken::share_record(self.ledger.clone(), id));
                        if let Err(mpsc::error::SendError(Ok(mut m))) = self.tx.send(Ok(m)) {
                            m.take_ack_token().release();
                        }
                    }
                }
            }
            Err(e) => {
                warn!(group = %self.group(), topic = %topic, partition = tp.1, error = %e, "acquired records do not decode; rejecting them");
                for a in acquired {
                    for o in a.first_offset..=a.last_offset {
                        if yielded.insert(o) {
                            let id = self.ledger.acquire(tp, o, sent);
                            self.ledger.settle_now(id, REJECT);
                        }
                    }
                }
                return;
            }
        }
        for a in acquired {
            for o in a.first_offset..=a.last_offset {
                if !yielded.contains(&o) {
                    self.ledger.gap(tp, o);
                }
            }
        }
    }

    /// Stop: finish the requests in flight, wait (an orderly close) for the records the
    /// consumer holds, release the rest, send the last acknowledgements while closing
    /// the sessions, and leave the group.
    async fn shutdown(&mut self, mut inflight: FuturesUnordered<BoxFuture<'static, Reply>>) {
        let deadline = Instant::now() + self.config.close_timeout;
        // let fetches in flight finish: their records go back at once (the stream is
        // closed: sending them fails and releases them)
        while let Ok(Some(reply)) = tokio::time::timeout_at(deadline, inflight.next()).await {
            let _ = self.handle(reply);
        }
        // wait for what the consumer holds (only after an orderly close: a dropped
        // reader's drops were released already)
        loop {
            if self.ledger.outstanding() == 0 {
                break;
            }
            self.dispatch(&mut inflight, false);
            tokio::select! {
                _ = tokio::time::sleep_until(deadline) => break,
                _ = self.ledger.changed.notified() => {}
                Some(reply) = inflight.next(), if !inflight.is_empty() => { let _ = self.handle(reply); }
            }
        }
        while let Ok(Some(reply)) =
            tokio::time::timeout(self.config.connection.request_timeout, inflight.next()).await
        {
            let _ = self.handle(reply);
        }
        let left = self.ledger.outstanding();
        if left > 0 {
            info!(group = %self.group(), records = left, "releasing records still held at close");
        }
        self.ledger.release_all();
        // the last acknowledgements close each session (epoch -1)
        let brokers: Vec<i32> = self
            .sessions
            .iter()
            .filter(|(_, s)| s.epoch > 0)
            .map(|(b, _)| *b)
            .collect();
        for b in brokers {
            let mine: BTreeSet<Tp> = self
                .leaders
                .iter()
                .filter(|(_, l)| **l == b)
                .map(|(tp, _)| *tp)
                .collect();
            let acks = self.ledger.take_acks(|tp| mine.contains(tp));
            let req = ack_request(&self.config.group_id, &self.member_id, -1, &acks);
            let r = async {
                let c = self.cluster.connection(b).await?;
                let v = c.version_for::<ShareAcknowledgeRequest>()?;
                c.send_version(&req, v).await
            };
            match tokio::time::timeout(self.config.connection.request_timeout, r).await {
                Ok(Ok(resp)) => {
                    let errors: HashMap<Tp, i16> = resp
                        .responses
                        .iter()
                        .flat_map(|t| {
                            t.partitions
                                .iter()
                                .map(move |p| ((t.topic_id, p.partition_index), p.error_code))
                        })
                        .collect();
                    if let Some(code) = ErrorCode::non_zero(resp.error_code) {
                        warn!(group = %self.group(), broker = b, error = %Error::kafka(code), "closing the share session failed");
                    } else {
                        self.acked(&acks, &errors);
                    }
                }
                Ok(Err(e)) => {
                    warn!(group = %self.group(), broker = b, error = %e, "closing the share session failed")
                }
                Err(_) => {
                    warn!(group = %self.group(), broker = b, "closing the share session timed out")
                }
            }
        }
        let rest = self.ledger.take_acks(|_| true);
        if !rest.is_empty() {
            warn!(group = %self.group(), partitions = rest.len(), "acknowledgements without a share session left unsent; their locks expire");
        }
        // leave
        if self.epoch > 0 {
            let req = ShareGroupHeartbeatRequest {
                group_id: self.config.group_id.clone(),
                member_id: self.member_id.clone(),
                member_epoch: -1,
                ..Default::default()
            };
            let r = async {
                let c = self.coord.connection(Lane::Membership).await?;
                let v = c.version_for::<ShareGroupHeartbeatRequest>()?;
                let resp = c.send_version(&req, v).await?;
                match ErrorCode::non_zero(resp.error_code) {
                    None => Ok(()),
                    Some(code) => Err(Error::kafka(code)),
                }
            };
            match tokio::time::timeout(self.config.connection.request_timeout, r).await {
                Ok(Ok(())) => {
                    info!(group = %self.group(), member_id = %self.member_id, "left share group")
                }
                Ok(Err(e)) => {
                    warn!(group = %self.group(), error = %e, "leaving the share group failed")
                }
                Err(_) => warn!(group = %self.group(), "leaving the share group timed out"),
            }
        }
        self.coord.close().await;
        self.cluster.close().await;
    }
}

fn ack_request(group: &str, member: &str, epoch: i32, acks: &Acks) -> ShareAcknowledgeRequest {
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
