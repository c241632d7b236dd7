//! The writer's background task: owns partition assignment, the per-partition batches,
//! the produce requests in flight and retries.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use tokio::sync::{mpsc, oneshot};
use tracing::{debug, trace, warn};

use super::{Group, Message, Shared, WriterConfig};
use crate::cluster::{Cluster, TopicMetadata};
use crate::conn::RequiredAcks;
use crate::error::{Error, Result};
use crate::protocol::messages::{ProducePartitionData, ProduceRequest, ProduceTopicData};
use crate::protocol::ErrorCode;
use crate::record::RecordBatchBuilder;

/// Size of a RecordBatch v2 header (everything before the records).
const BATCH_OVERHEAD: usize = 61;
/// Highest Produce version used: v13 addresses topics by id, which buys nothing here.
const MAX_PRODUCE_VERSION: i16 = 12;

/// One accepted message on its way to the task.
pub(crate) struct Msg {
    pub(crate) msg: Message,
    pub(crate) size: usize,
    pub(crate) group: Arc<Group>,
}

/// What the writer handle tells its task.
pub(crate) enum Cmd {
    One(Msg),
    Batch(Vec<Msg>),
    /// Seal every open batch now.
    Flush,
    /// Deliver what is pending, then stop; answer when stopped.
    Close(oneshot::Sender<()>),
}

enum Event {
    Produced {
        broker: i32,
        parts: Vec<(Arc<str>, i32)>,
        result: Result<Vec<Result<()>>>,
    },
    Meta {
        topic: Arc<str>,
        result: Result<Arc<TopicMetadata>>,
    },
}

/// Which waiting callers a batch's messages belong to: `(group, count)` runs.
type Runs = Vec<(Arc<Group>, usize)>;

fn add_run(runs: &mut Runs, group: &Arc<Group>) {
    match runs.last_mut() {
        Some((g, n)) if Arc::ptr_eq(g, group) => *n += 1,
        _ => runs.push((group.clone(), 1)),
    }
}

struct OpenBatch {
    builder: RecordBatchBuilder,
    runs: Runs,
    count: usize,
    bytes: usize,
    deadline: Instant,
}

struct Sealed {
    data: Bytes,
    runs: Runs,
    count: usize,
    bytes: usize,
    attempts: u32,
}

#[derive(Default)]
struct PartState {
    open: Option<OpenBatch>,
    sealed: VecDeque<Sealed>,
    /// The front sealed batch is in a request right now.
    busy: bool,
    /// The front sealed batch waits for its retry backoff.
    retry_at: Option<Instant>,
}

#[derive(Default)]
struct TopicState {
    meta: Option<Arc<TopicMetadata>>,
    ids: Vec<i32>,
    parts: HashMap<i32, PartState>,
    /// Messages waiting for the topic's first metadata.
    waiting: Vec<Msg>,
    meta_pending: bool,
    meta_attempts: u32,
    meta_retry_at: Option<Instant>,
}

pub(crate) struct Task {
    cfg: Arc<WriterConfig>,
    cluster: Cluster,
    shared: Arc<Shared>,
    cmds: mpsc::UnboundedReceiver<Cmd>,
    events_tx: mpsc::UnboundedSender<Event>,
    events_rx: mpsc::UnboundedReceiver<Event>,
    topics: HashMap<Arc<str>, TopicState>,
    in_flight: HashMap<i32, usize>,
    requests: usize,
    closing: bool,
    close_waiters: Vec<oneshot::Sender<()>>,
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

enum Wake {
    Event(Event),
    Cmds(usize),
    Timer,
}

impl Task {
    pub(crate) fn new(
        cfg: Arc<WriterConfig>,
        cluster: Cluster,
        shared: Arc<Shared>,
        cmds: mpsc::UnboundedReceiver<Cmd>,
    ) -> Task {
        let (events_tx, events_rx) = mpsc::unbounded_channel();
        Task {
            cfg,
            cluster,
            shared,
            cmds,
            events_tx,
            events_rx,
            topics: HashMap::new(),
            in_flight: HashMap::new(),
            requests: 0,
            closing: false,
            close_waiters: Vec::new(),
        }
    }

    pub(crate) async fn run(mut self) {
        let mut buf = Vec::with_capacity(512);
        loop {
            let deadline = self.next_deadline();
            let timer = async {
                match deadline {
                    Some(d) => tokio::time::sleep_until(d.into()).await,
                    None => std::future::pending().await,
                }
            };
            let wake = tokio::select! {
                biased;
                Some(ev) = self.events_rx.recv() => Wake::Event(ev),
                n = self.cmds.recv_many(&mut buf, 512), if !self.closing => Wake::Cmds(n),
                () = timer => Wake::Timer,
            };
            match wake {
                Wake::Event(ev) => self.on_event(ev),
                Wake::Cmds(0) => self.start_closing(),
                Wake::Cmds(_) => {
                    let ts = now_ms();
                    for cmd in buf.drain(..) {
                        self.on_cmd(cmd, ts);
                    }
                }
                Wake::Timer => {}
            }
            let now = Instant::now();
            self.seal_expired(now);
            self.request_metadata(now);
            self.dispatch(now);
            if self.closing && self.idle() {
                break;
            }
        }
        self.cluster.close().await;
        for w in self.close_waiters.drain(..) {
            let _ = w.send(());
        }
        debug!("writer task stopped");
    }

    fn idle(&self) -> bool {
        self.requests == 0
            && self.topics.values().all(|t| {
                t.waiting.is_empty()
                    && t.parts
                        .values()
                        .all(|p| p.open.is_none() && p.sealed.is_empty())
            })
    }

    fn start_closing(&mut self) {
        self.closing = true;
        self.seal_all();
    }

    fn next_deadline(&self) -> Option<Instant> {
        let mut next: Option<Instant> = None;
        let mut consider = |t: Instant| {
            next = Some(next.map_or(t, |n| n.min(t)));
        };
        for t in self.topics.values() {
            if let Some(at) = t.meta_retry_at {
                consider(at);
            }
            for p in t.parts.values() {
                if let Some(o) = &p.open {
                    consider(o.deadline);
                }
                if let Some(at) = p.retry_at {
                    if !p.busy {
                        consider(at);
                    }
                }
            }
        }
        next
    }

    fn on_cmd(&mut self, cmd: Cmd, ts: i64) {
        match cmd {
            Cmd::One(m) => self.accept(m, ts),
            Cmd::Batch(ms) => {
                for m in ms {
                    self.accept(m, ts);
                }
            }
            Cmd::Flush => self.seal_all(),
            Cmd::Close(tx) => {
                self.close_waiters.push(tx);
                self.start_closing();
            }
        }
    }

    /// Fail one message that never made it into a batch.
    fn reject(&self, m: Msg, err: Error) {
        debug!(error = %err, "message rejected");
        self.shared.stats.errors.fetch_add(1, Ordering::Relaxed);
        m.group.done(1, Some(&err));
        self.shared.release(m.size);
    }

    fn accept(&mut self, m: Msg, ts: i64) {
        let name = match (&m.msg.topic, &self.cfg.topic) {
            (Some(t), _) | (None, Some(t)) => t.as_str(),
            (None, None) => {
                let e = Error::config("message has no topic and the writer has no default topic");
                return self.reject(m, e);
            }
        };
        let key: Arc<str> = match self.topics.get_key_value(name) {
            Some((k, _)) => k.clone(),
            None => {
                let k: Arc<str> = Arc::from(name);
                self.topics.insert(k.clone(), TopicState::default());
                k
            }
        };
        let Some(t) = self.topics.get_mut(&key) else {
            return;
        };
        if t.meta.is_none() {
            t.waiting.push(m);
            return;
        }
        self.assign(&key, m, ts);
    }

    /// Put a message of a topic with known partitions into its partition's open batch.
    fn assign(&mut self, topic: &Arc<str>, m: Msg, ts: i64) {
        let cfg = self.cfg.clone();
        let Some(t) = self.topics.get_mut(topic) else {
            return;
        };
        let partition = match m.msg.partition {
            Some(p) if t.ids.binary_search(&p).is_ok() => p,
            Some(p) => {
                let e = Error::kafka(ErrorCode::UnknownTopicOrPartition)
                    .with_topic(&**topic)
                    .with_partition(p);
                return self.reject(m, e);
            }
            None if t.ids.is_empty() => {
                let e = Error::kafka(ErrorCode::UnknownTopicOrPartition)
                    .with_message("topic has no partitions")
                    .with_topic(&**topic);
                return self.reject(m, e);
            }
            None => cfg.balancer.partition(&m.msg, &t.ids),
        };
        let ps = t.parts.entry(partition).or_default();
        let ts = m.msg.timestamp.unwrap_or(ts);
        let (key, value, headers) = (m.msg.key.as_deref(), m.msg.value.as_deref(), &m.msg.headers);
        let fresh = RecordBatchBuilder::new(cfg.compression);
        let alone = fresh
            .record_size(ts, key, value, headers)
            .map(|n| n + BATCH_OVERHEAD);
        match alone {
            Ok(n) if n > cfg.batch_bytes => {
                let e = Error::kafka(ErrorCode::MessageTooLarge)
                    .with_message(format!(
                        "message of {n} bytes (as a batch) exceeds batch_bytes = {}",
                        cfg.batch_bytes
                    ))
                    .with_topic(&**topic)
                    .with_partition(partition);
                return self.reject(m, e);
            }
            Ok(_) => {}
            Err(e) => return self.reject(m, e.with_topic(&**topic).with_partition(partition)),
        }
        if let Some(open) = &ps.open {
            let more = open
                .builder
                .record_size(ts, key, value, headers)
                .unwrap_or(usize::MAX);
            if open.builder.estimated_size().saturating_add(more) > cfg.batch_bytes {
                seal(ps, &self.shared, topic, partition);
            }
        }
        let open = ps.open.get_or_insert_with(|| OpenBatch {
            builder: RecordBatchBuilder::with_capacity(
                cfg.compression,
                (cfg.batch_size * 64).min(cfg.batch_bytes),
            ),
            runs: Vec::new(),
            count: 0,
            bytes: 0,
            deadline: Instant::now() + cfg.batch_timeout,
        });
        if let Err(e) = open.builder.append(ts, key, value, headers) {
            return self.reject(m, e.with_topic(&**topic).with_partition(partition));
        }
        add_run(&mut open.runs, &m.group);
        open.count += 1;
        open.bytes += m.size;
        if open.count >= cfg.batch_size {
            seal(ps, &self.shared, topic, partition);
        }
    }

    fn seal_all(&mut self) {
        for (name, t) in &mut self.topics {
            for (p, ps) in &mut t.parts {
                if ps.open.is_some() {
                    seal(ps, &self.shared, name, *p);
                }
            }
        }
    }

    fn seal_expired(&mut self, now: Instant) {
        for (name, t) in &mut self.topics {
            for (p, ps) in &mut t.parts {
                if ps.open.as_ref().is_some_and(|o| o.deadline <= now) {
                    seal(ps, &self.shared, name, *p);
                }
            }
        }
    }

    /// Ask for metadata of topics with messages waiting for it.
    fn request_metadata(&mut self, now: Instant) {
        let mut wanted = Vec::new();
        for (name, t) in &mut self.topics {
            if t.meta.is_none()
                && !t.waiting.is_empty()
                && !t.meta_pending
                && t.meta_retry_at.map_or(true, |at| at <= now)
            {
                wanted.push(name.clone());
            }
        }
        for name in wanted {
            self.spawn_metadata(name);
        }
    }

    fn spawn_metadata(&mut self, name: Arc<str>) {
        let Some(t) = self.topics.get_mut(&name) else {
            return;
        };
        if t.meta_pending {
            return;
        }
        t.meta_pending = true;
        t.meta_retry_at = None;
        let cluster = self.cluster.clone();
        let tx = self.events_tx.clone();
        tokio::spawn(async move {
            let result = cluster.topic(&name).await;
            let _ = tx.send(Event::Meta {
                topic: name,
                result,
            });
        });
    }

    /// Send the front batch of every ready partition, one request per leader.
    fn dispatch(&mut self, now: Instant) {
        let mut by_broker: HashMap<i32, Vec<(Arc<str>, i32)>> = HashMap::new();
        let mut need_meta = Vec::new();
        for (name, t) in &self.topics {
            let mut leaderless = false;
            for (p, ps) in &t.parts {
                if ps.busy || ps.sealed.is_empty() || ps.retry_at.is_some_and(|at| at > now) {
                    continue;
                }
                match self.cluster.cached_leader(name, *p) {
                    Some(l) => by_broker.entry(l).or_default().push((name.clone(), *p)),
                    None => leaderless = true,
                }
            }
            if leaderless && !t.meta_pending && t.meta_retry_at.map_or(true, |at| at <= now) {
                need_meta.push(name.clone());
            }
        }
        for name in need_meta {
            self.spawn_metadata(name);
        }
        let max = self.cfg.max_in_flight_per_broker;
        for (broker, parts) in by_broker {
            let n = self.in_flight.entry(broker).or_default();
            if *n >= max {
                continue;
            }
            *n += 1;
            let mut batches = Vec::with_capacity(parts.len());
            for (name, p) in &parts {
                let Some(ps) = self.topics.get_mut(name).and_then(|t| t.parts.get_mut(p)) else {
                    continue;
                };
                let Some(front) = ps.sealed.front_mut() else {
                    continue;
                };
                ps.busy = true;
                ps.retry_at = None;
                front.attempts += 1;
                batches.push((name.clone(), *p, front.data.clone()));
            }
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
            let timeout = self.cfg.write_timeout;
            tokio::spawn(async move {
                let result = produce(&cluster, broker, &batches, acks, timeout).await;
                let _ = tx.send(Event::Produced {
                    broker,
                    parts,
                    result,
                });
            });
        }
    }

    fn on_event(&mut self, ev: Event) {
        match ev {
            Event::Meta { topic, result } => self.on_metadata(topic, result),
            Event::Produced {
                broker,
                parts,
                result,
            } => {
                self.requests = self.requests.saturating_sub(1);
                if let Some(n) = self.in_flight.get_mut(&broker) {
                    *n = n.saturating_sub(1);
                }
                match result {
                    Ok(outcomes) => {
                        for ((name, p), outcome) in parts.into_iter().zip(outcomes) {
                            self.complete(&name, p, outcome);
                        }
                    }
                    Err(e) => {
                        for (name, p) in parts {
                            let e = e.clone().with_topic(&*name).with_partition(p);
                            self.complete(&name, p, Err(e));
                        }
                    }
                }
            }
        }
    }

    fn on_metadata(&mut self, topic: Arc<str>, result: Result<Arc<TopicMetadata>>) {
        let now = Instant::now();
        let max_attempts = self.cfg.max_attempts;
        let Some(t) = self.topics.get_mut(&topic) else {
            return;
        };
        t.meta_pending = false;
        match result {
            Ok(meta) => {
                t.ids = meta.partition_ids();
                t.meta = Some(meta);
                t.meta_attempts = 0;
                let waiting = std::mem::take(&mut t.waiting);
                let ts = now_ms();
                for m in waiting {
                    self.assign(&topic, m, ts);
                }
            }
            Err(e) => {
                t.meta_attempts += 1;
                let attempts = t.meta_attempts;
                if e.is_retriable() && attempts < max_attempts {
                    debug!(topic = %topic, attempt = attempts, error = %e, "metadata lookup failed, retrying");
                    t.meta_retry_at = Some(now + self.cfg.backoff_for(attempts));
                    return;
                }
                warn!(topic = %topic, attempts, error = %e, "metadata lookup failed for good");
                t.meta_attempts = 0;
                let waiting = std::mem::take(&mut t.waiting);
                // Batches that cannot find their leader fail too.
                let mut stuck = Vec::new();
                for (p, ps) in &mut t.parts {
                    if !ps.busy && !ps.sealed.is_empty() {
                        while let Some(b) = ps.sealed.pop_front() {
                            stuck.push((*p, b));
                        }
                        ps.retry_at = None;
                    }
                }
                for m in waiting {
                    self.reject(m, e.clone());
                }
                for (p, b) in stuck {
                    self.finish(b, Some(&e.clone().with_partition(p)));
                }
            }
        }
    }

    /// A request for `name`/`p`'s front batch came back with `outcome`.
    fn complete(&mut self, name: &Arc<str>, p: i32, outcome: Result<()>) {
        let max_attempts = self.cfg.max_attempts;
        let Some(ps) = self.topics.get_mut(name).and_then(|t| t.parts.get_mut(&p)) else {
            return;
        };
        ps.busy = false;
        let attempts = ps.sealed.front().map_or(0, |b| b.attempts);
        match outcome {
            Ok(()) => {
                if let Some(b) = ps.sealed.pop_front() {
                    self.finish(b, None);
                }
            }
            Err(e) if e.is_retriable() && attempts < max_attempts => {
                let backoff = self.cfg.backoff_for(attempts);
                ps.retry_at = Some(Instant::now() + backoff);
                self.shared.stats.retries.fetch_add(1, Ordering::Relaxed);
                debug!(
                    topic = %name,
                    partition = p,
                    attempt = attempts,
                    backoff_ms = backoff.as_millis() as u64,
                    error = %e,
                    "produce failed, retrying"
                );
                self.cluster.invalidate(name);
            }
            Err(e) => {
                warn!(topic = %name, partition = p, attempts, error = %e, "produce failed");
                if e.is_retriable() {
                    self.cluster.invalidate(name);
                }
                if let Some(b) = ps.sealed.pop_front() {
                    self.finish(b, Some(&e));
                }
            }
        }
    }

    /// A batch is done: tell its callers, free its bytes, count it.
    fn finish(&self, b: Sealed, error: Option<&Error>) {
        let stats = &self.shared.stats;
        match error {
            None => {
                stats.batches.fetch_add(1, Ordering::Relaxed);
                stats.messages.fetch_add(b.count as u64, Ordering::Relaxed);
                stats.bytes.fetch_add(b.bytes as u64, Ordering::Relaxed);
            }
            Some(_) => {
                stats.errors.fetch_add(b.count as u64, Ordering::Relaxed);
            }
        }
        for (g, n) in &b.runs {
            g.done(*n, error);
        }
        self.shared.release(b.bytes);
    }
}

/// Close `ps`'s open batch and queue it for sending.
fn seal(ps: &mut PartState, shared: &Shared, topic: &str, partition: i32) {
    let Some(open) = ps.open.take() else {
        return;
    };
    match open.builder.build() {
        Ok(data) => ps.sealed.push_back(Sealed {
            data,
            runs: open.runs,
            count: open.count,
            bytes: open.bytes,
            attempts: 0,
        }),
        Err(e) => {
            let e = e.with_topic(topic).with_partition(partition);
            warn!(topic, partition, error = %e, "building a record batch failed");
            shared
                .stats
                .errors
                .fetch_add(open.count as u64, Ordering::Relaxed);
            for (g, n) in &open.runs {
                g.done(*n, Some(&e));
            }
            shared.release(open.bytes);
        }
    }
}

/// Send one produce request carrying `batches` to broker `broker`; one outcome per batch,
/// in order, or one error for the whole request.
async fn produce(
    cluster: &Cluster,
    broker: i32,
    batches: &[(Arc<str>, i32, Bytes)],
    acks: RequiredAcks,
    timeout: Duration,
) -> Result<Vec<Result<()>>> {
    let work = async {
        let conn = cluster.connection(broker).await?;
        let version = conn
            .version_for::<ProduceRequest>()?
            .min(MAX_PRODUCE_VERSION);
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
        let req = ProduceRequest {
            transactional_id: None,
            acks: acks.code(),
            timeout_ms: i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX),
            topic_data,
            ..Default::default()
        };
        if acks == RequiredAcks::None {
            conn.send_no_response(&req, version).await?;
            return Ok(vec![Ok(()); batches.len()]);
        }
        let resp = conn.send_version(&req, version).await?;
        Ok(batches
            .iter()
            .map(|(name, p, _)| {
                let found = resp
                    .responses
                    .iter()
                    .filter(|t| *t.name == **name)
                    .flat_map(|t| t.partition_responses.iter())
                    .find(|r| r.index == *p);
                match found {
                    None => Err(
                        Error::protocol("produce response does not mention the partition")
                            .with_topic(&**name)
                            .with_partition(*p)
                            .with_broker(conn.broker()),
                    ),
                    Some(r) if r.error_code == 0 => Ok(()),
                    Some(r) => {
                        let mut e = Error::kafka(ErrorCode::from(r.error_code))
                            .with_topic(&**name)
                            .with_partition(*p)
                            .with_broker(conn.broker());
                        if let Some(m) = &r.error_message {
                            e = e.with_message(m.clone());
                        }
                        Err(e)
                    }
                }
            })
            .collect())
    };
    match tokio::time::timeout(timeout, work).await {
        Ok(r) => r,
        Err(_) => Err(Error::timeout(format!(
            "produce request to broker {broker} timed out after {} ms",
            timeout.as_millis()
        ))),
    }
}
