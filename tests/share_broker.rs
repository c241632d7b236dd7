//! Share groups (KIP-932) against Apache Kafka 4.4 (the shared single-node test broker):
//! the `ShareReader` consumes and accepts, a released record comes back with delivery
//! count 2, a rejected one never comes back, and eight members on two partitions all get
//! work.
//!
//! A share group starts at the log end unless the GROUP config
//! `share.auto.offset.reset=earliest` is set (IncrementalAlterConfigs on a GROUP
//! resource): every test sets it before its members join, then produces.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use kafkapipe::admin::{Admin, AlterConfigOp, ConfigResource};
use kafkapipe::cluster::Cluster;
use kafkapipe::conn::{Conn, ConnectionConfig, ProduceOptions};
use kafkapipe::reader::Message;
use kafkapipe::record::Record;
use kafkapipe::share::{ShareReader, ShareReaderConfig};

const DEADLINE: Duration = Duration::from_secs(60);

async fn conn() -> Conn {
    Conn::connect(&common::shared().addr).await.unwrap()
}

fn admin() -> Admin {
    Admin::new(Cluster::new([common::shared().addr.clone()], ConnectionConfig::default()).unwrap())
}

async fn new_topic(prefix: &str, partitions: i32) -> String {
    let topic = common::unique_topic(prefix);
    let conn = conn().await;
    conn.create_topic(&topic, partitions, 1).await.unwrap();
    common::wait_for_topic(&conn, &topic, partitions).await;
    conn.close().await;
    topic
}

/// Set the share group's configs (before any member joins): start at the earliest
/// offset, and `extra`.
async fn configure_group(group: &str, extra: &[(&str, &str)]) {
    let mut ops = vec![AlterConfigOp::Set(
        "share.auto.offset.reset".into(),
        "earliest".into(),
    )];
    for (k, v) in extra {
        ops.push(AlterConfigOp::Set((*k).into(), (*v).into()));
    }
    let admin = admin();
    for (_, r) in admin
        .incremental_alter_configs(&[(ConfigResource::group(group), ops)], false)
        .await
        .unwrap()
    {
        r.unwrap();
    }
    admin.close().await;
}

async fn produce(topic: &str, partition: i32, values: impl IntoIterator<Item = String>) {
    let conn = conn().await;
    let records: Vec<Record> = values
        .into_iter()
        .map(|v| Record::new(Vec::<u8>::new(), v))
        .collect();
    for chunk in records.chunks(500) {
        conn.produce(topic, partition, chunk, &ProduceOptions::default())
            .await
            .unwrap();
    }
    conn.close().await;
}

fn config(group: &str, topic: &str) -> ShareReaderConfig {
    ShareReaderConfig::new([common::shared().addr.clone()], group)
        .topic(topic)
        .max_wait(Duration::from_millis(200))
        .close_timeout(Duration::from_secs(5))
}

async fn next(r: &mut ShareReader, what: &str) -> Message {
    match tokio::time::timeout(DEADLINE, r.next()).await {
        Ok(Some(Ok(m))) => m,
        Ok(Some(Err(e))) => panic!("{what}: {e}"),
        Ok(None) => panic!("{what}: the stream ended"),
        Err(_) => panic!(
            "{what}: nothing within {DEADLINE:?} (stats {:?})",
            r.stats()
        ),
    }
}

/// Wait until the reader's counters satisfy `cond` (acknowledgements are sent with the
/// reader's next request).
async fn wait_stats(r: &ShareReader, cond: impl Fn(&kafkapipe::share::ShareStats) -> bool) {
    let deadline = Instant::now() + DEADLINE;
    loop {
        let s = r.stats();
        if cond(&s) {
            return;
        }
        assert!(Instant::now() < deadline, "{s:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn value(m: &Message) -> String {
    String::from_utf8_lossy(m.value.as_deref().unwrap_or_default()).into_owned()
}

/// A fresh member reads until it has seen `marker`: what it saw before the marker is
/// what the group still had to deliver.
async fn read_until_marker(group: &str, topic: &str, marker: &str) -> Vec<String> {
    produce(topic, 0, [marker.to_string()]).await;
    let mut r = ShareReader::new(config(group, topic)).await.unwrap();
    let mut seen = Vec::new();
    loop {
        let m = next(&mut r, "until the marker").await;
        let v = value(&m);
        if v == marker {
            break;
        }
        seen.push(v);
    }
    r.close().await.unwrap();
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn share_consume_and_accept() {
    common::init_log();
    let topic = new_topic("share-accept", 1).await;
    let group = format!("{topic}-g");
    configure_group(&group, &[]).await;
    produce(&topic, 0, (0..20).map(|i| format!("v{i}"))).await;

    let mut r = ShareReader::new(config(&group, &topic)).await.unwrap();
    let mut got = BTreeSet::new();
    while got.len() < 20 {
        let m = next(&mut r, "20 records").await;
        assert_eq!(
            m.delivery_count(),
            Some(1),
            "first delivery of {}",
            m.offset
        );
        assert_eq!(&*m.topic, topic.as_str());
        got.insert(value(&m));
        // dropped: ACCEPT once the reader is polled again
    }
    assert_eq!(got, (0..20).map(|i| format!("v{i}")).collect());
    r.close().await.unwrap();

    // all accepted: a new member gets only what is produced afterwards
    let rest = read_until_marker(&group, &topic, "marker").await;
    assert!(rest.is_empty(), "redelivered after accepting: {rest:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn share_release_redelivers_with_count_two() {
    common::init_log();
    let topic = new_topic("share-release", 1).await;
    let group = format!("{topic}-g");
    configure_group(&group, &[]).await;
    produce(&topic, 0, (0..3).map(|i| format!("v{i}"))).await;

    let mut r = ShareReader::new(config(&group, &topic).max_records(1).max_in_flight(1))
        .await
        .unwrap();
    let mut first = next(&mut r, "first delivery").await;
    assert_eq!(first.delivery_count(), Some(1));
    let offset = first.offset;
    first.take_ack_token().release();
    // the released record comes back (this is the only member), delivery count 2
    let deadline = Instant::now() + DEADLINE;
    let mut seen = BTreeSet::from([offset]);
    let again = loop {
        assert!(Instant::now() < deadline, "released record not redelivered");
        let m = next(&mut r, "redelivery").await;
        if m.offset == offset {
            break m;
        }
        assert_eq!(m.delivery_count(), Some(1));
        seen.insert(m.offset);
    };
    assert_eq!(
        again.delivery_count(),
        Some(2),
        "a released record is delivered again"
    );
    drop(again);
    // accept the rest
    while seen.len() < 3 {
        let m = next(&mut r, "the rest").await;
        seen.insert(m.offset);
    }
    wait_stats(&r, |s| s.released >= 1).await;
    r.close().await.unwrap();
    let rest = read_until_marker(&group, &topic, "marker").await;
    assert!(rest.is_empty(), "redelivered after accepting: {rest:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn share_reject_is_never_redelivered() {
    common::init_log();
    let topic = new_topic("share-reject", 1).await;
    let group = format!("{topic}-g");
    configure_group(&group, &[]).await;
    produce(
        &topic,
        0,
        ["poison".to_string(), "ok1".into(), "ok2".into()],
    )
    .await;

    let mut r = ShareReader::new(config(&group, &topic)).await.unwrap();
    let mut seen = Vec::new();
    while seen.len() < 3 {
        let mut m = next(&mut r, "3 records").await;
        let v = value(&m);
        if v == "poison" {
            m.take_ack_token().reject();
        } else {
            m.take_ack_token().ack();
        }
        seen.push(v);
    }
    // the acknowledgements go with the next request: wait until they are answered
    wait_stats(&r, |s| s.rejected == 1 && s.accepted == 2).await;
    r.close().await.unwrap();
    let rest = read_until_marker(&group, &topic, "marker").await;
    assert!(
        rest.is_empty(),
        "rejected or accepted records came back: {rest:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn share_eight_members_on_two_partitions_all_get_work() {
    common::init_log();
    let topic = new_topic("share-eight", 2).await;
    let group = format!("{topic}-g");
    configure_group(&group, &[]).await;
    const N: usize = 400;
    // members join first, then the records come: each member holds few records at once
    // and takes a moment per record, so the work spreads
    let seen: Arc<Mutex<BTreeMap<usize, Vec<String>>>> = Arc::default();
    let total = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut members = Vec::new();
    for id in 0..8 {
        let cfg = config(&group, &topic).max_records(2).max_in_flight(2);
        let (seen, total, mut stop) = (seen.clone(), total.clone(), stop_rx.clone());
        members.push(tokio::spawn(async move {
            let mut r = ShareReader::new(cfg).await.unwrap();
            loop {
                tokio::select! {
                    _ = stop.changed() => break,
                    m = r.next() => {
                        let m = m.expect("stream ended").expect("share reader failed");
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        seen.lock().unwrap().entry(id).or_default().push(value(&m));
                        total.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    }
                }
            }
            r.close().await.unwrap();
        }));
    }
    // wait until every member is in the group with an assignment before producing
    let deadline = Instant::now() + DEADLINE;
    loop {
        let d = admin()
            .describe_share_groups(&[group.as_str()])
            .await
            .unwrap();
        let members = d
            .into_iter()
            .next()
            .and_then(|(_, g)| g.ok())
            .map_or(0, |g| {
                g.members
                    .iter()
                    .filter(|m| !m.assignment.is_empty())
                    .count()
            });
        if members == 8 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "8 members with assignments: {members}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    produce(&topic, 0, (0..N / 2).map(|i| format!("0-{i}"))).await;
    produce(&topic, 1, (0..N / 2).map(|i| format!("1-{i}"))).await;
    let deadline = Instant::now() + DEADLINE;
    while total.load(std::sync::atomic::Ordering::SeqCst) < N {
        assert!(
            Instant::now() < deadline,
            "{} of {N} records",
            total.load(std::sync::atomic::Ordering::SeqCst)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop_tx.send(true).unwrap();
    for m in members {
        m.await.unwrap();
    }
    let seen = seen.lock().unwrap();
    let per: Vec<usize> = (0..8).map(|i| seen.get(&i).map_or(0, Vec::len)).collect();
    eprintln!("records per member: {per:?}");
    assert!(
        per.iter().all(|&n| n > 0),
        "every member gets work: {per:?}"
    );
    let all: BTreeSet<&String> = seen.values().flatten().collect();
    assert_eq!(all.len(), N, "every record delivered");
}

/// An external share-group member: the Java `KafkaShareConsumer`
/// (`tests/interop/ShareMember.java`) or librdkafka's `ShareConsumer`
/// (`tests/interop/share_member.py`); it prints "value<TAB>delivery count" per accepted
/// record, "rejected<TAB>value" per rejected one (with `reject_every` N > 0 it rejects
/// "r<i>" where `i % N == N - 3`, the rule of [`rejected_by_rule`]), and stops once its
/// stop file exists.
struct External {
    proc: common::Watched,
    stop: std::path::PathBuf,
    name: &'static str,
}

impl External {
    fn start(kind: &'static str, group: &str, topic: &str, sleep_ms: u64) -> External {
        External::start_rejecting(kind, group, topic, sleep_ms, 0)
    }

    fn start_rejecting(
        kind: &'static str,
        group: &str,
        topic: &str,
        sleep_ms: u64,
        reject_every: u64,
    ) -> External {
        let dir = common::temp_dir(&format!("share-{kind}"));
        let stop = dir.join("stop");
        let log = dir.join("out.log");
        let root = env!("CARGO_MANIFEST_DIR");
        let addr = common::shared().addr.clone();
        let sleep = sleep_ms.to_string();
        let every = reject_every.to_string();
        let stop_s = stop.display().to_string();
        let proc = match kind {
            "java" => {
                let cp = format!("{}/*", common::kafka::kafka_libs().display());
                let src = format!("{root}/tests/interop/ShareMember.java");
                common::Watched::spawn(
                    "java",
                    &[
                        "-Xmx256m",
                        "-Dlog4j2.level=warn",
                        "-cp",
                        &cp,
                        &src,
                        &addr,
                        group,
                        topic,
                        &stop_s,
                        &sleep,
                        &every,
                    ],
                    &dir,
                    log,
                )
            }
            _ => {
                let src = format!("{root}/tests/interop/share_member.py");
                common::Watched::spawn(
                    "python3",
                    &[&src, &addr, group, topic, &stop_s, &sleep, &every],
                    &dir,
                    log,
                )
            }
        };
        External {
            proc,
            stop,
            name: kind,
        }
    }

    /// The accepted records so far: (value, delivery count).
    fn records(&self) -> Vec<(String, u16)> {
        self.proc
            .log_text()
            .lines()
            .filter_map(|l| {
                let (v, n) = l.split_once('\t')?;
                (v.starts_with('r') && v[1..].chars().all(|c| c.is_ascii_digit()))
                    .then(|| (v.to_string(), n.trim().parse().unwrap_or(0)))
            })
            .collect()
    }

    /// The values it rejected so far.
    fn rejected(&self) -> Vec<String> {
        self.proc
            .log_text()
            .lines()
            .filter_map(|l| l.strip_prefix("rejected\t"))
            .map(str::to_string)
            .collect()
    }

    fn subscribed(&self) -> bool {
        self.proc.log_text().contains("share member subscribed")
    }

    /// Ask it to stop and wait for the exit (it closes its consumer: leaves the group);
    /// what it accepted and what it rejected.
    fn stop(mut self) -> Outcome {
        std::fs::write(&self.stop, b"stop").unwrap();
        let deadline = Instant::now() + DEADLINE;
        while !self.proc.exited() {
            assert!(
                Instant::now() < deadline,
                "{} member did not stop:\n{}",
                self.name,
                self.proc.log_text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        (self.records(), self.rejected())
    }
}

/// A kafkapipe member in this process: accepts every record after `work`, except that it
/// rejects the values in `reject`; records (value, delivery count) of what it accepted
/// and of what it rejected.
/// What a [`Member`] accepted (value, delivery count) and what it rejected.
type Outcome = (Vec<(String, u16)>, Vec<String>);

struct Member {
    task: tokio::task::JoinHandle<Outcome>,
    stop: tokio::sync::watch::Sender<bool>,
    accepted: Arc<Mutex<usize>>,
}

impl Member {
    fn start(group: &str, topic: &str, work: Duration, reject: fn(&str) -> bool) -> Member {
        let cfg = config(group, topic).max_in_flight(20);
        let (stop, mut stop_rx) = tokio::sync::watch::channel(false);
        let accepted = Arc::new(Mutex::new(0));
        let count = accepted.clone();
        let task = tokio::spawn(async move {
            let mut r = ShareReader::new(cfg).await.unwrap();
            let (mut ok, mut rejected) = (Vec::new(), Vec::new());
            loop {
                let mut m = tokio::select! {
                    _ = stop_rx.changed() => break,
                    m = r.next() => m.expect("stream ended").expect("share reader failed"),
                };
                if !work.is_zero() {
                    tokio::time::sleep(work).await;
                }
                let v = value(&m);
                if reject(&v) {
                    m.take_ack_token().reject();
                    rejected.push(v);
                } else {
                    ok.push((v, m.delivery_count().unwrap_or(0)));
                    m.take_ack_token().ack();
                    *count.lock().unwrap() += 1;
                }
            }
            r.close().await.unwrap();
            (ok, rejected)
        });
        Member {
            task,
            stop,
            accepted,
        }
    }

    async fn stop(self) -> Outcome {
        let _ = self.stop.send(true);
        self.task.await.unwrap()
    }
}

async fn wait_members(group: &str, n: usize) {
    let deadline = Instant::now() + DEADLINE;
    let admin = admin();
    loop {
        let d = admin.describe_share_groups(&[group]).await.unwrap();
        let members = d
            .into_iter()
            .next()
            .and_then(|(_, g)| g.ok())
            .map_or(0, |g| {
                g.members
                    .iter()
                    .filter(|m| !m.assignment.is_empty())
                    .count()
            });
        if members >= n {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{n} members with assignments: {members}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    admin.close().await;
}

/// The broker's view: every partition's lag is 0 (all records accepted or rejected).
async fn wait_lag_zero(
    group: &str,
    topic: &str,
    limit: Duration,
) -> Vec<kafkapipe::admin::ShareGroupOffset> {
    let deadline = Instant::now() + limit;
    let admin = admin();
    loop {
        let offsets = admin
            .describe_share_group_offsets(group, Some(&[topic]))
            .await
            .unwrap();
        if !offsets.is_empty() && offsets.iter().all(|o| o.lag == Some(0)) {
            admin.close().await;
            return offsets;
        }
        assert!(
            Instant::now() < deadline,
            "lag not 0 within {limit:?}: {offsets:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The interop test's rejection rule, applied by every client: "r<i>" with
/// `i % 10 == 7` is rejected.
fn rejected_by_rule(v: &str) -> bool {
    v.strip_prefix('r')
        .and_then(|i| i.parse::<u64>().ok())
        .is_some_and(|i| i % 10 == 7)
}

/// One share group, three clients: a kafkapipe member, the Java `KafkaShareConsumer` and
/// librdkafka's `ShareConsumer`. Each gets work; each rejects one record in ten. Every
/// record is accepted exactly once or rejected, and a record rejected by any client is
/// never delivered again (to anyone).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn share_interop_with_java_and_librdkafka() {
    common::init_log();
    let topic = new_topic("share-interop", 1).await;
    let group = format!("{topic}-g");
    configure_group(&group, &[]).await;
    let java = External::start_rejecting("java", &group, &topic, 10, 10);
    let rdk = External::start_rejecting("librdkafka", &group, &topic, 10, 10);
    let ours = Member::start(&group, &topic, Duration::from_millis(10), rejected_by_rule);
    wait_members(&group, 3).await;
    // Records arrive in small produces until every client has won some: one produce of
    // 600 is one batch, and the first two pending fetches (Java's 500, librdkafka's 100)
    // can take all of it. A client that never gets work before the deadline fails.
    const CHUNK: usize = 20;
    let deadline = Instant::now() + DEADLINE;
    let mut n = 0;
    loop {
        produce(&topic, 0, (n..n + CHUNK).map(|i| format!("r{i}"))).await;
        n += CHUNK;
        let all_busy = *ours.accepted.lock().unwrap() > 0
            && !java.records().is_empty()
            && !rdk.records().is_empty();
        if all_busy && n >= 600 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not every client got work from {n} records: kafkapipe {}, java {}, librdkafka {}",
            *ours.accepted.lock().unwrap(),
            java.records().len(),
            rdk.records().len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let offsets = wait_lag_zero(&group, &topic, Duration::from_secs(120)).await;
    let (mine, mine_rej) = ours.stop().await;
    let ((j, j_rej), (r, r_rej)) = tokio::task::spawn_blocking(move || (java.stop(), rdk.stop()))
        .await
        .unwrap();
    eprintln!(
        "accepted: kafkapipe {}, java {}, librdkafka {}; rejected: {}, {}, {}; broker offsets {offsets:?}",
        mine.len(),
        j.len(),
        r.len(),
        mine_rej.len(),
        j_rej.len(),
        r_rej.len()
    );
    let mut accepted: BTreeMap<String, usize> = BTreeMap::new();
    for (v, _) in mine.iter().chain(&j).chain(&r) {
        *accepted.entry(v.clone()).or_default() += 1;
    }
    let mut rejected: BTreeMap<String, usize> = BTreeMap::new();
    for v in mine_rej.iter().chain(&j_rej).chain(&r_rej) {
        *rejected.entry(v.clone()).or_default() += 1;
    }
    let twice: Vec<_> = accepted.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "accepted twice: {twice:?}");
    let rejected_twice: Vec<_> = rejected.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        rejected_twice.is_empty(),
        "a rejected record came back: {rejected_twice:?}"
    );
    let both: Vec<_> = rejected
        .keys()
        .filter(|v| accepted.contains_key(*v))
        .collect();
    assert!(both.is_empty(), "rejected and then accepted: {both:?}");
    assert!(
        accepted.keys().all(|v| !rejected_by_rule(v))
            && rejected.keys().all(|v| rejected_by_rule(v)),
        "each client follows the rule"
    );
    assert_eq!(
        accepted.len() + rejected.len(),
        n,
        "every record accepted or rejected"
    );
    assert_eq!(rejected.len(), n / 10, "one in ten rejected");
    assert!(
        !mine.is_empty() && !j.is_empty() && !r.is_empty(),
        "every client gets work"
    );
    assert!(
        !mine_rej.is_empty() || !j_rej.is_empty() || !r_rej.is_empty(),
        "someone rejected"
    );
}

/// Accounting with a crash: 20,000 records on 2 partitions, four members of mixed
/// clients (two kafkapipe, Java, librdkafka); the librdkafka member is SIGKILLed mid-run.
/// Every record is accepted exactly once, or — if the killed member held it — delivered
/// again (delivery count 2+, after its lock expired) and accepted by a survivor; the
/// records the kafkapipe members reject never come back; the broker's view ends with lag
/// 0 on both partitions. (Fewer than the 100,000 records: on the shared 2-core
/// machine the lock expiry and the slow peers dominate, not the volume;
/// `KAFKAPIPE_SHARE_RECORDS=100000` runs the full count. Its run on 2026-12-03, Kafka
/// 4.4.0: passed in 166 s, 63 s of it the broker's start; accepted by kafkapipe 49,405 +
/// 20,244, Java 29,653, librdkafka 998 before the kill, 497 of those redelivered with
/// delivery count 2+; 198 rejected; lag 0 on both partitions.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn share_accounting_with_a_member_killed() {
    common::init_log();
    let n: usize = std::env::var("KAFKAPIPE_SHARE_RECORDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000);
    let topic = new_topic("share-account", 2).await;
    let group = format!("{topic}-g");
    configure_group(&group, &[("share.record.lock.duration.ms", "15000")]).await;
    fn poison(v: &str) -> bool {
        // on both partitions (values alternate between them)
        v[1..]
            .parse::<usize>()
            .is_ok_and(|i| i % 1000 == 7 || i % 1000 == 8)
    }
    let a = Member::start(&group, &topic, Duration::ZERO, poison);
    let b = Member::start(&group, &topic, Duration::from_micros(200), poison);
    let java = External::start("java", &group, &topic, 1);
    let victim = External::start("librdkafka", &group, &topic, 2);
    wait_members(&group, 4).await;
    for p in 0..2 {
        produce(
            &topic,
            p,
            (0..n)
                .filter(|i| i % 2 == p as usize)
                .map(|i| format!("r{i}")),
        )
        .await;
    }
    // kill the librdkafka member once it is busy
    let deadline = Instant::now() + DEADLINE;
    while victim.records().len() < 200 {
        assert!(
            Instant::now() < deadline,
            "the librdkafka member got no work: {}",
            victim.proc.log_text()
        );
        assert!(victim.subscribed());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let pid = victim.proc.pid().unwrap();
    assert!(std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .unwrap()
        .success());
    let killed_at = (*a.accepted.lock().unwrap(), *b.accepted.lock().unwrap());
    let offsets = wait_lag_zero(&group, &topic, Duration::from_secs(240)).await;
    let victim_seen = victim.records();
    let (a_ok, a_rej) = a.stop().await;
    let (b_ok, b_rej) = b.stop().await;
    let (j, _) = tokio::task::spawn_blocking(move || java.stop())
        .await
        .unwrap();

    let mut accepted: BTreeMap<String, Vec<(&str, u16)>> = BTreeMap::new();
    for (who, list) in [("a", &a_ok), ("b", &b_ok), ("java", &j)] {
        for (v, n) in list {
            accepted.entry(v.clone()).or_default().push((who, *n));
        }
    }
    let rejected: BTreeSet<&String> = a_rej.iter().chain(&b_rej).collect();
    let victim_values: BTreeSet<&String> = victim_seen.iter().map(|(v, _)| v).collect();
    let mut redelivered = 0;
    let mut missing = Vec::new();
    for i in 0..n {
        let v = format!("r{i}");
        let by = accepted.get(&v).map_or(&[][..], Vec::as_slice);
        if rejected.contains(&v) {
            assert!(by.is_empty(), "{v} rejected, then delivered again: {by:?}");
            continue;
        }
        match by {
            [] if victim_values.contains(&v) => {} // accepted by the killed member
            [] => missing.push(v),
            [(_, n)] if victim_values.contains(&v) => {
                assert!(
                    *n >= 2,
                    "{v} held by the killed member came back with delivery count {n}"
                );
                redelivered += 1;
            }
            [(_, n)] => assert!(*n >= 1, "{v}: delivery count {n}"),
            more => panic!("{v} accepted by more than one survivor: {more:?}"),
        }
    }
    assert!(
        missing.is_empty(),
        "{} records never accepted, e.g. {:?}",
        missing.len(),
        &missing[..missing.len().min(10)]
    );
    let expect_rejected = (0..n).filter(|i| i % 1000 == 7 || i % 1000 == 8).count();
    assert!(rejected.len() <= expect_rejected);
    eprintln!(
        "accounting: {n} records; accepted by kafkapipe a {} / b {}, java {}, librdkafka (killed at its {}th) {}; \
         rejected {}; held by the killed member and redelivered {redelivered}; kafkapipe had accepted {killed_at:?} at the kill; broker offsets {offsets:?}",
        a_ok.len(), b_ok.len(), j.len(), victim_seen.len(), victim_seen.len(), rejected.len()
    );
}

/// Backpressure: a member holding `max_in_flight` unsettled records acquires no more
/// (the record-limit acquire mode makes MaxRecords exact), so another member gets the
/// rest; once the first settles, it may fetch again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn share_in_flight_bound_leaves_the_rest_to_other_members() {
    common::init_log();
    let topic = new_topic("share-bound", 1).await;
    let group = format!("{topic}-g");
    configure_group(&group, &[]).await;
    produce(&topic, 0, (0..50).map(|i| format!("v{i}"))).await;
    let mut a = ShareReader::new(config(&group, &topic).max_in_flight(5))
        .await
        .unwrap();
    let mut held = Vec::new();
    for _ in 0..5 {
        let mut m = next(&mut a, "a's first 5").await;
        held.push(m.take_ack_token());
    }
    let mut b = ShareReader::new(config(&group, &topic)).await.unwrap();
    let mut got_b = BTreeSet::new();
    while got_b.len() < 45 {
        let m = next(&mut b, "the other 45").await;
        got_b.insert(m.offset);
    }
    let s = a.stats();
    assert_eq!(s.acquired, 5, "a acquired beyond its bound: {s:?}");
    assert_eq!(s.in_flight, 5, "{s:?}");
    held.into_iter().for_each(|t| t.ack());
    wait_stats(&a, |s| s.accepted == 5 && s.in_flight == 0).await;
    b.close().await.unwrap();
    a.close().await.unwrap();
}

/// Lock renewal (KIP-1222): a record held three times as long as the group's
/// acquisition lock (`share.record.lock.duration.ms`, 15 s, the lowest the broker
/// accepts) by a slow stage is not delivered to another member meanwhile: the reader
/// renews its lock while the token is alive; the final accept succeeds and nothing is
/// left for the group.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn share_lock_renewed_while_a_slow_stage_holds_the_record() {
    common::init_log();
    let topic = new_topic("share-renew", 1).await;
    let group = format!("{topic}-g");
    const LOCK: Duration = Duration::from_secs(15);
    configure_group(&group, &[("share.record.lock.duration.ms", "15000")]).await;
    // Both members hold at most the one record, so the holder sends no ShareFetch while
    // it holds it. A holder with room keeps fetching, and its renewals wait for the
    // session's fetch in flight: Kafka 4.4 was seen to answer such a ShareFetch (max
    // wait 200 ms) only after 30 s, past the 15 s lock (an open defect, DESIGN.md
    // "Share groups").
    let mut a = ShareReader::new(config(&group, &topic).max_in_flight(1))
        .await
        .unwrap();
    let mut b = ShareReader::new(config(&group, &topic).max_in_flight(1))
        .await
        .unwrap();
    wait_members(&group, 2).await;
    produce(&topic, 0, ["held".to_string()]).await;
    // whichever member gets it holds it (the slow stage); the other keeps reading
    let (mut holder, mut other, mut m) = tokio::select! {
        m = next(&mut a, "the record") => (a, b, m),
        m = next(&mut b, "the record") => (b, a, m),
    };
    let held_since = Instant::now();
    assert_eq!(m.delivery_count(), Some(1));
    let token = m.take_ack_token();
    let mut redelivered = Vec::new();
    while held_since.elapsed() < 3 * LOCK {
        let left = (3 * LOCK).saturating_sub(held_since.elapsed());
        match tokio::time::timeout(left, other.next()).await {
            Err(_) => break,
            Ok(Some(Ok(m))) => redelivered.push((value(&m), m.delivery_count())),
            Ok(Some(Err(e))) => panic!("the other member failed: {e}"),
            Ok(None) => panic!("the other member's stream ended"),
        }
    }
    assert!(
        redelivered.is_empty(),
        "a record held for {:?} (lock {LOCK:?}) went to another member: {redelivered:?}",
        held_since.elapsed()
    );
    token.ack();
    wait_stats(&holder, |s| s.accepted + s.ack_errors >= 1).await;
    let s = holder.stats();
    assert_eq!(
        (s.accepted, s.ack_errors),
        (1, 0),
        "the final accept: {s:?}"
    );
    assert!(s.renewed >= 2, "renewed at each half lock: {s:?}");
    assert_eq!(s.renew_errors, 0, "{s:?}");
    // the holder is polled only now: nothing else came its way either
    assert!(
        tokio::time::timeout(Duration::from_millis(300), holder.next())
            .await
            .is_err(),
        "the holder got another record"
    );
    holder.close().await.unwrap();
    other.close().await.unwrap();
    let rest = read_until_marker(&group, &topic, "marker").await;
    assert!(
        rest.is_empty(),
        "the held record was not accepted: {rest:?}"
    );
}

/// The renewal bound: a record held beyond `max_lock_hold` (10 s here: one renewal at
/// half of the 15 s lock, none after) loses its lock, the broker delivers it to the other
/// member (delivery count 2), and the holder's late accept is refused and counted in
/// `ack_errors`, not taken as done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn share_lock_renewal_stops_at_max_lock_hold() {
    common::init_log();
    let topic = new_topic("share-renew-bound", 1).await;
    let group = format!("{topic}-g");
    configure_group(&group, &[("share.record.lock.duration.ms", "15000")]).await;
    let cfg = || {
        config(&group, &topic)
            .max_in_flight(1)
            .max_lock_hold(Duration::from_secs(10))
    };
    let mut a = ShareReader::new(cfg()).await.unwrap();
    let mut b = ShareReader::new(cfg()).await.unwrap();
    wait_members(&group, 2).await;
    produce(&topic, 0, ["held".to_string()]).await;
    let (holder, mut other, mut m) = tokio::select! {
        m = next(&mut a, "the record") => (a, b, m),
        m = next(&mut b, "the record") => (b, a, m),
    };
    assert_eq!(m.delivery_count(), Some(1));
    let token = m.take_ack_token();
    let mut again = next(&mut other, "the redelivery after the bound").await;
    assert_eq!(value(&again), "held");
    assert_eq!(again.delivery_count(), Some(2), "delivered again");
    let s = holder.stats();
    assert_eq!(s.renewed, 1, "one renewal within the bound: {s:?}");
    token.ack();
    wait_stats(&holder, |s| s.accepted + s.ack_errors >= 1).await;
    let s = holder.stats();
    assert_eq!((s.accepted, s.ack_errors), (0, 1), "the late accept: {s:?}");
    again.take_ack_token().ack();
    wait_stats(&other, |s| s.accepted == 1).await;
    holder.close().await.unwrap();
    other.close().await.unwrap();
    let rest = read_until_marker(&group, &topic, "marker").await;
    assert!(
        rest.is_empty(),
        "left after the redelivery was accepted: {rest:?}"
    );
}

/// Retries an admin call while the broker still counts a member that has just left.
async fn while_non_empty<T, F, Fut>(what: &str, mut call: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = kafkapipe::Result<T>>,
{
    let deadline = Instant::now() + DEADLINE;
    loop {
        match call().await {
            Ok(v) => return v,
            Err(e)
                if e.kafka_code() == Some(kafkapipe::protocol::ErrorCode::NonEmptyGroup)
                    && Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(200)).await
            }
            Err(e) => panic!("{what}: {e}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn share_admin_lists_alters_and_deletes_group_offsets() {
    common::init_log();
    let topic = new_topic("share-admin", 1).await;
    let group = format!("{topic}-g");
    configure_group(&group, &[]).await;
    produce(&topic, 0, (0..20).map(|i| format!("v{i}"))).await;
    let admin = admin();
    let tp = kafkapipe::admin::TopicPartition::new(topic.clone(), 0);

    // a member accepts everything: the group is listed, its lag goes to 0
    let mut r = ShareReader::new(config(&group, &topic)).await.unwrap();
    for _ in 0..20 {
        next(&mut r, "20 records").await;
    }
    // while the member is in the group, its offsets cannot be altered (the refusal may
    // come for the request or for the partition)
    let code = match admin
        .alter_share_group_offsets(&group, &[(tp.clone(), 0)])
        .await
    {
        Err(e) => e.kafka_code(),
        Ok(results) => results.into_iter().find_map(|(_, r)| r.err()?.kafka_code()),
    };
    assert_eq!(
        code,
        Some(kafkapipe::protocol::ErrorCode::NonEmptyGroup),
        "altering the offsets of a group with a member"
    );
    r.close().await.unwrap();
    let listed = admin.list_share_groups().await.unwrap();
    let g = listed
        .iter()
        .find(|g| g.group_id == group)
        .unwrap_or_else(|| panic!("{group} not in {listed:?}"));
    assert_eq!(g.group_type.as_deref(), Some("share"));
    wait_lag_zero(&group, &topic, DEADLINE).await;

    // alter: the group goes on from offset 15
    let to_15 = [(tp.clone(), 15)];
    for (p, res) in
        while_non_empty("alter", || admin.alter_share_group_offsets(&group, &to_15)).await
    {
        res.unwrap_or_else(|e| panic!("alter {p}: {e}"));
    }
    let offsets = admin
        .describe_share_group_offsets(&group, Some(&[topic.as_str()]))
        .await
        .unwrap();
    assert_eq!(offsets.len(), 1, "{offsets:?}");
    assert_eq!(offsets[0].start_offset, 15, "{offsets:?}");
    let seen = read_until_marker(&group, &topic, "m1").await;
    assert_eq!(seen, (15..20).map(|i| format!("v{i}")).collect::<Vec<_>>());

    // delete: the group's state of the topic is gone, and it starts again from the
    // earliest offset (the group config)
    let topics = [topic.as_str()];
    for (t, res) in while_non_empty("delete", || {
        admin.delete_share_group_offsets(&group, &topics)
    })
    .await
    {
        res.unwrap_or_else(|e| panic!("delete {t}: {e}"));
    }
    let left = admin
        .describe_share_group_offsets(&group, None)
        .await
        .unwrap();
    assert!(
        left.iter().all(|o| o.partition.topic != topic),
        "offsets left after the delete: {left:?}"
    );
    let seen = read_until_marker(&group, &topic, "m2").await;
    let mut want: Vec<String> = (0..20).map(|i| format!("v{i}")).collect();
    want.push("m1".into());
    assert_eq!(seen, want);
    admin.close().await;
}
