//! [`Message`]: what the [`Writer`](super::Writer) accepts.

use bytes::Bytes;

use crate::record::Header;

/// A message to write.
///
/// `topic` falls back to [`WriterConfig::topic`](super::WriterConfig::topic) when `None`;
/// `partition` is chosen by the writer's [`Balancer`](super::Balancer) when `None`.
///
/// ```
/// use kafkapipe::writer::Message;
/// let m = Message::keyed("user-7", "clicked")
///     .with_topic("events")
///     .with_header("source", "web")
///     .with_timestamp(1_700_000_000_000);
/// assert_eq!(m.key.as_deref(), Some(&b"user-7"[..]));
/// assert_eq!(m.partition, None);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Message {
    /// Target topic; `None` uses the writer's topic.
    pub topic: Option<String>,
    /// Target partition; `None` lets the balancer choose.
    pub partition: Option<i32>,
    /// Key (hashed by the key-based balancers), or none.
    pub key: Option<Bytes>,
    /// Value, or none (a tombstone on compacted topics).
    pub value: Option<Bytes>,
    /// Record headers.
    pub headers: Vec<Header>,
    /// Create time in milliseconds since the Unix epoch; `None` means "now" (when the
    /// writer accepts the message).
    pub timestamp: Option<i64>,
}

impl Message {
    /// A message with a value and no key.
    pub fn new(value: impl Into<Bytes>) -> Self {
        Message {
            value: Some(value.into()),
            ..Message::default()
        }
    }

    /// A message with a key and a value.
    pub fn keyed(key: impl Into<Bytes>, value: impl Into<Bytes>) -> Self {
        Message {
            key: Some(key.into()),
            value: Some(value.into()),
            ..Message::default()
        }
    }

    /// Set the topic.
    pub fn with_topic(mut self, topic: impl Into<String>) -> Self {
        self.topic = Some(topic.into());
        self
    }

    /// Set an explicit partition (the balancer is skipped).
    pub fn with_partition(mut self, partition: i32) -> Self {
        self.partition = Some(partition);
        self
    }

    /// Set the key.
    pub fn with_key(mut self, key: impl Into<Bytes>) -> Self {
        self.key = Some(key.into());
        self
    }

    /// Add a header.
    pub fn with_header(mut self, key: impl Into<String>, value: impl Into<Bytes>) -> Self {
        self.headers.push(Header::new(key, value));
        self
    }

    /// Set the create timestamp (ms since the Unix epoch).
    pub fn with_timestamp(mut self, timestamp_ms: i64) -> Self {
        self.timestamp = Some(timestamp_ms);
        self
    }

    /// The bytes this message accounts for in the writer's buffer bound: key, value and
    /// headers plus a fixed per-record overhead (an upper bound of the record framing).
    pub fn size(&self) -> usize {
        const RECORD_OVERHEAD: usize = 21; // length, attributes, deltas, lengths (varints)
        self.key.as_ref().map_or(0, Bytes::len)
            + self.value.as_ref().map_or(0, Bytes::len)
            + self
                .headers
                .iter()
                .map(|h| h.key.len() + h.value.as_ref().map_or(0, Bytes::len) + 10)
                .sum::<usize>()
            + RECORD_OVERHEAD
    }
}
