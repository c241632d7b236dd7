//! The classic group protocol's requests for the [`GroupTask`]: JoinGroup and SyncGroup
//! (with the leader's assignment), heartbeats during a generation and while other work
//! runs, LeaveGroup.

use super::*;

impl GroupTask {
    /// JoinGroup and SyncGroup over the coordinator connection: the generation and this
    /// member's partitions. A coordinator lost on the way is marked unknown (found
    /// again on the next attempt).
    pub(super) async fn join_and_sync(
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

    pub(super) async fn join_and_sync_on(
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

    pub(super) async fn join(
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
    pub(super) async fn assign(
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
}

impl GroupTask {
    /// Run `f` (the revoke hook) while a classic member keeps heartbeating every
    /// heartbeat interval, as the Java client's heartbeat thread does during
    /// `onPartitionsRevoked`, so a hook slower than the session timeout does not expire
    /// the membership. Heartbeat answers are ignored (`REBALANCE_IN_PROGRESS` is
    /// expected; a lost membership shows in the commit and the next join). A KIP-848
    /// member gives partitions up in a task beside its heartbeats: `f` just runs.
    pub(super) async fn with_heartbeats<T>(&self, f: impl std::future::Future<Output = T>) -> T {
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

    pub(super) async fn heartbeat_loop(
        &self,
        generation: i32,
        member_id: &str,
        watched: &Watched,
    ) -> End {
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
        let mut commit = super::commit::interval_timer(commit_every);
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
    pub(super) async fn heartbeat(
        &self,
        req: &HeartbeatRequest,
        send_timeout: Duration,
    ) -> Result<()> {
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
    pub(super) async fn leave(&self, member_id: &str) {
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
        match tokio::time::timeout(self.config().connection.request_timeout, r).await {
            Ok(Ok(())) => info!(group = %g.group_id, member_id, "left group"),
            Ok(Err(e)) => warn!(group = %g.group_id, error = %e, "LeaveGroup failed"),
            Err(_) => warn!(group = %g.group_id, "LeaveGroup timed out"),
        }
    }
}
