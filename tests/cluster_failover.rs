//! Failover against a real 3-node Apache Kafka cluster (KRaft, RF 3, min.insync.replicas 2):
//! brokers that lead partitions, or coordinate a group, are killed (SIGKILL) or shut down
//! (SIGTERM) while kafkapipe writes and reads. Every scenario counts lost and duplicated
//! records by content, not by offsets alone.
//!
//! One cluster serves every scenario (a start costs ~20 s); the scenarios run one after
//! another inside one test and restart the nodes they stopped before the next begins.
//! Scenario 6 reads committed offsets through a coordinator kill (stable reads include every
//! acknowledged commit). Scenario 7 is an unclean leader election that truncates the log below what a reader
//! read (KIP-320). `KAFKAPIPE_FAILOVER=1,4` runs only those scenarios; `KAFKAPIPE_TEST_LOG=1` prints the
//! client's logs (`KAFKAPIPE_TEST_LOG=debug` for more).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{unique_topic, TestCluster};
use futures::{SinkExt, StreamExt};
use kafkapipe::admin::{Admin, OffsetFetchOptions};
use kafkapipe::conn::{Conn, RequiredAcks};
use kafkapipe::group::{CommitMode, GroupEvent};
use kafkapipe::protocol::messages::{
    CreatableReplicaAssignment, CreatableTopic, CreatableTopicConfig, CreateTopicsRequest,
};
use kafkapipe::reader::{LogTruncation, OffsetReset, Reader, ReaderConfig};
use kafkapipe::writer::{Hash, Message, Writer, WriterConfig};

/// The client's own record of its group offsets: every `OffsetCommit sent` /
/// `OffsetCommit acknowledged` debug event and every `OffsetFetch answered` of the admin,
/// captured by a tracing layer (beside the optional `KAFKAPIPE_TEST_LOG` printing).
mod capture {
    use std::collections::HashMap;
    use std::fmt::Debug;
    use std::sync::Mutex;

    use tracing::field::{Field, Visit};
    use tracing_subscriber::filter::{LevelFilter, Targets};
    use tracing_subscriber::layer::{Context, SubscriberExt};
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::Layer;

    /// One captured event: its message and fields (as text).
    #[derive(Debug, Clone)]
    pub struct Event {
        pub message: String,
        pub fields: HashMap<&'static str, String>,
    }

    impl Event {
        pub fn get(&self, name: &str) -> &str {
            self.fields.get(name).map_or("", String::as_str)
        }

        pub fn int(&self, name: &str) -> i64 {
            self.get(name).parse().unwrap_or(i64::MIN)
        }
    }

    pub static EVENTS: Mutex<Vec<Event>> = Mutex::new(Vec::new());

    /// How many events are captured so far (an index into [`EVENTS`]).
    pub fn len() -> usize {
        EVENTS.lock().unwrap().len()
    }

    /// The events captured from index `from` on.
    pub fn since(from: usize) -> Vec<Event> {
        EVENTS
            .lock()
            .unwrap()
            .get(from..)
            .unwrap_or_default()
            .to_vec()
    }

    struct Fields(HashMap<&'static str, String>);

    impl Visit for Fields {
        fn record_debug(&mut self, field: &Field, value: &dyn Debug) {
            self.0.insert(field.name(), format!("{value:?}"));
        }
        fn record_str(&mut self, field: &Field, value: &str) {
            self.0.insert(field.name(), value.to_string());
        }
    }

    struct Capture;

    impl<S: tracing::Subscriber> Layer<S> for Capture {
        fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
            let mut f = Fields(HashMap::new());
            event.record(&mut f);
            let message = f.0.remove("message").unwrap_or_default();
            if message.starts_with("OffsetCommit ") || message == "OffsetFetch answered" {
                EVENTS.lock().unwrap().push(Event {
                    message,
                    fields: f.0,
                });
            }
        }
    }

    /// Install the capture (debug events of `kafkapipe::admin::groups` only) and, with
    /// `KAFKAPIPE_TEST_LOG`, the usual printing of the client's logs.
    pub fn init() {
        let print = match std::env::var("KAFKAPIPE_TEST_LOG").as_deref() {
            Ok("debug") => LevelFilter::DEBUG,
            Ok(_) => LevelFilter::INFO,
            Err(_) => LevelFilter::OFF,
        };
        let _ = tracing_subscriber::registry()
            .with(Capture.with_filter(
                Targets::new().with_target("kafkapipe::admin::groups", LevelFilter::DEBUG),
            ))
            .with(
                tracing_subscriber::fmt::layer()
                    .with_test_writer()
                    .with_filter(print),
            )
            .try_init();
    }

    /// Per partition of `group`, the offsets the client sent (`OffsetCommit sent`) and had
    /// acknowledged (`OffsetCommit acknowledged`) must never go back: the regressions, and
    /// how many of each were seen.
    pub fn commit_regressions(group: &str) -> (Vec<String>, usize, usize) {
        let events = EVENTS.lock().unwrap();
        let mut last: HashMap<(&str, i64), (i64, i64, &str)> = HashMap::new();
        let (mut sent, mut acked) = (0, 0);
        let mut out = Vec::new();
        for e in events.iter().filter(|e| e.get("group") == group) {
            let kind = match e.message.as_str() {
                "OffsetCommit sent" => {
                    sent += 1;
                    "sent"
                }
                "OffsetCommit acknowledged" => {
                    acked += 1;
                    "acknowledged"
                }
                _ => continue,
            };
            let (p, o) = (e.int("partition"), e.int("offset"));
            if let Some((prev, prev_id, prev_broker)) =
                last.insert((kind, p), (o, e.int("correlation_id"), e.get("broker")))
            {
                if o < prev {
                    out.push(format!(
                        "{kind} p{p}: {prev} (correlation id {prev_id}, {prev_broker}) then {o} (correlation id {}, {}, generation {})",
                        e.int("correlation_id"),
                        e.get("broker"),
                        e.get("generation"),
                    ));
                }
            }
        }
        (out, sent, acked)
    }
}

fn wanted(n: u32) -> bool {
    match std::env::var("KAFKAPIPE_FAILOVER") {
        Ok(list) => list.split(',').any(|s| s.trim() == n.to_string()),
        Err(_) => true,
    }
}

/// Blocking harness calls (kill, restart, create topic) from the async test.
fn blocking<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

/// Leader broker id of each partition of `topic`, asked of a live node.
async fn leaders(addr: &str, topic: &str) -> BTreeMap<i32, i32> {
    let conn = Conn::connect(addr).await.unwrap();
    let md = conn.metadata(Some(&[topic])).await.unwrap();
    conn.close().await;
    md.topic(topic)
        .unwrap()
        .partitions
        .iter()
        .map(|p| (p.id, p.leader))
        .collect()
}

/// The broker leading the most partitions of `topic`.
fn busiest(leaders: &BTreeMap<i32, i32>) -> i32 {
    let mut count: BTreeMap<i32, usize> = BTreeMap::new();
    for l in leaders.values() {
        *count.entry(*l).or_default() += 1;
    }
    count.into_iter().max_by_key(|(_, n)| *n).unwrap().0
}

/// Waits until every partition of `topic` has a leader other than `not` (and not -1).
async fn wait_leaders_moved(addr: &str, topic: &str, not: i32) -> Duration {
    let t0 = Instant::now();
    loop {
        let conn = Conn::connect(addr).await.unwrap();
        if let Ok(md) = conn.metadata(Some(&[topic])).await {
            if let Some(t) = md.topic(topic) {
                if t.partitions
                    .iter()
                    .all(|p| p.leader >= 0 && p.leader != not)
                {
                    conn.close().await;
                    return t0.elapsed();
                }
            }
        }
        conn.close().await;
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "leaders of {topic} did not move off {not}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The log end offset of `topic`/`partition`, asked of its leader.
async fn log_end(bootstrap: &str, topic: &str, partition: i32) -> i64 {
    let conn = Conn::dial_leader(bootstrap, topic, partition, Default::default())
        .await
        .unwrap();
    let end = conn.last_offset(topic, partition).await.unwrap();
    conn.close().await;
    end
}

/// The content of message `i` of a keyed run: key `k{i % keys}`, value `k{key}:{seq}`.
fn keyed(i: usize, keys: usize) -> (String, String) {
    let key = format!("k{}", i % keys);
    let value = format!("{key}:{}", i / keys);
    (key, value)
}

/// What a verification read found.
#[derive(Debug, Default)]
struct Tally {
    consumed: usize,
    unique: usize,
    lost: usize,
    duplicated: usize,
    order_violations: usize,
}

/// Reads every partition of `topic` from the start up to the log end with a plain Reader
/// and checks the keyed run of `n` messages over `keys` keys: counts by content, and per
/// key the sequence numbers must appear in order.
async fn verify_keyed(
    bootstrap: &[String],
    topic: &str,
    partitions: i32,
    n: usize,
    keys: usize,
) -> Tally {
    let mut total_end = 0i64;
    for p in 0..partitions {
        total_end += log_end(&bootstrap[0], topic, p).await;
    }
    let mut reader = Reader::new(
        ReaderConfig::new(bootstrap.to_vec())
            .topic(topic)
            .max_wait(Duration::from_millis(100)),
    )
    .await
    .unwrap();
    let mut seen: HashMap<String, u32> = HashMap::new();
    let mut last_seq: HashMap<String, i64> = HashMap::new();
    let mut tally = Tally::default();
    let deadline = Instant::now() + Duration::from_secs(120);
    while (tally.consumed as i64) < total_end {
        let m = tokio::time::timeout_at(deadline.into(), reader.next_message())
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "verification read of {topic}: {} of {total_end} in 120 s",
                    tally.consumed
                )
            })
            .unwrap();
        tally.consumed += 1;
        let value = String::from_utf8(m.value.unwrap().to_vec()).unwrap();
        let key = String::from_utf8(m.key.unwrap().to_vec()).unwrap();
        let seq: i64 = value.rsplit(':').next().unwrap().parse().unwrap();
        let prev = last_seq.insert(key.clone(), seq);
        if prev.is_some_and(|p| p >= seq) {
            tally.order_violations += 1;
        }
        *seen.entry(value).or_default() += 1;
    }
    reader.close().await;
    tally.unique = seen.len();
    tally.duplicated = seen.values().map(|c| (*c as usize).saturating_sub(1)).sum();
    tally.lost = (0..n)
        .filter(|i| !seen.contains_key(&keyed(*i, keys).1))
        .count();
    tally
}

fn keyed_writer(bootstrap: &[String], topic: &str) -> Writer {
    Writer::new(
        WriterConfig::new(bootstrap.to_vec())
            .topic(topic)
            .balancer(Hash::default())
            .required_acks(RequiredAcks::All)
            .idempotent(true)
            .batch_size(500)
            .batch_timeout(Duration::from_millis(5)),
    )
    .unwrap()
}

/// Writes `n` keyed messages at about `rate` per second; `progress` counts those handed to
/// the writer. Returns every error the writer reported to the caller.
async fn produce_keyed(
    writer: &mut Writer,
    n: usize,
    keys: usize,
    rate: usize,
    progress: Arc<AtomicUsize>,
) -> Vec<String> {
    let mut errors = Vec::new();
    let t0 = Instant::now();
    let chunk = 500;
    let mut i = 0;
    while i < n {
        let end = (i + chunk).min(n);
        for j in i..end {
            let (k, v) = keyed(j, keys);
            if let Err(e) = writer.feed(Message::keyed(k, v)).await {
                errors.push(format!("feed {j}: {e}"));
            }
        }
        i = end;
        progress.store(i, Ordering::Relaxed);
        let due = t0 + Duration::from_secs_f64(i as f64 / rate as f64);
        tokio::time::sleep_until(due.into()).await;
    }
    if let Err(e) = writer.flush().await {
        errors.push(format!("flush: {e}"));
    }
    if let Err(e) = SinkExt::<Message>::close(writer).await {
        errors.push(format!("close: {e}"));
    }
    errors
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Stop {
    Kill,
    Terminate,
}

/// Scenarios 1 and 2: an idempotent acks=all writer keeps writing 200k keyed messages over
/// 6 partitions while the broker leading the most of them is stopped and later restarted.
async fn writer_survives_leader_loss(cluster: &mut TestCluster, stop: Stop) {
    const N: usize = 200_000;
    const KEYS: usize = 1000;
    const PARTITIONS: i32 = 6;
    let topic = unique_topic(&format!("failover-writer-{stop:?}").to_lowercase());
    blocking(|| cluster.create_topic(&topic, PARTITIONS));
    let bootstrap = cluster.addrs();
    let before = leaders(&bootstrap[0], &topic).await;
    let victim = busiest(&before);
    eprintln!("[{stop:?}] leaders {before:?}; stopping node {victim}");

    let progress = Arc::new(AtomicUsize::new(0));
    let mut writer = keyed_writer(&bootstrap, &topic);
    let t0 = Instant::now();
    let producer = {
        let progress = progress.clone();
        tokio::spawn(async move {
            let errors = produce_keyed(&mut writer, N, KEYS, 6_000, progress).await;
            (errors, writer.stats())
        })
    };
    while progress.load(Ordering::Relaxed) < N / 5 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let stopped_at = Instant::now();
    blocking(|| match stop {
        Stop::Kill => cluster.node(victim).kill(),
        Stop::Terminate => cluster.node(victim).terminate(),
    });
    let live = blocking(|| cluster.live_addr());
    let moved = wait_leaders_moved(&live, &topic, victim).await;
    eprintln!(
        "[{stop:?}] node {victim} stopped at {} messages; leaders moved after {:?}: {:?}",
        N / 5,
        stopped_at.elapsed().min(moved + Duration::from_secs(60)),
        leaders(&live, &topic).await
    );
    // Let the writer run against the new leaders for a while, then bring the node back.
    tokio::time::sleep(Duration::from_secs(3)).await;
    blocking(|| cluster.node(victim).restart());
    eprintln!(
        "[{stop:?}] node {victim} restarted at {} messages",
        progress.load(Ordering::Relaxed)
    );
    let (errors, stats) = tokio::time::timeout(Duration::from_secs(180), producer)
        .await
        .expect("producer finished within 180 s")
        .unwrap();
    let produce_time = t0.elapsed();
    eprintln!("[{stop:?}] produced {N} in {produce_time:?}; stats {stats:?}");
    let tally = verify_keyed(&bootstrap, &topic, PARTITIONS, N, KEYS).await;
    eprintln!(
        "[{stop:?}] produced {N}, {tally:?}, errors to caller {}",
        errors.len()
    );
    assert!(
        errors.is_empty(),
        "errors reached the caller: {:?}",
        &errors[..errors.len().min(10)]
    );
    assert_eq!(tally.lost, 0, "lost records: {tally:?}");
    assert_eq!(tally.duplicated, 0, "duplicated records: {tally:?}");
    assert_eq!(tally.order_violations, 0, "per-key order broken: {tally:?}");
    assert_eq!(tally.consumed, N, "{tally:?}");
}

/// Scenario 4: a plain Reader reads a topic while a writer appends to it and the leader of
/// its partitions is killed: per partition, offsets and contents follow without gap or
/// repeat.
async fn reader_reads_through_leader_change(cluster: &mut TestCluster) {
    const PARTITIONS: i32 = 3;
    const N: usize = 60_000;
    let topic = unique_topic("failover-reader");
    blocking(|| cluster.create_topic(&topic, PARTITIONS));
    let bootstrap = cluster.addrs();
    let before = leaders(&bootstrap[0], &topic).await;
    let victim = busiest(&before);
    eprintln!("[reader] leaders {before:?}; will kill node {victim}");

    // The writer puts value "p{partition}-{n}" with n counting per partition, so the
    // reader can check content against offsets.
    let progress = Arc::new(AtomicUsize::new(0));
    let producer = {
        let progress = progress.clone();
        let bootstrap = bootstrap.clone();
        let topic = topic.clone();
        tokio::spawn(async move {
            let mut writer = Writer::new(
                WriterConfig::new(bootstrap)
                    .topic(&topic)
                    .required_acks(RequiredAcks::All)
                    .idempotent(true),
            )
            .unwrap();
            let mut errors = Vec::new();
            let t0 = Instant::now();
            for i in 0..N {
                let p = (i % PARTITIONS as usize) as i32;
                let n = i / PARTITIONS as usize;
                if let Err(e) = writer
                    .feed(Message::new(format!("p{p}-{n}")).with_partition(p))
                    .await
                {
                    errors.push(e.to_string());
                }
                if i % 300 == 299 {
                    progress.store(i + 1, Ordering::Relaxed);
                    let due = t0 + Duration::from_secs_f64((i + 1) as f64 / 5_000.0);
                    tokio::time::sleep_until(due.into()).await;
                }
            }
            if let Err(e) = SinkExt::<Message>::close(&mut writer).await {
                errors.push(e.to_string());
            }
            errors
        })
    };

    let read_count = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let consumer = {
        let bootstrap = bootstrap.clone();
        let topic = topic.clone();
        let read_count = read_count.clone();
        tokio::spawn(async move {
            let mut reader = Reader::new(
                ReaderConfig::new(bootstrap)
                    .topic(&topic)
                    .max_wait(Duration::from_millis(100)),
            )
            .await
            .unwrap();
            let mut next: BTreeMap<i32, i64> = (0..PARTITIONS).map(|p| (p, 0)).collect();
            let mut gaps = Vec::new();
            let mut errors = Vec::new();
            let mut got = 0usize;
            let deadline = Instant::now() + Duration::from_secs(180);
            let mut last_at = Instant::now();
            let mut max_pause = Duration::ZERO;
            while got < N {
                match tokio::time::timeout_at(deadline.into(), reader.next()).await {
                    Err(_) => panic!("reader: {got} of {N} in 180 s"),
                    Ok(None) => panic!("reader stream ended"),
                    Ok(Some(Err(e))) => errors.push(e.to_string()),
                    Ok(Some(Ok(m))) => {
                        let expect = next[&m.partition];
                        let value = String::from_utf8(m.value.unwrap().to_vec()).unwrap();
                        let want = format!("p{}-{}", m.partition, m.offset);
                        if m.offset != expect || value != want {
                            gaps.push(format!(
                                "p{} offset {} (expected {expect}) value {value}",
                                m.partition, m.offset
                            ));
                        }
                        next.insert(m.partition, m.offset + 1);
                        got += 1;
                        read_count.store(got, Ordering::Relaxed);
                        max_pause = max_pause.max(last_at.elapsed());
                        last_at = Instant::now();
                    }
                }
            }
            reader.close().await;
            (gaps, errors, max_pause)
        })
    };

    while progress.load(Ordering::Relaxed) < N / 4 || read_count.load(Ordering::Relaxed) < N / 5 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    blocking(|| cluster.node(victim).kill());
    eprintln!(
        "[reader] killed node {victim} at {} written, {} read",
        progress.load(Ordering::Relaxed),
        read_count.load(Ordering::Relaxed)
    );
    let live = blocking(|| cluster.live_addr());
    let moved = wait_leaders_moved(&live, &topic, victim).await;
    eprintln!(
        "[reader] leaders moved after {moved:?}: {:?}",
        leaders(&live, &topic).await
    );
    let producer_errors = tokio::time::timeout(Duration::from_secs(180), producer)
        .await
        .expect("producer done")
        .unwrap();
    let (gaps, errors, max_pause) = tokio::time::timeout(Duration::from_secs(180), consumer)
        .await
        .expect("consumer done")
        .unwrap();
    done.store(true, Ordering::Relaxed);
    eprintln!(
        "[reader] read {N}: gaps/repeats {}, errors yielded {} {:?}, longest pause {max_pause:?}",
        gaps.len(),
        errors.len(),
        &errors[..errors.len().min(5)]
    );
    blocking(|| cluster.node(victim).restart());
    assert!(
        producer_errors.is_empty(),
        "writer errors: {producer_errors:?}"
    );
    assert!(
        gaps.is_empty(),
        "gaps or repeats: {:?}",
        &gaps[..gaps.len().min(20)]
    );
}

/// One OffsetFetch of the group's offsets of `topic`: the broker that answered, the
/// offsets, and the capture index after it.
async fn read(
    admin: &Admin,
    group: &str,
    topic: &str,
    stable: bool,
) -> Option<(i64, BTreeMap<i32, i64>, usize)> {
    let from = capture::len();
    let opts = OffsetFetchOptions::new().require_stable(stable);
    let r = tokio::time::timeout(
        Duration::from_secs(2),
        admin.fetch_group_offsets_with(group, Some(&[topic]), &opts),
    )
    .await;
    let Ok(Ok(offsets)) = r else { return None };
    let offsets: BTreeMap<i32, i64> = offsets
        .into_iter()
        .filter_map(|(tp, r)| Some((tp.partition, r.ok()?.offset)))
        .filter(|(_, o)| *o >= 0)
        .collect();
    let node = capture::since(from)
        .iter()
        .rev()
        .find(|e| {
            e.message == "OffsetFetch answered"
                && e.get("ok") == "true"
                && e.get("group") == group
                && e.get("require_stable") == stable.to_string()
        })
        .map_or(-1, |e| e.int("broker"));
    Some((node, offsets, capture::len()))
}

/// Group events of the members, with when and by whom they were seen.
type Events = Arc<Mutex<Vec<(Instant, &'static str, GroupEvent)>>>;

/// A group member: its reader forwards every message (errors are logged and skipped) into
/// its committer; `seen` counts contents, `events` records group events.
fn spawn_member(
    name: &'static str,
    config: ReaderConfig,
    seen: Arc<Mutex<HashMap<String, u32>>>,
    events: Events,
    stop: tokio::sync::watch::Receiver<bool>,
) -> tokio::task::JoinHandle<usize> {
    tokio::spawn(async move {
        let mut reader = Reader::new(config).await.unwrap();
        let committer = reader.committer().unwrap();
        let mut ev = reader.events().unwrap();
        let ev_task = tokio::spawn(async move {
            while let Some(e) = ev.next().await {
                eprintln!("[group] {name}: {e:?}");
                events.lock().unwrap().push((Instant::now(), name, e));
            }
        });
        let errors = Arc::new(AtomicUsize::new(0));
        let mut stop = stop;
        let stopped = async move {
            let _ = stop.wait_for(|s| *s).await;
        };
        {
            let errors = errors.clone();
            (&mut reader)
                .take_until(stopped)
                .filter_map(|r| {
                    let out = match r {
                        Ok(m) => {
                            let v = String::from_utf8(m.value.clone().unwrap().to_vec()).unwrap();
                            *seen.lock().unwrap().entry(v).or_default() += 1;
                            Some(Ok(m))
                        }
                        Err(e) => {
                            eprintln!("[group] {name}: reader error {e}");
                            errors.fetch_add(1, Ordering::Relaxed);
                            None
                        }
                    };
                    futures::future::ready(out)
                })
                .forward(committer)
                .await
                .unwrap_or_else(|e| panic!("{name}: committer failed: {e}"));
        }
        reader.close().await;
        ev_task.await.unwrap();
        errors.load(Ordering::Relaxed)
    })
}

/// Scenario 3: two group members read and commit while the broker leading partitions and
/// then the group's coordinator are killed in turn: every record is processed at least
/// once, committed offsets never go back, and the group never rebalances.
async fn group_survives_leader_and_coordinator_loss(
    cluster: &mut TestCluster,
    protocol: kafkapipe::group::GroupProtocol,
) {
    const PARTITIONS: i32 = 6;
    let topic = unique_topic("failover-group");
    let group = unique_topic("failover-group-g");
    blocking(|| cluster.create_topic(&topic, PARTITIONS));
    let bootstrap = cluster.addrs();

    let seen: Arc<Mutex<HashMap<String, u32>>> = Arc::default();
    let events: Events = Arc::default();
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let config = ReaderConfig::new(bootstrap.clone())
        .group_id(&group)
        .topic(&topic)
        .max_wait(Duration::from_millis(100))
        .session_timeout(Duration::from_secs(10))
        .heartbeat_interval(Duration::from_millis(500))
        .rebalance_timeout(Duration::from_secs(10))
        .commit_mode(CommitMode::Interval(Duration::from_millis(500)))
        .group_protocol(protocol);
    let members = [
        spawn_member(
            "a",
            config.clone(),
            seen.clone(),
            events.clone(),
            stop_rx.clone(),
        ),
        spawn_member("b", config, seen.clone(), events.clone(), stop_rx.clone()),
    ];

    // Committed offsets, watched for regressions with stable reads (on Kafka 4.x a
    // non-stable read is served at the offsets partition's high watermark, which a
    // coordinator just moved by a failover can hold behind the commits the previous one
    // acknowledged).
    let regressions: Arc<Mutex<Vec<String>>> = Arc::default();
    let last_committed: Arc<Mutex<BTreeMap<i32, i64>>> = Arc::default();
    let watcher = {
        let bootstrap = bootstrap.clone();
        let (group, topic) = (group.clone(), topic.clone());
        let (regressions, last_committed) = (regressions.clone(), last_committed.clone());
        let mut stop = stop_rx.clone();
        tokio::spawn(async move {
            let admin = Admin::connect(bootstrap).unwrap();
            loop {
                if let Some((node, offsets, _)) = read(&admin, &group, &topic, true).await {
                    let mut last = last_committed.lock().unwrap();
                    for (p, o) in offsets {
                        if let Some(prev) = last.insert(p, o).filter(|prev| *prev > o) {
                            regressions.lock().unwrap().push(format!(
                                "p{p} {prev} -> {o} (stable read answered by {node})"
                            ));
                        }
                    }
                }
                tokio::select! {
                    _ = stop.wait_for(|s| *s) => break,
                    _ = tokio::time::sleep(Duration::from_millis(200)) => {}
                }
            }
            admin.close().await;
        })
    };
    // Non-stable reads, only reported: one behind an offset seen before (by itself or
    // a stable read) names the broker that answered, and when it catches up, whether
    // a commit of that partition was acknowledged in between.
    let probe = {
        let bootstrap = bootstrap.clone();
        let (group, topic) = (group.clone(), topic.clone());
        let last_committed = last_committed.clone();
        let mut stop = stop_rx.clone();
        tokio::spawn(async move {
            let admin = Admin::connect(bootstrap).unwrap();
            let mut seen: BTreeMap<i32, i64> = BTreeMap::new();
            // partition -> (offset seen before, when it was behind, capture index then)
            let mut behind: BTreeMap<i32, (i64, Instant, usize)> = BTreeMap::new();
            let mut stale_reads = 0;
            let mut last_node = -1;
            loop {
                let stable_before = last_committed.lock().unwrap().clone();
                if let Some((node, offsets, at)) = read(&admin, &group, &topic, false).await {
                    if node != last_node {
                        eprintln!("[probe] first non-stable answer from {node}: {offsets:?}; seen before {seen:?}, stable {stable_before:?}");
                        last_node = node;
                    }
                    let mut stale = false;
                    for (p, o) in offsets {
                        let before = seen.get(&p).copied().max(stable_before.get(&p).copied());
                        seen.insert(p, before.unwrap_or(o).max(o));
                        match before.filter(|b| *b > o) {
                            Some(b) => {
                                stale = true;
                                eprintln!("[probe] non-stable read answered by {node}: p{p} {o}, behind {b} seen before");
                                behind.entry(p).or_insert((b, Instant::now(), at));
                            }
                            None => {
                                if let Some((b, since, from)) = behind.remove(&p) {
                                    let commits: Vec<String> = capture::since(from)
                                        .iter()
                                        .filter(|e| {
                                            e.get("group") == group
                                                && e.int("partition") == i64::from(p)
                                                && e.message == "OffsetCommit acknowledged"
                                        })
                                        .map(|e| e.get("offset").to_string())
                                        .collect();
                                    eprintln!(
                                        "[probe] non-stable read answered by {node}: p{p} at {o} (>= {b}) after {:?}; commits of p{p} acknowledged in between: {commits:?}",
                                        since.elapsed()
                                    );
                                }
                            }
                        }
                    }
                    stale_reads += usize::from(stale);
                }
                tokio::select! {
                    _ = stop.wait_for(|s| *s) => break,
                    _ = tokio::time::sleep(Duration::from_millis(50)) => {}
                }
            }
            admin.close().await;
            stale_reads
        })
    };

    // Wait for a stable group: both members assigned.
    let t0 = Instant::now();
    loop {
        let assigned = |name: &str| {
            events
                .lock()
                .unwrap()
                .iter()
                .any(|(_, n, e)| *n == name && matches!(e, GroupEvent::Assigned { .. }))
        };
        if assigned("a") && assigned("b") {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "group not formed in 60 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Let the assignment settle (the second join may rebalance the first member).
    tokio::time::sleep(Duration::from_secs(2)).await;
    let settled = Instant::now();
    eprintln!("[group] formed after {:?}", t0.elapsed());

    // The writer runs at ~2000/s until told to stop, so records keep arriving (and
    // commits keep moving) through both kills.
    let progress = Arc::new(AtomicUsize::new(0));
    let stop_producing = Arc::new(AtomicBool::new(false));
    let producer = {
        let progress = progress.clone();
        let stop_producing = stop_producing.clone();
        let bootstrap = bootstrap.clone();
        let topic = topic.clone();
        tokio::spawn(async move {
            // A delivery budget that outlasts a failover (a leader kill, then the
            // restarted node catching up while the coordinator's node is killed: below
            // min.insync.replicas for a while), as Java's 120 s `delivery.timeout.ms`
            // does: the default 10 attempts (~7 s) give up on records the group is then
            // expected to process.
            let mut writer = Writer::new(
                WriterConfig::new(bootstrap)
                    .topic(&topic)
                    // every partition keeps receiving records through both kills
                    .balancer(kafkapipe::writer::RoundRobin::default())
                    .required_acks(RequiredAcks::All)
                    .idempotent(true)
                    .max_attempts(60),
            )
            .unwrap();
            let mut errors = Vec::new();
            let t0 = Instant::now();
            let mut i = 0;
            while !stop_producing.load(Ordering::Relaxed) {
                if let Err(e) = writer.feed(Message::new(format!("r{i}"))).await {
                    errors.push(e.to_string());
                }
                i += 1;
                if i % 200 == 0 {
                    progress.store(i, Ordering::Relaxed);
                    let due = t0 + Duration::from_secs_f64(i as f64 / 2_000.0);
                    tokio::time::sleep_until(due.into()).await;
                }
            }
            if let Err(e) = SinkExt::<Message>::close(&mut writer).await {
                errors.push(e.to_string());
            }
            (i, errors)
        })
    };

    let admin = Admin::connect(bootstrap.clone()).unwrap();
    let coordinator = admin.find_coordinator(&group).await.unwrap();
    let before = leaders(&bootstrap[0], &topic).await;
    let leader_victim = *before.values().find(|l| **l != coordinator).unwrap();
    eprintln!("[group] coordinator {coordinator}, leaders {before:?}; killing leader {leader_victim} first");

    while progress.load(Ordering::Relaxed) < 10_000 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    blocking(|| cluster.node(leader_victim).kill());
    let live = blocking(|| cluster.live_addr());
    let moved = wait_leaders_moved(&live, &topic, leader_victim).await;
    eprintln!(
        "[group] killed {leader_victim} at {} produced; leaders moved after {moved:?}",
        progress.load(Ordering::Relaxed)
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    blocking(|| cluster.node(leader_victim).restart());
    eprintln!(
        "[group] node {leader_victim} restarted at {} produced",
        progress.load(Ordering::Relaxed)
    );

    let coordinator = admin.find_coordinator(&group).await.unwrap();
    blocking(|| cluster.node(coordinator).kill());
    let killed_at = Instant::now();
    eprintln!(
        "[group] killed coordinator {coordinator} at {} produced",
        progress.load(Ordering::Relaxed)
    );
    let admin2 = Admin::connect(vec![blocking(|| cluster.live_addr())]).unwrap();
    let new_coordinator = loop {
        if let Ok(c) = admin2.find_coordinator(&group).await {
            if c != coordinator {
                break c;
            }
        }
        assert!(
            killed_at.elapsed() < Duration::from_secs(60),
            "coordinator did not move"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    eprintln!(
        "[group] coordinator moved to {new_coordinator} after {:?}",
        killed_at.elapsed()
    );
    admin2.close().await;
    admin.close().await;
    // Keep producing and consuming on the new coordinator for a while.
    tokio::time::sleep(Duration::from_secs(5)).await;
    stop_producing.store(true, Ordering::Relaxed);
    let (n, producer_errors) = tokio::time::timeout(Duration::from_secs(180), producer)
        .await
        .expect("producer done")
        .unwrap();
    #[allow(non_snake_case)]
    let N = n;
    // Records the writer gave up on can never be processed: name that cause first.
    assert!(
        producer_errors.is_empty(),
        "writer errors: {producer_errors:?}"
    );
    let live = blocking(|| cluster.live_addr());
    // Every record processed.
    let t_wait = Instant::now();
    loop {
        let n = seen.lock().unwrap().len();
        if n >= N {
            break;
        }
        assert!(
            t_wait.elapsed() < Duration::from_secs(90),
            "only {n} of {N} records processed"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Commits catch up to the log end while the members still run.
    let mut ends = BTreeMap::new();
    for p in 0..PARTITIONS {
        ends.insert(p, log_end(&live, &topic, p).await);
    }
    let t_commit = Instant::now();
    while *last_committed.lock().unwrap() != ends {
        assert!(
            t_commit.elapsed() < Duration::from_secs(30),
            "committed {:?}, log end {ends:?}",
            last_committed.lock().unwrap()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop_tx.send(true).unwrap();
    let mut reader_errors = 0;
    for m in members {
        reader_errors += tokio::time::timeout(Duration::from_secs(60), m)
            .await
            .expect("member closes")
            .unwrap();
    }
    watcher.await.unwrap();
    let stale_reads = probe.await.unwrap();
    eprintln!("[group] non-stable reads behind an offset seen before: {stale_reads}");
    blocking(|| cluster.node(coordinator).restart());

    let seen = seen.lock().unwrap();
    let duplicated: usize = seen.values().map(|c| (*c as usize).saturating_sub(1)).sum();
    let lost = (0..N)
        .filter(|i| !seen.contains_key(&format!("r{i}")))
        .count();
    let late_events: Vec<_> = events
        .lock()
        .unwrap()
        .iter()
        .filter(|(at, _, _)| *at > settled)
        .map(|(_, n, e)| format!("{n}: {e:?}"))
        .collect();
    let regressions = regressions.lock().unwrap().clone();
    eprintln!(
        "[group] produced {N}, processed {} unique, lost {lost}, duplicated {duplicated}, reader errors {reader_errors}, commit regressions {}, group events after the kills {late_events:?}",
        seen.len(),
        regressions.len()
    );
    assert!(
        producer_errors.is_empty(),
        "writer errors: {producer_errors:?}"
    );
    // The client's own commits: per partition, what it sent and had acknowledged never
    // goes back.
    let (client_regressions, sent, acked) = capture::commit_regressions(&group);
    eprintln!(
        "[group] OffsetCommit partitions sent {sent}, acknowledged {acked}, regressions {client_regressions:?}"
    );
    assert!(sent > 0 && acked > 0, "no OffsetCommit captured");
    assert!(
        client_regressions.is_empty(),
        "the client's commits went back: {client_regressions:?}"
    );
    assert_eq!(lost, 0);
    assert!(regressions.is_empty(), "commits regressed: {regressions:?}");
    assert!(
        late_events.is_empty(),
        "the group rebalanced: {late_events:?}"
    );
}

/// Scenario 6: an admin commits offsets of a member-less group without pause; right
/// after an acknowledged commit (and with no commit after it) the coordinator is
/// killed. Every stable read of the new coordinator includes that commit. Non-stable
/// reads, made in turn with them, are only reported: on Kafka 4.x the new coordinator
/// serves them at its offsets partition's high watermark, which can still be before
/// that commit for a moment.
async fn stable_offset_reads_through_coordinator_loss(cluster: &mut TestCluster) {
    let topic = unique_topic("failover-reads");
    let group = unique_topic("failover-reads-g");
    blocking(|| cluster.create_topic(&topic, 1));
    let bootstrap = cluster.addrs();
    let admin = Admin::connect(bootstrap.clone()).unwrap();
    let stop_committing = Arc::new(AtomicBool::new(false));
    let progress = Arc::new(AtomicUsize::new(0));
    let committer = {
        let tp = kafkapipe::admin::TopicPartition::new(&topic, 0);
        let (admin, group) = (admin.clone(), group.clone());
        let (stop, progress) = (stop_committing.clone(), progress.clone());
        tokio::spawn(async move {
            let mut acked = -1i64;
            let mut i = 1i64;
            while !stop.load(Ordering::SeqCst) {
                if let Ok(mut r) = admin.commit_group_offsets(&group, &[(tp.clone(), i)]).await {
                    if r.pop().is_some_and(|(_, r)| r.is_ok()) {
                        acked = i;
                        progress.fetch_add(1, Ordering::SeqCst);
                    }
                }
                i += 1;
            }
            acked
        })
    };
    let t0 = Instant::now();
    while progress.load(Ordering::SeqCst) < 20 {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "commits not acknowledged"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let coordinator = admin.find_coordinator(&group).await.unwrap();
    stop_committing.store(true, Ordering::SeqCst);
    // the kill follows the last acknowledgement at once
    let acked = committer.await.unwrap();
    blocking(|| cluster.node(coordinator).kill());
    let killed_at = Instant::now();
    eprintln!("[reads] last acknowledged commit {acked}; killed coordinator {coordinator}");
    // No retries inside a read: the new coordinator's first answers matter.
    let probe = Admin::connect(vec![blocking(|| cluster.live_addr())])
        .unwrap()
        .with_retries(1, Duration::from_millis(5));
    let (mut answered, mut behind) = ([0usize; 2], [0usize; 2]);
    let mut first_answer = None;
    while answered[1] < 50 {
        assert!(
            killed_at.elapsed() < Duration::from_secs(60),
            "the new coordinator answered {answered:?} reads in 60 s"
        );
        let mut any = false;
        for stable in [false, true] {
            let Some((node, offsets, _)) = read(&probe, &group, &topic, stable).await else {
                continue;
            };
            any = true;
            let first = *first_answer.get_or_insert_with(|| killed_at.elapsed());
            let o = offsets.get(&0).copied().unwrap_or(-1);
            answered[usize::from(stable)] += 1;
            let kind = if stable { "stable" } else { "non-stable" };
            if o < acked {
                behind[usize::from(stable)] += 1;
                eprintln!("[reads] {:?} after the kill: {kind} read answered by {node}: {o}, before the acknowledged {acked}", killed_at.elapsed());
            } else if killed_at.elapsed() < first + Duration::from_millis(200) {
                eprintln!(
                    "[reads] {:?} after the kill: {kind} read answered by {node}: {o}",
                    killed_at.elapsed()
                );
            }
        }
        if !any {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    eprintln!(
        "[reads] answered: non-stable {}, stable {}; before the last acknowledged commit: non-stable {}, stable {}",
        answered[0], answered[1], behind[0], behind[1]
    );
    probe.close().await;
    admin.close().await;
    blocking(|| cluster.node(coordinator).restart());
    assert_eq!(
        behind[1], 0,
        "stable reads missed the acknowledged commit {acked}"
    );
}

/// `(leader, isr)` of `topic`/`partition` as node `addr` sees it (`None` if it does not
/// answer).
async fn partition_state(addr: &str, topic: &str, partition: i32) -> Option<(i32, Vec<i32>)> {
    let conn = Conn::connect(addr).await.ok()?;
    let md = conn.metadata(Some(&[topic])).await.ok();
    conn.close().await;
    let md = md?;
    let p = md
        .topic(topic)?
        .partitions
        .iter()
        .find(|p| p.id == partition)?
        .clone();
    let mut isr = p.isr;
    isr.sort();
    Some((p.leader, isr))
}

/// Polls [`partition_state`] on `addr` until `ok` holds (90 s at most).
async fn wait_partition(
    addr: &str,
    topic: &str,
    what: &str,
    ok: impl Fn(i32, &[i32]) -> bool,
) -> (i32, Vec<i32>) {
    let t0 = Instant::now();
    loop {
        if let Some((leader, isr)) = partition_state(addr, topic, 0).await {
            if ok(leader, &isr) {
                return (leader, isr);
            }
        }
        assert!(
            t0.elapsed() < Duration::from_secs(90),
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Produce values `"{tag}{i}"` for `i` in `range` to `topic`/0, acks=all, one flush.
async fn produce_tagged(bootstrap: &[String], topic: &str, tag: &str, range: std::ops::Range<i64>) {
    let mut writer = Writer::new(
        WriterConfig::new(bootstrap.to_vec())
            .topic(topic)
            .required_acks(RequiredAcks::All),
    )
    .unwrap();
    for i in range {
        writer
            .feed(Message::new(format!("{tag}{i}")).with_partition(0))
            .await
            .unwrap();
    }
    tokio::time::timeout(Duration::from_secs(120), writer.close())
        .await
        .expect("produce within 120 s")
        .unwrap();
}

/// Scenario 7, KIP-320: an unclean leader election truncates the log below what a reader
/// had read. Topic with one partition on nodes 2 and 3 (RF 2,
/// `unclean.leader.election.enable=true`, `min.insync.replicas=1`): 10 records reach both;
/// node 3 is frozen (SIGSTOP) and fenced out of the ISR; 10 more reach node 2 only, and
/// the reader reads all 20. Then node 2 dies (SIGKILL), node 3 resumes and becomes the
/// leader uncleanly with a log ending at offset 10, and takes 20 new records. (Nodes are
/// frozen rather than killed so that two of the three controller voters stay up.) The
/// reader, paused while this happens so that it cannot see the gap before the new
/// records fill it, must report the truncation with the offsets involved.
async fn reader_detects_log_truncation(cluster: &mut TestCluster) {
    let topic = unique_topic("truncation");
    let addr1 = cluster.node(1).addr.clone();
    {
        let conn = kafkapipe::conn::Connection::connect(&addr1, Default::default())
            .await
            .unwrap();
        let config = |name: &str, value: &str| CreatableTopicConfig {
            name: name.into(),
            value: Some(value.into()),
            ..Default::default()
        };
        let resp = conn
            .send(&CreateTopicsRequest {
                topics: vec![CreatableTopic {
                    name: topic.clone(),
                    num_partitions: -1,
                    replication_factor: -1,
                    assignments: vec![CreatableReplicaAssignment {
                        partition_index: 0,
                        broker_ids: vec![2, 3],
                        ..Default::default()
                    }],
                    configs: vec![
                        config("unclean.leader.election.enable", "true"),
                        config("min.insync.replicas", "1"),
                    ],
                    ..Default::default()
                }],
                timeout_ms: 30_000,
                ..Default::default()
            })
            .await
            .unwrap();
        assert_eq!(resp.topics[0].error_code, 0, "create topic: {resp:?}");
        conn.close().await;
    }
    let (leader, isr) = wait_partition(&addr1, &topic, "leader 2, ISR [2, 3]", |l, isr| {
        l == 2 && isr == [2, 3]
    })
    .await;
    eprintln!("[truncation] leader {leader}, isr {isr:?}");
    let bootstrap = vec![addr1.clone()];
    produce_tagged(&bootstrap, &topic, "old", 0..10).await;
    blocking(|| cluster.node(3).suspend());
    wait_partition(&addr1, &topic, "node 3 out of the ISR", |l, isr| {
        l == 2 && isr == [2]
    })
    .await;
    produce_tagged(&bootstrap, &topic, "old", 10..20).await;

    let mut reader = Reader::new(
        ReaderConfig::new(bootstrap.clone())
            .partition(&topic, 0)
            .offset_reset(OffsetReset::Error)
            .max_wait(Duration::from_millis(100))
            .read_backoff(Duration::from_millis(50), Duration::from_millis(500)),
    )
    .await
    .unwrap();
    for i in 0..20i64 {
        let m = tokio::time::timeout(Duration::from_secs(30), reader.next_message())
            .await
            .expect("a message within 30 s")
            .unwrap();
        assert_eq!(
            (m.offset, m.value.as_deref()),
            (i, Some(format!("old{i}").as_bytes()))
        );
    }
    let tp = kafkapipe::reader::TopicPartition::new(topic.as_str(), 0);
    reader.handle().pause(std::slice::from_ref(&tp));

    blocking(|| cluster.node(2).kill());
    blocking(|| cluster.node(3).resume());
    // Once node 2 is fenced, the controller elects node 3 uncleanly by itself (the
    // topic enables it); should the partition stay leaderless, Kafka's
    // kafka-leader-election.sh forces the unclean election.
    let (leader, _) =
        wait_partition(&addr1, &topic, "node 2 no longer leading", |l, _| l != 2).await;
    if leader < 0 {
        let t0 = Instant::now();
        loop {
            let (ok, out) = blocking(|| cluster.elect_leader("unclean", &topic, 0));
            if ok {
                break;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(90),
                "unclean election failed: {out}"
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
    let (leader, isr) = wait_partition(&addr1, &topic, "node 3 leading", |l, _| l == 3).await;
    eprintln!("[truncation] unclean election: leader {leader}, isr {isr:?}");
    let end = log_end(&addr1, &topic, 0).await;
    assert_eq!(
        end, 10,
        "the new leader's log should end where node 3 was frozen"
    );
    produce_tagged(&bootstrap, &topic, "new", 10..30).await;

    reader.handle().resume(std::slice::from_ref(&tp));
    let got = tokio::time::timeout(Duration::from_secs(60), reader.next_message())
        .await
        .expect("an item within 60 s");
    let err = match got {
        Ok(m) => panic!(
            "read {:?}@{} from the truncated log without noticing the truncation",
            m.value.as_deref().map(String::from_utf8_lossy),
            m.offset
        ),
        Err(e) => e,
    };
    eprintln!("[truncation] reader: {err}");
    let t = std::error::Error::source(&err)
        .and_then(|s| s.downcast_ref::<LogTruncation>())
        .unwrap_or_else(|| panic!("no LogTruncation in {err}"));
    assert_eq!((t.topic.as_str(), t.partition), (topic.as_str(), 0));
    assert_eq!((t.position, t.fetch_offset), (20, 20));
    assert_eq!(t.divergent_offset, Some(10), "{t}");
    assert!(t.leader_epoch > t.epoch, "{t}");
    assert_eq!(reader.stats().log_truncations, 1);
    // From the divergent offset the new records follow.
    reader.seek(&topic, 0, 10).unwrap();
    let m = tokio::time::timeout(Duration::from_secs(30), reader.next_message())
        .await
        .expect("a message within 30 s")
        .unwrap();
    assert_eq!((m.offset, m.value.as_deref()), (10, Some(&b"new10"[..])));
    assert_eq!(m.leader_epoch(), Some(t.leader_epoch));
    reader.close().await;
    blocking(|| cluster.node(2).restart());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_scenarios() {
    capture::init();
    let t0 = Instant::now();
    let mut cluster = blocking(|| TestCluster::start(3));
    eprintln!("cluster of 3 ready in {:?}", t0.elapsed());
    if wanted(1) {
        let t = Instant::now();
        writer_survives_leader_loss(&mut cluster, Stop::Kill).await;
        eprintln!("scenario 1 passed in {:?}", t.elapsed());
    }
    if wanted(4) {
        let t = Instant::now();
        reader_reads_through_leader_change(&mut cluster).await;
        eprintln!("scenario 4 passed in {:?}", t.elapsed());
    }
    if wanted(2) {
        let t = Instant::now();
        writer_survives_leader_loss(&mut cluster, Stop::Terminate).await;
        eprintln!("scenario 2 passed in {:?}", t.elapsed());
    }
    if wanted(3) {
        let t = Instant::now();
        group_survives_leader_and_coordinator_loss(
            &mut cluster,
            kafkapipe::group::GroupProtocol::Classic,
        )
        .await;
        eprintln!("scenario 3 passed in {:?}", t.elapsed());
    }
    if wanted(5) {
        // the same with KIP-848 members: the member epoch survives the coordinator move
        let t = Instant::now();
        group_survives_leader_and_coordinator_loss(
            &mut cluster,
            kafkapipe::group::GroupProtocol::Consumer,
        )
        .await;
        eprintln!("scenario 5 (KIP-848) passed in {:?}", t.elapsed());
    }
    if wanted(6) {
        let t = Instant::now();
        stable_offset_reads_through_coordinator_loss(&mut cluster).await;
        eprintln!("scenario 6 passed in {:?}", t.elapsed());
    }
    if wanted(7) {
        let t = Instant::now();
        reader_detects_log_truncation(&mut cluster).await;
        eprintln!("scenario 7 (log truncation) passed in {:?}", t.elapsed());
    }
    eprintln!("all scenarios in {:?}", t0.elapsed());
}
