//! Partition offsets and record deletion, routed to each partition's leader.

use super::{Admin, ListedOffset, OffsetSpec, Results, TopicPartition};
use crate::conn::Connection;
use crate::error::{Error, Result};
use crate::protocol::messages::{
    DeleteRecordsPartition, DeleteRecordsRequest, DeleteRecordsTopic, ListOffsetsPartition,
    ListOffsetsRequest, ListOffsetsTopic,
};
use crate::protocol::ErrorCode;
use crate::util::duration_ms;

/// `(topic, [(partition, value)])` in first-seen order.
fn group<T: Copy>(batch: &[(TopicPartition, T)]) -> Vec<(String, Vec<(i32, T)>)> {
    let mut out: Vec<(String, Vec<(i32, T)>)> = Vec::new();
    for (tp, v) in batch {
        match out.iter_mut().find(|(t, _)| *t == tp.topic) {
            Some((_, ps)) => ps.push((tp.partition, *v)),
            None => out.push((tp.topic.clone(), vec![(tp.partition, *v)])),
        }
    }
    out
}

impl Admin {
    /// Look up offsets of many partitions in one call: earliest, latest (the high-water
    /// mark), by timestamp, or an explicit offset (returned as is). One ListOffsets
    /// request per partition leader; one result per partition, in request order.
    ///
    /// A timestamp with no record at or after it gives offset `-1`.
    ///
    /// ```no_run
    /// # use kafkapipe::admin::{Admin, OffsetSpec, TopicPartition};
    /// # async fn demo(admin: Admin) -> kafkapipe::Result<()> {
    /// let specs: Vec<_> = (0..3)
    ///     .map(|p| (TopicPartition::new("events", p), OffsetSpec::Latest))
    ///     .collect();
    /// for (tp, r) in admin.list_offsets(&specs).await? {
    ///     println!("{tp}: {}", r?.offset);
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn list_offsets(
        &self,
        specs: &[(TopicPartition, OffsetSpec)],
    ) -> Result<Results<TopicPartition, ListedOffset>> {
        let lookups: Vec<(TopicPartition, i64)> = specs
            .iter()
            .filter_map(|(tp, s)| s.wire_timestamp().map(|ts| (tp.clone(), ts)))
            .collect();
        let timeout = duration_ms(self.timeout);
        let mut found = self
            .per_leader("ListOffsets", lookups, |c: Connection, batch| async move {
                let req = ListOffsetsRequest {
                    replica_id: -1,
                    isolation_level: 0,
                    topics: group(&batch)
                        .into_iter()
                        .map(|(name, ps)| ListOffsetsTopic {
                            name,
                            partitions: ps
                                .into_iter()
                                .map(|(p, ts)| ListOffsetsPartition {
                                    partition_index: p,
                                    current_leader_epoch: -1,
                                    timestamp: ts,
                                    ..Default::default()
                                })
                                .collect(),
                            ..Default::default()
                        })
                        .collect(),
                    timeout_ms: timeout,
                    ..Default::default()
                };
                let resp = c.send(&req).await?;
                let mut out = Vec::new();
                for t in resp.topics {
                    for p in t.partitions {
                        let tp = TopicPartition::new(&t.name, p.partition_index);
                        let r = match ErrorCode::non_zero(p.error_code) {
                            Some(code) => Err(Error::kafka(code)
                                .with_topic(&t.name)
                                .with_partition(p.partition_index)
                                .with_broker(c.broker())),
                            None => Ok(ListedOffset {
                                offset: p.offset,
                                timestamp: p.timestamp,
                                leader_epoch: p.leader_epoch,
                            }),
                        };
                        out.push((tp, r));
                    }
                }
                Ok(out)
            })
            .await
            .into_iter();
        Ok(specs
            .iter()
            .map(|(tp, s)| match s {
                OffsetSpec::Offset(o) => (
                    tp.clone(),
                    Ok(ListedOffset {
                        offset: *o,
                        timestamp: -1,
                        leader_epoch: -1,
                    }),
                ),
                _ => found.next().unwrap_or_else(|| {
                    (tp.clone(), Err(Error::protocol("ListOffsets: no result")))
                }),
            })
            .collect())
    }

    /// Delete the records of each partition before the given offset (`-1`: before the
    /// high-water mark, i.e. all). One request per partition leader; one result per
    /// partition: the new log start offset (low watermark).
    ///
    /// tansu 0.6 lists DeleteRecords but does not implement it (the connection is
    /// dropped); the call then fails with `Closed` after its retries.
    ///
    /// ```no_run
    /// # use kafkapipe::admin::TopicPartition;
    /// # async fn demo(admin: kafkapipe::admin::Admin) -> kafkapipe::Result<()> {
    /// let before = [(TopicPartition::new("events", 0), 1000)];
    /// let low_watermark = admin.delete_records(&before).await?.remove(0).1?;
    /// # Ok(()) }
    /// ```
    pub async fn delete_records(
        &self,
        before: &[(TopicPartition, i64)],
    ) -> Result<Results<TopicPartition, i64>> {
        let timeout = duration_ms(self.timeout);
        Ok(self
            .per_leader(
                "DeleteRecords",
                before.to_vec(),
                |c: Connection, batch| async move {
                    let req = DeleteRecordsRequest {
                        topics: group(&batch)
                            .into_iter()
                            .map(|(name, ps)| DeleteRecordsTopic {
                                name,
                                partitions: ps
                                    .into_iter()
                                    .map(|(p, offset)| DeleteRecordsPartition {
                                        partition_index: p,
                                        offset,
                                        ..Default::default()
                                    })
                                    .collect(),
                                ..Default::default()
                            })
                            .collect(),
                        timeout_ms: timeout,
                        ..Default::default()
                    };
                    let resp = c.send(&req).await?;
                    let mut out = Vec::new();
                    for t in resp.topics {
                        for p in t.partitions {
                            let r = match ErrorCode::non_zero(p.error_code) {
                                Some(code) => Err(Error::kafka(code)
                                    .with_topic(&t.name)
                                    .with_partition(p.partition_index)
                                    .with_broker(c.broker())),
                                None => Ok(p.low_watermark),
                            };
                            out.push((TopicPartition::new(&t.name, p.partition_index), r));
                        }
                    }
                    Ok(out)
                },
            )
            .await)
    }
}
