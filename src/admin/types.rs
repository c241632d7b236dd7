//! The typed requests and results of the [`Admin`](super::Admin) calls.

use bytes::Bytes;

use crate::conn::Broker;
use crate::protocol::consumer_protocol::{Assignment, Subscription};

/// One partition of one topic.
///
/// ```
/// use kafkapipe::admin::TopicPartition;
/// let tp = TopicPartition::new("events", 3);
/// assert_eq!(tp.to_string(), "events/3");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TopicPartition {
    /// The topic.
    pub topic: String,
    /// The partition index.
    pub partition: i32,
}

impl TopicPartition {
    /// `topic`/`partition`.
    pub fn new(topic: impl Into<String>, partition: i32) -> Self {
        TopicPartition {
            topic: topic.into(),
            partition,
        }
    }
}

impl std::fmt::Display for TopicPartition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.topic, self.partition)
    }
}

/// Which offset of a partition to look up (or reset a group to).
///
/// ```
/// use kafkapipe::admin::OffsetSpec;
/// assert_eq!("beginning".parse::<OffsetSpec>(), Ok(OffsetSpec::Earliest));
/// assert_eq!("42".parse::<OffsetSpec>(), Ok(OffsetSpec::Offset(42)));
/// let at = "@1700000000000".parse::<OffsetSpec>();
/// assert_eq!(at, Ok(OffsetSpec::Timestamp(1_700_000_000_000)));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OffsetSpec {
    /// The first offset still in the log (the log start offset).
    Earliest,
    /// The offset the next record will get (the high-water mark).
    Latest,
    /// The first offset whose record timestamp is at or after this many ms since the epoch.
    Timestamp(i64),
    /// This exact offset (no lookup).
    Offset(i64),
}

impl OffsetSpec {
    /// The ListOffsets `timestamp` value, `None` for an explicit offset.
    pub(crate) fn wire_timestamp(self) -> Option<i64> {
        match self {
            OffsetSpec::Earliest => Some(-2),
            OffsetSpec::Latest => Some(-1),
            OffsetSpec::Timestamp(t) => Some(t),
            OffsetSpec::Offset(_) => None,
        }
    }
}

impl std::str::FromStr for OffsetSpec {
    type Err = String;

    /// `earliest`/`beginning`, `latest`/`end`, `@<ms since epoch>` or an offset.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "earliest" | "beginning" | "start" => Ok(OffsetSpec::Earliest),
            "latest" | "end" => Ok(OffsetSpec::Latest),
            _ => {
                if let Some(ts) = s.strip_prefix('@') {
                    ts.parse()
                        .map(OffsetSpec::Timestamp)
                        .map_err(|e| format!("bad timestamp {ts:?}: {e}"))
                } else {
                    s.parse().map(OffsetSpec::Offset).map_err(|_| {
                        format!("bad offset {s:?}: want earliest, latest, @<ms> or a number")
                    })
                }
            }
        }
    }
}

/// An offset found by [`Admin::list_offsets`](super::Admin::list_offsets).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListedOffset {
    /// The offset; `-1` when a timestamp lookup found no record at or after it.
    pub offset: i64,
    /// The timestamp of that record for timestamp lookups, else `-1`.
    pub timestamp: i64,
    /// The leader epoch of that offset, `-1` if unknown.
    pub leader_epoch: i32,
}

/// A topic as listed by [`Admin::list_topics`](super::Admin::list_topics).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicListing {
    /// The topic name.
    pub name: String,
    /// Whether it is an internal topic (`__consumer_offsets`, …).
    pub internal: bool,
    /// Its number of partitions.
    pub partitions: usize,
}

/// A config resource: a topic, a broker, a broker's loggers, or a group.
///
/// ```
/// use kafkapipe::admin::ConfigResource;
/// assert_eq!(ConfigResource::broker(1), ConfigResource::Broker("1".into()));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ConfigResource {
    /// A topic's configs (wire type 2).
    Topic(String),
    /// A broker's configs (wire type 4); the name is the broker id, or empty for the
    /// cluster-wide default.
    Broker(String),
    /// A broker's log4j loggers (wire type 8).
    BrokerLogger(String),
    /// A group's configs (wire type 32, KIP-848/KIP-932; Kafka 4.0+): for instance a
    /// share group's `share.auto.offset.reset` or `share.record.lock.duration.ms`.
    Group(String),
}

impl ConfigResource {
    /// A topic resource.
    pub fn topic(name: impl Into<String>) -> Self {
        ConfigResource::Topic(name.into())
    }

    /// A group resource.
    ///
    /// ```
    /// use kafkapipe::admin::ConfigResource;
    /// assert_eq!(ConfigResource::group("workers").name(), "workers");
    /// ```
    pub fn group(name: impl Into<String>) -> Self {
        ConfigResource::Group(name.into())
    }

    /// A broker resource.
    pub fn broker(id: i32) -> Self {
        ConfigResource::Broker(id.to_string())
    }

    pub(crate) fn wire_type(&self) -> i8 {
        match self {
            ConfigResource::Topic(_) => 2,
            ConfigResource::Broker(_) => 4,
            ConfigResource::BrokerLogger(_) => 8,
            ConfigResource::Group(_) => 32,
        }
    }

    /// The resource name.
    pub fn name(&self) -> &str {
        match self {
            ConfigResource::Topic(n)
            | ConfigResource::Broker(n)
            | ConfigResource::BrokerLogger(n)
            | ConfigResource::Group(n) => n,
        }
    }

    /// The broker that must answer for this resource, if it is a specific broker's.
    pub(crate) fn broker_id(&self) -> Option<i32> {
        match self {
            ConfigResource::Topic(_) | ConfigResource::Group(_) => None,
            ConfigResource::Broker(n) | ConfigResource::BrokerLogger(n) => n.parse().ok(),
        }
    }
}

/// Where a config value comes from (DescribeConfigs `config_source`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfigSource {
    /// Unknown (-1 or 0, or a code added after this client).
    Unknown,
    /// A dynamic per-topic config (1).
    DynamicTopic,
    /// A dynamic per-broker config (2).
    DynamicBroker,
    /// A dynamic cluster-wide default (3).
    DynamicDefaultBroker,
    /// The broker's static `server.properties` (4).
    StaticBroker,
    /// The built-in default (5).
    Default,
    /// A dynamic per-broker logger config (6).
    DynamicBrokerLogger,
    /// A client metrics or group config (7, 8).
    Other(i8),
}

impl From<i8> for ConfigSource {
    fn from(v: i8) -> Self {
        match v {
            1 => ConfigSource::DynamicTopic,
            2 => ConfigSource::DynamicBroker,
            3 => ConfigSource::DynamicDefaultBroker,
            4 => ConfigSource::StaticBroker,
            5 => ConfigSource::Default,
            6 => ConfigSource::DynamicBrokerLogger,
            -1 | 0 => ConfigSource::Unknown,
            o => ConfigSource::Other(o),
        }
    }
}

/// One config of a resource, from [`Admin::describe_configs`](super::Admin::describe_configs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigEntry {
    /// The config name.
    pub name: String,
    /// The value; `None` for sensitive configs and unset values.
    pub value: Option<String>,
    /// Whether it cannot be changed.
    pub read_only: bool,
    /// Where the value comes from.
    pub source: ConfigSource,
    /// Whether the value is sensitive (and therefore not returned).
    pub sensitive: bool,
    /// Other sources of this config, highest precedence first (the first is the value's own).
    pub synonyms: Vec<(String, Option<String>, ConfigSource)>,
    /// The documentation (DescribeConfigs v3+; tansu 0.6 sends none).
    pub documentation: Option<String>,
}

/// One change of [`Admin::incremental_alter_configs`](super::Admin::incremental_alter_configs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AlterConfigOp {
    /// Set `name` to `value`.
    Set(String, String),
    /// Remove `name` (back to its default).
    Delete(String),
    /// Append `value` to the list config `name`.
    Append(String, String),
    /// Remove `value` from the list config `name`.
    Subtract(String, String),
}

impl AlterConfigOp {
    pub(crate) fn parts(&self) -> (&str, i8, Option<&str>) {
        match self {
            AlterConfigOp::Set(n, v) => (n, 0, Some(v)),
            AlterConfigOp::Delete(n) => (n, 1, None),
            AlterConfigOp::Append(n, v) => (n, 2, Some(v)),
            AlterConfigOp::Subtract(n, v) => (n, 3, Some(v)),
        }
    }
}

/// Apply incremental `ops` to a resource's current explicitly set configs, as
/// AlterConfigs (which replaces the whole set) needs. List configs are comma separated.
pub(crate) fn apply_ops(
    mut current: Vec<(String, String)>,
    ops: &[AlterConfigOp],
) -> Vec<(String, String)> {
    for op in ops {
        let (name, _, value) = op.parts();
        let pos = current.iter().position(|(n, _)| n == name);
        match op {
            AlterConfigOp::Set(_, v) => match pos {
                Some(i) => current[i].1 = v.clone(),
                None => current.push((name.to_string(), v.clone())),
            },
            AlterConfigOp::Delete(_) => {
                if let Some(i) = pos {
                    current.remove(i);
                }
            }
            AlterConfigOp::Append(..) | AlterConfigOp::Subtract(..) => {
                let value = value.unwrap_or_default();
                let mut items: Vec<String> = pos
                    .map(|i| {
                        current[i]
                            .1
                            .split(',')
                            .filter(|s| !s.is_empty())
                            .map(str::to_string)
                            .collect()
                    })
                    .unwrap_or_default();
                if matches!(op, AlterConfigOp::Append(..)) {
                    if !items.iter().any(|s| s == value) {
                        items.push(value.to_string());
                    }
                } else {
                    items.retain(|s| s != value);
                }
                let joined = items.join(",");
                match pos {
                    Some(i) => current[i].1 = joined,
                    None => current.push((name.to_string(), joined)),
                }
            }
        }
    }
    current
}

/// A group as listed by [`Admin::list_groups`](super::Admin::list_groups).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupListing {
    /// The group id.
    pub group_id: String,
    /// The protocol type (`consumer`, `connect`, … or empty for simple groups).
    pub protocol_type: String,
    /// The state (`Stable`, `Empty`, …) when the broker reports it (ListGroups v4+).
    pub state: Option<String>,
    /// The group type (`classic`, `consumer`, …) when reported (ListGroups v5+).
    pub group_type: Option<String>,
    /// The coordinator that listed it.
    pub coordinator: i32,
}

/// A member of a described group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberDescription {
    /// The member id.
    pub member_id: String,
    /// The static member id (KIP-345), if any.
    pub group_instance_id: Option<String>,
    /// The member's client id.
    pub client_id: String,
    /// The member's host.
    pub client_host: String,
    /// The raw member metadata (for `consumer` groups, the subscription bytes).
    pub metadata: Bytes,
    /// The raw assignment.
    pub assignment: Bytes,
    /// The decoded subscription, for `consumer` groups with well-formed metadata.
    pub subscription: Option<Subscription>,
    /// The decoded assignment, for `consumer` groups with a well-formed assignment.
    pub decoded_assignment: Option<Assignment>,
}

/// A group as described by [`Admin::describe_groups`](super::Admin::describe_groups).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupDescription {
    /// The group id.
    pub group_id: String,
    /// The state (`Stable`, `Empty`, `Dead`, …).
    pub state: String,
    /// The protocol type (`consumer`, …).
    pub protocol_type: String,
    /// The chosen protocol (for consumer groups, the assignor: `range`, `cooperative-sticky`…).
    pub protocol: String,
    /// The members.
    pub members: Vec<MemberDescription>,
    /// The coordinator's broker id.
    pub coordinator: i32,
}

/// A group of the consumer protocol (KIP-848), from
/// [`Admin::describe_consumer_groups`](super::Admin::describe_consumer_groups).
///
/// ```no_run
/// # async fn demo(admin: kafkapipe::admin::Admin) -> kafkapipe::Result<()> {
/// let (_, group) = admin.describe_consumer_groups(&["my-group"]).await?.remove(0);
/// let group = group?;
/// println!("{} epoch {} assignor {}", group.state, group.group_epoch, group.assignor);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumerGroupDescription {
    /// The group id.
    pub group_id: String,
    /// The state (`Empty`, `Assigning`, `Reconciling`, `Stable`, `Dead`).
    pub state: String,
    /// The group epoch: bumped on every change of members or subscriptions.
    pub group_epoch: i32,
    /// The epoch of the target assignment.
    pub assignment_epoch: i32,
    /// The server-side assignor in use (`uniform`, `range`).
    pub assignor: String,
    /// The members.
    pub members: Vec<ConsumerGroupMemberDescription>,
    /// The coordinator's broker id.
    pub coordinator: i32,
}

/// A member of a [`ConsumerGroupDescription`] (see there for an example).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumerGroupMemberDescription {
    /// The member id.
    pub member_id: String,
    /// The static instance id, if any.
    pub instance_id: Option<String>,
    /// The rack id, if any.
    pub rack_id: Option<String>,
    /// The member epoch.
    pub member_epoch: i32,
    /// The client id.
    pub client_id: String,
    /// The client host.
    pub client_host: String,
    /// The subscribed topic names.
    pub subscribed_topics: Vec<String>,
    /// The subscribed regular expression, if any.
    pub subscribed_regex: Option<String>,
    /// The partitions the member owns, sorted.
    pub assignment: Vec<TopicPartition>,
    /// The partitions the coordinator wants it to own, sorted (equal to `assignment`
    /// once reconciled).
    pub target_assignment: Vec<TopicPartition>,
    /// Whether the member speaks the classic protocol (a classic member of a group
    /// converted to the consumer protocol); `None` if the broker does not say.
    pub classic: Option<bool>,
}

/// A committed offset of a group, from
/// [`Admin::fetch_group_offsets`](super::Admin::fetch_group_offsets).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommittedOffset {
    /// The committed offset, `-1` if none.
    pub offset: i64,
    /// The leader epoch of the committed offset, `-1` if unknown.
    pub leader_epoch: i32,
    /// The metadata string committed with it.
    pub metadata: Option<String>,
}

/// How [`Admin::fetch_group_offsets_with`](super::Admin::fetch_group_offsets_with) reads
/// a group's committed offsets (the Java admin's `ListConsumerGroupOffsetsOptions`).
///
/// ```
/// use kafkapipe::admin::OffsetFetchOptions;
/// let opts = OffsetFetchOptions::new().require_stable(true);
/// assert!(opts.require_stable);
/// assert!(!OffsetFetchOptions::default().require_stable);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct OffsetFetchOptions {
    /// Read only stable offsets (OffsetFetch v7+ `require_stable`, Java's
    /// `requireStable`; default `false`, as Java). On Kafka 4.x the coordinator then
    /// answers once everything it wrote to `__consumer_offsets` is replicated, so the
    /// answer includes every commit it acknowledged; a non-stable read is served at the
    /// offsets partition's high watermark, which on a coordinator just moved by a
    /// failover can lag the commits the previous one acknowledged (for a moment, an
    /// older offset). On older coordinators, a partition whose offsets a transaction is
    /// still committing answers `UNSTABLE_OFFSET_COMMIT` instead of the older offset;
    /// that is retried under [`Admin::with_retries`](super::Admin::with_retries).
    pub require_stable: bool,
}

impl OffsetFetchOptions {
    /// The defaults: non-stable reads.
    pub fn new() -> Self {
        OffsetFetchOptions::default()
    }

    /// Read only stable offsets (see [`OffsetFetchOptions::require_stable`]).
    pub fn require_stable(mut self, require_stable: bool) -> Self {
        self.require_stable = require_stable;
        self
    }
}

/// What [`Admin::describe_cluster`](super::Admin::describe_cluster) returns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterDescription {
    /// The cluster id, if reported.
    pub cluster_id: Option<String>,
    /// The controller's broker id (in KRaft clusters, a broker that forwards to it), `-1`
    /// if unknown.
    pub controller_id: i32,
    /// The brokers, sorted by id.
    pub brokers: Vec<Broker>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv(v: &[(&str, &str)]) -> Vec<(String, String)> {
        v.iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    }

    #[test]
    fn apply_ops_replaces_appends_and_deletes() {
        let cur = kv(&[("retention.ms", "1"), ("cleanup.policy", "delete")]);
        let ops = [
            AlterConfigOp::Set("retention.ms".into(), "2".into()),
            AlterConfigOp::Append("cleanup.policy".into(), "compact".into()),
            AlterConfigOp::Append("cleanup.policy".into(), "compact".into()),
            AlterConfigOp::Subtract("cleanup.policy".into(), "delete".into()),
            AlterConfigOp::Append(
                "follower.replication.throttled.replicas".into(),
                "0:1".into(),
            ),
            AlterConfigOp::Set("segment.ms".into(), "9".into()),
            AlterConfigOp::Delete("segment.ms".into()),
            AlterConfigOp::Delete("never.set".into()),
        ];
        assert_eq!(
            apply_ops(cur, &ops),
            kv(&[
                ("retention.ms", "2"),
                ("cleanup.policy", "compact"),
                ("follower.replication.throttled.replicas", "0:1"),
            ])
        );
    }

    #[test]
    fn offset_spec_parse() {
        assert_eq!("end".parse::<OffsetSpec>(), Ok(OffsetSpec::Latest));
        assert!("soon".parse::<OffsetSpec>().is_err());
        assert!("@x".parse::<OffsetSpec>().is_err());
        assert_eq!(OffsetSpec::Offset(3).wire_timestamp(), None);
        assert_eq!(OffsetSpec::Earliest.wire_timestamp(), Some(-2));
    }

    #[test]
    fn config_resource_brokers() {
        assert_eq!(ConfigResource::broker(3).broker_id(), Some(3));
        assert_eq!(ConfigResource::Broker(String::new()).broker_id(), None);
        assert_eq!(ConfigResource::topic("t").wire_type(), 2);
        assert_eq!(ConfigSource::from(5), ConfigSource::Default);
    }
}
