//! The reader's metrics collector (feature `metrics`): publishes the counters behind
//! [`ReaderStats`](super::ReaderStats), the per-partition lag from the last fetch
//! responses, and its group's commit and rebalance timings, to the `metrics` facade.
//! The list is in [`crate::metrics`].

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

use metrics::{counter, gauge, Counter, Gauge};

use super::state::Shared;
use crate::group::GroupShared;
use crate::metrics::{ms, Connections, Window};

/// The metric handles of one reader, registered once.
struct Published {
    client_id: String,
    records: Counter,
    bytes: Counter,
    fetches: Counter,
    errors: Counter,
    retries: Counter,
    resets: Counter,
    fetch_latency_avg: Gauge,
    fetch_latency_max: Gauge,
    fetch_window: Window,
    throttle_avg: Gauge,
    throttle_max: Gauge,
    throttle_window: Window,
    lag_max: Gauge,
    assigned: Gauge,
    buffered: Gauge,
    lag: HashMap<(Arc<str>, i32), Gauge>,
    group: Option<GroupPublished>,
    connections: Connections,
}

struct GroupPublished {
    commits: Counter,
    commit_latency_avg: Gauge,
    commit_latency_max: Gauge,
    commit_window: Window,
    rebalances: Counter,
    rebalance_latency_total: Counter,
    rebalance_latency_avg: Gauge,
    rebalance_latency_max: Gauge,
    rebalance_window: Window,
    generation: Gauge,
}

impl Published {
    fn new(client_id: &str, group: bool) -> Self {
        let id = || client_id.to_string();
        Published {
            client_id: id(),
            records: counter!("kafka_consumer_records_consumed_total", "client_id" => id()),
            bytes: counter!("kafka_consumer_bytes_consumed_total", "client_id" => id()),
            fetches: counter!("kafka_consumer_fetch_total", "client_id" => id()),
            errors: counter!("kafka_consumer_fetch_error_total", "client_id" => id()),
            retries: counter!("kafka_consumer_retry_total", "client_id" => id()),
            resets: counter!("kafka_consumer_offset_reset_total", "client_id" => id()),
            fetch_latency_avg: gauge!("kafka_consumer_fetch_latency_avg", "client_id" => id()),
            fetch_latency_max: gauge!("kafka_consumer_fetch_latency_max", "client_id" => id()),
            fetch_window: Window::default(),
            throttle_avg: gauge!("kafka_consumer_fetch_throttle_time_avg", "client_id" => id()),
            throttle_max: gauge!("kafka_consumer_fetch_throttle_time_max", "client_id" => id()),
            throttle_window: Window::default(),
            lag_max: gauge!("kafka_consumer_records_lag_max", "client_id" => id()),
            assigned: gauge!("kafka_consumer_assigned_partitions", "client_id" => id()),
            buffered: gauge!("kafka_consumer_buffered_records", "client_id" => id()),
            lag: HashMap::new(),
            group: group.then(|| GroupPublished {
                commits: counter!("kafka_consumer_commit_total", "client_id" => id()),
                commit_latency_avg: gauge!("kafka_consumer_commit_latency_avg", "client_id" => id()),
                commit_latency_max: gauge!("kafka_consumer_commit_latency_max", "client_id" => id()),
                commit_window: Window::default(),
                rebalances: counter!("kafka_consumer_rebalance_total", "client_id" => id()),
                rebalance_latency_total: counter!("kafka_consumer_rebalance_latency_total", "client_id" => id()),
                rebalance_latency_avg: gauge!("kafka_consumer_rebalance_latency_avg", "client_id" => id()),
                rebalance_latency_max: gauge!("kafka_consumer_rebalance_latency_max", "client_id" => id()),
                rebalance_window: Window::default(),
                generation: gauge!("kafka_consumer_group_generation", "client_id" => id()),
            }),
            connections: Connections::new("kafka_consumer", client_id),
        }
    }

    /// One look at the reader; `false` once it is gone.
    fn publish(&mut self, shared: &Weak<Shared>, group: &Option<Weak<GroupShared>>) -> bool {
        let Some(shared) = shared.upgrade() else {
            self.connections.closed();
            return false;
        };
        let c = &shared.counters;
        self.records.absolute(c.messages.load(Ordering::Relaxed));
        self.bytes.absolute(c.bytes.load(Ordering::Relaxed));
        self.fetches.absolute(c.fetches.load(Ordering::Relaxed));
        self.errors.absolute(c.errors.load(Ordering::Relaxed));
        self.retries.absolute(c.retries.load(Ordering::Relaxed));
        self.resets.absolute(c.resets.load(Ordering::Relaxed));
        let (n, us, max) = c.fetch_latency.take();
        if let Some(mean) = self.fetch_window.mean(n, us) {
            self.fetch_latency_avg.set(ms(mean));
            self.fetch_latency_max.set(ms(max as f64));
        }
        let (responses, throttle_ms) = c.throttle.totals();
        if let Some(mean) = self.throttle_window.mean(responses, throttle_ms) {
            self.throttle_avg.set(mean);
        }
        self.throttle_max.set(c.throttle.max().as_millis() as f64);
        let mut lag_max = 0i64;
        let mut lags: Vec<((Arc<str>, i32), i64)> = Vec::new();
        let (assigned, buffered) = {
            let st = shared.lock();
            for (id, p) in &st.parts {
                let position = st.position_of(*id, p);
                if p.high_watermark >= 0 && position >= 0 {
                    let lag = p.high_watermark.saturating_sub(position).max(0);
                    lag_max = lag_max.max(lag);
                    lags.push(((p.topic.clone(), p.partition), lag));
                }
            }
            (st.parts.len(), st.queued().0)
        };
        for (key, lag) in lags {
            let client_id = &self.client_id;
            self.lag
                .entry(key)
                .or_insert_with_key(|(topic, partition)| {
                    gauge!("kafka_consumer_records_lag", "client_id" => client_id.clone(),
                        "topic" => topic.to_string(), "partition" => partition.to_string())
                })
                .set(lag as f64);
        }
        self.lag_max.set(lag_max as f64);
        self.assigned.set(assigned as f64);
        self.buffered.set(buffered as f64);
        if let (Some(p), Some(g)) = (&mut self.group, group.as_ref().and_then(Weak::upgrade)) {
            let t = &g.timings;
            let (n, us, max) = t.commit.take();
            p.commits.absolute(n);
            if let Some(mean) = p.commit_window.mean(n, us) {
                p.commit_latency_avg.set(ms(mean));
                p.commit_latency_max.set(ms(max as f64));
            }
            let (n, us, max) = t.rebalance.take();
            p.rebalances.absolute(n);
            p.rebalance_latency_total.absolute(us / 1000);
            if let Some(mean) = p.rebalance_window.mean(n, us) {
                p.rebalance_latency_avg.set(ms(mean));
                p.rebalance_latency_max.set(ms(max as f64));
            }
            p.generation.set(f64::from(g.generation()));
        }
        self.connections.publish(&shared.cluster);
        true
    }
}

/// Spawn the collector of a reader whose fetch and group tasks end with `done`.
pub(super) fn spawn(
    shared: &Arc<Shared>,
    group: Option<&Arc<GroupShared>>,
    done: impl std::future::Future<Output = ()> + Send + 'static,
) {
    let mut published = Published::new(&shared.config.connection.client_id, group.is_some());
    let interval = shared.config.metrics_interval;
    let weak = Arc::downgrade(shared);
    let group = group.map(Arc::downgrade);
    tokio::spawn(crate::metrics::collect(interval, done, move || {
        published.publish(&weak, &group)
    }));
}
