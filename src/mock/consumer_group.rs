//! The consumer group protocol of KIP-848 on the mock coordinator: ConsumerGroupHeartbeat
//! (join at member epoch 0, heartbeat, leave at -1 or -2), member epochs, a target
//! assignment computed by a sticky uniform assignor whenever the group epoch moves, and
//! each member's reconciliation towards it as Kafka's `CurrentAssignmentBuilder` does it:
//! partitions to revoke are taken away first while the member keeps its epoch, and only
//! once it stops reporting them (within its rebalance timeout, else it is fenced) does it
//! move to the new epoch; a partition still owned or being revoked by another member is
//! handed out only once released. Members are fenced (removed, their partitions freed)
//! when their session expires; OffsetCommit v9+ is checked against the member epoch
//! (`STALE_MEMBER_EPOCH`, `FENCED_MEMBER_EPOCH`, `UNKNOWN_MEMBER_ID`).
//!
//! Simplified: a static member leaving with epoch -2 leaves as with -1; regular
//! expression subscriptions and server assignors other than `uniform` behaviour are not
//! served (a regex is refused with `INVALID_REQUEST`; any assignor name assigns
//! uniformly); a group with classic members refuses KIP-848 members with
//! `INCONSISTENT_GROUP_PROTOCOL` (no online migration).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use tokio::time::Instant;

use super::State;
use crate::protocol::messages::{
    ConsumerGroupHeartbeatAssignment, ConsumerGroupHeartbeatRequest,
    ConsumerGroupHeartbeatResponse, ConsumerGroupHeartbeatResponseTopicPartitions,
};
use crate::protocol::ErrorCode;

/// A partition by topic name.
type Tp = (String, i32);

/// One KIP-848 member as the coordinator sees it.
#[derive(Debug)]
struct Member {
    epoch: i32,
    previous_epoch: i32,
    topics: Vec<String>,
    rebalance_timeout: Duration,
    last_seen: Instant,
    /// The partitions the member may own now (told in the last assignment).
    assigned: BTreeSet<Tp>,
    /// Partitions taken away that the member still reports, and until when it may.
    revoking: BTreeSet<Tp>,
    revoke_deadline: Option<Instant>,
    /// The assignment last sent, to send it again only when it changed.
    sent: Option<BTreeSet<Tp>>,
}

/// The KIP-848 side of a mock group.
#[derive(Debug, Default)]
pub(super) struct Consumers {
    group_epoch: i32,
    assignment_epoch: i32,
    target: BTreeMap<String, BTreeSet<Tp>>,
    members: BTreeMap<String, Member>,
}

impl Consumers {
    pub(super) fn member_ids(&self) -> impl Iterator<Item = &String> {
        self.members.keys()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// The member epoch of `member`, if it is in the group.
    pub(super) fn epoch(&self, member: &str) -> Option<i32> {
        self.members.get(member).map(|m| m.epoch)
    }

    fn remove(&mut self, member: &str) -> bool {
        if self.members.remove(member).is_none() {
            return false;
        }
        self.target.remove(member);
        self.group_epoch += 1;
        true
    }

    /// Fence members whose session expired or whose revocation is overdue. Returns
    /// whether any was.
    pub(super) fn expire(&mut self, now: Instant, session: Duration) -> bool {
        let gone: Vec<String> = self
            .members
            .iter()
            .filter(|(_, m)| {
                now >= m.last_seen + session || m.revoke_deadline.is_some_and(|d| now >= d)
            })
            .map(|(id, _)| id.clone())
            .collect();
        for id in &gone {
            tracing::debug!(member_id = %id, "mock coordinator fences a KIP-848 member");
            self.remove(id);
        }
        !gone.is_empty()
    }

    /// The error an OffsetCommit of `member` at `epoch` (request `version`) gets, if any.
    pub(super) fn check_commit(&self, member: &str, epoch: i32, version: i16) -> Option<ErrorCode> {
        let Some(m) = self.members.get(member) else {
            return Some(ErrorCode::UnknownMemberId);
        };
        if version < 9 {
            return Some(ErrorCode::UnsupportedVersion);
        }
        match epoch.cmp(&m.epoch) {
            std::cmp::Ordering::Greater => Some(ErrorCode::FencedMemberEpoch),
            std::cmp::Ordering::Less => Some(ErrorCode::StaleMemberEpoch),
            std::cmp::Ordering::Equal => None,
        }
    }

    /// A sticky uniform assignment of `partitions` (count per existing topic) over the
    /// members: each keeps what it had up to its fair share, the rest goes to the
    /// subscribed member with the fewest.
    fn compute_target(&mut self, partitions: &BTreeMap<String, i32>) {
        let valid = |m: &Member| -> BTreeSet<Tp> {
            m.topics
                .iter()
                .filter_map(|t| partitions.get(t).map(|n| (t, *n)))
                .flat_map(|(t, n)| (0..n).map(move |p| (t.clone(), p)))
                .collect()
        };
        let all: BTreeSet<Tp> = self.members.values().flat_map(valid).collect();
        let n = self.members.len().max(1);
        let (base, mut extras) = (all.len() / n, all.len() % n);
        let mut target: BTreeMap<String, BTreeSet<Tp>> = BTreeMap::new();
        let mut taken = BTreeSet::new();
        for (id, m) in &self.members {
            let ok = valid(m);
            let mut kept: Vec<Tp> = self
                .target
                .get(id)
                .into_iter()
                .flatten()
                .filter(|tp| ok.contains(*tp) && !taken.contains(*tp))
                .cloned()
                .collect();
            let cap = if kept.len() > base && extras > 0 {
                extras -= 1;
                base + 1
            } else {
                base
            };
            kept.truncate(cap);
            taken.extend(kept.iter().cloned());
            target.insert(id.clone(), kept.into_iter().collect());
        }
        for tp in all.difference(&taken) {
            let to = self
                .members
                .iter()
                .filter(|(_, m)| m.topics.contains(&tp.0))
                .map(|(id, _)| (target.get(id).map_or(0, BTreeSet::len), id.clone()))
                .min();
            if let Some((_, id)) = to {
                target.entry(id).or_default().insert(tp.clone());
            }
        }
        self.target = target;
        self.assignment_epoch = self.group_epoch;
    }

    /// Move `id` towards its target, given the partitions it reports owning.
    fn reconcile(&mut self, id: &str, owned: Option<&BTreeSet<Tp>>, now: Instant) {
        let target = self.target.get(id).cloned().unwrap_or_default();
        let held_by_others: BTreeSet<Tp> = self
            .members
            .iter()
            .filter(|(other, _)| other.as_str() != id)
            .flat_map(|(_, m)| m.assigned.iter().chain(m.revoking.iter()).cloned())
            .collect();
        let epoch = self.assignment_epoch;
        let Some(m) = self.members.get_mut(id) else {
            return;
        };
        if !m.revoking.is_empty() {
            if owned.is_some_and(|o| o.is_disjoint(&m.revoking)) {
                m.revoking.clear();
                m.revoke_deadline = None;
            } else {
                return;
            }
        }
        if m.epoch == epoch && m.assigned == target {
            return;
        }
        let revoke: BTreeSet<Tp> = m.assigned.difference(&target).cloned().collect();
        if !revoke.is_empty() {
            // the member keeps its epoch until it stops reporting these
            m.assigned.retain(|tp| target.contains(tp));
            m.revoking = revoke;
            m.revoke_deadline = Some(now + m.rebalance_timeout);
            return;
        }
        for tp in target.difference(&held_by_others) {
            m.assigned.insert(tp.clone());
        }
        if m.epoch != epoch {
            m.previous_epoch = m.epoch;
            m.epoch = epoch;
        }
    }
}

fn error(code: ErrorCode, message: &str) -> ConsumerGroupHeartbeatResponse {
    ConsumerGroupHeartbeatResponse {
        error_code: code.code(),
        error_message: Some(message.to_string()),
        member_epoch: -1,
        ..ConsumerGroupHeartbeatResponse::default()
    }
}

/// ConsumerGroupHeartbeat on coordinator `broker`.
pub(super) fn heartbeat(
    broker: i32,
    st: &mut State,
    req: &ConsumerGroupHeartbeatRequest,
    version: i16,
    forced: Option<ErrorCode>,
) -> ConsumerGroupHeartbeatResponse {
    if let Some(e) = forced {
        return error(e, "injected fault");
    }
    if req.group_id.is_empty() {
        return error(ErrorCode::InvalidRequest, "empty group id");
    }
    if st.coordinator(&req.group_id).map(|b| b.id) != Some(broker) {
        return error(ErrorCode::NotCoordinator, "not the coordinator");
    }
    if req.subscribed_topic_regex.is_some() {
        return error(
            ErrorCode::InvalidRequest,
            "the mock coordinator does not evaluate regular expressions",
        );
    }
    let (interval, session) = st.consumer_timeouts;
    // topic name -> (id, partition count), and id -> name
    let topics: BTreeMap<String, ([u8; 16], i32)> = st
        .topics
        .iter()
        .map(|(n, t)| {
            (
                n.clone(),
                (t.id, i32::try_from(t.partitions.len()).unwrap_or(0)),
            )
        })
        .collect();
    st.next_member_id += 1;
    let fresh = format!("mock-consumer-{}", st.next_member_id);
    let now = Instant::now();
    let g = st.groups.entry(req.group_id.clone()).or_default();
    if !g.member_ids().is_empty() && g.consumers.is_empty() {
        return error(
            ErrorCode::InconsistentGroupProtocol,
            "the group has classic members",
        );
    }
    let c = &mut g.consumers;
    c.expire(now, session);
    let id = match req.member_epoch {
        -1 | -2 => {
            c.remove(&req.member_id);
            return ConsumerGroupHeartbeatResponse {
                member_id: Some(req.member_id.clone()),
                member_epoch: req.member_epoch,
                ..ConsumerGroupHeartbeatResponse::default()
            };
        }
        0 => {
            let id = if version == 0 && req.member_id.is_empty() {
                fresh
            } else if req.member_id.is_empty() {
                return error(ErrorCode::InvalidRequest, "v1 joins with a member id");
            } else {
                req.member_id.clone()
            };
            // a member rejoining at epoch 0 starts over
            c.remove(&id);
            c.members.insert(
                id.clone(),
                Member {
                    epoch: 0,
                    previous_epoch: 0,
                    topics: Vec::new(),
                    rebalance_timeout: Duration::ZERO,
                    last_seen: now,
                    assigned: BTreeSet::new(),
                    revoking: BTreeSet::new(),
                    revoke_deadline: None,
                    sent: None,
                },
            );
            c.group_epoch += 1;
            id
        }
        e => {
            let Some(m) = c.members.get(&req.member_id) else {
                return error(ErrorCode::UnknownMemberId, "unknown member");
            };
            let owned_ok = req.topic_partitions.iter().flatten().all(|t| {
                let name = topics.iter().find(|(_, (tid, _))| *tid == t.topic_id);
                t.partitions
                    .iter()
                    .all(|p| name.is_some_and(|(n, _)| m.assigned.contains(&(n.clone(), *p))))
            });
            if e != m.epoch && !(e == m.previous_epoch && owned_ok) {
                return error(ErrorCode::FencedMemberEpoch, "fenced member epoch");
            }
            req.member_id.clone()
        }
    };
    let owned: Option<BTreeSet<Tp>> = req.topic_partitions.as_ref().map(|ts| {
        ts.iter()
            .flat_map(|t| {
                let name = topics
                    .iter()
                    .find(|(_, (tid, _))| *tid == t.topic_id)
                    .map(|(n, _)| n.clone());
                t.partitions
                    .iter()
                    .filter_map(move |p| name.clone().map(|n| (n, *p)))
            })
            .collect()
    });
    if let Some(m) = c.members.get_mut(&id) {
        m.last_seen = now;
        if req.rebalance_timeout_ms > 0 {
            m.rebalance_timeout =
                Duration::from_millis(u64::try_from(req.rebalance_timeout_ms).unwrap_or(0));
        }
        if let Some(names) = &req.subscribed_topic_names {
            let mut names = names.clone();
            names.sort();
            names.dedup();
            if names != m.topics {
                m.topics = names;
                c.group_epoch += 1;
            }
        }
    }
    if c.group_epoch > c.assignment_epoch {
        let counts = topics.iter().map(|(n, (_, k))| (n.clone(), *k)).collect();
        c.compute_target(&counts);
    }
    c.reconcile(&id, owned.as_ref(), now);
    let Some(m) = c.members.get_mut(&id) else {
        return error(ErrorCode::UnknownMemberId, "unknown member");
    };
    let send = m.sent.as_ref() != Some(&m.assigned) || owned.as_ref() != Some(&m.assigned);
    let assignment = send.then(|| {
        m.sent = Some(m.assigned.clone());
        let mut by_topic: BTreeMap<[u8; 16], Vec<i32>> = BTreeMap::new();
        for (t, p) in &m.assigned {
            if let Some((tid, _)) = topics.get(t) {
                by_topic.entry(*tid).or_default().push(*p);
            }
        }
        ConsumerGroupHeartbeatAssignment {
            topic_partitions: by_topic
                .into_iter()
                .map(
                    |(topic_id, partitions)| ConsumerGroupHeartbeatResponseTopicPartitions {
                        topic_id,
                        partitions,
                        ..Default::default()
                    },
                )
                .collect(),
            ..Default::default()
        }
    });
    ConsumerGroupHeartbeatResponse {
        member_id: Some(id),
        member_epoch: m.epoch,
        heartbeat_interval_ms: i32::try_from(interval.as_millis()).unwrap_or(i32::MAX),
        assignment,
        ..ConsumerGroupHeartbeatResponse::default()
    }
}
