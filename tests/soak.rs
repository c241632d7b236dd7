//! Soak on a 3-node Apache Kafka cluster: idempotent writers and a 3-member group pipeline
//! run while a random node is SIGKILLed and restarted every period and client connections
//! are cut through TCP proxies (every node advertises a proxy in front of its client
//! listener). Prints one JSON summary line
//! `{produced, consumed, lost, duplicated, redelivered, kills, cuts, rebalances, ...,
//! max_rss_mb}` and fails on any lost record (acknowledged to a writer, never consumed) or
//! duplicated record (the same content at two offsets).
//!
//! `KAFKAPIPE_SOAK_SECS` (default 30) sets how long the load and the chaos run;
//! `KAFKAPIPE_SOAK_KILL_EVERY_SECS` the kill period (default 30, at most half the run).
//! `cargo test --test soak -- --nocapture` shows the summary.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::proxy::Proxy;
use common::TestCluster;
use futures::{SinkExt, StreamExt};
use kafkapipe::conn::RequiredAcks;
use kafkapipe::group::GroupEvent;
use kafkapipe::reader::{Reader, ReaderConfig};
use kafkapipe::writer::{Message, Writer, WriterConfig};

const PARTITIONS: i32 = 6;
const WRITERS: usize = 2;
const MEMBERS: usize = 3;
const CHUNK: usize = 50;

fn env_secs(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A small xorshift generator: chaos needs variety, not quality.
struct Rng(u64);
impl Rng {
    fn new() -> Rng {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1)
            | 1;
        eprintln!("soak seed {seed}");
        Rng(seed)
    }
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}

/// What the consumers saw: content -> every (partition, offset) it was read at, and how
/// many times in all.
#[derive(Default)]
struct Seen {
    at: HashMap<String, HashSet<(i32, i64)>>,
    deliveries: u64,
}

#[derive(Default)]
struct Counters {
    reader_errors: AtomicU64,
    write_errors: AtomicU64,
    rebalances: AtomicU64,
    lost_events: AtomicU64,
    member_restarts: AtomicU64,
}

/// One writer: chunks of `CHUNK` keyed messages, each chunk flushed; a chunk counts as
/// produced only once its flush succeeded. A failed flush leaves its chunk unconfirmed
/// (neither counted as produced nor as lost) and the writer is replaced.
async fn run_writer(
    id: usize,
    bootstrap: Vec<String>,
    topic: String,
    stop: Arc<AtomicBool>,
    confirmed: Arc<Mutex<HashSet<String>>>,
    counters: Arc<Counters>,
) {
    let config = || {
        WriterConfig::new(bootstrap.clone())
            .topic(&topic)
            .required_acks(RequiredAcks::All)
            .idempotent(true)
            .batch_timeout(Duration::from_millis(5))
    };
    let mut writer = Writer::new(config()).unwrap();
    let mut seq = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let chunk: Vec<String> = (0..CHUNK)
            .map(|i| format!("w{id}-{}", seq + i as u64))
            .collect();
        seq += CHUNK as u64;
        let mut ok = true;
        for c in &chunk {
            // Keys cycle over a few hundred values so per-key order spans chunks.
            let key = format!("key-{id}-{}", seq % 300);
            if writer.feed(Message::keyed(key, c.clone())).await.is_err() {
                ok = false;
                break;
            }
        }
        if ok {
            match tokio::time::timeout(Duration::from_secs(120), writer.flush()).await {
                Ok(Ok(())) => confirmed.lock().unwrap().extend(chunk),
                Ok(Err(e)) => {
                    eprintln!("writer {id}: flush failed: {e}");
                    ok = false;
                }
                Err(_) => {
                    eprintln!("writer {id}: flush stalled for 120 s");
                    ok = false;
                }
            }
        }
        if !ok {
            counters.write_errors.fetch_add(1, Ordering::Relaxed);
            writer = Writer::new(config()).unwrap();
        }
    }
    let _ = writer.close().await;
}

/// One group member: reads, records what it saw, hands every message to its committer.
/// A member whose stream ends or fails for good is replaced (counted as a restart).
#[allow(clippy::too_many_arguments)]
async fn run_member(
    name: usize,
    bootstrap: Vec<String>,
    topic: String,
    group: String,
    stop: Arc<AtomicBool>,
    seen: Arc<Mutex<Seen>>,
    counters: Arc<Counters>,
) {
    while !stop.load(Ordering::Relaxed) {
        let config = ReaderConfig::new(bootstrap.clone())
            .group_id(&group)
            .topic(&topic)
            .client_id(format!("soak-member-{name}"))
            .max_wait(Duration::from_millis(100))
            .session_timeout(Duration::from_secs(10))
            .heartbeat_interval(Duration::from_millis(500))
            .rebalance_timeout(Duration::from_secs(10));
        let mut reader = match Reader::new(config).await {
            Ok(r) => r,
            Err(e) => {
                eprintln!("member {name}: reader: {e}");
                counters.member_restarts.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
        };
        let mut committer = reader.committer().unwrap();
        let mut events = reader.events().unwrap();
        let counters2 = counters.clone();
        let watcher = tokio::spawn(async move {
            while let Some(e) = events.next().await {
                match e {
                    GroupEvent::Assigned { .. } => {
                        counters2.rebalances.fetch_add(1, Ordering::Relaxed);
                    }
                    GroupEvent::Lost { .. } => {
                        counters2.lost_events.fetch_add(1, Ordering::Relaxed);
                    }
                    GroupEvent::Revoked { .. } => {}
                }
            }
        });
        let mut ended = false;
        while !stop.load(Ordering::Relaxed) {
            let item = tokio::time::timeout(Duration::from_millis(200), reader.next()).await;
            match item {
                Err(_) => continue,
                Ok(None) => {
                    ended = true;
                    break;
                }
                Ok(Some(Err(e))) => {
                    counters.reader_errors.fetch_add(1, Ordering::Relaxed);
                    eprintln!("member {name}: {e}");
                }
                Ok(Some(Ok(m))) => {
                    let content =
                        String::from_utf8_lossy(m.value.as_deref().unwrap_or_default()).to_string();
                    {
                        let mut s = seen.lock().unwrap();
                        s.deliveries += 1;
                        s.at.entry(content)
                            .or_default()
                            .insert((m.partition, m.offset));
                    }
                    if let Err(e) = committer.feed(&m).await {
                        eprintln!("member {name}: commit: {e}");
                    }
                }
            }
        }
        let _ = SinkExt::<&kafkapipe::reader::Message>::flush(&mut committer).await;
        reader.close().await;
        watcher.abort();
        if ended && !stop.load(Ordering::Relaxed) {
            eprintln!("member {name}: stream ended; replacing the member");
            counters.member_restarts.fetch_add(1, Ordering::Relaxed);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soak_on_a_three_node_cluster_with_kills_and_cuts() {
    common::init_log();
    let secs = env_secs("KAFKAPIPE_SOAK_SECS", 30);
    let kill_every = env_secs("KAFKAPIPE_SOAK_KILL_EVERY_SECS", 30)
        .min(secs / 2)
        .max(5);

    let mut proxies = Vec::new();
    let mut listeners = Vec::new();
    for _ in 0..3 {
        let (p, l) = Proxy::bind().await;
        proxies.push(p);
        listeners.push(l);
    }
    let advertised: Vec<String> = proxies.iter().map(|p| p.addr.clone()).collect();
    let cluster = tokio::task::spawn_blocking(move || TestCluster::start_proxied(&advertised))
        .await
        .unwrap();
    for ((p, l), node) in proxies.iter().zip(listeners).zip(&cluster.nodes) {
        p.run(l, node.addr.clone());
    }
    let bootstrap: Vec<String> = proxies.iter().map(|p| p.addr.clone()).collect();
    let topic = common::unique_topic("soak");
    let group = common::unique_topic("soak-g");
    let cluster = Arc::new(Mutex::new(cluster));
    {
        let cluster = cluster.clone();
        let topic = topic.clone();
        tokio::task::spawn_blocking(move || {
            cluster.lock().unwrap().create_topic(&topic, PARTITIONS)
        })
        .await
        .unwrap();
    }

    let stop_writers = Arc::new(AtomicBool::new(false));
    let stop_members = Arc::new(AtomicBool::new(false));
    let confirmed = Arc::new(Mutex::new(HashSet::new()));
    let seen = Arc::new(Mutex::new(Seen::default()));
    let counters = Arc::new(Counters::default());

    let members: Vec<_> = (0..MEMBERS)
        .map(|i| {
            tokio::spawn(run_member(
                i,
                bootstrap.clone(),
                topic.clone(),
                group.clone(),
                stop_members.clone(),
                seen.clone(),
                counters.clone(),
            ))
        })
        .collect();
    let writers: Vec<_> = (0..WRITERS)
        .map(|i| {
            tokio::spawn(run_writer(
                i,
                bootstrap.clone(),
                topic.clone(),
                stop_writers.clone(),
                confirmed.clone(),
                counters.clone(),
            ))
        })
        .collect();

    // Chaos: every `kill_every` a random node is SIGKILLed, stays down long enough to be
    // fenced (broker.session.timeout.ms is 3 s) and is restarted; every 3 s the client
    // connections through one proxy are cut.
    let started = Instant::now();
    let mut rng = Rng::new();
    let (mut kills, mut cuts) = (0u64, 0u64);
    let mut next_kill = started + Duration::from_secs(kill_every / 2);
    let mut next_cut = started + Duration::from_secs(3);
    while started.elapsed() < Duration::from_secs(secs) {
        let now = Instant::now();
        if now >= next_kill {
            let id = rng.below(3) as i32 + 1;
            eprintln!("[{:?}] SIGKILL node {id}", started.elapsed());
            let c = cluster.clone();
            tokio::task::spawn_blocking(move || c.lock().unwrap().node(id).kill())
                .await
                .unwrap();
            kills += 1;
            tokio::time::sleep(Duration::from_secs(5)).await;
            let c = cluster.clone();
            tokio::task::spawn_blocking(move || c.lock().unwrap().node(id).restart())
                .await
                .unwrap();
            eprintln!("[{:?}] node {id} back", started.elapsed());
            next_kill = Instant::now() + Duration::from_secs(kill_every);
        } else if now >= next_cut {
            let i = rng.below(3);
            proxies[i].cut();
            cuts += 1;
            next_cut = now + Duration::from_secs(3);
        } else {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    stop_writers.store(true, Ordering::Relaxed);
    for w in writers {
        w.await.unwrap();
    }
    let produced: HashSet<String> = confirmed.lock().unwrap().clone();
    // Drain: the members keep going until every acknowledged record was read.
    let drain = Instant::now();
    loop {
        let missing = {
            let s = seen.lock().unwrap();
            produced.iter().filter(|c| !s.at.contains_key(*c)).count()
        };
        if missing == 0 || drain.elapsed() > Duration::from_secs(90) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    stop_members.store(true, Ordering::Relaxed);
    for m in members {
        m.await.unwrap();
    }

    let s = seen.lock().unwrap();
    let lost: Vec<&String> = produced.iter().filter(|c| !s.at.contains_key(*c)).collect();
    let duplicated: Vec<(&String, &HashSet<(i32, i64)>)> =
        s.at.iter().filter(|(_, at)| at.len() > 1).collect();
    let consumed = s.at.len() as u64;
    let summary = serde_json::json!({
        "secs": secs,
        "produced": produced.len(),
        "consumed": consumed,
        "lost": lost.len(),
        "duplicated": duplicated.len(),
        "redelivered": s.deliveries - s.at.values().map(|a| a.len() as u64).sum::<u64>(),
        "unconfirmed_consumed": s.at.keys().filter(|c| !produced.contains(*c)).count(),
        "kills": kills,
        "cuts": cuts,
        "rebalances": counters.rebalances.load(Ordering::Relaxed),
        "lost_assignments": counters.lost_events.load(Ordering::Relaxed),
        "member_restarts": counters.member_restarts.load(Ordering::Relaxed),
        "reader_errors": counters.reader_errors.load(Ordering::Relaxed),
        "write_errors": counters.write_errors.load(Ordering::Relaxed),
        "drain_secs": drain.elapsed().as_secs_f64(),
        "max_rss_mb": common::proc_memory_mib("self", "VmHWM").unwrap_or(0),
    });
    println!("{summary}");
    assert!(!produced.is_empty(), "nothing was produced");
    assert!(
        lost.is_empty(),
        "{} acknowledged records never consumed, e.g. {:?}",
        lost.len(),
        &lost[..lost.len().min(5)]
    );
    assert!(
        duplicated.is_empty(),
        "{} records at more than one offset, e.g. {:?}",
        duplicated.len(),
        &duplicated[..duplicated.len().min(5)]
    );
}
