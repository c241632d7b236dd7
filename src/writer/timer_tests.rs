use super::*;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::Wake;

/// A service of the test's own (the process-wide one also serves the other tests'
/// writers, so its state could not be asserted on).
fn service(idle_exit: Duration) -> &'static Service {
    Box::leak(Box::new(Service::new(idle_exit, spawn_thread)))
}

/// Attempts to start a thread where none can be (one test uses it).
static SPAWN_ATTEMPTS: AtomicUsize = AtomicUsize::new(0);

fn no_thread(_: &'static Service) -> std::io::Result<()> {
    SPAWN_ATTEMPTS.fetch_add(1, Ordering::SeqCst);
    Err(std::io::Error::other("no threads in this test"))
}

fn armed(s: &Service) -> usize {
    s.lock().armed.len()
}

/// A waker that counts its wakes.
struct Count(AtomicUsize);

impl Wake for Count {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

fn fire(rt: &tokio::runtime::Runtime, timer: &mut Timer, deadline: Instant) -> Instant {
    timer.set(Some(deadline));
    rt.block_on(std::future::poll_fn(|cx| timer.poll_fire(cx)));
    Instant::now()
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// The linger defect: on Tokio's timer a deadline fired at the first millisecond tick at
/// or after it, and a runtime parked in `epoll_wait` woke up to another millisecond
/// later: 0–2 ms late, about 1 ms in the median. The timer must fire at or after its
/// deadline (asserted on every firing) and, in the median of 25 firings spread over a
/// millisecond, not much later than a plain `std::thread::sleep` to the same kind of
/// deadline measured in between (the machine's own wake-up delay, so that a loaded
/// machine loosens the bound for both): at most twice that (the timer's thread wakes,
/// then the runtime's) plus 300 µs. Quiet, that is about 0.4 ms, which Tokio's timer
/// does not meet (checked by running this test with the fallback); three rounds, any
/// one passing, so that a burst of load does not fail it.
#[test]
fn fires_after_its_deadline_and_well_within_a_millisecond() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let svc = service(IDLE_EXIT);
    let mut timer = Timer::with_service(svc);
    let mut rounds = Vec::new();
    for _ in 0..3 {
        let (mut timer_late, mut sleep_late) = (Vec::new(), Vec::new());
        for i in 0..25u64 {
            let ahead = Duration::from_micros(2_000 + (i * 41) % 1_000);
            let deadline = Instant::now() + ahead;
            let woke = fire(&rt, &mut timer, deadline);
            assert!(woke >= deadline, "fired {:?} early", deadline - woke);
            timer_late.push(woke - deadline);
            let deadline = Instant::now() + ahead;
            std::thread::sleep(deadline.saturating_duration_since(Instant::now()));
            sleep_late.push(Instant::now().saturating_duration_since(deadline));
        }
        let (timer_med, sleep_med) = (median(timer_late), median(sleep_late));
        if timer_med <= sleep_med * 2 + Duration::from_micros(300) {
            assert_eq!(svc.lock().started, 1, "one thread for all the deadlines");
            return;
        }
        rounds.push((timer_med, sleep_med));
    }
    panic!("median lateness (timer, thread sleep) in each round: {rounds:?}");
}

/// However often the deadline moves, the service holds one entry for the timer, and
/// only a deadline before the one the thread waits for wakes the thread.
#[test]
fn re_arming_replaces_the_registration() {
    let svc = service(IDLE_EXIT);
    let count = Arc::new(Count(AtomicUsize::new(0)));
    let waker = Waker::from(count.clone());
    let mut cx = Context::from_waker(&waker);
    let mut timer = Timer::with_service(svc);
    let base = Instant::now() + Duration::from_secs(3600);
    timer.set(Some(base));
    assert!(timer.poll_fire(&mut cx).is_pending());
    assert_eq!(armed(svc), 1);
    // Let the thread settle into waiting for `base`.
    std::thread::sleep(Duration::from_millis(50));
    let wakeups = svc.lock().wakeups;
    for i in 1..=10_000u64 {
        // Later and later (each loop turn's earliest batch sealed), polled or not.
        timer.set(Some(base + Duration::from_micros(i)));
        if i % 2 == 0 {
            assert!(timer.poll_fire(&mut cx).is_pending());
        }
    }
    assert_eq!(armed(svc), 1, "one entry per timer");
    let st = svc.lock();
    assert_eq!(
        st.armed.keys().next().unwrap().0,
        base + Duration::from_micros(10_000)
    );
    assert!(
        st.wakeups <= wakeups + 1,
        "later deadlines woke the thread {} times",
        st.wakeups - wakeups
    );
    assert_eq!(st.started, 1);
    drop(st);
    // Another timer's entry is its own.
    let mut other = Timer::with_service(svc);
    other.set(Some(base));
    assert!(other.poll_fire(&mut cx).is_pending());
    assert_eq!(armed(svc), 2);
    timer.set(None);
    assert_eq!(armed(svc), 1);
    assert!(timer.poll_fire(&mut cx).is_pending(), "no deadline fires");
    drop(other);
    assert_eq!(armed(svc), 0);
    assert_eq!(
        count.0.load(Ordering::SeqCst),
        0,
        "woken for a deadline not reached"
    );
}

/// A dropped timer leaves nothing behind: no entry, no clone of its waker, and its
/// deadline does not wake it.
#[test]
fn dropping_the_timer_deregisters_it() {
    let svc = service(IDLE_EXIT);
    let count = Arc::new(Count(AtomicUsize::new(0)));
    let waker = Waker::from(count.clone());
    let mut timer = Timer::with_service(svc);
    timer.set(Some(Instant::now() + Duration::from_millis(20)));
    assert!(timer
        .poll_fire(&mut Context::from_waker(&waker))
        .is_pending());
    assert_eq!(armed(svc), 1);
    drop(timer);
    assert_eq!(armed(svc), 0);
    std::thread::sleep(Duration::from_millis(60));
    assert_eq!(count.0.load(Ordering::SeqCst), 0, "woken after the drop");
    drop(waker);
    assert_eq!(
        Arc::strong_count(&count),
        1,
        "a clone of the waker was kept"
    );
}

/// A deadline reached fires at once without the thread, once; one polled from another
/// task wakes that task.
#[test]
fn a_deadline_reached_fires_at_once_and_once() {
    let svc = service(IDLE_EXIT);
    let waker = Waker::noop();
    let mut cx = Context::from_waker(waker);
    let mut timer = Timer::with_service(svc);
    timer.set(Some(Instant::now()));
    assert!(timer.poll_fire(&mut cx).is_ready());
    assert!(timer.poll_fire(&mut cx).is_pending(), "fired twice");
    assert_eq!(
        svc.lock().started,
        0,
        "a thread for a deadline already reached"
    );
    // Registered with one waker, polled by another: the second is woken.
    let count = Arc::new(Count(AtomicUsize::new(0)));
    let second = Waker::from(count.clone());
    timer.set(Some(Instant::now() + Duration::from_millis(5)));
    assert!(timer.poll_fire(&mut cx).is_pending());
    assert!(timer
        .poll_fire(&mut Context::from_waker(&second))
        .is_pending());
    assert_eq!(armed(svc), 1);
    let until = Instant::now() + Duration::from_secs(5);
    while count.0.load(Ordering::SeqCst) == 0 && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(count.0.load(Ordering::SeqCst), 1);
    assert_eq!(armed(svc), 0, "the fired entry stays");
    assert!(timer.poll_fire(&mut cx).is_ready());
}

/// The thread ends after `idle_exit` with nothing registered (not while a deadline is),
/// and the next deadline starts another.
#[test]
fn the_thread_ends_when_idle_and_restarts() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let svc = service(Duration::from_millis(30));
    let mut timer = Timer::with_service(svc);
    let waker = Waker::noop();
    let mut cx = Context::from_waker(waker);
    timer.set(Some(Instant::now() + Duration::from_secs(3600)));
    assert!(timer.poll_fire(&mut cx).is_pending());
    std::thread::sleep(Duration::from_millis(150));
    assert!(svc.lock().running, "ended while a deadline was registered");
    timer.set(None);
    let until = Instant::now() + Duration::from_secs(10);
    while svc.lock().running && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(!svc.lock().running, "still running with nothing registered");
    let deadline = Instant::now() + Duration::from_millis(2);
    assert!(fire(&rt, &mut timer, deadline) >= deadline);
    assert_eq!(svc.lock().started, 2);
}

/// Without a thread the timer falls back to Tokio's: late perhaps, never early.
#[test]
fn without_a_thread_tokio_s_timer_fires() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let svc: &'static Service = Box::leak(Box::new(Service::new(IDLE_EXIT, no_thread)));
    let mut timer = Timer::with_service(svc);
    for ms in [3, 1, 4] {
        let deadline = Instant::now() + Duration::from_millis(ms);
        assert!(fire(&rt, &mut timer, deadline) >= deadline);
        assert_eq!(armed(svc), 0);
    }
    assert_eq!(svc.lock().started, 0);
    // Turns that keep the deadline do not try to start the thread again.
    let attempts = SPAWN_ATTEMPTS.load(Ordering::SeqCst);
    let deadline = Instant::now() + Duration::from_secs(3600);
    // A waker whose clones `will_wake` it (as a Tokio task's; a no-op waker's clone may
    // not be recognised as the same waker, which counts as a new poller).
    let waker = Waker::from(Arc::new(Count(AtomicUsize::new(0))));
    let mut cx = Context::from_waker(&waker);
    for _ in 0..100 {
        timer.set(Some(deadline));
        assert!(timer.poll_fire(&mut cx).is_pending());
    }
    // Once for the new deadline (`set`, with the last waker), once for the new waker.
    assert_eq!(SPAWN_ATTEMPTS.load(Ordering::SeqCst), attempts + 2);
}
