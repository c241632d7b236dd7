//! Offsets on a [`Conn`]: ListOffsets (first, last, by time, with the leader epoch the
//! caller knows) and OffsetForLeaderEpoch (KIP-320) of one partition.
//!
//! May not: commit or fetch offsets of a group (the group layer does).

use crate::util::duration_ms;

use super::types::IsolationLevel;
use super::{Conn, EARLIEST_TIMESTAMP, LATEST_TIMESTAMP};
use crate::error::{Error, Result};
use crate::protocol::messages::{
    ListOffsetsPartition, ListOffsetsRequest, ListOffsetsTopic, OffsetForLeaderEpochRequest,
    OffsetForLeaderPartition, OffsetForLeaderTopic,
};
use crate::protocol::ErrorCode;

impl Conn {
    /// The first offset of `topic`/`partition` (kafka-go `ReadFirstOffset`).
    pub async fn first_offset(&self, topic: &str, partition: i32) -> Result<i64> {
        self.list_offset(
            topic,
            partition,
            EARLIEST_TIMESTAMP,
            IsolationLevel::ReadUncommitted,
        )
        .await?
        .ok_or_else(|| self.err(ErrorCode::OffsetNotAvailable, topic, partition))
    }

    /// The offset the next record written to `topic`/`partition` will get — the
    /// high-water mark (kafka-go `ReadLastOffset`).
    pub async fn last_offset(&self, topic: &str, partition: i32) -> Result<i64> {
        self.last_offset_with(topic, partition, IsolationLevel::ReadUncommitted)
            .await
    }

    /// The end of `topic`/`partition` as a consumer with `isolation` sees it: the
    /// high-water mark under read-uncommitted, the last stable offset (the first offset
    /// of the oldest open transaction) under read-committed — where a read-committed
    /// consumer starting "at the end" must begin so it does not skip transactions that
    /// commit later.
    ///
    /// ```no_run
    /// # async fn demo(conn: &kafkapipe::conn::Conn) -> kafkapipe::Result<()> {
    /// use kafkapipe::conn::IsolationLevel;
    /// let lso = conn.last_offset_with("events", 0, IsolationLevel::ReadCommitted).await?;
    /// # Ok(()) }
    /// ```
    pub async fn last_offset_with(
        &self,
        topic: &str,
        partition: i32,
        isolation: IsolationLevel,
    ) -> Result<i64> {
        self.list_offset(topic, partition, LATEST_TIMESTAMP, isolation)
            .await?
            .ok_or_else(|| self.err(ErrorCode::OffsetNotAvailable, topic, partition))
    }

    /// The first offset whose timestamp is at or after `timestamp_ms`, or `None` if no such
    /// record exists (kafka-go `ReadOffset`).
    pub async fn offset_for_time(
        &self,
        topic: &str,
        partition: i32,
        timestamp_ms: i64,
    ) -> Result<Option<i64>> {
        if timestamp_ms < 0 {
            return Err(Error::config("timestamp must not be negative"));
        }
        self.list_offset(
            topic,
            partition,
            timestamp_ms,
            IsolationLevel::ReadUncommitted,
        )
        .await
    }

    async fn list_offset(
        &self,
        topic: &str,
        partition: i32,
        timestamp: i64,
        isolation: IsolationLevel,
    ) -> Result<Option<i64>> {
        self.list_offset_at_epoch(topic, partition, timestamp, isolation, -1)
            .await
    }

    /// ListOffsets of one partition (`timestamp`: a time, [`EARLIEST_TIMESTAMP`] or
    /// [`LATEST_TIMESTAMP`]) sent with the leader epoch the caller knows
    /// (`current_leader_epoch`, -1 for none), so that a broker with another epoch answers
    /// `FENCED_LEADER_EPOCH` or `UNKNOWN_LEADER_EPOCH` instead of an offset (KIP-320).
    pub(crate) async fn list_offset_at_epoch(
        &self,
        topic: &str,
        partition: i32,
        timestamp: i64,
        isolation: IsolationLevel,
        current_leader_epoch: i32,
    ) -> Result<Option<i64>> {
        let req = ListOffsetsRequest {
            replica_id: -1,
            isolation_level: isolation.code(),
            topics: vec![ListOffsetsTopic {
                name: topic.to_string(),
                partitions: vec![ListOffsetsPartition {
                    partition_index: partition,
                    current_leader_epoch,
                    timestamp,
                    ..Default::default()
                }],
                ..Default::default()
            }],
            timeout_ms: duration_ms(self.connection.config().request_timeout),
            ..Default::default()
        };
        let resp = self.connection.send(&req).await?;
        let p = resp
            .topics
            .iter()
            .find(|t| t.name == topic)
            .and_then(|t| t.partitions.iter().find(|p| p.partition_index == partition))
            .ok_or_else(|| {
                Error::protocol("list offsets response does not mention the partition")
                    .with_topic(topic)
                    .with_partition(partition)
            })?;
        if let Some(code) = ErrorCode::non_zero(p.error_code) {
            return Err(self.err(code, topic, partition));
        }
        Ok((p.offset >= 0).then_some(p.offset))
    }

    /// OffsetForLeaderEpoch for one partition (KIP-320): the end offset of leader epoch
    /// `epoch` in the log of the leader of `topic`/`partition` — the first offset of the
    /// next higher epoch, or the log end offset if `epoch` is the leader's latest — and the
    /// largest epoch at or below `epoch` that the leader knows. `current_leader_epoch` (the
    /// epoch the caller knows the leader by) fences a stale leader or a stale caller
    /// (`FENCED_LEADER_EPOCH`, `UNKNOWN_LEADER_EPOCH`). `(-1, -1)` when the leader knows
    /// no such epoch.
    pub(crate) async fn offset_for_leader_epoch(
        &self,
        topic: &str,
        partition: i32,
        current_leader_epoch: i32,
        epoch: i32,
    ) -> Result<(i32, i64)> {
        let req = OffsetForLeaderEpochRequest {
            replica_id: -1,
            topics: vec![OffsetForLeaderTopic {
                topic: topic.to_string(),
                partitions: vec![OffsetForLeaderPartition {
                    partition,
                    current_leader_epoch,
                    leader_epoch: epoch,
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        };
        let resp = self.connection.send(&req).await?;
        let p = resp
            .topics
            .iter()
            .find(|t| t.topic == topic)
            .and_then(|t| t.partitions.iter().find(|p| p.partition == partition))
            .ok_or_else(|| {
                Error::protocol("offset for leader epoch response does not mention the partition")
                    .with_topic(topic)
                    .with_partition(partition)
            })?;
        if let Some(code) = ErrorCode::non_zero(p.error_code) {
            return Err(self.err(code, topic, partition));
        }
        Ok((p.leader_epoch, p.end_offset))
    }
}
