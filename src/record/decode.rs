//! Decoding the `records` bytes of a fetch response: a sequence of RecordBatch v2
//! batches and/or legacy messages, the last of which may be cut short by the broker.

use bytes::{Buf, Bytes};

use super::{legacy, Header, Record, RecordBatch, TimestampType, BATCH_HEADER_LEN, MAGIC_V2};
use crate::compression::Compression;
use crate::error::{Error, Result};
use crate::protocol::primitives::{
    capacity_for, get_i16, get_i32, get_i64, get_i8, get_u32, get_varint, get_varlong,
};

/// Offset (i64) and length (i32): the prefix shared by every batch and legacy message.
const LOG_OVERHEAD: usize = 12;
/// The smallest possible encoded record: seven one-byte fields.
const MIN_RECORD_LEN: usize = 7;

/// The result of [`decode_batches`].
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
}

/// Decode the raw `records` bytes of a fetch response (one partition) into batches.
///
/// Batches with magic 2 are RecordBatch v2, checked against their CRC-32C; magic 0 and
/// 1 are legacy messages (CRC-32), including compressed wrappers. An incomplete last
/// batch is not an error: it is dropped and reported in [`DecodedBatches::truncated`].
///
/// `max_decompressed` bounds the memory decompression may take for the whole call: all
/// compressed payloads *together* may decompress to at most that many bytes (a per-batch
/// limit would let a response of many small compressed batches, each just under it,
/// allocate without bound, as the decoded records keep every payload alive).
/// Uncompressed batches are slices of `data` and do not count.
pub fn decode_batches(mut data: Bytes, max_decompressed: usize) -> Result<DecodedBatches> {
    let mut out = DecodedBatches::default();
    let mut budget = max_decompressed;
    while !data.is_empty() {
        // offset (8 bytes), then the length of what follows (4 bytes)
        let length = match data.get(8..LOG_OVERHEAD).map(<[u8; 4]>::try_from) {
            Some(Ok(b)) => i32::from_be_bytes(b),
            _ => {
                out.truncated = true;
                break;
            }
        };
        let length = usize::try_from(length)
            .map_err(|_| Error::protocol(format!("negative record batch length {length}")))?;
        let size = length.saturating_add(LOG_OVERHEAD);
        if data.len() < size {
            out.truncated = true;
            out.truncated_batch_size = Some(size);
            break;
        }
        let batch = data.split_to(size);
        let magic = batch.get(16).map(|m| *m as i8);
        match magic {
            Some(MAGIC_V2) => out.batches.push(decode_v2(batch, &mut budget)?),
            Some(0 | 1) => out
                .batches
                .push(legacy::decode_message(batch, &mut budget)?),
            Some(m) => return Err(Error::protocol(format!("unknown record batch magic {m}"))),
            None => {
                return Err(Error::protocol(format!(
                    "record batch of {size} bytes is too short"
                )))
            }
        }
    }
    Ok(out)
}

/// Decode one complete RecordBatch v2 (`batch` is exactly its bytes). Decompression may
/// produce at most `budget` bytes, which are then taken from it.
fn decode_v2(batch: Bytes, budget: &mut usize) -> Result<RecordBatch> {
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
    let computed = crc32c::crc32c(&b);
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
    let at = |e: Error| {
        let msg = format!("record batch at offset {base_offset}: {e}");
        e.with_message(msg)
    };
    let mut payload = if compression == Compression::None {
        b
    } else {
        let payload = compression.decompress(&b, *budget).map_err(at)?;
        *budget = budget.saturating_sub(payload.len());
        payload
    };
    let count = usize::try_from(count)
        .map_err(|_| at(Error::protocol(format!("negative record count {count}"))))?;
    if count > payload.len() / MIN_RECORD_LEN {
        return Err(at(Error::protocol(format!(
            "record count {count} exceeds what the {} record bytes can hold",
            payload.len()
        ))));
    }
    let ctx = RecordCtx {
        base_offset,
        base_timestamp,
        log_append_time: (timestamp_type == TimestampType::LogAppendTime).then_some(max_timestamp),
    };
    let mut records = Vec::with_capacity(capacity_for::<Record>(count));
    for _ in 0..count {
        records.push(decode_record(&mut payload, &ctx).map_err(at)?);
    }
    if !payload.is_empty() {
        return Err(at(Error::protocol(format!(
            "{} trailing bytes after {count} records",
            payload.len()
        ))));
    }
    Ok(RecordBatch {
        base_offset,
        partition_leader_epoch,
        magic,
        compression,
        timestamp_type,
        is_transactional: attributes & 0x10 != 0,
        is_control: attributes & 0x20 != 0,
        last_offset_delta,
        base_timestamp,
        max_timestamp,
        producer_id,
        producer_epoch,
        base_sequence,
        records,
    })
}

struct RecordCtx {
    base_offset: i64,
    base_timestamp: i64,
    /// For `LogAppendTime` batches, the timestamp every record gets.
    log_append_time: Option<i64>,
}

fn decode_record(buf: &mut Bytes, ctx: &RecordCtx) -> Result<Record> {
    let len = get_varint(buf)?;
    let len = usize::try_from(len)
        .ok()
        .filter(|l| *l <= buf.remaining())
        .ok_or_else(|| {
            Error::protocol(format!(
                "record length {len} invalid with {} bytes left",
                buf.remaining()
            ))
        })?;
    let mut r = buf.split_to(len);
    let _attributes = get_i8(&mut r)?;
    let ts_delta = get_varlong(&mut r)?;
    let offset_delta = get_varint(&mut r)?;
    let key = get_varbytes(&mut r, "key")?;
    let value = get_varbytes(&mut r, "value")?;
    let n_headers = get_varint(&mut r)?;
    let n_headers = usize::try_from(n_headers)
        .ok()
        .filter(|n| n.saturating_mul(2) <= r.remaining())
        .ok_or_else(|| {
            Error::protocol(format!(
                "header count {n_headers} invalid with {} bytes left",
                r.remaining()
            ))
        })?;
    let mut headers = Vec::with_capacity(capacity_for::<Header>(n_headers));
    for _ in 0..n_headers {
        let key = get_varbytes(&mut r, "header key")?
            .ok_or_else(|| Error::protocol("null header key"))?;
        let key = String::from_utf8(key.to_vec())
            .map_err(|_| Error::protocol("header key is not valid UTF-8"))?;
        let value = get_varbytes(&mut r, "header value")?;
        headers.push(Header { key, value });
    }
    if !r.is_empty() {
        return Err(Error::protocol(format!(
            "record declared {len} bytes but {} were left unread",
            r.len()
        )));
    }
    Ok(Record {
        offset: ctx.base_offset.wrapping_add(i64::from(offset_delta)),
        timestamp: ctx
            .log_append_time
            .unwrap_or_else(|| ctx.base_timestamp.wrapping_add(ts_delta)),
        key,
        value,
        headers,
    })
}

/// A varint-length-prefixed nullable byte field, zero-copy.
fn get_varbytes(buf: &mut Bytes, what: &str) -> Result<Option<Bytes>> {
    let len = get_varint(buf)?;
    if len == -1 {
        return Ok(None);
    }
    match usize::try_from(len) {
        Ok(n) if n <= buf.remaining() => Ok(Some(buf.split_to(n))),
        _ => Err(Error::protocol(format!(
            "record {what} length {len} invalid with {} bytes left",
            buf.remaining()
        ))),
    }
}
