//! Offset commits of a group member: the per-partition bookkeeping (merge, contiguous
//! acks) and the [`Committer`] sink.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::Sink;
use tracing::debug;

use super::GroupShared;
use crate::error::{Error, Result};
use crate::reader::{Message, TopicPartition};

/// A processed message's position, handed to a [`Committer`]: committing it makes the
/// group resume at `offset + 1`.
///
/// ```
/// use kafkapipe::group::Offset;
/// let o = Offset::new("events", 3, 41);
/// assert_eq!(o.offset, 41);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Offset {
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: i32,
    /// The offset of the processed message (not the next one).
    pub offset: i64,
}

impl Offset {
    /// The processed message `topic`/`partition`@`offset`.
    pub fn new(topic: impl Into<String>, partition: i32, offset: i64) -> Self {
        Offset {
            topic: topic.into(),
            partition,
            offset,
        }
    }
}

impl From<&Message> for Offset {
    fn from(m: &Message) -> Self {
        Offset::new(&*m.topic, m.partition, m.offset)
    }
}

impl From<Message> for Offset {
    fn from(m: Message) -> Self {
        Offset::from(&m)
    }
}

/// When a [`Committer`] sends offsets to the group coordinator.
///
/// ```
/// use std::time::Duration;
/// use kafkapipe::group::CommitMode;
/// assert_eq!(CommitMode::default(), CommitMode::Interval(Duration::from_secs(1)));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommitMode {
    /// Every offset is committed before the sink accepts the next one (`poll_ready`
    /// commits what is pending), and `flush` resolves once the broker accepted every
    /// offset sent before it (kafka-go `CommitInterval: 0`). One OffsetCommit per item:
    /// simple and slow.
    Sync,
    /// Offsets are merged and committed by the group task every this often (kafka-go
    /// `CommitInterval`, Java `auto.commit.interval.ms` style); `flush` and `close` still
    /// commit right away and wait for the broker.
    Interval(Duration),
}

impl Default for CommitMode {
    fn default() -> Self {
        CommitMode::Interval(Duration::from_secs(1))
    }
}

/// Commit bookkeeping of one owned partition.
#[derive(Debug)]
pub(crate) struct PartCommit {
    /// The last offset the broker accepted from this member (-1: none).
    pub(crate) committed: i64,
    /// The next offset to commit (processed message + 1), -1 while nothing is pending.
    pub(crate) pending: i64,
    /// With contiguous tracking: offsets yielded by the reader, in order, and whether
    /// each was acked. The front is the oldest unacked delivery.
    delivered: VecDeque<(i64, bool)>,
}

impl Default for PartCommit {
    fn default() -> Self {
        PartCommit::new()
    }
}

impl PartCommit {
    fn new() -> Self {
        PartCommit {
            committed: -1,
            pending: -1,
            delivered: VecDeque::new(),
        }
    }

    /// The message at `offset` was yielded to the application.
    pub(crate) fn delivered(&mut self, offset: i64) {
        if self.delivered.back().is_some_and(|(o, _)| *o >= offset) {
            // a seek back: earlier deliveries no longer decide anything
            self.delivered.clear();
        }
        self.delivered.push_back((offset, false));
    }

    /// Record an ack of `offset`. Without `contiguous`, the pending offset becomes
    /// `offset + 1` if that is higher. With it, the pending offset only moves past a
    /// delivered message once every earlier delivered message was acked. Returns whether
    /// the pending offset moved.
    pub(crate) fn ack(&mut self, offset: i64, contiguous: bool) -> bool {
        let before = self.pending;
        if !contiguous {
            self.pending = self.pending.max(offset.saturating_add(1));
            return self.pending != before;
        }
        match self.delivered.binary_search_by_key(&offset, |(o, _)| *o) {
            Ok(i) => {
                if let Some(d) = self.delivered.get_mut(i) {
                    d.1 = true;
                }
            }
            Err(_) => {
                // Not tracked: delivered before tracking began (before the first
                // committer), already committed, or never delivered. Below the first
                // tracked delivery it is merged without passing that delivery.
                match self.delivered.front() {
                    Some(&(front, _)) if offset >= front => {
                        debug!(offset, "ack of an offset this reader did not yield ignored");
                    }
                    Some(&(front, _)) => {
                        self.pending = self.pending.max(offset.saturating_add(1).min(front));
                    }
                    None => self.pending = self.pending.max(offset.saturating_add(1)),
                }
                return self.pending != before;
            }
        }
        while let Some(&(o, true)) = self.delivered.front() {
            self.pending = self.pending.max(o.saturating_add(1));
            self.delivered.pop_front();
        }
        self.pending != before
    }

    /// The offset to commit, if it is ahead of what the broker has.
    pub(crate) fn due(&self) -> Option<i64> {
        (self.pending > self.committed).then_some(self.pending)
    }

    /// The broker accepted `offset`: never moves backwards.
    pub(crate) fn committed(&mut self, offset: i64) {
        self.committed = self.committed.max(offset);
    }
}

/// Commit state of every owned partition, keyed by topic then partition (so the reader can
/// look a message's partition up without allocating).
#[derive(Debug, Default)]
pub(crate) struct Commits {
    pub(crate) parts: HashMap<String, HashMap<i32, PartCommit>>,
    /// Whether deliveries are tracked (contiguous mode and a committer exists).
    pub(crate) tracking: bool,
}

impl Commits {
    pub(crate) fn own(&mut self, tp: &TopicPartition, committed: i64) {
        let p = self
            .parts
            .entry(tp.topic.clone())
            .or_default()
            .entry(tp.partition)
            .or_default();
        p.committed = committed;
        p.pending = p.pending.max(committed);
    }

    pub(crate) fn disown(&mut self, tp: &TopicPartition) {
        if let Some(t) = self.parts.get_mut(&tp.topic) {
            t.remove(&tp.partition);
            if t.is_empty() {
                self.parts.remove(&tp.topic);
            }
        }
    }

    pub(crate) fn get_mut(&mut self, topic: &str, partition: i32) -> Option<&mut PartCommit> {
        self.parts.get_mut(topic)?.get_mut(&partition)
    }

    /// The offsets to commit (of `only`, if given).
    pub(crate) fn due(&self, only: Option<&[TopicPartition]>) -> Vec<(TopicPartition, i64)> {
        let mut v = Vec::new();
        for (t, ps) in &self.parts {
            for (p, c) in ps {
                if let Some(o) = c.due() {
                    let tp = TopicPartition::new(t.clone(), *p);
                    if only.map_or(true, |only| only.contains(&tp)) {
                        v.push((tp, o));
                    }
                }
            }
        }
        v.sort();
        v
    }
}

type CommitFuture = Pin<Box<dyn Future<Output = Result<()>> + Send>>;

/// The commit sink of a group [`Reader`](crate::reader::Reader): a cloneable handle
/// implementing `Sink<Offset>` (and `Sink<Message>`, `Sink<&Message>`), so a pipeline can
/// end in `.forward(reader.committer())`.
///
/// Sending a message (or its [`Offset`]) says it was processed. Offsets are merged per
/// partition and a committed offset never goes backwards. With
/// [`ReaderConfig::commit_contiguous`](crate::reader::ReaderConfig::commit_contiguous)
/// (the default) the committer tracks acks that arrive out of order and commits, per
/// partition, only up to the lowest message not yet acked — so a message is never
/// committed before every earlier message this reader yielded was processed.
/// Acks of partitions this member no longer owns (revoked in a rebalance) are dropped:
/// another member now reads them from the last commit.
///
/// ```no_run
/// use futures::{StreamExt, TryStreamExt};
/// use kafkapipe::reader::{Reader, ReaderConfig};
///
/// # async fn demo() -> kafkapipe::Result<()> {
/// let reader = Reader::new(ReaderConfig::new(["127.0.0.1:9092"]).group_id("g").topic("events")).await?;
/// let Some(committer) = reader.committer() else { return Ok(()) };
/// reader
///     .inspect_ok(|m| println!("{}@{}", m.partition, m.offset))
///     .forward(committer)
///     .await?;
/// # Ok(()) }
/// ```
///
/// # Cancellation safety
///
/// Dropping a pending `flush`/`send` loses no offset: it stays pending and is committed by
/// the next flush, the interval tick or the reader's close. The commit request in flight
/// may still reach the broker.
pub struct Committer {
    shared: Arc<GroupShared>,
    /// The commit `poll_flush` drives; in a mutex (only ever used through `get_mut`, so
    /// never contended) so that `Committer` is `Sync` although the future is not.
    flushing: std::sync::Mutex<Option<CommitFuture>>,
}

impl std::fmt::Debug for Committer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Committer")
            .field("group_id", &self.shared.group_id)
            .finish_non_exhaustive()
    }
}

impl Clone for Committer {
    fn clone(&self) -> Self {
        Committer::new(self.shared.clone())
    }
}

impl Committer {
    pub(crate) fn new(shared: Arc<GroupShared>) -> Self {
        if shared.contiguous {
            shared.commits().tracking = true;
        }
        Committer {
            shared,
            flushing: std::sync::Mutex::new(None),
        }
    }

    /// Record that the message at `offset` was processed (what `start_send` does).
    ///
    /// ```no_run
    /// # fn demo(c: &kafkapipe::group::Committer, m: &kafkapipe::reader::Message) {
    /// c.ack(m);
    /// # }
    /// ```
    pub fn ack(&self, offset: impl Into<Offset>) {
        self.shared.ack(offset.into());
    }

    /// Commit every pending offset now and wait for the broker.
    ///
    /// ```no_run
    /// # async fn demo(c: &kafkapipe::group::Committer) -> kafkapipe::Result<()> {
    /// c.commit().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// The OffsetCommit error (e.g. `RebalanceInProgress`, `IllegalGeneration` when the
    /// member lost its partitions); the offsets stay pending if still owned.
    ///
    /// # Cancellation safety
    ///
    /// As for the sink: nothing pending is lost.
    pub async fn commit(&self) -> Result<()> {
        self.shared.commit_pending(None).await
    }

    fn poll_commit(&mut self, cx: &mut Context<'_>) -> Poll<Result<()>> {
        let shared = &self.shared;
        let flushing = self
            .flushing
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let fut = flushing.get_or_insert_with(|| {
            let shared = shared.clone();
            Box::pin(async move { shared.commit_pending(None).await })
        });
        let r = futures::ready!(fut.as_mut().poll(cx));
        *flushing = None;
        Poll::Ready(r)
    }
}

impl<T: Into<Offset>> Sink<T> for Committer {
    type Error = Error;

    fn poll_ready(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<()>> {
        let this = self.get_mut();
        if this.shared.mode == CommitMode::Sync && this.shared.has_due() {
            return this.poll_commit(cx);
        }
        Poll::Ready(Ok(()))
    }

    fn start_send(self: Pin<&mut Self>, item: T) -> Result<()> {
        self.shared.ack(item.into());
        Ok(())
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<()>> {
        self.get_mut().poll_commit(cx)
    }

    fn poll_close(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<()>> {
        self.get_mut().poll_commit(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn committer_is_send_and_sync() {
        fn check<T: Send + Sync + Unpin>() {}
        check::<Committer>();
    }

    #[test]
    fn merge_never_regresses() {
        let mut p = PartCommit::new();
        assert!(p.ack(10, false));
        assert!(!p.ack(3, false));
        assert_eq!(p.due(), Some(11));
        p.committed(11);
        assert_eq!(p.due(), None);
        p.committed(5);
        assert_eq!(p.committed, 11);
        assert!(!p.ack(7, false));
        assert_eq!(p.due(), None);
    }

    #[test]
    fn contiguous_commits_only_the_acked_prefix() {
        let mut p = PartCommit::new();
        for o in [5, 6, 8, 9] {
            p.delivered(o); // 7 was a control record: never delivered
        }
        assert!(!p.ack(6, true));
        assert!(!p.ack(9, true));
        assert_eq!(p.due(), None);
        assert!(p.ack(5, true));
        assert_eq!(p.due(), Some(7));
        assert!(p.ack(8, true));
        assert_eq!(p.due(), Some(10));
        // acks of already-covered offsets change nothing
        assert!(!p.ack(5, true));
        assert_eq!(p.due(), Some(10));
        // nothing tracked: merged like an untracked ack
        assert!(p.ack(100, true));
        assert_eq!(p.due(), Some(101));
    }

    #[test]
    fn acks_of_messages_yielded_before_tracking_never_pass_a_tracked_one() {
        let mut p = PartCommit::new();
        p.delivered(10); // tracking began at 10; 0..10 were yielded before
        assert!(p.ack(4, true));
        assert_eq!(p.due(), Some(5));
        assert!(!p.ack(12, true)); // beyond what was yielded: ignored
        assert!(p.ack(9, true));
        assert_eq!(p.due(), Some(10));
        assert!(p.ack(10, true));
        assert_eq!(p.due(), Some(11));
    }

    #[test]
    fn contiguous_after_seek_back_restarts_tracking() {
        let mut p = PartCommit::new();
        p.delivered(10);
        p.delivered(11);
        p.delivered(3);
        assert!(p.ack(3, true));
        assert_eq!(p.due(), Some(4));
    }

    #[test]
    fn commits_due_filters_and_sorts() {
        let mut c = Commits::default();
        c.own(&TopicPartition::new("t", 1), 4);
        c.own(&TopicPartition::new("t", 0), -1);
        c.get_mut("t", 0).map(|p| p.ack(2, false));
        c.get_mut("t", 1).map(|p| p.ack(9, false));
        assert_eq!(
            c.due(None),
            vec![
                (TopicPartition::new("t", 0), 3),
                (TopicPartition::new("t", 1), 10)
            ]
        );
        assert_eq!(
            c.due(Some(&[TopicPartition::new("t", 1)])),
            vec![(TopicPartition::new("t", 1), 10)]
        );
        c.disown(&TopicPartition::new("t", 1));
        assert_eq!(c.due(None).len(), 1);
        assert!(c.get_mut("x", 0).is_none());
    }
}
