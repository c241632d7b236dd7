//! The pre-revoke hook: [`RevokeHook`], what a group reader runs before it commits and
//! gives up partitions (Java's `ConsumerRebalanceListener.onPartitionsRevoked`,
//! rust-rdkafka's `pre_rebalance`), so stages that buffer messages can flush them first.

use std::fmt;
use std::future::Future;
use std::sync::Arc;

use futures::future::BoxFuture;

use crate::common::TopicPartition;

/// What a group reader runs before it gives partitions up, so the messages a stateful
/// stage still holds get processed — and committed — first.
///
/// Set it with [`ReaderConfig::on_revoke`](crate::reader::ReaderConfig::on_revoke). When
/// partitions are revoked (eager and cooperative classic rebalances, KIP-848
/// reconciliations) and when the reader closes, the group:
///
/// 1. stops yielding messages of those partitions (their buffered, not yet yielded
///    messages are dropped);
/// 2. runs the hook with the partitions and waits for its future, at most
///    [`ReaderConfig::rebalance_timeout`](crate::reader::ReaderConfig::rebalance_timeout)
///    (a classic member keeps heartbeating meanwhile; a KIP-848 member's heartbeats go
///    on beside it anyway);
/// 3. commits what was processed of them — including what the hook made processed:
///    the tokens of the messages a stage flushed and acked (or wrote with a
///    [`Writer`](crate::writer::Writer)) while the hook ran;
/// 4. gives them up and emits [`GroupEvent::Revoked`](super::GroupEvent::Revoked).
///
/// So a stage that buffers messages (holding their [`AckToken`](super::AckToken)s) is
/// told to flush by the hook, writes or acks them, and the hook's future completes once
/// it did: those messages are committed before another member gets the partitions, and
/// it does not read them again. On close the hook runs with every owned partition
/// before the reader waits for held tokens and commits.
///
/// Partitions that are *lost* (the session expired, the member was fenced) do not run
/// the hook: nothing can be committed for them any more. Hook calls never overlap; a
/// hook that outlives the rebalance timeout is dropped (with a warning) and the group
/// commits what was processed by then.
///
/// Any `Fn(Vec<TopicPartition>) -> impl Future<Output = ()>` is a hook:
///
/// ```no_run
/// use kafkapipe::reader::{ReaderConfig, TopicPartition};
/// use tokio::sync::{mpsc, oneshot};
///
/// // the stage that buffers messages listens on `flush_rx`: it writes and acks what it
/// // holds, then answers
/// let (flush_tx, flush_rx) = mpsc::channel::<oneshot::Sender<()>>(1);
/// # drop(flush_rx);
/// let config = ReaderConfig::new(["localhost:9092"])
///     .group_id("billing")
///     .topic("orders")
///     .on_revoke(move |partitions: Vec<TopicPartition>| {
///         let flush_tx = flush_tx.clone();
///         async move {
///             println!("flushing before {} partitions go", partitions.len());
///             let (done_tx, done_rx) = oneshot::channel();
///             if flush_tx.send(done_tx).await.is_ok() {
///                 let _ = done_rx.await;
///             }
///         }
///     });
/// ```
///
/// # Cancellation safety
///
/// The hook's future is dropped if it outlives the rebalance timeout, or if the reader's
/// close outlives its bound; it must leave the stage consistent when it is (the
/// messages it did not get processed are read again by the partitions' next owner).
pub trait RevokeHook: Send + Sync + 'static {
    /// Called with the partitions about to be committed and given up; the group waits
    /// for the returned future.
    fn revoking(&self, partitions: Vec<TopicPartition>) -> BoxFuture<'static, ()>;
}

impl<F, Fut> RevokeHook for F
where
    F: Fn(Vec<TopicPartition>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    fn revoking(&self, partitions: Vec<TopicPartition>) -> BoxFuture<'static, ()> {
        Box::pin(self(partitions))
    }
}

/// The hook a [`ReaderConfig`](crate::reader::ReaderConfig) holds.
#[derive(Clone)]
pub(crate) struct SharedRevokeHook(pub(crate) Arc<dyn RevokeHook>);

impl fmt::Debug for SharedRevokeHook {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("RevokeHook")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_closure_is_a_hook() {
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let s = seen.clone();
        let hook = SharedRevokeHook(Arc::new(move |parts: Vec<TopicPartition>| {
            let s = s.clone();
            async move { s.lock().unwrap_or_else(|e| e.into_inner()).extend(parts) }
        }));
        hook.0.revoking(vec![TopicPartition::new("t", 1)]).await;
        assert_eq!(
            *seen.lock().unwrap_or_else(|e| e.into_inner()),
            [TopicPartition::new("t", 1)]
        );
        assert_eq!(format!("{hook:?}"), "RevokeHook");
    }
}
