//! The membership engine of the consumer group protocol (KIP-848), beside the classic
//! one in `mod.rs`: both drive the same reader through the same internal interface
//! (`GroupTask::take` starts partitions at their committed offsets, `GroupTask::give_up`
//! stops them, committing first unless they were lost; commits go through
//! `GroupShared::commit_pending` with the membership in `GroupShared::member`).
//!
//! One request, ConsumerGroupHeartbeat (key 68), joins (member epoch 0), heartbeats and
//! leaves (epoch -1, or -2 for a static member that will come back). The member id is the
//! client's own (v1, KIP-1082), kept for the reader's life. The broker answers with the
//! member epoch, the heartbeat interval and, when it changed, the member's target
//! assignment as topic ids, mapped to names through Metadata (v10+ carries ids).
//!
//! Reconciliation, as the protocol requires, in tasks of their own while the heartbeats
//! go on: partitions missing from the target are stopped, their processed offsets
//! committed (OffsetCommit v9+ with the member epoch as generation; a
//! `STALE_MEMBER_EPOCH` commits again with the current epoch), and only then left out of
//! the owned partitions the next heartbeat reports — which is sent at once. Partitions
//! the broker grants are started after that acknowledgement (their OffsetFetch and the
//! `OffsetStore` never delay it) and reported when started; partitions that stay are
//! never touched, so they keep flowing through every rebalance. An assignment that
//! arrives during a reconciliation waits for the next one; a close or a lost membership
//! interrupts it. `FENCED_MEMBER_EPOCH` and
//! `UNKNOWN_MEMBER_ID` drop every partition without committing (`GroupEvent::Lost`)
//! and rejoin at epoch 0; `UNRELEASED_INSTANCE_ID` and `UNSUPPORTED_ASSIGNOR` are
//! yielded by the reader's stream with an explanation and retried after `join_backoff`.
//!
//! Heartbeat failures keep the partitions until the coordinator fences the member or no
//! heartbeat has been answered for longer than any broker session (see `expiry`); the
//! interval commit never outlives the membership, epoch or ownership it was built for
//! (see `GroupTask::abandon_commit`).
//!
//! Every heartbeat carries the full member state (subscription, rebalance timeout,
//! owned partitions) rather than only what changed: the broker accepts that, and a
//! heartbeat lost on the way can never leave the broker with a stale view.
//!
//! The state machine (`Member`) is pure — requests out, responses in — and tested
//! against scripted responses below; the task around it does the I/O.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tracing::{debug, info, warn};

use super::coordinator::{coordinator_lost, Lane};
use super::member::*;
use super::{AbortOnDrop, CommitMode, GroupTask};
use crate::common::retry::Streak;
use crate::common::TopicPartition;
use crate::error::{Error, ErrorKind, Result};
use crate::protocol::messages::{ConsumerGroupHeartbeatRequest, ConsumerGroupHeartbeatResponse};
use crate::protocol::{ApiKey, ErrorCode};

/// The longest session a KIP-848 group can have unless the operator raised the broker's
/// cap: `group.consumer.max.session.timeout.ms`, 60 s by default (the session itself,
/// `group.consumer.session.timeout.ms`, 45 s by default, is not told to the member).
const MAX_BROKER_SESSION: Duration = Duration::from_secs(60);

/// The first and the longest wait before looking up topic ids the Metadata did not know.
const NAMES_BACKOFF: (Duration, Duration) = (Duration::from_millis(250), Duration::from_secs(5));

/// How long without any answered heartbeat before the member drops its partitions as
/// lost on its own. The member keeps them through coordinator failures, as the Java
/// client does, and loses them when the coordinator says so (`FENCED_MEMBER_EPOCH`,
/// `UNKNOWN_MEMBER_ID`): time without answers proves no fencing — a coordinator that
/// moves or restarts loads the group and starts every member's session afresh, and a
/// broker and controller failover together easily outlast a few heartbeat intervals.
/// Only a member cut off from a coordinator the others still reach is fenced without
/// being told, and then within the broker's session timeout, which is at most
/// [`MAX_BROKER_SESSION`] (or [`ReaderConfig::session_timeout`] where the operator
/// allows longer sessions and the application says so there): past that plus the
/// rebalance timeout, the partitions surely have another owner.
///
/// [`ReaderConfig::session_timeout`]: crate::reader::ReaderConfig::session_timeout
fn expiry(config: &crate::reader::ReaderConfig) -> Duration {
    MAX_BROKER_SESSION
        .max(config.session_timeout)
        .saturating_add(config.rebalance_timeout)
}

/// How long a revocation's commit lets an interval commit in flight finish before
/// abandoning it: a quarter of the rebalance timeout, at most 1 s.
fn commit_grace(config: &crate::reader::ReaderConfig) -> Duration {
    (config.rebalance_timeout / 4).min(Duration::from_secs(1))
}

/// The interval commit in flight: its task and the member epoch it was built for.
struct IntervalCommit {
    task: AbortOnDrop,
    epoch: i32,
}

/// The next wait before another Metadata lookup of unknown topic ids.
fn names_backoff(previous: Duration) -> Duration {
    previous
        .saturating_mul(2)
        .clamp(NAMES_BACKOFF.0, NAMES_BACKOFF.1)
}

/// What a reconciliation step, running in a task of its own, reports.
enum Done {
    /// First step: `revoked` given up (committed first); `added` are the partitions of
    /// the plan to start next.
    Revoked {
        revoked: Vec<(TopicId, i32)>,
        added: Vec<(TopicId, i32)>,
    },
    /// Second step: the topic names learned for the assignment's ids; `started` were
    /// started, or could not be.
    Taken {
        learned: Vec<(TopicId, String)>,
        started: Vec<(TopicId, i32)>,
        result: Result<()>,
    },
}

/// A reconciliation step in its own task, aborted when dropped: the heartbeats go on
/// beside it. Whether it is a revocation (which commits).
struct Job(tokio::task::JoinHandle<Done>, bool);

/// The rebalance under way, for the metrics (feature `metrics`; without it this is
/// empty and does nothing): a reconciliation starts with the heartbeat answer that
/// brings a target assignment the member does not own, and ends when it owns it —
/// then its time goes into `GroupTimings::rebalance` (`crate::metrics`), as
/// the Java client's KIP-848 consumer times its `RECONCILING` state. A membership lost
/// on the way ends it uncounted.
#[derive(Default)]
struct RebalanceClock {
    #[cfg(feature = "metrics")]
    since: Option<Instant>,
}

impl RebalanceClock {
    /// After a heartbeat's answer or a reconciliation step: start the clock if `m`
    /// has a target to reach, stop it and count the rebalance once `m` owns it.
    fn observe(&mut self, m: &Member, g: &super::GroupShared) {
        #[cfg(feature = "metrics")]
        match (m.target.is_some(), self.since) {
            (true, None) => self.since = Some(Instant::now()),
            (false, Some(since)) => {
                self.since = None;
                g.timings.rebalance.record(since.elapsed());
            }
            _ => {}
        }
        #[cfg(not(feature = "metrics"))]
        let _ = (m, g);
    }

    /// The membership was lost: the reconciliation under way is no rebalance.
    fn abandon(&mut self) {
        #[cfg(feature = "metrics")]
        {
            self.since = None;
        }
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Job {
    /// Stop the step; what it reports if it had finished already.
    async fn cancel(mut self) -> Option<Done> {
        self.0.abort();
        (&mut self.0).await.ok()
    }
}

impl GroupTask {
    /// The consumer-protocol engine: heartbeat, reconcile, until the reader closes.
    ///
    /// A reconciliation runs in tasks of its own while the heartbeats go on (as the Java
    /// client's `ConsumerMembershipManager` does): first the revoked partitions are given
    /// up and the next heartbeat, sent at once, stops reporting them; only then are the
    /// added partitions started (OffsetFetch, the `OffsetStore`), so neither a slow
    /// offset lookup nor a slow commit can expire the session or hold back the
    /// revocation the new owners wait for. An assignment that arrives meanwhile waits
    /// for the next reconciliation; a close or a lost membership interrupts it.
    pub(crate) async fn run_consumer(self) {
        let g = self.group.clone();
        let config = self.config();
        let mut m = Member::new(
            MemberConfig {
                group_id: g.group_id.clone(),
                instance_id: g.instance_id.clone(),
                rack_id: config.client_rack.clone(),
                rebalance_timeout_ms: crate::util::duration_ms(config.rebalance_timeout),
                topics: self.topics(),
                regex: config.group_topic_regex.clone(),
                assignor: config.group_remote_assignor.clone(),
            },
            new_member_id(),
        );
        let mut names: HashMap<TopicId, String> = HashMap::new();
        let mut streak = Streak::default();
        let mut retry = Duration::from_millis(100);
        let mut next_beat = Instant::now();
        // The last answered heartbeat: with none for about the broker's session timeout
        // (see `expiry`) the broker has fenced this member, so its partitions are
        // dropped as lost — as the classic engine does — rather than read on beside
        // their next owner.
        let mut last_ok = Instant::now();
        let commit_every = match g.mode {
            CommitMode::Interval(d) if !d.is_zero() => Some(d),
            _ => None,
        };
        let mut commit = super::commit::interval_timer(commit_every);
        // The interval commit in flight, in a task of its own (a slow commit never delays a
        // heartbeat). It never outlives what it was built for: a lost membership or a new
        // member epoch abandons it at once, a revocation or a close lets it finish for a
        // short grace first (see `GroupTask::abandon_commit`).
        let mut inflight: Option<IntervalCommit> = None;
        let mut drain_until: Option<Instant> = None;
        // The reconciliation step running, and when the next may start (a failed start
        // of partitions, topic ids not resolved yet, back off; a revocation never waits).
        let mut job: Option<Job> = None;
        let mut reconcile_after = Instant::now();
        let mut names_wait = Duration::ZERO;
        let mut clock = RebalanceClock::default();
        loop {
            if g.closing() {
                if let Some(j) = job.take() {
                    info!(group = %g.group_id, "closing: reconciliation interrupted");
                    settle(j, &mut m, &mut names).await;
                }
                // As the classic engine: keep the membership until what the stream
                // yielded is processed (at most the rebalance timeout).
                let held = g.commits().held();
                let until = *drain_until.get_or_insert_with(|| {
                    if held > 0 {
                        info!(group = %g.group_id, held, "closing: waiting for the yielded messages to be processed");
                    }
                    Instant::now() + config.rebalance_timeout
                });
                if !m.joined() || (held == 0 && !g.txn.busy()) {
                    break;
                }
                if Instant::now() >= until {
                    warn!(group = %g.group_id, held, "closing: messages yielded were not processed within the rebalance timeout; committing what was");
                    break;
                }
            } else if job.is_none() && m.joined() {
                if let Some((revoked, added)) = m.plan() {
                    if !revoked.is_empty() {
                        job = Some(self.revoke_job(revoked, added, &names, inflight.take()));
                    } else if Instant::now() >= reconcile_after {
                        job = Some(self.take_job(&m, added, &names));
                    }
                }
            }
            let draining = drain_until.is_some();
            let backing_off = job.is_none() && m.target.is_some() && !draining;
            tokio::select! {
                _ = tokio::time::sleep_until(next_beat.into()) => {}
                _ = tokio::time::sleep(Duration::from_millis(10)), if draining => continue,
                _ = tokio::time::sleep_until(reconcile_after.into()), if backing_off => continue,
                _ = g.wake.notified() => continue,
                Some(r) = futures::future::OptionFuture::from(job.as_mut().map(|j| &mut j.0)), if job.is_some() => {
                    job = None;
                    let done = match r {
                        Ok(done) => done,
                        Err(e) => {
                            warn!(group = %g.group_id, error = %e, "reconciliation task failed");
                            continue;
                        }
                    };
                    match done {
                        Done::Revoked { revoked, added } => {
                            m.reconciled(&revoked, &[]);
                            // acknowledge at once: the coordinator hands revoked
                            // partitions on only when this member stops reporting them
                            next_beat = Instant::now();
                            let start: Vec<(TopicId, i32)> =
                                added.into_iter().filter(|(id, p)| m.wants(id, *p)).collect();
                            if !start.is_empty() {
                                job = Some(self.take_job(&m, start, &names));
                            } else if m.target.is_none() {
                                streak.reset();
                            }
                            clock.observe(&m, &g);
                        }
                        Done::Taken { learned, started, result } => {
                            names.extend(learned);
                            match result {
                                Ok(()) => {
                                    m.reconciled(&[], &started);
                                    if !started.is_empty() {
                                        next_beat = Instant::now();
                                    }
                                    if m.target.is_none() {
                                        streak.reset();
                                    }
                                    debug!(group = %g.group_id, epoch = m.epoch, started = started.len(), owned = flatten(&m.owned).len(), "reconciled");
                                }
                                Err(e) => {
                                    let wait = self.failed(&mut streak, "fetching the committed offsets", e);
                                    reconcile_after = Instant::now() + wait;
                                }
                            }
                            let unresolved = m.plan().is_some_and(|(_, added)| {
                                added.iter().any(|(id, _)| !names.contains_key(id))
                            });
                            if unresolved {
                                // not reconcilable yet (a topic name unknown): look again
                                // later, backing off
                                names_wait = names_backoff(names_wait);
                                reconcile_after = reconcile_after.max(Instant::now() + names_wait);
                                debug!(group = %g.group_id, wait_ms = names_wait.as_millis() as u64, "assigned topic ids not in the Metadata yet");
                            } else {
                                names_wait = Duration::ZERO;
                            }
                            clock.observe(&m, &g);
                        }
                    }
                    continue;
                }
                Some(r) = futures::future::OptionFuture::from(inflight.as_mut().map(|c| &mut c.task.0)), if inflight.is_some() => {
                    inflight = None;
                    match r {
                        Ok(Err(e)) => warn!(group = %g.group_id, error = %e, "interval commit failed"),
                        Err(e) => warn!(group = %g.group_id, error = %e, "interval commit task failed"),
                        Ok(Ok(())) => {}
                    }
                    continue;
                }
                // not while a revocation commits: it must not wait behind another commit
                _ = commit.tick(), if commit_every.is_some() && inflight.is_none() && m.joined() && !g.txn.transactional() && !job.as_ref().is_some_and(|j| j.1) => {
                    let g = g.clone();
                    inflight = Some(IntervalCommit {
                        task: AbortOnDrop(tokio::spawn(async move { g.commit_pending(None).await })),
                        epoch: m.epoch,
                    });
                    continue;
                }
            }
            let r = self.consumer_heartbeat(&m).await;
            match m.on_response(r) {
                Step::Beat => {
                    last_ok = Instant::now();
                    g.set_member(m.epoch, m.member_id.clone());
                    clock.observe(&m, &g);
                    if inflight.as_ref().is_some_and(|c| c.epoch != m.epoch) {
                        // built for an epoch that ended: the broker refuses it
                        // (STALE_MEMBER_EPOCH); the next tick commits with this one
                        self.abandon_commit(inflight.take(), "the member epoch moved on");
                    }
                    retry = Duration::from_millis(100);
                    next_beat = Instant::now() + m.interval;
                    if job.is_none() && m.plan().is_none() && m.joined() {
                        streak.reset();
                    }
                }
                Step::Retry(e) => {
                    self.reader.counters.retries.fetch_add(1, Ordering::Relaxed);
                    let wait = self.failed(&mut streak, "heartbeating the group", e);
                    next_beat = Instant::now() + retry.min(wait.max(retry));
                    retry = (retry * 2).min(Duration::from_secs(1));
                    if m.joined() && last_ok.elapsed() >= expiry(config) {
                        warn!(group = %g.group_id, epoch = m.epoch, failing_ms = last_ok.elapsed().as_millis() as u64, "no heartbeat answered for longer than any broker session; dropping the partitions and rejoining");
                        self.abandon_commit(inflight.take(), "the membership expired");
                        if let Some(j) = job.take() {
                            self.abandon_revocation(&j);
                            settle(j, &mut m, &mut names).await;
                        }
                        let lost = m.lose();
                        clock.abandon();
                        g.set_member(-1, m.member_id.clone());
                        let tps = to_partitions(&names, flatten(&lost).into_iter());
                        if !tps.is_empty() {
                            self.give_up(&tps, true).await;
                        }
                        last_ok = Instant::now();
                    }
                }
                Step::Lost(e, lost) => {
                    // never committed now: the broker refuses this member's epoch
                    self.abandon_commit(inflight.take(), "the membership was lost");
                    let lost = match job.take() {
                        // what the interrupted reconciliation finished counts: restore
                        // the owned partitions, settle, lose them again
                        Some(j) => {
                            m.owned = lost;
                            self.abandon_revocation(&j);
                            settle(j, &mut m, &mut names).await;
                            m.lose()
                        }
                        None => lost,
                    };
                    clock.abandon();
                    warn!(group = %g.group_id, error = %e, partitions = flatten(&lost).len(), "membership lost; rejoining");
                    g.set_member(-1, m.member_id.clone());
                    let tps = to_partitions(&names, flatten(&lost).into_iter());
                    if !tps.is_empty() {
                        self.give_up(&tps, true).await;
                    }
                    next_beat = Instant::now();
                }
                Step::Fatal(e) => {
                    // yielded at once, whatever the error's kind: it needs the
                    // application's (or an operator's) attention
                    warn!(group = %g.group_id, error = %e, "heartbeat failed; yielding the error and retrying after join_backoff");
                    self.reader.counters.last_error.set(&e);
                    streak.fail_fatally();
                    self.report(e);
                    next_beat = Instant::now() + config.join_backoff;
                }
                Step::Refused(e) => {
                    warn!(group = %g.group_id, error = %e, "the broker refuses the consumer group protocol; yielding the error and ending the stream");
                    self.reader.counters.last_error.set(&e);
                    self.report(e);
                    self.end_stream();
                    break;
                }
            }
        }
        // closing: commit what was processed with the current epoch, then leave
        if let Some(c) = inflight.take() {
            self.finish_or_abandon_commit(c, commit_grace(config)).await;
        }
        if !g.txn.transactional() && m.joined() {
            if let Err(e) = g.commit_pending_within(None, g.commit_timeout).await {
                warn!(group = %g.group_id, error = %e, "committing on close failed");
            }
        }
        if m.joined() {
            self.consumer_leave(&m).await;
        }
        g.coord.close().await;
        g.close_events();
    }
}

impl GroupTask {
    /// A handle on the group and the reader for a job's own task.
    fn task(&self) -> GroupTask {
        GroupTask {
            group: self.group.clone(),
            reader: self.reader.clone(),
        }
    }

    /// The first step of a reconciliation, in a task of its own: give up `revoked`
    /// (committing first). An interval commit in flight (`prior`) may finish for
    /// [`commit_grace`] first; then it is abandoned, so the revocation's commit never
    /// waits behind it for longer — the coordinator fences a member that does not
    /// acknowledge a revocation within the rebalance timeout.
    fn revoke_job(
        &self,
        revoked: Vec<(TopicId, i32)>,
        added: Vec<(TopicId, i32)>,
        names: &HashMap<TopicId, String>,
        prior: Option<IntervalCommit>,
    ) -> Job {
        let task = self.task();
        let tps = to_partitions(names, revoked.iter().copied());
        Job(
            tokio::spawn(async move {
                if let Some(c) = prior {
                    task.finish_or_abandon_commit(c, commit_grace(task.config()))
                        .await;
                }
                if !tps.is_empty() {
                    task.give_up(&tps, false).await;
                }
                Done::Revoked { revoked, added }
            }),
            true,
        )
    }

    /// Abandon the interval commit `c` (if still running): the membership or member
    /// epoch it was built for ended, so the broker would refuse it (KIP-848 checks the
    /// member epoch of every OffsetCommit) and its results belong to no current
    /// ownership. Its request, if in flight, may never be answered (a black-holed
    /// coordinator connection): the offsets connection is reset so that later commits
    /// and offset fetches do not queue behind it.
    fn abandon_commit(&self, c: Option<IntervalCommit>, why: &str) {
        let Some(c) = c else { return };
        if c.task.0.is_finished() {
            return;
        }
        debug!(group = %self.group.group_id, epoch = c.epoch, why, "interval commit abandoned");
        drop(c);
        self.group.coord.reset(Lane::Offsets);
    }

    /// A revocation interrupted because the membership is gone: its commit (or the
    /// interval commit it was letting finish) is abandoned with it, so reset the
    /// offsets connection its request may still occupy (see
    /// [`GroupTask::abandon_commit`]).
    fn abandon_revocation(&self, j: &Job) {
        if j.1 && !j.0.is_finished() {
            self.group.coord.reset(Lane::Offsets);
        }
    }

    /// Let the interval commit `c` finish for `grace` (a healthy coordinator answers in
    /// milliseconds, and the next commit then follows it, in order, on the same
    /// connection), else abandon it. Abandoning one of the current epoch may let the
    /// broker apply it after the commit that follows — of the same partitions at the
    /// same or later offsets — so a committed offset could step back to an earlier
    /// processed one (its next owner reads a few messages again); waiting longer would
    /// let the member miss the revocation deadline and lose every partition uncommitted.
    async fn finish_or_abandon_commit(&self, mut c: IntervalCommit, grace: Duration) {
        if tokio::time::timeout(grace, &mut c.task.0).await.is_ok() {
            return;
        }
        warn!(group = %self.group.group_id, epoch = c.epoch, grace_ms = grace.as_millis() as u64,
            "interval commit still unanswered; abandoning it so the revocation or close commits now");
        drop(c);
        self.group.coord.reset(Lane::Offsets);
    }

    /// The second step of a reconciliation, in a task of its own: learn the names of the
    /// assigned topic ids not known yet, then start those of `added` whose name is known
    /// at their committed offsets (or the `OffsetStore`'s).
    fn take_job(
        &self,
        m: &Member,
        added: Vec<(TopicId, i32)>,
        names: &HashMap<TopicId, String>,
    ) -> Job {
        let task = self.task();
        let (epoch, member_id) = (m.epoch, m.member_id.clone());
        let mut known: HashMap<TopicId, String> = added
            .iter()
            .filter_map(|(id, _)| names.get(id).map(|n| (*id, n.clone())))
            .collect();
        Job(
            tokio::spawn(async move {
                let g = &task.group;
                let mut learned = Vec::new();
                if added.iter().any(|(id, _)| !known.contains_key(id)) {
                    // Assignments name topics by id: learn the names (all topics: a regex
                    // subscription may bring topics this reader never heard of).
                    match tokio::time::timeout(
                        task.config().connection.request_timeout,
                        g.admin.metadata(None),
                    )
                    .await
                    {
                        Ok(Ok(md)) => {
                            for t in md.topics {
                                if t.id != [0; 16] && t.error.is_none() {
                                    learned.push((t.id, t.name));
                                }
                            }
                        }
                        Ok(Err(e)) => {
                            debug!(group = %g.group_id, error = %e, "metadata for the assigned topic ids failed")
                        }
                        Err(_) => {
                            debug!(group = %g.group_id, "metadata for the assigned topic ids timed out")
                        }
                    }
                    known.extend(learned.iter().cloned());
                }
                let started: Vec<(TopicId, i32)> = added
                    .into_iter()
                    .filter(|(id, _)| known.contains_key(id))
                    .collect();
                let tps = to_partitions(&known, started.iter().copied());
                let result = if tps.is_empty() {
                    Ok(())
                } else {
                    task.take(epoch, &member_id, &tps).await
                };
                Done::Taken {
                    learned,
                    started,
                    result,
                }
            }),
            false,
        )
    }

    /// One ConsumerGroupHeartbeat over the coordinator connection (found first if
    /// unknown), time-boxed; a lost coordinator is marked unknown.
    async fn consumer_heartbeat(&self, m: &Member) -> Result<ConsumerGroupHeartbeatResponse> {
        let coord = &self.group.coord;
        let c = coord.connection(Lane::Membership).await?;
        let version = c
            .version_for::<ConsumerGroupHeartbeatRequest>()
            .map_err(|_| kip848_refused(&self.group.group_id, &c, "no usable version"))?;
        let req = m.request(version)?;
        let send_timeout = self
            .config()
            .connection
            .request_timeout
            .min(Duration::from_secs(15));
        let r = match tokio::time::timeout(send_timeout, c.send_version(&req, version)).await {
            Ok(r) => r,
            Err(_) => Err(Error::new(
                ErrorKind::Timeout,
                format!(
                    "ConsumerGroupHeartbeat not answered within {} ms",
                    send_timeout.as_millis()
                ),
            )
            .with_broker(c.broker())),
        };
        if let Ok(resp) = &r {
            if resp.error_code == ErrorCode::UnsupportedVersion.code() && !m.joined() {
                // Kafka 3.x lists ConsumerGroupHeartbeat but refuses it unless `consumer`
                // is in its group.coordinator.rebalance.protocols
                let says = resp
                    .error_message
                    .as_deref()
                    .map(|s| format!(", broker: {s}"))
                    .unwrap_or_default();
                let why = format!("it answered the join with UNSUPPORTED_VERSION{says}");
                return Err(kip848_refused(&self.group.group_id, &c, &why));
            }
        }
        let lost = match &r {
            Err(e) => coordinator_lost(e),
            Ok(resp) => ErrorCode::non_zero(resp.error_code)
                .is_some_and(|code| coordinator_lost(&Error::kafka(code))),
        };
        if lost {
            let e = match &r {
                Err(e) => e.clone(),
                Ok(resp) => Error::kafka(ErrorCode::from(resp.error_code)),
            };
            coord.mark_unknown(&c, &e);
        }
        r
    }

    /// Leave the group (epoch -1; -2 for a static member), best effort.
    async fn consumer_leave(&self, m: &Member) {
        let g = &self.group;
        let req = m.leave_request();
        let r = async {
            let c = g.coord.connection(Lane::Membership).await?;
            let v = c.version_for::<ConsumerGroupHeartbeatRequest>()?;
            let resp = c.send_version(&req, v).await?;
            match ErrorCode::non_zero(resp.error_code) {
                None => Ok(()),
                Some(code) => Err(Error::kafka(code)),
            }
        };
        match tokio::time::timeout(self.config().connection.request_timeout, r).await {
            Ok(Ok(())) => {
                info!(group = %g.group_id, member_id = %m.member_id, epoch = req.member_epoch, "left group")
            }
            Ok(Err(e)) => warn!(group = %g.group_id, error = %e, "leaving the group failed"),
            Err(_) => warn!(group = %g.group_id, "leaving the group timed out"),
        }
    }
}

/// The error for a broker that does not serve the KIP-848 consumer group protocol: names
/// the broker, `why`, and what its ApiVersions answer says (ConsumerGroupHeartbeat's
/// range, the finalized `metadata.version` and its release, `group.version`).
fn kip848_refused(group: &str, c: &crate::conn::Connection, why: &str) -> Error {
    let evidence = match c.api_versions() {
        None => "no ApiVersions answer".to_string(),
        Some(v) => {
            let api = match v.range(ApiKey::CONSUMER_GROUP_HEARTBEAT) {
                Some((min, max)) => format!("ConsumerGroupHeartbeat v{min}..=v{max}"),
                None => "no ConsumerGroupHeartbeat".to_string(),
            };
            let level = v.finalized_level("metadata.version");
            let release = v
                .metadata_version()
                .map_or_else(|| "unknown release".to_string(), |r| format!("Kafka {r}"));
            format!(
                "{api}, metadata.version {level} ({release}), group.version {}",
                v.finalized_level("group.version")
            )
        }
    };
    Error::new(
        ErrorKind::UnsupportedVersion,
        format!(
            "group {group}: broker {} does not support KIP-848 consumer groups \
             (GroupProtocol::Consumer): {why}; its ApiVersions lists {evidence} (the consumer \
             group protocol needs Kafka 4.0+, or `consumer` in the broker's \
             group.coordinator.rebalance.protocols); use GroupProtocol::Classic",
            c.broker()
        ),
    )
    .with_broker(c.broker())
}

/// Stop an interrupted reconciliation step and record in `m` what it finished.
async fn settle(job: Job, m: &mut Member, names: &mut HashMap<TopicId, String>) {
    match job.cancel().await {
        Some(Done::Revoked { revoked, .. }) => m.reconciled(&revoked, &[]),
        Some(Done::Taken {
            learned,
            started,
            result,
        }) => {
            names.extend(learned);
            if result.is_ok() {
                m.reconciled(&[], &started);
            }
        }
        None => {}
    }
}

/// The named partitions of `parts` (those whose topic name is known), sorted.
fn to_partitions(
    names: &HashMap<TopicId, String>,
    parts: impl Iterator<Item = (TopicId, i32)>,
) -> Vec<TopicPartition> {
    let mut v: Vec<TopicPartition> = parts
        .filter_map(|(id, p)| names.get(&id).map(|n| TopicPartition::new(n.clone(), p)))
        .collect();
    v.sort();
    v
}

/// The state machine against scripted coordinator responses: the seam between the
/// protocol logic and the I/O (the engine against MockCluster's KIP-848 coordinator is
/// in `kip848_tests.rs`).
#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::messages::{
        ConsumerGroupHeartbeatAssignment, ConsumerGroupHeartbeatResponseTopicPartitions,
    };

    const A: TopicId = [1; 16];
    const B: TopicId = [2; 16];

    fn member(instance: Option<&str>) -> Member {
        Member::new(
            MemberConfig {
                group_id: "g".into(),
                instance_id: instance.map(str::to_string),
                rack_id: Some("rack-1".into()),
                rebalance_timeout_ms: 30_000,
                topics: vec!["a".into(), "b".into()],
                regex: None,
                assignor: Some("range".into()),
            },
            new_member_id(),
        )
    }

    fn ok(
        epoch: i32,
        assignment: Option<&[(TopicId, &[i32])]>,
    ) -> Result<ConsumerGroupHeartbeatResponse> {
        Ok(ConsumerGroupHeartbeatResponse {
            member_epoch: epoch,
            heartbeat_interval_ms: 700,
            assignment: assignment.map(|a| ConsumerGroupHeartbeatAssignment {
                topic_partitions: a
                    .iter()
                    .map(|(id, ps)| ConsumerGroupHeartbeatResponseTopicPartitions {
                        topic_id: *id,
                        partitions: ps.to_vec(),
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            }),
            ..Default::default()
        })
    }

    fn err(code: ErrorCode) -> Result<ConsumerGroupHeartbeatResponse> {
        Ok(ConsumerGroupHeartbeatResponse {
            error_code: code.code(),
            error_message: Some("scripted".into()),
            member_epoch: -1,
            ..Default::default()
        })
    }

    fn owned(req: &ConsumerGroupHeartbeatRequest) -> Vec<(TopicId, Vec<i32>)> {
        req.topic_partitions
            .iter()
            .flatten()
            .map(|t| (t.topic_id, t.partitions.clone()))
            .collect()
    }

    /// Joined with partitions a-0, a-1, b-0 at epoch 5.
    fn joined() -> Member {
        let mut m = member(None);
        assert!(matches!(
            m.on_response(ok(5, Some(&[(A, &[0, 1]), (B, &[0])]))),
            Step::Beat
        ));
        let (revoked, added) = m.plan().unwrap_or_default();
        assert!(revoked.is_empty());
        m.reconciled(&revoked, &added);
        m
    }

    #[test]
    fn member_id_is_a_kafka_uuid_string() {
        let (a, b) = (new_member_id(), new_member_id());
        assert_eq!(a.len(), 22);
        assert!(a
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'));
        assert_ne!(a, b);
        assert_eq!(base64url(&[0xfb, 0xff]), "-_8");
        assert_eq!(base64url(b"Man"), "TWFu");
    }

    #[test]
    fn join_request_then_reconcile_then_acknowledge() {
        let mut m = member(Some("i-1"));
        let id = m.member_id.clone();
        let join = m.request(1).unwrap_or_default();
        assert_eq!(join.member_epoch, 0);
        assert_eq!(join.member_id, id, "client-generated member id (KIP-1082)");
        assert_eq!(join.rebalance_timeout_ms, 30_000);
        assert_eq!(
            join.subscribed_topic_names,
            Some(vec!["a".into(), "b".into()])
        );
        assert_eq!(join.server_assignor.as_deref(), Some("range"));
        assert_eq!(join.instance_id.as_deref(), Some("i-1"));
        assert_eq!(join.rack_id.as_deref(), Some("rack-1"));
        assert_eq!(
            join.topic_partitions,
            Some(vec![]),
            "a join reports no partitions"
        );

        assert!(matches!(
            m.on_response(ok(3, Some(&[(A, &[0, 1])]))),
            Step::Beat
        ));
        assert_eq!(m.epoch, 3);
        assert_eq!(m.interval, Duration::from_millis(700));
        // not granted until reconciled: the next heartbeat still reports nothing
        assert!(owned(&m.request(1).unwrap_or_default()).is_empty());
        let (revoked, added) = m.plan().unwrap_or_default();
        assert_eq!((revoked, added.clone()), (vec![], vec![(A, 0), (A, 1)]));
        m.reconciled(&[], &added);
        assert!(m.plan().is_none());
        let beat = m.request(1).unwrap_or_default();
        assert_eq!(beat.member_epoch, 3);
        assert_eq!(owned(&beat), vec![(A, vec![0, 1])]);
        // an answer without assignment changes nothing
        assert!(matches!(m.on_response(ok(3, None)), Step::Beat));
        assert!(m.plan().is_none());
    }

    #[test]
    fn revocation_keeps_the_steady_partitions_and_reports_the_rest_only_after() {
        let mut m = joined();
        // the coordinator takes a-1 away and gives b-1
        assert!(matches!(
            m.on_response(ok(6, Some(&[(A, &[0]), (B, &[0, 1])]))),
            Step::Beat
        ));
        let (revoked, added) = m.plan().unwrap_or_default();
        assert_eq!(revoked, vec![(A, 1)]);
        assert_eq!(added, vec![(B, 1)]);
        // until reconciled, a-1 is still reported (its offsets are not committed yet)
        assert_eq!(
            owned(&m.request(1).unwrap_or_default()),
            vec![(A, vec![0, 1]), (B, vec![0])]
        );
        m.reconciled(&revoked, &added);
        assert_eq!(
            owned(&m.request(1).unwrap_or_default()),
            vec![(A, vec![0]), (B, vec![0, 1])]
        );
    }

    #[test]
    fn an_unknown_topic_id_stays_in_the_target() {
        let mut m = joined();
        assert!(matches!(
            m.on_response(ok(7, Some(&[(A, &[0, 1]), (B, &[0]), ([9; 16], &[0])]))),
            Step::Beat
        ));
        m.reconciled(&[], &[]); // the name of topic 9 is not known yet
        assert_eq!(m.plan().map(|p| p.1), Some(vec![([9; 16], 0)]));
    }

    #[test]
    fn fenced_member_epoch_and_unknown_member_id_drop_everything_and_rejoin() {
        for code in [ErrorCode::FencedMemberEpoch, ErrorCode::UnknownMemberId] {
            let mut m = joined();
            let id = m.member_id.clone();
            let Step::Lost(e, lost) = m.on_response(err(code)) else {
                panic!("{code:?}: not lost");
            };
            assert_eq!(e.kafka_code(), Some(code));
            assert_eq!(
                flatten(&lost).len(),
                3,
                "{code:?}: every owned partition is lost"
            );
            let rejoin = m.request(1).unwrap_or_default();
            assert_eq!(rejoin.member_epoch, 0, "{code:?}");
            assert_eq!(rejoin.member_id, id, "{code:?}: the member id is kept");
            assert_eq!(rejoin.topic_partitions, Some(vec![]), "{code:?}");
            assert!(m.plan().is_none());
        }
    }

    #[test]
    fn unreleased_instance_id_is_a_clear_error_and_the_join_is_retried() {
        let mut m = member(Some("worker-7"));
        let Step::Fatal(e) = m.on_response(err(ErrorCode::UnreleasedInstanceId)) else {
            panic!("not fatal");
        };
        assert_eq!(e.kafka_code(), Some(ErrorCode::UnreleasedInstanceId));
        let text = e.to_string();
        assert!(
            text.contains("worker-7") && text.contains("still held"),
            "{text}"
        );
        assert_eq!(m.request(1).unwrap_or_default().member_epoch, 0);
    }

    #[test]
    fn unsupported_assignor_is_a_clear_error() {
        let mut m = member(None);
        let Step::Fatal(e) = m.on_response(err(ErrorCode::UnsupportedAssignor)) else {
            panic!("not fatal");
        };
        let text = e.to_string();
        assert!(
            text.contains("\"range\"")
                && text.contains("group_remote_assignor")
                && text.contains("scripted"),
            "{text}"
        );
    }

    #[test]
    fn coordinator_errors_are_retried_keeping_the_membership() {
        for code in [
            ErrorCode::NotCoordinator,
            ErrorCode::CoordinatorNotAvailable,
            ErrorCode::CoordinatorLoadInProgress,
        ] {
            let mut m = joined();
            assert!(
                matches!(m.on_response(err(code)), Step::Retry(_)),
                "{code:?}"
            );
            assert_eq!(m.epoch, 5);
            assert_eq!(flatten(&m.owned).len(), 3);
        }
        let mut m = joined();
        let io = Error::new(ErrorKind::Io, "connection reset");
        assert!(matches!(m.on_response(Err(io)), Step::Retry(_)));
    }

    #[test]
    fn leaving() {
        let m = joined();
        let leave = m.leave_request();
        assert_eq!(
            (leave.member_epoch, leave.member_id.as_str()),
            (-1, m.member_id.as_str())
        );
        let mut s = member(Some("i-1"));
        assert!(matches!(s.on_response(ok(2, None)), Step::Beat));
        let leave = s.leave_request();
        assert_eq!(leave.member_epoch, -2, "a static member leaves temporarily");
        assert_eq!(leave.instance_id.as_deref(), Some("i-1"));
    }

    #[test]
    fn a_granted_partition_is_wanted_until_owned() {
        let mut m = joined();
        assert!(!m.wants(&A, 0), "owned, no target");
        assert!(matches!(
            m.on_response(ok(6, Some(&[(A, &[0]), (B, &[0, 1])]))),
            Step::Beat
        ));
        assert!(m.wants(&B, 1));
        assert!(!m.wants(&A, 1), "revoked");
        // an assignment that arrived meanwhile no longer grants b-1: not started
        assert!(matches!(
            m.on_response(ok(7, Some(&[(A, &[0]), (B, &[0])]))),
            Step::Beat
        ));
        assert!(!m.wants(&B, 1));
    }

    #[test]
    fn expiry_outlasts_any_broker_session() {
        let config = crate::reader::ReaderConfig::new(["localhost:9092"])
            .session_timeout(Duration::from_secs(30))
            .rebalance_timeout(Duration::from_secs(60));
        // the broker's cap on sessions (60 s by default) and the rebalance timeout,
        // whatever the heartbeat interval
        assert_eq!(expiry(&config), Duration::from_secs(120));
        // a longer session the application says the broker allows
        let long = config.session_timeout(Duration::from_secs(300));
        assert_eq!(expiry(&long), Duration::from_secs(360));
    }

    #[test]
    fn unknown_topic_ids_are_looked_up_with_backoff() {
        let mut waits = vec![];
        let mut w = Duration::ZERO;
        for _ in 0..8 {
            w = names_backoff(w);
            waits.push(w.as_millis());
        }
        assert_eq!(waits, [250, 500, 1000, 2000, 4000, 5000, 5000, 5000]);
    }

    #[test]
    fn regex_subscription() {
        let mut m = member(None);
        m.config.topics.clear();
        m.config.regex = Some("orders-.*".into());
        let join = m.request(1).unwrap_or_default();
        assert_eq!(join.subscribed_topic_names, None);
        assert_eq!(join.subscribed_topic_regex.as_deref(), Some("orders-.*"));
        assert!(m.request(0).is_err(), "v0 has no regex");
    }
}
