//! Record batches: RecordBatch v2 encode and decode, legacy MessageSet v0/v1 decode.
//!
//! Owns the record types ([`Record`], [`Header`], [`RecordBatch`], [`ControlRecord`]),
//! the producer-side [`RecordBatchBuilder`] and the consumer-side [`decode_batches`],
//! which reads the raw `records` bytes of a fetch response.
//!
//! References: the "Record Batch" section of the Kafka documentation
//! (<https://kafka.apache.org/documentation/#recordbatch>), KIP-98 (v2 format,
//! transactions and control records), KIP-32/KIP-31 (v1 timestamps and relative inner
//! offsets), and Apache Kafka's `DefaultRecordBatch`, `DefaultRecord` and
//! `LegacyRecord`.
//!
//! Decoding is zero-copy: keys, values and header values are [`Bytes`] slices of the
//! fetched buffer (or of the decompressed payload). Every count and length is checked
//! against the bytes actually left before anything is allocated, decompression is
//! bounded, and malformed input is an [`crate::Error`] of kind `Protocol` (or
//! `Compression`), never a panic.

use bytes::Bytes;

use crate::compression::Compression;
use crate::error::{Error, Result};

pub(crate) mod crc32;
mod decode;
mod encode;
mod legacy;

pub use crate::protocol::batch_bytes::BatchBytes;
pub(crate) use crate::protocol::batch_bytes::{crc32c_of, parts_from};
#[cfg(test)]
pub(crate) use decode::DEFER_MAX;
pub use decode::{decode_batches, decode_batches_within, DecodedBatches, MAX_BATCH_DECOMPRESSED};
pub(crate) use decode::{
    decode_batches_lazy, decode_batches_pooled, Decompression, EncodedRecords, LazyBatch,
};
pub use encode::RecordBatchBuilder;
#[cfg(test)]
pub(crate) use encode::VALUE_SPLICE_MIN;

/// The magic byte of RecordBatch v2.
pub const MAGIC_V2: i8 = 2;

/// Size of the RecordBatch v2 header, up to and including the record count.
pub const BATCH_HEADER_LEN: usize = 61;

/// "No producer id", "no epoch", "no sequence", "no partition leader epoch".
pub const NO_PRODUCER_ID: i64 = -1;

/// The timestamp of records that have none (legacy v0 messages).
pub const NO_TIMESTAMP: i64 = -1;

/// A record header.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Header {
    /// The header key (never null on the wire).
    pub key: String,
    /// The header value; `None` is a null value.
    pub value: Option<Bytes>,
}

impl Header {
    /// A header with a value.
    pub fn new(key: impl Into<String>, value: impl Into<Bytes>) -> Self {
        Header {
            key: key.into(),
            value: Some(value.into()),
        }
    }
}

/// One decoded record, with its absolute offset and timestamp.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Record {
    /// The record's offset in its partition.
    pub offset: i64,
    /// Milliseconds since the epoch (for `LogAppendTime` batches, the broker's append
    /// time; `-1` for legacy v0 messages).
    pub timestamp: i64,
    /// The key; `None` is a null key.
    pub key: Option<Bytes>,
    /// The value; `None` is a null value (a tombstone on compacted topics).
    pub value: Option<Bytes>,
    /// The headers (always empty for legacy messages).
    pub headers: Vec<Header>,
}

impl Record {
    /// A record to produce with this key and value, no headers, and timestamp `-1`
    /// (the producer stamps the current time).
    ///
    /// ```
    /// use kafkapipe::record::Record;
    /// let r = Record::new("user-1", "clicked");
    /// assert_eq!(r.key.as_deref(), Some(&b"user-1"[..]));
    /// assert_eq!(r.timestamp, -1);
    /// ```
    pub fn new(key: impl Into<Bytes>, value: impl Into<Bytes>) -> Self {
        Record {
            offset: 0,
            timestamp: NO_TIMESTAMP,
            key: Some(key.into()),
            value: Some(value.into()),
            headers: Vec::new(),
        }
    }

    /// Add a header.
    pub fn with_header(mut self, key: impl Into<String>, value: impl Into<Bytes>) -> Self {
        self.headers.push(Header::new(key, value));
        self
    }
}

/// What a batch's timestamps mean.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum TimestampType {
    /// Set by the producer.
    #[default]
    CreateTime,
    /// Set by the broker when it appended the batch.
    LogAppendTime,
}

/// A decoded record batch (or, for magic 0/1, one legacy shallow message, which may be a
/// compressed wrapper holding many records).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordBatch {
    /// The offset of the first record (legacy: of the first inner record).
    pub base_offset: i64,
    /// The partition leader epoch (`-1` if unknown, and for legacy messages).
    pub partition_leader_epoch: i32,
    /// The format: 2 for RecordBatch v2, 0 or 1 for a legacy message.
    pub magic: i8,
    /// The codec the batch was compressed with.
    pub compression: Compression,
    /// What the timestamps mean.
    pub timestamp_type: TimestampType,
    /// Whether the batch is part of a transaction.
    pub is_transactional: bool,
    /// Whether the batch holds control records (transaction markers).
    pub is_control: bool,
    /// Offset of the last record relative to `base_offset`. After compaction it may be
    /// larger than `records.len() - 1`.
    pub last_offset_delta: i32,
    /// The timestamp of the first record.
    pub base_timestamp: i64,
    /// The largest timestamp in the batch.
    pub max_timestamp: i64,
    /// The idempotent/transactional producer id, or `-1`.
    pub producer_id: i64,
    /// The producer epoch, or `-1`.
    pub producer_epoch: i16,
    /// The sequence number of the first record, or `-1`.
    pub base_sequence: i32,
    /// The records.
    pub records: Vec<Record>,
}

impl AsRef<RecordBatch> for RecordBatch {
    fn as_ref(&self) -> &RecordBatch {
        self
    }
}

impl RecordBatch {
    /// The offset after this batch's last offset: where the next fetch starts.
    pub fn next_offset(&self) -> i64 {
        self.base_offset
            .saturating_add(i64::from(self.last_offset_delta))
            .saturating_add(1)
    }

    /// For a control batch, the marker its first record carries; `None` for data
    /// batches (and for control batches with no records left after compaction).
    pub fn control_record(&self) -> Result<Option<ControlRecord>> {
        if !self.is_control {
            return Ok(None);
        }
        match self.records.first() {
            None => Ok(None),
            Some(r) => {
                let key = r
                    .key
                    .as_ref()
                    .ok_or_else(|| Error::protocol("control record with a null key"))?;
                ControlRecord::parse(key).map(Some)
            }
        }
    }
}

/// The marker a control record carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ControlRecord {
    /// The transaction was aborted (type 0).
    Abort,
    /// The transaction was committed (type 1).
    Commit,
    /// Another control type (KRaft uses 2 and up for its own markers).
    Unknown(i16),
}

impl ControlRecord {
    /// Parse a control record's key: `i16` version, `i16` type.
    ///
    /// ```
    /// use kafkapipe::record::ControlRecord;
    /// assert_eq!(ControlRecord::parse(&[0, 0, 0, 1]).unwrap(), ControlRecord::Commit);
    /// assert!(ControlRecord::parse(&[0, 0]).is_err());
    /// ```
    pub fn parse(key: &[u8]) -> Result<Self> {
        match key {
            [v0, v1, t0, t1, ..] => {
                let version = i16::from_be_bytes([*v0, *v1]);
                if version < 0 {
                    return Err(Error::protocol(format!(
                        "negative control record version {version}"
                    )));
                }
                Ok(match i16::from_be_bytes([*t0, *t1]) {
                    0 => ControlRecord::Abort,
                    1 => ControlRecord::Commit,
                    other => ControlRecord::Unknown(other),
                })
            }
            _ => Err(Error::protocol(format!(
                "control record key of {} bytes, need 4",
                key.len()
            ))),
        }
    }

    /// The control record key (version 0) for this marker.
    pub fn key(self) -> [u8; 4] {
        let t: i16 = match self {
            ControlRecord::Abort => 0,
            ControlRecord::Commit => 1,
            ControlRecord::Unknown(t) => t,
        };
        let [a, b] = t.to_be_bytes();
        [0, 0, a, b]
    }
}

// The tests decode fixtures of every codec.
#[cfg(all(
    test,
    feature = "gzip",
    feature = "snappy",
    feature = "lz4",
    feature = "zstd"
))]
mod tests;
