//! One partition's in-memory log: RecordBatch v2 bytes with assigned base offsets, and the
//! idempotent producers' sequence state.

use std::collections::HashMap;

use bytes::{Bytes, BytesMut};

use crate::protocol::ErrorCode;
use crate::record::{decode_batches, ControlRecord, RecordBatch, MAGIC_V2};

/// Offset (8) and length (4) before every batch.
const LOG_OVERHEAD: usize = 12;
/// Decompression bound when the mock validates a produced batch.
pub(super) const MAX_DECOMPRESSED: usize = 64 * 1024 * 1024;
/// How many recent batches per producer are remembered for duplicate detection (Kafka: 5).
const DEDUP_WINDOW: usize = 5;

#[derive(Debug, Clone)]
pub(super) struct StoredBatch {
    pub base: i64,
    /// The offset after the batch's last offset.
    pub next: i64,
    pub bytes: Bytes,
    /// (offset, timestamp) of every record, for ListOffsets by timestamp.
    pub timestamps: Vec<(i64, i64)>,
    pub producer_id: i64,
    pub transactional: bool,
    /// For a control batch: the marker, if it decoded.
    pub control: Option<Option<ControlRecord>>,
}

impl StoredBatch {
    /// A batch as stored at `base`; the producer and transaction fields come from the
    /// header bytes, the marker and timestamps from `decoded` (if it decoded).
    fn new(base: i64, next: i64, bytes: Bytes, decoded: Option<&RecordBatch>) -> Self {
        let attributes = bytes
            .get(21..23)
            .and_then(|b| <[u8; 2]>::try_from(b).ok())
            .map_or(0, i16::from_be_bytes);
        let producer_id = bytes
            .get(43..51)
            .and_then(|b| <[u8; 8]>::try_from(b).ok())
            .map_or(-1, i64::from_be_bytes);
        let timestamps = decoded
            .map(|b| {
                b.records
                    .iter()
                    .map(|r| {
                        (
                            base.saturating_add(r.offset.wrapping_sub(b.base_offset)),
                            r.timestamp,
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        let control = (attributes & 0x20 != 0)
            .then(|| decoded.and_then(|b| b.control_record().ok().flatten()));
        StoredBatch {
            base,
            next,
            bytes,
            timestamps,
            producer_id,
            transactional: attributes & 0x10 != 0,
            control,
        }
    }
}

/// An aborted transaction: producer, first offset, offset of its abort marker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Aborted {
    pub producer_id: i64,
    pub first_offset: i64,
    pub marker: i64,
}

#[derive(Debug, Clone, Default)]
struct ProducerState {
    epoch: i16,
    /// (first sequence, last sequence, base offset) of the most recent batches.
    recent: Vec<(i32, i32, i64)>,
}

#[derive(Debug)]
pub(super) struct PartitionLog {
    pub leader: i32,
    pub leader_epoch: i32,
    /// The leader epoch cache: `(epoch, start offset)` of every epoch in which a leader
    /// was elected, in order (Kafka's `LeaderEpochFileCache`).
    epochs: Vec<(i32, i64)>,
    pub log_start: i64,
    pub batches: Vec<StoredBatch>,
    producers: HashMap<i64, ProducerState>,
    /// Producers whose state was expired ([`PartitionLog::expire_producers`]): like a
    /// broker before Kafka 2.5, the log answers `UNKNOWN_PRODUCER_ID` to their next batch
    /// unless it starts a new sequence (0).
    expired: std::collections::HashSet<i64>,
}

/// A produced batch, split out and checked.
struct Incoming {
    bytes: BytesMut,
    batch: RecordBatch,
    count: i64,
}

impl PartitionLog {
    pub fn new(leader: i32) -> Self {
        PartitionLog {
            leader,
            leader_epoch: 0,
            epochs: vec![(0, 0)],
            log_start: 0,
            batches: Vec::new(),
            producers: HashMap::new(),
            expired: std::collections::HashSet::new(),
        }
    }

    /// Forget every idempotent producer's state (as the broker does after
    /// `transactional.id.expiration.ms` / `producer.id.expiration.ms`, or when retention
    /// deletes their batches). Returns how many producers were forgotten.
    pub fn expire_producers(&mut self) -> usize {
        let n = self.producers.len();
        self.expired
            .extend(self.producers.drain().map(|(id, _)| id));
        n
    }

    /// Forget every idempotent producer's state the way Kafka >= 2.5 does (retention or
    /// DeleteRecords removed all their batches): their next batch is taken at any
    /// sequence. Returns how many producers were forgotten.
    pub fn forget_producers(&mut self) -> usize {
        let n = self.producers.len();
        self.producers.clear();
        n
    }

    pub fn set_leader(&mut self, leader: i32) {
        self.leader = leader;
        self.leader_epoch = self.leader_epoch.saturating_add(1);
        if leader >= 0 {
            // an elected leader starts its epoch at its log end
            let end = self.high_watermark();
            self.epochs.push((self.leader_epoch, end));
        }
    }

    /// How a request's `current_leader_epoch` compares with the partition's: `None` when it
    /// matches or is not given (-1), `FENCED_LEADER_EPOCH` when the client's is older,
    /// `UNKNOWN_LEADER_EPOCH` when it is newer (KIP-320).
    pub fn check_epoch(&self, current: i32) -> Option<ErrorCode> {
        match current {
            c if c < 0 || c == self.leader_epoch => None,
            c if c < self.leader_epoch => Some(ErrorCode::FencedLeaderEpoch),
            _ => Some(ErrorCode::UnknownLeaderEpoch),
        }
    }

    /// OffsetForLeaderEpoch: the largest epoch at or below `epoch` that the log knows, and
    /// the end offset of that epoch (the start of the next higher one, or the log end for
    /// the latest); `(-1, -1)` for an epoch above every known one (Kafka's
    /// `LeaderEpochFileCache::endOffsetFor`).
    pub fn end_offset_for(&self, epoch: i32) -> (i32, i64) {
        if epoch < 0 {
            return (-1, -1);
        }
        if self.epochs.last().is_some_and(|(e, _)| *e == epoch) {
            return (epoch, self.high_watermark());
        }
        let Some(&(_, higher_start)) = self.epochs.iter().find(|(e, _)| *e > epoch) else {
            return (-1, -1);
        };
        match self.epochs.iter().rev().find(|(e, _)| *e <= epoch) {
            Some(&(floor, _)) => (floor, higher_start),
            None => (epoch, higher_start),
        }
    }

    /// Cut the log back to `offset` (whole batches: one holding `offset` goes too), as a
    /// replica whose log ended there would have it, and forget the epochs that started
    /// after. Returns the new log end.
    pub fn truncate(&mut self, offset: i64) -> i64 {
        let keep = offset.max(self.log_start);
        self.batches.retain(|b| b.next <= keep);
        let end = self.high_watermark();
        self.epochs.retain(|(_, start)| *start < end);
        if self.epochs.is_empty() {
            self.epochs.push((self.leader_epoch, end));
        }
        end
    }

    pub fn high_watermark(&self) -> i64 {
        self.batches
            .last()
            .map_or(self.log_start, |b| b.next.max(self.log_start))
    }

    pub fn raw_batches(&self) -> Vec<Bytes> {
        self.batches.iter().map(|b| b.bytes.clone()).collect()
    }

    /// Append the batches of one produce: all or none. Returns the base offset of the
    /// first (for a duplicate, the offset it was appended at first).
    pub fn append(&mut self, records: &Bytes, max_batch: Option<usize>) -> Result<i64, ErrorCode> {
        let incoming = split(records)?;
        if incoming
            .iter()
            .any(|i| max_batch.is_some_and(|max| i.bytes.len() > max))
        {
            return Err(ErrorCode::MessageTooLarge);
        }
        // Idempotence: check every batch before appending any.
        let mut next_seq: HashMap<i64, (i16, i32)> = HashMap::new();
        let mut duplicate = None;
        for (i, inc) in incoming.iter().enumerate() {
            let b = &inc.batch;
            if b.producer_id < 0 {
                continue;
            }
            let known = self.producers.get(&b.producer_id);
            let expected = next_seq.get(&b.producer_id).copied().or_else(|| {
                known.map(|s| {
                    let last = s.recent.last().map_or(-1, |r| r.1);
                    (s.epoch, last.wrapping_add(1))
                })
            });
            match (known, expected) {
                (Some(s), _) if b.producer_epoch < s.epoch => {
                    return Err(ErrorCode::InvalidProducerEpoch)
                }
                (Some(s), _) if b.producer_epoch == s.epoch && i == 0 => {
                    if let Some(r) = s.recent.iter().find(|r| r.0 == b.base_sequence) {
                        duplicate = Some(r.2);
                        break;
                    }
                }
                _ => {}
            }
            if known.is_none()
                && !next_seq.contains_key(&b.producer_id)
                && self.expired.contains(&b.producer_id)
                && b.base_sequence != 0
            {
                return Err(ErrorCode::UnknownProducerId);
            }
            let ok = match expected {
                Some((epoch, seq)) if epoch == b.producer_epoch => b.base_sequence == seq,
                // a new epoch of a producer the partition knows starts at sequence 0
                Some(_) => b.base_sequence == 0,
                // A producer the partition has no state for (new to it, or forgotten):
                // any sequence, as Kafka >= 2.5 takes it (`ProducerAppendInfo::
                // checkSequence` with no current epoch; KIP-360).
                None => true,
            };
            if !ok {
                return Err(ErrorCode::OutOfOrderSequenceNumber);
            }
            let last = b
                .base_sequence
                .wrapping_add(i32::try_from(inc.count - 1).unwrap_or(0));
            next_seq.insert(b.producer_id, (b.producer_epoch, last.wrapping_add(1)));
        }
        if let Some(offset) = duplicate {
            return Ok(offset);
        }
        let first = self.high_watermark();
        for inc in incoming {
            let base = self.high_watermark();
            let mut bytes = inc.bytes;
            // Neither the base offset nor the leader epoch is covered by the CRC.
            bytes[..8].copy_from_slice(&base.to_be_bytes());
            bytes[12..16].copy_from_slice(&self.leader_epoch.to_be_bytes());
            let b = inc.batch;
            if b.producer_id >= 0 {
                self.expired.remove(&b.producer_id);
                let s = self.producers.entry(b.producer_id).or_default();
                if s.epoch != b.producer_epoch {
                    s.recent.clear();
                    s.epoch = b.producer_epoch;
                }
                let last = b
                    .base_sequence
                    .wrapping_add(i32::try_from(inc.count - 1).unwrap_or(0));
                s.recent.push((b.base_sequence, last, base));
                if s.recent.len() > DEDUP_WINDOW {
                    s.recent.remove(0);
                }
            }
            self.batches.push(StoredBatch::new(
                base,
                base + inc.count,
                bytes.freeze(),
                Some(&b),
            ));
        }
        Ok(first)
    }

    /// Append `records` as they are (only the base offsets rewritten): batches that fail
    /// their CRC, or that no decoder would accept, reach the fetching client unchanged.
    /// Only the framing and the record count are read.
    pub fn append_raw(&mut self, records: &Bytes) -> Option<i64> {
        let first = self.high_watermark();
        let mut rest = records.clone();
        let mut out = Vec::new();
        let mut next = first;
        while !rest.is_empty() {
            let len = read_i32(&rest, 8).and_then(|l| usize::try_from(l).ok())?;
            let size = len.checked_add(LOG_OVERHEAD).filter(|s| *s <= rest.len())?;
            let delta = read_i32(&rest, 23).filter(|d| *d >= 0)?;
            let mut bytes = BytesMut::from(&rest.split_to(size)[..]);
            bytes[..8].copy_from_slice(&next.to_be_bytes());
            let base = next;
            next = base + i64::from(delta) + 1;
            let bytes = bytes.freeze();
            // Timestamps and markers, if the batch decodes at all.
            let decoded = decode_batches(bytes.clone(), MAX_DECOMPRESSED)
                .ok()
                .and_then(|d| d.batches.into_iter().next());
            out.push(StoredBatch::new(base, next, bytes, decoded.as_ref()));
        }
        if out.is_empty() {
            return None;
        }
        self.batches.extend(out);
        Some(first)
    }

    /// Move the log start up to `offset` (at most the high-water mark), dropping the
    /// batches wholly before it. Returns the new log start.
    pub fn delete_before(&mut self, offset: i64) -> i64 {
        self.log_start = self.log_start.max(offset.min(self.high_watermark()));
        let start = self.log_start;
        self.batches.retain(|b| b.next > start);
        start
    }

    /// The transactions in the log: the last stable offset (the first offset of the
    /// oldest open transaction, else the high-water mark) and the aborted ones.
    pub fn transactions(&self) -> (i64, Vec<Aborted>) {
        let mut open: HashMap<i64, i64> = HashMap::new();
        let mut aborted = Vec::new();
        for b in &self.batches {
            match b.control {
                Some(marker) => {
                    if let Some(first) = open.remove(&b.producer_id) {
                        if marker == Some(ControlRecord::Abort) {
                            aborted.push(Aborted {
                                producer_id: b.producer_id,
                                first_offset: first,
                                marker: b.base,
                            });
                        }
                    }
                }
                None if b.transactional => {
                    open.entry(b.producer_id).or_insert(b.base);
                }
                None => {}
            }
        }
        let lso = open
            .values()
            .copied()
            .min()
            .unwrap_or_else(|| self.high_watermark());
        (lso, aborted)
    }

    /// The first offset whose record has a timestamp at or after `ts`, with that
    /// timestamp.
    pub fn offset_for_time(&self, ts: i64) -> Option<(i64, i64)> {
        self.batches
            .iter()
            .flat_map(|b| b.timestamps.iter())
            .find(|(_, t)| *t >= ts)
            .copied()
    }

    /// The offset and timestamp of the record with the largest timestamp.
    pub fn max_timestamp(&self) -> Option<(i64, i64)> {
        self.batches.iter().flat_map(|b| b.timestamps.iter()).fold(
            None,
            |best: Option<(i64, i64)>, &(o, t)| match best {
                Some((_, bt)) if bt >= t => best,
                _ => Some((o, t)),
            },
        )
    }

    /// The batches from the one holding `offset` on, those starting before `upto`, at most `limit` bytes — but at least
    /// the first batch if `at_least_one`. With `truncate`, the batch that did not fit is
    /// cut at the limit instead of left out.
    pub fn read(
        &self,
        offset: i64,
        upto: i64,
        limit: usize,
        at_least_one: bool,
        truncate: bool,
    ) -> Bytes {
        let mut out = BytesMut::new();
        for b in self
            .batches
            .iter()
            .filter(|b| b.next > offset && b.base < upto)
        {
            let room = limit.saturating_sub(out.len());
            if b.bytes.len() <= room || (out.is_empty() && at_least_one) {
                out.extend_from_slice(&b.bytes);
            } else {
                if truncate && room > 0 {
                    out.extend_from_slice(&b.bytes[..room]);
                }
                break;
            }
        }
        out.freeze()
    }
}

fn read_i32(b: &[u8], at: usize) -> Option<i32> {
    b.get(at..at + 4)
        .and_then(|s| <[u8; 4]>::try_from(s).ok())
        .map(i32::from_be_bytes)
}

/// Split the records of a produce into its batches, each checked (magic 2, CRC, record
/// count) with the crate's decoder.
fn split(records: &Bytes) -> Result<Vec<Incoming>, ErrorCode> {
    let mut rest = records.clone();
    let mut out = Vec::new();
    while !rest.is_empty() {
        let len = rest
            .get(8..LOG_OVERHEAD)
            .and_then(|b| <[u8; 4]>::try_from(b).ok())
            .map(i32::from_be_bytes)
            .and_then(|l| usize::try_from(l).ok())
            .ok_or(ErrorCode::CorruptMessage)?;
        let size = len
            .checked_add(LOG_OVERHEAD)
            .filter(|s| *s <= rest.len())
            .ok_or(ErrorCode::CorruptMessage)?;
        let bytes = rest.split_to(size);
        if bytes.get(16).copied() != Some(MAGIC_V2 as u8) {
            return Err(ErrorCode::UnsupportedForMessageFormat);
        }
        let decoded = decode_batches(bytes.clone(), MAX_DECOMPRESSED)
            .map_err(|_| ErrorCode::CorruptMessage)?;
        if decoded.truncated || decoded.batches.len() != 1 {
            return Err(ErrorCode::CorruptMessage);
        }
        let Some(batch) = decoded.batches.into_iter().next() else {
            return Err(ErrorCode::CorruptMessage);
        };
        if batch.is_control {
            return Err(ErrorCode::InvalidRecord);
        }
        let count = i64::from(batch.last_offset_delta) + 1;
        if count < 1 {
            return Err(ErrorCode::CorruptMessage);
        }
        out.push(Incoming {
            bytes: BytesMut::from(&bytes[..]),
            batch,
            count,
        });
    }
    if out.is_empty() {
        return Err(ErrorCode::CorruptMessage);
    }
    Ok(out)
}
