//! [`ReaderConfig`]: every knob of the [`Reader`](super::Reader), with its default and the
//! matching kafka-go / Java consumer setting.

use std::time::Duration;

pub use crate::common::{StartOffset, TopicPartition};
use crate::conn::{ConnectionConfig, IsolationLevel};
use crate::error::{Error, Result};

/// What to do when the broker says a fetch offset is out of range (the log was truncated
/// or deleted below it, or it is past the end) (Java `auto.offset.reset`; kafka-go always
/// resets to its `StartOffset`).
///
/// ```
/// use kafkapipe::reader::OffsetReset;
/// assert_eq!(OffsetReset::default(), OffsetReset::Earliest);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OffsetReset {
    /// Continue from the first offset still in the log.
    #[default]
    Earliest,
    /// Continue from the high-water mark.
    Latest,
    /// Yield an `OffsetOutOfRange` error and stop fetching the partition until it is
    /// [`seek`](super::Reader::seek)ed (kafka-go `OffsetOutOfRangeError: true`).
    Error,
}

/// What to read from one topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TopicSelection {
    pub(crate) topic: String,
    /// `None`: every partition the topic has when the reader starts.
    pub(crate) partitions: Option<Vec<i32>>,
}

/// Configuration of a [`Reader`](super::Reader), built with chained setters.
///
/// ```
/// use std::time::Duration;
/// use kafkapipe::reader::{ReaderConfig, StartOffset};
///
/// let config = ReaderConfig::new(["127.0.0.1:9092"])
///     .topic("events")                 // every partition of "events"
///     .partitions("audit", [0, 2])     // partitions 0 and 2 of "audit"
///     .start_offset(StartOffset::Last)
///     .max_wait(Duration::from_millis(100))
///     .queue_capacity(10_000);
/// assert_eq!(config.queue_capacity_bytes, 8 * 1024 * 1024);
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ReaderConfig {
    /// Bootstrap broker addresses (`host:port`). Required (kafka-go `Brokers`, Java
    /// `bootstrap.servers`).
    pub brokers: Vec<String>,
    pub(crate) topics: Vec<TopicSelection>,
    /// Where every partition starts. Default [`StartOffset::First`] (kafka-go
    /// `StartOffset`, default `FirstOffset`; Java `auto.offset.reset`, default `latest`).
    pub start_offset: StartOffset,
    /// What to do on `OffsetOutOfRange`. Default [`OffsetReset::Earliest`].
    pub offset_reset: OffsetReset,
    /// The least data a broker should gather before answering a fetch. Default 1 byte
    /// (kafka-go `MinBytes`, Java `fetch.min.bytes`).
    pub min_bytes: i32,
    /// The most data one fetch response may carry (all partitions of one broker). At least
    /// one batch is always returned, even if larger (KIP-74). Default 50 MiB (kafka-go
    /// `MaxBytes` is per partition, default 1 MB; Java `fetch.max.bytes`).
    pub max_bytes: i32,
    /// The most data one fetch response may carry per partition. Default 1 MiB (Java
    /// `max.partition.fetch.bytes`).
    pub max_partition_bytes: i32,
    /// How long a broker may wait for `min_bytes`. Default 500 ms (kafka-go `MaxWait`
    /// defaults to 10 s; Java `fetch.max.wait.ms`).
    pub max_wait: Duration,
    /// Whether fetches use incremental fetch sessions (KIP-227, Fetch v7+). Default
    /// `true`, as the Java consumer, librdkafka and franz-go: after a first full request,
    /// each Fetch to a broker lists only the partitions whose position changed, and the
    /// broker answers only for partitions with news, which saves much of the request and
    /// response work with hundreds of partitions per broker. A broker that refuses
    /// sessions (or whose session cache is full) gets full requests either way. `false`
    /// sends every request in full, without a session.
    pub fetch_sessions: bool,
    /// Most messages fetched and not yet yielded. Fetching stops while it is reached.
    /// Default 100 000, librdkafka's `queued.min.messages` (kafka-go `QueueCapacity` is
    /// 100 and counts per-partition batches). With 1 KB messages a lower bound throttles
    /// throughput: one response of 6 partitions × 1 MiB already holds 6 000 messages; the
    /// byte bound below is what bounds memory.
    pub queue_capacity: usize,
    /// Most bytes fetched and not yet yielded. Fetching pauses while the buffers hold half
    /// of it, and each fetch then asks for at most what is left (its `max_bytes`, shared
    /// among the brokers fetched from), so the buffers stay within it; a response always
    /// carries at least one batch (KIP-74), which may pass it. Records
    /// are buffered encoded (and decoded as they are taken), so they count their encoded
    /// size: each record's bytes in its (decompressed) batch — key, value and headers
    /// plus their framing (length prefix, offset and timestamp deltas, field lengths), a
    /// few bytes more than [`Message::size`](super::Message::size); legacy (v0/v1)
    /// messages count their key, value and headers.
    ///
    /// A compressed batch of up to 256 KiB is kept compressed, counting its compressed
    /// size, until the stream reaches it: it is decompressed then, by the task polling
    /// the reader (as the Java consumer does in `poll`) without holding the reader's
    /// shared state, and counts its records from then on. So a partition of highly compressible records holds one decompressed batch at
    /// a time, however far its compressed data runs ahead. Larger compressed batches are
    /// decompressed as they are fetched (off the runtime's threads when a response holds
    /// much), and a response may overshoot the capacity by what they decompress to: about
    /// this capacity shared among the response's partitions (at least
    /// `4 × max_partition_bytes` each, at most `32 × max_partition_bytes` or 64 MiB).
    /// Decompressing a batch the stream reaches may likewise take the count past the
    /// capacity, by at most one batch per partition. A batch may decompress to at most
    /// [`MAX_BATCH_DECOMPRESSED`](crate::record::MAX_BATCH_DECOMPRESSED) (or
    /// `32 × max_partition_bytes`, if larger); a larger one is an error naming its
    /// offset.
    /// Default 8 MiB: on one local broker, 16 partitions of 100-byte records read as fast
    /// as with 64 MiB, with 25 MB of peak RSS instead of 40 (BENCHMARKS.md). Raise it for
    /// brokers far away, where more must be in flight to keep up (librdkafka's
    /// `queued.max.messages.kbytes` is 64 MiB).
    pub queue_capacity_bytes: usize,
    /// Backoff after the first failed fetch or lookup of a partition (and after the first
    /// failed join of a group reader); doubles per consecutive failure (see
    /// [`ReaderConfig::retry_timeout`]). Default 100 ms (kafka-go `ReadBackoffMin`, Java
    /// `retry.backoff.ms`).
    pub read_backoff_min: Duration,
    /// Largest backoff between fetch retries. Default 1 s (kafka-go `ReadBackoffMax`,
    /// Java `retry.backoff.max.ms`).
    pub read_backoff_max: Duration,
    /// Transaction isolation. Default read uncommitted (kafka-go `IsolationLevel`, Java
    /// `isolation.level`, whose default is also `read_uncommitted`).
    pub isolation_level: IsolationLevel,
    /// Whether the CRC-32C of every fetched record batch (and the CRC-32 of every legacy
    /// message) is computed and compared with the stored one; a mismatch is an error
    /// naming the batch's offsets. Default `true` (Java `check.crcs`, default true;
    /// librdkafka `check.crcs` defaults to false). Turning it off saves a pass over
    /// every fetched byte (see BENCHMARKS.md for what it costs): TCP and the broker's own
    /// checks still guard the data, but a batch corrupted on disk or by a proxy is then
    /// no longer caught here, and only fails if it no longer decodes.
    pub check_crcs: bool,
    /// How long the reader keeps retrying a *transient* failure before it also yields the
    /// error to the application. Default 5 minutes; `Duration::MAX` retries forever,
    /// `Duration::ZERO` yields every failure.
    ///
    /// A failure is transient unless it is one of the *fatal* errors below; transient
    /// ones are retried with exponential backoff ([`read_backoff_min`] doubling up to
    /// [`read_backoff_max`]) — connection failures and timeouts, leader elections
    /// (`NOT_LEADER_OR_FOLLOWER`, `LEADER_NOT_AVAILABLE`, …), a topic or partition the
    /// broker does not know (yet), coordinator moves and loads, unknown server errors.
    /// Each partition (and the group membership) times its own run of consecutive
    /// failures; when the run has lasted `retry_timeout`, the last error is yielded once
    /// and the run starts over, so the reader keeps retrying and yields the error again
    /// every `retry_timeout` while the failure lasts. Any success ends the run. Retried
    /// failures are logged at `warn` (at most one line per 10 s for the partitions and one
    /// for the group, each counting the lines left out; the rest at `debug`) and counted
    /// in [`ReaderStats::retries`] and [`ReaderStats::last_error`].
    ///
    /// Fatal errors are yielded at once: authentication and TLS failures, topic / group /
    /// cluster authorization failures, `UNSUPPORTED_VERSION` (or no common API version),
    /// an offset out of range under [`OffsetReset::Error`], record data that cannot be
    /// decoded (a batch failing its CRC or decompression, which the reader cannot skip:
    /// the partition stops until it is [`seek`](super::Reader::seek)ed past it), and for a
    /// group `FENCED_INSTANCE_ID`, `INCONSISTENT_GROUP_PROTOCOL`, `INVALID_GROUP_ID`,
    /// `INVALID_SESSION_TIMEOUT` and `GROUP_MAX_SIZE_REACHED`. A partition (or group)
    /// failing fatally is retried after `read_backoff_max`, so it recovers once the
    /// cause is fixed (e.g. an ACL granted).
    ///
    /// An unknown topic or partition is transient: an explicitly assigned partition (or a
    /// topic given to [`Reader::new`](super::Reader::new)) that still does not exist
    /// after `retry_timeout` is reported then.
    ///
    /// Why 5 minutes: a broker restart, a leader election or a coordinator move takes
    /// seconds, a rolling restart of a cluster minutes; all of them must pass unnoticed
    /// by a `forward` pipeline (which ends at the first error item). The Java consumer
    /// retries forever, which leaves an application that never polls errors blind to an
    /// outage that will not end (a deleted topic, a cluster gone): after 5 minutes of
    /// uninterrupted failure an error item is the better signal. Set `Duration::MAX` for
    /// Java's behaviour.
    ///
    /// (Replaces kafka-go's `MaxAttempts`; there is no Java equivalent, its fetcher
    /// retries forever.)
    ///
    /// [`read_backoff_min`]: ReaderConfig::read_backoff_min
    /// [`read_backoff_max`]: ReaderConfig::read_backoff_max
    /// [`ReaderStats::retries`]: super::ReaderStats::retries
    /// [`ReaderStats::last_error`]: super::ReaderStats::last_error
    pub retry_timeout: Duration,
    /// How often the metrics collector publishes this client's counters to the
    /// `metrics` facade (feature `metrics`; see the `kafkapipe::metrics` module); it publishes once
    /// more when the client has closed. Default 1 s. Without the feature it is unused.
    pub metrics_interval: Duration,
    /// The settings of every broker connection: client id (kafka-go `ClientID`, Java
    /// `client.id`), connect timeout (kafka-go `Dialer.Timeout`, Java
    /// `socket.connection.setup.timeout.ms`), request timeout (Java `request.timeout.ms`;
    /// a fetch's [`max_wait`](ReaderConfig::max_wait) is added to it, and for a group
    /// reader it is at least the [`rebalance_timeout`](ReaderConfig::rebalance_timeout)
    /// plus 5 s, which a JoinGroup may wait), TLS, SASL (kafka-go `Dialer.SASLMechanism`)
    /// and the [`Dialer`](crate::conn::Dialer). Defaults: those of
    /// [`ConnectionConfig`]. Set it whole with [`ReaderConfig::connection`] (one config
    /// can serve a reader and a writer) or one setting at a time with
    /// [`ReaderConfig::client_id`], [`ReaderConfig::request_timeout`] and the like.
    pub connection: ConnectionConfig,
    /// Consumer group to join (kafka-go `GroupID`, Java `group.id`). With a group the
    /// reader reads the partitions the group assigns it of the topics given with
    /// [`ReaderConfig::topic`] or matching [`ReaderConfig::topic_pattern`] (explicit
    /// partitions are not allowed), resumes at the
    /// group's committed offsets (else at `start_offset`), and offers
    /// [`Reader::committer`](super::Reader::committer) and
    /// [`Reader::events`](super::Reader::events). Default none.
    pub group_id: Option<String>,
    /// Static membership (KIP-345): a stable id per consumer instance, so a restart
    /// within the session timeout keeps its partitions without a rebalance; close then
    /// skips LeaveGroup (Java `group.instance.id`). Default none.
    pub group_instance_id: Option<String>,
    /// How long the coordinator waits for a heartbeat before evicting the member.
    /// Default 10 s (kafka-go `SessionTimeout`; Java `session.timeout.ms` is 45 s).
    /// With [`GroupProtocol::Consumer`](crate::group::GroupProtocol::Consumer) the
    /// session is the broker's; a value above 60 s (the broker's default
    /// `group.consumer.max.session.timeout.ms`) only lengthens how long a member whose
    /// heartbeats all fail keeps its partitions (that, plus the rebalance timeout).
    pub session_timeout: Duration,
    /// How long the coordinator waits for members to rejoin during a rebalance.
    /// Default 30 s (kafka-go `RebalanceTimeout`; Java `max.poll.interval.ms`).
    pub rebalance_timeout: Duration,
    /// Heartbeat period. Default 3 s (kafka-go `HeartbeatInterval`, Java
    /// `heartbeat.interval.ms`).
    pub heartbeat_interval: Duration,
    /// Pause before retrying a join that failed fatally (e.g. `GROUP_AUTHORIZATION_FAILED`);
    /// transient failures back off like fetches (see [`ReaderConfig::retry_timeout`]).
    /// Default 500 ms (kafka-go `JoinGroupBackoff`).
    pub join_backoff: Duration,
    /// How the [`Committer`](crate::group::Committer) commits. Default
    /// [`CommitMode::Interval`](crate::group::CommitMode::Interval) of 1 s.
    pub commit_mode: crate::group::CommitMode,
    /// Commit, per partition, only up to the lowest yielded message not yet processed
    /// (see [`AckToken`](crate::group::AckToken)), so messages may be processed out of
    /// order. Default true. Off, a partition's commit moves to the highest processed
    /// message at once (kafka-go's semantics).
    pub commit_contiguous: bool,
    /// How many yielded messages of one partition a group reader tracks before they are
    /// processed (see [`AckToken`](crate::group::AckToken)); at this bound the reader
    /// stops yielding that partition until the oldest is processed, so tracking memory
    /// stays bounded (about 32 bytes a message) and a stuck pipeline shows in
    /// [`ReaderStats::oldest_unacked`](super::ReaderStats::oldest_unacked). Default
    /// 100,000.
    pub max_unacked: usize,
    /// Glob patterns of topics a group reader subscribes to besides those given with
    /// [`ReaderConfig::topic`] (Java's pattern subscription, with globs instead of
    /// regular expressions: see [`glob_match`](crate::group::glob_match)). Internal topics
    /// never match. Re-checked every
    /// [`partition_watch_interval`](ReaderConfig::partition_watch_interval); a change
    /// rejoins the group. Group readers only. Default none.
    pub topic_patterns: Vec<String>,
    /// Regular expressions (the `regex` crate's syntax) of topics a group reader subscribes
    /// to, matched against the whole topic name as Java's pattern subscription does
    /// (`Pattern.matcher(topic).matches()`). Internal topics never match. Re-checked like
    /// [`topic_patterns`](ReaderConfig::topic_patterns). Group readers only. Default none.
    #[cfg(feature = "regex")]
    pub topic_regexes: Vec<String>,
    /// How often a group reader re-reads the cluster's topics during a generation: the
    /// topics its patterns match and, for the group leader, the partition counts of
    /// every subscribed topic. A change rejoins the group, so new topics and partitions
    /// get assigned (kafka-go `WatchPartitionChanges` + `PartitionWatchInterval`, Java
    /// `metadata.max.age.ms`). Default 5 s; zero turns the watch off.
    pub partition_watch_interval: Duration,
    /// Assignors offered in JoinGroup, preferred first. Default range, then roundrobin.
    /// If all of them are cooperative (e.g. only
    /// [`CooperativeStickyAssignor`](crate::group::CooperativeStickyAssignor)) the reader
    /// uses the incremental rebalance protocol (KIP-429); otherwise the eager one.
    pub assignors: Vec<std::sync::Arc<dyn crate::group::Assignor>>,
    /// Which group protocol a group reader speaks: the classic one (JoinGroup/SyncGroup,
    /// the default) or the consumer protocol of KIP-848 (ConsumerGroupHeartbeat; Kafka
    /// 4.0+), where the broker assigns and members reconcile incrementally. The reader,
    /// its stream, [`Committer`](crate::group::Committer) and
    /// [`GroupEvent`](crate::group::GroupEvent)s are the same either way. With
    /// [`GroupProtocol::Consumer`](crate::group::GroupProtocol::Consumer) the session
    /// timeout and heartbeat interval are the broker's (`group.consumer.*`), so
    /// `heartbeat_interval` and `assignors` are not used (nor `session_timeout`, but
    /// see there); see
    /// [`group_remote_assignor`](ReaderConfig::group_remote_assignor) and
    /// [`group_topic_regex`](ReaderConfig::group_topic_regex). Java `group.protocol`.
    pub group_protocol: crate::group::GroupProtocol,
    /// The assignor the broker runs for a [`GroupProtocol::Consumer`](crate::group::GroupProtocol::Consumer)
    /// group: `"uniform"` or `"range"` on Apache Kafka; `None` (the default) leaves the
    /// choice to the broker (`group.consumer.assignors`, uniform first). Java
    /// `group.remote.assignor`.
    pub group_remote_assignor: Option<String>,
    /// A regular expression of topics, evaluated by the broker (RE2/J syntax, whole
    /// name), that a [`GroupProtocol::Consumer`](crate::group::GroupProtocol::Consumer)
    /// group reader subscribes to besides the topics given with [`ReaderConfig::topic`];
    /// the broker re-evaluates it as topics are created or deleted. Default none.
    pub group_topic_regex: Option<String>,
    /// The rack of this client (Java `client.rack`), sent by a
    /// [`GroupProtocol::Consumer`](crate::group::GroupProtocol::Consumer) member so the
    /// broker's rack-aware assignment can prefer partitions with a replica in the same
    /// rack. Fetches still go to the leader. Default none.
    pub client_rack: Option<String>,
    /// Where newly assigned partitions start when the application keeps its offsets
    /// outside Kafka; see [`OffsetStore`](crate::group::OffsetStore). Group readers only.
    /// Default none (the group's committed offsets).
    pub(crate) offset_store: Option<crate::group::SharedStore>,
    /// What runs before partitions are committed and given up (rebalance, close); see
    /// [`RevokeHook`](crate::group::RevokeHook). Group readers only. Default none.
    pub(crate) on_revoke: Option<crate::group::SharedRevokeHook>,
}

impl crate::common::retry::RetryPolicy for ReaderConfig {
    fn retry_timeout(&self) -> Duration {
        self.retry_timeout
    }

    fn backoff_for(&self, failures: u32) -> Duration {
        ReaderConfig::backoff_for(self, failures)
    }
}

impl ReaderConfig {
    /// The defaults, with `brokers` as bootstrap addresses and nothing to read yet.
    pub fn new<I, S>(brokers: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        ReaderConfig {
            brokers: brokers.into_iter().map(Into::into).collect(),
            topics: Vec::new(),
            start_offset: StartOffset::First,
            offset_reset: OffsetReset::Earliest,
            min_bytes: 1,
            max_bytes: 50 * 1024 * 1024,
            max_partition_bytes: 1024 * 1024,
            max_wait: Duration::from_millis(500),
            fetch_sessions: true,
            queue_capacity: 100_000,
            queue_capacity_bytes: 8 * 1024 * 1024,
            read_backoff_min: Duration::from_millis(100),
            read_backoff_max: Duration::from_secs(1),
            isolation_level: IsolationLevel::ReadUncommitted,
            check_crcs: true,
            retry_timeout: Duration::from_secs(5 * 60),
            metrics_interval: Duration::from_secs(1),
            connection: ConnectionConfig::default(),
            group_id: None,
            group_instance_id: None,
            session_timeout: Duration::from_secs(10),
            rebalance_timeout: Duration::from_secs(30),
            heartbeat_interval: Duration::from_secs(3),
            join_backoff: Duration::from_millis(500),
            commit_mode: crate::group::CommitMode::default(),
            commit_contiguous: true,
            max_unacked: 100_000,
            topic_patterns: Vec::new(),
            #[cfg(feature = "regex")]
            topic_regexes: Vec::new(),
            partition_watch_interval: Duration::from_secs(5),
            assignors: vec![
                std::sync::Arc::new(crate::group::RangeAssignor),
                std::sync::Arc::new(crate::group::RoundRobinAssignor),
            ],
            group_protocol: crate::group::GroupProtocol::Classic,
            group_remote_assignor: None,
            group_topic_regex: None,
            client_rack: None,
            offset_store: None,
            on_revoke: None,
        }
    }

    /// Read every partition of `topic` (as listed when the reader starts) (kafka-go
    /// `Topic` / `GroupTopics`).
    pub fn topic(mut self, topic: impl Into<String>) -> Self {
        self.topics.push(TopicSelection {
            topic: topic.into(),
            partitions: None,
        });
        self
    }

    /// Read one partition of `topic` (kafka-go `Topic` + `Partition`).
    pub fn partition(self, topic: impl Into<String>, partition: i32) -> Self {
        self.partitions(topic, [partition])
    }

    /// Read these partitions of `topic`.
    pub fn partitions(
        mut self,
        topic: impl Into<String>,
        partitions: impl IntoIterator<Item = i32>,
    ) -> Self {
        self.topics.push(TopicSelection {
            topic: topic.into(),
            partitions: Some(partitions.into_iter().collect()),
        });
        self
    }

    /// Set [`ReaderConfig::start_offset`].
    pub fn start_offset(mut self, start: StartOffset) -> Self {
        self.start_offset = start;
        self
    }

    /// Set [`ReaderConfig::offset_reset`].
    pub fn offset_reset(mut self, reset: OffsetReset) -> Self {
        self.offset_reset = reset;
        self
    }

    /// Set [`ReaderConfig::retry_timeout`]: how long transient failures are retried
    /// before the error is also yielded (`Duration::MAX`: never).
    ///
    /// ```
    /// use std::time::Duration;
    /// use kafkapipe::reader::ReaderConfig;
    /// let config = ReaderConfig::new(["127.0.0.1:9092"]).topic("events");
    /// assert_eq!(config.retry_timeout, Duration::from_secs(300));
    /// let forever = config.retry_timeout(Duration::MAX);
    /// assert_eq!(forever.retry_timeout, Duration::MAX);
    /// ```
    pub fn retry_timeout(mut self, d: Duration) -> Self {
        self.retry_timeout = d;
        self
    }

    /// Set [`ReaderConfig::metrics_interval`].
    ///
    /// ```
    /// use std::time::Duration;
    /// let config = kafkapipe::reader::ReaderConfig::new(["localhost:9092"])
    ///     .metrics_interval(Duration::from_millis(250));
    /// assert_eq!(config.metrics_interval, Duration::from_millis(250));
    /// ```
    pub fn metrics_interval(mut self, d: Duration) -> Self {
        self.metrics_interval = d;
        self
    }

    /// Join consumer group `id` (see [`ReaderConfig::group_id`](ReaderConfig#structfield.group_id)).
    ///
    /// ```
    /// use kafkapipe::reader::ReaderConfig;
    /// let c = ReaderConfig::new(["127.0.0.1:9092"]).group_id("billing").topic("events");
    /// assert_eq!(c.group_id.as_deref(), Some("billing"));
    /// ```
    pub fn group_id(mut self, id: impl Into<String>) -> Self {
        self.group_id = Some(id.into());
        self
    }

    /// Set [`ReaderConfig::group_instance_id`] (static membership).
    pub fn group_instance_id(mut self, id: impl Into<String>) -> Self {
        self.group_instance_id = Some(id.into());
        self
    }

    /// Set [`ReaderConfig::session_timeout`].
    pub fn session_timeout(mut self, d: Duration) -> Self {
        self.session_timeout = d;
        self
    }

    /// Set [`ReaderConfig::rebalance_timeout`].
    pub fn rebalance_timeout(mut self, d: Duration) -> Self {
        self.rebalance_timeout = d;
        self
    }

    /// Set [`ReaderConfig::heartbeat_interval`].
    pub fn heartbeat_interval(mut self, d: Duration) -> Self {
        self.heartbeat_interval = d;
        self
    }

    /// Subscribe a group reader to every topic whose name matches the glob `pattern`
    /// (see [`ReaderConfig::topic_patterns`]).
    ///
    /// ```
    /// use kafkapipe::reader::ReaderConfig;
    /// let config = ReaderConfig::new(["localhost:9092"]).group_id("g").topic_pattern("orders-*");
    /// assert_eq!(config.topic_patterns, vec!["orders-*".to_string()]);
    /// ```
    pub fn topic_pattern(mut self, pattern: impl Into<String>) -> Self {
        self.topic_patterns.push(pattern.into());
        self
    }

    /// Subscribe a group reader to every topic whose whole name matches the regular
    /// expression `regex` (see [`ReaderConfig::topic_regexes`]; Java
    /// `subscribe(Pattern)`). An invalid expression is reported when the reader starts.
    ///
    /// ```
    /// use kafkapipe::reader::ReaderConfig;
    /// let config = ReaderConfig::new(["localhost:9092"]).group_id("g").topic_regex(r"orders\.(eu|us)");
    /// assert_eq!(config.topic_regexes, vec![r"orders\.(eu|us)".to_string()]);
    /// ```
    #[cfg(feature = "regex")]
    pub fn topic_regex(mut self, regex: impl Into<String>) -> Self {
        self.topic_regexes.push(regex.into());
        self
    }

    /// Whether topics are selected by pattern (globs or regular expressions).
    pub(crate) fn has_topic_patterns(&self) -> bool {
        #[cfg(feature = "regex")]
        if !self.topic_regexes.is_empty() {
            return true;
        }
        !self.topic_patterns.is_empty()
    }

    /// Whether `topic` matches one of the glob patterns or regular expressions.
    pub(crate) fn topic_matches(&self, topic: &str) -> bool {
        #[cfg(feature = "regex")]
        if self
            .topic_regexes
            .iter()
            .filter_map(|r| full_match_regex(r).ok())
            .any(|r| r.is_match(topic))
        {
            return true;
        }
        self.topic_patterns
            .iter()
            .any(|p| crate::group::glob_match(p, topic))
    }

    /// Set [`ReaderConfig::partition_watch_interval`].
    pub fn partition_watch_interval(mut self, d: Duration) -> Self {
        self.partition_watch_interval = d;
        self
    }

    /// Set [`ReaderConfig::join_backoff`].
    pub fn join_backoff(mut self, d: Duration) -> Self {
        self.join_backoff = d;
        self
    }

    /// Set [`ReaderConfig::commit_mode`].
    pub fn commit_mode(mut self, mode: crate::group::CommitMode) -> Self {
        self.commit_mode = mode;
        self
    }

    /// Set [`ReaderConfig::max_unacked`] (at least 1).
    ///
    /// ```
    /// let c = kafkapipe::reader::ReaderConfig::new(["127.0.0.1:9092"]).max_unacked(10_000);
    /// assert_eq!(c.max_unacked, 10_000);
    /// ```
    pub fn max_unacked(mut self, n: usize) -> Self {
        self.max_unacked = n.max(1);
        self
    }

    /// Set [`ReaderConfig::commit_contiguous`].
    pub fn commit_contiguous(mut self, on: bool) -> Self {
        self.commit_contiguous = on;
        self
    }

    /// Replace [`ReaderConfig::assignors`] (preferred first).
    pub fn assignors(mut self, assignors: Vec<std::sync::Arc<dyn crate::group::Assignor>>) -> Self {
        self.assignors = assignors;
        self
    }

    /// Set [`ReaderConfig::group_protocol`].
    ///
    /// ```
    /// use kafkapipe::group::GroupProtocol;
    /// use kafkapipe::reader::ReaderConfig;
    /// let config = ReaderConfig::new(["localhost:9092"])
    ///     .group_id("g")
    ///     .topic("events")
    ///     .group_protocol(GroupProtocol::Consumer);
    /// assert_eq!(config.group_protocol, GroupProtocol::Consumer);
    /// ```
    pub fn group_protocol(mut self, protocol: crate::group::GroupProtocol) -> Self {
        self.group_protocol = protocol;
        self
    }

    /// Set [`ReaderConfig::group_remote_assignor`].
    ///
    /// ```
    /// use kafkapipe::group::GroupProtocol;
    /// use kafkapipe::reader::ReaderConfig;
    /// let config = ReaderConfig::new(["localhost:9092"])
    ///     .group_id("g")
    ///     .topic("events")
    ///     .group_protocol(GroupProtocol::Consumer)
    ///     .group_remote_assignor("range");
    /// assert_eq!(config.group_remote_assignor.as_deref(), Some("range"));
    /// ```
    pub fn group_remote_assignor(mut self, name: impl Into<String>) -> Self {
        self.group_remote_assignor = Some(name.into());
        self
    }

    /// Set [`ReaderConfig::group_topic_regex`] (broker-side regular expression
    /// subscription of a [`GroupProtocol::Consumer`](crate::group::GroupProtocol::Consumer) group).
    ///
    /// ```
    /// use kafkapipe::group::GroupProtocol;
    /// use kafkapipe::reader::ReaderConfig;
    /// let config = ReaderConfig::new(["localhost:9092"])
    ///     .group_id("g")
    ///     .group_protocol(GroupProtocol::Consumer)
    ///     .group_topic_regex("orders-.*");
    /// assert_eq!(config.group_topic_regex.as_deref(), Some("orders-.*"));
    /// ```
    pub fn group_topic_regex(mut self, regex: impl Into<String>) -> Self {
        self.group_topic_regex = Some(regex.into());
        self
    }

    /// Set [`ReaderConfig::client_rack`].
    ///
    /// ```
    /// let config = kafkapipe::reader::ReaderConfig::new(["localhost:9092"]).client_rack("eu-west-1a");
    /// assert_eq!(config.client_rack.as_deref(), Some("eu-west-1a"));
    /// ```
    pub fn client_rack(mut self, rack: impl Into<String>) -> Self {
        self.client_rack = Some(rack.into());
        self
    }

    /// Keep the start offsets of a group reader's partitions outside Kafka: see
    /// [`OffsetStore`](crate::group::OffsetStore).
    ///
    /// ```no_run
    /// use std::collections::HashMap;
    /// use kafkapipe::reader::{ReaderConfig, TopicPartition};
    ///
    /// let config = ReaderConfig::new(["localhost:9092"])
    ///     .group_id("billing")
    ///     .topic("orders")
    ///     .offset_store(|_: Vec<TopicPartition>| async { Ok(HashMap::new()) });
    /// ```
    pub fn offset_store(mut self, store: impl crate::group::OffsetStore) -> Self {
        self.offset_store = Some(crate::group::SharedStore(std::sync::Arc::new(store)));
        self
    }

    /// Run `hook` before the group commits and gives up partitions — on a rebalance and
    /// on close — so stages that buffer messages flush them first (Java's
    /// `ConsumerRebalanceListener.onPartitionsRevoked`): see
    /// [`RevokeHook`](crate::group::RevokeHook).
    ///
    /// ```no_run
    /// use kafkapipe::reader::{ReaderConfig, TopicPartition};
    ///
    /// let config = ReaderConfig::new(["localhost:9092"])
    ///     .group_id("billing")
    ///     .topic("orders")
    ///     .on_revoke(|partitions: Vec<TopicPartition>| async move {
    ///         println!("about to give up {partitions:?}: flush the stages here");
    ///     });
    /// ```
    pub fn on_revoke(mut self, hook: impl crate::group::RevokeHook) -> Self {
        self.on_revoke = Some(crate::group::SharedRevokeHook(std::sync::Arc::new(hook)));
        self
    }

    pub(crate) fn validate(&self) -> Result<()> {
        let fail = |m: &str| Err(Error::config(m.to_string()));
        if self.brokers.is_empty() {
            return fail("ReaderConfig::brokers must name at least one broker");
        }
        if self.min_bytes < 0 {
            return fail("ReaderConfig::min_bytes must not be negative");
        }
        if self.max_bytes < 1 || self.max_partition_bytes < 1 {
            return fail("ReaderConfig::max_bytes and max_partition_bytes must be at least 1");
        }
        if self.queue_capacity == 0 || self.queue_capacity_bytes == 0 {
            return fail(
                "ReaderConfig::queue_capacity and queue_capacity_bytes must be at least 1",
            );
        }
        if self.read_backoff_min > self.read_backoff_max {
            return fail("ReaderConfig::read_backoff_min must not exceed read_backoff_max");
        }
        if self.group_id.is_none() && self.has_topic_patterns() {
            return fail("ReaderConfig::topic_pattern and topic_regex need a group_id");
        }
        #[cfg(feature = "regex")]
        for r in &self.topic_regexes {
            if let Err(e) = full_match_regex(r) {
                return Err(Error::config(format!(
                    "ReaderConfig::topic_regex {r:?} is not a valid regular expression: {e}"
                )));
            }
        }
        if self.group_id.is_none() && self.on_revoke.is_some() {
            return fail("ReaderConfig::on_revoke needs a group (ReaderConfig::group_id): a reader without one never has partitions revoked");
        }
        if self.group_id.is_none() && self.offset_store.is_some() {
            return fail("ReaderConfig::offset_store needs a group (ReaderConfig::group_id); a reader without one starts where Reader::assign or start_offset says");
        }
        let consumer_protocol = self.group_protocol == crate::group::GroupProtocol::Consumer;
        if !consumer_protocol
            && (self.group_topic_regex.is_some() || self.group_remote_assignor.is_some())
        {
            return fail("ReaderConfig::group_topic_regex and group_remote_assignor need GroupProtocol::Consumer");
        }
        if consumer_protocol && self.has_topic_patterns() {
            return fail("with GroupProtocol::Consumer the broker evaluates the subscription: use ReaderConfig::group_topic_regex instead of topic_pattern/topic_regex");
        }
        if self.group_id.is_none() && self.group_topic_regex.is_some() {
            return fail("ReaderConfig::group_topic_regex needs a group_id");
        }
        if self.group_topic_regex.as_deref().is_some_and(str::is_empty) {
            return fail("ReaderConfig::group_topic_regex must not be empty");
        }
        if self.group_id.is_some() {
            if (self.topics.is_empty()
                && !self.has_topic_patterns()
                && self.group_topic_regex.is_none())
                || self.topics.iter().any(|t| t.partitions.is_some())
            {
                return fail("a group reader needs topics given with ReaderConfig::topic or topic_pattern (no explicit partitions)");
            }
            if self.assignors.is_empty() {
                return fail("ReaderConfig::assignors must not be empty");
            }
            if self.heartbeat_interval.is_zero() || self.heartbeat_interval >= self.session_timeout
            {
                return fail(
                    "ReaderConfig::heartbeat_interval must be positive and below session_timeout",
                );
            }
        }
        if let StartOffset::At(o) | StartOffset::AtTimestamp(o) = self.start_offset {
            if o < 0 {
                return fail("ReaderConfig::start_offset must not be negative");
            }
        }
        Ok(())
    }

    /// The connection settings the reader dials with: [`connection`](ReaderConfig#structfield.connection) with
    /// the request timeout lengthened by `max_wait` (and, for a group, to cover a
    /// JoinGroup's wait of up to the rebalance timeout).
    pub(crate) fn connection_config(&self) -> ConnectionConfig {
        let mut c = self.connection.clone();
        let timeout = self.connection.request_timeout;
        c.request_timeout = if self.group_id.is_some() {
            timeout.max(
                self.rebalance_timeout
                    .saturating_add(Duration::from_secs(5)),
            )
        } else {
            timeout
        }
        .saturating_add(self.max_wait);
        c
    }

    /// The backoff after `failures` consecutive failures (at least 1): `read_backoff_min`
    /// doubled per earlier failure, at most `read_backoff_max`.
    pub(crate) fn backoff_for(&self, failures: u32) -> Duration {
        let factor = 1u32 << failures.saturating_sub(1).min(20);
        self.read_backoff_min
            .checked_mul(factor)
            .unwrap_or(self.read_backoff_max)
            .min(self.read_backoff_max)
    }
}

/// The fetch request and buffering settings.
impl ReaderConfig {
    /// Set [`ReaderConfig::min_bytes`].
    pub fn min_bytes(mut self, n: i32) -> Self {
        self.min_bytes = n;
        self
    }

    /// Set [`ReaderConfig::max_bytes`].
    pub fn max_bytes(mut self, n: i32) -> Self {
        self.max_bytes = n;
        self
    }

    /// Set [`ReaderConfig::max_partition_bytes`].
    pub fn max_partition_bytes(mut self, n: i32) -> Self {
        self.max_partition_bytes = n;
        self
    }

    /// Set [`ReaderConfig::max_wait`].
    pub fn max_wait(mut self, d: Duration) -> Self {
        self.max_wait = d;
        self
    }

    /// Set [`ReaderConfig::fetch_sessions`]: `false` sends every Fetch in full, without
    /// an incremental fetch session.
    ///
    /// ```
    /// use kafkapipe::reader::ReaderConfig;
    /// let config = ReaderConfig::new(["127.0.0.1:9092"]).topic("events");
    /// assert!(config.fetch_sessions);
    /// let config = config.fetch_sessions(false);
    /// assert!(!config.fetch_sessions);
    /// ```
    pub fn fetch_sessions(mut self, on: bool) -> Self {
        self.fetch_sessions = on;
        self
    }

    /// Set [`ReaderConfig::queue_capacity`] (messages).
    pub fn queue_capacity(mut self, n: usize) -> Self {
        self.queue_capacity = n;
        self
    }

    /// Set [`ReaderConfig::queue_capacity_bytes`].
    pub fn queue_capacity_bytes(mut self, n: usize) -> Self {
        self.queue_capacity_bytes = n;
        self
    }

    /// Set [`ReaderConfig::read_backoff_min`] and [`ReaderConfig::read_backoff_max`].
    pub fn read_backoff(mut self, min: Duration, max: Duration) -> Self {
        self.read_backoff_min = min;
        self.read_backoff_max = max;
        self
    }

    /// Set [`ReaderConfig::isolation_level`].
    pub fn isolation_level(mut self, level: IsolationLevel) -> Self {
        self.isolation_level = level;
        self
    }

    /// Set [`ReaderConfig::check_crcs`]: whether fetched batches' CRCs are verified.
    ///
    /// ```
    /// use kafkapipe::reader::ReaderConfig;
    ///
    /// let config = ReaderConfig::new(["localhost:9092"]).topic("events").check_crcs(false);
    /// assert!(!config.check_crcs);
    /// assert!(ReaderConfig::new(["localhost:9092"]).check_crcs);
    /// ```
    pub fn check_crcs(mut self, check: bool) -> Self {
        self.check_crcs = check;
        self
    }
}

/// The connection settings: each sets a field of [`connection`](ReaderConfig#structfield.connection).
impl ReaderConfig {
    /// Use `connection` for every broker connection (see [`connection`](ReaderConfig#structfield.connection)):
    /// replaces the client id, timeouts, TLS, SASL and dialer set so far.
    ///
    /// ```
    /// use std::time::Duration;
    /// use kafkapipe::conn::ConnectionConfig;
    /// use kafkapipe::reader::ReaderConfig;
    /// use kafkapipe::writer::WriterConfig;
    /// let conn = ConnectionConfig::new().client_id("billing").request_timeout(Duration::from_secs(20));
    /// let reader = ReaderConfig::new(["b:9092"]).topic("in").connection(conn.clone());
    /// let writer = WriterConfig::new(["b:9092"]).topic("out").connection(conn);
    /// assert_eq!(reader.connection, writer.connection);
    /// ```
    pub fn connection(mut self, connection: ConnectionConfig) -> Self {
        self.connection = connection;
        self
    }

    /// Set the TLS of every broker connection ([`ConnectionConfig::tls`]).
    ///
    /// ```no_run
    /// # fn demo() -> kafkapipe::Result<()> {
    /// use kafkapipe::reader::ReaderConfig;
    /// use kafkapipe::tls::TlsConfig;
    /// let tls = TlsConfig::builder().ca_file("ca.pem")?.build()?;
    /// let config = ReaderConfig::new(["broker:9093"]).topic("events").tls(tls);
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
    /// use kafkapipe::reader::ReaderConfig;
    /// use kafkapipe::sasl::Scram;
    /// let config = ReaderConfig::new(["broker:9093"]).sasl(Scram::sha256("alice", "secret"));
    /// assert!(!format!("{config:?}").contains("secret"));
    /// ```
    pub fn sasl(mut self, mechanism: impl crate::sasl::Mechanism + 'static) -> Self {
        self.connection.sasl = Some(std::sync::Arc::new(mechanism));
        self
    }

    /// Set how broker connections are opened ([`ConnectionConfig::dialer`]).
    ///
    /// ```
    /// use kafkapipe::conn::{Dialer, Socks5Proxy};
    /// use kafkapipe::reader::ReaderConfig;
    /// let config = ReaderConfig::new(["broker:9092"])
    ///     .dialer(Dialer::new().with_socks5_proxy(Socks5Proxy::new("127.0.0.1:1080")));
    /// assert!(config.connection.dialer.socks5_proxy().is_some());
    /// ```
    pub fn dialer(mut self, dialer: crate::conn::Dialer) -> Self {
        self.connection.dialer = dialer;
        self
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

    /// Set how long one request may take ([`ConnectionConfig::request_timeout`]; see
    /// [`connection`](ReaderConfig#structfield.connection) for what is added to it).
    ///
    /// ```
    /// use std::time::Duration;
    /// let config = kafkapipe::reader::ReaderConfig::new(["b:9092"]).request_timeout(Duration::from_secs(5));
    /// assert_eq!(config.connection.request_timeout, Duration::from_secs(5));
    /// ```
    pub fn request_timeout(mut self, d: Duration) -> Self {
        self.connection.request_timeout = d;
        self
    }
}

/// `regex` compiled to match a whole topic name, as Java's pattern subscription does.
#[cfg(feature = "regex")]
fn full_match_regex(regex: &str) -> std::result::Result<regex::Regex, regex::Error> {
    regex::Regex::new(&format!("^(?:{regex})$"))
}
