//! The coordinator connection and a group member through coordinator faults, against a
//! scripted multi-broker fake on loopback (the broker side decodes our requests and
//! encodes its answers with the same protocol types).

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::{BufMut, Bytes, BytesMut};
use futures::StreamExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use super::coordinator::{Coordinator, Lane};
use super::GroupEvent;
use crate::admin::Admin;
use crate::cluster::Cluster;
use crate::conn::ConnectionConfig;
use crate::protocol::messages::*;
use crate::protocol::{
    ApiKey, Encode, ErrorCode, Request, RequestHeader, ResponseHeader, TaggedFields,
};
use crate::reader::{Reader, ReaderConfig};

type Reply = (i16, BytesMut);

/// What a fake broker does with one request.
enum Act {
    Reply(Reply),
    /// Close the connection.
    Close,
    /// Never answer.
    Hang,
}

fn reply<R: Request>(version: i16, resp: &R::Response) -> Act {
    let mut b = BytesMut::new();
    resp.encode(&mut b, version).unwrap();
    Act::Reply((R::response_header_version(version), b))
}

fn parse<R: Request>(mut frame: Bytes, version: i16) -> R {
    RequestHeader::decode(&mut frame, R::request_header_version(version)).unwrap();
    R::decode(&mut frame, version).unwrap()
}

fn range<R: Request>() -> ApiVersionRange {
    ApiVersionRange {
        api_key: R::API_KEY,
        min_version: R::MIN_VERSION,
        max_version: R::MAX_VERSION,
        tagged_fields: TaggedFields::new(),
    }
}

type Handler = dyn Fn(i32, ApiKey, i16, Bytes) -> Act + Send + Sync;

/// `n` fake brokers (ids 1..=n) on loopback hosting topic "t" (one partition led by 1).
/// ApiVersions and Metadata are answered here, the rest by the handler; a broker in
/// `dead` closes every connection at its next request (and at once when accepted).
struct Fake {
    ports: Vec<u16>,
    dead: Arc<Mutex<HashSet<i32>>>,
}

impl Fake {
    async fn start(n: i32, handler: Arc<Handler>) -> Fake {
        let mut listeners = Vec::new();
        for _ in 0..n {
            listeners.push(TcpListener::bind("127.0.0.1:0").await.unwrap());
        }
        let ports: Vec<u16> = listeners
            .iter()
            .map(|l| l.local_addr().unwrap().port())
            .collect();
        let dead: Arc<Mutex<HashSet<i32>>> = Arc::default();
        for (i, listener) in listeners.into_iter().enumerate() {
            let id = i as i32 + 1;
            let (handler, dead, ports) = (handler.clone(), dead.clone(), ports.clone());
            tokio::spawn(async move {
                while let Ok((sock, _)) = listener.accept().await {
                    if dead.lock().unwrap().contains(&id) {
                        continue;
                    }
                    tokio::spawn(serve(
                        id,
                        sock,
                        handler.clone(),
                        dead.clone(),
                        ports.clone(),
                    ));
                }
            });
        }
        Fake { ports, dead }
    }

    fn bootstrap(&self) -> String {
        format!("127.0.0.1:{}", self.ports[0])
    }

    fn kill(&self, id: i32) {
        self.dead.lock().unwrap().insert(id);
    }
}

async fn serve(
    id: i32,
    mut sock: tokio::net::TcpStream,
    handler: Arc<Handler>,
    dead: Arc<Mutex<HashSet<i32>>>,
    ports: Vec<u16>,
) {
    loop {
        let Ok(size) = sock.read_i32().await else {
            return;
        };
        let mut frame = vec![0u8; size as usize];
        if sock.read_exact(&mut frame).await.is_err() {
            return;
        }
        if dead.lock().unwrap().contains(&id) {
            return;
        }
        let frame = Bytes::from(frame);
        let (key, version, corr) = RequestHeader::peek(&frame).unwrap();
        let act = match key {
            ApiKey::API_VERSIONS => reply::<ApiVersionsRequest>(
                version,
                &ApiVersionsResponse {
                    api_keys: vec![
                        range::<ApiVersionsRequest>(),
                        range::<MetadataRequest>(),
                        range::<FindCoordinatorRequest>(),
                        range::<JoinGroupRequest>(),
                        range::<SyncGroupRequest>(),
                        range::<HeartbeatRequest>(),
                        range::<LeaveGroupRequest>(),
                        range::<OffsetCommitRequest>(),
                        range::<OffsetFetchRequest>(),
                    ],
                    ..Default::default()
                },
            ),
            ApiKey::METADATA => reply::<MetadataRequest>(
                version,
                &MetadataResponse {
                    brokers: ports
                        .iter()
                        .enumerate()
                        .map(|(i, p)| MetadataBroker {
                            node_id: i as i32 + 1,
                            host: "127.0.0.1".into(),
                            port: i32::from(*p),
                            rack: None,
                            tagged_fields: TaggedFields::new(),
                        })
                        .collect(),
                    cluster_id: Some("fake".into()),
                    controller_id: 1,
                    topics: vec![MetadataTopic {
                        name: Some("t".into()),
                        partitions: vec![MetadataPartition {
                            partition_index: 0,
                            leader_id: 1,
                            replica_nodes: vec![1],
                            isr_nodes: vec![1],
                            ..Default::default()
                        }],
                        ..Default::default()
                    }],
                    ..Default::default()
                },
            ),
            _ => handler(id, key, version, frame),
        };
        let (header_version, body) = match act {
            Act::Reply(r) => r,
            Act::Close => return,
            Act::Hang => {
                // keep the socket open, never answer
                std::future::pending::<()>().await;
                return;
            }
        };
        let mut out = BytesMut::new();
        ResponseHeader {
            correlation_id: corr,
            tagged_fields: TaggedFields::new(),
        }
        .encode(&mut out, header_version)
        .unwrap();
        out.extend_from_slice(&body);
        let mut framed = BytesMut::new();
        framed.put_i32(out.len() as i32);
        framed.extend_from_slice(&out);
        if sock.write_all(&framed).await.is_err() {
            return;
        }
    }
}

/// FindCoordinator's answer: `node` (its port from `ports`) or an error code.
fn coordinator_answer(
    version: i16,
    frame: Bytes,
    node: std::result::Result<i32, ErrorCode>,
    ports: &[u16],
) -> Act {
    let req = parse::<FindCoordinatorRequest>(frame, version);
    let (code, node_id, port) = match node {
        Ok(n) => (0, n, i32::from(ports[n as usize - 1])),
        Err(c) => (c.code(), -1, -1),
    };
    reply::<FindCoordinatorRequest>(
        version,
        &FindCoordinatorResponse {
            error_code: code,
            node_id,
            host: "127.0.0.1".into(),
            port,
            coordinators: if version >= 4 {
                req.coordinator_keys
                    .iter()
                    .map(|k| crate::protocol::messages::Coordinator {
                        key: k.clone(),
                        node_id,
                        host: "127.0.0.1".into(),
                        port,
                        error_code: code,
                        ..Default::default()
                    })
                    .collect()
            } else {
                Vec::new()
            },
            ..Default::default()
        },
    )
}

fn ports_cell() -> Arc<Mutex<Vec<u16>>> {
    Arc::default()
}

#[tokio::test]
async fn lookup_skips_a_hanging_broker_and_dials_a_dedicated_connection() {
    let ports = ports_cell();
    let p = ports.clone();
    let asked: Arc<Mutex<Vec<i32>>> = Arc::default();
    let a = asked.clone();
    let fake = Fake::start(
        3,
        Arc::new(move |id, key, version, frame| match key {
            ApiKey::FIND_COORDINATOR => {
                a.lock().unwrap().push(id);
                if id == 1 {
                    Act::Hang
                } else {
                    coordinator_answer(version, frame, Ok(3), &p.lock().unwrap())
                }
            }
            _ => Act::Close,
        }),
    )
    .await;
    *ports.lock().unwrap() = fake.ports.clone();
    let cluster = Cluster::new([fake.bootstrap()], ConnectionConfig::default()).unwrap();
    // broker 1 has an open connection, so it is asked first — and hangs
    cluster.connection(1).await.unwrap();
    let coord = Coordinator::new("g".into(), cluster.clone(), Duration::from_millis(300));
    let t0 = Instant::now();
    let conn = coord.connection(Lane::Membership).await.unwrap();
    assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
    assert_eq!(conn.broker(), format!("127.0.0.1:{}", fake.ports[2]));
    assert_eq!(asked.lock().unwrap()[..], [1, 2]);
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
    assert_eq!(asked.lock().unwrap().len(), 2);
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
    assert_eq!(asked.lock().unwrap().len(), 2);
    // a lost coordinator drops both and is found again
    coord.mark_unknown(&conn, &crate::Error::kafka(ErrorCode::NotCoordinator));
    let again = coord.connection(Lane::Membership).await.unwrap();
    assert!(!again.same(&conn));
    assert_eq!(asked.lock().unwrap().len(), 3);
    coord.close().await;
    cluster.close().await;
}

#[tokio::test]
async fn calls_find_the_coordinator_again_after_not_coordinator_and_a_lost_connection() {
    let ports = ports_cell();
    let p = ports.clone();
    // where FindCoordinator points; the commits each broker saw
    let coordinator = Arc::new(Mutex::new(1));
    let commits: Arc<Mutex<Vec<i32>>> = Arc::default();
    let finds = Arc::new(AtomicUsize::new(0));
    let (c2, cm, f2) = (coordinator.clone(), commits.clone(), finds.clone());
    let fake = Fake::start(
        3,
        Arc::new(move |id, key, version, frame| match key {
            ApiKey::FIND_COORDINATOR => {
                f2.fetch_add(1, Ordering::SeqCst);
                let node = *c2.lock().unwrap();
                coordinator_answer(version, frame, Ok(node), &p.lock().unwrap())
            }
            ApiKey::OFFSET_COMMIT => {
                let req = parse::<OffsetCommitRequest>(frame, version);
                let n = {
                    let mut cm = cm.lock().unwrap();
                    cm.push(id);
                    cm.len()
                };
                let code = match n {
                    // the coordinator moved to 2
                    1 => {
                        *c2.lock().unwrap() = 2;
                        ErrorCode::NotCoordinator.code()
                    }
                    // the new coordinator hangs up once
                    2 => return Act::Close,
                    3 => ErrorCode::CoordinatorLoadInProgress.code(),
                    _ => 0,
                };
                reply::<OffsetCommitRequest>(
                    version,
                    &OffsetCommitResponse {
                        topics: req
                            .topics
                            .iter()
                            .map(|t| OffsetCommitResponseTopic {
                                name: t.name.clone(),
                                partitions: t
                                    .partitions
                                    .iter()
                                    .map(|p| OffsetCommitResponsePartition {
                                        partition_index: p.partition_index,
                                        error_code: code,
                                        ..Default::default()
                                    })
                                    .collect(),
                                ..Default::default()
                            })
                            .collect(),
                        ..Default::default()
                    },
                )
            }
            _ => Act::Close,
        }),
    )
    .await;
    *ports.lock().unwrap() = fake.ports.clone();
    let cluster = Cluster::new([fake.bootstrap()], ConnectionConfig::default()).unwrap();
    let coord = Coordinator::new("g".into(), cluster.clone(), Duration::from_millis(500));
    let offsets = [(crate::admin::TopicPartition::new("t", 0), 42)];
    let req = &Admin::offset_commit_request("g", 7, "m", None, &offsets);
    let offsets = &offsets;
    let r = coord
        .call(
            "OffsetCommit",
            Instant::now() + Duration::from_secs(5),
            Duration::from_secs(1),
            |c| async move { Admin::offset_commit_on(&c, req, offsets).await },
        )
        .await
        .unwrap();
    assert!(r[0].1.is_ok(), "{r:?}");
    assert_eq!(commits.lock().unwrap()[..], [1, 2, 2, 2]);
    // found at first, after NOT_COORDINATOR, after the hang-up (not after
    // COORDINATOR_LOAD_IN_PROGRESS: same coordinator, just loading)
    assert_eq!(finds.load(Ordering::SeqCst), 3);
    coord.close().await;
    cluster.close().await;
}

/// What the fake coordinator saw of the member.
#[derive(Default)]
struct Seen {
    joins: Vec<i32>,
    syncs: usize,
    /// (broker, generation, member id)
    heartbeats: Vec<(i32, i32, String)>,
    finds: Vec<i32>,
}

#[tokio::test]
async fn member_keeps_its_generation_through_coordinator_faults_and_yields_no_error() {
    let ports = ports_cell();
    let p = ports.clone();
    let seen: Arc<Mutex<Seen>> = Arc::default();
    let coordinator = Arc::new(Mutex::new(1));
    let (s, co) = (seen.clone(), coordinator.clone());
    let fake = Fake::start(
        3,
        Arc::new(move |id, key, version, frame| {
            let mut s = s.lock().unwrap();
            match key {
                ApiKey::FIND_COORDINATOR => {
                    s.finds.push(id);
                    let node = *co.lock().unwrap();
                    // the moved coordinator is not elected at once
                    let answer = if node == 2 && s.finds.len() % 2 == 0 {
                        Err(ErrorCode::CoordinatorNotAvailable)
                    } else {
                        Ok(node)
                    };
                    coordinator_answer(version, frame, answer, &p.lock().unwrap())
                }
                ApiKey::JOIN_GROUP => {
                    s.joins.push(id);
                    let code = match s.joins.len() {
                        1 => ErrorCode::CoordinatorLoadInProgress.code(),
                        2 => ErrorCode::NotCoordinator.code(),
                        3 => return Act::Close,
                        _ => 0,
                    };
                    reply::<JoinGroupRequest>(
                        version,
                        &JoinGroupResponse {
                            error_code: code,
                            generation_id: 5,
                            protocol_type: Some("consumer".into()),
                            protocol_name: Some("range".into()),
                            leader: "other".into(),
                            member_id: "m1".into(),
                            ..Default::default()
                        },
                    )
                }
                ApiKey::SYNC_GROUP => {
                    s.syncs += 1;
                    reply::<SyncGroupRequest>(
                        version,
                        &SyncGroupResponse {
                            protocol_type: Some("consumer".into()),
                            protocol_name: Some("range".into()),
                            ..Default::default()
                        },
                    )
                }
                ApiKey::HEARTBEAT => {
                    let req = parse::<HeartbeatRequest>(frame, version);
                    s.heartbeats.push((id, req.generation_id, req.member_id));
                    let at_2 = s.heartbeats.iter().filter(|h| h.0 == 2).count();
                    let code = if id != *co.lock().unwrap() {
                        ErrorCode::NotCoordinator.code()
                    } else if at_2 == 1 {
                        ErrorCode::CoordinatorLoadInProgress.code()
                    } else {
                        0
                    };
                    reply::<HeartbeatRequest>(
                        version,
                        &HeartbeatResponse {
                            error_code: code,
                            ..Default::default()
                        },
                    )
                }
                ApiKey::LEAVE_GROUP => reply::<LeaveGroupRequest>(
                    version,
                    &LeaveGroupResponse {
                        ..Default::default()
                    },
                ),
                _ => Act::Close,
            }
        }),
    )
    .await;
    *ports.lock().unwrap() = fake.ports.clone();
    let mut reader = Reader::new(
        ReaderConfig::new(vec![fake.bootstrap()])
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
    assert!(
        matches!(first, GroupEvent::Assigned { generation: 5, .. }),
        "{first:?}"
    );
    // heartbeats flow to broker 1; then it dies and the coordinator moves to 2
    let until = |f: fn(&Seen) -> bool| {
        let seen = seen.clone();
        async move {
            let t0 = Instant::now();
            while !f(&seen.lock().unwrap()) {
                assert!(t0.elapsed() < Duration::from_secs(10), "timed out");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    until(|s| s.heartbeats.iter().filter(|h| h.0 == 1).count() >= 3).await;
    *coordinator.lock().unwrap() = 2;
    fake.kill(1);
    let moved = Instant::now();
    until(|s| s.heartbeats.iter().filter(|h| h.0 == 2).count() >= 3).await;
    let recovered = moved.elapsed();
    assert!(recovered < Duration::from_secs(3), "{recovered:?}");
    // nothing yielded from the stream: no errors, no messages
    assert!(
        tokio::time::timeout(Duration::from_millis(300), reader.next())
            .await
            .is_err(),
        "the reader yielded something"
    );
    {
        let s = seen.lock().unwrap();
        // JoinGroup: loading, not coordinator, hang-up, joined — and never again
        assert_eq!(s.joins.len(), 4, "{:?}", s.joins);
        assert_eq!(s.syncs, 1);
        assert!(s.heartbeats.iter().all(|(_, g, m)| *g == 5 && m == "m1"));
    }
    reader.close().await;
    let rest: Vec<GroupEvent> = events.collect().await;
    assert!(
        rest.iter().all(|e| matches!(e, GroupEvent::Revoked { .. })),
        "{rest:?}"
    );
}
