//! A scripted fake Kafka cluster over real TCP, for exact fault cases a real broker cannot be made to show on demand
//! (OffsetOutOfRange, ListOffsets by timestamp, leader moves between brokers).
//!
//! It decodes requests with the crate's own protocol types and answers ApiVersions,
//! Metadata, ListOffsets and Fetch from a shared [`FakeState`] that the test edits while
//! clients run: which broker leads which partition, which offsets each partition's log
//! holds, which offset a timestamp maps to. Every broker of a [`FakeCluster`] serves the
//! same logs (as in-sync replicas would); only the leader answers fetches, others say
//! `NOT_LEADER_OR_FOLLOWER`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use kafkapipe::compression::Compression;
use kafkapipe::protocol::messages::{
    ApiVersionRange, ApiVersionsRequest, ApiVersionsResponse, FetchPartitionData, FetchRequest,
    FetchResponse, FetchableTopicResponse, ListOffsetsPartitionResponse, ListOffsetsRequest,
    ListOffsetsResponse, ListOffsetsTopicResponse, MetadataBroker, MetadataPartition,
    MetadataRequest, MetadataResponse, MetadataTopic,
};
use kafkapipe::protocol::{
    ApiKey, Encode, ErrorCode, Request, RequestHeader, ResponseHeader, TaggedFields,
};
use kafkapipe::record::RecordBatchBuilder;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The records of one partition: offsets `start..end`, value `"v{offset}"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FakeLog {
    pub start: i64,
    pub end: i64,
}

/// What the fake cluster serves; edit it through [`FakeCluster::state`].
#[derive(Debug, Default)]
pub struct FakeState {
    /// Broker id → address.
    pub brokers: Vec<(i32, String)>,
    /// Partition → leader broker id.
    pub leaders: HashMap<(String, i32), i32>,
    /// Partition → log.
    pub logs: HashMap<(String, i32), FakeLog>,
    /// Partition → the offset ListOffsets returns for any timestamp (else -1).
    pub time_offsets: HashMap<(String, i32), i64>,
    /// Fetch requests received, per broker id.
    pub fetches: HashMap<i32, u64>,
    /// (topic, partition, timestamp) of every ListOffsets partition asked for.
    pub list_offsets: Vec<(String, i32, i64)>,
    /// The isolation level of every ListOffsets request received.
    pub list_offsets_isolation: Vec<i8>,
    /// Most records per fetched batch.
    pub batch_records: i64,
}

/// A fake cluster of `n` brokers (ids 1..=n) on loopback ports.
pub struct FakeCluster {
    pub state: Arc<Mutex<FakeState>>,
    /// Per broker (index id - 1): its accept task and connection tasks.
    tasks: Vec<Arc<Mutex<Vec<tokio::task::JoinHandle<()>>>>>,
}

impl Drop for FakeCluster {
    fn drop(&mut self) {
        for b in &self.tasks {
            for t in b.lock().unwrap().iter() {
                t.abort();
            }
        }
    }
}

impl FakeCluster {
    pub async fn start(n: i32) -> FakeCluster {
        let state = Arc::new(Mutex::new(FakeState {
            batch_records: 5,
            ..FakeState::default()
        }));
        let mut cluster = FakeCluster {
            state,
            tasks: Vec::new(),
        };
        for id in 1..=n {
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap().to_string();
            cluster.state.lock().unwrap().brokers.push((id, addr));
            cluster.tasks.push(Arc::default());
            cluster.listen(id, listener);
        }
        cluster
    }

    fn listen(&self, id: i32, listener: TcpListener) {
        let state = self.state.clone();
        let tasks = self.tasks[(id - 1) as usize].clone();
        let conns = tasks.clone();
        let accept = tokio::spawn(async move {
            loop {
                let Ok((sock, _)) = listener.accept().await else {
                    return;
                };
                let t = tokio::spawn(serve(id, sock, state.clone()));
                conns.lock().unwrap().push(t);
            }
        });
        tasks.lock().unwrap().push(accept);
    }

    /// Stop broker `id`: close its listener and every connection it has (a crash).
    pub fn stop(&self, id: i32) {
        for t in self.tasks[(id - 1) as usize].lock().unwrap().drain(..) {
            t.abort();
        }
    }

    /// Start broker `id` again on its old address.
    pub async fn restart(&self, id: i32) {
        let addr = self.state.lock().unwrap().brokers[(id - 1) as usize]
            .1
            .clone();
        let listener = TcpListener::bind(&addr).await.unwrap();
        self.listen(id, listener);
    }

    /// The bootstrap address (broker 1).
    pub fn bootstrap(&self) -> String {
        self.state.lock().unwrap().brokers[0].1.clone()
    }

    /// Add partition `topic`/`partition` led by `leader` with offsets `start..end`.
    pub fn add(&self, topic: &str, partition: i32, leader: i32, start: i64, end: i64) {
        let mut st = self.state.lock().unwrap();
        st.leaders.insert((topic.to_string(), partition), leader);
        st.logs
            .insert((topic.to_string(), partition), FakeLog { start, end });
    }

    pub fn set_leader(&self, topic: &str, partition: i32, leader: i32) {
        self.state
            .lock()
            .unwrap()
            .leaders
            .insert((topic.to_string(), partition), leader);
    }

    pub fn set_end(&self, topic: &str, partition: i32, end: i64) {
        if let Some(l) = self
            .state
            .lock()
            .unwrap()
            .logs
            .get_mut(&(topic.to_string(), partition))
        {
            l.end = end;
        }
    }

    pub fn fetches(&self) -> u64 {
        self.state.lock().unwrap().fetches.values().sum()
    }
}

async fn serve(id: i32, mut sock: TcpStream, state: Arc<Mutex<FakeState>>) {
    loop {
        let mut len = [0u8; 4];
        if sock.read_exact(&mut len).await.is_err() {
            return;
        }
        let mut frame = vec![0u8; i32::from_be_bytes(len) as usize];
        if sock.read_exact(&mut frame).await.is_err() {
            return;
        }
        let frame = Bytes::from(frame);
        let (key, _, _) = RequestHeader::peek(&frame).unwrap();
        let (out, delay) = match key {
            ApiKey::API_VERSIONS => {
                answer::<ApiVersionsRequest>(frame, |_| (api_versions(), Duration::ZERO))
            }
            ApiKey::METADATA => answer::<MetadataRequest>(frame, |r| {
                (metadata(&state.lock().unwrap(), &r), Duration::ZERO)
            }),
            ApiKey::LIST_OFFSETS => answer::<ListOffsetsRequest>(frame, |r| {
                (list_offsets(&mut state.lock().unwrap(), &r), Duration::ZERO)
            }),
            ApiKey::FETCH => {
                answer::<FetchRequest>(frame, |r| fetch(id, &mut state.lock().unwrap(), &r))
            }
            other => panic!("fake broker got unexpected {other}"),
        };
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        let mut msg = Vec::with_capacity(out.len() + 4);
        msg.extend_from_slice(&(out.len() as i32).to_be_bytes());
        msg.extend_from_slice(&out);
        if sock.write_all(&msg).await.is_err() {
            return;
        }
    }
}

fn answer<R: Request>(
    frame: Bytes,
    f: impl FnOnce(R) -> (R::Response, Duration),
) -> (BytesMut, Duration) {
    let (_, version, _) = RequestHeader::peek(&frame).unwrap();
    let mut buf = frame;
    let header = RequestHeader::decode(&mut buf, R::request_header_version(version)).unwrap();
    let req = R::decode(&mut buf, version).unwrap();
    let (resp, delay) = f(req);
    let mut out = BytesMut::new();
    ResponseHeader {
        correlation_id: header.correlation_id,
        tagged_fields: TaggedFields::new(),
    }
    .encode(&mut out, R::response_header_version(version))
    .unwrap();
    resp.encode(&mut out, version).unwrap();
    (out, delay)
}

fn range<R: Request>(max: i16) -> ApiVersionRange {
    ApiVersionRange {
        api_key: R::API_KEY,
        min_version: R::MIN_VERSION,
        max_version: R::MAX_VERSION.min(max),
        tagged_fields: TaggedFields::new(),
    }
}

fn api_versions() -> ApiVersionsResponse {
    ApiVersionsResponse {
        api_keys: vec![
            range::<ApiVersionsRequest>(3),
            range::<MetadataRequest>(12),
            range::<ListOffsetsRequest>(7),
            range::<FetchRequest>(12),
        ],
        ..ApiVersionsResponse::default()
    }
}

fn metadata(st: &FakeState, req: &MetadataRequest) -> MetadataResponse {
    let mut names: Vec<String> = match &req.topics {
        Some(ts) => ts.iter().filter_map(|t| t.name.clone()).collect(),
        None => st.leaders.keys().map(|(t, _)| t.clone()).collect(),
    };
    names.sort();
    names.dedup();
    MetadataResponse {
        brokers: st
            .brokers
            .iter()
            .map(|(id, addr)| {
                let (host, port) = addr.rsplit_once(':').unwrap();
                MetadataBroker {
                    node_id: *id,
                    host: host.to_string(),
                    port: port.parse().unwrap(),
                    ..MetadataBroker::default()
                }
            })
            .collect(),
        controller_id: 1,
        topics: names
            .into_iter()
            .map(|name| {
                let mut parts: Vec<MetadataPartition> = st
                    .leaders
                    .iter()
                    .filter(|((t, _), _)| *t == name)
                    .map(|((_, p), leader)| MetadataPartition {
                        partition_index: *p,
                        leader_id: *leader,
                        replica_nodes: vec![*leader],
                        isr_nodes: vec![*leader],
                        ..MetadataPartition::default()
                    })
                    .collect();
                parts.sort_by_key(|p| p.partition_index);
                MetadataTopic {
                    error_code: if parts.is_empty() {
                        ErrorCode::UnknownTopicOrPartition.code()
                    } else {
                        0
                    },
                    name: Some(name),
                    partitions: parts,
                    ..MetadataTopic::default()
                }
            })
            .collect(),
        ..MetadataResponse::default()
    }
}

fn list_offsets(st: &mut FakeState, req: &ListOffsetsRequest) -> ListOffsetsResponse {
    st.list_offsets_isolation.push(req.isolation_level);
    let mut topics = Vec::new();
    for t in &req.topics {
        let mut partitions = Vec::new();
        for p in &t.partitions {
            let key = (t.name.clone(), p.partition_index);
            st.list_offsets
                .push((t.name.clone(), p.partition_index, p.timestamp));
            let log = st.logs.get(&key).copied();
            let (error_code, offset) = match (log, p.timestamp) {
                (None, _) => (ErrorCode::UnknownTopicOrPartition.code(), -1),
                (Some(l), -2) => (0, l.start),
                (Some(l), -1) => (0, l.end),
                (Some(_), _) => (0, st.time_offsets.get(&key).copied().unwrap_or(-1)),
            };
            partitions.push(ListOffsetsPartitionResponse {
                partition_index: p.partition_index,
                error_code,
                offset,
                ..ListOffsetsPartitionResponse::default()
            });
        }
        topics.push(ListOffsetsTopicResponse {
            name: t.name.clone(),
            partitions,
            ..ListOffsetsTopicResponse::default()
        });
    }
    ListOffsetsResponse {
        topics,
        ..ListOffsetsResponse::default()
    }
}

/// One batch holding offsets `from..to`, values `"v{offset}"`.
pub fn batch(from: i64, to: i64) -> Bytes {
    let mut b = RecordBatchBuilder::new(Compression::None);
    for o in from..to {
        b.append(
            1_700_000_000_000 + o,
            Some(format!("k{o}").as_bytes()),
            Some(format!("v{o}").as_bytes()),
            &[],
        )
        .unwrap();
    }
    let mut bytes = BytesMut::from(&b.build().unwrap()[..]);
    // The base offset is not covered by the CRC.
    bytes[..8].copy_from_slice(&from.to_be_bytes());
    bytes.freeze()
}

fn fetch(id: i32, st: &mut FakeState, req: &FetchRequest) -> (FetchResponse, Duration) {
    *st.fetches.entry(id).or_default() += 1;
    let mut any = false;
    let mut responses = Vec::new();
    for t in &req.topics {
        let mut partitions = Vec::new();
        for p in &t.partitions {
            let key = (t.topic.clone(), p.partition);
            let mut data = FetchPartitionData {
                partition_index: p.partition,
                ..FetchPartitionData::default()
            };
            match (st.leaders.get(&key), st.logs.get(&key)) {
                (Some(leader), Some(log)) if *leader == id => {
                    data.high_watermark = log.end;
                    data.last_stable_offset = log.end;
                    data.log_start_offset = log.start;
                    if p.fetch_offset < log.start || p.fetch_offset > log.end {
                        data.error_code = ErrorCode::OffsetOutOfRange.code();
                        any = true;
                    } else if p.fetch_offset < log.end {
                        let to = log.end.min(p.fetch_offset + st.batch_records);
                        data.records = Some(batch(p.fetch_offset, to));
                        any = true;
                    }
                }
                (Some(_), _) => {
                    data.error_code = ErrorCode::NotLeaderOrFollower.code();
                    any = true;
                }
                _ => {
                    data.error_code = ErrorCode::UnknownTopicOrPartition.code();
                    any = true;
                }
            }
            partitions.push(data);
        }
        responses.push(FetchableTopicResponse {
            topic: t.topic.clone(),
            partitions,
            ..FetchableTopicResponse::default()
        });
    }
    let delay = if any {
        Duration::ZERO
    } else {
        Duration::from_millis(u64::try_from(req.max_wait_ms).unwrap_or(0).min(50))
    };
    (
        FetchResponse {
            responses,
            ..FetchResponse::default()
        },
        delay,
    )
}
