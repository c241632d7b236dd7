//! [`Message`]: what the [`Writer`](super::Writer) accepts.

use bytes::Bytes;

use crate::ack::AckToken;
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
///
/// # At-least-once consume → produce
///
/// A message derived from consumed ones carries their [`AckToken`]s
/// ([`with_ack`](Message::with_ack), or `From<reader::Message>`): the writer acks them when
/// the broker acknowledges this message and fails them when its delivery fails, so the
/// source group commits a consumed message only after what was made of it is written.
///
/// ```no_run
/// use futures::{future::ready, StreamExt, TryStreamExt};
/// use kafkapipe::{reader::{Reader, ReaderConfig}, writer::{self, Writer, WriterConfig}};
/// # async fn demo() -> kafkapipe::Result<()> {
/// let reader = Reader::new(ReaderConfig::new(["127.0.0.1:9092"]).group_id("g").topic("in")).await?;
/// let writer = Writer::new(WriterConfig::new(["127.0.0.1:9092"]).topic("out"))?;
/// reader
///     .try_filter(|m| ready(m.value.is_some()))
///     .map_ok(|mut m| {
///         let upper = m.value.as_deref().unwrap_or_default().to_ascii_uppercase();
///         writer::Message::new(upper).with_ack(m.take_ack_token())
///     })
///     .forward(writer)
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Default)]
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
    /// The consumed messages this one was made from: acked when it is written, failed
    /// when its delivery fails. Inert by default.
    pub ack: AckToken,
}

impl Clone for Message {
    /// A copy of the message; its [`AckToken`] is inert (the original's decides).
    fn clone(&self) -> Self {
        Message {
            topic: self.topic.clone(),
            partition: self.partition,
            key: self.key.clone(),
            value: self.value.clone(),
            headers: self.headers.clone(),
            timestamp: self.timestamp,
            ack: AckToken::default(),
        }
    }
}

impl PartialEq for Message {
    /// Equal records (the [`AckToken`] is not compared).
    fn eq(&self, other: &Self) -> bool {
        self.topic == other.topic
            && self.partition == other.partition
            && self.key == other.key
            && self.value == other.value
            && self.headers == other.headers
            && self.timestamp == other.timestamp
    }
}

impl Eq for Message {}

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

    /// Carry `ack` (the [`AckToken`] of the consumed message(s) this one is made from, or
    /// a [`SharedAck`](crate::group::SharedAck) clone): acked once the broker acknowledges
    /// this message, failed if its delivery fails. A message already carrying a token
    /// carries both.
    ///
    /// ```
    /// # fn demo(mut consumed: kafkapipe::reader::Message) {
    /// use kafkapipe::writer::Message;
    /// let out = Message::new("derived").with_ack(consumed.take_ack_token());
    /// # }
    /// ```
    pub fn with_ack(mut self, ack: impl Into<AckToken>) -> Self {
        let ack = ack.into();
        self.ack = if self.ack.is_tracked() {
            [std::mem::take(&mut self.ack), ack].into_iter().collect()
        } else {
            ack
        };
        self
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

    /// Set the W3C `traceparent` header (replacing one already there) to `cx`, so the
    /// consumer can link its span to the producer's (feature `trace-context`; see
    /// [`crate::trace_context`]).
    ///
    /// ```
    /// use kafkapipe::trace_context::TraceContext;
    /// use kafkapipe::writer::Message;
    /// let cx = TraceContext::new([7; 16], [9; 8], 1).unwrap();
    /// let m = Message::new("v").with_trace_context(&cx).with_trace_context(&cx);
    /// assert_eq!(m.headers.len(), 1);
    /// assert_eq!(m.headers[0].key, "traceparent");
    /// ```
    #[cfg(feature = "trace-context")]
    pub fn with_trace_context(mut self, cx: &crate::trace_context::TraceContext) -> Self {
        use crate::trace_context::TRACEPARENT;
        self.headers.retain(|h| h.key != TRACEPARENT);
        self.headers.push(Header::new(TRACEPARENT, cx.to_string()));
        self
    }

    /// Set the value.
    ///
    /// ```
    /// let m = kafkapipe::writer::Message::default().with_value("v");
    /// assert_eq!(m.value.as_deref(), Some(&b"v"[..]));
    /// ```
    pub fn with_value(mut self, value: impl Into<Bytes>) -> Self {
        self.value = Some(value.into());
        self
    }

    /// Set the create timestamp (ms since the Unix epoch).
    pub fn with_timestamp(mut self, timestamp_ms: i64) -> Self {
        self.timestamp = Some(timestamp_ms);
        self
    }

    /// The bytes this message accounts for in the writer's buffer bound: key, value and
    /// headers plus a fixed per-record overhead (about the record framing; within 64
    /// bytes of the encoded record size).
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
