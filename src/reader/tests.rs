use std::time::Duration;

use bytes::Bytes;

use super::state::{Position, State};
use super::*;

fn msg(topic: &str, partition: i32, offset: i64, len: usize) -> Message {
    let mut m = Message::new(topic, partition, offset);
    m.value = Some(Bytes::from(vec![0u8; len]));
    m.timestamp = 0;
    m
}

fn state_with(parts: &[(&str, i32)]) -> (State, Vec<u64>) {
    let mut st = State::default();
    let mut ids = Vec::new();
    for (t, p) in parts {
        let tp = TopicPartition::new(*t, *p);
        st.assign(tp.clone(), StartOffset::At(0));
        ids.push(st.index[&tp]);
    }
    (st, ids)
}

#[test]
fn pop_is_round_robin_across_partitions() {
    let cfg = ReaderConfig::new(["b:9092"]);
    let (mut st, ids) = state_with(&[("t", 0), ("t", 1), ("u", 0)]);
    st.push(ids[0], (0..5).map(|o| msg("t", 0, o, 1)).collect());
    st.push(ids[1], (0..2).map(|o| msg("t", 1, o, 1)).collect());
    st.push(ids[2], (0..1).map(|o| msg("u", 0, o, 1)).collect());
    let order: Vec<(String, i32, i64)> = std::iter::from_fn(|| st.pop(&cfg))
        .map(|(m, _)| (m.topic.to_string(), m.partition, m.offset))
        .collect();
    let want = [
        ("t", 0, 0),
        ("t", 1, 0),
        ("u", 0, 0),
        ("t", 0, 1),
        ("t", 1, 1),
        ("t", 0, 2),
        ("t", 0, 3),
        ("t", 0, 4),
    ];
    let want: Vec<(String, i32, i64)> = want
        .iter()
        .map(|(t, p, o)| (t.to_string(), *p, *o))
        .collect();
    assert_eq!(order, want);
    assert_eq!((st.buffered, st.buffered_bytes), (0, 0));
    assert_eq!(st.parts[&ids[0]].position, 5);
}

#[test]
fn reset_and_unassign_drop_buffered_messages() {
    let cfg = ReaderConfig::new(["b:9092"]);
    let (mut st, ids) = state_with(&[("t", 0), ("t", 1)]);
    st.push(ids[0], (0..3).map(|o| msg("t", 0, o, 10)).collect());
    st.push(ids[1], (0..3).map(|o| msg("t", 1, o, 10)).collect());
    let epoch = st.parts[&ids[0]].epoch;
    st.reset(ids[0], Position::Offset(100));
    assert_eq!(st.parts[&ids[0]].epoch, epoch + 1);
    assert_eq!(st.parts[&ids[0]].position, 100);
    assert_eq!((st.buffered, st.buffered_bytes), (3, 30));
    assert!(st.unassign(&TopicPartition::new("t", 1)));
    assert!(!st.unassign(&TopicPartition::new("t", 1)));
    assert_eq!((st.buffered, st.buffered_bytes), (0, 0));
    assert!(st.pop(&cfg).is_none());
}

#[test]
fn full_by_messages_or_bytes_and_reports_when_space_frees() {
    let cfg = ReaderConfig::new(["b:9092"])
        .queue_capacity(3)
        .queue_capacity_bytes(1000);
    let (mut st, ids) = state_with(&[("t", 0)]);
    st.push(ids[0], (0..3).map(|o| msg("t", 0, o, 1)).collect());
    assert!(st.full(&cfg));
    let (_, freed) = st.pop(&cfg).unwrap();
    assert!(freed);
    let (_, freed) = st.pop(&cfg).unwrap();
    assert!(!freed);
    st.push(ids[0], vec![msg("t", 0, 3, 2000)]);
    assert!(st.full(&cfg), "bytes bound");
}

#[test]
fn fetching_pauses_at_half_the_byte_capacity_and_asks_for_the_rest() {
    let cfg = ReaderConfig::new(["b:9092"]).queue_capacity_bytes(1000);
    let (mut st, ids) = state_with(&[("t", 0)]);
    assert_eq!(st.fetch_room(&cfg), Some(1000));
    st.push(ids[0], vec![msg("t", 0, 0, 300)]);
    let queued = st.queued().1;
    assert_eq!(st.fetch_room(&cfg), Some(1000 - queued));
    st.push(ids[0], vec![msg("t", 0, 1, 300)]);
    assert!(st.queued().1 >= 500);
    assert_eq!(st.fetch_room(&cfg), None, "paused at half the capacity");
    assert!(st.full(&cfg));
    let (_, freed) = st.pop(&cfg).unwrap();
    assert!(freed, "under half again");
    assert_eq!(st.fetch_room(&cfg), Some(1000 - st.queued().1));
}

#[test]
fn paused_partitions_are_skipped_kept_and_resumed_in_order() {
    let cfg = ReaderConfig::new(["b:9092"])
        .queue_capacity(4)
        .queue_capacity_bytes(1 << 20);
    let (mut st, ids) = state_with(&[("t", 0), ("t", 1)]);
    let (t0, t1) = (TopicPartition::new("t", 0), TopicPartition::new("t", 1));
    st.push(ids[0], (0..3).map(|o| msg("t", 0, o, 1)).collect());
    st.push(ids[1], (0..3).map(|o| msg("t", 1, o, 1)).collect());
    assert!(st.full(&cfg));
    let (m, _) = st.pop(&cfg).unwrap();
    assert_eq!((m.partition, m.offset), (0, 0));
    st.pause(&t0);
    // the paused buffer no longer counts against the capacity
    assert!(!st.full(&cfg));
    // a fetch in flight when paused still lands, but nothing of it is yielded
    st.push(ids[0], (3..5).map(|o| msg("t", 0, o, 1)).collect());
    let rest: Vec<(i32, i64)> = std::iter::from_fn(|| st.pop(&cfg))
        .map(|(m, _)| (m.partition, m.offset))
        .collect();
    assert_eq!(rest, [(1, 0), (1, 1), (1, 2)]);
    assert_eq!(st.parts[&ids[0]].position, 1, "position kept");
    assert_eq!(st.buffered, 4, "buffer kept");
    assert!(!st.resume(&t1), "not paused");
    assert!(st.resume(&t0));
    let resumed: Vec<i64> = std::iter::from_fn(|| st.pop(&cfg))
        .map(|(m, _)| m.offset)
        .collect();
    assert_eq!(resumed, [1, 2, 3, 4]);
    // a pause ends with the assignment
    st.pause(&t1);
    assert!(st.unassign(&t1));
    st.assign(t1.clone(), StartOffset::At(0));
    assert!(!st.resume(&t1), "a new assignment is not paused");
    // pausing what is not assigned does nothing
    st.pause(&TopicPartition::new("u", 0));
    assert!(!st.resume(&TopicPartition::new("u", 0)));
}

#[test]
fn close_ends_the_stream_and_drops_buffers_and_errors() {
    let cfg = ReaderConfig::new(["b:9092"]);
    let (mut st, ids) = state_with(&[("t", 0)]);
    st.push(ids[0], (0..3).map(|o| msg("t", 0, o, 1)).collect());
    st.errors.push_back(Error::config("pending"));
    assert!(st.close().is_none());
    assert!(st.closed);
    assert!(st.errors.is_empty());
    assert_eq!((st.buffered, st.buffered_bytes), (0, 0));
    assert!(st.pop(&cfg).is_none());
}

#[test]
fn reassigning_resets_the_start() {
    let (mut st, ids) = state_with(&[("t", 0)]);
    st.push(ids[0], vec![msg("t", 0, 0, 1)]);
    st.assign(TopicPartition::new("t", 0), StartOffset::Last);
    let p = &st.parts[&ids[0]];
    assert_eq!(p.fetch, Position::Start(StartOffset::Last));
    assert_eq!((p.position, st.buffered), (-1, 0));
}

#[test]
fn config_validation_and_backoff() {
    assert!(ReaderConfig::new(Vec::<String>::new()).validate().is_err());
    assert!(ReaderConfig::new(["b:1"])
        .queue_capacity(0)
        .validate()
        .is_err());
    assert!(ReaderConfig::new(["b:1"])
        .start_offset(StartOffset::At(-1))
        .validate()
        .is_err());
    assert!(ReaderConfig::new(["b:1"])
        .read_backoff(Duration::from_secs(2), Duration::from_secs(1))
        .validate()
        .is_err());
    // topic patterns: group readers only, and enough on their own
    assert!(ReaderConfig::new(["b:1"])
        .topic_pattern("t-*")
        .validate()
        .is_err());
    assert!(ReaderConfig::new(["b:1"])
        .group_id("g")
        .topic_pattern("t-*")
        .validate()
        .is_ok());
    assert!(ReaderConfig::new(["b:1"]).group_id("g").validate().is_err());
    let c = ReaderConfig::new(["b:1"])
        .read_backoff(Duration::from_millis(100), Duration::from_millis(500));
    assert!(c.validate().is_ok());
    let b: Vec<u128> = (1..=5).map(|n| c.backoff_for(n).as_millis()).collect();
    assert_eq!(b, [100, 200, 400, 500, 500]);
    assert_eq!(
        c.connection_config().request_timeout,
        Duration::from_millis(30_500)
    );
}

#[cfg(all(feature = "gzip", feature = "lz4", feature = "zstd"))]
mod fetch_decoding {
    //! The fetch-response decoding the reader shares with `Conn::fetch`
    //! (`decode_fetch_partition`), on hand-built responses: tansu sends no aborted
    //! transactions list, so read-committed filtering is tested here.

    use bytes::{Bytes, BytesMut};

    use crate::compression::Compression;
    use crate::conn::{decode_fetch_partition, IsolationLevel};
    use crate::protocol::messages::{AbortedTransaction, FetchPartitionData};
    use crate::protocol::ErrorCode;
    use crate::record::{ControlRecord, RecordBatchBuilder};

    /// A batch at `base` with values `v{offset}` for `n` records.
    fn data(base: i64, n: i64, producer: Option<i64>, compression: Compression) -> Bytes {
        let mut b = RecordBatchBuilder::new(compression);
        if let Some(pid) = producer {
            b = b.producer(pid, 0, 0).transactional(true);
        }
        for o in base..base + n {
            b.append(o, None, Some(format!("v{o}").as_bytes()), &[])
                .unwrap();
        }
        rebase(b.build().unwrap(), base)
    }

    fn control(base: i64, pid: i64, marker: ControlRecord) -> Bytes {
        let mut b = RecordBatchBuilder::new(Compression::None)
            .producer(pid, 0, -1)
            .transactional(true)
            .control(true);
        b.append(base, Some(&marker.key()), Some(&[0, 0, 0, 0, 0, 0]), &[])
            .unwrap();
        rebase(b.build().unwrap(), base)
    }

    /// Set the base offset (not covered by the CRC).
    fn rebase(batch: Bytes, base: i64) -> Bytes {
        let mut b = BytesMut::from(&batch[..]);
        b[..8].copy_from_slice(&base.to_be_bytes());
        b.freeze()
    }

    fn partition(batches: &[Bytes], aborted: Vec<AbortedTransaction>) -> FetchPartitionData {
        FetchPartitionData {
            high_watermark: 100,
            records: Some(batches.concat().into()),
            aborted_transactions: Some(aborted),
            ..FetchPartitionData::default()
        }
    }

    fn offsets(p: FetchPartitionData, from: i64, iso: IsolationLevel) -> (Vec<i64>, i64) {
        let f = decode_fetch_partition(p, from, iso, 1 << 20).unwrap();
        (f.records.iter().map(|r| r.offset).collect(), f.next_offset)
    }

    #[test]
    fn read_committed_drops_aborted_transactions_and_control_records() {
        // pid 7 aborts 0..3, pid 8 commits 4..6, pid 7 starts again at 8 and commits.
        let batches = [
            data(0, 3, Some(7), Compression::None),
            control(3, 7, ControlRecord::Abort),
            data(4, 2, Some(8), Compression::Lz4),
            control(6, 8, ControlRecord::Commit),
            data(7, 1, None, Compression::None),
            data(8, 2, Some(7), Compression::Zstd),
            control(10, 7, ControlRecord::Commit),
        ];
        let aborted = vec![AbortedTransaction {
            producer_id: 7,
            first_offset: 0,
            ..AbortedTransaction::default()
        }];
        let committed = offsets(
            partition(&batches, aborted.clone()),
            0,
            IsolationLevel::ReadCommitted,
        );
        assert_eq!(committed, (vec![4, 5, 7, 8, 9], 11));
        // Read uncommitted keeps the aborted records but still hides control records.
        let uncommitted = offsets(
            partition(&batches, aborted),
            0,
            IsolationLevel::ReadUncommitted,
        );
        assert_eq!(uncommitted, (vec![0, 1, 2, 4, 5, 7, 8, 9], 11));
    }

    #[test]
    fn truncated_last_batch_is_ignored_and_leading_records_skipped() {
        let first = data(10, 5, None, Compression::Gzip);
        let second = data(15, 5, None, Compression::None);
        let cut = second.slice(..second.len() - 7);
        let p = partition(&[first, cut], Vec::new());
        // Asked from 12: the batch starts at 10, its first two records are skipped; the
        // cut second batch is dropped, so the next fetch starts at 15.
        assert_eq!(
            offsets(p, 12, IsolationLevel::ReadUncommitted),
            (vec![12, 13, 14], 15)
        );
    }

    #[test]
    fn partition_error_codes_become_errors() {
        let p = FetchPartitionData {
            error_code: ErrorCode::OffsetOutOfRange.code(),
            ..FetchPartitionData::default()
        };
        let e = decode_fetch_partition(p, 0, IsolationLevel::ReadUncommitted, 1024).unwrap_err();
        assert_eq!(e.kafka_code(), Some(ErrorCode::OffsetOutOfRange));
    }
}

#[test]
fn reader_is_send_and_sync() {
    fn check<T: Send + Sync + Unpin>() {}
    check::<Reader>();
    check::<Message>();
    fn handle<T: Clone + Send + Sync + 'static>() {}
    handle::<ReaderHandle>();
}

#[cfg(feature = "regex")]
#[test]
fn topic_regexes_match_whole_names_and_are_validated() {
    let config = ReaderConfig::new(["b:9092"])
        .group_id("g")
        .topic_regex(r"orders\.(eu|us)")
        .topic_pattern("audit-*");
    assert!(config.validate().is_ok());
    assert!(config.has_topic_patterns());
    assert!(config.topic_matches("orders.eu"));
    assert!(config.topic_matches("orders.us"));
    assert!(config.topic_matches("audit-2026"));
    // a whole-name match, as Java's Pattern.matcher(topic).matches()
    assert!(!config.topic_matches("orders.eux"));
    assert!(!config.topic_matches("xorders.eu"));
    assert!(!config.topic_matches("orders-eu"));

    let bad = ReaderConfig::new(["b:9092"])
        .group_id("g")
        .topic_regex("orders(");
    let err = bad.validate().unwrap_err();
    assert!(
        err.to_string().contains("not a valid regular expression"),
        "{err}"
    );

    let no_group = ReaderConfig::new(["b:9092"]).topic_regex("orders.*");
    assert!(
        no_group.validate().is_err(),
        "regex subscription needs a group"
    );
}

#[test]
fn group_protocol_validation() {
    use crate::group::GroupProtocol;
    let kip848 = || {
        ReaderConfig::new(["b:9092"])
            .group_id("g")
            .group_protocol(GroupProtocol::Consumer)
    };
    assert!(kip848().topic("t").validate().is_ok());
    assert!(kip848()
        .topic("t")
        .group_remote_assignor("uniform")
        .validate()
        .is_ok());
    // a broker-evaluated regex alone is a subscription
    assert!(kip848().group_topic_regex("orders-.*").validate().is_ok());
    assert!(kip848().validate().is_err(), "no subscription");
    assert!(kip848().group_topic_regex("").validate().is_err());
    // client-side patterns are the classic protocol's
    let e = kip848()
        .topic("t")
        .topic_pattern("orders-*")
        .validate()
        .unwrap_err();
    assert!(e.to_string().contains("group_topic_regex"), "{e}");
    // the KIP-848 options need the consumer protocol (and a group)
    let classic = ReaderConfig::new(["b:9092"]).group_id("g").topic("t");
    assert!(classic.clone().group_topic_regex("x").validate().is_err());
    assert!(classic.group_remote_assignor("range").validate().is_err());
    assert!(ReaderConfig::new(["b:9092"])
        .group_protocol(GroupProtocol::Consumer)
        .group_topic_regex("x")
        .validate()
        .is_err());
}

/// Take the next message as the consumer does: from its loan while that holds, else
/// under the lock (settling the loan first).
fn take(st: &mut State, loan: &mut state::Loan) -> Option<Result<Message>> {
    let lent = st.lent.clone();
    if let Some(m) = loan.next(&lent) {
        return Some(Ok(m));
    }
    st.settle(loan);
    if let Some(e) = st.errors.pop_front() {
        return Some(Err(e));
    }
    match st.pop_into(Some(loan)) {
        Some(m) => Some(Ok(m)),
        None => st.errors.pop_front().map(Err),
    }
}

/// The offsets taken up to the first error, and that error.
fn until_error(st: &mut State, loan: &mut state::Loan) -> (Vec<i64>, crate::Error) {
    let mut got = Vec::new();
    loop {
        match take(st, loan).expect("an item") {
            Ok(m) => got.push(m.offset),
            Err(e) => return (got, e),
        }
    }
}

fn offset_of(r: Option<Result<Message>>) -> i64 {
    r.expect("an item").expect("a message").offset
}

#[test]
fn runs_of_one_partition_are_lent_and_partitions_take_turns() {
    let cfg = ReaderConfig::new(["b:9092"]);
    let (mut st, ids) = state_with(&[("t", 0), ("t", 1)]);
    st.push(ids[0], (0..100).map(|o| msg("t", 0, o, 1)).collect());
    st.push(ids[1], (0..3).map(|o| msg("t", 1, o, 1)).collect());
    let mut loan = state::Loan::default();
    let order: Vec<(i32, i64)> = std::iter::from_fn(|| take(&mut st, &mut loan))
        .map(|r| r.map(|m| (m.partition, m.offset)).expect("a message"))
        .collect();
    let mut want: Vec<(i32, i64)> = (0..state::RUN as i64).map(|o| (0, o)).collect();
    want.extend((0..3).map(|o| (1, o)));
    want.extend((state::RUN as i64..100).map(|o| (0, o)));
    assert_eq!(order, want);
    st.settle(&mut loan);
    assert_eq!(st.queued(), (0, 0));
    assert!(!st.full(&cfg));
    assert_eq!(st.parts[&ids[0]].position, 100);
    assert_eq!(st.parts[&ids[1]].position, 3);
}

#[test]
fn an_error_queued_while_lent_comes_before_the_rest_of_the_loan() {
    let (mut st, ids) = state_with(&[("t", 0)]);
    st.push(ids[0], (0..10).map(|o| msg("t", 0, o, 1)).collect());
    let mut loan = state::Loan::default();
    assert_eq!(offset_of(take(&mut st, &mut loan)), 0);
    assert_eq!(offset_of(take(&mut st, &mut loan)), 1);
    st.push_error(Error::config("failed"));
    let e = take(&mut st, &mut loan).expect("an item");
    assert!(e.is_err(), "{e:?}");
    // the rest went back to the buffer, in order, and counts again
    assert_eq!(st.queued(), (8, 8));
    assert_eq!(st.parts[&ids[0]].position, 2);
    let rest: Vec<i64> = std::iter::from_fn(|| take(&mut st, &mut loan))
        .map(|r| r.expect("a message").offset)
        .collect();
    assert_eq!(rest, (2..10).collect::<Vec<_>>());
}

#[test]
fn a_partition_parked_while_lent_yields_its_error_after_the_lent_messages() {
    let (mut st, ids) = state_with(&[("t", 0)]);
    st.push(ids[0], (0..3).map(|o| msg("t", 0, o, 1)).collect());
    let mut loan = state::Loan::default();
    assert_eq!(offset_of(take(&mut st, &mut loan)), 0);
    assert!(
        !st.park(ids[0], Error::config("corrupt")),
        "queued after the loan"
    );
    assert_eq!(offset_of(take(&mut st, &mut loan)), 1);
    assert_eq!(offset_of(take(&mut st, &mut loan)), 2);
    let e = take(&mut st, &mut loan).expect("an item");
    assert!(e.is_err(), "{e:?}");
    assert!(take(&mut st, &mut loan).is_none());
}

#[test]
fn a_reset_while_lent_drops_the_loan_and_its_count() {
    let cfg = ReaderConfig::new(["b:9092"]).queue_capacity(10);
    let (mut st, ids) = state_with(&[("t", 0)]);
    st.push(ids[0], (0..10).map(|o| msg("t", 0, o, 1)).collect());
    let mut loan = state::Loan::default();
    assert_eq!(offset_of(take(&mut st, &mut loan)), 0);
    assert_eq!(st.queued(), (9, 9));
    st.reset(ids[0], Position::Offset(50));
    assert_eq!(st.queued(), (0, 0));
    assert!(!st.full(&cfg));
    assert!(take(&mut st, &mut loan).is_none());
    assert_eq!(st.queued(), (0, 0));
    assert_eq!(st.parts[&ids[0]].position, 50);
}

/// A RecordBatch v2 at offset `base` of `n` records with 10-byte values.
fn wire_batch(base: i64, n: usize, codec: crate::compression::Compression) -> Vec<u8> {
    let mut b = crate::record::RecordBatchBuilder::new(codec);
    for i in 0..n {
        b.append(1_000 + i as i64, None, Some(&[i as u8; 10][..]), &[])
            .expect("append");
    }
    let mut raw = b.build().expect("build").to_vec();
    raw[..8].copy_from_slice(&base.to_be_bytes());
    raw
}

/// Push `data` (record batches) into partition `id` as the fetch task does for a fetch
/// from `from`; the partition's next fetch offset moves past it.
fn fetch_lazily(st: &mut State, id: u64, data: Vec<u8>, from: i64) -> (u64, u64) {
    let pd = crate::protocol::messages::FetchPartitionData {
        high_watermark: 1_000,
        records: Some(data.into()),
        ..Default::default()
    };
    let f = crate::conn::decode_fetch_lazy(
        pd,
        from,
        crate::conn::IsolationLevel::ReadUncommitted,
        1 << 20,
        None,
        true,
    )
    .expect("decodes");
    if let Some(p) = st.parts.get_mut(&id) {
        p.fetch = Position::Offset(f.next_offset.max(from));
    }
    st.push_batches(id, f.batches, from, 1, 1_000)
}

fn none() -> crate::compression::Compression {
    crate::compression::Compression::None
}

#[test]
fn lazily_held_batches_count_against_the_queue_capacity() {
    let cfg = ReaderConfig::new(["b:9092"]).queue_capacity(100);
    let (mut st, ids) = state_with(&[("t", 0)]);
    let raw = wire_batch(0, 100, none());
    // the records' encoded bytes: the batch after its 61-byte header
    let payload = raw.len() - 61;
    assert_eq!(fetch_lazily(&mut st, ids[0], raw, 0), (100, payload as u64));
    let p = &st.parts[&ids[0]];
    assert!(p.buf.is_empty(), "nothing decoded before it is taken");
    assert_eq!(p.lazy_n, 100);
    assert_eq!(st.queued(), (100, payload));
    assert!(st.full(&cfg));
    // taking one decodes a run: still 99 queued, whatever their form
    let (m, _) = st.pop(&cfg).expect("a message");
    assert_eq!((m.offset, m.value.as_deref()), (0, Some(&[0u8; 10][..])));
    assert_eq!(st.queued().0, 99);
    assert!(!st.full(&cfg));
    let sizes: usize = std::iter::from_fn(|| st.pop(&cfg))
        .map(|(m, _)| m.queued_size())
        .sum::<usize>()
        + m.queued_size();
    assert_eq!(sizes, payload, "the records' sizes add up to the payload");
    assert_eq!(st.queued(), (0, 0));
}

#[test]
fn a_loan_decodes_at_most_a_run() {
    let (mut st, ids) = state_with(&[("t", 0)]);
    fetch_lazily(&mut st, ids[0], wire_batch(0, 1_000, none()), 0);
    let mut loan = state::Loan::default();
    assert_eq!(offset_of(take(&mut st, &mut loan)), 0);
    let p = &st.parts[&ids[0]];
    assert_eq!(p.lazy_n, 1_000 - state::RUN, "one run decoded");
    assert_eq!(st.queued().0, 999);
    let all: Vec<i64> = std::iter::from_fn(|| take(&mut st, &mut loan))
        .map(|r| r.expect("a message").offset)
        .collect();
    assert_eq!(all, (1..1_000).collect::<Vec<_>>());
    st.settle(&mut loan);
    assert_eq!(st.queued(), (0, 0));
}

#[test]
fn a_seek_during_a_half_decoded_batch_drops_the_rest() {
    let cfg = ReaderConfig::new(["b:9092"]).queue_capacity(100);
    let (mut st, ids) = state_with(&[("t", 0)]);
    fetch_lazily(&mut st, ids[0], wire_batch(0, 200, none()), 0);
    fetch_lazily(&mut st, ids[0], wire_batch(200, 200, none()), 200);
    let mut loan = state::Loan::default();
    for want in 0..10 {
        assert_eq!(offset_of(take(&mut st, &mut loan)), want);
    }
    st.reset(ids[0], Position::Offset(5_000));
    assert_eq!(st.queued(), (0, 0));
    assert!(!st.full(&cfg));
    assert!(take(&mut st, &mut loan).is_none());
    let p = &st.parts[&ids[0]];
    assert!(p.lazy.is_empty() && p.buf.is_empty());
    assert_eq!((p.lazy_n, p.lazy_bytes, p.buf_bytes), (0, 0, 0));
    assert_eq!(st.queued(), (0, 0));
    assert_eq!(p.position, 5_000);
}

#[test]
fn a_compressed_batch_starting_before_the_fetch_offset_yields_from_the_fetch_offset() {
    let (mut st, ids) = state_with(&[("t", 0)]);
    st.reset(ids[0], Position::Offset(4));
    let raw = wire_batch(0, 10, crate::compression::Compression::Zstd);
    let (n, _) = fetch_lazily(&mut st, ids[0], raw, 4);
    assert_eq!(n, 6, "only the records from the fetch offset count");
    assert_eq!(st.queued().0, 6);
    let mut loan = state::Loan::default();
    let got: Vec<i64> = std::iter::from_fn(|| take(&mut st, &mut loan))
        .map(|r| r.expect("a message").offset)
        .collect();
    assert_eq!(got, (4..10).collect::<Vec<_>>());
    st.settle(&mut loan);
    assert_eq!(st.queued(), (0, 0));
    assert_eq!(st.parts[&ids[0]].position, 10);
}

/// `raw` (one RecordBatch v2) with its last byte set to `b` and the CRC fixed.
fn with_last_byte(mut raw: Vec<u8>, b: u8) -> Vec<u8> {
    let last = raw.len() - 1;
    raw[last] = b;
    let crc = crc32c::crc32c(&raw[21..]);
    raw[17..21].copy_from_slice(&crc.to_be_bytes());
    raw
}

#[test]
fn a_malformed_record_surfaces_as_an_error_after_the_records_before_it() {
    let (mut st, ids) = state_with(&[("t", 0)]);
    // The last record's header count (its last byte) claims a header that is not there:
    // the batch passes its CRC check, the record does not decode.
    let bad = with_last_byte(wire_batch(0, 100, none()), 2);
    fetch_lazily(&mut st, ids[0], bad, 0);
    fetch_lazily(&mut st, ids[0], wire_batch(100, 10, none()), 100);
    assert_eq!(st.queued().0, 110);
    let mut loan = state::Loan::default();
    let (got, err) = until_error(&mut st, &mut loan);
    assert_eq!(got, (0..99).collect::<Vec<_>>());
    let text = err.to_string();
    assert!(
        text.contains("cannot decode the records fetched at offset 0"),
        "{text}"
    );
    assert!(text.contains("header count"), "{text}");
    assert_eq!(err.partition(), Some(0));
    // parked like a partition whose fetch does not decode: what followed is dropped,
    // the position stays at the bad record until a seek
    assert!(take(&mut st, &mut loan).is_none());
    st.settle(&mut loan);
    assert_eq!(st.queued(), (0, 0));
    let p = &st.parts[&ids[0]];
    assert_eq!(p.fetch, Position::Parked);
    assert_eq!(p.position, 99);
    assert_eq!(st.take_decode_errors().len(), 1);
}

#[test]
fn a_malformed_first_record_is_the_next_item() {
    let (mut st, ids) = state_with(&[("t", 0), ("t", 1)]);
    let bad = with_last_byte(wire_batch(0, 1, none()), 2);
    fetch_lazily(&mut st, ids[0], bad, 0);
    fetch_lazily(&mut st, ids[1], wire_batch(0, 3, none()), 0);
    let mut loan = state::Loan::default();
    assert!(take(&mut st, &mut loan).expect("an item").is_err());
    let rest: Vec<(i32, i64)> = std::iter::from_fn(|| take(&mut st, &mut loan))
        .map(|r| r.map(|m| (m.partition, m.offset)).expect("a message"))
        .collect();
    assert_eq!(rest, vec![(1, 0), (1, 1), (1, 2)]);
    assert_eq!(st.parts[&ids[0]].position, 0);
}

#[test]
fn the_position_after_the_last_lazily_decoded_record_is_the_next_fetch_offset() {
    for pop_one_by_one in [false, true] {
        let cfg = ReaderConfig::new(["b:9092"]);
        let (mut st, ids) = state_with(&[("t", 0)]);
        fetch_lazily(&mut st, ids[0], wire_batch(0, 100, none()), 0);
        // control records (say) follow: the next fetch starts past them
        st.parts.get_mut(&ids[0]).expect("assigned").fetch = Position::Offset(102);
        let mut loan = state::Loan::default();
        let mut n = 0;
        if pop_one_by_one {
            while let Some((m, _)) = st.pop(&cfg) {
                assert_eq!(m.offset, n);
                n += 1;
                let want = if n == 100 { 102 } else { n };
                assert_eq!(st.parts[&ids[0]].position, want);
            }
        } else {
            while let Some(r) = take(&mut st, &mut loan) {
                assert_eq!(r.expect("a message").offset, n);
                n += 1;
            }
            st.settle(&mut loan);
        }
        assert_eq!(n, 100);
        assert_eq!(st.parts[&ids[0]].position, 102);
    }
}

/// 168 bytes until the leader epoch (KIP-320: an `i32` behind `Message::leader_epoch`)
/// took the last 8.
#[test]
fn a_message_stays_176_bytes_with_its_queued_size_and_leader_epoch() {
    assert!(std::mem::size_of::<Message>() <= 176);
}

#[test]
fn a_group_partition_yields_lazily_decoded_messages_one_at_a_time_through_its_track() {
    use crate::group::{AckToken, Pulse, Track};
    use std::sync::Arc;
    let (mut st, ids) = state_with(&[("t", 0)]);
    let track = Arc::new(Track::new(-1, true, 10, Arc::new(Pulse::default())));
    st.set_track(&TopicPartition::new("t", 0), Some(track.clone()));
    fetch_lazily(&mut st, ids[0], wire_batch(0, 100, none()), 0);
    st.parts.get_mut(&ids[0]).expect("assigned").fetch = Position::Offset(101);
    let mut loan = state::Loan::default();
    let (mut got, mut unacked, mut blocked) = (Vec::new(), Vec::new(), 0);
    loop {
        match take(&mut st, &mut loan) {
            Some(Ok(mut m)) => {
                assert!(m.ack_token().is_tracked());
                let p = &st.parts[&ids[0]];
                assert!(p.buf.len() < state::RUN, "decoded a run at most");
                assert_eq!(st.queued().0, 99 - got.len());
                got.push(m.offset);
                unacked.push(m.take_ack_token());
            }
            Some(Err(e)) => panic!("{e}"),
            // the track is full: acks make room
            None if !unacked.is_empty() => {
                assert_eq!(unacked.len(), 10);
                blocked += 1;
                unacked.drain(..).for_each(AckToken::ack);
            }
            None => break,
        }
    }
    assert_eq!(got, (0..100).collect::<Vec<_>>());
    assert_eq!(blocked, 10);
    assert_eq!(st.parts[&ids[0]].position, 101);
    assert_eq!(track.pending_offset(), 101);
    assert_eq!(st.queued(), (0, 0));
}

/// A group partition's run is lent to the consumer as a track-less one's is: the lent
/// messages carry tokens of the partition's track, delivered to it as they are yielded
/// (without the reader's lock), and the loan stops at a full track or one restarted (a
/// seek) since it was made, to go on under the lock.
#[test]
fn a_group_partition_s_run_is_lent_with_its_track_s_tokens() {
    use crate::group::{AckToken, Pulse, Track};
    use std::sync::Arc;
    let tp = TopicPartition::new("t", 0);
    let (mut st, ids) = state_with(&[("t", 0)]);
    let track = Arc::new(Track::new(-1, true, 1000, Arc::new(Pulse::default())));
    st.set_track(&tp, Some(track.clone()));
    st.push(ids[0], (0..100).map(|o| msg("t", 0, o, 1)).collect());
    let mut loan = state::Loan::default();
    let first = offset_of(take(&mut st, &mut loan));
    assert_eq!(first, 0);
    assert!(st.is_lent(ids[0]), "the rest of the run is lent");
    let lent = st.lent.clone();
    let mut tokens = Vec::new();
    while let Some(mut m) = loan.next(&lent) {
        assert!(m.ack_token().is_tracked(), "offset {}", m.offset);
        tokens.push(m.take_ack_token());
    }
    assert_eq!(tokens.len(), state::RUN - 1);
    assert_eq!(
        track.unacked().0,
        state::RUN,
        "every lent message yielded is delivered"
    );
    tokens.into_iter().for_each(AckToken::ack);

    // A full track stops the loan; the lock path then blocks the partition.
    let (mut st, ids) = state_with(&[("t", 0)]);
    let track = Arc::new(Track::new(-1, true, 3, Arc::new(Pulse::default())));
    st.set_track(&tp, Some(track.clone()));
    st.push(ids[0], (0..10).map(|o| msg("t", 0, o, 1)).collect());
    let mut loan = state::Loan::default();
    let got: Vec<i64> = std::iter::from_fn(|| take(&mut st, &mut loan))
        .map(|r| r.expect("a message").offset)
        .collect();
    assert_eq!(got, vec![0, 1, 2]);
    assert_eq!(track.unacked().0, 3);
    assert_eq!(st.queued().0, 7, "the rest is back in the buffer");

    // A track restarted since the loan was made (a seek) refuses lent messages.
    let (mut st, ids) = state_with(&[("t", 0)]);
    let track = Arc::new(Track::new(-1, true, 1000, Arc::new(Pulse::default())));
    st.set_track(&tp, Some(track.clone()));
    st.push(ids[0], (0..10).map(|o| msg("t", 0, o, 1)).collect());
    let mut loan = state::Loan::default();
    assert_eq!(offset_of(take(&mut st, &mut loan)), 0);
    track.restart();
    assert!(loan.next(&st.lent.clone()).is_none());
    assert_eq!(track.unacked().0, 0);
}

/// A fetch that returns only control records (a transaction marker) while the rest of a
/// group partition's run is lent: once the loan's last message is processed, the commit
/// moves past the marker, as it does when the message is yielded under the lock.
#[test]
fn a_marker_fetched_while_a_group_run_is_lent_is_committed_past() {
    use crate::group::{AckToken, Pulse, Track};
    use std::sync::Arc;
    let tp = TopicPartition::new("t", 0);
    let (mut st, ids) = state_with(&[("t", 0)]);
    let pulse = Arc::new(Pulse::default());
    let track = Arc::new(Track::new(-1, true, 1000, pulse.clone()));
    st.set_track(&tp, Some(track.clone()));
    st.push(ids[0], (0..10).map(|o| msg("t", 0, o, 1)).collect());
    st.parts.get_mut(&ids[0]).expect("assigned").fetch = Position::Offset(10);
    let mut loan = state::Loan::default();
    let mut tokens = Vec::new();
    let mut first = take(&mut st, &mut loan)
        .expect("an item")
        .expect("a message");
    tokens.push(first.take_ack_token());
    assert!(st.is_lent(ids[0]));
    // the fetch task: offset 10 is a commit marker, the next fetch starts at 11
    st.parts.get_mut(&ids[0]).expect("assigned").fetch = Position::Offset(11);
    st.fetched_to(ids[0], 10, 11);
    while let Some(Ok(mut m)) = take(&mut st, &mut loan) {
        tokens.push(m.take_ack_token());
    }
    assert_eq!(tokens.len(), 10);
    tokens.into_iter().for_each(AckToken::ack);
    assert_eq!(st.parts[&ids[0]].position, 11);
    assert_eq!(
        track.pending_offset(),
        11,
        "the commit moves past the marker"
    );
}

#[test]
fn a_paused_partitions_encoded_batches_stop_counting_and_resume_where_they_stopped() {
    let cfg = ReaderConfig::new(["b:9092"]).queue_capacity(50);
    let (mut st, ids) = state_with(&[("t", 0), ("t", 1)]);
    let tp0 = TopicPartition::new("t", 0);
    fetch_lazily(&mut st, ids[0], wire_batch(0, 100, none()), 0);
    let mut loan = state::Loan::default();
    for want in 0..5 {
        assert_eq!(offset_of(take(&mut st, &mut loan)), want);
    }
    assert!(st.full(&cfg));
    st.pause(&tp0);
    fetch_lazily(&mut st, ids[1], wire_batch(0, 3, none()), 0);
    let other: Vec<(i32, i64)> = std::iter::from_fn(|| take(&mut st, &mut loan))
        .map(|r| r.map(|m| (m.partition, m.offset)).expect("a message"))
        .collect();
    assert_eq!(other, vec![(1, 0), (1, 1), (1, 2)]);
    assert_eq!(st.queued().0, 95, "kept while paused");
    assert!(!st.full(&cfg), "but not counted");
    assert!(st.resume(&tp0));
    let rest: Vec<i64> = std::iter::from_fn(|| take(&mut st, &mut loan))
        .map(|r| r.expect("a message").offset)
        .collect();
    assert_eq!(rest, (5..100).collect::<Vec<_>>());
}

/// The encoded bytes of a RecordBatch v2 as its batch header leaves them: the
/// (compressed) payload after the 61-byte header.
fn payload_len(raw: &[u8]) -> usize {
    raw.len() - 61
}

/// How many of partition `id`'s pending batches are still compressed.
fn still_compressed(st: &State, id: u64) -> usize {
    st.parts[&id]
        .lazy
        .iter()
        .filter(|b| b.is_compressed())
        .count()
}

#[test]
fn compressed_batches_stay_compressed_until_the_consumer_reaches_them() {
    let lz4 = crate::compression::Compression::Lz4;
    let (mut st, ids) = state_with(&[("t", 0)]);
    let raws: Vec<Vec<u8>> = (0..10).map(|i| wire_batch(i * 100, 100, lz4)).collect();
    let compressed: usize = raws.iter().map(|r| payload_len(r)).sum();
    let plain = payload_len(&wire_batch(0, 100, none()));
    assert!(compressed < 10 * plain, "the test's batches compress");
    let mut data = Vec::new();
    raws.iter().for_each(|r| data.extend_from_slice(r));
    // counted at their compressed size, none decompressed
    assert_eq!(
        fetch_lazily(&mut st, ids[0], data, 0),
        (1_000, compressed as u64)
    );
    assert_eq!(st.queued(), (1_000, compressed));
    assert_eq!(still_compressed(&st, ids[0]), 10);
    // taking the first message decompresses the first batch only, which then counts
    // its records' encoded bytes
    let mut loan = state::Loan::default();
    let first = take(&mut st, &mut loan)
        .expect("an item")
        .expect("a message");
    assert_eq!(first.offset, 0);
    assert_eq!(still_compressed(&st, ids[0]), 9);
    st.settle(&mut loan);
    let rest = compressed - payload_len(&raws[0]);
    assert_eq!(st.queued(), (999, rest + plain - first.queued_size()));
    let mut got = vec![0];
    while let Some(r) = take(&mut st, &mut loan) {
        let m = r.expect("a message");
        assert_eq!(m.value.as_deref(), Some(&[(m.offset % 100) as u8; 10][..]));
        got.push(m.offset);
    }
    assert_eq!(got, (0..1_000).collect::<Vec<_>>());
    st.settle(&mut loan);
    assert_eq!(st.queued(), (0, 0), "every byte counted is uncounted");
    assert_eq!(st.parts[&ids[0]].position, 1_000);
}

#[test]
fn a_compressed_batch_that_does_not_decompress_is_an_error_after_the_batches_before_it() {
    let lz4 = crate::compression::Compression::Lz4;
    let (mut st, ids) = state_with(&[("t", 0)]);
    let mut data = wire_batch(0, 100, lz4);
    // the second batch's LZ4 frame loses its end mark (its CRC still matches)
    let bad = with_last_byte(wire_batch(100, 100, lz4), 0xff);
    data.extend_from_slice(&bad);
    data.extend_from_slice(&wire_batch(200, 100, lz4));
    assert_eq!(fetch_lazily(&mut st, ids[0], data, 0).0, 300);
    let mut loan = state::Loan::default();
    let (got, err) = until_error(&mut st, &mut loan);
    assert_eq!(got, (0..100).collect::<Vec<_>>());
    let text = err.to_string();
    assert!(
        text.contains("cannot decode the records fetched at offset 0")
            && text.contains("record batch at offset 100"),
        "{text}"
    );
    assert!(take(&mut st, &mut loan).is_none());
    st.settle(&mut loan);
    assert_eq!(st.queued(), (0, 0));
    let p = &st.parts[&ids[0]];
    assert_eq!((p.fetch, p.position), (Position::Parked, 100));
}

#[test]
fn a_run_decompresses_one_batch_when_batches_are_large() {
    // Batches of one record each: a run of RUN messages would otherwise decompress RUN
    // batches at once.
    let (mut st, ids) = state_with(&[("t", 0)]);
    let mut data = Vec::new();
    for i in 0..10 {
        let mut b = crate::record::RecordBatchBuilder::new(crate::compression::Compression::Lz4);
        b.append(0, None, Some(&vec![i as u8; 1 << 20][..]), &[])
            .expect("append");
        let mut raw = b.build().expect("build").to_vec();
        raw[..8].copy_from_slice(&(i as i64).to_be_bytes());
        data.extend_from_slice(&raw);
    }
    assert_eq!(fetch_lazily(&mut st, ids[0], data, 0).0, 10);
    let mut loan = state::Loan::default();
    assert_eq!(offset_of(take(&mut st, &mut loan)), 0);
    assert_eq!(
        still_compressed(&st, ids[0]),
        9,
        "one MiB decompressed, not ten"
    );
    let rest: Vec<i64> = std::iter::from_fn(|| take(&mut st, &mut loan))
        .map(|r| r.expect("a message").offset)
        .collect();
    assert_eq!(rest, (1..10).collect::<Vec<_>>());
}

#[test]
fn a_group_partition_whose_track_is_full_leaves_its_next_batch_compressed() {
    use crate::group::{Pulse, Track};
    use std::sync::Arc;
    let lz4 = crate::compression::Compression::Lz4;
    let (mut st, ids) = state_with(&[("t", 0), ("t", 1)]);
    for (p, id) in ids.iter().enumerate() {
        // room for one run of unacknowledged messages: the first batch
        let track = Arc::new(Track::new(-1, true, state::RUN, Arc::new(Pulse::default())));
        st.set_track(&TopicPartition::new("t", p as i32), Some(track));
        let mut data = wire_batch(0, state::RUN, lz4);
        data.extend_from_slice(&wire_batch(state::RUN as i64, 100, lz4));
        fetch_lazily(&mut st, *id, data, 0);
    }
    let mut loan = state::Loan::default();
    let mut tokens = Vec::new();
    for _ in 0..2 * state::RUN {
        let mut m = take(&mut st, &mut loan)
            .expect("an item")
            .expect("a message");
        assert!(m.offset < state::RUN as i64);
        tokens.push(m.take_ack_token());
    }
    // Both tracks are full: nothing to yield, and no second batch decompressed for
    // nothing.
    assert!(take(&mut st, &mut loan).is_none());
    assert_eq!(still_compressed(&st, ids[0]), 1);
    assert_eq!(still_compressed(&st, ids[1]), 1);
    tokens.drain(..).for_each(crate::group::AckToken::ack);
    let m = take(&mut st, &mut loan)
        .expect("an item")
        .expect("a message");
    assert_eq!(m.offset, state::RUN as i64);
}

#[test]
fn a_compressed_batch_is_decompressed_without_the_state_and_a_stale_result_is_dropped() {
    let lz4 = crate::compression::Compression::Lz4;
    let (mut st, ids) = state_with(&[("t", 0)]);
    let mut data = wire_batch(0, 10, lz4);
    data.extend_from_slice(&wire_batch(10, 10, lz4));
    fetch_lazily(&mut st, ids[0], data, 0);
    let queued = st.queued();
    let mut loan = state::Loan::default();
    // The consumer is handed the decompression to do without the lock; the state is
    // untouched meanwhile.
    let state::Popped::Inflate(job) = st.pop_or_inflate(Some(&mut loan)) else {
        panic!("a batch to decompress first");
    };
    assert_eq!(still_compressed(&st, ids[0]), 2);
    assert_eq!(st.queued(), queued);
    let result = job.run();
    st.install(job, result);
    assert_eq!(still_compressed(&st, ids[0]), 1);
    let mut offsets = Vec::new();
    let job = loop {
        match st.pop_or_inflate(Some(&mut loan)) {
            state::Popped::Message(m) => offsets.push(m.offset),
            state::Popped::Inflate(job) => break job,
            state::Popped::Nothing => panic!("the second batch is left"),
        }
        st.settle(&mut loan);
        while let Some(m) = loan.next(&st.lent.clone()) {
            offsets.push(m.offset);
        }
        st.settle(&mut loan);
    };
    assert_eq!(offsets, (0..10).collect::<Vec<_>>());
    // A seek while the second batch is being decompressed: its result is dropped.
    st.reset(ids[0], Position::Offset(0));
    let result = job.run();
    st.install(job, result);
    assert_eq!(st.queued(), (0, 0));
    assert!(matches!(
        st.pop_or_inflate(Some(&mut loan)),
        state::Popped::Nothing
    ));
}

#[test]
fn a_batch_decompressed_while_its_partition_is_paused_counts_once_it_is_resumed() {
    let lz4 = crate::compression::Compression::Lz4;
    let cfg = ReaderConfig::new(["b:9092"]).queue_capacity(50);
    let (mut st, ids) = state_with(&[("t", 0)]);
    let tp = TopicPartition::new("t", 0);
    fetch_lazily(&mut st, ids[0], wire_batch(0, 100, lz4), 0);
    let mut loan = state::Loan::default();
    let state::Popped::Inflate(job) = st.pop_or_inflate(Some(&mut loan)) else {
        panic!("a batch to decompress");
    };
    assert!(st.full(&cfg));
    st.pause(&tp);
    let result = job.run();
    st.install(job, result);
    assert_eq!(still_compressed(&st, ids[0]), 0, "installed while paused");
    assert!(!st.full(&cfg), "a paused partition does not count");
    assert!(matches!(
        st.pop_or_inflate(Some(&mut loan)),
        state::Popped::Nothing
    ));
    assert!(st.resume(&tp));
    assert!(st.full(&cfg));
    let all: Vec<i64> = std::iter::from_fn(|| take(&mut st, &mut loan))
        .map(|r| r.expect("a message").offset)
        .collect();
    assert_eq!(all, (0..100).collect::<Vec<_>>());
    st.settle(&mut loan);
    assert_eq!(st.queued(), (0, 0));
}

#[test]
fn a_batch_that_decompresses_past_its_limit_parks_the_partition_when_reached() {
    let (mut st, ids) = state_with(&[("t", 0)]);
    let mut data = wire_batch(0, 10, none());
    data.extend_from_slice(&wire_batch(10, 100, crate::compression::Compression::Zstd));
    // a hard limit below the second batch's 100 records
    let d = crate::record::decode_batches_lazy(data.into(), 0, 1_000, None, true).expect("decodes");
    assert_eq!(d.batches.len(), 2);
    st.push_batches(ids[0], d.batches, 0, 1, 1_000);
    let mut loan = state::Loan::default();
    let (got, err) = until_error(&mut st, &mut loan);
    assert_eq!(got, (0..10).collect::<Vec<_>>());
    assert_eq!(err.kind(), crate::ErrorKind::Compression, "{err}");
    assert!(err.to_string().contains("1000-byte limit"), "{err}");
    st.settle(&mut loan);
    assert_eq!(st.queued(), (0, 0));
    assert_eq!(st.parts[&ids[0]].fetch, Position::Parked);
}

/// Partitions keep no buffer capacity once their run is lent: the capacity of a run
/// (`RUN` messages of 176 bytes) moves between the partitions and the loan instead of
/// staying with each of them. Before, every partition ever read kept an empty buffer of
/// `RUN` messages: 11 KiB a partition, 110 MB over 10,000 partitions.
#[test]
fn partitions_keep_no_buffer_capacity_after_their_runs_are_lent() {
    let parts: Vec<(&str, i32)> = (0..200).map(|p| ("t", p)).collect();
    let (mut st, ids) = state_with(&parts);
    for &id in &ids {
        fetch_lazily(
            &mut st,
            id,
            wire_batch(0, 100, crate::compression::Compression::None),
            0,
        );
    }
    let mut loan = state::Loan::default();
    let mut next = std::collections::HashMap::new();
    let mut n = 0;
    let mut most = 0;
    while let Some(m) = take(&mut st, &mut loan) {
        let m = m.expect("a message");
        let at = next.entry(m.partition).or_insert(0i64);
        assert_eq!(m.offset, *at, "partition {}", m.partition);
        *at += 1;
        n += 1;
        let held: usize = st.parts.values().map(|p| p.buf.capacity()).sum();
        most = most.max(held);
    }
    assert_eq!(n, 200 * 100);
    assert!(
        most <= 2 * state::RUN,
        "partitions held buffers for {most} messages at once"
    );
}
