//! Fetching a group's committed offsets: OffsetFetch at the group's coordinator (the
//! request's v8+ and older shapes), for the `Admin` calls and the group readers.

use tracing::debug;

use crate::admin::{Admin, CommittedOffset, OffsetFetchOptions, Results, TopicPartition};
use crate::conn::Connection;
use crate::error::{Error, Result};
use crate::protocol::messages::{
    OffsetFetchRequest, OffsetFetchRequestGroup, OffsetFetchRequestTopic, OffsetFetchRequestTopics,
};
use crate::protocol::ErrorCode;

impl Admin {
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
}
