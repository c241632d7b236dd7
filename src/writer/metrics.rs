//! The writer's metrics collector (feature `metrics`): publishes the counters behind
//! [`WriterStats`](super::WriterStats) to the `metrics` facade. The list is in
//! [`crate::metrics`].

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use metrics::{counter, gauge, Counter, Gauge};

use super::shared::TopicCounters;
use super::{Shared, WriterConfig};
use crate::cluster::Cluster;
use crate::metrics::{ms, Connections, Window};

/// The metric handles of one writer, registered once.
struct Published {
    records: Counter,
    bytes: Counter,
    errors: Counter,
    retries: Counter,
    requests: Counter,
    batches: Counter,
    latency_avg: Gauge,
    latency_max: Gauge,
    latency_window: Window,
    batch_size_avg: Gauge,
    batch_size_max: Gauge,
    batch_window: Window,
    per_request_avg: Gauge,
    per_request_window: Window,
    compression_avg: Gauge,
    compression_window: Window,
    available: Gauge,
    total: Gauge,
    queued: Gauge,
    throttle_avg: Gauge,
    throttle_max: Gauge,
    throttle_window: Window,
    queue_time_avg: Gauge,
    queue_time_max: Gauge,
    queue_window: Window,
    topics: HashMap<Arc<str>, TopicPublished>,
    client_id: String,
    connections: Connections,
}

/// The metric handles of one topic (Java's `producer-topic-metrics`).
struct TopicPublished {
    records: Counter,
    bytes: Counter,
    errors: Counter,
    compression: Gauge,
    compression_window: Window,
}

impl TopicPublished {
    fn new(client_id: &str, topic: &str) -> Self {
        let (id, t) = (|| client_id.to_string(), || topic.to_string());
        TopicPublished {
            records: counter!("kafka_producer_topic_record_send_total",
                "client_id" => id(), "topic" => t()),
            bytes: counter!("kafka_producer_topic_byte_total", "client_id" => id(), "topic" => t()),
            errors: counter!("kafka_producer_topic_record_error_total",
                "client_id" => id(), "topic" => t()),
            compression: gauge!("kafka_producer_topic_compression_rate",
                "client_id" => id(), "topic" => t()),
            compression_window: Window::default(),
        }
    }

    fn publish(&mut self, c: &TopicCounters) {
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let (records, bytes) = (load(&c.records), load(&c.bytes));
        self.records.absolute(records);
        self.bytes.absolute(bytes);
        self.errors.absolute(load(&c.errors));
        if let Some(rate) = self.compression_window.mean(bytes, load(&c.batch_bytes)) {
            self.compression.set(rate);
        }
    }
}

impl Published {
    fn new(client_id: &str) -> Self {
        let id = || client_id.to_string();
        Published {
            records: counter!("kafka_producer_record_send_total", "client_id" => id()),
            bytes: counter!("kafka_producer_byte_total", "client_id" => id()),
            errors: counter!("kafka_producer_record_error_total", "client_id" => id()),
            retries: counter!("kafka_producer_record_retry_total", "client_id" => id()),
            requests: counter!("kafka_producer_request_total", "client_id" => id()),
            batches: counter!("kafka_producer_batch_total", "client_id" => id()),
            latency_avg: gauge!("kafka_producer_request_latency_avg", "client_id" => id()),
            latency_max: gauge!("kafka_producer_request_latency_max", "client_id" => id()),
            latency_window: Window::default(),
            batch_size_avg: gauge!("kafka_producer_batch_size_avg", "client_id" => id()),
            batch_size_max: gauge!("kafka_producer_batch_size_max", "client_id" => id()),
            batch_window: Window::default(),
            per_request_avg: gauge!("kafka_producer_records_per_request_avg", "client_id" => id()),
            per_request_window: Window::default(),
            compression_avg: gauge!("kafka_producer_compression_rate_avg", "client_id" => id()),
            compression_window: Window::default(),
            available: gauge!("kafka_producer_buffer_available_bytes", "client_id" => id()),
            total: gauge!("kafka_producer_buffer_total_bytes", "client_id" => id()),
            queued: gauge!("kafka_producer_queued_records", "client_id" => id()),
            throttle_avg: gauge!("kafka_producer_produce_throttle_time_avg", "client_id" => id()),
            throttle_max: gauge!("kafka_producer_produce_throttle_time_max", "client_id" => id()),
            throttle_window: Window::default(),
            queue_time_avg: gauge!("kafka_producer_record_queue_time_avg", "client_id" => id()),
            queue_time_max: gauge!("kafka_producer_record_queue_time_max", "client_id" => id()),
            queue_window: Window::default(),
            topics: HashMap::new(),
            client_id: id(),
            connections: Connections::new("kafka_producer", client_id),
        }
    }

    /// One look at the writer; `false` once it is gone.
    fn publish(&mut self, shared: &Weak<Shared>, cluster: &Cluster) -> bool {
        let Some(shared) = shared.upgrade() else {
            self.connections.closed();
            return false;
        };
        let c = &shared.stats;
        let load = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        let (messages, bytes, writes, batches) = (
            load(&c.messages),
            load(&c.bytes),
            load(&c.writes),
            load(&c.batches),
        );
        let batch_bytes = load(&c.batch_bytes_total);
        self.records.absolute(messages);
        self.bytes.absolute(bytes);
        self.errors.absolute(load(&c.errors));
        self.retries.absolute(load(&c.retries));
        self.requests.absolute(writes);
        self.batches.absolute(batches);
        if let Some(mean) = self
            .latency_window
            .mean(load(&c.answered), load(&c.write_micros))
        {
            self.latency_avg.set(ms(mean));
        }
        self.latency_max.set(ms(load(&c.write_micros_max) as f64));
        if let Some(mean) = self.batch_window.mean(batches, batch_bytes) {
            self.batch_size_avg.set(mean);
        }
        self.batch_size_max.set(load(&c.batch_bytes_max) as f64);
        if let Some(mean) = self.per_request_window.mean(writes, messages) {
            self.per_request_avg.set(mean);
        }
        // encoded bytes per record byte: the record bytes are the "count" of this window
        if let Some(rate) = self.compression_window.mean(bytes, batch_bytes) {
            self.compression_avg.set(rate);
        }
        let buffered = shared.buffered.load(Ordering::Relaxed);
        self.available
            .set(shared.max_buffered.saturating_sub(buffered) as f64);
        self.total.set(shared.max_buffered as f64);
        self.queued.set(load(&c.queued) as f64);
        let (responses, throttle_ms) = c.throttle.totals();
        if let Some(mean) = self.throttle_window.mean(responses, throttle_ms) {
            self.throttle_avg.set(mean);
        }
        self.throttle_max.set(c.throttle.max().as_millis() as f64);
        if let Some(mean) = self
            .queue_window
            .mean(load(&c.sent_batches), load(&c.queue_micros))
        {
            self.queue_time_avg.set(ms(mean));
        }
        self.queue_time_max
            .set(ms(load(&c.queue_micros_max) as f64));
        for (topic, counters) in shared.topics() {
            let client_id = &self.client_id;
            self.topics
                .entry(topic)
                .or_insert_with_key(|topic| TopicPublished::new(client_id, topic))
                .publish(&counters);
        }
        self.connections.publish(cluster);
        true
    }
}

/// Spawn the collector of a writer; it publishes a last time when `done` resolves (the
/// writer's task ended).
pub(super) fn spawn(
    shared: &Arc<Shared>,
    cluster: &Cluster,
    config: &WriterConfig,
    done: impl std::future::Future<Output = ()> + Send + 'static,
) {
    let mut published = Published::new(&config.connection.client_id);
    let weak = Arc::downgrade(shared);
    let cluster = cluster.clone();
    tokio::spawn(crate::metrics::collect(
        config.metrics_interval,
        done,
        move || published.publish(&weak, &cluster),
    ));
}
