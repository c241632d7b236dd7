//! [`GroupTask`]: the group task of a group reader — the classic protocol's run loop
//! (generation after generation: join, take the partitions, heartbeat, revoke, rejoin,
//! close), retries and error reporting, and taking partitions in and giving them up (used
//! by the KIP-848 engine in `consumer.rs` as well). The classic requests themselves are in
//! `classic.rs`.

use super::*;

/// What the reader's group task works with.
pub(crate) struct GroupTask {
    pub(crate) group: Arc<GroupShared>,
    pub(crate) reader: Arc<crate::reader::Shared>,
}

pub(super) struct Joined {
    pub(super) generation: i32,
    pub(super) member_id: String,
    pub(super) leader: String,
    pub(super) protocol: String,
    pub(super) members: Vec<JoinGroupResponseMember>,
}

/// A task aborted when its handle is dropped.
pub(super) struct AbortOnDrop(pub(super) tokio::task::JoinHandle<Result<()>>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Why a generation ended.
pub(super) enum End {
    /// Rejoin, committing first.
    Rejoin,
    /// The membership is gone: drop the partitions without committing.
    Lost {
        forget_member_id: bool,
    },
    Close,
}

impl GroupTask {
    pub(super) fn config(&self) -> &ReaderConfig {
        &self.reader.config
    }

    /// KIP-429 incremental rebalancing: only if every offered assignor supports it (as
    /// in the Java client), so the protocol never changes with the chosen assignor.
    pub(super) fn cooperative(&self) -> bool {
        self.config()
            .assignors
            .iter()
            .all(|a| a.protocol() == RebalanceProtocol::Cooperative)
    }

    /// The subscribed topics: those configured plus those the patterns match now.
    pub(super) async fn subscribed(&self) -> Result<Vec<String>> {
        if !self.config().has_topic_patterns() {
            return Ok(self.topics());
        }
        Ok(self.matching(&self.group.admin.list_topics().await?))
    }

    pub(super) fn matching(&self, listing: &[crate::admin::TopicListing]) -> Vec<String> {
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
    pub(super) async fn changed(&self, watched: &Watched) -> Result<bool> {
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

    pub(super) fn topics(&self) -> Vec<String> {
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
    pub(super) fn failed(&self, streak: &mut Streak, what: &str, e: Error) -> Duration {
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
    pub(super) fn report(&self, e: Error) {
        let e = super::naming_group(e, &self.group.group_id);
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
    pub(super) fn end_stream(&self) {
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
    pub(super) async fn run_classic(self) {
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
}

impl GroupTask {
    /// Start reading `partitions` at their committed offsets.
    pub(super) async fn take(
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
    pub(super) async fn give_up(&self, partitions: &[TopicPartition], lost: bool) {
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
}
