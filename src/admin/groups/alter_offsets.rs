//! Changing groups' committed offsets: OffsetCommit (commit, reset to a spec, the commits
//! group readers make) and OffsetDelete, with the per-partition results.

use std::collections::BTreeMap;

use tracing::debug;

use crate::admin::{Admin, OffsetSpec, Results, TopicPartition};
use crate::conn::Connection;
use crate::error::{Error, Result};
use crate::protocol::messages::{
    OffsetCommitRequest, OffsetCommitRequestPartition, OffsetCommitRequestTopic,
    OffsetDeleteRequest, OffsetDeleteRequestPartition, OffsetDeleteRequestTopic,
};
use crate::protocol::ErrorCode;

/// Whether `code` means "ask the coordinator again" (after finding it again).
fn coordinator_moved(code: ErrorCode) -> bool {
    matches!(
        code,
        ErrorCode::NotCoordinator
            | ErrorCode::CoordinatorNotAvailable
            | ErrorCode::CoordinatorLoadInProgress
    )
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
