//! Concurrent processing that stays at least once: [`Tracked`], a value made from a
//! consumed message that carries the message's [`AckToken`], and
//! [`MessageStreamExt`], the stream adapters that keep a token with the work made of its
//! message ([`map_tracked`](MessageStreamExt::map_tracked),
//! [`process_concurrent`](MessageStreamExt::process_concurrent)).
//!
//! Why: a dropped token counts as processed once the reader is polled again — right for
//! a `filter`, wrong for `reader.map_ok(|m| m.value)` in front of `buffer_unordered(n)`
//! or `try_for_each_concurrent(n, ..)`, which drops each message (and its token) before
//! the work on its value starts and polls the reader for more while that work runs. The
//! group then commits messages still being processed, and a crash loses them. These
//! adapters move the token along with the value, so it is settled when the work is.
//! See DESIGN.md, "Acknowledgements: what 'processed' means".

use std::future::Future;
use std::ops::{Deref, DerefMut};
use std::pin::Pin;
use std::task::{Context, Poll};

use futures::stream::{Stream, TryForEachConcurrent};
use futures::TryStreamExt;
use pin_project::{pin_project, pinned_drop};

use super::Message;
use crate::error::{Error, Result};
use crate::group::AckToken;

/// A value made from a consumed [`Message`], carrying that message's [`AckToken`], so
/// the message counts as processed only when the value's work is done: a `Tracked`
/// dropped after the work (or by a filter that goes on) counts as processed once the
/// reader is polled again, like a dropped token; one dropped by a stage that fails and
/// ends the pipeline does not. [`ack`](Tracked::ack) and [`fail`](Tracked::fail) say so
/// explicitly. It derefs to the value. (A pipeline that is cancelled or fails and is then
/// started again on the same reader polls it again, so the `Tracked` values its
/// concurrent stage dropped unfinished would count: there, use
/// [`MessageStreamExt::process_concurrent`], which fails what it drops unfinished.)
///
/// Made by [`Message::tracked`], `Tracked::from(message)` or the stream adapter
/// [`MessageStreamExt::map_tracked`], which is what to put in front of
/// `buffer_unordered` / `try_for_each_concurrent`:
///
/// ```no_run
/// use futures::TryStreamExt;
/// use kafkapipe::reader::{MessageStreamExt, Reader, Tracked};
///
/// async fn work(value: &[u8]) -> kafkapipe::Result<()> {
///     Ok(())
/// }
///
/// # async fn demo(reader: &mut Reader) -> kafkapipe::Result<()> {
/// reader
///     .map_tracked(|m| m.value.unwrap_or_default())
///     // each item keeps its message's token until its work is done
///     .try_for_each_concurrent(8, |value: Tracked<bytes::Bytes>| async move {
///         work(&value).await
///     })
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Tracked<T> {
    value: T,
    ack: AckToken,
}

impl<T> Tracked<T> {
    /// `value`, processed when `ack` says so.
    ///
    /// ```
    /// use kafkapipe::group::AckToken;
    /// use kafkapipe::reader::Tracked;
    /// let t = Tracked::new(42, AckToken::default());
    /// assert_eq!(*t, 42);
    /// ```
    pub fn new(value: T, ack: AckToken) -> Self {
        Tracked { value, ack }
    }

    /// The value, by reference (also through `Deref`).
    ///
    /// ```
    /// # let t = kafkapipe::reader::Tracked::new("v", Default::default());
    /// assert_eq!(*t.value(), "v");
    /// ```
    pub fn value(&self) -> &T {
        &self.value
    }

    /// The token that says when the message is processed.
    ///
    /// ```
    /// # let t = kafkapipe::reader::Tracked::new(1, Default::default());
    /// assert!(!t.ack_token().is_tracked());
    /// ```
    pub fn ack_token(&self) -> &AckToken {
        &self.ack
    }

    /// Transform the value, keeping the token.
    ///
    /// ```
    /// # let t = kafkapipe::reader::Tracked::new(20, Default::default());
    /// let doubled = t.map(|v| v * 2);
    /// assert_eq!(*doubled, 40);
    /// ```
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Tracked<U> {
        Tracked {
            value: f(self.value),
            ack: self.ack,
        }
    }

    /// The value and the token, apart (hand the token on, e.g. to a
    /// [`writer::Message`](crate::writer::Message::with_ack)).
    ///
    /// ```
    /// # let t = kafkapipe::reader::Tracked::new(1, Default::default());
    /// let (value, token) = t.into_parts();
    /// token.ack();
    /// # let _ = value;
    /// ```
    pub fn into_parts(self) -> (T, AckToken) {
        (self.value, self.ack)
    }

    /// The message is processed now (no need to wait for the next poll of the reader);
    /// returns the value.
    ///
    /// ```
    /// # let t = kafkapipe::reader::Tracked::new(1, Default::default());
    /// let v = t.ack();
    /// # let _ = v;
    /// ```
    pub fn ack(self) -> T {
        self.ack.ack();
        self.value
    }

    /// The message was not processed: its partition's commit stays before it (see
    /// [`AckToken::fail`]); returns the value.
    ///
    /// ```
    /// # let t = kafkapipe::reader::Tracked::new(1, Default::default());
    /// let v = t.fail();
    /// # let _ = v;
    /// ```
    pub fn fail(self) -> T {
        self.ack.fail();
        self.value
    }
}

impl<T> Deref for Tracked<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.value
    }
}

impl<T> DerefMut for Tracked<T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.value
    }
}

impl From<Message> for Tracked<Message> {
    /// The message with its token taken out and carried beside it.
    fn from(mut m: Message) -> Self {
        let ack = m.take_ack_token();
        Tracked { value: m, ack }
    }
}

impl Message {
    /// `f(self)` carrying this message's [`AckToken`]: the token is taken out first, so
    /// it stays with the value `f` makes (see [`Tracked`]).
    ///
    /// ```
    /// use kafkapipe::reader::Message;
    /// let mut m = Message::new("events", 0, 7);
    /// m.value = Some("hello".into());
    /// let value = m.tracked(|m| m.value.unwrap_or_default());
    /// assert_eq!(&value[..], b"hello");
    /// ```
    pub fn tracked<T>(self, f: impl FnOnce(Message) -> T) -> Tracked<T> {
        Tracked::from(self).map(f)
    }
}

/// Adapters for streams of consumed messages (a [`Reader`](super::Reader), or what a
/// `try_filter` made of it) that keep each message's [`AckToken`] with the work made of
/// it, so concurrent stages stay at least once. Implemented for every
/// `Stream<Item = Result<Message>>`.
///
/// ```no_run
/// use kafkapipe::reader::{MessageStreamExt, Reader};
/// # async fn demo(reader: &mut Reader) -> kafkapipe::Result<()> {
/// reader
///     .process_concurrent(8, |m| async move {
///         // ... the work; Ok acks the message, Err fails it and ends the pipeline
///         let _ = m.value;
///         Ok::<_, kafkapipe::Error>(())
///     })
///     .await?;
/// # Ok(()) }
/// ```
pub trait MessageStreamExt: Stream<Item = Result<Message>> + Sized {
    /// Map each message to `f(message)` carrying the message's token ([`Tracked`]): the
    /// `map_ok` to use in front of `buffer_unordered`, `try_for_each_concurrent` and
    /// other stages that poll the reader while earlier items are still being worked on.
    /// (`map_ok(|m| m.value)` drops the token as it extracts the value: the message then
    /// counts as processed at the next poll, while its value is still being worked on.)
    ///
    /// ```no_run
    /// use futures::{StreamExt, TryStreamExt};
    /// use kafkapipe::reader::{MessageStreamExt, Reader};
    /// # async fn work(v: &[u8]) {}
    /// # async fn demo(reader: &mut Reader) -> kafkapipe::Result<()> {
    /// reader
    ///     .map_tracked(|m| m.value.unwrap_or_default())
    ///     .map_ok(|value| async move {
    ///         work(&value).await;
    ///         Ok(value) // still carrying the token
    ///     })
    ///     .try_buffer_unordered(8)
    ///     .try_for_each(|value| async move {
    ///         value.ack();
    ///         Ok(())
    ///     })
    ///     .await?;
    /// # Ok(()) }
    /// ```
    fn map_tracked<T, F>(self, f: F) -> MapTracked<Self, F>
    where
        F: FnMut(Message) -> T,
    {
        MapTracked { stream: self, f }
    }

    /// Run `f` on up to `limit` messages at once (`None`: no limit), holding each
    /// message's token until its future completes: `Ok` acks the message, `Err` fails
    /// it and ends the processing with that error (the messages still in flight are
    /// dropped and failed too: neither is committed). An error of the stream ends it
    /// likewise. This is `try_for_each_concurrent` that acknowledges, for the
    /// Java/kafka-go worker-pool shape; `f` gets the message with an inert token (the
    /// adapter holds the real one).
    ///
    /// ```no_run
    /// use kafkapipe::reader::{MessageStreamExt, Reader};
    /// # async fn store(v: Option<bytes::Bytes>) -> std::io::Result<()> { Ok(()) }
    /// #[derive(Debug)]
    /// enum AppError {
    ///     Kafka(kafkapipe::Error),
    ///     Io(std::io::Error),
    /// }
    /// impl From<kafkapipe::Error> for AppError {
    ///     fn from(e: kafkapipe::Error) -> Self {
    ///         AppError::Kafka(e)
    ///     }
    /// }
    /// # async fn demo(reader: &mut Reader) -> Result<(), AppError> {
    /// reader
    ///     .process_concurrent(8, |m| async move { store(m.value).await.map_err(AppError::Io) })
    ///     .await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Cancellation safety
    ///
    /// Dropping the future fails the tokens of the messages in flight (their work was
    /// cancelled, so they are read again after a restart or rebalance); the messages
    /// it completed are acked. The stream stays usable.
    fn process_concurrent<F, Fut, E>(
        self,
        limit: impl Into<Option<usize>>,
        f: F,
    ) -> ProcessConcurrent<Self, F, Fut, E>
    where
        F: FnMut(Message) -> Fut,
        Fut: Future<Output = std::result::Result<(), E>>,
        E: From<Error>,
    {
        let settle: Identity<Fut> = std::convert::identity;
        ProcessConcurrent {
            inner: Starting {
                stream: self,
                f,
                _e: std::marker::PhantomData,
            }
            .try_for_each_concurrent(limit, settle),
        }
    }
}

impl<S: Stream<Item = Result<Message>>> MessageStreamExt for S {}

/// The stream of [`MessageStreamExt::map_tracked`].
#[pin_project]
#[derive(Debug)]
#[must_use = "streams do nothing unless polled"]
pub struct MapTracked<S, F> {
    #[pin]
    stream: S,
    f: F,
}

impl<S, F, T> Stream for MapTracked<S, F>
where
    S: Stream<Item = Result<Message>>,
    F: FnMut(Message) -> T,
{
    type Item = Result<Tracked<T>>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.project();
        this.stream
            .poll_next(cx)
            .map(|o| o.map(|r| r.map(|m| m.tracked(&mut *this.f))))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.stream.size_hint()
    }
}

/// The future of [`MessageStreamExt::process_concurrent`]: resolves when the stream
/// ends and every message is processed, or at the first error.
#[pin_project]
#[must_use = "futures do nothing unless polled"]
pub struct ProcessConcurrent<S, F, Fut, E>
where
    S: Stream<Item = Result<Message>>,
    F: FnMut(Message) -> Fut,
    Fut: Future<Output = std::result::Result<(), E>>,
    E: From<Error>,
{
    #[pin]
    inner: TryForEachConcurrent<Starting<S, F, E>, Settling<Fut>, Identity<Fut>>,
}

impl<S, F, Fut, E> std::fmt::Debug for ProcessConcurrent<S, F, Fut, E>
where
    S: Stream<Item = Result<Message>>,
    F: FnMut(Message) -> Fut,
    Fut: Future<Output = std::result::Result<(), E>>,
    E: From<Error>,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProcessConcurrent").finish_non_exhaustive()
    }
}

impl<S, F, Fut, E> Future for ProcessConcurrent<S, F, Fut, E>
where
    S: Stream<Item = Result<Message>>,
    F: FnMut(Message) -> Fut,
    Fut: Future<Output = std::result::Result<(), E>>,
    E: From<Error>,
{
    type Output = std::result::Result<(), E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.project().inner.poll(cx)
    }
}

/// Hands each started [`Settling`] to `try_for_each_concurrent` as is.
type Identity<Fut> = fn(Settling<Fut>) -> Settling<Fut>;

/// Each message becomes `f(message)` holding the message's token.
#[pin_project]
struct Starting<S, F, E> {
    #[pin]
    stream: S,
    f: F,
    _e: std::marker::PhantomData<fn() -> E>,
}

impl<S, F, Fut, E> Stream for Starting<S, F, E>
where
    S: Stream<Item = Result<Message>>,
    F: FnMut(Message) -> Fut,
    Fut: Future<Output = std::result::Result<(), E>>,
    E: From<Error>,
{
    type Item = std::result::Result<Settling<Fut>, E>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.project();
        this.stream.poll_next(cx).map(|o| {
            o.map(|r| match r {
                Ok(mut m) => {
                    let ack = Some(m.take_ack_token());
                    Ok(Settling {
                        work: (this.f)(m),
                        ack,
                    })
                }
                Err(e) => Err(E::from(e)),
            })
        })
    }
}

/// One message's work, holding its token: acked when the work succeeds, failed when it
/// fails or is dropped unfinished.
#[pin_project(PinnedDrop)]
struct Settling<Fut> {
    #[pin]
    work: Fut,
    ack: Option<AckToken>,
}

impl<Fut, E> Future for Settling<Fut>
where
    Fut: Future<Output = std::result::Result<(), E>>,
{
    type Output = std::result::Result<(), E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let out = futures::ready!(this.work.poll(cx));
        if let Some(ack) = this.ack.take() {
            match &out {
                Ok(()) => ack.ack(),
                Err(_) => ack.fail(),
            }
        }
        Poll::Ready(out)
    }
}

#[pinned_drop]
impl<Fut> PinnedDrop for Settling<Fut> {
    fn drop(self: Pin<&mut Self>) {
        // dropped before its work completed: cancelled, not processed
        if let Some(ack) = self.project().ack.take() {
            ack.fail();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::group::{Pulse, Track};
    use futures::TryStreamExt;
    use std::collections::BTreeSet;
    use std::sync::{Arc, Mutex};

    /// A group reader's stream as the commit sees it: each poll counts (`Pulse`), each
    /// message gets a token of `track`; after `n` messages it parks like a reader with
    /// nothing buffered.
    fn fake_reader(
        pulse: Arc<Pulse>,
        track: Arc<Track>,
        n: i64,
    ) -> impl Stream<Item = Result<Message>> + Unpin {
        let mut next = 0;
        futures::stream::poll_fn(move |cx| {
            pulse.polled();
            if next >= n {
                pulse.park(cx.waker());
                return Poll::Pending;
            }
            let offset = next;
            next += 1;
            let seq = track.deliver(offset, offset + 1).expect("room");
            let mut m = Message::new("t", 0, offset);
            m.value = Some(bytes::Bytes::from(offset.to_string()));
            m.set_ack_token(AckToken::tracked(track.clone(), seq, offset));
            Poll::Ready(Some(Ok(m)))
        })
    }

    const N: i64 = 40;
    const SLOW: i64 = 5;

    fn offset_of(v: &bytes::Bytes) -> i64 {
        std::str::from_utf8(v)
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(-1)
    }

    /// The work: every offset but `SLOW` finishes at once; `SLOW` waits for `release`.
    /// Returns once everything but `SLOW` is done, with the commit due at that moment.
    async fn drive_until_all_but_slow<P>(
        pipeline: P,
        done: Arc<Mutex<BTreeSet<i64>>>,
        track: Arc<Track>,
    ) -> (Option<i64>, P)
    where
        P: Future + Unpin,
    {
        let mut pipeline = pipeline;
        let all_but_slow = async {
            loop {
                if done
                    .lock()
                    .map(|d| d.len() as i64 == N - 1)
                    .unwrap_or(false)
                {
                    // let the pipeline poll the reader again, as it does when it goes on
                    for _ in 0..10 {
                        tokio::task::yield_now().await;
                    }
                    return;
                }
                tokio::task::yield_now().await;
            }
        };
        tokio::select! {
            _ = &mut pipeline => panic!("the pipeline ended"),
            _ = all_but_slow => {}
        }
        // the pipeline is polled once more: every drop so far counts
        let _ = futures::poll!(&mut pipeline);
        (track.due(), pipeline)
    }

    /// Let the slow message's work finish, drive the pipeline until it is done, and poll
    /// the pipeline once more so that what completed is settled.
    async fn release_slow<P: Future + Unpin>(
        release: &tokio::sync::Notify,
        done: &Mutex<BTreeSet<i64>>,
        pipeline: &mut P,
    ) {
        release.notify_one();
        tokio::select! {
            _ = &mut *pipeline => panic!("the pipeline ended"),
            _ = async { while !done.lock().map(|d| d.contains(&SLOW)).unwrap_or(false) {
                tokio::task::yield_now().await } } => {}
        }
        let _ = futures::poll!(&mut *pipeline);
    }

    fn setup() -> (Arc<Pulse>, Arc<Track>, Arc<Mutex<BTreeSet<i64>>>) {
        let pulse = Arc::new(Pulse::default());
        let track = Arc::new(Track::new(-1, true, 1000, pulse.clone()));
        (pulse, track, Arc::new(Mutex::new(BTreeSet::new())))
    }

    async fn work(
        offset: i64,
        done: Arc<Mutex<BTreeSet<i64>>>,
        release: Arc<tokio::sync::Notify>,
    ) -> Result<()> {
        if offset == SLOW {
            release.notified().await;
        } else {
            tokio::task::yield_now().await;
        }
        if let Ok(mut d) = done.lock() {
            d.insert(offset);
        }
        Ok(())
    }

    /// The shape a Rust user writes first: `map_ok(extract)` then a concurrent stage. It
    /// commits past the slow message while it is still in the stage (the defect the
    /// adapters below avoid; kept as the reason they exist).
    #[tokio::test]
    async fn the_naive_concurrent_shape_commits_past_work_in_flight() {
        let (pulse, track, done) = setup();
        let release = Arc::new(tokio::sync::Notify::new());
        let (d, r) = (done.clone(), release.clone());
        let pipeline = fake_reader(pulse, track.clone(), N)
            .map_ok(|m| m.value.unwrap_or_default())
            .try_for_each_concurrent(8, move |v| work(offset_of(&v), d.clone(), r.clone()));
        let (due, _pipeline) = drive_until_all_but_slow(Box::pin(pipeline), done, track).await;
        assert_eq!(
            due,
            Some(N),
            "the naive shape commits past the slow message"
        );
    }

    /// `map_tracked` in front of `try_for_each_concurrent`: the commit never passes the
    /// slow message while it is in the stage, and passes it once it is done.
    #[tokio::test]
    async fn map_tracked_keeps_the_commit_before_work_in_flight() {
        let (pulse, track, done) = setup();
        let release = Arc::new(tokio::sync::Notify::new());
        let (d, r) = (done.clone(), release.clone());
        let pipeline = fake_reader(pulse, track.clone(), N)
            .map_tracked(|m| m.value.unwrap_or_default())
            .try_for_each_concurrent(8, move |v| {
                let (d, r) = (d.clone(), r.clone());
                async move { work(offset_of(&v), d, r).await }
            });
        let (due, mut pipeline) =
            drive_until_all_but_slow(Box::pin(pipeline), done.clone(), track.clone()).await;
        assert_eq!(
            due,
            Some(SLOW),
            "the commit passed a message still in the stage"
        );
        release_slow(&release, &done, &mut pipeline).await;
        let _ = futures::poll!(&mut pipeline);
        assert_eq!(track.due(), Some(N));
    }

    /// `map_tracked` then `try_buffer_unordered`, the values acked at the end.
    #[tokio::test]
    async fn map_tracked_through_buffer_unordered() {
        let (pulse, track, done) = setup();
        let release = Arc::new(tokio::sync::Notify::new());
        let (d, r) = (done.clone(), release.clone());
        let pipeline = fake_reader(pulse, track.clone(), N)
            .map_tracked(|m| m.value.unwrap_or_default())
            .map_ok(move |v| {
                let (d, r) = (d.clone(), r.clone());
                async move {
                    work(offset_of(&v), d, r).await?;
                    Ok(v)
                }
            })
            .try_buffer_unordered(8)
            .try_for_each(|v| async move {
                v.ack();
                Ok(())
            });
        let (due, _pipeline) = drive_until_all_but_slow(Box::pin(pipeline), done, track).await;
        assert_eq!(
            due,
            Some(SLOW),
            "the commit passed a message still in the stage"
        );
    }

    /// `process_concurrent`: the commit never passes the slow message while its future
    /// runs; a failing future fails its message and ends the processing, and in-flight
    /// ones are failed too.
    #[tokio::test]
    async fn process_concurrent_acks_each_message_when_its_work_completes() {
        let (pulse, track, done) = setup();
        let release = Arc::new(tokio::sync::Notify::new());
        let (d, r) = (done.clone(), release.clone());
        let pipeline = fake_reader(pulse, track.clone(), N).process_concurrent(8, move |m| {
            let (d, r) = (d.clone(), r.clone());
            async move { work(m.offset, d, r).await }
        });
        let (due, mut pipeline) =
            drive_until_all_but_slow(Box::pin(pipeline), done.clone(), track.clone()).await;
        assert_eq!(
            due,
            Some(SLOW),
            "the commit passed a message still in the stage"
        );
        release_slow(&release, &done, &mut pipeline).await;
        assert_eq!(track.due(), Some(N), "acked as each future completed");
    }

    #[tokio::test]
    async fn process_concurrent_fails_the_failed_and_the_cancelled() {
        let (pulse, track, _done) = setup();
        let started = Arc::new(Mutex::new(0usize));
        let s = started.clone();
        let pipeline =
            fake_reader(pulse.clone(), track.clone(), N).process_concurrent(4, move |m| {
                let s = s.clone();
                async move {
                    if let Ok(mut n) = s.lock() {
                        *n += 1;
                    }
                    match m.offset {
                        0 | 1 => Ok(()),
                        2 => {
                            // fails once 3 and 4 are under way (and stay so)
                            for _ in 0..5 {
                                tokio::task::yield_now().await;
                            }
                            Err(Error::config("work failed"))
                        }
                        _ => futures::future::pending().await,
                    }
                }
            });
        let err = pipeline.await.expect_err("the failure ends it");
        assert!(err.to_string().contains("work failed"), "{err}");
        pulse.polled();
        assert_eq!(
            track.due(),
            Some(2),
            "2 failed, 3.. cancelled: none committed"
        );
        assert_eq!(track.held(), 0, "nothing is left held");
    }

    #[test]
    fn tracked_carries_the_token() {
        let pulse = Arc::new(Pulse::default());
        let track = Arc::new(Track::new(-1, true, 10, pulse.clone()));
        let mut m = Message::new("t", 0, 0);
        let seq = track.deliver(0, 1).expect("room");
        m.set_ack_token(AckToken::tracked(track.clone(), seq, 0));
        m.value = Some("v".into());
        let t = m.tracked(|m| m.value);
        assert!(t.ack_token().is_tracked());
        pulse.polled();
        assert_eq!(
            track.due(),
            None,
            "the message was dropped but its token travels"
        );
        let t = t.map(|v| v.map(|b| b.len()));
        assert_eq!(*t, Some(1));
        drop(t);
        assert_eq!(track.due(), None, "not before the reader is polled again");
        pulse.polled();
        assert_eq!(track.due(), Some(1));
    }
}
