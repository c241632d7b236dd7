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
//! Compressed blocks are decoded by [`decode_block`], our own block decoder: it accepts
//! and rejects exactly what `lz4_flex`'s does, but repeats short-period matches (runs of
//! one byte above all) at memory speed where `lz4_flex` copies them a byte at a time.
//!
//! Anything else — linked blocks, dictionaries, skippable or legacy frames, several frames,
//! a header or checksum that does not verify, corrupt blocks — returns `None`, and the
//! caller decodes with `lz4_flex`'s streaming decoder, which handles (or reports) them.

use std::sync::Arc;

use bytes::{BufMut, Bytes, BytesMut};
use twox_hash::XxHash32;

use super::{freeze_buf, one_shot_limit, take_buf};
use crate::bufpool::{with_thread_scratch, BufPool};

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
    compress_frame_parts(&[input], out);
}

/// Like [`compress_frame`] for the concatenation of `parts`, byte for byte the same frame:
/// each 64 KiB block of the whole is compressed from the part itself when it lies within
/// one, and gathered into a per-thread 64 KiB buffer when it spans parts (a batch whose
/// large values are kept by reference, see [`crate::record::BatchBytes`]).
pub(super) fn compress_frame_parts(parts: &[&[u8]], out: &mut BytesMut) {
    let (flg, bd) = (FLG_VERSION_01 | FLG_INDEPENDENT_BLOCKS, 4u8 << 4);
    let total: usize = parts.iter().map(|p| p.len()).sum();
    out.reserve(7 + total + total / 128 + 64);
    out.put_u32_le(MAGIC);
    out.put_slice(&[flg, bd, (XxHash32::oneshot(0, &[flg, bd]) >> 8) as u8]);
    let size = |s: &Scratch| s.gathered.capacity() + s.packed.len();
    with_thread_scratch(&SCRATCH, size, |scratch| {
        let Scratch { gathered, packed } = scratch;
        gathered.clear();
        for (i, part) in parts.iter().enumerate() {
            let last = i + 1 == parts.len();
            let mut rest = *part;
            while !rest.is_empty() {
                if gathered.is_empty() && (rest.len() >= BLOCK_64K || last) {
                    let (block, after) = rest.split_at(rest.len().min(BLOCK_64K));
                    put_block(block, packed, out);
                    rest = after;
                    continue;
                }
                let (take, after) = rest.split_at(rest.len().min(BLOCK_64K - gathered.len()));
                gathered.extend_from_slice(take);
                rest = after;
                if gathered.len() == BLOCK_64K {
                    put_block(gathered, packed, out);
                    gathered.clear();
                }
            }
        }
        if !gathered.is_empty() {
            put_block(gathered, packed, out);
            gathered.clear();
        }
    });
    out.put_u32_le(0);
}

/// Per-thread buffers of [`compress_frame_parts`]: a block gathered from several parts, and
/// where a block is compressed to (initialized once, so compressing a block writes no
/// zeros first).
struct Scratch {
    gathered: Vec<u8>,
    packed: Vec<u8>,
}

impl Default for Scratch {
    fn default() -> Self {
        Scratch {
            gathered: Vec::with_capacity(BLOCK_64K),
            packed: vec![0; lz4_flex::block::get_maximum_output_size(BLOCK_64K)],
        }
    }
}

thread_local! {
    static SCRATCH: std::cell::RefCell<Scratch> = std::cell::RefCell::new(Scratch::default());
}

/// Append one block (at most 64 KiB): compressed through `packed`, or stored as it is
/// (the header's top bit says so) when it does not shrink.
fn put_block(block: &[u8], packed: &mut [u8], out: &mut BytesMut) {
    match lz4_flex::block::compress_into(block, packed)
        .ok()
        .filter(|&n| n < block.len())
    {
        Some(n) => {
            out.put_u32_le(n as u32);
            out.put_slice(&packed[..n]);
        }
        None => {
            out.put_u32_le(block.len() as u32 | BLOCK_STORED);
            out.put_slice(block);
        }
    }
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
        4 => BLOCK_64K,
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

/// One data block of a frame, as its header says.
struct Block<'a> {
    /// The block's bytes as stored (compressed, unless `stored`).
    data: &'a [u8],
    /// Stored uncompressed (the header's top bit).
    stored: bool,
    /// The block checksum that follows it, when the frame has them.
    checksum: Option<u32>,
}

/// The block at `*at` (moving `at` past it): `Some(None)` at the end mark, `None` when the
/// block header or data is cut short or the block is larger than the frame's block size.
fn next_block<'a>(input: &'a [u8], at: &mut usize, h: &Header) -> Option<Option<Block<'a>>> {
    let word = le_u32(input, *at)?;
    *at += 4;
    if word == 0 {
        return Some(None);
    }
    let len = (word & !BLOCK_STORED) as usize;
    if len > h.block_max {
        return None;
    }
    let data = input.get(*at..*at + len)?;
    *at += len;
    let checksum = if h.block_checksums {
        let sum = le_u32(input, *at)?;
        *at += 4;
        Some(sum)
    } else {
        None
    };
    Some(Some(Block {
        data,
        stored: word & BLOCK_STORED != 0,
        checksum,
    }))
}

/// Walk the frame's blocks: the most its content can decompress to, or `None` when the
/// blocks do not end exactly at the input's end (truncated, oversized blocks, trailing
/// bytes or a second frame).
fn output_bound(input: &[u8], h: &Header) -> Option<usize> {
    let mut at = h.len;
    let mut bound = 0usize;
    while let Some(block) = next_block(input, &mut at, h)? {
        let most = if block.stored {
            block.data.len()
        } else {
            h.block_max
        };
        bound = bound.checked_add(most)?;
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
    // five bytes may claim a 4 MiB block.
    if cap > one_shot_limit(input.len()) {
        return None;
    }
    let mut out = take_buf(pool, cap);
    out.resize(cap, 0);
    let done = decode_blocks(input, &h, max_len, &mut out);
    let freeze = |out: Vec<u8>| freeze_buf(pool, out);
    match done {
        // Content far less than the block headers allowed (a frame of 4 MiB blocks holding
        // 100 KB, or a 64 KiB block holding a small batch) moves out to a buffer of its
        // size as it is frozen (see `freeze_buf`).
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
    while let Some(b) = next_block(input, &mut at, h)? {
        if b.checksum
            .is_some_and(|sum| XxHash32::oneshot(0, b.data) != sum)
        {
            return None;
        }
        let (block, len) = (b.data, b.data.len());
        let room = out.len() - pos;
        let n = if b.stored {
            if len > room {
                return overflow(pos + len);
            }
            out[pos..pos + len].copy_from_slice(block);
            len
        } else if room >= h.block_max {
            // no more than a block's worth: a block that decodes to more is corrupt
            decode_block(block, &mut out[pos..pos + h.block_max])?
        } else {
            scratch.resize(h.block_max, 0);
            let n = decode_block(block, &mut scratch)?;
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

// ---- blocks ----------------------------------------------------------------------------
//
// An LZ4 block is a run of sequences: a token (literal length in the high nibble, match
// length - 4 in the low one, 15 meaning "more in the next bytes", each 255 meaning "and
// more"), the literals, a 2-byte little-endian offset back into the output, and the match
// length's extra bytes; the last sequence stops after its literals.
//
// Matches whose offset is shorter than their length repeat a period; `lz4_flex` copies
// those a byte or two at a time, which for a run of one byte (offset 1) comes to ~0.5 GB/s.
// Here offset 1 is a `fill`, a short period is built in a register and stored 8 bytes at a
// time, and a long match doubles the period with each copy. Everything else follows
// `lz4_flex`: when 32 bytes of input and 40 of output are left, a sequence whose lengths fit
// its token is copied in fixed-size chunks (16 literal bytes, an 18-byte match) and the
// positions advance by the real lengths; the bytes copied past them are rewritten by what
// comes next. Nearer the ends every length is checked before it is copied.

/// Decode one LZ4 block into `out`: the bytes written, or `None` when the block is malformed
/// (empty, truncated, a match offset of 0 or reaching before the block's first byte, a
/// length running past the input or `out`). Bytes of `out` past the ones written may have
/// been overwritten too.
pub(super) fn decode_block(block: &[u8], out: &mut [u8]) -> Option<usize> {
    if block.is_empty() {
        return None;
    }
    let mut rest = block;
    // Bytes written; never more than `out.len()`.
    let mut op = 0usize;
    loop {
        // Fast path: both lengths fit the token, 32 bytes of input and 40 of output left.
        while let Some(win) = rest.first_chunk::<32>() {
            let token = win[0];
            if token >= 0xF0 || token & 0x0F == 0x0F {
                break;
            }
            let Some(dst) = out.get_mut(op..).and_then(|t| t.first_chunk_mut::<40>()) else {
                break;
            };
            // at most 14 literals; 16 copied (fixed indices into the 32-byte window), the
            // ones past `op + lit` rewritten by the match and what follows
            let lit = usize::from(token >> 4);
            dst[..16].copy_from_slice(&win[1..17]);
            let offset = usize::from(u16::from_le_bytes([win[1 + lit], win[2 + lit]]));
            rest = &rest[3 + lit..]; // 3 + lit < 32
            op += lit;
            // offset 0, or before the block's first byte
            if offset.wrapping_sub(1) >= op {
                return None;
            }
            // at most 18 bytes at `op`, which has at least 40 - 14 = 26 bytes after it
            fast_match(out, op, offset);
            op += usize::from(token & 0x0F) + 4;
        }
        let (&token, tail) = rest.split_first()?;
        rest = tail;
        let mut lit = usize::from(token >> 4);
        if lit == 15 {
            lit += read_length(&mut rest)?;
        }
        if lit > 0 {
            let (src, tail) = rest.split_at_checked(lit)?;
            let dst = out.get_mut(op..)?;
            match (rest.first_chunk::<16>(), dst.first_chunk_mut::<16>()) {
                // a short run with room after it: one fixed-size copy
                (Some(wide), Some(to)) if lit <= 16 => *to = *wide,
                _ => copy_exact(dst.get_mut(..lit)?, src),
            }
            rest = tail;
            op += lit;
        }
        // the last sequence ends after its literals
        let Some((&lo, tail)) = rest.split_first() else {
            break;
        };
        let (&hi, tail) = tail.split_first()?;
        rest = tail;
        let offset = usize::from(u16::from_le_bytes([lo, hi]));
        let mut len = usize::from(token & 0x0F) + 4;
        if len == 19 {
            len += read_length(&mut rest)?;
        }
        if offset == 0 || offset > op || len > out.len() - op {
            return None;
        }
        copy_match(out, op, offset, len);
        op += len;
        // a match is never last
        if rest.is_empty() {
            return None;
        }
    }
    Some(op)
}

/// A length's continuation bytes: their sum, up to and including the first that is not 255
/// (at most 255 per byte of input: no overflow).
fn read_length(rest: &mut &[u8]) -> Option<usize> {
    let mut n = 0usize;
    loop {
        let (&b, tail) = rest.split_first()?;
        *rest = tail;
        n += usize::from(b);
        if b != 255 {
            return Some(n);
        }
    }
}

/// The fast path's match (at most 18 bytes; `1 <= offset <= op`, 24 bytes of `out` free
/// at `op`): 18 bytes at once when they do not overlap, three 8-byte steps when the offset
/// is at least 8 (each reads only bytes already final), a period built in a register below.
#[inline(always)]
fn fast_match(out: &mut [u8], op: usize, offset: usize) {
    let from = op - offset;
    if offset >= 18 {
        out.copy_within(from..from + 18, op);
    } else if offset >= 8 {
        out.copy_within(from..from + 8, op);
        out.copy_within(from + 8..from + 16, op + 8);
        out.copy_within(from + 16..from + 24, op + 16);
    } else {
        repeat_short(out, op, offset);
    }
}

/// `u64` masks of a period's `p` bytes (`p < 8`), multipliers repeating them every `p`
/// bytes, and how far (in bits) the period's phase moves in 8 bytes (`8 % p * 8`).
const PERIOD_MASK: [u64; 8] = [
    0,
    0xff,
    0xffff,
    0xff_ffff,
    0xffff_ffff,
    0xff_ffff_ffff,
    0xffff_ffff_ffff,
    0xff_ffff_ffff_ffff,
];
const PERIOD_REPEAT: [u64; 8] = [
    0,
    0x0101_0101_0101_0101,
    0x0001_0001_0001_0001,
    0x0001_0000_0100_0001,
    0x0000_0001_0000_0001,
    1 << 40 | 1,
    1 << 48 | 1,
    1 << 56 | 1,
];
const PERIOD_SHIFT: [u32; 8] = [0, 0, 0, 16, 0, 24, 16, 8];

/// Write 24 bytes at `op` repeating the `p` bytes before it (`1 <= p < 8`, `p <= op`,
/// `op + 24 <= out.len()`): the period is built in a `u64` and stored 8 bytes at a time,
/// each word the last one shifted to its phase. Nothing when out of bounds.
#[inline]
fn repeat_short(out: &mut [u8], op: usize, p: usize) {
    let (mask, repeat, shift) = (
        PERIOD_MASK[p & 7],
        PERIOD_REPEAT[p & 7],
        PERIOD_SHIFT[p & 7],
    );
    // the period's bytes, and what follows them (masked off)
    let Some(&first) = out
        .get(op.wrapping_sub(p)..)
        .and_then(|s| s.first_chunk::<8>())
    else {
        return;
    };
    let w0 = (u64::from_le_bytes(first) & mask).wrapping_mul(repeat);
    let w1 = ((w0 >> shift) & mask).wrapping_mul(repeat);
    let w2 = ((w1 >> shift) & mask).wrapping_mul(repeat);
    let Some(dst) = out.get_mut(op..).and_then(|s| s.first_chunk_mut::<24>()) else {
        return;
    };
    dst[..8].copy_from_slice(&w0.to_le_bytes());
    dst[8..16].copy_from_slice(&w1.to_le_bytes());
    dst[16..].copy_from_slice(&w2.to_le_bytes());
}

/// Copy the `len`-byte match `offset` bytes back to `op` (`1 <= offset <= op` and
/// `op + len <= out.len()`, checked by the caller).
#[inline]
fn copy_match(out: &mut [u8], op: usize, offset: usize, len: usize) {
    let from = op - offset;
    let room = out.len() - op;
    if offset >= 32 && len <= 32 && room >= 32 {
        move_within::<32>(out, from, op);
    } else if offset >= 64 && len <= 64 && room >= 64 {
        move_within::<64>(out, from, op);
    } else if offset >= len {
        out.copy_within(from..from + len, op);
    } else if offset == 1 {
        let b = out.get(from).copied().unwrap_or_default();
        if let Some(dst) = out.get_mut(op..op + len) {
            dst.fill(b);
        }
    } else {
        // The period repeated: every copy doubles what the next can copy (always a whole
        // number of periods from `from`, so each continues the pattern).
        let end = op + len;
        let mut at = op;
        while at < end {
            let n = (at - from).min(end - at);
            out.copy_within(from..from + n, at);
            at += n;
        }
    }
}

/// Copy `N` bytes within `out` from `from` to `to`, as `memmove` does (a fixed size: plain
/// loads and stores). Nothing when either range is out of bounds.
#[inline(always)]
fn move_within<const N: usize>(out: &mut [u8], from: usize, to: usize) {
    if let Some(&chunk) = out.get(from..).and_then(|s| s.first_chunk::<N>()) {
        if let Some(dst) = out.get_mut(to..).and_then(|s| s.first_chunk_mut::<N>()) {
            *dst = chunk;
        }
    }
}

/// Copy `src` into `dst` (which must be as long; nothing otherwise). Beyond 32 bytes in
/// 32-byte chunks and the last 32: measured faster than glibc's `memmove` (which
/// `copy_from_slice` calls) on the 64 KiB literal runs of incompressible blocks.
#[inline]
fn copy_exact(dst: &mut [u8], src: &[u8]) {
    let n = dst.len();
    if src.len() != n {
        return;
    }
    if n <= 32 {
        dst.copy_from_slice(src);
        return;
    }
    let mut at = 0;
    while let (Some(d), Some(s)) = (dst.get_mut(at..at + 32), src.get(at..at + 32)) {
        d.copy_from_slice(s);
        at += 32;
    }
    dst[n - 32..].copy_from_slice(&src[n - 32..]);
}
