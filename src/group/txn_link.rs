//! The link between a group reader and the
//! [`ExactlyOnceSink`](crate::writer::ExactlyOnceSink) that took over its commits.
//!
//! Once a pipeline is attached, the group never commits offsets by itself again (no
//! interval commit, no commit of revoked partitions or on close; the
//! [`Committer`](super::Committer) refuses): the consumed offsets reach the broker only
//! inside the pipeline's transactions. Before the group gives partitions up (a revoke,
//! eager or cooperative, or a lost membership) it asks the pipeline to end its open
//! transaction and waits until it did: the pipeline aborts it and rewinds the partitions
//! it keeps to their committed offsets.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::Waker;
use std::time::Duration;

use futures::task::AtomicWaker;
use tokio::sync::Notify;

#[derive(Debug, Default)]
pub(crate) struct TxnLink {
    /// A pipeline took over once: the group's own commit paths stay off for good.
    transactional: AtomicBool,
    /// A pipeline is attached now (cleared when its sink is closed or dropped).
    attached: AtomicBool,
    /// The pipeline has a transaction open.
    open: AtomicBool,
    /// Requests to end the open transaction, made and answered.
    requested: AtomicU64,
    answered: AtomicU64,
    /// The pipeline's task, woken for a request.
    waker: AtomicWaker,
    /// Notified on an answer, a detach, or a transaction ending.
    changed: Notify,
}

impl TxnLink {
    /// A pipeline takes over the commits. Returns false if one is attached already.
    pub(crate) fn attach(&self) -> bool {
        if self.attached.swap(true, Ordering::SeqCst) {
            return false;
        }
        self.transactional.store(true, Ordering::SeqCst);
        // every request before this one is moot: nothing was open
        self.answered
            .store(self.requested.load(Ordering::SeqCst), Ordering::SeqCst);
        true
    }

    /// The pipeline is gone (closed, failed or dropped): nothing is waited for any more.
    pub(crate) fn detach(&self) {
        self.attached.store(false, Ordering::SeqCst);
        self.open.store(false, Ordering::SeqCst);
        self.changed.notify_waiters();
    }

    /// Whether the group's own commits are off.
    pub(crate) fn transactional(&self) -> bool {
        self.transactional.load(Ordering::SeqCst)
    }

    pub(crate) fn set_open(&self, open: bool) {
        self.open.store(open, Ordering::SeqCst);
        if !open {
            self.changed.notify_waiters();
        }
    }

    /// An attached pipeline has a transaction open (a close keeps the membership until
    /// it ends, so its offsets commit under a live generation).
    pub(crate) fn busy(&self) -> bool {
        self.attached.load(Ordering::SeqCst) && self.open.load(Ordering::SeqCst)
    }

    /// The pipeline's task, to wake for a request.
    pub(crate) fn register(&self, waker: &Waker) {
        self.waker.register(waker);
    }

    /// The request the pipeline has not answered yet, if any.
    pub(crate) fn pending_request(&self) -> Option<u64> {
        let requested = self.requested.load(Ordering::SeqCst);
        (requested > self.answered.load(Ordering::SeqCst)).then_some(requested)
    }

    /// The pipeline ended its transaction for every request up to `n`.
    pub(crate) fn answer(&self, n: u64) {
        self.answered.fetch_max(n, Ordering::SeqCst);
        self.changed.notify_waiters();
    }

    /// Partitions are about to be given up: ask an attached pipeline to end its
    /// transaction and wait until it did, it detached, or `within` passed. Returns
    /// whether it ended in time (or nothing was attached).
    pub(crate) async fn end_transaction(&self, within: Duration) -> bool {
        if !self.attached.load(Ordering::SeqCst) {
            return true;
        }
        let n = self.requested.fetch_add(1, Ordering::SeqCst) + 1;
        self.waker.wake();
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if self.answered.load(Ordering::SeqCst) >= n || !self.attached.load(Ordering::SeqCst) {
                return true;
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                return false;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[tokio::test]
    async fn nothing_attached_nothing_waited_for() {
        let link = TxnLink::default();
        assert!(!link.transactional());
        assert!(link.end_transaction(Duration::from_secs(5)).await);
        assert!(!link.busy());
    }

    #[tokio::test]
    async fn a_request_waits_for_the_answer() {
        let link = Arc::new(TxnLink::default());
        assert!(link.attach());
        assert!(!link.attach(), "one pipeline per reader");
        assert!(link.transactional());
        assert_eq!(link.pending_request(), None);
        let waiter = tokio::spawn({
            let link = link.clone();
            async move { link.end_transaction(Duration::from_secs(10)).await }
        });
        let n = loop {
            if let Some(n) = link.pending_request() {
                break n;
            }
            tokio::task::yield_now().await;
        };
        assert!(!waiter.is_finished());
        link.answer(n);
        assert!(waiter.await.unwrap());
        assert_eq!(link.pending_request(), None);
    }

    #[tokio::test]
    async fn a_detach_or_the_timeout_ends_the_wait() {
        let link = Arc::new(TxnLink::default());
        link.attach();
        assert!(!link.end_transaction(Duration::from_millis(20)).await);
        let waiter = tokio::spawn({
            let link = link.clone();
            async move { link.end_transaction(Duration::from_secs(10)).await }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        link.detach();
        assert!(waiter.await.unwrap());
        assert!(link.transactional(), "the commits stay off after a detach");
    }
}
