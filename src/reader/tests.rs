use std::time::Duration;

use bytes::Bytes;

use super::state::{Position, State};
use super::*;

fn msg(topic: &str, partition: i32, offset: i64, len: usize) -> Message {
    Message {
        topic: topic.into(),
        partition,
        offset,
        high_watermark: offset + 1,
        key: None,
        value: Some(Bytes::from(vec![0u8; len])),
        headers: Vec::new(),
        timestamp: 0,
    }
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
