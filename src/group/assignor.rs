//! Partition assignors: the [`Assignor`] trait run by the group leader, and the Java
//! client's `range` and `roundrobin` strategies with identical results.

use std::collections::BTreeMap;

use crate::protocol::consumer_protocol::Subscription;
use crate::reader::TopicPartition;

/// One member of a group as the leader sees it after JoinGroup.
///
/// ```
/// use kafkapipe::group::GroupMember;
/// use kafkapipe::protocol::consumer_protocol::Subscription;
/// let m = GroupMember {
///     member_id: "m-1".into(),
///     group_instance_id: None,
///     subscription: Subscription { topics: vec!["events".into()], ..Subscription::default() },
/// };
/// assert_eq!(m.sort_key(), "m-1");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupMember {
    /// The member id the coordinator gave the member.
    pub member_id: String,
    /// The static member id (KIP-345), if any.
    pub group_instance_id: Option<String>,
    /// The member's subscription (decoded JoinGroup metadata).
    pub subscription: Subscription,
}

impl GroupMember {
    /// The key members are ordered by (Java `MemberInfo`): the group instance id for static
    /// members, else the member id.
    pub fn sort_key(&self) -> &str {
        self.group_instance_id.as_deref().unwrap_or(&self.member_id)
    }
}

/// Members in Java's `MemberInfo` order: static members (by instance id) before dynamic
/// ones (by member id).
fn sorted(members: &[GroupMember]) -> Vec<&GroupMember> {
    let mut v: Vec<&GroupMember> = members.iter().collect();
    v.sort_by(|a, b| match (&a.group_instance_id, &b.group_instance_id) {
        (Some(x), Some(y)) => x.cmp(y),
        (Some(_), None) => std::cmp::Ordering::Less,
        (None, Some(_)) => std::cmp::Ordering::Greater,
        (None, None) => a.member_id.cmp(&b.member_id),
    });
    v
}

/// A partition assignment strategy, run by the group leader over every member's
/// subscription. Its [`name`](Assignor::name) is the protocol name offered in JoinGroup,
/// so members of other clients using the same name must compute the same kind of result.
///
/// ```
/// use std::collections::BTreeMap;
/// use kafkapipe::group::{Assignor, GroupMember, RangeAssignor};
/// use kafkapipe::protocol::consumer_protocol::Subscription;
///
/// let members: Vec<GroupMember> = ["a", "b"]
///     .iter()
///     .map(|id| GroupMember {
///         member_id: id.to_string(),
///         group_instance_id: None,
///         subscription: Subscription { topics: vec!["t".into()], ..Subscription::default() },
///     })
///     .collect();
/// let partitions = BTreeMap::from([("t".to_string(), 3)]);
/// let a = RangeAssignor.assign(&members, &partitions);
/// assert_eq!(a["a"].len(), 2);
/// assert_eq!(a["b"].len(), 1);
/// ```
pub trait Assignor: Send + Sync + std::fmt::Debug {
    /// The protocol name (Java `ConsumerPartitionAssignor.name()`), e.g. `"range"`.
    fn name(&self) -> &str;

    /// Assign `partitions` (topic → partition count, for every topic some member
    /// subscribes to that exists) to `members`. Every member id must be a key of the
    /// result (possibly with no partitions); each partition goes to at most one member.
    fn assign(
        &self,
        members: &[GroupMember],
        partitions: &BTreeMap<String, i32>,
    ) -> BTreeMap<String, Vec<TopicPartition>>;
}

fn empty(members: &[GroupMember]) -> BTreeMap<String, Vec<TopicPartition>> {
    members
        .iter()
        .map(|m| (m.member_id.clone(), Vec::new()))
        .collect()
}

/// Java's `RangeAssignor` (`"range"`, the Java and librdkafka default): per topic, the
/// subscribed members in order each take a contiguous range; the first
/// `partitions % members` take one extra.
///
/// ```
/// use kafkapipe::group::{Assignor, RangeAssignor};
/// assert_eq!(RangeAssignor.name(), "range");
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct RangeAssignor;

impl Assignor for RangeAssignor {
    fn name(&self) -> &str {
        "range"
    }

    fn assign(
        &self,
        members: &[GroupMember],
        partitions: &BTreeMap<String, i32>,
    ) -> BTreeMap<String, Vec<TopicPartition>> {
        let mut out = empty(members);
        let order = sorted(members);
        for (topic, &count) in partitions {
            let subs: Vec<&&GroupMember> = order
                .iter()
                .filter(|m| m.subscription.topics.iter().any(|t| t == topic))
                .collect();
            if subs.is_empty() || count <= 0 {
                continue;
            }
            let n = subs.len() as i32;
            let per = count / n;
            let extra = count % n;
            for (i, m) in subs.iter().enumerate() {
                let i = i as i32;
                let start = per * i + i.min(extra);
                let len = per + i32::from(i < extra);
                if let Some(v) = out.get_mut(&m.member_id) {
                    v.extend((start..start + len).map(|p| TopicPartition::new(topic, p)));
                }
            }
        }
        out
    }
}

/// Java's `RoundRobinAssignor` (`"roundrobin"`): every partition of every subscribed
/// topic, sorted by topic then partition, dealt to the members in order, skipping members
/// not subscribed to the partition's topic.
///
/// ```
/// use kafkapipe::group::{Assignor, RoundRobinAssignor};
/// assert_eq!(RoundRobinAssignor.name(), "roundrobin");
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct RoundRobinAssignor;

impl Assignor for RoundRobinAssignor {
    fn name(&self) -> &str {
        "roundrobin"
    }

    fn assign(
        &self,
        members: &[GroupMember],
        partitions: &BTreeMap<String, i32>,
    ) -> BTreeMap<String, Vec<TopicPartition>> {
        let mut out = empty(members);
        let order = sorted(members);
        if order.is_empty() {
            return out;
        }
        let mut next = 0usize;
        for (topic, &count) in partitions {
            if !order
                .iter()
                .any(|m| m.subscription.topics.iter().any(|t| t == topic))
            {
                continue;
            }
            for p in 0..count.max(0) {
                // the next member (circularly) subscribed to the topic; one exists
                for _ in 0..order.len() {
                    let m = order[next % order.len()];
                    next = (next + 1) % order.len();
                    if m.subscription.topics.iter().any(|t| t == topic) {
                        if let Some(v) = out.get_mut(&m.member_id) {
                            v.push(TopicPartition::new(topic, p));
                        }
                        break;
                    }
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(id: &str, topics: &[&str]) -> GroupMember {
        GroupMember {
            member_id: id.into(),
            group_instance_id: None,
            subscription: Subscription {
                topics: topics.iter().map(|t| t.to_string()).collect(),
                ..Subscription::default()
            },
        }
    }

    fn tps(v: &[(&str, i32)]) -> Vec<TopicPartition> {
        v.iter().map(|(t, p)| TopicPartition::new(*t, *p)).collect()
    }

    // Vectors from Apache Kafka's RangeAssignorTest / RoundRobinAssignorTest.

    #[test]
    fn range_two_consumers_one_topic_three_partitions() {
        let m = [member("consumer1", &["t1"]), member("consumer2", &["t1"])];
        let a = RangeAssignor.assign(&m, &BTreeMap::from([("t1".into(), 3)]));
        assert_eq!(a["consumer1"], tps(&[("t1", 0), ("t1", 1)]));
        assert_eq!(a["consumer2"], tps(&[("t1", 2)]));
    }

    #[test]
    fn range_two_consumers_two_topics_three_partitions() {
        // testTwoConsumersTwoTopicsSixPartitions
        let m = [
            member("consumer1", &["t1", "t2"]),
            member("consumer2", &["t1", "t2"]),
        ];
        let a = RangeAssignor.assign(&m, &BTreeMap::from([("t1".into(), 3), ("t2".into(), 3)]));
        assert_eq!(
            a["consumer1"],
            tps(&[("t1", 0), ("t1", 1), ("t2", 0), ("t2", 1)])
        );
        assert_eq!(a["consumer2"], tps(&[("t1", 2), ("t2", 2)]));
    }

    #[test]
    fn range_only_assigns_subscribed_topics_and_covers_unsubscribed_members() {
        // testMultipleConsumersMixedTopics
        let m = [
            member("consumer1", &["t1"]),
            member("consumer2", &["t1", "t2"]),
            member("consumer3", &["t1"]),
        ];
        let a = RangeAssignor.assign(&m, &BTreeMap::from([("t1".into(), 3), ("t2".into(), 2)]));
        assert_eq!(a["consumer1"], tps(&[("t1", 0)]));
        assert_eq!(a["consumer2"], tps(&[("t1", 1), ("t2", 0), ("t2", 1)]));
        assert_eq!(a["consumer3"], tps(&[("t1", 2)]));
        let none = RangeAssignor.assign(&[member("c", &["x"])], &BTreeMap::new());
        assert_eq!(none["c"], vec![]);
    }

    #[test]
    fn range_six_partitions_three_members() {
        let m = [
            member("c", &["t"]),
            member("a", &["t"]),
            member("b", &["t"]),
        ];
        let a = RangeAssignor.assign(&m, &BTreeMap::from([("t".into(), 6)]));
        assert_eq!(a["a"], tps(&[("t", 0), ("t", 1)]));
        assert_eq!(a["b"], tps(&[("t", 2), ("t", 3)]));
        assert_eq!(a["c"], tps(&[("t", 4), ("t", 5)]));
    }

    #[test]
    fn range_static_members_sorted_by_instance_id() {
        let mut m = [member("z-dynamic", &["t"]), member("a-dynamic", &["t"])];
        m[0].group_instance_id = Some("i1".into());
        let a = RangeAssignor.assign(&m, &BTreeMap::from([("t".into(), 3)]));
        assert_eq!(a["z-dynamic"], tps(&[("t", 0), ("t", 1)]));
        assert_eq!(a["a-dynamic"], tps(&[("t", 2)]));
    }

    #[test]
    fn roundrobin_two_consumers_two_topics() {
        // testTwoConsumersTwoTopicsSixPartitions
        let m = [
            member("consumer1", &["t1", "t2"]),
            member("consumer2", &["t1", "t2"]),
        ];
        let a =
            RoundRobinAssignor.assign(&m, &BTreeMap::from([("t1".into(), 3), ("t2".into(), 3)]));
        assert_eq!(a["consumer1"], tps(&[("t1", 0), ("t1", 2), ("t2", 1)]));
        assert_eq!(a["consumer2"], tps(&[("t1", 1), ("t2", 0), ("t2", 2)]));
    }

    #[test]
    fn roundrobin_mixed_subscriptions() {
        // testMultipleConsumersMixedTopics
        let m = [
            member("consumer1", &["t1"]),
            member("consumer2", &["t1", "t2"]),
            member("consumer3", &["t1"]),
        ];
        let a =
            RoundRobinAssignor.assign(&m, &BTreeMap::from([("t1".into(), 3), ("t2".into(), 2)]));
        assert_eq!(a["consumer1"], tps(&[("t1", 0)]));
        assert_eq!(a["consumer2"], tps(&[("t1", 1), ("t2", 0), ("t2", 1)]));
        assert_eq!(a["consumer3"], tps(&[("t1", 2)]));
    }

    #[test]
    fn every_partition_assigned_exactly_once() {
        let m: Vec<GroupMember> = (0..5)
            .map(|i| member(&format!("m{i}"), &["a", "b"]))
            .collect();
        let parts = BTreeMap::from([("a".into(), 7), ("b".into(), 3)]);
        for assignor in [&RangeAssignor as &dyn Assignor, &RoundRobinAssignor] {
            let a = assignor.assign(&m, &parts);
            let mut all: Vec<TopicPartition> = a.values().flatten().cloned().collect();
            all.sort();
            let before = all.len();
            all.dedup();
            assert_eq!(before, 10);
            assert_eq!(all.len(), 10);
        }
    }
}
