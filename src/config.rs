//! Client settings by their Java / librdkafka property names: [`Properties`] turns a map
//! such as `bootstrap.servers`, `security.protocol`, `sasl.jaas.config`, `ssl.*`,
//! `group.id`, `acks`, `linger.ms` into the [`ConnectionConfig`], [`ReaderConfig`],
//! [`WriterConfig`] and [`Admin`] of this crate, so that property maps passed through by
//! connector frameworks, and `client.properties` files, work unchanged. The `kafkapipe`
//! command line tool's `-X KEY=VALUE` goes through this one parser.
//!
//! Unknown keys and bad values are errors naming the key. A few keys are known and
//! ignored on purpose ([`IGNORED_KEYS`], each with the reason); every key that is read is
//! listed in [`KEYS`] with what it sets.
//!
//! ```no_run
//! use kafkapipe::config::Properties;
//! use kafkapipe::reader::Reader;
//! use kafkapipe::writer::Writer;
//!
//! # async fn demo() -> kafkapipe::Result<()> {
//! let props = Properties::from_pairs([
//!     ("bootstrap.servers", "pkc-12345.eu-west-1.aws.confluent.cloud:9092"),
//!     ("security.protocol", "SASL_SSL"),
//!     ("sasl.mechanism", "PLAIN"),
//!     ("sasl.username", "API_KEY"),
//!     ("sasl.password", "API_SECRET"),
//!     ("group.id", "billing"),
//!     ("auto.offset.reset", "earliest"),
//!     ("acks", "all"),
//! ])?;
//! let reader = Reader::new(props.reader_config()?.topic("invoices")).await?;
//! let writer = Writer::new(props.writer_config()?.topic("receipts"))?;
//! # Ok(()) }
//! ```
//!
//! TLS trusts the system roots unless a CA or truststore is given (see [`crate::tls`]).
//! SASL: `PLAIN` and `SCRAM-SHA-256/512` (feature `scram`) from `sasl.username` /
//! `sasl.password` or from a `sasl.jaas.config` with `PlainLoginModule` or
//! `ScramLoginModule`; `GSSAPI` (Kerberos, feature `gssapi`) from
//! `sasl.kerberos.service.name`, `sasl.kerberos.keytab` and `sasl.kerberos.principal`
//! (librdkafka) or a `sasl.jaas.config` with `Krb5LoginModule` (`useKeyTab=true`,
//! `keyTab`, `principal`, `serviceName`; Java); `OAUTHBEARER` with OIDC client credentials (KIP-768, feature
//! `oidc`) from librdkafka's `sasl.oauthbearer.method=oidc`,
//! `sasl.oauthbearer.token.endpoint.url`, `sasl.oauthbearer.client.id`,
//! `sasl.oauthbearer.client.secret`, `sasl.oauthbearer.scope`, or from Java's
//! `sasl.oauthbearer.token.endpoint.url` with an `OAuthBearerLoginModule` JAAS entry
//! carrying `clientId`, `clientSecret` (and `scope`, `extension_NAME`); other mechanisms
//! are set in code through [`ConnectionConfig::sasl`].
//!
//! `socks5.proxy` (a kafkapipe key: neither the Java client nor librdkafka has one)
//! sends every broker connection through a SOCKS5 proxy, `socks5://user:password@host:port`
//! (see [`Socks5Proxy`](crate::conn::Socks5Proxy)).
//!
//! ```
//! # #[cfg(feature = "oidc")] {
//! use kafkapipe::config::Properties;
//! let props = Properties::from_pairs([
//!     ("bootstrap.servers", "broker:9093"),
//!     ("security.protocol", "SASL_SSL"),
//!     ("sasl.mechanism", "OAUTHBEARER"),
//!     ("sasl.oauthbearer.method", "oidc"),
//!     ("sasl.oauthbearer.token.endpoint.url", "https://idp.example.com/oauth2/token"),
//!     ("sasl.oauthbearer.client.id", "my-client"),
//!     ("sasl.oauthbearer.client.secret", "my-secret"),
//!     ("sasl.oauthbearer.scope", "kafka"),
//!     ("socks5.proxy", "socks5://proxy.example.com:1080"),
//! ])?;
//! assert_eq!(props.connection_config().sasl.unwrap().name(), "OAUTHBEARER");
//! # }
//! # Ok::<(), kafkapipe::Error>(())
//! ```

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::admin::Admin;
use crate::cluster::Cluster;
use crate::compression::Compression;
use crate::conn::{ConnectionConfig, FetchOptions, IsolationLevel, RequiredAcks};
use crate::error::{Error, Result};
use crate::group::{CommitMode, GroupProtocol};
use crate::reader::{OffsetReset, ReaderConfig, StartOffset};
use crate::sasl::Mechanism;
use crate::writer::WriterConfig;

/// Every key [`Properties`] reads, with what it sets (the CLI's `-X list` prints this).
/// Aliases are listed beside the name they stand for.
pub const KEYS: &[(&str, &str)] = &[
    ("bootstrap.servers", "bootstrap brokers, host:port,... (alias metadata.broker.list)"),
    ("client.id", "client id sent with every request (default kafkapipe)"),
    ("security.protocol", "plaintext | ssl | sasl_plaintext | sasl_ssl (default plaintext)"),
    ("sasl.mechanism", "PLAIN | SCRAM-SHA-256 | SCRAM-SHA-512 | GSSAPI (alias sasl.mechanisms; default PLAIN)"),
    ("sasl.username", "SASL user name"),
    ("sasl.password", "SASL password"),
    ("sasl.jaas.config", "PlainLoginModule or ScramLoginModule with username and password; OAuthBearerLoginModule with clientId, clientSecret, scope, extension_NAME; Krb5LoginModule with useKeyTab, keyTab, principal (GSSAPI)"),
    ("sasl.oauthbearer.method", "oidc: OAUTHBEARER tokens from sasl.oauthbearer.token.endpoint.url with client credentials (feature oidc)"),
    ("sasl.oauthbearer.token.endpoint.url", "OAUTHBEARER (feature oidc): the OIDC/OAuth 2 token endpoint (KIP-768)"),
    ("sasl.oauthbearer.client.id", "OAUTHBEARER client id (alias sasl.oauthbearer.client.credentials.client.id)"),
    ("sasl.oauthbearer.client.secret", "OAUTHBEARER client secret (alias sasl.oauthbearer.client.credentials.client.secret)"),
    ("sasl.oauthbearer.scope", "OAUTHBEARER scope requested from the token endpoint"),
    ("sasl.oauthbearer.extensions", "OAUTHBEARER SASL extensions, key=value,..."),
    ("sasl.login.callback.handler.class", "Java: OAuthBearerLoginCallbackHandler (built in: the OIDC client credentials flow)"),
    ("sasl.kerberos.service.name", "GSSAPI: the brokers' Kerberos service name (default kafka)"),
    ("sasl.kerberos.keytab", "GSSAPI: the client's keytab (default: the ticket cache or KRB5_CLIENT_KTNAME)"),
    ("sasl.kerberos.principal", "GSSAPI: the client principal (default: the keytab's or ticket cache's)"),
    ("ssl.ca.location", "PEM file of the CA certificates to trust (default: the system roots; `probe`: the system roots)"),
    ("ssl.ca.pem", "the CA certificates to trust, as PEM text"),
    ("ssl.truststore.location", "truststore file to trust: PEM or PKCS#12 (JKS: convert it)"),
    ("ssl.truststore.password", "truststore password"),
    ("ssl.truststore.type", "PKCS12 | PEM (checked against the file; JKS is refused)"),
    ("ssl.truststore.certificates", "the CA certificates to trust, as PEM text (Java, type PEM)"),
    ("ssl.certificate.location", "PEM file of the client certificate (mutual TLS)"),
    ("ssl.key.location", "PEM file of the client certificate's unencrypted key"),
    ("ssl.certificate.pem", "the client certificate, as PEM text"),
    ("ssl.key.pem", "the client certificate's unencrypted key, as PEM text"),
    ("ssl.keystore.location", "client keystore file: PKCS#12 or PEM (key and chain)"),
    ("ssl.keystore.password", "keystore password"),
    ("ssl.keystore.type", "PKCS12 | PEM (checked against the file; JKS is refused)"),
    ("ssl.keystore.certificate.chain", "the client certificate chain, as PEM text (Java, type PEM)"),
    ("ssl.keystore.key", "the client certificate's unencrypted key, as PEM text (Java, type PEM)"),
    ("ssl.key.password", "PKCS#12 key password: must equal ssl.keystore.password"),
    ("ssl.endpoint.identification.algorithm", "https (default: verify the broker host name) | empty or none (do not)"),
    ("ssl.server.name", "kafkapipe: the name to verify broker certificates against (default: the host dialed)"),
    ("socket.connection.setup.timeout.ms", "TCP (+TLS) connect timeout (default 10000)"),
    ("socks5.proxy", "kafkapipe: SOCKS5 proxy for every broker connection, [socks5://][user:password@]host:port"),
    ("request.timeout.ms", "timeout of one request (default 30000; the writer's 10000)"),
    ("max.in.flight.requests.per.connection", "requests in flight per connection, and produce batches per partition (alias max.in.flight)"),
    ("metadata.max.age.ms", "how often metadata is refreshed"),
    ("group.id", "consumer group id"),
    ("group.instance.id", "static group membership id"),
    ("group.protocol", "classic | consumer (KIP-848)"),
    ("group.remote.assignor", "KIP-848 server-side assignor (uniform, range)"),
    ("partition.assignment.strategy", "range, roundrobin, cooperative-sticky (or the Java class names), comma-separated"),
    ("session.timeout.ms", "consumer group session timeout (default 10000)"),
    ("heartbeat.interval.ms", "consumer group heartbeat interval (default 3000)"),
    ("max.poll.interval.ms", "consumer group rebalance timeout (default 30000)"),
    ("auto.commit.interval.ms", "how often acknowledged offsets are committed (default 1000)"),
    ("auto.offset.reset", "earliest | latest | none (also smallest, largest, error)"),
    ("client.rack", "the consumer's rack, for fetching from the closest replica"),
    ("fetch.min.bytes", "least data a fetch waits for"),
    ("fetch.max.bytes", "most data of one fetch response"),
    ("max.partition.fetch.bytes", "most data per partition of one fetch"),
    ("fetch.max.wait.ms", "how long a fetch waits for fetch.min.bytes (alias fetch.wait.max.ms)"),
    ("isolation.level", "read_uncommitted | read_committed"),
    ("acks", "produce: all | -1 | 1 | 0 (alias request.required.acks)"),
    ("compression.type", "produce: none | gzip | snappy | lz4 | zstd (alias compression.codec)"),
    ("linger.ms", "produce: how long a batch waits for more records (alias queue.buffering.max.ms)"),
    ("batch.size", "produce: most bytes per batch"),
    ("batch.num.messages", "produce: most records per batch"),
    ("buffer.memory", "produce: most bytes buffered before writes wait"),
    ("max.request.size", "produce: most bytes of one produce request (alias message.max.bytes)"),
    ("enable.idempotence", "produce: true | false"),
    ("transactional.id", "produce: transactional id (TransactionalWriter)"),
    ("transaction.timeout.ms", "produce: how long a transaction may stay open"),
    ("delivery.timeout.ms", "produce: how long a record may take to be delivered (alias message.timeout.ms)"),
    ("retries", "produce: most retries of a batch (alias message.send.max.retries)"),
    ("retry.backoff.ms", "produce: first retry backoff"),
    ("retry.backoff.max.ms", "produce: largest retry backoff"),
    ("allow.auto.create.topics", "produce: let metadata requests create missing topics"),
];

/// Keys that are accepted and ignored, with the reason: Java class names that have no
/// meaning here, and settings whose behaviour this crate has built in.
pub const IGNORED_KEYS: &[(&str, &str)] = &[
    ("key.serializer", "a Java class: messages carry bytes"),
    ("value.serializer", "a Java class: messages carry bytes"),
    ("key.deserializer", "a Java class: messages carry bytes"),
    ("value.deserializer", "a Java class: messages carry bytes"),
    ("enable.auto.commit", "a group reader commits only offsets the application acknowledged, every auto.commit.interval.ms"),
    ("max.poll.records", "the Reader is a Stream: it yields one message at a time"),
    ("client.dns.lookup", "every address a name resolves to is tried (use_all_dns_ips)"),
    ("reconnect.backoff.ms", "connections are redialed with the retry backoff"),
    ("reconnect.backoff.max.ms", "connections are redialed with the retry backoff"),
    ("socket.keepalive.enable", "not configurable"),
    ("api.version.request", "ApiVersions is always used"),
    ("sasl.kerberos.kinit.cmd", "GSSAPI: no kinit is run; the Kerberos library gets tickets from sasl.kerberos.keytab"),
    ("sasl.kerberos.min.time.before.relogin", "GSSAPI: the Kerberos library renews tickets from the keytab itself"),
];

/// A client configuration read from Java / librdkafka properties; see the
/// [module docs](self). Build the crate's configs from it with
/// [`reader_config`](Self::reader_config), [`writer_config`](Self::writer_config),
/// [`admin`](Self::admin) or [`connection_config`](Self::connection_config).
///
/// `Debug` output never shows passwords or keys.
///
/// ```
/// use kafkapipe::config::Properties;
///
/// let props = Properties::from_pairs([("bootstrap.servers", "b1:9092,b2:9092"), ("linger.ms", "5")])?;
/// assert_eq!(props.bootstrap_servers(), ["b1:9092", "b2:9092"]);
/// let err = Properties::from_pairs([("linger.ms", "soon")]).unwrap_err();
/// assert!(err.to_string().contains("linger.ms"));
/// # Ok::<(), kafkapipe::Error>(())
/// ```
#[derive(Clone, Default)]
pub struct Properties {
    bootstrap: Vec<String>,
    conn: ConnectionConfig,
    /// `client.id` and `socket.connection.setup.timeout.ms` as given (also in `conn`), so
    /// that `apply_to_*` leaves a config's own values alone when they were not.
    client_id: Option<String>,
    connect_timeout: Option<Duration>,
    request_timeout: Option<Duration>,
    metadata_max_age: Option<Duration>,
    max_in_flight: Option<usize>,
    /// `socks5.proxy` as given (also in `conn.dialer`).
    socks5_proxy: Option<crate::conn::Socks5Proxy>,
    consumer: Consumer,
    producer: Producer,
}

/// Consumer settings, applied by [`Properties::apply_to_reader`].
#[derive(Clone, Default)]
struct Consumer {
    group_id: Option<String>,
    group_instance_id: Option<String>,
    group_protocol: Option<GroupProtocol>,
    group_remote_assignor: Option<String>,
    assignors: Option<Vec<Arc<dyn crate::group::Assignor>>>,
    session_timeout: Option<Duration>,
    heartbeat_interval: Option<Duration>,
    rebalance_timeout: Option<Duration>,
    commit_interval: Option<Duration>,
    offset_reset: Option<(StartOffset, OffsetReset)>,
    client_rack: Option<String>,
    fetch_min_bytes: Option<i32>,
    fetch_max_bytes: Option<i32>,
    max_partition_fetch_bytes: Option<i32>,
    fetch_max_wait: Option<Duration>,
    isolation_level: Option<IsolationLevel>,
}

/// Producer settings, applied by [`Properties::apply_to_writer`].
#[derive(Clone, Default, Debug)]
struct Producer {
    acks: Option<RequiredAcks>,
    compression: Option<Compression>,
    linger: Option<Duration>,
    batch_bytes: Option<usize>,
    batch_messages: Option<usize>,
    buffer_memory: Option<usize>,
    max_request_bytes: Option<usize>,
    idempotent: Option<bool>,
    transactional_id: Option<String>,
    transaction_timeout: Option<Duration>,
    delivery_timeout: Option<Duration>,
    retries: Option<u32>,
    backoff_min: Option<Duration>,
    backoff_max: Option<Duration>,
    allow_auto_topic_creation: Option<bool>,
}

impl fmt::Debug for Consumer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Consumer")
            .field("group_id", &self.group_id)
            .field("group_instance_id", &self.group_instance_id)
            .field("group_protocol", &self.group_protocol)
            .field("assignors", &self.assignors.as_ref().map(Vec::len))
            .field("session_timeout", &self.session_timeout)
            .field("isolation_level", &self.isolation_level)
            .finish_non_exhaustive()
    }
}

impl fmt::Debug for Properties {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // ConnectionConfig's Debug redacts SASL secrets and TLS keys.
        f.debug_struct("Properties")
            .field("bootstrap", &self.bootstrap)
            .field("conn", &self.conn)
            .field("consumer", &self.consumer)
            .field("producer", &self.producer)
            .finish_non_exhaustive()
    }
}

/// `property KEY: MESSAGE`.
fn bad(key: &str, message: impl fmt::Display) -> Error {
    Error::config(format!("property {key}: {message}"))
}

fn millis(key: &str, v: &str) -> Result<Duration> {
    v.parse::<u64>()
        .map(Duration::from_millis)
        .map_err(|_| bad(key, format_args!("expected milliseconds, got {v:?}")))
}

fn number<T: std::str::FromStr>(key: &str, v: &str) -> Result<T> {
    v.parse().map_err(|_| {
        bad(
            key,
            format_args!("expected a non-negative number, got {v:?}"),
        )
    })
}

fn boolean(key: &str, v: &str) -> Result<bool> {
    match v.to_ascii_lowercase().as_str() {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err(bad(key, format_args!("expected true or false, got {v:?}"))),
    }
}

/// `acks` values: all, -1, 1, 0.
///
/// ```
/// use kafkapipe::conn::RequiredAcks;
/// assert_eq!(kafkapipe::config::parse_acks("all")?, RequiredAcks::All);
/// assert!(kafkapipe::config::parse_acks("2").is_err());
/// # Ok::<(), kafkapipe::Error>(())
/// ```
///
/// # Errors
///
/// `Config` for any other value.
pub fn parse_acks(v: &str) -> Result<RequiredAcks> {
    match v.to_ascii_lowercase().as_str() {
        "all" | "-1" => Ok(RequiredAcks::All),
        "1" => Ok(RequiredAcks::Leader),
        "0" => Ok(RequiredAcks::None),
        _ => Err(bad(
            "acks",
            format_args!("expected all, -1, 1 or 0, got {v:?}"),
        )),
    }
}

/// Compression codec names: none, gzip, snappy, lz4, zstd.
///
/// ```
/// use kafkapipe::compression::Compression;
/// assert_eq!(kafkapipe::config::parse_compression("ZSTD")?, Compression::Zstd);
/// # Ok::<(), kafkapipe::Error>(())
/// ```
///
/// # Errors
///
/// `Config` for any other name.
pub fn parse_compression(v: &str) -> Result<Compression> {
    match v.to_ascii_lowercase().as_str() {
        "none" => Ok(Compression::None),
        "gzip" => Ok(Compression::Gzip),
        "snappy" => Ok(Compression::Snappy),
        "lz4" => Ok(Compression::Lz4),
        "zstd" => Ok(Compression::Zstd),
        _ => Err(bad(
            "compression.type",
            format_args!("expected none, gzip, snappy, lz4 or zstd, got {v:?}"),
        )),
    }
}

/// One parsed JAAS login module entry: `Class required key="value" ...;`.
#[derive(Debug, PartialEq, Eq)]
struct Jaas {
    module: String,
    options: BTreeMap<String, String>,
}

/// Parses a `sasl.jaas.config` value as Kafka's `JaasConfig` does: one module class, a
/// control flag, `key=value` options (values bare or in single or double quotes, with
/// backslash escapes), a closing `;`.
fn parse_jaas(v: &str) -> Result<Jaas> {
    const KEY: &str = "sasl.jaas.config";
    let mut chars = v.chars().peekable();
    let mut tokens: Vec<String> = Vec::new();
    let mut ended = false;
    while let Some(&c) = chars.peek() {
        if ended {
            if c.is_whitespace() {
                chars.next();
                continue;
            }
            return Err(bad(
                KEY,
                "only one login module is supported (text after `;`)",
            ));
        }
        match c {
            c if c.is_whitespace() => {
                chars.next();
            }
            ';' => {
                chars.next();
                ended = true;
            }
            '=' => {
                chars.next();
                tokens.push("=".into());
            }
            '"' | '\'' => {
                let quote = c;
                chars.next();
                let mut s = String::new();
                loop {
                    match chars.next() {
                        None => return Err(bad(KEY, "unterminated quoted value")),
                        Some('\\') => match chars.next() {
                            Some(e) => s.push(e),
                            None => return Err(bad(KEY, "unterminated quoted value")),
                        },
                        Some(q) if q == quote => break,
                        Some(other) => s.push(other),
                    }
                }
                // A quoted token is always a value; mark it so `=` cannot be taken for one.
                tokens.push(format!("\u{0}{s}"));
            }
            _ => {
                let mut s = String::new();
                while let Some(&c) = chars.peek() {
                    if c.is_whitespace() || c == '=' || c == ';' || c == '"' || c == '\'' {
                        break;
                    }
                    s.push(c);
                    chars.next();
                }
                tokens.push(s);
            }
        }
    }
    if !ended {
        return Err(bad(KEY, "the login module entry must end with `;`"));
    }
    let mut it = tokens.into_iter();
    let module = match it.next() {
        Some(m) if !m.starts_with('\u{0}') && m != "=" => m,
        _ => return Err(bad(KEY, "expected a login module class name")),
    };
    match it.next().as_deref() {
        Some("required" | "requisite" | "sufficient" | "optional") => {}
        _ => {
            return Err(bad(
                KEY,
                "expected a control flag (required, requisite, sufficient or optional) after the module",
            ))
        }
    }
    let mut options = BTreeMap::new();
    let rest: Vec<String> = it.collect();
    let mut i = 0;
    while i < rest.len() {
        let (Some(k), Some(eq), Some(val)) = (rest.get(i), rest.get(i + 1), rest.get(i + 2)) else {
            return Err(bad(KEY, "expected options as key=value"));
        };
        if eq != "=" || k == "=" || k.starts_with('\u{0}') || val == "=" {
            return Err(bad(KEY, "expected options as key=value"));
        }
        let val = val.strip_prefix('\u{0}').unwrap_or(val);
        options.insert(k.clone(), val.to_string());
        i += 3;
    }
    Ok(Jaas { module, options })
}

/// The TLS inputs collected while reading the keys; built into a `TlsConfig` at the end.
#[derive(Default)]
struct TlsInputs {
    ca_location: Option<String>,
    ca_pem: Option<String>,
    truststore_location: Option<String>,
    truststore_password: Option<String>,
    truststore_type: Option<String>,
    truststore_certificates: Option<String>,
    certificate_location: Option<String>,
    key_location: Option<String>,
    certificate_pem: Option<String>,
    key_pem: Option<String>,
    keystore_location: Option<String>,
    keystore_password: Option<String>,
    keystore_type: Option<String>,
    keystore_chain: Option<String>,
    keystore_key: Option<String>,
    key_password: Option<String>,
    endpoint_identification: Option<String>,
    server_name: Option<String>,
}

impl TlsInputs {
    /// The first key set, for "needs security.protocol=ssl" errors.
    fn first_set(&self) -> Option<&'static str> {
        [
            ("ssl.ca.location", self.ca_location.is_some()),
            ("ssl.ca.pem", self.ca_pem.is_some()),
            (
                "ssl.truststore.location",
                self.truststore_location.is_some(),
            ),
            (
                "ssl.truststore.password",
                self.truststore_password.is_some(),
            ),
            ("ssl.truststore.type", self.truststore_type.is_some()),
            (
                "ssl.truststore.certificates",
                self.truststore_certificates.is_some(),
            ),
            (
                "ssl.certificate.location",
                self.certificate_location.is_some(),
            ),
            ("ssl.key.location", self.key_location.is_some()),
            ("ssl.certificate.pem", self.certificate_pem.is_some()),
            ("ssl.key.pem", self.key_pem.is_some()),
            ("ssl.keystore.location", self.keystore_location.is_some()),
            ("ssl.keystore.password", self.keystore_password.is_some()),
            ("ssl.keystore.type", self.keystore_type.is_some()),
            (
                "ssl.keystore.certificate.chain",
                self.keystore_chain.is_some(),
            ),
            ("ssl.keystore.key", self.keystore_key.is_some()),
            ("ssl.key.password", self.key_password.is_some()),
            ("ssl.server.name", self.server_name.is_some()),
        ]
        .into_iter()
        .find(|(_, set)| *set)
        .map(|(k, _)| k)
    }

    #[cfg(feature = "tls")]
    fn build(self) -> Result<crate::tls::TlsConfig> {
        use crate::tls::TlsConfig;
        let store_type = |key: &str, v: &Option<String>| -> Result<()> {
            match v.as_deref().map(str::to_ascii_uppercase).as_deref() {
                None | Some("PKCS12" | "PEM") => Ok(()),
                Some("JKS") => Err(bad(
                    key,
                    "JKS is not supported: convert the store with `keytool -importkeystore \
                     -deststoretype PKCS12` and set PKCS12",
                )),
                Some(other) => Err(bad(
                    key,
                    format_args!("expected PKCS12 or PEM, got {other:?}"),
                )),
            }
        };
        store_type("ssl.truststore.type", &self.truststore_type)?;
        store_type("ssl.keystore.type", &self.keystore_type)?;
        let mut b = TlsConfig::builder();
        match self.ca_location.as_deref() {
            None => {}
            Some("probe") => b = system_roots(b)?,
            Some(path) => b = b.ca_file(path).map_err(|e| bad("ssl.ca.location", e))?,
        }
        if let Some(pem) = &self.ca_pem {
            b = b.ca_pem(pem.as_bytes()).map_err(|e| bad("ssl.ca.pem", e))?;
        }
        if let Some(pem) = &self.truststore_certificates {
            b = b
                .ca_pem(pem.as_bytes())
                .map_err(|e| bad("ssl.truststore.certificates", e))?;
        }
        if let Some(path) = &self.truststore_location {
            let password = self.truststore_password.as_deref().unwrap_or("");
            b = b
                .truststore_file(path, password)
                .map_err(|e| bad("ssl.truststore.location", e))?;
        }
        if let Some(kp) = &self.key_password {
            if self.keystore_password.as_deref() != Some(kp.as_str()) {
                return Err(bad(
                    "ssl.key.password",
                    "encrypted private keys are not supported: the key must be unencrypted, \
                     or in a PKCS#12 keystore under ssl.keystore.password",
                ));
            }
        }
        let mut client_sources = 0;
        match (&self.certificate_location, &self.key_location) {
            (Some(cert), Some(key)) => {
                b = b
                    .client_cert_files(cert, key)
                    .map_err(|e| bad("ssl.certificate.location", e))?;
                client_sources += 1;
            }
            (None, None) => {}
            (Some(_), None) => {
                return Err(bad(
                    "ssl.certificate.location",
                    "needs ssl.key.location too",
                ))
            }
            (None, Some(_)) => {
                return Err(bad(
                    "ssl.key.location",
                    "needs ssl.certificate.location too",
                ))
            }
        }
        for (cert_key, key_key, cert, key) in [
            (
                "ssl.certificate.pem",
                "ssl.key.pem",
                &self.certificate_pem,
                &self.key_pem,
            ),
            (
                "ssl.keystore.certificate.chain",
                "ssl.keystore.key",
                &self.keystore_chain,
                &self.keystore_key,
            ),
        ] {
            match (cert, key) {
                (Some(cert), Some(key)) => {
                    b = b
                        .client_cert_pem(cert.as_bytes(), key.as_bytes())
                        .map_err(|e| bad(cert_key, e))?;
                    client_sources += 1;
                }
                (None, None) => {}
                (Some(_), None) => return Err(bad(cert_key, format_args!("needs {key_key} too"))),
                (None, Some(_)) => return Err(bad(key_key, format_args!("needs {cert_key} too"))),
            }
        }
        if let Some(path) = &self.keystore_location {
            let password = self.keystore_password.as_deref().unwrap_or("");
            b = b
                .keystore_file(path, password)
                .map_err(|e| bad("ssl.keystore.location", e))?;
            client_sources += 1;
        }
        if client_sources > 1 {
            return Err(bad(
                "ssl.keystore.location",
                "give one client certificate: ssl.keystore.location, ssl.certificate.location \
                 with ssl.key.location, or the PEM text settings",
            ));
        }
        match self
            .endpoint_identification
            .as_deref()
            .map(str::to_ascii_lowercase)
            .as_deref()
        {
            None | Some("https") => {}
            Some("" | "none") => b = b.danger_accept_invalid_hostnames(true),
            Some(other) => {
                return Err(bad(
                    "ssl.endpoint.identification.algorithm",
                    format_args!("expected https, none or empty, got {other:?}"),
                ))
            }
        }
        if let Some(name) = self.server_name {
            b = b.server_name(name);
        }
        b.build()
            .map_err(|e| bad("security.protocol", format_args!("TLS settings: {e}")))
    }
}

#[cfg(all(feature = "tls", feature = "native-roots"))]
fn system_roots(b: crate::tls::TlsConfigBuilder) -> Result<crate::tls::TlsConfigBuilder> {
    b.native_roots().map_err(|e| bad("ssl.ca.location", e))
}

#[cfg(all(feature = "tls", not(feature = "native-roots")))]
fn system_roots(_: crate::tls::TlsConfigBuilder) -> Result<crate::tls::TlsConfigBuilder> {
    Err(bad(
        "ssl.ca.location",
        "`probe` needs the `native-roots` cargo feature",
    ))
}

/// The SASL inputs collected while reading the keys.
#[derive(Default)]
struct SaslInputs {
    mechanism: Option<String>,
    username: Option<String>,
    password: Option<String>,
    jaas: Option<Jaas>,
    oauth: OAuthInputs,
    kerberos_service_name: Option<String>,
    kerberos_keytab: Option<String>,
    kerberos_principal: Option<String>,
}

/// The OAUTHBEARER (OIDC client credentials, KIP-768) inputs; each with the key it came
/// from, for errors.
#[derive(Default)]
struct OAuthInputs {
    method: Option<String>,
    token_url: Option<String>,
    client_id: Option<(&'static str, String)>,
    client_secret: Option<(&'static str, String)>,
    scope: Option<String>,
    extensions: Vec<(String, String)>,
    callback_handler: Option<String>,
}

impl OAuthInputs {
    fn first_set(&self) -> Option<&'static str> {
        [
            ("sasl.oauthbearer.method", self.method.is_some()),
            (
                "sasl.oauthbearer.token.endpoint.url",
                self.token_url.is_some(),
            ),
            (
                self.client_id.as_ref().map_or("", |(k, _)| *k),
                self.client_id.is_some(),
            ),
            (
                self.client_secret.as_ref().map_or("", |(k, _)| *k),
                self.client_secret.is_some(),
            ),
            ("sasl.oauthbearer.scope", self.scope.is_some()),
            ("sasl.oauthbearer.extensions", !self.extensions.is_empty()),
            (
                "sasl.login.callback.handler.class",
                self.callback_handler.is_some(),
            ),
        ]
        .into_iter()
        .find(|(_, set)| *set)
        .map(|(k, _)| k)
    }
}

/// `sasl.oauthbearer.extensions`: `key=value,key=value`.
fn oauth_extensions(key: &str, v: &str) -> Result<Vec<(String, String)>> {
    v.split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .map(|e| match e.split_once('=') {
            Some((k, v)) if !k.trim().is_empty() => {
                Ok((k.trim().to_string(), v.trim().to_string()))
            }
            _ => Err(bad(key, format_args!("expected key=value,..., got {e:?}"))),
        })
        .collect()
}

/// `socks5.proxy`: `[socks5://|socks5h://][user:password@]host:port`; the user name and
/// password may be percent-encoded.
fn socks5_proxy(key: &str, v: &str) -> Result<crate::conn::Socks5Proxy> {
    let rest = match v.split_once("://") {
        None => v,
        Some((scheme, rest))
            if scheme.eq_ignore_ascii_case("socks5") || scheme.eq_ignore_ascii_case("socks5h") =>
        {
            rest
        }
        Some((scheme, _)) => {
            return Err(bad(
                key,
                format_args!("expected a socks5:// proxy, got scheme {scheme:?}"),
            ))
        }
    };
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    let (userinfo, addr) = match rest.rsplit_once('@') {
        Some((u, a)) => (Some(u), a),
        None => (None, rest),
    };
    let port_ok = addr
        .rsplit_once(':')
        .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok());
    if !port_ok {
        return Err(bad(
            key,
            format_args!("expected host:port for the proxy, got {addr:?}"),
        ));
    }
    let proxy = crate::conn::Socks5Proxy::new(addr);
    Ok(match userinfo {
        None => proxy,
        Some(u) => {
            let (user, password) = u
                .split_once(':')
                .ok_or_else(|| bad(key, "expected user:password@ before the proxy address"))?;
            let (user, password) = (percent_decode(key, user)?, percent_decode(key, password)?);
            if user.is_empty() || password.is_empty() || user.len() > 255 || password.len() > 255 {
                return Err(bad(
                    key,
                    "the proxy user name and password must each be 1 to 255 bytes",
                ));
            }
            proxy.with_credentials(user, password)
        }
    })
}

fn percent_decode(key: &str, s: &str) -> Result<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = s
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| bad(key, "bad percent-encoding in the proxy credentials"))?;
            out.push(hex);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| bad(key, "the proxy credentials are not UTF-8"))
}

impl SaslInputs {
    fn first_set(&self) -> Option<&'static str> {
        if let Some(k) = self.oauth.first_set() {
            Some(k)
        } else if self.mechanism.is_some() {
            Some("sasl.mechanism")
        } else if self.username.is_some() {
            Some("sasl.username")
        } else if self.password.is_some() {
            Some("sasl.password")
        } else if self.jaas.is_some() {
            Some("sasl.jaas.config")
        } else {
            self.first_kerberos()
        }
    }

    fn first_kerberos(&self) -> Option<&'static str> {
        if self.kerberos_service_name.is_some() {
            Some("sasl.kerberos.service.name")
        } else if self.kerberos_keytab.is_some() {
            Some("sasl.kerberos.keytab")
        } else if self.kerberos_principal.is_some() {
            Some("sasl.kerberos.principal")
        } else {
            None
        }
    }

    /// `GSSAPI` is chosen by `sasl.mechanism` or implied by a `Krb5LoginModule`.
    fn is_gssapi(&self) -> bool {
        let krb5 = self
            .jaas
            .as_ref()
            .is_some_and(|j| j.module.rsplit('.').next().unwrap_or(&j.module) == "Krb5LoginModule");
        match self.mechanism.as_deref() {
            Some(m) => m == "GSSAPI",
            None => krb5,
        }
    }

    /// GSSAPI from `sasl.kerberos.*` and/or a `Krb5LoginModule` JAAS entry.
    fn build_gssapi(self) -> Result<Arc<dyn Mechanism>> {
        if let Some(key) = [
            ("sasl.username", self.username.is_some()),
            ("sasl.password", self.password.is_some()),
        ]
        .iter()
        .find_map(|(k, set)| set.then_some(*k))
        {
            return Err(bad(
                key,
                "not used by sasl.mechanism=GSSAPI (Kerberos): give sasl.kerberos.keytab and sasl.kerberos.principal",
            ));
        }
        let (mut keytab, mut principal, mut service) = (
            self.kerberos_keytab,
            self.kerberos_principal,
            self.kerberos_service_name,
        );
        if let Some(jaas) = &self.jaas {
            let class = jaas.module.rsplit('.').next().unwrap_or(&jaas.module);
            if class != "Krb5LoginModule" {
                return Err(bad(
                    "sasl.jaas.config",
                    format_args!("its login module does not match sasl.mechanism=GSSAPI (expected Krb5LoginModule, got {class})"),
                ));
            }
            let opt = |name: &str| jaas.options.get(name).cloned();
            let use_keytab = opt("useKeyTab").is_some_and(|v| v.eq_ignore_ascii_case("true"));
            let merge = |slot: &mut Option<String>, value: Option<String>, key: &str| match (
                slot.as_ref(),
                value,
            ) {
                (Some(a), Some(b)) if *a != b => Err(bad(
                    "sasl.jaas.config",
                    format_args!("its value {b:?} contradicts {key}={a:?}"),
                )),
                (None, Some(b)) => {
                    *slot = Some(b);
                    Ok(())
                }
                _ => Ok(()),
            };
            if use_keytab {
                let Some(k) = opt("keyTab") else {
                    return Err(bad(
                        "sasl.jaas.config",
                        "Krb5LoginModule useKeyTab=true needs a keyTab option",
                    ));
                };
                merge(&mut keytab, Some(k), "sasl.kerberos.keytab")?;
            }
            merge(&mut principal, opt("principal"), "sasl.kerberos.principal")?;
            merge(
                &mut service,
                opt("serviceName"),
                "sasl.kerberos.service.name",
            )?;
        }
        #[cfg(feature = "gssapi")]
        {
            let mut g = crate::sasl::Gssapi::new();
            if let Some(s) = service {
                if s.is_empty() {
                    return Err(bad("sasl.kerberos.service.name", "is empty"));
                }
                g = g.service_name(s);
            }
            if let Some(k) = keytab {
                g = g.keytab(k);
            }
            if let Some(p) = principal {
                g = g.principal(p);
            }
            Ok(Arc::new(g))
        }
        #[cfg(not(feature = "gssapi"))]
        {
            let _ = (keytab, principal, service);
            Err(bad(
                "sasl.mechanism",
                "GSSAPI (Kerberos) needs the `gssapi` cargo feature",
            ))
        }
    }

    fn build(self) -> Result<Arc<dyn Mechanism>> {
        let oauth_jaas = self
            .jaas
            .as_ref()
            .is_some_and(|j| j.module.rsplit('.').next() == Some("OAuthBearerLoginModule"));
        match self.mechanism.as_deref() {
            Some("OAUTHBEARER") => return self.oauthbearer(),
            None if oauth_jaas => return self.oauthbearer(),
            _ => {}
        }
        if self.is_gssapi() {
            return self.build_gssapi();
        }
        if let Some(key) = self.oauth.first_set() {
            return Err(bad(key, "needs sasl.mechanism=OAUTHBEARER"));
        }
        if let Some(key) = self.first_kerberos() {
            return Err(bad(
                key,
                format_args!(
                    "is for sasl.mechanism=GSSAPI (it is {})",
                    self.mechanism.as_deref().unwrap_or("PLAIN")
                ),
            ));
        }
        let from_jaas = match &self.jaas {
            None => None,
            Some(jaas) => {
                let class = jaas.module.rsplit('.').next().unwrap_or(&jaas.module);
                let implied = match class {
                    "PlainLoginModule" => "PLAIN",
                    "ScramLoginModule" => "SCRAM",
                    "OAuthBearerLoginModule" => "OAUTHBEARER",
                    _ => {
                        return Err(bad(
                            "sasl.jaas.config",
                            format_args!(
                            "login module {} is not supported from properties (PlainLoginModule, \
                                 ScramLoginModule and OAuthBearerLoginModule are); set \
                                 ConnectionConfig::sasl in code",
                            jaas.module
                        ),
                        ))
                    }
                };
                if self.username.is_some() || self.password.is_some() {
                    return Err(bad(
                        "sasl.jaas.config",
                        "give the credentials either here or in sasl.username/sasl.password, not both",
                    ));
                }
                let field = |name: &str| {
                    jaas.options.get(name).cloned().ok_or_else(|| {
                        bad(
                            "sasl.jaas.config",
                            format_args!("{class} needs a {name} option"),
                        )
                    })
                };
                Some((implied, field("username")?, field("password")?))
            }
        };
        let mechanism = match (self.mechanism.as_deref(), from_jaas.as_ref()) {
            (Some(m), Some((implied, ..))) if !m.starts_with(implied) => {
                return Err(bad(
                    "sasl.jaas.config",
                    format_args!("its login module does not match sasl.mechanism={m}"),
                ))
            }
            (Some(m), _) => m.to_string(),
            (None, Some(("SCRAM", ..))) => {
                return Err(bad(
                    "sasl.mechanism",
                    "ScramLoginModule needs sasl.mechanism=SCRAM-SHA-256 or SCRAM-SHA-512",
                ))
            }
            (None, _) => "PLAIN".to_string(),
        };
        let (user, password) = match from_jaas {
            Some((_, u, p)) => (u, p),
            None => match (self.username, self.password) {
                (Some(u), Some(p)) => (u, p),
                _ => {
                    return Err(bad(
                        "security.protocol",
                        "SASL needs sasl.username and sasl.password (or sasl.jaas.config)",
                    ))
                }
            },
        };
        let m: Arc<dyn Mechanism> = match mechanism.as_str() {
            "PLAIN" => Arc::new(crate::sasl::Plain::new(user, password)),
            #[cfg(feature = "scram")]
            "SCRAM-SHA-256" => Arc::new(crate::sasl::Scram::sha256(user, password)),
            #[cfg(feature = "scram")]
            "SCRAM-SHA-512" => Arc::new(crate::sasl::Scram::sha512(user, password)),
            #[cfg(not(feature = "scram"))]
            "SCRAM-SHA-256" | "SCRAM-SHA-512" => {
                return Err(bad(
                    "sasl.mechanism",
                    "SCRAM needs the `scram` cargo feature",
                ))
            }
            other => {
                return Err(bad(
                    "sasl.mechanism",
                    format_args!(
                        "expected PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, OAUTHBEARER or GSSAPI, \
                         got {other:?} (other mechanisms are set in code: ConnectionConfig::sasl)"
                    ),
                ))
            }
        };
        Ok(m)
    }
}

impl SaslInputs {
    /// OAUTHBEARER with OIDC client credentials (KIP-768): librdkafka's
    /// `sasl.oauthbearer.method=oidc` + `sasl.oauthbearer.*` keys, or Java's
    /// `sasl.oauthbearer.token.endpoint.url` + `OAuthBearerLoginModule` options.
    fn oauthbearer(self) -> Result<Arc<dyn Mechanism>> {
        const URL: &str = "sasl.oauthbearer.token.endpoint.url";
        let o = self.oauth;
        match o.method.as_deref().map(str::to_ascii_lowercase).as_deref() {
            None | Some("oidc") => {}
            Some("default") => {
                return Err(bad(
                    "sasl.oauthbearer.method",
                    "default (unsecured or application-supplied tokens) cannot be set from \
                     properties: set ConnectionConfig::sasl to an OAuthBearer in code, or use oidc",
                ))
            }
            Some(other) => {
                return Err(bad(
                    "sasl.oauthbearer.method",
                    format_args!("expected oidc or default, got {other:?}"),
                ))
            }
        }
        if let Some(class) = &o.callback_handler {
            if class.rsplit('.').next() != Some("OAuthBearerLoginCallbackHandler") {
                return Err(bad(
                    "sasl.login.callback.handler.class",
                    format_args!(
                        "only OAuthBearerLoginCallbackHandler (the OIDC client credentials \
                         flow, built in) is supported, got {class:?}"
                    ),
                ));
            }
        }
        for (key, set) in [
            ("sasl.username", self.username.is_some()),
            ("sasl.password", self.password.is_some()),
        ] {
            if set {
                return Err(bad(
                    key,
                    "is not used by OAUTHBEARER: give sasl.oauthbearer.client.id and \
                     sasl.oauthbearer.client.secret",
                ));
            }
        }
        let mut jaas_id = None;
        let mut jaas_secret = None;
        let mut jaas_scope = None;
        let mut extensions = o.extensions;
        if let Some(jaas) = self.jaas {
            if jaas.module.rsplit('.').next() != Some("OAuthBearerLoginModule") {
                return Err(bad(
                    "sasl.jaas.config",
                    format_args!(
                        "its login module {} does not match sasl.mechanism=OAUTHBEARER",
                        jaas.module
                    ),
                ));
            }
            for (k, v) in jaas.options {
                match k.as_str() {
                    "clientId" => jaas_id = Some(v),
                    "clientSecret" => jaas_secret = Some(v),
                    "scope" => jaas_scope = Some(v),
                    _ if k.starts_with("extension_") => {
                        extensions.push((k["extension_".len()..].to_string(), v))
                    }
                    _ if k.starts_with("unsecuredLogin") => {
                        return Err(bad(
                            "sasl.jaas.config",
                            format_args!(
                                "{k}: unsecured OAUTHBEARER tokens cannot be set from \
                                 properties: set ConnectionConfig::sasl to an OAuthBearer in code"
                            ),
                        ))
                    }
                    _ => {
                        return Err(bad(
                            "sasl.jaas.config",
                            format_args!(
                                "unknown OAuthBearerLoginModule option {k:?} (expected clientId, \
                                 clientSecret, scope, extension_NAME)"
                            ),
                        ))
                    }
                }
            }
        }
        let url = o.token_url.ok_or_else(|| {
            bad(
                URL,
                "is required for OAUTHBEARER from properties (the OIDC token endpoint)",
            )
        })?;
        let client_id = match (o.client_id, jaas_id) {
            (Some((k, _)), Some(_)) => {
                return Err(bad(
                    k,
                    "give the client id here or as clientId in sasl.jaas.config, not both",
                ))
            }
            (Some((_, v)), None) | (None, Some(v)) => v,
            (None, None) => {
                return Err(bad(
                    "sasl.oauthbearer.client.id",
                    "is required for OAUTHBEARER (or clientId in sasl.jaas.config)",
                ))
            }
        };
        let client_secret =
            match (o.client_secret, jaas_secret) {
                (Some((k, _)), Some(_)) => return Err(bad(
                    k,
                    "give the client secret here or as clientSecret in sasl.jaas.config, not both",
                )),
                (Some((_, v)), None) | (None, Some(v)) => v,
                (None, None) => {
                    return Err(bad(
                        "sasl.oauthbearer.client.secret",
                        "is required for OAUTHBEARER (or clientSecret in sasl.jaas.config)",
                    ))
                }
            };
        let scope = o.scope.or(jaas_scope);
        #[cfg(feature = "oidc")]
        {
            let mut cc = crate::sasl::ClientCredentials::new(&url, client_id, client_secret)
                .map_err(|e| bad(URL, e))?;
            if let Some(scope) = scope {
                cc = cc.scope(scope);
            }
            for (k, v) in extensions {
                cc = cc.extension(k, v);
            }
            Ok(Arc::new(cc.into_mechanism()))
        }
        #[cfg(not(feature = "oidc"))]
        {
            let _ = (url, client_id, client_secret, scope, extensions);
            Err(bad(
                URL,
                "OAUTHBEARER with OIDC client credentials needs the `oidc` cargo feature",
            ))
        }
    }
}

fn assignors(v: &str) -> Result<Vec<Arc<dyn crate::group::Assignor>>> {
    const KEY: &str = "partition.assignment.strategy";
    let mut out: Vec<Arc<dyn crate::group::Assignor>> = Vec::new();
    for name in v.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let short = name.rsplit('.').next().unwrap_or(name);
        out.push(match short.to_ascii_lowercase().as_str() {
            "range" | "rangeassignor" => Arc::new(crate::group::RangeAssignor),
            "roundrobin" | "roundrobinassignor" => Arc::new(crate::group::RoundRobinAssignor),
            "cooperative-sticky" | "cooperativestickyassignor" => {
                Arc::new(crate::group::CooperativeStickyAssignor)
            }
            _ => {
                return Err(bad(
                    KEY,
                    format_args!("expected range, roundrobin or cooperative-sticky, got {name:?}"),
                ))
            }
        });
    }
    if out.is_empty() {
        return Err(bad(KEY, "names no assignor"));
    }
    Ok(out)
}

impl Properties {
    /// Reads `(key, value)` pairs (a `HashMap`, a `BTreeMap`, a `Vec` of pairs, …); a
    /// later pair overrides an earlier one with the same key. Values are trimmed. Files
    /// named by `ssl.*` settings are read here, so a missing file is reported before
    /// anything connects.
    ///
    /// ```
    /// use std::collections::HashMap;
    /// use kafkapipe::config::Properties;
    ///
    /// let mut map = HashMap::new();
    /// map.insert("bootstrap.servers".to_string(), "localhost:9092".to_string());
    /// map.insert("group.id".to_string(), "g".to_string());
    /// let props = Properties::from_pairs(&map)?;
    /// assert_eq!(props.reader_config()?.group_id.as_deref(), Some("g"));
    /// # Ok::<(), kafkapipe::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// `Config`, naming the key, for an unknown key, a bad value, settings that contradict
    /// each other, or a TLS file that cannot be read.
    pub fn from_pairs<I, K, V>(pairs: I) -> Result<Properties>
    where
        I: IntoIterator<Item = (K, V)>,
        K: AsRef<str>,
        V: AsRef<str>,
    {
        let mut p = Properties::default();
        let mut protocol = "plaintext".to_string();
        let mut tls = TlsInputs::default();
        let mut sasl = SaslInputs::default();
        for (k, v) in pairs {
            let (k, v) = (k.as_ref().trim(), v.as_ref().trim());
            let s = || Some(v.to_string());
            let c = &mut p.consumer;
            let w = &mut p.producer;
            match k {
                "bootstrap.servers" | "metadata.broker.list" => {
                    p.bootstrap = v
                        .split(',')
                        .map(str::trim)
                        .filter(|s| !s.is_empty())
                        .map(String::from)
                        .collect();
                    if p.bootstrap.is_empty() {
                        return Err(bad(k, "names no broker"));
                    }
                }
                "client.id" => {
                    p.conn.client_id = v.to_string();
                    p.client_id = s();
                }
                "security.protocol" => protocol = v.to_ascii_lowercase(),
                "sasl.mechanism" | "sasl.mechanisms" => {
                    sasl.mechanism = Some(v.to_ascii_uppercase())
                }
                "sasl.username" => sasl.username = s(),
                "sasl.password" => sasl.password = s(),
                "sasl.jaas.config" => sasl.jaas = Some(parse_jaas(v)?),
                "sasl.oauthbearer.method" => sasl.oauth.method = s(),
                "sasl.oauthbearer.token.endpoint.url" => sasl.oauth.token_url = s(),
                "sasl.oauthbearer.client.id" => {
                    sasl.oauth.client_id = Some(("sasl.oauthbearer.client.id", v.to_string()))
                }
                "sasl.oauthbearer.client.credentials.client.id" => {
                    sasl.oauth.client_id = Some((
                        "sasl.oauthbearer.client.credentials.client.id",
                        v.to_string(),
                    ))
                }
                "sasl.oauthbearer.client.secret" => {
                    sasl.oauth.client_secret =
                        Some(("sasl.oauthbearer.client.secret", v.to_string()))
                }
                "sasl.oauthbearer.client.credentials.client.secret" => {
                    sasl.oauth.client_secret = Some((
                        "sasl.oauthbearer.client.credentials.client.secret",
                        v.to_string(),
                    ))
                }
                "sasl.oauthbearer.scope" => sasl.oauth.scope = s(),
                "sasl.oauthbearer.extensions" => sasl.oauth.extensions = oauth_extensions(k, v)?,
                "sasl.login.callback.handler.class" => sasl.oauth.callback_handler = s(),
                "socks5.proxy" => {
                    let proxy = socks5_proxy(k, v)?;
                    p.conn.dialer = crate::conn::Dialer::new().with_socks5_proxy(proxy.clone());
                    p.socks5_proxy = Some(proxy);
                }
                "sasl.kerberos.service.name" => sasl.kerberos_service_name = s(),
                "sasl.kerberos.keytab" => sasl.kerberos_keytab = s(),
                "sasl.kerberos.principal" => sasl.kerberos_principal = s(),
                "ssl.ca.location" => tls.ca_location = s(),
                "ssl.ca.pem" => tls.ca_pem = s(),
                "ssl.truststore.location" => tls.truststore_location = s(),
                "ssl.truststore.password" => tls.truststore_password = s(),
                "ssl.truststore.type" => tls.truststore_type = s(),
                "ssl.truststore.certificates" => tls.truststore_certificates = s(),
                "ssl.certificate.location" => tls.certificate_location = s(),
                "ssl.key.location" => tls.key_location = s(),
                "ssl.certificate.pem" => tls.certificate_pem = s(),
                "ssl.key.pem" => tls.key_pem = s(),
                "ssl.keystore.location" => tls.keystore_location = s(),
                "ssl.keystore.password" => tls.keystore_password = s(),
                "ssl.keystore.type" => tls.keystore_type = s(),
                "ssl.keystore.certificate.chain" => tls.keystore_chain = s(),
                "ssl.keystore.key" => tls.keystore_key = s(),
                "ssl.key.password" => tls.key_password = s(),
                "ssl.endpoint.identification.algorithm" => tls.endpoint_identification = s(),
                "ssl.server.name" => tls.server_name = s(),
                "socket.connection.setup.timeout.ms" => {
                    p.conn.connect_timeout = millis(k, v)?;
                    p.connect_timeout = Some(p.conn.connect_timeout);
                }
                "request.timeout.ms" => p.request_timeout = Some(millis(k, v)?),
                "max.in.flight.requests.per.connection" | "max.in.flight" => {
                    let n: usize = number(k, v)?;
                    if n == 0 {
                        return Err(bad(k, "must be at least 1"));
                    }
                    p.max_in_flight = Some(n);
                }
                "metadata.max.age.ms" => p.metadata_max_age = Some(millis(k, v)?),
                "group.id" => c.group_id = s(),
                "group.instance.id" => c.group_instance_id = s(),
                "group.protocol" => {
                    c.group_protocol = Some(match v.to_ascii_lowercase().as_str() {
                        "classic" => GroupProtocol::Classic,
                        "consumer" => GroupProtocol::Consumer,
                        _ => {
                            return Err(bad(
                                k,
                                format_args!("expected classic or consumer, got {v:?}"),
                            ))
                        }
                    })
                }
                "group.remote.assignor" => c.group_remote_assignor = s(),
                "partition.assignment.strategy" => c.assignors = Some(assignors(v)?),
                "session.timeout.ms" => c.session_timeout = Some(millis(k, v)?),
                "heartbeat.interval.ms" => c.heartbeat_interval = Some(millis(k, v)?),
                "max.poll.interval.ms" => c.rebalance_timeout = Some(millis(k, v)?),
                "auto.commit.interval.ms" => c.commit_interval = Some(millis(k, v)?),
                "auto.offset.reset" => {
                    c.offset_reset = Some(match v.to_ascii_lowercase().as_str() {
                        "earliest" | "smallest" | "beginning" => {
                            (StartOffset::First, OffsetReset::Earliest)
                        }
                        "latest" | "largest" | "end" => (StartOffset::Last, OffsetReset::Latest),
                        "none" | "error" => (StartOffset::First, OffsetReset::Error),
                        _ => {
                            return Err(bad(
                                k,
                                format_args!("expected earliest, latest or none, got {v:?}"),
                            ))
                        }
                    })
                }
                "client.rack" => c.client_rack = s(),
                "fetch.min.bytes" => c.fetch_min_bytes = Some(number(k, v)?),
                "fetch.max.bytes" => c.fetch_max_bytes = Some(number(k, v)?),
                "max.partition.fetch.bytes" => c.max_partition_fetch_bytes = Some(number(k, v)?),
                "fetch.max.wait.ms" | "fetch.wait.max.ms" => c.fetch_max_wait = Some(millis(k, v)?),
                "isolation.level" => {
                    c.isolation_level = Some(match v.to_ascii_lowercase().as_str() {
                        "read_uncommitted" => IsolationLevel::ReadUncommitted,
                        "read_committed" => IsolationLevel::ReadCommitted,
                        _ => {
                            return Err(bad(
                                k,
                                format_args!(
                                    "expected read_uncommitted or read_committed, got {v:?}"
                                ),
                            ))
                        }
                    })
                }
                "acks" | "request.required.acks" => {
                    w.acks =
                        Some(parse_acks(v).map_err(|_| {
                            bad(k, format_args!("expected all, -1, 1 or 0, got {v:?}"))
                        })?)
                }
                "compression.type" | "compression.codec" => {
                    w.compression = Some(parse_compression(v).map_err(|_| {
                        bad(
                            k,
                            format_args!("expected none, gzip, snappy, lz4 or zstd, got {v:?}"),
                        )
                    })?)
                }
                "linger.ms" | "queue.buffering.max.ms" => w.linger = Some(millis(k, v)?),
                "batch.size" => w.batch_bytes = Some(number(k, v)?),
                "batch.num.messages" => w.batch_messages = Some(number(k, v)?),
                "buffer.memory" => w.buffer_memory = Some(number(k, v)?),
                "max.request.size" | "message.max.bytes" => {
                    w.max_request_bytes = Some(number(k, v)?)
                }
                "enable.idempotence" => w.idempotent = Some(boolean(k, v)?),
                "transactional.id" => w.transactional_id = s(),
                "transaction.timeout.ms" => w.transaction_timeout = Some(millis(k, v)?),
                "delivery.timeout.ms" | "message.timeout.ms" => {
                    w.delivery_timeout = Some(millis(k, v)?)
                }
                "retries" | "message.send.max.retries" => w.retries = Some(number(k, v)?),
                "retry.backoff.ms" => w.backoff_min = Some(millis(k, v)?),
                "retry.backoff.max.ms" => w.backoff_max = Some(millis(k, v)?),
                "allow.auto.create.topics" => w.allow_auto_topic_creation = Some(boolean(k, v)?),
                _ if IGNORED_KEYS.iter().any(|(i, _)| *i == k) => {
                    tracing::debug!(key = k, "ignored property");
                }
                _ => {
                    return Err(Error::config(format!(
                        "unknown property {k:?} (kafkapipe::config::KEYS lists the known ones)"
                    )))
                }
            }
        }
        let (use_tls, use_sasl) = match protocol.as_str() {
            "plaintext" => (false, false),
            "ssl" => (true, false),
            "sasl_plaintext" => (false, true),
            "sasl_ssl" => (true, true),
            other => {
                return Err(bad(
                    "security.protocol",
                    format_args!(
                        "expected plaintext, ssl, sasl_plaintext or sasl_ssl, got {other:?}"
                    ),
                ))
            }
        };
        if use_sasl {
            p.conn.sasl = Some(sasl.build()?);
        } else if let Some(key) = sasl.first_set() {
            return Err(bad(
                key,
                format_args!(
                    "needs security.protocol=sasl_plaintext or sasl_ssl (it is {protocol})"
                ),
            ));
        }
        if !use_tls {
            if let Some(key) = tls.first_set() {
                return Err(bad(
                    key,
                    format_args!("needs security.protocol=ssl or sasl_ssl (it is {protocol})"),
                ));
            }
        } else {
            #[cfg(feature = "tls")]
            {
                p.conn.tls = Some(tls.build()?);
            }
            #[cfg(not(feature = "tls"))]
            return Err(bad(
                "security.protocol",
                format_args!("{protocol} needs the `tls` cargo feature"),
            ));
        }
        if p.producer.idempotent == Some(false) && p.producer.transactional_id.is_some() {
            return Err(bad(
                "enable.idempotence",
                "false contradicts transactional.id (transactions need idempotence)",
            ));
        }
        if let Some(t) = p.request_timeout {
            p.conn.request_timeout = t;
        }
        if let Some(n) = p.max_in_flight {
            p.conn.max_in_flight = n;
        }
        Ok(p)
    }

    /// Reads the text of a Java `.properties` file (`client.properties`): `key=value` or
    /// `key: value` lines, `#` and `!` comments, a trailing `\` continuing a line.
    ///
    /// ```
    /// use kafkapipe::config::Properties;
    ///
    /// let props = Properties::from_text(
    ///     "# Confluent Cloud\n\
    ///      bootstrap.servers=pkc-1.eu-west-1.aws.confluent.cloud:9092\n\
    ///      security.protocol=SASL_SSL\n\
    ///      sasl.mechanisms=PLAIN\n\
    ///      sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule \\\n\
    ///        required username='KEY' password='SECRET';\n",
    /// )?;
    /// assert_eq!(props.bootstrap_servers().len(), 1);
    /// # Ok::<(), kafkapipe::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`from_pairs`](Self::from_pairs), and `Config` if the text ends inside a
    /// continued line.
    pub fn from_text(text: &str) -> Result<Properties> {
        Properties::from_pairs(parse_text(text)?)
    }

    /// The bootstrap brokers (`bootstrap.servers`); empty if not set.
    ///
    /// ```
    /// let props = kafkapipe::config::Properties::from_pairs([("bootstrap.servers", "b:9092")])?;
    /// assert_eq!(props.bootstrap_servers(), ["b:9092"]);
    /// # Ok::<(), kafkapipe::Error>(())
    /// ```
    pub fn bootstrap_servers(&self) -> &[String] {
        &self.bootstrap
    }

    /// The connection settings: client id, connect and request timeouts, in-flight
    /// limit, TLS and SASL.
    ///
    /// ```
    /// let props = kafkapipe::config::Properties::from_pairs([("client.id", "billing")])?;
    /// assert_eq!(props.connection_config().client_id, "billing");
    /// # Ok::<(), kafkapipe::Error>(())
    /// ```
    pub fn connection_config(&self) -> ConnectionConfig {
        self.conn.clone()
    }

    fn need_bootstrap(&self) -> Result<&[String]> {
        if self.bootstrap.is_empty() {
            return Err(bad("bootstrap.servers", "is required"));
        }
        Ok(&self.bootstrap)
    }

    /// A [`ReaderConfig`] for `bootstrap.servers` with the connection and consumer
    /// settings; add the topics to read.
    ///
    /// ```
    /// let props = kafkapipe::config::Properties::from_pairs([
    ///     ("bootstrap.servers", "b:9092"),
    ///     ("group.id", "g"),
    ///     ("isolation.level", "read_committed"),
    /// ])?;
    /// let config = props.reader_config()?.topic("events");
    /// # Ok::<(), kafkapipe::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// `Config` if `bootstrap.servers` is not set.
    pub fn reader_config(&self) -> Result<ReaderConfig> {
        Ok(self.apply_to_reader(ReaderConfig::new(self.need_bootstrap()?.to_vec())))
    }

    /// Applies the connection and consumer settings that were given to `c` (others keep
    /// `c`'s values); the brokers stay `c`'s.
    ///
    /// ```
    /// use kafkapipe::reader::ReaderConfig;
    /// let props = kafkapipe::config::Properties::from_pairs([("fetch.min.bytes", "1024")])?;
    /// let c = props.apply_to_reader(ReaderConfig::new(["b:9092"]));
    /// assert_eq!(c.min_bytes, 1024);
    /// # Ok::<(), kafkapipe::Error>(())
    /// ```
    pub fn apply_to_reader(&self, mut c: ReaderConfig) -> ReaderConfig {
        let s = &self.consumer;
        if let Some(id) = &self.client_id {
            c.client_id = id.clone();
        }
        if let Some(d) = self.connect_timeout {
            c.connect_timeout = d;
        }
        if let Some(t) = self.request_timeout {
            c.request_timeout = t;
        }
        #[cfg(feature = "tls")]
        if self.conn.tls.is_some() {
            c.tls = self.conn.tls.clone();
        }
        if self.conn.sasl.is_some() {
            c.sasl = self.conn.sasl.clone();
        }
        if self.socks5_proxy.is_some() {
            c.dialer = self.conn.dialer.clone();
        }
        if let Some(id) = &s.group_id {
            c = c.group_id(id.clone());
        }
        if let Some(id) = &s.group_instance_id {
            c = c.group_instance_id(id.clone());
        }
        if let Some(p) = s.group_protocol {
            c = c.group_protocol(p);
        }
        if let Some(a) = &s.group_remote_assignor {
            c = c.group_remote_assignor(a.clone());
        }
        if let Some(a) = &s.assignors {
            c = c.assignors(a.clone());
        }
        if let Some(d) = s.session_timeout {
            c = c.session_timeout(d);
        }
        if let Some(d) = s.heartbeat_interval {
            c = c.heartbeat_interval(d);
        }
        if let Some(d) = s.rebalance_timeout {
            c = c.rebalance_timeout(d);
        }
        if let Some(d) = s.commit_interval {
            c = c.commit_mode(CommitMode::Interval(d));
        }
        if let Some((start, reset)) = s.offset_reset {
            c = c.start_offset(start).offset_reset(reset);
        }
        if let Some(r) = &s.client_rack {
            c = c.client_rack(r.clone());
        }
        if let Some(n) = s.fetch_min_bytes {
            c = c.min_bytes(n);
        }
        if let Some(n) = s.fetch_max_bytes {
            c = c.max_bytes(n);
        }
        if let Some(n) = s.max_partition_fetch_bytes {
            c = c.max_partition_bytes(n);
        }
        if let Some(d) = s.fetch_max_wait {
            c = c.max_wait(d);
        }
        if let Some(l) = s.isolation_level {
            c = c.isolation_level(l);
        }
        c
    }

    /// Applies `fetch.min.bytes`, `max.partition.fetch.bytes` (else `fetch.max.bytes`),
    /// `fetch.max.wait.ms` and `isolation.level`, where given, to the options of a
    /// low-level [`Conn::fetch`](crate::conn::Conn::fetch).
    ///
    /// ```
    /// use kafkapipe::conn::{FetchOptions, IsolationLevel};
    /// let props = kafkapipe::config::Properties::from_pairs([("isolation.level", "read_committed")])?;
    /// let opts = props.apply_to_fetch_options(FetchOptions::default());
    /// assert_eq!(opts.isolation_level, IsolationLevel::ReadCommitted);
    /// # Ok::<(), kafkapipe::Error>(())
    /// ```
    pub fn apply_to_fetch_options(&self, mut opts: FetchOptions) -> FetchOptions {
        let s = &self.consumer;
        if let Some(n) = s.fetch_min_bytes {
            opts.min_bytes = n;
        }
        if let Some(n) = s.max_partition_fetch_bytes.or(s.fetch_max_bytes) {
            opts.max_bytes = n;
        }
        if let Some(d) = s.fetch_max_wait {
            opts.max_wait = d;
        }
        if let Some(l) = s.isolation_level {
            opts.isolation_level = l;
        }
        opts
    }

    /// A [`WriterConfig`] for `bootstrap.servers` with the connection and producer
    /// settings. With `transactional.id` it is for
    /// [`TransactionalWriter`](crate::writer::TransactionalWriter).
    ///
    /// ```
    /// let props = kafkapipe::config::Properties::from_pairs([
    ///     ("bootstrap.servers", "b:9092"),
    ///     ("acks", "all"),
    ///     ("linger.ms", "20"),
    ///     ("compression.type", "zstd"),
    /// ])?;
    /// let config = props.writer_config()?.topic("events");
    /// assert_eq!(config.batch_timeout, std::time::Duration::from_millis(20));
    /// # Ok::<(), kafkapipe::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// `Config` if `bootstrap.servers` is not set.
    pub fn writer_config(&self) -> Result<WriterConfig> {
        Ok(self.apply_to_writer(WriterConfig::new(self.need_bootstrap()?.to_vec())))
    }

    /// Applies the connection and producer settings that were given to `c` (others keep
    /// `c`'s values); the brokers stay `c`'s.
    ///
    /// ```
    /// use kafkapipe::writer::WriterConfig;
    /// let props = kafkapipe::config::Properties::from_pairs([("batch.size", "65536")])?;
    /// let c = props.apply_to_writer(WriterConfig::new(["b:9092"]));
    /// assert_eq!(c.batch_bytes, 65536);
    /// # Ok::<(), kafkapipe::Error>(())
    /// ```
    pub fn apply_to_writer(&self, mut c: WriterConfig) -> WriterConfig {
        let s = &self.producer;
        if let Some(id) = &self.client_id {
            c.client_id = id.clone();
        }
        if let Some(d) = self.connect_timeout {
            c.connect_timeout = d;
        }
        if let Some(t) = self.request_timeout {
            c = c.write_timeout(t);
        }
        #[cfg(feature = "tls")]
        if self.conn.tls.is_some() {
            c.tls = self.conn.tls.clone();
        }
        if self.conn.sasl.is_some() {
            c.sasl = self.conn.sasl.clone();
        }
        if self.socks5_proxy.is_some() {
            c.dialer = self.conn.dialer.clone();
        }
        if let Some(n) = self.max_in_flight {
            c = c.max_in_flight_per_partition(n);
        }
        if let Some(d) = self.metadata_max_age {
            c = c.metadata_max_age(d);
        }
        if let Some(a) = s.acks {
            c = c.required_acks(a);
        }
        if let Some(z) = s.compression {
            c = c.compression(z);
        }
        if let Some(d) = s.linger {
            c = c.batch_timeout(d);
        }
        if let Some(n) = s.batch_bytes {
            c = c.batch_bytes(n);
        }
        if let Some(n) = s.batch_messages {
            c = c.batch_size(n);
        }
        if let Some(n) = s.buffer_memory {
            c = c.max_buffered_bytes(n);
        }
        if let Some(n) = s.max_request_bytes {
            c = c.max_request_bytes(n);
        }
        if let Some(on) = s.idempotent {
            c = c.idempotent(on);
        }
        if let Some(id) = &s.transactional_id {
            c = c.transactional_id(id.clone());
        }
        if let Some(d) = s.transaction_timeout {
            c = c.transaction_timeout(d);
        }
        if let Some(d) = s.delivery_timeout {
            c = c.delivery_timeout(d);
        }
        if let Some(n) = s.retries {
            c = c.max_attempts(n.saturating_add(1));
        }
        if s.backoff_min.is_some() || s.backoff_max.is_some() {
            let min = s.backoff_min.unwrap_or(c.backoff_min);
            let max = s.backoff_max.unwrap_or(c.backoff_max).max(min);
            c = c.backoff(min, max);
        }
        if let Some(on) = s.allow_auto_topic_creation {
            c = c.allow_auto_topic_creation(on);
        }
        c
    }

    /// A metadata/admin [`Cluster`] client for `brokers` with the connection settings
    /// (`metadata.max.age.ms` included).
    ///
    /// ```no_run
    /// let props = kafkapipe::config::Properties::from_pairs([("client.id", "ops")])?;
    /// let cluster = props.cluster(&["b:9092".to_string()])?;
    /// # Ok::<(), kafkapipe::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`Cluster::new`].
    pub fn cluster(&self, brokers: &[String]) -> Result<Cluster> {
        let cluster = Cluster::new(brokers.to_vec(), self.conn.clone())?;
        Ok(match self.metadata_max_age {
            Some(d) => cluster.with_metadata_max_age(d),
            None => cluster,
        })
    }

    /// An [`Admin`] client for `bootstrap.servers` with the connection settings.
    ///
    /// ```no_run
    /// # async fn demo() -> kafkapipe::Result<()> {
    /// let props = kafkapipe::config::Properties::from_pairs([("bootstrap.servers", "b:9092")])?;
    /// let admin = props.admin()?;
    /// println!("{:?}", admin.list_topics().await?);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// `Config` if `bootstrap.servers` is not set.
    pub fn admin(&self) -> Result<Admin> {
        Ok(Admin::new(self.cluster(self.need_bootstrap()?)?))
    }
}

/// The `(key, value)` pairs of Java `.properties` text (see [`Properties::from_text`]):
/// the key ends at the first `=`, `:` or white space; one `=` or `:` and the white space
/// around it separate it from the value.
fn parse_text(text: &str) -> Result<Vec<(String, String)>> {
    let mut pairs = Vec::new();
    let mut logical = String::new();
    for line in text.lines() {
        let line = line.trim_start();
        if logical.is_empty() && (line.is_empty() || line.starts_with('#') || line.starts_with('!'))
        {
            continue;
        }
        // An odd number of trailing backslashes continues the line.
        let trailing = line.chars().rev().take_while(|&c| c == '\\').count();
        if trailing % 2 == 1 {
            logical.push_str(&line[..line.len() - 1]);
            continue;
        }
        logical.push_str(line);
        let entry = std::mem::take(&mut logical);
        let split = entry
            .find(|c: char| c == '=' || c == ':' || c.is_whitespace())
            .unwrap_or(entry.len());
        let (key, rest) = entry.split_at(split);
        let rest = rest.trim_start();
        let value = rest
            .strip_prefix('=')
            .or_else(|| rest.strip_prefix(':'))
            .unwrap_or(rest);
        pairs.push((key.to_string(), value.trim().to_string()));
    }
    if !logical.is_empty() {
        return Err(Error::config(
            "properties text ends inside a continued line",
        ));
    }
    Ok(pairs)
}

#[cfg(test)]
mod tests;
