//! [`Conn`]: the low-level, kafka-go style API over one broker [`Connection`].
//!
//! A `Conn` talks to exactly one broker. It does not follow leaders or retry: a request
//! for a partition this broker does not lead fails with `NotLeaderOrFollower`, which is
//! retriable, and the caller (or the `Writer`/`Reader` built on top) decides what to do.
//! Use [`Conn::dial_leader`] to connect to the leader of a partition through any
//! bootstrap broker, as kafka-go's `DialLeader` does.
//!
//! # Files
//!
//! - this file: the [`Conn`] handle (connect, dial the leader, close);
//! - `types.rs`: the public option and result types ([`ProduceOptions`],
//!   [`FetchOptions`], [`Fetched`], [`Metadata`], [`NewTopic`]…), plain data;
//! - `topics.rs`: Metadata, CreateTopics, DeleteTopics, and the topic-id cache that
//!   Produce and Fetch v13+ need;
//! - `produce.rs`: Produce of one batch to one partition;
//! - `fetch.rs`: Fetch of one partition, and the decoding of a fetch response's
//!   partition (visible batches, aborted transactions, the decompression budget) that
//!   the `Reader` shares;
//! - `offsets.rs`: ListOffsets and OffsetForLeaderEpoch of one partition;
//! - `tests.rs`: unit tests of the fetch decoding.

use std::collections::HashMap;
use std::sync::Mutex;

use super::{Connection, ConnectionConfig};
use crate::error::{Error, Result};
use crate::protocol::ErrorCode;

mod fetch;
mod offsets;
mod produce;
#[cfg(test)]
mod tests;
mod topics;
mod types;

#[cfg(test)]
pub(crate) use fetch::decode_fetch_partition;
pub(crate) use fetch::{decode_fetch_lazy, decompress_limit, FetchedBatches};
pub use types::{
    Broker, FetchOptions, Fetched, IsolationLevel, Metadata, NewTopic, PartitionInfo,
    ProduceOptions, RequiredAcks, TopicInfo,
};

pub(crate) const EARLIEST_TIMESTAMP: i64 = -2;
pub(crate) const LATEST_TIMESTAMP: i64 = -1;
const ZERO_UUID: [u8; 16] = [0; 16];

/// A low-level connection to one broker, in the spirit of kafka-go's `Conn`.
///
/// ```no_run
/// use kafkapipe::conn::{Conn, FetchOptions, ProduceOptions};
/// use kafkapipe::record::Record;
///
/// # async fn demo() -> kafkapipe::Result<()> {
/// let conn = Conn::connect("127.0.0.1:9092").await?;
/// conn.create_topic("events", 3, 1).await?;
/// let offset = conn
///     .produce("events", 0, &[Record::new("k", "v")], &ProduceOptions::default())
///     .await?;
/// let fetched = conn.fetch("events", 0, offset, &FetchOptions::default()).await?;
/// assert_eq!(fetched.records[0].value.as_deref(), Some(&b"v"[..]));
/// # Ok(()) }
/// ```
///
/// # Cancellation safety
///
/// Every method is cancel safe in the sense of [`Connection::send`]: dropping the future
/// never leaves the connection out of sync, and the `Conn` stays usable. What is not
/// known is whether the broker acted on a request already handed to the connection: it
/// is written whole and its response read and discarded, so a dropped `produce` may or
/// may not have been written, and a dropped `create_topics` or `delete_topics` may or
/// may not have taken effect (look at the metadata to find out). Calls that make
/// several requests — `dial_leader` (Metadata, then a new connection), a `fetch` that
/// first looks up the topic's id — stop between them. A `connect` dropped midway
/// leaves nothing open: a half-made connection closes with its last handle.
#[derive(Debug)]
pub struct Conn {
    connection: Connection,
    topic_ids: Mutex<HashMap<String, [u8; 16]>>,
}

impl Conn {
    /// Connect to the broker at `addr` (`host:port`) with the default configuration.
    pub async fn connect(addr: &str) -> Result<Conn> {
        Self::connect_with(addr, ConnectionConfig::default()).await
    }

    /// Connect to the broker at `addr` with `config`: TLS and SASL as
    /// [`ConnectionConfig::tls`] and [`ConnectionConfig::sasl`] say (see
    /// [`Connection::connect`]).
    ///
    /// ```no_run
    /// use kafkapipe::conn::{Conn, ConnectionConfig};
    /// use kafkapipe::sasl::Scram;
    /// use kafkapipe::tls::TlsConfig;
    ///
    /// # async fn demo() -> kafkapipe::Result<()> {
    /// let config = ConnectionConfig::new()
    ///     .tls(TlsConfig::builder().ca_file("ca.pem")?.build()?)
    ///     .sasl(Scram::sha256("alice", "secret"));
    /// let conn = Conn::connect_with("broker:9093", config).await?;
    /// # Ok(()) }
    /// ```
    pub async fn connect_with(addr: &str, config: ConnectionConfig) -> Result<Conn> {
        Ok(Self::from_connection(
            Connection::connect(addr, config).await?,
        ))
    }

    /// Wrap an established [`Connection`].
    pub fn from_connection(connection: Connection) -> Conn {
        Conn {
            connection,
            topic_ids: Mutex::new(HashMap::new()),
        }
    }

    /// Connect to the leader of `topic`/`partition`, asking the broker at `bootstrap` who
    /// it is (kafka-go's `DialLeader`).
    pub async fn dial_leader(
        bootstrap: &str,
        topic: &str,
        partition: i32,
        config: ConnectionConfig,
    ) -> Result<Conn> {
        let boot = Conn::connect_with(bootstrap, config.clone()).await?;
        let md = boot.metadata(Some(&[topic])).await?;
        let t = md
            .topic(topic)
            .ok_or_else(|| Error::kafka(ErrorCode::UnknownTopicOrPartition).with_topic(topic))?;
        if let Some(code) = t.error {
            return Err(Error::kafka(code).with_topic(topic));
        }
        let p = t
            .partitions
            .iter()
            .find(|p| p.id == partition)
            .ok_or_else(|| {
                Error::kafka(ErrorCode::UnknownTopicOrPartition)
                    .with_topic(topic)
                    .with_partition(partition)
            })?;
        let leader = md.broker(p.leader).ok_or_else(|| {
            Error::kafka(ErrorCode::LeaderNotAvailable)
                .with_topic(topic)
                .with_partition(partition)
        })?;
        let addr = leader.addr();
        if addr == boot.connection.broker() {
            return Ok(boot);
        }
        boot.close().await;
        Conn::connect_with(&addr, config).await
    }

    /// The underlying connection.
    pub fn connection(&self) -> &Connection {
        &self.connection
    }

    /// Close the connection; in-flight requests fail with a closed error.
    pub async fn close(&self) {
        self.connection.close().await;
    }

    fn err(&self, code: ErrorCode, topic: &str, partition: i32) -> Error {
        Error::kafka(code)
            .with_topic(topic)
            .with_partition(partition)
            .with_broker(self.connection.broker())
    }
}
