//! [`Connection`]: a handle to one broker connection, and the driver task behind it.
//!
//! # Design
//!
//! The caller side ([`Connection::send`] and friends) encodes the whole request frame
//! (size prefix, request header, body), takes one in-flight permit from a semaphore sized
//! [`ConnectionConfig::max_in_flight`], stamps a fresh correlation id into the frame and
//! hands it to the driver over an unbounded channel (bounded in practice by the permits),
//! then awaits a oneshot reply.
//!
//! The driver is one task that owns the stream, split into a read half and a write half
//! driven concurrently:
//!
//! - the writer takes frames off the channel, records the request in the pending map
//!   (correlation id → reply sender, response header version, permit) and writes the frame
//!   whole; frames whose caller has already gone away are not written at all;
//! - the reader reads size-prefixed response frames, removes the matching pending entry,
//!   decodes the response header at the version the request recorded and hands the rest of
//!   the frame to the caller (or discards it if the caller gave up), releasing the permit.
//!
//! Quotas (KIP-219): a response whose `throttle_time_ms` the client must honour (see
//! [`crate::protocol::throttle`]) holds the writer back: no further request is written on
//! the connection until the throttle time, counted from the response's arrival, has
//! passed (the Java client's per-node `throttleUntil`). Requests issued meanwhile queue;
//! the time spent throttled does not count against their timeouts.
//!
//! Any failure (peer hang-up, I/O error, a frame size out of range, an unknown
//! correlation id, an undecodable header) kills the connection: the reason is recorded,
//! every pending request fails with it, the semaphore is closed so waiting and later sends
//! fail at once, and the task ends. [`Connection::close`] and dropping the last handle
//! also end the task.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot, Notify, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinHandle;
use tracing::{debug, trace, warn, Instrument};

use crate::bufpool::BufPool;
use crate::error::{Error, ErrorKind, Result};
use crate::protocol::messages::{ApiVersionsRequest, ApiVersionsResponse};
use crate::sasl::Mechanism;

use super::Dialer;

mod auth;
use crate::protocol::{
    check_version, throttle, ApiKey, Decode, ErrorCode, Request, RequestHeader, ResponseHeader,
    Splices, TaggedFields,
};

/// Settings of one [`Connection`].
///
/// ```
/// use std::time::Duration;
/// use kafkapipe::conn::ConnectionConfig;
/// let config = ConnectionConfig {
///     client_id: "my-app".into(),
///     request_timeout: Duration::from_secs(5),
///     ..ConnectionConfig::default()
/// };
/// assert_eq!(config.max_in_flight, 5);
/// ```
#[derive(Debug, Clone)]
pub struct ConnectionConfig {
    /// The client id sent in every request header. Default `"kafkapipe"`
    /// (Java: `client.id`).
    pub client_id: String,
    /// How long establishing the TCP connection may take. Default 10 s
    /// (Java: `socket.connection.setup.timeout.ms`).
    pub connect_timeout: Duration,
    /// How long one request may take, from the call until its response arrives, including
    /// the wait for an in-flight slot. Default 30 s (Java: `request.timeout.ms`).
    ///
    /// A timeout closes the connection, as in the Java client: a broker that does not
    /// answer on this socket in time is treated as gone, every other in-flight request
    /// fails with a retriable `Closed` error, and the cluster layer dials afresh.
    pub request_timeout: Duration,
    /// How many requests may be written and not yet answered at once; further sends wait
    /// for a slot. Must be at least 1. Default 5
    /// (Java: `max.in.flight.requests.per.connection`).
    pub max_in_flight: usize,
    /// The largest response frame accepted, in bytes. A larger (or negative) size prefix is
    /// a protocol error that kills the connection. Default 100 MiB
    /// (Java: `socket.request.max.bytes` on the broker side).
    pub max_frame_size: usize,
    /// TLS for every connection dialed with this configuration; `None` (the default)
    /// for plain TCP. The TLS handshake counts against `connect_timeout`.
    /// (Java: `security.protocol=SSL` / `SASL_SSL` and the `ssl.*` settings.)
    #[cfg(feature = "tls")]
    pub tls: Option<crate::tls::TlsConfig>,
    /// SASL authentication after the ApiVersions handshake; `None` (the default) for
    /// none. See [`crate::sasl`]. (Java: `sasl.mechanism`, `sasl.jaas.config`.)
    ///
    /// The connection re-authenticates in place before the session lifetime the broker
    /// grants expires (KIP-368).
    pub sasl: Option<Arc<dyn Mechanism>>,
    /// How the connection's byte stream is opened: an address map for advertised
    /// addresses, a custom [`Connector`](super::Connector) or a SOCKS5 proxy. Default:
    /// direct TCP to the address as given. See [`Dialer`].
    ///
    /// ```
    /// use kafkapipe::conn::{ConnectionConfig, Dialer, Socks5Proxy};
    /// let config = ConnectionConfig {
    ///     dialer: Dialer::new().with_socks5_proxy(Socks5Proxy::new("127.0.0.1:1080")),
    ///     ..ConnectionConfig::default()
    /// };
    /// # let _ = config;
    /// ```
    pub dialer: Dialer,
}

impl PartialEq for ConnectionConfig {
    /// Field-wise; `sasl` mechanisms are equal when they are the same `Arc`.
    fn eq(&self, other: &Self) -> bool {
        let sasl_eq = match (&self.sasl, &other.sasl) {
            (None, None) => true,
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            _ => false,
        };
        #[cfg(feature = "tls")]
        let tls_eq = self.tls == other.tls;
        #[cfg(not(feature = "tls"))]
        let tls_eq = true;
        self.client_id == other.client_id
            && self.connect_timeout == other.connect_timeout
            && self.request_timeout == other.request_timeout
            && self.max_in_flight == other.max_in_flight
            && self.max_frame_size == other.max_frame_size
            && tls_eq
            && sasl_eq
            && self.dialer == other.dialer
    }
}

impl Eq for ConnectionConfig {}

impl Default for ConnectionConfig {
    fn default() -> Self {
        ConnectionConfig {
            client_id: "kafkapipe".to_string(),
            connect_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(30),
            max_in_flight: 5,
            max_frame_size: 100 * 1024 * 1024,
            #[cfg(feature = "tls")]
            tls: None,
            sasl: None,
            dialer: Dialer::default(),
        }
    }
}

impl ConnectionConfig {
    fn validate(&self) -> Result<()> {
        if self.max_in_flight == 0 || self.max_in_flight > Semaphore::MAX_PERMITS {
            return Err(Error::config(format!(
                "max_in_flight must be between 1 and {}, got {}",
                Semaphore::MAX_PERMITS,
                self.max_in_flight
            )));
        }
        if self.max_frame_size < 4 {
            return Err(Error::config(format!(
                "max_frame_size must be at least 4 bytes, got {}",
                self.max_frame_size
            )));
        }
        Ok(())
    }
}

/// One multiplexed connection to one broker.
///
/// Cloning is cheap (an `Arc`); all clones share the socket, the in-flight limit and the
/// negotiated versions. The background task ends when [`Connection::close`] is called, when
/// the connection fails, or when the last clone is dropped.
#[derive(Clone)]
pub struct Connection {
    shared: Arc<Shared>,
}

struct Shared {
    broker: String,
    config: ConnectionConfig,
    commands: mpsc::UnboundedSender<Command>,
    state: Arc<State>,
    next_correlation_id: AtomicI32,
    api_versions: OnceLock<ApiVersionsResponse>,
    driver: Mutex<Option<JoinHandle<()>>>,
    /// The KIP-368 re-authentication timer task, if the broker limited the session.
    reauth: Mutex<Option<JoinHandle<()>>>,
}

impl fmt::Debug for Connection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Connection")
            .field("broker", &self.shared.broker)
            .field("closed", &self.is_closed())
            .finish()
    }
}

impl Connection {
    /// Connect to `addr` (`host:port`): open the stream with [`ConnectionConfig::dialer`]
    /// (by default TCP with `TCP_NODELAY`; or after mapping the address, through a SOCKS5
    /// proxy or a custom connector), then TLS if [`ConnectionConfig::tls`] is set — both
    /// within [`ConnectionConfig::connect_timeout`] — then the ApiVersions handshake, then
    /// SASL if [`ConnectionConfig::sasl`] is set. The connection is returned only once all
    /// of that succeeded. TLS checks the certificate against `addr`'s host (before any
    /// address mapping).
    ///
    /// # Errors
    ///
    /// `Timeout` or `Io` if the stream cannot be opened, `Authentication` if a SOCKS5
    /// proxy refuses the credentials, `Tls` if the TLS
    /// handshake fails (untrusted or mismatching certificate…), `Config` for an invalid
    /// configuration, any error of the handshake (see [`Connection::negotiate_versions`])
    /// and of authentication (see [`Connection::from_stream`]). Every error names the
    /// broker.
    pub async fn connect(addr: &str, config: ConnectionConfig) -> Result<Connection> {
        config.validate()?;
        debug!(broker = addr, "connecting");
        let started = tokio::time::Instant::now();
        let stream =
            match tokio::time::timeout(config.connect_timeout, config.dialer.dial(addr)).await {
                Err(_) => {
                    return Err(Error::timeout(format!(
                        "connect timed out after {} ms",
                        config.connect_timeout.as_millis()
                    ))
                    .with_broker(addr))
                }
                Ok(r) => r?,
            };
        #[cfg(feature = "tls")]
        if let Some(tls) = config.tls.clone() {
            let deadline = started + config.connect_timeout;
            let stream = match tokio::time::timeout_at(deadline, tls.handshake(stream, addr)).await
            {
                Err(_) => {
                    return Err(Error::timeout(format!(
                        "TLS handshake timed out (connect timeout {} ms)",
                        config.connect_timeout.as_millis()
                    ))
                    .with_broker(addr))
                }
                Ok(r) => r?,
            };
            debug!(broker = addr, "TLS established");
            return Self::from_stream(stream, addr, config).await;
        }
        let _ = started;
        Self::from_stream(stream, addr, config).await
    }

    /// Run a connection over an already established `stream` (TCP, TLS, an in-memory pipe…)
    /// to the broker called `broker` (used in logs and errors), perform the ApiVersions
    /// handshake, then SASL authentication if [`ConnectionConfig::sasl`] is set
    /// ([`ConnectionConfig::tls`] is not used here: `stream` is already what it is).
    ///
    /// Authentication is SaslHandshake v1 followed by SaslAuthenticate requests carrying
    /// the mechanism's messages. If it fails the connection is closed before this returns:
    /// no further request is ever sent on it. If the broker grants a limited session
    /// lifetime, the connection re-authenticates in place at 85% of it (KIP-368): new
    /// requests wait while in-flight ones finish, the exchange runs alone on the
    /// connection, then requests flow again. If re-authentication fails the connection is
    /// closed (`Closed`, retriable: a new connection authenticates afresh, and fails for
    /// good if the credentials are no longer valid).
    ///
    /// # Errors
    ///
    /// `Config` for an invalid configuration or when called outside a Tokio runtime, any
    /// error of the handshake (see [`Connection::negotiate_versions`]), and for SASL:
    /// `Kafka(UnsupportedSaslMechanism)` naming the mechanisms the broker offers,
    /// `Kafka(SaslAuthenticationFailed)` with the broker's message (e.g. a wrong password),
    /// `Authentication` for client-side failures (a broker that fails to prove it knows the
    /// SCRAM credentials, a token provider error). None of these is retriable.
    pub async fn from_stream<S>(
        stream: S,
        broker: impl Into<String>,
        config: ConnectionConfig,
    ) -> Result<Connection>
    where
        S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
    {
        let conn = Self::from_stream_without_handshake(stream, broker, config)?;
        if let Err(e) = conn.negotiate_versions().await {
            conn.close().await;
            return Err(e);
        }
        if let Some(mechanism) = conn.shared.config.sasl.clone() {
            if let Err(e) = conn.authenticate(mechanism).await {
                conn.close().await;
                return Err(e);
            }
        }
        Ok(conn)
    }

    /// Run a connection over `stream` without the ApiVersions handshake: only
    /// [`Connection::send_version`] and [`Connection::send_no_response`] work until
    /// [`Connection::negotiate_versions`] is called. Meant for tests and for exchanges that
    /// must precede the handshake.
    ///
    /// Must be called within a Tokio runtime, which runs the connection's task.
    ///
    /// # Errors
    ///
    /// `Config` for an invalid configuration or when called outside a Tokio runtime.
    pub fn from_stream_without_handshake<S>(
        stream: S,
        broker: impl Into<String>,
        config: ConnectionConfig,
    ) -> Result<Connection>
    where
        S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
    {
        let broker = broker.into();
        config
            .validate()
            .map_err(|e| e.with_broker(broker.clone()))?;
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| {
            Error::config("a kafkapipe connection must be created within a Tokio runtime")
                .with_broker(broker.clone())
        })?;
        let (commands, receiver) = mpsc::unbounded_channel();
        let state = Arc::new(State {
            broker: broker.clone(),
            in_flight: Arc::new(Semaphore::new(config.max_in_flight)),
            pending: Mutex::new(HashMap::new()),
            unanswered: Mutex::new(std::collections::VecDeque::new()),
            failure: Mutex::new(None),
            spare_frames: Mutex::new(Vec::new()),
            shutdown: Notify::new(),
            throttle: Mutex::new(Throttle::default()),
        });
        let span = tracing::debug_span!("kafka_connection", broker = %broker);
        let driver = runtime.spawn(
            drive(stream, receiver, Arc::clone(&state), config.max_frame_size).instrument(span),
        );
        Ok(Connection {
            shared: Arc::new(Shared {
                broker,
                config,
                commands,
                state,
                next_correlation_id: AtomicI32::new(0),
                api_versions: OnceLock::new(),
                driver: Mutex::new(Some(driver)),
                reauth: Mutex::new(None),
            }),
        })
    }

    /// Perform the ApiVersions handshake and remember the broker's version ranges.
    ///
    /// Sends ApiVersions v3 with the client software name `kafkapipe` and this crate's
    /// version (KIP-511). A broker that does not know v3 answers `UNSUPPORTED_VERSION` with a
    /// v0 body listing its ranges; the request is then repeated at the highest version the
    /// broker allows (or v0).
    ///
    /// # Errors
    ///
    /// `Config` if the versions were already negotiated; `Kafka` if the broker answers with
    /// an error code; otherwise the errors of [`Connection::send_version`].
    pub async fn negotiate_versions(&self) -> Result<()> {
        if self.shared.api_versions.get().is_some() {
            return Err(self.err(Error::config("API versions were already negotiated")));
        }
        const FIRST: i16 = 3;
        let req = ApiVersionsRequest {
            client_software_name: "kafkapipe".to_string(),
            client_software_version: env!("CARGO_PKG_VERSION").to_string(),
            tagged_fields: TaggedFields::new(),
        };
        let mut body = self.request_body(&req, FIRST).await?;
        let error_code = peek_i16(&body).unwrap_or(0);
        let response = if error_code == ErrorCode::UnsupportedVersion.code() {
            let v0 = ApiVersionsResponse::decode(&mut body, 0).map_err(|e| self.err(e))?;
            let fallback = v0
                .range(ApiKey::API_VERSIONS)
                .map_or(0, |(_, max)| max.min(FIRST - 1))
                .max(0);
            debug!(
                broker = %self.shared.broker,
                api = %ApiKey::API_VERSIONS,
                fallback,
                "broker does not support ApiVersions v3, retrying"
            );
            self.send_version(&req, fallback).await?
        } else {
            ApiVersionsResponse::decode(&mut body, FIRST).map_err(|e| self.err(e))?
        };
        if response.error_code != 0 {
            return Err(self.err(
                Error::kafka(ErrorCode::from(response.error_code))
                    .with_message("ApiVersions handshake failed"),
            ));
        }
        debug!(
            broker = %self.shared.broker,
            apis = response.api_keys.len(),
            "negotiated API versions"
        );
        if self.shared.api_versions.set(response).is_err() {
            return Err(self.err(Error::config("API versions were already negotiated")));
        }
        Ok(())
    }

    /// The broker's ApiVersions response, once the handshake is done.
    pub fn api_versions(&self) -> Option<&ApiVersionsResponse> {
        self.shared.api_versions.get()
    }

    /// The broker name given at connect time (its address, unless the caller chose
    /// otherwise).
    pub fn broker(&self) -> &str {
        &self.shared.broker
    }

    /// The configuration this connection runs with.
    pub fn config(&self) -> &ConnectionConfig {
        &self.shared.config
    }

    /// Whether `self` and `other` are handles on the same connection.
    pub(crate) fn same(&self, other: &Connection) -> bool {
        Arc::ptr_eq(&self.shared, &other.shared)
    }

    /// Whether the connection is dead (failed or closed); every further send fails with the
    /// reason it died.
    pub fn is_closed(&self) -> bool {
        self.shared.state.failure().is_some()
    }

    /// The version of `R` to use with this broker: the highest version both sides support,
    /// `min(R::MAX_VERSION, broker max)`.
    ///
    /// # Errors
    ///
    /// `UnsupportedVersion` (naming the API and both ranges) if the broker lacks the API,
    /// the ranges do not overlap, or no handshake was done.
    pub fn version_for<R: Request>(&self) -> Result<i16> {
        let Some(versions) = self.shared.api_versions.get() else {
            return Err(self.err(Error::new(
                ErrorKind::UnsupportedVersion,
                format!(
                    "cannot choose a version of {}: no ApiVersions handshake was done",
                    R::API_KEY
                ),
            )));
        };
        let Some((broker_min, broker_max)) = versions.range(R::API_KEY) else {
            return Err(self.err(Error::new(
                ErrorKind::UnsupportedVersion,
                format!(
                    "broker does not support {} (client supports {}..={})",
                    R::API_KEY,
                    R::MIN_VERSION,
                    R::MAX_VERSION
                ),
            )));
        };
        let version = R::MAX_VERSION.min(broker_max);
        if version < R::MIN_VERSION.max(broker_min) {
            return Err(self.err(Error::new(
                ErrorKind::UnsupportedVersion,
                format!(
                    "no common version of {}: client supports {}..={}, broker supports {}..={}",
                    R::API_KEY,
                    R::MIN_VERSION,
                    R::MAX_VERSION,
                    broker_min,
                    broker_max
                ),
            )));
        }
        Ok(version)
    }

    /// Send `req` at the negotiated version (see [`Connection::version_for`]) and await its
    /// response.
    ///
    /// # Errors
    ///
    /// `UnsupportedVersion` if no common version exists, and the errors of
    /// [`Connection::send_version`].
    ///
    /// # Cancellation safety
    ///
    /// Dropping the future at any point leaves the connection usable: before the request is
    /// handed to the connection task nothing was sent; afterwards the task either skips it
    /// (if not yet written) or writes it whole and reads and discards its response. The
    /// request may therefore still reach the broker after the future was dropped.
    pub async fn send<R: Request>(&self, req: &R) -> Result<R::Response> {
        let version = self.version_for::<R>()?;
        self.send_version(req, version).await
    }

    /// Send `req` at `version` and await its response, decoded at that version.
    ///
    /// # Errors
    ///
    /// `UnsupportedVersion` if `version` is outside `R`'s implemented range; `Encode` if the
    /// request cannot be encoded; `Timeout` after [`ConnectionConfig::request_timeout`]
    /// (the connection stays usable); `Closed`, `Io` or `Protocol` if the connection is or
    /// becomes dead; `Protocol` if the response body cannot be decoded. Every error names
    /// the broker.
    ///
    /// # Cancellation safety
    ///
    /// As for [`Connection::send`].
    pub async fn send_version<R: Request>(&self, req: &R, version: i16) -> Result<R::Response> {
        let mut body = self.request_body(req, version).await?;
        R::Response::decode(&mut body, version).map_err(|e| self.err(e))
    }

    /// Like [`Connection::send`], calling `on_queued` with the request's correlation id as
    /// soon as the request is handed to the connection task (before the response), so a
    /// caller can log what it sent under the id the broker sees, even if no answer comes.
    pub(crate) async fn send_observed<R: Request>(
        &self,
        req: &R,
        on_queued: impl FnOnce(i32),
    ) -> Result<(i32, R::Response)> {
        let version = self.version_for::<R>()?;
        let mut id = -1;
        let mut body = self
            .request_body_observed(req, version, false, |c| {
                id = c;
                on_queued(c);
            })
            .await?;
        let resp = R::Response::decode(&mut body, version).map_err(|e| self.err(e))?;
        Ok((id, resp))
    }

    /// Queue `req` at `version` on the connection now, before returning: requests queued
    /// this way are written in the order of the calls (the writer relies on it to keep a
    /// partition's batches in sequence order on the wire). No in-flight slot is taken —
    /// the caller bounds its own requests. The returned future awaits the response, within
    /// [`ConnectionConfig::request_timeout`] from the first poll.
    ///
    /// Once queued, the request is written even if the future is dropped (timed out)
    /// before its turn: skipping it would leave a gap before the requests queued after it
    /// (for the writer, a sequence gap the broker refuses, and a batch that looks sent
    /// but never was).
    ///
    /// # Errors
    ///
    /// As for [`Connection::send_version`]; an error before anything was queued is
    /// returned at once.
    pub(crate) fn queue_request<R: Request>(
        &self,
        req: &R,
        version: i16,
    ) -> Result<impl std::future::Future<Output = Result<R::Response>> + Send + 'static>
    where
        R::Response: Send + 'static,
    {
        check_version::<R>(version).map_err(|e| self.err(e))?;
        if self.is_closed() {
            return Err(self.err(self.shared.state.error()));
        }
        let (mut head, splices) = self.encode_frame(req, version)?;
        let correlation_id = self.next_correlation_id();
        if let Some(slot) = head.get_mut(8..12) {
            slot.copy_from_slice(&correlation_id.to_be_bytes());
        }
        let (tx, rx) = oneshot::channel();
        self.submit(Command {
            correlation_id,
            frame: Frame {
                head: head.freeze(),
                splices,
            },
            permit: None,
            reply: Reply::Response {
                api_key: R::API_KEY,
                api_version: version,
                header_version: R::response_header_version(version),
                tx,
                ordered: true,
            },
        })
        .map_err(|e| self.err(e))?;
        let conn = self.clone();
        Ok(async move {
            let work = async { rx.await.unwrap_or_else(|_| Err(conn.shared.state.error())) };
            let mut body = conn.timed(R::API_KEY, version, work).await?;
            R::Response::decode(&mut body, version).map_err(|e| conn.err(e))
        })
    }

    /// Send `req` at `version` without expecting a response (Produce with `acks=0`). Returns
    /// once the frame is written and flushed. Takes an in-flight slot while waiting to be
    /// written, so it respects [`ConnectionConfig::max_in_flight`].
    ///
    /// # Errors
    ///
    /// As for [`Connection::send_version`], except that no response is decoded.
    ///
    /// # Cancellation safety
    ///
    /// Dropping the future never leaves a partial frame: once handed to the connection task
    /// the frame is written whole even if the future is dropped.
    pub async fn send_no_response<R: Request>(&self, req: &R, version: i16) -> Result<()> {
        check_version::<R>(version).map_err(|e| self.err(e))?;
        let frame = self.encode_frame(req, version)?;
        let work = async {
            let (permit, correlation_id, frame) = self.prepare(frame, false).await?;
            let (tx, rx) = oneshot::channel();
            self.submit(Command {
                correlation_id,
                frame,
                permit,
                reply: Reply::Written(tx),
            })?;
            trace!(
                broker = %self.shared.broker,
                api = %R::API_KEY,
                api_version = version,
                correlation_id,
                "queued request without response"
            );
            rx.await.unwrap_or_else(|_| Err(self.shared.state.error()))
        };
        self.timed(R::API_KEY, version, work).await
    }

    /// Close the connection: fail every in-flight request with `Closed`, stop the
    /// connection's task and wait for it to end. Later sends fail with `Closed`. Closing
    /// twice is harmless.
    ///
    /// # Cancellation safety
    ///
    /// The connection is marked closed and its task told to stop before the first await;
    /// dropping the future only skips waiting for the task to finish.
    pub async fn close(&self) {
        self.shared.state.set_failure(Failure::new(
            ErrorKind::Closed,
            "connection closed by client",
        ));
        self.shared.state.shutdown.notify_one();
        if let Some(reauth) = lock(&self.shared.reauth).take() {
            reauth.abort();
        }
        let handle = lock(&self.shared.driver).take();
        if let Some(handle) = handle {
            let _ = handle.await;
        }
        debug!(broker = %self.shared.broker, "connection closed");
    }

    /// Encode, send and await the raw response body of `req` at `version`.
    async fn request_body<R: Request>(&self, req: &R, version: i16) -> Result<Bytes> {
        self.request_body_with(req, version, false).await
    }

    /// Like [`Connection::request_body`]; with `exclusive` no in-flight slot is taken,
    /// because the caller holds them all (re-authentication).
    async fn request_body_with<R: Request>(
        &self,
        req: &R,
        version: i16,
        exclusive: bool,
    ) -> Result<Bytes> {
        self.request_body_observed(req, version, exclusive, |_| {})
            .await
    }

    /// Like [`Connection::request_body_with`], calling `on_queued` with the correlation id
    /// once the request is handed to the connection task.
    async fn request_body_observed<R: Request>(
        &self,
        req: &R,
        version: i16,
        exclusive: bool,
        on_queued: impl FnOnce(i32),
    ) -> Result<Bytes> {
        check_version::<R>(version).map_err(|e| self.err(e))?;
        let frame = self.encode_frame(req, version)?;
        let header_version = R::response_header_version(version);
        let work = async {
            let (permit, correlation_id, frame) = self.prepare(frame, exclusive).await?;
            let (tx, rx) = oneshot::channel();
            self.submit(Command {
                correlation_id,
                frame,
                permit,
                reply: Reply::Response {
                    api_key: R::API_KEY,
                    api_version: version,
                    header_version,
                    tx,
                    ordered: false,
                },
            })?;
            trace!(
                broker = %self.shared.broker,
                api = %R::API_KEY,
                api_version = version,
                correlation_id,
                "queued request"
            );
            on_queued(correlation_id);
            rx.await.unwrap_or_else(|_| Err(self.shared.state.error()))
        };
        self.timed(R::API_KEY, version, work).await
    }

    /// Encode the whole frame with correlation id 0 ([`Connection::prepare`] stamps the
    /// real one): the buffer, and the large byte strings left out of it (record batches),
    /// which are written from their own memory.
    fn encode_frame<R: Request>(&self, req: &R, version: i16) -> Result<(BytesMut, Splices)> {
        let mut buf = self.shared.state.frame_buffer();
        let mut splices = Splices::new();
        buf.put_i32(0); // size, patched below
        RequestHeader {
            api_key: R::API_KEY,
            api_version: version,
            correlation_id: 0,
            client_id: Some(self.shared.config.client_id.clone()),
            tagged_fields: TaggedFields::new(),
        }
        .encode(&mut buf, R::request_header_version(version))
        .map_err(|e| self.err(e))?;
        req.encode_spliced(&mut buf, &mut splices, version)
            .map_err(|e| self.err(e))?;
        let len = (buf.len() - 4).saturating_add(splices.len());
        let size = i32::try_from(len).map_err(|_| {
            self.err(Error::encode(format!(
                "{} request of {len} bytes exceeds the frame size limit",
                R::API_KEY,
            )))
        })?;
        buf[..4].copy_from_slice(&size.to_be_bytes());
        Ok((buf, splices))
    }

    /// Wait for an in-flight slot (unless `exclusive`: the caller holds every slot), then
    /// stamp a fresh correlation id into `frame`.
    async fn prepare(
        &self,
        (mut head, splices): (BytesMut, Splices),
        exclusive: bool,
    ) -> Result<(Option<OwnedSemaphorePermit>, i32, Frame)> {
        if self.is_closed() {
            return Err(self.shared.state.error());
        }
        let permit = if exclusive {
            None
        } else {
            Some(
                Arc::clone(&self.shared.state.in_flight)
                    .acquire_owned()
                    .await
                    .map_err(|_| self.shared.state.error())?,
            )
        };
        let correlation_id = self.next_correlation_id();
        // Every request header starts with api_key (2), api_version (2), correlation_id (4),
        // right after the 4-byte size prefix.
        if let Some(slot) = head.get_mut(8..12) {
            slot.copy_from_slice(&correlation_id.to_be_bytes());
        }
        let frame = Frame {
            head: head.freeze(),
            splices,
        };
        Ok((permit, correlation_id, frame))
    }

    fn submit(&self, command: Command) -> Result<()> {
        self.shared
            .commands
            .send(command)
            .map_err(|_| self.shared.state.error())
    }

    async fn timed<T>(
        &self,
        api_key: ApiKey,
        version: i16,
        work: impl std::future::Future<Output = Result<T>>,
    ) -> Result<T> {
        let timeout = self.shared.config.request_timeout;
        match self.timeout_unthrottled(timeout, work).await {
            Some(result) => result,
            None => {
                debug!(broker = %self.shared.broker, api = %api_key, api_version = version, "request timed out; closing the connection");
                // Like the Java client: a broker that does not answer in time on this
                // socket is treated as gone. Every other in-flight request fails with
                // `Closed` (retriable), and the cluster layer dials a fresh connection.
                self.shared.state.fail(Failure::new(
                    ErrorKind::Closed,
                    format!("connection closed after a {api_key} request timed out"),
                ));
                self.shared.state.shutdown.notify_one();
                Err(self.err(Error::timeout(format!(
                    "{api_key} v{version} request timed out after {} ms",
                    timeout.as_millis()
                ))))
            }
        }
    }

    /// Until when the broker throttles this connection (KIP-219): `Some` while a quota
    /// throttle time is running, during which no request is written. See
    /// [`crate::protocol::throttle`].
    ///
    /// ```no_run
    /// # async fn f(conn: kafkapipe::conn::Connection) {
    /// if let Some(until) = conn.throttled_until() {
    ///     println!("throttled for {:?} more", until - tokio::time::Instant::now());
    /// }
    /// # }
    /// ```
    pub fn throttled_until(&self) -> Option<tokio::time::Instant> {
        self.shared.state.throttled_until()
    }

    /// Run `work` for at most `timeout`, not counting the time this connection is
    /// throttled by a quota meanwhile (KIP-219): a request held back by the throttle has
    /// its whole timeout once it may go. `None` if the time ran out.
    pub(crate) async fn timeout_unthrottled<F: std::future::Future>(
        &self,
        timeout: Duration,
        work: F,
    ) -> Option<F::Output> {
        let state = &self.shared.state;
        let start = tokio::time::Instant::now();
        let mark = state.throttle_mark(start);
        tokio::pin!(work);
        // A timeout too large to add to an instant (`Duration::MAX` settings) never ends.
        let deadline = || {
            start
                .checked_add(timeout)
                .and_then(|d| d.checked_add(state.throttled_since(&mark)))
        };
        loop {
            let Some(at) = deadline() else {
                return Some(work.await);
            };
            if let Ok(out) = tokio::time::timeout_at(at, &mut work).await {
                return Some(out);
            }
            if deadline().is_some_and(|at| at <= tokio::time::Instant::now()) {
                return None;
            }
        }
    }

    /// Correlation ids count up from 0 and wrap back to 0 after `i32::MAX`.
    fn next_correlation_id(&self) -> i32 {
        self.shared
            .next_correlation_id
            .fetch_add(1, Ordering::Relaxed)
            & i32::MAX
    }

    fn err(&self, e: Error) -> Error {
        if e.broker().is_some() {
            e
        } else {
            e.with_broker(self.shared.broker.clone())
        }
    }
}

fn peek_i16(buf: &Bytes) -> Option<i16> {
    let bytes = buf.get(..2)?;
    Some(i16::from_be_bytes([bytes[0], bytes[1]]))
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

// ---------------------------------------------------------------------------------------
// driver

/// Why the connection died; turned into an [`Error`] for every affected request.
#[derive(Debug, Clone)]
struct Failure {
    kind: ErrorKind,
    message: String,
}

impl Failure {
    fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Failure {
            kind,
            message: message.into(),
        }
    }
}

/// State shared by the handles and the driver task.
struct State {
    broker: String,
    in_flight: Arc<Semaphore>,
    pending: Mutex<HashMap<i32, Pending>>,
    /// Correlation ids of recent requests sent without expecting a response (acks=0
    /// produce). Some brokers (tansu 0.6) answer them anyway; such a reply is discarded
    /// rather than treated as garbage. Bounded to [`UNANSWERED_MEMORY`] entries.
    unanswered: Mutex<std::collections::VecDeque<i32>>,
    failure: Mutex<Option<Failure>>,
    /// Buffers of large frames already written, for the next requests (at most
    /// [`SPARE_FRAMES`]): a stream of megabyte produce requests then fills memory it
    /// touched before instead of fresh pages.
    spare_frames: Mutex<Vec<BytesMut>>,
    shutdown: Notify,
    /// The quota throttle (KIP-219) the broker asked for.
    throttle: Mutex<Throttle>,
}

/// A connection's quota throttle: until when nothing may be written, and the total
/// throttled time so far (each throttle counting only what it added to the window), from
/// which a request's timeout learns how long it was held back.
#[derive(Debug, Default)]
struct Throttle {
    until: Option<tokio::time::Instant>,
    total: Duration,
}

/// Where the throttle stood when a request started (see [`State::throttled_since`]).
struct ThrottleMark {
    total: Duration,
    remaining: Duration,
}

/// Frame buffers kept per connection for reuse.
const SPARE_FRAMES: usize = 2;
/// Only frames at least this large are kept.
const SPARE_FRAME_MIN: usize = 64 * 1024;

impl State {
    /// An empty buffer for a frame: a reused one if any.
    fn frame_buffer(&self) -> BytesMut {
        match lock(&self.spare_frames).pop() {
            Some(mut buf) => {
                buf.clear();
                buf
            }
            None => BytesMut::with_capacity(128),
        }
    }

    /// A frame is written: keep its buffer if it is large and nothing else holds it. The
    /// buffer's capacity counts, not the frame's length: a small request written into a
    /// reused large buffer hands that buffer back.
    fn recycle(&self, frame: Bytes) {
        let Ok(buf) = frame.try_into_mut() else {
            return;
        };
        if buf.capacity() < SPARE_FRAME_MIN {
            return;
        }
        let mut spare = lock(&self.spare_frames);
        if spare.len() < SPARE_FRAMES {
            spare.push(buf);
        }
    }

    fn failure(&self) -> Option<Failure> {
        lock(&self.failure).clone()
    }

    /// The broker asked for `ms` of quiet from `now` on: extend the throttle window.
    fn throttle(&self, now: tokio::time::Instant, ms: i32) {
        let until = now + Duration::from_millis(u64::try_from(ms).unwrap_or(0));
        let mut t = lock(&self.throttle);
        let from = t.until.map_or(now, |u| u.max(now));
        if until > from {
            t.total += until - from;
            t.until = Some(until);
        }
    }

    /// The end of the running throttle, if one runs.
    fn throttled_until(&self) -> Option<tokio::time::Instant> {
        lock(&self.throttle)
            .until
            .filter(|u| *u > tokio::time::Instant::now())
    }

    fn throttle_mark(&self, now: tokio::time::Instant) -> ThrottleMark {
        let t = lock(&self.throttle);
        ThrottleMark {
            total: t.total,
            remaining: t
                .until
                .map_or(Duration::ZERO, |u| u.saturating_duration_since(now)),
        }
    }

    /// How much throttled time falls after `mark` was taken (an upper bound: the rest of
    /// the throttle then running, and every throttle added since).
    fn throttled_since(&self, mark: &ThrottleMark) -> Duration {
        let total = lock(&self.throttle).total;
        mark.remaining + total.saturating_sub(mark.total)
    }

    fn error_from(&self, f: &Failure) -> Error {
        Error::new(f.kind, f.message.clone()).with_broker(self.broker.clone())
    }

    /// The error for requests on this connection once it is dead.
    fn error(&self) -> Error {
        match self.failure() {
            Some(f) => self.error_from(&f),
            None => Error::closed("connection closed").with_broker(self.broker.clone()),
        }
    }

    /// Record why the connection died (the first reason wins) and stop new requests.
    fn set_failure(&self, failure: Failure) {
        let mut slot = lock(&self.failure);
        if slot.is_none() {
            *slot = Some(failure);
        }
        drop(slot);
        self.in_flight.close();
    }

    /// Record `failure` and fail every pending request.
    fn fail(&self, failure: Failure) {
        self.set_failure(failure);
        let pending = std::mem::take(&mut *lock(&self.pending));
        let error_count = pending.len();
        for (_, p) in pending {
            let _ = p.tx.send(Err(self.error()));
        }
        if error_count > 0 {
            debug!(broker = %self.broker, failed = error_count, "failed in-flight requests");
        }
    }

    /// Hand one response frame (without its size prefix) to its request.
    fn dispatch(&self, frame: Bytes) -> Result<(), Failure> {
        let Some(correlation_id) = frame
            .get(..4)
            .map(|b| i32::from_be_bytes([b[0], b[1], b[2], b[3]]))
        else {
            return Err(Failure::new(
                ErrorKind::Protocol,
                "response frame too short for a header",
            ));
        };
        let Some(pending) = lock(&self.pending).remove(&correlation_id) else {
            let mut unanswered = lock(&self.unanswered);
            if let Some(i) = unanswered.iter().position(|id| *id == correlation_id) {
                unanswered.remove(i);
                debug!(
                    broker = %self.broker,
                    correlation_id,
                    "discarded a response to a request sent without expecting one"
                );
                return Ok(());
            }
            // The response stream is out of step with the requests: the connection is
            // dropped and what was in flight failed with it (retriable: a request's fate
            // is unknown, as after a cut connection).
            return Err(Failure::new(
                ErrorKind::Closed,
                format!(
                    "connection dropped: response with unknown correlation id {correlation_id}"
                ),
            ));
        };
        let mut body = frame;
        if let Err(e) = ResponseHeader::decode(&mut body, pending.header_version) {
            let failure = Failure::new(
                ErrorKind::Protocol,
                format!(
                    "undecodable {} response header (correlation id {correlation_id}): {e}",
                    pending.api_key
                ),
            );
            let _ = pending.tx.send(Err(self.error_from(&failure)));
            return Err(failure);
        }
        trace!(
            broker = %self.broker,
            api = %pending.api_key,
            correlation_id,
            size = body.len(),
            "received response"
        );
        if let Some(ms) = throttle::client_throttle_ms(pending.api_key, pending.api_version, &body)
        {
            self.throttle(tokio::time::Instant::now(), ms);
            debug!(
                broker = %self.broker,
                api = %pending.api_key,
                correlation_id,
                throttle_time_ms = ms,
                "throttled by a broker quota: holding further requests (KIP-219)"
            );
        }
        if pending.tx.send(Ok(body)).is_err() {
            debug!(
                broker = %self.broker,
                api = %pending.api_key,
                correlation_id,
                "discarded response to an abandoned request"
            );
        }
        Ok(())
    }
}

/// How many correlation ids of no-response requests are remembered.
const UNANSWERED_MEMORY: usize = 1024;

/// A request written and awaiting its response. Holds its in-flight permit until then.
struct Pending {
    api_key: ApiKey,
    api_version: i16,
    header_version: i16,
    tx: oneshot::Sender<Result<Bytes>>,
    _permit: Option<OwnedSemaphorePermit>,
}

/// A request frame: its encoded buffer and the byte strings spliced into it.
struct Frame {
    head: Bytes,
    splices: Splices,
}

/// The most pieces handed to one vectored write.
const MAX_PIECES: usize = 64;

impl Frame {
    /// Write the whole frame: one write of its buffer, or vectored writes of the buffer's
    /// pieces and the splices between them (nothing is copied into one buffer first).
    async fn write_to<W: AsyncWrite + Unpin>(&self, writer: &mut W) -> std::io::Result<()> {
        if self.splices.is_empty() {
            return writer.write_all(&self.head).await;
        }
        let mut pieces: Vec<&[u8]> = self.splices.pieces(&self.head).collect();
        let mut first = 0;
        let mut slices = Vec::with_capacity(pieces.len().min(MAX_PIECES));
        while first < pieces.len() {
            slices.clear();
            slices.extend(
                pieces[first..]
                    .iter()
                    .take(MAX_PIECES)
                    .map(|p| std::io::IoSlice::new(p)),
            );
            let mut n = writer.write_vectored(&slices).await?;
            if n == 0 {
                return Err(std::io::ErrorKind::WriteZero.into());
            }
            while n > 0 {
                let piece = pieces[first];
                if n >= piece.len() {
                    n -= piece.len();
                    first += 1;
                } else {
                    pieces[first] = &piece[n..];
                    n = 0;
                }
            }
        }
        Ok(())
    }
}

/// A frame handed from a caller to the driver.
struct Command {
    correlation_id: i32,
    frame: Frame,
    permit: Option<OwnedSemaphorePermit>,
    reply: Reply,
}

enum Reply {
    /// A response is expected, with a header of `header_version`.
    Response {
        api_key: ApiKey,
        api_version: i16,
        header_version: i16,
        tx: oneshot::Sender<Result<Bytes>>,
        /// Written even when the caller gave up before its turn (see
        /// [`Connection::queue_request`]); otherwise such a request is skipped.
        ordered: bool,
    },
    /// No response is expected; report once the frame is written.
    Written(oneshot::Sender<Result<()>>),
}

async fn drive<S>(
    stream: S,
    mut commands: mpsc::UnboundedReceiver<Command>,
    state: Arc<State>,
    max_frame_size: usize,
) where
    S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let (reader, writer) = tokio::io::split(stream);
    let outcome = tokio::select! {
        r = write_loop(writer, &mut commands, &state) => r,
        r = read_loop(reader, &state, max_frame_size) => r,
        () = state.shutdown.notified() => {
            Err(Failure::new(ErrorKind::Closed, "connection closed by client"))
        }
    };
    let failure = match outcome {
        Ok(()) => Failure::new(ErrorKind::Closed, "connection dropped by client"),
        Err(f) => f,
    };
    match failure.kind {
        ErrorKind::Closed => {
            debug!(broker = %state.broker, reason = %failure.message, "connection ended")
        }
        _ => warn!(broker = %state.broker, reason = %failure.message, "connection failed"),
    }
    state.fail(failure);
    // Requests still queued fail when their reply senders drop with `commands`.
    commands.close();
}

async fn write_loop<W: AsyncWrite + Unpin>(
    mut writer: W,
    commands: &mut mpsc::UnboundedReceiver<Command>,
    state: &State,
) -> Result<(), Failure> {
    while let Some(first) = commands.recv().await {
        let mut next = Some(first);
        while let Some(command) = next {
            if state.throttled_until().is_some() {
                writer.flush().await.map_err(write_failure)?;
                while let Some(until) = state.throttled_until() {
                    tokio::time::sleep_until(until).await;
                }
                trace!(broker = %state.broker, "quota throttle over: writing again");
            }
            write_one(&mut writer, command, state).await?;
            next = commands.try_recv().ok();
        }
        writer.flush().await.map_err(write_failure)?;
    }
    Ok(())
}

fn write_failure(e: std::io::Error) -> Failure {
    Failure::new(io_kind(&e), format!("write failed: {e}"))
}

/// `Tls` for a TLS-level failure after the handshake (e.g. a server that demands a client
/// certificate sends its alert on the first read with TLS 1.3), else `Io`.
fn io_kind(e: &std::io::Error) -> ErrorKind {
    #[cfg(feature = "tls")]
    if e.get_ref()
        .is_some_and(|inner| inner.is::<tokio_rustls::rustls::Error>())
    {
        return ErrorKind::Tls;
    }
    let _ = e;
    ErrorKind::Io
}

async fn write_one<W: AsyncWrite + Unpin>(
    writer: &mut W,
    command: Command,
    state: &State,
) -> Result<(), Failure> {
    let Command {
        correlation_id,
        frame,
        permit,
        reply,
    } = command;
    match reply {
        Reply::Response {
            api_key,
            api_version,
            header_version,
            tx,
            ordered,
        } => {
            if tx.is_closed() && !ordered {
                trace!(broker = %state.broker, api = %api_key, correlation_id, "skipped abandoned request");
                return Ok(());
            }
            {
                let mut pending = lock(&state.pending);
                if pending.contains_key(&correlation_id) {
                    // Only after 2^31 requests with one still unanswered.
                    let _ = tx.send(Err(Error::protocol(format!(
                        "correlation id {correlation_id} is still in flight"
                    ))
                    .with_broker(state.broker.clone())));
                    return Ok(());
                }
                pending.insert(
                    correlation_id,
                    Pending {
                        api_key,
                        api_version,
                        header_version,
                        tx,
                        _permit: permit,
                    },
                );
            }
            frame.write_to(writer).await.map_err(write_failure)?;
            state.recycle(frame.head);
        }
        Reply::Written(tx) => {
            let written = match frame.write_to(writer).await {
                Ok(()) => writer.flush().await,
                Err(e) => Err(e),
            };
            state.recycle(frame.head);
            drop(permit);
            match written {
                Ok(()) => {
                    let mut unanswered = lock(&state.unanswered);
                    if unanswered.len() >= UNANSWERED_MEMORY {
                        unanswered.pop_front();
                    }
                    unanswered.push_back(correlation_id);
                    drop(unanswered);
                    let _ = tx.send(Ok(()));
                }
                Err(e) => {
                    let failure = write_failure(e);
                    let _ = tx.send(Err(state.error_from(&failure)));
                    return Err(failure);
                }
            }
        }
    }
    Ok(())
}

async fn read_loop<R: AsyncRead + Unpin>(
    mut reader: R,
    state: &State,
    max_frame_size: usize,
) -> Result<(), Failure> {
    let mut buf = BytesMut::with_capacity(8 * 1024);
    // Large frames (fetch responses) are read into buffers reused from frame to frame:
    // a fresh multi-megabyte buffer per response costs a page fault per 4 KiB page.
    let pool = BufPool::for_fetches();
    loop {
        while buf.len() < 4 {
            read_more(&mut reader, &mut buf).await?;
        }
        let size = i32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]);
        let size = match usize::try_from(size) {
            Ok(s) if (4..=max_frame_size).contains(&s) => s,
            _ => {
                return Err(Failure::new(
                    ErrorKind::Protocol,
                    format!("invalid response frame size {size} (allowed 4..={max_frame_size})"),
                ))
            }
        };
        let total = 4 + size;
        if size >= POOLED_FRAME_MIN {
            buf.advance(4);
            let frame = read_pooled_frame(&mut reader, &mut buf, size, &pool).await?;
            state.dispatch(frame)?;
            continue;
        }
        if buf.len() < total {
            buf.reserve(total - buf.len());
        }
        while buf.len() < total {
            read_more(&mut reader, &mut buf).await?;
        }
        buf.advance(4);
        let frame = buf.split_to(size).freeze();
        state.dispatch(frame)?;
    }
}

/// Frames from this size on are read into a pooled buffer (see [`read_pooled_frame`]).
const POOLED_FRAME_MIN: usize = 64 * 1024;

/// Read the rest of a `size`-byte frame whose first bytes (if any) are in `buf` into a
/// buffer of `pool`, which gets it back once the last slice of the frame is dropped.
async fn read_pooled_frame<R: AsyncRead + Unpin>(
    reader: &mut R,
    buf: &mut BytesMut,
    size: usize,
    pool: &Arc<BufPool>,
) -> Result<Bytes, Failure> {
    let mut frame = pool.take_rounded(size);
    let have = buf.len().min(size);
    frame.extend_from_slice(&buf[..have]);
    buf.advance(have);
    while frame.len() < size {
        let want = size - frame.len();
        let n = reader
            .read_buf(&mut (&mut frame).limit(want))
            .await
            .map_err(|e| Failure::new(io_kind(&e), format!("read failed: {e}")))?;
        if n == 0 {
            return Err(Failure::new(
                ErrorKind::Closed,
                "connection closed by peer in the middle of a response",
            ));
        }
    }
    Ok(pool.freeze(frame))
}

async fn read_more<R: AsyncRead + Unpin>(
    reader: &mut R,
    buf: &mut BytesMut,
) -> Result<(), Failure> {
    if buf.capacity() == buf.len() {
        buf.reserve(8 * 1024);
    }
    let n = reader
        .read_buf(buf)
        .await
        .map_err(|e| Failure::new(io_kind(&e), format!("read failed: {e}")))?;
    if n == 0 {
        let message = if buf.is_empty() {
            "connection closed by peer"
        } else {
            "connection closed by peer in the middle of a response"
        };
        return Err(Failure::new(ErrorKind::Closed, message));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::messages::ApiVersionRange;
    use crate::protocol::Encode;
    use tokio::io::DuplexStream;

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
        let batch = |n: usize, seed: u8| -> Bytes {
            (0..n).map(|i| (i as u8).wrapping_mul(seed)).collect()
        };
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

    async fn garbage_fails_all_with(
        garbage: &[u8],
        max_frame_size: usize,
        kind: ErrorKind,
    ) -> Error {
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
}
