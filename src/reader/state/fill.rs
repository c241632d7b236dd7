//! Filling the partitions' buffers: fetched messages and record batches appended (the
//! batches decoded later, on the consumer's side), and the results of the decompressions
//! run outside the lock.

use super::{record_size, Inflate, Pending, PendingRecords, State};
#[cfg(test)]
use crate::reader::Message;
use crate::record::LazyBatch;

impl State {
    /// Append messages to partition `id`'s buffer and queue it for the consumer.
    #[cfg(test)]
    pub(crate) fn push(&mut self, id: u64, msgs: Vec<Message>) -> u64 {
        let Some(p) = self.parts.get_mut(&id) else {
            return 0;
        };
        let n = msgs.len();
        let mut bytes = 0;
        for mut m in msgs {
            m.set_queued_size(m.size());
            bytes += m.size();
            p.buf.push_back(m);
        }
        debug_assert!(p.lazy.is_empty(), "decoded messages go before encoded ones");
        p.buf_bytes += bytes;
        self.added(id, n, bytes);
        bytes as u64
    }

    /// Append fetched `batches` (their records before the fetch offset skipped) to
    /// partition `id`'s buffer, still encoded, and queue it for the consumer. `from` and
    /// `broker` are the fetch's offset and broker. Returns how many messages and bytes
    /// were added.
    pub(crate) fn push_batches(
        &mut self,
        id: u64,
        batches: Vec<LazyBatch>,
        from: i64,
        broker: i32,
        high_watermark: i64,
    ) -> (u64, u64) {
        let Some(p) = self.parts.get_mut(&id) else {
            return (0, 0);
        };
        let (mut n, mut bytes) = (0, 0);
        for b in batches {
            let (records, bn, bbytes) = match b.encoded {
                Some(e) => {
                    let (bn, bbytes) = (e.len(), e.bytes());
                    (PendingRecords::Encoded(e), bn, bbytes)
                }
                None => {
                    let bbytes = b.batch.records.iter().map(record_size).sum();
                    let bn = b.batch.records.len();
                    (
                        PendingRecords::Decoded(b.batch.records.into_iter()),
                        bn,
                        bbytes,
                    )
                }
            };
            if bn == 0 {
                continue;
            }
            n += bn;
            bytes += bbytes;
            self.serials += 1;
            p.lazy.push_back(Pending {
                records,
                serial: self.serials,
                high_watermark,
                leader_epoch: b.batch.partition_leader_epoch,
                n: bn,
                bytes: bbytes,
                fetched_at: from,
                broker,
            });
        }
        p.lazy_n += n;
        p.lazy_bytes += bytes;
        self.added(id, n, bytes);
        (n as u64, bytes as u64)
    }

    /// Take the result of `job` (run without the lock): partition `job.id`'s first
    /// pending batch is decompressed from now on and counts its records' bytes, or, if it
    /// did not decompress, the partition is parked with the error as for a record that
    /// does not decode. Dropped if the partition was reset, unassigned or reassigned
    /// meanwhile.
    pub(crate) fn install(&mut self, job: Inflate, result: crate::error::Result<bytes::Bytes>) {
        let Some(p) = self.parts.get_mut(&job.id) else {
            return;
        };
        if p.epoch != job.epoch {
            return;
        }
        let Some(b) = p.lazy.front_mut().filter(|b| b.serial == job.serial) else {
            return;
        };
        let PendingRecords::Encoded(e) = &mut b.records else {
            return;
        };
        // It counted its compressed size; from now on, its records' bytes.
        let before = e.bytes();
        let installed = e.install(result);
        let after = e.bytes();
        b.bytes = b.bytes.saturating_sub(before) + after;
        p.lazy_bytes = p.lazy_bytes.saturating_sub(before) + after;
        self.buffered_bytes = self.buffered_bytes.saturating_sub(before) + after;
        if let Err(e) = installed {
            let (fetched_at, broker) = (b.fetched_at, b.broker);
            self.fail_run(job.id, e, fetched_at, broker);
        }
    }

    /// Account for `n` messages of `bytes` just appended to partition `id`'s buffer, and
    /// queue it for the consumer.
    fn added(&mut self, id: u64, n: usize, bytes: usize) {
        let Some(p) = self.parts.get_mut(&id) else {
            return;
        };
        self.buffered += n;
        self.buffered_bytes += bytes;
        if !p.in_ready && !p.paused && !p.is_empty() {
            p.in_ready = true;
            self.ready.push_back(id);
        }
    }
}
