//! The writer loop's timer: wakes the loop at its next deadline (a batch's linger, a
//! retry, a delivery timeout) within tens of microseconds, not at Tokio's next
//! millisecond.
//!
//! Why it exists: Tokio's timer fires at the first millisecond tick at or after a
//! deadline, and a runtime parked in `epoll_wait` (whose timeout is in whole
//! milliseconds) wakes up to another millisecond after that tick. A 5 ms linger lasted
//! 5–7 ms (the writer's queue time averaged 5.6 ms at 1 000 msgs/s), most of the median
//! produce latency kafkapipe had over librdkafka, whose linger wait is a condition
//! variable's, precise to microseconds.
//!
//! How: one process-wide thread ([`Service`], started on the first deadline, ended after
//! [`IDLE_EXIT`] without any) waits on a condition variable until the earliest deadline
//! registered and wakes the waker registered with it. Each writer loop owns one
//! [`Timer`], which holds at most one registration: its loop's next deadline and the
//! loop's waker. Moving the deadline replaces the registration (one map entry removed, one
//! inserted, under one lock), so however often a loop's earliest deadline moves — with
//! every batch sealed, at 1 000 partitions round robin — the service holds one entry per
//! writer and one thread in all; no thread, task or Tokio timer entry is started per
//! deadline. The thread is woken early (notified) only when a deadline comes before the
//! one it waits for; it never spins. A deadline already reached fires without the thread;
//! a dropped timer removes its registration. If the thread cannot be started, the timer
//! falls back to Tokio's (late, never early).

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

/// How long the service's thread stays without any deadline before it ends (the next
/// deadline starts another).
pub(super) const IDLE_EXIT: Duration = Duration::from_secs(10);

/// The process-wide service every writer's [`Timer`] registers with.
static SERVICE: Service = Service::new(IDLE_EXIT, spawn_thread);

/// Starts the service's thread; tests replace it to see the fallback.
type Spawn = fn(&'static Service) -> std::io::Result<()>;

fn spawn_thread(service: &'static Service) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("kafkapipe-timer".into())
        .spawn(move || service.run())
        .map(drop)
}

/// One thread waking the wakers of registered deadlines when they are reached.
pub(super) struct Service {
    state: Mutex<State>,
    /// The thread waits here; notified when a deadline comes before the one it waits
    /// for.
    cond: Condvar,
    idle_exit: Duration,
    spawn: Spawn,
}

struct State {
    /// Registered deadlines, by (deadline, timer id): at most one entry per [`Timer`].
    armed: BTreeMap<(Instant, u64), Waker>,
    /// The next timer id.
    next_id: u64,
    /// The thread is running (set by whoever starts it, cleared by the thread as it ends,
    /// both under the lock).
    running: bool,
    /// While the thread waits: the deadline it waits for (`None`: none, it waits
    /// [`Service::idle_exit`] to end). A deadline before it needs a notification.
    waits_for: Option<Instant>,
    /// Threads started (tests: one at a time, not one per deadline).
    started: u64,
    /// The thread's waits ended (by timeout or notification; tests: it does not spin).
    wakeups: u64,
}

impl Service {
    pub(super) const fn new(idle_exit: Duration, spawn: Spawn) -> Service {
        Service {
            state: Mutex::new(State {
                armed: BTreeMap::new(),
                next_id: 0,
                running: false,
                waits_for: None,
                started: 0,
                wakeups: 0,
            }),
            cond: Condvar::new(),
            idle_exit,
            spawn,
        }
    }

    /// The registrations hold no invariant a panic could break halfway (the thread
    /// itself only pops entries and wakes wakers), so a poisoned lock is used as is.
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn new_id(&self) -> u64 {
        let mut st = self.lock();
        st.next_id += 1;
        st.next_id
    }

    /// Register timer `id` at `deadline` with `waker`, replacing its registration at
    /// `old` (if any). False if the thread could not be started (nothing registered).
    fn arm(&'static self, id: u64, old: Option<Instant>, deadline: Instant, waker: Waker) -> bool {
        let mut st = self.lock();
        if let Some(old) = old {
            st.armed.remove(&(old, id));
        }
        if !st.running {
            if (self.spawn)(self).is_err() {
                return false;
            }
            st.running = true;
            st.started += 1;
        }
        st.armed.insert((deadline, id), waker);
        if st.waits_for.is_none_or(|w| deadline < w) {
            self.cond.notify_one();
        }
        true
    }

    /// Remove timer `id`'s registration at `at`, if it has not fired. The thread is
    /// notified only when nothing is left, to start counting `idle_exit` (it would
    /// otherwise wait for the removed deadline); a deadline that merely moved later
    /// wakes it once, at the old one.
    fn disarm(&self, id: u64, at: Instant) {
        let mut st = self.lock();
        if st.armed.remove(&(at, id)).is_some() && st.armed.is_empty() {
            self.cond.notify_one();
        }
    }

    /// The thread: wake what is due, then wait for the earliest deadline (or a
    /// notification); end after `idle_exit` with nothing registered.
    fn run(&self) {
        let mut due: Vec<Waker> = Vec::new();
        let mut st = self.lock();
        loop {
            let now = Instant::now();
            while let Some(entry) = st.armed.first_entry() {
                if entry.key().0 > now {
                    break;
                }
                due.push(entry.remove());
            }
            if !due.is_empty() {
                // Wake without the lock: a waker may run code (a current-thread runtime's
                // unpark) that should not wait for the writers' registrations.
                drop(st);
                for w in due.drain(..) {
                    w.wake();
                }
                st = self.lock();
                continue;
            }
            match st.armed.first_key_value().map(|(k, _)| k.0) {
                Some(next) => {
                    st.waits_for = Some(next);
                    st = self
                        .cond
                        .wait_timeout(st, next - now)
                        .unwrap_or_else(PoisonError::into_inner)
                        .0;
                    st.wakeups += 1;
                }
                None => {
                    st.waits_for = None;
                    let (guard, waited) = self
                        .cond
                        .wait_timeout(st, self.idle_exit)
                        .unwrap_or_else(PoisonError::into_inner);
                    st = guard;
                    st.wakeups += 1;
                    if waited.timed_out() && st.armed.is_empty() {
                        st.running = false;
                        return;
                    }
                }
            }
        }
    }
}

/// A writer loop's timer: one deadline at a time, kept across the loop's turns while it
/// stays the same (a turn that does not move it takes no lock).
pub(super) struct Timer {
    service: &'static Service,
    id: u64,
    /// The deadline the loop asked for (`None`: none, or fired).
    deadline: Option<Instant>,
    /// The deadline of this timer's entry in the service (`None`: no entry). The
    /// service removes the entry when it fires it, which happens only once the deadline
    /// is reached; removing an entry no longer there is harmless.
    armed: Option<Instant>,
    /// The waker registered (the loop's task; replaced if another polls).
    waker: Option<Waker>,
    /// Tokio's timer, used when the service's thread could not be started.
    fallback: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl Timer {
    pub(super) fn new() -> Timer {
        Timer::with_service(&SERVICE)
    }

    fn with_service(service: &'static Service) -> Timer {
        Timer {
            service,
            id: service.new_id(),
            deadline: None,
            armed: None,
            waker: None,
            fallback: None,
        }
    }

    /// Aim at `deadline` (`None`: none, the timer never fires). An unchanged deadline
    /// keeps the registration; a new one replaces it (once polled).
    pub(super) fn set(&mut self, deadline: Option<Instant>) {
        self.deadline = deadline;
        if self.armed == deadline || deadline.is_some_and(|d| self.on_fallback(d)) {
            return;
        }
        match (deadline, self.waker.clone()) {
            // Already known waker: re-aim now, so the thread does not wake the loop at
            // the old deadline for nothing.
            (Some(d), Some(waker)) if d > Instant::now() => self.register(d, waker),
            _ => self.unregister(),
        }
    }

    /// Ready once the deadline is reached (never before); then unset until the next
    /// [`Timer::set`].
    pub(super) fn poll_fire(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let Some(deadline) = self.deadline else {
            return Poll::Pending;
        };
        if Instant::now() >= deadline {
            self.deadline = None;
            return Poll::Ready(());
        }
        let new_waker = !self.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker()));
        if new_waker {
            self.waker = Some(cx.waker().clone());
        }
        // Register unless registered here with this waker, or already falling back to
        // Tokio's timer for this deadline (no thread: not retried on every poll).
        if new_waker || (self.armed != Some(deadline) && !self.on_fallback(deadline)) {
            self.register(deadline, cx.waker().clone());
        }
        if self.armed.is_some() {
            return Poll::Pending;
        }
        // No thread: Tokio's timer.
        let fallback = self
            .fallback
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline.into())));
        if fallback.deadline().into_std() != deadline {
            fallback.as_mut().reset(deadline.into());
        }
        if fallback.as_mut().poll(cx).is_ready() {
            self.deadline = None;
            return Poll::Ready(());
        }
        Poll::Pending
    }

    /// Tokio's timer already aims at `deadline` (the thread could not be started for
    /// it): not retried on every turn.
    fn on_fallback(&self, deadline: Instant) -> bool {
        self.fallback
            .as_ref()
            .is_some_and(|f| f.deadline().into_std() == deadline)
    }

    fn register(&mut self, deadline: Instant, waker: Waker) {
        if self.service.arm(self.id, self.armed, deadline, waker) {
            self.armed = Some(deadline);
        } else {
            self.armed = None;
        }
    }

    fn unregister(&mut self) {
        if let Some(at) = self.armed.take() {
            self.service.disarm(self.id, at);
        }
    }
}

impl Drop for Timer {
    fn drop(&mut self) {
        self.unregister();
    }
}

#[cfg(test)]
#[path = "timer_tests.rs"]
mod tests;
