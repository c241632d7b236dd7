//! Real-broker tests of consumer groups against Apache Kafka (the shared single-node test
//! broker, `group.initial.rebalance.delay.ms=0`): membership and rebalances of several
//! kafkapipe readers, committed offsets (never regressing, ending at the log end),
//! dropping revoked partitions' buffered messages, commit on close and restart from the
//! committed offsets, interoperability with librdkafka members, partitions added with
//! CreatePartitions.
//!
//! `group_scenarios` runs them all concurrently (one topic and group each).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{SinkExt, StreamExt};
use kafkapipe::admin::Admin;
use kafkapipe::conn::{Conn, ProduceOptions};
use kafkapipe::group::{CommitMode, GroupEvent};
use kafkapipe::reader::{Message, Reader, ReaderConfig, TopicPartition};
use kafkapipe::record::Record;

async fn conn() -> Conn {
    Conn::connect(&common::shared().addr).await.unwrap()
}

async fn new_topic(prefix: &str, partitions: i32) -> String {
    let topic = common::unique_topic(prefix);
    create_named(&topic, partitions).await;
    topic
}

/// Creates `topic` and waits until every partition has a leader.
async fn create_named(topic: &str, partitions: i32) {
    let conn = conn().await;
    conn.create_topic(topic, partitions, 1).await.unwrap();
    common::wait_for_topic(&conn, topic, partitions).await;
    conn.close().await;
}

fn group_config(group: &str, topic: &str) -> ReaderConfig {
    ReaderConfig::new([common::shared().addr.clone()])
        .group_id(group)
        .topic(topic)
        .max_wait(Duration::from_millis(50))
        .session_timeout(Duration::from_secs(6))
        .heartbeat_interval(Duration::from_millis(300))
        .rebalance_timeout(Duration::from_secs(5))
        .join_backoff(Duration::from_millis(200))
}

/// Produce `n` records `"{partition}-{i}"` to every partition of `topic`.
async fn produce(topic: &str, partitions: i32, from: usize, n: usize) {
    let conn = conn().await;
    for p in 0..partitions {
        let mut i = from;
        while i < from + n {
            let end = (i + 500).min(from + n);
            let records: Vec<Record> = (i..end)
                .map(|k| Record::new(format!("k{k}"), format!("{p}-{k}")))
                .collect();
            produce_retrying(&conn, topic, p, &records).await;
            i = end;
        }
    }
}

/// Produce, retrying retriable errors for a few seconds: Kafka may list a new partition's
/// leader in Metadata a moment before that leader accepts Produce (NOT_LEADER_OR_FOLLOWER).
async fn produce_retrying(conn: &Conn, topic: &str, partition: i32, records: &[Record]) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match conn
            .produce(topic, partition, records, &ProduceOptions::default())
            .await
        {
            Ok(_) => return,
            Err(e) if e.is_retriable() && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            Err(e) => panic!("produce to {topic}/{partition}: {e}"),
        }
    }
}

async fn committed(group: &str, topic: &str) -> BTreeMap<i32, i64> {
    let admin = Admin::connect([common::shared().addr.clone()]).unwrap();
    let mut out = BTreeMap::new();
    for (tp, r) in admin
        .fetch_group_offsets(group, Some(&[topic]))
        .await
        .unwrap()
    {
        out.insert(tp.partition, r.unwrap().offset);
    }
    out
}

/// The next message. Any error fails the test: retriable coordinator errors (the broker
/// loading the group, the coordinator moving) are retried inside the group task, as the
/// Java client does, and never reach the stream.
async fn next(reader: &mut Reader, within: Duration) -> Message {
    tokio::time::timeout(within, reader.next_message())
        .await
        .expect("a message in time")
        .unwrap_or_else(|e| panic!("reader error: {e}"))
}

/// Loads the group coordinator (`__consumer_offsets` is created and loaded on the first
/// FindCoordinator of a fresh broker) with a throwaway group, so the scenarios measure
/// group behaviour rather than the broker's first start (only for speed: the scenarios'
/// timeouts are tight; the members retry a loading coordinator silently).
async fn warm_up_coordinator() {
    let topic = new_topic("group-warmup", 1).await;
    produce(&topic, 1, 0, 1).await;
    let group = common::unique_topic("group-warmup-g");
    let mut reader = Reader::new(group_config(&group, &topic)).await.unwrap();
    next(&mut reader, Duration::from_secs(60)).await;
    reader.close().await;
}

async fn single_member_commits_on_close_and_restarts_from_commit() {
    let topic = new_topic("group-single", 2).await;
    let group = common::unique_topic("group-single-g");
    produce(&topic, 2, 0, 10).await;

    let mut reader = Reader::new(group_config(&group, &topic).commit_mode(CommitMode::Sync))
        .await
        .unwrap();
    let mut events = reader.events().unwrap();
    let mut committer = reader.committer().unwrap();
    let mut seen = Vec::new();
    // 7 from each partition: acked, then close must commit them
    while seen.len() < 20 {
        let mut m = next(&mut reader, Duration::from_secs(20)).await;
        seen.push((m.partition, m.offset));
        if m.offset < 7 {
            committer.feed(&m).await.unwrap();
        } else {
            // not processed: a dropped message would count as processed
            m.take_ack_token().fail();
        }
    }
    match events.next().await.unwrap() {
        GroupEvent::Assigned { partitions, .. } => assert_eq!(
            partitions,
            vec![
                TopicPartition::new(&topic, 0),
                TopicPartition::new(&topic, 1)
            ]
        ),
        other => panic!("{other:?}"),
    }
    reader.close().await;
    assert_eq!(
        committed(&group, &topic).await,
        BTreeMap::from([(0, 7), (1, 7)])
    );

    // a new member resumes at the commit
    let mut reader = Reader::new(group_config(&group, &topic)).await.unwrap();
    let mut again = HashSet::new();
    while again.len() < 6 {
        let m = next(&mut reader, Duration::from_secs(20)).await;
        assert!(m.offset >= 7, "{m:?} was committed");
        again.insert((m.partition, m.offset));
    }
    reader.close().await;
}

type Seen = Arc<Mutex<HashMap<(i32, i64), u32>>>;

/// One group member: reads, records and acks every message until told to stop, then
/// closes (committing and leaving the group).
fn spawn_member(
    config: ReaderConfig,
    seen: Seen,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut reader = Reader::new(config).await.unwrap();
        let mut committer = reader.committer().unwrap();
        loop {
            tokio::select! {
                _ = stop.changed() => break,
                m = reader.next_message() => match m {
                    Ok(m) => {
                        *seen.lock().unwrap().entry((m.partition, m.offset)).or_default() += 1;
                        committer.feed(&m).await.unwrap();
                    }
                    Err(e) => eprintln!("member error: {e}"),
                },
            }
        }
        reader.close().await;
    })
}

/// Polls the group's committed offsets until stopped; panics if one ever goes backwards.
fn watch_commits(
    group: String,
    topic: String,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<usize> {
    tokio::spawn(async move {
        let admin = Admin::connect([common::shared().addr.clone()]).unwrap();
        let mut last: HashMap<i32, i64> = HashMap::new();
        let mut polls = 0;
        while !stop.load(Ordering::SeqCst) {
            if let Ok(offsets) = admin.fetch_group_offsets(&group, Some(&[&topic])).await {
                for (tp, r) in offsets {
                    let Ok(c) = r else { continue };
                    let prev = last.entry(tp.partition).or_insert(-1);
                    assert!(
                        c.offset >= *prev,
                        "{tp}: commit went from {prev} to {}",
                        c.offset
                    );
                    *prev = c.offset;
                }
                polls += 1;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        polls
    })
}

async fn wait_until(what: &str, within: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Produces 50 records to each partition every 50 ms until stopped; returns how many
/// each partition got.
fn spawn_producer(
    topic: String,
    partitions: i32,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<usize> {
    tokio::spawn(async move {
        let mut n = 0;
        while !stop.load(Ordering::SeqCst) {
            produce(&topic, partitions, n, 50).await;
            n += 50;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        n
    })
}

/// One, two, then three members over 6 partitions while messages flow; then the first
/// one (the group leader) leaves and the coordinator picks a new leader. Every message is
/// processed at least once, no commit ever regresses, and after the members close the
/// committed offsets are the log end.
async fn members_join_and_leave_while_messages_flow() {
    common::init_log();
    let topic = new_topic("group-flow", 6).await;
    let group = common::unique_topic("group-flow-g");
    produce(&topic, 6, 0, 1_000).await;
    let stop_producer = Arc::new(AtomicBool::new(false));
    let producer = spawn_producer(topic.clone(), 6, stop_producer.clone());
    let stop_watch = Arc::new(AtomicBool::new(false));
    let watcher = watch_commits(group.clone(), topic.clone(), stop_watch.clone());
    let config = || {
        group_config(&group, &topic).commit_mode(CommitMode::Interval(Duration::from_millis(100)))
    };
    let seen: [Seen; 3] = Default::default();
    let count = |i: usize| seen[i].lock().unwrap().len();

    let (stop_a, rx) = tokio::sync::watch::channel(false);
    let a = spawn_member(config(), seen[0].clone(), rx);
    wait_until("a's first messages", Duration::from_secs(20), || {
        count(0) >= 1_000
    })
    .await;
    let (stop_b, rx) = tokio::sync::watch::channel(false);
    let b = spawn_member(config(), seen[1].clone(), rx);
    wait_until("b's first messages", Duration::from_secs(20), || {
        count(1) >= 100
    })
    .await;
    let (stop_c, rx) = tokio::sync::watch::channel(false);
    let c = spawn_member(config(), seen[2].clone(), rx);
    wait_until("c's first messages", Duration::from_secs(20), || {
        count(2) >= 100
    })
    .await;
    // a, the leader, leaves gracefully; b and c take over its partitions from its commits
    stop_a.send(true).unwrap();
    a.await.unwrap();
    let after_a = (count(1), count(2));
    wait_until("b and c to go on", Duration::from_secs(20), || {
        count(1) > after_a.0 + 100 && count(2) > after_a.1 + 100
    })
    .await;
    stop_producer.store(true, Ordering::SeqCst);
    let per = 1_000 + producer.await.unwrap();
    let all = |seen: &[Seen; 3]| {
        let mut all: HashMap<(i32, i64), u32> = HashMap::new();
        for s in seen {
            for (k, n) in s.lock().unwrap().iter() {
                *all.entry(*k).or_default() += n;
            }
        }
        all
    };
    wait_until("every message", Duration::from_secs(20), || {
        all(&seen).len() >= 6 * per
    })
    .await;
    stop_b.send(true).unwrap();
    stop_c.send(true).unwrap();
    b.await.unwrap();
    c.await.unwrap();
    stop_watch.store(true, Ordering::SeqCst);
    assert!(watcher.await.unwrap() > 0);

    let all = all(&seen);
    for p in 0..6 {
        for o in 0..per as i64 {
            assert!(all.contains_key(&(p, o)), "{p}@{o} never processed");
        }
    }
    let duplicates: u32 = all.values().map(|n| n - 1).sum();
    eprintln!(
        "{} messages (a {}, b {}, c {}), {duplicates} redelivered",
        all.len(),
        count(0),
        count(1),
        count(2)
    );
    let expected: BTreeMap<i32, i64> = (0..6).map(|p| (p, per as i64)).collect();
    assert_eq!(committed(&group, &topic).await, expected);
}

async fn next_event(events: &mut kafkapipe::group::GroupEvents, within: Duration) -> GroupEvent {
    tokio::time::timeout(within, events.next())
        .await
        .expect("a group event in time")
        .expect("events go on while the reader is open")
}

/// A member with a full prefetch buffer loses partitions to a second member: after the
/// rebalance it yields nothing of the partitions it lost (their buffered messages were
/// dropped), and the new owner reads them from the last commit.
async fn rebalance_drops_buffered_messages_of_revoked_partitions() {
    let topic = new_topic("group-revoke", 6).await;
    let group = common::unique_topic("group-revoke-g");
    produce(&topic, 6, 0, 1_000).await;
    let mut a = Reader::new(group_config(&group, &topic)).await.unwrap();
    let mut events = a.events().unwrap();
    let first = next(&mut a, Duration::from_secs(20)).await;
    match next_event(&mut events, Duration::from_secs(5)).await {
        GroupEvent::Assigned { partitions, .. } => assert_eq!(partitions.len(), 6),
        other => panic!("{other:?}"),
    }
    wait_until("a full buffer", Duration::from_secs(10), || {
        a.stats().queue_length >= 3_000
    })
    .await;
    // commit where a stands on the first message's partition, nothing elsewhere
    let mut committer = a.committer().unwrap();
    committer.send(&first).await.unwrap();

    let mut b = Reader::new(group_config(&group, &topic)).await.unwrap();
    let mut b_events = b.events().unwrap();
    match next_event(&mut events, Duration::from_secs(20)).await {
        GroupEvent::Revoked { partitions } => assert_eq!(partitions.len(), 6),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        a.stats().queue_length,
        0,
        "revoked partitions' messages dropped"
    );
    let kept = match next_event(&mut events, Duration::from_secs(20)).await {
        GroupEvent::Assigned { partitions, .. } => partitions,
        other => panic!("{other:?}"),
    };
    assert_eq!(kept.len(), 3);
    for _ in 0..500 {
        let m = next(&mut a, Duration::from_secs(10)).await;
        assert!(
            kept.contains(&TopicPartition::new(&topic, m.partition)),
            "{m:?} is not a's any more"
        );
    }
    let taken = match next_event(&mut b_events, Duration::from_secs(20)).await {
        GroupEvent::Assigned { partitions, .. } => partitions,
        other => panic!("{other:?}"),
    };
    assert_eq!(taken.len(), 3);
    // b starts each partition at the commit: first.offset + 1 on first's partition, else 0
    let mut starts: HashMap<i32, i64> = HashMap::new();
    while starts.len() < 3 {
        let m = next(&mut b, Duration::from_secs(10)).await;
        starts.entry(m.partition).or_insert(m.offset);
    }
    for (p, o) in starts {
        let want = if p == first.partition {
            first.offset + 1
        } else {
            0
        };
        assert_eq!(o, want, "b's first offset on partition {p}");
    }
    a.close().await;
    b.close().await;
}

/// Acks out of order: only the contiguous acked prefix is committed.
async fn out_of_order_acks_commit_only_the_contiguous_prefix() {
    let topic = new_topic("group-contiguous", 1).await;
    let group = common::unique_topic("group-contiguous-g");
    produce(&topic, 1, 0, 10).await;
    let mut reader = Reader::new(group_config(&group, &topic).commit_mode(CommitMode::Sync))
        .await
        .unwrap();
    let mut committer = reader.committer().unwrap();
    let mut msgs = Vec::new();
    for _ in 0..10 {
        msgs.push(next(&mut reader, Duration::from_secs(20)).await);
    }
    for i in [5, 3, 9, 1, 2] {
        committer.send(&msgs[i]).await.unwrap();
    }
    assert_eq!(committed(&group, &topic).await, BTreeMap::from([(0, -1)]));
    committer.send(&msgs[0]).await.unwrap(); // 0..=3 acked
    assert_eq!(committed(&group, &topic).await, BTreeMap::from([(0, 4)]));
    for i in [4, 6, 7, 8] {
        committer.send(&msgs[i]).await.unwrap();
    }
    assert_eq!(committed(&group, &topic).await, BTreeMap::from([(0, 10)]));
    // acking an old message again never moves the commit back
    committer.send(&msgs[2]).await.unwrap();
    assert_eq!(committed(&group, &topic).await, BTreeMap::from([(0, 10)]));
    reader.close().await;
}

/// A member dropped without close (no LeaveGroup, no final commit): after the session
/// timeout the other member reads its partitions from its last commit.
async fn crashed_member_partitions_move_after_the_session_timeout() {
    let topic = new_topic("group-crash", 4).await;
    let group = common::unique_topic("group-crash-g");
    produce(&topic, 4, 0, 100).await;
    let mut a = Reader::new(group_config(&group, &topic).session_timeout(Duration::from_secs(3)))
        .await
        .unwrap();
    let mut a_events = a.events().unwrap();
    let mut a_commit = a.committer().unwrap();
    next_event(&mut a_events, Duration::from_secs(20)).await;
    let mut b = Reader::new(group_config(&group, &topic).session_timeout(Duration::from_secs(3)))
        .await
        .unwrap();
    let mut b_events = b.events().unwrap();
    // a: revoked, then assigned half
    next_event(&mut a_events, Duration::from_secs(20)).await;
    let a_parts = match next_event(&mut a_events, Duration::from_secs(20)).await {
        GroupEvent::Assigned { partitions, .. } => partitions,
        other => panic!("{other:?}"),
    };
    assert_eq!(a_parts.len(), 2);
    // a processes and commits 10 messages, then crashes
    for _ in 0..10 {
        let m = next(&mut a, Duration::from_secs(10)).await;
        a_commit.feed(&m).await.unwrap();
    }
    a_commit.commit().await.unwrap();
    let at_crash = committed(&group, &topic).await;
    drop(a_commit);
    drop(a);
    let crashed = Instant::now();
    // b: assigned 2, then (after the session timeout) all 4
    loop {
        match next_event(&mut b_events, Duration::from_secs(20)).await {
            GroupEvent::Assigned { partitions, .. } if partitions.len() == 4 => break,
            _ => {}
        }
    }
    eprintln!("partitions moved {:?} after the crash", crashed.elapsed());
    let mut starts: HashMap<i32, i64> = HashMap::new();
    while starts.len() < 4 {
        let m = next(&mut b, Duration::from_secs(10)).await;
        starts.entry(m.partition).or_insert(m.offset);
    }
    for tp in a_parts {
        let c = at_crash[&tp.partition];
        assert_eq!(
            starts[&tp.partition],
            c.max(0),
            "{tp} resumes at a's commit"
        );
    }
    b.close().await;
}

/// A kafkapipe member (the leader: it joins first) and a librdkafka
/// member (python confluent-kafka, `partition.assignment.strategy=range`) share a group:
/// librdkafka's subscription is decoded by our assignor, our assignment bytes by
/// librdkafka; the partitions are split 3/3 and every message is processed at least once.
async fn shares_a_group_with_a_librdkafka_member() {
    let topic = new_topic("group-interop", 6).await;
    let group = common::unique_topic("group-interop-g");
    produce(&topic, 6, 0, 200).await;
    let mut k = Reader::new(group_config(&group, &topic)).await.unwrap();
    let mut events = k.events().unwrap();
    let mut committer = k.committer().unwrap();
    match next_event(&mut events, Duration::from_secs(20)).await {
        GroupEvent::Assigned { partitions, .. } => assert_eq!(partitions.len(), 6),
        other => panic!("{other:?}"),
    }
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    let script = format!(
        "{}/tests/interop/group_member.py",
        env!("CARGO_MANIFEST_DIR")
    );
    let child = tokio::process::Command::new(python)
        .args([
            &script,
            "--broker",
            &common::shared().addr,
            "--topic",
            &topic,
            "--group",
            &group,
            "--duration",
            "10",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("run group_member.py");
    let mut seen: HashMap<(i32, i64), u32> = HashMap::new();
    let mut mine = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    // read and ack until the librdkafka member has come and gone (k owns all 6 again)
    let mut phases = Vec::new();
    loop {
        assert!(Instant::now() < deadline, "phases so far: {phases:?}");
        tokio::select! {
            m = k.next_message() => {
                let m = m.unwrap();
                *seen.entry((m.partition, m.offset)).or_default() += 1;
                committer.feed(&m).await.unwrap();
            }
            e = events.next() => {
                if let GroupEvent::Assigned { partitions, .. } = e.unwrap() {
                    phases.push(partitions.len());
                    if partitions.len() == 3 {
                        mine = partitions;
                    } else if partitions.len() == 6 && !mine.is_empty() {
                        break;
                    }
                }
            }
        }
    }
    let out = child.wait_with_output().await.unwrap();
    assert!(
        out.status.success(),
        "librdkafka member failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("json line"))
        .collect();
    let theirs: Vec<i32> = lines
        .iter()
        .find_map(|l| l.get("assigned"))
        .map(|a| {
            a.as_array()
                .unwrap()
                .iter()
                .map(|p| p.as_i64().unwrap() as i32)
                .collect()
        })
        .expect("librdkafka was assigned partitions");
    let mine: Vec<i32> = mine.iter().map(|tp| tp.partition).collect();
    assert_eq!(
        theirs.len(),
        3,
        "range over 2 members: {theirs:?} / {mine:?}"
    );
    assert!(theirs.iter().all(|p| !mine.contains(p)));
    for l in &lines {
        if let (Some(p), Some(o)) = (l.get("partition"), l.get("offset")) {
            *seen
                .entry((p.as_i64().unwrap() as i32, o.as_i64().unwrap()))
                .or_default() += 1;
        }
    }
    // k reads the rest after the librdkafka member left
    produce(&topic, 6, 200, 10).await;
    while (0..6).any(|p| (0..210).any(|o| !seen.contains_key(&(p, o)))) {
        let m = next(&mut k, Duration::from_secs(10)).await;
        *seen.entry((m.partition, m.offset)).or_default() += 1;
        committer.feed(&m).await.unwrap();
    }
    k.close().await;
    let expected: BTreeMap<i32, i64> = (0..6).map(|p| (p, 210)).collect();
    assert_eq!(committed(&group, &topic).await, expected);
}

/// The other way round: a librdkafka member leads (it joins first) and runs its
/// `roundrobin` assignor; the kafkapipe member decodes librdkafka's assignment and reads
/// its partitions.
async fn follows_a_librdkafka_leader() {
    common::init_log();
    let topic = new_topic("group-interop-follow", 6).await;
    let group = common::unique_topic("group-interop-follow-g");
    produce(&topic, 6, 0, 50).await;
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    let script = format!(
        "{}/tests/interop/group_member.py",
        env!("CARGO_MANIFEST_DIR")
    );
    let mut child = tokio::process::Command::new(python)
        .args([
            &script,
            "--broker",
            &common::shared().addr,
            "--topic",
            &topic,
            "--group",
            &group,
            "--duration",
            "14",
            "--strategy",
            "roundrobin",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("run group_member.py");
    // wait until librdkafka owns the group
    let stdout = child.stdout.take().unwrap();
    let mut lines = tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(stdout));
    let mut theirs = Vec::new();
    let first = tokio::time::timeout(Duration::from_secs(20), lines.next_line())
        .await
        .expect("librdkafka joins in time")
        .unwrap()
        .unwrap();
    assert!(first.contains("assigned"), "{first}");
    let mut k = Reader::new(
        group_config(&group, &topic)
            .assignors(vec![Arc::new(kafkapipe::group::RoundRobinAssignor)]),
    )
    .await
    .unwrap();
    let mut events = k.events().unwrap();
    let mine = match next_event(&mut events, Duration::from_secs(20)).await {
        GroupEvent::Assigned { partitions, .. } => partitions,
        other => panic!("{other:?}"),
    };
    assert_eq!(mine.len(), 3, "{mine:?}");
    let mine: Vec<i32> = mine.iter().map(|tp| tp.partition).collect();
    // librdkafka may have consumed and committed everything so far: produce more
    produce(&topic, 6, 50, 50).await;
    let mut got: HashSet<(i32, i64)> = HashSet::new();
    while got.len() < 150 {
        let m = next(&mut k, Duration::from_secs(10)).await;
        assert!(mine.contains(&m.partition));
        got.insert((m.partition, m.offset));
    }
    k.close().await;
    // librdkafka's view: at some point it held exactly the other three
    while let Ok(Some(l)) = lines.next_line().await {
        let v: serde_json::Value = serde_json::from_str(&l).unwrap();
        if let Some(a) = v.get("assigned") {
            theirs.push(
                a.as_array()
                    .unwrap()
                    .iter()
                    .map(|p| p.as_i64().unwrap() as i32)
                    .collect::<Vec<i32>>(),
            );
        }
    }
    let status = child.wait().await.unwrap();
    assert!(status.success());
    let other: Vec<i32> = (0..6).filter(|p| !mine.contains(p)).collect();
    assert!(
        theirs.contains(&other),
        "librdkafka assignments {theirs:?}, ours {mine:?}"
    );
}

/// A static member (group instance id) does not leave the group on close, and a restart
/// with the same instance id gets its partitions back and resumes at its commits.
async fn static_member_stays_in_the_group_across_a_restart() {
    common::init_log();
    let topic = new_topic("group-static", 2).await;
    let group = common::unique_topic("group-static-g");
    produce(&topic, 2, 0, 20).await;
    let config = || group_config(&group, &topic).group_instance_id("instance-1");
    let mut a = Reader::new(config()).await.unwrap();
    let mut committer = a.committer().unwrap();
    for _ in 0..10 {
        let m = next(&mut a, Duration::from_secs(20)).await;
        committer.feed(&m).await.unwrap();
    }
    a.close().await;
    let admin = Admin::connect([common::shared().addr.clone()]).unwrap();
    let described = admin.describe_groups(&[&group]).await.unwrap();
    let d = described[0].1.as_ref().unwrap();
    assert_eq!(
        d.members.len(),
        1,
        "no LeaveGroup for a static member: {d:?}"
    );
    let at_close = committed(&group, &topic).await;
    assert_eq!(at_close.values().map(|o| o.max(&0)).sum::<i64>(), 10);

    let mut a = Reader::new(config().commit_mode(CommitMode::Sync))
        .await
        .unwrap();
    let mut events = a.events().unwrap();
    match next_event(&mut events, Duration::from_secs(20)).await {
        GroupEvent::Assigned { partitions, .. } => assert_eq!(partitions.len(), 2),
        other => panic!("{other:?}"),
    }
    let m = tokio::time::timeout(Duration::from_secs(10), a.read_message())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(m.offset, at_close[&m.partition].max(0));
    // read_message in sync mode: committed before it returns
    assert_eq!(committed(&group, &topic).await[&m.partition], m.offset + 1);
    a.close().await;
}

/// Group errors are yielded by the stream, not swallowed: a member sharing no assignor
/// with the group's members is refused with INCONSISTENT_GROUP_PROTOCOL. (A member
/// sharing *some* assignor is accepted, and Kafka switches the group to the common one:
/// see the mixed cooperative/eager scenario.)
async fn group_errors_surface_in_the_stream() {
    let topic = new_topic("group-errors", 1).await;
    let group = common::unique_topic("group-errors-g");
    let mut a = Reader::new(
        group_config(&group, &topic).assignors(vec![Arc::new(kafkapipe::group::RangeAssignor)]),
    )
    .await
    .unwrap();
    let mut a_events = a.events().unwrap();
    next_event(&mut a_events, Duration::from_secs(20)).await;
    let mut b = Reader::new(
        group_config(&group, &topic)
            .assignors(vec![Arc::new(kafkapipe::group::RoundRobinAssignor)]),
    )
    .await
    .unwrap();
    let err = tokio::time::timeout(Duration::from_secs(20), b.next_message())
        .await
        .expect("an error in time")
        .expect_err("no partitions for b");
    assert_eq!(
        err.kafka_code(),
        Some(kafkapipe::protocol::ErrorCode::InconsistentGroupProtocol),
        "{err}"
    );
    b.close().await;
    a.close().await;
}

/// A pipeline ending in `.forward(committer)`: closing the sink at the end of the stream
/// commits everything it was sent.
async fn pipeline_forwards_into_the_committer() {
    use futures::TryStreamExt;
    let topic = new_topic("group-forward", 3).await;
    let group = common::unique_topic("group-forward-g");
    produce(&topic, 3, 0, 10).await;
    let mut reader = Reader::new(
        group_config(&group, &topic).commit_mode(CommitMode::Interval(Duration::from_secs(60))),
    )
    .await
    .unwrap();
    let committer = reader.committer().unwrap();
    tokio::time::timeout(
        Duration::from_secs(20),
        (&mut reader)
            .take(30)
            .try_filter(|m| futures::future::ready(m.offset >= 0))
            .forward(committer),
    )
    .await
    .expect("30 messages in time")
    .unwrap();
    // the interval (60 s) never ticked: the sink's close committed
    let expected: BTreeMap<i32, i64> = (0..3).map(|p| (p, 10)).collect();
    assert_eq!(committed(&group, &topic).await, expected);
    reader.close().await;
}

type Events = Arc<Mutex<Vec<GroupEvent>>>;

/// Like `spawn_member`, also recording the reader's group events.
fn spawn_member_with_events(
    config: ReaderConfig,
    seen: Seen,
    events: Events,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut reader = Reader::new(config).await.unwrap();
        let mut committer = reader.committer().unwrap();
        let mut ev = reader.events().unwrap();
        loop {
            tokio::select! {
                _ = stop.changed() => break,
                Some(e) = ev.next() => events.lock().unwrap().push(e),
                m = reader.next_message() => match m {
                    Ok(m) => {
                        *seen.lock().unwrap().entry((m.partition, m.offset)).or_default() += 1;
                        committer.feed(&m).await.unwrap();
                    }
                    Err(e) => eprintln!("member error: {e}"),
                },
            }
        }
        reader.close().await;
    })
}

/// The partitions a member holds according to its events, and every partition it was
/// ever revoked or lost.
fn holding(events: &Events) -> (Vec<i32>, Vec<i32>, usize) {
    let mut held = std::collections::BTreeSet::new();
    let mut revoked = Vec::new();
    let mut lost = 0;
    for e in events.lock().unwrap().iter() {
        match e {
            GroupEvent::Assigned { partitions, .. } => {
                held.extend(partitions.iter().map(|tp| tp.partition))
            }
            GroupEvent::Revoked { partitions } => {
                for tp in partitions {
                    held.remove(&tp.partition);
                    revoked.push(tp.partition);
                }
            }
            GroupEvent::Lost { partitions } => {
                lost += partitions.len();
                for tp in partitions {
                    held.remove(&tp.partition);
                }
            }
        }
    }
    (held.into_iter().collect(), revoked, lost)
}

/// cooperative-sticky (KIP-429): a second member joins a one-member group while messages
/// flow. The first member is revoked only the partitions that move to the second one; its
/// other partitions keep flowing (never unassigned, so none of their messages is read
/// twice). Every message is processed, no commit regresses, commits end at the log end.
async fn cooperative_sticky_revokes_only_moving_partitions() {
    let topic = new_topic("group-coop", 6).await;
    let group = common::unique_topic("group-coop-g");
    produce(&topic, 6, 0, 1_000).await;
    let stop_producer = Arc::new(AtomicBool::new(false));
    let producer = spawn_producer(topic.clone(), 6, stop_producer.clone());
    let stop_watch = Arc::new(AtomicBool::new(false));
    let watcher = watch_commits(group.clone(), topic.clone(), stop_watch.clone());
    let config = || {
        group_config(&group, &topic)
            .commit_mode(CommitMode::Interval(Duration::from_millis(100)))
            .assignors(vec![Arc::new(kafkapipe::group::CooperativeStickyAssignor)])
    };
    let seen: [Seen; 2] = Default::default();
    let events: [Events; 2] = Default::default();
    let count = |i: usize| seen[i].lock().unwrap().len();
    let (stop_a, rx) = tokio::sync::watch::channel(false);
    let a = spawn_member_with_events(config(), seen[0].clone(), events[0].clone(), rx);
    wait_until("a's first messages", Duration::from_secs(20), || {
        count(0) >= 1_000
    })
    .await;
    assert_eq!(holding(&events[0]).0, vec![0, 1, 2, 3, 4, 5]);
    let (stop_b, rx) = tokio::sync::watch::channel(false);
    let b = spawn_member_with_events(config(), seen[1].clone(), events[1].clone(), rx);
    // measure: how much a processes while the rebalance goes on
    let (before, rebalance_start) = (count(0), Instant::now());
    wait_until("b's partitions", Duration::from_secs(20), || {
        holding(&events[1]).0.len() == 3 && holding(&events[0]).0.len() == 3
    })
    .await;
    eprintln!(
        "cooperative rebalance: a processed {} messages in the {:?} until b held its partitions",
        count(0) - before,
        rebalance_start.elapsed()
    );
    wait_until("b's first messages", Duration::from_secs(20), || {
        count(1) >= 100
    })
    .await;
    stop_producer.store(true, Ordering::SeqCst);
    let per = 1_000 + producer.await.unwrap();
    let all = |seen: &[Seen; 2]| {
        let mut all: HashMap<(i32, i64), u32> = HashMap::new();
        for s in seen {
            for (k, n) in s.lock().unwrap().iter() {
                *all.entry(*k).or_default() += n;
            }
        }
        all
    };
    wait_until("every message", Duration::from_secs(20), || {
        all(&seen).len() >= 6 * per
    })
    .await;
    stop_a.send(true).unwrap();
    stop_b.send(true).unwrap();
    a.await.unwrap();
    b.await.unwrap();
    stop_watch.store(true, Ordering::SeqCst);
    assert!(watcher.await.unwrap() > 0);

    let (kept, mut revoked, lost) = holding(&events[0]);
    let (taken, _, _) = holding(&events[1]);
    revoked.sort();
    assert_eq!(lost, 0);
    assert_eq!(kept.len(), 3);
    assert_eq!(revoked, taken, "a gave up exactly what b took");
    for p in &kept {
        assert!(!revoked.contains(p), "kept partition {p} was revoked");
    }
    // the kept partitions were never unassigned: each of their messages was read once
    let a_seen: Vec<((i32, i64), u32)> = seen[0]
        .lock()
        .unwrap()
        .iter()
        .map(|(k, n)| (*k, *n))
        .collect();
    for ((p, o), n) in a_seen {
        if kept.contains(&p) {
            assert_eq!(n, 1, "{p}@{o} of a kept partition read {n} times");
        }
    }
    let all = all(&seen);
    for p in 0..6 {
        for o in 0..per as i64 {
            assert!(all.contains_key(&(p, o)), "{p}@{o} never processed");
        }
    }
    let expected: BTreeMap<i32, i64> = (0..6).map(|p| (p, per as i64)).collect();
    assert_eq!(committed(&group, &topic).await, expected);
}

/// A member offering [cooperative-sticky, range] starts the group alone (the coordinator
/// picks cooperative-sticky), then range-only members join: the coordinator switches the
/// group to range, the common protocol, and from then on the member rebalances eagerly
/// (gives up all its partitions before rejoining), as the Java client does with mixed
/// assignors.
async fn mixed_cooperative_and_eager_members_fall_back_to_eager() {
    let topic = new_topic("group-coop-mixed", 4).await;
    let group = common::unique_topic("group-coop-mixed-g");
    produce(&topic, 4, 0, 100).await;
    let seen: [Seen; 3] = Default::default();
    let events: [Events; 3] = Default::default();
    let range =
        || group_config(&group, &topic).assignors(vec![Arc::new(kafkapipe::group::RangeAssignor)]);
    let (stop_a, rx) = tokio::sync::watch::channel(false);
    let a = spawn_member_with_events(
        group_config(&group, &topic).assignors(vec![
            Arc::new(kafkapipe::group::CooperativeStickyAssignor),
            Arc::new(kafkapipe::group::RangeAssignor),
        ]),
        seen[0].clone(),
        events[0].clone(),
        rx,
    );
    wait_until("a's partitions", Duration::from_secs(20), || {
        holding(&events[0]).0.len() == 4
    })
    .await;
    let (stop_b, rx) = tokio::sync::watch::channel(false);
    let b = spawn_member_with_events(range(), seen[1].clone(), events[1].clone(), rx);
    wait_until("the split", Duration::from_secs(20), || {
        holding(&events[0]).0.len() == 2 && holding(&events[1]).0.len() == 2
    })
    .await;
    let switched = events[0].lock().unwrap().len();
    // range: two contiguous halves
    let mut halves = [holding(&events[0]).0, holding(&events[1]).0];
    halves.sort();
    assert_eq!(halves, [vec![0, 1], vec![2, 3]]);
    // a third member joins: a revokes everything it holds (eager), not just what moves
    let (stop_c, rx) = tokio::sync::watch::channel(false);
    let c = spawn_member_with_events(range(), seen[2].clone(), events[2].clone(), rx);
    wait_until("three members", Duration::from_secs(20), || {
        let n: Vec<usize> = events.iter().map(|e| holding(e).0.len()).collect();
        n.iter().all(|&n| n >= 1) && n.iter().sum::<usize>() == 4
    })
    .await;
    let mut held = std::collections::BTreeSet::new();
    let mut revokes = 0;
    for (i, e) in events[0].lock().unwrap().iter().enumerate() {
        match e {
            GroupEvent::Assigned { partitions, .. } => {
                held.extend(partitions.iter().map(|tp| tp.partition))
            }
            GroupEvent::Revoked { partitions } | GroupEvent::Lost { partitions } => {
                let gone: std::collections::BTreeSet<i32> =
                    partitions.iter().map(|tp| tp.partition).collect();
                if i >= switched {
                    assert_eq!(gone, held, "an eager member gives up everything");
                    revokes += 1;
                }
                held.retain(|p| !gone.contains(p));
            }
        }
    }
    assert!(revokes >= 1);
    for stop in [stop_a, stop_b, stop_c] {
        stop.send(true).unwrap();
    }
    for m in [a, b, c] {
        m.await.unwrap();
    }
}

/// A group reader subscribed by regular expression picks up a matching topic created while
/// it runs (the partition watch sees it and rejoins) and reads it from the start. (Glob
/// patterns go through the same matching path; they are unit-tested.)
async fn pattern_subscription_picks_up_new_topics() {
    let prefix = common::unique_topic("group-pat");
    let first = format!("{prefix}-a");
    create_named(&first, 2).await;
    produce(&first, 2, 0, 10).await;
    let group = common::unique_topic("group-pat-g");
    let config = ReaderConfig::new([common::shared().addr.clone()])
        .group_id(&group)
        .topic_regex(format!("{prefix}-[a-z]"))
        .max_wait(Duration::from_millis(50))
        .session_timeout(Duration::from_secs(6))
        .heartbeat_interval(Duration::from_millis(300))
        .rebalance_timeout(Duration::from_secs(5))
        .join_backoff(Duration::from_millis(200))
        .partition_watch_interval(Duration::from_millis(500));
    let mut reader = Reader::new(config).await.unwrap();
    let mut events = reader.events().unwrap();
    match next_event(&mut events, Duration::from_secs(20)).await {
        GroupEvent::Assigned { partitions, .. } => {
            assert_eq!(
                partitions,
                vec![
                    TopicPartition::new(&first, 0),
                    TopicPartition::new(&first, 1)
                ]
            )
        }
        other => panic!("{other:?}"),
    }
    for _ in 0..20 {
        let m = next(&mut reader, Duration::from_secs(10)).await;
        assert_eq!(&*m.topic, first.as_str());
    }
    let second = format!("{prefix}-b");
    create_named(&second, 3).await;
    produce(&second, 3, 0, 10).await;
    // the unmatched topic is never subscribed
    create_named(&format!("{prefix}x-c"), 1).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    let assigned = loop {
        assert!(
            Instant::now() < deadline,
            "the new topic was never assigned"
        );
        if let GroupEvent::Assigned { partitions, .. } =
            next_event(&mut events, Duration::from_secs(20)).await
        {
            if partitions.iter().any(|tp| tp.topic == second) {
                break partitions;
            }
        }
    };
    assert_eq!(assigned.len(), 5, "{assigned:?}");
    let mut from_second = HashSet::new();
    while from_second.len() < 30 {
        let m = next(&mut reader, Duration::from_secs(10)).await;
        assert!(m.topic.starts_with(&prefix) && !m.topic.starts_with(&format!("{prefix}x")));
        if &*m.topic == second.as_str() {
            from_second.insert((m.partition, m.offset));
        }
    }
    reader.close().await;
}

/// The leader's partition watch: a subscribed topic grows from 1 to 3 partitions
/// (CreatePartitions); the leader notices the count change on its periodic metadata check
/// and rejoins, and the new partitions are assigned and read from their start.
async fn leader_watch_assigns_partitions_that_appear() {
    let topic = new_topic("group-watch", 1).await;
    produce(&topic, 1, 0, 10).await;
    let group = common::unique_topic("group-watch-g");
    let mut reader = Reader::new(
        group_config(&group, &topic).partition_watch_interval(Duration::from_millis(500)),
    )
    .await
    .unwrap();
    let mut events = reader.events().unwrap();
    match next_event(&mut events, Duration::from_secs(20)).await {
        GroupEvent::Assigned { partitions, .. } => {
            assert_eq!(partitions, vec![TopicPartition::new(&topic, 0)])
        }
        other => panic!("{other:?}"),
    }
    next(&mut reader, Duration::from_secs(10)).await;
    let admin = Admin::connect([common::shared().addr.clone()]).unwrap();
    admin
        .create_partitions(&[(topic.as_str(), 3)], false)
        .await
        .unwrap()
        .remove(0)
        .1
        .unwrap();
    {
        let conn = conn().await;
        common::wait_for_topic(&conn, &topic, 3).await;
        conn.close().await;
    }
    let conn = conn().await;
    for p in 1..3 {
        let records: Vec<Record> = (0..10)
            .map(|k| Record::new(format!("k{k}"), format!("{p}-{k}")))
            .collect();
        produce_retrying(&conn, &topic, p, &records).await;
    }
    conn.close().await;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        assert!(
            Instant::now() < deadline,
            "the new partitions were never assigned"
        );
        if let GroupEvent::Assigned { partitions, .. } =
            next_event(&mut events, Duration::from_secs(20)).await
        {
            if partitions.len() > 1 {
                assert_eq!(
                    partitions,
                    (0..3)
                        .map(|p| TopicPartition::new(&topic, p))
                        .collect::<Vec<_>>()
                );
                break;
            }
        }
    }
    let mut seen = HashSet::new();
    while seen.len() < 20 {
        let m = next(&mut reader, Duration::from_secs(10)).await;
        if m.partition > 0 {
            seen.insert((m.partition, m.offset));
        }
    }
    reader.close().await;
}

/// A KIP-848 (consumer protocol) group reader's config.
fn kip848_config(group: &str, topic: &str) -> ReaderConfig {
    group_config(group, topic)
        .group_protocol(kafkapipe::group::GroupProtocol::Consumer)
        .commit_mode(CommitMode::Interval(Duration::from_millis(100)))
}

/// KIP-848: one, then three, then two members over 12 partitions while a producer runs.
/// Every record is processed, no commit regresses, commits end at the log end. The
/// steady member `a` keeps processing through each reconciliation (measured: records
/// `a` processed while the others' partitions moved), and the partitions it keeps are
/// never revoked, so none of their records is read twice. A member that closes leaves
/// the group (epoch -1): its partitions move well within the broker's session timeout
/// (10 s in the test broker).
async fn kip848_one_three_two_members_over_12_partitions() {
    let topic = new_topic("kip848-flow", 12).await;
    let group = common::unique_topic("kip848-flow-g");
    produce(&topic, 12, 0, 500).await;
    let stop_producer = Arc::new(AtomicBool::new(false));
    let producer = spawn_producer(topic.clone(), 12, stop_producer.clone());
    let stop_watch = Arc::new(AtomicBool::new(false));
    let watcher = watch_commits(group.clone(), topic.clone(), stop_watch.clone());
    let seen: [Seen; 3] = Default::default();
    let events: [Events; 3] = Default::default();
    let count = |i: usize| seen[i].lock().unwrap().len();
    let held = |i: usize| holding(&events[i]).0.len();

    let (stop_a, rx) = tokio::sync::watch::channel(false);
    let a = spawn_member_with_events(
        kip848_config(&group, &topic),
        seen[0].clone(),
        events[0].clone(),
        rx,
    );
    wait_until("a's first messages", Duration::from_secs(30), || {
        count(0) >= 6_000
    })
    .await;
    assert_eq!(held(0), 12);

    // 1 -> 3
    let (before, started) = (count(0), Instant::now());
    let (stop_b, rx) = tokio::sync::watch::channel(false);
    let b = spawn_member_with_events(
        kip848_config(&group, &topic),
        seen[1].clone(),
        events[1].clone(),
        rx,
    );
    let (stop_c, rx) = tokio::sync::watch::channel(false);
    let c = spawn_member_with_events(
        kip848_config(&group, &topic),
        seen[2].clone(),
        events[2].clone(),
        rx,
    );
    wait_until("a 4/4/4 split", Duration::from_secs(30), || {
        held(0) == 4 && held(1) == 4 && held(2) == 4
    })
    .await;
    let grow = (count(0) - before, started.elapsed());
    eprintln!(
        "KIP-848 1->3 reconciliation: a processed {} records in {:?}",
        grow.0, grow.1
    );
    assert!(
        grow.0 > 0,
        "the steady member stopped during the reconciliation"
    );
    let kept: Vec<i32> = holding(&events[0]).0;
    wait_until("b and c processing", Duration::from_secs(20), || {
        count(1) >= 100 && count(2) >= 100
    })
    .await;

    // 3 -> 2: c closes and leaves (epoch -1)
    let (before, started) = (count(0), Instant::now());
    stop_c.send(true).unwrap();
    c.await.unwrap();
    let closed = started.elapsed();
    wait_until("c's partitions to move", Duration::from_secs(8), || {
        held(0) + held(1) == 12
    })
    .await;
    let shrink = (count(0) - before, started.elapsed());
    eprintln!(
        "KIP-848 3->2 reconciliation: c closed in {closed:?}, its partitions moved within {:?}; a processed {} records meanwhile",
        shrink.1, shrink.0
    );
    assert!(
        shrink.0 > 0,
        "the steady member stopped during the reconciliation"
    );
    assert!(
        shrink.1 < Duration::from_secs(8),
        "c's partitions waited for the session timeout: it did not leave"
    );

    stop_producer.store(true, Ordering::SeqCst);
    let per = 500 + producer.await.unwrap();
    let all = |seen: &[Seen; 3]| {
        let mut all: HashMap<(i32, i64), u32> = HashMap::new();
        for s in seen {
            for (k, n) in s.lock().unwrap().iter() {
                *all.entry(*k).or_default() += n;
            }
        }
        all
    };
    wait_until("every message", Duration::from_secs(30), || {
        all(&seen).len() >= 12 * per
    })
    .await;
    stop_a.send(true).unwrap();
    stop_b.send(true).unwrap();
    a.await.unwrap();
    b.await.unwrap();
    stop_watch.store(true, Ordering::SeqCst);
    assert!(watcher.await.unwrap() > 0);

    for (i, e) in events.iter().enumerate() {
        assert_eq!(holding(e).2, 0, "member {i} lost partitions");
    }
    let (_, revoked_a, _) = holding(&events[0]);
    for p in &kept {
        assert!(!revoked_a.contains(p), "kept partition {p} was revoked");
    }
    for ((p, o), n) in seen[0].lock().unwrap().iter() {
        if kept.contains(p) {
            assert_eq!(*n, 1, "{p}@{o} of a partition a kept was read {n} times");
        }
    }
    let all = all(&seen);
    for p in 0..12 {
        for o in 0..per as i64 {
            assert!(all.contains_key(&(p, o)), "{p}@{o} never processed");
        }
    }
    let expected: BTreeMap<i32, i64> = (0..12).map(|p| (p, per as i64)).collect();
    assert_eq!(committed(&group, &topic).await, expected);
}

/// KIP-848 regular-expression subscription, evaluated by the broker: a topic matching it
/// that is created after the member joined is assigned and read; one not matching is not.
async fn kip848_regex_subscription_picks_up_a_topic_created_later() {
    let prefix = common::unique_topic("kip848-re");
    let first = format!("{prefix}-a");
    create_named(&first, 2).await;
    produce(&first, 2, 0, 10).await;
    let group = common::unique_topic("kip848-re-g");
    let config = ReaderConfig::new([common::shared().addr.clone()])
        .group_id(&group)
        .group_protocol(kafkapipe::group::GroupProtocol::Consumer)
        .group_topic_regex(format!("{prefix}-[a-z]"))
        .max_wait(Duration::from_millis(50));
    let mut reader = Reader::new(config).await.unwrap();
    for _ in 0..20 {
        let m = next(&mut reader, Duration::from_secs(20)).await;
        assert_eq!(&*m.topic, first.as_str());
    }
    let second = format!("{prefix}-b");
    create_named(&second, 3).await;
    produce(&second, 3, 0, 10).await;
    create_named(&format!("{prefix}x-c"), 1).await;
    produce(&format!("{prefix}x-c"), 1, 0, 10).await;
    let started = Instant::now();
    let mut from_second = HashSet::new();
    while from_second.len() < 30 {
        let m = next(&mut reader, Duration::from_secs(40)).await;
        assert!(
            !m.topic.starts_with(&format!("{prefix}x")),
            "unmatched topic read"
        );
        if &*m.topic == second.as_str() {
            from_second.insert((m.partition, m.offset));
        }
    }
    eprintln!(
        "KIP-848 regex: the new topic was read {:?} after its creation",
        started.elapsed()
    );
    reader.close().await;
}

/// KIP-848: a member that crashes (dropped without close: no leave heartbeat) keeps its
/// partitions until the broker's session timeout (`group.consumer.session.timeout.ms`,
/// 10 s here); then they move to the other member, which resumes at the crashed
/// member's commits.
async fn kip848_crashed_member_partitions_move_after_the_session_timeout() {
    let topic = new_topic("kip848-crash", 4).await;
    let group = common::unique_topic("kip848-crash-g");
    produce(&topic, 4, 0, 100).await;
    let mut a = Reader::new(kip848_config(&group, &topic).commit_mode(CommitMode::Sync))
        .await
        .unwrap();
    let mut a_commit = a.committer().unwrap();
    let mut a_events = a.events().unwrap();
    next_event(&mut a_events, Duration::from_secs(20)).await;
    let b_events: Events = Default::default();
    let b_seen: Seen = Default::default();
    let (stop_b, rx) = tokio::sync::watch::channel(false);
    let b = spawn_member_with_events(
        kip848_config(&group, &topic),
        b_seen.clone(),
        b_events.clone(),
        rx,
    );
    wait_until("a 2/2 split", Duration::from_secs(20), || {
        holding(&b_events).0.len() == 2
    })
    .await;
    let b_first = holding(&b_events).0;
    // a processes and commits a few messages of its partitions, then crashes
    for _ in 0..10 {
        let m = next(&mut a, Duration::from_secs(10)).await;
        a_commit.feed(&m).await.unwrap();
    }
    a_commit.commit().await.unwrap();
    let at_crash = committed(&group, &topic).await;
    drop(a_commit);
    drop(a_events);
    drop(a);
    let crashed = Instant::now();
    wait_until("a's partitions to move", Duration::from_secs(30), || {
        holding(&b_events).0.len() == 4
    })
    .await;
    let moved = crashed.elapsed();
    eprintln!("KIP-848: a crashed member's partitions moved {moved:?} after the crash");
    assert!(
        moved >= Duration::from_secs(5),
        "moved before the session timeout: {moved:?}"
    );
    wait_until("b to read everything", Duration::from_secs(20), || {
        let seen = b_seen.lock().unwrap();
        (0..4).all(|p| seen.contains_key(&(p, 99)))
    })
    .await;
    stop_b.send(true).unwrap();
    b.await.unwrap();
    // b resumed each of a's partitions at a's commit
    for p in (0..4).filter(|p| !b_first.contains(p)) {
        let first = b_seen
            .lock()
            .unwrap()
            .keys()
            .filter(|(q, _)| *q == p)
            .map(|(_, o)| *o)
            .min();
        assert_eq!(
            first,
            Some(at_crash.get(&p).copied().unwrap_or(0).max(0)),
            "partition {p}"
        );
    }
    let expected: BTreeMap<i32, i64> = (0..4).map(|p| (p, 100)).collect();
    assert_eq!(committed(&group, &topic).await, expected);
}

/// KIP-848 static membership: a static member that closes leaves with epoch -2, so its
/// partitions wait for it; restarted within the session timeout it gets the same
/// partitions back and the other member sees no reassignment at all. A second reader
/// with the instance id of a live member is refused with UNRELEASED_INSTANCE_ID,
/// yielded by its stream with an explanation.
async fn kip848_static_member_restart_keeps_its_partitions() {
    let topic = new_topic("kip848-static", 4).await;
    let group = common::unique_topic("kip848-static-g");
    produce(&topic, 4, 0, 10).await;
    let x_events: Events = Default::default();
    let (stop_x, rx) = tokio::sync::watch::channel(false);
    let x = spawn_member_with_events(
        kip848_config(&group, &topic),
        Seen::default(),
        x_events.clone(),
        rx,
    );
    wait_until("x's partitions", Duration::from_secs(20), || {
        holding(&x_events).0.len() == 4
    })
    .await;
    let config = || kip848_config(&group, &topic).group_instance_id("static-1");
    let mut s = Reader::new(config()).await.unwrap();
    let mut s_events = s.events().unwrap();
    let first = match next_event(&mut s_events, Duration::from_secs(20)).await {
        GroupEvent::Assigned { partitions, .. } => partitions,
        other => panic!("{other:?}"),
    };
    wait_until("x to hand over", Duration::from_secs(20), || {
        holding(&x_events).0.len() == 2
    })
    .await;
    assert_eq!(first.len(), 2);

    // a second reader with the same instance id while s is alive
    let mut dup = Reader::new(config()).await.unwrap();
    let e = tokio::time::timeout(Duration::from_secs(20), dup.next_message())
        .await
        .expect("an error in time")
        .expect_err("refused");
    assert_eq!(
        e.kafka_code(),
        Some(kafkapipe::protocol::ErrorCode::UnreleasedInstanceId),
        "{e}"
    );
    assert!(e.to_string().contains("static-1"), "{e}");
    dup.close().await;

    let x_before = x_events.lock().unwrap().len();
    s.close().await;
    let mut s = Reader::new(config()).await.unwrap();
    let mut s_events = s.events().unwrap();
    let again = match next_event(&mut s_events, Duration::from_secs(20)).await {
        GroupEvent::Assigned { partitions, .. } => partitions,
        other => panic!("{other:?}"),
    };
    assert_eq!(
        again, first,
        "the restarted static member got other partitions"
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        x_events.lock().unwrap().len(),
        x_before,
        "the other member saw a reassignment: {:?}",
        &x_events.lock().unwrap()[x_before..]
    );
    s.close().await;
    stop_x.send(true).unwrap();
    x.await.unwrap();
}

/// KIP-848: an assignor the broker does not offer is refused with UNSUPPORTED_ASSIGNOR,
/// yielded by the stream with an explanation.
async fn kip848_unsupported_assignor_surfaces_in_the_stream() {
    let topic = new_topic("kip848-assignor", 1).await;
    let group = common::unique_topic("kip848-assignor-g");
    let mut r =
        Reader::new(kip848_config(&group, &topic).group_remote_assignor("no-such-assignor"))
            .await
            .unwrap();
    let e = tokio::time::timeout(Duration::from_secs(20), r.next_message())
        .await
        .expect("an error in time")
        .expect_err("refused");
    assert_eq!(
        e.kafka_code(),
        Some(kafkapipe::protocol::ErrorCode::UnsupportedAssignor),
        "{e}"
    );
    assert!(e.to_string().contains("no-such-assignor"), "{e}");
    r.close().await;
}

/// KIP-848 interop: a kafkapipe member and a librdkafka member (python confluent-kafka,
/// `group.protocol=consumer`) share a consumer-protocol group: the broker splits the 6
/// partitions 3/3, the kafkapipe member keeps its 3 flowing, gets the others back when
/// librdkafka leaves, and every record is processed and committed.
async fn kip848_shares_a_group_with_a_librdkafka_member() {
    let topic = new_topic("kip848-interop", 6).await;
    let group = common::unique_topic("kip848-interop-g");
    produce(&topic, 6, 0, 200).await;
    let mut k = Reader::new(kip848_config(&group, &topic)).await.unwrap();
    let mut events = k.events().unwrap();
    let mut committer = k.committer().unwrap();
    let log: Events = Default::default();
    match next_event(&mut events, Duration::from_secs(20)).await {
        e @ GroupEvent::Assigned { .. } => log.lock().unwrap().push(e),
        other => panic!("{other:?}"),
    }
    assert_eq!(holding(&log).0.len(), 6);
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    let script = format!(
        "{}/tests/interop/group_member.py",
        env!("CARGO_MANIFEST_DIR")
    );
    let child = tokio::process::Command::new(python)
        .args([
            &script,
            "--broker",
            &common::shared().addr,
            "--topic",
            &topic,
            "--group",
            &group,
            "--duration",
            "10",
            "--protocol",
            "consumer",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("run group_member.py");
    let mut seen: HashMap<(i32, i64), u32> = HashMap::new();
    let mut mine: Vec<i32> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        assert!(
            Instant::now() < deadline,
            "events so far: {:?}",
            log.lock().unwrap()
        );
        tokio::select! {
            m = k.next_message() => {
                let m = m.unwrap();
                *seen.entry((m.partition, m.offset)).or_default() += 1;
                committer.feed(&m).await.unwrap();
            }
            e = events.next() => {
                log.lock().unwrap().push(e.unwrap());
                let held = holding(&log).0;
                if held.len() == 3 {
                    mine = held;
                } else if held.len() == 6 && !mine.is_empty() {
                    break;
                }
            }
        }
    }
    let out = child.wait_with_output().await.unwrap();
    assert!(
        out.status.success(),
        "librdkafka member failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("json line"))
        .collect();
    let mut theirs: Vec<i32> = lines
        .iter()
        .filter_map(|l| l.get("assigned"))
        .flat_map(|a| {
            a.as_array()
                .unwrap()
                .iter()
                .map(|p| p.as_i64().unwrap() as i32)
                .collect::<Vec<_>>()
        })
        .collect();
    theirs.sort();
    theirs.dedup();
    assert_eq!(
        theirs.len(),
        3,
        "uniform over 2 members: {theirs:?} / {mine:?}"
    );
    assert!(
        theirs.iter().all(|p| !mine.contains(p)),
        "{theirs:?} / {mine:?}"
    );
    let (_, _, lost) = holding(&log);
    assert_eq!(lost, 0);
    for l in &lines {
        if let (Some(p), Some(o)) = (l.get("partition"), l.get("offset")) {
            *seen
                .entry((p.as_i64().unwrap() as i32, o.as_i64().unwrap()))
                .or_default() += 1;
        }
    }
    // the partitions k kept were never revoked: each of their records was read once
    for ((p, o), n) in &seen {
        if mine.contains(p) {
            assert_eq!(*n, 1, "{p}@{o} of a kept partition read {n} times");
        }
    }
    produce(&topic, 6, 200, 10).await;
    while (0..6).any(|p| (0..210).any(|o| !seen.contains_key(&(p, o)))) {
        let m = next(&mut k, Duration::from_secs(10)).await;
        *seen.entry((m.partition, m.offset)).or_default() += 1;
        committer.feed(&m).await.unwrap();
    }
    k.close().await;
    let expected: BTreeMap<i32, i64> = (0..6).map(|p| (p, 210)).collect();
    assert_eq!(committed(&group, &topic).await, expected);
}

/// What [`rebalance_pause`] measured.
#[derive(Debug, Clone, Copy)]
struct Pause {
    /// How long a owned no partition (eager: between giving up everything and the new
    /// assignment).
    idle: Duration,
    /// a's longest gap between two processed records in the 2 s before b started.
    baseline_gap: Duration,
    /// a's longest gap from b's start until 1 s after the group settled.
    gap: Duration,
    /// From b's start until both held 6 partitions.
    settled: Duration,
    /// From b's start until b processed a record.
    b_first: Duration,
    /// a's records per second in the 2 s before b started, and until settled.
    rate_before: f64,
    rate_during: f64,
}

/// One member `a` reads 12 partitions under a continuous producer; a second member `b`
/// joins. Measures a's pauses and throughput before and during the rebalance.
async fn rebalance_pause(kind: &str, config: impl Fn(&str, &str) -> ReaderConfig) -> Pause {
    let topic = new_topic(&format!("pause-{kind}"), 12).await;
    let group = common::unique_topic(&format!("pause-{kind}-g"));
    produce(&topic, 12, 0, 100).await;
    let stop_producer = Arc::new(AtomicBool::new(false));
    let producer = spawn_producer(topic.clone(), 12, stop_producer.clone());
    let a_times: Arc<Mutex<Vec<Instant>>> = Default::default();
    let a_events: Events = Default::default();
    // a's partition count after each of its group events, when it came
    let a_held: Arc<Mutex<Vec<(Instant, usize)>>> = Default::default();
    let (stop_a, mut rx) = tokio::sync::watch::channel(false);
    let a = {
        let (config, times, events, held_log) = (
            config(&group, &topic),
            a_times.clone(),
            a_events.clone(),
            a_held.clone(),
        );
        tokio::spawn(async move {
            let mut reader = Reader::new(config).await.unwrap();
            let mut committer = reader.committer().unwrap();
            let mut ev = reader.events().unwrap();
            loop {
                tokio::select! {
                    _ = rx.changed() => break,
                    Some(e) = ev.next() => {
                        events.lock().unwrap().push(e);
                        let held = holding(&events).0.len();
                        held_log.lock().unwrap().push((Instant::now(), held));
                    }
                    m = reader.next_message() => {
                        let m = m.unwrap();
                        times.lock().unwrap().push(Instant::now());
                        committer.feed(&m).await.unwrap();
                    }
                }
            }
            reader.close().await;
        })
    };
    wait_until("a's first records", Duration::from_secs(30), || {
        a_times.lock().unwrap().len() >= 1_200
    })
    .await;
    // the baseline window
    tokio::time::sleep(Duration::from_secs(2)).await;
    let b_seen: Seen = Default::default();
    let b_events: Events = Default::default();
    let (stop_b, rx) = tokio::sync::watch::channel(false);
    let started = Instant::now();
    let b = spawn_member_with_events(config(&group, &topic), b_seen.clone(), b_events.clone(), rx);
    wait_until("a 6/6 split", Duration::from_secs(30), || {
        holding(&a_events).0.len() == 6 && holding(&b_events).0.len() == 6
    })
    .await;
    let settled = started.elapsed();
    wait_until("b's first record", Duration::from_secs(30), || {
        !b_seen.lock().unwrap().is_empty()
    })
    .await;
    let b_first = started.elapsed();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let end = Instant::now();
    let times = a_times.lock().unwrap().clone();
    let longest_gap = |from: Instant, to: Instant| {
        let mut last = times
            .iter()
            .rev()
            .find(|t| **t <= from)
            .copied()
            .unwrap_or(from);
        let mut gap = Duration::ZERO;
        for t in times.iter().filter(|t| **t > from && **t <= to) {
            gap = gap.max(t.duration_since(last));
            last = *t;
        }
        gap.max(to.duration_since(last))
    };
    let count =
        |from: Instant, to: Instant| times.iter().filter(|t| **t > from && **t <= to).count();
    let before = started - Duration::from_secs(2);
    let settled_at = started + settled;
    // how long a owned no partition at all during the rebalance
    let mut idle = Duration::ZERO;
    let mut idle_since: Option<Instant> = None;
    for (t, held) in a_held.lock().unwrap().iter().filter(|(t, _)| *t > started) {
        match (held, idle_since) {
            (0, None) => idle_since = Some(*t),
            (n, Some(since)) if *n > 0 => {
                idle += t.duration_since(since);
                idle_since = None;
            }
            _ => {}
        }
    }
    let pause = Pause {
        idle,
        baseline_gap: longest_gap(before, started),
        gap: longest_gap(started, end),
        settled,
        b_first,
        rate_before: count(before, started) as f64 / 2.0,
        rate_during: count(started, settled_at) as f64 / settled.as_secs_f64().max(0.001),
    };
    stop_producer.store(true, Ordering::SeqCst);
    producer.await.unwrap();
    stop_a.send(true).unwrap();
    stop_b.send(true).unwrap();
    a.await.unwrap();
    b.await.unwrap();
    pause
}

/// The rebalance pause of the three protocols on one workload (12 partitions, a
/// producer adding 50 records a partition every ~50 ms, a second member joining a
/// one-member group): classic eager (range), classic cooperative-sticky (KIP-429) and
/// KIP-848. Run one after the other; printed for the notes. The protocols' own timings
/// differ: the classic members heartbeat every 300 ms, KIP-848 members at the broker's
/// `group.consumer.heartbeat.interval.ms` (1 s here).
async fn rebalance_pause_comparison() {
    let mut rows = Vec::new();
    let eager = rebalance_pause("eager", |g, t| {
        group_config(g, t).commit_mode(CommitMode::Interval(Duration::from_millis(100)))
    })
    .await;
    rows.push(("classic eager (range)", eager));
    let coop = rebalance_pause("coop", |g, t| {
        group_config(g, t)
            .commit_mode(CommitMode::Interval(Duration::from_millis(100)))
            .assignors(vec![Arc::new(kafkapipe::group::CooperativeStickyAssignor)])
    })
    .await;
    rows.push(("classic cooperative-sticky", coop));
    let kip848 = rebalance_pause("kip848", kip848_config).await;
    rows.push(("KIP-848 consumer (uniform)", kip848));
    for (name, p) in &rows {
        eprintln!(
            "rebalance pause | {name:<28} | a owned nothing for {:>9.3?} | a's longest pause {:>9.3?} (baseline {:>9.3?}) | settled in {:>9.3?} | b's first record {:>9.3?} | a's rate {:>6.0}/s during, {:>6.0}/s before",
            p.idle,
            p.gap, p.baseline_gap, p.settled, p.b_first, p.rate_during, p.rate_before
        );
    }
    // the incremental protocols keep a reading while the group rebalances. The eager one
    // revokes everything: a may process nothing in a rebalance shorter than its usual
    // gap between records (50 ms against 70 ms happened), so it is not held to this.
    for (name, p) in [
        ("classic cooperative-sticky", &coop),
        ("KIP-848 consumer (uniform)", &kip848),
    ] {
        assert!(
            p.rate_during > 0.0,
            "{name}: a processed nothing while the group rebalanced: {rows:?}"
        );
    }
    // the incremental protocols never take every partition from the member that keeps
    // some; the eager one does
    assert_eq!(coop.idle, Duration::ZERO, "{rows:?}");
    assert_eq!(kip848.idle, Duration::ZERO, "{rows:?}");
    assert!(eager.idle > Duration::ZERO, "{rows:?}");
}

/// A stage for the pre-revoke hook scenarios: buffers every message `reader` yields
/// (holding their tokens) and acks them all only when the hook asks it to flush — never
/// at the end of the stream. Returns the reader's handle, the hook and how many
/// messages the stage buffered so far.
#[allow(clippy::type_complexity)]
fn buffering_stage(
    config: ReaderConfig,
) -> (
    ReaderConfig,
    impl FnOnce(
        Reader,
    ) -> (
        Arc<std::sync::atomic::AtomicUsize>,
        tokio::task::JoinHandle<()>,
    ),
) {
    use tokio::sync::{mpsc, oneshot};
    let (flush_tx, mut flush_rx) = mpsc::channel::<oneshot::Sender<()>>(1);
    let config = config.on_revoke(move |_partitions: Vec<TopicPartition>| {
        let flush_tx = flush_tx.clone();
        async move {
            let (done, flushed) = oneshot::channel();
            if flush_tx.send(done).await.is_ok() {
                let _ = flushed.await;
            }
        }
    });
    let start = move |mut reader: Reader| {
        let buffered = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let count = buffered.clone();
        let task = tokio::spawn(async move {
            let mut buf: Vec<Message> = Vec::new();
            let mut open = true;
            loop {
                tokio::select! {
                    m = reader.next(), if open => match m {
                        Some(Ok(m)) => {
                            buf.push(m);
                            count.fetch_add(1, Ordering::SeqCst);
                        }
                        Some(Err(e)) => panic!("reader error: {e}"),
                        None => open = false,
                    },
                    done = flush_rx.recv() => {
                        let Some(done) = done else { return };
                        for mut m in buf.drain(..) {
                            m.take_ack_token().ack();
                        }
                        let _ = done.send(());
                    }
                }
            }
        });
        (buffered, task)
    };
    (config, start)
}

/// Issue 26 item 7a: a kafkapipe member whose stage buffers 100 messages (2 partitions
/// of 50) shares a classic group with a librdkafka member that joins. The pre-revoke
/// hook makes the stage flush, so the group's committed offsets cover the 100 messages
/// before the partitions are given up, and the librdkafka member never receives them.
async fn revoke_hook_flushes_before_a_librdkafka_member_takes_over() {
    let topic = new_topic("group-revoke-hook", 2).await;
    let group = common::unique_topic("group-revoke-hook-g");
    produce(&topic, 2, 0, 50).await;
    let (config, start) = buffering_stage(group_config(&group, &topic));
    let k = Reader::new(config).await.unwrap();
    let handle = k.handle();
    let mut events = k.events().unwrap();
    let (buffered, stage) = start(k);
    wait_until(
        "the stage to buffer 100 messages",
        Duration::from_secs(20),
        || buffered.load(Ordering::SeqCst) == 100,
    )
    .await;
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    let script = format!(
        "{}/tests/interop/group_member.py",
        env!("CARGO_MANIFEST_DIR")
    );
    let child = tokio::process::Command::new(python)
        .args([
            &script,
            "--broker",
            &common::shared().addr,
            "--topic",
            &topic,
            "--group",
            &group,
            "--duration",
            "8",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("run group_member.py");
    let revoked = loop {
        match next_event(&mut events, Duration::from_secs(20)).await {
            GroupEvent::Revoked { partitions } => break partitions,
            GroupEvent::Assigned { .. } => {}
            other => panic!("{other:?}"),
        }
    };
    assert_eq!(revoked.len(), 2, "eager: everything is revoked");
    let expected: BTreeMap<i32, i64> = [(0, 50), (1, 50)].into();
    assert_eq!(
        committed(&group, &topic).await,
        expected,
        "the flushed messages are committed before the partitions are given up"
    );
    // one more message per partition, for whoever owns it next
    produce(&topic, 2, 50, 1).await;
    let out = child.wait_with_output().await.unwrap();
    assert!(
        out.status.success(),
        "librdkafka member failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let read: Vec<(i64, i64)> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).expect("json line"))
        .filter_map(|l| Some((l.get("partition")?.as_i64()?, l.get("offset")?.as_i64()?)))
        .collect();
    assert!(
        !read.is_empty(),
        "the librdkafka member read its partition's new message"
    );
    assert!(
        read.iter().all(|(_, o)| *o >= 50),
        "the librdkafka member read flushed messages again: {read:?}"
    );
    handle.close().await;
    stage.abort();
}

/// The same with the KIP-848 protocol and kafkapipe members: the hook runs in the
/// reconciliation's revocation (the shared `give_up`), before its commit.
async fn kip848_revoke_hook_flushes_before_the_partitions_move() {
    let topic = new_topic("kip848-revoke-hook", 2).await;
    let group = common::unique_topic("kip848-revoke-hook-g");
    produce(&topic, 2, 0, 50).await;
    let (config, start) = buffering_stage(
        kip848_config(&group, &topic).commit_mode(CommitMode::Interval(Duration::from_secs(3600))),
    );
    let a = Reader::new(config).await.unwrap();
    let handle = a.handle();
    let mut events = a.events().unwrap();
    let (buffered, stage) = start(a);
    wait_until(
        "the stage to buffer 100 messages",
        Duration::from_secs(20),
        || buffered.load(Ordering::SeqCst) == 100,
    )
    .await;
    let mut b = Reader::new(kip848_config(&group, &topic)).await.unwrap();
    let revoked = loop {
        match next_event(&mut events, Duration::from_secs(30)).await {
            GroupEvent::Revoked { partitions } => break partitions,
            GroupEvent::Assigned { .. } => {}
            other => panic!("{other:?}"),
        }
    };
    assert_eq!(revoked.len(), 1, "one of the two partitions moves");
    let p = revoked[0].partition;
    assert_eq!(
        committed(&group, &topic).await.get(&p),
        Some(&50),
        "the flushed messages of {p} are committed before it is given up"
    );
    produce(&topic, 2, 50, 1).await;
    let m = next(&mut b, Duration::from_secs(30)).await;
    assert_eq!(
        (m.partition, m.offset),
        (p, 50),
        "the new owner starts after the flushed messages"
    );
    b.close().await;
    handle.close().await;
    stage.abort();
}

/// The scenarios above, all at once: they mostly wait on the broker (session timeouts,
/// rebalances), and the test harness would run only as many
/// tests at a time as there are CPUs. Each runs in its own task on its own topic and
/// group; every failure is reported by name.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn group_scenarios() {
    common::init_log();
    type Scenario = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;
    let scenarios: Vec<(&str, Scenario)> = vec![
        (
            "single_member_commits_on_close_and_restarts_from_commit",
            Box::pin(single_member_commits_on_close_and_restarts_from_commit()),
        ),
        (
            "members_join_and_leave_while_messages_flow",
            Box::pin(members_join_and_leave_while_messages_flow()),
        ),
        (
            "rebalance_drops_buffered_messages_of_revoked_partitions",
            Box::pin(rebalance_drops_buffered_messages_of_revoked_partitions()),
        ),
        (
            "out_of_order_acks_commit_only_the_contiguous_prefix",
            Box::pin(out_of_order_acks_commit_only_the_contiguous_prefix()),
        ),
        (
            "crashed_member_partitions_move_after_the_session_timeout",
            Box::pin(crashed_member_partitions_move_after_the_session_timeout()),
        ),
        (
            "shares_a_group_with_a_librdkafka_member",
            Box::pin(shares_a_group_with_a_librdkafka_member()),
        ),
        (
            "follows_a_librdkafka_leader",
            Box::pin(follows_a_librdkafka_leader()),
        ),
        (
            "static_member_stays_in_the_group_across_a_restart",
            Box::pin(static_member_stays_in_the_group_across_a_restart()),
        ),
        (
            "group_errors_surface_in_the_stream",
            Box::pin(group_errors_surface_in_the_stream()),
        ),
        (
            "pipeline_forwards_into_the_committer",
            Box::pin(pipeline_forwards_into_the_committer()),
        ),
        (
            "cooperative_sticky_revokes_only_moving_partitions",
            Box::pin(cooperative_sticky_revokes_only_moving_partitions()),
        ),
        (
            "pattern_subscription_picks_up_new_topics",
            Box::pin(pattern_subscription_picks_up_new_topics()),
        ),
        (
            "leader_watch_assigns_partitions_that_appear",
            Box::pin(leader_watch_assigns_partitions_that_appear()),
        ),
        (
            "mixed_cooperative_and_eager_members_fall_back_to_eager",
            Box::pin(mixed_cooperative_and_eager_members_fall_back_to_eager()),
        ),
        (
            "kip848_one_three_two_members_over_12_partitions",
            Box::pin(kip848_one_three_two_members_over_12_partitions()),
        ),
        (
            "kip848_regex_subscription_picks_up_a_topic_created_later",
            Box::pin(kip848_regex_subscription_picks_up_a_topic_created_later()),
        ),
        (
            "kip848_crashed_member_partitions_move_after_the_session_timeout",
            Box::pin(kip848_crashed_member_partitions_move_after_the_session_timeout()),
        ),
        (
            "kip848_static_member_restart_keeps_its_partitions",
            Box::pin(kip848_static_member_restart_keeps_its_partitions()),
        ),
        (
            "kip848_shares_a_group_with_a_librdkafka_member",
            Box::pin(kip848_shares_a_group_with_a_librdkafka_member()),
        ),
        (
            "rebalance_pause_comparison",
            Box::pin(rebalance_pause_comparison()),
        ),
        (
            "revoke_hook_flushes_before_a_librdkafka_member_takes_over",
            Box::pin(revoke_hook_flushes_before_a_librdkafka_member_takes_over()),
        ),
        (
            "kip848_revoke_hook_flushes_before_the_partitions_move",
            Box::pin(kip848_revoke_hook_flushes_before_the_partitions_move()),
        ),
        (
            "kip848_unsupported_assignor_surfaces_in_the_stream",
            Box::pin(kip848_unsupported_assignor_surfaces_in_the_stream()),
        ),
    ];
    // KAFKAPIPE_SCENARIO=substring: run only the matching scenarios.
    let only = std::env::var("KAFKAPIPE_SCENARIO").unwrap_or_default();
    let scenarios: Vec<(&str, Scenario)> = scenarios
        .into_iter()
        .filter(|(name, _)| name.contains(only.as_str()))
        .collect();
    let started = Instant::now();
    warm_up_coordinator().await;
    eprintln!("coordinator warm in {:?}", started.elapsed());
    let tasks: Vec<_> = scenarios
        .into_iter()
        .map(|(name, f)| {
            (
                name,
                tokio::spawn(async move {
                    let t = Instant::now();
                    f.await;
                    t.elapsed()
                }),
            )
        })
        .collect();
    let mut failed = Vec::new();
    for (name, task) in tasks {
        match task.await {
            Ok(took) => eprintln!("{name}: ok in {took:?}"),
            Err(e) => {
                let msg = e.try_into_panic().ok().and_then(|p| {
                    p.downcast_ref::<String>()
                        .cloned()
                        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                });
                eprintln!("{name}: FAILED: {msg:?}");
                failed.push(name);
            }
        }
    }
    eprintln!("all scenarios in {:?}", started.elapsed());
    assert!(failed.is_empty(), "failed scenarios: {failed:?}");
}
