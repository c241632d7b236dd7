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
mod commit;
mod consumer;
pub(crate) use crate::coordinator;
mod offset_store;
mod revoke_hook;
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
pub(crate) use consumer::new_member_id;
use coordinator::{coordinator_lost, coordinator_retriable, Coordinator, Lane};
pub use offset_store::OffsetStore;
pub(crate) use offset_store::SharedStore;
pub use revoke_hook::RevokeHook;
pub(crate) use revoke_hook::SharedRevokeHook;

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

/// State shared by a group reader, its committers and its group task.
pub(crate) struct GroupShared {
    pub(crate) group_id: String,
    pub(crate) instance_id: Option<String>,
    pub(crate) admin: Admin,
    /// The dedicated coordinator connection (heartbeats, join, sync, commits).
    coord: Coordinator,
    /// How long one coordinator request may take (OffsetCommit, OffsetFetch).
    request_timeout: Duration,
    pub(crate) mode: CommitMode,
    pub(crate) contiguous: bool,
    pub(crate) max_unacked: usize,
    /// The reader's poll count and consumer waker, shared with every track.
    pub(crate) pulse: Arc<Pulse>,
    commits: Mutex<Commits>,
    /// Generation and member id of the current membership.
    member: Mutex<(i32, String)>,
    /// Woken whenever `member` changes ([`GroupShared::set_member`]).
    member_moved: Notify,
    events: Mutex<Events>,
    commit_lock: tokio::sync::Mutex<()>,
    /// How long a commit of revoked partitions (or on close) and the OffsetFetch of a
    /// join keep retrying retriable failures (coordinator moved or unreachable): the
    /// rebalance timeout, at least 5 s, as the coordinator waits no longer for the
    /// member's rejoin.
    commit_timeout: Duration,
    /// How long other commits (the interval's, the [`Committer`]'s) keep retrying:
    /// [`ReaderConfig::retry_timeout`].
    retry_timeout: Duration,
    /// The group task's `warn` rate limit of retried failures.
    warn_limit: WarnLimit,
    pub(crate) closing: AtomicBool,
    pub(crate) wake: Notify,
    /// The exactly-once pipeline that owns this group's commits, if one took over.
    pub(crate) txn: txn_link::TxnLink,
    /// [`ReaderConfig::on_revoke`](crate::reader::ReaderConfig::on_revoke).
    on_revoke: Option<SharedRevokeHook>,
    /// Keeps the hook's calls (a revoke, the close) from overlapping.
    hook_lock: tokio::sync::Mutex<()>,
    /// How long the hook may take: the rebalance timeout.
    hook_timeout: Duration,
    /// The leader epoch of a partition's record at an offset, as the reader fetched it
    /// (set by the reader): committed with the offset after it (KIP-320).
    pub(crate) offset_epochs: std::sync::OnceLock<OffsetEpochs>,
    /// Commit and join timings, for the metrics collector.
    #[cfg(feature = "metrics")]
    pub(crate) timings: crate::metrics::GroupTimings,
}

/// See [`GroupShared::offset_epochs`]: `(topic, partition, offset)` → leader epoch.
pub(crate) type OffsetEpochs = Box<dyn Fn(&str, i32, i64) -> Option<i32> + Send + Sync>;

/// How long one coordinator lookup step (FindCoordinator to one broker, a dial) may
/// take: twice the heartbeat interval, 2 to 5 s.
fn coordinator_step(config: &ReaderConfig) -> Duration {
    config
        .heartbeat_interval
        .saturating_mul(2)
        .clamp(Duration::from_secs(2), Duration::from_secs(5))
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

impl GroupShared {
    /// The current membership for a transactional offset commit (KIP-447), `None` while
    /// the reader is not a member.
    pub(crate) fn group_metadata(&self) -> Option<crate::writer::GroupMetadata> {
        let (generation, member_id) = lock(&self.member).clone();
        (generation >= 0 && !member_id.is_empty()).then(|| {
            crate::writer::GroupMetadata::new(&self.group_id)
                .generation_id(generation)
                .member_id(member_id)
                .group_instance_id(self.instance_id.clone())
        })
    }

    pub(crate) fn new(
        config: &ReaderConfig,
        group_id: String,
        admin: Admin,
        cluster: crate::cluster::Cluster,
    ) -> Self {
        GroupShared {
            coord: Coordinator::new(group_id.clone(), cluster, coordinator_step(config)),
            request_timeout: config.request_timeout,
            group_id,
            instance_id: config.group_instance_id.clone(),
            admin,
            mode: config.commit_mode,
            contiguous: config.commit_contiguous,
            max_unacked: config.max_unacked,
            pulse: Arc::default(),
            commits: Mutex::default(),
            member: Mutex::new((-1, String::new())),
            member_moved: Notify::new(),
            events: Mutex::default(),
            commit_lock: tokio::sync::Mutex::new(()),
            commit_timeout: config.rebalance_timeout.max(Duration::from_secs(5)),
            retry_timeout: config.retry_timeout,
            warn_limit: WarnLimit::default(),
            closing: AtomicBool::new(false),
            wake: Notify::new(),
            txn: txn_link::TxnLink::default(),
            on_revoke: config.on_revoke.clone(),
            hook_lock: tokio::sync::Mutex::new(()),
            hook_timeout: config.rebalance_timeout,
            offset_epochs: std::sync::OnceLock::new(),
            #[cfg(feature = "metrics")]
            timings: Default::default(),
        }
    }

    /// Run the pre-revoke hook ([`ReaderConfig::on_revoke`](crate::reader::ReaderConfig::on_revoke))
    /// with `partitions`, if there is one, and wait for it at most the rebalance timeout:
    /// what it gets processed is committed by the commit that follows.
    pub(crate) async fn before_revoke(&self, partitions: &[TopicPartition]) {
        let Some(hook) = &self.on_revoke else {
            return;
        };
        if partitions.is_empty() {
            return;
        }
        let _serial = self.hook_lock.lock().await;
        let started = Instant::now();
        debug!(group = %self.group_id, partitions = partitions.len(), "running the revoke hook");
        match tokio::time::timeout(self.hook_timeout, hook.0.revoking(partitions.to_vec())).await {
            Ok(()) => {
                debug!(group = %self.group_id, partitions = partitions.len(), took_ms = started.elapsed().as_millis() as u64, "revoke hook done")
            }
            Err(_) => warn!(
                group = %self.group_id,
                partitions = partitions.len(),
                timeout_ms = self.hook_timeout.as_millis() as u64,
                "the revoke hook did not finish within the rebalance timeout; committing what was processed"
            ),
        }
    }

    /// The reader closes: run the pre-revoke hook with every partition still owned.
    pub(crate) async fn before_close(&self) {
        if self.on_revoke.is_none() {
            return;
        }
        let owned: Vec<TopicPartition> = {
            let c = self.commits();
            let mut v: Vec<TopicPartition> = c
                .parts
                .iter()
                .flat_map(|(t, ps)| ps.keys().map(|p| TopicPartition::new(t.clone(), *p)))
                .collect();
            v.sort();
            v
        };
        self.before_revoke(&owned).await;
    }

    pub(crate) fn commits(&self) -> MutexGuard<'_, Commits> {
        lock(&self.commits)
    }

    /// A new track for an ownership of a partition committed at `committed`.
    pub(crate) fn new_track(&self, committed: i64) -> Arc<Track> {
        Arc::new(Track::new(
            committed,
            self.contiguous,
            self.max_unacked,
            self.pulse.clone(),
        ))
    }

    pub(crate) fn ack(&self, o: Offset) {
        if self.txn.transactional() {
            // The pipeline's transactions commit what its writes made of: an explicit
            // ack could move the commit past a message whose result is not written.
            warn!(group = %self.group_id, topic = %o.topic, partition = o.partition, offset = o.offset,
                "explicit ack ignored: an exactly-once pipeline owns this group's commits");
            return;
        }
        let c = self.commits();
        match c.get(&o.topic, o.partition) {
            Some(t) if o.assignment().is_none_or(|a| a == t.id) => {
                t.ack_offset(o.offset);
            }
            Some(_) => debug!(
                group = %self.group_id,
                topic = %o.topic,
                partition = o.partition,
                offset = o.offset,
                "ack of a message from an earlier assignment of this partition dropped"
            ),
            None => debug!(
                group = %self.group_id,
                topic = %o.topic,
                partition = o.partition,
                offset = o.offset,
                "ack for a partition this member does not own dropped"
            ),
        }
    }

    pub(crate) fn has_due(&self) -> bool {
        !self.commits().due(None).is_empty()
    }

    /// Commit every pending offset (of `only`, if given) and wait for the broker,
    /// retrying coordinator failures for [`ReaderConfig::retry_timeout`] (for `only`:
    /// revoked partitions, the rebalance timeout).
    pub(crate) async fn commit_pending(
        self: &Arc<Self>,
        only: Option<&[TopicPartition]>,
    ) -> Result<()> {
        let within = match only {
            Some(_) => self.commit_timeout,
            None => self.retry_timeout,
        };
        self.commit_pending_within(only, within).await
    }

    /// [`GroupShared::commit_pending`], retrying coordinator failures for `within`.
    ///
    /// The commit runs in a task of its own and the caller only waits for its result:
    /// dropping this future never abandons an OffsetCommit mid-flight. Commits are
    /// serialised by `commit_lock`, held by that task until the broker answered (or the
    /// commit gave up), so a newer commit is never sent while an older one may still be
    /// applied after it.
    async fn commit_pending_within(
        self: &Arc<Self>,
        only: Option<&[TopicPartition]>,
        within: Duration,
    ) -> Result<()> {
        if self.txn.transactional() {
            return Err(Error::config(format!(
                "group {}: offsets are committed by the exactly-once pipeline's transactions \
                 (ExactlyOnceSink); committing outside them is refused",
                self.group_id
            )));
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            // not on a Tokio runtime: nothing to spawn on, commit in the caller's future
            return self.commit_now(only, within).await;
        };
        let (me, only) = (self.clone(), only.map(<[TopicPartition]>::to_vec));
        match rt
            .spawn(async move { me.commit_now(only.as_deref(), within).await })
            .await
        {
            Ok(r) => r,
            Err(e) => Err(Error::new(
                crate::error::ErrorKind::Closed,
                format!("group {}: the commit task ended: {e}", self.group_id),
            )),
        }
    }

    /// The membership commits are sent with: the generation (KIP-848: the member epoch)
    /// and the member id; a generation of -1 while there is none.
    pub(crate) fn set_member(&self, generation: i32, member_id: String) {
        let mut member = lock(&self.member);
        #[cfg(feature = "metrics")]
        if generation >= 0 && member.0 != generation {
            self.timings.joined.fetch_add(1, Ordering::Relaxed);
        }
        *member = (generation, member_id);
        drop(member);
        self.member_moved.notify_waiters();
    }

    /// The current generation (KIP-848: member epoch), -1 while there is none.
    #[cfg(feature = "metrics")]
    pub(crate) fn generation(&self) -> i32 {
        lock(&self.member).0
    }

    /// Resolves once the membership is no longer `(generation, member_id)`.
    async fn membership_moved(&self, generation: i32, member_id: &str) {
        loop {
            let moved = self.member_moved.notified();
            tokio::pin!(moved);
            moved.as_mut().enable();
            {
                let m = lock(&self.member);
                if m.0 != generation || m.1 != member_id {
                    return;
                }
            }
            moved.await;
        }
    }

    /// The commit itself, run by [`GroupShared::commit_pending_within`]'s task.
    async fn commit_now(&self, only: Option<&[TopicPartition]>, within: Duration) -> Result<()> {
        let _serial = self.commit_lock.lock().await;
        let deadline = deadline_after(within);
        let mut abandoned = false;
        loop {
            // The tracks the offsets were taken from: the answer moves only them, never a
            // later ownership of the same partition taken while this commit was on its way.
            let (due, tracks) = {
                let c = self.commits();
                let due = c.due(only);
                let tracks: Vec<Option<Arc<Track>>> = due
                    .iter()
                    .map(|(tp, _)| c.get(&tp.topic, tp.partition).cloned())
                    .collect();
                (due, tracks)
            };
            if due.is_empty() {
                return Ok(());
            }
            let (generation, member_id) = lock(&self.member).clone();
            if generation < 0 && abandoned {
                // the membership ended under the abandoned commit (lost, fenced): its
                // partitions are being dropped; commit with the next one, if they are not
                if Instant::now() >= deadline {
                    return Err(Error::new(
                        crate::error::ErrorKind::Timeout,
                        format!("group {}: no membership to commit with", self.group_id),
                    ));
                }
                tokio::select! {
                    () = self.membership_moved(generation, &member_id) => {}
                    () = tokio::time::sleep(Duration::from_millis(100)) => {}
                }
                continue;
            }
            let offsets: Vec<(crate::admin::TopicPartition, i64)> = due
                .iter()
                .map(|(tp, o)| {
                    (
                        crate::admin::TopicPartition::new(&tp.topic, tp.partition),
                        *o,
                    )
                })
                .collect();
            // Over the coordinator connection, finding the coordinator again on
            // `NotCoordinator` and the like and retrying within the commit timeout: a
            // coordinator failover (the broker fenced, the offsets partition's new leader
            // loading the group) takes a few seconds. The generation stays valid meanwhile.
            let mut req = Admin::offset_commit_request(
                &self.group_id,
                generation,
                &member_id,
                self.instance_id.as_deref(),
                &offsets,
            );
            // the leader epoch of the record before each offset, so that a member taking
            // the partition over can validate the offset (KIP-320)
            if let Some(epoch_of) = self.offset_epochs.get() {
                for t in &mut req.topics {
                    for p in &mut t.partitions {
                        p.committed_leader_epoch = epoch_of(
                            &t.name,
                            p.partition_index,
                            p.committed_offset.saturating_sub(1),
                        )
                        .unwrap_or(-1);
                    }
                }
            }
            let (req, offsets) = (&req, &offsets);
            let call = self.coord.call(
                "OffsetCommit",
                deadline,
                self.request_timeout,
                |c| async move { Admin::offset_commit_on(&c, req, offsets).await },
            );
            // A commit built for a membership that ended (a new member epoch, a fence, a
            // lost or rejoined member) is abandoned, not retried: the broker refuses that
            // generation, and waiting out its request would hold up the commits (a
            // revocation's above all) of the membership that replaced it. Its connection
            // is kept, so the next commit queues behind the abandoned request on it and
            // the broker still answers them in order.
            #[cfg(feature = "metrics")]
            let started = Instant::now();
            let call = call.instrument(tracing::debug_span!(
                "commit",
                group = %self.group_id,
                generation,
                partitions = due.len()
            ));
            let results = tokio::select! {
                r = call => {
                    let r = r?;
                    #[cfg(feature = "metrics")]
                    self.timings.commit.record(started.elapsed());
                    r
                }
                () = self.membership_moved(generation, &member_id) => {
                    debug!(group = %self.group_id, generation, "the membership this commit was built for ended; committing with the current one");
                    abandoned = true;
                    continue;
                }
            };
            let mut first_err = None;
            let mut stale = false;
            {
                for (((_, r), (_, offset)), track) in
                    results.into_iter().zip(due.iter()).zip(tracks.iter())
                {
                    match r {
                        Ok(()) => {
                            if let Some(t) = track {
                                t.committed(*offset);
                            }
                        }
                        Err(e) => {
                            stale |= e.kafka_code() == Some(ErrorCode::StaleMemberEpoch);
                            first_err.get_or_insert(e);
                        }
                    }
                }
            }
            debug!(group = %self.group_id, generation, partitions = due.len(), "committed offsets");
            // KIP-848: the member epoch moved on (a heartbeat answered with a new epoch
            // while this commit was on its way): commit again with the current one.
            let retry_at = Instant::now() + Duration::from_millis(100);
            if stale && retry_at < deadline {
                debug!(group = %self.group_id, member_epoch = generation, "stale member epoch; committing again with the current one");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
            return first_err.map_or(Ok(()), Err);
        }
    }

    fn push_event(&self, e: GroupEvent) {
        let mut ev = lock(&self.events);
        if ev.queue.len() >= MAX_EVENTS {
            warn!(group = %self.group_id, "group event queue full; dropping the oldest event");
            ev.queue.pop_front();
        }
        ev.queue.push_back(e);
        if let Some(w) = ev.waker.take() {
            w.wake();
        }
    }

    pub(crate) fn close_events(&self) {
        let mut ev = lock(&self.events);
        ev.closed = true;
        if let Some(w) = ev.waker.take() {
            w.wake();
        }
    }

    fn closing(&self) -> bool {
        self.closing.load(Ordering::SeqCst)
    }

    /// How long a close may wait for the group task: the wait for held tokens (the
    /// rebalance timeout), the final commit (its own retry budget) and LeaveGroup,
    /// with a request timeout to spare.
    pub(crate) fn close_bound(&self, config: &ReaderConfig) -> Duration {
        config
            .rebalance_timeout
            .saturating_add(self.commit_timeout)
            .saturating_add(config.request_timeout.saturating_mul(2))
    }
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

/// What the reader's group task works with.
pub(crate) struct GroupTask {
    pub(crate) group: Arc<GroupShared>,
    pub(crate) reader: Arc<crate::reader::Shared>,
}

struct Joined {
    generation: i32,
    member_id: String,
    leader: String,
    protocol: String,
    members: Vec<JoinGroupResponseMember>,
}

/// A task aborted when its handle is dropped.
struct AbortOnDrop(tokio::task::JoinHandle<Result<()>>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Why a generation ended.
enum End {
    /// Rejoin, committing first.
    Rejoin,
    /// The membership is gone: drop the partitions without committing.
    Lost {
        forget_member_id: bool,
    },
    Close,
}

impl GroupTask {
    fn config(&self) -> &ReaderConfig {
        &self.reader.config
    }

    /// KIP-429 incremental rebalancing: only if every offered assignor supports it (as
    /// in the Java client), so the protocol never changes with the chosen assignor.
    fn cooperative(&self) -> bool {
        self.config()
            .assignors
            .iter()
            .all(|a| a.protocol() == RebalanceProtocol::Cooperative)
    }

    /// The subscribed topics: those configured plus those the patterns match now.
    async fn subscribed(&self) -> Result<Vec<String>> {
        if !self.config().has_topic_patterns() {
            return Ok(self.topics());
        }
        Ok(self.matching(&self.group.admin.list_topics().await?))
    }

    fn matching(&self, listing: &[crate::admin::TopicListing]) -> Vec<String> {
        let mut t = self.topics();
        for l in listing {
            if !l.internal && self.config().topic_matches(&l.name) {
                t.push(l.name.clone());
            }
        }
        t.sort();
        t.dedup();
        t
    }

    /// Whether the cluster's topics changed from what the generation was joined with.
    async fn changed(&self, watched: &Watched) -> Result<bool> {
        if !self.config().has_topic_patterns() && watched.counts.is_none() {
            return Ok(false);
        }
        let listing = self.group.admin.list_topics().await?;
        if self.config().has_topic_patterns() && self.matching(&listing) != watched.topics {
            return Ok(true);
        }
        Ok(watched
            .counts
            .as_ref()
            .is_some_and(|counts| counts_changed(counts, &listing)))
    }

    fn topics(&self) -> Vec<String> {
        let mut t: Vec<String> = self
            .config()
            .topics
            .iter()
            .map(|s| s.topic.clone())
            .collect();
        t.sort();
        t.dedup();
        t
    }

    /// A failed join or offset fetch, counted in `streak`: a fatal error is yielded at
    /// once (retried after `join_backoff`), a transient one retried with the read
    /// backoff and yielded only when the membership has been failing for
    /// `retry_timeout`. Returns how long to wait before the next attempt.
    fn failed(&self, streak: &mut Streak, what: &str, e: Error) -> Duration {
        let g = &self.group;
        let config = self.config();
        let counters = &self.reader.counters;
        let now = Instant::now();
        counters.last_error.set(&e);
        let permit = g.warn_limit.permit(now);
        if retry::is_fatal(&e) {
            streak.fail_fatally();
            warn!(group = %g.group_id, error = %e, "{what} failed fatally; yielding the error");
            self.report(e);
            return config.join_backoff;
        }
        counters.retries.fetch_add(1, Ordering::Relaxed);
        let failing_ms = streak.failing_for(now).as_millis() as u64;
        let (backoff, expired) = streak.fail(now, config);
        let failures = streak.failures;
        if expired {
            warn!(group = %g.group_id, failures, failing_ms, error = %e, "{what} still failing after retry_timeout; yielding the error and retrying on");
            self.report(e);
        } else if let Some(suppressed) = permit {
            warn!(group = %g.group_id, failures, failing_ms, suppressed, error = %e, "{what} failed; retrying");
        } else {
            debug!(group = %g.group_id, failures, failing_ms, error = %e, "{what} failed; retrying");
        }
        backoff
    }

    /// Yield `e` from the reader's stream.
    fn report(&self, e: Error) {
        let waker = {
            let mut st = self.reader.lock();
            if st.errors.len() < 16 {
                st.push_error(e);
            }
            st.consumer.take()
        };
        if let Some(w) = waker {
            w.wake();
        }
    }

    /// End the reader's stream after what it already queued (the errors yielded first):
    /// the group cannot go on.
    fn end_stream(&self) {
        let waker = {
            let mut st = self.reader.lock();
            st.ended = true;
            st.consumer.take()
        };
        if let Some(w) = waker {
            w.wake();
        }
    }

    /// The group task: join, read, rejoin, until the reader closes — with the membership
    /// engine of the configured [`GroupProtocol`].
    pub(crate) async fn run(self) {
        match self.config().group_protocol {
            GroupProtocol::Classic => self.run_classic().await,
            GroupProtocol::Consumer => self.run_consumer().await,
        }
    }

    /// The classic engine: JoinGroup, SyncGroup, heartbeat, rejoin.
    async fn run_classic(self) {
        let g = self.group.clone();
        let cooperative = self.cooperative();
        let mut member_id = String::new();
        // The run of failed joins since the last established generation: transient
        // failures back off (read backoff) and are yielded after `retry_timeout`.
        let mut streak = Streak::default();
        // The partitions this member owns and the generation it last joined: the eager
        // protocol gives all of them up before each JoinGroup, the cooperative one keeps
        // them (and reports them in the subscription) and gives up only those the new
        // assignment no longer contains.
        let mut owned: Vec<TopicPartition> = Vec::new();
        let mut generation = -1;
        let mut watched = Watched::default();
        while !g.closing() {
            let joined = tokio::select! {
                r = self.join_and_sync(&mut member_id, &owned, generation, &mut watched) => r,
                _ = g.wake.notified() => continue,
            };
            let (new_generation, assigned) = match joined {
                Ok(v) => v,
                Err(e) if e.kafka_code() == Some(ErrorCode::RebalanceInProgress) => {
                    // another member joined or left between our JoinGroup and SyncGroup:
                    // rejoin soon
                    debug!(group = %g.group_id, error = %e, "rebalance in progress; joining again");
                    tokio::select! {
                        _ = tokio::time::sleep(Duration::from_millis(100)) => {}
                        _ = g.wake.notified() => {}
                    }
                    continue;
                }
                Err(e) if !owned.is_empty() && lost_membership(&e) => {
                    // a cooperative member rejoining lost its membership: and so the
                    // partitions it kept
                    warn!(group = %g.group_id, error = %e, "membership lost while rejoining");
                    if e.kafka_code() == Some(ErrorCode::UnknownMemberId) {
                        member_id.clear();
                    }
                    if retry::is_fatal(&e) {
                        // FENCED_INSTANCE_ID: another instance uses this instance id
                        self.report(e);
                    }
                    self.give_up(&owned, true).await;
                    owned.clear();
                    generation = -1;
                    continue;
                }
                Err(e) => {
                    // The coordinator moved, is loading or unreachable (found again; the
                    // membership, if any, is kept, as in the Java client), or another
                    // failure: retried, and yielded if fatal or failing for too long.
                    let wait = self.failed(&mut streak, "joining the group", e);
                    tokio::select! {
                        _ = tokio::time::sleep(wait) => {}
                        _ = g.wake.notified() => {}
                    }
                    continue;
                }
            };
            generation = new_generation;
            g.set_member(generation, member_id.clone());
            // Eager: nothing is owned here, so everything assigned is added.
            let revoked: Vec<TopicPartition> = owned
                .iter()
                .filter(|tp| assigned.binary_search(tp).is_err())
                .cloned()
                .collect();
            let added: Vec<TopicPartition> = assigned
                .iter()
                .filter(|tp| owned.binary_search(tp).is_err())
                .cloned()
                .collect();
            if !revoked.is_empty() {
                // committed with the new generation, which this member is part of
                self.give_up(&revoked, false).await;
                owned.retain(|tp| revoked.binary_search(tp).is_err());
            }
            if let Err(e) = self.take(generation, &member_id, &added).await {
                let wait = self.failed(&mut streak, "fetching the committed offsets", e);
                if !cooperative {
                    self.give_up(&owned, false).await;
                    owned.clear();
                }
                tokio::time::sleep(wait).await;
                continue;
            }
            // a generation with its partitions: the run of failures is over
            streak.reset();
            owned.extend(added);
            owned.sort();
            if cooperative && !revoked.is_empty() {
                // KIP-429: rejoin at once, so the next assignment hands the revoked
                // partitions to their new owner
                debug!(group = %g.group_id, generation, revoked = revoked.len(), "revoked partitions; rejoining");
                continue;
            }
            match self.heartbeat_loop(generation, &member_id, &watched).await {
                End::Rejoin => {
                    if !cooperative {
                        self.give_up(&owned, false).await;
                        owned.clear();
                    }
                }
                End::Lost { forget_member_id } => {
                    if forget_member_id {
                        member_id.clear();
                    }
                    self.give_up(&owned, true).await;
                    owned.clear();
                    generation = -1;
                }
                End::Close => break,
            }
        }
        // closing, possibly in the middle of a (cooperative) rejoin; `Reader::close`
        // waits twice the request timeout for all of this
        if !g.txn.transactional() {
            if let Err(e) = g.commit_pending_within(None, g.commit_timeout).await {
                warn!(group = %g.group_id, error = %e, "committing on close failed");
            }
        }
        self.leave(&member_id).await;
        g.coord.close().await;
        g.close_events();
    }

    /// JoinGroup and SyncGroup over the coordinator connection: the generation and this
    /// member's partitions. A coordinator lost on the way is marked unknown (found
    /// again on the next attempt).
    async fn join_and_sync(
        &self,
        member_id: &mut String,
        owned: &[TopicPartition],
        generation: i32,
        watched: &mut Watched,
    ) -> Result<(i32, Vec<TopicPartition>)> {
        let conn = self.group.coord.connection(Lane::Membership).await?;
        #[cfg(feature = "metrics")]
        let started = Instant::now();
        let r = self
            .join_and_sync_on(&conn, member_id, owned, generation, watched)
            .instrument(tracing::debug_span!("rebalance", group = %self.group.group_id, generation))
            .await;
        #[cfg(feature = "metrics")]
        if r.is_ok() {
            self.group.timings.rebalance.record(started.elapsed());
        }
        if let Err(e) = &r {
            if coordinator_lost(e) {
                self.group.coord.mark_unknown(&conn, e);
            }
        }
        r
    }

    async fn join_and_sync_on(
        &self,
        conn: &Connection,
        member_id: &mut String,
        owned: &[TopicPartition],
        generation: i32,
        watched: &mut Watched,
    ) -> Result<(i32, Vec<TopicPartition>)> {
        let g = &self.group;
        watched.topics = self.subscribed().await?;
        watched.counts = None;
        let joined = self
            .join(conn, member_id, owned, generation, &watched.topics)
            .await?;
        *member_id = joined.member_id.clone();
        let is_leader = joined.leader == joined.member_id;
        info!(
            group = %g.group_id,
            generation = joined.generation,
            member_id = %joined.member_id,
            leader = is_leader,
            leader_id = %joined.leader,
            protocol = %joined.protocol,
            members = joined.members.len(),
            "joined group"
        );
        let assignments = if is_leader {
            let (assignments, counts) = self.assign(&joined).await?;
            watched.counts = Some(counts);
            assignments
        } else {
            Vec::new()
        };
        let req = SyncGroupRequest {
            group_id: g.group_id.clone(),
            generation_id: joined.generation,
            member_id: joined.member_id.clone(),
            group_instance_id: g.instance_id.clone(),
            protocol_type: Some("consumer".into()),
            protocol_name: Some(joined.protocol.clone()),
            assignments,
            ..Default::default()
        };
        let resp = conn.send(&req).await?;
        if let Some(c) = ErrorCode::non_zero(resp.error_code) {
            if c == ErrorCode::UnknownMemberId {
                member_id.clear();
            }
            return Err(Error::kafka(c)
                .with_broker(conn.broker())
                .with_message("SyncGroup failed"));
        }
        let mut partitions = Vec::new();
        if !resp.assignment.is_empty() {
            let a = Assignment::decode(resp.assignment)?;
            for t in a.partitions {
                for p in t.partitions {
                    partitions.push(TopicPartition::new(t.topic.clone(), p));
                }
            }
        }
        partitions.sort();
        Ok((joined.generation, partitions))
    }

    async fn join(
        &self,
        conn: &Connection,
        member_id: &mut String,
        owned: &[TopicPartition],
        generation: i32,
        topics: &[String],
    ) -> Result<Joined> {
        let g = &self.group;
        let config = self.config();
        let mut by_topic: BTreeMap<&str, Vec<i32>> = BTreeMap::new();
        for tp in owned {
            by_topic.entry(&tp.topic).or_default().push(tp.partition);
        }
        let subscription = Subscription {
            version: SUBSCRIPTION_VERSION,
            topics: topics.to_vec(),
            owned_partitions: by_topic
                .into_iter()
                .map(|(topic, partitions)| TopicPartitions {
                    topic: topic.to_string(),
                    partitions,
                })
                .collect(),
            generation_id: generation,
            ..Subscription::default()
        }
        .encode(SUBSCRIPTION_VERSION)?;
        // MEMBER_ID_REQUIRED (and UNKNOWN_MEMBER_ID after a lost membership) ask for
        // another join with the id the broker returned.
        for _ in 0..3 {
            let req = JoinGroupRequest {
                group_id: g.group_id.clone(),
                session_timeout_ms: duration_ms(config.session_timeout),
                rebalance_timeout_ms: duration_ms(config.rebalance_timeout),
                member_id: member_id.clone(),
                group_instance_id: g.instance_id.clone(),
                protocol_type: "consumer".into(),
                protocols: config
                    .assignors
                    .iter()
                    .map(|a| JoinGroupRequestProtocol {
                        name: a.name().to_string(),
                        metadata: subscription.clone(),
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            };
            let resp = conn.send(&req).await?;
            match ErrorCode::non_zero(resp.error_code) {
                None => {
                    return Ok(Joined {
                        generation: resp.generation_id,
                        member_id: resp.member_id,
                        leader: resp.leader,
                        protocol: resp.protocol_name.unwrap_or_default(),
                        members: resp.members,
                    })
                }
                Some(ErrorCode::MemberIdRequired) => {
                    debug!(group = %g.group_id, member_id = %resp.member_id, "member id required; joining again");
                    *member_id = resp.member_id;
                }
                // a member still holding partitions must give them up first (run)
                Some(ErrorCode::UnknownMemberId) if owned.is_empty() => member_id.clear(),
                Some(c) => {
                    return Err(Error::kafka(c)
                        .with_broker(conn.broker())
                        .with_message("JoinGroup failed"))
                }
            }
        }
        Err(Error::kafka(ErrorCode::MemberIdRequired)
            .with_message("JoinGroup kept asking for a member id"))
    }

    /// The leader's part: run the chosen assignor over the members' subscriptions.
    /// The assignments, and the partition count of every subscribed topic they were
    /// computed from (0 for a topic that does not exist).
    async fn assign(
        &self,
        joined: &Joined,
    ) -> Result<(Vec<SyncGroupRequestAssignment>, BTreeMap<String, i32>)> {
        let config = self.config();
        let assignor = config
            .assignors
            .iter()
            .find(|a| a.name() == joined.protocol)
            .ok_or_else(|| {
                Error::protocol(format!(
                    "the coordinator chose protocol {:?}, which this reader does not offer",
                    joined.protocol
                ))
            })?;
        let mut members = Vec::new();
        for m in &joined.members {
            let subscription = Subscription::decode(m.metadata.clone())?;
            members.push(GroupMember {
                member_id: m.member_id.clone(),
                group_instance_id: m.group_instance_id.clone(),
                subscription,
            });
        }
        let mut topics: Vec<&String> = members
            .iter()
            .flat_map(|m| m.subscription.topics.iter())
            .collect();
        topics.sort();
        topics.dedup();
        // Assign from fresh metadata: the cached partition counts may predate a
        // CreatePartitions that the partition watch saw, and assigning from them would
        // leave the new partitions out and rejoin again and again.
        let names: Vec<&str> = topics.iter().map(|t| t.as_str()).collect();
        if let Err(e) = self.reader.cluster.refresh(&names).await {
            warn!(group = %self.group.group_id, error = %e, "metadata refresh before assigning failed; using cached partition counts");
        }
        let mut partitions = BTreeMap::new();
        for t in topics {
            match self.reader.cluster.partitions(t).await {
                Ok(ps) => {
                    partitions.insert(t.clone(), i32::try_from(ps.len()).unwrap_or(i32::MAX));
                }
                Err(e) => {
                    warn!(group = %self.group.group_id, topic = %t, error = %e, "subscribed topic not assignable")
                }
            }
        }
        let result = assignor.assign(&members, &partitions);
        let mut out = Vec::new();
        for m in &members {
            let mut by_topic: BTreeMap<&str, Vec<i32>> = BTreeMap::new();
            for tp in result.get(&m.member_id).into_iter().flatten() {
                by_topic.entry(&tp.topic).or_default().push(tp.partition);
            }
            let a = Assignment {
                version: ASSIGNMENT_VERSION,
                partitions: by_topic
                    .into_iter()
                    .map(|(t, partitions)| TopicPartitions {
                        topic: t.to_string(),
                        partitions,
                    })
                    .collect(),
                user_data: None,
            };
            out.push(SyncGroupRequestAssignment {
                member_id: m.member_id.clone(),
                assignment: a.encode(ASSIGNMENT_VERSION)?,
                ..Default::default()
            });
        }
        debug!(group = %self.group.group_id, assignor = assignor.name(), members = members.len(), "assigned partitions");
        let mut counts = partitions;
        for m in &members {
            for t in &m.subscription.topics {
                counts.entry(t.clone()).or_insert(0);
            }
        }
        Ok((out, counts))
    }

    /// Start reading `partitions` at their committed offsets.
    async fn take(
        &self,
        generation: i32,
        member_id: &str,
        partitions: &[TopicPartition],
    ) -> Result<()> {
        let g = &self.group;
        let mut committed = BTreeMap::new();
        let mut epochs = BTreeMap::new();
        if !partitions.is_empty() {
            let mut topics: Vec<&str> = partitions.iter().map(|tp| tp.topic.as_str()).collect();
            topics.dedup();
            let wanted = g.admin.offset_fetch_wanted(Some(&topics)).await?;
            let (group_id, wanted) = (&g.group_id, wanted.as_deref());
            let fetched = g
                .coord
                .call(
                    "OffsetFetch",
                    deadline_after(g.commit_timeout),
                    g.request_timeout,
                    // require_stable (v7+): offsets of a transaction still being completed
                    // answer UNSTABLE_OFFSET_COMMIT (retried), never the older offset
                    |c| async move { Admin::offset_fetch_on(&c, group_id, wanted, true).await },
                )
                .await?;
            for (tp, r) in fetched {
                let r = r?;
                let tp = TopicPartition::new(tp.topic, tp.partition);
                if r.leader_epoch >= 0 {
                    epochs.insert(tp.clone(), r.leader_epoch);
                }
                committed.insert(tp, r.offset);
            }
            if let Some(store) = &self.config().offset_store {
                // the application's own offsets win over the group's
                for (tp, at) in store.0.load(partitions.to_vec()).await? {
                    if at < 0 {
                        return Err(Error::config(format!(
                            "the OffsetStore answered offset {at} for {tp}; offsets are never negative"
                        )));
                    }
                    if partitions.contains(&tp) {
                        epochs.remove(&tp);
                        committed.insert(tp, at);
                    }
                }
            }
        }
        let start = self.config().start_offset;
        {
            let mut c = g.commits();
            let mut st = self.reader.lock();
            for tp in partitions {
                let at = committed.get(tp).copied().unwrap_or(-1);
                let track = g.new_track(at);
                c.own(tp, track.clone());
                st.assign(
                    tp.clone(),
                    if at >= 0 { StartOffset::At(at) } else { start },
                );
                if let (true, Some(epoch)) = (at > 0, epochs.get(tp)) {
                    // validated with OffsetForLeaderEpoch before the first fetch (KIP-320)
                    st.validate_from(tp, at, *epoch);
                }
                st.set_track(tp, Some(track));
            }
        }
        self.reader.wake_task.notify_one();
        info!(group = %g.group_id, generation, partitions = partitions.len(), "partitions assigned");
        g.push_event(GroupEvent::Assigned {
            generation,
            member_id: member_id.to_string(),
            partitions: partitions.to_vec(),
        });
        Ok(())
    }

    /// Stop reading `partitions` (dropping their buffered messages), commit what was
    /// acked for them unless `lost`, forget them.
    async fn give_up(&self, partitions: &[TopicPartition], lost: bool) {
        let g = &self.group;
        {
            let mut st = self.reader.lock();
            for tp in partitions {
                st.unassign(tp);
            }
        }
        self.reader.wake_task.notify_one();
        if !lost {
            // the pre-revoke hook: stages flush what they hold, so it is committed below
            self.with_heartbeats(g.before_revoke(partitions)).await;
        }
        if g.txn.transactional() {
            // An exactly-once pipeline owns the commits: it aborts its open transaction
            // (results and offsets of these partitions go together, or not at all) and
            // rewinds the partitions it keeps, before they are given up.
            if !g.txn.end_transaction(g.commit_timeout).await {
                warn!(group = %g.group_id, partitions = partitions.len(),
                    "the exactly-once pipeline did not end its transaction in time; giving the partitions up");
            }
        } else if !lost {
            if let Err(e) = g.commit_pending(Some(partitions)).await {
                warn!(group = %g.group_id, error = %e, "committing revoked partitions failed");
            }
        }
        {
            let mut c = g.commits();
            for tp in partitions {
                c.disown(tp);
            }
        }
        info!(group = %g.group_id, partitions = partitions.len(), lost, "partitions revoked");
        g.push_event(if lost {
            GroupEvent::Lost {
                partitions: partitions.to_vec(),
            }
        } else {
            GroupEvent::Revoked {
                partitions: partitions.to_vec(),
            }
        });
    }

    /// Run `f` (the revoke hook) while a classic member keeps heartbeating every
    /// heartbeat interval, as the Java client's heartbeat thread does during
    /// `onPartitionsRevoked`, so a hook slower than the session timeout does not expire
    /// the membership. Heartbeat answers are ignored (`REBALANCE_IN_PROGRESS` is
    /// expected; a lost membership shows in the commit and the next join). A KIP-848
    /// member gives partitions up in a task beside its heartbeats: `f` just runs.
    async fn with_heartbeats<T>(&self, f: impl std::future::Future<Output = T>) -> T {
        let (generation, member_id) = lock(&self.group.member).clone();
        if self.config().group_protocol != GroupProtocol::Classic
            || generation < 0
            || member_id.is_empty()
        {
            return f.await;
        }
        let config = self.config();
        let send_timeout = (config.session_timeout / 3).max(coordinator_step(config));
        let req = HeartbeatRequest {
            group_id: self.group.group_id.clone(),
            generation_id: generation,
            member_id,
            group_instance_id: self.group.instance_id.clone(),
            ..Default::default()
        };
        let mut beat = tokio::time::interval_at(
            tokio::time::Instant::now() + config.heartbeat_interval,
            config.heartbeat_interval,
        );
        beat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tokio::pin!(f);
        loop {
            tokio::select! {
                r = &mut f => return r,
                _ = beat.tick() => {
                    if let Err(e) = self.heartbeat(&req, send_timeout).await {
                        debug!(group = %self.group.group_id, generation, error = %e, "heartbeat while the revoke hook runs");
                    }
                }
            }
        }
    }

    async fn heartbeat_loop(&self, generation: i32, member_id: &str, watched: &Watched) -> End {
        let g = &self.group;
        let config = self.config();
        // Heartbeats go over the dedicated coordinator connection. A coordinator lost
        // (connection failed or timed out, `NotCoordinator`, `CoordinatorNotAvailable`)
        // is marked unknown and found again before the next heartbeat, which comes soon
        // (100 ms doubling to the interval); the generation stays valid meanwhile, as in
        // the Java client's `markCoordinatorUnknown` — no rejoin. Only the coordinator's
        // answer (`UnknownMemberId`, `IllegalGeneration`, `FencedInstanceId`,
        // `RebalanceInProgress`) changes the membership — or no answer at all for the
        // session and rebalance timeouts together, after which the broker has surely
        // expired this member.
        let send_timeout = (config.session_timeout / 3).max(coordinator_step(config));
        let give_up_after = config
            .session_timeout
            .saturating_add(config.rebalance_timeout);
        let mut retry = Duration::from_millis(100);
        let mut beat = tokio::time::interval(config.heartbeat_interval);
        beat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let commit_every = match g.mode {
            CommitMode::Interval(d) if !d.is_zero() => Some(d),
            _ => None,
        };
        let mut commit = tokio::time::interval(commit_every.unwrap_or(Duration::from_secs(3600)));
        commit.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let watch_every = Some(config.partition_watch_interval).filter(|d| !d.is_zero());
        let mut watch = tokio::time::interval(watch_every.unwrap_or(Duration::from_secs(3600)));
        watch.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        watch.reset();
        let mut last_ok = Instant::now();
        // The interval commit in flight: a task of its own, so a slow commit never
        // delays a heartbeat — and never deadlocks one: a commit future polled by this
        // loop would stall, while a heartbeat runs, holding the coordinator lookup the
        // heartbeat waits for. Aborting it (on return) loses nothing: offsets count as
        // committed only once the broker accepted them.
        let mut inflight: Option<AbortOnDrop> = None;
        // Closing: the reader's stream has ended, but what it yielded may still be on its
        // way (a writer that a `forward` closes acks its messages as the broker answers).
        // Keep the membership alive (heartbeats) until no token is held, at most the
        // rebalance timeout, so the final commit includes them.
        let mut drain_until: Option<Instant> = None;
        loop {
            if g.closing() {
                let held = g.commits().held();
                let until = *drain_until.get_or_insert_with(|| {
                    if held > 0 {
                        info!(group = %g.group_id, held, "closing: waiting for the yielded messages to be processed");
                    }
                    Instant::now() + config.rebalance_timeout
                });
                // An exactly-once pipeline's open transaction commits its offsets under
                // this generation: keep it until the transaction ends.
                if held == 0 && !g.txn.busy() {
                    return End::Close;
                }
                if Instant::now() >= until {
                    warn!(group = %g.group_id, held, "closing: messages yielded were not processed within the rebalance timeout; committing what was");
                    return End::Close;
                }
            }
            let draining = drain_until.is_some();
            tokio::select! {
                // settled tokens are checked this often while closing
                _ = tokio::time::sleep(Duration::from_millis(10)), if draining => {}
                _ = g.wake.notified() => {}
                Some(r) = futures::future::OptionFuture::from(inflight.as_mut().map(|h| &mut h.0)), if inflight.is_some() => {
                    inflight = None;
                    match r {
                        Ok(Err(e)) => warn!(group = %g.group_id, error = %e, "interval commit failed"),
                        Err(e) => warn!(group = %g.group_id, error = %e, "interval commit task failed"),
                        Ok(Ok(())) => {}
                    }
                }
                _ = watch.tick(), if watch_every.is_some() && !draining => {
                    match tokio::time::timeout(config.heartbeat_interval, self.changed(watched)).await.unwrap_or(Ok(false)) {
                        Ok(true) => {
                            info!(group = %g.group_id, generation, "subscribed topics or partitions changed; rejoining");
                            return End::Rejoin;
                        }
                        Ok(false) => {}
                        Err(e) => debug!(group = %g.group_id, error = %e, "partition watch failed"),
                    }
                }
                _ = commit.tick(), if commit_every.is_some() && inflight.is_none() && !g.txn.transactional() => {
                    let g = g.clone();
                    inflight = Some(AbortOnDrop(tokio::spawn(async move { g.commit_pending(None).await })));
                }
                _ = beat.tick() => {
                    let req = HeartbeatRequest {
                        group_id: g.group_id.clone(),
                        generation_id: generation,
                        member_id: member_id.to_string(),
                        group_instance_id: g.instance_id.clone(),
                        ..Default::default()
                    };
                    match self.heartbeat(&req, send_timeout).await {
                        Ok(()) => {
                            last_ok = Instant::now();
                            retry = Duration::from_millis(100);
                        }
                        Err(e) if coordinator_retriable(&e) => {
                            self.reader.counters.retries.fetch_add(1, Ordering::Relaxed);
                            self.reader.counters.last_error.set(&e);
                            let failing_ms = last_ok.elapsed().as_millis() as u64;
                            match g.warn_limit.permit(Instant::now()) {
                                Some(suppressed) => warn!(group = %g.group_id, generation, failing_ms, suppressed, error = %e, "heartbeat failed; retrying (generation kept)"),
                                None => debug!(group = %g.group_id, generation, failing_ms, error = %e, "heartbeat failed; retrying (generation kept)"),
                            }
                            beat.reset_after(retry.min(config.heartbeat_interval));
                            retry = (retry * 2).min(Duration::from_secs(1));
                        }
                        Err(e) => match e.kafka_code() {
                            Some(ErrorCode::RebalanceInProgress) => {
                                info!(group = %g.group_id, generation, "rebalance in progress; rejoining");
                                return End::Rejoin;
                            }
                            Some(c @ (ErrorCode::IllegalGeneration | ErrorCode::UnknownMemberId | ErrorCode::FencedInstanceId)) => {
                                warn!(group = %g.group_id, generation, code = ?c, "membership lost");
                                if retry::is_fatal(&e) {
                                    // FENCED_INSTANCE_ID: another instance uses this id
                                    self.report(e.with_message("Heartbeat failed"));
                                }
                                return End::Lost { forget_member_id: c == ErrorCode::UnknownMemberId };
                            }
                            Some(c) => {
                                warn!(group = %g.group_id, generation, code = ?c, "heartbeat failed; rejoining");
                                if retry::is_fatal(&e) {
                                    self.report(e.with_message("Heartbeat failed"));
                                }
                                return End::Rejoin;
                            }
                            None => {
                                warn!(group = %g.group_id, generation, error = %e, "heartbeat failed");
                            }
                        },
                    }
                    if last_ok.elapsed() >= give_up_after {
                        warn!(group = %g.group_id, generation, "no heartbeat answered within the session and rebalance timeouts");
                        return End::Lost { forget_member_id: false };
                    }
                }
            }
        }
    }

    /// One heartbeat over the coordinator connection (found first if unknown); a lost
    /// coordinator is marked unknown. The send is time-boxed by `send_timeout`.
    async fn heartbeat(&self, req: &HeartbeatRequest, send_timeout: Duration) -> Result<()> {
        let coord = &self.group.coord;
        let c = coord.connection(Lane::Membership).await?;
        let r = match tokio::time::timeout(send_timeout, c.send(req)).await {
            Ok(Ok(resp)) => match ErrorCode::non_zero(resp.error_code) {
                None => Ok(()),
                Some(code) => Err(Error::kafka(code).with_broker(c.broker())),
            },
            Ok(Err(e)) => Err(e),
            Err(_) => Err(Error::new(
                crate::error::ErrorKind::Timeout,
                format!(
                    "heartbeat not answered within {} ms",
                    send_timeout.as_millis()
                ),
            )
            .with_broker(c.broker())),
        };
        if let Err(e) = &r {
            if coordinator_lost(e) {
                coord.mark_unknown(&c, e);
            }
        }
        r
    }

    /// LeaveGroup, best effort (static members stay, so a restart keeps its partitions).
    async fn leave(&self, member_id: &str) {
        let g = &self.group;
        if member_id.is_empty() || g.instance_id.is_some() {
            return;
        }
        let r = async {
            let conn = g.coord.connection(Lane::Membership).await?;
            let v = conn.version_for::<LeaveGroupRequest>()?;
            let req = LeaveGroupRequest {
                group_id: g.group_id.clone(),
                member_id: member_id.to_string(),
                members: if v >= 3 {
                    vec![MemberIdentity {
                        member_id: member_id.to_string(),
                        group_instance_id: None,
                        reason: Some("the kafkapipe reader was closed".into()),
                        ..Default::default()
                    }]
                } else {
                    Vec::new()
                },
                ..Default::default()
            };
            let resp = conn.send_version(&req, v).await?;
            match ErrorCode::non_zero(resp.error_code) {
                None => Ok(()),
                Some(c) => Err(Error::kafka(c)),
            }
        };
        match tokio::time::timeout(self.config().request_timeout, r).await {
            Ok(Ok(())) => info!(group = %g.group_id, member_id, "left group"),
            Ok(Err(e)) => warn!(group = %g.group_id, error = %e, "LeaveGroup failed"),
            Err(_) => warn!(group = %g.group_id, "LeaveGroup timed out"),
        }
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
