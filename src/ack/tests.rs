//! Unit tests of the ack tokens and the per-ownership tracks.

use super::*;

/// A track makes room (an ack elsewhere) after the consumer's poll found it full but
/// before the consumer parked: the consumer is woken once it parks, not left waiting.
#[test]
fn a_nudge_between_a_poll_and_the_park_is_not_lost() {
    use std::sync::atomic::AtomicUsize;
    use std::task::{Wake, Waker};
    struct Count(AtomicUsize);
    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
    let count = Arc::new(Count(AtomicUsize::new(0)));
    let waker = Waker::from(count.clone());
    let pulse = Pulse::default();
    pulse.polled();
    pulse.nudge();
    pulse.park(&waker);
    assert_eq!(count.0.load(Ordering::SeqCst), 1, "woken at the park");
    // and only once: a later poll and park wait for the next nudge
    pulse.polled();
    pulse.park(&waker);
    assert_eq!(count.0.load(Ordering::SeqCst), 1);
    pulse.nudge();
    assert_eq!(count.0.load(Ordering::SeqCst), 2);
}

/// Tokens dropped on another thread at every moment relative to the consumer's poll and
/// park (before the park, during it, after it): every drop wakes the parked consumer (a
/// lost wake-up would leave it parked with the drop unconfirmed), and once polled again
/// every drop counts as processed, so the commit reaches the last offset.
#[test]
fn drops_on_another_thread_always_wake_the_parked_consumer() {
    use std::sync::atomic::AtomicBool;
    use std::task::{Wake, Waker};
    use std::time::{Duration, Instant};
    struct Unpark {
        woken: AtomicBool,
        thread: std::thread::Thread,
    }
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.woken.store(true, Ordering::SeqCst);
            self.thread.unpark();
        }
    }
    const N: i64 = 20_000;
    let (pulse, t) = track(true, 1 << 20);
    let unpark = Arc::new(Unpark {
        woken: AtomicBool::new(false),
        thread: std::thread::current(),
    });
    let waker = Waker::from(unpark.clone());
    let (tx, rx) = std::sync::mpsc::channel::<AckToken>();
    let dropper = std::thread::spawn(move || {
        // A cheap pseudo-random spin before each drop, so that drops land before, during
        // and after the consumer's park.
        let mut x: u32 = 0x9E37_79B9;
        for token in rx {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            for _ in 0..(x % 2_000) {
                std::hint::spin_loop();
            }
            drop(token);
        }
    });
    for offset in 0..N {
        pulse.polled();
        tx.send(token(&t, offset)).unwrap();
        pulse.park(&waker);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !unpark.woken.swap(false, Ordering::SeqCst) {
            let now = Instant::now();
            assert!(
                now < deadline,
                "lost wake-up after the drop of offset {offset}"
            );
            std::thread::park_timeout(deadline - now);
        }
    }
    drop(tx);
    dropper.join().unwrap();
    pulse.polled();
    assert_eq!(t.unacked().0, 0, "every drop confirmed");
    assert_eq!(t.pending_offset(), N);
}

fn track(contiguous: bool, max: usize) -> (Arc<Pulse>, Arc<Track>) {
    let pulse = Arc::new(Pulse::default());
    let t = Arc::new(Track::new(-1, contiguous, max, pulse.clone()));
    (pulse, t)
}

fn token(t: &Arc<Track>, offset: i64) -> AckToken {
    let seq = t.deliver(offset, offset + 1).expect("room");
    AckToken::tracked(t.clone(), seq, offset)
}

#[test]
fn sources_see_through_shared_and_merged_tokens() {
    let (_pulse, t) = track(true, 10);
    let a = token(&t, 5);
    let b = token(&t, 6);
    let c = token(&t, 7);
    let shared = c.share();
    let merged: AckToken = [a, AckToken::from(shared.clone())].into_iter().collect();
    let mut out = Vec::new();
    merged.sources(&mut out);
    b.sources(&mut out);
    let offsets: Vec<i64> = out.iter().map(|(_, _, o)| *o).collect();
    assert_eq!(offsets, vec![5, 7, 6]);
    assert!(out.iter().all(|(tr, seq, _)| tr.is_current(*seq)));
    let mut none = Vec::new();
    AckToken::default().sources(&mut none);
    assert!(none.is_empty());
    drop((merged, b, shared));
}

#[test]
fn a_restart_or_a_give_up_makes_earlier_deliveries_stale() {
    let (pulse, t) = track(true, 10);
    let a = token(&t, 5);
    let mut out = Vec::new();
    a.sources(&mut out);
    let seq = out[0].1;
    assert!(t.is_current(seq));
    t.restart();
    assert!(!t.is_current(seq), "forgotten by a seek/rewind");
    let b = token(&t, 5);
    let mut out = Vec::new();
    b.sources(&mut out);
    assert!(t.is_current(out[0].1));
    b.ack();
    assert_eq!(t.pending_offset(), 6);
    assert_eq!(t.committed_offset(), -1);
    t.committed(6);
    assert_eq!(t.committed_offset(), 6);
    let c = token(&t, 6);
    let mut out = Vec::new();
    c.sources(&mut out);
    t.deactivate();
    assert!(!t.active());
    assert!(!t.is_current(out[0].1), "given up");
    pulse.polled();
    drop((a, c));
}

#[test]
fn dropped_tokens_count_once_the_reader_is_polled_again() {
    let (pulse, t) = track(true, 100);
    pulse.polled();
    let a = token(&t, 0);
    let b = token(&t, 1);
    drop(a); // filtered out
    assert_eq!(t.due(), None, "not before the reader is polled again");
    pulse.polled();
    assert_eq!(t.due(), Some(1));
    b.ack();
    assert_eq!(t.due(), Some(2));
}

#[test]
fn a_token_dropped_after_the_last_poll_is_not_processed() {
    // A failing stage drops its message and ends the pipeline: nothing polls again.
    let (pulse, t) = track(true, 100);
    pulse.polled();
    let a = token(&t, 7);
    a.ack();
    let b = token(&t, 8);
    drop(b);
    assert_eq!(t.due(), Some(8));
}

#[test]
fn failed_tokens_hold_the_commit() {
    let (pulse, t) = track(true, 100);
    let a = token(&t, 0);
    let b = token(&t, 1);
    a.fail();
    b.ack();
    pulse.polled();
    assert_eq!(t.due(), None);
    assert_eq!(t.unacked().0, 2);
}

#[test]
fn out_of_order_acks_commit_the_contiguous_prefix() {
    let (_pulse, t) = track(true, 100);
    let toks: Vec<_> = (0..5).map(|o| token(&t, o)).collect();
    let mut toks = toks.into_iter();
    let (t0, t1, t2, t3, t4) = (
        toks.next().unwrap(),
        toks.next().unwrap(),
        toks.next().unwrap(),
        toks.next().unwrap(),
        toks.next().unwrap(),
    );
    t3.ack();
    t1.ack();
    assert_eq!(t.due(), None);
    t0.ack();
    assert_eq!(t.due(), Some(2));
    t2.ack();
    assert_eq!(t.due(), Some(4));
    t4.ack();
    assert_eq!(t.due(), Some(5));
}

#[test]
fn not_contiguous_commits_through_the_highest_processed() {
    let (_pulse, t) = track(false, 100);
    let a = token(&t, 0);
    let b = token(&t, 1);
    b.ack();
    assert_eq!(t.due(), Some(2));
    a.fail();
    assert_eq!(t.due(), Some(2));
}

#[test]
fn the_bound_refuses_deliveries_until_room_is_made() {
    let (pulse, t) = track(true, 2);
    let a = token(&t, 0);
    let _b = token(&t, 1);
    assert_eq!(t.deliver(2, 3), Err(Full));
    assert_eq!(t.unacked().0, 2);
    a.ack();
    assert!(t.deliver(2, 3).is_ok());
    pulse.polled();
}

#[test]
fn tokens_of_an_earlier_ownership_change_nothing() {
    let pulse = Arc::new(Pulse::default());
    let old = Arc::new(Track::new(-1, true, 100, pulse.clone()));
    let stale = token(&old, 5);
    old.deactivate();
    // The partition comes back to this member, committed at 3 by someone else.
    let new = Arc::new(Track::new(3, true, 100, pulse.clone()));
    let fresh = token(&new, 3);
    stale.ack();
    pulse.polled();
    assert_eq!(new.due(), None, "a stale ack must not commit 6");
    fresh.ack();
    assert_eq!(new.due(), Some(4));
}

#[test]
fn shared_tokens_are_processed_when_every_clone_is() {
    let (pulse, t) = track(true, 100);
    let s = token(&t, 0).share();
    let (a, b, c) = (s.clone(), s.clone(), s);
    a.ack();
    b.ack();
    assert_eq!(t.due(), None);
    c.ack();
    pulse.polled();
    assert_eq!(t.due(), Some(1));

    let s = token(&t, 1).share();
    let (a, b) = (s.clone(), s);
    a.fail();
    b.ack();
    pulse.polled();
    assert_eq!(t.due(), Some(1), "one failed part holds the message");
}

#[test]
fn merged_tokens_settle_together() {
    let (_pulse, t) = track(true, 100);
    let merged: AckToken = (0..3).map(|o| token(&t, o)).collect();
    assert!(merged.is_tracked());
    assert_eq!(t.due(), None);
    merged.ack();
    assert_eq!(t.due(), Some(3));
}

#[test]
fn a_panicking_holder_fails_its_token() {
    let (pulse, t) = track(true, 100);
    let a = token(&t, 0);
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
        let _held = a;
        panic!("worker died");
    }));
    assert!(r.is_err());
    pulse.polled();
    assert_eq!(t.due(), None);
}

#[test]
fn commits_skip_what_follows_the_last_message_and_nothing_else() {
    let (_pulse, t) = track(true, 100);
    // 0, then a commit marker at 1: nothing to yield before 2
    let seq = t.deliver(0, 2).unwrap();
    let a = AckToken::tracked(t.clone(), seq, 0);
    // a later fetch found only markers 2..5 while 0 was still being processed
    t.gap(2, 5);
    assert_eq!(t.due(), None);
    a.ack();
    assert_eq!(t.due(), Some(5));
    // nothing tracked and the commit at the gap's start: it moves
    t.gap(5, 7);
    assert_eq!(t.due(), Some(7));
    // a gap that does not start where the commit is: ignored
    t.gap(9, 12);
    assert_eq!(t.due(), Some(7));
}

#[test]
fn held_counts_only_tokens_still_pending() {
    let (pulse, t) = track(true, 100);
    let a = token(&t, 0);
    let b = token(&t, 1);
    let c = token(&t, 2);
    let d = token(&t, 3);
    assert_eq!(t.held(), 4);
    a.ack();
    b.fail();
    drop(c); // dropped after the last poll: not processed, but not held either
    assert_eq!(t.held(), 1);
    assert_eq!(t.due(), Some(1));
    d.ack();
    assert_eq!(t.held(), 0);
    let _e = token(&t, 4);
    pulse.polled();
    assert_eq!(t.held(), 1);
    t.deactivate();
    assert_eq!(t.held(), 0, "a given-up partition holds nothing");
}

/// Issue 26 item 4: a forward seek while messages are held. 0..99 processed and
/// committed, 100..109 held, seek to 1110, 1110 processed: the commit stays at 100
/// until 100..109 are settled, the held ones still count, then it moves to 1111.
#[test]
fn a_seek_does_not_commit_past_held_messages() {
    let (pulse, t) = track(true, 1000);
    for o in 0..100 {
        token(&t, o).ack();
    }
    assert_eq!(t.due(), Some(100));
    t.committed(100);
    let held: Vec<AckToken> = (100..110).map(|o| token(&t, o)).collect();
    t.seek();
    let after = token(&t, 1110);
    after.ack();
    pulse.polled();
    assert_eq!(
        t.due(),
        None,
        "the commit must not pass 100..109, still held"
    );
    assert_eq!(
        t.held(),
        10,
        "the held messages still count (close waits for them)"
    );
    assert_eq!(t.unacked(), (11, t.unacked().1));
    assert_eq!(t.unacked().1.map(|(o, _)| o), Some(100));
    let mut held = held.into_iter();
    if let Some(first) = held.next() {
        first.ack();
    }
    assert_eq!(t.due(), Some(101));
    for tok in held {
        tok.ack();
    }
    assert_eq!(
        t.due(),
        Some(1111),
        "settled: the work after the seek commits"
    );
    assert_eq!(t.held(), 0);
}

/// A seek back while messages are held: the re-read messages do not forget them,
/// and the commit never goes backwards.
#[test]
fn a_seek_back_keeps_held_messages_and_never_moves_the_commit_back() {
    let (pulse, t) = track(true, 1000);
    let a = token(&t, 10);
    let b = token(&t, 11);
    t.seek();
    let c = token(&t, 3);
    c.ack();
    pulse.polled();
    assert_eq!(t.due(), None, "10 and 11 are still held");
    assert_eq!(t.held(), 2);
    a.ack();
    b.ack();
    assert_eq!(t.due(), Some(12));
    let d = token(&t, 4);
    d.ack();
    assert_eq!(t.due(), Some(12), "never backwards");
    // an explicit ack finds the re-read message among the older deliveries
    let e = token(&t, 5);
    let f = token(&t, 6);
    assert!(!t.ack_offset(6));
    drop(e);
    pulse.polled();
    assert_eq!(t.unacked().0, 0);
    drop(f);
}

/// An explicit `Offset` ack after a seek, while messages yielded before it are held,
/// never moves the commit past them (it used to find an empty track and move it).
#[test]
fn explicit_acks_after_a_seek_never_pass_held_messages() {
    let (_pulse, t) = track(true, 1000);
    for o in 0..100 {
        token(&t, o).ack();
    }
    assert_eq!(t.due(), Some(100));
    let held: Vec<AckToken> = (100..110).map(|o| token(&t, o)).collect();
    t.seek();
    assert!(!t.ack_offset(1110), "100..109 are held");
    assert_eq!(t.due(), Some(100));
    assert!(!t.ack_offset(40), "already committed");
    let _a = token(&t, 1110);
    assert!(!t.ack_offset(1110));
    assert_eq!(t.due(), Some(100));
    held.into_iter().for_each(AckToken::ack);
    assert_eq!(t.due(), Some(1111));
}

/// The exactly-once rewind still forgets: deliveries before it are stale.
#[test]
fn a_rewind_still_forgets_earlier_deliveries() {
    let (_pulse, t) = track(true, 100);
    let a = token(&t, 5);
    let mut out = Vec::new();
    a.sources(&mut out);
    t.seek();
    assert!(t.is_current(out[0].1), "a seek keeps what was yielded");
    t.restart();
    assert!(!t.is_current(out[0].1), "a rewind forgets it");
    assert_eq!(t.held(), 0);
    drop(a);
}

#[test]
fn explicit_offset_acks_never_pass_a_tracked_message() {
    let (_pulse, t) = track(true, 100);
    let _a = token(&t, 10); // 0..10 yielded before tracking
    assert!(t.ack_offset(4));
    assert_eq!(t.due(), Some(5));
    assert!(!t.ack_offset(12));
    assert!(t.ack_offset(9));
    assert_eq!(t.due(), Some(10));
    assert!(t.ack_offset(10));
    assert_eq!(t.due(), Some(11));
}
