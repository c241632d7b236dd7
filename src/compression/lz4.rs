//! LZ4 frames written and read block by block straight from and into the caller's buffers.
//!
//! [`compress_frame`] writes the frame Kafka's producers write — independent 64 KiB blocks,
//! no checksums — compressing each block of the input directly into the output (a block
//! that does not shrink is stored as it is). `lz4_flex`'s streaming frame encoder would
//! first copy the input into its own block buffer and the output out of another.
//!
//! Kafka's producers (the Java client, librdkafka, franz-go and kafkapipe) write a batch's
//! records as one LZ4 frame of independent blocks. Such a frame says everything needed to
//! size its output before decoding: each block is at most the frame's block size, and a
//! stored (uncompressed) block holds exactly its length. [`decompress_sized`] walks the
//! block headers, takes one buffer of that bound (from the pool when there is one), and
//! decodes every block into place: no streaming decoder copying through its own block
//! buffer, and no output buffer regrown (and its pages faulted in again) by doubling.
//!
//! Anything else — linked blocks, dictionaries, skippable or legacy frames, several frames,
//! a header or checksum that does not verify, corrupt blocks — returns `None`, and the
//! caller decodes with `lz4_flex`'s streaming decoder, which handles (or reports) them.

use std::sync::Arc;

use bytes::{BufMut, Bytes, BytesMut};
use twox_hash::XxHash32;

use crate::bufpool::BufPool;

/// The frame magic number (little endian on the wire).
const MAGIC: u32 = 0x184D_2204;
/// FLG: version bits, which must read `01`.
const FLG_VERSION_MASK: u8 = 0b1100_0000;
const FLG_VERSION_01: u8 = 0b0100_0000;
const FLG_INDEPENDENT_BLOCKS: u8 = 0b0010_0000;
const FLG_BLOCK_CHECKSUMS: u8 = 0b0001_0000;
const FLG_CONTENT_SIZE: u8 = 0b0000_1000;
const FLG_CONTENT_CHECKSUM: u8 = 0b0000_0100;
const FLG_RESERVED: u8 = 0b0000_0010;
const FLG_DICTIONARY_ID: u8 = 0b0000_0001;
/// BD: every bit but the block-size code is reserved.
const BD_RESERVED: u8 = 0b1000_1111;
/// A block header's top bit: the block is stored uncompressed.
const BLOCK_STORED: u32 = 0x8000_0000;

/// The block size [`compress_frame`] writes (BD code 4), as Kafka's Java client and
/// librdkafka do.
const BLOCK_64K: usize = 64 << 10;

/// Append `input` to `out` as one LZ4 frame of independent 64 KiB blocks without
/// checksums: FLG version 01 with independent blocks, BD 64 KiB, then the blocks and the
/// end mark.
pub(super) fn compress_frame(input: &[u8], out: &mut BytesMut) {
    let (flg, bd) = (FLG_VERSION_01 | FLG_INDEPENDENT_BLOCKS, 4u8 << 4);
    out.reserve(7 + input.len() + input.len() / 128 + 64);
    out.put_u32_le(MAGIC);
    out.put_slice(&[flg, bd, (XxHash32::oneshot(0, &[flg, bd]) >> 8) as u8]);
    for block in input.chunks(BLOCK_64K) {
        let at = out.len();
        out.resize(
            at + 4 + lz4_flex::block::get_maximum_output_size(block.len()),
            0,
        );
        let packed = lz4_flex::block::compress_into(block, &mut out[at + 4..])
            .ok()
            .filter(|&n| n < block.len());
        // A block that does not shrink is stored as it is (the header's top bit says so).
        let word = match packed {
            Some(n) => {
                out.truncate(at + 4 + n);
                n as u32
            }
            None => {
                out.truncate(at + 4);
                out.put_slice(block);
                block.len() as u32 | BLOCK_STORED
            }
        };
        out[at..at + 4].copy_from_slice(&word.to_le_bytes());
    }
    out.put_u32_le(0);
}

/// What the frame header says, for the fast path.
struct Header {
    /// Bytes of the header (magic to header checksum).
    len: usize,
    /// The most a block decompresses to.
    block_max: usize,
    block_checksums: bool,
    content_checksum: bool,
    /// The content size the frame declares, if it does.
    content_size: Option<u64>,
}

/// Parse a frame header the fast path handles: version 01, independent blocks, no
/// dictionary, a header checksum that verifies.
fn header(input: &[u8]) -> Option<Header> {
    let magic = u32::from_le_bytes(input.get(..4)?.try_into().ok()?);
    let (&flg, &bd) = (input.get(4)?, input.get(5)?);
    if magic != MAGIC
        || flg & FLG_VERSION_MASK != FLG_VERSION_01
        || flg & (FLG_RESERVED | FLG_DICTIONARY_ID) != 0
        || flg & FLG_INDEPENDENT_BLOCKS == 0
        || bd & BD_RESERVED != 0
    {
        return None;
    }
    let block_max = match bd >> 4 {
        4 => 64 << 10,
        5 => 256 << 10,
        6 => 1 << 20,
        7 => 4 << 20,
        _ => return None,
    };
    let descriptor_end = if flg & FLG_CONTENT_SIZE != 0 { 14 } else { 6 };
    let checksum = *input.get(descriptor_end)?;
    // The header checksum is the second byte of the descriptor's xxHash32 (FLG to the
    // byte before the checksum).
    if (XxHash32::oneshot(0, &input[4..descriptor_end]) >> 8) as u8 != checksum {
        return None;
    }
    let content_size = (descriptor_end == 14)
        .then(|| Some(u64::from_le_bytes(input.get(6..14)?.try_into().ok()?)))
        .flatten();
    Some(Header {
        len: descriptor_end + 1,
        block_max,
        block_checksums: flg & FLG_BLOCK_CHECKSUMS != 0,
        content_checksum: flg & FLG_CONTENT_CHECKSUM != 0,
        content_size,
    })
}

fn le_u32(input: &[u8], at: usize) -> Option<u32> {
    let end = at.checked_add(4)?;
    Some(u32::from_le_bytes(input.get(at..end)?.try_into().ok()?))
}

/// Walk the frame's blocks: the most its content can decompress to, or `None` when the
/// blocks do not end exactly at the input's end (truncated, oversized blocks, trailing
/// bytes or a second frame).
fn output_bound(input: &[u8], h: &Header) -> Option<usize> {
    let checksum_len = if h.block_checksums { 4 } else { 0 };
    let mut at = h.len;
    let mut bound = 0usize;
    loop {
        let word = le_u32(input, at)?;
        at += 4;
        if word == 0 {
            break;
        }
        let len = (word & !BLOCK_STORED) as usize;
        if len > h.block_max {
            return None;
        }
        bound = bound.checked_add(if word & BLOCK_STORED != 0 {
            len
        } else {
            h.block_max
        })?;
        at = at.checked_add(len + checksum_len)?;
    }
    if h.content_checksum {
        at = at.checked_add(4)?;
    }
    (at == input.len()).then_some(bound)
}

/// Decode an LZ4 frame of independent blocks into one buffer sized from its block headers
/// (a pooled one when `pool` is given). `Some(Ok(None))` when the content is larger than
/// `max_len`; `None` when the frame is not one the fast path handles, or does not decode
/// or verify here: the caller then streams it (which reports what is wrong).
pub(super) fn decompress_sized(
    input: &[u8],
    max_len: usize,
    pool: Option<&Arc<BufPool>>,
) -> Option<crate::Result<Option<Bytes>>> {
    let h = header(input)?;
    let mut bound = output_bound(input, &h)?;
    if let Some(declared) = h.content_size {
        // a frame holds exactly what it declares (checked as it decodes)
        bound = bound.min(usize::try_from(declared).unwrap_or(usize::MAX));
    }
    let cap = bound.min(max_len);
    // Block headers are not trusted for an allocation the payload cannot plausibly fill:
    // five bytes may claim a 4 MiB block. LZ4 expands at most about 255 times; beyond
    // that the frame streams, and its output grows only as data is really decoded.
    if cap > input.len().saturating_mul(256).max(1 << 20) {
        return None;
    }
    let mut out = match pool {
        Some(p) => p.take(cap),
        None => Vec::with_capacity(cap),
    };
    out.resize(cap, 0);
    let done = decode_blocks(input, &h, max_len, &mut out);
    let freeze = |out: Vec<u8>| match pool {
        Some(p) => p.freeze(out),
        None => Bytes::from(out),
    };
    match done {
        Some(Fit::Within(n)) => {
            out.truncate(n);
            Some(Ok(Some(freeze(out))))
        }
        Some(Fit::OverLimit) => {
            drop(freeze(out));
            Some(Ok(None))
        }
        None => {
            drop(freeze(out));
            None
        }
    }
}

enum Fit {
    /// The content is this many bytes, at the start of the output.
    Within(usize),
    /// The content is larger than the limit.
    OverLimit,
}

/// Decode the frame's blocks (already walked by [`output_bound`]) into `out`, verifying
/// the block and content checksums and the declared content size the frame carries. A
/// compressed block goes straight into `out` when a whole block fits in what is left, else
/// through a scratch block (only near a limit: `max_len` or the declared size).
fn decode_blocks(input: &[u8], h: &Header, max_len: usize, out: &mut [u8]) -> Option<Fit> {
    let mut at = h.len;
    let mut pos = 0usize;
    let mut scratch = Vec::new();
    // Content that does not fit in `out` is over the limit if it passes `max_len`, and
    // otherwise longer than the frame declares (corrupt: streamed for the error report).
    let overflow = |end: usize| (end > max_len).then_some(Fit::OverLimit);
    loop {
        let word = le_u32(input, at)?;
        at += 4;
        if word == 0 {
            break;
        }
        let len = (word & !BLOCK_STORED) as usize;
        let block = input.get(at..at + len)?;
        at += len;
        if h.block_checksums {
            if XxHash32::oneshot(0, block) != le_u32(input, at)? {
                return None;
            }
            at += 4;
        }
        let room = out.len() - pos;
        let n = if word & BLOCK_STORED != 0 {
            if len > room {
                return overflow(pos + len);
            }
            out[pos..pos + len].copy_from_slice(block);
            len
        } else if room >= h.block_max {
            lz4_flex::block::decompress_into(block, &mut out[pos..]).ok()?
        } else {
            scratch.resize(h.block_max, 0);
            let n = lz4_flex::block::decompress_into(block, &mut scratch).ok()?;
            if n > room {
                return overflow(pos + n);
            }
            out[pos..pos + n].copy_from_slice(&scratch[..n]);
            n
        };
        pos += n;
    }
    if h.content_size
        .is_some_and(|declared| declared != pos as u64)
    {
        return None;
    }
    if h.content_checksum && XxHash32::oneshot(0, &out[..pos]) != le_u32(input, at)? {
        return None;
    }
    Some(Fit::Within(pos))
}
