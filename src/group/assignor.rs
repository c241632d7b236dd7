//! Partition assignors: the [`Assignor`] trait run by the group leader, the Java
//! client's `range` and `roundrobin` strategies with identical results, and
//! `cooperative-sticky` (KIP-429 incremental rebalancing).

use std::collections::{BTreeMap, BTreeSet};

use crate::common::TopicPartition;
use crate::protocol::consumer_protocol::Subscription;

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

    /// The rebalance protocol the assignor supports (Java
    /// `ConsumerPartitionAssignor.supportedProtocols()`, newest only). A reader uses the
    /// incremental protocol only if every assignor it offers is
    /// [`Cooperative`](RebalanceProtocol::Cooperative). Default: eager.
    fn protocol(&self) -> RebalanceProtocol {
        RebalanceProtocol::Eager
    }

    /// Assign `partitions` (topic → partition count, for every topic some member
    /// subscribes to that exists) to `members`. Every member id must be a key of the
    /// result (possibly with no partitions); each partition goes to at most one member.
    fn assign(
        &self,
        members: &[GroupMember],
        partitions: &BTreeMap<String, i32>,
    ) -> BTreeMap<String, Vec<TopicPartition>>;
}

/// How a member gives up partitions in a rebalance.
///
/// ```
/// use kafkapipe::group::{Assignor, CooperativeStickyAssignor, RangeAssignor, RebalanceProtocol};
/// assert_eq!(RangeAssignor.protocol(), RebalanceProtocol::Eager);
/// assert_eq!(CooperativeStickyAssignor.protocol(), RebalanceProtocol::Cooperative);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RebalanceProtocol {
    /// Every member gives up all its partitions before it rejoins.
    Eager,
    /// KIP-429: members keep their partitions while they rejoin; only the partitions the
    /// new assignment takes away are given up, and the assignor never hands a partition
    /// to a new owner in the generation its old owner still holds it.
    Cooperative,
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

/// Java's `CooperativeStickyAssignor` (`"cooperative-sticky"`, KIP-429): a balanced
/// assignment that keeps as many partitions as possible with their current owners, for
/// the incremental rebalance protocol.
///
/// Members report the partitions they own and their generation in their subscription
/// (ConsumerProtocol v1+). Claims of a generation older than the newest one reported are
/// ignored (the member was out of the group), as are partitions claimed twice in the same
/// generation. The assignment is computed like Java's constrained sticky assignment: each
/// member keeps its owned partitions up to its quota (`partitions / members`, one more
/// for the first `partitions % members` members that own that many), then the free
/// partitions are dealt round-robin (in topic, partition order) to the members below
/// the lower quota, then one each to members still below the upper quota. Finally, as in
/// Java's `adjustAssignment`, a partition that moves from one owner to another is
/// withheld: its old owner sees it missing, revokes it (committing its offsets) and
/// rejoins, and the following rebalance hands it to its new owner.
///
/// Members subscribed to different topic sets are supported by a simpler rule than
/// Java's general sticky algorithm: each keeps its owned partitions up to the quota of
/// the members sharing its topics, and free partitions go to the subscribed member with
/// the fewest partitions, so results may differ from Java's there.
///
/// ```
/// use std::collections::BTreeMap;
/// use kafkapipe::group::{Assignor, CooperativeStickyAssignor, GroupMember};
/// use kafkapipe::protocol::consumer_protocol::{Subscription, TopicPartitions};
///
/// let sub = |owned: Vec<i32>| Subscription {
///     version: 2,
///     topics: vec!["t".into()],
///     owned_partitions: vec![TopicPartitions { topic: "t".into(), partitions: owned }],
///     generation_id: 1,
///     ..Subscription::default()
/// };
/// // "a" owns all 4 partitions; "b" has just joined.
/// let members = vec![
///     GroupMember { member_id: "a".into(), group_instance_id: None, subscription: sub(vec![0, 1, 2, 3]) },
///     GroupMember { member_id: "b".into(), group_instance_id: None, subscription: sub(vec![]) },
/// ];
/// let a = CooperativeStickyAssignor.assign(&members, &BTreeMap::from([("t".to_string(), 4)]));
/// // "a" keeps two and gives up two; "b" gets them in the next rebalance.
/// assert_eq!(a["a"].len(), 2);
/// assert!(a["b"].is_empty());
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct CooperativeStickyAssignor;

impl CooperativeStickyAssignor {
    /// The sticky, balanced assignment before withholding moved partitions, and the
    /// valid previous owner of each partition.
    fn sticky(
        members: &[GroupMember],
        partitions: &BTreeMap<String, i32>,
    ) -> (
        BTreeMap<String, Vec<TopicPartition>>,
        BTreeMap<TopicPartition, String>,
    ) {
        let order = sorted(members);
        let subscribed =
            |m: &GroupMember, topic: &str| m.subscription.topics.iter().any(|t| t == topic);
        let exists = |tp: &TopicPartition| {
            partitions
                .get(&tp.topic)
                .is_some_and(|&n| tp.partition >= 0 && tp.partition < n)
        };
        // Valid previous owners: the newest generation wins; a partition claimed twice in
        // that generation has no valid owner.
        let mut claims: BTreeMap<TopicPartition, (i32, Option<&str>)> = BTreeMap::new();
        for m in &order {
            let generation = m.subscription.generation_id;
            for t in &m.subscription.owned_partitions {
                for &p in &t.partitions {
                    let tp = TopicPartition::new(&t.topic, p);
                    if !exists(&tp) || !subscribed(m, &t.topic) {
                        continue;
                    }
                    match claims.get_mut(&tp) {
                        None => {
                            claims.insert(tp, (generation, Some(&m.member_id)));
                        }
                        Some(c) if generation > c.0 => *c = (generation, Some(&m.member_id)),
                        Some(c) if generation == c.0 && c.1 != Some(m.member_id.as_str()) => {
                            c.1 = None
                        }
                        Some(_) => {}
                    }
                }
            }
        }
        let owners: BTreeMap<TopicPartition, String> = claims
            .into_iter()
            .filter_map(|(tp, (_, m))| m.map(|m| (tp, m.to_string())))
            .collect();

        let mut out = empty(members);
        // every assignable partition, in topic, partition order
        let all: Vec<TopicPartition> = partitions
            .iter()
            .filter(|(t, _)| order.iter().any(|m| subscribed(m, t)))
            .flat_map(|(t, &n)| (0..n.max(0)).map(move |p| TopicPartition::new(t, p)))
            .collect();
        // Quotas: members sharing a topic set split its partitions evenly.
        let topic_set = |m: &GroupMember| -> BTreeSet<String> {
            m.subscription
                .topics
                .iter()
                .filter(|t| partitions.contains_key(*t))
                .cloned()
                .collect()
        };
        let mut groups: BTreeMap<BTreeSet<String>, Vec<&GroupMember>> = BTreeMap::new();
        for m in &order {
            groups.entry(topic_set(m)).or_default().push(m);
        }
        let mut quota: BTreeMap<&str, usize> = BTreeMap::new();
        let mut taken: BTreeSet<TopicPartition> = BTreeSet::new();
        for (topics, ms) in &groups {
            let n: usize = topics
                .iter()
                .map(|t| partitions.get(t).copied().unwrap_or(0).max(0) as usize)
                .sum();
            let min = n / ms.len();
            let mut over = n % ms.len();
            // Members owning the most keep the extra partitions (stable: sorted order).
            let mut by_owned: Vec<(&GroupMember, Vec<TopicPartition>)> = ms
                .iter()
                .map(|m| {
                    let mine: Vec<TopicPartition> = owners
                        .iter()
                        .filter(|(_, o)| **o == m.member_id)
                        .map(|(tp, _)| tp.clone())
                        .collect();
                    (*m, mine)
                })
                .collect();
            by_owned.sort_by_key(|(_, mine)| std::cmp::Reverse(mine.len()));
            for (m, mine) in by_owned {
                let q = if mine.len() > min && over > 0 {
                    over -= 1;
                    min + 1
                } else {
                    min
                };
                quota.insert(m.member_id.as_str(), q);
                if let Some(v) = out.get_mut(&m.member_id) {
                    for tp in mine.into_iter().take(q) {
                        taken.insert(tp.clone());
                        v.push(tp);
                    }
                }
            }
            // The rest of the extra slots go to members in sorted order.
            for m in ms {
                if over == 0 {
                    break;
                }
                if let Some(q) = quota.get_mut(m.member_id.as_str()) {
                    if *q == min {
                        *q += 1;
                        over -= 1;
                    }
                }
            }
        }
        // Deal the free partitions: round-robin over members below their lower quota
        // first (Java's unfilled members), then to the member with the fewest.
        let free: Vec<TopicPartition> = all.into_iter().filter(|tp| !taken.contains(tp)).collect();
        let mut cursor = 0usize;
        for tp in free {
            let eligible: Vec<&&GroupMember> =
                order.iter().filter(|m| subscribed(m, &tp.topic)).collect();
            if eligible.is_empty() {
                continue;
            }
            let count = |m: &GroupMember| out.get(&m.member_id).map_or(0, Vec::len);
            let room =
                |m: &GroupMember| count(m) < quota.get(m.member_id.as_str()).copied().unwrap_or(0);
            // the next eligible member (circularly) with room, else the least loaded
            let mut pick = None;
            for i in 0..eligible.len() {
                let m = eligible[(cursor + i) % eligible.len()];
                if room(m) {
                    pick = Some(m);
                    cursor = (cursor + i + 1) % eligible.len();
                    break;
                }
            }
            let pick = pick.or_else(|| eligible.iter().copied().min_by_key(|m| count(m)));
            if let Some(m) = pick {
                if let Some(v) = out.get_mut(&m.member_id) {
                    v.push(tp);
                }
            }
        }
        for v in out.values_mut() {
            v.sort();
        }
        (out, owners)
    }
}

impl Assignor for CooperativeStickyAssignor {
    fn name(&self) -> &str {
        "cooperative-sticky"
    }

    fn protocol(&self) -> RebalanceProtocol {
        RebalanceProtocol::Cooperative
    }

    fn assign(
        &self,
        members: &[GroupMember],
        partitions: &BTreeMap<String, i32>,
    ) -> BTreeMap<String, Vec<TopicPartition>> {
        let (mut out, owners) = Self::sticky(members, partitions);
        // Withhold partitions whose owner changes (KIP-429): the old owner revokes first.
        for (member, v) in out.iter_mut() {
            v.retain(|tp| owners.get(tp).is_none_or(|o| o == member));
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

    fn owning(id: &str, topics: &[&str], generation: i32, owned: &[(&str, i32)]) -> GroupMember {
        let mut m = member(id, topics);
        m.subscription.version = 2;
        m.subscription.generation_id = generation;
        let mut by_topic: BTreeMap<&str, Vec<i32>> = BTreeMap::new();
        for (t, p) in owned {
            by_topic.entry(t).or_default().push(*p);
        }
        m.subscription.owned_partitions = by_topic
            .into_iter()
            .map(
                |(t, partitions)| crate::protocol::consumer_protocol::TopicPartitions {
                    topic: t.into(),
                    partitions,
                },
            )
            .collect();
        m
    }

    #[test]
    fn cooperative_first_assignment_matches_java() {
        // AbstractStickyAssignorTest.testTwoConsumersOneTopicTwoPartitions and the
        // round-robin fill of the constrained assignment for three partitions.
        let m = [member("consumer1", &["t"]), member("consumer2", &["t"])];
        let a = CooperativeStickyAssignor.assign(&m, &BTreeMap::from([("t".into(), 2)]));
        assert_eq!(a["consumer1"], tps(&[("t", 0)]));
        assert_eq!(a["consumer2"], tps(&[("t", 1)]));
        let a = CooperativeStickyAssignor.assign(&m, &BTreeMap::from([("t".into(), 3)]));
        assert_eq!(a["consumer1"], tps(&[("t", 0), ("t", 2)]));
        assert_eq!(a["consumer2"], tps(&[("t", 1)]));
        // testOneConsumerNonexistentTopic / no members
        let a = CooperativeStickyAssignor.assign(&[member("c", &["x"])], &BTreeMap::new());
        assert_eq!(a["c"], vec![]);
        assert_eq!(CooperativeStickyAssignor.name(), "cooperative-sticky");
    }

    #[test]
    fn cooperative_withholds_moving_partitions_then_hands_them_over() {
        let parts = BTreeMap::from([("t".into(), 6)]);
        let all: Vec<(&str, i32)> = (0..6).map(|p| ("t", p)).collect();
        // a owns everything, b joins: a keeps half, the other half is withheld.
        let m = [owning("a", &["t"], 1, &all), owning("b", &["t"], -1, &[])];
        let r = CooperativeStickyAssignor.assign(&m, &parts);
        assert_eq!(r["a"], tps(&[("t", 0), ("t", 1), ("t", 2)]));
        assert_eq!(r["b"], vec![]);
        // a revoked 3..5 and rejoins: they go to b, a's partitions stay.
        let m = [
            owning("a", &["t"], 2, &[("t", 0), ("t", 1), ("t", 2)]),
            owning("b", &["t"], 2, &[]),
        ];
        let r = CooperativeStickyAssignor.assign(&m, &parts);
        assert_eq!(r["a"], tps(&[("t", 0), ("t", 1), ("t", 2)]));
        assert_eq!(r["b"], tps(&[("t", 3), ("t", 4), ("t", 5)]));
    }

    #[test]
    fn cooperative_is_sticky_when_a_member_joins_or_leaves() {
        let parts = BTreeMap::from([("t".into(), 6)]);
        // a: 0,2,4 and b: 1,3,5 (non-contiguous); c joins.
        let m = [
            owning("a", &["t"], 3, &[("t", 0), ("t", 2), ("t", 4)]),
            owning("b", &["t"], 3, &[("t", 1), ("t", 3), ("t", 5)]),
            owning("c", &["t"], -1, &[]),
        ];
        let r = CooperativeStickyAssignor.assign(&m, &parts);
        assert_eq!(r["a"], tps(&[("t", 0), ("t", 2)]));
        assert_eq!(r["b"], tps(&[("t", 1), ("t", 3)]));
        assert_eq!(r["c"], vec![]); // 4 and 5 are withheld until a and b revoke them
        let (pre, _) = CooperativeStickyAssignor::sticky(&m, &parts);
        assert_eq!(pre["c"], tps(&[("t", 4), ("t", 5)]));
        // b leaves: a keeps its partitions and takes b's (free, so nothing is withheld).
        let m = [owning("a", &["t"], 3, &[("t", 0), ("t", 2), ("t", 4)])];
        let r = CooperativeStickyAssignor.assign(&m, &parts);
        assert_eq!(r["a"].len(), 6);
    }

    #[test]
    fn cooperative_balance_and_exclusivity() {
        let parts = BTreeMap::from([("a".into(), 7), ("b".into(), 3)]);
        // skewed ownership: m0 owns everything of "a"
        let owned: Vec<(&str, i32)> = (0..7).map(|p| ("a", p)).collect();
        let mut m = vec![owning("m0", &["a", "b"], 4, &owned)];
        for i in 1..4 {
            m.push(owning(&format!("m{i}"), &["a", "b"], 4, &[]));
        }
        let (pre, _) = CooperativeStickyAssignor::sticky(&m, &parts);
        let sizes: Vec<usize> = pre.values().map(Vec::len).collect();
        assert_eq!(sizes.iter().sum::<usize>(), 10);
        assert!(sizes.iter().all(|&n| n == 2 || n == 3), "{sizes:?}");
        // m0 keeps 3 of its own
        assert_eq!(pre["m0"], tps(&[("a", 0), ("a", 1), ("a", 2)]));
        let r = CooperativeStickyAssignor.assign(&m, &parts);
        let mut all: Vec<TopicPartition> = r.values().flatten().cloned().collect();
        all.sort();
        let n = all.len();
        all.dedup();
        assert_eq!(n, all.len());
        // a3..a6 move away from m0, so they are withheld; everything else is assigned
        assert_eq!(n, 6);
        assert!(!all.iter().any(|tp| tp.topic == "a" && tp.partition >= 3));
    }

    #[test]
    fn cooperative_ignores_stale_and_conflicting_claims() {
        let parts = BTreeMap::from([("t".into(), 2)]);
        // b claims 0 with an older generation (it was out of the group): a's claim wins
        // and b gets a free partition instead.
        let m = [
            owning("a", &["t"], 5, &[("t", 0)]),
            owning("b", &["t"], 4, &[("t", 0)]),
        ];
        let r = CooperativeStickyAssignor.assign(&m, &parts);
        assert_eq!(r["a"], tps(&[("t", 0)]));
        assert_eq!(r["b"], tps(&[("t", 1)]));
        // the same generation claimed twice: no valid owner, nothing withheld
        let m = [
            owning("a", &["t"], 5, &[("t", 0), ("t", 1)]),
            owning("b", &["t"], 5, &[("t", 1)]),
        ];
        let r = CooperativeStickyAssignor.assign(&m, &parts);
        assert_eq!(r["a"], tps(&[("t", 0)]));
        assert_eq!(r["b"], tps(&[("t", 1)]));
        // partitions of topics that are gone or not subscribed are dropped
        let m = [owning("a", &["t"], 1, &[("t", 9), ("gone", 0)])];
        let r = CooperativeStickyAssignor.assign(&m, &parts);
        assert_eq!(r["a"], tps(&[("t", 0), ("t", 1)]));
    }
}
