//! The consumer's side of the buffers: popping round robin over the ready partitions,
//! decoding pending batches a run at a time (or handing out a decompression to run
//! without the lock), and lending the rest of a partition's buffer ([`Loan`]).

use std::sync::atomic::Ordering;

use super::{
    record_size, Inflate, Loan, Pending, PendingRecords, Popped, Position, Run, State, RUN,
    SPARE_BUFS,
};
use crate::error::Error;
use crate::group::AckToken;
use crate::reader::Message;
#[cfg(test)]
use crate::reader::ReaderConfig;

impl State {
    /// Decode up to [`RUN`] messages of partition `id`'s pending batches into its
    /// (empty) `buf`, stopping before a batch still compressed ([`Run::Inflate`] when it
    /// comes first). A record that does not decode parks the partition, as a fetch that
    /// does not decode does (see `task.rs`): what follows it is dropped, and the error is
    /// yielded after the messages decoded before it ([`Run::Failed`]).
    fn decode_run(&mut self, id: u64) -> Run {
        let Some(p) = self.parts.get_mut(&id) else {
            return Run::Decoded;
        };
        if p.buf.capacity() == 0 && !p.lazy.is_empty() {
            if let Some(spare) = self.spare_bufs.pop() {
                p.buf = spare;
            }
        }
        let mut failed = None;
        while p.buf.len() < RUN {
            let Some(b) = p.lazy.front_mut() else {
                break;
            };
            if let PendingRecords::Encoded(e) = &mut b.records {
                if e.is_compressed() {
                    // A run ends before a compressed batch; one that starts with it hands
                    // its decompression to the consumer, to run without the lock.
                    if !p.buf.is_empty() {
                        break;
                    }
                    let Some(job) = e.decompression() else {
                        break;
                    };
                    return Run::Inflate(Inflate {
                        id,
                        epoch: p.epoch,
                        serial: b.serial,
                        job,
                    });
                }
            }
            let (topic, partition, hw, le) =
                (&p.topic, p.partition, b.high_watermark, b.leader_epoch);
            let buf = &mut p.buf;
            let mut size = 0;
            let (decoded, end) = match &mut b.records {
                PendingRecords::Encoded(e) => match e.decode_next(|r, len| {
                    size = len;
                    buf.push_back(Message::from_record(topic, partition, hw, le, r, len));
                }) {
                    Err(err) => (false, Err(err)),
                    Ok(()) if e.len() == 0 => (true, e.finish()),
                    Ok(()) => (true, Ok(())),
                },
                PendingRecords::Decoded(it) => match it.next() {
                    Some(r) => {
                        size = record_size(&r);
                        buf.push_back(Message::from_record(topic, partition, hw, le, r, size));
                        (true, Ok(()))
                    }
                    None => (false, Ok(())),
                },
            };
            if decoded {
                // from the pending batch to `buf`: still buffered, same size
                b.n = b.n.saturating_sub(1);
                b.bytes = b.bytes.saturating_sub(size);
                p.lazy_n = p.lazy_n.saturating_sub(1);
                p.lazy_bytes = p.lazy_bytes.saturating_sub(size);
                p.buf_bytes += size;
            }
            if let Err(e) = end {
                failed = Some((e, b.fetched_at, b.broker));
                break;
            }
            if b.n == 0 || !decoded {
                let (n, rest) = (b.n, b.bytes);
                p.lazy.pop_front();
                p.lazy_n = p.lazy_n.saturating_sub(n);
                p.lazy_bytes = p.lazy_bytes.saturating_sub(rest);
                self.buffered = self.buffered.saturating_sub(n);
                self.buffered_bytes = self.buffered_bytes.saturating_sub(rest);
            }
        }
        let Some((e, fetched_at, broker)) = failed else {
            return Run::Decoded;
        };
        self.fail_run(id, e, fetched_at, broker);
        Run::Failed
    }

    /// Partition `id`'s pending records do not decode (`e`, in the fetch at `fetched_at`
    /// from `broker`): drop them and park the partition with the error.
    pub(super) fn fail_run(&mut self, id: u64, e: Error, fetched_at: i64, broker: i32) {
        let Some(p) = self.parts.get_mut(&id) else {
            return;
        };
        let (n, bytes) = p.clear_lazy();
        p.streak.fail_fatally();
        // An error parked by a later fetch is about data dropped here: this one comes first.
        p.parked_error = None;
        self.buffered = self.buffered.saturating_sub(n);
        self.buffered_bytes = self.buffered_bytes.saturating_sub(bytes);
        let topic = p.topic.clone();
        let partition = p.partition;
        let err = e
            .clone()
            .with_message(format!(
                "cannot decode the records fetched at offset {fetched_at}: {e}; the partition is paused until a seek"
            ))
            .with_topic(&*topic)
            .with_partition(partition)
            .with_broker(format!("broker {broker}"));
        tracing::warn!(topic = %topic, partition, offset = fetched_at, error = %e, "fetched records cannot be decoded; partition paused until a seek");
        self.decode_errors.push(err.clone());
        self.park(id, err);
    }

    /// The next message, round robin over partitions, and whether the buffer went from
    /// full to not full.
    #[cfg(test)]
    pub(crate) fn pop(&mut self, config: &ReaderConfig) -> Option<(Message, bool)> {
        let was_full = self.full(config);
        let m = self.pop_into(None)?;
        Some((m, was_full && !self.full(config)))
    }

    /// The next message, round robin over partitions (see [`pop_or_inflate`](Self::pop_or_inflate)),
    /// decompressing batches at once: for tests.
    #[cfg(test)]
    pub(crate) fn pop_into(&mut self, mut loan: Option<&mut Loan>) -> Option<Message> {
        loop {
            match self.pop_or_inflate(loan.as_deref_mut()) {
                Popped::Message(m) => return Some(m),
                Popped::Nothing => return None,
                Popped::Inflate(job) => {
                    let result = job.run();
                    self.install(job, result);
                }
            }
        }
    }

    /// The next message, round robin over partitions. With `loan` (settled, empty), the
    /// partition also lends the rest of its buffer, of which up to
    /// [`RUN`]` - 1` messages are taken one after another before the next partition's
    /// turn.
    ///
    /// When the partition whose turn it is starts with a batch still compressed, its
    /// decompression is handed back instead ([`Popped::Inflate`]), for the consumer to
    /// run without the lock and [`install`](Self::install); the partition keeps its turn.
    pub(crate) fn pop_or_inflate(&mut self, mut loan: Option<&mut Loan>) -> Popped {
        if !self.blocked.is_empty() {
            let blocked = std::mem::take(&mut self.blocked);
            for id in blocked {
                if let Some(p) = self.parts.get_mut(&id) {
                    if !p.in_ready && !p.paused && !p.is_empty() {
                        p.in_ready = true;
                        self.ready.push_back(id);
                    }
                }
            }
        }
        while let Some(id) = self.ready.pop_front() {
            let Some(p) = self.parts.get_mut(&id) else {
                continue;
            };
            if p.paused {
                // queued again by `resume`
                p.in_ready = false;
                continue;
            }
            // A batch is decompressed only for a track with room for its records.
            let compressed_next =
                p.buf.is_empty() && p.lazy.front().and_then(Pending::compressed_from).is_some();
            if let (true, Some(t)) = (compressed_next, &p.track) {
                if !t.has_room() {
                    p.in_ready = false;
                    self.blocked.push(id);
                    continue;
                }
            }
            if p.buf.is_empty() && !p.lazy.is_empty() {
                match self.decode_run(id) {
                    Run::Decoded => {}
                    Run::Inflate(job) => {
                        // its turn again once the batch is decompressed
                        self.ready.push_front(id);
                        return Popped::Inflate(job);
                    }
                    Run::Failed => {
                        let Some(q) = self.parts.get_mut(&id) else {
                            continue;
                        };
                        if q.buf.is_empty() {
                            // the error is next
                            q.in_ready = false;
                            return Popped::Nothing;
                        }
                    }
                }
            }
            let Some(p) = self.parts.get_mut(&id) else {
                continue;
            };
            let Some(offset) = p.buf.front().map(|m| m.offset) else {
                p.in_ready = false;
                continue;
            };
            // The next message to yield: the one after this, or, when this is the last
            // one fetched, the next fetch's offset (past control records and aborted
            // transactions, as the Java consumer's position).
            let mut next = offset.saturating_add(1);
            if p.buf.len() == 1 && p.lazy.is_empty() {
                if let Position::Offset(f) = p.fetch {
                    next = next.max(f);
                }
            }
            let token = match &p.track {
                None => AckToken::default(),
                Some(t) => match t.deliver(offset, next) {
                    Ok(seq) => AckToken::tracked(t.clone(), seq, offset),
                    Err(_full) => {
                        // Tried again at the next poll; the track wakes a parked
                        // consumer when it has room.
                        p.in_ready = false;
                        self.blocked.push(id);
                        continue;
                    }
                },
            };
            let Some(mut m) = p.buf.pop_front() else {
                p.in_ready = false;
                continue;
            };
            m.set_ack_token(token);
            let size = m.queued_size();
            p.buf_bytes = p.buf_bytes.saturating_sub(size);
            p.position = next;
            if p.is_empty() {
                p.in_ready = false;
                if let Some(e) = p.parked_error.take() {
                    self.errors.push_back(e);
                }
            } else {
                self.ready.push_back(id);
            }
            self.buffered = self.buffered.saturating_sub(1);
            self.buffered_bytes = self.buffered_bytes.saturating_sub(size);
            if let Some(loan) = loan.take() {
                self.lend(id, loan);
            }
            return Popped::Message(m);
        }
        Popped::Nothing
    }

    /// Lend the consumer the rest of partition `id`'s buffer (just popped from, so in
    /// `ready` if it has more), when it is not parked.
    fn lend(&mut self, id: u64, loan: &mut Loan) {
        let Some(p) = self.parts.get_mut(&id) else {
            return;
        };
        if p.buf.is_empty() || p.parked_error.is_some() || loan.active {
            return;
        }
        loan.track = p.track.as_ref().map(|t| (t.clone(), t.restarts()));
        // The partition keeps no capacity: the loan's old buffer is kept for the next run.
        let mut old = std::mem::replace(&mut loan.msgs, std::mem::take(&mut p.buf));
        if old.capacity() > 0 && self.spare_bufs.len() < SPARE_BUFS {
            old.clear();
            self.spare_bufs.push(old);
        }
        let (k, bytes) = (loan.msgs.len(), p.buf_bytes);
        let last = loan
            .msgs
            .back()
            .map_or(p.position, |m| m.offset.saturating_add(1));
        loan.tail_next = match p.fetch {
            // the last message fetched: the next fetch's offset follows
            Position::Offset(f) if p.lazy.is_empty() => last.max(f),
            _ => last,
        };
        loan.active = true;
        loan.id = id;
        loan.epoch = p.epoch;
        loan.n = k;
        loan.bytes = bytes;
        loan.yielded = 0;
        loan.yielded_bytes = 0;
        loan.left = RUN - 1;
        loan.next = p.position;
        p.buf_bytes = 0;
        if p.in_ready {
            // it was queued again by `pop_or_inflate`: `settle` queues it after this run
            p.in_ready = false;
            if let Some(i) = self.ready.iter().rposition(|r| *r == id) {
                self.ready.remove(i);
            }
        }
        self.buffered = self.buffered.saturating_sub(k);
        self.buffered_bytes = self.buffered_bytes.saturating_sub(bytes);
        self.loan_of = Some((id, loan.epoch));
        self.lent_n = k;
        self.lent_bytes = bytes;
        self.lent.pos.store(p.position, Ordering::Relaxed);
        self.lent.yielded.store(0, Ordering::Relaxed);
        self.lent.yielded_bytes.store(0, Ordering::Relaxed);
        loan.gen = self.lent.gen.load(Ordering::Relaxed);
    }
}
