//! Offset commits of a group member: the per-partition bookkeeping (merge, contiguous
//! acks) and the [`Committer`] sink.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use super::GroupShared;
use crate::ack::Track;
use crate::common::TopicPartition;
use crate::error::{Error, Result};
use crate::reader::Message;
use futures::Sink;

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
    /// The ownership of the partition the message was yielded under, when the offset
    /// comes from a message: an ack from an earlier assignment is ignored.
    assignment: Option<u64>,
}

impl Offset {
    /// The processed message `topic`/`partition`@`offset`.
    pub fn new(topic: impl Into<String>, partition: i32, offset: i64) -> Self {
        Offset {
            topic: topic.into(),
            partition,
            offset,
            assignment: None,
        }
    }

    pub(crate) fn assignment(&self) -> Option<u64> {
        self.assignment
    }
}

impl From<&Message> for Offset {
    fn from(m: &Message) -> Self {
        Offset {
            assignment: m.ack_token().assignment(),
            ..Offset::new(&*m.topic, m.partition, m.offset)
        }
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
    /// `CommitInterval`, Java `auto.commit.interval.ms` style); the [`Committer`]'s
    /// `close` and [`Committer::commit`] still commit right away and wait for the broker
    /// (its `flush` does not: see [`Committer`]).
    Interval(Duration),
}

impl Default for CommitMode {
    fn default() -> Self {
        CommitMode::Interval(Duration::from_secs(1))
    }
}

/// Commit state of every owned partition, keyed by topic then partition: one [`Track`]
/// per ownership (see [`AckToken`](super::AckToken)).
#[derive(Debug, Default)]
pub(crate) struct Commits {
    pub(crate) parts: HashMap<String, HashMap<i32, Arc<Track>>>,
}

impl Commits {
    /// Own `tp`, committed at `committed`: a new track (an earlier one of the same
    /// partition is deactivated, so its tokens change nothing).
    pub(crate) fn own(&mut self, tp: &TopicPartition, track: Arc<Track>) {
        if let Some(old) = self
            .parts
            .entry(tp.topic.clone())
            .or_default()
            .insert(tp.partition, track)
        {
            old.deactivate();
        }
    }

    pub(crate) fn disown(&mut self, tp: &TopicPartition) {
        if let Some(t) = self.parts.get_mut(&tp.topic) {
            if let Some(track) = t.remove(&tp.partition) {
                track.deactivate();
            }
            if t.is_empty() {
                self.parts.remove(&tp.topic);
            }
        }
    }

    pub(crate) fn get(&self, topic: &str, partition: i32) -> Option<&Arc<Track>> {
        self.parts.get(topic)?.get(&partition)
    }

    /// The offsets to commit (of `only`, if given).
    pub(crate) fn due(&self, only: Option<&[TopicPartition]>) -> Vec<(TopicPartition, i64)> {
        let mut v = Vec::new();
        for (t, ps) in &self.parts {
            for (p, track) in ps {
                if let Some(o) = track.due() {
                    let tp = TopicPartition::new(t.clone(), *p);
                    if only.is_none_or(|only| only.contains(&tp)) {
                        v.push((tp, o));
                    }
                }
            }
        }
        v.sort();
        v
    }

    /// Messages yielded whose tokens are still held, over every owned partition.
    pub(crate) fn held(&self) -> usize {
        self.parts
            .values()
            .flat_map(|ps| ps.values())
            .map(|t| t.held())
            .sum()
    }

    /// Messages yielded and not known processed, and the oldest of them.
    pub(crate) fn unacked(&self) -> (usize, Option<Unacked>) {
        let mut total = 0;
        let mut oldest: Option<Unacked> = None;
        for (t, ps) in &self.parts {
            for (p, track) in ps {
                let (n, front) = track.unacked();
                total += n;
                if let Some((offset, at)) = front {
                    let age = at.elapsed();
                    if oldest.as_ref().is_none_or(|o| age > o.age) {
                        oldest = Some(Unacked {
                            topic: t.clone(),
                            partition: *p,
                            offset,
                            age,
                        });
                    }
                }
            }
        }
        (total, oldest)
    }
}

/// The oldest message a group reader yielded that is not known processed yet (see
/// [`ReaderStats::oldest_unacked`](crate::reader::ReaderStats::oldest_unacked)): where a
/// stuck pipeline is stuck.
///
/// ```
/// # fn show(s: &kafkapipe::reader::ReaderStats) {
/// if let Some(u) = &s.oldest_unacked {
///     println!("{}/{}@{} unacked for {:?}", u.topic, u.partition, u.offset, u.age);
/// }
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unacked {
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: i32,
    /// The message's offset.
    pub offset: i64,
    /// How long ago the reader yielded it.
    pub age: Duration,
}

type CommitFuture = Pin<Box<dyn Future<Output = Result<()>> + Send>>;

/// The commit sink of a group [`Reader`](crate::reader::Reader): a cloneable handle
/// implementing `Sink<Offset>` (and `Sink<Message>`, `Sink<&Message>`), so a pipeline can
/// end in `.forward(reader.committer())`.
///
/// Sending a message (or its [`Offset`]) says it was processed: it acks the message's
/// [`AckToken`](super::AckToken). Messages the pipeline drops (a `filter`) count as
/// processed too, and messages handed to a [`Writer`](crate::writer::Writer) with their
/// token count once written — see [`AckToken`](super::AckToken) for the whole model. So
/// the committer need not see every message; it is where the pipeline ends.
/// Offsets are merged per partition and a committed offset never goes backwards. With
/// [`ReaderConfig::commit_contiguous`](crate::reader::ReaderConfig::commit_contiguous)
/// (the default) a partition is committed only up to the lowest message not yet
/// processed — so a message is never committed before every earlier message this reader
/// yielded was processed. Acks from an earlier assignment of a partition, or of
/// partitions this member no longer owns, are dropped: another member (or this one,
/// again) reads them from the last commit.
///
/// `flush` commits and waits in [`CommitMode::Sync`]; in [`CommitMode::Interval`] it
/// returns at once (`forward` flushes whenever the reader is momentarily empty) and the
/// interval commits; [`Committer::commit`] and `close` commit now. A rebalance under
/// way does not fail the sink's flush or close: the offsets stay pending
/// (`RebalanceInProgress`) or belong to the partitions' next owner.
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
/// Dropping a pending `flush`/`send`/`close` loses no offset: it stays pending and is
/// committed by the next commit, the interval tick or the reader's close. A commit, once
/// started, is never abandoned: it runs in a task of its own until the broker answered
/// (or its retries gave up), and the sink's future only waits for its result (a sink
/// flush's wait is kept in the `Committer` and resumed by its next `flush` or `close`).
/// Commits of one group go out one at a time, each only after the previous one was
/// answered, so a commit whose caller went away can never be applied after a newer one
/// and move the committed offset back. A `send` dropped before the sink took its
/// message drops the message, whose dropped [`AckToken`](super::AckToken) counts as
/// processed all the same (see there).
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
    /// Cancel safe: dropping this future (a `timeout` or `select!` around it) stops only
    /// the waiting. The commit runs to its end in a task of its own, and the next commit
    /// of the group is sent only after it was answered, so it is never applied after a
    /// newer one; offsets it did not get committed stay pending.
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

impl Committer {
    fn sink_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<()>> {
        if self.shared.mode == CommitMode::Sync && self.shared.has_due() {
            return self.poll_commit(cx);
        }
        Poll::Ready(Ok(()))
    }

    /// `flush`: in sync mode, commit now and wait; in interval mode the interval (or
    /// [`Committer::commit`], or close) commits — `forward` flushes whenever its source
    /// is momentarily empty, which must not turn into one OffsetCommit per message.
    fn sink_flush(&mut self, cx: &mut Context<'_>) -> Poll<Result<()>> {
        match self.shared.mode {
            CommitMode::Sync => self.poll_membership_commit(cx),
            CommitMode::Interval(_) => Poll::Ready(Ok(())),
        }
    }

    /// Commit as the sink does: a rebalance under way (`RebalanceInProgress`) or a
    /// membership that ended (`IllegalGeneration`, `UnknownMemberId`) does not end the
    /// pipeline — offsets of partitions still owned stay pending for the next commit,
    /// and those of partitions given up are another member's to read again.
    fn poll_membership_commit(&mut self, cx: &mut Context<'_>) -> Poll<Result<()>> {
        match futures::ready!(self.poll_commit(cx)) {
            Err(e) if super::membership_changing(&e) => {
                tracing::info!(group = %self.shared.group_id, error = %e, "commit skipped: the group is rebalancing; offsets stay pending");
                Poll::Ready(Ok(()))
            }
            r => Poll::Ready(r),
        }
    }
}

impl Sink<Offset> for Committer {
    type Error = Error;

    fn poll_ready(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<()>> {
        self.get_mut().sink_ready(cx)
    }

    fn start_send(self: Pin<&mut Self>, item: Offset) -> Result<()> {
        self.shared.ack(item);
        Ok(())
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<()>> {
        self.get_mut().sink_flush(cx)
    }

    fn poll_close(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<()>> {
        self.get_mut().poll_membership_commit(cx)
    }
}

impl Sink<Message> for Committer {
    type Error = Error;

    fn poll_ready(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<()>> {
        self.get_mut().sink_ready(cx)
    }

    fn start_send(self: Pin<&mut Self>, mut item: Message) -> Result<()> {
        let token = item.take_ack_token();
        if token.is_tracked() {
            token.ack();
        } else {
            self.shared.ack(Offset::from(&item));
        }
        Ok(())
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<()>> {
        self.get_mut().sink_flush(cx)
    }

    fn poll_close(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<()>> {
        self.get_mut().poll_membership_commit(cx)
    }
}

impl Sink<&Message> for Committer {
    type Error = Error;

    fn poll_ready(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<()>> {
        self.get_mut().sink_ready(cx)
    }

    fn start_send(self: Pin<&mut Self>, item: &Message) -> Result<()> {
        if item.ack_token().is_tracked() {
            item.ack_token().ack_ref();
        } else {
            self.shared.ack(Offset::from(item));
        }
        Ok(())
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<()>> {
        self.get_mut().sink_flush(cx)
    }

    fn poll_close(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<()>> {
        self.get_mut().poll_membership_commit(cx)
    }
}

/// The interval commit's timer, `every` apart (`None`: an hour, for a mode that never
/// ticks); a tick missed while the loop was busy is delayed, not bunched. Its first tick
/// is one interval after the membership starts, as the Java consumer's first
/// auto-commit: a tokio interval ticks at once, which committed right at the start of
/// every generation.
pub(crate) fn interval_timer(every: Option<Duration>) -> tokio::time::Interval {
    let every = every.unwrap_or(Duration::from_secs(3600));
    let mut t = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    t
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
    fn commits_due_filters_and_sorts() {
        let pulse = Arc::new(crate::ack::Pulse::default());
        let mut c = Commits::default();
        let track = |committed| Arc::new(Track::new(committed, true, 10, pulse.clone()));
        c.own(&TopicPartition::new("t", 1), track(4));
        c.own(&TopicPartition::new("t", 0), track(-1));
        c.get("t", 0).map(|p| p.ack_offset(2));
        c.get("t", 1).map(|p| p.ack_offset(9));
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
        assert!(c.get("x", 0).is_none());
    }

    /// No interval commit before one interval has passed: a tokio interval ticks at once,
    /// which committed right at the start of every membership (pipeline_broker's
    /// interval_mode_does_not_commit_on_every_flush saw `{0: 1}` committed under load).
    #[tokio::test(start_paused = true)]
    async fn the_interval_commit_waits_one_interval_before_its_first_tick() {
        use futures::FutureExt;
        let every = Duration::from_secs(5);
        let mut timer = interval_timer(Some(every));
        assert!(timer.tick().now_or_never().is_none(), "ticked at once");
        tokio::time::advance(every - Duration::from_millis(1)).await;
        assert!(timer.tick().now_or_never().is_none(), "ticked early");
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(
            timer.tick().now_or_never().is_some(),
            "no tick after the interval"
        );
        tokio::time::advance(every).await;
        assert!(timer.tick().now_or_never().is_some(), "no second tick");
    }
}
