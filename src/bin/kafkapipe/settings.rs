//! `-X KEY=VALUE`: client settings by their Kafka (Java / librdkafka) names, as kcat
//! passes them to librdkafka. Unknown keys and bad values are usage errors.

use std::sync::Arc;
use std::time::Duration;

use kafkapipe::cluster::Cluster;
use kafkapipe::compression::Compression;
use kafkapipe::conn::{ConnectionConfig, IsolationLevel, RequiredAcks};
use kafkapipe::group::CommitMode;
use kafkapipe::reader::ReaderConfig;
use kafkapipe::sasl::{Mechanism, Plain, Scram};
use kafkapipe::tls::TlsConfig;
use kafkapipe::writer::WriterConfig;

/// Every accepted key, with what it sets (printed by `-X list`).
pub const KEYS: &[(&str, &str)] = &[
    (
        "client.id",
        "client id sent with every request (default kafkapipe)",
    ),
    (
        "security.protocol",
        "plaintext | ssl | sasl_plaintext | sasl_ssl (default plaintext)",
    ),
    (
        "sasl.mechanism",
        "PLAIN | SCRAM-SHA-256 | SCRAM-SHA-512 (alias sasl.mechanisms)",
    ),
    ("sasl.username", "SASL user name"),
    ("sasl.password", "SASL password"),
    (
        "ssl.ca.location",
        "PEM file of the CA certificates to trust",
    ),
    (
        "ssl.certificate.location",
        "PEM file of the client certificate (mutual TLS)",
    ),
    (
        "ssl.key.location",
        "PEM file of the client certificate's key",
    ),
    (
        "ssl.server.name",
        "name to verify broker certificates against (default: the host dialed)",
    ),
    (
        "socket.connection.setup.timeout.ms",
        "TCP (+TLS) connect timeout",
    ),
    ("request.timeout.ms", "timeout of one request"),
    (
        "session.timeout.ms",
        "consumer group session timeout (default 10000)",
    ),
    ("heartbeat.interval.ms", "consumer group heartbeat interval"),
    (
        "max.poll.interval.ms",
        "consumer group rebalance timeout (default 60000)",
    ),
    ("group.instance.id", "static group membership id"),
    (
        "auto.commit.interval.ms",
        "group commit interval (default 1000)",
    ),
    ("fetch.min.bytes", "least data a fetch waits for"),
    ("fetch.max.bytes", "most data of one fetch response"),
    (
        "max.partition.fetch.bytes",
        "most data per partition of one fetch",
    ),
    (
        "fetch.wait.max.ms",
        "how long a fetch waits for fetch.min.bytes (alias fetch.max.wait.ms)",
    ),
    ("isolation.level", "read_uncommitted | read_committed"),
    (
        "acks",
        "produce: all | -1 | 1 | 0 (alias request.required.acks)",
    ),
    (
        "compression.type",
        "produce: none | gzip | snappy | lz4 | zstd (alias compression.codec)",
    ),
    (
        "linger.ms",
        "produce: how long a batch waits for more records",
    ),
    ("batch.num.messages", "produce: most records per batch"),
    ("batch.size", "produce: most bytes per batch"),
    ("enable.idempotence", "produce: true | false"),
    (
        "delivery.timeout.ms",
        "produce: how long a record may take to be delivered (alias message.timeout.ms)",
    ),
];

/// The parsed `-X` settings.
#[derive(Debug, Default)]
pub struct Settings {
    /// Client id, TLS, SASL and timeouts of every connection.
    pub conn: ConnectionConfig,
    /// `session.timeout.ms` (group members).
    session_timeout: Option<Duration>,
    /// `heartbeat.interval.ms`.
    heartbeat_interval: Option<Duration>,
    /// `max.poll.interval.ms`: the rebalance timeout.
    rebalance_timeout: Option<Duration>,
    /// `group.instance.id`: static membership.
    group_instance_id: Option<String>,
    /// `auto.commit.interval.ms`.
    commit_interval: Option<Duration>,
    /// `fetch.min.bytes`.
    pub fetch_min_bytes: Option<i32>,
    /// `fetch.max.bytes`.
    pub fetch_max_bytes: Option<i32>,
    /// `max.partition.fetch.bytes`.
    pub max_partition_fetch_bytes: Option<i32>,
    /// `fetch.wait.max.ms`.
    pub fetch_max_wait: Option<Duration>,
    /// `isolation.level`.
    pub isolation_level: Option<IsolationLevel>,
    /// `acks` (producer).
    acks: Option<RequiredAcks>,
    /// `compression.type` (producer).
    compression: Option<Compression>,
    /// `linger.ms`.
    linger: Option<Duration>,
    /// `batch.num.messages`.
    batch_messages: Option<usize>,
    /// `batch.size`.
    batch_bytes: Option<usize>,
    /// `enable.idempotence`.
    idempotent: Option<bool>,
    /// `delivery.timeout.ms`.
    delivery_timeout: Option<Duration>,
}

fn millis(key: &str, v: &str) -> Result<Duration, String> {
    v.parse::<u64>()
        .map(Duration::from_millis)
        .map_err(|_| format!("-X {key}: expected milliseconds, got {v:?}"))
}

fn number<T: std::str::FromStr>(key: &str, v: &str) -> Result<T, String> {
    v.parse()
        .map_err(|_| format!("-X {key}: expected a number, got {v:?}"))
}

/// `acks` values: all, -1, 1, 0.
pub fn parse_acks(v: &str) -> Result<RequiredAcks, String> {
    match v.to_ascii_lowercase().as_str() {
        "all" | "-1" => Ok(RequiredAcks::All),
        "1" => Ok(RequiredAcks::Leader),
        "0" => Ok(RequiredAcks::None),
        _ => Err(format!("acks: expected all, -1, 1 or 0, got {v:?}")),
    }
}

/// Compression codec names.
pub fn parse_compression(v: &str) -> Result<Compression, String> {
    match v.to_ascii_lowercase().as_str() {
        "none" => Ok(Compression::None),
        "gzip" => Ok(Compression::Gzip),
        "snappy" => Ok(Compression::Snappy),
        "lz4" => Ok(Compression::Lz4),
        "zstd" => Ok(Compression::Zstd),
        _ => Err(format!(
            "compression: expected none, gzip, snappy, lz4 or zstd, got {v:?}"
        )),
    }
}

impl Settings {
    /// Parse `KEY=VALUE` pairs; later pairs override earlier ones. TLS files are read
    /// here, so a missing file is reported before anything connects.
    pub fn parse(pairs: &[String]) -> Result<Settings, String> {
        let mut s = Settings::default();
        let mut protocol = "plaintext".to_string();
        let (mut mechanism, mut user, mut password) = (None, None, None);
        let (mut ca, mut cert, mut key, mut server_name) = (None, None, None, None);
        for pair in pairs {
            let Some((k, v)) = pair.split_once('=') else {
                return Err(format!(
                    "-X wants KEY=VALUE, got {pair:?} (-X list shows the keys)"
                ));
            };
            let (k, v) = (k.trim(), v.trim());
            match k {
                "client.id" => s.conn.client_id = v.to_string(),
                "security.protocol" => protocol = v.to_ascii_lowercase(),
                "sasl.mechanism" | "sasl.mechanisms" => mechanism = Some(v.to_ascii_uppercase()),
                "sasl.username" => user = Some(v.to_string()),
                "sasl.password" => password = Some(v.to_string()),
                "ssl.ca.location" => ca = Some(v.to_string()),
                "ssl.certificate.location" => cert = Some(v.to_string()),
                "ssl.key.location" => key = Some(v.to_string()),
                "ssl.server.name" => server_name = Some(v.to_string()),
                "socket.connection.setup.timeout.ms" => s.conn.connect_timeout = millis(k, v)?,
                "request.timeout.ms" => s.conn.request_timeout = millis(k, v)?,
                "session.timeout.ms" => s.session_timeout = Some(millis(k, v)?),
                "heartbeat.interval.ms" => s.heartbeat_interval = Some(millis(k, v)?),
                "max.poll.interval.ms" => s.rebalance_timeout = Some(millis(k, v)?),
                "group.instance.id" => s.group_instance_id = Some(v.to_string()),
                "auto.commit.interval.ms" => s.commit_interval = Some(millis(k, v)?),
                "fetch.min.bytes" => s.fetch_min_bytes = Some(number(k, v)?),
                "fetch.max.bytes" => s.fetch_max_bytes = Some(number(k, v)?),
                "max.partition.fetch.bytes" => s.max_partition_fetch_bytes = Some(number(k, v)?),
                "fetch.wait.max.ms" | "fetch.max.wait.ms" => s.fetch_max_wait = Some(millis(k, v)?),
                "isolation.level" => {
                    s.isolation_level = Some(match v.to_ascii_lowercase().as_str() {
                        "read_uncommitted" => IsolationLevel::ReadUncommitted,
                        "read_committed" => IsolationLevel::ReadCommitted,
                        _ => {
                            return Err(format!(
                                "-X {k}: expected read_uncommitted or read_committed, got {v:?}"
                            ))
                        }
                    })
                }
                "acks" | "request.required.acks" => {
                    s.acks = Some(parse_acks(v).map_err(|e| format!("-X {e}"))?)
                }
                "compression.type" | "compression.codec" => {
                    s.compression = Some(parse_compression(v).map_err(|e| format!("-X {e}"))?)
                }
                "linger.ms" => s.linger = Some(millis(k, v)?),
                "batch.num.messages" => s.batch_messages = Some(number(k, v)?),
                "batch.size" => s.batch_bytes = Some(number(k, v)?),
                "enable.idempotence" => {
                    s.idempotent = Some(
                        v.parse()
                            .map_err(|_| format!("-X {k}: expected true or false, got {v:?}"))?,
                    )
                }
                "delivery.timeout.ms" | "message.timeout.ms" => {
                    s.delivery_timeout = Some(millis(k, v)?)
                }
                _ => return Err(format!("unknown -X setting {k:?} (-X list shows the keys)")),
            }
        }
        let (tls, sasl) = match protocol.as_str() {
            "plaintext" => (false, false),
            "ssl" => (true, false),
            "sasl_plaintext" => (false, true),
            "sasl_ssl" => (true, true),
            other => {
                return Err(format!(
                    "-X security.protocol: expected plaintext, ssl, sasl_plaintext or sasl_ssl, got {other:?}"
                ))
            }
        };
        if sasl {
            let (Some(user), Some(password)) = (user, password) else {
                return Err(format!(
                    "-X security.protocol={protocol} needs -X sasl.username and -X sasl.password"
                ));
            };
            let m: Arc<dyn Mechanism> = match mechanism.as_deref().unwrap_or("PLAIN") {
                "PLAIN" => Arc::new(Plain::new(user, password)),
                "SCRAM-SHA-256" => Arc::new(Scram::sha256(user, password)),
                "SCRAM-SHA-512" => Arc::new(Scram::sha512(user, password)),
                other => {
                    return Err(format!(
                        "-X sasl.mechanism: expected PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512, got {other:?}"
                    ))
                }
            };
            s.conn.sasl = Some(m);
        } else if mechanism.is_some() || user.is_some() || password.is_some() {
            return Err(format!(
                "-X sasl.* settings need -X security.protocol=sasl_plaintext or sasl_ssl (it is {protocol})"
            ));
        }
        if tls {
            let Some(ca) = ca else {
                return Err(format!(
                    "-X security.protocol={protocol} needs -X ssl.ca.location=FILE"
                ));
            };
            let mut b = TlsConfig::builder()
                .ca_file(&ca)
                .map_err(|e| format!("-X ssl.ca.location={ca}: {e}"))?;
            match (cert, key) {
                (Some(cert), Some(key)) => {
                    b = b
                        .client_cert_files(&cert, &key)
                        .map_err(|e| format!("-X ssl.certificate.location/ssl.key.location: {e}"))?
                }
                (None, None) => {}
                _ => {
                    return Err(
                        "-X ssl.certificate.location and ssl.key.location go together".into(),
                    )
                }
            }
            if let Some(name) = server_name {
                b = b.server_name(name);
            }
            s.conn.tls = Some(b.build().map_err(|e| format!("TLS settings: {e}"))?);
        } else if ca.is_some() || cert.is_some() || key.is_some() || server_name.is_some() {
            return Err(format!(
                "-X ssl.* settings need -X security.protocol=ssl or sasl_ssl (it is {protocol})"
            ));
        }
        Ok(s)
    }

    /// An admin/metadata cluster client for `brokers` with these settings.
    pub fn cluster(&self, brokers: &[String]) -> kafkapipe::Result<Cluster> {
        Cluster::new(brokers.to_vec(), self.conn.clone())
    }

    /// Apply the connection and consumer settings.
    pub fn reader(&self, mut c: ReaderConfig) -> ReaderConfig {
        c.client_id = self.conn.client_id.clone();
        c.connect_timeout = self.conn.connect_timeout;
        c.request_timeout = self.conn.request_timeout;
        c.tls = self.conn.tls.clone();
        c.sasl = self.conn.sasl.clone();
        if let Some(d) = self.session_timeout {
            c = c.session_timeout(d);
        }
        if let Some(d) = self.heartbeat_interval {
            c = c.heartbeat_interval(d);
        }
        if let Some(d) = self.rebalance_timeout {
            c = c.rebalance_timeout(d);
        }
        if let Some(id) = &self.group_instance_id {
            c = c.group_instance_id(id.clone());
        }
        if let Some(d) = self.commit_interval {
            c = c.commit_mode(CommitMode::Interval(d));
        }
        if let Some(n) = self.fetch_min_bytes {
            c = c.min_bytes(n);
        }
        if let Some(n) = self.fetch_max_bytes {
            c = c.max_bytes(n);
        }
        if let Some(n) = self.max_partition_fetch_bytes {
            c = c.max_partition_bytes(n);
        }
        if let Some(d) = self.fetch_max_wait {
            c = c.max_wait(d);
        }
        if let Some(l) = self.isolation_level {
            c = c.isolation_level(l);
        }
        c
    }

    /// Apply the connection and producer settings.
    pub fn writer(&self, mut c: WriterConfig) -> WriterConfig {
        c.client_id = self.conn.client_id.clone();
        c.connect_timeout = self.conn.connect_timeout;
        c.tls = self.conn.tls.clone();
        c.sasl = self.conn.sasl.clone();
        if let Some(a) = self.acks {
            c = c.required_acks(a);
        }
        if let Some(z) = self.compression {
            c = c.compression(z);
        }
        if let Some(d) = self.linger {
            c = c.batch_timeout(d);
        }
        if let Some(n) = self.batch_messages {
            c = c.batch_size(n);
        }
        if let Some(n) = self.batch_bytes {
            c = c.batch_bytes(n);
        }
        if let Some(on) = self.idempotent {
            c = c.idempotent(on);
        }
        if let Some(d) = self.delivery_timeout {
            c = c.delivery_timeout(d);
        }
        c
    }
}
