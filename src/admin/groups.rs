//! Groups and their committed offsets, routed to each group's coordinator.

use std::collections::BTreeMap;
use std::future::Future;

use tracing::debug;

use super::{
    code_error, Admin, CommittedOffset, ConsumerGroupDescription, ConsumerGroupMemberDescription,
    GroupDescription, GroupListing, MemberDescription, OffsetFetchOptions, OffsetSpec, Results,
    TopicPartition,
};
use crate::conn::Connection;
use crate::error::{Error, Result};
use crate::protocol::consumer_protocol::{Assignment, Subscription};
use crate::protocol::messages::{
    ConsumerGroupDescribeAssignment, ConsumerGroupDescribeRequest, ConsumerGroupDescribedGroup,
    DeleteGroupsRequest, DescribeGroupsRequest, DescribedGroup, FindCoordinatorRequest,
    ListGroupsRequest, OffsetCommitRequest, OffsetCommitRequestPartition, OffsetCommitRequestTopic,
    OffsetDeleteRequest, OffsetDeleteRequestPartition, OffsetDeleteRequestTopic,
    OffsetFetchRequest, OffsetFetchRequestGroup, OffsetFetchRequestTopic, OffsetFetchRequestTopics,
};
use crate::protocol::{ErrorCode, Request};

/// Whether `code` means "ask the coordinator again" (after finding it again).
fn coordinator_moved(code: ErrorCode) -> bool {
    matches!(
        code,
        ErrorCode::NotCoordinator
            | ErrorCode::CoordinatorNotAvailable
            | ErrorCode::CoordinatorLoadInProgress
    )
}

/// The description of a group that DescribeGroups found without error.
fn describe(d: DescribedGroup, coordinator: i32) -> GroupDescription {
    let consumer = d.protocol_type == "consumer";
    GroupDescription {
        group_id: d.group_id,
        state: d.group_state,
        protocol_type: d.protocol_type,
        protocol: d.protocol_data,
        coordinator,
        members: d
            .members
            .into_iter()
            .map(|m| MemberDescription {
                subscription: (consumer && !m.member_metadata.is_empty())
                    .then(|| Subscription::decode(m.member_metadata.clone()).ok())
                    .flatten(),
                decoded_assignment: consumer
                    .then(|| Assignment::decode(m.member_assignment.clone()).ok())
                    .flatten(),
                member_id: m.member_id,
                group_instance_id: m.group_instance_id,
                client_id: m.client_id,
                client_host: m.client_host,
                metadata: m.member_metadata,
                assignment: m.member_assignment,
            })
            .collect(),
    }
}

fn consumer_assignment(a: ConsumerGroupDescribeAssignment) -> Vec<TopicPartition> {
    let mut v: Vec<TopicPartition> = a
        .topic_partitions
        .into_iter()
        .flat_map(|t| {
            let topic = t.topic_name;
            t.partitions
                .into_iter()
                .map(move |p| TopicPartition::new(topic.clone(), p))
        })
        .collect();
    v.sort();
    v
}

/// The description of a group that ConsumerGroupDescribe found without error.
fn describe_consumer(d: ConsumerGroupDescribedGroup, coordinator: i32) -> ConsumerGroupDescription {
    ConsumerGroupDescription {
        group_id: d.group_id,
        state: d.group_state,
        group_epoch: d.group_epoch,
        assignment_epoch: d.assignment_epoch,
        assignor: d.assignor_name,
        coordinator,
        members: d
            .members
            .into_iter()
            .map(|m| ConsumerGroupMemberDescription {
                member_id: m.member_id,
                instance_id: m.instance_id,
                rack_id: m.rack_id,
                member_epoch: m.member_epoch,
                client_id: m.client_id,
                client_host: m.client_host,
                subscribed_topics: m.subscribed_topic_names,
                subscribed_regex: m.subscribed_topic_regex,
                assignment: consumer_assignment(m.assignment),
                target_assignment: consumer_assignment(m.target_assignment),
                classic: match m.member_type {
                    0 => Some(true),
                    1 => Some(false),
                    _ => None,
                },
            })
            .collect(),
    }
}

/// Partitions grouped by topic, in first-seen order.
/// One result per requested partition from a response's per-partition error codes
/// (`code_of(topic, partition)`); a partition the response leaves out is a protocol error.
fn partition_results<'a>(
    requested: impl Iterator<Item = &'a TopicPartition>,
    api: &str,
    code_of: impl Fn(&str, i32) -> Option<i16>,
) -> Vec<(TopicPartition, Result<()>)> {
    requested
        .map(|tp| {
            let r = match code_of(&tp.topic, tp.partition) {
                None => Err(Error::protocol(format!(
                    "{api} response does not mention the partition"
                ))),
                Some(c) => match ErrorCode::non_zero(c) {
                    Some(code) => Err(Error::kafka(code)),
                    None => Ok(()),
                },
            };
            (
                tp.clone(),
                r.map_err(|e| e.with_topic(&tp.topic).with_partition(tp.partition)),
            )
        })
        .collect()
}

fn by_topic<T: Clone>(items: &[(TopicPartition, T)]) -> Vec<(String, Vec<(i32, T)>)> {
    let mut out: Vec<(String, Vec<(i32, T)>)> = Vec::new();
    for (tp, v) in items {
        match out.iter_mut().find(|(t, _)| *t == tp.topic) {
            Some((_, ps)) => ps.push((tp.partition, v.clone())),
            None => out.push((tp.topic.clone(), vec![(tp.partition, v.clone())])),
        }
    }
    out
}

impl Admin {
    /// The broker id coordinating `group` (FindCoordinator, batched form from v4).
    ///
    /// ```no_run
    /// # async fn demo(admin: kafkapipe::admin::Admin) -> kafkapipe::Result<()> {
    /// let broker_id = admin.find_coordinator("my-group").await?;
    /// # Ok(()) }
    /// ```
    pub async fn find_coordinator(&self, group: &str) -> Result<i32> {
        self.retry("FindCoordinator", || async move {
            let (_, c) = self.any_connection().await?;
            Self::find_coordinator_on(&c, group).await
        })
        .await
    }

    /// FindCoordinator for `group` asked of the broker behind `c`, once.
    pub(crate) async fn find_coordinator_on(c: &Connection, group: &str) -> Result<i32> {
        Self::find_coordinator_key_on(c, group, 0).await
    }

    /// FindCoordinator for `group` (a group id with `key_type` 0, a transactional id
    /// with 1) asked of the broker behind `c`, once.
    pub(crate) async fn find_coordinator_key_on(
        c: &Connection,
        group: &str,
        key_type: i8,
    ) -> Result<i32> {
        let v = c.version_for::<FindCoordinatorRequest>()?;
        if key_type != 0 && v < 1 {
            return Err(Error::new(
                crate::error::ErrorKind::UnsupportedVersion,
                "FindCoordinator v1+ is needed to find a transaction coordinator",
            ));
        }
        let req = FindCoordinatorRequest {
            key: group.to_string(),
            key_type,
            coordinator_keys: if v >= 4 {
                vec![group.to_string()]
            } else {
                Vec::new()
            },
            ..Default::default()
        };
        let resp = c.send_version(&req, v).await?;
        let (code, msg, node) = if v >= 4 {
            let co = resp
                .coordinators
                .iter()
                .find(|co| co.key == group)
                .ok_or_else(|| {
                    Error::protocol("FindCoordinator response does not mention the group")
                })?;
            (co.error_code, co.error_message.clone(), co.node_id)
        } else {
            (resp.error_code, resp.error_message.clone(), resp.node_id)
        };
        match ErrorCode::non_zero(code) {
            Some(code) => Err(code_error(code, msg.as_deref()).with_broker(c.broker())),
            None => {
                debug!(group, coordinator = node, "found group coordinator");
                Ok(node)
            }
        }
    }

    /// The coordinator of `group`: cached, else found with FindCoordinator.
    pub(super) async fn coordinator(&self, group: &str) -> Result<i32> {
        if let Some(node) = self.coordinator_cache().get(group).copied() {
            return Ok(node);
        }
        let node = self.find_coordinator(group).await?;
        self.coordinator_cache().insert(group.to_string(), node);
        Ok(node)
    }

    /// Forget `group`'s cached coordinator (after it failed retriably).
    pub(super) fn forget_coordinator(&self, group: &str) {
        self.coordinator_cache().remove(group);
    }

    fn coordinator_cache(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, i32>> {
        self.coordinators
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Run `f` against `group`'s coordinator (cached), finding it again and retrying when
    /// `f` fails retriably (for example with `NotCoordinator`).
    pub(super) async fn with_coordinator<T, F, Fut>(
        &self,
        op: &'static str,
        group: &str,
        f: F,
    ) -> Result<T>
    where
        F: Fn(Connection, i32) -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        let f = &f;
        self.retry(op, || async move {
            let node = self.coordinator(group).await?;
            let r = match self.cluster.connection(node).await {
                Ok(c) => f(c, node).await,
                Err(e) => Err(e),
            };
            if r.as_ref().is_err_and(Error::is_retriable) {
                self.forget_coordinator(group);
            }
            r
        })
        .await
    }

    /// Every group of the cluster (ListGroups to every broker), sorted by id.
    ///
    /// # Errors
    ///
    /// The first broker's error if a broker cannot be asked after the retries (a partial
    /// list would look complete).
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn demo(admin: kafkapipe::admin::Admin) -> kafkapipe::Result<()> {
    /// for g in admin.list_groups().await? {
    ///     println!("{} {:?} {}", g.group_id, g.state, g.protocol_type);
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn list_groups(&self) -> Result<Vec<GroupListing>> {
        let md = self.metadata(Some(&[])).await?;
        let lists = md.brokers.iter().map(|b| {
            let id = b.id;
            self.retry("ListGroups", move || async move {
                let c = self.cluster.connection(id).await?;
                let v = c.version_for::<ListGroupsRequest>()?;
                let resp = c.send_version(&ListGroupsRequest::default(), v).await?;
                if let Some(code) = ErrorCode::non_zero(resp.error_code) {
                    return Err(Error::kafka(code).with_broker(c.broker()));
                }
                Ok(resp
                    .groups
                    .into_iter()
                    .map(|g| GroupListing {
                        group_id: g.group_id,
                        protocol_type: g.protocol_type,
                        state: (v >= 4).then_some(g.group_state),
                        group_type: (v >= 5).then_some(g.group_type),
                        coordinator: id,
                    })
                    .collect::<Vec<_>>())
            })
        });
        let mut out = Vec::new();
        for r in futures::future::join_all(lists).await {
            out.extend(r?);
        }
        out.sort_by(|a, b| a.group_id.cmp(&b.group_id));
        Ok(out)
    }

    /// Describe `groups` at their coordinators, one request per coordinator (retried
    /// through [`Admin::fan_out`]): `request` builds it from the group ids, `entries`
    /// takes the described groups out of the response, `header` reads a group's id, error
    /// code and message, and `describe` builds the result of a group without error from
    /// it and its coordinator's node id.
    pub(super) async fn describe_at_coordinators<Req, D, V>(
        &self,
        op: &'static str,
        groups: &[&str],
        request: impl Fn(Vec<String>) -> Req,
        entries: impl Fn(Req::Response) -> Vec<D>,
        header: impl Fn(&D) -> (String, i16, Option<String>),
        describe: impl Fn(D, i32) -> V,
    ) -> Result<Results<String, V>>
    where
        Req: Request,
    {
        let items: Vec<(String, ())> = groups.iter().map(|g| ((*g).to_string(), ())).collect();
        let (request, entries, header, describe) = (&request, &entries, &header, &describe);
        Ok(self
            .fan_out(
                op,
                items,
                |g: String| async move { self.coordinator(&g).await },
                |g: &String| self.forget_coordinator(g),
                |c, node, batch| async move {
                    let req = request(batch.into_iter().map(|(g, ())| g).collect());
                    let resp = c.send(&req).await?;
                    Ok(entries(resp)
                        .into_iter()
                        .map(|d| {
                            let (id, code, message) = header(&d);
                            let r =
                                match ErrorCode::non_zero(code) {
                                    Some(code) => Err(code_error(code, message.as_deref())
                                        .with_broker(c.broker())),
                                    None => Ok(describe(d, node)),
                                };
                            (id, r)
                        })
                        .collect())
                },
            )
            .await)
    }

    /// Describe groups: state, protocol and members, with consumer-group subscriptions
    /// and assignments decoded. One result per group.
    ///
    /// A group that does not exist is reported by Kafka as state `Dead` (or, from
    /// DescribeGroups v6, `GroupIdNotFound`); tansu 0.6 reports it as `Empty`.
    ///
    /// ```no_run
    /// # async fn demo(admin: kafkapipe::admin::Admin) -> kafkapipe::Result<()> {
    /// let (_, group) = admin.describe_groups(&["my-group"]).await?.remove(0);
    /// for m in group?.members {
    ///     let assigned = m.decoded_assignment.map(|a| a.partitions);
    ///     println!("{} {} {:?}", m.member_id, m.client_host, assigned);
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn describe_groups(
        &self,
        groups: &[&str],
    ) -> Result<Results<String, GroupDescription>> {
        self.describe_at_coordinators(
            "DescribeGroups",
            groups,
            |ids| DescribeGroupsRequest {
                groups: ids,
                ..Default::default()
            },
            |resp| resp.groups,
            |d| (d.group_id.clone(), d.error_code, d.error_message.clone()),
            describe,
        )
        .await
    }

    /// Describe groups of the consumer protocol (KIP-848; ConsumerGroupDescribe, Kafka
    /// 4.0+): state, epochs, the server assignor, and each member's subscription, owned
    /// and target partitions. One result per group; a group that does not exist, or is a
    /// classic group, is `GroupIdNotFound` (use [`Admin::describe_groups`] for those).
    ///
    /// ```no_run
    /// # async fn demo(admin: kafkapipe::admin::Admin) -> kafkapipe::Result<()> {
    /// let (_, group) = admin.describe_consumer_groups(&["my-group"]).await?.remove(0);
    /// for m in group?.members {
    ///     println!("{} epoch {} owns {:?}", m.member_id, m.member_epoch, m.assignment);
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// `UnsupportedVersion` if the coordinator does not offer ConsumerGroupDescribe.
    pub async fn describe_consumer_groups(
        &self,
        groups: &[&str],
    ) -> Result<Results<String, ConsumerGroupDescription>> {
        self.describe_at_coordinators(
            "ConsumerGroupDescribe",
            groups,
            |ids| ConsumerGroupDescribeRequest {
                group_ids: ids,
                ..Default::default()
            },
            |resp| resp.groups,
            |d| (d.group_id.clone(), d.error_code, d.error_message.clone()),
            describe_consumer,
        )
        .await
    }

    /// Delete groups (they must have no members) with their committed offsets. One
    /// result per group.
    ///
    /// ```no_run
    /// # async fn demo(admin: kafkapipe::admin::Admin) -> kafkapipe::Result<()> {
    /// admin.delete_groups(&["my-group"]).await?.remove(0).1?;
    /// # Ok(()) }
    /// ```
    pub async fn delete_groups(&self, groups: &[&str]) -> Result<Results<String>> {
        let items: Vec<(String, ())> = groups.iter().map(|g| ((*g).to_string(), ())).collect();
        Ok(self
            .fan_out(
                "DeleteGroups",
                items,
                |g: String| async move { self.coordinator(&g).await },
                |g: &String| self.forget_coordinator(g),
                |c, _, batch| async move {
                    let req = DeleteGroupsRequest {
                        groups_names: batch.into_iter().map(|(g, ())| g).collect(),
                        ..Default::default()
                    };
                    let resp = c.send(&req).await?;
                    Ok(resp
                        .results
                        .into_iter()
                        .map(|r| {
                            let result = match ErrorCode::non_zero(r.error_code) {
                                Some(code) => Err(Error::kafka(code).with_broker(c.broker())),
                                None => Ok(()),
                            };
                            (r.group_id, result)
                        })
                        .collect())
                },
            )
            .await)
    }

    /// The offsets `group` committed, for `topics` (`None`: every topic it committed
    /// for). One result per partition; a partition without a committed offset has
    /// offset `-1`.
    ///
    /// # Errors
    ///
    /// The metadata error of a topic in `topics` that does not exist (its partitions are
    /// needed for the request), or the group's error.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn demo(admin: kafkapipe::admin::Admin) -> kafkapipe::Result<()> {
    /// for (tp, r) in admin.fetch_group_offsets("my-group", Some(&["events"])).await? {
    ///     println!("{tp}: {}", r?.offset);
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn fetch_group_offsets(
        &self,
        group: &str,
        topics: Option<&[&str]>,
    ) -> Result<Results<TopicPartition, CommittedOffset>> {
        self.fetch_group_offsets_with(group, topics, &OffsetFetchOptions::default())
            .await
    }

    /// [`Admin::fetch_group_offsets`] with options: with
    /// [`OffsetFetchOptions::require_stable`], only stable offsets — the read to use
    /// when an answer must include every commit the coordinator acknowledged (on Kafka
    /// 4.x a non-stable read can lag them for a moment after a coordinator failover).
    /// Partitions answering `UNSTABLE_OFFSET_COMMIT` (a transaction still committing
    /// offsets) are asked again, as Java's consumer does, under the retry policy of
    /// [`Admin::with_retries`]; if they stay unstable, their result is that error.
    ///
    /// # Errors
    ///
    /// As for [`Admin::fetch_group_offsets`].
    ///
    /// # Example
    ///
    /// ```no_run
    /// use kafkapipe::admin::OffsetFetchOptions;
    /// # async fn demo(admin: kafkapipe::admin::Admin) -> kafkapipe::Result<()> {
    /// let stable = OffsetFetchOptions::new().require_stable(true);
    /// for (tp, r) in admin.fetch_group_offsets_with("my-group", Some(&["events"]), &stable).await? {
    ///     println!("{tp}: {}", r?.offset);
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Cancellation safety
    ///
    /// Cancel safe: it only reads.
    pub async fn fetch_group_offsets_with(
        &self,
        group: &str,
        topics: Option<&[&str]>,
        options: &OffsetFetchOptions,
    ) -> Result<Results<TopicPartition, CommittedOffset>> {
        let wanted = self.offset_fetch_wanted(topics).await?;
        let wanted = wanted.as_deref();
        let stable = options.require_stable;
        let mut attempt = 0;
        loop {
            let fetched = self
                .with_coordinator("OffsetFetch", group, |c, node| async move {
                    let r = Self::offset_fetch_on(&c, group, wanted, stable).await;
                    debug!(
                        group,
                        broker = node,
                        require_stable = stable,
                        ok = r.is_ok(),
                        "OffsetFetch answered"
                    );
                    r
                })
                .await?;
            let unstable = fetched.iter().any(|(_, r)| {
                r.as_ref()
                    .is_err_and(|e| e.kafka_code() == Some(ErrorCode::UnstableOffsetCommit))
            });
            if !unstable || attempt + 1 >= self.attempts {
                return Ok(fetched);
            }
            let delay = self.delay(attempt);
            debug!(
                group,
                attempt,
                delay_ms = delay.as_millis() as u64,
                "unstable offsets (a transaction is committing them); fetching again"
            );
            tokio::time::sleep(delay).await;
            attempt += 1;
        }
    }

    /// The partitions of `topics` (every partition of each), for an OffsetFetch.
    pub(crate) async fn offset_fetch_wanted(
        &self,
        topics: Option<&[&str]>,
    ) -> Result<Option<Vec<(String, Vec<i32>)>>> {
        let mut wanted: Option<Vec<(String, Vec<i32>)>> = None;
        if let Some(ts) = topics {
            let mut v = Vec::new();
            for t in ts {
                v.push(((*t).to_string(), self.cluster.partitions(t).await?));
            }
            wanted = Some(v);
        }
        Ok(wanted)
    }

    /// OffsetFetch of `group` (the `wanted` partitions, or all) over `c`, once;
    /// `require_stable` (v7+): pending transactional offsets answer `UNSTABLE_OFFSET_COMMIT`.
    pub(crate) async fn offset_fetch_on(
        c: &Connection,
        group: &str,
        wanted: Option<&[(String, Vec<i32>)]>,
        require_stable: bool,
    ) -> Result<Results<TopicPartition, CommittedOffset>> {
        let v = c.version_for::<OffsetFetchRequest>()?;
        let req = if v >= 8 {
            OffsetFetchRequest {
                groups: vec![OffsetFetchRequestGroup {
                    group_id: group.to_string(),
                    topics: wanted.as_ref().map(|w| {
                        w.iter()
                            .map(|(t, ps)| OffsetFetchRequestTopics {
                                name: t.clone(),
                                partition_indexes: ps.clone(),
                                ..Default::default()
                            })
                            .collect()
                    }),
                    ..Default::default()
                }],
                require_stable,
                ..Default::default()
            }
        } else {
            OffsetFetchRequest {
                group_id: group.to_string(),
                topics: wanted.as_ref().map(|w| {
                    w.iter()
                        .map(|(t, ps)| OffsetFetchRequestTopic {
                            name: t.clone(),
                            partition_indexes: ps.clone(),
                            ..Default::default()
                        })
                        .collect()
                }),
                require_stable,
                ..Default::default()
            }
        };
        let resp = c.send_version(&req, v).await?;
        let mut out = Vec::new();
        let mut push = |topic: &str,
                        partition: i32,
                        offset: i64,
                        epoch: i32,
                        meta: Option<String>,
                        code: i16| {
            let tp = TopicPartition::new(topic, partition);
            let r = match ErrorCode::non_zero(code) {
                Some(code) => Err(Error::kafka(code)
                    .with_topic(topic)
                    .with_partition(partition)),
                None => Ok(CommittedOffset {
                    offset,
                    leader_epoch: epoch,
                    metadata: meta,
                }),
            };
            out.push((tp, r));
        };
        let group_code = if v >= 8 {
            let g = resp
                .groups
                .into_iter()
                .find(|g| g.group_id == group)
                .ok_or_else(|| {
                    Error::protocol("OffsetFetch response does not mention the group")
                })?;
            for t in g.topics {
                for p in t.partitions {
                    push(
                        &t.name,
                        p.partition_index,
                        p.committed_offset,
                        p.committed_leader_epoch,
                        p.metadata,
                        p.error_code,
                    );
                }
            }
            g.error_code
        } else {
            for t in resp.topics {
                for p in t.partitions {
                    push(
                        &t.name,
                        p.partition_index,
                        p.committed_offset,
                        p.committed_leader_epoch,
                        p.metadata,
                        p.error_code,
                    );
                }
            }
            resp.error_code
        };
        if let Some(code) = ErrorCode::non_zero(group_code) {
            return Err(Error::kafka(code).with_broker(c.broker()));
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(out)
    }

    /// Commit `offsets` for `group` as an admin (generation -1, no member: the group must
    /// have no active members, as with `kafka-consumer-groups --reset-offsets`). One
    /// result per partition.
    ///
    /// ```no_run
    /// # use kafkapipe::admin::TopicPartition;
    /// # async fn demo(admin: kafkapipe::admin::Admin) -> kafkapipe::Result<()> {
    /// let offsets = [(TopicPartition::new("events", 0), 42)];
    /// admin.commit_group_offsets("my-group", &offsets).await?.remove(0).1?;
    /// # Ok(()) }
    /// ```
    pub async fn commit_group_offsets(
        &self,
        group: &str,
        offsets: &[(TopicPartition, i64)],
    ) -> Result<Results<TopicPartition>> {
        self.commit_offsets_as(group, -1, "", None, offsets).await
    }

    /// Commit `offsets` for `group` as member `member_id` of `generation` (a consumer
    /// group member's commit; `-1` and `""` for an admin commit).
    pub(crate) async fn commit_offsets_as(
        &self,
        group: &str,
        generation: i32,
        member_id: &str,
        group_instance_id: Option<&str>,
        offsets: &[(TopicPartition, i64)],
    ) -> Result<Results<TopicPartition>> {
        let req =
            &Self::offset_commit_request(group, generation, member_id, group_instance_id, offsets);
        self.with_coordinator("OffsetCommit", group, |c, _| async move {
            Self::offset_commit_on(&c, req, offsets).await
        })
        .await
    }

    /// The OffsetCommit request committing `offsets` for `group` as `member_id` of
    /// `generation`.
    pub(crate) fn offset_commit_request(
        group: &str,
        generation: i32,
        member_id: &str,
        group_instance_id: Option<&str>,
        offsets: &[(TopicPartition, i64)],
    ) -> OffsetCommitRequest {
        OffsetCommitRequest {
            group_id: group.to_string(),
            generation_id_or_member_epoch: generation,
            member_id: member_id.to_string(),
            group_instance_id: group_instance_id.map(str::to_string),
            retention_time_ms: -1,
            topics: by_topic(offsets)
                .into_iter()
                .map(|(name, ps)| OffsetCommitRequestTopic {
                    name,
                    partitions: ps
                        .into_iter()
                        .map(|(p, o)| OffsetCommitRequestPartition {
                            partition_index: p,
                            committed_offset: o,
                            committed_leader_epoch: -1,
                            committed_metadata: None,
                            ..Default::default()
                        })
                        .collect(),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    /// Send `req` (committing `offsets`) over `c`, once: one result per partition; a
    /// coordinator move reported for any partition is the whole call's error.
    pub(crate) async fn offset_commit_on(
        c: &Connection,
        req: &OffsetCommitRequest,
        offsets: &[(TopicPartition, i64)],
    ) -> Result<Results<TopicPartition>> {
        let (group, generation) = (&req.group_id, req.generation_id_or_member_epoch);
        // One debug line per partition sent and answered, with the correlation id: the
        // offsets a member sends and has acknowledged can be followed (and checked to
        // never go back) from the log alone.
        let sent = c.send_observed(req, |correlation_id| {
            for t in &req.topics {
                for p in &t.partitions {
                    debug!(group = %group, generation, member_id = %req.member_id, broker = %c.broker(), topic = %t.name, partition = p.partition_index, offset = p.committed_offset, correlation_id, "OffsetCommit sent");
                }
            }
        });
        let (correlation_id, resp) = match sent.await {
            Ok(r) => r,
            Err(e) => {
                debug!(group = %group, generation, broker = %c.broker(), error = %e, "OffsetCommit not answered");
                return Err(e);
            }
        };
        for t in resp
            .topics
            .iter()
            .filter(|_| tracing::enabled!(tracing::Level::DEBUG))
        {
            for p in &t.partitions {
                let offset = offsets
                    .iter()
                    .find(|(tp, _)| tp.topic == t.name && tp.partition == p.partition_index)
                    .map_or(-1, |(_, o)| *o);
                match ErrorCode::non_zero(p.error_code) {
                    None => {
                        debug!(group = %group, generation, broker = %c.broker(), topic = %t.name, partition = p.partition_index, offset, correlation_id, "OffsetCommit acknowledged")
                    }
                    Some(code) => {
                        debug!(group = %group, generation, broker = %c.broker(), topic = %t.name, partition = p.partition_index, offset, correlation_id, error = %code, "OffsetCommit refused")
                    }
                }
            }
        }
        // Kafka reports coordinator moves per partition.
        for t in &resp.topics {
            for p in &t.partitions {
                if let Some(code) =
                    ErrorCode::non_zero(p.error_code).filter(|c| coordinator_moved(*c))
                {
                    return Err(Error::kafka(code).with_broker(c.broker()));
                }
            }
        }
        Ok(partition_results(
            offsets.iter().map(|(tp, _)| tp),
            "OffsetCommit",
            |topic, partition| {
                let t = resp.topics.iter().find(|t| t.name == topic)?;
                let p = t
                    .partitions
                    .iter()
                    .find(|p| p.partition_index == partition)?;
                Some(p.error_code)
            },
        ))
    }

    /// Reset `group`'s committed offsets of every partition of `topic` to the earliest or
    /// latest offset, the first offset at or after a timestamp (the latest offset where no
    /// record is that new, as `kafka-consumer-groups --to-datetime` does) or an explicit
    /// offset. One result per partition: the committed offset.
    ///
    /// # Errors
    ///
    /// The metadata error if `topic` does not exist.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # use kafkapipe::admin::OffsetSpec;
    /// # async fn demo(admin: kafkapipe::admin::Admin) -> kafkapipe::Result<()> {
    /// for (tp, r) in admin.reset_group_offsets("my-group", "events", OffsetSpec::Earliest).await? {
    ///     println!("{tp} -> {}", r?);
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn reset_group_offsets(
        &self,
        group: &str,
        topic: &str,
        to: OffsetSpec,
    ) -> Result<Results<TopicPartition, i64>> {
        let partitions = self.cluster.partitions(topic).await?;
        let tps: Vec<TopicPartition> = partitions
            .iter()
            .map(|p| TopicPartition::new(topic, *p))
            .collect();
        let mut targets: Vec<(TopicPartition, Result<i64>)> = Vec::new();
        let listed = self
            .list_offsets(&tps.iter().map(|tp| (tp.clone(), to)).collect::<Vec<_>>())
            .await?;
        let mut fallback = Vec::new();
        for (tp, r) in listed {
            match r {
                Ok(o) if o.offset < 0 => fallback.push(tp),
                r => targets.push((tp, r.map(|o| o.offset))),
            }
        }
        if !fallback.is_empty() {
            let specs: Vec<_> = fallback
                .into_iter()
                .map(|tp| (tp, OffsetSpec::Latest))
                .collect();
            for (tp, r) in self.list_offsets(&specs).await? {
                targets.push((tp, r.map(|o| o.offset)));
            }
        }
        let commit: Vec<(TopicPartition, i64)> = targets
            .iter()
            .filter_map(|(tp, r)| r.as_ref().ok().map(|o| (tp.clone(), *o)))
            .collect();
        let mut committed: BTreeMap<TopicPartition, Result<()>> = if commit.is_empty() {
            BTreeMap::new()
        } else {
            self.commit_group_offsets(group, &commit)
                .await?
                .into_iter()
                .collect()
        };
        let mut out: Vec<(TopicPartition, Result<i64>)> = targets
            .into_iter()
            .map(|(tp, r)| {
                let r = r.and_then(|o| committed.remove(&tp).unwrap_or(Ok(())).map(|()| o));
                (tp, r)
            })
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(out)
    }

    /// Delete `group`'s committed offsets of `partitions` (OffsetDelete, Kafka 2.4+). One
    /// result per partition.
    ///
    /// # Errors
    ///
    /// `UnsupportedVersion` naming OffsetDelete if the coordinator lacks the API; the
    /// group's error (`GroupIdNotFound`, `NonEmptyGroup`, …).
    ///
    /// # Example
    ///
    /// ```no_run
    /// # use kafkapipe::admin::TopicPartition;
    /// # async fn demo(admin: kafkapipe::admin::Admin) -> kafkapipe::Result<()> {
    /// let tps = [TopicPartition::new("events", 0)];
    /// admin.delete_group_offsets("my-group", &tps).await?.remove(0).1?;
    /// # Ok(()) }
    /// ```
    pub async fn delete_group_offsets(
        &self,
        group: &str,
        partitions: &[TopicPartition],
    ) -> Result<Results<TopicPartition>> {
        let items: Vec<(TopicPartition, ())> =
            partitions.iter().map(|tp| (tp.clone(), ())).collect();
        let req = OffsetDeleteRequest {
            group_id: group.to_string(),
            topics: by_topic(&items)
                .into_iter()
                .map(|(name, ps)| OffsetDeleteRequestTopic {
                    name,
                    partitions: ps
                        .into_iter()
                        .map(|(p, ())| OffsetDeleteRequestPartition {
                            partition_index: p,
                            ..Default::default()
                        })
                        .collect(),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        };
        let req = &req;
        let resp = self
            .with_coordinator("OffsetDelete", group, |c, _| async move {
                let resp = c.send(req).await?;
                match ErrorCode::non_zero(resp.error_code) {
                    Some(code) => Err(Error::kafka(code).with_broker(c.broker())),
                    None => Ok(resp),
                }
            })
            .await?;
        Ok(partition_results(
            partitions.iter(),
            "OffsetDelete",
            |topic, partition| {
                let t = resp.topics.iter().find(|t| t.name == topic)?;
                let p = t
                    .partitions
                    .iter()
                    .find(|p| p.partition_index == partition)?;
                Some(p.error_code)
            },
        ))
    }
}
