//! The classic group protocol on the mock coordinator: JoinGroup with a join barrier
//! (the rebalance completes when every member has rejoined, or at the rebalance timeout
//! without the missing ones), SyncGroup, Heartbeat, LeaveGroup, session expiry, and
//! the group's committed offsets.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::time::Instant;

use super::handlers::{parse, reply};
use super::{Shared, State};
use crate::error::{Error, Result};
use crate::protocol::messages::offset_fetch::OffsetFetchResponsePartition;
use crate::protocol::messages::offset_fetch::OffsetFetchResponseTopic;
use crate::protocol::messages::offset_fetch::{OffsetFetchRequest, OffsetFetchResponse};
use crate::protocol::messages::*;
use crate::protocol::{ApiKey, ErrorCode};

/// How often waiting requests and the reaper re-check timeouts.
const POLL: Duration = Duration::from_millis(50);

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum Phase {
    #[default]
    Empty,
    Preparing,
    Completing,
    Stable,
}

#[derive(Debug)]
struct Member {
    instance_id: Option<String>,
    protocols: Vec<(String, Bytes)>,
    session_timeout: Duration,
    rebalance_timeout: Duration,
    last_seen: Instant,
    /// Rejoined in the current rebalance.
    joined: bool,
    /// A JoinGroup of this member is waiting at the barrier.
    waiting: bool,
    /// The generation this member was last admitted to.
    generation: i32,
    assignment: Option<Bytes>,
}

#[derive(Debug, Default)]
pub(super) struct Group {
    generation: i32,
    phase: Phase,
    protocol_type: Option<String>,
    protocol: Option<String>,
    leader: String,
    members: BTreeMap<String, Member>,
    /// Member ids handed out with MEMBER_ID_REQUIRED, not joined yet.
    pending: HashSet<String>,
    rebalance_deadline: Option<Instant>,
    offsets: HashMap<(String, i32), (i64, Option<String>)>,
    /// The group's KIP-848 members (a group has classic members or these, not both).
    pub(super) consumers: super::consumer_group::Consumers,
    /// The committed leader epochs (KIP-320), where one was committed.
    epochs: HashMap<(String, i32), i32>,
}

impl Group {
    pub fn committed(&self, topic: &str, partition: i32) -> Option<i64> {
        self.offsets
            .get(&(topic.to_string(), partition))
            .map(|o| o.0)
    }

    /// Store a committed offset (a transaction's, when it commits).
    pub fn commit(&mut self, topic: String, partition: i32, offset: i64, metadata: Option<String>) {
        self.epochs.remove(&(topic.clone(), partition));
        self.offsets.insert((topic, partition), (offset, metadata));
    }

    pub fn member_ids(&self) -> Vec<String> {
        self.members
            .keys()
            .chain(self.consumers.member_ids())
            .cloned()
            .collect()
    }

    /// The group as DescribeGroups reports it.
    pub fn describe(&self) -> DescribedGroup {
        let state = match self.phase {
            Phase::Empty => "Empty",
            Phase::Preparing => "PreparingRebalance",
            Phase::Completing => "CompletingRebalance",
            Phase::Stable => "Stable",
        };
        DescribedGroup {
            group_state: state.to_string(),
            protocol_type: self.protocol_type.clone().unwrap_or_default(),
            protocol_data: self.protocol.clone().unwrap_or_default(),
            members: self
                .members
                .iter()
                .map(|(id, m)| DescribedGroupMember {
                    member_id: id.clone(),
                    group_instance_id: m.instance_id.clone(),
                    member_metadata: self
                        .protocol
                        .as_ref()
                        .and_then(|p| m.protocols.iter().find(|(n, _)| n == p))
                        .map(|(_, md)| md.clone())
                        .unwrap_or_default(),
                    member_assignment: m.assignment.clone().unwrap_or_default(),
                    ..DescribedGroupMember::default()
                })
                .collect(),
            ..DescribedGroup::default()
        }
    }

    /// Start a rebalance (unless one is under way): every member must rejoin within the
    /// largest rebalance timeout.
    fn prepare(&mut self, now: Instant) {
        if self.phase == Phase::Preparing {
            return;
        }
        self.phase = Phase::Preparing;
        for m in self.members.values_mut() {
            m.joined = m.waiting;
        }
        let timeout = self
            .members
            .values()
            .map(|m| m.rebalance_timeout)
            .max()
            .unwrap_or(Duration::ZERO);
        self.rebalance_deadline = Some(now + timeout);
    }

    /// Complete the rebalance if everyone rejoined or the timeout passed. Returns whether
    /// anything changed.
    fn try_complete(&mut self, now: Instant) -> bool {
        if self.phase != Phase::Preparing {
            return false;
        }
        let all = self.members.values().all(|m| m.joined);
        let late = self.rebalance_deadline.is_some_and(|d| now >= d);
        if !all && !late {
            return false;
        }
        self.members.retain(|_, m| m.joined);
        if self.members.is_empty() {
            self.phase = Phase::Empty;
            self.generation = self.generation.wrapping_add(1);
            self.protocol = None;
            self.leader.clear();
            return true;
        }
        self.generation = self.generation.wrapping_add(1);
        // The first protocol of the leader's that every member supports.
        if !self.members.contains_key(&self.leader) {
            self.leader = self.members.keys().next().cloned().unwrap_or_default();
        }
        self.protocol = self.members.get(&self.leader).and_then(|l| {
            l.protocols
                .iter()
                .map(|(n, _)| n)
                .find(|n| {
                    self.members
                        .values()
                        .all(|m| m.protocols.iter().any(|(p, _)| p == *n))
                })
                .cloned()
        });
        for m in self.members.values_mut() {
            m.generation = self.generation;
            m.assignment = None;
            m.last_seen = now;
            // Admitted: its JoinGroup answers next (or its connection is gone, and the
            // session timeout applies again).
            m.waiting = false;
        }
        self.phase = Phase::Completing;
        true
    }

    /// Remove members whose session expired (members waiting at the barrier are alive).
    fn expire(&mut self, now: Instant) -> bool {
        let before = self.members.len();
        self.members
            .retain(|_, m| m.waiting || now < m.last_seen + m.session_timeout);
        if self.members.len() == before {
            return false;
        }
        if self.members.is_empty() {
            self.phase = Phase::Empty;
        } else {
            self.prepare(now);
        }
        true
    }

    fn remove(&mut self, member: &str, now: Instant) -> bool {
        if self.members.remove(member).is_none() {
            return false;
        }
        if self.members.is_empty() && self.phase != Phase::Preparing {
            self.phase = Phase::Empty;
        } else {
            self.prepare(now);
        }
        true
    }

    /// Can `member` act in `generation`?
    fn check(&self, member: &str, generation: i32) -> Option<ErrorCode> {
        if !self.members.contains_key(member) {
            Some(ErrorCode::UnknownMemberId)
        } else if generation != self.generation {
            Some(ErrorCode::IllegalGeneration)
        } else {
            None
        }
    }
}

/// Expire members and finish rebalances whose timeout passed, for as long as the
/// cluster lives.
pub(super) async fn reaper(shared: Arc<Shared>) {
    loop {
        tokio::time::sleep(POLL).await;
        let now = Instant::now();
        let mut changed = false;
        {
            let mut st = shared.lock();
            let session = st.consumer_timeouts.1;
            for g in st.groups.values_mut() {
                changed |= g.consumers.expire(now, session);
                changed |= g.expire(now);
                changed |= g.try_complete(now);
            }
        }
        if changed {
            shared.changed();
        }
    }
}

/// Whether broker `id` coordinates `group`.
fn coordinates(st: &State, id: i32, group: &str) -> bool {
    st.coordinator(group).is_some_and(|b| b.id == id)
}

pub(super) async fn handle(
    id: i32,
    shared: &Shared,
    api: ApiKey,
    version: i16,
    frame: Bytes,
    forced: Option<ErrorCode>,
) -> Result<Option<BytesMut>> {
    match api {
        ApiKey::JOIN_GROUP => {
            let (c, r) = parse::<JoinGroupRequest>(frame, version)?;
            let resp = join(id, shared, &r, version, forced).await;
            reply::<JoinGroupRequest>(c, version, &resp)
        }
        ApiKey::SYNC_GROUP => {
            let (c, r) = parse::<SyncGroupRequest>(frame, version)?;
            let resp = sync(id, shared, &r, forced).await;
            reply::<SyncGroupRequest>(c, version, &resp)
        }
        ApiKey::HEARTBEAT => {
            let (c, r) = parse::<HeartbeatRequest>(frame, version)?;
            let resp = heartbeat(id, &mut shared.lock(), &r, forced);
            reply::<HeartbeatRequest>(c, version, &resp)
        }
        ApiKey::LEAVE_GROUP => {
            let (c, r) = parse::<LeaveGroupRequest>(frame, version)?;
            let resp = leave(id, &mut shared.lock(), &r, forced);
            shared.changed();
            reply::<LeaveGroupRequest>(c, version, &resp)
        }
        ApiKey::OFFSET_COMMIT => {
            let (c, r) = parse::<OffsetCommitRequest>(frame, version)?;
            let resp = offset_commit(id, &mut shared.lock(), &r, version, forced);
            reply::<OffsetCommitRequest>(c, version, &resp)
        }
        ApiKey::OFFSET_FETCH => {
            let (c, r) = parse::<OffsetFetchRequest>(frame, version)?;
            let resp = offset_fetch(id, &mut shared.lock(), &r, forced);
            reply::<OffsetFetchRequest>(c, version, &resp)
        }
        other => Err(Error::protocol(format!("not a group API: {other}"))),
    }
}

fn join_error(e: ErrorCode, member_id: &str) -> JoinGroupResponse {
    JoinGroupResponse {
        error_code: e.code(),
        generation_id: -1,
        member_id: member_id.to_string(),
        ..JoinGroupResponse::default()
    }
}

/// The join's first step under the lock: register the member, or answer at once.
fn join_enter(
    id: i32,
    st: &mut State,
    req: &JoinGroupRequest,
    version: i16,
    forced: Option<ErrorCode>,
) -> std::result::Result<String, (ErrorCode, String)> {
    if let Some(e) = forced {
        return Err((e, req.member_id.clone()));
    }
    if req.group_id.is_empty() {
        return Err((ErrorCode::InvalidGroupId, req.member_id.clone()));
    }
    if !coordinates(st, id, &req.group_id) {
        return Err((ErrorCode::NotCoordinator, req.member_id.clone()));
    }
    let session = u64::try_from(req.session_timeout_ms).unwrap_or(0);
    if !(1..=3_600_000).contains(&session) {
        return Err((ErrorCode::InvalidSessionTimeout, req.member_id.clone()));
    }
    st.next_member_id += 1;
    let fresh = format!("mock-member-{}", st.next_member_id);
    let now = Instant::now();
    let g = st.groups.entry(req.group_id.clone()).or_default();
    let others_compatible = g.members.iter().all(|(mid, m)| {
        *mid == req.member_id
            || req
                .protocols
                .iter()
                .any(|p| m.protocols.iter().any(|(n, _)| *n == p.name))
    });
    let type_ok =
        g.members.is_empty() || g.protocol_type.as_deref() == Some(req.protocol_type.as_str());
    if req.protocols.is_empty() || !others_compatible || !type_ok {
        return Err((ErrorCode::InconsistentGroupProtocol, req.member_id.clone()));
    }
    let member_id = if req.member_id.is_empty() {
        if version >= 4 {
            g.pending.insert(fresh.clone());
            return Err((ErrorCode::MemberIdRequired, fresh));
        }
        fresh
    } else if g.members.contains_key(&req.member_id) || g.pending.remove(&req.member_id) {
        req.member_id.clone()
    } else {
        return Err((ErrorCode::UnknownMemberId, req.member_id.clone()));
    };
    if g.members.is_empty() {
        g.protocol_type = Some(req.protocol_type.clone());
    }
    let rebalance = u64::try_from(req.rebalance_timeout_ms)
        .ok()
        .filter(|r| *r > 0)
        .unwrap_or(session);
    g.prepare(now);
    g.members.insert(
        member_id.clone(),
        Member {
            instance_id: req.group_instance_id.clone(),
            protocols: req
                .protocols
                .iter()
                .map(|p| (p.name.clone(), p.metadata.clone()))
                .collect(),
            session_timeout: Duration::from_millis(session),
            rebalance_timeout: Duration::from_millis(rebalance),
            last_seen: now,
            joined: true,
            waiting: true,
            generation: -1,
            assignment: None,
        },
    );
    if g.rebalance_deadline.is_none() {
        g.rebalance_deadline = Some(now + Duration::from_millis(rebalance));
    }
    Ok(member_id)
}

/// JoinGroup: register, then wait at the barrier until the rebalance completes.
async fn join(
    id: i32,
    shared: &Shared,
    req: &JoinGroupRequest,
    version: i16,
    forced: Option<ErrorCode>,
) -> JoinGroupResponse {
    let mut tick = shared.tick.subscribe();
    let member_id = match join_enter(id, &mut shared.lock(), req, version, forced) {
        Ok(m) => m,
        Err((e, member_id)) => return join_error(e, &member_id),
    };
    shared.changed();
    loop {
        tick.borrow_and_update();
        let now = Instant::now();
        let (done, changed) = {
            let mut st = shared.lock();
            let Some(g) = st.groups.get_mut(&req.group_id) else {
                return join_error(ErrorCode::UnknownMemberId, &member_id);
            };
            let changed = g.try_complete(now);
            let done = match g.members.get_mut(&member_id) {
                None => Some(join_error(ErrorCode::UnknownMemberId, &member_id)),
                Some(m) if g.phase != Phase::Preparing && m.generation == g.generation => {
                    m.waiting = false;
                    m.last_seen = now;
                    let members = if g.leader == member_id {
                        g.members
                            .iter()
                            .map(|(mid, m)| JoinGroupResponseMember {
                                member_id: mid.clone(),
                                group_instance_id: m.instance_id.clone(),
                                metadata: g
                                    .protocol
                                    .as_ref()
                                    .and_then(|p| m.protocols.iter().find(|(n, _)| n == p))
                                    .map(|(_, md)| md.clone())
                                    .unwrap_or_default(),
                                ..JoinGroupResponseMember::default()
                            })
                            .collect()
                    } else {
                        Vec::new()
                    };
                    Some(JoinGroupResponse {
                        generation_id: g.generation,
                        protocol_type: g.protocol_type.clone(),
                        protocol_name: g.protocol.clone(),
                        leader: g.leader.clone(),
                        member_id: member_id.clone(),
                        members,
                        ..JoinGroupResponse::default()
                    })
                }
                Some(m) => {
                    m.last_seen = now;
                    None
                }
            };
            (done, changed)
        };
        if changed {
            shared.changed();
        }
        if let Some(resp) = done {
            return resp;
        }
        tokio::select! {
            _ = tick.changed() => {}
            _ = tokio::time::sleep(POLL) => {}
        }
    }
}

fn sync_error(e: ErrorCode) -> SyncGroupResponse {
    SyncGroupResponse {
        error_code: e.code(),
        ..SyncGroupResponse::default()
    }
}

/// SyncGroup: the leader's assignments complete the rebalance; every member waits for
/// them.
async fn sync(
    id: i32,
    shared: &Shared,
    req: &SyncGroupRequest,
    forced: Option<ErrorCode>,
) -> SyncGroupResponse {
    let mut tick = shared.tick.subscribe();
    {
        let mut st = shared.lock();
        if let Some(e) = forced {
            return sync_error(e);
        }
        if !coordinates(&st, id, &req.group_id) {
            return sync_error(ErrorCode::NotCoordinator);
        }
        let Some(g) = st.groups.get_mut(&req.group_id) else {
            return sync_error(ErrorCode::UnknownMemberId);
        };
        if let Some(e) = g.check(&req.member_id, req.generation_id) {
            return sync_error(e);
        }
        if g.phase == Phase::Preparing {
            return sync_error(ErrorCode::RebalanceInProgress);
        }
        if let Some(m) = g.members.get_mut(&req.member_id) {
            m.last_seen = Instant::now();
        }
        if g.leader == req.member_id && g.phase == Phase::Completing {
            for a in &req.assignments {
                if let Some(m) = g.members.get_mut(&a.member_id) {
                    m.assignment = Some(a.assignment.clone());
                }
            }
            g.phase = Phase::Stable;
        }
    }
    shared.changed();
    loop {
        tick.borrow_and_update();
        {
            let st = shared.lock();
            let Some(g) = st.groups.get(&req.group_id) else {
                return sync_error(ErrorCode::UnknownMemberId);
            };
            let Some(m) = g.members.get(&req.member_id) else {
                return sync_error(ErrorCode::UnknownMemberId);
            };
            if g.generation != req.generation_id || g.phase == Phase::Preparing {
                return sync_error(ErrorCode::RebalanceInProgress);
            }
            if g.phase == Phase::Stable {
                return SyncGroupResponse {
                    protocol_type: g.protocol_type.clone(),
                    protocol_name: g.protocol.clone(),
                    assignment: m.assignment.clone().unwrap_or_default(),
                    ..SyncGroupResponse::default()
                };
            }
        }
        tokio::select! {
            _ = tick.changed() => {}
            _ = tokio::time::sleep(POLL) => {}
        }
    }
}

fn heartbeat(
    id: i32,
    st: &mut State,
    req: &HeartbeatRequest,
    forced: Option<ErrorCode>,
) -> HeartbeatResponse {
    let error = forced.or_else(|| {
        if !coordinates(st, id, &req.group_id) {
            return Some(ErrorCode::NotCoordinator);
        }
        let Some(g) = st.groups.get_mut(&req.group_id) else {
            return Some(ErrorCode::UnknownMemberId);
        };
        if let Some(e) = g.check(&req.member_id, req.generation_id) {
            return Some(e);
        }
        if let Some(m) = g.members.get_mut(&req.member_id) {
            m.last_seen = Instant::now();
        }
        (g.phase == Phase::Preparing).then_some(ErrorCode::RebalanceInProgress)
    });
    HeartbeatResponse {
        error_code: error.map_or(0, ErrorCode::code),
        ..HeartbeatResponse::default()
    }
}

fn leave(
    id: i32,
    st: &mut State,
    req: &LeaveGroupRequest,
    forced: Option<ErrorCode>,
) -> LeaveGroupResponse {
    let top = forced
        .or_else(|| (!coordinates(st, id, &req.group_id)).then_some(ErrorCode::NotCoordinator));
    if let Some(e) = top {
        return LeaveGroupResponse {
            error_code: e.code(),
            ..LeaveGroupResponse::default()
        };
    }
    let now = Instant::now();
    let g = st.groups.entry(req.group_id.clone()).or_default();
    let mut leaving: Vec<(String, Option<String>)> = req
        .members
        .iter()
        .map(|m| (m.member_id.clone(), m.group_instance_id.clone()))
        .collect();
    if leaving.is_empty() {
        leaving.push((req.member_id.clone(), None));
    }
    let members: Vec<MemberResponse> = leaving
        .into_iter()
        .map(|(member_id, group_instance_id)| {
            let known = g.remove(&member_id, now);
            MemberResponse {
                member_id,
                group_instance_id,
                error_code: if known {
                    0
                } else {
                    ErrorCode::UnknownMemberId.code()
                },
                ..MemberResponse::default()
            }
        })
        .collect();
    // v0–v2 carry one member and report its error at the top level.
    let error_code = if req.members.is_empty() {
        members.first().map_or(0, |m| m.error_code)
    } else {
        0
    };
    LeaveGroupResponse {
        error_code,
        members,
        ..LeaveGroupResponse::default()
    }
}

fn offset_commit(
    id: i32,
    st: &mut State,
    req: &OffsetCommitRequest,
    version: i16,
    forced: Option<ErrorCode>,
) -> OffsetCommitResponse {
    let coordinator = coordinates(st, id, &req.group_id);
    let g = st.groups.entry(req.group_id.clone()).or_default();
    let error = forced.or_else(|| {
        if !coordinator {
            return Some(ErrorCode::NotCoordinator);
        }
        if req.generation_id_or_member_epoch < 0 && req.member_id.is_empty() {
            // A simple commit (no membership), allowed unless the group has members.
            return (!g.members.is_empty() || !g.consumers.is_empty())
                .then_some(ErrorCode::UnknownMemberId);
        }
        if !g.consumers.is_empty() {
            // KIP-848: the member epoch is the generation (OffsetCommit v9+)
            return g.consumers.check_commit(
                &req.member_id,
                req.generation_id_or_member_epoch,
                version,
            );
        }
        if let Some(e) = g.check(&req.member_id, req.generation_id_or_member_epoch) {
            return Some(e);
        }
        (g.phase == Phase::Completing).then_some(ErrorCode::RebalanceInProgress)
    });
    let topics = req
        .topics
        .iter()
        .map(|t| OffsetCommitResponseTopic {
            name: t.name.clone(),
            partitions: t
                .partitions
                .iter()
                .map(|p| {
                    if error.is_none() {
                        let key = (t.name.clone(), p.partition_index);
                        match p.committed_leader_epoch {
                            e if e >= 0 => g.epochs.insert(key.clone(), e),
                            _ => g.epochs.remove(&key),
                        };
                        g.offsets
                            .insert(key, (p.committed_offset, p.committed_metadata.clone()));
                    }
                    OffsetCommitResponsePartition {
                        partition_index: p.partition_index,
                        error_code: error.map_or(0, ErrorCode::code),
                        ..OffsetCommitResponsePartition::default()
                    }
                })
                .collect(),
            ..OffsetCommitResponseTopic::default()
        })
        .collect();
    OffsetCommitResponse {
        topics,
        ..OffsetCommitResponse::default()
    }
}

fn offset_fetch(
    id: i32,
    st: &mut State,
    req: &OffsetFetchRequest,
    forced: Option<ErrorCode>,
) -> OffsetFetchResponse {
    let error = forced
        .or_else(|| (!coordinates(st, id, &req.group_id)).then_some(ErrorCode::NotCoordinator));
    let wanted: Vec<(String, Vec<i32>)> = match &req.topics {
        Some(ts) => ts
            .iter()
            .map(|t| (t.name.clone(), t.partition_indexes.clone()))
            .collect(),
        None => {
            let mut all: BTreeMap<String, Vec<i32>> = BTreeMap::new();
            let g = st.groups.get(&req.group_id);
            for (t, p) in g.map(|g| g.offsets.keys()).into_iter().flatten() {
                all.entry(t.clone()).or_default().push(*p);
            }
            all.into_iter().collect()
        }
    };
    let topics = wanted
        .into_iter()
        .map(|(name, parts)| OffsetFetchResponseTopic {
            partitions: parts
                .into_iter()
                .map(|p| {
                    let injected = match error {
                        Some(_) => None,
                        None => st.take_partition_error(ApiKey::OFFSET_FETCH, &name, p),
                    };
                    let g = st.groups.get(&req.group_id);
                    let found = g
                        .and_then(|g| g.offsets.get(&(name.clone(), p)))
                        .filter(|_| injected.is_none());
                    OffsetFetchResponsePartition {
                        partition_index: p,
                        committed_offset: found.map_or(-1, |o| o.0),
                        committed_leader_epoch: g
                            .and_then(|g| g.epochs.get(&(name.clone(), p)).copied())
                            .unwrap_or(-1),
                        metadata: found.and_then(|o| o.1.clone()),
                        error_code: error.or(injected).map_or(0, ErrorCode::code),
                        ..OffsetFetchResponsePartition::default()
                    }
                })
                .collect(),
            name,
            ..OffsetFetchResponseTopic::default()
        })
        .collect();
    OffsetFetchResponse {
        topics,
        error_code: error.map_or(0, ErrorCode::code),
        ..OffsetFetchResponse::default()
    }
}
