//! Unit tests of [`Connection`](super::Connection) against a scripted peer on a
//! `tokio::io::duplex` pipe.

use std::sync::atomic::Ordering;

use bytes::{BufMut, Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

use super::driver::{read_pooled_frame, Frame, POOLED_FRAME_MIN};
use super::*;
use crate::bufpool::BufPool;
use crate::protocol::messages::{ApiVersionRange, ApiVersionsRequest};
use crate::protocol::{
    ApiKey, Decode, Encode, ErrorCode, Request, RequestHeader, ResponseHeader, TaggedFields,
};

const T: Duration = Duration::from_secs(5);

/// The broker side of a `tokio::io::duplex` pipe.
struct Peer {
    io: DuplexStream,
}

/// One request as the peer saw it.
struct Seen {
    header: RequestHeader,
    request: ApiVersionsRequest,
}

impl Peer {
    async fn read_request(&mut self) -> Seen {
        tokio::time::timeout(T, self.try_read_request())
            .await
            .expect("peer timed out waiting for a request")
            .expect("peer saw EOF")
    }

    /// `None` on EOF.
    async fn try_read_request(&mut self) -> Option<Seen> {
        let size = match self.io.read_i32().await {
            Ok(s) => s,
            Err(_) => return None,
        };
        let mut frame = vec![0u8; size as usize];
        self.io.read_exact(&mut frame).await.ok()?;
        let mut frame = Bytes::from(frame);
        let (key, version, _) = RequestHeader::peek(&frame).unwrap();
        assert_eq!(key, ApiKey::API_VERSIONS);
        let header = RequestHeader::decode(
            &mut frame,
            ApiVersionsRequest::request_header_version(version),
        )
        .unwrap();
        let request = ApiVersionsRequest::decode(&mut frame, version).unwrap();
        assert!(frame.is_empty());
        Some(Seen { header, request })
    }

    /// Whether a request arrives within `d`.
    async fn request_within(&mut self, d: Duration) -> Option<Seen> {
        tokio::time::timeout(d, self.try_read_request())
            .await
            .ok()
            .flatten()
    }

    async fn respond(&mut self, correlation_id: i32, version: i16, resp: &ApiVersionsResponse) {
        let mut body = BytesMut::new();
        ResponseHeader {
            correlation_id,
            tagged_fields: TaggedFields::new(),
        }
        .encode(&mut body, 0)
        .unwrap();
        resp.encode(&mut body, version).unwrap();
        let mut frame = BytesMut::new();
        frame.put_i32(body.len() as i32);
        frame.extend_from_slice(&body);
        self.write_raw(&frame).await;
    }

    /// Answer `seen` at its version with `tag` as the key of its only API range (see
    /// [`tag_in`]; not in `throttle_time_ms`, which would throttle the connection).
    async fn answer(&mut self, seen: &Seen, tag: i32) {
        let resp = ApiVersionsResponse {
            api_keys: vec![range(ApiKey(tag as i16), 0, 0)],
            ..ApiVersionsResponse::default()
        };
        self.respond(seen.header.correlation_id, seen.header.api_version, &resp)
            .await;
    }

    async fn write_raw(&mut self, bytes: &[u8]) {
        self.io.write_all(bytes).await.unwrap();
        self.io.flush().await.unwrap();
    }
}

fn range(key: ApiKey, min: i16, max: i16) -> ApiVersionRange {
    ApiVersionRange {
        api_key: key,
        min_version: min,
        max_version: max,
        tagged_fields: TaggedFields::new(),
    }
}

fn config() -> ConnectionConfig {
    ConnectionConfig {
        request_timeout: T,
        ..ConnectionConfig::default()
    }
}

fn raw_pair(config: ConnectionConfig) -> (Connection, Peer) {
    let (client, broker) = tokio::io::duplex(64 * 1024);
    let conn = Connection::from_stream_without_handshake(client, "fake:9092", config).unwrap();
    (conn, Peer { io: broker })
}

/// A request whose response can be told apart: the peer echoes `n` in
/// an API range key (see [`tag_of`]).
fn tagged(n: i32) -> ApiVersionsRequest {
    ApiVersionsRequest {
        client_software_name: format!("r{n}"),
        client_software_version: "1".into(),
        tagged_fields: TaggedFields::new(),
    }
}

async fn send_tagged(conn: &Connection, n: i32, version: i16) -> Result<ApiVersionsResponse> {
    conn.send_version(&tagged(n), version).await
}

async fn send_negotiated(conn: &Connection, n: i32) -> Result<ApiVersionsResponse> {
    conn.send(&tagged(n)).await
}

/// The tag [`Peer::answer`] put in a response.
fn tag_in(resp: &ApiVersionsResponse) -> i32 {
    resp.api_keys.first().map_or(-1, |r| i32::from(r.api_key.0))
}

fn tag_of(seen: &Seen) -> i32 {
    seen.request.client_software_name[1..].parse().unwrap()
}

/// Connect over a duplex pipe while the peer answers the handshake with `ranges`.
async fn handshake_with(ranges: Vec<ApiVersionRange>) -> (Connection, Peer) {
    let (client, broker) = tokio::io::duplex(64 * 1024);
    let mut peer = Peer { io: broker };
    let serve = async {
        let seen = peer.read_request().await;
        assert_eq!(seen.header.api_version, 3);
        assert_eq!(seen.request.client_software_name, "kafkapipe");
        assert_eq!(
            seen.request.client_software_version,
            env!("CARGO_PKG_VERSION")
        );
        assert_eq!(seen.header.client_id.as_deref(), Some("kafkapipe"));
        let resp = ApiVersionsResponse {
            api_keys: ranges,
            ..ApiVersionsResponse::default()
        };
        peer.respond(seen.header.correlation_id, 3, &resp).await;
    };
    let (conn, ()) = tokio::join!(
        Connection::from_stream(client, "fake:9092", config()),
        serve
    );
    (conn.unwrap(), peer)
}

/// Takes at most `limit` bytes per write, cutting pieces anywhere; with `vectored`
/// a write spans several pieces.
struct Trickle {
    out: Vec<u8>,
    limit: usize,
    vectored: bool,
}

impl AsyncWrite for Trickle {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let n = buf.len().min(self.limit);
        self.out.extend_from_slice(&buf[..n]);
        std::task::Poll::Ready(Ok(n))
    }

    fn poll_write_vectored(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        if !self.vectored {
            let first = bufs
                .iter()
                .find(|b| !b.is_empty())
                .map_or(&[][..], |b| &b[..]);
            return self.poll_write(cx, first);
        }
        let mut left = self.limit;
        for b in bufs {
            let n = b.len().min(left);
            self.out.extend_from_slice(&b[..n]);
            left -= n;
        }
        std::task::Poll::Ready(Ok(self.limit - left))
    }

    fn is_write_vectored(&self) -> bool {
        self.vectored
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
}

/// A produce frame's record batches are written from their own buffers, through short
/// and vectored writes, and the peer receives exactly the plain encoding.
#[tokio::test]
async fn spliced_record_batches_reach_the_wire_whole() {
    use crate::protocol::messages::produce::{
        ProducePartitionData, ProduceRequest, ProduceTopicData,
    };
    let batch =
        |n: usize, seed: u8| -> Bytes { (0..n).map(|i| (i as u8).wrapping_mul(seed)).collect() };
    // more partitions than one vectored write takes
    let partitions = (0..100)
        .map(|i| ProducePartitionData {
            index: i,
            records: Some(batch([20_000, 10, 9_000][i as usize % 3], i as u8 | 1).into()),
            ..Default::default()
        })
        .collect();
    let req = ProduceRequest {
        acks: -1,
        timeout_ms: 1000,
        topic_data: vec![ProduceTopicData {
            name: "t".into(),
            partition_data: partitions,
            ..Default::default()
        }],
        ..Default::default()
    };
    let (conn, _peer) = raw_pair(config());
    let (head, splices) = conn.encode_frame(&req, 9).unwrap();
    assert!(!splices.is_empty());
    let frame = Frame {
        head: head.freeze(),
        splices,
    };
    let mut plain = BytesMut::new();
    plain.put_i32(0);
    RequestHeader {
        api_key: ApiKey::PRODUCE,
        api_version: 9,
        correlation_id: 0,
        client_id: Some(conn.config().client_id.clone()),
        tagged_fields: TaggedFields::new(),
    }
    .encode(&mut plain, ProduceRequest::request_header_version(9))
    .unwrap();
    req.encode(&mut plain, 9).unwrap();
    let size = i32::try_from(plain.len() - 4).unwrap();
    plain[..4].copy_from_slice(&size.to_be_bytes());
    for limit in [1, 7, 4096, 65_536, 10 << 20] {
        for vectored in [false, true] {
            let mut w = Trickle {
                out: Vec::new(),
                limit,
                vectored,
            };
            frame.write_to(&mut w).await.unwrap();
            assert!(w.out == plain[..], "limit {limit}, vectored {vectored}");
        }
    }
}

/// A large frame arrives in pieces, part of it already buffered: it is read whole into
/// a pooled buffer, which the next large frame reuses once the first is dropped; a
/// peer closing mid-frame is a `Closed` error.
#[tokio::test]
async fn large_frames_are_read_into_reused_buffers() {
    let size = POOLED_FRAME_MIN * 3;
    let body: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
    let pool = BufPool::for_fetches();
    let (mut client, mut server) = tokio::io::duplex(4096);
    let writer = {
        let body = body.clone();
        tokio::spawn(async move {
            for _ in 0..2 {
                for chunk in body[1000..].chunks(10_000) {
                    server.write_all(chunk).await.unwrap();
                }
            }
            server.write_all(&body[1000..2000]).await.unwrap();
            // dropped: closed in the middle of the third frame
        })
    };
    let mut first_ptr = None;
    for _ in 0..2 {
        let mut buf = BytesMut::from(&body[..1000]);
        let frame = read_pooled_frame(&mut client, &mut buf, size, &pool)
            .await
            .unwrap();
        assert_eq!(&frame[..], &body[..]);
        assert!(buf.is_empty());
        let ptr = frame.as_ptr();
        assert_eq!(*first_ptr.get_or_insert(ptr), ptr, "the buffer is reused");
        let slice = frame.slice(5..10);
        drop(frame);
        assert_eq!(pool.kept().0, 0, "a slice still holds the buffer");
        drop(slice);
        assert_eq!(pool.kept().0, 1);
    }
    let mut buf = BytesMut::from(&body[..1000]);
    let err = read_pooled_frame(&mut client, &mut buf, size, &pool)
        .await
        .unwrap_err();
    assert_eq!(err.kind, ErrorKind::Closed);
    writer.await.unwrap();
}

#[tokio::test]
async fn handshake_negotiates_min_of_maxima() {
    let (conn, _peer) = handshake_with(vec![range(ApiKey::API_VERSIONS, 0, 3)]).await;
    assert_eq!(conn.version_for::<ApiVersionsRequest>().unwrap(), 3);
    assert_eq!(
        conn.api_versions().unwrap().range(ApiKey::API_VERSIONS),
        Some((0, 3))
    );

    let (conn, _peer) = handshake_with(vec![range(ApiKey::API_VERSIONS, 0, 9)]).await;
    assert_eq!(
        conn.version_for::<ApiVersionsRequest>().unwrap(),
        ApiVersionsRequest::MAX_VERSION
    );
}

#[tokio::test]
async fn send_uses_negotiated_version() {
    let (conn, mut peer) = handshake_with(vec![range(ApiKey::API_VERSIONS, 0, 2)]).await;
    let (resp, ()) = tokio::join!(send_negotiated(&conn, 7), async {
        let seen = peer.read_request().await;
        assert_eq!(seen.header.api_version, 2);
        peer.answer(&seen, 7).await;
    });
    assert_eq!(tag_in(&resp.unwrap()), 7);
}

#[tokio::test]
async fn absent_or_disjoint_api_is_unsupported() {
    let (conn, _peer) = handshake_with(vec![range(ApiKey::FETCH, 0, 13)]).await;
    let err = conn.version_for::<ApiVersionsRequest>().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::UnsupportedVersion);
    assert!(err.to_string().contains("ApiVersions"), "{err}");
    assert_eq!(err.broker(), Some("fake:9092"));
    let err = send_negotiated(&conn, 1).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::UnsupportedVersion);

    let (conn, _peer) = handshake_with(vec![range(ApiKey::API_VERSIONS, 5, 9)]).await;
    let err = conn.version_for::<ApiVersionsRequest>().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::UnsupportedVersion);
    let s = err.to_string();
    assert!(s.contains("0..=4") && s.contains("5..=9"), "{s}");
}

#[tokio::test]
async fn version_for_without_handshake_is_unsupported() {
    let (conn, _peer) = raw_pair(config());
    let err = conn.version_for::<ApiVersionsRequest>().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::UnsupportedVersion);
}

#[tokio::test]
async fn handshake_falls_back_on_unsupported_version() {
    let (client, broker) = tokio::io::duplex(64 * 1024);
    let mut peer = Peer { io: broker };
    let serve = async {
        let seen = peer.read_request().await;
        assert_eq!(seen.header.api_version, 3);
        let reject = ApiVersionsResponse {
            error_code: ErrorCode::UnsupportedVersion.code(),
            api_keys: vec![range(ApiKey::API_VERSIONS, 0, 2)],
            ..ApiVersionsResponse::default()
        };
        // An old broker answers in the v0 format.
        peer.respond(seen.header.correlation_id, 0, &reject).await;
        let seen = peer.read_request().await;
        assert_eq!(seen.header.api_version, 2);
        let ok = ApiVersionsResponse {
            api_keys: vec![
                range(ApiKey::API_VERSIONS, 0, 2),
                range(ApiKey::FETCH, 0, 11),
            ],
            ..ApiVersionsResponse::default()
        };
        peer.respond(seen.header.correlation_id, 2, &ok).await;
    };
    let (conn, ()) = tokio::join!(Connection::from_stream(client, "old:9092", config()), serve);
    let conn = conn.unwrap();
    assert_eq!(conn.version_for::<ApiVersionsRequest>().unwrap(), 2);
    assert_eq!(
        conn.api_versions().unwrap().range(ApiKey::FETCH),
        Some((0, 11))
    );
}

#[tokio::test]
async fn handshake_error_code_fails_connect() {
    let (client, broker) = tokio::io::duplex(64 * 1024);
    let mut peer = Peer { io: broker };
    let serve = async {
        let seen = peer.read_request().await;
        let resp = ApiVersionsResponse {
            error_code: ErrorCode::ClusterAuthorizationFailed.code(),
            ..ApiVersionsResponse::default()
        };
        peer.respond(seen.header.correlation_id, 3, &resp).await;
    };
    let (conn, ()) = tokio::join!(Connection::from_stream(client, "b:1", config()), serve);
    let err = conn.unwrap_err();
    assert_eq!(
        err.kafka_code(),
        Some(ErrorCode::ClusterAuthorizationFailed)
    );
    assert_eq!(err.broker(), Some("b:1"));
}

#[tokio::test]
async fn connect_over_tcp() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let server = tokio::spawn(async move {
        let (sock, _) = listener.accept().await.unwrap();
        let mut peer = Peer {
            io: {
                // Bridge the TCP socket to a duplex end so the Peer helper can serve it.
                let (a, b) = tokio::io::duplex(64 * 1024);
                let (mut sr, mut sw) = sock.into_split();
                let (mut ar, mut aw) = tokio::io::split(a);
                tokio::spawn(async move { tokio::io::copy(&mut sr, &mut aw).await });
                tokio::spawn(async move { tokio::io::copy(&mut ar, &mut sw).await });
                b
            },
        };
        let seen = peer.read_request().await;
        let resp = ApiVersionsResponse {
            api_keys: vec![range(ApiKey::API_VERSIONS, 0, 4)],
            ..ApiVersionsResponse::default()
        };
        peer.respond(seen.header.correlation_id, 3, &resp).await;
        peer
    });
    let conn = Connection::connect(&addr, config()).await.unwrap();
    assert_eq!(conn.broker(), addr);
    assert_eq!(conn.version_for::<ApiVersionsRequest>().unwrap(), 4);
    let _peer = server.await.unwrap();
    conn.close().await;
    assert!(conn.is_closed());
}

#[tokio::test]
async fn connect_refused_is_io_error_with_broker() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    drop(listener);
    let err = Connection::connect(&addr, config()).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Io);
    assert_eq!(err.broker(), Some(addr.as_str()));
}

#[tokio::test]
async fn invalid_config_is_rejected() {
    let (client, _broker) = tokio::io::duplex(64);
    let cfg = ConnectionConfig {
        max_in_flight: 0,
        ..config()
    };
    let err = Connection::from_stream_without_handshake(client, "b", cfg).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Config);
}

#[tokio::test]
async fn pipelined_responses_out_of_order_reach_their_callers() {
    let (conn, mut peer) = raw_pair(config());
    let sends = futures::future::join_all((0..4).map(|n| {
        let conn = conn.clone();
        async move { send_tagged(&conn, n, 3).await }
    }));
    let serve = async {
        let mut seen = Vec::new();
        for _ in 0..4 {
            seen.push(peer.read_request().await);
        }
        let mut ids: Vec<i32> = seen.iter().map(|s| s.header.correlation_id).collect();
        ids.sort();
        ids.dedup();
        assert_eq!(ids.len(), 4, "correlation ids must be distinct");
        for s in seen.iter().rev() {
            peer.answer(s, 100 + tag_of(s)).await;
        }
    };
    let (results, ()) = tokio::join!(sends, serve);
    for (n, r) in results.into_iter().enumerate() {
        assert_eq!(tag_in(&r.unwrap()), 100 + n as i32);
    }
    assert!(!conn.is_closed());
}

#[tokio::test]
async fn max_in_flight_bounds_unanswered_requests() {
    let (conn, mut peer) = raw_pair(ConnectionConfig {
        max_in_flight: 2,
        ..config()
    });
    let sends = futures::future::join_all((0..5).map(|n| {
        let conn = conn.clone();
        async move { send_tagged(&conn, n, 3).await }
    }));
    let serve = async {
        let mut unanswered = vec![peer.read_request().await, peer.read_request().await];
        let mut answered = 0;
        while answered < 5 {
            assert!(
                peer.request_within(Duration::from_millis(50))
                    .await
                    .is_none(),
                "peer saw more than 2 unanswered requests"
            );
            let s = unanswered.remove(0);
            peer.answer(&s, tag_of(&s)).await;
            answered += 1;
            if answered <= 3 {
                unanswered.push(peer.read_request().await);
            }
        }
    };
    let (results, ()) = tokio::join!(sends, serve);
    for (n, r) in results.into_iter().enumerate() {
        assert_eq!(tag_in(&r.unwrap()), n as i32);
    }
}

#[tokio::test]
async fn peer_hang_up_fails_in_flight_and_later_sends() {
    let (conn, mut peer) = raw_pair(config());
    let sends = futures::future::join_all((0..2).map(|n| {
        let conn = conn.clone();
        async move { send_tagged(&conn, n, 3).await }
    }));
    let hang_up = async move {
        peer.read_request().await;
        peer.read_request().await;
        drop(peer);
    };
    let started = std::time::Instant::now();
    let (results, ()) = tokio::join!(sends, hang_up);
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "failure was not prompt"
    );
    for r in results {
        let err = r.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Closed, "{err}");
        assert_eq!(err.broker(), Some("fake:9092"));
    }
    assert!(conn.is_closed());
    let err = send_tagged(&conn, 9, 3).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Closed);
}

/// Two requests in flight, then `garbage` from the peer: both fail with Protocol.
async fn garbage_fails_all(garbage: &[u8], max_frame_size: usize) -> Error {
    garbage_fails_all_with(garbage, max_frame_size, ErrorKind::Protocol).await
}

async fn garbage_fails_all_with(garbage: &[u8], max_frame_size: usize, kind: ErrorKind) -> Error {
    let (conn, mut peer) = raw_pair(ConnectionConfig {
        max_frame_size,
        ..config()
    });
    let sends = futures::future::join_all((0..2).map(|n| {
        let conn = conn.clone();
        async move { send_tagged(&conn, n, 3).await }
    }));
    let serve = async {
        peer.read_request().await;
        peer.read_request().await;
        peer.write_raw(garbage).await;
        peer
    };
    let (results, _peer) = tokio::join!(sends, serve);
    let mut last = None;
    for r in results {
        let err = r.unwrap_err();
        assert_eq!(err.kind(), kind, "{err}");
        last = Some(err);
    }
    assert!(conn.is_closed());
    let err = send_tagged(&conn, 9, 3).await.unwrap_err();
    assert_eq!(err.kind(), kind);
    last.unwrap()
}

#[tokio::test]
async fn negative_frame_size_is_protocol_error() {
    let err = garbage_fails_all(&(-5i32).to_be_bytes(), 1024).await;
    assert!(err.to_string().contains("-5"), "{err}");
}

#[tokio::test]
async fn oversized_frame_is_protocol_error() {
    garbage_fails_all(&2000i32.to_be_bytes(), 1024).await;
}

#[tokio::test]
async fn unknown_correlation_id_is_protocol_error() {
    let mut frame = BytesMut::new();
    frame.put_i32(10);
    frame.put_i32(123_456);
    frame.extend_from_slice(&[0; 6]);
    let err = garbage_fails_all_with(&frame, 1024, ErrorKind::Closed).await;
    assert!(err.to_string().contains("123456"), "{err}");
    assert!(err.is_retriable(), "{err}");
}

#[tokio::test]
async fn request_timeout_closes_the_connection() {
    let (conn, mut peer) = raw_pair(ConnectionConfig {
        request_timeout: Duration::from_millis(100),
        ..config()
    });
    // Two requests in flight; the broker answers neither.
    let ((r1, r2), _) = tokio::join!(
        async { tokio::join!(send_tagged(&conn, 1, 3), send_tagged(&conn, 2, 3)) },
        async {
            peer.read_request().await;
            peer.read_request().await;
        }
    );
    let errs = [r1.unwrap_err(), r2.unwrap_err()];
    // The first to time out reports the timeout; the other fails with the closed
    // connection (or its own timeout, if both deadlines fired together).
    assert!(errs.iter().any(Error::is_timeout), "{errs:?}");
    assert!(
        errs.iter().all(|e| e.is_timeout() || e.is_closed()),
        "{errs:?}"
    );
    assert!(errs.iter().all(Error::is_retriable));
    assert!(conn.is_closed());
    let later = send_tagged(&conn, 3, 3).await.unwrap_err();
    assert!(later.is_closed(), "{later}");
}

#[tokio::test]
async fn dropped_send_after_write_does_not_poison() {
    let (conn, mut peer) = raw_pair(config());
    let first = {
        let send = send_tagged(&conn, 1, 3);
        tokio::pin!(send);
        tokio::select! {
            _ = &mut send => panic!("no response was sent"),
            seen = peer.read_request() => seen,
        }
        // `send` is dropped here, after its frame was written.
    };
    let (r, ()) = tokio::join!(send_tagged(&conn, 2, 3), async {
        let second = peer.read_request().await;
        peer.answer(&first, 1).await;
        peer.answer(&second, 2).await;
    });
    assert_eq!(tag_in(&r.unwrap()), 2);
    assert!(!conn.is_closed());
}

#[tokio::test]
async fn dropped_send_before_write_is_skipped() {
    let (conn, mut peer) = raw_pair(ConnectionConfig {
        max_in_flight: 1,
        ..config()
    });
    // Occupy the only slot, then abandon a second send while it waits for the slot.
    let (r, ()) = tokio::join!(send_tagged(&conn, 1, 3), async {
        let first = peer.read_request().await;
        let waiting = send_tagged(&conn, 2, 3);
        assert!(tokio::time::timeout(Duration::from_millis(50), waiting)
            .await
            .is_err());
        peer.answer(&first, 1).await;
    });
    assert_eq!(tag_in(&r.unwrap()), 1);
    let (r, seen) = tokio::join!(send_tagged(&conn, 3, 3), async {
        let s = peer.read_request().await;
        peer.answer(&s, 3).await;
        s
    });
    assert_eq!(tag_in(&r.unwrap()), 3);
    assert_eq!(tag_of(&seen), 3, "abandoned request must not be written");
}

/// A queued request whose caller gave up (the writer's timeout) before the connection
/// wrote it is still written, between the requests queued before and after it: a gap
/// would break a partition's sequence. (It was skipped: the peer saw 1 and 3.)
#[tokio::test]
async fn a_queued_request_abandoned_before_its_turn_is_still_written() {
    let (conn, mut peer) = raw_pair(config());
    // nothing runs the connection's task before the first await: all three wait
    let first = conn.queue_request(&tagged(1), 3).unwrap();
    let second = conn.queue_request(&tagged(2), 3).unwrap();
    let third = conn.queue_request(&tagged(3), 3).unwrap();
    drop(second);
    let (r1, r3, seen) = tokio::join!(first, third, async {
        let mut tags = Vec::new();
        for _ in 0..3 {
            let s = peer.read_request().await;
            tags.push(tag_of(&s));
            peer.answer(&s, tag_of(&s)).await;
        }
        tags
    });
    assert_eq!(seen, [1, 2, 3]);
    assert_eq!(tag_in(&r1.unwrap()), 1);
    assert_eq!(tag_in(&r3.unwrap()), 3);
}

#[tokio::test]
async fn send_no_response_writes_frame_and_frees_slot() {
    let (conn, mut peer) = raw_pair(ConnectionConfig {
        max_in_flight: 1,
        ..config()
    });
    conn.send_no_response(&tagged(5), 3).await.unwrap();
    let seen = peer.read_request().await;
    assert_eq!(tag_of(&seen), 5);
    assert_eq!(seen.header.api_version, 3);
    // The only slot is free again: a normal request goes through.
    let (r, ()) = tokio::join!(send_tagged(&conn, 6, 3), async {
        let s = peer.read_request().await;
        peer.answer(&s, 6).await;
    });
    assert_eq!(tag_in(&r.unwrap()), 6);
}

#[tokio::test]
async fn unexpected_answer_to_no_response_request_is_discarded() {
    // tansu 0.6 answers acks=0 produce requests; that must not kill the connection.
    let (conn, mut peer) = raw_pair(config());
    conn.send_no_response(&tagged(5), 3).await.unwrap();
    let seen = peer.read_request().await;
    peer.answer(&seen, 5).await;
    let (r, ()) = tokio::join!(send_tagged(&conn, 6, 3), async {
        let s = peer.read_request().await;
        peer.answer(&s, 6).await;
    });
    assert_eq!(tag_in(&r.unwrap()), 6);
    assert!(!conn.is_closed());
}

#[tokio::test]
async fn close_fails_in_flight_and_stops_driver() {
    let (conn, mut peer) = raw_pair(config());
    let (r, ()) = tokio::join!(send_tagged(&conn, 1, 3), async {
        peer.read_request().await;
        conn.close().await;
    });
    assert_eq!(r.unwrap_err().kind(), ErrorKind::Closed);
    assert!(conn.is_closed());
    assert_eq!(
        send_tagged(&conn, 2, 3).await.unwrap_err().kind(),
        ErrorKind::Closed
    );
    // The driver dropped its end of the pipe.
    assert!(peer.request_within(T).await.is_none());
    conn.close().await;
}

#[tokio::test]
async fn dropping_last_handle_stops_driver() {
    let (conn, mut peer) = raw_pair(config());
    let other = conn.clone();
    drop(conn);
    let (r, ()) = tokio::join!(send_tagged(&other, 1, 3), async {
        let s = peer.read_request().await;
        peer.answer(&s, 1).await;
    });
    assert_eq!(tag_in(&r.unwrap()), 1);
    drop(other);
    // EOF: the driver task ended and dropped the stream.
    assert!(peer.request_within(T).await.is_none());
}

#[tokio::test]
async fn version_outside_implemented_range_is_rejected() {
    let (conn, _peer) = raw_pair(config());
    let err = send_tagged(&conn, 1, 9).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::UnsupportedVersion);
    assert!(!conn.is_closed());
}

#[tokio::test]
async fn correlation_ids_wrap_to_zero() {
    let (conn, _peer) = raw_pair(config());
    conn.shared
        .next_correlation_id
        .store(i32::MAX, Ordering::Relaxed);
    assert_eq!(conn.next_correlation_id(), i32::MAX);
    assert_eq!(conn.next_correlation_id(), 0);
    assert_eq!(conn.next_correlation_id(), 1);
}

/// Answer `seen` asking for `ms` of quota throttle (KIP-219).
async fn answer_throttled(peer: &mut Peer, seen: &Seen, ms: i32) {
    let resp = ApiVersionsResponse {
        throttle_time_ms: ms,
        ..ApiVersionsResponse::default()
    };
    peer.respond(seen.header.correlation_id, seen.header.api_version, &resp)
        .await;
}

#[tokio::test(start_paused = true)]
async fn a_throttled_response_holds_the_next_request_back() {
    let (conn, mut peer) = handshake_with(vec![range(ApiKey::API_VERSIONS, 0, 3)]).await;
    let (r, ()) = tokio::join!(send_negotiated(&conn, 1), async {
        let seen = peer.read_request().await;
        answer_throttled(&mut peer, &seen, 500).await;
    });
    assert_eq!(r.unwrap().throttle_time_ms, 500);
    let answered = tokio::time::Instant::now();
    assert!(conn.throttled_until().is_some());
    let (r, ()) = tokio::join!(send_negotiated(&conn, 2), async {
        assert!(
            peer.request_within(Duration::from_millis(490))
                .await
                .is_none(),
            "a request was written while the connection was throttled"
        );
        let seen = peer.read_request().await;
        assert!(answered.elapsed() >= Duration::from_millis(500));
        assert_eq!(tag_of(&seen), 2);
        peer.answer(&seen, 2).await;
    });
    assert_eq!(tag_in(&r.unwrap()), 2);
    assert!(conn.throttled_until().is_none());
}

#[tokio::test(start_paused = true)]
async fn queued_requests_wait_for_the_throttle_too() {
    let (conn, mut peer) = handshake_with(vec![range(ApiKey::API_VERSIONS, 0, 3)]).await;
    let (r, ()) = tokio::join!(send_negotiated(&conn, 1), async {
        let seen = peer.read_request().await;
        answer_throttled(&mut peer, &seen, 300).await;
    });
    assert!(r.is_ok());
    let answered = tokio::time::Instant::now();
    let queued = conn.queue_request(&tagged(2), 3).unwrap();
    let (r, ()) = tokio::join!(queued, async {
        assert!(peer
            .request_within(Duration::from_millis(290))
            .await
            .is_none());
        let seen = peer.read_request().await;
        assert!(answered.elapsed() >= Duration::from_millis(300));
        peer.answer(&seen, 2).await;
    });
    assert_eq!(tag_in(&r.unwrap()), 2);
}

#[tokio::test(start_paused = true)]
async fn time_throttled_does_not_count_against_the_request_timeout() {
    let (client, broker) = tokio::io::duplex(64 * 1024);
    let config = ConnectionConfig {
        request_timeout: Duration::from_secs(1),
        ..ConnectionConfig::default()
    };
    let conn = Connection::from_stream_without_handshake(client, "fake:9092", config).unwrap();
    let mut peer = Peer { io: broker };
    let (r, ()) = tokio::join!(send_tagged(&conn, 1, 3), async {
        let seen = peer.read_request().await;
        answer_throttled(&mut peer, &seen, 3000).await;
    });
    assert!(r.is_ok());
    // Held back for 3 s, then answered at once: not a timeout of the 1 s request.
    let (r, ()) = tokio::join!(send_tagged(&conn, 2, 3), async {
        let seen = peer.read_request().await;
        peer.answer(&seen, 2).await;
    });
    assert_eq!(tag_in(&r.unwrap()), 2);
    assert!(!conn.is_closed());
    // A broker that then does not answer still times out.
    let (r, _) = tokio::join!(send_tagged(&conn, 3, 3), peer.read_request());
    assert_eq!(r.unwrap_err().kind(), ErrorKind::Timeout);
}

#[tokio::test(start_paused = true)]
async fn broker_throttled_versions_do_not_hold_requests() {
    // ApiVersions v1 predates KIP-219: the broker delayed the answer itself.
    let (conn, mut peer) = handshake_with(vec![range(ApiKey::API_VERSIONS, 0, 1)]).await;
    let (r, ()) = tokio::join!(send_negotiated(&conn, 1), async {
        let seen = peer.read_request().await;
        assert_eq!(seen.header.api_version, 1);
        answer_throttled(&mut peer, &seen, 5000).await;
    });
    assert_eq!(r.unwrap().throttle_time_ms, 5000);
    assert!(conn.throttled_until().is_none());
    let started = tokio::time::Instant::now();
    let (_, seen) = tokio::join!(
        tokio::time::timeout(Duration::from_millis(100), send_negotiated(&conn, 2)),
        peer.read_request()
    );
    assert_eq!(seen.header.api_version, 1);
    assert!(started.elapsed() < Duration::from_secs(1));
}
