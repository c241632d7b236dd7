//! Reading a property map: [`Properties::from_pairs`] (one match over every key of
//! [`KEYS`](super::KEYS), each value parsed and checked, the TLS and SASL inputs
//! collected and built at the end) and Java `.properties` text
//! ([`Properties::from_text`]).
//!
//! May not: build reader, writer or admin configs (`apply.rs` does, from what is read
//! here).

use super::jaas::parse_jaas;
use super::oauth::oauth_extensions;
use super::sasl::SaslInputs;
use super::socks::socks5_proxy;
use super::tls::TlsInputs;
use super::*;

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
                "check.crcs" => c.check_crcs = Some(boolean(k, v)?),
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
}

/// The `(key, value)` pairs of Java `.properties` text (see [`Properties::from_text`]):
/// the key ends at the first `=`, `:` or white space; one `=` or `:` and the white space
/// around it separate it from the value.
pub(super) fn parse_text(text: &str) -> Result<Vec<(String, String)>> {
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
