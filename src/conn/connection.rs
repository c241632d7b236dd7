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
//!
//! # Files
//!
//! - this file: [`ConnectionConfig`], the [`Connection`] handle and its life (connect,
//!   run over a stream, close, the accessors);
//! - `versions.rs`: the ApiVersions handshake and the choice of each request's version;
//! - `requests.rs`: the caller side of a request (encode the frame, take a slot, stamp a
//!   correlation id, hand it to the driver, await the answer within the timeout);
//! - `driver.rs`: the driver task and the state it shares with the handles (the
//!   in-flight map, the reads and writes of frames, failures);
//! - `throttle.rs`: the KIP-219 quota throttle (its window, and timeouts that do not
//!   count the throttled time);
//! - `auth.rs`: SASL authentication and KIP-368 re-authentication.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::AtomicI32;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{mpsc, Notify, Semaphore};
use tokio::task::JoinHandle;
use tracing::{debug, Instrument};

use crate::error::{Error, ErrorKind, Result};
use crate::protocol::messages::ApiVersionsResponse;
use crate::sasl::Mechanism;

use super::Dialer;

mod auth;
mod driver;
mod requests;
#[cfg(test)]
mod tests;
mod throttle;
mod versions;

use driver::{drive, Command, Failure, State};
use throttle::Throttle;

/// Settings of one [`Connection`], and of every broker connection a
/// [`Reader`](crate::reader::Reader), [`Writer`](crate::writer::Writer),
/// [`ShareReader`](crate::share::ShareReader) or [`Cluster`](crate::cluster::Cluster)
/// opens (their configs embed one as `connection`).
///
/// Built with chained setters from [`ConnectionConfig::new`] (the defaults); the fields
/// are public for reading and assignment. The struct is `#[non_exhaustive]`, so new
/// settings can be added without breaking callers: build it with the setters (or assign
/// fields of a default one), not with a struct literal.
///
/// ```
/// use std::time::Duration;
/// use kafkapipe::conn::ConnectionConfig;
/// let config = ConnectionConfig::new()
///     .client_id("my-app")
///     .request_timeout(Duration::from_secs(5));
/// assert_eq!(config.max_in_flight, 5);
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
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
    /// let config = ConnectionConfig::new()
    ///     .dialer(Dialer::new().with_socks5_proxy(Socks5Proxy::new("127.0.0.1:1080")));
    /// assert!(config.dialer.socks5_proxy().is_some());
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
    /// The defaults (the same as [`ConnectionConfig::default`]).
    ///
    /// ```
    /// use std::time::Duration;
    /// let config = kafkapipe::conn::ConnectionConfig::new();
    /// assert_eq!(config.client_id, "kafkapipe");
    /// assert_eq!(config.request_timeout, Duration::from_secs(30));
    /// ```
    pub fn new() -> Self {
        Self::default()
    }

    /// Set [`ConnectionConfig::client_id`].
    ///
    /// ```
    /// let config = kafkapipe::conn::ConnectionConfig::new().client_id("billing");
    /// assert_eq!(config.client_id, "billing");
    /// ```
    pub fn client_id(mut self, id: impl Into<String>) -> Self {
        self.client_id = id.into();
        self
    }

    /// Set [`ConnectionConfig::connect_timeout`].
    ///
    /// ```
    /// use std::time::Duration;
    /// let config = kafkapipe::conn::ConnectionConfig::new().connect_timeout(Duration::from_secs(3));
    /// assert_eq!(config.connect_timeout, Duration::from_secs(3));
    /// ```
    pub fn connect_timeout(mut self, d: Duration) -> Self {
        self.connect_timeout = d;
        self
    }

    /// Set [`ConnectionConfig::request_timeout`].
    ///
    /// ```
    /// use std::time::Duration;
    /// let config = kafkapipe::conn::ConnectionConfig::new().request_timeout(Duration::from_secs(5));
    /// assert_eq!(config.request_timeout, Duration::from_secs(5));
    /// ```
    pub fn request_timeout(mut self, d: Duration) -> Self {
        self.request_timeout = d;
        self
    }

    /// Set [`ConnectionConfig::max_in_flight`] (at least 1; checked when connecting).
    ///
    /// ```
    /// let config = kafkapipe::conn::ConnectionConfig::new().max_in_flight(1);
    /// assert_eq!(config.max_in_flight, 1);
    /// ```
    pub fn max_in_flight(mut self, n: usize) -> Self {
        self.max_in_flight = n;
        self
    }

    /// Set [`ConnectionConfig::max_frame_size`] (bytes, at least 4; checked when
    /// connecting).
    ///
    /// ```
    /// let config = kafkapipe::conn::ConnectionConfig::new().max_frame_size(1 << 20);
    /// assert_eq!(config.max_frame_size, 1 << 20);
    /// ```
    pub fn max_frame_size(mut self, n: usize) -> Self {
        self.max_frame_size = n;
        self
    }

    /// Set [`ConnectionConfig::tls`] to `tls`.
    ///
    /// ```no_run
    /// # fn demo() -> kafkapipe::Result<()> {
    /// use kafkapipe::conn::ConnectionConfig;
    /// use kafkapipe::tls::TlsConfig;
    /// let config = ConnectionConfig::new().tls(TlsConfig::builder().ca_file("ca.pem")?.build()?);
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "tls")]
    pub fn tls(mut self, tls: crate::tls::TlsConfig) -> Self {
        self.tls = Some(tls);
        self
    }

    /// Set [`ConnectionConfig::sasl`] to `mechanism` (to share one mechanism already in
    /// an `Arc`, assign the field: `config.sasl = Some(arc)`).
    ///
    /// ```
    /// use kafkapipe::conn::ConnectionConfig;
    /// use kafkapipe::sasl::Scram;
    /// let config = ConnectionConfig::new().sasl(Scram::sha512("alice", "secret"));
    /// assert_eq!(config.sasl.as_ref().map(|m| m.name()), Some("SCRAM-SHA-512"));
    /// assert!(!format!("{config:?}").contains("secret"));
    /// ```
    pub fn sasl(mut self, mechanism: impl Mechanism + 'static) -> Self {
        self.sasl = Some(Arc::new(mechanism));
        self
    }

    /// Set [`ConnectionConfig::dialer`].
    ///
    /// ```
    /// use kafkapipe::conn::{ConnectionConfig, Dialer};
    /// let config = ConnectionConfig::new().dialer(Dialer::new().map_address("kafka-0:9092", "127.0.0.1:19092"));
    /// # let _ = config;
    /// ```
    pub fn dialer(mut self, dialer: Dialer) -> Self {
        self.dialer = dialer;
        self
    }

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

    fn err(&self, e: Error) -> Error {
        if e.broker().is_some() {
            e
        } else {
            e.with_broker(self.shared.broker.clone())
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}
