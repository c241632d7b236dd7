//! Writer behaviour a real broker cannot be made to show on demand — leader changes, partition errors,
//! partitions without a leader — against a small scripted fake broker that speaks
//! ApiVersions, Metadata and Produce over TCP with kafkapipe's own protocol codec.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use kafkapipe::protocol::messages::{
    ApiVersionRange, ApiVersionsRequest, ApiVersionsResponse, InitProducerIdRequest,
    InitProducerIdResponse, MetadataBroker, MetadataPartition, MetadataRequest, MetadataResponse,
    MetadataTopic, ProducePartitionResponse, ProduceRequest, ProduceResponse, ProduceTopicResponse,
};
use kafkapipe::protocol::{
    ApiKey, Decode, Encode, ErrorCode, Request, RequestHeader, ResponseHeader, TaggedFields,
};
use kafkapipe::record::decode_batches;
use kafkapipe::writer::{Message, Writer, WriterConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const TOPIC: &str = "t";

#[derive(Default)]
struct State {
    /// Partition id → leader id (1 is this broker, -1 none).
    partitions: Vec<(i32, i32)>,
    /// Error codes to answer for a partition's next produces, in order.
    script: HashMap<i32, VecDeque<ErrorCode>>,
    /// An error code answered for every produce to a partition.
    always: HashMap<i32, ErrorCode>,
    /// Partitions carried by each produce request.
    requests: Vec<Vec<i32>>,
    /// Broker id → partitions carried, per produce request it received.
    requests_by_broker: HashMap<i32, Vec<Vec<i32>>>,
    /// Broker id → port, for every broker of the fake cluster.
    ports: Vec<(i32, u16)>,
    /// Values accepted per partition, in order.
    accepted: HashMap<i32, Vec<Bytes>>,
    metadata_requests: usize,
    /// Answer MessageTooLarge for batches with more records than this.
    max_records: Option<usize>,
    /// Producer ids handed out by InitProducerId.
    producer_ids: i64,
    /// Idempotence per partition: producer id, epoch, base sequence of the last batch
    /// appended and the next sequence expected.
    sequences: HashMap<i32, (i64, i16, i32, i32)>,
    /// Partitions whose next produce is appended but left out of the response.
    omit_once: std::collections::HashSet<i32>,
    /// A partition answered with a scripted or `always` error loses its leader.
    unlead_on_error: bool,
}

struct Fake {
    addr: String,
    state: Arc<Mutex<State>>,
}

impl Fake {
    /// One fake broker (id 1) hosting `partitions` (id, leader).
    async fn start(partitions: Vec<(i32, i32)>) -> Fake {
        Self::start_cluster(1, partitions).await
    }

    /// `brokers` fake brokers (ids 1..=brokers) sharing one state; bootstrap is broker 1.
    /// A broker answers NotLeaderOrFollower for partitions it does not lead.
    async fn start_cluster(brokers: i32, partitions: Vec<(i32, i32)>) -> Fake {
        let state = Arc::new(Mutex::new(State {
            partitions,
            ..State::default()
        }));
        let mut addr = String::new();
        for id in 1..=brokers {
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let port = listener.local_addr().unwrap().port();
            if id == 1 {
                addr = listener.local_addr().unwrap().to_string();
            }
            state.lock().unwrap().ports.push((id, port));
            let st = state.clone();
            tokio::spawn(async move {
                while let Ok((sock, _)) = listener.accept().await {
                    tokio::spawn(serve(sock, st.clone(), id));
                }
            });
        }
        Fake { addr, state }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap()
    }

    fn writer(&self, tune: impl FnOnce(WriterConfig) -> WriterConfig) -> Writer {
        Writer::new(tune(
            WriterConfig::new([self.addr.clone()])
                .topic(TOPIC)
                .backoff(Duration::from_millis(5), Duration::from_millis(20))
                .batch_timeout(Duration::from_millis(2)),
        ))
        .unwrap()
    }
}

fn frame<R: Request>(correlation_id: i32, version: i16, resp: &R::Response) -> BytesMut
where
    R::Response: Encode,
{
    let mut body = BytesMut::new();
    ResponseHeader {
        correlation_id,
        tagged_fields: TaggedFields::new(),
    }
    .encode(&mut body, R::response_header_version(version))
    .unwrap();
    resp.encode(&mut body, version).unwrap();
    let mut out = BytesMut::new();
    out.put_i32(body.len() as i32);
    out.extend_from_slice(&body);
    out
}

async fn serve(mut sock: TcpStream, state: Arc<Mutex<State>>, me: i32) {
    loop {
        let Ok(size) = sock.read_i32().await else {
            return;
        };
        let mut buf = vec![0u8; size as usize];
        if sock.read_exact(&mut buf).await.is_err() {
            return;
        }
        let mut buf = Bytes::from(buf);
        let (key, version, _) = RequestHeader::peek(&buf).unwrap();
        let out = match key {
            ApiKey::API_VERSIONS => {
                let h = RequestHeader::decode(
                    &mut buf,
                    ApiVersionsRequest::request_header_version(version),
                )
                .unwrap();
                let range = |api_key, min_version, max_version| ApiVersionRange {
                    api_key,
                    min_version,
                    max_version,
                    tagged_fields: TaggedFields::new(),
                };
                let resp = ApiVersionsResponse {
                    api_keys: vec![
                        range(ApiKey::API_VERSIONS, 0, 3),
                        range(ApiKey::METADATA, 4, 12),
                        range(ApiKey::PRODUCE, 3, 9),
                        range(ApiKey::INIT_PRODUCER_ID, 0, 4),
                    ],
                    ..ApiVersionsResponse::default()
                };
                frame::<ApiVersionsRequest>(h.correlation_id, version.min(3), &resp)
            }
            ApiKey::METADATA => {
                let h = RequestHeader::decode(
                    &mut buf,
                    MetadataRequest::request_header_version(version),
                )
                .unwrap();
                let mut st = state.lock().unwrap();
                st.metadata_requests += 1;
                let resp = MetadataResponse {
                    brokers: st
                        .ports
                        .iter()
                        .map(|(id, port)| MetadataBroker {
                            node_id: *id,
                            host: "127.0.0.1".into(),
                            port: i32::from(*port),
                            ..MetadataBroker::default()
                        })
                        .collect(),
                    controller_id: 1,
                    topics: vec![MetadataTopic {
                        name: Some(TOPIC.into()),
                        partitions: st
                            .partitions
                            .iter()
                            .map(|(id, leader)| MetadataPartition {
                                partition_index: *id,
                                leader_id: *leader,
                                error_code: if *leader < 0 { 5 } else { 0 },
                                ..MetadataPartition::default()
                            })
                            .collect(),
                        ..MetadataTopic::default()
                    }],
                    ..MetadataResponse::default()
                };
                frame::<MetadataRequest>(h.correlation_id, version, &resp)
            }
            ApiKey::INIT_PRODUCER_ID => {
                let h = RequestHeader::decode(
                    &mut buf,
                    InitProducerIdRequest::request_header_version(version),
                )
                .unwrap();
                let mut st = state.lock().unwrap();
                st.producer_ids += 1;
                let resp = InitProducerIdResponse {
                    producer_id: 1000 + st.producer_ids,
                    producer_epoch: 0,
                    ..InitProducerIdResponse::default()
                };
                frame::<InitProducerIdRequest>(h.correlation_id, version, &resp)
            }
            ApiKey::PRODUCE => {
                let h = RequestHeader::decode(
                    &mut buf,
                    ProduceRequest::request_header_version(version),
                )
                .unwrap();
                let req = ProduceRequest::decode(&mut buf, version).unwrap();
                let mut st = state.lock().unwrap();
                let mut carried = Vec::new();
                let mut responses = Vec::new();
                for t in req.topic_data {
                    let mut parts = Vec::new();
                    for p in t.partition_data {
                        carried.push(p.index);
                        let leads = st
                            .partitions
                            .iter()
                            .any(|(id, l)| *id == p.index && *l == me);
                        let code = match st.script.get_mut(&p.index).and_then(VecDeque::pop_front) {
                            _ if !leads => Some(ErrorCode::NotLeaderOrFollower),
                            Some(c) => Some(c),
                            None => st.always.get(&p.index).copied(),
                        };
                        if code.is_some() && st.unlead_on_error {
                            for (id, l) in &mut st.partitions {
                                if *id == p.index {
                                    *l = -1;
                                }
                            }
                        }
                        let base = st.accepted.get(&p.index).map_or(0, Vec::len) as i64;
                        let batches = decode_batches(p.records.clone().unwrap(), 1 << 24).unwrap();
                        let ids = batches
                            .batches
                            .first()
                            .map(|b| (b.producer_id, b.producer_epoch, b.base_sequence));
                        let records: Vec<_> = batches
                            .batches
                            .into_iter()
                            .flat_map(|b| b.records)
                            .collect();
                        // Idempotence as a broker applies it.
                        let code = match (code, ids) {
                            (None, Some((pid, epoch, seq))) if pid >= 0 => {
                                let n = records.len() as i32;
                                match st.sequences.get(&p.index).copied() {
                                    Some((q, e, last, _))
                                        if (q, e) == (pid, epoch) && seq == last =>
                                    {
                                        Some(ErrorCode::DuplicateSequenceNumber)
                                    }
                                    Some((q, e, _, next))
                                        if (q, e) == (pid, epoch) && seq != next =>
                                    {
                                        Some(ErrorCode::OutOfOrderSequenceNumber)
                                    }
                                    Some((q, e, _, _)) if (q, e) != (pid, epoch) && seq != 0 => {
                                        Some(ErrorCode::OutOfOrderSequenceNumber)
                                    }
                                    None if seq != 0 => Some(ErrorCode::OutOfOrderSequenceNumber),
                                    _ => {
                                        st.sequences.insert(p.index, (pid, epoch, seq, seq + n));
                                        None
                                    }
                                }
                            }
                            (code, _) => code,
                        };
                        let code = match (code, st.max_records) {
                            (None, Some(max)) if records.len() > max => {
                                Some(ErrorCode::MessageTooLarge)
                            }
                            (code, _) => code,
                        };
                        if code.is_none() {
                            let values = st.accepted.entry(p.index).or_default();
                            values.extend(records.into_iter().map(|r| r.value.unwrap()));
                        }
                        if code.is_none() && st.omit_once.remove(&p.index) {
                            continue;
                        }
                        parts.push(ProducePartitionResponse {
                            index: p.index,
                            error_code: code.map_or(0, ErrorCode::code),
                            base_offset: base,
                            log_append_time_ms: -1,
                            ..ProducePartitionResponse::default()
                        });
                    }
                    responses.push(ProduceTopicResponse {
                        name: t.name,
                        partition_responses: parts,
                        ..ProduceTopicResponse::default()
                    });
                }
                st.requests_by_broker
                    .entry(me)
                    .or_default()
                    .push(carried.clone());
                st.requests.push(carried);
                let resp = ProduceResponse {
                    responses,
                    ..ProduceResponse::default()
                };
                frame::<ProduceRequest>(h.correlation_id, version, &resp)
            }
            other => panic!("fake broker got unexpected {other}"),
        };
        if sock.write_all(&out).await.is_err() {
            return;
        }
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

#[tokio::test]
async fn not_leader_is_retried_in_order_after_a_metadata_refresh() {
    let fake = Fake::start(vec![(0, 1), (1, 1)]).await;
    fake.state().script.insert(
        0,
        VecDeque::from([
            ErrorCode::NotLeaderOrFollower,
            ErrorCode::NotLeaderOrFollower,
        ]),
    );
    let writer = fake.writer(|c| c.batch_size(50));
    let mut msgs = numbered(0, 300);
    msgs.extend(numbered(1, 300));
    writer.write_messages(msgs).await.unwrap();

    let stats = writer.stats();
    assert_eq!(stats.messages, 600, "{stats:?}");
    assert_eq!(stats.retries, 2, "{stats:?}");
    let st = fake.state();
    assert!(
        st.metadata_requests >= 2,
        "metadata refreshed after NotLeader"
    );
    for p in [0, 1] {
        let got = &st.accepted[&p];
        assert_eq!(got.len(), 300, "partition {p}");
        assert!(in_order(got), "partition {p} out of order");
    }
    assert!(
        st.requests.iter().any(|r| r.len() == 2),
        "batches of both partitions share a request: {:?}",
        st.requests
    );
    for r in &st.requests {
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
    let fake = Fake::start(vec![(0, 1), (1, 1)]).await;
    fake.state().always.insert(1, ErrorCode::MessageTooLarge);
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
    assert_eq!(fake.state().accepted[&0].len(), 20);
    // The writer keeps working for the healthy partition.
    writer.write_messages(numbered(0, 5)).await.unwrap();
}

#[tokio::test]
async fn retriable_error_gives_up_after_max_attempts() {
    let fake = Fake::start(vec![(0, 1)]).await;
    fake.state()
        .always
        .insert(0, ErrorCode::NotLeaderOrFollower);
    let writer = fake.writer(|c| c.max_attempts(3));
    let err = writer.write_messages(numbered(0, 3)).await.unwrap_err();
    assert_eq!(
        err.kafka_code(),
        Some(ErrorCode::NotLeaderOrFollower),
        "{err}"
    );
    assert_eq!(err.partition(), Some(0));
    assert_eq!(fake.state().requests.len(), 3, "exactly max_attempts sends");
    assert_eq!(writer.stats().retries, 2);
}

#[tokio::test]
async fn partition_without_leader_fails_after_max_attempts() {
    let fake = Fake::start(vec![(0, 1), (1, -1)]).await;
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
    assert!(!fake.state().accepted.contains_key(&1));
}

#[tokio::test]
async fn batch_too_large_for_the_broker_is_split_until_it_fits() {
    use futures::StreamExt;
    let fake = Fake::start(vec![(0, 1)]).await;
    fake.state().max_records = Some(4);
    let writer = fake.writer(|c| c.batch_size(37));
    let mut deliveries = writer.deliveries();
    writer.write_messages(numbered(0, 37)).await.unwrap();
    let stats = writer.stats();
    assert_eq!((stats.messages, stats.errors), (37, 0), "{stats:?}");
    assert_eq!(stats.batch_messages_max, 4, "{stats:?}");
    let got = fake.state().accepted[&0].clone();
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
    let fake = Fake::start_cluster(2, vec![(0, 1), (1, 2), (2, 1), (3, 2)]).await;
    let writer = fake.writer(|c| c.batch_size(20));
    let all = |n| (0..4).flat_map(move |p| numbered(p, n)).collect::<Vec<_>>();
    writer.write_messages(all(100)).await.unwrap();
    {
        let st = fake.state();
        for (broker, reqs) in &st.requests_by_broker {
            let led: Vec<i32> = if *broker == 1 { vec![0, 2] } else { vec![1, 3] };
            assert!(
                reqs.iter().flatten().all(|p| led.contains(p)),
                "broker {broker} got partitions it does not lead: {reqs:?}"
            );
        }
        assert!(
            st.requests_by_broker
                .values()
                .flatten()
                .any(|r| r.len() == 2),
            "a broker's partitions share requests"
        );
    }

    // Partition 0 moves to broker 2: broker 1 answers NotLeaderOrFollower, the writer
    // refreshes metadata and follows the leader.
    fake.state().partitions[0].1 = 2;
    let before = writer.stats().retries;
    let mut second: Vec<Message> = (100..200)
        .map(|i| Message::new(format!("{i:06}")).with_partition(0))
        .collect();
    second.extend((100..200).map(|i| Message::new(format!("{i:06}")).with_partition(1)));
    writer.write_messages(second).await.unwrap();
    assert!(writer.stats().retries > before, "NotLeader was retried");
    let st = fake.state();
    for p in 0..4 {
        let got = &st.accepted[&p];
        assert!(in_order(got), "partition {p} out of order");
    }
    assert_eq!(st.accepted[&0].len(), 200);
    assert_eq!(st.accepted[&1].len(), 200);
    let moved = st.requests_by_broker[&2]
        .iter()
        .flatten()
        .filter(|p| **p == 0)
        .count();
    assert!(moved > 0, "partition 0 now goes to broker 2");
}

#[tokio::test]
async fn extreme_settings_do_not_overflow() {
    use futures::SinkExt;
    let fake = Fake::start(vec![(0, 1)]).await;
    let mut writer = fake.writer(|c| {
        c.batch_size(usize::MAX)
            .batch_timeout(Duration::MAX)
            .write_timeout(Duration::MAX)
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
    assert_eq!(fake.state().accepted[&0].len(), 3);
}

#[tokio::test]
async fn split_with_deliveries_frees_exactly_the_buffered_bytes() {
    use futures::StreamExt;
    let fake = Fake::start(vec![(0, 1)]).await;
    fake.state().max_records = Some(1);
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
    let fake = Fake::start(vec![(0, 1)]).await;
    fake.state().omit_once.insert(0);
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
    let got = fake.state().accepted[&0].clone();
    assert_eq!(got.len(), 200, "the second batch was not written");
    assert_eq!(got[199], Bytes::from("b099"));
    assert_eq!(
        fake.state().producer_ids,
        2,
        "a new producer id after the ambiguity"
    );
}

#[tokio::test]
async fn idempotent_rejected_batch_gives_its_sequence_numbers_back() {
    let fake = Fake::start(vec![(0, 1)]).await;
    fake.state()
        .script
        .insert(0, VecDeque::from([ErrorCode::InvalidRecord]));
    let writer = fake.writer(|c| c.idempotent(true));
    let err = writer.write_messages(numbered(0, 10)).await.unwrap_err();
    assert_eq!(err.kafka_code(), Some(ErrorCode::InvalidRecord), "{err}");
    writer.write_messages(numbered(0, 10)).await.unwrap();
    assert_eq!(fake.state().accepted[&0].len(), 10);
    assert_eq!(fake.state().producer_ids, 1, "no new producer id needed");
}

#[tokio::test]
async fn idempotent_leaderless_give_up_leaves_no_sequence_gap() {
    let fake = Fake::start(vec![(0, 1)]).await;
    {
        let mut st = fake.state();
        st.script
            .insert(0, VecDeque::from([ErrorCode::NotLeaderOrFollower]));
        st.unlead_on_error = true;
    }
    let writer = fake.writer(|c| c.idempotent(true).max_attempts(3));
    // Sent once (stamped), then the partition has no leader until the writer gives up.
    let err = writer.write_messages(numbered(0, 10)).await.unwrap_err();
    assert_eq!(
        err.kafka_code(),
        Some(ErrorCode::LeaderNotAvailable),
        "{err}"
    );
    {
        let mut st = fake.state();
        st.partitions = vec![(0, 1)];
        st.unlead_on_error = false;
    }
    // The next healthy batch must not fail with OutOfOrderSequenceNumber.
    writer.write_messages(numbered(0, 10)).await.unwrap();
    assert_eq!(fake.state().accepted[&0].len(), 10);
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
    let fake = Fake::start(vec![(0, 1)]).await;
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
    let fake = Fake::start(vec![(0, 1), (1, 1), (2, 1)]).await;
    // One batch per request: each batch alone is over the limit, yet still sent.
    let writer = fake.writer(|c| c.batch_size(10).max_request_bytes(1));
    let msgs: Vec<Message> = (0..3).flat_map(|p| numbered(p, 10)).collect();
    writer.write_messages(msgs).await.unwrap();
    {
        let st = fake.state();
        assert_eq!(st.requests.len(), 3, "{:?}", st.requests);
        assert!(
            st.requests.iter().all(|r| r.len() == 1),
            "{:?}",
            st.requests
        );
        for p in 0..3 {
            assert_eq!(st.accepted[&p].len(), 10);
            assert!(in_order(&st.accepted[&p]));
        }
    }
    // Room for two batches of about 200 bytes: two requests carry the three batches.
    let fake = Fake::start(vec![(0, 1), (1, 1), (2, 1)]).await;
    let writer = fake.writer(|c| c.batch_size(10).max_request_bytes(500));
    let msgs: Vec<Message> = (0..3).flat_map(|p| numbered(p, 10)).collect();
    writer.write_messages(msgs).await.unwrap();
    let st = fake.state();
    let mut sizes: Vec<usize> = st.requests.iter().map(Vec::len).collect();
    sizes.sort_unstable();
    assert_eq!(sizes, [1, 2], "{:?}", st.requests);
}
