//! A deterministic, scripted fake Kafka broker over real TCP, for `Conn` fault tests.
//!
//! [`FakeBroker::start`] listens on `127.0.0.1:0` and serves every accepted connection on
//! its own task. Each request frame is decoded with kafkapipe's own protocol types (request
//! header v2 for flexible versions, v1 otherwise) and recorded. ApiVersions is answered
//! automatically from the configured ranges (response header v0, as Kafka does); every
//! other request is handed to the test's [`Handler`], which decides what bytes go back:
//! a well-formed response built with [`respond`], raw garbage, nothing, or a hang-up.
//!
//! Nothing is random or timed: the broker answers exactly what the script says, in order.
#![allow(dead_code)]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::{Arc, Mutex};

use bytes::{BufMut, Bytes, BytesMut};
use kafkapipe::protocol::messages::{
    ApiVersionRange, ApiVersionsRequest, ApiVersionsResponse, CreateTopicsRequest,
    DeleteTopicsRequest, FetchRequest, ListOffsetsRequest, MetadataBroker, MetadataPartition,
    MetadataRequest, MetadataResponse, MetadataTopic, ProduceRequest,
};
use kafkapipe::protocol::{
    ApiKey, Encode, ErrorCode, Request, RequestHeader, ResponseHeader, TaggedFields,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// A decoded request body.
#[derive(Debug, Clone)]
pub enum Req {
    /// ApiVersions (answered by the fake itself).
    ApiVersions(ApiVersionsRequest),
    /// Metadata.
    Metadata(MetadataRequest),
    /// Produce.
    Produce(ProduceRequest),
    /// Fetch.
    Fetch(FetchRequest),
    /// ListOffsets.
    ListOffsets(ListOffsetsRequest),
    /// CreateTopics.
    CreateTopics(CreateTopicsRequest),
    /// DeleteTopics.
    DeleteTopics(DeleteTopicsRequest),
}

/// One request as the fake broker saw it.
#[derive(Debug, Clone)]
pub struct Incoming {
    /// The decoded request header.
    pub header: RequestHeader,
    /// The decoded body.
    pub req: Req,
}

/// What the fake does with a request.
pub enum Action {
    /// Write these bytes (one or more whole frames, or anything at all).
    Write(Vec<u8>),
    /// Write nothing and keep serving.
    Ignore,
    /// Close the connection.
    HangUp,
}

/// The test's script: called for every request except ApiVersions.
pub type Handler = Arc<dyn Fn(&Incoming) -> Action + Send + Sync>;

/// A running fake broker; stops (all its connections included) when dropped.
pub struct FakeBroker {
    /// `127.0.0.1:PORT`.
    pub addr: String,
    seen: Arc<Mutex<Vec<Incoming>>>,
    task: JoinHandle<()>,
}

impl Drop for FakeBroker {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FakeBroker {
    /// Start a fake advertising `ranges` in its ApiVersions response and answering every
    /// other request with `handler`.
    pub async fn start(
        ranges: Vec<ApiVersionRange>,
        handler: impl Fn(&Incoming) -> Action + Send + Sync + 'static,
    ) -> FakeBroker {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let handler: Handler = Arc::new(handler);
        let ranges = Arc::new(ranges);
        let task = {
            let seen = Arc::clone(&seen);
            tokio::spawn(async move {
                let mut conns = tokio::task::JoinSet::new();
                while let Ok((stream, _)) = listener.accept().await {
                    conns.spawn(serve(
                        stream,
                        Arc::clone(&ranges),
                        Arc::clone(&handler),
                        Arc::clone(&seen),
                    ));
                }
            })
        };
        FakeBroker { addr, seen, task }
    }

    /// Every request received so far (ApiVersions included), in arrival order.
    pub fn seen(&self) -> Vec<Incoming> {
        self.seen.lock().unwrap().clone()
    }

    /// The Fetch requests received so far.
    pub fn fetches(&self) -> Vec<(RequestHeader, FetchRequest)> {
        self.seen()
            .into_iter()
            .filter_map(|i| match i.req {
                Req::Fetch(f) => Some((i.header, f)),
                _ => None,
            })
            .collect()
    }
}

async fn serve(
    mut stream: TcpStream,
    ranges: Arc<Vec<ApiVersionRange>>,
    handler: Handler,
    seen: Arc<Mutex<Vec<Incoming>>>,
) {
    loop {
        let Ok(size) = stream.read_i32().await else {
            return;
        };
        let mut frame = vec![0u8; usize::try_from(size).expect("negative request size")];
        if stream.read_exact(&mut frame).await.is_err() {
            return;
        }
        let incoming = decode_request(Bytes::from(frame));
        seen.lock().unwrap().push(incoming.clone());
        let action = match &incoming.req {
            Req::ApiVersions(_) => Action::Write(api_versions_reply(&incoming.header, &ranges)),
            _ => handler(&incoming),
        };
        match action {
            Action::Write(bytes) => {
                if stream.write_all(&bytes).await.is_err() || stream.flush().await.is_err() {
                    return;
                }
            }
            Action::Ignore => {}
            Action::HangUp => return,
        }
    }
}

fn decode_as<R: Request>(frame: &mut Bytes, version: i16) -> (RequestHeader, R) {
    let header = RequestHeader::decode(frame, R::request_header_version(version))
        .unwrap_or_else(|e| panic!("fake broker: bad {} request header: {e}", R::API_KEY));
    let body = R::decode(frame, version)
        .unwrap_or_else(|e| panic!("fake broker: bad {} v{version} request: {e}", R::API_KEY));
    assert!(
        frame.is_empty(),
        "fake broker: {} trailing bytes after {} v{version}",
        frame.len(),
        R::API_KEY
    );
    (header, body)
}

fn decode_request(mut frame: Bytes) -> Incoming {
    let (key, version, _) = RequestHeader::peek(&frame).expect("request header");
    let f = &mut frame;
    let (header, req) = match key {
        ApiKey::API_VERSIONS => {
            // A client may send a version newer than ours; only the header matters then.
            if version > ApiVersionsRequest::MAX_VERSION {
                let header = RequestHeader::decode(f, 2).expect("header");
                (header, Req::ApiVersions(ApiVersionsRequest::default()))
            } else {
                let (h, r) = decode_as::<ApiVersionsRequest>(f, version);
                (h, Req::ApiVersions(r))
            }
        }
        ApiKey::METADATA => {
            let (h, r) = decode_as::<MetadataRequest>(f, version);
            (h, Req::Metadata(r))
        }
        ApiKey::PRODUCE => {
            let (h, r) = decode_as::<ProduceRequest>(f, version);
            (h, Req::Produce(r))
        }
        ApiKey::FETCH => {
            let (h, r) = decode_as::<FetchRequest>(f, version);
            (h, Req::Fetch(r))
        }
        ApiKey::LIST_OFFSETS => {
            let (h, r) = decode_as::<ListOffsetsRequest>(f, version);
            (h, Req::ListOffsets(r))
        }
        ApiKey::CREATE_TOPICS => {
            let (h, r) = decode_as::<CreateTopicsRequest>(f, version);
            (h, Req::CreateTopics(r))
        }
        ApiKey::DELETE_TOPICS => {
            let (h, r) = decode_as::<DeleteTopicsRequest>(f, version);
            (h, Req::DeleteTopics(r))
        }
        other => panic!("fake broker: unexpected API {other}"),
    };
    Incoming { header, req }
}

fn api_versions_reply(header: &RequestHeader, ranges: &[ApiVersionRange]) -> Vec<u8> {
    let mut resp = ApiVersionsResponse {
        api_keys: ranges.to_vec(),
        ..ApiVersionsResponse::default()
    };
    let mut version = header.api_version;
    if version > ApiVersionsRequest::MAX_VERSION {
        // What Kafka does: UNSUPPORTED_VERSION with a v0 body listing its ranges.
        resp.error_code = ErrorCode::UnsupportedVersion.code();
        version = 0;
    }
    frame_with(header.correlation_id, 0, |b| resp.encode(b, version))
}

/// One whole response frame answering `header`: response header at the version `R` uses,
/// then `resp` encoded at the request's version.
pub fn respond<R: Request>(header: &RequestHeader, resp: &R::Response) -> Vec<u8> {
    let version = header.api_version;
    frame_with(
        header.correlation_id,
        R::response_header_version(version),
        |b| resp.encode(b, version),
    )
}

/// A frame with a response header for `correlation_id` and a body written by `body`.
pub fn frame_with(
    correlation_id: i32,
    header_version: i16,
    body: impl FnOnce(&mut BytesMut) -> kafkapipe::Result<()>,
) -> Vec<u8> {
    let mut b = BytesMut::new();
    ResponseHeader {
        correlation_id,
        tagged_fields: TaggedFields::new(),
    }
    .encode(&mut b, header_version)
    .unwrap();
    body(&mut b).unwrap();
    raw_frame(&b)
}

/// `payload` with a 4-byte size prefix.
pub fn raw_frame(payload: &[u8]) -> Vec<u8> {
    let mut out = BytesMut::with_capacity(payload.len() + 4);
    out.put_i32(i32::try_from(payload.len()).unwrap());
    out.extend_from_slice(payload);
    out.to_vec()
}

/// The version range of `R` this client implements.
pub fn range_of<R: Request>() -> ApiVersionRange {
    range(R::API_KEY, R::MIN_VERSION, R::MAX_VERSION)
}

/// A version range.
pub fn range(api_key: ApiKey, min_version: i16, max_version: i16) -> ApiVersionRange {
    ApiVersionRange {
        api_key,
        min_version,
        max_version,
        tagged_fields: TaggedFields::new(),
    }
}

/// Every API this client speaks, at exactly the client's ranges (a modern broker).
pub fn client_ranges() -> Vec<ApiVersionRange> {
    vec![
        range_of::<ApiVersionsRequest>(),
        range_of::<MetadataRequest>(),
        range_of::<ProduceRequest>(),
        range_of::<FetchRequest>(),
        range_of::<ListOffsetsRequest>(),
        range_of::<CreateTopicsRequest>(),
        range_of::<DeleteTopicsRequest>(),
    ]
}

/// `client_ranges()` with `key` replaced by `min..=max`.
pub fn ranges_with(key: ApiKey, min: i16, max: i16) -> Vec<ApiVersionRange> {
    client_ranges()
        .into_iter()
        .map(|r| {
            if r.api_key == key {
                range(key, min, max)
            } else {
                r
            }
        })
        .collect()
}

/// A Metadata answer: broker 1 leads `partitions` partitions of `topic`, whose id is
/// `topic_id`.
pub fn metadata_reply(inc: &Incoming, topic: &str, topic_id: [u8; 16], partitions: i32) -> Action {
    let resp = MetadataResponse {
        brokers: vec![MetadataBroker {
            node_id: 1,
            host: "127.0.0.1".to_string(),
            port: 9092,
            ..MetadataBroker::default()
        }],
        cluster_id: Some("fake".to_string()),
        controller_id: 1,
        topics: vec![MetadataTopic {
            name: Some(topic.to_string()),
            topic_id,
            partitions: (0..partitions)
                .map(|p| MetadataPartition {
                    partition_index: p,
                    leader_id: 1,
                    leader_epoch: 0,
                    replica_nodes: vec![1],
                    isr_nodes: vec![1],
                    ..MetadataPartition::default()
                })
                .collect(),
            ..MetadataTopic::default()
        }],
        ..MetadataResponse::default()
    };
    Action::Write(respond::<MetadataRequest>(&inc.header, &resp))
}
