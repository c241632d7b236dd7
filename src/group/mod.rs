//! Consumer groups: membership (JoinGroup, SyncGroup, Heartbeat, LeaveGroup — or, with
//! [`GroupProtocol::Consumer`], KIP-848's ConsumerGroupHeartbeat), the [`Assignor`]s the
//! leader runs, and the [`Committer`] sink. A group is used through a
//! [`Reader`](crate::reader::Reader) configured with
//! [`ReaderConfig::group_id`](crate::reader::ReaderConfig::group_id).
//!
//! The rest of this page describes the classic protocol; with
//! [`GroupProtocol::Consumer`] the broker assigns and each member reconciles on its own:
//! partitions taken away are committed (with the member epoch) and then reported gone,
//! partitions granted are started, partitions that stay are never paused; the reader,
//! its stream, commits and [`GroupEvent`]s are the same.
//!
//! # Rebalance design
//!
//! One group task per reader runs kafka-go's `run` loop with the Java client's eager or
//! cooperative (KIP-429) rebalance protocol: find the coordinator, JoinGroup (retrying once with the member id the broker
//! hands out on `MEMBER_ID_REQUIRED`), the leader runs the assignor chosen by the
//! coordinator over every member's [`Subscription`], SyncGroup, then heartbeat every
//! `heartbeat_interval` (and commit every commit interval) until the coordinator says
//! `REBALANCE_IN_PROGRESS` (rejoin), `ILLEGAL_GENERATION` / `UNKNOWN_MEMBER_ID` /
//! `FENCED_INSTANCE_ID` (the partitions are lost), or the reader closes.
//!
//! On assignment the committed offsets are fetched (OffsetFetch) and the partitions are
//! [`assign`](crate::reader::Reader::assign)ed at them (at `start_offset` where nothing is
//! committed). Before the next JoinGroup every owned partition is first
//! [`unassign`](crate::reader::Reader::unassign)ed — its buffered messages are dropped, so
//! nothing stale is yielded after a rebalance (kafka-go's failure) — then the offsets
//! acked for it so far are committed with the old generation, and only then is the
//! partition given up and a [`GroupEvent::Revoked`] emitted. Lost partitions
//! ([`GroupEvent::Lost`]) are dropped without committing, as the broker would refuse.
//! Close first ends the reader's stream and stops fetching, then keeps heartbeating until
//! no yielded message's [`AckToken`] is still held (at most the rebalance timeout) — so a
//! writer that a closing pipeline flushes gets its acknowledgements into the commit —
//! then commits every processed offset and leaves the group (static members do not).
//!
//! With the cooperative protocol (every offered assignor is cooperative, e.g. only
//! [`CooperativeStickyAssignor`], as in the Java client) the member keeps its partitions
//! while it rejoins and reports them, with its generation, in its subscription. They keep
//! flowing through the rebalance: nothing is unassigned or re-fetched. After SyncGroup only
//! the partitions missing from the new assignment are given up as above (committed with
//! the new generation, [`GroupEvent::Revoked`]) and the member rejoins at once; the
//! assignor withholds a partition from its new owner until its old owner no longer
//! reports it, so no partition is ever read by two members of one generation. A group of
//! mixed members agrees on a protocol every member offers; a member offering both an
//! eager and a cooperative assignor rebalances eagerly.
//!
//! The coordinator is reached over a dedicated connection (see `coordinator.rs`):
//! coordinator failures (`NOT_COORDINATOR`, `COORDINATOR_NOT_AVAILABLE`,
//! `COORDINATOR_LOAD_IN_PROGRESS`, connection failures and timeouts) are retried,
//! finding the coordinator again and keeping the generation, as the Java client does.
//! Failures of the join (JoinGroup, SyncGroup, the OffsetFetch that follows) follow the
//! reader's retry policy (see
//! [`ReaderConfig::retry_timeout`](crate::reader::ReaderConfig::retry_timeout)):
//! transient ones are retried with the read backoff and yielded by the reader's stream
//! only once the membership has been failing for `retry_timeout`; fatal ones (e.g.
//! `GROUP_AUTHORIZATION_FAILED`, `FENCED_INSTANCE_ID`) are yielded at once and retried
//! after `join_backoff`. Heartbeats retry a lost coordinator for the session and rebalance
//! timeouts, then rejoin; commits the application waits for retry for `retry_timeout`,
//! those of revoked partitions for the rebalance timeout.
//!
//! Topic patterns and the partition watch: every
//! [`partition_watch_interval`](crate::reader::ReaderConfig::partition_watch_interval)
//! during a generation a member with
//! [`topic_patterns`](crate::reader::ReaderConfig::topic_patterns) re-lists the cluster's
//! topics and rejoins if the matching set changed (its new subscription makes the
//! coordinator rebalance); the leader also compares the partition count of every topic a
//! member subscribes to (0 for a missing one) with what it assigned from and rejoins on a
//! change, so new partitions and newly created topics get assigned.
//!
//! # Limits
//!
//! Patterns are globs ([`glob_match`]) or, with the `regex` feature, regular expressions
//! matched against the whole topic name as Java does. Heartbeats run on the group
//! task whether or not the application polls the reader (no `max.poll.interval.ms`
//! liveness check): a stuck application keeps its partitions.

mod assignor;
mod classic;
mod commit;
mod consumer;
mod member;
pub(crate) use crate::coordinator;
mod offset_store;
mod revoke_hook;
mod shared;
mod task;
// Coordinator faults, against MockCluster.
#[cfg(all(test, feature = "mock"))]
mod coordinator_tests;
// The pre-revoke hook, against MockCluster.
#[cfg(all(test, feature = "mock"))]
mod revoke_tests;
// The KIP-848 engine through coordinator faults, against MockCluster.
#[cfg(all(test, feature = "mock"))]
mod kip848_tests;
pub(crate) mod txn_link;

use crate::util::duration_ms;
use std::collections::{BTreeMap, VecDeque};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use futures::Stream;
use tokio::sync::Notify;
use tracing::{debug, info, warn, Instrument};

pub use crate::ack::{AckToken, SharedAck};
pub(crate) use crate::ack::{Pulse, Track};
pub(crate) use crate::ack::{ShareLedger, ShareOutcome};
pub use assignor::{
    Assignor, CooperativeStickyAssignor, GroupMember, RangeAssignor, RebalanceProtocol,
    RoundRobinAssignor,
};
pub(crate) use commit::Commits;
pub use commit::{CommitMode, Committer, Offset, Unacked};
use coordinator::{coordinator_lost, coordinator_retriable, Coordinator, Lane};
pub(crate) use member::new_member_id;
pub use offset_store::OffsetStore;
pub(crate) use offset_store::SharedStore;
pub use revoke_hook::RevokeHook;
pub(crate) use revoke_hook::SharedRevokeHook;
use shared::coordinator_step;
pub(crate) use shared::GroupShared;
pub(crate) use task::GroupTask;
use task::{AbortOnDrop, End, Joined};

use crate::admin::Admin;
use crate::common::retry::{self, deadline_after, Streak, WarnLimit};
use crate::common::{StartOffset, TopicPartition};
use crate::conn::Connection;
use crate::error::{Error, Result};
use crate::protocol::consumer_protocol::{
    Assignment, Subscription, TopicPartitions, ASSIGNMENT_VERSION, SUBSCRIPTION_VERSION,
};
use crate::protocol::messages::{
    HeartbeatRequest, JoinGroupRequest, JoinGroupRequestProtocol, JoinGroupResponseMember,
    LeaveGroupRequest, MemberIdentity, SyncGroupRequest, SyncGroupRequestAssignment,
};
use crate::protocol::ErrorCode;
use crate::reader::ReaderConfig;

/// Whether `name` matches the glob `pattern`: `*` matches any run of characters
/// (including none), `?` exactly one; everything else matches itself. The whole name must
/// match. Used for [`ReaderConfig::topic_patterns`].
///
/// ```
/// use kafkapipe::group::glob_match;
/// assert!(glob_match("orders-*", "orders-eu"));
/// assert!(glob_match("orders-??", "orders-eu"));
/// assert!(!glob_match("orders-?", "orders-eu"));
/// assert!(!glob_match("orders", "orders-eu"));
/// ```
pub fn glob_match(pattern: &str, name: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let n: Vec<char> = name.chars().collect();
    let (mut i, mut j) = (0usize, 0usize);
    // the last `*` seen and the name position it currently covers up to
    let mut star: Option<(usize, usize)> = None;
    while j < n.len() {
        match p.get(i) {
            Some('*') => {
                star = Some((i, j));
                i += 1;
            }
            Some(&c) if c == '?' || c == n[j] => {
                i += 1;
                j += 1;
            }
            _ => match star {
                Some((si, sj)) => {
                    i = si + 1;
                    j = sj + 1;
                    star = Some((si, sj + 1));
                }
                None => return false,
            },
        }
    }
    p[i.min(p.len())..].iter().all(|&c| c == '*')
}

/// The consumer group protocol of a group reader: see
/// [`ReaderConfig::group_protocol`](crate::reader::ReaderConfig::group_protocol).
///
/// ```
/// use kafkapipe::group::GroupProtocol;
/// assert_eq!(GroupProtocol::default(), GroupProtocol::Classic);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GroupProtocol {
    /// JoinGroup/SyncGroup/Heartbeat with a client-side [`Assignor`] (eager, or
    /// cooperative with [`CooperativeStickyAssignor`]). Every Kafka version.
    #[default]
    Classic,
    /// The consumer protocol of KIP-848 (ConsumerGroupHeartbeat, Kafka 4.0+): the broker
    /// assigns, each member reconciles on its own, partitions that stay with a member are
    /// never paused.
    Consumer,
}

/// What a generation was joined with, re-checked by the partition watch.
#[derive(Debug, Default, PartialEq, Eq)]
struct Watched {
    /// This member's subscribed topics.
    topics: Vec<String>,
    /// The group leader's: the partition count of every topic a member subscribes to.
    counts: Option<BTreeMap<String, i32>>,
}

/// Whether a partition count of the topics in `counts` (0: did not exist) differs in
/// `listing`.
fn counts_changed(counts: &BTreeMap<String, i32>, listing: &[crate::admin::TopicListing]) -> bool {
    counts.iter().any(|(topic, &n)| {
        let now = listing
            .iter()
            .find(|l| &l.name == topic)
            .map_or(0, |l| i32::try_from(l.partitions).unwrap_or(i32::MAX));
        now != n
    })
}

/// `e` with the group named in its message: the broker's group errors
/// (`GROUP_AUTHORIZATION_FAILED`, `INVALID_GROUP_ID`, ...) do not say which group, and an
/// application reading several groups' errors must be able to tell.
fn naming_group(e: Error, group: &str) -> Error {
    let message = match e.message() {
        Some(m) if m.contains(group) => return e,
        Some(m) => format!("group {group}: {m}"),
        None => format!("group {group}"),
    };
    e.with_message(message)
}

fn lost_membership(e: &Error) -> bool {
    matches!(
        e.kafka_code(),
        Some(
            ErrorCode::IllegalGeneration | ErrorCode::UnknownMemberId | ErrorCode::FencedInstanceId
        )
    )
}

/// A change of a group reader's assignment, from [`Reader::events`](crate::reader::Reader::events).
///
/// ```
/// use kafkapipe::group::GroupEvent;
/// use kafkapipe::reader::TopicPartition;
/// let e = GroupEvent::Revoked { partitions: vec![TopicPartition::new("events", 0)] };
/// assert!(matches!(e, GroupEvent::Revoked { .. }));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GroupEvent {
    /// A new generation began. With the eager protocol `partitions` is the whole
    /// assignment; with the cooperative protocol only the partitions added to those the
    /// member kept (possibly none). They will be read from their
    /// committed offsets.
    Assigned {
        /// The group generation.
        generation: i32,
        /// The member id the coordinator gave this reader.
        member_id: String,
        /// The assigned partitions, sorted.
        partitions: Vec<TopicPartition>,
    },
    /// A rebalance took these partitions away: their buffered messages were dropped and
    /// the offsets acked so far were committed first.
    Revoked {
        /// The revoked partitions.
        partitions: Vec<TopicPartition>,
    },
    /// The membership was lost (session expired, fenced): the partitions were dropped
    /// without committing; acks for them since the last commit are lost.
    Lost {
        /// The lost partitions.
        partitions: Vec<TopicPartition>,
    },
}

const MAX_EVENTS: usize = 1024;

#[derive(Default)]
struct Events {
    queue: VecDeque<GroupEvent>,
    waker: Option<Waker>,
    closed: bool,
}

/// Whether a commit failed because the membership is changing (a rebalance under way, or
/// the generation ended): the offsets stay pending or belong to the next owner.
pub(crate) fn membership_changing(e: &Error) -> bool {
    matches!(
        e.kafka_code(),
        Some(
            ErrorCode::RebalanceInProgress
                | ErrorCode::IllegalGeneration
                | ErrorCode::UnknownMemberId
                | ErrorCode::StaleMemberEpoch
                | ErrorCode::FencedMemberEpoch
        )
    )
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The stream of a group reader's [`GroupEvent`]s, from
/// [`Reader::events`](crate::reader::Reader::events). Events are queued from the reader's
/// start (the oldest are dropped beyond 1024 unread events); every handle shares the one
/// queue, so use one. It ends after the reader is closed and the queue is drained.
///
/// ```no_run
/// use futures::StreamExt;
/// # async fn demo(reader: kafkapipe::reader::Reader) {
/// let Some(mut events) = reader.events() else { return };
/// while let Some(e) = events.next().await {
///     println!("{e:?}");
/// }
/// # }
/// ```
///
/// # Cancellation safety
///
/// Cancel safe: an event leaves the queue only when it is returned.
pub struct GroupEvents {
    shared: Arc<GroupShared>,
}

impl std::fmt::Debug for GroupEvents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupEvents")
            .field("group_id", &self.shared.group_id)
            .finish_non_exhaustive()
    }
}

impl GroupEvents {
    pub(crate) fn new(shared: Arc<GroupShared>) -> Self {
        GroupEvents { shared }
    }
}

impl Stream for GroupEvents {
    type Item = GroupEvent;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<GroupEvent>> {
        let mut ev = lock(&self.shared.events);
        if let Some(e) = ev.queue.pop_front() {
            return Poll::Ready(Some(e));
        }
        if ev.closed {
            return Poll::Ready(None);
        }
        ev.waker = Some(cx.waker().clone());
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admin::TopicListing;

    #[test]
    fn glob() {
        for (p, n, want) in [
            ("*", "", true),
            ("*", "anything", true),
            ("a*", "a", true),
            ("a*c", "abbbc", true),
            ("a*c", "abbbcd", false),
            ("a*b*c", "axxbyyc", true),
            ("a*b*c", "axxcyyb", false),
            ("?", "a", true),
            ("?", "", false),
            ("a?c", "abc", true),
            ("a?c", "ac", false),
            ("orders-*-eu", "orders-1-eu", true),
            ("orders-*-eu", "orders-1-us", false),
            ("exact", "exact", true),
            ("exact", "exactly", false),
            ("", "", true),
            ("", "a", false),
            ("**a", "ba", true),
            ("*a", "aaa", true),
            ("é*", "éte", true),
        ] {
            assert_eq!(glob_match(p, n), want, "{p:?} vs {n:?}");
        }
    }

    #[test]
    fn partition_count_changes() {
        let listing = |v: &[(&str, usize)]| -> Vec<TopicListing> {
            v.iter()
                .map(|(n, p)| TopicListing {
                    name: n.to_string(),
                    internal: false,
                    partitions: *p,
                })
                .collect()
        };
        let counts = BTreeMap::from([("a".to_string(), 3), ("missing".to_string(), 0)]);
        assert!(!counts_changed(
            &counts,
            &listing(&[("a", 3), ("other", 9)])
        ));
        assert!(counts_changed(&counts, &listing(&[("a", 4)])), "grown");
        assert!(
            counts_changed(&counts, &listing(&[("a", 3), ("missing", 2)])),
            "created"
        );
        assert!(counts_changed(&counts, &listing(&[])), "deleted");
    }
}
