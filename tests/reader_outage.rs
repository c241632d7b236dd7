//! Pipelines across a broker outage, against a dedicated Apache Kafka node that the tests
//! SIGKILL and restart: a transient fault (the broker gone for 10 s) must never end a
//! `forward` pipeline — no error item, nothing lost, commits resume — while a fatal error
//! (an out-of-range offset with no reset policy) still ends it promptly.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{SinkExt, StreamExt, TryStreamExt};
use kafkapipe::admin::Admin;
use kafkapipe::conn::{Conn, ProduceOptions};
use kafkapipe::group::CommitMode;
use kafkapipe::protocol::ErrorCode;
use kafkapipe::reader::{OffsetReset, Reader, ReaderConfig, StartOffset};
use kafkapipe::record::Record;

const PARTITIONS: i32 = 3;
/// Records per partition produced before the outage, and again after it.
const PER_PHASE: usize = 200;
/// How long the broker stays down.
const OUTAGE: Duration = Duration::from_secs(10);

async fn start_broker() -> common::TestBroker {
    tokio::task::spawn_blocking(common::TestBroker::start)
        .await
        .unwrap()
}

async fn new_topic(addr: &str, prefix: &str) -> String {
    let topic = common::unique_topic(prefix);
    let conn = Conn::connect(addr).await.unwrap();
    conn.create_topic(&topic, PARTITIONS, 1).await.unwrap();
    common::wait_for_topic(&conn, &topic, PARTITIONS).await;
    conn.close().await;
    topic
}

/// Produce records `from..from + n` (`"{partition}-{i}"`) to every partition, retrying
/// retriable errors for a while (a restarted broker takes its partitions back a moment
/// after it answers Metadata).
async fn produce(addr: &str, topic: &str, from: usize, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut conn = Conn::connect(addr).await.unwrap();
    for p in 0..PARTITIONS {
        let records: Vec<Record> = (from..from + n)
            .map(|i| Record::new(format!("k{i}"), format!("{p}-{i}")))
            .collect();
        loop {
            match conn
                .produce(topic, p, &records, &ProduceOptions::default())
                .await
            {
                Ok(_) => break,
                Err(e) if e.is_retriable() && Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    if e.kafka_code().is_none() {
                        if let Ok(c) = Conn::connect(addr).await {
                            conn = c;
                        }
                    }
                }
                Err(e) => panic!("produce to {topic}/{p}: {e}"),
            }
        }
    }
    conn.close().await;
}

type Seen = Arc<Mutex<BTreeSet<(i32, i64)>>>;
type Duplicates = Arc<std::sync::atomic::AtomicUsize>;

/// A running pipeline: `reader → inspect (record) → sink`, until `stop` fires. Its task
/// returns the pipeline's result and the reader (to close it).
struct Pipeline {
    seen: Seen,
    /// Records delivered more than once.
    duplicates: Duplicates,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<(kafkapipe::Result<()>, Reader)>,
}

impl Pipeline {
    /// Panics with the pipeline's result if it already ended: an error item ended it.
    async fn assert_running(&mut self, when: &str) {
        if self.task.is_finished() {
            let (r, _) = (&mut self.task).await.unwrap();
            panic!("the pipeline ended {when}: {r:?}");
        }
    }

    /// Waits (checking the pipeline is still running) until `done` holds for the seen
    /// records.
    async fn wait_for(
        &mut self,
        what: &str,
        within: Duration,
        done: impl Fn(&BTreeSet<(i32, i64)>) -> bool,
    ) {
        let deadline = Instant::now() + within;
        loop {
            self.assert_running(&format!("while waiting for {what}"))
                .await;
            if done(&self.seen.lock().unwrap()) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: not within {within:?} ({} records seen)",
                self.seen.lock().unwrap().len()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Ends the pipeline (the stream ends, the sink is closed) and returns the reader.
    async fn stop(mut self) -> Reader {
        self.assert_running("before it was stopped").await;
        let _ = self.stop.take().map(|s| s.send(()));
        let (r, reader) = tokio::time::timeout(Duration::from_secs(60), self.task)
            .await
            .expect("the pipeline stops")
            .unwrap();
        r.expect("the pipeline ends without an error");
        reader
    }
}

fn spawn_pipeline<S>(mut reader: Reader, sink: S) -> Pipeline
where
    S: futures::Sink<kafkapipe::reader::Message, Error = kafkapipe::Error> + Send + 'static,
{
    let seen: Seen = Arc::default();
    let duplicates: Duplicates = Arc::default();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let record = seen.clone();
    let twice = duplicates.clone();
    let task = tokio::spawn(async move {
        let r = (&mut reader)
            .take_until(stopped)
            .inspect_ok(move |m| {
                if !record.lock().unwrap().insert((m.partition, m.offset)) {
                    twice.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                assert_eq!(
                    m.value.as_deref(),
                    Some(format!("{}-{}", m.partition, m.offset).as_bytes())
                );
            })
            .forward(sink)
            .await;
        (r, reader)
    });
    Pipeline {
        seen,
        duplicates,
        stop: Some(stop),
        task,
    }
}

/// Every offset `0..n` of every partition.
fn all_up_to(n: usize) -> impl Fn(&BTreeSet<(i32, i64)>) -> bool {
    move |seen| (0..PARTITIONS).all(|p| (0..n as i64).all(|o| seen.contains(&(p, o))))
}

/// SIGKILL the broker, keep it down for `OUTAGE` (the pipeline must not end meanwhile),
/// restart it.
async fn outage(mut broker: common::TestBroker, pipeline: &mut Pipeline) -> common::TestBroker {
    let mut broker = tokio::task::spawn_blocking(move || {
        broker.node.kill();
        broker
    })
    .await
    .unwrap();
    let down = Instant::now();
    while down.elapsed() < OUTAGE {
        pipeline.assert_running("during the outage").await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let broker = tokio::task::spawn_blocking(move || {
        broker.node.restart();
        broker
    })
    .await
    .unwrap();
    eprintln!("broker down for {:?}", down.elapsed());
    pipeline.assert_running("after the restart").await;
    broker
}

async fn committed(addr: &str, group: &str, topic: &str) -> BTreeMap<i32, i64> {
    let admin = Admin::connect([addr.to_string()]).unwrap();
    let mut out = BTreeMap::new();
    if let Ok(offsets) = admin.fetch_group_offsets(group, Some(&[topic])).await {
        for (tp, r) in offsets {
            if let Ok(c) = r {
                out.insert(tp.partition, c.offset);
            }
        }
    }
    out
}

/// A group reader forwarding into its committer survives a 10 s outage of its only
/// broker (fetch connections, the coordinator and `__consumer_offsets` all gone): no error
/// item ends the pipeline, every record before and after is consumed once, and the
/// commits resume up to the end of every partition.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_pipeline_survives_a_broker_outage() {
    common::init_log();
    let broker = start_broker().await;
    let addr = broker.addr.clone();
    let topic = new_topic(&addr, "outage-group").await;
    let group = common::unique_topic("outage-group-g");
    produce(&addr, &topic, 0, PER_PHASE).await;
    let reader = Reader::new(
        ReaderConfig::new([addr.clone()])
            .group_id(&group)
            .topic(&topic)
            .max_wait(Duration::from_millis(100))
            .heartbeat_interval(Duration::from_millis(500))
            .commit_mode(CommitMode::Interval(Duration::from_millis(200))),
    )
    .await
    .unwrap();
    let committer = reader.committer().unwrap();
    let mut pipeline = spawn_pipeline(reader, committer);
    pipeline
        .wait_for(
            "the records produced before the outage",
            Duration::from_secs(60),
            all_up_to(PER_PHASE),
        )
        .await;
    let broker = outage(broker, &mut pipeline).await;
    produce(&addr, &topic, PER_PHASE, PER_PHASE).await;
    pipeline
        .wait_for(
            "every record produced before and after the outage",
            Duration::from_secs(120),
            all_up_to(2 * PER_PHASE),
        )
        .await;
    assert_eq!(
        pipeline.seen.lock().unwrap().len(),
        PARTITIONS as usize * 2 * PER_PHASE
    );
    // the interval commits resume after the outage and reach the end of every partition
    let end: BTreeMap<i32, i64> = (0..PARTITIONS).map(|p| (p, 2 * PER_PHASE as i64)).collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        pipeline
            .assert_running("while waiting for the commits")
            .await;
        let c = committed(&addr, &group, &topic).await;
        if c == end {
            break;
        }
        assert!(Instant::now() < deadline, "commits stuck at {c:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // A membership lost in the outage may redeliver what was acked but not committed.
    let duplicates = pipeline
        .duplicates
        .load(std::sync::atomic::Ordering::Relaxed);
    let mut reader = pipeline.stop().await;
    let stats = reader.stats();
    eprintln!("duplicates: {duplicates}, stats: {stats:?}");
    assert!(stats.retries > 0, "the outage was retried: {stats:?}");
    assert!(stats.last_error.is_some(), "{stats:?}");
    reader.close().await;
    drop(broker);
}

/// A plain reader of explicit partitions forwarding into a sink that counts survives a
/// 10 s outage of its only broker the same way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partition_pipeline_survives_a_broker_outage() {
    common::init_log();
    let broker = start_broker().await;
    let addr = broker.addr.clone();
    let topic = new_topic(&addr, "outage-plain").await;
    produce(&addr, &topic, 0, PER_PHASE).await;
    let reader = Reader::new(
        ReaderConfig::new([addr.clone()])
            .partitions(&topic, 0..PARTITIONS)
            .max_wait(Duration::from_millis(100)),
    )
    .await
    .unwrap();
    let sink = futures::sink::drain().sink_map_err(|e: Infallible| match e {});
    let mut pipeline = spawn_pipeline(reader, sink);
    pipeline
        .wait_for(
            "the records produced before the outage",
            Duration::from_secs(60),
            all_up_to(PER_PHASE),
        )
        .await;
    let broker = outage(broker, &mut pipeline).await;
    produce(&addr, &topic, PER_PHASE, PER_PHASE).await;
    pipeline
        .wait_for(
            "every record produced before and after the outage",
            Duration::from_secs(120),
            all_up_to(2 * PER_PHASE),
        )
        .await;
    assert_eq!(
        pipeline.seen.lock().unwrap().len(),
        PARTITIONS as usize * 2 * PER_PHASE
    );
    // no group: the reader resumes at its next offset, nothing is delivered twice
    assert_eq!(
        pipeline
            .duplicates
            .load(std::sync::atomic::Ordering::Relaxed),
        0
    );
    let mut reader = pipeline.stop().await;
    let stats = reader.stats();
    eprintln!("stats: {stats:?}");
    assert!(stats.retries > 0, "the outage was retried: {stats:?}");
    assert!(
        stats
            .last_error
            .as_deref()
            .is_some_and(|e| e.contains(&topic)),
        "{stats:?}"
    );
    reader.close().await;
    drop(broker);
}

/// A fatal error still ends a pipeline promptly: a plain reader of an explicit partition
/// starting past the end of the log, with no reset policy (`OffsetReset::Error`), yields
/// `OffsetOutOfRange`, and `forward` returns it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_range_without_reset_policy_ends_the_pipeline() {
    common::init_log();
    let addr = common::shared().addr.clone();
    let topic = new_topic(&addr, "outage-fatal").await;
    produce(&addr, &topic, 0, 10).await;
    let mut reader = Reader::new(
        ReaderConfig::new([addr.clone()])
            .partition(&topic, 1)
            .start_offset(StartOffset::At(1_000))
            .offset_reset(OffsetReset::Error)
            .max_wait(Duration::from_millis(100)),
    )
    .await
    .unwrap();
    let sink = futures::sink::drain().sink_map_err(|e: Infallible| match e {});
    let err = tokio::time::timeout(Duration::from_secs(30), (&mut reader).forward(sink))
        .await
        .expect("the pipeline ends promptly")
        .expect_err("an error ends it");
    assert_eq!(err.kafka_code(), Some(ErrorCode::OffsetOutOfRange), "{err}");
    assert_eq!(err.partition(), Some(1));
    reader.close().await;
}
