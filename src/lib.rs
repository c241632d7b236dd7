//! # kafkapipe
//!
//! A pure-Rust, async Apache Kafka client for `futures` pipelines: the consumer
//! ([`reader::Reader`]) is a `Stream<Item = Result<Message>>`, the producer
//! ([`writer::Writer`]) is a `Sink<Message>`, and a consumer group commits only what the
//! pipeline has processed (every message carries an [`AckToken`](group::AckToken)).
//!
//! ```no_run
//! use futures::{future::ready, StreamExt, TryStreamExt};
//! use kafkapipe::reader::{Reader, ReaderConfig};
//! use kafkapipe::writer::{Message, Writer, WriterConfig};
//!
//! # async fn demo() -> kafkapipe::Result<()> {
//! let brokers = ["127.0.0.1:9092"];
//! let mut reader =
//!     Reader::new(ReaderConfig::new(brokers).group_id("uppercaser").topic("clicks")).await?;
//! let mut writer = Writer::new(WriterConfig::new(brokers).topic("clicks-upper"))?;
//! let result = (&mut reader)
//!     .try_filter(|m| ready(m.value.is_some()))
//!     .map_ok(|m| {
//!         let upper = m.value.as_deref().unwrap_or_default().to_ascii_uppercase();
//!         Message::from(m).with_value(upper) // carries m's ack token to the writer
//!     })
//!     .forward(&mut writer)
//!     .await;
//! reader.close().await; // on success and on error: commit what was processed, leave
//! result
//! # }
//! ```
//!
//! | module | owns |
//! | --- | --- |
//! | [`reader`] | the consumer: [`reader::Reader`] over assigned partitions or a consumer group, bounded prefetch, seek, lag |
//! | [`share`] | share groups (KIP-932, Kafka as a queue): [`share::ShareReader`], per-record ACCEPT/RELEASE/REJECT through the ack tokens |
//! | [`group`] | consumer groups (classic and KIP-848), rebalance events, ack tokens, the [`Committer`](group::Committer) sink, offset stores |
//! | [`writer`] | the producer: [`writer::Writer`], balancers, idempotence, transactions and the exactly-once pipeline sink |
//! | [`admin`] | the admin client: topics, partitions, configs, groups, offsets, records, cluster |
//! | [`config`] | client settings by their Java / librdkafka property names ([`config::Properties`]) |
//! | [`cluster`] | metadata cache, leader lookup, one connection per broker |
//! | [`conn`] | one broker connection: handshake, version negotiation, pipelining, and the kafka-go style [`Conn`](conn::Conn) API |
//! | `tls` | TLS settings (rustls; feature `tls`, on by default): system roots by default, PEM and PKCS#12 stores |
//! | [`sasl`] | SASL mechanisms: PLAIN, SCRAM-SHA-256/512, OAUTHBEARER (own provider, OIDC client credentials, AWS MSK IAM) |
//! | [`record`] | RecordBatch v2 encode/decode, legacy MessageSet v0/v1 decode |
//! | [`compression`] | gzip, snappy, lz4, zstd codecs |
//! | [`protocol`] | the wire codec: primitives, headers, one module per API, error codes |
//! | `metrics` | the metrics published through the `metrics` facade, and their collectors (feature `metrics`) |
//! | `trace_context` | W3C `traceparent` in record headers: `TraceContext` (feature `trace-context`) |
//! | `mock` | `MockCluster`, an in-process Kafka cluster with fault hooks for tests (feature `mock`) |
//!
//! `DESIGN.md` in the repository has the layers, the file map, and how a request and a
//! message flow.
#![deny(unsafe_code)]
#![warn(missing_docs)]
#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used, clippy::panic))]

mod ack;
pub mod admin;
mod bufpool;
pub mod cluster;
mod common;
pub mod compression;
pub mod config;
pub mod conn;
mod coordinator;
mod eos;
mod error;
pub mod group;
#[cfg(feature = "metrics")]
pub mod metrics;
#[cfg(feature = "mock")]
pub mod mock;
pub mod protocol;
pub mod reader;
pub mod record;
pub mod sasl;
pub mod share;
#[cfg(feature = "tls")]
pub mod tls;
#[cfg(feature = "trace-context")]
pub mod trace_context;
mod util;
pub mod writer;

pub use error::{Error, ErrorKind, Result};

/// The README's Rust examples, compiled as doc tests so they cannot go stale.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
