//! Legacy MessageSet v0/v1 decoding (magic 0 and 1), for old brokers and old data.
//!
//! A message is `offset i64, size i32, crc u32, magic i8, attributes i8,
//! [timestamp i64 (v1)], key bytes, value bytes`, with a CRC-32 (IEEE) over magic..end.
//! A compressed message (a "wrapper") carries a whole inner message set in its value.
//! Inner offsets are absolute in v0 and relative in v1 (KIP-31): absolute =
//! wrapper offset − last inner offset + inner offset.
//!
//! Reference: Apache Kafka `LegacyRecord` and `AbstractLegacyRecordBatch`.

use bytes::{Buf, Bytes};

use super::crc32::crc32;
use super::decode::Step;
use super::{Record, RecordBatch, TimestampType, NO_TIMESTAMP};
use crate::compression::Compression;
use crate::error::{Error, Result};
use crate::protocol::primitives::{get_i32, get_i64, get_i8, get_nullable_bytes, get_u32};

/// One parsed legacy message.
struct Message {
    offset: i64,
    magic: i8,
    compression: Compression,
    timestamp_type: TimestampType,
    timestamp: i64,
    key: Option<Bytes>,
    value: Option<Bytes>,
}

/// Parse one complete legacy message (`msg` is exactly its bytes, offset and size
/// included), checking its CRC if `check_crc`.
fn parse_message(mut msg: Bytes, check_crc: bool) -> Result<Message> {
    let offset = get_i64(&mut msg)?;
    let _size = get_i32(&mut msg)?;
    let stored = get_u32(&mut msg)?;
    let computed = if check_crc { crc32(&msg) } else { stored };
    if stored != computed {
        return Err(Error::protocol(format!(
            "CRC mismatch in legacy message at offset {offset}: stored {stored:#010x}, computed {computed:#010x}"
        )));
    }
    let magic = get_i8(&mut msg)?;
    if !(0..=1).contains(&magic) {
        return Err(Error::protocol(format!(
            "legacy message at offset {offset} has magic {magic}"
        )));
    }
    let attributes = get_i8(&mut msg)?;
    let compression = Compression::from_attributes(i16::from(attributes))?;
    let (timestamp, timestamp_type) = if magic >= 1 {
        let ts = get_i64(&mut msg)?;
        let tt = if attributes & 0x08 != 0 {
            TimestampType::LogAppendTime
        } else {
            TimestampType::CreateTime
        };
        (ts, tt)
    } else {
        (NO_TIMESTAMP, TimestampType::CreateTime)
    };
    let key = get_nullable_bytes(&mut msg, false)?;
    let value = get_nullable_bytes(&mut msg, false)?;
    if msg.has_remaining() {
        return Err(Error::protocol(format!(
            "legacy message at offset {offset} has {} trailing bytes",
            msg.remaining()
        )));
    }
    Ok(Message {
        offset,
        magic,
        compression,
        timestamp_type,
        timestamp,
        key,
        value,
    })
}

/// Decode one complete shallow legacy message into a batch, decompressing a wrapper's
/// value to at most `limit` bytes.
pub(super) fn decode_message(msg: Bytes, limit: usize, check_crc: bool) -> Result<Step> {
    let wrapper = parse_message(msg, check_crc)?;
    let (records, decompressed) = if wrapper.compression == Compression::None {
        let record = Record {
            offset: wrapper.offset,
            timestamp: wrapper.timestamp,
            key: wrapper.key.clone(),
            value: wrapper.value.clone(),
            headers: Vec::new(),
        };
        (vec![record], 0)
    } else {
        match inner_records(&wrapper, limit, check_crc)? {
            Some(r) => r,
            None => {
                return Ok(Step::OverLimit {
                    at: format!("compressed legacy message at offset {}", wrapper.offset),
                    codec: wrapper.compression,
                })
            }
        }
    };
    let (first, last) = match (records.first(), records.last()) {
        (Some(f), Some(l)) => (f, l),
        _ => {
            return Err(Error::protocol(format!(
                "compressed legacy message at offset {} holds no messages",
                wrapper.offset
            )))
        }
    };
    let base_offset = first.offset;
    let last_offset_delta = i32::try_from(last.offset.wrapping_sub(base_offset)).map_err(|_| {
        Error::protocol(format!(
            "legacy message set at offset {} spans too many offsets",
            wrapper.offset
        ))
    })?;
    let base_timestamp = first.timestamp;
    let max_timestamp = records
        .iter()
        .map(|r| r.timestamp)
        .max()
        .unwrap_or(NO_TIMESTAMP);
    let batch = RecordBatch {
        base_offset,
        partition_leader_epoch: -1,
        magic: wrapper.magic,
        compression: wrapper.compression,
        timestamp_type: wrapper.timestamp_type,
        is_transactional: false,
        is_control: false,
        last_offset_delta,
        base_timestamp,
        max_timestamp,
        producer_id: -1,
        producer_epoch: -1,
        base_sequence: -1,
        records,
    };
    Ok(Step::Batch(batch, decompressed))
}

/// Decompress a wrapper's value (to at most `limit` bytes; `None` if it is larger) and
/// decode the inner message set. Also returns the decompressed size.
fn inner_records(
    wrapper: &Message,
    limit: usize,
    check_crc: bool,
) -> Result<Option<(Vec<Record>, usize)>> {
    let at = |e: Error| {
        let msg = format!(
            "compressed legacy message at offset {}: {e}",
            wrapper.offset
        );
        e.with_message(msg)
    };
    let value = wrapper
        .value
        .as_ref()
        .ok_or_else(|| at(Error::protocol("null value")))?;
    let Some(mut inner) = wrapper
        .compression
        .decompress_within(value, limit)
        .map_err(at)?
    else {
        return Ok(None);
    };
    let decompressed = inner.len();
    let mut messages = Vec::new();
    while inner.has_remaining() {
        let size = inner
            .get(8..12)
            .and_then(|s| <[u8; 4]>::try_from(s).ok())
            .map(i32::from_be_bytes)
            .ok_or_else(|| at(Error::protocol("truncated inner message")))?;
        let size = usize::try_from(size)
            .ok()
            .and_then(|s| s.checked_add(12))
            .filter(|s| *s <= inner.remaining())
            .ok_or_else(|| {
                at(Error::protocol(format!(
                    "inner message size {size} invalid"
                )))
            })?;
        let m = parse_message(inner.split_to(size), check_crc).map_err(at)?;
        if m.compression != Compression::None {
            return Err(at(Error::protocol("nested compressed message")));
        }
        messages.push(m);
    }
    // v1 inner offsets are relative to the last one, which sits at the wrapper offset.
    let shift = match (wrapper.magic, messages.last()) {
        (1, Some(last)) => wrapper.offset.wrapping_sub(last.offset),
        _ => 0,
    };
    let log_append = wrapper.timestamp_type == TimestampType::LogAppendTime;
    let records = messages
        .into_iter()
        .map(|m| Record {
            offset: m.offset.wrapping_add(shift),
            timestamp: if log_append {
                wrapper.timestamp
            } else {
                m.timestamp
            },
            key: m.key,
            value: m.value,
            headers: Vec::new(),
        })
        .collect();
    Ok(Some((records, decompressed)))
}
