//! The KIP-848 member state machine, pure — requests out, responses in: the member
//! epoch, the owned and target assignments (by topic id), the reconciliation plan (what to
//! give up, what to start) and the heartbeat request that reports it. The task around it,
//! which does the I/O, is in `consumer.rs`; its tests drive it with scripted responses.

use std::collections::{BTreeMap, BTreeSet};
use std::hash::{BuildHasher, Hasher};
use std::time::Duration;

use super::coordinator::coordinator_retriable;
use crate::error::{Error, ErrorKind, Result};
use crate::protocol::messages::*;
use crate::protocol::ErrorCode;

/// A Kafka topic id.
pub(crate) type TopicId = [u8; 16];

/// Partitions by topic id.
pub(crate) type Parts = BTreeMap<TopicId, BTreeSet<i32>>;

/// A reconciliation: the partitions to give up, and those to start.
pub(crate) type Plan = (Vec<(TopicId, i32)>, Vec<(TopicId, i32)>);

/// Member epoch of a join.
pub(super) const JOIN_EPOCH: i32 = 0;
/// Member epoch of a member leaving for good.
pub(super) const LEAVE_EPOCH: i32 = -1;
/// Member epoch of a static member leaving for a restart.
pub(super) const STATIC_LEAVE_EPOCH: i32 = -2;

/// A member id as KIP-1082 wants one: a random UUID, in Kafka's URL-safe base64 form
/// (22 characters, as the Java client's `Uuid.toString`). Randomness from the standard
/// library's randomly keyed hasher, mixed with the time and the process id: unique, not
/// secret (a member id is no credential).
pub(crate) fn new_member_id() -> String {
    let mut bytes = [0u8; 16];
    for (i, chunk) in bytes.chunks_mut(8).enumerate() {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos()),
        );
        h.write_u32(std::process::id());
        h.write_usize(i);
        chunk.copy_from_slice(&h.finish().to_le_bytes());
    }
    base64url(&bytes)
}

/// URL-safe base64 without padding.
pub(super) fn base64url(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for k in 0..=chunk.len() {
            out.push(char::from(ALPHABET[((n >> (18 - 6 * k)) & 63) as usize]));
        }
    }
    out
}

/// What a member subscribes with: constant for the reader's life.
#[derive(Debug, Clone, Default)]
pub(crate) struct MemberConfig {
    pub(crate) group_id: String,
    pub(crate) instance_id: Option<String>,
    pub(crate) rack_id: Option<String>,
    pub(crate) rebalance_timeout_ms: i32,
    pub(crate) topics: Vec<String>,
    pub(crate) regex: Option<String>,
    pub(crate) assignor: Option<String>,
}

/// What the task does after a heartbeat's answer.
#[derive(Debug)]
pub(crate) enum Step {
    /// Answered: heartbeat again after the interval (reconcile first if
    /// [`Member::plan`] has work).
    Beat,
    /// The coordinator moved, is loading, or did not answer: retry soon, membership kept.
    Retry(Error),
    /// Fenced or unknown: every owned partition is lost (returned); rejoin at once at
    /// epoch 0.
    Lost(Error, Parts),
    /// A failure the application must see (yielded by the reader): retry after
    /// `join_backoff`, membership kept.
    Fatal(Error),
    /// The broker does not offer the consumer group protocol (no ConsumerGroupHeartbeat,
    /// or UNSUPPORTED_VERSION to a join): retrying cannot help, so the error is yielded
    /// and the stream ends after it.
    Refused(Error),
}

/// The membership state of one consumer-protocol member.
#[derive(Debug)]
pub(crate) struct Member {
    pub(crate) config: MemberConfig,
    pub(crate) member_id: String,
    pub(crate) epoch: i32,
    /// The heartbeat interval the broker asked for.
    pub(crate) interval: Duration,
    /// The partitions this member reads (and reports).
    pub(crate) owned: Parts,
    /// The latest assignment from the coordinator, while it differs from `owned`.
    pub(crate) target: Option<Parts>,
}

pub(super) fn flatten(parts: &Parts) -> BTreeSet<(TopicId, i32)> {
    parts
        .iter()
        .flat_map(|(id, ps)| ps.iter().map(move |p| (*id, *p)))
        .collect()
}

impl Member {
    pub(crate) fn new(config: MemberConfig, member_id: String) -> Self {
        Member {
            config,
            member_id,
            epoch: JOIN_EPOCH,
            interval: Duration::from_secs(1),
            owned: Parts::new(),
            target: None,
        }
    }

    /// The next heartbeat, for ConsumerGroupHeartbeat `version`: the full member state.
    pub(crate) fn request(&self, version: i16) -> Result<ConsumerGroupHeartbeatRequest> {
        let c = &self.config;
        if version < 1 && c.regex.is_some() {
            return Err(Error::new(
                ErrorKind::UnsupportedVersion,
                "ReaderConfig::group_topic_regex needs ConsumerGroupHeartbeat v1 (Kafka 4.0+)",
            ));
        }
        let names = if c.topics.is_empty() && c.regex.is_some() {
            None
        } else {
            Some(c.topics.clone())
        };
        Ok(ConsumerGroupHeartbeatRequest {
            group_id: c.group_id.clone(),
            // v0: the broker hands the member id out on the join
            member_id: self.member_id.clone(),
            member_epoch: self.epoch,
            instance_id: c.instance_id.clone(),
            rack_id: c.rack_id.clone(),
            rebalance_timeout_ms: c.rebalance_timeout_ms,
            subscribed_topic_names: names,
            subscribed_topic_regex: if version >= 1 { c.regex.clone() } else { None },
            server_assignor: c.assignor.clone(),
            topic_partitions: Some(
                self.owned
                    .iter()
                    .map(|(id, ps)| ConsumerGroupHeartbeatRequestTopicPartitions {
                        topic_id: *id,
                        partitions: ps.iter().copied().collect(),
                        ..Default::default()
                    })
                    .collect(),
            ),
            ..Default::default()
        })
    }

    /// The heartbeat that leaves the group: epoch -1, or -2 for a static member (its
    /// partitions wait for it for the session timeout).
    pub(crate) fn leave_request(&self) -> ConsumerGroupHeartbeatRequest {
        ConsumerGroupHeartbeatRequest {
            group_id: self.config.group_id.clone(),
            member_id: self.member_id.clone(),
            member_epoch: if self.config.instance_id.is_some() {
                STATIC_LEAVE_EPOCH
            } else {
                LEAVE_EPOCH
            },
            instance_id: self.config.instance_id.clone(),
            ..Default::default()
        }
    }

    /// Whether this member is in the group (joined, not fenced).
    pub(crate) fn joined(&self) -> bool {
        self.epoch > 0
    }

    /// Take in the answer to [`Member::request`].
    pub(crate) fn on_response(&mut self, r: Result<ConsumerGroupHeartbeatResponse>) -> Step {
        let resp = match r {
            Ok(resp) => resp,
            // a join the broker cannot serve (see `GroupTask::consumer_heartbeat`)
            Err(e) if e.kind() == ErrorKind::UnsupportedVersion && !self.joined() => {
                return Step::Refused(e)
            }
            Err(e) if coordinator_retriable(&e) => return Step::Retry(e),
            Err(e) => return Step::Fatal(e),
        };
        let Some(code) = ErrorCode::non_zero(resp.error_code) else {
            if let Some(id) = resp.member_id.filter(|id| !id.is_empty()) {
                self.member_id = id;
            }
            self.epoch = resp.member_epoch;
            if resp.heartbeat_interval_ms > 0 {
                self.interval = Duration::from_millis(resp.heartbeat_interval_ms as u64);
            }
            if let Some(a) = resp.assignment {
                let mut target = Parts::new();
                for t in a.topic_partitions {
                    target.entry(t.topic_id).or_default().extend(t.partitions);
                }
                target.retain(|_, ps| !ps.is_empty());
                self.target = Some(target);
            }
            if self.target.as_ref() == Some(&self.owned) {
                self.target = None;
            }
            return Step::Beat;
        };
        let broker_says = resp
            .error_message
            .map(|m| format!(" (broker: {m})"))
            .unwrap_or_default();
        let group = &self.config.group_id;
        let e = Error::kafka(code);
        match code {
            ErrorCode::FencedMemberEpoch | ErrorCode::UnknownMemberId => {
                let e = e.with_message(format!(
                    "group {group}: the coordinator fenced this member (epoch {}){broker_says}; its partitions are lost and it rejoins",
                    self.epoch
                ));
                Step::Lost(e, self.lose())
            }
            ErrorCode::UnreleasedInstanceId => Step::Fatal(e.with_message(format!(
                "group {group}: group instance id {:?} is still held by another member — a second reader with the same ReaderConfig::group_instance_id, or a previous instance whose session has not expired yet; retrying{broker_says}",
                self.config.instance_id.as_deref().unwrap_or("")
            ))),
            ErrorCode::UnsupportedAssignor => Step::Fatal(e.with_message(format!(
                "group {group}: the broker does not offer the server assignor {:?} of ReaderConfig::group_remote_assignor (Apache Kafka offers \"uniform\" and \"range\"){broker_says}",
                self.config.assignor.as_deref().unwrap_or("")
            ))),
            ErrorCode::UnsupportedVersion => Step::Fatal(e.with_message(format!(
                "group {group}: the broker does not accept the consumer group protocol (KIP-848 needs Kafka 4.0+ with `consumer` in group.coordinator.rebalance.protocols); use GroupProtocol::Classic{broker_says}"
            ))),
            c if coordinator_retriable(&Error::kafka(c)) => Step::Retry(e),
            _ => Step::Fatal(e.with_message(format!(
                "group {group}: ConsumerGroupHeartbeat failed{broker_says}"
            ))),
        }
    }

    /// The membership is gone: every owned partition (returned) is lost, the next
    /// heartbeat joins again at epoch 0 with the same member id.
    pub(crate) fn lose(&mut self) -> Parts {
        self.epoch = JOIN_EPOCH;
        self.target = None;
        std::mem::take(&mut self.owned)
    }

    /// Whether the latest assignment grants `p` of topic `id` (false when the member
    /// owns its target).
    pub(crate) fn wants(&self, id: &TopicId, p: i32) -> bool {
        self.target
            .as_ref()
            .is_some_and(|t| t.get(id).is_some_and(|ps| ps.contains(&p)))
    }

    /// The reconciliation to do: partitions to give up and partitions to start, or
    /// `None` when the member owns its target.
    pub(crate) fn plan(&self) -> Option<Plan> {
        let target = flatten(self.target.as_ref()?);
        let owned = flatten(&self.owned);
        let revoked = owned.difference(&target).copied().collect();
        let added = target.difference(&owned).copied().collect();
        Some((revoked, added))
    }

    /// A reconciliation finished: `revoked` were given up, `added` started (those of the
    /// plan that could not be, e.g. of a topic whose name is not known yet, stay in the
    /// target for the next one).
    pub(crate) fn reconciled(&mut self, revoked: &[(TopicId, i32)], added: &[(TopicId, i32)]) {
        for (id, p) in revoked {
            if let Some(ps) = self.owned.get_mut(id) {
                ps.remove(p);
            }
        }
        for (id, p) in added {
            self.owned.entry(*id).or_default().insert(*p);
        }
        self.owned.retain(|_, ps| !ps.is_empty());
        if self.target.as_ref() == Some(&self.owned) {
            self.target = None;
        }
    }
}
