//! [`GroupShared`]: the state a group reader, its committers and its group task share —
//! the coordinator, the owned partitions' commit bookkeeping, the current membership
//! (generation, member id), the event queue, the revoke hook and the exactly-once link —
//! and the commits made from it (pending, revoked, on close).

use super::*;

/// State shared by a group reader, its committers and its group task.
pub(crate) struct GroupShared {
    pub(crate) group_id: String,
    pub(crate) instance_id: Option<String>,
    pub(crate) admin: Admin,
    /// The dedicated coordinator connection (heartbeats, join, sync, commits).
    pub(super) coord: Coordinator,
    /// How long one coordinator request may take (OffsetCommit, OffsetFetch).
    pub(super) request_timeout: Duration,
    pub(crate) mode: CommitMode,
    pub(crate) contiguous: bool,
    pub(crate) max_unacked: usize,
    /// The reader's poll count and consumer waker, shared with every track.
    pub(crate) pulse: Arc<Pulse>,
    pub(super) commits: Mutex<Commits>,
    /// Generation and member id of the current membership.
    pub(super) member: Mutex<(i32, String)>,
    /// Woken whenever `member` changes ([`GroupShared::set_member`]).
    pub(super) member_moved: Notify,
    pub(super) events: Mutex<Events>,
    pub(super) commit_lock: tokio::sync::Mutex<()>,
    /// How long a commit of revoked partitions (or on close) and the OffsetFetch of a
    /// join keep retrying retriable failures (coordinator moved or unreachable): the
    /// rebalance timeout, at least 5 s, as the coordinator waits no longer for the
    /// member's rejoin.
    pub(super) commit_timeout: Duration,
    /// How long other commits (the interval's, the [`Committer`]'s) keep retrying:
    /// [`ReaderConfig::retry_timeout`].
    pub(super) retry_timeout: Duration,
    /// The group task's `warn` rate limit of retried failures.
    pub(super) warn_limit: WarnLimit,
    pub(crate) closing: AtomicBool,
    pub(crate) wake: Notify,
    /// The exactly-once pipeline that owns this group's commits, if one took over.
    pub(crate) txn: txn_link::TxnLink,
    /// [`ReaderConfig::on_revoke`](crate::reader::ReaderConfig::on_revoke).
    pub(super) on_revoke: Option<SharedRevokeHook>,
    /// Keeps the hook's calls (a revoke, the close) from overlapping.
    pub(super) hook_lock: tokio::sync::Mutex<()>,
    /// How long the hook may take: the rebalance timeout.
    pub(super) hook_timeout: Duration,
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
pub(super) fn coordinator_step(config: &ReaderConfig) -> Duration {
    config
        .heartbeat_interval
        .saturating_mul(2)
        .clamp(Duration::from_secs(2), Duration::from_secs(5))
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
            request_timeout: config.connection.request_timeout,
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
    pub(super) async fn commit_pending_within(
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
    pub(super) async fn membership_moved(&self, generation: i32, member_id: &str) {
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
    pub(super) async fn commit_now(
        &self,
        only: Option<&[TopicPartition]>,
        within: Duration,
    ) -> Result<()> {
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

    pub(super) fn push_event(&self, e: GroupEvent) {
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

    pub(super) fn closing(&self) -> bool {
        self.closing.load(Ordering::SeqCst)
    }

    /// How long a close may wait for the group task: the wait for held tokens (the
    /// rebalance timeout), the final commit (its own retry budget) and LeaveGroup,
    /// with a request timeout to spare.
    pub(crate) fn close_bound(&self, config: &ReaderConfig) -> Duration {
        config
            .rebalance_timeout
            .saturating_add(self.commit_timeout)
            .saturating_add(config.connection.request_timeout.saturating_mul(2))
    }
}
