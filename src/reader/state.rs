//! The state shared by the [`Reader`](super::Reader) handle and its fetch task: one entry
//! per assigned partition with its own buffer, plus the round-robin queue of partitions
//! that have buffered messages.
//!
//! Every partition carries an `epoch`. Fetch and offset lookups record the epoch they
//! were planned under; [`seek`](super::Reader::seek), re-assignment and revocation bump
//! it (or remove the partition), so a response that was in flight across such a change
//! is recognised as stale and dropped. Because the partition's buffer is cleared under
//! the same lock, nothing fetched before a seek can be yielded after it.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicUsize};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::Waker;
use std::time::Instant;

use tokio::sync::Notify;

use super::{Message, ReaderConfig, StartOffset, TopicPartition};
use crate::cluster::Cluster;
use crate::error::Error;

/// Where the next fetch of a partition starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Position {
    /// At this offset.
    Offset(i64),
    /// To be looked up with ListOffsets first.
    Start(StartOffset),
    /// Not fetched until the application seeks (after `OffsetReset::Error`).
    Parked,
}

impl Position {
    pub(crate) fn from_start(start: StartOffset) -> Self {
        match start {
            StartOffset::At(o) => Position::Offset(o),
            s => Position::Start(s),
        }
    }
}

pub(crate) struct Part {
    pub(crate) topic: Arc<str>,
    pub(crate) partition: i32,
    pub(crate) epoch: u64,
    pub(crate) fetch: Position,
    /// The leader's broker id, once looked up.
    pub(crate) leader: Option<i32>,
    /// A fetch or lookup for this partition is in flight.
    pub(crate) busy: bool,
    pub(crate) retry_at: Option<Instant>,
    pub(crate) failures: u32,
    pub(crate) buf: VecDeque<Message>,
    pub(crate) buf_bytes: usize,
    pub(crate) in_ready: bool,
    /// The offset of the next message to yield (last yielded + 1), -1 while unknown.
    pub(crate) position: i64,
    /// The last high-water mark a fetch reported, -1 while unknown.
    pub(crate) high_watermark: i64,
}

impl Part {
    fn new(tp: &TopicPartition, start: StartOffset) -> Self {
        let fetch = Position::from_start(start);
        Part {
            topic: Arc::from(tp.topic.as_str()),
            partition: tp.partition,
            epoch: 0,
            fetch,
            leader: None,
            busy: false,
            retry_at: None,
            failures: 0,
            buf: VecDeque::new(),
            buf_bytes: 0,
            in_ready: false,
            position: match fetch {
                Position::Offset(o) => o,
                _ => -1,
            },
            high_watermark: -1,
        }
    }
}

#[derive(Default)]
pub(crate) struct State {
    pub(crate) parts: HashMap<u64, Part>,
    pub(crate) index: HashMap<TopicPartition, u64>,
    next_id: u64,
    /// Partitions with buffered messages, served round robin one message at a time.
    pub(crate) ready: VecDeque<u64>,
    /// Errors to yield before the next message.
    pub(crate) errors: VecDeque<Error>,
    pub(crate) buffered: usize,
    pub(crate) buffered_bytes: usize,
    pub(crate) consumer: Option<Waker>,
    pub(crate) closed: bool,
}

impl State {
    /// Assign `tp` starting at `start`; an assigned partition is reset to `start`.
    pub(crate) fn assign(&mut self, tp: TopicPartition, start: StartOffset) {
        if let Some(id) = self.index.get(&tp).copied() {
            self.reset(id, Position::from_start(start));
            return;
        }
        let id = self.next_id;
        self.next_id += 1;
        self.parts.insert(id, Part::new(&tp, start));
        self.index.insert(tp, id);
    }

    /// Stop reading `tp` and drop its buffered messages. Returns whether it was assigned.
    pub(crate) fn unassign(&mut self, tp: &TopicPartition) -> bool {
        let Some(id) = self.index.remove(tp) else {
            return false;
        };
        if let Some(p) = self.parts.remove(&id) {
            self.buffered = self.buffered.saturating_sub(p.buf.len());
            self.buffered_bytes = self.buffered_bytes.saturating_sub(p.buf_bytes);
        }
        true
    }

    /// Move partition `id` to `fetch`: bump its epoch (in-flight results become stale),
    /// drop its buffered messages, forget failures.
    pub(crate) fn reset(&mut self, id: u64, fetch: Position) {
        let Some(p) = self.parts.get_mut(&id) else {
            return;
        };
        p.epoch += 1;
        p.fetch = fetch;
        p.position = match fetch {
            Position::Offset(o) => o,
            _ => -1,
        };
        p.retry_at = None;
        p.failures = 0;
        self.buffered = self.buffered.saturating_sub(p.buf.len());
        self.buffered_bytes = self.buffered_bytes.saturating_sub(p.buf_bytes);
        p.buf.clear();
        p.buf_bytes = 0;
    }

    /// Whether the prefetch buffer is full (fetching pauses).
    pub(crate) fn full(&self, config: &ReaderConfig) -> bool {
        self.buffered >= config.queue_capacity || self.buffered_bytes >= config.queue_capacity_bytes
    }

    /// Append fetched messages to partition `id`'s buffer and queue it for the consumer.
    pub(crate) fn push(&mut self, id: u64, msgs: Vec<Message>) -> u64 {
        let Some(p) = self.parts.get_mut(&id) else {
            return 0;
        };
        let mut bytes = 0;
        let n = msgs.len();
        for m in msgs {
            bytes += m.size();
            p.buf.push_back(m);
        }
        p.buf_bytes += bytes;
        self.buffered += n;
        self.buffered_bytes += bytes;
        if !p.in_ready && !p.buf.is_empty() {
            p.in_ready = true;
            self.ready.push_back(id);
        }
        bytes as u64
    }

    /// The next message, round robin over partitions, and whether the buffer went from
    /// full to not full.
    pub(crate) fn pop(&mut self, config: &ReaderConfig) -> Option<(Message, bool)> {
        let was_full = self.full(config);
        while let Some(id) = self.ready.pop_front() {
            let Some(p) = self.parts.get_mut(&id) else {
                continue;
            };
            let Some(m) = p.buf.pop_front() else {
                p.in_ready = false;
                continue;
            };
            let size = m.size();
            p.buf_bytes = p.buf_bytes.saturating_sub(size);
            p.position = m.offset.saturating_add(1);
            if p.buf.is_empty() {
                p.in_ready = false;
            } else {
                self.ready.push_back(id);
            }
            self.buffered = self.buffered.saturating_sub(1);
            self.buffered_bytes = self.buffered_bytes.saturating_sub(size);
            return Some((m, was_full && !self.full(config)));
        }
        None
    }
}

#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) fetches: AtomicU64,
    pub(crate) messages: AtomicU64,
    pub(crate) bytes: AtomicU64,
    pub(crate) errors: AtomicU64,
    pub(crate) resets: AtomicU64,
    pub(crate) tasks_running: AtomicUsize,
}

pub(crate) struct Shared {
    pub(crate) state: Mutex<State>,
    /// Wakes the fetch task: assignment changed, seek, buffer space freed, close.
    pub(crate) wake_task: Notify,
    pub(crate) config: ReaderConfig,
    pub(crate) cluster: Cluster,
    pub(crate) counters: Counters,
}

impl Shared {
    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}
