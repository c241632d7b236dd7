//! Produce on a [`Conn`]: `records` encoded as one RecordBatch v2 and sent to one
//! partition of this broker, no retries.
//!
//! May not: batch across calls or retry (the `Writer` does both).

use bytes::Bytes;

use crate::util::{duration_ms, now_ms};

use super::types::{ProduceOptions, RequiredAcks};
use super::{Conn, ZERO_UUID};
use crate::error::{Error, Result};
use crate::protocol::messages::{ProducePartitionData, ProduceRequest, ProduceTopicData};
use crate::protocol::ErrorCode;
use crate::record::{Record, RecordBatchBuilder};

impl Conn {
    /// Encode `records` as one RecordBatch v2 and produce it to `topic`/`partition`.
    /// Records with a negative timestamp get the current time. Returns the offset the
    /// broker assigned to the first record (`-1` with [`RequiredAcks::None`]).
    pub async fn produce(
        &self,
        topic: &str,
        partition: i32,
        records: &[Record],
        opts: &ProduceOptions,
    ) -> Result<i64> {
        if records.is_empty() {
            return Err(Error::config("produce needs at least one record"));
        }
        let now = now_ms();
        let size: usize = records
            .iter()
            .map(|r| {
                r.key.as_ref().map_or(0, Bytes::len) + r.value.as_ref().map_or(0, Bytes::len) + 16
            })
            .sum();
        let mut builder = RecordBatchBuilder::with_capacity(opts.compression, size);
        for r in records {
            let ts = if r.timestamp < 0 { now } else { r.timestamp };
            builder.append(ts, r.key.as_deref(), r.value.as_deref(), &r.headers)?;
        }
        let batch = builder.build()?;
        self.produce_batch(topic, partition, batch, opts).await
    }

    /// Produce an already encoded record batch (see [`RecordBatchBuilder`]).
    pub async fn produce_batch(
        &self,
        topic: &str,
        partition: i32,
        batch: Bytes,
        opts: &ProduceOptions,
    ) -> Result<i64> {
        let mut version = self.connection.version_for::<ProduceRequest>()?;
        let mut topic_id = ZERO_UUID;
        if version >= 13 {
            topic_id = self.topic_id(topic).await?;
            if topic_id == ZERO_UUID {
                version = self.by_name_version::<ProduceRequest>(topic, partition)?;
            }
        }
        let req = ProduceRequest {
            transactional_id: None,
            acks: opts.acks.code(),
            timeout_ms: duration_ms(opts.timeout),
            topic_data: vec![ProduceTopicData {
                name: topic.to_string(),
                topic_id,
                partition_data: vec![ProducePartitionData {
                    index: partition,
                    records: Some(batch.into()),
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        };
        if opts.acks == RequiredAcks::None {
            self.connection.send_no_response(&req, version).await?;
            return Ok(-1);
        }
        let resp = self.connection.send_version(&req, version).await?;
        let p = resp
            .responses
            .iter()
            .find(|t| t.name == topic || (topic_id != ZERO_UUID && t.topic_id == topic_id))
            .and_then(|t| t.partition_responses.iter().find(|p| p.index == partition))
            .ok_or_else(|| {
                Error::protocol("produce response does not mention the partition")
                    .with_topic(topic)
                    .with_partition(partition)
            })?;
        match ErrorCode::non_zero(p.error_code) {
            None => Ok(p.base_offset),
            Some(code) => {
                let mut e = self.err(code, topic, partition);
                if let Some(m) = &p.error_message {
                    e = e.with_message(m.clone());
                }
                Err(e)
            }
        }
    }
}
