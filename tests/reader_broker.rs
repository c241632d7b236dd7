//! Real-broker tests of the `Reader` stream against Apache Kafka: exactly-once in-order
//! delivery over several topics and partitions, start offsets (by timestamp too), offset
//! resets after DeleteRecords, a reader started on a topic that is still being created,
//! seeks while running, lag, bounded prefetch with a slow consumer, runtime
//! (un)assignment, every codec, and close.
//!
//! Leader moves are covered against `MockCluster` in `reader_fake.rs`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use futures::StreamExt;
use kafkapipe::conn::{Conn, ProduceOptions};
use kafkapipe::reader::{Message, Reader, ReaderConfig, StartOffset, TopicPartition};
use kafkapipe::record::Record;
use kafkapipe::ErrorKind;

/// Messages per partition in the bulk test: 6 × 166 667 ≈ 1M messages. On 2 cores in a
/// debug build this takes about 1 s to produce and 3.5 s to consume.
const PER_PARTITION: usize = 166_667;

async fn admin() -> Conn {
    Conn::connect(&common::shared().addr).await.unwrap()
}

async fn new_topic(prefix: &str, partitions: i32) -> String {
    let topic = common::unique_topic(prefix);
    let conn = admin().await;
    conn.create_topic(&topic, partitions, 1).await.unwrap();
    common::wait_for_topic(&conn, &topic, partitions).await;
    topic
}

fn config() -> ReaderConfig {
    ReaderConfig::new([common::shared().addr.clone()]).max_wait(Duration::from_millis(50))
}

/// Produce `n` records `"{partition}-{i}"` to `topic`/`partition` in batches of `batch`.
async fn produce(conn: &Conn, topic: &str, partition: i32, from: usize, n: usize, batch: usize) {
    let mut i = from;
    while i < from + n {
        let end = (i + batch).min(from + n);
        let records: Vec<Record> = (i..end)
            .map(|k| Record::new(format!("k{k}"), format!("{partition}-{k}")))
            .collect();
        conn.produce(topic, partition, &records, &ProduceOptions::default())
            .await
            .unwrap();
        i = end;
    }
}

async fn next(reader: &mut Reader) -> Message {
    tokio::time::timeout(Duration::from_secs(10), reader.next_message())
        .await
        .expect("a message within 10 s")
        .unwrap()
}

fn value(m: &Message) -> String {
    String::from_utf8(m.value.as_ref().unwrap().to_vec()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn yields_every_message_exactly_once_in_partition_order() {
    let t1 = new_topic("reader-bulk-a", 3).await;
    let t2 = new_topic("reader-bulk-b", 3).await;
    let conn = admin().await;
    let per = PER_PARTITION;
    let started = Instant::now();
    let mut producers = Vec::new();
    for t in [&t1, &t2] {
        for p in 0..3 {
            let t = t.clone();
            producers.push(tokio::spawn(async move {
                let conn = admin().await;
                produce(&conn, &t, p, 0, per, 2000).await;
            }));
        }
    }
    for h in producers {
        h.await.unwrap();
    }
    let produced = started.elapsed();
    drop(conn);

    let started = Instant::now();
    let mut reader = Reader::new(config().topic(&t1).topic(&t2)).await.unwrap();
    assert_eq!(reader.assignment().len(), 6);
    let mut next_offset: HashMap<(String, i32), i64> = HashMap::new();
    for _ in 0..per * 6 {
        let m = next(&mut reader).await;
        let want = next_offset
            .entry((m.topic.to_string(), m.partition))
            .or_insert(0);
        assert_eq!(m.offset, *want, "{}/{} out of order", m.topic, m.partition);
        assert_eq!(value(&m), format!("{}-{}", m.partition, m.offset));
        *want += 1;
    }
    let consumed = started.elapsed();
    assert!(next_offset.values().all(|n| *n == per as i64));
    // Nothing more: no duplicates arrive later.
    let extra = tokio::time::timeout(Duration::from_millis(300), reader.next()).await;
    assert!(extra.is_err(), "unexpected extra item {extra:?}");
    assert_eq!(reader.lag(), 0);
    let stats = reader.stats();
    assert_eq!(stats.messages, (per * 6) as u64);
    eprintln!(
        "bulk: produced {} in {produced:?}, consumed in {consumed:?} ({} fetches)",
        per * 6,
        stats.fetches
    );
    reader.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_offsets_first_last_and_explicit() {
    let topic = new_topic("reader-start", 1).await;
    let conn = admin().await;
    // Batches of several records: Last is the high-water mark, not a batch's base offset.
    produce(&conn, &topic, 0, 0, 10, 4).await;

    let mut first = Reader::new(config().partition(&topic, 0)).await.unwrap();
    assert_eq!(next(&mut first).await.offset, 0);
    first.close().await;

    let mut explicit = Reader::new(
        config()
            .partition(&topic, 0)
            .start_offset(StartOffset::At(7)),
    )
    .await
    .unwrap();
    assert_eq!(next(&mut explicit).await.offset, 7);
    explicit.close().await;

    let mut last = Reader::new(
        config()
            .partition(&topic, 0)
            .start_offset(StartOffset::Last),
    )
    .await
    .unwrap();
    // Wait until the reader knows where the end is, then write something new.
    let deadline = Instant::now() + Duration::from_secs(5);
    while last.position(&topic, 0).is_none() {
        assert!(Instant::now() < deadline, "start offset never resolved");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(last.position(&topic, 0), Some(10));
    produce(&conn, &topic, 0, 10, 3, 3).await;
    let m = next(&mut last).await;
    assert_eq!((m.offset, value(&m)), (10, "0-10".to_string()));
    last.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seek_while_running_discards_everything_before_it() {
    let topic = new_topic("reader-seek", 2).await;
    let conn = admin().await;
    produce(&conn, &topic, 0, 0, 2000, 100).await;
    produce(&conn, &topic, 1, 0, 2000, 100).await;
    let mut reader = Reader::new(config().topic(&topic)).await.unwrap();
    let mut seen = 0;
    while seen < 50 {
        next(&mut reader).await;
        seen += 1;
    }
    // The buffer holds more of partition 0 from before the seek; none of it may appear.
    reader.seek(&topic, 0, 1500).unwrap();
    let mut p0 = Vec::new();
    let mut p1_last = -1;
    while p0.len() < 100 {
        let m = next(&mut reader).await;
        if m.partition == 0 {
            p0.push(m.offset);
        } else {
            if p1_last >= 0 {
                assert_eq!(m.offset, p1_last + 1, "partition 1 skipped or repeated");
            }
            p1_last = m.offset;
        }
    }
    assert_eq!(p0, (1500..1600).collect::<Vec<_>>());
    // Seek backwards too, then past the end.
    reader.seek(&topic, 0, 3).unwrap();
    loop {
        let m = next(&mut reader).await;
        if m.partition == 0 {
            assert_eq!(m.offset, 3);
            break;
        }
    }
    assert!(reader.seek(&topic, 9, 0).is_err(), "unassigned partition");
    reader.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lag_from_fetches_and_from_the_broker() {
    let topic = new_topic("reader-lag", 1).await;
    let conn = admin().await;
    produce(&conn, &topic, 0, 0, 100, 1).await;
    let mut reader = Reader::new(config().partition(&topic, 0).queue_capacity(1000))
        .await
        .unwrap();
    for _ in 0..10 {
        next(&mut reader).await;
    }
    assert_eq!(reader.partition_lag(&topic, 0), Some(90));
    assert_eq!(reader.lag(), 90);
    assert_eq!(reader.read_lag().await.unwrap(), 90);
    produce(&conn, &topic, 0, 100, 5, 1).await;
    assert_eq!(reader.read_lag().await.unwrap(), 95);
    for _ in 0..95 {
        next(&mut reader).await;
    }
    assert_eq!(reader.lag(), 0);
    assert_eq!(reader.stats().lag, 0);
    reader.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_consumer_keeps_the_prefetch_bounded() {
    let topic = new_topic("reader-slow", 1).await;
    let conn = admin().await;
    // 20k messages of ~100 bytes: 2 MB of backlog.
    let records: Vec<Record> = (0..500)
        .map(|i| Record::new(format!("k{i}"), vec![b'x'; 100]))
        .collect();
    for _ in 0..40 {
        conn.produce(&topic, 0, &records, &ProduceOptions::default())
            .await
            .unwrap();
    }
    let cap_bytes = 64 * 1024;
    let fetch_bytes = 16 * 1024;
    let mut reader = Reader::new(
        config()
            .partition(&topic, 0)
            .queue_capacity(1_000_000)
            .queue_capacity_bytes(cap_bytes)
            .max_partition_bytes(fetch_bytes)
            .max_bytes(fetch_bytes),
    )
    .await
    .unwrap();
    // Not polling: the buffer fills up to the bound and fetching stops.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let s1 = reader.stats();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let s2 = reader.stats();
    eprintln!("slow consumer: {s2:?}");
    assert!(
        s2.queue_bytes >= cap_bytes / 2,
        "prefetch never filled: {s2:?}"
    );
    // At most one response beyond the bound (one batch of ~55 KB may exceed max_bytes).
    assert!(s2.queue_bytes <= cap_bytes + 64 * 1024, "{s2:?}");
    assert_eq!(
        s1.fetches, s2.fetches,
        "fetching went on with a full buffer"
    );
    // Polling again resumes fetching, and everything arrives in order.
    for i in 0..20_000 {
        assert_eq!(next(&mut reader).await.offset, i);
        assert!(reader.stats().queue_bytes <= cap_bytes + 64 * 1024);
    }
    reader.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn assign_and_unassign_at_runtime() {
    let topic = new_topic("reader-assign", 3).await;
    let conn = admin().await;
    for p in 0..3 {
        produce(&conn, &topic, p, 0, 500, 100).await;
    }
    let mut reader = Reader::new(config().partition(&topic, 0)).await.unwrap();
    assert_eq!(next(&mut reader).await.partition, 0);
    reader.assign([
        (TopicPartition::new(&topic, 1), StartOffset::At(100)),
        (TopicPartition::new(&topic, 2), StartOffset::First),
    ]);
    let mut first: HashMap<i32, i64> = HashMap::new();
    while first.len() < 3 {
        let m = next(&mut reader).await;
        first.entry(m.partition).or_insert(m.offset);
    }
    assert_eq!(first[&1], 100);
    assert_eq!(first[&2], 0);
    reader.unassign(&[
        TopicPartition::new(&topic, 0),
        TopicPartition::new(&topic, 2),
    ]);
    assert_eq!(reader.assignment(), vec![TopicPartition::new(&topic, 1)]);
    for _ in 0..100 {
        assert_eq!(next(&mut reader).await.partition, 1);
    }
    reader.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_stops_the_fetch_task() {
    let topic = new_topic("reader-close", 2).await;
    let conn = admin().await;
    produce(&conn, &topic, 0, 0, 10, 10).await;
    let mut reader = Reader::new(config().topic(&topic)).await.unwrap();
    next(&mut reader).await;
    assert_eq!(reader.stats().fetch_tasks, 1);
    reader.close().await;
    assert_eq!(reader.stats().fetch_tasks, 0);
    let fetches = reader.stats().fetches;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(reader.stats().fetches, fetches);
    assert!(reader.next().await.is_none());
    assert_eq!(
        reader.next_message().await.unwrap_err().kind(),
        ErrorKind::Closed
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decodes_batches_of_every_codec_with_headers() {
    use kafkapipe::compression::Compression;
    let topic = new_topic("reader-codecs", 1).await;
    let conn = admin().await;
    let mut offset = 0;
    for c in Compression::ALL.into_iter().filter(|c| c.is_available()) {
        let records: Vec<Record> = (offset..offset + 50)
            .map(|k| Record::new(format!("k{k}"), format!("0-{k}")).with_header("codec", c.name()))
            .collect();
        let opts = ProduceOptions::default().compression(c);
        conn.produce(&topic, 0, &records, &opts).await.unwrap();
        offset += 50;
    }
    let mut reader = Reader::new(config().partition(&topic, 0)).await.unwrap();
    for k in 0..offset {
        let m = next(&mut reader).await;
        assert_eq!((m.offset, value(&m)), (k, format!("0-{k}")));
        assert_eq!(m.key.as_deref(), Some(format!("k{k}").as_bytes()));
        assert_eq!(m.headers.len(), 1);
        assert!(m.timestamp > 0);
    }
    reader.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_at_timestamp_and_reset_after_delete_records() {
    use kafkapipe::admin::{Admin, TopicPartition as AdminTp};
    use kafkapipe::reader::OffsetReset;
    let topic = new_topic("reader-ts", 1).await;
    let conn = admin().await;
    let t0 = now_ms() - 600_000;
    let records: Vec<Record> = (0..10i64)
        .map(|i| Record {
            timestamp: t0 + i * 1000,
            ..Record::new(format!("k{i}"), format!("0-{i}"))
        })
        .collect();
    conn.produce(&topic, 0, &records, &ProduceOptions::default())
        .await
        .unwrap();

    // The first record at or after the timestamp; the end where there is none.
    let mut at = Reader::new(
        config()
            .partition(&topic, 0)
            .start_offset(StartOffset::AtTimestamp(t0 + 6500)),
    )
    .await
    .unwrap();
    assert_eq!(next(&mut at).await.offset, 7);
    at.close().await;
    let mut future = Reader::new(
        config()
            .partition(&topic, 0)
            .start_offset(StartOffset::AtTimestamp(t0 + 3_600_000)),
    )
    .await
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while future.position(&topic, 0).is_none() {
        assert!(Instant::now() < deadline, "start offset never resolved");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(future.position(&topic, 0), Some(10));
    future.close().await;

    // Offsets below the log start are out of range: reset to the earliest, or an error.
    let admin = Admin::connect([common::shared().addr.clone()]).unwrap();
    let r = admin
        .delete_records(&[(AdminTp::new(&topic, 0), 4)])
        .await
        .unwrap();
    assert_eq!(*r[0].1.as_ref().unwrap(), 4);
    let mut reset = Reader::new(
        config()
            .partition(&topic, 0)
            .start_offset(StartOffset::At(2)),
    )
    .await
    .unwrap();
    let m = next(&mut reset).await;
    assert_eq!((m.offset, value(&m)), (4, "0-4".to_string()));
    assert_eq!(reset.stats().offset_resets, 1);
    reset.close().await;
    let mut strict = Reader::new(
        config()
            .partition(&topic, 0)
            .start_offset(StartOffset::At(2))
            .offset_reset(OffsetReset::Error),
    )
    .await
    .unwrap();
    let e = tokio::time::timeout(Duration::from_secs(10), strict.next_message())
        .await
        .expect("an item within 10 s")
        .unwrap_err();
    assert_eq!(
        e.kafka_code(),
        Some(kafkapipe::protocol::ErrorCode::OffsetOutOfRange),
        "{e}"
    );
    strict.close().await;
}

/// A reader started right after CreateTopics, before the broker serves the topic, waits
/// for it as the Java consumer and kafka-go do, instead of failing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reader_on_a_topic_still_being_created() {
    let topic = common::unique_topic("reader-fresh");
    let conn = admin().await;
    conn.create_topic(&topic, 2, 1).await.unwrap();
    let mut reader = Reader::new(config().topic(&topic)).await.unwrap();
    common::wait_for_topic(&conn, &topic, 2).await;
    produce(&conn, &topic, 1, 0, 3, 3).await;
    for k in 0..3 {
        let m = next(&mut reader).await;
        assert_eq!((m.partition, m.offset), (1, k));
    }
    eprintln!("reader on a fresh topic: {:?}", reader.stats());
    reader.close().await;
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// KIP-219 for fetches: a reader over its client id's 1 MB/s consumer quota reads 4 MiB
/// at about the quota and sees the throttle times in its stats. The data is written first
/// by another client id (no quota). The broker lets about one sample window (1 s) of
/// burst through, and a fetch returns up to 1 MiB per partition, so the floor is loose:
/// 1.5 s for 4 MiB (about 4.2 s at the quota).
#[tokio::test]
async fn a_consumer_byte_rate_quota_paces_the_reader() {
    let broker = common::shared();
    let client_id = format!("quota-reader-{}", std::process::id());
    common::set_client_quota(
        &broker.addr,
        &client_id,
        "consumer_byte_rate",
        Some(1_000_000.0),
    )
    .await;
    let topic = new_topic("quota-reader", 1).await;
    let conn = admin().await;
    let value = bytes::Bytes::from(vec![b'r'; 16 * 1024]);
    for _ in 0..16 {
        let records: Vec<Record> = (0..16)
            .map(|_| Record::new(bytes::Bytes::new(), value.clone()))
            .collect();
        conn.produce(&topic, 0, &records, &ProduceOptions::default())
            .await
            .unwrap();
    }
    let mut reader = Reader::new(
        config()
            .partition(&topic, 0)
            .client_id(&client_id)
            .start_offset(StartOffset::First),
    )
    .await
    .unwrap();
    let started = Instant::now();
    for _ in 0..256 {
        next(&mut reader).await;
    }
    let elapsed = started.elapsed();
    let stats = reader.stats();
    reader.close().await;
    eprintln!(
        "4 MiB in {elapsed:?}: {} fetches, throttle avg {:?} max {:?}",
        stats.fetches, stats.throttle_time_avg, stats.throttle_time_max
    );
    assert!(
        stats.throttle_time_max > Duration::ZERO,
        "no throttle time in the stats: {stats:?}"
    );
    assert!(stats.throttle_time_avg > Duration::ZERO);
    assert!(
        elapsed >= Duration::from_millis(1500),
        "4 MiB read at more than 2.7 MB/s under a 1 MB/s quota: {elapsed:?}"
    );
    common::set_client_quota(&broker.addr, &client_id, "consumer_byte_rate", None).await;
}

/// Reads `topic` until `want` messages came, pausing partitions 0–19 after `pause_at`
/// messages and resuming them after `resume_at`; checks each partition yields its values
/// `"{p}-0"`, `"{p}-1"`, … in order, once each, and that nothing more comes.
async fn read_all_once(
    reader: &mut Reader,
    topic: &str,
    partitions: i32,
    want: usize,
    pause: Option<(usize, usize)>,
) {
    let paused: Vec<TopicPartition> = (0..20).map(|p| TopicPartition::new(topic, p)).collect();
    let mut next_of: HashMap<i32, usize> = HashMap::new();
    for n in 0..want {
        if let Some((pause_at, resume_at)) = pause {
            if n == pause_at {
                reader.pause(&paused);
            }
            if n == resume_at {
                reader.resume(&paused);
            }
        }
        let m = next(reader).await;
        assert!(m.partition < partitions);
        let k = next_of.entry(m.partition).or_default();
        assert_eq!(value(&m), format!("{}-{k}", m.partition), "at message {n}");
        if let Some((pause_at, resume_at)) = pause {
            if (pause_at..resume_at).contains(&n) {
                assert!(
                    m.partition >= 20,
                    "paused partition {} yielded",
                    m.partition
                );
            }
        }
        *k += 1;
    }
    let extra = tokio::time::timeout(Duration::from_millis(1500), reader.next_message()).await;
    assert!(extra.is_err(), "a message more than produced: {extra:?}");
}

/// 200 partitions with a few records each, more produced while reading, partitions
/// paused and resumed midway: with fetch sessions (the default) every record comes once,
/// the fetches after the first are incremental ones, and no session was lost. The same
/// topic read with sessions off yields the same and sends only full fetches.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fetch_sessions_over_200_partitions_yield_every_record_once() {
    const PARTITIONS: i32 = 200;
    const FIRST: usize = 5;
    const MORE: usize = 5;
    let topic = new_topic("reader-sessions", PARTITIONS).await;
    let conn = admin().await;
    for p in 0..PARTITIONS {
        produce(&conn, &topic, p, 0, FIRST, FIRST).await;
    }
    let mut reader = Reader::new(config().topic(&topic)).await.unwrap();
    let t = topic.clone();
    let more = tokio::spawn(async move {
        let conn = admin().await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        for p in 0..PARTITIONS {
            produce(&conn, &t, p, FIRST, MORE, 1).await;
        }
    });
    let total = PARTITIONS as usize * (FIRST + MORE);
    read_all_once(&mut reader, &topic, PARTITIONS, total, Some((300, 1200))).await;
    more.await.unwrap();
    let s = reader.stats();
    eprintln!(
        "sessions on: {} fetches, {} incremental, {} sessions lost",
        s.fetches, s.incremental_fetches, s.fetch_sessions_lost
    );
    assert!(s.fetches >= 3, "{s:?}");
    // One full fetch opens the session; pausing and resuming only forget and re-add
    // partitions in it (one more full fetch allowed, should the broker evict it).
    assert!(s.incremental_fetches + 2 >= s.fetches, "{s:?}");
    assert_eq!(s.fetch_sessions_lost, 0);
    assert_eq!(s.errors, 0, "{s:?}");
    reader.close().await;

    let mut reader = Reader::new(config().topic(&topic).fetch_sessions(false))
        .await
        .unwrap();
    read_all_once(&mut reader, &topic, PARTITIONS, total, None).await;
    let s = reader.stats();
    assert!(s.fetches >= 1);
    assert_eq!(s.incremental_fetches, 0, "{s:?}");
    reader.close().await;
}

/// What a test's tracing subscriber writes, kept for the test to read.
#[derive(Clone, Default)]
struct LogSink(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for LogSink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Closing a reader closes its fetch session on the broker: Kafka accepts the Fetch with
/// epoch -1 that names it (`fetch session closed` in the reader's debug log, and no
/// failure or timeout of it). The reader's last fetch is still waiting on the broker
/// (10 s `max_wait`, nothing more to read), so the close goes over a connection of its
/// own and does not wait for that fetch.
#[tokio::test]
async fn closing_a_reader_closes_its_fetch_session_on_the_broker() {
    let log = LogSink::default();
    let sink = log.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::DEBUG)
        .with_writer(move || sink.clone())
        .finish();
    // A current-thread runtime: the reader's tasks run on this thread, under this
    // subscriber.
    let _guard = tracing::subscriber::set_default(subscriber);
    let topic = new_topic("reader-close-session", 2).await;
    let conn = admin().await;
    for p in 0..2 {
        produce(&conn, &topic, p, 0, 10, 10).await;
    }
    let config = config().topic(&topic).max_wait(Duration::from_secs(10));
    let mut reader = Reader::new(config).await.unwrap();
    for _ in 0..20 {
        next(&mut reader).await;
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while reader.stats().incremental_fetches == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{:?}",
            reader.stats()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let started = std::time::Instant::now();
    reader.close().await;
    let took = started.elapsed();
    let text = String::from_utf8_lossy(&log.0.lock().unwrap()).to_string();
    assert!(text.contains("fetch session closed"), "{text}");
    assert!(!text.contains("closing the fetch session"), "{text}");
    // Not after the waiting fetch's 10 s (a wide margin for a loaded machine).
    assert!(took < Duration::from_secs(5), "close took {took:?}");
}
