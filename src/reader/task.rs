//! The reader's fetch task: one tokio task that keeps at most one Fetch request in
//! flight per broker, each covering every ready partition that broker leads (as
//! librdkafka and franz-go do), plus at most one batch of leader/offset lookups.
//!
//! Each loop iteration plans under the state lock (which partitions can be fetched from
//! which broker, which need a leader or a start offset looked up), starts those requests
//! as futures in one `FuturesUnordered`, and waits for the first of: a request finishing,
//! a wake-up from the handle (assignment, seek, space freed, close), or the earliest
//! retry deadline. Requests are futures inside this task, not tasks of their own, so
//! aborting this one task stops everything.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use futures::future::{join_all, BoxFuture};
use futures::stream::FuturesUnordered;
use futures::{FutureExt, StreamExt};
use tracing::{debug, info, warn, Instrument};

use super::retry;
use super::session::{self, Sent, Session};
use super::state::{Position, Shared, State};
use super::validate::{self, LogTruncation, Outcome};
use super::{OffsetReset, ReaderConfig, StartOffset};
use crate::conn::{
    decode_fetch_lazy, decompress_limit, Conn, Connection, FetchedBatches, IsolationLevel,
    EARLIEST_TIMESTAMP, LATEST_TIMESTAMP,
};
use crate::error::{Error, ErrorKind, Result};
use crate::protocol::messages::{
    FetchPartition, FetchPartitionData, FetchRequest, FetchResponse, FetchTopic, ForgottenTopic,
    OffsetForLeaderEpochRequest,
};
use crate::protocol::ErrorCode;
use crate::record::LazyBatch;

/// Fetch versions from 13 on name topics by id; the reader sticks to names (every broker
/// since Kafka 2.x and up to 4.x accepts Fetch v12).
const MAX_FETCH_VERSION: i16 = 12;

/// Fetch v7 brought fetch sessions (KIP-227).
const MIN_SESSION_VERSION: i16 = 7;

struct Job {
    id: u64,
    epoch: u64,
    topic: Arc<str>,
    partition: i32,
    /// Fetch: the offset. Validation: the fetch offset to validate.
    offset: i64,
    /// Lookup: what to look up (`None`: the leader only).
    start: Option<StartOffset>,
    /// Fetch: the leader epoch the leader was looked up with (-1: unknown).
    leader_epoch: i32,
    /// Lookup: validate the fetch position `offset`, whose previous record was written in
    /// this leader epoch, with OffsetForLeaderEpoch (KIP-320).
    validate: Option<i32>,
}

/// A lookup's result.
struct Found {
    leader: i32,
    /// The leader's epoch, -1 if the broker did not report one.
    leader_epoch: i32,
    /// The start offset, if asked for.
    offset: Option<i64>,
    /// For a validation: the leader's `(epoch, end offset)` for the job's epoch; `None`
    /// when the position could not be validated (no epochs, or a broker without
    /// OffsetForLeaderEpoch v2+), which lets it go on unvalidated (as Java).
    end: Option<(i32, i64)>,
}

type Lookup = Result<Found>;

/// Per job, in order: its partition's decoded data, `None` when the response left it out.
type Decoded = Vec<Option<Result<FetchedBatches<LazyBatch>>>>;

enum Event {
    Fetched {
        broker: i32,
        /// Every partition planned for the broker, whether the request listed it or
        /// (incremental) left it to the session.
        jobs: Vec<Job>,
        /// The response's session id and per job, in order: its partition's decoded
        /// data, `None` when the response left the partition out.
        result: Result<(i32, Decoded)>,
    },
    Resolved(Vec<(Job, Lookup)>),
}

/// Counts itself in `tasks_running` while alive, including when aborted.
struct Running(Arc<Shared>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.counters.tasks_running.fetch_sub(1, Ordering::SeqCst);
    }
}

pub(crate) async fn run(shared: Arc<Shared>) {
    shared.counters.tasks_running.fetch_add(1, Ordering::SeqCst);
    let _running = Running(shared.clone());
    let mut inflight: FuturesUnordered<BoxFuture<'static, Event>> = FuturesUnordered::new();
    let mut busy_brokers: HashSet<i32> = HashSet::new();
    let mut sessions: HashMap<i32, Session> = HashMap::new();
    let mut resolving = false;
    let mut round = 0usize;
    loop {
        let (lookups, fetches, next_retry) = plan(&shared, &busy_brokers, resolving);
        if shared.lock().closed {
            return;
        }
        if !lookups.is_empty() {
            resolving = true;
            inflight.push(resolve(shared.clone(), lookups).boxed());
        }
        for (broker, mut jobs) in fetches.jobs {
            // Rotate the partition order from request to request, so that when a broker
            // fills `max_bytes` before reaching the last partitions, it is not always the
            // same ones that get nothing (the Java consumer does the same).
            jobs.sort_by_key(|j| j.id);
            if !jobs.is_empty() {
                let k = round % jobs.len();
                jobs.rotate_left(k);
            }
            round = round.wrapping_add(1);
            busy_brokers.insert(broker);
            let session = sessions.entry(broker).or_default();
            let planned: Vec<(session::Key, Sent)> = jobs
                .iter()
                .map(|j| ((j.topic.clone(), j.partition), sent(&shared.config, j)))
                .collect();
            let req = session.request(shared.config.fetch_sessions, &planned);
            if let Some(held) = lock_sessions(&shared).get_mut(&broker) {
                held.waiting = true;
            }
            inflight.push(fetch(shared.clone(), broker, jobs, req, fetches.max_bytes).boxed());
        }
        let sleep = async {
            match next_retry {
                Some(at) => tokio::time::sleep_until(at.into()).await,
                None => futures::future::pending().await,
            }
        };
        tokio::select! {
            Some(ev) = inflight.next(), if !inflight.is_empty() => match ev {
                Event::Fetched { broker, jobs, result } => {
                    busy_brokers.remove(&broker);
                    let session = sessions.entry(broker).or_default();
                    let result = on_session(&shared, session, broker, &jobs, result);
                    let mut held = lock_sessions(&shared);
                    match session.id() {
                        0 => held.remove(&broker),
                        id => held.insert(broker, session::Held { id, waiting: false }),
                    };
                    drop(held);
                    if let Some(result) = result {
                        on_fetched(&shared, broker, jobs, result);
                    }
                }
                Event::Resolved(results) => {
                    resolving = false;
                    on_resolved(&shared, results);
                }
            },
            () = shared.wake_task.notified() => {}
            () = sleep => {}
        }
    }
}

/// What a fetch request says about `job`'s partition (a session lists it again when any
/// of it changes).
fn sent(config: &ReaderConfig, job: &Job) -> Sent {
    Sent {
        fetch_offset: job.offset,
        leader_epoch: job.leader_epoch,
        max_bytes: config.max_partition_bytes,
        log_start_offset: -1,
    }
}

/// Update `broker`'s fetch session with the outcome of its request, and pass the
/// outcome on to [`on_fetched`]; `None` when the request failed only because the broker
/// lost the session: its partitions are planned again at once, for a full request.
fn on_session(
    shared: &Shared,
    session: &mut Session,
    broker: i32,
    jobs: &[Job],
    result: Result<(i32, Decoded)>,
) -> Option<Result<Decoded>> {
    match result {
        Ok((session_id, decoded)) => {
            // A partition that lost its leader moves, maybe to this broker again under a
            // new epoch: start over with a full request (the others are unaffected).
            let moved = decoded.iter().any(
                |d| matches!(d, Some(Err(e)) if e.kafka_code().is_some() && needs_new_leader(e)),
            );
            if moved {
                session.failed(None);
            } else {
                session.answered(session_id);
            }
            Some(Ok(decoded))
        }
        Err(e) => {
            let code = e.kafka_code();
            let lost = session.only_session_lost(code);
            session.failed(code);
            if !lost {
                return Some(Err(e));
            }
            debug!(broker_id = broker, error = %e, "fetch session lost; sending a full fetch");
            shared
                .counters
                .sessions_lost
                .fetch_add(1, Ordering::Relaxed);
            let mut st = shared.lock();
            for j in jobs {
                if let Some(p) = st.parts.get_mut(&j.id) {
                    p.busy = false;
                }
            }
            None
        }
    }
}

type Plan = (Vec<Job>, Fetches, Option<Instant>);

/// The fetches of one round: the jobs per broker, and the `max_bytes` each request asks
/// for.
struct Fetches {
    jobs: HashMap<i32, Vec<Job>>,
    max_bytes: i32,
}

/// A round's `max_bytes` per request: the buffer's room (see [`State::fetch_room`])
/// shared among the requests of this round and those still in flight, at most
/// [`ReaderConfig::max_bytes`]. However small, a response carries at least one batch
/// (KIP-74).
fn request_max_bytes(config: &ReaderConfig, room: usize, requests: usize) -> i32 {
    let share = i32::try_from(room / requests.max(1)).unwrap_or(i32::MAX);
    share.clamp(1, config.max_bytes.max(1))
}

fn plan(shared: &Shared, busy_brokers: &HashSet<i32>, resolving: bool) -> Plan {
    let now = Instant::now();
    let mut st = shared.lock();
    let room = st.fetch_room(&shared.config);
    let space = room.is_some();
    st.lent.starved.store(!space, Ordering::Relaxed);
    let mut lookups = Vec::new();
    let mut fetches: HashMap<i32, Vec<Job>> = HashMap::new();
    let mut next_retry: Option<Instant> = None;
    for (&id, p) in st.parts.iter_mut() {
        // Paused partitions are neither fetched nor looked up until resumed.
        if p.busy || p.paused || p.fetch == Position::Parked {
            continue;
        }
        if let Some(at) = p.retry_at {
            if at > now {
                next_retry = Some(next_retry.map_or(at, |n| n.min(at)));
                continue;
            }
            p.retry_at = None;
        }
        let job = |offset, start, validate| Job {
            id,
            epoch: p.epoch,
            topic: p.topic.clone(),
            partition: p.partition,
            offset,
            start,
            leader_epoch: p.leader_epoch,
            validate,
        };
        // A new leader or leader epoch: where the last record fetched was written must
        // still be in the leader's log before fetching on (KIP-320).
        if p.validate {
            match p.fetch {
                Position::Offset(offset) => match p.epochs.epoch_of(offset - 1) {
                    Some(e) if !resolving => {
                        lookups.push(job(offset, None, Some(e)));
                        p.busy = true;
                        continue;
                    }
                    Some(_) => continue,
                    None => p.validate = false,
                },
                _ => p.validate = false,
            }
        }
        match (p.leader, p.fetch) {
            (Some(broker), Position::Offset(offset))
                if space && !busy_brokers.contains(&broker) =>
            {
                fetches
                    .entry(broker)
                    .or_default()
                    .push(job(offset, None, None));
                p.busy = true;
            }
            // Waiting for buffer space or for the broker's current request.
            (Some(_), Position::Offset(_)) => {}
            (_, fetch) if !resolving => {
                let start = match fetch {
                    Position::Start(s) => Some(s),
                    _ => None,
                };
                lookups.push(job(-1, start, None));
                p.busy = true;
            }
            _ => {}
        }
    }
    let max_bytes = request_max_bytes(
        &shared.config,
        room.unwrap_or(0),
        fetches.len() + busy_brokers.len(),
    );
    let fetches = Fetches {
        jobs: fetches,
        max_bytes,
    };
    (lookups, fetches, next_retry)
}

/// Look up the leader (and, if asked, the start offset) of each job's partition.
async fn resolve(shared: Arc<Shared>, jobs: Vec<Job>) -> Event {
    let results = join_all(jobs.iter().map(|j| resolve_one(&shared, j))).await;
    Event::Resolved(jobs.into_iter().zip(results).collect())
}

async fn resolve_one(shared: &Shared, job: &Job) -> Lookup {
    let topic = &*job.topic;
    let (leader, leader_epoch) = shared
        .cluster
        .leader_and_epoch(topic, job.partition)
        .await?;
    let mut found = Found {
        leader,
        leader_epoch,
        offset: None,
        end: None,
    };
    if let Some(epoch) = job.validate {
        found.end = validate(shared, job, leader, leader_epoch, epoch).await?;
        return Ok(found);
    }
    let Some(start) = job.start else {
        return Ok(found);
    };
    let conn = Conn::from_connection(shared.cluster.connection(leader).await?);
    // Read-committed readers start "at the end" from the last stable offset, so records of
    // transactions still open now are delivered once they commit.
    let isolation = shared.config.isolation_level;
    let uncommitted = IsolationLevel::ReadUncommitted;
    let list = |timestamp, isolation| {
        conn.list_offset_at_epoch(topic, job.partition, timestamp, isolation, leader_epoch)
    };
    let not_available = || {
        Error::kafka(ErrorCode::OffsetNotAvailable)
            .with_topic(topic)
            .with_partition(job.partition)
    };
    let offset = match start {
        StartOffset::First => list(EARLIEST_TIMESTAMP, uncommitted)
            .await?
            .ok_or_else(not_available)?,
        StartOffset::Last => list(LATEST_TIMESTAMP, isolation)
            .await?
            .ok_or_else(not_available)?,
        StartOffset::At(o) => o,
        StartOffset::AtTimestamp(ts) if ts < 0 => {
            return Err(Error::config("timestamp must not be negative"))
        }
        StartOffset::AtTimestamp(ts) => match list(ts, uncommitted).await? {
            Some(o) => o,
            None => list(LATEST_TIMESTAMP, isolation)
                .await?
                .ok_or_else(not_available)?,
        },
    };
    debug!(
        topic,
        partition = job.partition,
        ?start,
        offset,
        leader_epoch,
        "start offset resolved"
    );
    found.offset = Some(offset);
    Ok(found)
}

/// OffsetForLeaderEpoch for `job`'s partition: where `epoch` ends in the log of `leader`
/// (of `leader_epoch`). `None` when it cannot be asked (the broker reports no leader
/// epochs, or lacks OffsetForLeaderEpoch v2+): the position goes on unvalidated, as in
/// the Java client.
async fn validate(
    shared: &Shared,
    job: &Job,
    leader: i32,
    leader_epoch: i32,
    epoch: i32,
) -> Result<Option<(i32, i64)>> {
    if leader_epoch < 0 {
        return Ok(None);
    }
    let connection = shared.cluster.connection(leader).await?;
    if connection
        .version_for::<OffsetForLeaderEpochRequest>()
        .is_err()
    {
        debug!(topic = %job.topic, partition = job.partition, broker_id = leader, "no OffsetForLeaderEpoch v2+; position not validated");
        return Ok(None);
    }
    let end = Conn::from_connection(connection)
        .offset_for_leader_epoch(&job.topic, job.partition, leader_epoch, epoch)
        .await?;
    debug!(
        topic = %job.topic,
        partition = job.partition,
        fetch_offset = job.offset,
        epoch,
        leader_epoch,
        end_epoch = end.0,
        end_offset = end.1,
        "position validated"
    );
    Ok(Some(end))
}

/// One Fetch request to `broker` for all `jobs`, of which `req` lists those it names,
/// asking for at most `max_bytes`.
async fn fetch(
    shared: Arc<Shared>,
    broker: i32,
    jobs: Vec<Job>,
    req: session::Request,
    max_bytes: i32,
) -> Event {
    let result = match fetch_request(&shared, broker, &jobs, req, max_bytes).await {
        Ok(resp) => {
            let session_id = resp.session_id;
            decode_response(&shared, resp, &jobs)
                .await
                .map(|d| (session_id, d))
        }
        Err(e) => Err(e),
    };
    Event::Fetched {
        broker,
        jobs,
        result,
    }
}

/// Compressed record bytes in one response from which decoding moves to Tokio's blocking
/// pool: 1 MiB of zstd can hold a hundred MiB of records, tens of milliseconds of work
/// that would otherwise hold up every other task of the runtime thread (group heartbeats,
/// the application's own tasks; all of them on a current-thread runtime).
const OFF_RUNTIME_DECODE_BYTES: usize = 256 << 10;

/// The compressed record bytes of `resp`: the record sets whose first batch is
/// compressed (a record batch's attributes are bytes 21-22; codec in the low 3 bits).
fn compressed_bytes(resp: &FetchResponse) -> usize {
    resp.responses
        .iter()
        .flat_map(|t| &t.partitions)
        .filter_map(|p| p.records.as_ref())
        .filter(|r| r.get(22).is_some_and(|attributes| attributes & 0x07 != 0))
        .map(|r| r.len())
        .sum()
}

/// Decode every job's partition of `resp` (in job order), on the blocking pool when the
/// response holds [`OFF_RUNTIME_DECODE_BYTES`] or more of compressed records.
async fn decode_response(
    shared: &Arc<Shared>,
    resp: FetchResponse,
    jobs: &[Job],
) -> Result<Decoded> {
    let wanted: Vec<(Arc<str>, i32, i64)> = jobs
        .iter()
        .map(|j| (j.topic.clone(), j.partition, j.offset))
        .collect();
    if compressed_bytes(&resp) < OFF_RUNTIME_DECODE_BYTES {
        return Ok(decode_all(shared, resp, &wanted));
    }
    let shared = shared.clone();
    tokio::task::spawn_blocking(move || decode_all(&shared, resp, &wanted))
        .await
        .map_err(|e| Error::protocol(format!("decoding a fetch response failed: {e}")))
}

fn decode_all(
    shared: &Shared,
    resp: FetchResponse,
    wanted: &[(Arc<str>, i32, i64)],
) -> Vec<Option<Result<FetchedBatches<LazyBatch>>>> {
    let mut data: HashMap<(String, i32), FetchPartitionData> = HashMap::new();
    for t in resp.responses {
        for p in t.partitions {
            data.insert((t.topic.clone(), p.partition_index), p);
        }
    }
    let config = &shared.config;
    let limit = partition_decompress_limit(config, wanted.len());
    wanted
        .iter()
        .map(|(topic, partition, offset)| {
            let pd = data.remove(&(topic.to_string(), *partition))?;
            Some(decode_fetch_lazy(
                pd,
                *offset,
                config.isolation_level,
                limit,
                Some(&shared.pool),
                config.check_crcs,
            ))
        })
        .collect()
}

/// How much each partition's compressed batches in a response for `partitions`
/// partitions may decompress to: [`ReaderConfig::queue_capacity_bytes`] shared among them,
/// never more than a lone partition's limit. A response then decodes to about what the
/// queue may hold, where each of 16 partitions of highly compressible records could bring
/// 64 MiB. What does not fit is fetched again once the queue has room. Each partition may
/// take at least 4 × [`ReaderConfig::max_partition_bytes`], so that with many partitions a
/// fetch of ordinary compressed data (ratios up to 4) is never cut and fetched again
/// (and the response's `max_bytes` bounds how many partitions carry data at all).
fn partition_decompress_limit(config: &ReaderConfig, partitions: usize) -> usize {
    let alone = decompress_limit(config.max_partition_bytes);
    let min = usize::try_from(config.max_partition_bytes.max(1))
        .unwrap_or(1)
        .saturating_mul(4);
    (config.queue_capacity_bytes / partitions.max(1))
        .max(min)
        .min(alone)
}

async fn fetch_request(
    shared: &Shared,
    broker: i32,
    jobs: &[Job],
    mut session: session::Request,
    max_bytes: i32,
) -> Result<FetchResponse> {
    let c = &shared.config;
    let conn = shared.cluster.connection(broker).await?;
    let version = conn.version_for::<FetchRequest>()?.min(MAX_FETCH_VERSION);
    if version < MIN_SESSION_VERSION && !session.full {
        // Not after a full request, which this broker would have answered without a
        // session; but a broker may be downgraded in between.
        session.full = true;
        session.send = (0..jobs.len()).collect();
    }
    let mut topics: Vec<FetchTopic> = Vec::new();
    for &i in &session.send {
        let j = &jobs[i];
        let s = sent(c, j);
        let part = FetchPartition {
            partition: j.partition,
            // a broker that is not the leader of this epoch refuses the fetch (KIP-320)
            current_leader_epoch: s.leader_epoch,
            fetch_offset: s.fetch_offset,
            last_fetched_epoch: -1,
            log_start_offset: s.log_start_offset,
            partition_max_bytes: s.max_bytes,
            ..Default::default()
        };
        match topics.iter_mut().find(|t| t.topic == *j.topic) {
            Some(t) => t.partitions.push(part),
            None => topics.push(FetchTopic {
                topic: j.topic.to_string(),
                partitions: vec![part],
                ..Default::default()
            }),
        }
    }
    let req = FetchRequest {
        replica_id: -1,
        max_wait_ms: crate::util::duration_ms(c.max_wait),
        min_bytes: c.min_bytes,
        max_bytes,
        isolation_level: c.isolation_level.code(),
        session_id: session.session_id,
        session_epoch: session.epoch,
        topics,
        forgotten_topics_data: forgotten(&session.forgotten),
        ..Default::default()
    };
    shared.counters.fetches.fetch_add(1, Ordering::Relaxed);
    if !session.full {
        shared
            .counters
            .incremental_fetches
            .fetch_add(1, Ordering::Relaxed);
    }
    #[cfg(feature = "metrics")]
    let started = Instant::now();
    let span = match jobs {
        [j] => {
            tracing::debug_span!("fetch", broker_id = broker, topic = %j.topic, partition = j.partition, offset = j.offset, epoch = j.leader_epoch)
        }
        _ => tracing::debug_span!(
            "fetch",
            broker_id = broker,
            partitions = jobs.len(),
            listed = session.send.len(),
            forgotten = session.forgotten.len(),
            session_id = session.session_id,
            session_epoch = session.epoch
        ),
    };
    let resp = conn.send_version(&req, version).instrument(span).await?;
    shared.counters.throttle.record(resp.throttle_time_ms);
    #[cfg(feature = "metrics")]
    shared.counters.fetch_latency.record(started.elapsed());
    if resp.error_code != 0 {
        return Err(Error::kafka(ErrorCode::from(resp.error_code)).with_broker(conn.broker()));
    }
    Ok(resp)
}

fn lock_sessions(shared: &Shared) -> std::sync::MutexGuard<'_, HashMap<i32, session::Held>> {
    shared
        .fetch_sessions
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Close the fetch sessions brokers hold for this reader (the fetch task has ended): a
/// Fetch naming each session with epoch -1 and no partitions, which the broker answers at
/// once after dropping the session, as the Java consumer does on close. Otherwise a
/// session keeps one of the broker's `max.incremental.fetch.session.cache.slots` (1,000
/// by default, shared by every consumer and follower) until it is evicted. A broker
/// answers a connection's requests in order, so where the ended task left a fetch
/// waiting (up to `max_wait`), the close goes over a connection of its own instead.
/// Best effort: each is bounded by `max_wait` plus a second, and a failure is only
/// logged.
pub(crate) async fn close_sessions(shared: &Shared) {
    let held: Vec<(i32, session::Held)> = std::mem::take(&mut *lock_sessions(shared))
        .into_iter()
        .filter(|(_, h)| h.id != 0)
        .collect();
    let bound = shared.config.max_wait + std::time::Duration::from_secs(1);
    join_all(held.into_iter().map(|(broker, held)| async move {
        let id = held.id;
        match tokio::time::timeout(bound, close_session(shared, broker, held)).await {
            Ok(Ok(())) => debug!(broker_id = broker, session_id = id, "fetch session closed"),
            Ok(Err(e)) => {
                debug!(broker_id = broker, session_id = id, error = %e, "closing the fetch session failed")
            }
            Err(_) => debug!(broker_id = broker, session_id = id, "closing the fetch session timed out"),
        }
    }))
    .await;
}

async fn close_session(shared: &Shared, broker: i32, held: session::Held) -> Result<()> {
    let conn = match shared.cluster.broker_addr(broker) {
        Some(addr) if held.waiting => {
            Connection::connect(&addr, shared.cluster.config().clone()).await?
        }
        _ => shared.cluster.connection(broker).await?,
    };
    let version = conn.version_for::<FetchRequest>()?.min(MAX_FETCH_VERSION);
    if version < MIN_SESSION_VERSION {
        return Ok(());
    }
    let req = FetchRequest {
        replica_id: -1,
        max_wait_ms: 0,
        min_bytes: 0,
        max_bytes: 0,
        isolation_level: shared.config.isolation_level.code(),
        session_id: held.id,
        session_epoch: -1,
        ..Default::default()
    };
    let resp = conn.send_version(&req, version).await?;
    if resp.error_code != 0 {
        return Err(Error::kafka(ErrorCode::from(resp.error_code)).with_broker(conn.broker()));
    }
    Ok(())
}

/// The forgotten partitions of a request, by topic.
fn forgotten(keys: &[session::Key]) -> Vec<ForgottenTopic> {
    let mut topics: Vec<ForgottenTopic> = Vec::new();
    for (topic, partition) in keys {
        match topics.iter_mut().find(|t| t.topic == **topic) {
            Some(t) => t.partitions.push(*partition),
            None => topics.push(ForgottenTopic {
                topic: topic.to_string(),
                partitions: vec![*partition],
                ..Default::default()
            }),
        }
    }
    topics
}

/// Errors after which the partition's leader must be looked up again. Not
/// `UNKNOWN_LEADER_EPOCH`: the broker has not caught up with the epoch our metadata
/// knows yet, and the same request is retried after the backoff (KIP-320, as Java).
/// `FENCED_LEADER_EPOCH` (ours is older) does need newer metadata.
fn needs_new_leader(e: &Error) -> bool {
    match e.kafka_code() {
        Some(code) => matches!(
            code,
            ErrorCode::NotLeaderOrFollower
                | ErrorCode::LeaderNotAvailable
                | ErrorCode::UnknownTopicOrPartition
                | ErrorCode::FencedLeaderEpoch
                | ErrorCode::ReplicaNotAvailable
                | ErrorCode::KafkaStorageError
                | ErrorCode::NotCoordinator
        ),
        // I/O, timeouts, closed connections, unknown broker ids.
        None => true,
    }
}

/// Whether a partition's fetch result failed to decode (a batch failing its CRC or
/// decompression, or decompressing past the hard cap), rather than the broker reporting an
/// error: the same bytes come back on every fetch of that offset, so the reader cannot
/// skip them and retrying is pointless.
fn undecodable(e: &Error) -> bool {
    matches!(e.kind(), ErrorKind::Protocol | ErrorKind::Compression)
}

/// Record a failed attempt for partition `id` (planned under `epoch`): back off, maybe
/// forget the leader. A fatal error is yielded at once; a transient one only once the
/// partition has been failing for `retry_timeout` (then again every `retry_timeout`).
fn fail(shared: &Shared, id: u64, epoch: u64, err: Error) {
    let mut st = shared.lock();
    let config = &shared.config;
    let Some(p) = st.parts.get_mut(&id) else {
        return;
    };
    p.busy = false;
    if p.epoch != epoch {
        return;
    }
    let now = Instant::now();
    let topic = p.topic.clone();
    let partition = p.partition;
    let fatal = retry::is_fatal(&err);
    if needs_new_leader(&err) {
        p.leader = None;
        shared.cluster.invalidate(&topic);
    }
    shared.counters.errors.fetch_add(1, Ordering::Relaxed);
    let err = err.with_topic(&*topic).with_partition(partition);
    shared.counters.last_error.set(&err);
    let permit = shared.counters.warn_limit.permit(now);
    let yield_it = if fatal {
        p.streak.fail_fatally();
        p.retry_at = Some(now + config.read_backoff_max);
        warn!(topic = %topic, partition, error = %err, "fatal error; yielding it");
        true
    } else {
        shared.counters.retries.fetch_add(1, Ordering::Relaxed);
        let failing_for = p.streak.failing_for(now);
        let (backoff, expired) = p.streak.fail(now, config);
        p.retry_at = Some(now + backoff);
        let failures = p.streak.failures;
        let (failing_ms, backoff_ms) = (failing_for.as_millis() as u64, backoff.as_millis() as u64);
        if expired {
            warn!(topic = %topic, partition, failures, failing_ms, error = %err, "partition still failing after retry_timeout; yielding the error and retrying on");
        } else if let Some(suppressed) = permit {
            warn!(topic = %topic, partition, failures, failing_ms, backoff_ms, suppressed, error = %err, "transient error; retrying");
        } else {
            debug!(topic = %topic, partition, failures, failing_ms, backoff_ms, error = %err, "transient error; retrying");
        }
        expired
    };
    if !yield_it {
        return;
    }
    // At most one pending error per partition, so a reader nobody polls does not pile
    // them up.
    let queued = st
        .errors
        .iter()
        .any(|e| e.partition() == Some(partition) && e.topic() == Some(&*topic));
    if !queued {
        st.push_error(err);
    }
    if let Some(w) = st.consumer.take() {
        drop(st);
        w.wake();
    }
}

fn on_resolved(shared: &Shared, results: Vec<(Job, Lookup)>) {
    for (job, r) in results {
        match r {
            Err(e) => fail(shared, job.id, job.epoch, e),
            Ok(found) => {
                let mut st = shared.lock();
                let lent = st.is_lent(job.id);
                let Some(p) = st.parts.get_mut(&job.id) else {
                    continue;
                };
                p.busy = false;
                if p.epoch != job.epoch {
                    continue;
                }
                // The run of failures goes on until a fetch succeeds: a leader that is
                // found but does not serve the partition yet keeps backing off.
                let moved = p.leader != Some(found.leader) || p.leader_epoch != found.leader_epoch;
                p.leader = Some(found.leader);
                p.leader_epoch = found.leader_epoch;
                if let (Some(o), Position::Start(_)) = (found.offset, p.fetch) {
                    p.fetch = Position::Offset(o);
                    // Messages still to be yielded (buffered or on loan) set the
                    // position as they go.
                    if p.is_empty() && !lent {
                        p.position = o;
                    }
                }
                if job.validate.is_some() {
                    // validated against the leader (and epoch) just found
                    p.validate = false;
                    if let Some(end) = found.end {
                        validated(shared, &mut st, &job, found.leader_epoch, end);
                    }
                } else if moved && found.leader_epoch >= 0 {
                    // Java validates whenever the leader or its epoch changes and the
                    // position has an epoch (`maybeValidatePositionForCurrentLeader`)
                    p.validate = true;
                }
            }
        }
    }
}

/// Apply the leader's answer `(end_epoch, end_offset)` to the validation `job` (see
/// `validate.rs`).
fn validated(
    shared: &Shared,
    st: &mut State,
    job: &Job,
    leader_epoch: i32,
    (end_epoch, end_offset): (i32, i64),
) {
    let Some(p) = st.parts.get(&job.id) else {
        return;
    };
    if p.fetch != Position::Offset(job.offset) {
        return;
    }
    let config = &shared.config;
    let position = st.position_of(job.id, p);
    let (topic, partition) = (p.topic.clone(), p.partition);
    let epoch = job.validate.unwrap_or(-1);
    let outcome = validate::outcome(
        config.offset_reset,
        position,
        job.offset,
        end_epoch,
        end_offset,
    );
    let truncation = || LogTruncation {
        topic: topic.to_string(),
        partition,
        position,
        fetch_offset: job.offset,
        epoch,
        divergent_offset: (end_epoch >= 0 && end_offset >= 0).then_some(end_offset),
        divergent_epoch: (end_epoch >= 0 && end_offset >= 0).then_some(end_epoch),
        leader_epoch,
    };
    match outcome {
        Outcome::Valid => {}
        Outcome::Refetch => {
            let from = st.refetch(job.id);
            info!(topic = %topic, partition, fetch_offset = job.offset, epoch, end_epoch, end_offset, leader_epoch, from, "log truncated after the position; fetching again");
        }
        Outcome::SeekTo(to) => {
            shared
                .counters
                .log_truncations
                .fetch_add(1, Ordering::Relaxed);
            warn!(topic = %topic, partition, position, fetch_offset = job.offset, epoch, end_epoch, end_offset, leader_epoch, policy = ?config.offset_reset, "log truncation detected; continuing at the first offset known to diverge");
            st.reset(job.id, Position::Offset(to));
            if let Some(p) = st.parts.get_mut(&job.id) {
                p.epochs.record(to - 1, end_epoch);
            }
        }
        Outcome::Reset => {
            shared
                .counters
                .log_truncations
                .fetch_add(1, Ordering::Relaxed);
            shared.counters.resets.fetch_add(1, Ordering::Relaxed);
            warn!(topic = %topic, partition, position, fetch_offset = job.offset, epoch, leader_epoch, policy = ?config.offset_reset, "log truncation detected and the leader knows no epoch that old; resetting");
            let to = match config.offset_reset {
                OffsetReset::Latest => StartOffset::Last,
                _ => StartOffset::First,
            };
            st.reset(job.id, Position::Start(to));
        }
        Outcome::Fail => {
            shared
                .counters
                .log_truncations
                .fetch_add(1, Ordering::Relaxed);
            let t = truncation();
            warn!(topic = %topic, partition, position, fetch_offset = job.offset, epoch, end_epoch, end_offset, leader_epoch, "log truncation detected; partition paused until a seek");
            let err = Error::kafka(ErrorCode::OffsetOutOfRange)
                .with_message("log truncation detected, partition paused until a seek")
                .with_topic(&*topic)
                .with_partition(partition)
                .with_source(t);
            shared.counters.last_error.set(&err);
            // the messages still buffered before the divergent offset go first
            if st.park(job.id, err) {
                if let Some(w) = st.consumer.take() {
                    w.wake();
                }
            }
        }
    }
}

fn on_fetched(shared: &Shared, broker: i32, jobs: Vec<Job>, result: Result<Decoded>) {
    let decoded = match result {
        Ok(d) => d,
        Err(e) => {
            debug!(broker_id = broker, error = %e, "fetch request failed");
            for j in jobs {
                fail(shared, j.id, j.epoch, e.clone());
            }
            return;
        }
    };
    let config = &shared.config;
    let mut wake = None;
    // Decoded outside the lock; a stale result is simply dropped below.
    for (j, decoded) in jobs.into_iter().zip(decoded) {
        let mut st = shared.lock();
        let Some(p) = st.parts.get_mut(&j.id) else {
            continue;
        };
        if p.epoch != j.epoch || p.fetch != Position::Offset(j.offset) {
            p.busy = false;
            continue;
        }
        match decoded {
            // Kafka lists every partition of a sessionless fetch; tansu 0.6 leaves out
            // those with nothing new. Nothing new either way.
            None => {
                p.busy = false;
                p.streak.reset();
            }
            Some(Ok(f)) => {
                p.busy = false;
                p.streak.reset();
                if f.high_watermark >= 0 {
                    p.high_watermark = f.high_watermark;
                }
                p.fetch = Position::Offset(f.next_offset.max(j.offset));
                p.epochs.extend(&f.epochs);
                if p.position < 0 {
                    p.position = j.offset;
                }
                let hw = p.high_watermark;
                let (n, bytes) = st.push_batches(j.id, f.batches, j.offset, broker, hw);
                // Nothing yieldable (control records, an aborted transaction): with
                // nothing buffered, the position moves past it.
                if n == 0 {
                    st.fetched_to(j.id, j.offset, f.next_offset);
                }
                if n > 0 {
                    shared.counters.messages.fetch_add(n, Ordering::Relaxed);
                    shared.counters.bytes.fetch_add(bytes, Ordering::Relaxed);
                    if let Some(w) = st.consumer.take() {
                        wake = Some(w);
                    }
                }
            }
            Some(Err(e)) if e.kafka_code() == Some(ErrorCode::OffsetOutOfRange) => {
                p.busy = false;
                shared.counters.resets.fetch_add(1, Ordering::Relaxed);
                let topic = p.topic.clone();
                let to = match config.offset_reset {
                    OffsetReset::Earliest => Position::Start(StartOffset::First),
                    OffsetReset::Latest => Position::Start(StartOffset::Last),
                    OffsetReset::Error => Position::Parked,
                };
                warn!(topic = %topic, partition = j.partition, offset = j.offset, policy = ?config.offset_reset, "offset out of range; resetting");
                p.fetch = to;
                if to == Position::Parked {
                    st.push_error(
                        e.with_topic(&*topic)
                            .with_partition(j.partition)
                            .with_message(format!("offset {} is out of range", j.offset)),
                    );
                    if let Some(w) = st.consumer.take() {
                        wake = Some(w);
                    }
                }
            }
            Some(Err(e)) if undecodable(&e) => {
                p.busy = false;
                p.streak.fail_fatally();
                shared.counters.errors.fetch_add(1, Ordering::Relaxed);
                let topic = p.topic.clone();
                // The broker serves the same bytes for this offset every time: fetching
                // them again would loop forever. Stop here until the application seeks.
                let err = e
                    .clone()
                    .with_message(format!(
                        "cannot decode the records fetched at offset {}: {e}; the partition is paused until a seek",
                        j.offset
                    ))
                    .with_topic(&*topic)
                    .with_partition(j.partition)
                    .with_broker(format!("broker {broker}"));
                shared.counters.last_error.set(&err);
                warn!(topic = %topic, partition = j.partition, offset = j.offset, error = %e, "fetched records cannot be decoded; partition paused until a seek");
                if st.park(j.id, err) {
                    if let Some(w) = st.consumer.take() {
                        wake = Some(w);
                    }
                }
            }
            Some(Err(e)) => {
                drop(st);
                fail(
                    shared,
                    j.id,
                    j.epoch,
                    e.with_broker(format!("broker {broker}")),
                );
            }
        }
    }
    if let Some(w) = wake {
        w.wake();
    }
}

#[cfg(test)]
#[path = "task_tests.rs"]
mod tests;
