//! Fetch on a [`Conn`], and the decoding of one partition of a fetch response.
//!
//! Owns [`Conn::fetch`] (one partition from one offset) and the decoding the `Reader`
//! shares ([`decode_fetch_lazy`]): the partition's error code, the record batches within
//! the decompression budget ([`decompress_limit`]), control batches and the batches of
//! aborted transactions dropped ([`visible_batches`], the Java consumer's
//! `CompletedFetch` rule), the offset to fetch next. May not: follow leaders, keep
//! positions or sessions (the `Reader`'s task does).

use std::sync::Arc;

use bytes::Bytes;

use crate::util::duration_ms;

use super::types::{FetchOptions, Fetched, IsolationLevel};
use super::{Conn, ZERO_UUID};
use crate::bufpool::BufPool;
use crate::error::{Error, Result};
use crate::protocol::messages::{
    AbortedTransaction, FetchPartition, FetchPartitionData, FetchRequest, FetchTopic,
};
use crate::protocol::ErrorCode;
use crate::record::{
    decode_batches_lazy, decode_batches_pooled, ControlRecord, LazyBatch, Record, RecordBatch,
    MAX_BATCH_DECOMPRESSED,
};

impl Conn {
    /// Fetch records of `topic`/`partition` starting at `offset`.
    ///
    /// Batches that start before `offset` have their leading records skipped; control
    /// records are dropped; under [`IsolationLevel::ReadCommitted`] the records of aborted
    /// transactions are removed using the response's aborted-transactions list.
    /// An empty result (nothing new within `max_wait`) is not an error.
    pub async fn fetch(
        &self,
        topic: &str,
        partition: i32,
        offset: i64,
        opts: &FetchOptions,
    ) -> Result<Fetched> {
        let mut version = self.connection.version_for::<FetchRequest>()?;
        let mut topic_id = ZERO_UUID;
        if version >= 13 {
            topic_id = self.topic_id(topic).await?;
            if topic_id == ZERO_UUID {
                version = self.by_name_version::<FetchRequest>(topic, partition)?;
            }
        }
        let req = FetchRequest {
            replica_id: -1,
            max_wait_ms: duration_ms(opts.max_wait),
            min_bytes: opts.min_bytes,
            max_bytes: opts.max_bytes,
            isolation_level: opts.isolation_level.code(),
            session_id: 0,
            session_epoch: -1,
            topics: vec![FetchTopic {
                topic: topic.to_string(),
                topic_id,
                partitions: vec![FetchPartition {
                    partition,
                    current_leader_epoch: -1,
                    fetch_offset: offset,
                    last_fetched_epoch: -1,
                    log_start_offset: -1,
                    partition_max_bytes: opts.max_bytes,
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        };
        let resp = self.connection.send_version(&req, version).await?;
        if let Some(code) = ErrorCode::non_zero(resp.error_code) {
            return Err(self.err(code, topic, partition));
        }
        let Some(p) = resp
            .responses
            .into_iter()
            .find(|t| t.topic == topic || (topic_id != ZERO_UUID && t.topic_id == topic_id))
            .and_then(|t| {
                t.partitions
                    .into_iter()
                    .find(|p| p.partition_index == partition)
            })
        else {
            // Kafka always lists every partition of a sessionless fetch; tansu 0.6 leaves
            // them out when nothing arrived within max_wait. Nothing new either way.
            tracing::debug!(topic, partition, "fetch response without the partition");
            return Ok(Fetched {
                records: Vec::new(),
                next_offset: offset,
                high_watermark: -1,
                last_stable_offset: -1,
                log_start_offset: -1,
            });
        };
        decode_fetch_partition(p, offset, opts.isolation_level, opts.max_bytes).map_err(|e| {
            e.with_topic(topic)
                .with_partition(partition)
                .with_broker(self.connection.broker())
        })
    }
}

/// Decode one partition of a fetch response that asked for records from `offset`: the
/// partition's error code becomes an error (without topic/partition context, which the
/// caller adds), the record bytes are decoded (an incomplete last batch is ignored) and
/// filtered with [`visible_batches`]. [`Conn::fetch`]'s; the `Reader` decodes with
/// [`decode_fetch_lazy`], which shares all but the records' decoding.
///
/// Compressed batches decode within [`decompress_limit`] together: when a response holds
/// more, the batches that fit are returned and `next_offset` points at the first one that
/// did not, so the next fetch continues there. The first batch may take up to
/// [`MAX_BATCH_DECOMPRESSED`], so there is always progress; one larger than that is a
/// non-retriable `Compression` error naming its offset.
pub(crate) fn decode_fetch_partition(
    p: FetchPartitionData,
    offset: i64,
    isolation_level: IsolationLevel,
    max_bytes: i32,
) -> Result<Fetched> {
    let f = decode_fetch_batches(
        p,
        offset,
        isolation_level,
        decompress_limit(max_bytes),
        None,
    )?;
    Ok(Fetched {
        records: visible_in(f.batches, offset).collect(),
        next_offset: f.next_offset,
        high_watermark: f.high_watermark,
        last_stable_offset: f.last_stable_offset,
        log_start_offset: f.log_start_offset,
    })
}

/// A partition's fetch result as [`decode_fetch_batches`] returns it: the visible data
/// batches, whose records before the requested offset are still to be skipped
/// ([`visible_in`]); or as [`decode_fetch_lazy`] returns it, with them skipped.
pub(crate) struct FetchedBatches<B = RecordBatch> {
    /// The data batches left after dropping control batches and aborted transactions.
    pub(crate) batches: Vec<B>,
    /// As [`Fetched::next_offset`].
    pub(crate) next_offset: i64,
    /// As [`Fetched::high_watermark`].
    pub(crate) high_watermark: i64,
    /// As [`Fetched::last_stable_offset`].
    pub(crate) last_stable_offset: i64,
    /// As [`Fetched::log_start_offset`].
    pub(crate) log_start_offset: i64,
    /// The partition leader epoch of every batch decoded (control batches and aborted
    /// transactions included) where it changes: `(base offset, epoch)`, in offset order.
    /// The last entry is the epoch of the last offset fetched (KIP-320).
    pub(crate) epochs: Vec<(i64, i32)>,
}

/// [`decode_fetch_partition`] without flattening the batches into one `Vec` of records,
/// decompressing into buffers of `pool` when given, to at most `limit` bytes together
/// (see [`decompress_limit`]; the first batch may take more).
pub(crate) fn decode_fetch_batches(
    p: FetchPartitionData,
    offset: i64,
    isolation_level: IsolationLevel,
    limit: usize,
    pool: Option<&Arc<BufPool>>,
) -> Result<FetchedBatches> {
    fetched_batches(p, offset, isolation_level, |data| {
        decode_batches_pooled(data, limit, MAX_BATCH_DECOMPRESSED, pool).map(|d| d.batches)
    })
}

/// [`decode_fetch_batches`] leaving the records of data batches encoded (see
/// [`decode_batches_lazy`]), the records before `offset` skipped: every record left is
/// visible. Legacy messages come decoded. Decompresses to at most `limit` bytes together,
/// as [`decode_fetch_batches`]. CRCs are checked if `check_crcs`.
pub(crate) fn decode_fetch_lazy(
    p: FetchPartitionData,
    offset: i64,
    isolation_level: IsolationLevel,
    limit: usize,
    pool: Option<&Arc<BufPool>>,
    check_crcs: bool,
) -> Result<FetchedBatches<LazyBatch>> {
    let mut f = fetched_batches(p, offset, isolation_level, |data| {
        decode_batches_lazy(data, limit, MAX_BATCH_DECOMPRESSED, pool, check_crcs)
            .map(|d| d.batches)
    })?;
    for b in &mut f.batches {
        match &mut b.encoded {
            Some(e) => e.skip_before(offset)?,
            None => b.batch.records.retain(|r| r.offset >= offset),
        }
    }
    Ok(f)
}

fn fetched_batches<B: AsRef<RecordBatch>>(
    p: FetchPartitionData,
    offset: i64,
    isolation_level: IsolationLevel,
    decode: impl FnOnce(Bytes) -> Result<Vec<B>>,
) -> Result<FetchedBatches<B>> {
    if let Some(code) = ErrorCode::non_zero(p.error_code) {
        return Err(Error::kafka(code));
    }
    let data = p.records.unwrap_or_default();
    let decoded = decode(data)?;
    let mut epochs: Vec<(i64, i32)> = Vec::new();
    for b in &decoded {
        let b = b.as_ref();
        if epochs.last().map(|(_, e)| *e) != Some(b.partition_leader_epoch) {
            epochs.push((b.base_offset, b.partition_leader_epoch));
        }
    }
    let aborted = if isolation_level == IsolationLevel::ReadCommitted {
        p.aborted_transactions.unwrap_or_default()
    } else {
        Vec::new()
    };
    let (batches, next_offset) = visible_batches(decoded, offset, &aborted);
    Ok(FetchedBatches {
        batches,
        next_offset,
        high_watermark: p.high_watermark,
        last_stable_offset: p.last_stable_offset,
        log_start_offset: p.log_start_offset,
        epochs,
    })
}

/// The records of `batches` (from [`visible_batches`]) at or after `from`, in order.
pub(crate) fn visible_in(batches: Vec<RecordBatch>, from: i64) -> impl Iterator<Item = Record> {
    batches
        .into_iter()
        .flat_map(|b| b.records)
        .filter(move |r| r.offset >= from)
}

/// Records visible to the application from decoded `batches`, starting at `from` (see
/// [`visible_batches`]), plus the offset to fetch next.
#[cfg(test)]
pub(crate) fn visible_records(
    batches: Vec<RecordBatch>,
    from: i64,
    aborted: &[AbortedTransaction],
) -> (Vec<Record>, i64) {
    let (batches, next) = visible_batches(batches, from, aborted);
    (visible_in(batches, from).collect(), next)
}

/// The data batches of decoded `batches` visible to the application, with control batches
/// dropped and batches of `aborted` transactions removed (records before `from` are
/// skipped later, by [`visible_in`]), plus the offset to fetch next.
///
/// The aborted-transaction rule is the Java consumer's (`CompletedFetch`): the aborted
/// transactions are taken in order of first offset; for each batch with a producer id, every
/// aborted transaction whose first offset is at or before the batch's *last* offset
/// activates its producer P; while P is active its transactional data batches are skipped;
/// P's ABORT control marker deactivates it. Non-transactional batches (idempotent
/// producers) and other producers' batches are never skipped. With `aborted` empty (read
/// uncommitted) only control records are dropped.
pub(crate) fn visible_batches<B: AsRef<RecordBatch>>(
    batches: Vec<B>,
    from: i64,
    aborted: &[AbortedTransaction],
) -> (Vec<B>, i64) {
    let mut pending: Vec<&AbortedTransaction> = aborted.iter().collect();
    // Popped from the end: smallest first offset first.
    pending.sort_by_key(|a| std::cmp::Reverse(a.first_offset));
    let mut active: Vec<i64> = Vec::new();
    let mut out = Vec::new();
    let mut next = from;
    for b in batches {
        let batch = b.as_ref();
        next = next.max(batch.next_offset());
        if batch.producer_id >= 0 {
            let last_offset = batch.next_offset().saturating_sub(1);
            while pending
                .last()
                .is_some_and(|a| a.first_offset <= last_offset)
            {
                if let Some(a) = pending.pop() {
                    active.push(a.producer_id);
                }
            }
            if batch.is_control {
                if let Ok(Some(ControlRecord::Abort)) = batch.control_record() {
                    active.retain(|p| *p != batch.producer_id);
                }
            } else if batch.is_transactional && active.contains(&batch.producer_id) {
                continue;
            }
        }
        if batch.is_control {
            continue;
        }
        out.push(b);
    }
    (out, next)
}

/// How much the compressed batches of one partition's fetch response may decompress to,
/// together (the soft limit of [`decode_batches_within`](crate::record::decode_batches_within)): generous relative to the fetch
/// size (real compression ratios rarely exceed 10–20×; constant 100-byte values reach ~75×
/// with zstd), bounded so that many small bombs cannot exhaust memory. A response holding
/// more is decoded in part, not refused.
pub(crate) fn decompress_limit(max_bytes: i32) -> usize {
    let base = usize::try_from(max_bytes.max(1)).unwrap_or(1);
    base.saturating_mul(32)
        .clamp(64 * 1024 * 1024, 1024 * 1024 * 1024)
}
