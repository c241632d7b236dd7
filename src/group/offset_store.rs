//! Start offsets kept outside Kafka: [`OffsetStore`].

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::sync::Arc;

use futures::future::BoxFuture;

use crate::common::TopicPartition;
use crate::error::Result;

/// Where a group reader's newly assigned partitions start, when the application keeps its
/// consumed offsets itself — typically in the same database transaction as the results
/// they produced, so a crash can neither lose nor repeat a record (the seed's
/// `loadOffsetFromDB` pattern; Java's "storing offsets outside Kafka" with a
/// `ConsumerRebalanceListener` that seeks in `onPartitionsAssigned`).
///
/// Set it with [`ReaderConfig::offset_store`](crate::reader::ReaderConfig::offset_store).
/// On every assignment (eager or cooperative) the group asks the store about the
/// partitions it was just given, before any of them is fetched:
///
/// - a partition the store answers for starts at that offset (the *next* offset to read:
///   the last stored record's offset + 1);
/// - a partition it leaves out starts at the group's committed offset, or at
///   [`ReaderConfig::start_offset`](crate::reader::ReaderConfig::start_offset) if there
///   is none — so a store can be introduced to an existing group.
///
/// A store that fails (or answers a negative offset) fails the assignment like a failed
/// OffsetFetch: the member retries with backoff, and the error reaches the reader's
/// stream after [`ReaderConfig::retry_timeout`](crate::reader::ReaderConfig::retry_timeout).
///
/// The group still commits to Kafka as configured (useful for lag monitoring); the store
/// wins over those commits. To make the store's offsets the only ones, process each
/// message and save its offset in one transaction of your own, and ack the message after
/// that transaction committed.
///
/// Any `Fn(Vec<TopicPartition>) -> impl Future<Output = Result<HashMap<TopicPartition, i64>>>`
/// is a store:
///
/// ```no_run
/// use std::collections::HashMap;
/// use kafkapipe::reader::{ReaderConfig, TopicPartition};
///
/// let config = ReaderConfig::new(["localhost:9092"])
///     .group_id("billing")
///     .topic("orders")
///     .offset_store(|partitions: Vec<TopicPartition>| async move {
///         // look the partitions up in your database here
///         let mut next = HashMap::new();
///         for tp in partitions {
///             next.insert(tp, 0);
///         }
///         Ok(next)
///     });
/// ```
///
/// `examples/sqlite_offsets.rs` keeps results and offsets in one SQLite transaction and
/// survives a crash without loss or duplicates.
///
/// # Cancellation safety
///
/// A `load` future may be dropped before it completes (the member lost its assignment or
/// the reader closed); it must leave the store consistent when it is.
pub trait OffsetStore: Send + Sync + 'static {
    /// The next offset to read of each of `partitions` that the store knows.
    fn load(
        &self,
        partitions: Vec<TopicPartition>,
    ) -> BoxFuture<'static, Result<HashMap<TopicPartition, i64>>>;
}

impl<F, Fut> OffsetStore for F
where
    F: Fn(Vec<TopicPartition>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<HashMap<TopicPartition, i64>>> + Send + 'static,
{
    fn load(
        &self,
        partitions: Vec<TopicPartition>,
    ) -> BoxFuture<'static, Result<HashMap<TopicPartition, i64>>> {
        Box::pin(self(partitions))
    }
}

/// The store a [`ReaderConfig`](crate::reader::ReaderConfig) holds.
#[derive(Clone)]
pub(crate) struct SharedStore(pub(crate) Arc<dyn OffsetStore>);

impl fmt::Debug for SharedStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("OffsetStore")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_closure_is_a_store() {
        let store = SharedStore(Arc::new(|parts: Vec<TopicPartition>| async move {
            Ok(parts.into_iter().map(|tp| (tp, 7)).collect())
        }));
        let tp = TopicPartition::new("t", 1);
        let got = store.0.load(vec![tp.clone()]).await;
        assert_eq!(got.ok().and_then(|m| m.get(&tp).copied()), Some(7));
        assert_eq!(format!("{store:?}"), "OffsetStore");
    }
}
