//! Decoding the `records` bytes of a fetch response: a sequence of RecordBatch v2
//! batches and/or legacy messages, the last of which may be cut short by the broker.

use std::sync::Arc;

use bytes::{Buf, Bytes};

use super::{legacy, Header, Record, RecordBatch, TimestampType, BATCH_HEADER_LEN, MAGIC_V2};
use crate::bufpool::BufPool;
use crate::compression::Compression;
use crate::error::{Error, Result};
use crate::protocol::primitives::{capacity_for, get_i16, get_i32, get_i64, get_i8, get_u32};

/// Offset (i64) and length (i32): the prefix shared by every batch and legacy message.
const LOG_OVERHEAD: usize = 12;
/// The smallest possible encoded record: seven one-byte fields.
const MIN_RECORD_LEN: usize = 7;

/// The result of [`decode_batches`] and [`decode_batches_within`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DecodedBatches {
    /// The complete batches, in order.
    pub batches: Vec<RecordBatch>,
    /// Whether the buffer ended with an incomplete batch (normal: the broker cuts the
    /// response at the fetch's max bytes). It was dropped.
    pub truncated: bool,
    /// When truncated and the cut batch's length was readable: its full size in bytes
    /// (offset and length prefix included). If `batches` is empty, a fetch needs at
    /// least this many bytes to make progress.
    pub truncated_batch_size: Option<usize>,
    /// Whether decoding stopped early, before a compressed batch that would have taken
    /// the decompressed total past the soft limit, or before a batch that does not decode
    /// (corrupt, unknown magic): that batch and everything after it were left undecoded
    /// (never `batches` empty). Fetching again from the last batch's
    /// [`RecordBatch::next_offset`] continues with them; a bad batch, first then, is
    /// reported as the error.
    pub limited: bool,
}

/// The largest compressed payload [`decode_batches_lazy`] leaves compressed, to be
/// decompressed when its first record is decoded (by the consumer, as it reaches the
/// batch); larger ones are decompressed at once, off the consumer's path. Small
/// payloads are where a fetch's decompressed size runs away from its fetched size: a
/// batch of 1 MiB of repetitive records compresses to a few KiB, so one response of them
/// would otherwise decompress to hundreds of MiB, all fresh memory, while the consumer
/// reads one batch at a time.
pub(crate) const DEFER_MAX: usize = 256 << 10;

/// The hard limit [`decode_batches_within`] applies to the first batch when the caller
/// passes none larger: 256 MiB, 256 times Kafka's default `max.message.bytes`.
pub const MAX_BATCH_DECOMPRESSED: usize = 256 * 1024 * 1024;

/// Decode the raw `records` bytes of a fetch response (one partition) into batches,
/// with one decompression limit: `decode_batches_within(data, max_decompressed,
/// max_decompressed)`.
///
/// ```
/// use kafkapipe::compression::Compression;
/// use kafkapipe::record::{decode_batches, RecordBatchBuilder};
///
/// let mut b = RecordBatchBuilder::new(Compression::Zstd);
/// b.append(0, None, Some(&[0u8; 1000][..]), &[])?;
/// let batch = b.build()?;
/// let mut two = batch.to_vec();
/// two.extend_from_slice(&batch);
///
/// // Room for one decompressed payload, not two: the first batch comes back alone.
/// let d = decode_batches(two.into(), 1500)?;
/// assert_eq!((d.batches.len(), d.limited), (1, true));
/// // A first batch beyond the limit is an error.
/// assert!(decode_batches(batch, 500).is_err());
/// # Ok::<(), kafkapipe::Error>(())
/// ```
pub fn decode_batches(data: Bytes, max_decompressed: usize) -> Result<DecodedBatches> {
    decode_batches_within(data, max_decompressed, max_decompressed)
}

/// Decode the raw `records` bytes of a fetch response (one partition) into batches,
/// keeping decompression within bounds.
///
/// Batches with magic 2 are RecordBatch v2, checked against their CRC-32C; magic 0 and
/// 1 are legacy messages (CRC-32), including compressed wrappers. An incomplete last
/// batch is not an error: it is dropped and reported in [`DecodedBatches::truncated`].
/// A batch that does not decode (corrupt, unknown magic) is an error only when it comes
/// first; after good batches, decoding stops before it with [`DecodedBatches::limited`]
/// set, so the good ones are never lost to a bad one behind them.
///
/// Decompression is bounded per call, since the decoded records keep every payload
/// alive (a per-batch limit would let many small compressed batches, each just under
/// it, allocate without bound):
/// - `soft_limit`: the compressed payloads of all batches *together* decompress to at
///   most this many bytes. Decoding stops before the first compressed batch that would
///   cross it, returning the batches decoded so far with [`DecodedBatches::limited`]
///   set, so the caller makes progress and fetches the rest again from there.
/// - `hard_limit`: the first batch (while nothing has been decoded yet) may use up to
///   `max(soft_limit, hard_limit)` bytes, so a batch larger than the soft limit is still
///   read. A first batch beyond that (a decompression bomb, or a batch too big for this
///   reader) is an error of kind `Compression` naming its offset; it is never partly
///   returned.
///
/// Uncompressed batches are slices of `data` and count against neither limit. At most
/// `max(soft_limit, hard_limit)` decompressed bytes are kept, plus at most `soft_limit`
/// bytes of a batch decompressed and dropped for crossing the limit.
///
/// ```
/// use kafkapipe::compression::Compression;
/// use kafkapipe::record::{decode_batches_within, RecordBatchBuilder};
///
/// let mut b = RecordBatchBuilder::new(Compression::Lz4);
/// b.append(0, None, Some(&[7u8; 10_000][..]), &[])?;
/// let big = b.build()?;
///
/// // Larger than the soft limit, within the hard one: decoded, so a reader progresses.
/// let d = decode_batches_within(big.clone(), 1_000, 1 << 20)?;
/// assert_eq!(d.batches[0].records.len(), 1);
/// // Larger than both: a clear error naming the batch.
/// let err = decode_batches_within(big, 1_000, 5_000).unwrap_err();
/// assert!(err.to_string().contains("offset 0"), "{err}");
/// # Ok::<(), kafkapipe::Error>(())
/// ```
pub fn decode_batches_within(
    data: Bytes,
    soft_limit: usize,
    hard_limit: usize,
) -> Result<DecodedBatches> {
    decode_batches_pooled(data, soft_limit, hard_limit, None)
}

/// [`decode_batches_within`], decompressing RecordBatch v2 payloads into buffers of `pool`
/// (when given), which get them back once the last record slice is dropped.
pub(crate) fn decode_batches_pooled(
    data: Bytes,
    soft_limit: usize,
    hard_limit: usize,
    pool: Option<&Arc<BufPool>>,
) -> Result<DecodedBatches> {
    let d = decode_batches_inner(data, soft_limit, hard_limit, pool, false, true)?;
    Ok(DecodedBatches {
        batches: d.batches.into_iter().map(|b| b.batch).collect(),
        truncated: d.truncated,
        truncated_batch_size: d.truncated_batch_size,
        limited: d.limited,
    })
}

/// A batch as [`decode_batches_lazy`] returns it: its header (and, for control batches,
/// legacy messages and empty batches, its records) plus, for other RecordBatch v2
/// batches, their records still encoded.
#[derive(Debug)]
pub(crate) struct LazyBatch {
    /// The header; `records` is empty when `encoded` holds them.
    pub(crate) batch: RecordBatch,
    pub(crate) encoded: Option<EncodedRecords>,
}

impl AsRef<RecordBatch> for LazyBatch {
    fn as_ref(&self) -> &RecordBatch {
        &self.batch
    }
}

/// [`decode_batches_pooled`]'s result in [`decode_batches_lazy`].
#[derive(Debug, Default)]
pub(crate) struct LazyDecoded {
    pub(crate) batches: Vec<LazyBatch>,
    pub(crate) truncated: bool,
    pub(crate) truncated_batch_size: Option<usize>,
    pub(crate) limited: bool,
}

/// [`decode_batches_pooled`] with every batch-level check (CRC, decompression and its
/// limits, record count) but leaving the records of RecordBatch v2 data batches encoded,
/// for [`EncodedRecords::decode_next`] to decode one at a time. Control batches and legacy
/// messages come decoded. With `check_crcs` false the batches' and legacy messages'
/// CRCs are not computed ([`ReaderConfig::check_crcs`](crate::reader::ReaderConfig::check_crcs)).
pub(crate) fn decode_batches_lazy(
    data: Bytes,
    soft_limit: usize,
    hard_limit: usize,
    pool: Option<&Arc<BufPool>>,
    check_crcs: bool,
) -> Result<LazyDecoded> {
    decode_batches_inner(data, soft_limit, hard_limit, pool, true, check_crcs)
}

fn decode_batches_inner(
    mut data: Bytes,
    soft_limit: usize,
    hard_limit: usize,
    pool: Option<&Arc<BufPool>>,
    lazy: bool,
    check_crcs: bool,
) -> Result<LazyDecoded> {
    let mut out = LazyDecoded::default();
    let mut budget = soft_limit;
    while !data.is_empty() {
        // offset (8 bytes), then the length of what follows (4 bytes)
        let length = match data.get(8..LOG_OVERHEAD).map(<[u8; 4]>::try_from) {
            Some(Ok(b)) => i32::from_be_bytes(b),
            _ => {
                out.truncated = true;
                break;
            }
        };
        let first = out.batches.is_empty();
        let Ok(length) = usize::try_from(length) else {
            if first {
                return Err(Error::protocol(format!(
                    "negative record batch length {length}"
                )));
            }
            out.limited = true;
            break;
        };
        let size = length.saturating_add(LOG_OVERHEAD);
        if data.len() < size {
            out.truncated = true;
            out.truncated_batch_size = Some(size);
            break;
        }
        let limit = if first {
            budget.max(hard_limit)
        } else {
            budget
        };
        // Only taken from `data` once decoded, so a batch left for the next fetch stays.
        let batch = data.slice(..size);
        let magic = batch.get(16).map(|m| *m as i8);
        let step = match magic {
            Some(MAGIC_V2) => decode_v2(
                batch,
                limit,
                soft_limit.max(hard_limit),
                pool,
                lazy,
                check_crcs,
            ),
            Some(0 | 1) => legacy::decode_message(batch, limit, check_crcs),
            Some(m) => Err(Error::protocol(format!("unknown record batch magic {m}"))),
            None => Err(Error::protocol(format!(
                "record batch of {size} bytes is too short"
            ))),
        };
        // A batch that does not decode after good ones: keep those, leave it for the
        // next decode, which starts with it and reports its error.
        let step = match step {
            Ok(step) => step,
            Err(_) if !first => {
                out.limited = true;
                break;
            }
            Err(e) => return Err(e),
        };
        match step {
            Step::Batch(batch, decompressed) => {
                budget = budget.saturating_sub(decompressed);
                out.batches.push(LazyBatch {
                    batch,
                    encoded: None,
                });
                data.advance(size);
            }
            Step::Encoded(batch, encoded, decompressed) => {
                budget = budget.saturating_sub(decompressed);
                out.batches.push(LazyBatch {
                    batch,
                    encoded: Some(encoded),
                });
                data.advance(size);
            }
            Step::OverLimit { .. } if !first => {
                out.limited = true;
                break;
            }
            Step::OverLimit { at, codec } => {
                return Err(Error::compression(format!(
                    "{at}: {}",
                    over_limit(codec, limit)
                )))
            }
        }
    }
    Ok(out)
}

/// The outcome of decoding one batch within a decompression limit.
pub(super) enum Step {
    /// The batch, and how many bytes its payload decompressed to (0 if uncompressed).
    Batch(RecordBatch, usize),
    /// The batch without its records (still encoded), and the same byte count.
    Encoded(RecordBatch, EncodedRecords, usize),
    /// Its payload decompresses to more than the limit. `at` names the batch ("record
    /// batch at offset N").
    OverLimit { at: String, codec: Compression },
}

/// Decode one complete RecordBatch v2 (`batch` is exactly its bytes), decompressing its
/// payload to at most `limit` bytes; with `lazy`, a data batch's records are left encoded,
/// and a compressed payload of at most [`DEFER_MAX`] bytes is left compressed too, to be
/// decompressed to at most `deferred_limit` bytes when its first record is decoded.
/// The CRC-32C is checked when `check_crc` is set.
fn decode_v2(
    batch: Bytes,
    limit: usize,
    deferred_limit: usize,
    pool: Option<&Arc<BufPool>>,
    lazy: bool,
    check_crc: bool,
) -> Result<Step> {
    if batch.len() < BATCH_HEADER_LEN {
        return Err(Error::protocol(format!(
            "record batch of {} bytes is shorter than its {BATCH_HEADER_LEN}-byte header",
            batch.len()
        )));
    }
    let mut b = batch.clone();
    let base_offset = get_i64(&mut b)?;
    let _length = get_i32(&mut b)?;
    let partition_leader_epoch = get_i32(&mut b)?;
    let magic = get_i8(&mut b)?;
    let stored_crc = get_u32(&mut b)?;
    // `b` now starts at the attributes: the CRC-32C covers everything from here on.
    let computed = if check_crc {
        crc32c::crc32c(&b)
    } else {
        stored_crc
    };
    let attributes = get_i16(&mut b)?;
    let last_offset_delta = get_i32(&mut b)?;
    if stored_crc != computed {
        return Err(Error::protocol(format!(
            "CRC mismatch in record batch at offsets {base_offset}..={}: stored {stored_crc:#010x}, computed {computed:#010x}",
            base_offset.saturating_add(i64::from(last_offset_delta))
        )));
    }
    let base_timestamp = get_i64(&mut b)?;
    let max_timestamp = get_i64(&mut b)?;
    let producer_id = get_i64(&mut b)?;
    let producer_epoch = get_i16(&mut b)?;
    let base_sequence = get_i32(&mut b)?;
    let count = get_i32(&mut b)?;

    let compression = Compression::from_attributes(attributes)?;
    let timestamp_type = if attributes & 0x08 != 0 {
        TimestampType::LogAppendTime
    } else {
        TimestampType::CreateTime
    };
    let at = |e: Error| at_batch(base_offset, e);
    let count = usize::try_from(count)
        .map_err(|_| at(Error::protocol(format!("negative record count {count}"))))?;
    let is_control = attributes & 0x20 != 0;
    let ctx = RecordCtx {
        base_offset,
        base_timestamp,
        log_append_time: (timestamp_type == TimestampType::LogAppendTime).then_some(max_timestamp),
    };
    let mut batch = RecordBatch {
        base_offset,
        partition_leader_epoch,
        magic,
        compression,
        timestamp_type,
        is_transactional: attributes & 0x10 != 0,
        is_control,
        last_offset_delta,
        base_timestamp,
        max_timestamp,
        producer_id,
        producer_epoch,
        base_sequence,
        records: Vec::new(),
    };
    // Left compressed: a small data batch whose record count its offsets allow (Kafka
    // writes at most `last_offset_delta + 1` records; a batch claiming more is checked
    // against its payload now, as it would count that many messages meanwhile). It gets
    // its own copy of the compressed bytes, which are a slice of the whole response.
    let offsets = i64::from(last_offset_delta).saturating_add(1);
    if lazy
        && compression != Compression::None
        && !is_control
        && count > 0
        && i64::try_from(count).is_ok_and(|c| c <= offsets)
        && b.len() <= DEFER_MAX
    {
        let encoded = EncodedRecords {
            payload: Bytes::copy_from_slice(&b),
            pos: 0,
            left: count,
            count,
            ctx,
            compressed: Some(Box::new(Deferred {
                codec: compression,
                limit: deferred_limit,
                pool: pool.cloned(),
            })),
        };
        return Ok(Step::Encoded(batch, encoded, 0));
    }
    let (payload, decompressed) = if compression == Compression::None {
        (b, 0)
    } else {
        match compression.decompress_pooled(&b, limit, pool).map_err(at)? {
            Some(p) => {
                let n = p.len();
                (p, n)
            }
            None => {
                return Ok(Step::OverLimit {
                    at: format!("record batch at offset {base_offset}"),
                    codec: compression,
                })
            }
        }
    };
    check_count(count, payload.len()).map_err(at)?;
    let mut encoded = EncodedRecords {
        payload,
        pos: 0,
        left: count,
        count,
        ctx,
        compressed: None,
    };
    // Control batches (read at fetch time) and empty ones (nothing to defer but the
    // trailing-bytes check) are decoded now.
    if lazy && !is_control && count > 0 {
        return Ok(Step::Encoded(batch, encoded, decompressed));
    }
    // One pass over the payload: a cursor over the bytes (bounds checked per field, one-byte
    // varints on a fast path), each key and value one zero-copy slice of `payload`.
    let mut records = Vec::with_capacity(capacity_for::<Record>(count));
    let mut cur = Cursor {
        buf: &encoded.payload,
        pos: 0,
        end: encoded.payload.len(),
    };
    for _ in 0..count {
        decode_record_into(&encoded.payload, &mut cur, &encoded.ctx, &mut records).map_err(at)?;
    }
    (encoded.pos, encoded.left) = (cur.pos, 0);
    encoded.finish()?;
    batch.records = records;
    Ok(Step::Batch(batch, decompressed))
}

/// What a payload that decompresses past its limit is told.
fn over_limit(codec: Compression, limit: usize) -> String {
    format!("{codec} payload decompresses to more than the {limit}-byte limit")
}

/// A batch of `count` records cannot fit in `len` bytes.
fn check_count(count: usize, len: usize) -> Result<()> {
    if count > len / MIN_RECORD_LEN {
        return Err(Error::protocol(format!(
            "record count {count} exceeds what the {len} record bytes can hold"
        )));
    }
    Ok(())
}

/// Prefix `e` with the batch it comes from.
fn at_batch(base_offset: i64, e: Error) -> Error {
    let msg = format!("record batch at offset {base_offset}: {e}");
    e.with_message(msg)
}

/// The records of one RecordBatch v2, still encoded in its payload (still compressed,
/// for a small compressed batch, until the first record is decoded: see [`DEFER_MAX`]),
/// and a cursor over them: [`decode_next`](Self::decode_next) decodes the next one.
#[derive(Debug)]
pub(crate) struct EncodedRecords {
    payload: Bytes,
    pos: usize,
    /// Records still to decode (of the batch's record `count`).
    left: usize,
    count: usize,
    ctx: RecordCtx,
    /// While `payload` is still compressed: how to decompress it.
    compressed: Option<Box<Deferred>>,
}

/// How a payload left compressed is decompressed.
#[derive(Debug, Clone)]
struct Deferred {
    codec: Compression,
    /// The most bytes it may decompress to.
    limit: usize,
    pool: Option<Arc<BufPool>>,
}

/// The decompression of a payload left compressed, to run anywhere (the reader runs it
/// without its state lock) and hand back to [`EncodedRecords::install`].
#[derive(Debug)]
pub(crate) struct Decompression {
    payload: Bytes,
    how: Deferred,
    base_offset: i64,
}

impl Decompression {
    /// The decompressed payload, or the error naming the batch.
    pub(crate) fn run(&self) -> Result<Bytes> {
        let at = |e: Error| at_batch(self.base_offset, e);
        let d = &self.how;
        d.codec
            .decompress_pooled(&self.payload, d.limit, d.pool.as_ref())
            .map_err(at)?
            .ok_or_else(|| at(Error::compression(over_limit(d.codec, d.limit))))
    }
}

impl EncodedRecords {
    /// Whether the payload is still compressed ([`bytes`](Self::bytes) then counts its
    /// compressed size).
    #[inline]
    pub(crate) fn is_compressed(&self) -> bool {
        self.compressed.is_some()
    }

    /// The payload (still compressed or not).
    #[cfg(test)]
    pub(crate) fn payload(&self) -> &Bytes {
        &self.payload
    }

    /// The offset of the batch's first record.
    #[inline]
    pub(crate) fn base_offset(&self) -> i64 {
        self.ctx.base_offset
    }

    /// Decompress a payload left compressed (nothing to do otherwise). Decoding the
    /// first record does it too; the caller calls it first to see
    /// [`bytes`](Self::bytes) grow.
    pub(crate) fn decompress(&mut self) -> Result<()> {
        let Some(job) = self.decompression() else {
            return Ok(());
        };
        let result = job.run();
        self.install(result)
    }

    /// The decompression a payload left compressed still needs.
    pub(crate) fn decompression(&self) -> Option<Decompression> {
        let how = self.compressed.as_deref()?.clone();
        Some(Decompression {
            payload: self.payload.clone(),
            how,
            base_offset: self.ctx.base_offset,
        })
    }

    /// Take the result of [`decompression`](Self::decompression)'s run: the payload is
    /// decompressed from now on (and, on an error, not to be decoded).
    pub(crate) fn install(&mut self, result: Result<Bytes>) -> Result<()> {
        if self.compressed.take().is_none() {
            return Ok(());
        }
        let checked = result.and_then(|p| {
            check_count(self.count, p.len()).map_err(|e| at_batch(self.ctx.base_offset, e))?;
            Ok(p)
        });
        let payload = match checked {
            Ok(p) => p,
            Err(e) => {
                self.left = 0;
                return Err(e);
            }
        };
        self.payload = payload;
        self.pos = 0;
        Ok(())
    }

    /// Records still to decode.
    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.left
    }

    /// Encoded bytes still to decode.
    #[inline]
    pub(crate) fn bytes(&self) -> usize {
        self.payload.len() - self.pos
    }

    /// Decode the next record (there must be one: `len() > 0`) and hand it to `emit` with
    /// its encoded length (length prefix included); all of them add up to the payload's
    /// length once [`finish`](Self::finish) succeeds.
    #[inline]
    pub(crate) fn decode_next(&mut self, emit: impl FnOnce(Record, usize)) -> Result<()> {
        if self.left == 0 {
            return Err(at_batch(
                self.ctx.base_offset,
                Error::protocol("no record left to decode"),
            ));
        }
        if self.compressed.is_some() {
            self.decompress()?;
        }
        let mut cur = Cursor {
            buf: &self.payload,
            pos: self.pos,
            end: self.payload.len(),
        };
        decode_record(&self.payload, &mut cur, &self.ctx, emit)
            .map_err(|e| at_batch(self.ctx.base_offset, e))?;
        self.pos = cur.pos;
        self.left -= 1;
        Ok(())
    }

    /// Once every record is decoded: an error if bytes are left after them.
    pub(crate) fn finish(&self) -> Result<()> {
        if self.pos == self.payload.len() {
            return Ok(());
        }
        Err(at_batch(
            self.ctx.base_offset,
            Error::protocol(format!(
                "{} trailing bytes after {} records",
                self.payload.len() - self.pos,
                self.count
            )),
        ))
    }

    /// Skip the records before offset `from` (a compressed batch starts before the offset
    /// a fetch asked for).
    pub(crate) fn skip_before(&mut self, from: i64) -> Result<()> {
        if self.ctx.base_offset >= from {
            return Ok(());
        }
        while self.left > 0 {
            let (pos, left) = (self.pos, self.left);
            let mut offset = from;
            self.decode_next(|r, _| offset = r.offset)?;
            if offset >= from {
                (self.pos, self.left) = (pos, left);
                break;
            }
        }
        Ok(())
    }
}

/// [`decode_record`] onto `out`: one call per record of an eagerly decoded batch (inlined
/// into the batch loop, its varint reads would not be).
#[inline(never)]
fn decode_record_into(
    payload: &Bytes,
    cur: &mut Cursor<'_>,
    ctx: &RecordCtx,
    out: &mut Vec<Record>,
) -> Result<()> {
    decode_record(payload, cur, ctx, |r, _| out.push(r))
}

#[derive(Debug)]
struct RecordCtx {
    base_offset: i64,
    base_timestamp: i64,
    /// For `LogAppendTime` batches, the timestamp every record gets.
    log_append_time: Option<i64>,
}

#[cold]
fn bad_length(what: &str, len: i32, left: usize) -> Error {
    Error::protocol(format!(
        "record {what} length {len} invalid with {left} bytes left"
    ))
}

#[cold]
fn truncated(what: &str) -> Error {
    Error::protocol(format!("truncated {what}: need 1 bytes, 0 left"))
}

/// A bounds-checked read position in a record payload: `pos..end` is what is left.
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
    end: usize,
}

impl Cursor<'_> {
    #[inline]
    fn remaining(&self) -> usize {
        self.end - self.pos
    }

    #[inline]
    fn u8(&mut self, what: &str) -> Result<u8> {
        match self.buf.get(self.pos..self.end) {
            Some([b, ..]) => {
                self.pos += 1;
                Ok(*b)
            }
            _ => Err(truncated(what)),
        }
    }

    /// An `UNSIGNED_VARINT` (at most 5 bytes), as [`get_uvarint`](crate::protocol::primitives::get_uvarint).
    #[inline]
    fn uvarint(&mut self) -> Result<u32> {
        // Most lengths and deltas fit one or two bytes (a 100-byte value's length, zigzag
        // encoded, takes two).
        match self.buf.get(self.pos..self.end) {
            Some([b0, ..]) if *b0 < 0x80 => {
                self.pos += 1;
                Ok(u32::from(*b0))
            }
            Some([b0, b1, ..]) if *b1 < 0x80 => {
                self.pos += 2;
                Ok(u32::from(b0 & 0x7f) | u32::from(*b1) << 7)
            }
            _ => self.uvarint_slow(),
        }
    }

    #[cold]
    fn uvarint_slow(&mut self) -> Result<u32> {
        let mut value: u32 = 0;
        for i in 0..5 {
            let b = self.u8("unsigned varint")?;
            if i == 4 && b > 0x0f {
                return Err(Error::protocol("unsigned varint overflows 32 bits"));
            }
            value |= u32::from(b & 0x7f) << (7 * i);
            if b & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(Error::protocol("unsigned varint longer than 5 bytes"))
    }

    /// An unsigned varint of at most 10 bytes, as
    /// [`get_uvarlong`](crate::protocol::primitives::get_uvarlong).
    #[inline]
    fn uvarlong(&mut self) -> Result<u64> {
        match self.buf.get(self.pos..self.end) {
            Some([b0, ..]) if *b0 < 0x80 => {
                self.pos += 1;
                Ok(u64::from(*b0))
            }
            Some([b0, b1, ..]) if *b1 < 0x80 => {
                self.pos += 2;
                Ok(u64::from(b0 & 0x7f) | u64::from(*b1) << 7)
            }
            _ => self.uvarlong_slow(),
        }
    }

    #[cold]
    fn uvarlong_slow(&mut self) -> Result<u64> {
        let mut value: u64 = 0;
        for i in 0..10 {
            let b = self.u8("unsigned varlong")?;
            if i == 9 && b > 0x01 {
                return Err(Error::protocol("varlong overflows 64 bits"));
            }
            value |= u64::from(b & 0x7f) << (7 * i);
            if b & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(Error::protocol("varlong longer than 10 bytes"))
    }

    /// A zigzag `VARINT`.
    #[inline]
    fn varint(&mut self) -> Result<i32> {
        let v = self.uvarint()?;
        Ok(((v >> 1) as i32) ^ -((v & 1) as i32))
    }

    /// A zigzag `VARLONG`.
    #[inline]
    fn varlong(&mut self) -> Result<i64> {
        let v = self.uvarlong()?;
        Ok(((v >> 1) as i64) ^ -((v & 1) as i64))
    }

    /// A varint-length-prefixed nullable byte field, as a zero-copy slice of `payload`
    /// (the bytes this cursor reads).
    #[inline(always)]
    fn varbytes(&mut self, payload: &Bytes, what: &str) -> Result<Option<Bytes>> {
        let len = self.varint()?;
        if len == -1 {
            return Ok(None);
        }
        match usize::try_from(len) {
            Ok(n) if n <= self.remaining() => {
                let start = self.pos;
                self.pos += n;
                Ok(Some(payload.slice(start..self.pos)))
            }
            _ => Err(bad_length(what, len, self.remaining())),
        }
    }
}

/// Decode one record at `cur` (a cursor over `payload`) and hand it to `emit` with its
/// encoded length, leaving `cur` after it. (Handed over rather than returned: a
/// `Result<Record>` is one more move of it.) Inlined into each caller, the lazy one
/// building a reader's `Message` in place; the eager one is [`decode_record_into`].
#[inline(always)]
fn decode_record(
    payload: &Bytes,
    cur: &mut Cursor<'_>,
    ctx: &RecordCtx,
    emit: impl FnOnce(Record, usize),
) -> Result<()> {
    let start = cur.pos;
    let len = cur.varint()?;
    let len = usize::try_from(len)
        .ok()
        .filter(|l| *l <= cur.remaining())
        .ok_or_else(|| {
            Error::protocol(format!(
                "record length {len} invalid with {} bytes left",
                cur.remaining()
            ))
        })?;
    let end = cur.pos + len;
    let mut r = Cursor {
        buf: cur.buf,
        pos: cur.pos,
        end,
    };
    let _attributes = r.u8("int8")?;
    let ts_delta = r.varlong()?;
    let offset_delta = r.varint()?;
    let key = r.varbytes(payload, "key")?;
    let value = r.varbytes(payload, "value")?;
    let n_headers = r.varint()?;
    let n_headers = usize::try_from(n_headers)
        .ok()
        .filter(|n| n.saturating_mul(2) <= r.remaining())
        .ok_or_else(|| {
            Error::protocol(format!(
                "header count {n_headers} invalid with {} bytes left",
                r.remaining()
            ))
        })?;
    // Most records have no headers: no call into the allocator for them.
    let mut headers = if n_headers == 0 {
        Vec::new()
    } else {
        Vec::with_capacity(capacity_for::<Header>(n_headers))
    };
    for _ in 0..n_headers {
        let key = r
            .varbytes(payload, "header key")?
            .ok_or_else(|| Error::protocol("null header key"))?;
        let key = String::from_utf8(key.to_vec())
            .map_err(|_| Error::protocol("header key is not valid UTF-8"))?;
        let value = r.varbytes(payload, "header value")?;
        headers.push(Header { key, value });
    }
    if r.pos != end {
        return Err(Error::protocol(format!(
            "record declared {len} bytes but {} were left unread",
            end - r.pos
        )));
    }
    cur.pos = end;
    emit(
        Record {
            offset: ctx.base_offset.wrapping_add(i64::from(offset_delta)),
            timestamp: ctx
                .log_append_time
                .unwrap_or_else(|| ctx.base_timestamp.wrapping_add(ts_delta)),
            key,
            value,
            headers,
        },
        end - start,
    );
    Ok(())
}

#[cfg(test)]
mod cursor_tests {
    #![allow(clippy::unwrap_used)]

    use bytes::{Buf, Bytes};

    use super::Cursor;
    use crate::protocol::primitives::{get_uvarint, get_uvarlong};

    /// Every 1-, 2- and 3-byte input (the third byte from a spread), also cut short by
    /// the cursor's end: the cursor's fast paths agree with the reference decoders on the
    /// value, the bytes consumed, and whether it is an error.
    #[test]
    fn varints_agree_with_the_reference_decoders() {
        let thirds = [0x00u8, 0x01, 0x0f, 0x10, 0x7f, 0x80, 0xff];
        for b0 in 0..=255u8 {
            for b1 in 0..=255u8 {
                for b2 in thirds {
                    let bytes = [b0, b1, b2, 0x00, 0x00, 0x00];
                    for end in 0..=bytes.len() {
                        let input = Bytes::copy_from_slice(&bytes[..end]);
                        let want = get_uvarint(&mut input.clone()).ok();
                        let mut c = Cursor {
                            buf: &bytes,
                            pos: 0,
                            end,
                        };
                        let got = c.uvarint().ok();
                        assert_eq!(got, want, "{bytes:?} end {end}");
                        if let Some(v) = want {
                            let mut r = input.clone();
                            get_uvarint(&mut r).unwrap();
                            assert_eq!(c.pos, end - r.remaining(), "{v} from {bytes:?}");
                        }
                        let want = get_uvarlong(&mut input.clone()).ok();
                        let mut c = Cursor {
                            buf: &bytes,
                            pos: 0,
                            end,
                        };
                        assert_eq!(c.uvarlong().ok(), want, "{bytes:?} end {end}");
                        if want.is_some() {
                            let mut r = input.clone();
                            get_uvarlong(&mut r).unwrap();
                            assert_eq!(c.pos, end - r.remaining(), "{bytes:?}");
                        }
                    }
                }
            }
        }
    }
}
