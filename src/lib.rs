//! # kafkapipe
//!
//! A pure-Rust, async Apache Kafka client in which the consumer is a
//! `futures::Stream<Item = Result<Message>>` and the producer is a `futures::Sink`.
//!
//! This release provides the foundation layers, the producer and the consumer:
//!
//! | module | owns |
//! | --- | --- |
//! | [`protocol`] | the wire codec: primitives, headers, one module per API, error codes |
//! | [`record`] | RecordBatch v2 encode/decode, legacy MessageSet v0/v1 decode |
//! | [`compression`] | gzip, snappy, lz4, zstd codecs |
//! | [`conn`] | one broker connection: handshake, version negotiation, pipelining, and the kafka-go style [`Conn`](conn::Conn) API |
//! | [`cluster`] | metadata cache, leader lookup, one connection per broker |
//! | [`writer`] | the producer: [`writer::Writer`], a batching, backpressured `Sink<Message>` |
//! | [`reader`] | the consumer: [`reader::Reader`], a `Stream<Item = Result<Message>>` over assigned partitions with bounded prefetch |
//! | [`admin`] | the admin client: topics, partitions, configs, groups, offsets, records, cluster |
//! | `tls` | TLS settings (rustls; feature `tls`, on by default) |
//! | [`sasl`] | SASL mechanisms: PLAIN, SCRAM-SHA-256/512, OAUTHBEARER |
//! | `mock` | `MockCluster`, an in-process Kafka cluster with fault hooks for tests (feature `mock`) |
//!
//! Consumer groups build on these layers.
//!
//! ```no_run
//! use kafkapipe::conn::{Conn, FetchOptions, ProduceOptions};
//! use kafkapipe::record::Record;
//!
//! # async fn demo() -> kafkapipe::Result<()> {
//! let conn = Conn::connect("127.0.0.1:9092").await?;
//! conn.create_topic("events", 3, 1).await?;
//! let base = conn
//!     .produce("events", 0, &[Record::new("key", "hello")], &ProduceOptions::default())
//!     .await?;
//! let fetched = conn.fetch("events", 0, base, &FetchOptions::default()).await?;
//! assert_eq!(fetched.records[0].value.as_deref(), Some(&b"hello"[..]));
//! # Ok(()) }
//! ```
//!
//! See `DESIGN.md` for how a request flows from a user call to the socket.
#![deny(unsafe_code)]
#![warn(missing_docs)]
#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used, clippy::panic))]

pub mod admin;
mod bufpool;
pub mod cluster;
pub mod compression;
pub mod conn;
mod error;
pub mod group;
#[cfg(feature = "mock")]
pub mod mock;
pub mod protocol;
pub mod reader;
pub mod record;
pub mod sasl;
#[cfg(feature = "tls")]
pub mod tls;
mod util;
pub mod writer;

pub use error::{Error, ErrorKind, Result};

/// The README's Rust examples, compiled as doc tests so they cannot go stale.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
