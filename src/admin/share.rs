//! Share-group administration (KIP-932, Apache Kafka 4.2+): list and describe share
//! groups (ShareGroupDescribe), read, set and delete their start offsets
//! (DescribeShareGroupOffsets, AlterShareGroupOffsets, DeleteShareGroupOffsets). Every
//! call goes to the group's coordinator. A share group's configs (for instance
//! `share.auto.offset.reset`) are set with
//! [`incremental_alter_configs`](Admin::incremental_alter_configs) on a
//! [`ConfigResource::Group`](super::ConfigResource::Group).

use super::{code_error, Admin, GroupListing, Results, TopicPartition};
use crate::error::{Error, ErrorKind, Result};
use crate::protocol::messages::{
    AlterShareGroupOffsetsRequest, AlterShareGroupOffsetsRequestPartition,
    AlterShareGroupOffsetsRequestTopic, DeleteShareGroupOffsetsRequest,
    DeleteShareGroupOffsetsRequestTopic, DescribeShareGroupOffsetsRequest,
    DescribeShareGroupOffsetsRequestGroup, DescribeShareGroupOffsetsRequestTopic,
    ShareGroupDescribeRequest, ShareGroupDescribedGroup,
};
use crate::protocol::ErrorCode;

/// A share group as [`Admin::describe_share_groups`] reports it.
///
/// ```no_run
/// # async fn demo(admin: kafkapipe::admin::Admin) -> kafkapipe::Result<()> {
/// let (_, group) = admin.describe_share_groups(&["workers"]).await?.remove(0);
/// let group = group?;
/// println!("{} epoch {}: {} members", group.state, group.group_epoch, group.members.len());
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ShareGroupDescription {
    /// The group id.
    pub group_id: String,
    /// The state (`Empty`, `Stable`, `Dead`).
    pub state: String,
    /// The group epoch.
    pub group_epoch: i32,
    /// The epoch of the target assignment.
    pub assignment_epoch: i32,
    /// The server-side assignor (`simple`).
    pub assignor: String,
    /// The members.
    pub members: Vec<ShareMemberDescription>,
    /// The coordinator's broker id.
    pub coordinator: i32,
}

/// A member of a [`ShareGroupDescription`] (see there for an example).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ShareMemberDescription {
    /// The member id.
    pub member_id: String,
    /// The rack id, if any.
    pub rack_id: Option<String>,
    /// The member epoch.
    pub member_epoch: i32,
    /// The client id.
    pub client_id: String,
    /// The client host.
    pub client_host: String,
    /// The subscribed topic names.
    pub subscribed_topics: Vec<String>,
    /// The partitions the member may fetch from, sorted (several members may share one).
    pub assignment: Vec<TopicPartition>,
}

/// A share group's position in one partition (see
/// [`Admin::describe_share_group_offsets`]).
///
/// ```
/// use kafkapipe::admin::{ShareGroupOffset, TopicPartition};
/// let o = ShareGroupOffset { partition: TopicPartition::new("jobs", 0), start_offset: 5, leader_epoch: 0, lag: Some(0) };
/// assert_eq!(o.lag, Some(0));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShareGroupOffset {
    /// The partition.
    pub partition: TopicPartition,
    /// The share-partition start offset: every record before it is done (accepted,
    /// rejected or archived). It may trail the log end after everything is accepted
    /// until the next delivery moves it; `lag` is the reliable "all done" signal.
    pub start_offset: i64,
    /// The leader epoch of the partition.
    pub leader_epoch: i32,
    /// Records not yet done (DescribeShareGroupOffsets v1, Kafka 4.1+), `None` where the
    /// broker does not report it.
    pub lag: Option<i64>,
}

impl Admin {
    /// The share groups of the cluster (ListGroups filtered by type `share`).
    ///
    /// ```no_run
    /// # async fn demo(admin: kafkapipe::admin::Admin) -> kafkapipe::Result<()> {
    /// for g in admin.list_share_groups().await? {
    ///     println!("{} {:?}", g.group_id, g.state);
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn list_share_groups(&self) -> Result<Vec<GroupListing>> {
        Ok(self
            .list_groups()
            .await?
            .into_iter()
            .filter(|g| g.group_type.as_deref() == Some("share"))
            .collect())
    }

    /// Describe share groups: state, epochs and each member's subscription and
    /// assignment. One result per group; a group that does not exist, or is not a share
    /// group, is `GroupIdNotFound`.
    ///
    /// ```no_run
    /// # async fn demo(admin: kafkapipe::admin::Admin) -> kafkapipe::Result<()> {
    /// let (_, group) = admin.describe_share_groups(&["workers"]).await?.remove(0);
    /// for m in group?.members {
    ///     println!("{} may fetch {:?}", m.member_id, m.assignment);
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// `UnsupportedVersion` if the coordinator has no ShareGroupDescribe (before 4.2).
    pub async fn describe_share_groups(
        &self,
        groups: &[&str],
    ) -> Result<Results<String, ShareGroupDescription>> {
        self.describe_at_coordinators(
            "ShareGroupDescribe",
            groups,
            |ids| ShareGroupDescribeRequest {
                group_ids: ids,
                ..Default::default()
            },
            |resp| resp.groups,
            |d| (d.group_id.clone(), d.error_code, d.error_message.clone()),
            describe_share,
        )
        .await
    }

    /// A share group's start offsets (and lag) in `topics` (every topic it has state
    /// for when `None`), sorted by topic and partition.
    ///
    /// ```no_run
    /// # async fn demo(admin: kafkapipe::admin::Admin) -> kafkapipe::Result<()> {
    /// for o in admin.describe_share_group_offsets("workers", None).await? {
    ///     println!("{} start {} lag {:?}", o.partition, o.start_offset, o.lag);
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// The group's error, or the first partition's.
    pub async fn describe_share_group_offsets(
        &self,
        group: &str,
        topics: Option<&[&str]>,
    ) -> Result<Vec<ShareGroupOffset>> {
        let want: Option<Vec<(String, Vec<i32>)>> = match topics {
            None => None,
            Some(ts) => {
                let mut v = Vec::new();
                for t in ts {
                    v.push(((*t).to_string(), self.cluster.partitions(t).await?));
                }
                Some(v)
            }
        };
        let want = &want;
        self.with_coordinator("DescribeShareGroupOffsets", group, |c, _| async move {
            let v = c.version_for::<DescribeShareGroupOffsetsRequest>()?;
            let req = DescribeShareGroupOffsetsRequest {
                groups: vec![DescribeShareGroupOffsetsRequestGroup {
                    group_id: group.to_string(),
                    topics: want.as_ref().map(|w| {
                        w.iter()
                            .map(|(t, ps)| DescribeShareGroupOffsetsRequestTopic {
                                topic_name: t.clone(),
                                partitions: ps.clone(),
                                ..Default::default()
                            })
                            .collect()
                    }),
                    ..Default::default()
                }],
                ..Default::default()
            };
            let resp = c.send_version(&req, v).await?;
            let Some(g) = resp.groups.into_iter().find(|g| g.group_id == group) else {
                return Err(Error::new(
                    ErrorKind::Protocol,
                    format!("DescribeShareGroupOffsets: no answer for group {group}"),
                ));
            };
            if let Some(code) = ErrorCode::non_zero(g.error_code) {
                return Err(code_error(code, g.error_message.as_deref()).with_broker(c.broker()));
            }
            let mut out = Vec::new();
            for t in g.topics {
                for p in t.partitions {
                    if let Some(code) = ErrorCode::non_zero(p.error_code) {
                        return Err(code_error(code, p.error_message.as_deref())
                            .with_topic(t.topic_name.clone()));
                    }
                    out.push(ShareGroupOffset {
                        partition: TopicPartition::new(t.topic_name.clone(), p.partition_index),
                        start_offset: p.start_offset,
                        leader_epoch: p.leader_epoch,
                        lag: (v >= 1 && p.lag >= 0).then_some(p.lag),
                    });
                }
            }
            out.sort_by(|a, b| a.partition.cmp(&b.partition));
            Ok(out)
        })
        .await
    }

    /// Set an empty share group's start offsets: the group goes on from each given
    /// offset (records before it are skipped). One result per partition.
    ///
    /// ```no_run
    /// # async fn demo(admin: kafkapipe::admin::Admin) -> kafkapipe::Result<()> {
    /// use kafkapipe::admin::TopicPartition;
    /// for (tp, r) in admin
    ///     .alter_share_group_offsets("workers", &[(TopicPartition::new("jobs", 0), 0)])
    ///     .await?
    /// {
    ///     r?;
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// A request-level error (for instance `NonEmptyGroup` while members are in it).
    pub async fn alter_share_group_offsets(
        &self,
        group: &str,
        offsets: &[(TopicPartition, i64)],
    ) -> Result<Results<TopicPartition>> {
        let mut topics: Vec<AlterShareGroupOffsetsRequestTopic> = Vec::new();
        for (tp, o) in offsets {
            let part = AlterShareGroupOffsetsRequestPartition {
                partition_index: tp.partition,
                start_offset: *o,
                ..Default::default()
            };
            match topics.iter_mut().find(|t| t.topic_name == tp.topic) {
                Some(t) => t.partitions.push(part),
                None => topics.push(AlterShareGroupOffsetsRequestTopic {
                    topic_name: tp.topic.clone(),
                    partitions: vec![part],
                    ..Default::default()
                }),
            }
        }
        let req = &AlterShareGroupOffsetsRequest {
            group_id: group.to_string(),
            topics,
            ..Default::default()
        };
        self.with_coordinator("AlterShareGroupOffsets", group, |c, _| async move {
            let resp = c.send(req).await?;
            if let Some(code) = ErrorCode::non_zero(resp.error_code) {
                return Err(code_error(code, resp.error_message.as_deref()).with_broker(c.broker()));
            }
            Ok(offsets
                .iter()
                .map(|(tp, _)| {
                    let p = resp
                        .responses
                        .iter()
                        .filter(|t| t.topic_name == tp.topic)
                        .flat_map(|t| t.partitions.iter())
                        .find(|p| p.partition_index == tp.partition);
                    let r = match p {
                        None => Err(Error::new(
                            ErrorKind::Protocol,
                            format!("AlterShareGroupOffsets: no answer for {tp}"),
                        )),
                        Some(p) => match ErrorCode::non_zero(p.error_code) {
                            Some(code) => Err(code_error(code, p.error_message.as_deref())),
                            None => Ok(()),
                        },
                    };
                    (tp.clone(), r)
                })
                .collect())
        })
        .await
    }

    /// Delete an empty share group's offsets (its state) of whole topics. One result per
    /// topic.
    ///
    /// ```no_run
    /// # async fn demo(admin: kafkapipe::admin::Admin) -> kafkapipe::Result<()> {
    /// admin.delete_share_group_offsets("workers", &["jobs"]).await?.remove(0).1?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// A request-level error (for instance `NonEmptyGroup` while members are in it).
    pub async fn delete_share_group_offsets(
        &self,
        group: &str,
        topics: &[&str],
    ) -> Result<Results<String>> {
        let req = &DeleteShareGroupOffsetsRequest {
            group_id: group.to_string(),
            topics: topics
                .iter()
                .map(|t| DeleteShareGroupOffsetsRequestTopic {
                    topic_name: (*t).to_string(),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        };
        self.with_coordinator("DeleteShareGroupOffsets", group, |c, _| async move {
            let resp = c.send(req).await?;
            if let Some(code) = ErrorCode::non_zero(resp.error_code) {
                return Err(code_error(code, resp.error_message.as_deref()).with_broker(c.broker()));
            }
            Ok(topics
                .iter()
                .map(|t| {
                    let r = match resp.responses.iter().find(|r| r.topic_name == *t) {
                        None => Err(Error::new(
                            ErrorKind::Protocol,
                            format!("DeleteShareGroupOffsets: no answer for topic {t}"),
                        )),
                        Some(r) => match ErrorCode::non_zero(r.error_code) {
                            Some(code) => Err(code_error(code, r.error_message.as_deref())),
                            None => Ok(()),
                        },
                    };
                    ((*t).to_string(), r)
                })
                .collect())
        })
        .await
    }
}

fn describe_share(d: ShareGroupDescribedGroup, coordinator: i32) -> ShareGroupDescription {
    ShareGroupDescription {
        group_id: d.group_id,
        state: d.group_state,
        group_epoch: d.group_epoch,
        assignment_epoch: d.assignment_epoch,
        assignor: d.assignor_name,
        coordinator,
        members: d
            .members
            .into_iter()
            .map(|m| {
                let mut assignment: Vec<TopicPartition> = m
                    .assignment
                    .topic_partitions
                    .iter()
                    .flat_map(|t| {
                        t.partitions
                            .iter()
                            .map(|p| TopicPartition::new(t.topic_name.clone(), *p))
                    })
                    .collect();
                assignment.sort();
                ShareMemberDescription {
                    member_id: m.member_id,
                    rack_id: m.rack_id,
                    member_epoch: m.member_epoch,
                    client_id: m.client_id,
                    client_host: m.client_host,
                    subscribed_topics: m.subscribed_topic_names,
                    assignment,
                }
            })
            .collect(),
    }
}
