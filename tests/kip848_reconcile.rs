//! KIP-848 reconciliation against Apache Kafka 4.1 (the shared test broker:
//! `group.consumer.session.timeout.ms=10000`, heartbeat interval 1 s): a member keeps
//! heartbeating while a slow reconciliation runs, and acknowledges a revocation before
//! it starts the partitions it was given.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{SinkExt, StreamExt};
use kafkapipe::admin::Admin;
use kafkapipe::conn::Conn;
use kafkapipe::group::{CommitMode, GroupEvent, GroupProtocol};
use kafkapipe::reader::{Reader, ReaderConfig, TopicPartition};

/// Events with the instant each arrived.
type Events = Arc<Mutex<Vec<(Instant, GroupEvent)>>>;

fn config(group: &str, topic: &str) -> ReaderConfig {
    ReaderConfig::new([common::shared().addr.clone()])
        .group_id(group)
        .topic(topic)
        .group_protocol(GroupProtocol::Consumer)
        .commit_mode(CommitMode::Interval(Duration::from_millis(100)))
        .max_wait(Duration::from_millis(50))
        .join_backoff(Duration::from_millis(200))
}

/// Reads (acking everything) and records the reader's events until `stop`.
fn spawn_member(
    config: ReaderConfig,
    events: Events,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut reader = Reader::new(config).await.unwrap();
        let mut committer = reader.committer().unwrap();
        let mut ev = reader.events().unwrap();
        while !stop.load(Ordering::SeqCst) {
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(50)) => {}
                Some(e) = ev.next() => events.lock().unwrap().push((Instant::now(), e)),
                m = reader.next_message() => match m {
                    Ok(m) => committer.feed(&m).await.unwrap(),
                    Err(e) => eprintln!("member error: {e}"),
                },
            }
        }
        reader.close().await;
    })
}

/// Partitions held according to the events; every revoked one; how many were lost.
fn holding(events: &Events) -> (BTreeSet<TopicPartition>, Vec<TopicPartition>, usize) {
    let mut held = BTreeSet::new();
    let (mut revoked, mut lost) = (Vec::new(), 0);
    for (_, e) in events.lock().unwrap().iter() {
        match e {
            GroupEvent::Assigned { partitions, .. } => held.extend(partitions.iter().cloned()),
            GroupEvent::Revoked { partitions } => {
                for tp in partitions {
                    held.remove(tp);
                    revoked.push(tp.clone());
                }
            }
            GroupEvent::Lost { partitions } => {
                lost += partitions.len();
                for tp in partitions {
                    held.remove(tp);
                }
            }
        }
    }
    (held, revoked, lost)
}

async fn wait_until(what: &str, within: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Member `a` subscribes to topics `t1` (4 partitions) and `t2` (created later) and owns
/// all of `t1`; then its OffsetStore turns slow (each `load` takes 13 s, longer than the
/// broker's 10 s session timeout), `t2` is created (2 partitions) and member `b`, which
/// subscribes to `t1` only, joins: `a` must give some of `t1` up and start `t2`'s
/// partitions, which only it can take. `a` must keep its membership (no `Lost`), never
/// give up a partition it keeps, and `b` must get what `a` revoked within a few seconds
/// of `a`'s `Revoked` event — not after `a`'s slow load.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kip848_heartbeats_continue_during_a_slow_reconciliation() {
    common::init_log();
    let prefix = common::unique_topic("kip848-slow");
    let (t1, t2) = (format!("{prefix}-1"), format!("{prefix}-2"));
    let group = common::unique_topic("kip848-slow-g");
    let conn = Conn::connect(&common::shared().addr).await.unwrap();
    conn.create_topic(&t1, 4, 1).await.unwrap();
    common::wait_for_topic(&conn, &t1, 4).await;

    let slow = Arc::new(AtomicBool::new(false));
    let loads = Arc::new(Mutex::new(Vec::<Duration>::new()));
    let store = {
        let (slow, loads) = (slow.clone(), loads.clone());
        move |_: Vec<TopicPartition>| {
            let (slow, loads) = (slow.clone(), loads.clone());
            async move {
                let began = Instant::now();
                if slow.load(Ordering::SeqCst) {
                    tokio::time::sleep(Duration::from_secs(13)).await;
                }
                loads.lock().unwrap().push(began.elapsed());
                Ok(HashMap::new())
            }
        }
    };
    let (a_events, b_events): (Events, Events) = Default::default();
    let stop = Arc::new(AtomicBool::new(false));
    let a = spawn_member(
        config(&group, &t1).topic(&t2).offset_store(store),
        a_events.clone(),
        stop.clone(),
    );
    wait_until("a holding t1", Duration::from_secs(30), || {
        holding(&a_events).0.len() == 4
    })
    .await;
    let before = holding(&a_events).0;

    slow.store(true, Ordering::SeqCst);
    conn.create_topic(&t2, 2, 1).await.unwrap();
    let b = spawn_member(config(&group, &t1), b_events.clone(), stop.clone());
    let started = Instant::now();
    let t2_parts: BTreeSet<TopicPartition> =
        (0..2).map(|p| TopicPartition::new(t2.clone(), p)).collect();
    let settled = || {
        let (ha, hb) = (holding(&a_events).0, holding(&b_events).0);
        t2_parts.is_subset(&ha) && !hb.is_empty() && ha.is_disjoint(&hb) && ha.len() + hb.len() == 6
    };
    while !settled() {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "not settled within 60 s; a: {:?}; b: {:?}",
            holding(&a_events),
            holding(&b_events)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eprintln!(
        "KIP-848 slow reconciliation: settled {:?} after b started; store loads took {:?}",
        started.elapsed(),
        loads.lock().unwrap()
    );
    assert!(
        loads
            .lock()
            .unwrap()
            .iter()
            .any(|d| *d >= Duration::from_secs(13)),
        "a's slow load did not run"
    );
    // a few heartbeats later: nothing lost since
    tokio::time::sleep(Duration::from_secs(3)).await;

    let (held_a, revoked_a, lost_a) = holding(&a_events);
    let (held_b, _, lost_b) = holding(&b_events);
    assert_eq!(
        lost_a,
        0,
        "a lost partitions: {:?}",
        a_events.lock().unwrap()
    );
    assert_eq!(lost_b, 0, "b lost partitions");
    for tp in &held_a {
        if before.contains(tp) {
            assert!(!revoked_a.contains(tp), "kept partition {tp} was revoked");
        }
    }
    // b got a's revoked partitions soon after a's Revoked event
    let revoked_at = a_events
        .lock()
        .unwrap()
        .iter()
        .find(|(_, e)| matches!(e, GroupEvent::Revoked { .. }))
        .map(|(t, _)| *t)
        .expect("a revoked partitions");
    let moved: BTreeSet<TopicPartition> = revoked_a.iter().cloned().collect();
    assert!(
        moved.is_subset(&held_b),
        "b does not hold {moved:?}: {held_b:?}"
    );
    let got_at = b_events
        .lock()
        .unwrap()
        .iter()
        .rev()
        .find_map(|(t, e)| match e {
            GroupEvent::Assigned { partitions, .. }
                if partitions.iter().any(|tp| moved.contains(tp)) =>
            {
                Some(*t)
            }
            _ => None,
        })
        .expect("b assigned a's partitions");
    let wait = got_at.saturating_duration_since(revoked_at);
    eprintln!(
        "KIP-848 slow reconciliation: b got a's revoked partitions {wait:?} after a's Revoked event, {:?} after b started",
        got_at.saturating_duration_since(started)
    );
    assert!(
        wait < Duration::from_secs(4),
        "b waited {wait:?} for a's revoked partitions"
    );

    stop.store(true, Ordering::SeqCst);
    a.await.unwrap();
    b.await.unwrap();
    conn.close().await;
}

/// A close interrupts a reconciliation that is starting partitions (an OffsetStore that
/// takes a minute): the reader closes at once, commits what was processed of the
/// partitions it kept and leaves the group (epoch -1), so a new member gets every
/// partition right away instead of after the broker's session timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kip848_close_interrupts_a_reconciliation() {
    common::init_log();
    let topic = common::unique_topic("kip848-close");
    let group = common::unique_topic("kip848-close-g");
    let conn = Conn::connect(&common::shared().addr).await.unwrap();
    conn.create_topic(&topic, 2, 1).await.unwrap();
    common::wait_for_topic(&conn, &topic, 2).await;
    for p in 0..2 {
        let records: Vec<kafkapipe::record::Record> = (0..10)
            .map(|i| kafkapipe::record::Record::new(format!("k{i}"), format!("{p}-{i}")))
            .collect();
        conn.produce(&topic, p, &records, &Default::default())
            .await
            .unwrap();
    }
    let slow = Arc::new(AtomicBool::new(false));
    let loading = Arc::new(AtomicBool::new(false));
    let store = {
        let (slow, loading) = (slow.clone(), loading.clone());
        move |_: Vec<TopicPartition>| {
            let (slow, loading) = (slow.clone(), loading.clone());
            async move {
                if slow.load(Ordering::SeqCst) {
                    loading.store(true, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_secs(60)).await;
                }
                Ok(HashMap::new())
            }
        }
    };
    // no interval commits: only the close commits
    let mut a = Reader::new(
        config(&group, &topic)
            .commit_mode(CommitMode::Interval(Duration::from_secs(3600)))
            .offset_store(store),
    )
    .await
    .unwrap();
    let mut committer = a.committer().unwrap();
    for _ in 0..20 {
        let m = tokio::time::timeout(Duration::from_secs(30), a.next_message())
            .await
            .unwrap()
            .unwrap();
        committer.feed(&m).await.unwrap();
    }
    SinkExt::<&kafkapipe::reader::Message>::flush(&mut committer)
        .await
        .unwrap();

    slow.store(true, Ordering::SeqCst);
    let admin = Admin::connect([common::shared().addr.clone()]).unwrap();
    for (_, r) in admin
        .create_partitions(&[(&topic, 4)], false)
        .await
        .unwrap()
    {
        r.unwrap();
    }
    wait_until("a's slow load", Duration::from_secs(30), || {
        loading.load(Ordering::SeqCst)
    })
    .await;
    let closing = Instant::now();
    drop(committer);
    a.close().await;
    let closed = closing.elapsed();
    eprintln!("KIP-848: closed during a reconciliation in {closed:?}");
    assert!(closed < Duration::from_secs(5), "close took {closed:?}");

    let committed: BTreeSet<(i32, i64)> = admin
        .fetch_group_offsets(&group, Some(&[&topic]))
        .await
        .unwrap()
        .into_iter()
        .filter_map(|(tp, r)| r.ok().map(|c| (tp.partition, c.offset)))
        .filter(|(_, o)| *o >= 0)
        .collect();
    assert_eq!(committed, BTreeSet::from([(0, 10), (1, 10)]));

    // a left: b gets all 4 partitions well before the 10 s session timeout
    let b_events: Events = Default::default();
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let b = spawn_member(config(&group, &topic), b_events.clone(), stop.clone());
    wait_until("b holding 4 partitions", Duration::from_secs(30), || {
        holding(&b_events).0.len() == 4
    })
    .await;
    let took = started.elapsed();
    eprintln!("KIP-848: the next member held every partition {took:?} after it started");
    assert!(
        took < Duration::from_secs(6),
        "a did not leave: b waited {took:?}"
    );
    stop.store(true, Ordering::SeqCst);
    b.await.unwrap();
    conn.close().await;
}
