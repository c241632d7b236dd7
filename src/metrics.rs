//! Metrics through the [`metrics`](https://docs.rs/metrics) facade (feature `metrics`): so
//! any exporter (Prometheus, StatsD, OpenTelemetry, …) sees a running
//! [`Reader`](crate::reader::Reader) or [`Writer`](crate::writer::Writer) the way operators
//! watch the Java client.
//!
//! This module owns the list of metrics (below), the latency counters the reader and its
//! consumer group keep for them, and the publishing loop. The counters themselves are
//! the ones behind [`ReaderStats`](crate::reader::ReaderStats) and
//! [`WriterStats`](crate::writer::WriterStats): each reader and writer spawns one
//! *collector* task that reads them every
//! [`ReaderConfig::metrics_interval`](crate::reader::ReaderConfig::metrics_interval) /
//! [`WriterConfig::metrics_interval`](crate::writer::WriterConfig::metrics_interval)
//! (default 1 s) and once more when the client has closed, and hands them to the
//! installed recorder — counters with `absolute`, gauges with `set`. Reading and writing
//! never call the facade, so the feature costs a task waking once a second; without the
//! feature there is no collector and no latency timing at all.
//!
//! Install a recorder (for example `metrics_exporter_prometheus::PrometheusBuilder`)
//! before creating clients; `examples/metrics_prometheus.rs` serves `/metrics`.
//!
//! ```no_run
//! # async fn demo() -> kafkapipe::Result<()> {
//! use std::time::Duration;
//! use kafkapipe::reader::{Reader, ReaderConfig};
//! // metrics_exporter_prometheus::PrometheusBuilder::new().install_recorder()?;
//! let reader = Reader::new(
//!     ReaderConfig::new(["127.0.0.1:9092"])
//!         .client_id("billing")
//!         .group_id("billing")
//!         .topic("payments")
//!         .metrics_interval(Duration::from_millis(500)),
//! )
//! .await?;
//! // kafka_consumer_records_lag{client_id="billing",topic="payments",partition="0"} …
//! # Ok(()) }
//! ```
//!
//! # The metrics
//!
//! Names are the Java client's metric names (`records-lag`, `fetch-latency-avg`, …) with
//! `kafka_consumer_` or `kafka_producer_` before them and `_` for `-`, as Prometheus
//! spells them; the Java producer's per-topic group (`producer-topic-metrics`) gets
//! `kafka_producer_topic_`, so that a per-topic series never shares its name with the
//! client-wide one of the same Java name (a `sum` over one name then counts each
//! record once). Every metric has the label `client_id` (the configured
//! [`client_id`](crate::reader::ReaderConfig::client_id)); some also `topic` and
//! `partition`, or `broker` (the broker's node id). Latencies are in milliseconds, as in
//! the Java client. Java's `*-rate` metrics are the `*_total` counters here: a rate is
//! the exporter's job (`rate(kafka_producer_record_send_total[1m])`). "Interval" is the
//! collector's interval: an average or maximum over it keeps its last value through
//! intervals without a sample.
//!
//! | name | type | labels | what (Java name) |
//! | --- | --- | --- | --- |
//! | `kafka_consumer_records_consumed_total` | counter | client_id | records fetched and buffered for the application, control records and aborted transactions excluded (`records-consumed-total`) |
//! | `kafka_consumer_bytes_consumed_total` | counter | client_id | their bytes, as [`ReaderStats::bytes`](crate::reader::ReaderStats::bytes) counts them (`bytes-consumed-total`) |
//! | `kafka_consumer_fetch_total` | counter | client_id | fetch requests sent (`fetch-total`) |
//! | `kafka_consumer_fetch_error_total` | counter | client_id | failed fetches and leader lookups (kafkapipe) |
//! | `kafka_consumer_retry_total` | counter | client_id | transient failures retried: fetches, lookups, group requests (kafkapipe) |
//! | `kafka_consumer_offset_reset_total` | counter | client_id | `OffsetOutOfRange` resets (kafkapipe) |
//! | `kafka_consumer_fetch_latency_avg` | gauge | client_id | mean fetch request time over the interval, ms (`fetch-latency-avg`) |
//! | `kafka_consumer_fetch_latency_max` | gauge | client_id | longest fetch request time over the interval, ms (`fetch-latency-max`) |
//! | `kafka_consumer_fetch_throttle_time_avg` | gauge | client_id | mean quota throttle time of the fetch responses over the interval, ms (KIP-219; `fetch-throttle-time-avg`) |
//! | `kafka_consumer_fetch_throttle_time_max` | gauge | client_id | longest quota throttle time of a fetch response since the start, ms (`fetch-throttle-time-max`) |
//! | `kafka_consumer_records_lag` | gauge | client_id, topic, partition | high watermark of the last fetch response − the application's position (`records-lag`) |
//! | `kafka_consumer_records_lag_max` | gauge | client_id | the largest `records_lag` of the assigned partitions (`records-lag-max`) |
//! | `kafka_consumer_assigned_partitions` | gauge | client_id | partitions assigned (`assigned-partitions`) |
//! | `kafka_consumer_buffered_records` | gauge | client_id | records fetched and not yet yielded ([`ReaderStats::queue_length`](crate::reader::ReaderStats::queue_length)) |
//! | `kafka_consumer_commit_total` | counter | client_id | offset commits answered, group readers (`commit-total`) |
//! | `kafka_consumer_commit_latency_avg` | gauge | client_id | mean OffsetCommit time over the interval, ms (`commit-latency-avg`) |
//! | `kafka_consumer_commit_latency_max` | gauge | client_id | longest OffsetCommit time over the interval, ms (`commit-latency-max`) |
//! | `kafka_consumer_rebalance_total` | counter | client_id | rebalances completed: a JoinGroup + SyncGroup answered (classic protocol), or a KIP-848 reconciliation finished (see below) (`rebalance-total`) |
//! | `kafka_consumer_rebalance_latency_avg` | gauge | client_id | mean rebalance time over the interval, ms (`rebalance-latency-avg`) |
//! | `kafka_consumer_rebalance_latency_max` | gauge | client_id | longest rebalance time over the interval, ms (`rebalance-latency-max`) |
//! | `kafka_consumer_rebalance_latency_total` | counter | client_id | time spent in completed rebalances since the start, ms (`rebalance-latency-total`) |
//! | `kafka_consumer_group_generation` | gauge | client_id | the current generation (member epoch with KIP-848), -1 while there is none (kafkapipe) |
//! | `kafka_consumer_connection_count` | gauge | client_id, broker | open connections to the broker: 0 or 1 (sum over `broker` for Java's `connection-count`) |
//! | `kafka_producer_record_send_total` | counter | client_id | records acknowledged (`record-send-total`) |
//! | `kafka_producer_byte_total` | counter | client_id | their bytes, as [`Message::size`](crate::writer::Message::size) counts them (`byte-total`) |
//! | `kafka_producer_record_error_total` | counter | client_id | records failed for good (`record-error-total`) |
//! | `kafka_producer_record_retry_total` | counter | client_id | batch retries (`record-retry-total` counts records) |
//! | `kafka_producer_request_total` | counter | client_id | produce requests sent (`request-total`) |
//! | `kafka_producer_batch_total` | counter | client_id | record batches acknowledged (kafkapipe) |
//! | `kafka_producer_request_latency_avg` | gauge | client_id | mean produce request time over the interval, ms (`request-latency-avg`) |
//! | `kafka_producer_request_latency_max` | gauge | client_id | longest produce request time since the start, ms (`request-latency-max`) |
//! | `kafka_producer_produce_throttle_time_avg` | gauge | client_id | mean quota throttle time of the produce responses over the interval, ms (KIP-219; `produce-throttle-time-avg`) |
//! | `kafka_producer_produce_throttle_time_max` | gauge | client_id | longest quota throttle time of a produce response since the start, ms (`produce-throttle-time-max`) |
//! | `kafka_producer_batch_size_avg` | gauge | client_id | mean encoded (compressed) batch bytes over the interval (`batch-size-avg`) |
//! | `kafka_producer_batch_size_max` | gauge | client_id | largest encoded batch since the start, bytes (`batch-size-max`) |
//! | `kafka_producer_records_per_request_avg` | gauge | client_id | mean records per produce request over the interval (`records-per-request-avg`) |
//! | `kafka_producer_compression_rate_avg` | gauge | client_id | encoded batch bytes / record bytes over the interval (`compression-rate-avg`) |
//! | `kafka_producer_buffer_available_bytes` | gauge | client_id | [`max_buffered_bytes`](crate::writer::WriterConfig::max_buffered_bytes) − buffered bytes (`buffer-available-bytes`) |
//! | `kafka_producer_buffer_total_bytes` | gauge | client_id | [`max_buffered_bytes`](crate::writer::WriterConfig::max_buffered_bytes) (`buffer-total-bytes`) |
//! | `kafka_producer_queued_records` | gauge | client_id | records accepted and not yet acknowledged or failed (kafkapipe) |
//! | `kafka_producer_connection_count` | gauge | client_id, broker | open connections to the broker: 0 or 1 (`connection-count`) |
//! | `kafka_producer_record_queue_time_avg` | gauge | client_id | mean time a batch waited in the writer before it was first sent, over the interval, ms: from its oldest message's acceptance to its produce request ([`WriterStats::queue_time_avg`](crate::writer::WriterStats::queue_time_avg); `record-queue-time-avg`) |
//! | `kafka_producer_record_queue_time_max` | gauge | client_id | longest such wait since the start, ms (`record-queue-time-max`) |
//! | `kafka_producer_topic_record_send_total` | counter | client_id, topic | the topic's records acknowledged (`producer-topic-metrics` `record-send-total`) |
//! | `kafka_producer_topic_byte_total` | counter | client_id, topic | their bytes, as [`Message::size`](crate::writer::Message::size) counts them (`byte-total`) |
//! | `kafka_producer_topic_record_error_total` | counter | client_id, topic | the topic's records failed for good (`record-error-total`) |
//! | `kafka_producer_topic_compression_rate` | gauge | client_id, topic | encoded batch bytes / record bytes of the topic's acknowledged batches over the interval (`compression-rate`) |
//!
//! A rebalance with the classic protocol is a JoinGroup + SyncGroup, timed from the
//! JoinGroup request to the SyncGroup answer. With KIP-848
//! ([`GroupProtocol::Consumer`](crate::group::GroupProtocol::Consumer)) it is a
//! reconciliation: timed from the heartbeat answer that brought a target assignment
//! the member did not own to the moment it owns it (revoked partitions committed,
//! given up and acknowledged, added ones started), as the Java client's KIP-848
//! consumer times its `RECONCILING` state. A member epoch that moves without changing the
//! member's partitions is no rebalance; a reconciliation cut short by a lost
//! membership is not counted.
//!
//! The per-topic counters cost nothing without the feature: they are kept only when
//! it is on (one lookup per finished batch).
//!
//! A partition's `records_lag` is set while it is assigned; after a revocation it keeps
//! its last value in the recorder unless the exporter drops idle metrics (Prometheus:
//! `PrometheusBuilder::idle_timeout`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// A latency measured per request: count, total and largest since the last look, lock
/// free. The collector takes the maximum out ([`Latency::take`]), so it is per interval.
#[derive(Debug, Default)]
pub(crate) struct Latency {
    count: AtomicU64,
    micros: AtomicU64,
    max_micros: AtomicU64,
}

impl Latency {
    /// One request took `d`.
    pub(crate) fn record(&self, d: Duration) {
        let us = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        self.count.fetch_add(1, Ordering::Relaxed);
        self.micros.fetch_add(us, Ordering::Relaxed);
        self.max_micros.fetch_max(us, Ordering::Relaxed);
    }

    /// `(count, total µs)` since the start.
    #[cfg(test)]
    pub(crate) fn totals(&self) -> (u64, u64) {
        (
            self.count.load(Ordering::Relaxed),
            self.micros.load(Ordering::Relaxed),
        )
    }

    /// `(count, total µs)` since the start, and the largest µs since the last `take`.
    pub(crate) fn take(&self) -> (u64, u64, u64) {
        (
            self.count.load(Ordering::Relaxed),
            self.micros.load(Ordering::Relaxed),
            self.max_micros.swap(0, Ordering::Relaxed),
        )
    }
}

/// A consumer group's timings: OffsetCommit requests, and rebalances — JoinGroup +
/// SyncGroup (classic protocol), or a KIP-848 reconciliation from the heartbeat answer
/// that brought its target assignment to the member owning it.
#[derive(Debug, Default)]
pub(crate) struct GroupTimings {
    pub(crate) commit: Latency,
    pub(crate) rebalance: Latency,
}

/// A cumulative `(count, sum)` pair turned into per-interval means: the mean of what was
/// added since the previous call, or `None` when nothing was.
#[derive(Debug, Default)]
pub(crate) struct Window {
    count: u64,
    sum: u64,
}

impl Window {
    pub(crate) fn mean(&mut self, count: u64, sum: u64) -> Option<f64> {
        let dc = count.saturating_sub(self.count);
        let ds = sum.saturating_sub(self.sum);
        self.count = count;
        self.sum = sum;
        (dc > 0).then(|| ds as f64 / dc as f64)
    }
}

/// Runs `publish` every `interval`, and a last time when `done` resolves (the client
/// closed or was dropped) or when `publish` says the client is gone (returns `false`).
pub(crate) async fn collect(
    interval: Duration,
    done: impl std::future::Future<Output = ()>,
    mut publish: impl FnMut() -> bool,
) {
    let mut tick = tokio::time::interval(interval.max(Duration::from_millis(1)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tokio::pin!(done);
    loop {
        tokio::select! {
            _ = tick.tick() => {
                if !publish() {
                    return;
                }
            }
            () = &mut done => {
                publish();
                return;
            }
        }
    }
}

/// Publishes the `connection_count` gauge of every broker `cluster` knows.
pub(crate) struct Connections {
    prefix: &'static str,
    client_id: String,
    gauges: std::collections::HashMap<i32, metrics::Gauge>,
}

impl Connections {
    pub(crate) fn new(prefix: &'static str, client_id: &str) -> Self {
        Connections {
            prefix,
            client_id: client_id.to_string(),
            gauges: Default::default(),
        }
    }

    pub(crate) fn publish(&mut self, cluster: &crate::cluster::Cluster) {
        for (id, _) in cluster.brokers() {
            let open = cluster.open_connection(id).is_some();
            let (prefix, client_id) = (self.prefix, &self.client_id);
            self.gauges
                .entry(id)
                .or_insert_with(|| {
                    metrics::gauge!(format!("{prefix}_connection_count"),
                        "client_id" => client_id.clone(), "broker" => id.to_string())
                })
                .set(if open { 1.0 } else { 0.0 });
        }
    }

    /// Every connection is closed.
    pub(crate) fn closed(&mut self) {
        for g in self.gauges.values() {
            g.set(0.0);
        }
    }
}

/// Microseconds as the milliseconds the metrics are in.
pub(crate) fn ms(micros: f64) -> f64 {
    micros / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latency_max_is_per_take_and_the_window_means_what_was_added() {
        let l = Latency::default();
        l.record(Duration::from_millis(2));
        l.record(Duration::from_millis(4));
        assert_eq!(l.take(), (2, 6000, 4000));
        assert_eq!(l.take(), (2, 6000, 0));
        let mut w = Window::default();
        assert_eq!(w.mean(2, 6000), Some(3000.0));
        assert_eq!(w.mean(2, 6000), None);
        l.record(Duration::from_millis(1));
        let (c, s, _) = l.take();
        assert_eq!(w.mean(c, s), Some(1000.0));
    }
}
