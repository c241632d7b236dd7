//! Exactly-once consume → transform → produce pipelines on Apache Kafka (the shared
//! single-node test broker): a group `Reader` → user combinators → an
//! [`ExactlyOnceSink`](kafkapipe::writer::ExactlyOnceSink), whose transactions carry the
//! consumed offsets with the produced records (KIP-447). Every scenario runs on both
//! transaction protocols (`NAME::v1`: AddPartitionsToTxn/AddOffsetsToTxn; `NAME::v2`:
//! KIP-890 transactions v2, partitions and the group joining through Produce v12 and
//! TxnOffsetCommit v5, a new epoch from each EndTxn v5).
//!
//! Each test reads the output with read_committed and checks that every kept input is in
//! it exactly once (count and content), and that the group's committed offsets are the
//! input's end offsets: a pipeline over 3 partitions with a filter; a pipeline dropped in
//! the middle of a transaction (a crash) and restarted with the same transactional id (the
//! new writer fences the old one and aborts its transaction); two members with their own
//! transactional ids, the second joining in the middle (a rebalance revokes partitions
//! from the first: its open transaction is aborted before they are given up), eager and
//! cooperative; an unordered concurrent stage (results out of input order) with a crash;
//! a running pipeline fenced by a new writer with its transactional id (a zombie: it ends
//! with the fatal error).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use futures::{future, StreamExt, TryStreamExt};
use kafkapipe::admin::Admin;
use kafkapipe::conn::{Conn, IsolationLevel, ProduceOptions};
use kafkapipe::reader::{Reader, ReaderConfig, ReaderHandle, StartOffset};
use kafkapipe::record::Record;
use kafkapipe::writer::{
    Message, PipelineConfig, PipelineStats, TransactionalWriter, WriterConfig,
};

const PARTITIONS: i32 = 3;

fn addr() -> String {
    common::shared().addr.clone()
}

async fn topic(prefix: &str, partitions: i32) -> String {
    let topic = common::unique_topic(prefix);
    let conn = Conn::connect(&addr()).await.unwrap();
    conn.create_topic(&topic, partitions, 1).await.unwrap();
    common::wait_for_topic(&conn, &topic, partitions).await;
    conn.close().await;
    topic
}

/// Produce `n` values `v<i>` round robin over the partitions of `topic` (not
/// transactional): the end offset of each partition.
async fn produce_input(topic: &str, n: usize) -> BTreeMap<i32, i64> {
    let conn = Conn::connect(&addr()).await.unwrap();
    let mut ends = BTreeMap::new();
    for p in 0..PARTITIONS {
        let values: Vec<usize> = (0..n).filter(|i| *i as i32 % PARTITIONS == p).collect();
        for chunk in values.chunks(1000) {
            let records: Vec<Record> = chunk
                .iter()
                .map(|i| Record::new(format!("k{i}"), format!("v{i}")))
                .collect();
            conn.produce(topic, p, &records, &ProduceOptions::default())
                .await
                .unwrap();
        }
        ends.insert(p, values.len() as i64);
    }
    conn.close().await;
    ends
}

/// The filter of every test: inputs whose number is a multiple of 7 are left out.
fn kept(i: usize) -> bool {
    i % 7 != 0
}

fn number(value: &[u8]) -> Option<usize> {
    std::str::from_utf8(value)
        .ok()?
        .strip_prefix('v')?
        .parse()
        .ok()
}

fn expected(n: usize) -> Vec<String> {
    (0..n)
        .filter(|i| kept(*i))
        .map(|i| format!("V{i}"))
        .collect()
}

fn group_reader_config(input: &str, group: &str) -> ReaderConfig {
    ReaderConfig::new([addr()])
        .group_id(group)
        .topic(input)
        .start_offset(StartOffset::First)
        .isolation_level(IsolationLevel::ReadCommitted)
        .max_wait(Duration::from_millis(50))
        .session_timeout(Duration::from_secs(6))
        .rebalance_timeout(Duration::from_secs(10))
        .heartbeat_interval(Duration::from_millis(500))
}

fn writer_config(output: &str, txn_id: &str) -> WriterConfig {
    WriterConfig::new([addr()])
        .topic(output)
        // transactions over every output partition
        .balancer(kafkapipe::writer::RoundRobin::default())
        .transactional_id(txn_id)
        .transaction_timeout(Duration::from_secs(30))
        .transaction_protocol(common::txn_protocol())
}

// Every scenario runs on both transaction protocols (`NAME::v1`, `NAME::v2`).
crate::on_both_txn_protocols!(
    a_pipeline_writes_each_kept_input_exactly_once_and_commits_the_input_end,
    a_crashed_pipeline_is_fenced_by_its_successor_and_the_output_stays_exactly_once,
    an_unordered_stage_with_a_crash_still_writes_each_input_exactly_once,
    two_members_with_a_rebalance_in_the_middle_write_each_input_exactly_once,
    two_cooperative_members_with_a_rebalance_in_the_middle_write_each_input_exactly_once,
    a_fenced_zombie_pipeline_ends_with_the_fatal_error_and_its_successor_finishes,
);

/// The pipeline of every test: keep, uppercase, write (each output message carries the
/// ack token of its input, which is how the sink knows the consumed position).
/// `slow` sleeps that long per message. Runs until the reader is closed.
async fn run_pipeline(
    reader: Reader,
    output: String,
    txn_id: String,
    config: PipelineConfig,
    slow: Option<Duration>,
) -> kafkapipe::Result<PipelineStats> {
    let handle = reader.handle();
    let mut sink = TransactionalWriter::new(writer_config(&output, &txn_id))?
        .pipeline(&handle, config)
        .await?;
    let result = reader
        .try_filter(|m| future::ready(m.value.as_deref().and_then(number).is_some_and(kept)))
        .and_then(|mut m| async move {
            if let Some(d) = slow {
                tokio::time::sleep(d).await;
            }
            let upper = m
                .value
                .as_deref()
                .map(|v| v.to_ascii_uppercase())
                .unwrap_or_default();
            Ok(Message::new(upper).with_ack(m.take_ack_token()))
        })
        .forward(&mut sink)
        .await;
    result?;
    Ok(sink.stats())
}

/// The input of partition 0 that [`run_unordered_pipeline`] processes slowly.
const SLOW_OFFSET: i64 = 300;

/// The pipeline of [`run_pipeline`] with a concurrent, unordered stage: up to 16 inputs
/// in flight, each taking 0-6 ms (partition 0's input at [`SLOW_OFFSET`]: 3 s), so
/// results reach the sink out of input order.
async fn run_unordered_pipeline(
    reader: Reader,
    output: String,
    txn_id: String,
    config: PipelineConfig,
) -> kafkapipe::Result<PipelineStats> {
    let handle = reader.handle();
    let mut sink = TransactionalWriter::new(writer_config(&output, &txn_id))?
        .pipeline(&handle, config)
        .await?;
    let result = reader
        .try_filter(|m| future::ready(m.value.as_deref().and_then(number).is_some_and(kept)))
        .map_ok(|mut m| async move {
            // one input takes 3 s: the results of the inputs after it (partition 0) are
            // written long before its own
            let pause = if m.partition == 0 && m.offset == SLOW_OFFSET {
                Duration::from_secs(3)
            } else {
                Duration::from_millis((m.offset % 7) as u64)
            };
            tokio::time::sleep(pause).await;
            let upper = m
                .value
                .as_deref()
                .map(|v| v.to_ascii_uppercase())
                .unwrap_or_default();
            Ok(Message::new(upper).with_ack(m.take_ack_token()))
        })
        .try_buffer_unordered(16)
        .forward(&mut sink)
        .await;
    result?;
    Ok(sink.stats())
}

/// Every value of `topic` read with read_committed (in order of arrival, duplicates
/// kept), waiting until at least `expected` arrived, then a little longer for extras.
async fn read_committed(topic: &str, expected: usize) -> Vec<String> {
    let mut reader = Reader::new(
        ReaderConfig::new([addr()])
            .topic(topic)
            .isolation_level(IsolationLevel::ReadCommitted)
            .start_offset(StartOffset::First)
            .max_wait(Duration::from_millis(50)),
    )
    .await
    .unwrap();
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let wait = if out.len() >= expected {
            Duration::from_millis(1500)
        } else {
            deadline.saturating_duration_since(Instant::now())
        };
        match tokio::time::timeout(wait, reader.next()).await {
            Ok(Some(m)) => {
                let m = m.unwrap();
                out.push(String::from_utf8(m.value.unwrap().to_vec()).unwrap());
            }
            Ok(None) | Err(_) => break,
        }
    }
    reader.close().await;
    out
}

/// The number of records in `topic` read with read_uncommitted (aborted ones included).
async fn count_uncommitted(topic: &str) -> usize {
    let mut reader = Reader::new(
        ReaderConfig::new([addr()])
            .topic(topic)
            .isolation_level(IsolationLevel::ReadUncommitted)
            .start_offset(StartOffset::First)
            .max_wait(Duration::from_millis(50)),
    )
    .await
    .unwrap();
    let mut n = 0;
    while let Ok(Some(m)) = tokio::time::timeout(Duration::from_millis(1500), reader.next()).await {
        m.unwrap();
        n += 1;
    }
    reader.close().await;
    n
}

async fn committed_offsets(group: &str, topic: &str) -> BTreeMap<i32, i64> {
    // The group coordinator may still be loading its partitions while 13 scenarios start
    // at once on a fresh broker: in the full suite on Kafka 4.4, OffsetFetch answered
    // COORDINATOR_LOAD_IN_PROGRESS past the admin's default 4 attempts (0.7 s) in two
    // scenarios. Ride it out, as the readers do.
    let admin = Admin::connect([addr()])
        .unwrap()
        .with_retries(40, Duration::from_millis(100));
    admin
        .fetch_group_offsets(group, Some(&[topic]))
        .await
        .unwrap()
        .into_iter()
        .filter_map(|(tp, r)| Some((tp.partition, r.ok()?.offset)))
        .filter(|(_, o)| *o >= 0)
        .collect()
}

type Pipeline = tokio::task::JoinHandle<kafkapipe::Result<PipelineStats>>;

/// Wait until the group committed the end of every input partition (the pipeline
/// processed everything and its last transaction committed), at most `within`; a
/// pipeline of `running` that ends before fails the test with its result.
async fn wait_committed(
    group: &str,
    input: &str,
    ends: &BTreeMap<i32, i64>,
    within: Duration,
    running: &mut [&mut Pipeline],
) {
    let deadline = Instant::now() + within;
    loop {
        let got = committed_offsets(group, input).await;
        if &got == ends {
            return;
        }
        for p in running.iter_mut() {
            if p.is_finished() {
                panic!("a pipeline ended early: {:?}", (&mut **p).await);
            }
        }
        assert!(
            Instant::now() < deadline,
            "committed {got:?}, input ends {ends:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn assert_exactly_once(mut got: Vec<String>, n: usize) {
    let want = expected(n);
    let total = got.len();
    got.sort();
    let mut dup = got.clone();
    dup.dedup();
    assert_eq!(
        total - dup.len(),
        0,
        "duplicates in the committed output ({total} records, {} distinct)",
        dup.len()
    );
    let mut want_sorted = want.clone();
    want_sorted.sort();
    assert_eq!(got.len(), want_sorted.len(), "output count");
    assert!(
        got == want_sorted,
        "output content differs from the kept inputs"
    );
}

async fn close(handle: &ReaderHandle) {
    tokio::time::timeout(Duration::from_secs(60), handle.close())
        .await
        .expect("reader closed in time");
}

/// Waits (up to 60 s) until the group has committed offsets of `input`: the first
/// transaction of a pipeline committed.
async fn first_transaction_committed(group: &str, input: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while committed_offsets(group, input).await.is_empty() {
        assert!(Instant::now() < deadline, "no transaction committed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn a_pipeline_writes_each_kept_input_exactly_once_and_commits_the_input_end() {
    common::init_log();
    const N: usize = 10_000;
    let input = topic("eos-in", PARTITIONS).await;
    let output = topic("eos-out", PARTITIONS).await;
    let group = common::unique_topic("eos-g");
    let ends = produce_input(&input, N).await;

    let reader = Reader::new(group_reader_config(&input, &group))
        .await
        .unwrap();
    let handle = reader.handle();
    let committer = reader.committer().expect("a group reader has a committer");
    let mut task = tokio::spawn(run_pipeline(
        reader,
        output.clone(),
        common::unique_topic("eos-txn"),
        PipelineConfig::new()
            .commit_every_messages(1000)
            .commit_interval(Duration::from_millis(200)),
        None,
    ));
    wait_committed(
        &group,
        &input,
        &ends,
        Duration::from_secs(90),
        &mut [&mut task],
    )
    .await;
    // The pipeline owns the commits: committing outside its transactions is an error.
    let e = committer.commit().await.unwrap_err();
    assert!(e.to_string().contains("transaction"), "{e}");
    close(&handle).await;
    let stats = tokio::time::timeout(Duration::from_secs(60), task)
        .await
        .expect("pipeline ended in time")
        .unwrap()
        .unwrap();
    assert!(stats.transactions_committed >= 1, "{stats:?}");
    assert_eq!(
        stats.messages_committed as usize,
        expected(N).len(),
        "{stats:?}"
    );
    assert_exactly_once(read_committed(&output, expected(N).len()).await, N);
    assert_eq!(committed_offsets(&group, &input).await, ends);
}

async fn a_crashed_pipeline_is_fenced_by_its_successor_and_the_output_stays_exactly_once() {
    common::init_log();
    const N: usize = 10_000;
    let input = topic("eos-crash-in", PARTITIONS).await;
    let output = topic("eos-crash-out", PARTITIONS).await;
    let group = common::unique_topic("eos-crash-g");
    let txn_id = common::unique_topic("eos-crash-txn");
    let ends = produce_input(&input, N).await;

    // Large transactions, slowly: the crash lands in the middle of one.
    let config = PipelineConfig::new()
        .commit_every_messages(2000)
        .commit_interval(Duration::from_secs(5));
    let reader = Reader::new(group_reader_config(&input, &group))
        .await
        .unwrap();
    let first = tokio::spawn(run_pipeline(
        reader,
        output.clone(),
        txn_id.clone(),
        config.clone(),
        Some(Duration::from_micros(300)),
    ));
    // Wait for the first transaction to commit, then for records of the next one.
    first_transaction_committed(&group, &input).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    // The crash: the pipeline future is dropped, no close, no abort, no LeaveGroup.
    first.abort();
    let _ = first.await;
    let at_crash = committed_offsets(&group, &input).await;
    assert_ne!(at_crash, ends, "the crash came after the end");

    let reader = Reader::new(group_reader_config(&input, &group))
        .await
        .unwrap();
    let handle = reader.handle();
    let mut second = tokio::spawn(run_pipeline(reader, output.clone(), txn_id, config, None));
    wait_committed(
        &group,
        &input,
        &ends,
        Duration::from_secs(120),
        &mut [&mut second],
    )
    .await;
    close(&handle).await;
    tokio::time::timeout(Duration::from_secs(60), second)
        .await
        .expect("pipeline ended in time")
        .unwrap()
        .unwrap();
    let committed = read_committed(&output, expected(N).len()).await;
    assert_exactly_once(committed, N);
    // The crashed transaction's records are in the log, aborted.
    let all = count_uncommitted(&output).await;
    assert!(
        all > expected(N).len(),
        "no aborted record: the crash did not interrupt a transaction ({all})"
    );
}

/// Results arrive out of input order (a `try_buffer_unordered` stage): a commit must not
/// put in a result whose input's offset it cannot commit yet (an earlier input of the
/// partition still in flight) — such results wait for the next transaction. Crash and
/// restart as above: a result committed without its offset would be written again.
async fn an_unordered_stage_with_a_crash_still_writes_each_input_exactly_once() {
    common::init_log();
    const N: usize = 6_000;
    let input = topic("eos-unord-in", PARTITIONS).await;
    let output = topic("eos-unord-out", PARTITIONS).await;
    let group = common::unique_topic("eos-unord-g");
    let txn_id = common::unique_topic("eos-unord-txn");
    let ends = produce_input(&input, N).await;
    let config = PipelineConfig::new()
        .commit_every_messages(200)
        .commit_interval(Duration::from_millis(200));
    let reader = Reader::new(group_reader_config(&input, &group))
        .await
        .unwrap();
    let mut first = tokio::spawn(run_unordered_pipeline(
        reader,
        output.clone(),
        txn_id.clone(),
        config.clone(),
    ));
    let deadline = Instant::now() + Duration::from_secs(60);
    while committed_offsets(&group, &input).await.is_empty() {
        assert!(Instant::now() < deadline, "no transaction committed");
        if first.is_finished() {
            panic!("the pipeline ended early: {:?}", (&mut first).await);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The crash lands while the slow input is in flight: results of later inputs of
    // its partition are written, their offsets cannot be committed yet.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let at_crash = committed_offsets(&group, &input).await;
    assert!(
        at_crash.get(&0).is_some_and(|o| *o <= SLOW_OFFSET),
        "partition 0 committed past the slow input before it was done: {at_crash:?}"
    );
    first.abort();
    let _ = first.await;
    assert_ne!(
        committed_offsets(&group, &input).await,
        ends,
        "the crash came after the end"
    );

    let reader = Reader::new(group_reader_config(&input, &group))
        .await
        .unwrap();
    let handle = reader.handle();
    let mut second = tokio::spawn(run_unordered_pipeline(
        reader,
        output.clone(),
        txn_id,
        config,
    ));
    wait_committed(
        &group,
        &input,
        &ends,
        Duration::from_secs(120),
        &mut [&mut second],
    )
    .await;
    close(&handle).await;
    let stats = tokio::time::timeout(Duration::from_secs(60), second)
        .await
        .expect("pipeline ended in time")
        .unwrap()
        .unwrap();
    // On a quiet machine the successor may finish within one commit interval.
    assert!(stats.transactions_committed >= 1, "{stats:?}");
    assert_exactly_once(read_committed(&output, expected(N).len()).await, N);
}

async fn two_members_with_a_rebalance_in_the_middle_write_each_input_exactly_once() {
    two_members(Protocol::Eager).await;
}

/// The same with the cooperative-sticky assignor: the first member keeps some partitions
/// through the rebalance (its open transaction is aborted and they are rewound).
async fn two_cooperative_members_with_a_rebalance_in_the_middle_write_each_input_exactly_once() {
    two_members(Protocol::Cooperative).await;
}

/// The same as KIP-848 members: the broker assigns, the first member reconciles (its open
/// transaction is aborted before partitions are given up) and the transactional offset
/// commits carry the member epoch.
#[tokio::test]
async fn two_kip848_members_with_a_rebalance_in_the_middle_write_each_input_exactly_once() {
    two_members(Protocol::Kip848).await;
}

#[derive(Clone, Copy)]
enum Protocol {
    Eager,
    Cooperative,
    Kip848,
}

async fn two_members(protocol: Protocol) {
    common::init_log();
    const N: usize = 6_000;
    let member = |input: &str, group: &str| {
        let c = group_reader_config(input, group);
        match protocol {
            Protocol::Eager => c,
            Protocol::Cooperative => c.assignors(vec![std::sync::Arc::new(
                kafkapipe::group::CooperativeStickyAssignor,
            )]),
            Protocol::Kip848 => c.group_protocol(kafkapipe::group::GroupProtocol::Consumer),
        }
    };
    let input = topic("eos-2m-in", PARTITIONS).await;
    let output = topic("eos-2m-out", PARTITIONS).await;
    let group = common::unique_topic("eos-2m-g");
    let ends = produce_input(&input, N).await;
    let config = PipelineConfig::new()
        .commit_every_messages(300)
        .commit_interval(Duration::from_millis(300));

    let a = Reader::new(member(&input, &group)).await.unwrap();
    let a_handle = a.handle();
    let mut a_task = tokio::spawn(run_pipeline(
        a,
        output.clone(),
        common::unique_topic("eos-2m-a"),
        config.clone(),
        Some(Duration::from_millis(1)),
    ));
    // The first member is well into the input (some transaction committed) when the
    // second joins: the rebalance revokes partitions from it mid-run.
    first_transaction_committed(&group, &input).await;
    let b = Reader::new(member(&input, &group)).await.unwrap();
    let b_handle = b.handle();
    let mut b_task = tokio::spawn(run_pipeline(
        b,
        output.clone(),
        common::unique_topic("eos-2m-b"),
        config,
        Some(Duration::from_millis(1)),
    ));
    wait_committed(
        &group,
        &input,
        &ends,
        Duration::from_secs(180),
        &mut [&mut a_task, &mut b_task],
    )
    .await;
    close(&a_handle).await;
    close(&b_handle).await;
    let a_stats = a_task.await.unwrap().unwrap();
    let b_stats = b_task.await.unwrap().unwrap();
    assert!(
        b_stats.messages_committed > 0,
        "the second member processed nothing: {b_stats:?}"
    );
    assert!(a_stats.messages_committed > 0, "{a_stats:?}");
    assert_exactly_once(read_committed(&output, expected(N).len()).await, N);
    assert_eq!(committed_offsets(&group, &input).await, ends);
}

/// A zombie: the pipeline is still running when a new writer with its transactional id
/// initializes (fencing it and aborting its open transaction). The zombie's next
/// transactional call fails fatally and its `forward` ends with that error, naming the
/// transactional id; a successor pipeline with the same id finishes the input, exactly
/// once.
async fn a_fenced_zombie_pipeline_ends_with_the_fatal_error_and_its_successor_finishes() {
    common::init_log();
    const N: usize = 4_000;
    let input = topic("eos-zombie-in", PARTITIONS).await;
    let output = topic("eos-zombie-out", PARTITIONS).await;
    let group = common::unique_topic("eos-zombie-g");
    let txn_id = common::unique_topic("eos-zombie-txn");
    let ends = produce_input(&input, N).await;
    let config = PipelineConfig::new()
        .commit_every_messages(200)
        .commit_interval(Duration::from_millis(200));
    let reader = Reader::new(group_reader_config(&input, &group))
        .await
        .unwrap();
    let zombie = tokio::spawn(run_pipeline(
        reader,
        output.clone(),
        txn_id.clone(),
        config.clone(),
        Some(Duration::from_millis(1)),
    ));
    first_transaction_committed(&group, &input).await;
    let mut fencer = TransactionalWriter::new(writer_config(&output, &txn_id)).unwrap();
    tokio::time::timeout(Duration::from_secs(60), fencer.init_transactions())
        .await
        .expect("init in time")
        .unwrap();
    let e = tokio::time::timeout(Duration::from_secs(60), zombie)
        .await
        .expect("the zombie ended in time")
        .unwrap()
        .expect_err("the fenced pipeline must end with an error");
    println!("the zombie ended with: {e}");
    assert!(e.to_string().contains(&txn_id), "{e}");
    fencer.close().await.unwrap();
    assert_ne!(committed_offsets(&group, &input).await, ends);

    let reader = Reader::new(group_reader_config(&input, &group))
        .await
        .unwrap();
    let handle = reader.handle();
    let mut successor = tokio::spawn(run_pipeline(reader, output.clone(), txn_id, config, None));
    wait_committed(
        &group,
        &input,
        &ends,
        Duration::from_secs(120),
        &mut [&mut successor],
    )
    .await;
    close(&handle).await;
    successor.await.unwrap().unwrap();
    assert_exactly_once(read_committed(&output, expected(N).len()).await, N);
}
