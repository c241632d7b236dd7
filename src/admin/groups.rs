//! Groups and their committed offsets, routed to each group's coordinator.

use std::future::Future;

use tracing::debug;

use super::{
    code_error, Admin, ConsumerGroupDescription, ConsumerGroupMemberDescription, GroupDescription,
    GroupListing, MemberDescription, Results, TopicPartition,
};
use crate::conn::Connection;
use crate::error::{Error, Result};
use crate::protocol::consumer_protocol::{Assignment, Subscription};
use crate::protocol::messages::{
    ConsumerGroupDescribeAssignment, ConsumerGroupDescribeRequest, ConsumerGroupDescribedGroup,
    DeleteGroupsRequest, DescribeGroupsRequest, DescribedGroup, FindCoordinatorRequest,
    ListGroupsRequest,
};
use crate::protocol::{ErrorCode, Request};

mod alter_offsets;
mod fetch_offsets;

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
}
