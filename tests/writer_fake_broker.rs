//! Writer behaviour a real broker cannot be made to show on demand — leader changes,
//! partition errors, partitions without a leader, oversized batches, unanswered
//! partitions — against `kafkapipe::mock::MockCluster`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::HashMap;
use std::time::Duration;

use bytes::Bytes;
use kafkapipe::mock::{Fault, Gate, MockCluster};
use kafkapipe::protocol::messages::ProduceRequest;
use kafkapipe::protocol::{ApiKey, ErrorCode};
use kafkapipe::record::decode_batches;
use kafkapipe::writer::{Message, Writer, WriterConfig};

const TOPIC: &str = "t";

struct Fake {
    cluster: MockCluster,
}

impl Fake {
    /// One broker (id 1) leading every partition of `TOPIC`.
    async fn start(partitions: i32) -> Fake {
        Self::start_cluster(1, partitions).await
    }

    /// `brokers` brokers (ids 1..=brokers); partition p of `TOPIC` is led by broker
    /// p % brokers + 1. Every Produce request is captured.
    async fn start_cluster(brokers: i32, partitions: i32) -> Fake {
        let cluster = MockCluster::builder()
            .brokers(brokers)
            .topic(TOPIC, partitions)
            .start()
            .await
            .unwrap();
        cluster.capture(ApiKey::PRODUCE);
        Fake { cluster }
    }

    fn writer(&self, tune: impl FnOnce(WriterConfig) -> WriterConfig) -> Writer {
        Writer::new(tune(
            WriterConfig::new(self.cluster.bootstrap())
                .topic(TOPIC)
                .backoff(Duration::from_millis(5), Duration::from_millis(20))
                .batch_timeout(Duration::from_millis(2)),
        ))
        .unwrap()
    }

    /// The values appended to a partition, in offset order.
    fn accepted(&self, partition: i32) -> Vec<Bytes> {
        self.cluster
            .batches(TOPIC, partition)
            .into_iter()
            .flat_map(|b| decode_batches(b, 1 << 24).unwrap().batches)
            .flat_map(|b| b.records)
            .map(|r| r.value.unwrap())
            .collect()
    }

    /// The partitions carried by each Produce request, with the broker it went to.
    fn requests_by_broker(&self) -> Vec<(i32, Vec<i32>)> {
        self.cluster
            .captured_by_broker::<ProduceRequest>()
            .into_iter()
            .map(|(broker, r)| {
                let parts = r
                    .topic_data
                    .iter()
                    .flat_map(|t| t.partition_data.iter().map(|p| p.index))
                    .collect();
                (broker, parts)
            })
            .collect()
    }

    /// The partitions carried by each Produce request.
    fn requests(&self) -> Vec<Vec<i32>> {
        self.requests_by_broker()
            .into_iter()
            .map(|(_, p)| p)
            .collect()
    }

    fn metadata_requests(&self) -> u64 {
        self.cluster.requests(ApiKey::METADATA)
    }

    fn producer_ids(&self) -> u64 {
        self.cluster.requests(ApiKey::INIT_PRODUCER_ID)
    }
}

fn numbered(partition: i32, n: usize) -> Vec<Message> {
    (0..n)
        .map(|i| Message::new(format!("{i:06}")).with_partition(partition))
        .collect()
}

fn in_order(values: &[Bytes]) -> bool {
    values.windows(2).all(|w| w[0] < w[1])
}

/// Run `write` while the partition loses its leader: its first Produce is held back
/// until the test has removed the leader, so it is sent once (stamped) and answered
/// `NOT_LEADER_OR_FOLLOWER`, and every lookup after it finds no leader.
async fn unlead_during_first_produce<F: std::future::Future>(fake: &Fake, write: F) -> F::Output {
    fake.cluster
        .fault(ApiKey::PRODUCE, Fault::Delay(Duration::from_millis(300)), 1);
    let unlead = async {
        while fake.cluster.requests(ApiKey::PRODUCE) == 0 {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        fake.cluster.remove_leader(TOPIC, 0);
    };
    let (out, ()) = tokio::join!(write, unlead);
    out
}

#[tokio::test]
async fn not_leader_is_retried_in_order_after_a_metadata_refresh() {
    let fake = Fake::start(2).await;
    fake.cluster
        .fault_partition(ApiKey::PRODUCE, TOPIC, 0, ErrorCode::NotLeaderOrFollower, 2);
    let writer = fake.writer(|c| c.batch_size(50));
    let mut msgs = numbered(0, 300);
    msgs.extend(numbered(1, 300));
    writer.write_messages(msgs).await.unwrap();

    let stats = writer.stats();
    assert_eq!(stats.messages, 600, "{stats:?}");
    // Two NOT_LEADER answers; with up to 5 batches of a partition in flight, the batches
    // sent behind a refused one come back OUT_OF_ORDER_SEQUENCE_NUMBER (idempotence is
    // on by default) and are retried after it, so they count as retries too.
    assert!(stats.retries >= 2, "{stats:?}");
    assert!(
        fake.metadata_requests() >= 2,
        "metadata refreshed after NotLeader"
    );
    for p in [0, 1] {
        let got = fake.accepted(p);
        assert_eq!(got.len(), 300, "partition {p}");
        assert!(in_order(&got), "partition {p} out of order");
    }
    let requests = fake.requests();
    assert!(
        requests.iter().any(|r| r.len() == 2),
        "batches of both partitions share a request: {requests:?}"
    );
    for r in &requests {
        let mut unique = r.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(
            unique.len(),
            r.len(),
            "one batch per partition per request: {r:?}"
        );
    }
}

#[tokio::test]
async fn non_retriable_error_fails_only_that_partitions_messages() {
    let fake = Fake::start(2).await;
    fake.cluster.fault_partition(
        ApiKey::PRODUCE,
        TOPIC,
        1,
        ErrorCode::MessageTooLarge,
        u32::MAX,
    );
    let writer = fake.writer(|c| c);
    let mut msgs = numbered(0, 20);
    msgs.extend(numbered(1, 20));
    let err = writer.write_messages(msgs).await.unwrap_err();
    assert_eq!(err.kafka_code(), Some(ErrorCode::MessageTooLarge), "{err}");
    assert_eq!(err.topic(), Some(TOPIC));
    assert_eq!(err.partition(), Some(1));
    assert!(err.broker().is_some(), "{err}");
    let stats = writer.stats();
    assert_eq!(
        (stats.messages, stats.errors, stats.retries),
        (20, 20, 0),
        "{stats:?}"
    );
    assert_eq!(fake.accepted(0).len(), 20);
    // The writer keeps working for the healthy partition.
    writer.write_messages(numbered(0, 5)).await.unwrap();
}

#[tokio::test]
async fn retriable_error_gives_up_after_max_attempts() {
    let fake = Fake::start(1).await;
    fake.cluster.fault_partition(
        ApiKey::PRODUCE,
        TOPIC,
        0,
        ErrorCode::NotLeaderOrFollower,
        u32::MAX,
    );
    let writer = fake.writer(|c| c.max_attempts(3));
    let err = writer.write_messages(numbered(0, 3)).await.unwrap_err();
    assert_eq!(
        err.kafka_code(),
        Some(ErrorCode::NotLeaderOrFollower),
        "{err}"
    );
    assert_eq!(err.partition(), Some(0));
    assert_eq!(fake.requests().len(), 3, "exactly max_attempts sends");
    assert_eq!(writer.stats().retries, 2);
}

/// With the default `max_attempts`, a retriable error is retried — more often than the
/// old 10-attempt budget (each retry waits for a metadata refresh, at least 100 ms apart)
/// — until the delivery timeout, then fails saying so.
#[tokio::test]
async fn retriable_error_is_retried_until_the_delivery_timeout() {
    let fake = Fake::start(1).await;
    fake.cluster.fault_partition(
        ApiKey::PRODUCE,
        TOPIC,
        0,
        ErrorCode::NotLeaderOrFollower,
        u32::MAX,
    );
    let writer = fake.writer(|c| c.delivery_timeout(Duration::from_secs(2)));
    let started = std::time::Instant::now();
    let err = tokio::time::timeout(
        Duration::from_secs(30),
        writer.write_messages(numbered(0, 3)),
    )
    .await
    .expect("gave up at the deadline")
    .unwrap_err();
    assert!(started.elapsed() >= Duration::from_secs(2), "{err}");
    assert_eq!(
        err.kafka_code(),
        Some(ErrorCode::NotLeaderOrFollower),
        "{err}"
    );
    assert!(err.to_string().contains("delivery timeout"), "{err}");
    assert_eq!(err.partition(), Some(0));
    let sends = fake.requests().len();
    assert!(sends > 10, "retried past the old budget: {sends} sends");
    assert_eq!(writer.stats().errors, 3);
}

/// A partition that never gets a leader fails at the delivery timeout.
#[tokio::test]
async fn partition_without_leader_fails_at_the_delivery_timeout() {
    let fake = Fake::start(2).await;
    fake.cluster.remove_leader(TOPIC, 1);
    let writer = fake.writer(|c| c.delivery_timeout(Duration::from_secs(2)));
    let started = std::time::Instant::now();
    let err = tokio::time::timeout(
        Duration::from_secs(30),
        writer.write_messages(numbered(1, 3)),
    )
    .await
    .expect("gave up at the deadline")
    .unwrap_err();
    assert!(started.elapsed() >= Duration::from_secs(2), "{err}");
    assert_eq!(
        err.kafka_code(),
        Some(ErrorCode::LeaderNotAvailable),
        "{err}"
    );
    assert!(err.to_string().contains("delivery timeout"), "{err}");
    let lookups = fake.metadata_requests();
    assert!(lookups > 10, "looked up past the old budget: {lookups}");
    writer.write_messages(numbered(0, 3)).await.unwrap();
}

#[tokio::test]
async fn partition_without_leader_fails_after_max_attempts() {
    let fake = Fake::start(2).await;
    fake.cluster.remove_leader(TOPIC, 1);
    let writer = fake.writer(|c| c.max_attempts(3));
    writer.write_messages(numbered(0, 3)).await.unwrap();
    let err = tokio::time::timeout(
        Duration::from_secs(10),
        writer.write_messages(numbered(1, 3)),
    )
    .await
    .expect("gave up in time")
    .unwrap_err();
    assert_eq!(
        err.kafka_code(),
        Some(ErrorCode::LeaderNotAvailable),
        "{err}"
    );
    assert_eq!(err.partition(), Some(1));
    assert!(fake.accepted(1).is_empty());
}

#[tokio::test]
async fn batch_too_large_for_the_broker_is_split_until_it_fits() {
    use futures::StreamExt;
    let fake = Fake::start(1).await;
    // A record of a six-byte value takes 14 or 15 bytes after the 61-byte batch header:
    // four fit, five do not.
    fake.cluster.set_max_message_bytes(Some(125));
    let writer = fake.writer(|c| c.batch_size(37));
    let mut deliveries = writer.deliveries();
    writer.write_messages(numbered(0, 37)).await.unwrap();
    let stats = writer.stats();
    assert_eq!((stats.messages, stats.errors), (37, 0), "{stats:?}");
    assert_eq!(stats.batch_messages_max, 4, "{stats:?}");
    let got = fake.accepted(0);
    assert_eq!(got.len(), 37);
    assert!(in_order(&got));
    // Reports carry the right offsets after splitting.
    for i in 0..37 {
        let d = deliveries.next().await.unwrap();
        assert_eq!(d.result.unwrap(), i as i64);
        assert_eq!(d.message.value.unwrap(), format!("{i:06}").as_bytes());
    }
}

#[tokio::test]
async fn one_request_per_broker_and_leader_moves_are_followed() {
    let fake = Fake::start_cluster(2, 4).await;
    let writer = fake.writer(|c| c.batch_size(20));
    let all = |n| (0..4).flat_map(move |p| numbered(p, n)).collect::<Vec<_>>();
    writer.write_messages(all(100)).await.unwrap();
    {
        let mut by_broker: HashMap<i32, Vec<Vec<i32>>> = HashMap::new();
        for (broker, parts) in fake.requests_by_broker() {
            by_broker.entry(broker).or_default().push(parts);
        }
        for (broker, reqs) in &by_broker {
            let led: Vec<i32> = if *broker == 1 { vec![0, 2] } else { vec![1, 3] };
            assert!(
                reqs.iter().flatten().all(|p| led.contains(p)),
                "broker {broker} got partitions it does not lead: {reqs:?}"
            );
        }
        assert!(
            by_broker.values().flatten().any(|r| r.len() == 2),
            "a broker's partitions share requests"
        );
    }

    // Partition 0 moves to broker 2: broker 1 answers NotLeaderOrFollower, the writer
    // refreshes metadata and follows the leader.
    fake.cluster.move_leader(TOPIC, 0, 2).unwrap();
    let before = writer.stats().retries;
    let mut second: Vec<Message> = (100..200)
        .map(|i| Message::new(format!("{i:06}")).with_partition(0))
        .collect();
    second.extend((100..200).map(|i| Message::new(format!("{i:06}")).with_partition(1)));
    writer.write_messages(second).await.unwrap();
    assert!(writer.stats().retries > before, "NotLeader was retried");
    for p in 0..4 {
        assert!(in_order(&fake.accepted(p)), "partition {p} out of order");
    }
    assert_eq!(fake.accepted(0).len(), 200);
    assert_eq!(fake.accepted(1).len(), 200);
    let moved = fake
        .requests_by_broker()
        .into_iter()
        .filter(|(b, _)| *b == 2)
        .flat_map(|(_, parts)| parts)
        .filter(|p| *p == 0)
        .count();
    assert!(moved > 0, "partition 0 now goes to broker 2");
}

#[tokio::test]
async fn extreme_settings_do_not_overflow() {
    use futures::SinkExt;
    let fake = Fake::start(1).await;
    let mut writer = fake.writer(|c| {
        c.batch_size(usize::MAX)
            .batch_timeout(Duration::MAX)
            .request_timeout(Duration::MAX)
            .connect_timeout(Duration::MAX)
            .backoff(Duration::MAX, Duration::MAX)
            .max_buffered_bytes(usize::MAX)
    });
    for m in numbered(0, 3) {
        writer.feed(m).await.unwrap();
    }
    tokio::time::timeout(Duration::from_secs(5), writer.flush())
        .await
        .expect("flush seals the open batch despite an endless linger")
        .unwrap();
    writer.close().await.unwrap();
    assert_eq!(fake.accepted(0).len(), 3);
}

#[tokio::test]
async fn split_with_deliveries_frees_exactly_the_buffered_bytes() {
    use futures::StreamExt;
    let fake = Fake::start(1).await;
    // The 1000-byte record fits alone, not with the 22-byte one.
    fake.cluster.set_max_message_bytes(Some(1100));
    let writer = fake.writer(|c| c.batch_size(2).max_buffered_bytes(1500));
    let mut deliveries = writer.deliveries();
    let big = Message::new(vec![b'b'; 1000]).with_partition(0);
    let small = Message::new(vec![b's'; 22]).with_partition(0);
    writer.write_messages([big, small]).await.unwrap();
    for _ in 0..2 {
        deliveries.next().await.unwrap().result.unwrap();
    }
    let stats = writer.stats();
    assert_eq!((stats.messages, stats.buffered_bytes), (2, 0), "{stats:?}");
    // The writer still accepts and delivers (the gauge did not wrap).
    tokio::time::timeout(
        Duration::from_secs(5),
        writer.write_messages(numbered(0, 1)),
    )
    .await
    .expect("writer hung after a split")
    .unwrap();
    deliveries.next().await.unwrap().result.unwrap();
    assert_eq!(writer.stats().buffered_bytes, 0);
}

#[tokio::test]
async fn idempotent_unanswered_partition_does_not_lose_the_next_batch() {
    let fake = Fake::start(1).await;
    fake.cluster.omit_from_produce_response(TOPIC, 0, 1);
    let writer = fake.writer(|c| c.idempotent(true).batch_size(100));
    // The broker appends the batch but its answer does not mention the partition: the
    // writer cannot know it was written and fails it.
    let first: Vec<Message> = (0..100)
        .map(|i| Message::new(format!("a{i:03}")).with_partition(0))
        .collect();
    let err = writer.write_messages(first).await.unwrap_err();
    assert_eq!(err.kafka_code(), None, "{err}");
    // The next batch must not reuse the first one's sequence numbers (the broker would
    // drop it as a duplicate and the writer report it delivered).
    let second: Vec<Message> = (0..100)
        .map(|i| Message::new(format!("b{i:03}")).with_partition(0))
        .collect();
    writer.write_messages(second).await.unwrap();
    let got = fake.accepted(0);
    assert_eq!(got.len(), 200, "the second batch was not written");
    assert_eq!(got[199], Bytes::from("b099"));
    // The unknown fate leaves the sequence unresolved; with nothing after it in flight
    // the epoch is bumped locally (Java's maybeResolveSequences), no new producer id.
    assert_eq!(
        fake.producer_ids(),
        1,
        "no new producer id after the ambiguity"
    );
    let epochs: Vec<i16> = fake
        .cluster
        .batches(TOPIC, 0)
        .into_iter()
        .flat_map(|b| decode_batches(b, 1 << 24).unwrap().batches)
        .map(|b| b.producer_epoch)
        .collect();
    assert_eq!(epochs, [0, 1], "the second batch carries the bumped epoch");
}

#[tokio::test]
async fn idempotent_rejected_batch_gives_its_sequence_numbers_back() {
    let fake = Fake::start(1).await;
    fake.cluster
        .fault_partition(ApiKey::PRODUCE, TOPIC, 0, ErrorCode::InvalidRecord, 1);
    let writer = fake.writer(|c| c.idempotent(true));
    let err = writer.write_messages(numbered(0, 10)).await.unwrap_err();
    assert_eq!(err.kafka_code(), Some(ErrorCode::InvalidRecord), "{err}");
    writer.write_messages(numbered(0, 10)).await.unwrap();
    assert_eq!(fake.accepted(0).len(), 10);
    assert_eq!(fake.producer_ids(), 1, "no new producer id needed");
}

#[tokio::test]
async fn idempotent_leaderless_give_up_leaves_no_sequence_gap() {
    let fake = Fake::start(1).await;
    let writer = fake.writer(|c| c.idempotent(true).max_attempts(3));
    // Sent once (stamped), then the partition has no leader until the writer gives up.
    let err = unlead_during_first_produce(&fake, writer.write_messages(numbered(0, 10)))
        .await
        .unwrap_err();
    assert_eq!(
        err.kafka_code(),
        Some(ErrorCode::LeaderNotAvailable),
        "{err}"
    );
    fake.cluster.move_leader(TOPIC, 0, 1).unwrap();
    // The next healthy batch must not fail with OutOfOrderSequenceNumber.
    writer.write_messages(numbered(0, 10)).await.unwrap();
    assert_eq!(fake.accepted(0).len(), 10);
}

/// An idempotent batch sent once, then expired at the delivery timeout while its
/// partition has no leader, must not leave a sequence gap for the next batch.
#[tokio::test]
async fn idempotent_expired_batch_leaves_no_sequence_gap() {
    let fake = Fake::start(1).await;
    let writer = fake.writer(|c| {
        c.idempotent(true)
            .delivery_timeout(Duration::from_millis(500))
    });
    let err = unlead_during_first_produce(&fake, writer.write_messages(numbered(0, 10)))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("delivery timeout"), "{err}");
    fake.cluster.move_leader(TOPIC, 0, 1).unwrap();
    writer.write_messages(numbered(0, 10)).await.unwrap();
    assert_eq!(fake.accepted(0).len(), 10);
}

struct PanickingBalancer;

impl kafkapipe::writer::Balancer for PanickingBalancer {
    fn partition(&self, _: &Message, _: &[i32]) -> i32 {
        panic!("balancer bug (on purpose)");
    }
}

#[tokio::test]
async fn a_dead_writer_task_fails_poll_ready_and_flush_instead_of_hanging() {
    use futures::SinkExt;
    let fake = Fake::start(1).await;
    let mut writer = fake.writer(|c| c.balancer(PanickingBalancer).max_buffered_bytes(10));
    // Over the buffer bound at once; the task dies assigning the message, so nothing
    // will ever free the space.
    writer.feed(Message::new(vec![b'x'; 100])).await.unwrap();
    let limit = Duration::from_secs(5);
    let e = tokio::time::timeout(limit, writer.feed(Message::new("more")))
        .await
        .expect("poll_ready hung after the task died")
        .unwrap_err();
    assert!(e.is_closed(), "{e}");
    let e = tokio::time::timeout(limit, writer.flush())
        .await
        .expect("flush hung after the task died")
        .unwrap_err();
    assert!(e.is_closed(), "{e}");
    let e = tokio::time::timeout(limit, writer.write_messages([Message::new("x")]))
        .await
        .expect("write_messages hung after the task died")
        .unwrap_err();
    assert!(e.is_closed(), "{e}");
    assert!(tokio::time::timeout(limit, writer.close())
        .await
        .expect("close hung after the task died")
        .is_err());
}

#[tokio::test]
async fn produce_requests_are_capped_at_max_request_bytes() {
    let fake = Fake::start(3).await;
    // One batch per request: each batch alone is over the limit, yet still sent.
    let writer = fake.writer(|c| c.batch_size(10).max_request_bytes(1));
    let msgs: Vec<Message> = (0..3).flat_map(|p| numbered(p, 10)).collect();
    writer.write_messages(msgs).await.unwrap();
    {
        let requests = fake.requests();
        assert_eq!(requests.len(), 3, "{requests:?}");
        assert!(requests.iter().all(|r| r.len() == 1), "{requests:?}");
        for p in 0..3 {
            assert_eq!(fake.accepted(p).len(), 10);
            assert!(in_order(&fake.accepted(p)));
        }
    }
    // Room for two batches of about 200 bytes: two requests carry the three batches.
    let fake = Fake::start(3).await;
    let writer = fake.writer(|c| c.batch_size(10).max_request_bytes(500));
    let msgs: Vec<Message> = (0..3).flat_map(|p| numbered(p, 10)).collect();
    writer.write_messages(msgs).await.unwrap();
    let requests = fake.requests();
    let mut sizes: Vec<usize> = requests.iter().map(Vec::len).collect();
    sizes.sort_unstable();
    assert_eq!(sizes, [1, 2], "{requests:?}");
}

/// While the only in-flight slot is taken (one produce request per broker), the next batch
/// keeps growing past the linger instead of being sealed into a queue of tiny batches
/// that then go out one request at a time (as the Java client keeps appending to a batch
/// until the sender drains it). The first request is held at the broker (a gate, not a
/// delay) until the other 299 messages were fed, each after the 1 ms linger ran out; then
/// they go out as full batches of `batch_size` (100): 1 + 3 requests. Before the fix each
/// expired linger sealed a one-message batch: ~300 requests.
#[tokio::test]
async fn a_batch_waiting_for_an_in_flight_slot_keeps_filling() {
    use futures::SinkExt;
    let fake = Fake::start(1).await;
    let gate = Gate::new();
    fake.cluster
        .fault(ApiKey::PRODUCE, Fault::Hold(gate.clone()), 1);
    let mut writer = fake.writer(|c| {
        c.batch_timeout(Duration::from_millis(1))
            .required_acks(kafkapipe::conn::RequiredAcks::Leader)
            .idempotent(false)
            .max_in_flight_per_broker(1)
    });
    let mut msgs = numbered(0, 300).into_iter();
    let first = msgs.next().unwrap();
    writer.feed(first).await.unwrap();
    // readiness: the first request (message 0 alone) is at the broker, held: the slot is taken
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while fake.cluster.requests(ApiKey::PRODUCE) == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the first produce request never reached the broker"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    for m in msgs {
        writer.feed(m).await.unwrap();
        // longer than the linger: the open batch's linger has run out before the next one
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    assert_eq!(
        fake.cluster.requests(ApiKey::PRODUCE),
        1,
        "the slot stayed taken"
    );
    gate.release(1);
    tokio::time::timeout(Duration::from_secs(20), writer.flush())
        .await
        .expect("flush within 20 s")
        .unwrap();
    let requests = fake.requests();
    assert_eq!(fake.accepted(0).len(), 300);
    assert!(in_order(&fake.accepted(0)));
    assert_eq!(
        requests.len(),
        4,
        "{} produce requests: batches did not grow while waiting for the slot",
        requests.len()
    );
}

/// Several clones feed one writer from separate tasks (on a multi-thread runtime, so the
/// writer's task drains while they push), each flushing now and then; a handle closes the
/// writer after the last feeds, which were never flushed. Every message arrives, each
/// clone's in its own order, each flush returns only once that clone's messages so far
/// are written, and sends after the close fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clones_feeding_at_once_keep_their_order_and_lose_nothing() {
    use futures::SinkExt;
    const CLONES: usize = 4;
    const EACH: usize = 3000;
    let fake = std::sync::Arc::new(Fake::start(1).await);
    let writer = fake.writer(|c| c.batch_size(100).max_buffered_bytes(20_000));
    let handle = writer.handle();
    let mut tasks = Vec::new();
    for c in 0..CLONES {
        let mut w = writer.clone();
        let accepted = {
            let fake = fake.clone();
            let prefix = format!("c{c}-");
            move || {
                fake.accepted(0)
                    .iter()
                    .filter(|v| v.starts_with(prefix.as_bytes()))
                    .count()
            }
        };
        tasks.push(tokio::spawn(async move {
            for i in 0..EACH {
                w.feed(Message::new(format!("c{c}-{i:06}")).with_partition(0))
                    .await
                    .unwrap();
                if i % 700 == 699 {
                    w.flush().await.unwrap();
                    assert!(
                        accepted() > i,
                        "clone {c}: flush returned before message {i} was written"
                    );
                }
                if i % 97 == 0 {
                    tokio::task::yield_now().await;
                }
            }
            w // unflushed tail
        }));
    }
    let mut clones = Vec::new();
    for t in tasks {
        clones.push(t.await.unwrap());
    }
    drop(writer);
    tokio::time::timeout(Duration::from_secs(20), handle.close())
        .await
        .expect("close hung");
    let values = fake.accepted(0);
    assert_eq!(values.len(), CLONES * EACH, "lost or duplicated messages");
    for c in 0..CLONES {
        let prefix = format!("c{c}-");
        let mine: Vec<&Bytes> = values
            .iter()
            .filter(|v| v.starts_with(prefix.as_bytes()))
            .collect();
        assert_eq!(mine.len(), EACH, "clone {c}");
        assert!(
            mine.windows(2).all(|w| w[0] < w[1]),
            "clone {c}'s messages out of order"
        );
    }
    for mut w in clones {
        assert!(w.feed(Message::new("late")).await.unwrap_err().is_closed());
        w.close().await.unwrap();
    }
}

/// A message fed and never flushed is still written, after the linger.
#[tokio::test]
async fn a_fed_message_is_written_without_a_flush() {
    use futures::SinkExt;
    let fake = Fake::start(1).await;
    let mut writer = fake.writer(|c| c);
    writer
        .feed(Message::new("lone").with_partition(0))
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while fake.accepted(0).is_empty() {
        assert!(tokio::time::Instant::now() < deadline, "never written");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(fake.accepted(0), vec![Bytes::from("lone")]);
    writer.close().await.unwrap();
}
