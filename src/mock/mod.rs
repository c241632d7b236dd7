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
mod control;
mod faults;
mod fetch_session;
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

pub use faults::Fault;
use faults::{FaultRule, PartitionFault};
pub use gate::Gate;
use group::Group;
use log::PartitionLog;

/// The largest request frame a mock broker reads; a larger size prefix closes the
/// connection.
const MAX_FRAME: usize = 64 * 1024 * 1024;

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
    fetch_sessions: fetch_session::Sessions,
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
}

impl MockCluster {
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

    /// How many incremental fetch sessions (KIP-227) the cluster's brokers hold open: a
    /// reader opens one per broker it fetches from, and closes them when it is closed.
    ///
    /// ```
    /// use kafkapipe::mock::MockCluster;
    ///
    /// # fn main() -> kafkapipe::Result<()> {
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| kafkapipe::Error::io("runtime", e))?.block_on(async {
    /// let cluster = MockCluster::builder().start().await?;
    /// assert_eq!(cluster.fetch_sessions(), 0);
    /// # Ok(()) })
    /// # }
    /// ```
    pub fn fetch_sessions(&self) -> usize {
        self.shared.lock().fetch_sessions.open()
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
