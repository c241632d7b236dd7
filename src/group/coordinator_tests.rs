//! The coordinator connection and a group member through coordinator faults, against
//! `crate::mock::MockCluster` (feature `mock`): three brokers, the coordinator pinned
//! where each test needs it, faults per broker and API.

use std::time::{Duration, Instant};

use futures::StreamExt;

use super::GroupEvent;
use crate::admin::Admin;
use crate::cluster::Cluster;
use crate::conn::ConnectionConfig;
use crate::coordinator::{Coordinator, Lane};
use crate::mock::{Fault, MockCluster};
use crate::protocol::messages::*;
use crate::protocol::{ApiKey, ErrorCode};
use crate::reader::{Reader, ReaderConfig};

/// Three brokers hosting topic "t" (one partition, led by broker 1).
async fn mock() -> MockCluster {
    MockCluster::builder()
        .brokers(3)
        .topic("t", 1)
        .start()
        .await
        .unwrap()
}

/// The brokers each captured request of type `R` went to, in order.
fn brokers_asked<R: crate::protocol::Request>(mock: &MockCluster) -> Vec<i32> {
    mock.captured_by_broker::<R>()
        .into_iter()
        .map(|(b, _)| b)
        .collect()
}

#[tokio::test]
async fn lookup_skips_a_hanging_broker_and_dials_a_dedicated_connection() {
    let mock = mock().await;
    mock.set_coordinator("g", Some(3));
    mock.fault_on(1, ApiKey::FIND_COORDINATOR, Fault::Hang, u32::MAX);
    mock.capture(ApiKey::FIND_COORDINATOR);
    let asked = || brokers_asked::<FindCoordinatorRequest>(&mock);
    let cluster = Cluster::new([mock.bootstrap()[0].clone()], ConnectionConfig::default()).unwrap();
    // broker 1 has an open connection, so it is asked first — and hangs
    cluster.connection(1).await.unwrap();
    let coord = Coordinator::new("g".into(), cluster.clone(), Duration::from_millis(300));
    let t0 = Instant::now();
    let conn = coord.connection(Lane::Membership).await.unwrap();
    assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
    assert_eq!(Some(conn.broker().to_string()), mock.broker_addr(3));
    assert_eq!(asked(), [1, 2]);
    // its own connection, not the cluster's shared one to broker 3
    let shared = cluster.connection(3).await.unwrap();
    assert!(!conn.same(&shared));
    // cached while open
    assert!(coord
        .connection(Lane::Membership)
        .await
        .unwrap()
        .same(&conn));
    // commits get a connection of their own to the known coordinator, no new lookup
    let offsets = coord.connection(Lane::Offsets).await.unwrap();
    assert!(!offsets.same(&conn) && !offsets.same(&shared));
    assert_eq!(offsets.broker(), conn.broker());
    assert_eq!(asked().len(), 2);
    // a timed-out request drops only its own connection
    coord.mark_unknown(
        &offsets,
        &crate::Error::new(crate::ErrorKind::Timeout, "slow"),
    );
    assert!(coord
        .connection(Lane::Membership)
        .await
        .unwrap()
        .same(&conn));
    assert!(!coord
        .connection(Lane::Offsets)
        .await
        .unwrap()
        .same(&offsets));
    assert_eq!(asked().len(), 2);
    // a lost coordinator drops both and is found again
    coord.mark_unknown(&conn, &crate::Error::kafka(ErrorCode::NotCoordinator));
    let again = coord.connection(Lane::Membership).await.unwrap();
    assert!(!again.same(&conn));
    assert_eq!(asked().len(), 3);
    coord.close().await;
    cluster.close().await;
}

#[tokio::test]
async fn calls_find_the_coordinator_again_after_not_coordinator_and_a_lost_connection() {
    let mock = mock().await;
    mock.set_coordinator("g", Some(1));
    mock.capture(ApiKey::OFFSET_COMMIT);
    // The first commit reaches broker 1 and is held there until the coordinator has
    // moved to 2, so broker 1 answers NOT_COORDINATOR; the new coordinator hangs up
    // once, then is still loading once.
    mock.fault_on(
        1,
        ApiKey::OFFSET_COMMIT,
        Fault::Delay(Duration::from_millis(300)),
        1,
    );
    mock.fault_on(2, ApiKey::OFFSET_COMMIT, Fault::CloseOnRequest, 1);
    mock.fault_on(
        2,
        ApiKey::OFFSET_COMMIT,
        Fault::Error(ErrorCode::CoordinatorLoadInProgress),
        1,
    );
    let mover = async {
        while mock.requests_to(1, ApiKey::OFFSET_COMMIT) == 0 {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        mock.set_coordinator("g", Some(2));
    };
    let cluster = Cluster::new([mock.bootstrap()[0].clone()], ConnectionConfig::default()).unwrap();
    let coord = Coordinator::new("g".into(), cluster.clone(), Duration::from_millis(500));
    let offsets = [(crate::admin::TopicPartition::new("t", 0), 42)];
    // an admin commit (no membership), so the mock stores it whoever asks
    let req = &Admin::offset_commit_request("g", -1, "", None, &offsets);
    let offsets = &offsets;
    let call = coord.call(
        "OffsetCommit",
        Instant::now() + Duration::from_secs(5),
        Duration::from_secs(1),
        |c| async move { Admin::offset_commit_on(&c, req, offsets).await },
    );
    let (r, ()) = tokio::join!(call, mover);
    let r = r.unwrap();
    assert!(r[0].1.is_ok(), "{r:?}");
    assert_eq!(brokers_asked::<OffsetCommitRequest>(&mock), [1, 2, 2, 2]);
    assert_eq!(mock.committed("g", "t", 0), Some(42));
    // found at first, after NOT_COORDINATOR, after the hang-up (not after
    // COORDINATOR_LOAD_IN_PROGRESS: same coordinator, just loading)
    assert_eq!(mock.requests(ApiKey::FIND_COORDINATOR), 3);
    coord.close().await;
    cluster.close().await;
}

#[tokio::test]
async fn member_keeps_its_generation_through_coordinator_faults_and_yields_no_error() {
    let mock = mock().await;
    mock.set_coordinator("g", Some(1));
    mock.capture(ApiKey::HEARTBEAT);
    // JoinGroup: loading, not coordinator, hang-up, then it goes through.
    mock.fault(
        ApiKey::JOIN_GROUP,
        Fault::Error(ErrorCode::CoordinatorLoadInProgress),
        1,
    );
    mock.fault(
        ApiKey::JOIN_GROUP,
        Fault::Error(ErrorCode::NotCoordinator),
        1,
    );
    mock.fault(ApiKey::JOIN_GROUP, Fault::CloseOnRequest, 1);
    let mut reader = Reader::new(
        ReaderConfig::new(mock.bootstrap())
            .group_id("g")
            .topic("t")
            .heartbeat_interval(Duration::from_millis(100))
            .session_timeout(Duration::from_secs(3))
            .rebalance_timeout(Duration::from_secs(3)),
    )
    .await
    .unwrap();
    let mut events = reader.events().unwrap();
    let first = tokio::time::timeout(Duration::from_secs(10), events.next())
        .await
        .expect("assigned in time")
        .unwrap();
    let GroupEvent::Assigned { generation, .. } = first else {
        panic!("{first:?}");
    };
    let joins = mock.requests(ApiKey::JOIN_GROUP);
    assert!(joins >= 4, "{joins} joins: the three faults, then the join");
    let heartbeats = |broker: i32| {
        mock.captured_by_broker::<HeartbeatRequest>()
            .into_iter()
            .filter(|(b, _)| *b == broker)
            .count()
    };
    // heartbeats flow to broker 1; then it dies and the coordinator moves to 2
    let until = |broker: i32| async move {
        let t0 = Instant::now();
        while heartbeats(broker) < 3 {
            assert!(t0.elapsed() < Duration::from_secs(10), "timed out");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    until(1).await;
    // The coordinator moves to 2 as broker 1 dies; the new one is not found at once
    // and is still loading at first.
    mock.fault(
        ApiKey::FIND_COORDINATOR,
        Fault::Error(ErrorCode::CoordinatorNotAvailable),
        1,
    );
    mock.fault_on(
        2,
        ApiKey::HEARTBEAT,
        Fault::Error(ErrorCode::CoordinatorLoadInProgress),
        1,
    );
    mock.set_coordinator("g", Some(2));
    mock.kill(1);
    let moved = Instant::now();
    until(2).await;
    let recovered = moved.elapsed();
    assert!(recovered < Duration::from_secs(3), "{recovered:?}");
    // nothing yielded from the stream: no errors, no messages
    assert!(
        tokio::time::timeout(Duration::from_millis(300), reader.next())
            .await
            .is_err(),
        "the reader yielded something"
    );
    // joined once — and never again
    assert_eq!(mock.requests(ApiKey::JOIN_GROUP), joins);
    assert_eq!(mock.requests(ApiKey::SYNC_GROUP), 1);
    let members = mock.members("g");
    assert_eq!(members.len(), 1);
    assert!(mock
        .captured::<HeartbeatRequest>()
        .iter()
        .all(|h| h.generation_id == generation && h.member_id == members[0]));
    reader.close().await;
    let rest: Vec<GroupEvent> = events.collect().await;
    assert!(
        rest.iter().all(|e| matches!(e, GroupEvent::Revoked { .. })),
        "{rest:?}"
    );
}

/// A commit answered STALE_MEMBER_EPOCH (KIP-848: the member epoch moved on while the
/// commit was on its way) is sent again with the current membership, and succeeds;
/// the committer never sees the error. (The shared commit path: the mock serves the
/// classic protocol, so the member here is a classic one.)
#[tokio::test]
async fn a_stale_member_epoch_commit_is_sent_again() {
    use futures::SinkExt;
    let mock = mock().await;
    mock.produce("t", 0, &[crate::record::Record::new("k", "v")])
        .unwrap();
    let mut reader = Reader::new(
        ReaderConfig::new(mock.bootstrap())
            .group_id("g")
            .topic("t")
            .commit_mode(crate::group::CommitMode::Sync)
            .heartbeat_interval(Duration::from_millis(100))
            .session_timeout(Duration::from_secs(3))
            .rebalance_timeout(Duration::from_secs(3)),
    )
    .await
    .unwrap();
    let mut committer = reader.committer().unwrap();
    let m = tokio::time::timeout(Duration::from_secs(10), reader.next_message())
        .await
        .expect("a message in time")
        .unwrap();
    mock.fault(
        ApiKey::OFFSET_COMMIT,
        Fault::Error(ErrorCode::StaleMemberEpoch),
        1,
    );
    let before = mock.requests(ApiKey::OFFSET_COMMIT);
    committer.send(&m).await.unwrap();
    assert_eq!(mock.committed("g", "t", 0), Some(1));
    assert_eq!(mock.requests(ApiKey::OFFSET_COMMIT), before + 2);
    reader.close().await;
}

/// Read `n` messages and ack each.
async fn read_and_ack(reader: &mut Reader, committer: &crate::group::Committer, n: usize) {
    for _ in 0..n {
        let m = tokio::time::timeout(Duration::from_secs(10), reader.next_message())
            .await
            .expect("a message in time")
            .unwrap();
        committer.ack(&m);
    }
}

/// Issue 26 item 3: a commit whose caller gave up (a `timeout` around
/// `Committer::commit`) is still on its way to a slow coordinator when the coordinator
/// is forgotten (a heartbeat answered NOT_COORDINATOR) and a newer commit follows. The
/// broker must never apply the older commit after the newer one: the committed offset,
/// sampled all along, only grows and ends at the newer commit.
#[tokio::test]
async fn a_cancelled_commit_is_never_applied_after_a_newer_one() {
    let mock = std::sync::Arc::new(mock().await);
    mock.set_coordinator("g", Some(1));
    let records: Vec<_> = (0..30)
        .map(|i| crate::record::Record::new("k", format!("v{i}")))
        .collect();
    mock.produce("t", 0, &records).unwrap();
    let mut reader = Reader::new(
        ReaderConfig::new(mock.bootstrap())
            .group_id("g")
            .topic("t")
            .commit_mode(crate::group::CommitMode::Interval(Duration::from_secs(
                3600,
            )))
            .heartbeat_interval(Duration::from_millis(100))
            .session_timeout(Duration::from_secs(6))
            .rebalance_timeout(Duration::from_secs(6)),
    )
    .await
    .unwrap();
    let committer = reader.committer().unwrap();
    read_and_ack(&mut reader, &committer, 10).await;
    // Sample the committed offset from now on.
    let samples = std::sync::Arc::new(std::sync::Mutex::new(Vec::<i64>::new()));
    let sampler = {
        let (mock, samples) = (mock.clone(), samples.clone());
        tokio::spawn(async move {
            loop {
                if let Some(o) = mock.committed("g", "t", 0) {
                    let mut s = samples.lock().unwrap();
                    if s.last() != Some(&o) {
                        s.push(o);
                    }
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        })
    };
    // The coordinator holds the next OffsetCommit for a while; the caller gives up on it
    // as soon as it reached the broker.
    const DELAY: Duration = Duration::from_millis(800);
    mock.fault(ApiKey::OFFSET_COMMIT, Fault::Delay(DELAY), 1);
    let commits = mock.requests(ApiKey::OFFSET_COMMIT);
    let sent_at = Instant::now();
    let reached = async {
        while mock.requests(ApiKey::OFFSET_COMMIT) == commits {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    };
    let first = tokio::time::timeout(Duration::from_secs(10), async {
        tokio::select! {
            r = committer.commit() => Some(r),
            () = reached => None,
        }
    })
    .await
    .expect("the commit reached the coordinator");
    assert!(
        first.is_none(),
        "the delayed commit finished early: {first:?}"
    );
    // The coordinator is lost (its connections dropped) and found again.
    let lookups = mock.requests(ApiKey::FIND_COORDINATOR);
    mock.fault(
        ApiKey::HEARTBEAT,
        Fault::Error(ErrorCode::NotCoordinator),
        1,
    );
    let t0 = Instant::now();
    while mock.requests(ApiKey::FIND_COORDINATOR) == lookups {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "coordinator not looked up again"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // A newer commit.
    read_and_ack(&mut reader, &committer, 10).await;
    tokio::time::timeout(Duration::from_secs(10), committer.commit())
        .await
        .expect("the second commit in time")
        .unwrap();
    // Give the held commit time to be applied (or not), then look at what happened.
    let settle = sent_at + DELAY + Duration::from_millis(700);
    while Instant::now() < settle {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    sampler.abort();
    let seen = samples.lock().unwrap().clone();
    let final_offset = mock.committed("g", "t", 0);
    reader.close().await;
    assert!(
        seen.windows(2).all(|w| w[0] <= w[1]),
        "the committed offset went backwards: {seen:?}"
    );
    assert_eq!(final_offset, Some(20), "committed offsets seen: {seen:?}");
}
