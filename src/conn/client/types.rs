//! The public option and result types of [`Conn`](super::Conn): what a produce and a
//! fetch take, what a fetch and a metadata request return, a topic to create.
//!
//! Plain data with defaults and small accessors; may not send requests or decode
//! responses (the `Conn` files do).

use std::time::Duration;

use crate::compression::Compression;
use crate::protocol::ErrorCode;
use crate::record::Record;

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

/// Options of [`Conn::produce`](super::Conn::produce).
///
/// ```
/// use std::time::Duration;
/// use kafkapipe::compression::Compression;
/// use kafkapipe::conn::{ProduceOptions, RequiredAcks};
/// let opts = ProduceOptions::default()
///     .compression(Compression::Zstd)
///     .acks(RequiredAcks::Leader);
/// assert_eq!(opts.timeout, Duration::from_secs(30));
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
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

impl ProduceOptions {
    /// Set [`ProduceOptions::acks`].
    ///
    /// ```
    /// use kafkapipe::conn::{ProduceOptions, RequiredAcks};
    /// assert_eq!(ProduceOptions::default().acks(RequiredAcks::None).acks, RequiredAcks::None);
    /// ```
    pub fn acks(mut self, acks: RequiredAcks) -> Self {
        self.acks = acks;
        self
    }

    /// Set [`ProduceOptions::timeout`].
    ///
    /// ```
    /// use std::time::Duration;
    /// let opts = kafkapipe::conn::ProduceOptions::default().timeout(Duration::from_secs(5));
    /// assert_eq!(opts.timeout, Duration::from_secs(5));
    /// ```
    pub fn timeout(mut self, d: Duration) -> Self {
        self.timeout = d;
        self
    }

    /// Set [`ProduceOptions::compression`].
    ///
    /// ```
    /// use kafkapipe::compression::Compression;
    /// let opts = kafkapipe::conn::ProduceOptions::default().compression(Compression::Gzip);
    /// assert_eq!(opts.compression, Compression::Gzip);
    /// ```
    pub fn compression(mut self, c: Compression) -> Self {
        self.compression = c;
        self
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

/// Options of [`Conn::fetch`](super::Conn::fetch).
///
/// ```
/// use std::time::Duration;
/// use kafkapipe::conn::{FetchOptions, IsolationLevel};
/// let opts = FetchOptions::default()
///     .max_wait(Duration::from_millis(100))
///     .isolation_level(IsolationLevel::ReadCommitted);
/// assert_eq!(opts.max_bytes, 1024 * 1024);
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
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

impl FetchOptions {
    /// Set [`FetchOptions::min_bytes`].
    ///
    /// ```
    /// assert_eq!(kafkapipe::conn::FetchOptions::default().min_bytes(1024).min_bytes, 1024);
    /// ```
    pub fn min_bytes(mut self, n: i32) -> Self {
        self.min_bytes = n;
        self
    }

    /// Set [`FetchOptions::max_bytes`].
    ///
    /// ```
    /// assert_eq!(kafkapipe::conn::FetchOptions::default().max_bytes(4096).max_bytes, 4096);
    /// ```
    pub fn max_bytes(mut self, n: i32) -> Self {
        self.max_bytes = n;
        self
    }

    /// Set [`FetchOptions::max_wait`].
    ///
    /// ```
    /// use std::time::Duration;
    /// let opts = kafkapipe::conn::FetchOptions::default().max_wait(Duration::ZERO);
    /// assert_eq!(opts.max_wait, Duration::ZERO);
    /// ```
    pub fn max_wait(mut self, d: Duration) -> Self {
        self.max_wait = d;
        self
    }

    /// Set [`FetchOptions::isolation_level`].
    ///
    /// ```
    /// use kafkapipe::conn::{FetchOptions, IsolationLevel};
    /// let opts = FetchOptions::default().isolation_level(IsolationLevel::ReadCommitted);
    /// assert_eq!(opts.isolation_level, IsolationLevel::ReadCommitted);
    /// ```
    pub fn isolation_level(mut self, level: IsolationLevel) -> Self {
        self.isolation_level = level;
        self
    }
}

/// What [`Conn::fetch`](super::Conn::fetch) returned for one partition.
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

/// A broker as listed by [`Conn::metadata`](super::Conn::metadata).
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

/// A partition as listed by [`Conn::metadata`](super::Conn::metadata).
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

/// A topic as listed by [`Conn::metadata`](super::Conn::metadata).
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

/// Cluster metadata as returned by [`Conn::metadata`](super::Conn::metadata).
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

/// A topic to create with [`Conn::create_topics`](super::Conn::create_topics).
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
