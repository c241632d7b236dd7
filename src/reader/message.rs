//! [`Message`]: one record as the [`Reader`](super::Reader) yields it.

use std::sync::Arc;

use bytes::Bytes;

use crate::group::AckToken;
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
///
/// A group reader's messages also carry an [`AckToken`] that says when the message is
/// processed (acked, handed to a [`Writer`](crate::writer::Writer) with
/// [`writer::Message::with_ack`](crate::writer::Message::with_ack), or dropped), so the
/// group commits past it only then. Clones carry an inert token, and equality ignores it.
#[derive(Debug)]
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
    ack: AckToken,
    /// What it counts against the reader's byte capacity while queued: its encoded record
    /// length (see [`ReaderConfig::queue_capacity_bytes`](super::ReaderConfig::queue_capacity_bytes)).
    queued: u32,
    /// See [`Message::leader_epoch`]; -1 unknown (an `i32` beside `queued`, where an
    /// `Option<i32>` would make every message 8 bytes larger).
    epoch: i32,
    /// Share groups: how many times the record was delivered (0: not a share record).
    delivery: i16,
}

impl Clone for Message {
    /// A copy of the record; its [`AckToken`] is inert (the original's decides).
    fn clone(&self) -> Self {
        Message {
            topic: self.topic.clone(),
            partition: self.partition,
            offset: self.offset,
            high_watermark: self.high_watermark,
            key: self.key.clone(),
            value: self.value.clone(),
            headers: self.headers.clone(),
            timestamp: self.timestamp,
            ack: AckToken::default(),
            queued: self.queued,
            epoch: self.epoch,
            delivery: self.delivery,
        }
    }
}

impl PartialEq for Message {
    fn eq(&self, other: &Self) -> bool {
        self.topic == other.topic
            && self.partition == other.partition
            && self.offset == other.offset
            && self.high_watermark == other.high_watermark
            && self.key == other.key
            && self.value == other.value
            && self.headers == other.headers
            && self.timestamp == other.timestamp
            && self.epoch == other.epoch
            && self.delivery == other.delivery
    }
}

impl Eq for Message {}

// Here rather than in `writer`: the reader sits above the writer (DESIGN.md, "Layers").
impl From<Message> for crate::writer::Message {
    /// The consumed record's key, value, headers and timestamp, carrying its
    /// [`AckToken`]; topic and partition are left to the writer (a consumed topic is
    /// rarely the destination).
    ///
    /// ```
    /// use kafkapipe::{reader, writer};
    /// let mut consumed = reader::Message::new("in", 0, 7);
    /// consumed.value = Some("v".into());
    /// let out = writer::Message::from(consumed).with_topic("out");
    /// assert_eq!(out.value.as_deref(), Some(&b"v"[..]));
    /// ```
    fn from(mut m: Message) -> Self {
        let ack = m.take_ack_token();
        crate::writer::Message {
            topic: None,
            partition: None,
            key: m.key,
            value: m.value,
            headers: m.headers,
            timestamp: (m.timestamp >= 0).then_some(m.timestamp),
            ack,
        }
    }
}

impl Message {
    #[inline]
    pub(crate) fn from_record(
        topic: &Arc<str>,
        partition: i32,
        high_watermark: i64,
        leader_epoch: i32,
        r: Record,
        queued: usize,
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
            ack: AckToken::default(),
            queued: u32::try_from(queued).unwrap_or(u32::MAX),
            epoch: leader_epoch.max(-1),
            delivery: 0,
        }
    }

    /// A message of `topic`/`partition` at `offset` with no key, value or headers and an
    /// inert [`AckToken`] — for tests of code that handles messages.
    ///
    /// ```
    /// use kafkapipe::reader::Message;
    /// let mut m = Message::new("events", 0, 41);
    /// m.value = Some("hello".into());
    /// assert_eq!(m.high_watermark, 42);
    /// ```
    pub fn new(topic: &str, partition: i32, offset: i64) -> Self {
        Message {
            topic: Arc::from(topic),
            partition,
            offset,
            high_watermark: offset.saturating_add(1),
            key: None,
            value: None,
            headers: Vec::new(),
            timestamp: -1,
            ack: AckToken::default(),
            queued: 0,
            epoch: -1,
            delivery: 0,
        }
    }

    /// The leader epoch of the partition leader that appended the record (its batch's
    /// partition leader epoch; Java `ConsumerRecord::leaderEpoch`, KIP-320), `None` when
    /// unknown (legacy messages, brokers without leader epochs, [`Message::new`]).
    ///
    /// ```
    /// use kafkapipe::reader::Message;
    /// assert_eq!(Message::new("t", 0, 0).leader_epoch(), None);
    /// ```
    pub fn leader_epoch(&self) -> Option<i32> {
        (self.epoch >= 0).then_some(self.epoch)
    }

    /// This message's [`AckToken`].
    ///
    /// ```
    /// # fn demo(m: &kafkapipe::reader::Message) {
    /// if m.ack_token().is_tracked() { /* a group reader's message */ }
    /// # }
    /// ```
    pub fn ack_token(&self) -> &AckToken {
        &self.ack
    }

    /// For a message of a [`ShareReader`](crate::share::ShareReader): how many times the
    /// broker has delivered this record, this delivery included (1 the first time; a
    /// released record or one whose acquisition lock expired comes back with one more).
    /// `None` for messages of other readers.
    ///
    /// ```
    /// let m = kafkapipe::reader::Message::new("events", 0, 42);
    /// assert_eq!(m.delivery_count(), None);
    /// ```
    pub fn delivery_count(&self) -> Option<u16> {
        u16::try_from(self.delivery).ok().filter(|&n| n > 0)
    }

    pub(crate) fn set_delivery_count(&mut self, n: i16) {
        self.delivery = n;
    }

    /// Take this message's [`AckToken`] (leaving an inert one), to ack it later or to
    /// hand it to a [`writer::Message`](crate::writer::Message).
    ///
    /// ```
    /// use kafkapipe::writer;
    /// # fn demo(mut m: kafkapipe::reader::Message) -> writer::Message {
    /// let out = writer::Message::new(m.value.clone().unwrap_or_default());
    /// out.with_ack(m.take_ack_token())
    /// # }
    /// ```
    pub fn take_ack_token(&mut self) -> AckToken {
        std::mem::take(&mut self.ack)
    }

    /// The W3C trace context its producer attached: the first `traceparent` header that
    /// parses (feature `trace-context`; see [`crate::trace_context`]). Messages from the
    /// Java client's or librdkafka's OpenTelemetry instrumentation read the same way.
    ///
    /// ```
    /// use kafkapipe::reader::Message;
    /// use kafkapipe::record::Header;
    /// let mut m = Message::new("t", 0, 0);
    /// assert!(m.trace_context().is_none());
    /// m.headers.push(Header::new("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"));
    /// assert_eq!(m.trace_context().unwrap().trace_id_hex(), "4bf92f3577b34da6a3ce929d0e0e4736");
    /// ```
    #[cfg(feature = "trace-context")]
    pub fn trace_context(&self) -> Option<crate::trace_context::TraceContext> {
        use crate::trace_context::{TraceContext, TRACEPARENT};
        self.headers
            .iter()
            .filter(|h| h.key == TRACEPARENT)
            .find_map(|h| h.value.as_deref().and_then(TraceContext::from_header))
    }

    /// The bytes it counts against the reader's byte capacity while queued.
    #[inline]
    pub(crate) fn queued_size(&self) -> usize {
        self.queued as usize
    }

    #[cfg(test)]
    pub(crate) fn set_queued_size(&mut self, n: usize) {
        self.queued = u32::try_from(n).unwrap_or(u32::MAX);
    }

    #[inline]
    pub(crate) fn set_ack_token(&mut self, ack: AckToken) {
        self.ack = ack;
    }

    /// The bytes of its key, value, header keys and header values. (While buffered it
    /// counted its encoded size, a few bytes more, against
    /// [`ReaderConfig::queue_capacity_bytes`](super::ReaderConfig::queue_capacity_bytes).)
    ///
    /// ```
    /// use kafkapipe::reader::Message;
    /// let mut m = Message::new("t", 0, 0);
    /// m.key = Some("k".into());
    /// m.value = Some("vv".into());
    /// assert_eq!(m.size(), 3);
    /// ```
    #[inline]
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
