//! Flush groups: the messages one caller waits for (those accepted between two flushes,
//! or one `write_messages` call), counted down as their batches are answered, with the
//! first error to surface and, for a single message, where it was written.

use super::*;

/// Messages whose delivery one caller waits for: those accepted by the sink between two
/// flushes, or one `write_messages` call.
pub(crate) struct Group {
    pub(super) state: Mutex<GroupState>,
    /// An error was recorded and not surfaced yet: `poll_ready` asks for every message
    /// and takes the lock only then.
    pub(super) unsurfaced: AtomicBool,
    /// The group of one [`Writer::produce`] call: the task records where its message
    /// went ([`Group::placed`], [`Group::written_at`]).
    pub(super) reports_position: bool,
}

pub(super) struct GroupState {
    /// Messages not done: those counted at the seal less those done (negative until the
    /// seal, as the sink counts its messages itself and tells the group only then).
    pub(super) pending: isize,
    pub(super) sealed: bool,
    pub(super) error: Option<Error>,
    /// The error was already returned early by `poll_ready`.
    pub(super) surfaced: bool,
    pub(super) waiter: Option<oneshot::Sender<Result<()>>>,
    /// The partition and offset of a [`Writer::produce`] call's message, as learned.
    pub(super) partition: Option<i32>,
    pub(super) offset: Option<i64>,
}

impl Group {
    pub(super) fn open() -> Arc<Group> {
        Group::new(false)
    }

    pub(super) fn new(reports_position: bool) -> Arc<Group> {
        Arc::new(Group {
            state: Mutex::new(GroupState {
                pending: 0,
                sealed: false,
                error: None,
                surfaced: false,
                waiter: None,
                partition: None,
                offset: None,
            }),
            unsurfaced: AtomicBool::new(false),
            reports_position,
        })
    }

    /// The task put a message of this group into a batch of `partition` (only recorded
    /// for a [`Writer::produce`] call's group).
    #[inline]
    pub(crate) fn placed(&self, partition: i32) {
        if self.reports_position {
            self.lock().partition = Some(partition);
        }
    }

    /// The broker wrote the group's first message of a batch at `offset` (-1 without
    /// acknowledgement); only recorded for a [`Writer::produce`] call's group, before
    /// [`done`](Self::done) answers it.
    #[inline]
    pub(crate) fn written_at(&self, offset: i64) {
        if self.reports_position {
            self.lock().offset = Some(offset);
        }
    }

    /// Where the message of a [`Writer::produce`] call went.
    pub(super) fn position(&self) -> Option<(i32, i64)> {
        let s = self.lock();
        Some((s.partition?, s.offset?))
    }

    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, GroupState> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// No more messages join: the group has `count` in all; `waiter` hears once all are
    /// done.
    pub(super) fn seal(&self, count: usize, waiter: oneshot::Sender<Result<()>>) {
        let mut s = self.lock();
        s.pending = s
            .pending
            .saturating_add(isize::try_from(count).unwrap_or(isize::MAX));
        s.sealed = true;
        s.waiter = Some(waiter);
        s.finish_if_done();
    }

    /// The group's first error, the first time it is asked for.
    pub(super) fn surface_error(&self) -> Option<Error> {
        if !self.unsurfaced.load(Ordering::Acquire) {
            return None;
        }
        let mut s = self.lock();
        self.unsurfaced.store(false, Ordering::Release);
        if s.surfaced {
            return None;
        }
        let e = s.error.clone()?;
        s.surfaced = true;
        Some(e)
    }

    /// `n` messages finished, successfully or with `error`.
    pub(crate) fn done(&self, n: usize, error: Option<&Error>) {
        let mut s = self.lock();
        s.pending = s
            .pending
            .saturating_sub(isize::try_from(n).unwrap_or(isize::MAX));
        if let (Some(e), None) = (error, &s.error) {
            s.error = Some(e.clone());
            self.unsurfaced.store(true, Ordering::Release);
        }
        s.finish_if_done();
    }
}

impl GroupState {
    pub(super) fn finish_if_done(&mut self) {
        if self.sealed && self.pending <= 0 {
            if let Some(w) = self.waiter.take() {
                let _ = w.send(self.error.take().map_or(Ok(()), Err));
            }
        }
    }
}
