//! Broker connections.
//!
//! [`Connection`] is one multiplexed connection to one broker: it performs the ApiVersions
//! handshake (KIP-35, KIP-511), negotiates the version of each API (the highest version both
//! sides support), pipelines requests up to [`ConnectionConfig::max_in_flight`] and matches
//! responses to requests by correlation id. Handles are cheap to clone; one background task
//! per connection owns the socket. Its byte stream is opened by the [`Dialer`] of
//! [`ConnectionConfig::dialer`]: direct TCP, a [`Socks5Proxy`] or a user [`Connector`],
//! after mapping advertised addresses.
//!
//! Reference: the "Network" and "Requests" sections of the Kafka protocol guide
//! (<https://kafka.apache.org/protocol#protocol_network>).

mod connection;
mod dial;

pub use connection::{Connection, ConnectionConfig};
pub use dial::{BoxedBrokerStream, BrokerStream, Connector, Dialer, Socks5Proxy};

mod client;

pub use client::{
    Broker, Conn, FetchOptions, Fetched, IsolationLevel, Metadata, NewTopic, PartitionInfo,
    ProduceOptions, RequiredAcks, TopicInfo,
};

#[cfg(test)]
pub(crate) use client::decode_fetch_partition;
pub(crate) use client::{decode_fetch_lazy, decompress_limit, FetchedBatches};
pub(crate) use client::{EARLIEST_TIMESTAMP, LATEST_TIMESTAMP};
