//! The KIP-848 engine through coordinator faults, against the consumer group coordinator
//! of `crate::mock::MockCluster` (feature `mock`): member epochs, revocation deadlines,
//! session expiry and OffsetCommit epoch checks are the mock's, faults are injected per
//! API as for the classic protocol in `coordinator_tests.rs`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;

use super::{CommitMode, GroupEvent, GroupProtocol, GroupShared};
use crate::admin::Admin;
use crate::cluster::Cluster;
use crate::conn::ConnectionConfig;
use crate::mock::{Fault, MockCluster};
use crate::protocol::messages::OffsetCommitRequest;
use crate::protocol::{ApiKey, ErrorCode};
use crate::reader::{Reader, ReaderConfig, TopicPartition};
use crate::record::Record;

/// What a member task saw: its events, and the last offset it read per partition.
#[derive(Default)]
struct Seen {
    events: Vec<(Instant, GroupEvent)>,
    read: BTreeMap<i32, i64>,
    /// Messages read, over the member's life.
    messages: usize,
}

type Shared = Arc<Mutex<Seen>>;

/// `partitions` partitions of topic "t"; KIP-848 heartbeats every 100 ms, sessions of
/// `session`.
async fn mock(partitions: i32, session: Duration) -> MockCluster {
    MockCluster::builder()
        .topic("t", partitions)
        .consumer_group_timeouts(Duration::from_millis(100), session)
        .start()
        .await
        .unwrap()
}

fn config(mock: &MockCluster) -> ReaderConfig {
    ReaderConfig::new(mock.bootstrap())
        .group_id("g")
        .topic("t")
        .group_protocol(GroupProtocol::Consumer)
        .commit_mode(CommitMode::Interval(Duration::from_millis(100)))
        .max_wait(Duration::from_millis(50))
        .join_backoff(Duration::from_millis(200))
}

fn produce(mock: &MockCluster, partition: i32, n: usize) {
    let records: Vec<Record> = (0..n).map(|i| Record::new("k", format!("v{i}"))).collect();
    mock.produce("t", partition, &records).unwrap();
}

/// Reads (acking everything) and records what it saw until `stop`.
fn spawn_member(
    config: ReaderConfig,
    seen: Shared,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut reader = Reader::new(config).await.unwrap();
        let committer = reader.committer().unwrap();
        let mut ev = reader.events().unwrap();
        while !stop.load(Ordering::SeqCst) {
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(20)) => {}
                Some(e) = ev.next() => seen.lock().unwrap().events.push((Instant::now(), e)),
                m = reader.next_message() => if let Ok(m) = m {
                    {
                        let mut s = seen.lock().unwrap();
                        s.read.insert(m.partition, m.offset);
                        s.messages += 1;
                    }
                    committer.ack(&m);
                },
            }
        }
        reader.close().await;
    })
}

/// Partitions held according to the events; how many Assigned, Revoked and Lost events.
fn holding(seen: &Shared) -> (BTreeSet<TopicPartition>, usize, usize, usize) {
    let mut held = BTreeSet::new();
    let (mut assigned, mut revoked, mut lost) = (0, 0, 0);
    for (_, e) in &seen.lock().unwrap().events {
        match e {
            GroupEvent::Assigned { partitions, .. } => {
                assigned += 1;
                held.extend(partitions.iter().cloned());
            }
            GroupEvent::Revoked { partitions } => {
                revoked += 1;
                for tp in partitions {
                    held.remove(tp);
                }
            }
            GroupEvent::Lost { partitions } => {
                lost += 1;
                for tp in partitions {
                    held.remove(tp);
                }
            }
        }
    }
    (held, assigned, revoked, lost)
}

async fn wait_until(what: &str, within: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The mock coordinator itself: two members split the partitions, a partition moves
/// only after its old owner committed and stopped reporting it.
#[tokio::test]
async fn two_members_split_the_partitions_and_hand_over_after_the_commit() {
    let mock = mock(4, Duration::from_secs(10)).await;
    for p in 0..4 {
        produce(&mock, p, 5);
    }
    let (a, b): (Shared, Shared) = Default::default();
    let stop = Arc::new(AtomicBool::new(false));
    let ta = spawn_member(config(&mock), a.clone(), stop.clone());
    wait_until("a holding 4 and committed", Duration::from_secs(10), || {
        holding(&a).0.len() == 4 && (0..4).all(|p| mock.committed("g", "t", p) == Some(5))
    })
    .await;
    let tb = spawn_member(config(&mock), b.clone(), stop.clone());
    wait_until("2 and 2", Duration::from_secs(10), || {
        holding(&a).0.len() == 2 && holding(&b).0.len() == 2
    })
    .await;
    let (held_b, ..) = holding(&b);
    for tp in &held_b {
        assert_eq!(mock.committed("g", "t", tp.partition), Some(5));
    }
    assert!(holding(&a).0.is_disjoint(&held_b));
    assert_eq!(holding(&a).3, 0, "no Lost");
    // b read nothing twice: it started at a's commits
    assert_eq!(b.lock().unwrap().messages, 0);
    stop.store(true, Ordering::SeqCst);
    ta.await.unwrap();
    tb.await.unwrap();
    assert!(mock.members("g").is_empty(), "both left");
}

/// Issue 26 (1): an interval commit hung on the coordinator (its request never answered,
/// as on a black-holed connection) must not hold back the commit of a revocation: the
/// revocation is committed and acknowledged within the rebalance timeout (4 s here; the
/// hung attempt would last the 20 s request timeout) and the member is not fenced.
#[tokio::test]
async fn a_hung_interval_commit_does_not_delay_the_revocation() {
    let mock = mock(2, Duration::from_secs(10)).await;
    for p in 0..2 {
        produce(&mock, p, 5);
    }
    let a_config = config(&mock)
        .rebalance_timeout(Duration::from_secs(4))
        .request_timeout(Duration::from_secs(20));
    let (a, b): (Shared, Shared) = Default::default();
    let stop = Arc::new(AtomicBool::new(false));
    let ta = spawn_member(a_config, a.clone(), stop.clone());
    wait_until("a holding both, committed", Duration::from_secs(10), || {
        holding(&a).0.len() == 2 && (0..2).all(|p| mock.committed("g", "t", p) == Some(5))
    })
    .await;
    let a_id = mock.members("g").pop().unwrap();
    // the next commit hangs; a reads 3 more per partition meanwhile
    let commits = mock.requests(ApiKey::OFFSET_COMMIT);
    mock.fault(ApiKey::OFFSET_COMMIT, Fault::Hang, 1);
    for p in 0..2 {
        produce(&mock, p, 3);
    }
    wait_until("a read everything", Duration::from_secs(10), || {
        let s = a.lock().unwrap();
        (0..2).all(|p| s.read.get(&p) == Some(&7))
    })
    .await;
    wait_until("the hung commit", Duration::from_secs(10), || {
        mock.requests(ApiKey::OFFSET_COMMIT) > commits
    })
    .await;
    let tb = spawn_member(config(&mock), b.clone(), stop.clone());
    wait_until("b holding one partition", Duration::from_secs(20), || {
        holding(&b).0.len() == 1 || holding(&a).3 > 0
    })
    .await;
    let (held_a, _, revoked, lost) = holding(&a);
    assert_eq!(
        lost, 0,
        "a was fenced: its revocation waited behind the hung commit"
    );
    assert_eq!(revoked, 1);
    assert_eq!(held_a.len(), 1);
    let moved = holding(&b).0.into_iter().next().unwrap();
    assert_eq!(
        mock.committed("g", "t", moved.partition),
        Some(8),
        "the revoked partition was committed before it moved"
    );
    assert!(
        mock.member_epoch("g", &a_id).is_some(),
        "a is still a member"
    );
    stop.store(true, Ordering::SeqCst);
    ta.await.unwrap();
    tb.await.unwrap();
}

/// Issue 26 (2): the result of a commit built for an ownership of a partition never
/// moves a later ownership's track: the partition was given up and taken again (here
/// with committed offset 3) while the commit of the earlier ownership's offset 10 was on
/// its way.
#[tokio::test]
async fn an_old_commit_result_is_not_applied_to_a_new_ownership() {
    let mock = mock(1, Duration::from_secs(10)).await;
    let config = ReaderConfig::new(mock.bootstrap()).group_id("g").topic("t");
    let cluster = Cluster::new(mock.bootstrap(), ConnectionConfig::default()).unwrap();
    let admin = Admin::connect(mock.bootstrap()).unwrap();
    let g = Arc::new(GroupShared::new(
        &config,
        "g".into(),
        admin,
        cluster.clone(),
    ));
    let tp = TopicPartition::new("t", 0);
    let old = g.new_track(-1);
    g.commits().own(&tp, old.clone());
    old.ack_offset(9);
    mock.fault(
        ApiKey::OFFSET_COMMIT,
        Fault::Delay(Duration::from_millis(300)),
        1,
    );
    let commit = tokio::spawn({
        let g = g.clone();
        async move { g.commit_pending(None).await }
    });
    wait_until("the commit sent", Duration::from_secs(5), || {
        mock.requests(ApiKey::OFFSET_COMMIT) == 1
    })
    .await;
    // the partition changes hands and comes back: a new ownership, committed at 3
    let new = g.new_track(3);
    g.commits().own(&tp, new.clone());
    commit.await.unwrap().unwrap();
    assert_eq!(mock.committed("g", "t", 0), Some(10), "the broker took it");
    assert_eq!(
        new.committed_offset(),
        3,
        "the earlier ownership's commit moved the new ownership's track"
    );
    g.coord.close().await;
    cluster.close().await;
}

/// Issue 26 (3): heartbeats failing for longer than 8 heartbeat intervals but shorter
/// than the broker's session timeout: the member keeps its partitions (no Lost, no new
/// OffsetFetch) and carries on when the coordinator answers again.
#[tokio::test]
async fn heartbeats_failing_within_the_session_keep_the_partitions() {
    let mock = mock(2, Duration::from_secs(10)).await;
    for p in 0..2 {
        produce(&mock, p, 5);
    }
    let a: Shared = Default::default();
    let stop = Arc::new(AtomicBool::new(false));
    let ta = spawn_member(config(&mock), a.clone(), stop.clone());
    wait_until("a holding both, committed", Duration::from_secs(10), || {
        holding(&a).0.len() == 2 && (0..2).all(|p| mock.committed("g", "t", p) == Some(5))
    })
    .await;
    let a_id = mock.members("g").pop().unwrap();
    let fetches = mock.requests(ApiKey::OFFSET_FETCH);
    // 3 s of failing heartbeats: 30 heartbeat intervals, under the 10 s session
    mock.fault(
        ApiKey::CONSUMER_GROUP_HEARTBEAT,
        Fault::Error(ErrorCode::CoordinatorLoadInProgress),
        u32::MAX,
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    mock.clear_faults();
    let beats = mock.requests(ApiKey::CONSUMER_GROUP_HEARTBEAT);
    wait_until("heartbeats answered again", Duration::from_secs(5), || {
        mock.requests(ApiKey::CONSUMER_GROUP_HEARTBEAT) > beats + 2
    })
    .await;
    for p in 0..2 {
        produce(&mock, p, 2);
    }
    wait_until("a carries on", Duration::from_secs(10), || {
        (0..2).all(|p| mock.committed("g", "t", p) == Some(7))
    })
    .await;
    let (held, assigned, _, lost) = holding(&a);
    assert_eq!(lost, 0, "the partitions were dropped as lost");
    assert_eq!((held.len(), assigned), (2, 1), "taken again");
    assert_eq!(
        mock.requests(ApiKey::OFFSET_FETCH),
        fetches,
        "re-fetched from the committed offsets"
    );
    assert_eq!(a.lock().unwrap().messages, 14, "read nothing twice");
    assert!(mock.member_epoch("g", &a_id).is_some());
    stop.store(true, Ordering::SeqCst);
    ta.await.unwrap();
}

/// Issue 26 (4): the coordinator fences the member (`FENCED_MEMBER_EPOCH`): it loses its
/// partitions without committing — an interval commit hung at that moment included: it
/// is abandoned, and no commit of the fenced epoch goes out after the Lost — rejoins and
/// reads again from the last commit.
#[tokio::test]
async fn fenced_member_loses_its_partitions_without_committing() {
    let mock = mock(1, Duration::from_secs(10)).await;
    produce(&mock, 0, 5);
    let a: Shared = Default::default();
    let stop = Arc::new(AtomicBool::new(false));
    let a_config = config(&mock).request_timeout(Duration::from_secs(3));
    let ta = spawn_member(a_config, a.clone(), stop.clone());
    wait_until("a holding t-0, committed", Duration::from_secs(10), || {
        holding(&a).0.len() == 1 && mock.committed("g", "t", 0) == Some(5)
    })
    .await;
    let a_id = mock.members("g").pop().unwrap();
    let old_epoch = mock.member_epoch("g", &a_id).unwrap();
    // a commit hangs (a read 3 more), then the coordinator fences the member
    let commits = mock.requests(ApiKey::OFFSET_COMMIT);
    mock.fault(ApiKey::OFFSET_COMMIT, Fault::Hang, 1);
    produce(&mock, 0, 3);
    wait_until("the hung commit", Duration::from_secs(10), || {
        mock.requests(ApiKey::OFFSET_COMMIT) > commits && a.lock().unwrap().messages == 8
    })
    .await;
    mock.capture(ApiKey::OFFSET_COMMIT);
    mock.fault(
        ApiKey::CONSUMER_GROUP_HEARTBEAT,
        Fault::Error(ErrorCode::FencedMemberEpoch),
        1,
    );
    wait_until(
        "a lost t-0 and took it again",
        Duration::from_secs(10),
        || {
            let (held, assigned, _, lost) = holding(&a);
            lost == 1 && assigned == 2 && held.len() == 1
        },
    )
    .await;
    // read again from the last commit (5): the 3 acked since were not committed
    wait_until("a read t-0 again", Duration::from_secs(10), || {
        a.lock().unwrap().messages == 8 + 3
    })
    .await;
    // the hung commit's attempt would have timed out by now (3 s)
    wait_until("committed again", Duration::from_secs(10), || {
        mock.committed("g", "t", 0) == Some(8)
    })
    .await;
    assert_eq!(
        holding(&a).2,
        0,
        "no Revoked: lost partitions are not committed"
    );
    let stale: Vec<i32> = mock
        .captured::<OffsetCommitRequest>()
        .into_iter()
        .map(|r| r.generation_id_or_member_epoch)
        .filter(|e| *e <= old_epoch)
        .collect();
    assert!(
        stale.is_empty(),
        "commits of the fenced epoch {old_epoch} sent after the fence: {stale:?}"
    );
    stop.store(true, Ordering::SeqCst);
    ta.await.unwrap();
}

/// The consumer group protocol on a broker that refuses it: the error names KIP-848 and
/// what ApiVersions said, and the stream ends after it — no join is tried again.
async fn refused(mock: MockCluster, why: &str) {
    mock.capture(ApiKey::CONSUMER_GROUP_HEARTBEAT);
    let mut reader = Reader::new(config(&mock)).await.unwrap();
    let e = tokio::time::timeout(Duration::from_secs(10), reader.next())
        .await
        .expect("an error in time, not a hang")
        .expect("the stream yields the error")
        .expect_err("the protocol is refused");
    let text = e.to_string();
    assert_eq!(e.kind(), crate::ErrorKind::UnsupportedVersion, "{text}");
    for want in [
        "does not support KIP-848 consumer groups",
        why,
        "metadata.version 21 (Kafka 3.9-IV0)",
        "GroupProtocol::Classic",
    ] {
        assert!(text.contains(want), "{want:?} missing from: {text}");
    }
    let rest = tokio::time::timeout(Duration::from_secs(5), reader.next())
        .await
        .expect("the stream ends after the refusal");
    assert!(
        rest.is_none(),
        "{:?}",
        rest.map(|r| r.map(|m| m.offset).map_err(|e| e.to_string()))
    );
    let joins = mock
        .captured::<crate::protocol::messages::ConsumerGroupHeartbeatRequest>()
        .len();
    assert!(joins <= 1, "{joins} joins sent");
    reader.close().await;
}

/// Kafka 3.9 lists ConsumerGroupHeartbeat v0 but, without `consumer` in its
/// group.coordinator.rebalance.protocols (the default), answers a join with
/// UNSUPPORTED_VERSION.
#[tokio::test]
async fn unsupported_version_to_a_join_is_refused_once_and_ends_the_stream() {
    let mock = MockCluster::builder()
        .topic("t", 1)
        .finalized_feature("metadata.version", 21)
        .start()
        .await
        .unwrap();
    mock.fault(
        ApiKey::CONSUMER_GROUP_HEARTBEAT,
        crate::mock::Fault::Error(ErrorCode::UnsupportedVersion),
        u32::MAX,
    );
    refused(mock, "answered the join with UNSUPPORTED_VERSION").await;
}

/// A broker that does not list ConsumerGroupHeartbeat at all (Kafka before 3.7).
#[tokio::test]
async fn a_broker_without_consumer_group_heartbeat_is_refused_and_ends_the_stream() {
    let mock = MockCluster::builder()
        .topic("t", 1)
        .finalized_feature("metadata.version", 21)
        .without_api(ApiKey::CONSUMER_GROUP_HEARTBEAT)
        .start()
        .await
        .unwrap();
    refused(mock, "no ConsumerGroupHeartbeat").await;
}

/// Feature `metrics`: a KIP-848 rebalance is timed from the heartbeat answer that
/// brings a new target assignment to the end of its reconciliation — the join's, and a
/// revocation's when a second member comes, which includes the revoke hook's run.
#[cfg(feature = "metrics")]
#[tokio::test]
async fn reconciliations_are_timed_as_rebalances() {
    let mock = mock(2, Duration::from_secs(10)).await;
    let hook = Duration::from_millis(300);
    let revoked = Arc::new(AtomicBool::new(false));
    let seen = revoked.clone();
    let mut a = Reader::new(
        config(&mock)
            // the collector's first look takes nothing: no later one runs in this test
            .metrics_interval(Duration::from_secs(3600))
            .on_revoke(move |_: Vec<TopicPartition>| {
                let seen = seen.clone();
                async move {
                    tokio::time::sleep(hook).await;
                    seen.store(true, Ordering::SeqCst);
                }
            }),
    )
    .await
    .unwrap();
    let g = a.handle().group.clone().unwrap();
    wait_until("a owns both partitions", Duration::from_secs(10), || {
        a.stats().partitions == 2 && g.timings.rebalance.totals().0 >= 1
    })
    .await;
    let (joins, joined_us) = g.timings.rebalance.totals();
    assert!(joined_us > 0, "the join's reconciliation took no time");
    let (b, stop) = (Shared::default(), Arc::new(AtomicBool::new(false)));
    let tb = spawn_member(config(&mock), b.clone(), stop.clone());
    wait_until("a gave a partition up", Duration::from_secs(10), || {
        g.timings.rebalance.totals().0 > joins
    })
    .await;
    assert!(revoked.load(Ordering::SeqCst), "the hook ran");
    let (n, us) = g.timings.rebalance.totals();
    assert_eq!(n, joins + 1, "one reconciliation: the revocation");
    assert!(
        Duration::from_micros(us - joined_us) >= hook,
        "the revocation took {:?}, its hook {hook:?}",
        Duration::from_micros(us - joined_us)
    );
    stop.store(true, Ordering::SeqCst);
    tb.await.unwrap();
    a.close().await;
}
