//! Opening the byte stream of a broker connection: [`Dialer`], the dial hook every
//! broker connection goes through (bootstrap, partition leaders, group and transaction
//! coordinators), with its two extension points — an address map applied to every
//! `host:port` before dialing (for brokers that advertise addresses this client cannot
//! reach) and a [`Connector`] that opens the stream (a tunnel, an in-process transport…)
//! — and the built-in SOCKS5 proxy client ([`Socks5Proxy`], RFC 1928 with the RFC 1929
//! username/password method).
//!
//! TLS, when configured, runs over whatever stream the dialer returns, and checks the
//! broker certificate against the host of the address *before* mapping (the name the
//! broker advertises, which is the one its certificate carries).
//!
//! References: librdkafka's `connect_cb` / `resolve_cb`, kafka-go's `Dialer.Resolver`,
//! RFC 1928 (SOCKS Protocol Version 5), RFC 1929 (Username/Password Authentication).

use std::collections::HashMap;
use std::fmt;
use std::io;
use std::sync::Arc;

use futures::future::BoxFuture;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tracing::debug;

use crate::error::{Error, ErrorKind, Result};

/// A byte stream to a broker, as a [`Connector`] returns it: anything readable and
/// writable that can move between tasks (a `TcpStream`, one half of a tunnel, a
/// `tokio::io::DuplexStream`…). Implemented for every such type.
pub trait BrokerStream: AsyncRead + AsyncWrite + Send + Unpin {}

impl<T: AsyncRead + AsyncWrite + Send + Unpin + ?Sized> BrokerStream for T {}

/// A boxed [`BrokerStream`]: what a [`Connector`] returns.
pub type BoxedBrokerStream = Box<dyn BrokerStream>;

/// Opens the byte stream to a broker: the user-supplied part of a [`Dialer`].
///
/// `addr` is the broker's `host:port` after the dialer's address map. The stream is
/// returned raw: TLS (if configured) and the Kafka handshake run over it afterwards. The
/// whole call counts against [`ConnectionConfig::connect_timeout`](super::ConnectionConfig::connect_timeout).
///
/// A connector that opens plain TCP connections and counts them:
///
/// ```
/// use std::sync::atomic::{AtomicUsize, Ordering};
/// use std::sync::Arc;
/// use futures::future::BoxFuture;
/// use kafkapipe::conn::{BoxedBrokerStream, Connector, Dialer};
///
/// #[derive(Default)]
/// struct Counting(AtomicUsize);
///
/// impl Connector for Counting {
///     fn connect<'a>(&'a self, addr: &'a str) -> BoxFuture<'a, std::io::Result<BoxedBrokerStream>> {
///         Box::pin(async move {
///             self.0.fetch_add(1, Ordering::Relaxed);
///             let tcp = tokio::net::TcpStream::connect(addr).await?;
///             tcp.set_nodelay(true)?;
///             Ok(Box::new(tcp) as BoxedBrokerStream)
///         })
///     }
/// }
///
/// let counting = Arc::new(Counting::default());
/// let dialer = Dialer::new().with_connector(counting.clone());
/// assert_eq!(counting.0.load(Ordering::Relaxed), 0);
/// ```
pub trait Connector: Send + Sync {
    /// Open a stream to `addr` (`host:port`).
    ///
    /// # Errors
    ///
    /// Any I/O error; it fails this connection attempt with an `Io` error naming the
    /// broker (retriable: the client dials again later).
    fn connect<'a>(&'a self, addr: &'a str) -> BoxFuture<'a, io::Result<BoxedBrokerStream>>;
}

type AddressMapFn = dyn Fn(&str) -> Option<String> + Send + Sync;

/// How broker connections are opened: the dial hook of [`ConnectionConfig::dialer`](super::ConnectionConfig::dialer)
/// (also on `ReaderConfig`, `WriterConfig` and `Properties` through `socks5.proxy`).
///
/// Every connection the client makes — to the bootstrap servers, to partition leaders,
/// to group and transaction coordinators — goes through it: first the address map turns
/// the `host:port` to dial into another (addresses it does not map are dialed as they
/// are), then the stream is opened by, in order of precedence, a custom [`Connector`],
/// a [`Socks5Proxy`], or a direct TCP connection (`TCP_NODELAY` on) — the default.
/// Cloning is cheap (shared `Arc`s).
///
/// Reaching brokers that advertise in-cluster names through local port forwards:
///
/// ```no_run
/// use kafkapipe::conn::Dialer;
/// use kafkapipe::writer::{Writer, WriterConfig};
///
/// # async fn demo() -> kafkapipe::Result<()> {
/// let dialer = Dialer::new()
///     .map_address("kafka-0.kafka.svc:9092", "127.0.0.1:19092")
///     .map_address("kafka-1.kafka.svc:9092", "127.0.0.1:19093");
/// let writer = Writer::new(WriterConfig::new(["127.0.0.1:19092"]).topic("events").dialer(dialer))?;
/// # Ok(()) }
/// ```
///
/// Every connection through a SOCKS5 proxy:
///
/// ```
/// use kafkapipe::conn::{Dialer, Socks5Proxy};
/// let dialer = Dialer::new()
///     .with_socks5_proxy(Socks5Proxy::new("proxy.example.com:1080").with_credentials("alice", "secret"));
/// assert!(format!("{dialer:?}").contains("proxy.example.com:1080"));
/// assert!(!format!("{dialer:?}").contains("secret"));
/// ```
#[derive(Clone, Default)]
pub struct Dialer {
    addresses: Arc<HashMap<String, String>>,
    resolver: Option<Arc<AddressMapFn>>,
    via: Via,
}

#[derive(Clone, Default)]
enum Via {
    #[default]
    Tcp,
    Socks5(Socks5Proxy),
    Connector(Arc<dyn Connector>),
}

impl fmt::Debug for Dialer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("Dialer");
        if !self.addresses.is_empty() {
            d.field("addresses", &self.addresses);
        }
        if self.resolver.is_some() {
            d.field("resolver", &"custom");
        }
        match &self.via {
            Via::Tcp => d.field("via", &"tcp"),
            Via::Socks5(p) => d.field("via", p),
            Via::Connector(_) => d.field("via", &"custom connector"),
        };
        d.finish()
    }
}

impl PartialEq for Dialer {
    /// Equal when the address maps are equal and custom hooks are the same `Arc`s.
    fn eq(&self, other: &Self) -> bool {
        let resolver_eq = match (&self.resolver, &other.resolver) {
            (None, None) => true,
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            _ => false,
        };
        let via_eq = match (&self.via, &other.via) {
            (Via::Tcp, Via::Tcp) => true,
            (Via::Socks5(a), Via::Socks5(b)) => a == b,
            (Via::Connector(a), Via::Connector(b)) => Arc::ptr_eq(a, b),
            _ => false,
        };
        self.addresses == other.addresses && resolver_eq && via_eq
    }
}

impl Eq for Dialer {}

impl Dialer {
    /// Direct TCP connections to the addresses as given (the default).
    ///
    /// ```
    /// assert_eq!(kafkapipe::conn::Dialer::new(), kafkapipe::conn::Dialer::default());
    /// ```
    pub fn new() -> Self {
        Self::default()
    }

    /// Dial `to` whenever `from` is to be dialed (both `host:port`, compared exactly).
    /// Mappings added this way are looked up before the
    /// [`with_address_map`](Self::with_address_map) function.
    ///
    /// ```
    /// let dialer = kafkapipe::conn::Dialer::new().map_address("b-1.internal:9092", "127.0.0.1:19092");
    /// assert_eq!(dialer.resolve("b-1.internal:9092"), "127.0.0.1:19092");
    /// assert_eq!(dialer.resolve("b-2.internal:9092"), "b-2.internal:9092");
    /// ```
    pub fn map_address(mut self, from: impl Into<String>, to: impl Into<String>) -> Self {
        Arc::make_mut(&mut self.addresses).insert(from.into(), to.into());
        self
    }

    /// Map addresses with a function: given the `host:port` to dial, it returns the one
    /// to dial instead, or `None` to dial it as it is. Replaces an earlier function.
    ///
    /// ```
    /// // brokers advertise `b-N.internal:9092`; local forwards listen on 1909N
    /// let dialer = kafkapipe::conn::Dialer::new().with_address_map(|addr| {
    ///     let n = addr.strip_prefix("b-")?.strip_suffix(".internal:9092")?;
    ///     Some(format!("127.0.0.1:1909{n}"))
    /// });
    /// assert_eq!(dialer.resolve("b-3.internal:9092"), "127.0.0.1:19093");
    /// ```
    pub fn with_address_map(
        mut self,
        map: impl Fn(&str) -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        self.resolver = Some(Arc::new(map));
        self
    }

    /// Open streams with `connector` (replaces a SOCKS5 proxy set earlier).
    ///
    /// See [`Connector`] for an example.
    pub fn with_connector(mut self, connector: Arc<dyn Connector>) -> Self {
        self.via = Via::Connector(connector);
        self
    }

    /// Open every connection through the SOCKS5 proxy `proxy` (replaces a connector set
    /// earlier). See [`Socks5Proxy`].
    ///
    /// ```
    /// use kafkapipe::conn::{Dialer, Socks5Proxy};
    /// let dialer = Dialer::new().with_socks5_proxy(Socks5Proxy::new("127.0.0.1:1080"));
    /// assert_eq!(dialer.socks5_proxy().map(|p| p.addr()), Some("127.0.0.1:1080"));
    /// ```
    pub fn with_socks5_proxy(mut self, proxy: Socks5Proxy) -> Self {
        self.via = Via::Socks5(proxy);
        self
    }

    /// The SOCKS5 proxy connections go through, if one is set.
    pub fn socks5_proxy(&self) -> Option<&Socks5Proxy> {
        match &self.via {
            Via::Socks5(p) => Some(p),
            _ => None,
        }
    }

    /// The address dialed for `addr`: its mapping if it has one, else `addr` itself.
    ///
    /// ```
    /// assert_eq!(kafkapipe::conn::Dialer::new().resolve("b:9092"), "b:9092");
    /// ```
    pub fn resolve(&self, addr: &str) -> String {
        if let Some(to) = self.addresses.get(addr) {
            return to.clone();
        }
        self.resolver
            .as_ref()
            .and_then(|f| f(addr))
            .unwrap_or_else(|| addr.to_string())
    }

    /// Open the raw stream to the broker `addr`: map the address, then connect through
    /// the connector, the proxy or directly. No timeout of its own (the connection's
    /// `connect_timeout` wraps it). Errors name the broker (`addr`, and the mapped
    /// address when it differs).
    pub(crate) async fn dial(&self, addr: &str) -> Result<BoxedBrokerStream> {
        let target = self.resolve(addr);
        let via = if target == addr {
            String::new()
        } else {
            format!(" (mapped to {target})")
        };
        if !via.is_empty() {
            debug!(broker = addr, target = %target, "dialing mapped address");
        }
        let r = match &self.via {
            Via::Tcp => tcp_connect(&target)
                .await
                .map(|s| Box::new(s) as BoxedBrokerStream)
                .map_err(|e| Error::io(format!("connect failed{via}"), e)),
            Via::Connector(c) => c
                .connect(&target)
                .await
                .map_err(|e| Error::io(format!("connect failed{via} (custom connector)"), e)),
            // the proxy's errors name the target (the mapped address) themselves
            Via::Socks5(proxy) => proxy
                .connect(&target)
                .await
                .map(|s| Box::new(s) as BoxedBrokerStream),
        };
        r.map_err(|e| e.with_broker(addr))
    }
}

async fn tcp_connect(addr: &str) -> io::Result<TcpStream> {
    let tcp = TcpStream::connect(addr).await?;
    tcp.set_nodelay(true)?;
    Ok(tcp)
}

/// A SOCKS5 proxy every broker connection goes through (RFC 1928), with the
/// username/password method (RFC 1929) when credentials are set, else no authentication.
///
/// Broker host names are sent to the proxy unresolved (the `socks5h` behaviour), so the
/// proxy resolves them from inside its network. Set on a [`Dialer`] with
/// [`Dialer::with_socks5_proxy`], or with the `socks5.proxy` property
/// (`socks5://user:password@host:port`) of [`Properties`](crate::config::Properties).
///
/// Failures: a proxy that refuses the credentials is an `Authentication` error (not
/// retriable, like a broker refusing SASL credentials); a proxy that cannot reach the
/// broker (its reply code is named in the message) or cannot be reached is an `Io`
/// error (retriable).
///
/// ```
/// use kafkapipe::conn::Socks5Proxy;
/// let proxy = Socks5Proxy::new("127.0.0.1:1080").with_credentials("alice", "secret");
/// assert_eq!(proxy.addr(), "127.0.0.1:1080");
/// assert_eq!(proxy.username(), Some("alice"));
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct Socks5Proxy {
    addr: String,
    credentials: Option<(String, String)>,
}

impl fmt::Debug for Socks5Proxy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Socks5Proxy")
            .field("addr", &self.addr)
            .field("username", &self.username())
            .finish_non_exhaustive()
    }
}

const SOCKS_VERSION: u8 = 5;
const METHOD_NONE: u8 = 0x00;
const METHOD_USERPASS: u8 = 0x02;
const METHOD_REFUSED: u8 = 0xFF;

impl Socks5Proxy {
    /// The proxy at `addr` (`host:port`), without authentication.
    pub fn new(addr: impl Into<String>) -> Self {
        Socks5Proxy {
            addr: addr.into(),
            credentials: None,
        }
    }

    /// Authenticate to the proxy with `username` and `password` (RFC 1929; each 1 to
    /// 255 bytes, checked when dialing).
    pub fn with_credentials(
        mut self,
        username: impl Into<String>,
        password: impl Into<String>,
    ) -> Self {
        self.credentials = Some((username.into(), password.into()));
        self
    }

    /// The proxy's `host:port`.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// The username sent to the proxy, if any.
    pub fn username(&self) -> Option<&str> {
        self.credentials.as_ref().map(|(u, _)| u.as_str())
    }

    /// Connect to the proxy and ask it for a connection to `target` (`host:port`).
    async fn connect(&self, target: &str) -> Result<TcpStream> {
        let (host, port) = split_host_port(target).ok_or_else(|| {
            Error::config(format!(
                "cannot dial {target:?} through the SOCKS5 proxy: not a host:port address"
            ))
        })?;
        let mut tcp = tcp_connect(&self.addr)
            .await
            .map_err(|e| Error::io(format!("cannot reach the SOCKS5 proxy {}", self.addr), e))?;
        self.handshake(&mut tcp, host, port).await?;
        debug!(proxy = %self.addr, target, "SOCKS5 tunnel established");
        Ok(tcp)
    }

    async fn handshake<S: AsyncRead + AsyncWrite + Unpin>(
        &self,
        s: &mut S,
        host: &str,
        port: u16,
    ) -> Result<()> {
        let proxy = &self.addr;
        let io_err = |e: io::Error| Error::io(format!("SOCKS5 proxy {proxy} exchange failed"), e);
        let protocol =
            |m: String| Error::new(ErrorKind::Protocol, format!("SOCKS5 proxy {proxy}: {m}"));
        // method selection (RFC 1928 §3)
        let greeting: &[u8] = if self.credentials.is_some() {
            &[SOCKS_VERSION, 2, METHOD_NONE, METHOD_USERPASS]
        } else {
            &[SOCKS_VERSION, 1, METHOD_NONE]
        };
        s.write_all(greeting).await.map_err(io_err)?;
        let mut reply = [0u8; 2];
        s.read_exact(&mut reply).await.map_err(io_err)?;
        if reply[0] != SOCKS_VERSION {
            return Err(protocol(format!(
                "answered version {} to a SOCKS5 greeting",
                reply[0]
            )));
        }
        match (reply[1], &self.credentials) {
            (METHOD_NONE, _) => {}
            (METHOD_USERPASS, Some((user, password))) => {
                // username/password sub-negotiation (RFC 1929 §2)
                let (Ok(ulen), Ok(plen)) = (u8::try_from(user.len()), u8::try_from(password.len()))
                else {
                    return Err(Error::config(
                        "SOCKS5 username and password must each be at most 255 bytes",
                    ));
                };
                if ulen == 0 || plen == 0 {
                    return Err(Error::config(
                        "SOCKS5 username and password must not be empty",
                    ));
                }
                let mut m = Vec::with_capacity(3 + user.len() + password.len());
                m.extend_from_slice(&[1, ulen]);
                m.extend_from_slice(user.as_bytes());
                m.push(plen);
                m.extend_from_slice(password.as_bytes());
                s.write_all(&m).await.map_err(io_err)?;
                let mut status = [0u8; 2];
                s.read_exact(&mut status).await.map_err(io_err)?;
                if status[1] != 0 {
                    return Err(Error::new(
                        ErrorKind::Authentication,
                        format!(
                            "SOCKS5 proxy {proxy} rejected the username/password of user {user:?}"
                        ),
                    ));
                }
            }
            (METHOD_USERPASS, None) => {
                return Err(Error::new(
                    ErrorKind::Authentication,
                    format!(
                        "SOCKS5 proxy {proxy} requires a username and password; none is configured"
                    ),
                ))
            }
            (METHOD_REFUSED, _) => {
                return Err(Error::new(
                    ErrorKind::Authentication,
                    format!(
                    "SOCKS5 proxy {proxy} accepts none of the offered authentication methods ({})",
                    if self.credentials.is_some() {
                        "none, username/password"
                    } else {
                        "none; it may require a username and password"
                    }
                ),
                ))
            }
            (m, _) => {
                return Err(protocol(format!(
                    "chose authentication method {m:#04x}, which was not offered"
                )))
            }
        }
        // CONNECT request (RFC 1928 §4): IPv4, IPv6 or a domain name left for the proxy
        let mut req = vec![SOCKS_VERSION, 1, 0];
        match host.parse::<std::net::IpAddr>() {
            Ok(std::net::IpAddr::V4(ip)) => {
                req.push(1);
                req.extend_from_slice(&ip.octets());
            }
            Ok(std::net::IpAddr::V6(ip)) => {
                req.push(4);
                req.extend_from_slice(&ip.octets());
            }
            Err(_) => {
                let Ok(len) = u8::try_from(host.len()) else {
                    return Err(Error::config(format!(
                        "host name {host:?} is too long for SOCKS5 (at most 255 bytes)"
                    )));
                };
                req.extend_from_slice(&[3, len]);
                req.extend_from_slice(host.as_bytes());
            }
        }
        req.extend_from_slice(&port.to_be_bytes());
        s.write_all(&req).await.map_err(io_err)?;
        let mut head = [0u8; 4];
        s.read_exact(&mut head).await.map_err(io_err)?;
        if head[0] != SOCKS_VERSION {
            return Err(protocol(format!(
                "answered version {} to a CONNECT request",
                head[0]
            )));
        }
        if head[1] != 0 {
            let reason = match head[1] {
                1 => "general SOCKS server failure",
                2 => "connection not allowed by ruleset",
                3 => "network unreachable",
                4 => "host unreachable",
                5 => "connection refused",
                6 => "TTL expired",
                7 => "command not supported",
                8 => "address type not supported",
                _ => "unknown reply code",
            };
            return Err(Error::new(
                ErrorKind::Io,
                format!(
                    "SOCKS5 proxy {proxy} could not connect to {host}:{port}: {reason} (reply {})",
                    head[1]
                ),
            ));
        }
        // skip the bound address and port
        let skip = match head[3] {
            1 => 4 + 2,
            4 => 16 + 2,
            3 => {
                let mut len = [0u8; 1];
                s.read_exact(&mut len).await.map_err(io_err)?;
                usize::from(len[0]) + 2
            }
            t => return Err(protocol(format!("answered with unknown address type {t}"))),
        };
        let mut bound = [0u8; 258];
        s.read_exact(&mut bound[..skip]).await.map_err(io_err)?;
        Ok(())
    }
}

/// Split `host:port` (`[v6]:port` for IPv6 literals).
fn split_host_port(addr: &str) -> Option<(&str, u16)> {
    let (host, port) = addr.rsplit_once(':')?;
    let port = port.parse().ok()?;
    let host = match host.strip_prefix('[') {
        Some(h) => h.strip_suffix(']')?,
        None => host,
    };
    (!host.is_empty()).then_some((host, port))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn host_port_split() {
        assert_eq!(split_host_port("b:9092"), Some(("b", 9092)));
        assert_eq!(split_host_port("[::1]:9092"), Some(("::1", 9092)));
        assert_eq!(split_host_port("10.0.0.1:1"), Some(("10.0.0.1", 1)));
        assert_eq!(split_host_port("b"), None);
        assert_eq!(split_host_port(":9092"), None);
        assert_eq!(split_host_port("b:x"), None);
    }

    #[test]
    fn map_then_function() {
        let d = Dialer::new()
            .map_address("a:1", "x:1")
            .with_address_map(|a| (a == "a:1" || a == "b:1").then(|| "y:1".to_string()));
        assert_eq!(d.resolve("a:1"), "x:1");
        assert_eq!(d.resolve("b:1"), "y:1");
        assert_eq!(d.resolve("c:1"), "c:1");
    }

    /// Runs the client handshake against `server`, a scripted proxy.
    async fn handshake_with<F, Fut>(proxy: Socks5Proxy, target: &str, server: F) -> Result<()>
    where
        F: FnOnce(tokio::io::DuplexStream) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        let (mut client, srv) = tokio::io::duplex(1024);
        let task = tokio::spawn(server(srv));
        let (host, port) = split_host_port(target).unwrap();
        let r = proxy.handshake(&mut client, host, port).await;
        drop(client);
        task.await.unwrap();
        r
    }

    #[tokio::test]
    async fn userpass_connect_by_domain_name() {
        let proxy = Socks5Proxy::new("p:1080").with_credentials("alice", "pw");
        handshake_with(proxy, "kafka-1.internal:9092", |mut s| async move {
            let mut greet = [0u8; 4];
            s.read_exact(&mut greet).await.unwrap();
            assert_eq!(greet, [5, 2, 0, 2]);
            s.write_all(&[5, 2]).await.unwrap();
            let mut auth = [0u8; 1 + 1 + 5 + 1 + 2];
            s.read_exact(&mut auth).await.unwrap();
            assert_eq!(&auth, b"\x01\x05alice\x02pw");
            s.write_all(&[1, 0]).await.unwrap();
            let mut req = vec![0u8; 5 + 16 + 2];
            s.read_exact(&mut req).await.unwrap();
            assert_eq!(&req[..5], &[5, 1, 0, 3, 16]);
            assert_eq!(&req[5..21], b"kafka-1.internal");
            assert_eq!(&req[21..], &9092u16.to_be_bytes());
            // bound address as a domain name, then the port
            s.write_all(&[5, 0, 0, 3, 2, b'h', b'x', 0, 1])
                .await
                .unwrap();
        })
        .await
        .unwrap();
    }

    #[tokio::test]
    async fn refusals_are_named() {
        // wrong password
        let err = handshake_with(
            Socks5Proxy::new("p:1080").with_credentials("alice", "bad"),
            "10.0.0.1:9092",
            |mut s| async move {
                let mut buf = [0u8; 64];
                let _ = s.read(&mut buf).await;
                s.write_all(&[5, 2]).await.unwrap();
                let _ = s.read(&mut buf).await;
                s.write_all(&[1, 1]).await.unwrap();
            },
        )
        .await
        .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Authentication);
        assert!(
            err.to_string().contains("rejected the username/password"),
            "{err}"
        );

        // no acceptable method
        let err = handshake_with(
            Socks5Proxy::new("p:1080"),
            "10.0.0.1:9092",
            |mut s| async move {
                let mut buf = [0u8; 3];
                s.read_exact(&mut buf).await.unwrap();
                s.write_all(&[5, 0xFF]).await.unwrap();
            },
        )
        .await
        .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Authentication);
        assert!(err.to_string().contains("none of the offered"), "{err}");

        // the proxy cannot reach the broker: retriable, reply code named
        let err = handshake_with(
            Socks5Proxy::new("p:1080"),
            "[::1]:9092",
            |mut s| async move {
                let mut buf = [0u8; 3];
                s.read_exact(&mut buf).await.unwrap();
                s.write_all(&[5, 0]).await.unwrap();
                let mut req = [0u8; 4 + 16 + 2];
                s.read_exact(&mut req).await.unwrap();
                assert_eq!(req[3], 4, "IPv6 address type");
                s.write_all(&[5, 5, 0, 1, 0, 0, 0, 0, 0, 0]).await.unwrap();
            },
        )
        .await
        .unwrap_err();
        assert!(err.is_retriable());
        assert!(err.to_string().contains("connection refused"), "{err}");

        // not a SOCKS5 server
        let err = handshake_with(Socks5Proxy::new("p:1080"), "b:1", |mut s| async move {
            let mut buf = [0u8; 3];
            s.read_exact(&mut buf).await.unwrap();
            s.write_all(b"HTTP/1.1 400\r\n").await.unwrap();
        })
        .await
        .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Protocol, "{err}");
    }
}
