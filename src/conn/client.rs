//! [`Conn`]: the low-level, kafka-go style API over one broker [`Connection`].
//!
//! A `Conn` talks to exactly one broker. It does not follow leaders or retry: a request
//! for a partition this broker does not lead fails with `NotLeaderOrFollower`, which is
//! retriable, and the caller (or the `Writer`/`Reader` built on top) decides what to do.
//! Use [`Conn::dial_leader`] to connect to the leader of a partition through any
//! bootstrap broker, as kafka-go's `DialLeader` does.

use crate::util::{duration_ms, now_ms};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;

use super::{Connection, ConnectionConfig};
use crate::bufpool::BufPool;
use crate::compression::Compression;
use crate::error::{Error, Result};
use crate::protocol::messages::{
    AbortedTransaction, CreatableTopic, CreatableTopicConfig, CreateTopicsRequest,
    DeleteTopicState, DeleteTopicsRequest, FetchPartition, FetchPartitionData, FetchRequest,
    FetchTopic, ListOffsetsPartition, ListOffsetsRequest, ListOffsetsTopic, MetadataRequest,
    MetadataRequestTopic, MetadataResponse, OffsetForLeaderEpochRequest, OffsetForLeaderPartition,
    OffsetForLeaderTopic, ProducePartitionData, ProduceRequest, ProduceTopicData,
};
use crate::protocol::{ErrorCode, Request};
use crate::record::{
    decode_batches_lazy, decode_batches_pooled, ControlRecord, LazyBatch, Record, RecordBatch,
    RecordBatchBuilder, MAX_BATCH_DECOMPRESSED,
};

/// How many replicas must acknowledge a produce request (Java: `acks`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RequiredAcks {
    /// Do not wait for any acknowledgement (`acks=0`); the broker sends no response and
    /// the returned offset is unknown (`-1`).
    None,
    /// Wait for the leader only (`acks=1`).
    Leader,
    /// Wait for all in-sync replicas (`acks=all`, `-1`). The default, as in the Java client
    /// since Kafka 3.0.
    #[default]
    All,
}

impl RequiredAcks {
    /// The wire value: 0, 1 or -1.
    pub fn code(self) -> i16 {
        match self {
            RequiredAcks::None => 0,
            RequiredAcks::Leader => 1,
            RequiredAcks::All => -1,
        }
    }
}

/// Options of [`Conn::produce`].
///
/// ```
/// use std::time::Duration;
/// use kafkapipe::compression::Compression;
/// use kafkapipe::conn::{ProduceOptions, RequiredAcks};
/// let opts = ProduceOptions {
///     compression: Compression::Zstd,
///     acks: RequiredAcks::Leader,
///     ..ProduceOptions::default()
/// };
/// assert_eq!(opts.timeout, Duration::from_secs(30));
/// ```
#[derive(Debug, Clone)]
pub struct ProduceOptions {
    /// Acknowledgements to wait for. Default [`RequiredAcks::All`] (Java: `acks`).
    pub acks: RequiredAcks,
    /// How long the broker may wait for replication. Default 30 s
    /// (Java: `delivery.timeout.ms` bounds it from the client side; wire field `timeout_ms`).
    pub timeout: Duration,
    /// Codec for the record batch. Default none (Java: `compression.type`).
    pub compression: Compression,
}

impl Default for ProduceOptions {
    fn default() -> Self {
        ProduceOptions {
            acks: RequiredAcks::All,
            timeout: Duration::from_secs(30),
            compression: Compression::None,
        }
    }
}

/// Which records a fetch may return (Java: `isolation.level`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IsolationLevel {
    /// Everything up to the high-water mark, including records of open and aborted
    /// transactions. The default, as in the Java client.
    #[default]
    ReadUncommitted,
    /// Only records up to the last stable offset, with records of aborted transactions
    /// removed.
    ReadCommitted,
}

impl IsolationLevel {
    pub(crate) fn code(self) -> i8 {
        match self {
            IsolationLevel::ReadUncommitted => 0,
            IsolationLevel::ReadCommitted => 1,
        }
    }
}

/// Options of [`Conn::fetch`].
#[derive(Debug, Clone)]
pub struct FetchOptions {
    /// The least data the broker should wait for. Default 1 byte (Java: `fetch.min.bytes`).
    pub min_bytes: i32,
    /// The most data the broker may return for the partition. At least one batch is
    /// always returned, even if larger (KIP-74). Default 1 MiB
    /// (Java: `max.partition.fetch.bytes`).
    pub max_bytes: i32,
    /// How long the broker may wait for `min_bytes`. Default 500 ms
    /// (Java: `fetch.max.wait.ms`).
    pub max_wait: Duration,
    /// Transaction isolation. Default read uncommitted.
    pub isolation_level: IsolationLevel,
}

impl Default for FetchOptions {
    fn default() -> Self {
        FetchOptions {
            min_bytes: 1,
            max_bytes: 1024 * 1024,
            max_wait: Duration::from_millis(500),
            isolation_level: IsolationLevel::ReadUncommitted,
        }
    }
}

/// What [`Conn::fetch`] returned for one partition.
#[derive(Debug, Clone, Default)]
pub struct Fetched {
    /// Data records at or after the requested offset, in offset order. Control records
    /// are never included; under read-committed isolation aborted records are removed.
    pub records: Vec<Record>,
    /// The offset to fetch next: one past the last record of the last complete batch
    /// (which can be past the last returned record when a batch held only control or
    /// aborted records), or the requested offset when nothing was returned.
    pub next_offset: i64,
    /// The partition's high-water mark (offset of the next record to be written).
    pub high_watermark: i64,
    /// The last stable offset (read committed reads stop here), or -1 if unknown.
    pub last_stable_offset: i64,
    /// The first offset of the partition's log, or -1 if unknown.
    pub log_start_offset: i64,
}

/// A broker as listed by [`Conn::metadata`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Broker {
    /// The broker id.
    pub id: i32,
    /// Host name or address.
    pub host: String,
    /// Port.
    pub port: i32,
    /// Rack, if configured.
    pub rack: Option<String>,
}

impl Broker {
    /// `host:port`.
    pub fn addr(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }
}

/// A partition as listed by [`Conn::metadata`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionInfo {
    /// Partition index.
    pub id: i32,
    /// Leader broker id, -1 if none.
    pub leader: i32,
    /// Leader epoch, -1 if unknown.
    pub leader_epoch: i32,
    /// Replica broker ids.
    pub replicas: Vec<i32>,
    /// In-sync replica broker ids.
    pub isr: Vec<i32>,
    /// The partition's error, if any (e.g. `LeaderNotAvailable`).
    pub error: Option<ErrorCode>,
}

/// A topic as listed by [`Conn::metadata`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicInfo {
    /// Topic name.
    pub name: String,
    /// Topic id (all zeros if the broker does not report ids).
    pub id: [u8; 16],
    /// Whether this is an internal topic.
    pub internal: bool,
    /// Partitions, sorted by id.
    pub partitions: Vec<PartitionInfo>,
    /// The topic's error, if any (e.g. `UnknownTopicOrPartition`).
    pub error: Option<ErrorCode>,
}

/// Cluster metadata as returned by [`Conn::metadata`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Metadata {
    /// The cluster id, if reported.
    pub cluster_id: Option<String>,
    /// The controller's broker id, -1 if unknown.
    pub controller_id: i32,
    /// Live brokers.
    pub brokers: Vec<Broker>,
    /// Topics.
    pub topics: Vec<TopicInfo>,
}

impl Metadata {
    /// The topic named `name`.
    pub fn topic(&self, name: &str) -> Option<&TopicInfo> {
        self.topics.iter().find(|t| t.name == name)
    }

    /// The broker with id `id`.
    pub fn broker(&self, id: i32) -> Option<&Broker> {
        self.brokers.iter().find(|b| b.id == id)
    }
}

/// A topic to create with [`Conn::create_topics`].
///
/// ```
/// use kafkapipe::conn::NewTopic;
/// let topic = NewTopic::new("events", 6).config("retention.ms", "3600000");
/// assert_eq!(topic.replication_factor, -1);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewTopic {
    /// Topic name.
    pub name: String,
    /// Number of partitions (-1: the broker default).
    pub partitions: i32,
    /// Replication factor (-1: the broker default).
    pub replication_factor: i16,
    /// Topic configs (`cleanup.policy`, `retention.ms`, …).
    pub configs: Vec<(String, String)>,
}

impl NewTopic {
    /// A topic with `partitions` partitions and the broker's default replication factor.
    pub fn new(name: impl Into<String>, partitions: i32) -> Self {
        NewTopic {
            name: name.into(),
            partitions,
            replication_factor: -1,
            configs: Vec::new(),
        }
    }

    /// Set the replication factor.
    pub fn replication_factor(mut self, replication_factor: i16) -> Self {
        self.replication_factor = replication_factor;
        self
    }

    /// Add a topic config.
    pub fn config(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.configs.push((name.into(), value.into()));
        self
    }
}

pub(crate) const EARLIEST_TIMESTAMP: i64 = -2;
pub(crate) const LATEST_TIMESTAMP: i64 = -1;
const ZERO_UUID: [u8; 16] = [0; 16];

/// A low-level connection to one broker, in the spirit of kafka-go's `Conn`.
///
/// ```no_run
/// use kafkapipe::conn::{Conn, FetchOptions, ProduceOptions};
/// use kafkapipe::record::Record;
///
/// # async fn demo() -> kafkapipe::Result<()> {
/// let conn = Conn::connect("127.0.0.1:9092").await?;
/// conn.create_topic("events", 3, 1).await?;
/// let offset = conn
///     .produce("events", 0, &[Record::new("k", "v")], &ProduceOptions::default())
///     .await?;
/// let fetched = conn.fetch("events", 0, offset, &FetchOptions::default()).await?;
/// assert_eq!(fetched.records[0].value.as_deref(), Some(&b"v"[..]));
/// # Ok(()) }
/// ```
///
/// # Cancellation safety
///
/// Every method is cancel safe in the sense of [`Connection::send`]: dropping the future
/// never leaves the connection out of sync, and the `Conn` stays usable. What is not
/// known is whether the broker acted on a request already handed to the connection: it
/// is written whole and its response read and discarded, so a dropped `produce` may or
/// may not have been written, and a dropped `create_topics` or `delete_topics` may or
/// may not have taken effect (look at the metadata to find out). Calls that make
/// several requests — `dial_leader` (Metadata, then a new connection), a `fetch` that
/// first looks up the topic's id — stop between them. A `connect` dropped midway
/// leaves nothing open: a half-made connection closes with its last handle.
#[derive(Debug)]
pub struct Conn {
    connection: Connection,
    topic_ids: Mutex<HashMap<String, [u8; 16]>>,
}

impl Conn {
    /// Connect to the broker at `addr` (`host:port`) with the default configuration.
    pub async fn connect(addr: &str) -> Result<Conn> {
        Self::connect_with(addr, ConnectionConfig::default()).await
    }

    /// Connect to the broker at `addr` with `config`: TLS and SASL as
    /// [`ConnectionConfig::tls`] and [`ConnectionConfig::sasl`] say (see
    /// [`Connection::connect`]).
    ///
    /// ```no_run
    /// use std::sync::Arc;
    /// use kafkapipe::conn::{Conn, ConnectionConfig};
    /// use kafkapipe::sasl::Scram;
    /// use kafkapipe::tls::TlsConfig;
    ///
    /// # async fn demo() -> kafkapipe::Result<()> {
    /// let config = ConnectionConfig {
    ///     tls: Some(TlsConfig::builder().ca_file("ca.pem")?.build()?),
    ///     sasl: Some(Arc::new(Scram::sha256("alice", "secret"))),
    ///     ..ConnectionConfig::default()
    /// };
    /// let conn = Conn::connect_with("broker:9093", config).await?;
    /// # Ok(()) }
    /// ```
    pub async fn connect_with(addr: &str, config: ConnectionConfig) -> Result<Conn> {
        Ok(Self::from_connection(
            Connection::connect(addr, config).await?,
        ))
    }

    /// Wrap an established [`Connection`].
    pub fn from_connection(connection: Connection) -> Conn {
        Conn {
            connection,
            topic_ids: Mutex::new(HashMap::new()),
        }
    }

    /// Connect to the leader of `topic`/`partition`, asking the broker at `bootstrap` who
    /// it is (kafka-go's `DialLeader`).
    pub async fn dial_leader(
        bootstrap: &str,
        topic: &str,
        partition: i32,
        config: ConnectionConfig,
    ) -> Result<Conn> {
        let boot = Conn::connect_with(bootstrap, config.clone()).await?;
        let md = boot.metadata(Some(&[topic])).await?;
        let t = md
            .topic(topic)
            .ok_or_else(|| Error::kafka(ErrorCode::UnknownTopicOrPartition).with_topic(topic))?;
        if let Some(code) = t.error {
            return Err(Error::kafka(code).with_topic(topic));
        }
        let p = t
            .partitions
            .iter()
            .find(|p| p.id == partition)
            .ok_or_else(|| {
                Error::kafka(ErrorCode::UnknownTopicOrPartition)
                    .with_topic(topic)
                    .with_partition(partition)
            })?;
        let leader = md.broker(p.leader).ok_or_else(|| {
            Error::kafka(ErrorCode::LeaderNotAvailable)
                .with_topic(topic)
                .with_partition(partition)
        })?;
        let addr = leader.addr();
        if addr == boot.connection.broker() {
            return Ok(boot);
        }
        boot.close().await;
        Conn::connect_with(&addr, config).await
    }

    /// The underlying connection.
    pub fn connection(&self) -> &Connection {
        &self.connection
    }

    /// Close the connection; in-flight requests fail with a closed error.
    pub async fn close(&self) {
        self.connection.close().await;
    }

    fn err(&self, code: ErrorCode, topic: &str, partition: i32) -> Error {
        Error::kafka(code)
            .with_topic(topic)
            .with_partition(partition)
            .with_broker(self.connection.broker())
    }

    /// List metadata for `topics` (`None`: all topics). Topics are not auto-created.
    pub async fn metadata(&self, topics: Option<&[&str]>) -> Result<Metadata> {
        self.metadata_with(topics, false).await
    }

    /// Like [`Conn::metadata`], asking the broker to create missing `topics` with its
    /// defaults when `allow_auto_topic_creation` is set (and the broker's
    /// `auto.create.topics.enable` allows it).
    pub async fn metadata_with(
        &self,
        topics: Option<&[&str]>,
        allow_auto_topic_creation: bool,
    ) -> Result<Metadata> {
        let req = MetadataRequest {
            topics: topics.map(|ts| {
                ts.iter()
                    .map(|t| MetadataRequestTopic {
                        name: Some((*t).to_string()),
                        ..Default::default()
                    })
                    .collect()
            }),
            allow_auto_topic_creation,
            ..Default::default()
        };
        let resp: MetadataResponse = self.connection.send(&req).await?;
        let code = ErrorCode::from(resp.error_code);
        if !code.is_ok() {
            return Err(Error::kafka(code).with_broker(self.connection.broker()));
        }
        let md = Metadata {
            cluster_id: resp.cluster_id,
            controller_id: resp.controller_id,
            brokers: resp
                .brokers
                .into_iter()
                .map(|b| Broker {
                    id: b.node_id,
                    host: b.host,
                    port: b.port,
                    rack: b.rack,
                })
                .collect(),
            topics: resp
                .topics
                .into_iter()
                .map(|t| {
                    let mut partitions: Vec<PartitionInfo> = t
                        .partitions
                        .into_iter()
                        .map(|p| PartitionInfo {
                            id: p.partition_index,
                            leader: p.leader_id,
                            leader_epoch: p.leader_epoch,
                            replicas: p.replica_nodes,
                            isr: p.isr_nodes,
                            error: ErrorCode::non_zero(p.error_code),
                        })
                        .collect();
                    partitions.sort_by_key(|p| p.id);
                    TopicInfo {
                        name: t.name.unwrap_or_default(),
                        id: t.topic_id,
                        internal: t.is_internal,
                        partitions,
                        error: ErrorCode::non_zero(t.error_code),
                    }
                })
                .collect(),
        };
        if let Ok(mut ids) = self.topic_ids.lock() {
            for t in &md.topics {
                if t.id != ZERO_UUID {
                    ids.insert(t.name.clone(), t.id);
                }
            }
        }
        Ok(md)
    }

    /// Create one topic; see [`Conn::create_topics`].
    pub async fn create_topic(
        &self,
        name: &str,
        partitions: i32,
        replication_factor: i16,
    ) -> Result<()> {
        let topic = NewTopic::new(name, partitions).replication_factor(replication_factor);
        match self.create_topics(&[topic]).await?.into_iter().next() {
            Some((_, result)) => result,
            None => Err(Error::protocol("CreateTopics gave no result").with_topic(name)),
        }
    }

    /// Create topics. Returns one result per topic, in request order; a topic that
    /// already exists gives `TopicAlreadyExists`. Send this to the controller (any broker
    /// forwards it in KRaft clusters).
    pub async fn create_topics(&self, topics: &[NewTopic]) -> Result<Vec<(String, Result<()>)>> {
        let req = CreateTopicsRequest {
            topics: topics
                .iter()
                .map(|t| CreatableTopic {
                    name: t.name.clone(),
                    num_partitions: t.partitions,
                    replication_factor: t.replication_factor,
                    configs: t
                        .configs
                        .iter()
                        .map(|(k, v)| CreatableTopicConfig {
                            name: k.clone(),
                            value: Some(v.clone()),
                            ..Default::default()
                        })
                        .collect(),
                    ..Default::default()
                })
                .collect(),
            timeout_ms: duration_ms(self.connection.config().request_timeout),
            validate_only: false,
            ..Default::default()
        };
        let resp = self.connection.send(&req).await?;
        Ok(topics
            .iter()
            .map(|t| {
                let result = match resp.topics.iter().find(|r| r.name == t.name) {
                    None => Err(Error::protocol(
                        "CreateTopics response does not mention the topic",
                    )
                    .with_topic(&t.name)),
                    Some(r) => match ErrorCode::non_zero(r.error_code) {
                        None => Ok(()),
                        Some(code) => {
                            let mut e = Error::kafka(code).with_topic(&t.name);
                            if let Some(m) = &r.error_message {
                                e = e.with_message(m.clone());
                            }
                            Err(e.with_broker(self.connection.broker()))
                        }
                    },
                };
                (t.name.clone(), result)
            })
            .collect())
    }

    /// Delete topics by name. Returns one result per topic, in request order.
    pub async fn delete_topics(&self, names: &[&str]) -> Result<Vec<(String, Result<()>)>> {
        let req = DeleteTopicsRequest {
            topics: names
                .iter()
                .map(|n| DeleteTopicState {
                    name: Some((*n).to_string()),
                    ..Default::default()
                })
                .collect(),
            topic_names: names.iter().map(|n| (*n).to_string()).collect(),
            timeout_ms: duration_ms(self.connection.config().request_timeout),
            ..Default::default()
        };
        let resp = self.connection.send(&req).await?;
        if let Ok(mut ids) = self.topic_ids.lock() {
            for n in names {
                ids.remove(*n);
            }
        }
        Ok(names
            .iter()
            .map(|n| {
                let result = match resp
                    .responses
                    .iter()
                    .find(|r| r.name.as_deref() == Some(*n))
                {
                    None => Err(Error::protocol(
                        "DeleteTopics response does not mention the topic",
                    )
                    .with_topic(*n)),
                    Some(r) => match ErrorCode::non_zero(r.error_code) {
                        None => Ok(()),
                        Some(code) => Err(Error::kafka(code)
                            .with_topic(*n)
                            .with_broker(self.connection.broker())),
                    },
                };
                ((*n).to_string(), result)
            })
            .collect())
    }

    /// Encode `records` as one RecordBatch v2 and produce it to `topic`/`partition`.
    /// Records with a negative timestamp get the current time. Returns the offset the
    /// broker assigned to the first record (`-1` with [`RequiredAcks::None`]).
    pub async fn produce(
        &self,
        topic: &str,
        partition: i32,
        records: &[Record],
        opts: &ProduceOptions,
    ) -> Result<i64> {
        if records.is_empty() {
            return Err(Error::config("produce needs at least one record"));
        }
        let now = now_ms();
        let size: usize = records
            .iter()
            .map(|r| {
                r.key.as_ref().map_or(0, Bytes::len) + r.value.as_ref().map_or(0, Bytes::len) + 16
            })
            .sum();
        let mut builder = RecordBatchBuilder::with_capacity(opts.compression, size);
        for r in records {
            let ts = if r.timestamp < 0 { now } else { r.timestamp };
            builder.append(ts, r.key.as_deref(), r.value.as_deref(), &r.headers)?;
        }
        let batch = builder.build()?;
        self.produce_batch(topic, partition, batch, opts).await
    }

    /// Produce an already encoded record batch (see [`RecordBatchBuilder`]).
    pub async fn produce_batch(
        &self,
        topic: &str,
        partition: i32,
        batch: Bytes,
        opts: &ProduceOptions,
    ) -> Result<i64> {
        let mut version = self.connection.version_for::<ProduceRequest>()?;
        let mut topic_id = ZERO_UUID;
        if version >= 13 {
            topic_id = self.topic_id(topic).await?;
            if topic_id == ZERO_UUID {
                version = self.by_name_version::<ProduceRequest>(topic, partition)?;
            }
        }
        let req = ProduceRequest {
            transactional_id: None,
            acks: opts.acks.code(),
            timeout_ms: duration_ms(opts.timeout),
            topic_data: vec![ProduceTopicData {
                name: topic.to_string(),
                topic_id,
                partition_data: vec![ProducePartitionData {
                    index: partition,
                    records: Some(batch.into()),
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        };
        if opts.acks == RequiredAcks::None {
            self.connection.send_no_response(&req, version).await?;
            return Ok(-1);
        }
        let resp = self.connection.send_version(&req, version).await?;
        let p = resp
            .responses
            .iter()
            .find(|t| t.name == topic || (topic_id != ZERO_UUID && t.topic_id == topic_id))
            .and_then(|t| t.partition_responses.iter().find(|p| p.index == partition))
            .ok_or_else(|| {
                Error::protocol("produce response does not mention the partition")
                    .with_topic(topic)
                    .with_partition(partition)
            })?;
        match ErrorCode::non_zero(p.error_code) {
            None => Ok(p.base_offset),
            Some(code) => {
                let mut e = self.err(code, topic, partition);
                if let Some(m) = &p.error_message {
                    e = e.with_message(m.clone());
                }
                Err(e)
            }
        }
    }

    /// The version of `R` (Produce or Fetch) to use when `topic`'s id is unknown, so the
    /// request must name the topic: 12, the last version with names, if the broker still
    /// accepts it. Otherwise the broker cannot know the topic: `UnknownTopicOrPartition`.
    fn by_name_version<R: Request>(&self, topic: &str, partition: i32) -> Result<i16> {
        const LAST_WITH_NAMES: i16 = 12;
        match self
            .connection
            .api_versions()
            .and_then(|v| v.range(R::API_KEY))
        {
            Some((broker_min, _)) if broker_min <= LAST_WITH_NAMES => Ok(LAST_WITH_NAMES),
            _ => Err(self
                .err(ErrorCode::UnknownTopicOrPartition, topic, partition)
                .with_message(format!(
                    "no topic id known for the topic and the broker requires {} v13+",
                    R::API_KEY
                ))),
        }
    }

    async fn topic_id(&self, topic: &str) -> Result<[u8; 16]> {
        if let Some(id) = self
            .topic_ids
            .lock()
            .ok()
            .and_then(|ids| ids.get(topic).copied())
        {
            return Ok(id);
        }
        let md = self.metadata(Some(&[topic])).await?;
        Ok(md.topic(topic).map_or(ZERO_UUID, |t| t.id))
    }

    /// Fetch records of `topic`/`partition` starting at `offset`.
    ///
    /// Batches that start before `offset` have their leading records skipped; control
    /// records are dropped; under [`IsolationLevel::ReadCommitted`] the records of aborted
    /// transactions are removed using the response's aborted-transactions list.
    /// An empty result (nothing new within `max_wait`) is not an error.
    pub async fn fetch(
        &self,
        topic: &str,
        partition: i32,
        offset: i64,
        opts: &FetchOptions,
    ) -> Result<Fetched> {
        let mut version = self.connection.version_for::<FetchRequest>()?;
        let mut topic_id = ZERO_UUID;
        if version >= 13 {
            topic_id = self.topic_id(topic).await?;
            if topic_id == ZERO_UUID {
                version = self.by_name_version::<FetchRequest>(topic, partition)?;
            }
        }
        let req = FetchRequest {
            replica_id: -1,
            max_wait_ms: duration_ms(opts.max_wait),
            min_bytes: opts.min_bytes,
            max_bytes: opts.max_bytes,
            isolation_level: opts.isolation_level.code(),
            session_id: 0,
            session_epoch: -1,
            topics: vec![FetchTopic {
                topic: topic.to_string(),
                topic_id,
                partitions: vec![FetchPartition {
                    partition,
                    current_leader_epoch: -1,
                    fetch_offset: offset,
                    last_fetched_epoch: -1,
                    log_start_offset: -1,
                    partition_max_bytes: opts.max_bytes,
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        };
        let resp = self.connection.send_version(&req, version).await?;
        if let Some(code) = ErrorCode::non_zero(resp.error_code) {
            return Err(self.err(code, topic, partition));
        }
        let Some(p) = resp
            .responses
            .into_iter()
            .find(|t| t.topic == topic || (topic_id != ZERO_UUID && t.topic_id == topic_id))
            .and_then(|t| {
                t.partitions
                    .into_iter()
                    .find(|p| p.partition_index == partition)
            })
        else {
            // Kafka always lists every partition of a sessionless fetch; tansu 0.6 leaves
            // them out when nothing arrived within max_wait. Nothing new either way.
            tracing::debug!(topic, partition, "fetch response without the partition");
            return Ok(Fetched {
                records: Vec::new(),
                next_offset: offset,
                high_watermark: -1,
                last_stable_offset: -1,
                log_start_offset: -1,
            });
        };
        decode_fetch_partition(p, offset, opts.isolation_level, opts.max_bytes).map_err(|e| {
            e.with_topic(topic)
                .with_partition(partition)
                .with_broker(self.connection.broker())
        })
    }

    /// The first offset of `topic`/`partition` (kafka-go `ReadFirstOffset`).
    pub async fn first_offset(&self, topic: &str, partition: i32) -> Result<i64> {
        self.list_offset(
            topic,
            partition,
            EARLIEST_TIMESTAMP,
            IsolationLevel::ReadUncommitted,
        )
        .await?
        .ok_or_else(|| self.err(ErrorCode::OffsetNotAvailable, topic, partition))
    }

    /// The offset the next record written to `topic`/`partition` will get — the
    /// high-water mark (kafka-go `ReadLastOffset`).
    pub async fn last_offset(&self, topic: &str, partition: i32) -> Result<i64> {
        self.last_offset_with(topic, partition, IsolationLevel::ReadUncommitted)
            .await
    }

    /// The end of `topic`/`partition` as a consumer with `isolation` sees it: the
    /// high-water mark under read-uncommitted, the last stable offset (the first offset
    /// of the oldest open transaction) under read-committed — where a read-committed
    /// consumer starting "at the end" must begin so it does not skip transactions that
    /// commit later.
    ///
    /// ```no_run
    /// # async fn demo(conn: &kafkapipe::conn::Conn) -> kafkapipe::Result<()> {
    /// use kafkapipe::conn::IsolationLevel;
    /// let lso = conn.last_offset_with("events", 0, IsolationLevel::ReadCommitted).await?;
    /// # Ok(()) }
    /// ```
    pub async fn last_offset_with(
        &self,
        topic: &str,
        partition: i32,
        isolation: IsolationLevel,
    ) -> Result<i64> {
        self.list_offset(topic, partition, LATEST_TIMESTAMP, isolation)
            .await?
            .ok_or_else(|| self.err(ErrorCode::OffsetNotAvailable, topic, partition))
    }

    /// The first offset whose timestamp is at or after `timestamp_ms`, or `None` if no such
    /// record exists (kafka-go `ReadOffset`).
    pub async fn offset_for_time(
        &self,
        topic: &str,
        partition: i32,
        timestamp_ms: i64,
    ) -> Result<Option<i64>> {
        if timestamp_ms < 0 {
            return Err(Error::config("timestamp must not be negative"));
        }
        self.list_offset(
            topic,
            partition,
            timestamp_ms,
            IsolationLevel::ReadUncommitted,
        )
        .await
    }

    async fn list_offset(
        &self,
        topic: &str,
        partition: i32,
        timestamp: i64,
        isolation: IsolationLevel,
    ) -> Result<Option<i64>> {
        self.list_offset_at_epoch(topic, partition, timestamp, isolation, -1)
            .await
    }

    /// ListOffsets of one partition (`timestamp`: a time, [`EARLIEST_TIMESTAMP`] or
    /// [`LATEST_TIMESTAMP`]) sent with the leader epoch the caller knows
    /// (`current_leader_epoch`, -1 for none), so that a broker with another epoch answers
    /// `FENCED_LEADER_EPOCH` or `UNKNOWN_LEADER_EPOCH` instead of an offset (KIP-320).
    pub(crate) async fn list_offset_at_epoch(
        &self,
        topic: &str,
        partition: i32,
        timestamp: i64,
        isolation: IsolationLevel,
        current_leader_epoch: i32,
    ) -> Result<Option<i64>> {
        let req = ListOffsetsRequest {
            replica_id: -1,
            isolation_level: isolation.code(),
            topics: vec![ListOffsetsTopic {
                name: topic.to_string(),
                partitions: vec![ListOffsetsPartition {
                    partition_index: partition,
                    current_leader_epoch,
                    timestamp,
                    ..Default::default()
                }],
                ..Default::default()
            }],
            timeout_ms: duration_ms(self.connection.config().request_timeout),
            ..Default::default()
        };
        let resp = self.connection.send(&req).await?;
        let p = resp
            .topics
            .iter()
            .find(|t| t.name == topic)
            .and_then(|t| t.partitions.iter().find(|p| p.partition_index == partition))
            .ok_or_else(|| {
                Error::protocol("list offsets response does not mention the partition")
                    .with_topic(topic)
                    .with_partition(partition)
            })?;
        if let Some(code) = ErrorCode::non_zero(p.error_code) {
            return Err(self.err(code, topic, partition));
        }
        Ok((p.offset >= 0).then_some(p.offset))
    }

    /// OffsetForLeaderEpoch for one partition (KIP-320): the end offset of leader epoch
    /// `epoch` in the log of the leader of `topic`/`partition` — the first offset of the
    /// next higher epoch, or the log end offset if `epoch` is the leader's latest — and the
    /// largest epoch at or below `epoch` that the leader knows. `current_leader_epoch` (the
    /// epoch the caller knows the leader by) fences a stale leader or a stale caller
    /// (`FENCED_LEADER_EPOCH`, `UNKNOWN_LEADER_EPOCH`). `(-1, -1)` when the leader knows
    /// no such epoch.
    pub(crate) async fn offset_for_leader_epoch(
        &self,
        topic: &str,
        partition: i32,
        current_leader_epoch: i32,
        epoch: i32,
    ) -> Result<(i32, i64)> {
        let req = OffsetForLeaderEpochRequest {
            replica_id: -1,
            topics: vec![OffsetForLeaderTopic {
                topic: topic.to_string(),
                partitions: vec![OffsetForLeaderPartition {
                    partition,
                    current_leader_epoch,
                    leader_epoch: epoch,
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        };
        let resp = self.connection.send(&req).await?;
        let p = resp
            .topics
            .iter()
            .find(|t| t.topic == topic)
            .and_then(|t| t.partitions.iter().find(|p| p.partition == partition))
            .ok_or_else(|| {
                Error::protocol("offset for leader epoch response does not mention the partition")
                    .with_topic(topic)
                    .with_partition(partition)
            })?;
        if let Some(code) = ErrorCode::non_zero(p.error_code) {
            return Err(self.err(code, topic, partition));
        }
        Ok((p.leader_epoch, p.end_offset))
    }
}

/// Decode one partition of a fetch response that asked for records from `offset`: the
/// partition's error code becomes an error (without topic/partition context, which the
/// caller adds), the record bytes are decoded (an incomplete last batch is ignored) and
/// filtered with [`visible_batches`]. [`Conn::fetch`]'s; the `Reader` decodes with
/// [`decode_fetch_lazy`], which shares all but the records' decoding.
///
/// Compressed batches decode within [`decompress_limit`] together: when a response holds
/// more, the batches that fit are returned and `next_offset` points at the first one that
/// did not, so the next fetch continues there. The first batch may take up to
/// [`MAX_BATCH_DECOMPRESSED`], so there is always progress; one larger than that is a
/// non-retriable `Compression` error naming its offset.
pub(crate) fn decode_fetch_partition(
    p: FetchPartitionData,
    offset: i64,
    isolation_level: IsolationLevel,
    max_bytes: i32,
) -> Result<Fetched> {
    let f = decode_fetch_batches(
        p,
        offset,
        isolation_level,
        decompress_limit(max_bytes),
        None,
    )?;
    Ok(Fetched {
        records: visible_in(f.batches, offset).collect(),
        next_offset: f.next_offset,
        high_watermark: f.high_watermark,
        last_stable_offset: f.last_stable_offset,
        log_start_offset: f.log_start_offset,
    })
}

/// A partition's fetch result as [`decode_fetch_batches`] returns it: the visible data
/// batches, whose records before the requested offset are still to be skipped
/// ([`visible_in`]); or as [`decode_fetch_lazy`] returns it, with them skipped.
pub(crate) struct FetchedBatches<B = RecordBatch> {
    /// The data batches left after dropping control batches and aborted transactions.
    pub(crate) batches: Vec<B>,
    /// As [`Fetched::next_offset`].
    pub(crate) next_offset: i64,
    /// As [`Fetched::high_watermark`].
    pub(crate) high_watermark: i64,
    /// As [`Fetched::last_stable_offset`].
    pub(crate) last_stable_offset: i64,
    /// As [`Fetched::log_start_offset`].
    pub(crate) log_start_offset: i64,
    /// The partition leader epoch of every batch decoded (control batches and aborted
    /// transactions included) where it changes: `(base offset, epoch)`, in offset order.
    /// The last entry is the epoch of the last offset fetched (KIP-320).
    pub(crate) epochs: Vec<(i64, i32)>,
}

/// [`decode_fetch_partition`] without flattening the batches into one `Vec` of records,
/// decompressing into buffers of `pool` when given, to at most `limit` bytes together
/// (see [`decompress_limit`]; the first batch may take more).
pub(crate) fn decode_fetch_batches(
    p: FetchPartitionData,
    offset: i64,
    isolation_level: IsolationLevel,
    limit: usize,
    pool: Option<&Arc<BufPool>>,
) -> Result<FetchedBatches> {
    fetched_batches(p, offset, isolation_level, |data| {
        decode_batches_pooled(data, limit, MAX_BATCH_DECOMPRESSED, pool).map(|d| d.batches)
    })
}

/// [`decode_fetch_batches`] leaving the records of data batches encoded (see
/// [`decode_batches_lazy`]), the records before `offset` skipped: every record left is
/// visible. Legacy messages come decoded. Decompresses to at most `limit` bytes together,
/// as [`decode_fetch_batches`].
pub(crate) fn decode_fetch_lazy(
    p: FetchPartitionData,
    offset: i64,
    isolation_level: IsolationLevel,
    limit: usize,
    pool: Option<&Arc<BufPool>>,
) -> Result<FetchedBatches<LazyBatch>> {
    let mut f = fetched_batches(p, offset, isolation_level, |data| {
        decode_batches_lazy(data, limit, MAX_BATCH_DECOMPRESSED, pool).map(|d| d.batches)
    })?;
    for b in &mut f.batches {
        match &mut b.encoded {
            Some(e) => e.skip_before(offset)?,
            None => b.batch.records.retain(|r| r.offset >= offset),
        }
    }
    Ok(f)
}

fn fetched_batches<B: AsRef<RecordBatch>>(
    p: FetchPartitionData,
    offset: i64,
    isolation_level: IsolationLevel,
    decode: impl FnOnce(Bytes) -> Result<Vec<B>>,
) -> Result<FetchedBatches<B>> {
    if let Some(code) = ErrorCode::non_zero(p.error_code) {
        return Err(Error::kafka(code));
    }
    let data = p.records.unwrap_or_default();
    let decoded = decode(data)?;
    let mut epochs: Vec<(i64, i32)> = Vec::new();
    for b in &decoded {
        let b = b.as_ref();
        if epochs.last().map(|(_, e)| *e) != Some(b.partition_leader_epoch) {
            epochs.push((b.base_offset, b.partition_leader_epoch));
        }
    }
    let aborted = if isolation_level == IsolationLevel::ReadCommitted {
        p.aborted_transactions.unwrap_or_default()
    } else {
        Vec::new()
    };
    let (batches, next_offset) = visible_batches(decoded, offset, &aborted);
    Ok(FetchedBatches {
        batches,
        next_offset,
        high_watermark: p.high_watermark,
        last_stable_offset: p.last_stable_offset,
        log_start_offset: p.log_start_offset,
        epochs,
    })
}

/// The records of `batches` (from [`visible_batches`]) at or after `from`, in order.
pub(crate) fn visible_in(batches: Vec<RecordBatch>, from: i64) -> impl Iterator<Item = Record> {
    batches
        .into_iter()
        .flat_map(|b| b.records)
        .filter(move |r| r.offset >= from)
}

/// Records visible to the application from decoded `batches`, starting at `from` (see
/// [`visible_batches`]), plus the offset to fetch next.
#[cfg(test)]
pub(crate) fn visible_records(
    batches: Vec<RecordBatch>,
    from: i64,
    aborted: &[AbortedTransaction],
) -> (Vec<Record>, i64) {
    let (batches, next) = visible_batches(batches, from, aborted);
    (visible_in(batches, from).collect(), next)
}

/// The data batches of decoded `batches` visible to the application, with control batches
/// dropped and batches of `aborted` transactions removed (records before `from` are
/// skipped later, by [`visible_in`]), plus the offset to fetch next.
///
/// The aborted-transaction rule is the Java consumer's (`CompletedFetch`): the aborted
/// transactions are taken in order of first offset; for each batch with a producer id, every
/// aborted transaction whose first offset is at or before the batch's *last* offset
/// activates its producer P; while P is active its transactional data batches are skipped;
/// P's ABORT control marker deactivates it. Non-transactional batches (idempotent
/// producers) and other producers' batches are never skipped. With `aborted` empty (read
/// uncommitted) only control records are dropped.
pub(crate) fn visible_batches<B: AsRef<RecordBatch>>(
    batches: Vec<B>,
    from: i64,
    aborted: &[AbortedTransaction],
) -> (Vec<B>, i64) {
    let mut pending: Vec<&AbortedTransaction> = aborted.iter().collect();
    // Popped from the end: smallest first offset first.
    pending.sort_by_key(|a| std::cmp::Reverse(a.first_offset));
    let mut active: Vec<i64> = Vec::new();
    let mut out = Vec::new();
    let mut next = from;
    for b in batches {
        let batch = b.as_ref();
        next = next.max(batch.next_offset());
        if batch.producer_id >= 0 {
            let last_offset = batch.next_offset().saturating_sub(1);
            while pending
                .last()
                .is_some_and(|a| a.first_offset <= last_offset)
            {
                if let Some(a) = pending.pop() {
                    active.push(a.producer_id);
                }
            }
            if batch.is_control {
                if let Ok(Some(ControlRecord::Abort)) = batch.control_record() {
                    active.retain(|p| *p != batch.producer_id);
                }
            } else if batch.is_transactional && active.contains(&batch.producer_id) {
                continue;
            }
        }
        if batch.is_control {
            continue;
        }
        out.push(b);
    }
    (out, next)
}

/// How much the compressed batches of one partition's fetch response may decompress to,
/// together (the soft limit of [`decode_batches_within`](crate::record::decode_batches_within)): generous relative to the fetch
/// size (real compression ratios rarely exceed 10–20×; constant 100-byte values reach ~75×
/// with zstd), bounded so that many small bombs cannot exhaust memory. A response holding
/// more is decoded in part, not refused.
pub(crate) fn decompress_limit(max_bytes: i32) -> usize {
    let base = usize::try_from(max_bytes.max(1)).unwrap_or(1);
    base.saturating_mul(32)
        .clamp(64 * 1024 * 1024, 1024 * 1024 * 1024)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use crate::protocol::TaggedFields;

    const P: i64 = 7;
    const Q: i64 = 9;

    /// A RecordBatch v2 on the wire at `base` with `n` records (values `"{tag}{i}"`),
    /// built by the producer-side builder and decoded back, as a fetch would see it.
    fn batch(base: i64, n: usize, producer: i64, transactional: bool) -> RecordBatch {
        let mut b = RecordBatchBuilder::new(Compression::None)
            .producer(producer, 0, 0)
            .transactional(transactional);
        for i in 0..n {
            b.append(
                1_000 + i as i64,
                None,
                Some(format!("v{}", base + i as i64).as_bytes()),
                &[],
            )
            .unwrap();
        }
        decode_one(b.build().unwrap(), base)
    }

    /// A transaction marker (control batch with one control record) at `offset`.
    fn marker(offset: i64, producer: i64, kind: ControlRecord) -> RecordBatch {
        let mut b = RecordBatchBuilder::new(Compression::None)
            .producer(producer, 0, -1)
            .transactional(true)
            .control(true);
        b.append(1_000, Some(&kind.key()), Some(&[0, 0, 0, 0, 0, 0]), &[])
            .unwrap();
        decode_one(b.build().unwrap(), offset)
    }

    /// Decode one encoded batch after moving it to base offset `base` (the base offset is
    /// not covered by the CRC, so the broker rewrites it in place like this).
    fn decode_one(bytes: Bytes, base: i64) -> RecordBatch {
        let mut raw = bytes.to_vec();
        raw[..8].copy_from_slice(&base.to_be_bytes());
        let mut d = crate::record::decode_batches(Bytes::from(raw), 1 << 20).unwrap();
        assert_eq!(d.batches.len(), 1);
        d.batches.remove(0)
    }

    fn aborted(producer_id: i64, first_offset: i64) -> AbortedTransaction {
        AbortedTransaction {
            producer_id,
            first_offset,
            tagged_fields: TaggedFields::new(),
        }
    }

    fn offsets(records: &[Record]) -> Vec<i64> {
        records.iter().map(|r| r.offset).collect()
    }

    #[test]
    fn control_batches_are_hidden() {
        let batches = vec![
            batch(0, 2, P, true),
            marker(2, P, ControlRecord::Commit),
            batch(3, 1, -1, false),
            marker(4, P, ControlRecord::Abort),
        ];
        let (records, next) = visible_records(batches, 0, &[]);
        assert_eq!(offsets(&records), [0, 1, 3]);
        assert_eq!(records[2].value.as_deref(), Some(&b"v3"[..]));
        assert_eq!(next, 5);
    }

    #[test]
    fn records_before_from_are_skipped() {
        // The broker returns whole batches: one starting before the requested offset.
        let batches = vec![batch(10, 5, -1, false), batch(15, 2, -1, false)];
        let (records, next) = visible_records(batches, 12, &[]);
        assert_eq!(offsets(&records), [12, 13, 14, 15, 16]);
        assert_eq!(next, 17);
    }

    #[test]
    fn batch_entirely_before_from_contributes_nothing() {
        let batches = vec![batch(0, 3, -1, false), batch(3, 2, -1, false)];
        let (records, next) = visible_records(batches, 4, &[]);
        assert_eq!(offsets(&records), [4]);
        assert_eq!(next, 5);
    }

    #[test]
    fn next_offset_advances_past_control_only_batch() {
        let (records, next) = visible_records(vec![marker(41, P, ControlRecord::Commit)], 41, &[]);
        assert!(records.is_empty());
        assert_eq!(next, 42);
    }

    #[test]
    fn nothing_fetched_keeps_requested_offset() {
        let (records, next) = visible_records(Vec::new(), 99, &[aborted(P, 3)]);
        assert!(records.is_empty());
        assert_eq!(next, 99);
    }

    /// Offsets: 0-1 P (aborted txn), 2-3 Q (committed txn), 4 P, 5 P ABORT, 6 Q COMMIT,
    /// 7-8 P (new txn, not aborted), 9 P COMMIT.
    fn interleaved() -> Vec<RecordBatch> {
        vec![
            batch(0, 2, P, true),
            batch(2, 2, Q, true),
            batch(4, 1, P, true),
            marker(5, P, ControlRecord::Abort),
            marker(6, Q, ControlRecord::Commit),
            batch(7, 2, P, true),
            marker(9, P, ControlRecord::Commit),
        ]
    }

    #[test]
    fn read_committed_hides_aborted_txn_keeps_interleaved_committed_txn() {
        let (records, next) = visible_records(interleaved(), 0, &[aborted(P, 0)]);
        assert_eq!(offsets(&records), [2, 3, 7, 8]);
        assert_eq!(next, 10);
    }

    #[test]
    fn read_uncommitted_shows_aborted_records() {
        let (records, next) = visible_records(interleaved(), 0, &[]);
        assert_eq!(offsets(&records), [0, 1, 2, 3, 4, 7, 8]);
        assert_eq!(next, 10);
    }

    #[test]
    fn aborted_txn_beyond_fetched_batches_hides_nothing() {
        let (records, _) = visible_records(interleaved(), 0, &[aborted(P, 10)]);
        assert_eq!(offsets(&records), [0, 1, 2, 3, 4, 7, 8]);
        let (records, _) = visible_records(interleaved(), 0, &[aborted(P, 1_000)]);
        assert_eq!(offsets(&records), [0, 1, 2, 3, 4, 7, 8]);
    }

    #[test]
    fn two_aborted_txns_of_same_producer_in_sequence() {
        // 0-1 P, 2 P ABORT, 3 Q (plain), 4-5 P, 6 P ABORT, 7 P (txn 3, committed), 8 COMMIT
        let batches = vec![
            batch(0, 2, P, true),
            marker(2, P, ControlRecord::Abort),
            batch(3, 1, Q, false),
            batch(4, 2, P, true),
            marker(6, P, ControlRecord::Abort),
            batch(7, 1, P, true),
            marker(8, P, ControlRecord::Commit),
        ];
        // Listed out of order on purpose: the consumer sorts by first offset.
        let list = [aborted(P, 4), aborted(P, 0)];
        let (records, next) = visible_records(batches, 0, &list);
        assert_eq!(offsets(&records), [3, 7]);
        assert_eq!(next, 9);
    }

    #[test]
    fn aborted_txn_activates_when_batch_last_offset_reaches_first_offset() {
        // Java: a producer is aborted once firstOffset <= batch.lastOffset(), so a batch
        // that merely *ends* at the first offset is already hidden.
        let batches = || vec![batch(10, 3, P, true), marker(13, P, ControlRecord::Abort)];
        let (records, _) = visible_records(batches(), 10, &[aborted(P, 12)]);
        assert!(records.is_empty(), "{records:?}");
        let (records, _) = visible_records(batches(), 10, &[aborted(P, 13)]);
        assert_eq!(offsets(&records), [10, 11, 12]);
    }

    #[test]
    fn idempotent_batches_of_aborted_producer_stay_visible() {
        // Only transactional batches are removed; a non-transactional batch with the same
        // producer id is not part of the aborted transaction.
        let batches = vec![
            batch(0, 1, P, true),
            batch(1, 1, P, false),
            marker(2, P, ControlRecord::Abort),
        ];
        let (records, _) = visible_records(batches, 0, &[aborted(P, 0)]);
        assert_eq!(offsets(&records), [1]);
    }

    #[test]
    fn aborted_txn_started_before_fetch_offset() {
        // The txn began before the fetch window: its list entry has a first offset lower
        // than every fetched batch and still hides P until its marker.
        let batches = vec![
            batch(20, 2, P, true),
            batch(22, 1, Q, true),
            marker(23, P, ControlRecord::Abort),
            marker(24, Q, ControlRecord::Commit),
            batch(25, 1, P, true),
        ];
        let (records, next) = visible_records(batches, 21, &[aborted(P, 5)]);
        assert_eq!(offsets(&records), [22, 25]);
        assert_eq!(next, 26);
    }

    #[test]
    fn decompress_limit_is_bounded() {
        assert_eq!(decompress_limit(-5), 64 * 1024 * 1024);
        assert_eq!(decompress_limit(1024 * 1024), 64 * 1024 * 1024);
        assert_eq!(decompress_limit(i32::MAX), 1024 * 1024 * 1024);
    }
}
