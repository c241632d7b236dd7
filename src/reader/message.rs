//! [`Message`]: one record as the [`Reader`](super::Reader) yields it.

use std::sync::Arc;

use bytes::Bytes;

use crate::record::{Header, Record};

/// One consumed record, with where it came from. Key, value and header values are
/// zero-copy [`Bytes`] slices of the fetched buffer (or of the decompressed batch), so a
/// message keeps that buffer alive until it is dropped.
///
/// ```
/// use kafkapipe::reader::Message;
/// # fn show(m: &Message) {
/// println!("{}/{}@{} lag {}", m.topic, m.partition, m.offset, m.high_watermark - m.offset - 1);
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// Topic name (shared by every message of the partition).
    pub topic: Arc<str>,
    /// Partition index.
    pub partition: i32,
    /// The message's offset in its partition.
    pub offset: i64,
    /// The partition's high-water mark when the message was fetched: the offset the next
    /// written record gets (kafka-go `HighWaterMark`).
    pub high_watermark: i64,
    /// The key; `None` is a null key.
    pub key: Option<Bytes>,
    /// The value; `None` is a null value (a tombstone on compacted topics).
    pub value: Option<Bytes>,
    /// The headers, in order.
    pub headers: Vec<Header>,
    /// Milliseconds since the epoch: the producer's create time, or the broker's append
    /// time for topics with `message.timestamp.type=LogAppendTime`; `-1` if unknown
    /// (legacy v0 messages).
    pub timestamp: i64,
}

impl Message {
    pub(crate) fn from_record(
        topic: &Arc<str>,
        partition: i32,
        high_watermark: i64,
        r: Record,
    ) -> Self {
        Message {
            topic: topic.clone(),
            partition,
            offset: r.offset,
            high_watermark,
            key: r.key,
            value: r.value,
            headers: r.headers,
            timestamp: r.timestamp,
        }
    }

    /// The bytes this message counts against
    /// [`ReaderConfig::queue_capacity_bytes`](super::ReaderConfig::queue_capacity_bytes):
    /// key, value, header keys and header values.
    ///
    /// ```
    /// use kafkapipe::reader::Message;
    /// let m = Message {
    ///     topic: "t".into(), partition: 0, offset: 0, high_watermark: 1,
    ///     key: Some("k".into()), value: Some("vv".into()), headers: vec![], timestamp: 0,
    /// };
    /// assert_eq!(m.size(), 3);
    /// ```
    pub fn size(&self) -> usize {
        self.key.as_ref().map_or(0, Bytes::len)
            + self.value.as_ref().map_or(0, Bytes::len)
            + self
                .headers
                .iter()
                .map(|h| h.key.len() + h.value.as_ref().map_or(0, Bytes::len))
                .sum::<usize>()
    }
}
