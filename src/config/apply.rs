//! What a [`Properties`] builds: the [`ConnectionConfig`], [`ReaderConfig`],
//! [`FetchOptions`] and [`WriterConfig`] (or applies to ones given), a [`Cluster`] and
//! an [`Admin`]. Only the settings that were given change a config passed in.
//!
//! May not: read keys (`properties.rs` does).

use crate::admin::Admin;
use crate::cluster::Cluster;
use crate::conn::{ConnectionConfig, FetchOptions};
use crate::error::Result;
use crate::group::CommitMode;
use crate::reader::ReaderConfig;
use crate::writer::WriterConfig;

use super::{bad, Properties};

impl Properties {
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

    /// Applies the connection settings that were given (`client.id`, the connect and
    /// request timeouts, TLS, SASL, `socks5.proxy`) to the embedded connection config of
    /// a reader or writer; the others keep `c`'s values. `request.timeout.ms` sets
    /// [`ConnectionConfig::request_timeout`] for every client.
    fn apply_to_connection(&self, c: &mut ConnectionConfig) {
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
        self.apply_to_connection(&mut c.connection);
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
        if let Some(check) = s.check_crcs {
            c = c.check_crcs(check);
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
        self.apply_to_connection(&mut c.connection);
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
