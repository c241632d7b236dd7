//! An in-process Kafka cluster for tests (cargo feature `mock`, off by default).
//!
//! [`MockCluster`] starts N brokers on loopback ports that speak the real wire protocol
//! through this crate's own codec (the broker side decodes requests and encodes
//! responses), with in-memory partition logs. Point a [`Writer`](crate::writer::Writer),
//! [`Reader`](crate::reader::Reader), [`Admin`](crate::admin::Admin) or
//! [`Conn`](crate::conn::Conn) at [`MockCluster::bootstrap`] and test a pipeline without a
//! broker, including the faults a real broker cannot be made to show on demand:
//! [`MockCluster::fault`] answers the next requests of an API with an error code, delays
//! them, hangs, closes the connection or corrupts the response;
//! [`MockCluster::move_leader`], [`MockCluster::kill`] and [`MockCluster::restart`] move
//! leadership and take brokers down.
//!
//! What it serves: ApiVersions, Metadata (with topic ids), Produce (acks 0/1/all,
//! idempotent sequence checks, by name or topic id), Fetch (long poll, byte limits,
//! read-committed up to the last stable offset with the aborted-transaction list),
//! ListOffsets (earliest, latest, by timestamp, max timestamp), CreateTopics,
//! DeleteTopics, CreatePartitions, DescribeConfigs/AlterConfigs (topics),
//! FindCoordinator, the classic group protocol (JoinGroup with a join barrier,
//! SyncGroup, Heartbeat, LeaveGroup, session expiry), the consumer group protocol of
//! KIP-848 (ConsumerGroupHeartbeat: member epochs, a sticky uniform target assignment,
//! revocation before a partition moves to its next owner, fencing on session expiry and
//! on a revocation not done within the rebalance timeout — see
//! [`MockClusterBuilder::consumer_group_timeouts`]), OffsetCommit (v9 member epoch
//! checks for KIP-848 groups), OffsetFetch,
//! DescribeGroups, DeleteGroups, InitProducerId and the transaction APIs
//! (AddPartitionsToTxn, AddOffsetsToTxn, TxnOffsetCommit, EndTxn, which writes the
//! COMMIT/ABORT markers and applies the transaction's offsets on commit; a test can also
//! write transactional batches and markers itself with [`MockCluster::append_raw`]).
//! With [`MockClusterBuilder::finalized_feature`]`("transaction.version", 2)` it speaks
//! KIP-890 transactions v2: Produce v12 adds the batch's partition to its transaction,
//! EndTxn v5 bumps the epoch (a new producer id once exhausted). Produce before v12 does
//! not check that a transactional batch's partition was added to its transaction, and
//! transactions never time out. Not served: SASL, DeleteRecords,
//! IncrementalAlterConfigs, DescribeCluster, ConsumerGroupDescribe — the mock does
//! not advertise them and closes the connection on such a request, as Kafka does for an
//! API it does not know. Topics are not created
//! automatically. Every partition is replicated on every broker, so a killed leader's
//! partitions move to a live broker at once; there is no replication delay.
//!
//! It is a test tool: real-broker tests stay the reference for Kafka's behaviour.
//!
//! ```
//! use futures::{SinkExt, StreamExt};
//! use kafkapipe::mock::MockCluster;
//! use kafkapipe::reader::{Reader, ReaderConfig};
//! use kafkapipe::writer::{Message, Writer, WriterConfig};
//!
//! # fn main() -> kafkapipe::Result<()> {
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| kafkapipe::Error::io("runtime", e))?.block_on(async {
//! let cluster = MockCluster::builder().brokers(3).topic("events", 2).start().await?;
//!
//! let mut writer = Writer::new(WriterConfig::new(cluster.bootstrap()).topic("events"))?;
//! writer.send(Message::new("hello").with_partition(1)).await?;
//! writer.close().await?;
//!
//! let mut reader = Reader::new(ReaderConfig::new(cluster.bootstrap()).partition("events", 1)).await?;
//! let message = reader.next().await.transpose()?;
//! assert_eq!(message.and_then(|m| m.value).as_deref(), Some(&b"hello"[..]));
//! reader.close().await;
//! # Ok(()) })
//! # }
//! ```

mod admin_apis;
mod consumer_group;
mod gate;
mod group;
mod handlers;
mod log;
mod txn;

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::compression::Compression;
use crate::error::{Error, ErrorKind, Result};
use crate::protocol::{ApiKey, ErrorCode, Request, RequestHeader};
use crate::record::{decode_batches, Record, RecordBatchBuilder};

pub use gate::Gate;
use group::Group;
use log::PartitionLog;

/// The largest request frame a mock broker reads; a larger size prefix closes the
/// connection.
const MAX_FRAME: usize = 64 * 1024 * 1024;

/// A fault injected into the requests of one API (see [`MockCluster::fault`]).
///
/// ```
/// use std::time::Duration;
/// use kafkapipe::conn::{Conn, ConnectionConfig};
/// use kafkapipe::mock::{Fault, MockCluster};
/// use kafkapipe::protocol::ApiKey;
/// use kafkapipe::ErrorKind;
///
/// # fn main() -> kafkapipe::Result<()> {
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| kafkapipe::Error::io("runtime", e))?.block_on(async {
/// let cluster = MockCluster::builder().topic("t", 1).start().await?;
/// let config = ConnectionConfig {
///     request_timeout: Duration::from_millis(100),
///     ..ConnectionConfig::default()
/// };
/// let conn = Conn::connect_with(&cluster.bootstrap()[0], config).await?;
/// // The next ListOffsets is never answered: the client's request timeout fires.
/// cluster.fault(ApiKey::LIST_OFFSETS, Fault::Hang, 1);
/// let err = conn.last_offset("t", 0).await.unwrap_err();
/// assert_eq!(err.kind(), ErrorKind::Timeout);
/// # Ok(()) })
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Fault {
    /// Answer with this error code and change nothing: a produce is not appended, a join
    /// does not join. The code goes where the API reports errors — every partition of a
    /// Produce or ListOffsets, every topic of Metadata, the top-level code of Fetch (with
    /// no partitions, as a fetch session error), of the group APIs and of
    /// FindCoordinator. For one partition's error in a Fetch, see
    /// [`MockCluster::fault_partition`].
    Error(ErrorCode),
    /// Like [`Error`](Self::Error), with this error message where the response has a
    /// field for it (Produce partitions, CreateTopics, CreatePartitions,
    /// FindCoordinator).
    ErrorWithMessage(ErrorCode, String),
    /// Handle the request normally, but only after this long.
    Delay(Duration),
    /// Handle the request normally once the [`Gate`] lets it through (one request per
    /// [`Gate::release`]); the broker's connection reads nothing more meanwhile.
    Hold(Gate),
    /// Never answer; the connection stays open and reads nothing more.
    Hang,
    /// Close the connection on receiving the request, without handling it.
    CloseOnRequest,
    /// Handle the request, write the first half of the response frame, then close the
    /// connection.
    CloseMidResponse,
    /// Handle the request and answer with a frame whose correlation id matches no request.
    Corrupt,
    /// Handle the request and answer with a well-framed response to the right
    /// correlation id whose every following byte is `0xff`.
    GarbageBody,
    /// Handle the request and answer with its response cut short by this many bytes
    /// (the size prefix says the shorter length).
    Truncate(usize),
    /// Handle the request and write these bytes instead of the response frame (a size
    /// prefix, if wanted, is part of them).
    Raw(Bytes),
}

#[derive(Debug, Clone)]
struct FaultRule {
    api: ApiKey,
    broker: Option<i32>,
    fault: Fault,
    /// How many more requests it applies to; `u32::MAX` never runs out.
    remaining: u32,
}

#[derive(Debug, Clone)]
struct PartitionFault {
    api: ApiKey,
    topic: String,
    partition: i32,
    /// The error to answer, or `None`: handle the partition and leave it out of the
    /// response.
    code: Option<ErrorCode>,
    remaining: u32,
}

#[derive(Debug)]
struct Broker {
    id: i32,
    addr: SocketAddr,
    up: bool,
}

#[derive(Debug)]
struct Topic {
    id: [u8; 16],
    partitions: Vec<PartitionLog>,
    /// The configs set on the topic (CreateTopics, AlterConfigs).
    configs: BTreeMap<String, String>,
}

/// The partition index under which per-group faults are kept with the partition faults.
const GROUP_PARTITION: i32 = -1;

/// Everything the brokers share, behind one lock.
#[derive(Debug, Default)]
struct State {
    brokers: Vec<Broker>,
    topics: BTreeMap<String, Topic>,
    groups: HashMap<String, Group>,
    faults: Vec<FaultRule>,
    partition_faults: Vec<PartitionFault>,
    /// APIs whose request frames are kept, with the frames kept so far.
    captured: HashMap<ApiKey, Vec<(i32, i16, Bytes)>>,
    /// Produced batches larger than this are refused with `MESSAGE_TOO_LARGE`.
    max_message_bytes: Option<usize>,
    /// ApiVersions ranges replacing the mock's own, per API.
    versions: HashMap<ApiKey, (i16, i16)>,
    /// Whether Metadata reports topic ids (else all zeros, as brokers before 2.8).
    topic_ids: bool,
    /// APIs left out of ApiVersions.
    without: Vec<ApiKey>,
    /// Finalized features reported in ApiVersions (v3+): (name, level).
    features: Vec<(String, i16)>,
    /// Coordinators pinned by the test, per group (or transactional) id.
    pinned_coordinators: HashMap<String, i32>,
    requests: HashMap<(i32, ApiKey), u64>,
    next_producer_id: i64,
    transactions: HashMap<String, txn::Txn>,
    next_topic_id: u64,
    next_member_id: u64,
    truncate_fetches: bool,
    /// KIP-848 groups: the heartbeat interval told to members and the session timeout.
    consumer_timeouts: (Duration, Duration),
}

impl State {
    fn live_brokers(&self) -> impl Iterator<Item = &Broker> {
        self.brokers.iter().filter(|b| b.up)
    }

    /// A live broker for the `n`th partition (round-robin), or -1 if none is up.
    fn pick_leader(&self, n: usize) -> i32 {
        let live: Vec<i32> = self.live_brokers().map(|b| b.id).collect();
        if live.is_empty() {
            -1
        } else {
            live[n % live.len()]
        }
    }

    fn create_topic(&mut self, name: &str, partitions: i32) {
        self.next_topic_id += 1;
        let mut id = [0u8; 16];
        id[8..].copy_from_slice(&self.next_topic_id.to_be_bytes());
        id[0] = 0x4d;
        let offset = self.topics.len();
        let partitions = (0..partitions.max(0))
            .map(|p| PartitionLog::new(self.pick_leader(offset + usize::try_from(p).unwrap_or(0))))
            .collect();
        self.topics.insert(
            name.to_string(),
            Topic {
                id,
                partitions,
                configs: BTreeMap::new(),
            },
        );
    }

    /// The name of a topic a request names by `name` or, if that is empty, by `id`.
    fn resolve(&self, name: &str, id: [u8; 16]) -> std::result::Result<String, ErrorCode> {
        if !name.is_empty() {
            return Ok(name.to_string());
        }
        if id == [0; 16] || !self.topic_ids {
            return Err(ErrorCode::UnknownTopicId);
        }
        self.topics
            .iter()
            .find(|(_, t)| t.id == id)
            .map(|(n, _)| n.clone())
            .ok_or(ErrorCode::UnknownTopicId)
    }

    fn partition(&self, topic: &str, partition: i32) -> Option<&PartitionLog> {
        let p = usize::try_from(partition).ok()?;
        self.topics.get(topic)?.partitions.get(p)
    }

    fn partition_mut(&mut self, topic: &str, partition: i32) -> Option<&mut PartitionLog> {
        let p = usize::try_from(partition).ok()?;
        self.topics.get_mut(topic)?.partitions.get_mut(p)
    }

    /// The coordinator of a group or transactional id: a live broker chosen by a hash of
    /// the key, so it moves when that broker goes down.
    fn coordinator(&self, key: &str) -> Option<&Broker> {
        if let Some(id) = self.pinned_coordinators.get(key) {
            return self.live_brokers().find(|b| b.id == *id);
        }
        let live: Vec<&Broker> = self.live_brokers().collect();
        if live.is_empty() {
            return None;
        }
        let hash = key
            .bytes()
            .fold(5381u64, |h, b| h.wrapping_mul(33) ^ u64::from(b));
        let i = usize::try_from(hash % live.len() as u64).unwrap_or(0);
        live.get(i).copied()
    }

    /// Whether the cluster finalizes `transaction.version` >= 2 (transactions v2).
    fn transactions_v2(&self) -> bool {
        self.features
            .iter()
            .any(|(n, l)| n == "transaction.version" && *l >= 2)
    }

    /// Take the error injected for one partition of a request of `api`, if any.
    fn take_partition_error(
        &mut self,
        api: ApiKey,
        topic: &str,
        partition: i32,
    ) -> Option<ErrorCode> {
        self.take_partition_fault(api, topic, partition).flatten()
    }

    /// Take the fault injected for one partition of a request of `api`, if any:
    /// `Some(None)` is "leave the partition out of the response".
    fn take_partition_fault(
        &mut self,
        api: ApiKey,
        topic: &str,
        partition: i32,
    ) -> Option<Option<ErrorCode>> {
        let i = self
            .partition_faults
            .iter()
            .position(|f| f.api == api && f.topic == topic && f.partition == partition)?;
        let rule = &mut self.partition_faults[i];
        let code = rule.code;
        if rule.remaining != u32::MAX {
            rule.remaining = rule.remaining.saturating_sub(1);
            if rule.remaining == 0 {
                self.partition_faults.remove(i);
            }
        }
        Some(code)
    }

    /// Take the fault for the next request of `api` on `broker`, if one is injected.
    fn take_fault(&mut self, broker: i32, api: ApiKey) -> Option<Fault> {
        let i = self
            .faults
            .iter()
            .position(|f| f.api == api && f.broker.is_none_or(|b| b == broker))?;
        let rule = &mut self.faults[i];
        let fault = rule.fault.clone();
        if rule.remaining != u32::MAX {
            rule.remaining = rule.remaining.saturating_sub(1);
            if rule.remaining == 0 {
                self.faults.remove(i);
            }
        }
        Some(fault)
    }
}

/// What every broker task holds.
#[derive(Debug)]
struct Shared {
    state: Mutex<State>,
    /// Bumped on every change a waiting request may care about (appends, group changes).
    tick: watch::Sender<u64>,
}

impl Shared {
    /// The state, even if a task panicked while holding the lock (the mock's state stays
    /// usable for the test's assertions).
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn changed(&self) {
        self.tick.send_modify(|t| *t = t.wrapping_add(1));
    }
}

/// Builds a [`MockCluster`]; from [`MockCluster::builder`].
///
/// ```
/// # fn main() -> kafkapipe::Result<()> {
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| kafkapipe::Error::io("runtime", e))?.block_on(async {
/// let cluster = kafkapipe::mock::MockCluster::builder()
///     .brokers(2)
///     .topic("a", 3)
///     .topic("b", 1)
///     .start()
///     .await?;
/// assert_eq!(cluster.bootstrap().len(), 2);
/// assert_eq!(cluster.partitions("a"), Some(3));
/// # Ok(()) })
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct MockClusterBuilder {
    brokers: i32,
    topics: Vec<(String, i32)>,
    truncate_fetches: bool,
    versions: HashMap<ApiKey, (i16, i16)>,
    topic_ids: bool,
    without: Vec<ApiKey>,
    features: Vec<(String, i16)>,
    consumer_timeouts: (Duration, Duration),
}

impl MockClusterBuilder {
    /// The number of brokers (ids `1..=n`, at least 1; default 1).
    ///
    /// ```
    /// use kafkapipe::mock::MockCluster;
    ///
    /// # fn main() -> kafkapipe::Result<()> {
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| kafkapipe::Error::io("runtime", e))?.block_on(async {
    /// let cluster = MockCluster::builder().brokers(3).start().await?;
    /// assert_eq!(cluster.bootstrap().len(), 3);
    /// # Ok(()) })
    /// # }
    /// ```
    pub fn brokers(mut self, n: i32) -> Self {
        self.brokers = n.max(1);
        self
    }

    /// A topic to create at start with `partitions` partitions, led round-robin by the
    /// brokers.
    ///
    /// ```
    /// use kafkapipe::mock::MockCluster;
    ///
    /// # fn main() -> kafkapipe::Result<()> {
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| kafkapipe::Error::io("runtime", e))?.block_on(async {
    /// let cluster = MockCluster::builder().brokers(2).topic("t", 4).start().await?;
    /// let leaders: Vec<_> = (0..4).filter_map(|p| cluster.leader("t", p)).collect();
    /// assert_eq!(leaders, [1, 2, 1, 2]);
    /// # Ok(()) })
    /// # }
    /// ```
    pub fn topic(mut self, name: impl Into<String>, partitions: i32) -> Self {
        self.topics.push((name.into(), partitions));
        self
    }

    /// Whether a fetch response cut at its byte limit carries the first part of the
    /// batch that did not fit, as Kafka's does (default `false`: only whole batches).
    ///
    /// ```
    /// use kafkapipe::mock::MockCluster;
    ///
    /// # fn main() -> kafkapipe::Result<()> {
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| kafkapipe::Error::io("runtime", e))?.block_on(async {
    /// // Fetch responses cut at their limit carry the start of the next batch, as Kafka's do.
    /// let cluster = MockCluster::builder().topic("t", 1).truncate_fetches(true).start().await?;
    /// assert_eq!(cluster.partitions("t"), Some(1));
    /// # Ok(()) })
    /// # }
    /// ```
    pub fn truncate_fetches(mut self, truncate: bool) -> Self {
        self.truncate_fetches = truncate;
        self
    }

    /// Advertise `min..=max` for `api` in ApiVersions instead of the mock's own range
    /// (which stops Fetch and Produce at v12, before topic ids; v13 and up are served
    /// too when advertised here). A range the mock cannot serve makes it close the
    /// connection on such a request, as Kafka does with a version it does not know.
    ///
    /// ```
    /// use kafkapipe::conn::Conn;
    /// use kafkapipe::mock::MockCluster;
    /// use kafkapipe::protocol::ApiKey;
    /// use kafkapipe::ErrorKind;
    ///
    /// # fn main() -> kafkapipe::Result<()> {
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| kafkapipe::Error::io("runtime", e))?.block_on(async {
    /// // A broker whose Fetch versions this client does not speak.
    /// let cluster = MockCluster::builder().topic("t", 1).api_versions(ApiKey::FETCH, 0, 3).start().await?;
    /// let conn = Conn::connect(&cluster.bootstrap()[0]).await?;
    /// let err = conn.fetch("t", 0, 0, &Default::default()).await.unwrap_err();
    /// assert_eq!(err.kind(), ErrorKind::UnsupportedVersion);
    /// # Ok(()) })
    /// # }
    /// ```
    pub fn api_versions(mut self, api: ApiKey, min: i16, max: i16) -> Self {
        self.versions.insert(api, (min, max));
        self
    }

    /// Leave `api` out of ApiVersions, as a broker that lacks it (clients then fall back
    /// or report it unsupported).
    ///
    /// ```
    /// use kafkapipe::conn::Conn;
    /// use kafkapipe::mock::MockCluster;
    /// use kafkapipe::protocol::ApiKey;
    ///
    /// # fn main() -> kafkapipe::Result<()> {
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| kafkapipe::Error::io("runtime", e))?.block_on(async {
    /// let cluster = MockCluster::builder().without_api(ApiKey::CREATE_PARTITIONS).start().await?;
    /// let conn = Conn::connect(&cluster.bootstrap()[0]).await?;
    /// let versions = conn.connection().api_versions().map(|v| v.api_keys.clone()).unwrap_or_default();
    /// assert!(!versions.iter().any(|r| r.api_key == ApiKey::CREATE_PARTITIONS));
    /// # Ok(()) })
    /// # }
    /// ```
    pub fn without_api(mut self, api: ApiKey) -> Self {
        self.without.push(api);
        self
    }

    /// Report feature `name` finalized at `level` in ApiVersions (v3+), as Kafka reports
    /// e.g. `transaction.version` = 2 (default: no finalized features). With
    /// `transaction.version` >= 2 the mock's EndTxn v5 bumps the epoch (KIP-890).
    ///
    /// ```
    /// use kafkapipe::conn::Conn;
    /// use kafkapipe::mock::MockCluster;
    ///
    /// # fn main() -> kafkapipe::Result<()> {
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| kafkapipe::Error::io("runtime", e))?.block_on(async {
    /// let cluster = MockCluster::builder().finalized_feature("transaction.version", 2).start().await?;
    /// let conn = Conn::connect(&cluster.bootstrap()[0]).await?;
    /// let versions = conn.connection().api_versions().cloned().unwrap_or_default();
    /// assert_eq!(versions.finalized_level("transaction.version"), 2);
    /// # Ok(()) })
    /// # }
    /// ```
    pub fn finalized_feature(mut self, name: &str, level: i16) -> Self {
        self.features.retain(|(n, _)| n != name);
        self.features.push((name.to_string(), level));
        self
    }

    /// Whether Metadata reports topic ids (default `true`; `false` reports all zeros,
    /// as brokers before Kafka 2.8 do).
    ///
    /// ```
    /// use kafkapipe::conn::Conn;
    /// use kafkapipe::mock::MockCluster;
    ///
    /// # fn main() -> kafkapipe::Result<()> {
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| kafkapipe::Error::io("runtime", e))?.block_on(async {
    /// let cluster = MockCluster::builder().topic("t", 1).topic_ids(false).start().await?;
    /// let conn = Conn::connect(&cluster.bootstrap()[0]).await?;
    /// let metadata = conn.metadata(Some(&["t"])).await?;
    /// assert_eq!(metadata.topic("t").map(|t| t.id), Some([0; 16]));
    /// # Ok(()) })
    /// # }
    /// ```
    pub fn topic_ids(mut self, on: bool) -> Self {
        self.topic_ids = on;
        self
    }

    /// The heartbeat interval the coordinator tells KIP-848 members and the session
    /// timeout after which it fences a member it has not heard from (Kafka's
    /// `group.consumer.heartbeat.interval.ms` and `group.consumer.session.timeout.ms`;
    /// default 5 s and 45 s, as Kafka's).
    ///
    /// ```
    /// use std::time::Duration;
    /// use kafkapipe::mock::MockCluster;
    ///
    /// # fn main() -> kafkapipe::Result<()> {
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| kafkapipe::Error::io("runtime", e))?.block_on(async {
    /// let cluster = MockCluster::builder()
    ///     .topic("t", 2)
    ///     .consumer_group_timeouts(Duration::from_millis(100), Duration::from_secs(3))
    ///     .start()
    ///     .await?;
    /// assert_eq!(cluster.partitions("t"), Some(2));
    /// # Ok(()) })
    /// # }
    /// ```
    pub fn consumer_group_timeouts(
        mut self,
        heartbeat_interval: Duration,
        session_timeout: Duration,
    ) -> Self {
        self.consumer_timeouts = (heartbeat_interval, session_timeout);
        self
    }

    /// Bind the brokers to ephemeral ports on 127.0.0.1 and start serving.
    ///
    /// Fails only if a port cannot be bound.
    ///
    /// # Cancellation safety
    ///
    /// Dropping the future before it completes stops the brokers bound so far.
    ///
    /// ```
    /// use kafkapipe::mock::MockCluster;
    ///
    /// # fn main() -> kafkapipe::Result<()> {
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| kafkapipe::Error::io("runtime", e))?.block_on(async {
    /// let cluster = MockCluster::builder().start().await?;
    /// assert!(cluster.bootstrap()[0].starts_with("127.0.0.1:"));
    /// # Ok(()) })
    /// # }
    /// ```
    pub async fn start(self) -> Result<MockCluster> {
        let (tick, _) = watch::channel(0);
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                next_producer_id: 1000,
                truncate_fetches: self.truncate_fetches,
                versions: self.versions,
                topic_ids: self.topic_ids,
                without: self.without,
                features: self.features,
                consumer_timeouts: self.consumer_timeouts,
                ..State::default()
            }),
            tick,
        });
        let mut cluster = MockCluster {
            shared,
            tasks: Arc::new(Mutex::new(HashMap::new())),
            reaper: None,
        };
        for id in 1..=self.brokers {
            let listener = TcpListener::bind("127.0.0.1:0")
                .await
                .map_err(|e| Error::io("mock broker bind", e))?;
            let addr = listener
                .local_addr()
                .map_err(|e| Error::io("mock broker address", e))?;
            cluster
                .shared
                .lock()
                .brokers
                .push(Broker { id, addr, up: true });
            cluster.listen(id, listener);
        }
        {
            let mut st = cluster.shared.lock();
            for (name, partitions) in &self.topics {
                st.create_topic(name, *partitions);
            }
        }
        cluster.reaper = Some(tokio::spawn(group::reaper(cluster.shared.clone())));
        Ok(cluster)
    }
}

/// An in-process Kafka cluster of N brokers on loopback ports, with in-memory logs and
/// fault hooks. Dropping it stops every broker and closes every connection.
///
/// See the [module documentation](self) for what it serves.
///
/// ```
/// use futures::SinkExt;
/// use kafkapipe::mock::{Fault, MockCluster};
/// use kafkapipe::protocol::{ApiKey, ErrorCode};
/// use kafkapipe::writer::{Message, Writer, WriterConfig};
///
/// # fn main() -> kafkapipe::Result<()> {
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| kafkapipe::Error::io("runtime", e))?.block_on(async {
/// let cluster = MockCluster::builder().topic("t", 1).start().await?;
/// // The first two produces are refused with a retriable error; the writer retries.
/// cluster.fault(ApiKey::PRODUCE, Fault::Error(ErrorCode::NotLeaderOrFollower), 2);
/// let mut writer = Writer::new(WriterConfig::new(cluster.bootstrap()).topic("t"))?;
/// writer.send(Message::new("v")).await?;
/// writer.close().await?;
/// assert_eq!(cluster.high_watermark("t", 0), Some(1));
/// assert_eq!(cluster.requests(ApiKey::PRODUCE), 3);
/// # Ok(()) })
/// # }
/// ```
#[derive(Debug)]
pub struct MockCluster {
    shared: Arc<Shared>,
    /// Per broker: its accept task and connection tasks.
    tasks: Arc<Mutex<HashMap<i32, Vec<JoinHandle<()>>>>>,
    reaper: Option<JoinHandle<()>>,
}

impl Drop for MockCluster {
    fn drop(&mut self) {
        let mut tasks = self.tasks.lock().unwrap_or_else(|e| e.into_inner());
        for t in tasks.values_mut().flat_map(|v| v.drain(..)) {
            t.abort();
        }
        if let Some(r) = self.reaper.take() {
            r.abort();
        }
    }
}

impl MockCluster {
    /// A builder: one broker and no topics unless told otherwise.
    ///
    /// ```
    /// use kafkapipe::mock::MockCluster;
    ///
    /// # fn main() -> kafkapipe::Result<()> {
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| kafkapipe::Error::io("runtime", e))?.block_on(async {
    /// let cluster = MockCluster::builder().start().await?;
    /// assert_eq!(cluster.bootstrap().len(), 1, "one broker unless told otherwise");
    /// assert_eq!(cluster.partitions("t"), None, "and no topics");
    /// # Ok(()) })
    /// # }
    /// ```
    pub fn builder() -> MockClusterBuilder {
        MockClusterBuilder {
            brokers: 1,
            topics: Vec::new(),
            truncate_fetches: false,
            versions: HashMap::new(),
            topic_ids: true,
            without: Vec::new(),
            features: Vec::new(),
            consumer_timeouts: (Duration::from_secs(5), Duration::from_secs(45)),
        }
    }

    fn listen(&self, id: i32, listener: TcpListener) {
        let shared = self.shared.clone();
        let tasks = self.tasks.clone();
        let conns = tasks.clone();
        let accept = tokio::spawn(async move {
            while let Ok((sock, _)) = listener.accept().await {
                let _ = sock.set_nodelay(true);
                let t = tokio::spawn(serve(id, sock, shared.clone()));
                let mut all = conns.lock().unwrap_or_else(|e| e.into_inner());
                let mine = all.entry(id).or_default();
                mine.retain(|t| !t.is_finished());
                mine.push(t);
            }
        });
        tasks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(id)
            .or_default()
            .push(accept);
    }

    /// The brokers' addresses (`127.0.0.1:port`), live or not, in id order.
    ///
    /// ```
    /// use kafkapipe::reader::ReaderConfig;
    /// use kafkapipe::mock::MockCluster;
    ///
    /// # fn main() -> kafkapipe::Result<()> {
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| kafkapipe::Error::io("runtime", e))?.block_on(async {
    /// let cluster = MockCluster::builder().brokers(2).start().await?;
    /// let config = ReaderConfig::new(cluster.bootstrap());
    /// # let _ = config;
    /// assert_eq!(cluster.bootstrap().len(), 2);
    /// # Ok(()) })
    /// # }
    /// ```
    pub fn bootstrap(&self) -> Vec<String> {
        self.shared
            .lock()
            .brokers
            .iter()
            .map(|b| b.addr.to_string())
            .collect()
    }

    /// The address of broker `id`.
    ///
    /// ```
    /// use kafkapipe::mock::MockCluster;
    ///
    /// # fn main() -> kafkapipe::Result<()> {
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| kafkapipe::Error::io("runtime", e))?.block_on(async {
    /// let cluster = MockCluster::builder().brokers(2).start().await?;
    /// assert_eq!(cluster.broker_addr(2).as_deref(), cluster.bootstrap().get(1).map(String::as_str));
    /// assert_eq!(cluster.broker_addr(3), None);
    /// # Ok(()) })
    /// # }
    /// ```
    pub fn broker_addr(&self, id: i32) -> Option<String> {
        self.shared
            .lock()
            .brokers
            .iter()
            .find(|b| b.id == id)
            .map(|b| b.addr.to_string())
    }

    /// Create a topic (as CreateTopics would). Returns `false` if it exists.
    ///
    /// ```
    /// use kafkapipe::mock::MockCluster;
    ///
    /// # fn main() -> kafkapipe::Result<()> {
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| kafkapipe::Error::io("runtime", e))?.block_on(async {
    /// let cluster = MockCluster::builder().start().await?;
    /// assert!(cluster.create_topic("t", 2));
    /// assert!(!cluster.create_topic("t", 2), "exists");
    /// assert_eq!(cluster.partitions("t"), Some(2));
    /// # Ok(()) })
    /// # }
    /// ```
    pub fn create_topic(&self, name: &str, partitions: i32) -> bool {
        let mut st = self.shared.lock();
        if st.topics.contains_key(name) {
            return false;
        }
        st.create_topic(name, partitions);
        true
    }

    /// The id of `topic` (as Metadata reports it when topic ids are on).
    ///
    /// ```
    /// use kafkapipe::conn::Conn;
    /// use kafkapipe::mock::MockCluster;
    ///
    /// # fn main() -> kafkapipe::Result<()> {
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| kafkapipe::Error::io("runtime", e))?.block_on(async {
    /// let cluster = MockCluster::builder().topic("t", 1).start().await?;
    /// let conn = Conn::connect(&cluster.bootstrap()[0]).await?;
    /// let metadata = conn.metadata(Some(&["t"])).await?;
    /// assert_eq!(metadata.topic("t").map(|t| t.id), cluster.topic_id("t"));
    /// # Ok(()) })
    /// # }
    /// ```
    pub fn topic_id(&self, topic: &str) -> Option<[u8; 16]> {
        self.shared.lock().topics.get(topic).map(|t| t.id)
    }

    /// The number of partitions of `topic`, if it exists.
    ///
    /// ```
    /// use kafkapipe::mock::MockCluster;
    ///
    /// # fn main() -> kafkapipe::Result<()> {
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| kafkapipe::Error::io("runtime", e))?.block_on(async {
    /// let cluster = MockCluster::builder().topic("t", 3).start().await?;
    /// assert_eq!(cluster.partitions("t"), Some(3));
    /// assert_eq!(cluster.partitions("missing"), None);
    /// # Ok(()) })
    /// # }
    /// ```
    pub fn partitions(&self, topic: &str) -> Option<i32> {
        let st = self.shared.lock();
        let t = st.topics.get(topic)?;
        i32::try_from(t.partitions.len()).ok()
    }

    /// The leader of a partition (`-1` while no broker is up).
    ///
    /// ```
    /// use kafkapipe::mock::MockCluster;
    ///
    /// # fn main() -> kafkapipe::Result<()> {
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| kafkapipe::Error::io("runtime", e))?.block_on(async {
    /// let cluster = MockCluster::builder().brokers(2).topic("t", 2).start().await?;
    /// assert_eq!(cluster.leader("t", 1), Some(2));
    /// cluster.remove_leader("t", 1);
    /// assert_eq!(cluster.leader("t", 1), Some(-1));
    /// # Ok(()) })
    /// # }
    /// ```
    pub fn leader(&self, topic: &str, partition: i32) -> Option<i32> {
        self.shared
            .lock()
            .partition(topic, partition)
            .map(|p| p.leader)
    }

    /// The high-water mark (next offset) of a partition.
    ///
    /// ```
    /// use kafkapipe::conn::{Conn, ProduceOptions};
    /// use kafkapipe::mock::MockCluster;
    /// use kafkapipe::record::Record;
    ///
    /// # fn main() -> kafkapipe::Result<()> {
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| kafkapipe::Error::io("runtime", e))?.block_on(async {
    /// let cluster = MockCluster::builder().topic("t", 1).start().await?;
    /// let conn = Conn::connect(&cluster.bootstrap()[0]).await?;
    /// conn.produce("t", 0, &[Record::new("k", "a"), Record::new("k", "b")], &ProduceOptions::default()).await?;
    /// assert_eq!(cluster.high_watermark("t", 0), Some(2));
    /// # Ok(()) })
    /// # }
    /// ```
    pub fn high_watermark(&self, topic: &str, partition: i32) -> Option<i64> {
        self.shared
            .lock()
            .partition(topic, partition)
            .map(PartitionLog::high_watermark)
    }

    /// Append `records` to a partition as one batch, as a Produce would (records with a
    /// negative timestamp get the current time). Returns the first record's offset.
    ///
    /// ```
    /// use kafkapipe::mock::MockCluster;
    /// use kafkapipe::reader::{Reader, ReaderConfig};
    /// use kafkapipe::record::Record;
    ///
    /// # fn main() -> kafkapipe::Result<()> {
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| kafkapipe::Error::io("runtime", e))?.block_on(async {
    /// let cluster = MockCluster::builder().topic("t", 1).start().await?;
    /// assert_eq!(cluster.produce("t", 0, &[Record::new("k", "seeded")])?, 0);
    /// let mut reader = Reader::new(ReaderConfig::new(cluster.bootstrap()).partition("t", 0)).await?;
    /// assert_eq!(reader.next_message().await?.value.as_deref(), Some(&b"seeded"[..]));
    /// reader.close().await;
    /// # Ok(()) })
    /// # }
    /// ```
    pub fn produce(&self, topic: &str, partition: i32, records: &[Record]) -> Result<i64> {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
        let mut b = RecordBatchBuilder::new(Compression::None);
        for r in records {
            let ts = if r.timestamp < 0 { now } else { r.timestamp };
            b.append(ts, r.key.as_deref(), r.value.as_deref(), &r.headers)?;
        }
        let batch = b.build()?;
        let offset = {
            let mut st = self.shared.lock();
            let max = st.max_message_bytes;
            let log = st.partition_mut(topic, partition).ok_or_else(|| {
                Error::new(
                    ErrorKind::Config,
                    format!("mock cluster has no partition {topic}/{partition}"),
                )
            })?;
            log.append(&batch, max)
                .map_err(|e| Error::kafka(e).with_topic(topic).with_partition(partition))?
        };
        self.shared.changed();
        Ok(offset)
    }

    /// The records of a partition's log (control records left out), decoded, in offset
    /// order; batches that do not decode are skipped.
    ///
    /// ```
    /// use futures::SinkExt;
    /// use kafkapipe::mock::MockCluster;
    /// use kafkapipe::writer::{Message, Writer, WriterConfig};
    ///
    /// # fn main() -> kafkapipe::Result<()> {
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| kafkapipe::Error::io("runtime", e))?.block_on(async {
    /// let cluster = MockCluster::builder().topic("t", 1).start().await?;
    /// let mut writer = Writer::new(WriterConfig::new(cluster.bootstrap()).topic("t"))?;
    /// writer.send(Message::keyed("k", "v").with_header("h", "1")).await?;
    /// writer.close().await?;
    /// let records = cluster.records("t", 0);
    /// assert_eq!(records[0].key.as_deref(), Some(&b"k"[..]));
    /// assert_eq!(records[0].headers[0].key, "h");
    /// # Ok(()) })
    /// # }
    /// ```
    pub fn records(&self, topic: &str, partition: i32) -> Vec<Record> {
        self.batches(topic, partition)
            .into_iter()
            .filter_map(|b| decode_batches(b, log::MAX_DECOMPRESSED).ok())
            .flat_map(|d| d.batches)
            .filter(|b| !b.is_control)
            .flat_map(|b| b.records)
            .collect()
    }

    /// The raw record batches of a partition's log, base offsets as assigned.
    ///
    /// ```
    /// use kafkapipe::conn::{Conn, ProduceOptions};
    /// use kafkapipe::mock::MockCluster;
    /// use kafkapipe::record::{decode_batches, Record};
    ///
    /// # fn main() -> kafkapipe::Result<()> {
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| kafkapipe::Error::io("runtime", e))?.block_on(async {
    /// let cluster = MockCluster::builder().topic("t", 1).start().await?;
    /// let conn = Conn::connect(&cluster.bootstrap()[0]).await?;
    /// conn.produce("t", 0, &[Record::new("k", "a")], &ProduceOptions::default()).await?;
    /// let batches = cluster.batches("t", 0);
    /// let decoded = decode_batches(batches[0].clone(), 1 << 20)?;
    /// assert_eq!(decoded.batches[0].records[0].value.as_deref(), Some(&b"a"[..]));
    /// # Ok(()) })
    /// # }
    /// ```
    pub fn batches(&self, topic: &str, partition: i32) -> Vec<Bytes> {
        self.shared
            .lock()
            .partition(topic, partition)
            .map(PartitionLog::raw_batches)
            .unwrap_or_default()
    }

    /// The offset `group` committed for a partition.
    ///
    /// ```
    /// use kafkapipe::admin::{Admin, TopicPartition};
    /// use kafkapipe::mock::MockCluster;
    ///
    /// # fn main() -> kafkapipe::Result<()> {
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| kafkapipe::Error::io("runtime", e))?.block_on(async {
    /// let cluster = MockCluster::builder().topic("t", 1).start().await?;
    /// let admin = Admin::connect(cluster.bootstrap())?;
    /// admin.commit_group_offsets("g", &[(TopicPartition::new("t", 0), 5)]).await?;
    /// assert_eq!(cluster.committed("g", "t", 0), Some(5));
    /// # Ok(()) })
    /// # }
    /// ```
    pub fn committed(&self, group: &str, topic: &str, partition: i32) -> Option<i64> {
        self.shared
            .lock()
            .groups
            .get(group)?
            .committed(topic, partition)
    }

    /// The member ids of `group` in its current generation.
    ///
    /// ```
    /// use std::time::Duration;
    /// use kafkapipe::mock::MockCluster;
    /// use kafkapipe::reader::{Reader, ReaderConfig};
    ///
    /// # fn main() -> kafkapipe::Result<()> {
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| kafkapipe::Error::io("runtime", e))?.block_on(async {
    /// let cluster = MockCluster::builder().topic("t", 1).start().await?;
    /// let mut reader = Reader::new(ReaderConfig::new(cluster.bootstrap()).topic("t").group_id("g")).await?;
    /// while cluster.members("g").is_empty() {
    ///     tokio::time::sleep(Duration::from_millis(10)).await;
    /// }
    /// reader.close().await;
    /// assert!(cluster.members("g").is_empty(), "it left the group");
    /// # Ok(()) })
    /// # }
    /// ```
    pub fn members(&self, group: &str) -> Vec<String> {
        self.shared
            .lock()
            .groups
            .get(group)
            .map(Group::member_ids)
            .unwrap_or_default()
    }

    /// The member epoch of KIP-848 member `member_id` of `group`, while it is in the
    /// group (`None` once it left or was fenced).
    ///
    /// ```
    /// use std::time::Duration;
    /// use kafkapipe::group::GroupProtocol;
    /// use kafkapipe::mock::MockCluster;
    /// use kafkapipe::reader::{Reader, ReaderConfig};
    ///
    /// # fn main() -> kafkapipe::Result<()> {
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| kafkapipe::Error::io("runtime", e))?.block_on(async {
    /// let cluster = MockCluster::builder().topic("t", 1).start().await?;
    /// let config = ReaderConfig::new(cluster.bootstrap())
    ///     .topic("t")
    ///     .group_id("g")
    ///     .group_protocol(GroupProtocol::Consumer);
    /// let mut reader = Reader::new(config).await?;
    /// let member = loop {
    ///     if let Some(m) = cluster.members("g").pop() {
    ///         break m;
    ///     }
    ///     tokio::time::sleep(Duration::from_millis(10)).await;
    /// };
    /// assert!(cluster.member_epoch("g", &member).is_some());
    /// reader.close().await;
    /// assert_eq!(cluster.member_epoch("g", &member), None, "it left the group");
    /// # Ok(()) })
    /// # }
    /// ```
    pub fn member_epoch(&self, group: &str, member_id: &str) -> Option<i32> {
        self.shared
            .lock()
            .groups
            .get(group)?
            .consumers
            .epoch(member_id)
    }

    /// How many requests of `api` the brokers received (faulted ones included).
    ///
    /// ```
    /// use kafkapipe::conn::Conn;
    /// use kafkapipe::mock::MockCluster;
    /// use kafkapipe::protocol::ApiKey;
    ///
    /// # fn main() -> kafkapipe::Result<()> {
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| kafkapipe::Error::io("runtime", e))?.block_on(async {
    /// let cluster = MockCluster::builder().topic("t", 1).start().await?;
    /// let conn = Conn::connect(&cluster.bootstrap()[0]).await?;
    /// conn.first_offset("t", 0).await?;
    /// assert_eq!(cluster.requests(ApiKey::API_VERSIONS), 1);
    /// assert_eq!(cluster.requests(ApiKey::LIST_OFFSETS), 1);
    /// # Ok(()) })
    /// # }
    /// ```
    pub fn requests(&self, api: ApiKey) -> u64 {
        self.shared
            .lock()
            .requests
            .iter()
            .filter(|((_, a), _)| *a == api)
            .map(|(_, n)| n)
            .sum()
    }

    /// How many requests of `api` broker `id` received.
    ///
    /// ```
    /// use kafkapipe::conn::Conn;
    /// use kafkapipe::mock::MockCluster;
    /// use kafkapipe::protocol::ApiKey;
    ///
    /// # fn main() -> kafkapipe::Result<()> {
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| kafkapipe::Error::io("runtime", e))?.block_on(async {
    /// let cluster = MockCluster::builder().brokers(2).start().await?;
    /// let _conn = Conn::connect(&cluster.bootstrap()[1]).await?;
    /// assert_eq!(cluster.requests_to(1, ApiKey::API_VERSIONS), 0);
    /// assert_eq!(cluster.requests_to(2, ApiKey::API_VERSIONS), 1);
    /// # Ok(()) })
    /// # }
    /// ```
    pub fn requests_to(&self, id: i32, api: ApiKey) -> u64 {
        self.shared
            .lock()
            .requests
            .get(&(id, api))
            .copied()
            .unwrap_or(0)
    }

    /// Apply `fault` to the next `times` requests of `api` on any broker (`u32::MAX`:
    /// every request until [`clear_faults`](Self::clear_faults)). Faults are matched in
    /// the order they were added.
    pub fn fault(&self, api: ApiKey, fault: Fault, times: u32) {
        self.add_fault(None, api, fault, times);
    }

    /// Like [`fault`](Self::fault), for requests to broker `id` only.
    ///
    /// ```
    /// use kafkapipe::conn::Conn;
    /// use kafkapipe::mock::{Fault, MockCluster};
    /// use kafkapipe::protocol::{ApiKey, ErrorCode};
    ///
    /// # fn main() -> kafkapipe::Result<()> {
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| kafkapipe::Error::io("runtime", e))?.block_on(async {
    /// let cluster = MockCluster::builder().brokers(2).topic("t", 2).start().await?;
    /// // Only broker 2 (the leader of partition 1) refuses.
    /// cluster.fault_on(2, ApiKey::LIST_OFFSETS, Fault::Error(ErrorCode::LeaderNotAvailable), 1);
    /// let one = Conn::connect(&cluster.bootstrap()[0]).await?;
    /// let two = Conn::connect(&cluster.bootstrap()[1]).await?;
    /// assert_eq!(one.last_offset("t", 0).await?, 0);
    /// assert!(two.last_offset("t", 1).await.is_err());
    /// assert_eq!(two.last_offset("t", 1).await?, 0);
    /// # Ok(()) })
    /// # }
    /// ```
    pub fn fault_on(&self, id: i32, api: ApiKey, fault: Fault, times: u32) {
        self.add_fault(Some(id), api, fault, times);
    }

    fn add_fault(&self, broker: Option<i32>, api: ApiKey, fault: Fault, times: u32) {
        if times == 0 {
            return;
        }
        self.shared.lock().faults.push(FaultRule {
            api,
            broker,
            fault,
            remaining: times,
        });
    }

    /// Answer `code` for one partition in the next `times` requests of `api` that carry
    /// it (`u32::MAX`: until [`clear_faults`](Self::clear_faults)); the request's other
    /// partitions are served normally. For Produce, Fetch, ListOffsets and OffsetFetch.
    ///
    /// ```
    /// use kafkapipe::conn::{Conn, ProduceOptions};
    /// use kafkapipe::mock::MockCluster;
    /// use kafkapipe::protocol::{ApiKey, ErrorCode};
    /// use kafkapipe::record::Record;
    ///
    /// # fn main() -> kafkapipe::Result<()> {
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| kafkapipe::Error::io("runtime", e))?.block_on(async {
    /// let cluster = MockCluster::builder().topic("t", 2).start().await?;
    /// cluster.fault_partition(ApiKey::PRODUCE, "t", 1, ErrorCode::KafkaStorageError, 1);
    /// let conn = Conn::connect(&cluster.bootstrap()[0]).await?;
    /// let records = [Record::new("k", "v")];
    /// let opts = ProduceOptions::default();
    /// assert_eq!(conn.produce("t", 0, &records, &opts).await?, 0);
    /// let err = conn.produce("t", 1, &records, &opts).await.unwrap_err();
    /// assert_eq!(err.kafka_code(), Some(ErrorCode::KafkaStorageError));
    /// assert_eq!(conn.produce("t", 1, &records, &opts).await?, 0);
    /// # Ok(()) })
    /// # }
    /// ```
    pub fn fault_partition(
        &self,
        api: ApiKey,
        topic: &str,
        partition: i32,
        code: ErrorCode,
        times: u32,
    ) {
        if times == 0 {
            return;
        }
        self.shared.lock().partition_faults.push(PartitionFault {
            api,
            topic: topic.to_string(),
            partition,
            code: Some(code),
            remaining: times,
        });
    }

    /// Make broker `id` the coordinator of `group` (`None`: back to the default, a live
    /// broker chosen by a hash of the id). While a pinned coordinator is down the group
    /// has none (`COORDINATOR_NOT_AVAILABLE`). The group's state (members, generation,
    /// offsets) moves with it; the old coordinator answers `NOT_COORDINATOR`.
    ///
    /// ```
    /// use kafkapipe::admin::Admin;
    /// use kafkapipe::mock::MockCluster;
    ///
    /// # fn main() -> kafkapipe::Result<()> {
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| kafkapipe::Error::io("runtime", e))?.block_on(async {
    /// let cluster = MockCluster::builder().brokers(3).start().await?;
    /// cluster.set_coordinator("g", Some(3));
    /// let admin = Admin::connect(cluster.bootstrap())?;
    /// assert_eq!(admin.find_coordinator("g").await?, 3);
    /// # Ok(()) })
    /// # }
    /// ```
    pub fn set_coordinator(&self, group: &str, id: Option<i32>) {
        {
            let mut st = self.shared.lock();
            match id {
                Some(id) => st.pinned_coordinators.insert(group.to_string(), id),
                None => st.pinned_coordinators.remove(group),
            };
        }
        self.shared.changed();
    }

    /// The coordinator of `group` now, if a broker is up to be it.
    ///
    /// ```
    /// use kafkapipe::mock::MockCluster;
    ///
    /// # fn main() -> kafkapipe::Result<()> {
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| kafkapipe::Error::io("runtime", e))?.block_on(async {
    /// let cluster = MockCluster::builder().brokers(2).start().await?;
    /// cluster.set_coordinator("g", Some(2));
    /// assert_eq!(cluster.coordinator("g"), Some(2));
    /// cluster.kill(2);
    /// assert_eq!(cluster.coordinator("g"), None, "pinned to a broker that is down");
    /// # Ok(()) })
    /// # }
    /// ```
    pub fn coordinator(&self, group: &str) -> Option<i32> {
        self.shared.lock().coordinator(group).map(|b| b.id)
    }

    /// Answer `code` for `group` in the next `times` DescribeGroups or DeleteGroups
    /// requests (per `api`) that name it; the request's other groups are served normally.
    ///
    /// ```
    /// use kafkapipe::admin::Admin;
    /// use kafkapipe::mock::MockCluster;
    /// use kafkapipe::protocol::{ApiKey, ErrorCode};
    ///
    /// # fn main() -> kafkapipe::Result<()> {
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| kafkapipe::Error::io("runtime", e))?.block_on(async {
    /// let cluster = MockCluster::builder().start().await?;
    /// cluster.fault_group(ApiKey::DESCRIBE_GROUPS, "secret", ErrorCode::GroupAuthorizationFailed, 1);
    /// let admin = Admin::connect(cluster.bootstrap())?;
    /// let r = admin.describe_groups(&["open", "secret"]).await?;
    /// assert!(r[0].1.is_ok());
    /// assert_eq!(r[1].1.as_ref().err().and_then(|e| e.kafka_code()), Some(ErrorCode::GroupAuthorizationFailed));
    /// # Ok(()) })
    /// # }
    /// ```
    pub fn fault_group(&self, api: ApiKey, group: &str, code: ErrorCode, times: u32) {
        self.fault_partition(api, group, GROUP_PARTITION, code, times);
    }

    /// Append what the next `times` Produce requests carry for a partition, but leave
    /// the partition out of their responses (a broker bug the client must survive: it
    /// cannot know whether the batch was written).
    ///
    /// ```
    /// use kafkapipe::conn::{Conn, ProduceOptions};
    /// use kafkapipe::mock::MockCluster;
    /// use kafkapipe::record::Record;
    ///
    /// # fn main() -> kafkapipe::Result<()> {
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| kafkapipe::Error::io("runtime", e))?.block_on(async {
    /// let cluster = MockCluster::builder().topic("t", 1).start().await?;
    /// cluster.omit_from_produce_response("t", 0, 1);
    /// let conn = Conn::connect(&cluster.bootstrap()[0]).await?;
    /// // Written, but the answer does not say so.
    /// assert!(conn.produce("t", 0, &[Record::new("k", "v")], &ProduceOptions::default()).await.is_err());
    /// assert_eq!(cluster.high_watermark("t", 0), Some(1));
    /// # Ok(()) })
    /// # }
    /// ```
    pub fn omit_from_produce_response(&self, topic: &str, partition: i32, times: u32) {
        if times == 0 {
            return;
        }
        self.shared.lock().partition_faults.push(PartitionFault {
            api: ApiKey::PRODUCE,
            topic: topic.to_string(),
            partition,
            code: None,
            remaining: times,
        });
    }

    /// Refuse produced batches larger than `bytes` with `MESSAGE_TOO_LARGE`, as Kafka's
    /// `max.message.bytes` does (`None`: no limit, the default).
    ///
    /// ```
    /// use kafkapipe::conn::{Conn, ProduceOptions};
    /// use kafkapipe::mock::MockCluster;
    /// use kafkapipe::protocol::ErrorCode;
    /// use kafkapipe::record::Record;
    ///
    /// # fn main() -> kafkapipe::Result<()> {
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| kafkapipe::Error::io("runtime", e))?.block_on(async {
    /// let cluster = MockCluster::builder().topic("t", 1).start().await?;
    /// cluster.set_max_message_bytes(Some(100));
    /// let conn = Conn::connect(&cluster.bootstrap()[0]).await?;
    /// let big = Record::new("k", vec![0u8; 200]);
    /// let err = conn.produce("t", 0, &[big], &ProduceOptions::default()).await.unwrap_err();
    /// assert_eq!(err.kafka_code(), Some(ErrorCode::MessageTooLarge));
    /// # Ok(()) })
    /// # }
    /// ```
    pub fn set_max_message_bytes(&self, bytes: Option<usize>) {
        self.shared.lock().max_message_bytes = bytes;
    }

    /// Remove every injected fault not used up yet (requests already hanging stay so).
    ///
    /// ```
    /// use kafkapipe::conn::Conn;
    /// use kafkapipe::mock::{Fault, MockCluster};
    /// use kafkapipe::protocol::{ApiKey, ErrorCode};
    ///
    /// # fn main() -> kafkapipe::Result<()> {
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| kafkapipe::Error::io("runtime", e))?.block_on(async {
    /// let cluster = MockCluster::builder().topic("t", 1).start().await?;
    /// cluster.fault(ApiKey::LIST_OFFSETS, Fault::Error(ErrorCode::LeaderNotAvailable), u32::MAX);
    /// let conn = Conn::connect(&cluster.bootstrap()[0]).await?;
    /// assert!(conn.last_offset("t", 0).await.is_err());
    /// cluster.clear_faults();
    /// assert_eq!(conn.last_offset("t", 0).await?, 0);
    /// # Ok(()) })
    /// # }
    /// ```
    pub fn clear_faults(&self) {
        let mut st = self.shared.lock();
        st.faults.clear();
        st.partition_faults.clear();
    }

    /// Keep the frames of every request of `api` received from now on, for
    /// [`captured`](Self::captured).
    ///
    /// ```
    /// use kafkapipe::conn::Conn;
    /// use kafkapipe::mock::MockCluster;
    /// use kafkapipe::protocol::messages::ListOffsetsRequest;
    /// use kafkapipe::protocol::ApiKey;
    ///
    /// # fn main() -> kafkapipe::Result<()> {
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| kafkapipe::Error::io("runtime", e))?.block_on(async {
    /// let cluster = MockCluster::builder().topic("t", 1).start().await?;
    /// cluster.capture(ApiKey::LIST_OFFSETS);
    /// let conn = Conn::connect(&cluster.bootstrap()[0]).await?;
    /// conn.first_offset("t", 0).await?;
    /// let asked = cluster.captured::<ListOffsetsRequest>();
    /// assert_eq!(asked[0].topics[0].partitions[0].timestamp, -2, "earliest");
    /// # Ok(()) })
    /// # }
    /// ```
    pub fn capture(&self, api: ApiKey) {
        self.shared.lock().captured.entry(api).or_default();
    }

    /// The requests of type `R` received since [`capture`](Self::capture) was called for
    /// its API, decoded, in arrival order (frames that do not decode are left out).
    ///
    /// ```
    /// use kafkapipe::conn::Conn;
    /// use kafkapipe::mock::MockCluster;
    /// use kafkapipe::protocol::messages::MetadataRequest;
    /// use kafkapipe::protocol::ApiKey;
    ///
    /// # fn main() -> kafkapipe::Result<()> {
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| kafkapipe::Error::io("runtime", e))?.block_on(async {
    /// let cluster = MockCluster::builder().topic("t", 1).start().await?;
    /// cluster.capture(ApiKey::METADATA);
    /// let conn = Conn::connect(&cluster.bootstrap()[0]).await?;
    /// conn.metadata(Some(&["t"])).await?;
    /// let asked = cluster.captured::<MetadataRequest>();
    /// let names: Vec<_> = asked[0].topics.iter().flatten().filter_map(|t| t.name.clone()).collect();
    /// assert_eq!(names, ["t"]);
    /// # Ok(()) })
    /// # }
    /// ```
    pub fn captured<R: Request>(&self) -> Vec<R> {
        self.captured_by_broker::<R>()
            .into_iter()
            .map(|(_, r)| r)
            .collect()
    }

    /// Like [`captured`](Self::captured), with the id of the broker each request went to.
    ///
    /// ```
    /// use kafkapipe::conn::Conn;
    /// use kafkapipe::mock::MockCluster;
    /// use kafkapipe::protocol::messages::MetadataRequest;
    /// use kafkapipe::protocol::ApiKey;
    ///
    /// # fn main() -> kafkapipe::Result<()> {
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| kafkapipe::Error::io("runtime", e))?.block_on(async {
    /// let cluster = MockCluster::builder().brokers(2).start().await?;
    /// cluster.capture(ApiKey::METADATA);
    /// let conn = Conn::connect(&cluster.bootstrap()[1]).await?;
    /// conn.metadata(None).await?;
    /// let brokers: Vec<i32> = cluster.captured_by_broker::<MetadataRequest>().iter().map(|(b, _)| *b).collect();
    /// assert_eq!(brokers, [2]);
    /// # Ok(()) })
    /// # }
    /// ```
    pub fn captured_by_broker<R: Request>(&self) -> Vec<(i32, R)> {
        self.captured_versions::<R>()
            .into_iter()
            .map(|(broker, _, r)| (broker, r))
            .collect()
    }

    /// Like [`captured`](Self::captured), with the broker each request went to and the
    /// version it was sent at.
    ///
    /// ```
    /// use kafkapipe::conn::Conn;
    /// use kafkapipe::mock::MockCluster;
    /// use kafkapipe::protocol::messages::MetadataRequest;
    /// use kafkapipe::protocol::ApiKey;
    ///
    /// # fn main() -> kafkapipe::Result<()> {
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| kafkapipe::Error::io("runtime", e))?.block_on(async {
    /// // Metadata up to v9 only: the client speaks v9.
    /// let cluster = MockCluster::builder().api_versions(ApiKey::METADATA, 4, 9).start().await?;
    /// cluster.capture(ApiKey::METADATA);
    /// let conn = Conn::connect(&cluster.bootstrap()[0]).await?;
    /// conn.metadata(None).await?;
    /// let versions: Vec<i16> = cluster.captured_versions::<MetadataRequest>().iter().map(|(_, v, _)| *v).collect();
    /// assert_eq!(versions, [9]);
    /// # Ok(()) })
    /// # }
    /// ```
    pub fn captured_versions<R: Request>(&self) -> Vec<(i32, i16, R)> {
        let frames = self
            .shared
            .lock()
            .captured
            .get(&R::API_KEY)
            .cloned()
            .unwrap_or_default();
        frames
            .into_iter()
            .filter_map(|(broker, version, frame)| {
                handlers::parse::<R>(frame, version)
                    .ok()
                    .map(|(_, r)| (broker, version, r))
            })
            .collect()
    }

    /// Append record batches to a partition as they are — only their base offsets are
    /// rewritten, nothing is checked beyond the framing — so a test can serve batches
    /// that fail their CRC or do not decode. Returns the first batch's offset, or `None`
    /// if the partition does not exist or the bytes are not framed as batches.
    ///
    /// ```
    /// use kafkapipe::compression::Compression;
    /// use kafkapipe::mock::MockCluster;
    /// use kafkapipe::reader::{Reader, ReaderConfig};
    /// use kafkapipe::record::RecordBatchBuilder;
    ///
    /// # fn main() -> kafkapipe::Result<()> {
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| kafkapipe::Error::io("runtime", e))?.block_on(async {
    /// let cluster = MockCluster::builder().topic("t", 1).start().await?;
    /// let mut b = RecordBatchBuilder::new(Compression::None);
    /// b.append(0, None, Some(b"v"), &[])?;
    /// let mut bad = b.build()?.to_vec();
    /// let last = bad.len() - 1;
    /// bad[last] ^= 0xff; // covered by the CRC
    /// assert_eq!(cluster.append_raw("t", 0, bad.into()), Some(0));
    /// let mut reader = Reader::new(ReaderConfig::new(cluster.bootstrap()).partition("t", 0)).await?;
    /// let err = reader.next_message().await.unwrap_err();
    /// assert!(err.to_string().contains("CRC"), "{err}");
    /// reader.close().await;
    /// # Ok(()) })
    /// # }
    /// ```
    pub fn append_raw(&self, topic: &str, partition: i32, batches: Bytes) -> Option<i64> {
        let offset = self
            .shared
            .lock()
            .partition_mut(topic, partition)?
            .append_raw(&batches);
        self.shared.changed();
        offset
    }

    /// Delete the records before `offset` (as DeleteRecords does): the log start moves
    /// there (at most to the high-water mark). Returns the new log start.
    ///
    /// ```
    /// use kafkapipe::conn::{Conn, ProduceOptions};
    /// use kafkapipe::mock::MockCluster;
    /// use kafkapipe::record::Record;
    ///
    /// # fn main() -> kafkapipe::Result<()> {
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| kafkapipe::Error::io("runtime", e))?.block_on(async {
    /// let cluster = MockCluster::builder().topic("t", 1).start().await?;
    /// let conn = Conn::connect(&cluster.bootstrap()[0]).await?;
    /// let records: Vec<Record> = (0..10).map(|i| Record::new("k", format!("{i}"))).collect();
    /// conn.produce("t", 0, &records, &ProduceOptions::default()).await?;
    /// assert_eq!(cluster.delete_records("t", 0, 4), Some(4));
    /// assert_eq!(conn.first_offset("t", 0).await?, 4);
    /// # Ok(()) })
    /// # }
    /// ```
    pub fn delete_records(&self, topic: &str, partition: i32, offset: i64) -> Option<i64> {
        let start = self
            .shared
            .lock()
            .partition_mut(topic, partition)?
            .delete_before(offset);
        self.shared.changed();
        Some(start)
    }

    /// Set the producer epoch the transaction coordinator holds for `transactional_id`
    /// (registering the id with a new producer id if it is unknown); the next
    /// InitProducerId answers `epoch + 1`. For epoch exhaustion: with
    /// `transaction.version` >= 2, an EndTxn v5 at epoch `i16::MAX - 1` or later answers a
    /// new producer id with epoch 0, as Kafka does. Returns the producer id.
    ///
    /// ```
    /// use kafkapipe::mock::MockCluster;
    ///
    /// # fn main() -> kafkapipe::Result<()> {
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| kafkapipe::Error::io("runtime", e))?.block_on(async {
    /// let cluster = MockCluster::builder().start().await?;
    /// let pid = cluster.set_transaction_epoch("tx-1", i16::MAX - 2);
    /// assert_eq!(cluster.set_transaction_epoch("tx-1", 0), pid);
    /// # Ok(()) })
    /// # }
    /// ```
    pub fn set_transaction_epoch(&self, transactional_id: &str, epoch: i16) -> i64 {
        let mut st = self.shared.lock();
        if !st.transactions.contains_key(transactional_id) {
            st.next_producer_id += 1;
            let producer_id = st.next_producer_id;
            let mut t = txn::Txn::default();
            t.producer_id = producer_id;
            st.transactions.insert(transactional_id.to_string(), t);
        }
        match st.transactions.get_mut(transactional_id) {
            Some(t) => {
                t.epoch = epoch;
                t.producer_id
            }
            None => -1,
        }
    }

    /// Expire the idempotent producers' state of a partition, as a broker does when a
    /// producer stays idle past `producer.id.expiration.ms` or retention deletes all its
    /// batches. The next batch of such a producer is answered `UNKNOWN_PRODUCER_ID` unless
    /// its sequence is 0 (the behaviour of brokers before Kafka 2.5, which the Java
    /// client's KIP-360 recovery handles by bumping the epoch). Returns how many producers
    /// were forgotten, or `None` for an unknown partition.
    ///
    /// ```
    /// use futures::SinkExt;
    /// use kafkapipe::mock::MockCluster;
    /// use kafkapipe::writer::{Message, Writer, WriterConfig};
    ///
    /// # fn main() -> kafkapipe::Result<()> {
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| kafkapipe::Error::io("runtime", e))?.block_on(async {
    /// let cluster = MockCluster::builder().topic("t", 1).start().await?;
    /// let mut writer = Writer::new(WriterConfig::new(cluster.bootstrap()).topic("t"))?;
    /// writer.write_messages([Message::new("a")]).await?;
    /// assert_eq!(cluster.expire_producers("t", 0), Some(1));
    /// // The writer bumps its epoch and goes on.
    /// writer.write_messages([Message::new("b")]).await?;
    /// assert_eq!(cluster.high_watermark("t", 0), Some(2));
    /// writer.close().await?;
    /// # Ok(()) })
    /// # }
    /// ```
    pub fn expire_producers(&self, topic: &str, partition: i32) -> Option<usize> {
        let n = self
            .shared
            .lock()
            .partition_mut(topic, partition)?
            .expire_producers();
        self.shared.changed();
        Some(n)
    }

    /// Forget the idempotent producers' state of a partition the way Kafka 2.5 and later
    /// do when retention or DeleteRecords removes every batch of a producer: the next
    /// batch of such a producer is taken at whatever sequence it carries (KIP-360), as
    /// is the first batch of a producer a partition never saw. (Compare
    /// [`expire_producers`](Self::expire_producers), the older brokers' answer.) Returns
    /// how many producers were forgotten, or `None` for an unknown partition.
    ///
    /// ```
    /// use kafkapipe::mock::MockCluster;
    ///
    /// # fn main() -> kafkapipe::Result<()> {
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| kafkapipe::Error::io("runtime", e))?.block_on(async {
    /// let cluster = MockCluster::builder().topic("t", 1).start().await?;
    /// assert_eq!(cluster.forget_producers("t", 0), Some(0));
    /// assert_eq!(cluster.forget_producers("t", 9), None);
    /// # Ok(()) })
    /// # }
    /// ```
    pub fn forget_producers(&self, topic: &str, partition: i32) -> Option<usize> {
        let n = self
            .shared
            .lock()
            .partition_mut(topic, partition)?
            .forget_producers();
        self.shared.changed();
        Some(n)
    }

    /// Leave a partition without a leader (as while every replica is down): Metadata
    /// reports `LEADER_NOT_AVAILABLE` for it and every broker answers
    /// `NOT_LEADER_OR_FOLLOWER` until [`move_leader`](Self::move_leader).
    ///
    /// ```
    /// use kafkapipe::conn::Conn;
    /// use kafkapipe::mock::MockCluster;
    /// use kafkapipe::protocol::ErrorCode;
    ///
    /// # fn main() -> kafkapipe::Result<()> {
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| kafkapipe::Error::io("runtime", e))?.block_on(async {
    /// let cluster = MockCluster::builder().topic("t", 1).start().await?;
    /// assert!(cluster.remove_leader("t", 0));
    /// let conn = Conn::connect(&cluster.bootstrap()[0]).await?;
    /// let err = conn.last_offset("t", 0).await.unwrap_err();
    /// assert_eq!(err.kafka_code(), Some(ErrorCode::NotLeaderOrFollower));
    /// cluster.move_leader("t", 0, 1)?;
    /// assert_eq!(conn.last_offset("t", 0).await?, 0);
    /// # Ok(()) })
    /// # }
    /// ```
    pub fn remove_leader(&self, topic: &str, partition: i32) -> bool {
        let found = match self.shared.lock().partition_mut(topic, partition) {
            Some(p) => {
                p.set_leader(-1);
                true
            }
            None => false,
        };
        self.shared.changed();
        found
    }

    /// Make broker `to` the leader of a partition (bumping its leader epoch). The old
    /// leader answers `NOT_LEADER_OR_FOLLOWER` from now on; clients find the new one in
    /// Metadata.
    ///
    /// ```
    /// use futures::SinkExt;
    /// use kafkapipe::mock::MockCluster;
    /// use kafkapipe::protocol::ApiKey;
    /// use kafkapipe::writer::{Message, Writer, WriterConfig};
    ///
    /// # fn main() -> kafkapipe::Result<()> {
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| kafkapipe::Error::io("runtime", e))?.block_on(async {
    /// let cluster = MockCluster::builder().brokers(2).topic("t", 1).start().await?;
    /// assert_eq!(cluster.leader("t", 0), Some(1));
    /// let mut writer = Writer::new(WriterConfig::new(cluster.bootstrap()).topic("t"))?;
    /// writer.send(Message::new("before")).await?;
    /// cluster.move_leader("t", 0, 2)?;
    /// writer.send(Message::new("after")).await?;
    /// writer.close().await?;
    /// assert_eq!(cluster.high_watermark("t", 0), Some(2));
    /// assert!(cluster.requests_to(2, ApiKey::PRODUCE) >= 1);
    /// # Ok(()) })
    /// # }
    /// ```
    pub fn move_leader(&self, topic: &str, partition: i32, to: i32) -> Result<()> {
        let mut st = self.shared.lock();
        if !st.brokers.iter().any(|b| b.id == to) {
            return Err(Error::new(
                ErrorKind::Config,
                format!("mock cluster has no broker {to}"),
            ));
        }
        let p = st.partition_mut(topic, partition).ok_or_else(|| {
            Error::new(
                ErrorKind::Config,
                format!("mock cluster has no partition {topic}/{partition}"),
            )
        })?;
        p.set_leader(to);
        drop(st);
        self.shared.changed();
        Ok(())
    }

    /// An unclean leader election onto a replica whose log ends at `offset`: the
    /// partition's records from `offset` on are gone (whole batches: a batch holding
    /// `offset` goes too) and its leader starts a new leader epoch at the new log end,
    /// which the records produced from now on carry. Returns the new log end and leader
    /// epoch. A consumer that had read past the new end finds out through
    /// OffsetForLeaderEpoch (KIP-320).
    ///
    /// ```
    /// use kafkapipe::mock::MockCluster;
    /// use kafkapipe::record::Record;
    ///
    /// # fn main() -> kafkapipe::Result<()> {
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| kafkapipe::Error::io("runtime", e))?.block_on(async {
    /// let cluster = MockCluster::builder().topic("t", 1).start().await?;
    /// cluster.produce("t", 0, &[Record::new("k", "a"), Record::new("k", "b")])?;
    /// cluster.produce("t", 0, &[Record::new("k", "c")])?;
    /// assert_eq!(cluster.truncate("t", 0, 2)?, (2, 1));
    /// assert_eq!(cluster.high_watermark("t", 0), Some(2));
    /// # Ok(()) })
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// `Config` if the partition does not exist.
    pub fn truncate(&self, topic: &str, partition: i32, offset: i64) -> Result<(i64, i32)> {
        let mut st = self.shared.lock();
        let p = st.partition_mut(topic, partition).ok_or_else(|| {
            Error::new(
                ErrorKind::Config,
                format!("mock cluster has no partition {topic}/{partition}"),
            )
        })?;
        let end = p.truncate(offset);
        let leader = p.leader;
        p.set_leader(leader);
        let epoch = p.leader_epoch;
        drop(st);
        self.shared.changed();
        Ok((end, epoch))
    }

    /// Stop broker `id` as a crash would: it stops accepting, every connection to it is
    /// closed and requests in progress are never answered. The partitions it led move to
    /// live brokers; groups it coordinated move with the coordinator.
    ///
    /// ```
    /// use kafkapipe::conn::Conn;
    /// use kafkapipe::mock::MockCluster;
    ///
    /// # fn main() -> kafkapipe::Result<()> {
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| kafkapipe::Error::io("runtime", e))?.block_on(async {
    /// let cluster = MockCluster::builder().brokers(2).topic("t", 2).start().await?;
    /// let addr = cluster.broker_addr(1).unwrap_or_default();
    /// cluster.kill(1);
    /// assert!(Conn::connect(&addr).await.is_err());
    /// assert_eq!(cluster.leader("t", 0), Some(2), "moved to the live broker");
    /// cluster.restart(1).await?;
    /// assert!(Conn::connect(&addr).await.is_ok());
    /// # Ok(()) })
    /// # }
    /// ```
    pub fn kill(&self, id: i32) {
        let tasks = self
            .tasks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&id)
            .unwrap_or_default();
        for t in tasks {
            t.abort();
        }
        let mut st = self.shared.lock();
        let mut moved = 0;
        if let Some(b) = st.brokers.iter_mut().find(|b| b.id == id) {
            b.up = false;
        }
        let live: Vec<i32> = st.live_brokers().map(|b| b.id).collect();
        for topic in st.topics.values_mut() {
            for p in &mut topic.partitions {
                if p.leader == id {
                    let to = if live.is_empty() {
                        -1
                    } else {
                        live[moved % live.len()]
                    };
                    moved += 1;
                    p.set_leader(to);
                }
            }
        }
        drop(st);
        self.shared.changed();
    }

    /// Start broker `id` again on its old port after [`kill`](Self::kill). Partitions
    /// without a leader (every broker was down) are led by it.
    ///
    /// # Cancellation safety
    ///
    /// Binding is the only await; dropping the future before it completes leaves the
    /// broker down.
    ///
    /// ```
    /// use kafkapipe::conn::Conn;
    /// use kafkapipe::mock::MockCluster;
    ///
    /// # fn main() -> kafkapipe::Result<()> {
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| kafkapipe::Error::io("runtime", e))?.block_on(async {
    /// let cluster = MockCluster::builder().start().await?;
    /// let addr = cluster.bootstrap()[0].clone();
    /// cluster.kill(1);
    /// assert!(Conn::connect(&addr).await.is_err());
    /// cluster.restart(1).await?;
    /// assert!(Conn::connect(&addr).await.is_ok());
    /// # Ok(()) })
    /// # }
    /// ```
    pub async fn restart(&self, id: i32) -> Result<()> {
        let addr = self
            .shared
            .lock()
            .brokers
            .iter()
            .find(|b| b.id == id)
            .map(|b| (b.addr, b.up));
        let Some((addr, up)) = addr else {
            return Err(Error::new(
                ErrorKind::Config,
                format!("mock cluster has no broker {id}"),
            ));
        };
        if up {
            return Ok(());
        }
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|e| Error::io(format!("mock broker {id} rebind {addr}"), e))?;
        self.listen(id, listener);
        let mut st = self.shared.lock();
        if let Some(b) = st.brokers.iter_mut().find(|b| b.id == id) {
            b.up = true;
        }
        for topic in st.topics.values_mut() {
            for p in &mut topic.partitions {
                if p.leader < 0 {
                    p.set_leader(id);
                }
            }
        }
        drop(st);
        self.shared.changed();
        Ok(())
    }
}

/// One connection: read a request, apply the faults, answer; one request at a time, as
/// Kafka does per connection. Any frame that cannot be read or decoded closes it.
async fn serve(id: i32, mut sock: TcpStream, shared: Arc<Shared>) {
    loop {
        let Ok(len) = sock.read_i32().await else {
            return;
        };
        let Ok(len) = usize::try_from(len) else {
            return;
        };
        if len > MAX_FRAME {
            return;
        }
        let mut frame = vec![0u8; len];
        if sock.read_exact(&mut frame).await.is_err() {
            return;
        }
        let frame = Bytes::from(frame);
        let Ok((api, _, _)) = RequestHeader::peek(&frame) else {
            return;
        };
        let fault = {
            let mut st = shared.lock();
            *st.requests.entry((id, api)).or_default() += 1;
            if let Some(frames) = st.captured.get_mut(&api) {
                if let Ok((_, version, _)) = RequestHeader::peek(&frame) {
                    frames.push((id, version, frame.clone()));
                }
            }
            st.take_fault(id, api)
        };
        let mut forced = None;
        let mut message = None;
        match &fault {
            Some(Fault::Hang) => std::future::pending::<()>().await,
            Some(Fault::CloseOnRequest) => return,
            Some(Fault::Delay(d)) => tokio::time::sleep(*d).await,
            Some(Fault::Hold(gate)) => gate.pass().await,
            Some(Fault::Error(code)) => forced = Some(*code),
            Some(Fault::ErrorWithMessage(code, m)) => {
                forced = Some(*code);
                message = Some(m.clone());
            }
            _ => {}
        }
        let out = match handlers::handle(id, &shared, frame, forced, message).await {
            Ok(Some(out)) => out,
            // acks=0: nothing to answer
            Ok(None) => continue,
            Err(e) => {
                tracing::debug!(broker = id, "mock broker closes the connection: {e}");
                return;
            }
        };
        let mut out = out;
        match &fault {
            Some(Fault::GarbageBody) => {
                for b in out.iter_mut().skip(4) {
                    *b = 0xff;
                }
            }
            Some(Fault::Truncate(n)) => out.truncate(out.len().saturating_sub(*n)),
            Some(Fault::Raw(bytes)) => {
                if sock.write_all(bytes).await.is_err() {
                    return;
                }
                continue;
            }
            _ => {}
        }
        let mut msg = BytesMut::with_capacity(out.len() + 4);
        let Ok(size) = i32::try_from(out.len()) else {
            return;
        };
        msg.extend_from_slice(&size.to_be_bytes());
        msg.extend_from_slice(&out);
        match fault {
            Some(Fault::CloseMidResponse) => {
                let half = msg.len() / 2;
                let _ = sock.write_all(&msg[..half]).await;
                let _ = sock.flush().await;
                return;
            }
            Some(Fault::Corrupt) => {
                // The correlation id follows the size; flip it so it matches nothing.
                for b in msg.iter_mut().skip(4).take(4) {
                    *b ^= 0x5a;
                }
            }
            _ => {}
        }
        if sock.write_all(&msg).await.is_err() {
            return;
        }
    }
}
