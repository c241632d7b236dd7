//! Tests of the fetch task (`task.rs`).

use std::sync::atomic::AtomicBool;
use std::sync::Mutex;

use bytes::{Bytes, BytesMut};

use super::*;
use crate::cluster::Cluster;
use crate::compression::Compression;
use crate::conn::ConnectionConfig;
use crate::protocol::messages::FetchableTopicResponse;
use crate::reader::state::{Counters, State};
use crate::reader::ReaderConfig;
use crate::record::RecordBatchBuilder;

fn shared() -> Arc<Shared> {
    Arc::new(Shared {
        state: Mutex::new(State::default()),
        wake_task: tokio::sync::Notify::new(),
        config: ReaderConfig::new(["127.0.0.1:1"]).topic("t"),
        cluster: Cluster::new(["127.0.0.1:1"], ConnectionConfig::default()).unwrap(),
        counters: Counters::default(),
        pool: crate::bufpool::BufPool::for_fetches(),
        fetch_sessions: Mutex::default(),
    })
}

/// One partition of topic `t` holding `n` records of 1 KiB of incompressible bytes.
fn response(n: usize, compression: Compression) -> FetchResponse {
    let mut b = RecordBatchBuilder::new(compression);
    let noise = crate::util::noise(1024 * n, 0x9E37_79B9_7F4A_7C15);
    for (o, value) in noise.chunks(1024).enumerate() {
        b.append(o as i64, None, Some(value), &[]).unwrap();
    }
    FetchResponse {
        responses: vec![FetchableTopicResponse {
            topic: "t".into(),
            partitions: vec![FetchPartitionData {
                high_watermark: n as i64,
                records: Some(b.build().unwrap()),
                ..FetchPartitionData::default()
            }],
            ..FetchableTopicResponse::default()
        }],
        ..FetchResponse::default()
    }
}

fn job() -> Job {
    Job {
        id: 0,
        epoch: 0,
        topic: Arc::from("t"),
        partition: 0,
        offset: 0,
        start: None,
        leader_epoch: -1,
        validate: None,
    }
}

/// Decodes `resp` while another task on the same current-thread runtime waits to
/// run; whether it ran before the decoding finished, and the records decoded.
async fn decode_beside_a_task(resp: FetchResponse) -> (bool, usize) {
    let shared = shared();
    let ran = Arc::new(AtomicBool::new(false));
    let flag = ran.clone();
    tokio::spawn(async move { flag.store(true, Ordering::SeqCst) });
    let decoded = decode_response(&shared, resp, &[job()]).await.unwrap();
    let ran = ran.load(Ordering::SeqCst);
    let records = match decoded.into_iter().next() {
        Some(Some(Ok(f))) => f
            .batches
            .iter()
            .map(|b| {
                b.encoded
                    .as_ref()
                    .map_or(b.batch.records.len(), |e| e.len())
            })
            .sum(),
        _ => panic!("partition not decoded"),
    };
    (ran, records)
}

#[test]
fn a_request_asks_for_its_share_of_the_room_within_max_bytes() {
    let config = ReaderConfig::new(["b:9092"]).max_bytes(4 << 20);
    assert_eq!(request_max_bytes(&config, 3 << 20, 1), 3 << 20);
    assert_eq!(request_max_bytes(&config, 3 << 20, 3), 1 << 20);
    assert_eq!(
        request_max_bytes(&config, 64 << 20, 1),
        4 << 20,
        "max_bytes"
    );
    assert_eq!(request_max_bytes(&config, 0, 2), 1, "at least a batch");
    assert_eq!(request_max_bytes(&config, usize::MAX, 0), 4 << 20);
}

/// A response for 16 partitions of very compressible records (each partition 8 lz4
/// batches that decompress to 1 MiB from a few KiB) decodes to about the queue's byte
/// capacity, shared among the partitions, each of which makes progress; it decoded to
/// 16 × 8 MiB when each partition had a lone fetch's 64 MiB limit.
#[test]
fn a_response_of_many_compressed_partitions_decodes_within_the_queue_capacity() {
    let shared = shared();
    let batch = |base: i64| {
        let mut b = RecordBatchBuilder::new(Compression::Lz4);
        for o in 0..100 {
            b.append(base + o, None, Some(&[b'x'; 10_240][..]), &[])
                .unwrap();
        }
        let mut data = BytesMut::from(&b.build().unwrap()[..]);
        data[..8].copy_from_slice(&base.to_be_bytes());
        data.freeze()
    };
    let records: Bytes = (0..8)
        .flat_map(|i| batch(i * 100).to_vec())
        .collect::<Vec<u8>>()
        .into();
    assert!(
        records.len() < 1 << 20,
        "{} bytes on the wire",
        records.len()
    );
    let resp = FetchResponse {
        responses: vec![FetchableTopicResponse {
            topic: "t".into(),
            partitions: (0..16)
                .map(|p| FetchPartitionData {
                    partition_index: p,
                    high_watermark: 800,
                    records: Some(records.clone()),
                    ..FetchPartitionData::default()
                })
                .collect(),
            ..FetchableTopicResponse::default()
        }],
        ..FetchResponse::default()
    };
    let wanted: Vec<(Arc<str>, i32, i64)> = (0..16).map(|p| (Arc::from("t"), p, 0)).collect();
    let decoded = decode_all(&shared, resp, &wanted);
    let mut total = 0;
    for d in decoded {
        let f = d.unwrap().unwrap();
        assert!(!f.batches.is_empty());
        assert_eq!(f.next_offset, f.batches.last().unwrap().batch.next_offset());
        total += f
            .batches
            .iter()
            .map(|b| b.encoded.as_ref().map_or(0, |e| e.bytes()))
            .sum::<usize>();
    }
    let capacity = shared.config.queue_capacity_bytes;
    assert!(
        total <= capacity + 16 * 1_100_000,
        "decoded {total} bytes, queue capacity {capacity}"
    );
    assert_eq!(
        partition_decompress_limit(&shared.config, 1),
        8 << 20,
        "the queue capacity"
    );
    assert_eq!(partition_decompress_limit(&shared.config, 16), 4 << 20);
    assert_eq!(partition_decompress_limit(&shared.config, 1000), 4 << 20);
}

/// An out-of-range reset whose new start offset is looked up while the consumer holds
/// the partition's buffer on loan: the position stays with the messages still to be
/// yielded (it jumped to the looked-up offset, then went back as they were yielded).
#[test]
fn a_start_offset_resolved_during_a_loan_leaves_the_position_to_the_loan() {
    let shared = shared();
    let tp = crate::reader::TopicPartition::new("t", 0);
    let mut loan = crate::reader::state::Loan::default();
    let (id, epoch) = {
        let mut st = shared.lock();
        st.assign(tp.clone(), StartOffset::At(0));
        let id = st.index[&tp];
        st.push(
            id,
            (0..10)
                .map(|o| super::super::Message::new("t", 0, o))
                .collect(),
        );
        let first = st.pop_into(Some(&mut loan)).map(|m| m.offset);
        assert_eq!(first, Some(0));
        let p = st.parts.get_mut(&id).unwrap();
        p.fetch = Position::Start(StartOffset::Last);
        (id, p.epoch)
    };
    let job = Job {
        id,
        epoch,
        topic: Arc::from("t"),
        partition: 0,
        offset: -1,
        start: Some(StartOffset::Last),
        leader_epoch: -1,
        validate: None,
    };
    let found = Found {
        leader: 1,
        leader_epoch: -1,
        offset: Some(500),
        end: None,
    };
    on_resolved(&shared, vec![(job, Ok(found))]);
    let st = shared.lock();
    let p = &st.parts[&id];
    assert_eq!(p.fetch, Position::Offset(500));
    assert!(
        st.position_of(id, p) <= 10,
        "position {}",
        st.position_of(id, p)
    );
}

#[tokio::test(flavor = "current_thread")]
async fn a_large_compressed_response_is_decoded_off_the_runtime_thread() {
    let resp = response(400, Compression::Zstd);
    assert!(compressed_bytes(&resp) >= OFF_RUNTIME_DECODE_BYTES);
    let (ran, records) = decode_beside_a_task(resp).await;
    assert_eq!(records, 400);
    assert!(ran, "the runtime thread was held for the whole decoding");
}

#[tokio::test(flavor = "current_thread")]
async fn small_or_uncompressed_responses_are_decoded_in_place() {
    for resp in [
        response(400, Compression::None),
        response(10, Compression::Zstd),
    ] {
        assert!(compressed_bytes(&resp) < OFF_RUNTIME_DECODE_BYTES);
        let (ran, records) = decode_beside_a_task(resp).await;
        assert!(records > 0);
        assert!(!ran, "a cheap decoding went through the blocking pool");
    }
}
/// An incremental fetch refused for a lost session (70 or 71) frees its partitions
/// for a full fetch at once: no backoff, no error counted; the same error for a full
/// request is an ordinary failure.
#[test]
fn a_lost_fetch_session_is_refetched_in_full_without_backoff() {
    let shared = shared();
    let tp = crate::reader::TopicPartition::new("t", 0);
    let (id, epoch) = {
        let mut st = shared.lock();
        st.assign(tp.clone(), StartOffset::At(0));
        let id = st.index[&tp];
        let p = st.parts.get_mut(&id).unwrap();
        p.fetch = Position::Offset(5);
        p.busy = true;
        (id, p.epoch)
    };
    let j = Job {
        id,
        epoch,
        offset: 5,
        ..job()
    };
    let planned = [((Arc::from("t"), 0), sent(&shared.config, &j))];
    let mut session = Session::default();
    session.request(true, &planned);
    session.answered(9);
    let req = session.request(true, &planned);
    assert!(!req.full && req.send.is_empty());
    for code in [
        ErrorCode::InvalidFetchSessionEpoch,
        ErrorCode::FetchSessionIdNotFound,
    ] {
        let err = Err(Error::kafka(code));
        let out = on_session(&shared, &mut session, 1, std::slice::from_ref(&j), err);
        assert!(out.is_none(), "{code:?} went on as a failure");
        let st = shared.lock();
        let p = &st.parts[&id];
        assert!(!p.busy && p.retry_at.is_none());
        drop(st);
        let req = session.request(true, &planned);
        assert!(req.full && req.send == vec![0], "{req:?}");
        // answered in full, then the next one is incremental again
        session.answered(10);
        assert!(!session.request(true, &planned).full);
    }
    assert_eq!(shared.counters.sessions_lost.load(Ordering::Relaxed), 2);
    assert_eq!(shared.counters.errors.load(Ordering::Relaxed), 0);
    // A full request refused so is an ordinary failure (backoff, no loop).
    session.failed(None);
    assert!(session.request(true, &planned).full);
    let err = Err(Error::kafka(ErrorCode::FetchSessionIdNotFound));
    assert!(on_session(&shared, &mut session, 1, &[j], err).is_some());
}
