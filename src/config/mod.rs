//! Client settings by their Java / librdkafka property names: [`Properties`] turns a map
//! such as `bootstrap.servers`, `security.protocol`, `sasl.jaas.config`, `ssl.*`,
//! `group.id`, `acks`, `linger.ms` into the [`ConnectionConfig`], [`ReaderConfig`](crate::reader::ReaderConfig),
//! [`WriterConfig`](crate::writer::WriterConfig) and [`Admin`](crate::admin::Admin) of this crate, so that property maps passed through by
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
//!
//! # Files
//!
//! - this file: the key tables ([`KEYS`], [`IGNORED_KEYS`]), [`Properties`] and the
//!   consumer and producer settings it holds, the value parsers shared by the others
//!   (milliseconds, numbers, booleans, `acks`, compression, assignors);
//! - `properties.rs`: reading the pairs ([`Properties::from_pairs`]: one match over the
//!   keys) and Java `.properties` text ([`Properties::from_text`]);
//! - `apply.rs`: what a `Properties` builds — the connection, reader, writer and fetch
//!   settings, a `Cluster`, an `Admin`;
//! - `tls.rs`: the `ssl.*` inputs built into a `TlsConfig`;
//! - `sasl.rs`: the `sasl.*` inputs built into a SASL mechanism (PLAIN, SCRAM, GSSAPI);
//! - `oauth.rs`: the OAUTHBEARER inputs (OIDC client credentials, KIP-768);
//! - `jaas.rs`: the `sasl.jaas.config` parser;
//! - `socks.rs`: the `socks5.proxy` URL;
//! - `tests.rs`: the unit and property tests.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::compression::Compression;
use crate::conn::{ConnectionConfig, IsolationLevel, RequiredAcks};
use crate::error::{Error, Result};
use crate::group::GroupProtocol;
use crate::reader::{OffsetReset, StartOffset};

mod apply;
mod jaas;
mod oauth;
mod properties;
mod sasl;
mod socks;
mod tls;

#[cfg(test)]
mod tests;

#[cfg(test)]
use jaas::parse_jaas;
#[cfg(test)]
use properties::parse_text;

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
    ("check.crcs", "whether fetched batches' CRCs are verified (default true)"),
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
    check_crcs: Option<bool>,
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
