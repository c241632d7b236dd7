//! [`WriterConfig`]: every knob of the [`Writer`](super::Writer), with its default and the
//! matching kafka-go / Java producer setting.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::{Balancer, Sticky};
use crate::compression::Compression;
use crate::conn::{ConnectionConfig, RequiredAcks};
use crate::error::{Error, Result};

/// Most batches per partition in flight with idempotence: the broker remembers the last 5
/// batches of each producer for deduplication.
pub(crate) const MAX_IDEMPOTENT_IN_FLIGHT: usize = 5;

/// Configuration of a [`Writer`](super::Writer), built with chained setters.
///
/// ```
/// use std::time::Duration;
/// use kafkapipe::compression::Compression;
/// use kafkapipe::conn::RequiredAcks;
/// use kafkapipe::writer::{Murmur2, WriterConfig};
///
/// let config = WriterConfig::new(["127.0.0.1:9092"])
///     .topic("events")
///     .balancer(Murmur2::default())
///     .batch_size(500)
///     .batch_timeout(Duration::from_millis(20))
///     .compression(Compression::Zstd)
///     .required_acks(RequiredAcks::Leader);
/// assert_eq!(config.batch_bytes, 1024 * 1024);
/// ```
#[derive(Clone)]
#[non_exhaustive]
pub struct WriterConfig {
    /// Bootstrap broker addresses (`host:port`). Required (kafka-go `Addr`, Java
    /// `bootstrap.servers`).
    pub brokers: Vec<String>,
    /// Topic for messages whose [`Message::topic`](super::Message::topic) is `None`.
    /// Default none: then every message must name its topic (kafka-go `Topic`).
    pub topic: Option<String>,
    /// Chooses the partition of messages without one (kafka-go `Balancer`, Java
    /// `partitioner.class`). Default [`Sticky`]: the Java client's placement — a keyed
    /// message goes to `murmur2(key) % partitions` (the same partition as the Java client
    /// and librdkafka's `murmur2_random`), so each key's messages stay in order in one
    /// partition; messages without a key go to one partition at a time
    /// ([`Sticky::DEFAULT_SWITCH_BYTES`] before switching). kafka-go's default,
    /// [`RoundRobin`](super::RoundRobin), ignores keys: set it explicitly to spread every
    /// message evenly, keyed or not.
    ///
    /// ```
    /// use kafkapipe::writer::{Message, RoundRobin, WriterConfig};
    /// let config = WriterConfig::new(["127.0.0.1:9092"]);
    /// let partitions: Vec<i32> = (0..1000).collect();
    /// // where the Java client puts key "123456789" among 1000 partitions
    /// assert_eq!(config.balancer.partition(&Message::keyed("123456789", "v"), &partitions), 566);
    /// let kafka_go = config.balancer(RoundRobin::default());
    /// ```
    pub balancer: Arc<dyn Balancer>,
    /// Most messages per partition batch. Default 100 (kafka-go `BatchSize`).
    pub batch_size: usize,
    /// Most bytes per partition batch (uncompressed, including the 61-byte batch header).
    /// A single message larger than this is rejected with `MessageTooLarge`. Default
    /// 1 MiB (kafka-go `BatchBytes`, Java `batch.size`/`max.request.size`).
    pub batch_bytes: usize,
    /// How long a partition batch may wait for more messages after its first one before
    /// it is sent anyway (a full batch is sent at once). Default 5 ms — librdkafka's and
    /// Java 4.0's `linger.ms`; kafka-go's `BatchTimeout` is the same knob with a 1 s
    /// default, which makes lone writes slow.
    pub batch_timeout: Duration,
    /// Bound on the memory of messages accepted but not yet acknowledged: each counts its
    /// [`Message::size`](super::Message::size) plus the size of the message struct
    /// (`size_of::<Message>()`, about 170 bytes). While it is exceeded `poll_ready` is
    /// pending (backpressure). Default 32 MiB (Java `buffer.memory`): about 120 000
    /// messages of 100 bytes (librdkafka's default queue holds 100 000). Of those, at
    /// most 16 384 wait for metadata at a time (see the [module docs](super)).
    ///
    /// Messages are encoded into batches as they come, except large ones (512 bytes or
    /// more by `Message::size`): once the batches sealed and not yet acknowledged hold
    /// two batches' worth ([`batch_bytes`](Self::batch_bytes) × 2, at least 2 MiB), a
    /// partition that has such a batch keeps its next messages as they are until the
    /// acknowledgements make room. For large values this bound then holds the values themselves rather than
    /// encoded copies of them, and a batch is encoded shortly before it is sent. Values of
    /// 8 KiB or more in uncompressed batches are never copied: the batch keeps a
    /// reference to the message's bytes (so a value sliced from a larger buffer keeps
    /// that buffer until its batch is acknowledged).
    pub max_buffered_bytes: usize,
    /// Acknowledgements to wait for. Default [`RequiredAcks::All`] (Java `acks=all`;
    /// kafka-go's default is none). Setting `Leader` or `None` turns the default
    /// idempotence off (see [`idempotent`](Self::idempotent)). With [`RequiredAcks::None`] a message counts as
    /// delivered once its request is written to the socket, so a flush does not prove the
    /// broker stored it; closing the writer still waits for one answered request per
    /// broker, which the broker handles after every earlier produce on that connection.
    pub required_acks: RequiredAcks,
    /// How long a message may take from its acceptance (`start_send` or
    /// [`Writer::write_messages`](super::Writer::write_messages); for `start_send`, counted
    /// from when the writer's task takes it off its queue, at most one turn of the task
    /// later) to its acknowledgement:
    /// until then retriable errors (leader elections, broker restarts, broken connections,
    /// a topic not in metadata yet, …) are retried with [`backoff_min`](Self::backoff_min)
    /// doubling up to [`backoff_max`](Self::backoff_max); at the deadline the message fails
    /// with the last error, its message saying the delivery timeout expired (or `Timeout`
    /// if nothing was tried). A produce request already in flight at the deadline is
    /// awaited (at most the [request timeout](ConnectionConfig::request_timeout)), as its batch may be
    /// written. Non-retriable errors fail at once. Default 120 s (Java
    /// `delivery.timeout.ms`).
    pub delivery_timeout: Duration,
    /// An additional bound on retries: how many times a batch is sent, or a topic's
    /// metadata looked up, before a retriable error is given up on. Default `u32::MAX`, so
    /// [`delivery_timeout`](Self::delivery_timeout) governs (Java `retries`, whose default
    /// is `Integer.MAX_VALUE`; kafka-go's `MaxAttempts` is 10, about 7 s of backoff).
    pub max_attempts: u32,
    /// Backoff before the first retry; doubles per attempt. Default 100 ms (kafka-go
    /// `WriteBackoffMin`, Java `retry.backoff.ms`).
    pub backoff_min: Duration,
    /// Largest backoff between retries. Default 1 s (kafka-go `WriteBackoffMax`, Java
    /// `retry.backoff.max.ms`).
    pub backoff_max: Duration,
    /// Codec for record batches. Default none (kafka-go `Compression`, Java
    /// `compression.type`).
    pub compression: Compression,
    /// How often the metrics collector publishes this client's counters to the
    /// `metrics` facade (feature `metrics`; see the `kafkapipe::metrics` module); it publishes once
    /// more when the client has closed. Default 1 s. Without the feature it is unused.
    pub metrics_interval: Duration,
    /// Most produce requests in flight per broker. Each request carries at most one batch
    /// per partition; a partition has at most
    /// [`max_in_flight_per_partition`](Self::max_in_flight_per_partition) batches in
    /// flight. Default 5 (Java `max.in.flight.requests.per.connection`). It is also the
    /// in-flight limit of the writer's connections: their
    /// [`ConnectionConfig::max_in_flight`] is not used.
    pub max_in_flight_per_broker: usize,
    /// Most record-batch bytes (as encoded, after compression) in one produce request. A
    /// request carries the ready batches of every partition the broker leads; past this
    /// limit the rest wait for the next request (a request always carries at least one
    /// batch). Keeps requests under the broker's `socket.request.max.bytes` (100 MiB by
    /// default), above which the broker drops the connection. Default 64 MiB. The Java
    /// client's `max.request.size` (default 1 MiB) is the same per-request cap, but it
    /// also caps a single record; here [`WriterConfig::batch_bytes`] does that.
    pub max_request_bytes: usize,
    /// How long a topic's cached metadata (partitions, leaders) is used before it is
    /// looked up again even though nothing failed; a message for a partition the cache
    /// does not know refreshes it at once. Partitions added to a topic (CreatePartitions)
    /// receive balanced messages at most this long after they appear. Default 30 s: a
    /// Metadata request per topic every 30 s costs the brokers nothing noticeable, while
    /// Java's `metadata.max.age.ms` default of 5 min leaves new partitions unused for
    /// minutes (kafka-go's `MetadataTTL` is 6 s).
    pub metadata_max_age: Duration,
    /// How long a message waits for a topic that metadata reports as unknown
    /// (`UNKNOWN_TOPIC_OR_PARTITION`) before it fails with that error. `None` (default):
    /// until the [`delivery_timeout`](Self::delivery_timeout). `Some(Duration::ZERO)` fails
    /// such messages at the first answer — but a topic just created may be unknown for a
    /// moment. (librdkafka `topic.metadata.propagation.max.ms`.)
    pub unknown_topic_timeout: Option<Duration>,
    /// Ask the broker to create a missing topic (with its default partition count) when
    /// the writer first looks it up; the broker's `auto.create.topics.enable` decides.
    /// Default false (kafka-go `AllowAutoTopicCreation`).
    pub allow_auto_topic_creation: bool,
    /// Idempotent delivery (Java `enable.idempotence`): the writer gets a producer id
    /// (InitProducerId) and numbers each partition's batches, so a batch resent after a
    /// lost response is written once, and up to
    /// [`max_in_flight_per_partition`](Self::max_in_flight_per_partition) batches per
    /// partition stay in order through retries.
    ///
    /// `None` (default): **on** when [`required_acks`](Self::required_acks) is
    /// [`RequiredAcks::All`] (the default) and `max_in_flight_per_partition` is at most 5,
    /// else off — as the Java client since 3.0, which turns idempotence off when `acks` is
    /// set to 0 or 1 without `enable.idempotence` being set. `Some(true)` asks for it
    /// explicitly: then `acks` other than `All`, or more than 5 in flight per partition,
    /// is a configuration error (as in Java). `Some(false)` turns it off. See
    /// [`is_idempotent`](Self::is_idempotent) for the effective setting.
    ///
    /// When a broker loses the producer's state (`UNKNOWN_PRODUCER_ID`), reports a gap
    /// (`OUT_OF_ORDER_SEQUENCE_NUMBER` for the next expected batch), rejects a batch for
    /// good, or a batch's fate stays unknown when it is given up, the writer bumps its
    /// producer epoch locally and restarts that partition's sequences at 0, as the Java
    /// client does (KIP-360); a new producer id is asked for only when the epoch is
    /// exhausted. kafka-go has no idempotence.
    pub idempotent: Option<bool>,
    /// Most batches of one partition in produce requests at once (Java
    /// `max.in.flight.requests.per.connection`, which bounds the same thing since a
    /// request carries one batch per partition). Default 5; at most 5 with idempotence,
    /// the broker's deduplication window. With idempotence, order is kept through
    /// retries: a batch that is retried keeps its sequence number and the later ones are
    /// sent again after it. Without idempotence, a retried batch may land after a later
    /// one (as in Java): set 1 if order matters more than throughput.
    pub max_in_flight_per_partition: usize,
    /// Transactional id: makes the writer transactional (Java `transactional.id`). Such a
    /// configuration is for [`TransactionalWriter`](super::TransactionalWriter) only
    /// ([`Writer::new`](super::Writer::new) refuses it); it implies
    /// [`idempotent`](Self::idempotent). One id names one logical producer across
    /// restarts: a new writer with the id fences the previous one. Default none.
    pub transactional_id: Option<String>,
    /// How long the transaction coordinator lets a transaction stay open before aborting
    /// it on its own (sent in InitProducerId; the broker caps it at its
    /// `transaction.max.timeout.ms`, 15 min by default). Default 60 s (Java
    /// `transaction.timeout.ms`).
    pub transaction_timeout: Duration,
    /// Which transaction protocol a [`TransactionalWriter`](super::TransactionalWriter)
    /// speaks: [`TransactionProtocol::Auto`] (default) chooses KIP-890 transactions v2
    /// when the transaction coordinator finalizes `transaction.version` >= 2 and supports
    /// Produce v12, EndTxn v5 and TxnOffsetCommit v5, else the v1 protocol.
    pub transaction_protocol: TransactionProtocol,
    /// The settings of every broker connection: client id (Java `client.id`), connect
    /// timeout (Java `socket.connection.setup.timeout.ms`), TLS, SASL, the
    /// [`Dialer`](crate::conn::Dialer), and the request timeout: how long one produce
    /// request may take, including connecting, also sent to the broker as the request's
    /// replication timeout (kafka-go `WriteTimeout`, Java `request.timeout.ms`). Defaults:
    /// those of [`ConnectionConfig`], except the request timeout: 10 s (kafka-go's
    /// `WriteTimeout`; Java's is 30 s). The in-flight limit is
    /// [`max_in_flight_per_broker`](Self::max_in_flight_per_broker). Set it whole with
    /// [`WriterConfig::connection`] (one config can serve a reader and a writer) or one
    /// setting at a time with [`WriterConfig::client_id`],
    /// [`WriterConfig::request_timeout`] and the like.
    pub connection: ConnectionConfig,
}

impl fmt::Debug for WriterConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WriterConfig")
            .field("brokers", &self.brokers)
            .field("topic", &self.topic)
            .field("batch_size", &self.batch_size)
            .field("batch_bytes", &self.batch_bytes)
            .field("batch_timeout", &self.batch_timeout)
            .field("max_buffered_bytes", &self.max_buffered_bytes)
            .field("required_acks", &self.required_acks)
            .field("delivery_timeout", &self.delivery_timeout)
            .field("max_attempts", &self.max_attempts)
            .field("backoff_min", &self.backoff_min)
            .field("backoff_max", &self.backoff_max)
            .field("compression", &self.compression)
            .field("metrics_interval", &self.metrics_interval)
            .field("max_in_flight_per_broker", &self.max_in_flight_per_broker)
            .field("max_request_bytes", &self.max_request_bytes)
            .field("metadata_max_age", &self.metadata_max_age)
            .field("unknown_topic_timeout", &self.unknown_topic_timeout)
            .field("allow_auto_topic_creation", &self.allow_auto_topic_creation)
            .field("idempotent", &self.idempotent)
            .field(
                "max_in_flight_per_partition",
                &self.max_in_flight_per_partition,
            )
            .field("transactional_id", &self.transactional_id)
            .field("transaction_timeout", &self.transaction_timeout)
            .field("transaction_protocol", &self.transaction_protocol)
            .field("connection", &self.connection)
            .finish_non_exhaustive()
    }
}

impl WriterConfig {
    /// The defaults, with `brokers` as bootstrap addresses.
    pub fn new<I, S>(brokers: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        WriterConfig {
            brokers: brokers.into_iter().map(Into::into).collect(),
            topic: None,
            balancer: Arc::new(Sticky::new()),
            batch_size: 100,
            batch_bytes: 1024 * 1024,
            batch_timeout: Duration::from_millis(5),
            max_buffered_bytes: 32 * 1024 * 1024,
            required_acks: RequiredAcks::All,
            delivery_timeout: Duration::from_secs(120),
            max_attempts: u32::MAX,
            backoff_min: Duration::from_millis(100),
            backoff_max: Duration::from_secs(1),
            compression: Compression::None,
            metrics_interval: Duration::from_secs(1),
            max_in_flight_per_broker: 5,
            max_request_bytes: 64 * 1024 * 1024,
            metadata_max_age: Duration::from_secs(30),
            unknown_topic_timeout: None,
            allow_auto_topic_creation: false,
            idempotent: None,
            max_in_flight_per_partition: 5,
            transactional_id: None,
            transaction_timeout: Duration::from_secs(60),
            transaction_protocol: TransactionProtocol::Auto,
            connection: ConnectionConfig::default().request_timeout(Duration::from_secs(10)),
        }
    }

    /// Set [`WriterConfig::topic`].
    pub fn topic(mut self, topic: impl Into<String>) -> Self {
        self.topic = Some(topic.into());
        self
    }

    /// Set [`WriterConfig::balancer`].
    pub fn balancer(mut self, balancer: impl Balancer) -> Self {
        self.balancer = Arc::new(balancer);
        self
    }

    /// Set [`WriterConfig::batch_size`].
    pub fn batch_size(mut self, n: usize) -> Self {
        self.batch_size = n;
        self
    }

    /// Set [`WriterConfig::batch_bytes`].
    pub fn batch_bytes(mut self, n: usize) -> Self {
        self.batch_bytes = n;
        self
    }

    /// Set [`WriterConfig::batch_timeout`] (linger).
    pub fn batch_timeout(mut self, d: Duration) -> Self {
        self.batch_timeout = d;
        self
    }

    /// Set [`WriterConfig::max_buffered_bytes`].
    pub fn max_buffered_bytes(mut self, n: usize) -> Self {
        self.max_buffered_bytes = n;
        self
    }

    /// Set [`WriterConfig::required_acks`].
    pub fn required_acks(mut self, acks: RequiredAcks) -> Self {
        self.required_acks = acks;
        self
    }

    /// Set [`WriterConfig::delivery_timeout`].
    ///
    /// ```
    /// use std::time::Duration;
    /// use kafkapipe::writer::WriterConfig;
    /// let config = WriterConfig::new(["b:9092"]).delivery_timeout(Duration::from_secs(30));
    /// assert_eq!(config.max_attempts, u32::MAX); // the timeout alone bounds retries
    /// ```
    pub fn delivery_timeout(mut self, d: Duration) -> Self {
        self.delivery_timeout = d;
        self
    }

    /// Set [`WriterConfig::metadata_max_age`].
    ///
    /// ```
    /// use std::time::Duration;
    /// use kafkapipe::writer::WriterConfig;
    /// let config = WriterConfig::new(["b:9092"]).metadata_max_age(Duration::from_secs(5));
    /// assert_eq!(config.metadata_max_age, Duration::from_secs(5));
    /// ```
    pub fn metadata_max_age(mut self, d: Duration) -> Self {
        self.metadata_max_age = d;
        self
    }

    /// Set [`WriterConfig::unknown_topic_timeout`].
    ///
    /// ```
    /// use std::time::Duration;
    /// use kafkapipe::writer::WriterConfig;
    /// // Fail messages for a missing topic after 5 s instead of the delivery timeout.
    /// let config = WriterConfig::new(["b:9092"]).unknown_topic_timeout(Some(Duration::from_secs(5)));
    /// # assert!(config.unknown_topic_timeout.is_some());
    /// ```
    pub fn unknown_topic_timeout(mut self, d: Option<Duration>) -> Self {
        self.unknown_topic_timeout = d;
        self
    }

    /// Set [`WriterConfig::max_attempts`].
    pub fn max_attempts(mut self, n: u32) -> Self {
        self.max_attempts = n;
        self
    }

    /// Set [`WriterConfig::backoff_min`] and [`WriterConfig::backoff_max`].
    pub fn backoff(mut self, min: Duration, max: Duration) -> Self {
        self.backoff_min = min;
        self.backoff_max = max;
        self
    }

    /// Set [`WriterConfig::compression`].
    pub fn compression(mut self, c: Compression) -> Self {
        self.compression = c;
        self
    }

    /// Set [`WriterConfig::metrics_interval`].
    ///
    /// ```
    /// use std::time::Duration;
    /// let config = kafkapipe::writer::WriterConfig::new(["localhost:9092"])
    ///     .metrics_interval(Duration::from_millis(250));
    /// assert_eq!(config.metrics_interval, Duration::from_millis(250));
    /// ```
    pub fn metrics_interval(mut self, d: Duration) -> Self {
        self.metrics_interval = d;
        self
    }

    /// Set [`WriterConfig::max_in_flight_per_broker`].
    pub fn max_in_flight_per_broker(mut self, n: usize) -> Self {
        self.max_in_flight_per_broker = n;
        self
    }

    /// Set [`WriterConfig::allow_auto_topic_creation`].
    pub fn allow_auto_topic_creation(mut self, allow: bool) -> Self {
        self.allow_auto_topic_creation = allow;
        self
    }

    /// Set [`WriterConfig::max_request_bytes`].
    pub fn max_request_bytes(mut self, n: usize) -> Self {
        self.max_request_bytes = n;
        self
    }

    /// Set [`WriterConfig::idempotent`] explicitly (`Some(on)`).
    ///
    /// ```
    /// use kafkapipe::conn::RequiredAcks;
    /// use kafkapipe::writer::WriterConfig;
    /// let config = WriterConfig::new(["b:9092"]);
    /// assert!(config.is_idempotent(), "on by default, with acks=all");
    /// let fast = config.clone().required_acks(RequiredAcks::Leader);
    /// assert!(!fast.is_idempotent(), "acks=1 turns the default off");
    /// let off = config.idempotent(false);
    /// assert!(!off.is_idempotent());
    /// ```
    pub fn idempotent(mut self, on: bool) -> Self {
        self.idempotent = Some(on);
        self
    }

    /// Whether the writer is idempotent: [`WriterConfig::idempotent`] if set, else
    /// whether [`WriterConfig::required_acks`] is `All` and
    /// [`WriterConfig::max_in_flight_per_partition`] at most 5.
    ///
    /// ```
    /// use kafkapipe::conn::RequiredAcks;
    /// use kafkapipe::writer::WriterConfig;
    /// let c = WriterConfig::new(["b:9092"]).required_acks(RequiredAcks::None);
    /// assert!(!c.is_idempotent());
    /// ```
    pub fn is_idempotent(&self) -> bool {
        self.idempotent.unwrap_or(
            self.required_acks == RequiredAcks::All
                && self.max_in_flight_per_partition <= MAX_IDEMPOTENT_IN_FLIGHT,
        )
    }

    /// Set [`WriterConfig::max_in_flight_per_partition`].
    ///
    /// ```
    /// use kafkapipe::writer::WriterConfig;
    /// // Strict order without idempotence: one batch per partition at a time.
    /// let c = WriterConfig::new(["b:9092"]).idempotent(false).max_in_flight_per_partition(1);
    /// assert_eq!(c.max_in_flight_per_partition, 1);
    /// ```
    pub fn max_in_flight_per_partition(mut self, n: usize) -> Self {
        self.max_in_flight_per_partition = n;
        self
    }

    /// Set [`WriterConfig::transactional_id`] (and [`WriterConfig::idempotent`]).
    ///
    /// ```no_run
    /// use kafkapipe::writer::{TransactionalWriter, WriterConfig};
    /// # async fn demo() -> kafkapipe::Result<()> {
    /// let config = WriterConfig::new(["127.0.0.1:9092"]).topic("out").transactional_id("etl-1");
    /// let mut writer = TransactionalWriter::new(config)?;
    /// writer.init_transactions().await?;
    /// # Ok(()) }
    /// ```
    pub fn transactional_id(mut self, id: impl Into<String>) -> Self {
        self.transactional_id = Some(id.into());
        self.idempotent = Some(true);
        self
    }

    /// Set [`WriterConfig::transaction_timeout`].
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use kafkapipe::writer::WriterConfig;
    /// let config = WriterConfig::new(["127.0.0.1:9092"])
    ///     .transactional_id("etl-1")
    ///     .transaction_timeout(Duration::from_secs(30));
    /// ```
    pub fn transaction_timeout(mut self, d: Duration) -> Self {
        self.transaction_timeout = d;
        self
    }

    /// Set [`WriterConfig::transaction_protocol`] (the default, `Auto`, follows the
    /// broker; `V1` or `V2` force one protocol, e.g. to test both on one broker).
    ///
    /// ```no_run
    /// use kafkapipe::writer::{TransactionProtocol, WriterConfig};
    /// let config = WriterConfig::new(["127.0.0.1:9092"])
    ///     .transactional_id("etl-1")
    ///     .transaction_protocol(TransactionProtocol::V1);
    /// ```
    pub fn transaction_protocol(mut self, p: TransactionProtocol) -> Self {
        self.transaction_protocol = p;
        self
    }

    pub(crate) fn validate(&self) -> Result<()> {
        let fail = |m: &str| Err(Error::config(m.to_string()));
        if self.brokers.is_empty() {
            return fail("WriterConfig::brokers must name at least one broker");
        }
        if self.batch_size == 0 {
            return fail("WriterConfig::batch_size must be at least 1");
        }
        if self.batch_bytes < 128 || self.batch_bytes > i32::MAX as usize {
            return fail("WriterConfig::batch_bytes must be between 128 and 2^31-1");
        }
        if self.max_buffered_bytes == 0 {
            return fail("WriterConfig::max_buffered_bytes must be at least 1");
        }
        if self.max_attempts == 0 {
            return fail("WriterConfig::max_attempts must be at least 1");
        }
        if self.delivery_timeout.is_zero() {
            return fail("WriterConfig::delivery_timeout must be positive");
        }
        if self.metadata_max_age.is_zero() {
            return fail("WriterConfig::metadata_max_age must be positive");
        }
        if self.max_in_flight_per_broker == 0 {
            return fail("WriterConfig::max_in_flight_per_broker must be at least 1");
        }
        if self.max_request_bytes == 0 {
            return fail("WriterConfig::max_request_bytes must be at least 1");
        }
        if self.max_in_flight_per_partition == 0 {
            return fail("WriterConfig::max_in_flight_per_partition must be at least 1");
        }
        if self.idempotent == Some(true) {
            if self.required_acks != RequiredAcks::All {
                return fail("WriterConfig::idempotent requires required_acks = All");
            }
            if self.max_in_flight_per_partition > MAX_IDEMPOTENT_IN_FLIGHT {
                return fail(
                    "WriterConfig::idempotent allows at most 5 max_in_flight_per_partition",
                );
            }
        }
        if let Some(id) = &self.transactional_id {
            if id.is_empty() {
                return fail("WriterConfig::transactional_id must not be empty");
            }
            if self.idempotent != Some(true) {
                return fail("WriterConfig::transactional_id requires idempotent = true");
            }
            if self.transaction_timeout.is_zero()
                || self.transaction_timeout.as_millis() > i32::MAX as u128
            {
                return fail(
                    "WriterConfig::transaction_timeout must be between 1 ms and 2^31-1 ms",
                );
            }
        }
        if self.backoff_min > self.backoff_max {
            return fail("WriterConfig::backoff_min must not exceed backoff_max");
        }
        Ok(())
    }

    /// The connection settings the writer dials with: [`connection`](WriterConfig#structfield.connection) with
    /// [`WriterConfig::max_in_flight_per_broker`] as the in-flight limit.
    pub(crate) fn connection_config(&self) -> ConnectionConfig {
        let mut c = self.connection.clone();
        c.max_in_flight = self.max_in_flight_per_broker;
        c
    }

    /// The backoff before attempt `attempt + 1` (after `attempt` failures): `backoff_min`
    /// doubled per earlier failure, at most `backoff_max`.
    pub(crate) fn backoff_for(&self, attempt: u32) -> Duration {
        let factor = 1u32 << attempt.saturating_sub(1).min(20);
        self.backoff_min
            .checked_mul(factor)
            .unwrap_or(self.backoff_max)
            .min(self.backoff_max)
    }
}

/// The connection settings: each sets a field of [`connection`](WriterConfig#structfield.connection).
impl WriterConfig {
    /// Use `connection` for every broker connection (see [`connection`](WriterConfig#structfield.connection)):
    /// replaces the client id, timeouts, TLS, SASL and dialer set so far, the writer's
    /// 10 s request timeout included.
    ///
    /// ```
    /// use std::time::Duration;
    /// use kafkapipe::conn::ConnectionConfig;
    /// use kafkapipe::writer::WriterConfig;
    /// let config = WriterConfig::new(["b:9092"])
    ///     .connection(ConnectionConfig::new().client_id("billing"));
    /// assert_eq!(config.connection.request_timeout, Duration::from_secs(30));
    /// ```
    pub fn connection(mut self, connection: ConnectionConfig) -> Self {
        self.connection = connection;
        self
    }

    /// Set the TLS of every broker connection ([`ConnectionConfig::tls`]).
    ///
    /// ```no_run
    /// # fn demo() -> kafkapipe::Result<()> {
    /// use kafkapipe::tls::TlsConfig;
    /// use kafkapipe::writer::WriterConfig;
    /// let tls = TlsConfig::builder().ca_file("ca.pem")?.build()?;
    /// let config = WriterConfig::new(["broker:9093"]).tls(tls);
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "tls")]
    pub fn tls(mut self, tls: crate::tls::TlsConfig) -> Self {
        self.connection.tls = Some(tls);
        self
    }

    /// Set the SASL mechanism of every broker connection ([`ConnectionConfig::sasl`]).
    ///
    /// ```
    /// use kafkapipe::sasl::Scram;
    /// use kafkapipe::writer::WriterConfig;
    /// let config = WriterConfig::new(["broker:9093"]).sasl(Scram::sha512("alice", "secret"));
    /// assert!(!format!("{config:?}").contains("secret"));
    /// ```
    pub fn sasl(mut self, mechanism: impl crate::sasl::Mechanism + 'static) -> Self {
        self.connection.sasl = Some(Arc::new(mechanism));
        self
    }

    /// Set how broker connections are opened ([`ConnectionConfig::dialer`]).
    ///
    /// ```
    /// use kafkapipe::conn::{Dialer, Socks5Proxy};
    /// use kafkapipe::writer::WriterConfig;
    /// let config = WriterConfig::new(["broker:9092"])
    ///     .dialer(Dialer::new().with_socks5_proxy(Socks5Proxy::new("127.0.0.1:1080")));
    /// assert!(config.connection.dialer.socks5_proxy().is_some());
    /// ```
    pub fn dialer(mut self, dialer: crate::conn::Dialer) -> Self {
        self.connection.dialer = dialer;
        self
    }

    /// Set how long one produce request may take, including connecting; also sent to
    /// the broker as the request's replication timeout ([`ConnectionConfig::request_timeout`]
    /// of [`connection`](WriterConfig#structfield.connection); default 10 s). kafka-go's `WriteTimeout`; Java
    /// `request.timeout.ms`.
    ///
    /// ```
    /// use std::time::Duration;
    /// let config = kafkapipe::writer::WriterConfig::new(["b:9092"]).request_timeout(Duration::from_secs(5));
    /// assert_eq!(config.connection.request_timeout, Duration::from_secs(5));
    /// ```
    pub fn request_timeout(mut self, d: Duration) -> Self {
        self.connection.request_timeout = d;
        self
    }

    /// The old name of [`WriterConfig::request_timeout`], which kafka-go calls
    /// `WriteTimeout`: sets the same [`ConnectionConfig::request_timeout`].
    ///
    /// ```
    /// # #![allow(deprecated)]
    /// use std::time::Duration;
    /// let config = kafkapipe::writer::WriterConfig::new(["b:9092"]).write_timeout(Duration::from_secs(5));
    /// assert_eq!(config.connection.request_timeout, Duration::from_secs(5));
    /// ```
    #[deprecated(
        note = "renamed to `request_timeout` (kafka-go's WriteTimeout is `WriterConfig::request_timeout`)"
    )]
    pub fn write_timeout(self, d: Duration) -> Self {
        self.request_timeout(d)
    }

    /// Set the client id sent to brokers ([`ConnectionConfig::client_id`]).
    pub fn client_id(mut self, id: impl Into<String>) -> Self {
        self.connection.client_id = id.into();
        self
    }

    /// Set how long establishing a broker connection may take
    /// ([`ConnectionConfig::connect_timeout`]).
    pub fn connect_timeout(mut self, d: Duration) -> Self {
        self.connection.connect_timeout = d;
        self
    }
}

/// The transaction protocol of a [`TransactionalWriter`](super::TransactionalWriter)
/// ([`WriterConfig::transaction_protocol`]).
///
/// - v1: each partition joins the transaction with AddPartitionsToTxn before its first
///   batch, a group with AddOffsetsToTxn before TxnOffsetCommit; EndTxn (≤ v4) keeps the
///   producer epoch.
/// - v2 (KIP-890 "transactions v2", Kafka 4.0+ with `transaction.version=2`): partitions
///   join implicitly through Produce v12, the group through TxnOffsetCommit v5, and every
///   EndTxn (v5) bumps the epoch and returns the producer id and epoch of the next
///   transaction (a new producer id once the epoch is exhausted); sequence numbers restart.
///
/// ```no_run
/// use kafkapipe::writer::{TransactionProtocol, WriterConfig};
/// let config = WriterConfig::new(["127.0.0.1:9092"])
///     .transactional_id("etl-1")
///     .transaction_protocol(TransactionProtocol::V2);
/// assert_eq!(config.transaction_protocol, TransactionProtocol::V2);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TransactionProtocol {
    /// v2 when the transaction coordinator finalizes `transaction.version` >= 2 and
    /// supports Produce v12, EndTxn v5 and TxnOffsetCommit v5; v1 otherwise (default).
    #[default]
    Auto,
    /// Always the v1 protocol (Kafka 4.x still accepts it).
    V1,
    /// Always transactions v2: `init_transactions` fails with `UnsupportedVersion` when
    /// the coordinator cannot do it.
    V2,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_max() {
        let c =
            WriterConfig::new(["b:1"]).backoff(Duration::from_millis(100), Duration::from_secs(1));
        let got: Vec<u128> = (1..=6).map(|a| c.backoff_for(a).as_millis()).collect();
        assert_eq!(got, [100, 200, 400, 800, 1000, 1000]);
        assert_eq!(c.backoff_for(u32::MAX), Duration::from_secs(1));
    }

    #[test]
    fn invalid_configs_are_rejected() {
        let ok = WriterConfig::new(["b:1"]);
        assert!(ok.validate().is_ok());
        for bad in [
            WriterConfig::new(Vec::<String>::new()),
            ok.clone().batch_size(0),
            ok.clone().batch_bytes(10),
            ok.clone().max_buffered_bytes(0),
            ok.clone().max_attempts(0),
            ok.clone().delivery_timeout(Duration::ZERO),
            ok.clone().metadata_max_age(Duration::ZERO),
            ok.clone().max_in_flight_per_broker(0),
            ok.clone().max_in_flight_per_partition(0),
            ok.clone().idempotent(true).max_in_flight_per_partition(6),
            ok.clone().max_request_bytes(0),
            ok.clone()
                .backoff(Duration::from_secs(2), Duration::from_secs(1)),
            ok.clone()
                .idempotent(true)
                .required_acks(RequiredAcks::Leader),
            ok.clone().transactional_id(""),
            ok.clone().transactional_id("t").idempotent(false),
            ok.clone()
                .transactional_id("t")
                .required_acks(RequiredAcks::Leader),
            ok.clone()
                .transactional_id("t")
                .transaction_timeout(Duration::ZERO),
        ] {
            let e = bad.validate().unwrap_err();
            assert_eq!(e.kind(), crate::ErrorKind::Config, "{e}");
        }
    }

    #[test]
    fn idempotence_is_on_by_default_only_with_acks_all() {
        let c = WriterConfig::new(["b:1"]);
        assert!(c.is_idempotent() && c.validate().is_ok());
        for acks in [RequiredAcks::Leader, RequiredAcks::None] {
            let c = WriterConfig::new(["b:1"]).required_acks(acks);
            assert!(!c.is_idempotent(), "{acks:?} turns the default off");
            assert!(c.validate().is_ok());
        }
        let many = WriterConfig::new(["b:1"]).max_in_flight_per_partition(8);
        assert!(!many.is_idempotent() && many.validate().is_ok());
        assert!(!WriterConfig::new(["b:1"]).idempotent(false).is_idempotent());
        assert!(WriterConfig::new(["b:1"])
            .transactional_id("t")
            .is_idempotent());
    }

    #[test]
    #[allow(deprecated)]
    fn the_request_timeout_is_one_field_with_the_old_name_as_alias() {
        let c = WriterConfig::new(["b:1"]);
        assert_eq!(c.connection.request_timeout, Duration::from_secs(10));
        assert_eq!(
            c.connection_config().request_timeout,
            Duration::from_secs(10)
        );
        let old = c.clone().write_timeout(Duration::from_secs(4));
        let new = c.request_timeout(Duration::from_secs(4));
        assert_eq!(old.connection, new.connection);
        assert_eq!(new.connection.request_timeout, Duration::from_secs(4));
    }

    #[test]
    fn a_whole_connection_config_replaces_the_connection_settings() {
        let shared = ConnectionConfig::new()
            .client_id("shared")
            .connect_timeout(Duration::from_secs(2));
        let c = WriterConfig::new(["b:1"])
            .client_id("mine")
            .connection(shared.clone())
            .max_in_flight_per_broker(3);
        assert_eq!(c.connection, shared);
        let cc = c.connection_config();
        assert_eq!((cc.client_id.as_str(), cc.max_in_flight), ("shared", 3));
        assert_eq!(cc.connect_timeout, Duration::from_secs(2));
        let r = crate::reader::ReaderConfig::new(["b:1"]).connection(shared.clone());
        assert_eq!(r.connection, shared);
    }

    #[test]
    fn connection_config_follows_writer_settings() {
        let c = WriterConfig::new(["b:1"])
            .client_id("app")
            .request_timeout(Duration::from_secs(3))
            .max_in_flight_per_broker(2);
        let cc = c.connection_config();
        assert_eq!(cc.client_id, "app");
        assert_eq!(cc.request_timeout, Duration::from_secs(3));
        assert_eq!(cc.max_in_flight, 2);
    }
}
