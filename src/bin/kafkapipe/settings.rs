//! `-X KEY=VALUE`: client settings by their Kafka (Java / librdkafka) names, as kcat
//! passes them to librdkafka, read by the library's one parser
//! ([`kafkapipe::config::Properties`]). Unknown keys and bad values are usage errors.

use kafkapipe::cluster::Cluster;
use kafkapipe::compression::Compression;
use kafkapipe::config::Properties;
use kafkapipe::conn::{FetchOptions, RequiredAcks};
use kafkapipe::reader::ReaderConfig;
use kafkapipe::writer::WriterConfig;

pub use kafkapipe::config::{IGNORED_KEYS, KEYS};

/// The parsed `-X` settings.
#[derive(Debug, Default)]
pub struct Settings {
    props: Properties,
}

/// `acks` values: all, -1, 1, 0 (the `-a` option).
pub fn parse_acks(v: &str) -> Result<RequiredAcks, String> {
    kafkapipe::config::parse_acks(v).map_err(|e| e.to_string())
}

/// Compression codec names (the `-z` option).
pub fn parse_compression(v: &str) -> Result<Compression, String> {
    kafkapipe::config::parse_compression(v).map_err(|e| e.to_string())
}

impl Settings {
    /// Parse `KEY=VALUE` pairs; later pairs override earlier ones. TLS files are read
    /// here, so a missing file is reported before anything connects.
    pub fn parse(pairs: &[String]) -> Result<Settings, String> {
        let mut kv = Vec::with_capacity(pairs.len());
        for pair in pairs {
            let Some((k, v)) = pair.split_once('=') else {
                return Err(format!(
                    "-X wants KEY=VALUE, got {pair:?} (-X list shows the keys)"
                ));
            };
            kv.push((k, v));
        }
        let props = Properties::from_pairs(kv).map_err(|e| format!("-X {e}"))?;
        Ok(Settings { props })
    }

    /// The brokers to bootstrap from: `-b`, else `-X bootstrap.servers`, else
    /// 127.0.0.1:9092.
    pub fn brokers(&self, cli: &[String]) -> Vec<String> {
        if !cli.is_empty() {
            cli.to_vec()
        } else if !self.props.bootstrap_servers().is_empty() {
            self.props.bootstrap_servers().to_vec()
        } else {
            vec!["127.0.0.1:9092".to_string()]
        }
    }

    /// An admin/metadata cluster client for `brokers` with these settings.
    pub fn cluster(&self, brokers: &[String]) -> kafkapipe::Result<Cluster> {
        self.props.cluster(brokers)
    }

    /// Apply the connection and consumer settings.
    pub fn reader(&self, c: ReaderConfig) -> ReaderConfig {
        self.props.apply_to_reader(c)
    }

    /// Apply the connection and producer settings.
    pub fn writer(&self, c: WriterConfig) -> WriterConfig {
        self.props.apply_to_writer(c)
    }

    /// The connection settings (TLS, SASL, client id, timeouts).
    pub fn connection(&self) -> kafkapipe::conn::ConnectionConfig {
        self.props.connection_config()
    }

    /// Fetch options with the `fetch.*` and `isolation.level` settings.
    pub fn fetch_options(&self) -> FetchOptions {
        self.props.apply_to_fetch_options(FetchOptions::default())
    }
}
