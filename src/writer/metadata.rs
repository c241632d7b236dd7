//! The task's topics: each topic's metadata and partition ids, the messages waiting
//! for them, and the metadata lookups with their retries (franz-go's `metadata.go`).
//!
//! A message whose topic has no metadata yet waits in the topic's `waiting` queue; one
//! naming a partition the metadata lacks waits in `recheck` for a fresh lookup (the topic
//! may have grown). When a lookup answers, the waiting messages are handed to the
//! accumulator ([`Task::assign`]); when lookups fail for good, they are rejected.
//!
//! May not: place messages or touch batches itself, except to count an attempt against
//! (or fail) a partition's front batch while the metadata names no leader for it.

use std::sync::Arc;
use std::time::Instant;

use tracing::{debug, warn};

use super::accumulator::{seal, take_idle, Msg, PartMap, PartState};
use super::task::{after, Event, Task};
use super::WriterConfig;
use crate::cluster::TopicMetadata;
use crate::error::{Error, Result};
use crate::protocol::ErrorCode;
use crate::util::now_ms;

/// Messages per chunk of a [`MsgQueue`] (about 200 bytes each: a chunk is some 200 KiB).
const MSG_CHUNK: usize = 1024;

/// Messages waiting in the task (for metadata), with the earliest time one of them was
/// accepted: their delivery timeouts run from there, so the loop knows when the first one
/// is due without scanning the list on every wake. Writer clones may hand messages over
/// in a different order than they were accepted, so this is a minimum, not the first.
///
/// The messages are kept in chunks of at most [`MSG_CHUNK`]: the list holds less than a
/// chunk of room beyond its messages, where one `Vec` doubling as it grows held up to as
/// much room again, and a list taken to be placed frees each chunk as soon as its messages
/// are encoded, where one `Vec` stayed whole until the last one was. A writer whose first
/// metadata lookup takes a while fills its whole buffer bound with waiting messages (a
/// 32 MiB bound: 120 000 messages of 100 bytes, 25 MB as waiting messages, in a 28 MB
/// `Vec`), and placing them all at once held that `Vec` beside the 13 MB of batches they
/// became: the producer's peak memory.
#[derive(Default)]
pub(super) struct MsgQueue {
    chunks: Vec<Vec<Msg>>,
    len: usize,
    pub(super) earliest: Option<Instant>,
}

/// The messages taken from a [`MsgQueue`], oldest first, in chunks: iterate it with
/// `into_iter().flatten()`, which frees each chunk once its messages are taken.
pub(super) type MsgChunks = Vec<Vec<Msg>>;

impl MsgQueue {
    pub(super) fn push(&mut self, m: Msg) {
        self.earliest = Some(self.earliest.map_or(m.accepted, |e| e.min(m.accepted)));
        self.len += 1;
        match self.chunks.last_mut() {
            Some(last) if last.len() < MSG_CHUNK => last.push(m),
            // A short list grows its one chunk as a `Vec` does; a long one by whole chunks.
            Some(_) => {
                let mut chunk = Vec::with_capacity(MSG_CHUNK);
                chunk.push(m);
                self.chunks.push(chunk);
            }
            None => self.chunks.push(vec![m]),
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.chunks.is_empty()
    }

    pub(super) fn len(&self) -> usize {
        self.len
    }

    #[cfg(test)]
    pub(super) fn capacity(&self) -> usize {
        self.chunks.iter().map(Vec::capacity).sum()
    }

    /// Every message, leaving the queue empty.
    pub(super) fn take(&mut self) -> MsgChunks {
        self.earliest = None;
        self.len = 0;
        std::mem::take(&mut self.chunks)
    }
}

#[derive(Default)]
pub(super) struct TopicState {
    pub(super) meta: Option<Arc<TopicMetadata>>,
    pub(super) ids: Vec<i32>,
    pub(super) parts: PartMap<PartState>,
    /// Messages waiting for the topic's first metadata.
    pub(super) waiting: MsgQueue,
    /// Messages for partitions `ids` lacks, waiting for metadata asked for after they
    /// were accepted (the topic may have grown).
    pub(super) recheck: MsgQueue,
    /// When the lookup that gave `meta` was started.
    pub(super) meta_asked: Option<Instant>,
    /// When the lookup in progress was started.
    pub(super) pending_asked: Option<Instant>,
    /// The last failed metadata lookup's error, reported if waiting messages expire.
    pub(super) last_error: Option<Error>,
    /// A flush came while messages were waiting: seal their batches once assigned.
    pub(super) seal_when_assigned: bool,
    pub(super) meta_pending: bool,
    pub(super) meta_attempts: u32,
    pub(super) meta_retry_at: Option<Instant>,
    /// The topic's counters (feature `metrics`), once a batch or message of it is done.
    #[cfg(feature = "metrics")]
    pub(super) counters: Option<Arc<super::shared::TopicCounters>>,
}

impl Task {
    /// Ask for metadata of topics with messages waiting for it.
    pub(super) fn request_metadata(&mut self, now: Instant) {
        let mut wanted = Vec::new();
        for (name, t) in &mut self.topics {
            let first = t.meta.is_none() && !t.waiting.is_empty();
            if (first || !t.recheck.is_empty())
                && !t.meta_pending
                && t.meta_retry_at.is_none_or(|at| at <= now)
            {
                wanted.push((name.clone(), !first));
            }
        }
        for (name, fresh) in wanted {
            self.spawn_metadata(name, fresh);
        }
    }

    /// Look `name` up in the background (answered by an `Event::Meta`); `fresh` asks the
    /// brokers even if the cluster's cache holds the topic, without invalidating the
    /// cache, so batches keep going to the cached leaders meanwhile.
    pub(super) fn spawn_metadata(&mut self, name: Arc<str>, fresh: bool) {
        let Some(t) = self.topics.get_mut(&name) else {
            return;
        };
        if t.meta_pending {
            return;
        }
        t.meta_pending = true;
        t.meta_retry_at = None;
        t.pending_asked = Some(Instant::now());
        let cluster = self.cluster.clone();
        let tx = self.events_tx.clone();
        tokio::spawn(async move {
            let refreshed = if fresh {
                cluster.refresh(&[&name]).await
            } else {
                Ok(())
            };
            let result = match refreshed {
                Ok(()) => cluster.topic(&name).await,
                Err(e) => Err(e),
            };
            let _ = tx.send(Event::Meta {
                topic: name,
                result,
            });
        });
    }

    pub(super) fn on_metadata(&mut self, topic: Arc<str>, result: Result<Arc<TopicMetadata>>) {
        let now = Instant::now();
        let max_attempts = self.cfg.max_attempts;
        let Some(t) = self.topics.get_mut(&topic) else {
            return;
        };
        t.meta_pending = false;
        let asked = t.pending_asked.take();
        match result {
            Ok(meta) => {
                t.ids = meta.partition_ids();
                t.meta_attempts = 0;
                t.meta_asked = asked.or(Some(now));
                t.last_error = None;
                // Batches whose partition still has no leader count an attempt, so a
                // partition that never gets one fails instead of waiting forever.
                let mut failed = Vec::new();
                for (p, ps) in &mut t.parts {
                    if ps.in_flight > 0 || meta.leader(*p).is_some() {
                        continue;
                    }
                    let Some(front) = ps.sealed.front_mut() else {
                        continue;
                    };
                    front.attempts = front.attempts.saturating_add(1);
                    front.last_error = Some(
                        Error::kafka(ErrorCode::LeaderNotAvailable)
                            .with_message("metadata names no leader")
                            .with_topic(&*topic)
                            .with_partition(*p),
                    );
                    if front.attempts >= max_attempts {
                        if let Some(b) = ps.sealed.pop_front() {
                            failed.push((*p, b));
                        }
                        ps.retry_at = None;
                    } else {
                        ps.retry_at = Some(after(now, self.cfg.backoff_for(front.attempts)));
                    }
                }
                t.meta = Some(meta);
                let mut waiting = t.waiting.take();
                waiting.append(&mut t.recheck.take());
                for (p, b) in failed {
                    let e = Error::kafka(ErrorCode::LeaderNotAvailable)
                        .with_message(format!("no leader after {max_attempts} attempts"))
                        .with_topic(&*topic)
                        .with_partition(p);
                    warn!(topic = %topic, partition = p, "giving up on a partition without leader");
                    self.give_up(&topic, p, b, &e, false);
                }
                let ts = now_ms();
                // Chunk by chunk: each is freed once its messages are in batches.
                for m in waiting.into_iter().flatten() {
                    self.assign(&topic, m, ts);
                }
                if let Some(t) = self.topics.get_mut(&topic) {
                    if std::mem::take(&mut t.seal_when_assigned) {
                        for (p, ps) in &mut t.parts {
                            if !ps.held.is_empty() {
                                ps.seal_held = true;
                            }
                            if ps.open.is_some() {
                                self.unreported.extend(seal(
                                    ps,
                                    &self.shared,
                                    self.cfg.delivery_timeout,
                                    &mut self.spare_buffers,
                                    &topic,
                                    *p,
                                ));
                            }
                        }
                    }
                }
            }
            Err(e) => {
                t.meta_attempts = t.meta_attempts.saturating_add(1);
                let attempts = t.meta_attempts;
                let e = if e.topic().is_none() {
                    e.with_topic(&*topic)
                } else {
                    e
                };
                t.last_error = Some(e.clone());
                if e.is_retriable() && attempts < max_attempts {
                    debug!(topic = %topic, attempt = attempts, error = %e, "metadata lookup failed, retrying");
                    t.meta_retry_at = Some(after(now, self.cfg.backoff_for(attempts)));
                    return;
                }
                warn!(topic = %topic, attempts, error = %e, "metadata lookup failed for good");
                t.meta_attempts = 0;
                let mut waiting = t.waiting.take();
                waiting.append(&mut t.recheck.take());
                // Batches that cannot find their leader fail too.
                let mut stuck = Vec::new();
                for (p, ps) in &mut t.parts {
                    stuck.extend(take_idle(ps).into_iter().map(|b| (*p, b)));
                    ps.retry_at = None;
                }
                for m in waiting.into_iter().flatten() {
                    self.reject(m, e.clone());
                }
                for (p, b) in stuck {
                    self.give_up(&topic, p, b, &e.clone().with_partition(p), false);
                }
            }
        }
    }
}

/// When a message accepted at `accepted` and waiting for `t`'s metadata expires.
pub(super) fn msg_expiry(cfg: &WriterConfig, t: &TopicState, accepted: Instant) -> Instant {
    let at = after(accepted, cfg.delivery_timeout);
    match cfg.unknown_topic_timeout {
        Some(d)
            if t.meta.is_none()
                && t.last_error.as_ref().and_then(Error::kafka_code)
                    == Some(ErrorCode::UnknownTopicOrPartition) =>
        {
            at.min(after(accepted, d))
        }
        _ => at,
    }
}
