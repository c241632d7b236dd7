//! Types and helpers shared by the reader, the consumer group and the writer, owned below
//! all three so that none of them imports another for them (DESIGN.md, "Layers"):
//! [`TopicPartition`] and [`StartOffset`] (re-exported as `reader::TopicPartition` and
//! `reader::StartOffset`), and [`retry`], the retry policy of the fetch and group tasks.
//! Nothing here does I/O.

pub(crate) mod retry;

/// Where a partition starts (or restarts after [`Reader::seek_to_time`]) when the reader
/// has no explicit offset for it (kafka-go `StartOffset`, Java `auto.offset.reset` for the
/// first two).
///
/// ```
/// use kafkapipe::reader::StartOffset;
/// assert_eq!(StartOffset::default(), StartOffset::First);
/// let _ = StartOffset::At(42);
/// ```
///
/// [`Reader::seek_to_time`]: crate::reader::Reader::seek_to_time
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StartOffset {
    /// The first offset still in the log (kafka-go `FirstOffset`, Java `earliest`).
    #[default]
    First,
    /// The high-water mark: only messages written from now on (kafka-go `LastOffset`,
    /// Java `latest`).
    Last,
    /// This offset.
    At(i64),
    /// The first offset whose timestamp is at or after this many milliseconds since the
    /// epoch, found with ListOffsets; the high-water mark if there is none (Java
    /// `offsetsForTimes`, kafka-go `SetOffsetAt`).
    AtTimestamp(i64),
}

/// One partition of one topic.
///
/// ```
/// use kafkapipe::reader::TopicPartition;
/// let tp = TopicPartition::new("events", 3);
/// assert_eq!(tp.to_string(), "events/3");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TopicPartition {
    /// Topic name.
    pub topic: String,
    /// Partition index.
    pub partition: i32,
}

impl TopicPartition {
    /// `topic`/`partition`.
    pub fn new(topic: impl Into<String>, partition: i32) -> Self {
        TopicPartition {
            topic: topic.into(),
            partition,
        }
    }
}

impl std::fmt::Display for TopicPartition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.topic, self.partition)
    }
}
