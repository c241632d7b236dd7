//! Snappy with xerial framing (what the Java client writes) plus raw snappy reading.
//!
//! Reference: xerial `snappy-java` `SnappyOutputStream` / `SnappyCodec` (header:
//! magic `\x82SNAPPY\0`, `i32` version, `i32` minimum compatible version, both
//! big-endian; then blocks of `[i32 compressed length][raw snappy block]`).

use bytes::{BufMut, Bytes, BytesMut};

use super::{codec_error, Compression};
use crate::error::{Error, Result};

/// The xerial stream magic.
pub(crate) const XERIAL_MAGIC: [u8; 8] = [0x82, b'S', b'N', b'A', b'P', b'P', b'Y', 0];
/// The xerial header: magic, version, compatible version.
const XERIAL_HEADER_LEN: usize = 16;
/// How much input each xerial block compresses (snappy-java's default block size).
const XERIAL_BLOCK: usize = 32 * 1024;

/// Compress `input` as a xerial-framed snappy stream appended to `out`.
pub(crate) fn compress_xerial(input: &[u8], out: &mut BytesMut) -> Result<()> {
    let blocks = input.len().div_ceil(XERIAL_BLOCK);
    out.reserve(
        XERIAL_HEADER_LEN
            + blocks * 4
            + snap::raw::max_compress_len(XERIAL_BLOCK.min(input.len())) * blocks.max(1),
    );
    out.put_slice(&XERIAL_MAGIC);
    out.put_i32(1);
    out.put_i32(1);
    let mut enc = snap::raw::Encoder::new();
    for chunk in input.chunks(XERIAL_BLOCK) {
        let max = snap::raw::max_compress_len(chunk.len());
        let len_at = out.len();
        out.put_i32(0);
        let start = out.len();
        out.resize(start + max, 0);
        let dst = out
            .get_mut(start..)
            .ok_or_else(|| Error::compression("snappy output buffer"))?;
        let n = enc
            .compress(chunk, dst)
            .map_err(|e| codec_error(Compression::Snappy, "compression", e))?;
        out.truncate(start + n);
        let n = i32::try_from(n).map_err(|_| Error::encode("snappy block too large"))?;
        if let Some(len) = out.get_mut(len_at..start) {
            len.copy_from_slice(&n.to_be_bytes());
        }
    }
    Ok(())
}

/// Decompress xerial-framed or raw snappy, producing at most `max_len` bytes (`None` if
/// the output would be longer).
pub(crate) fn decompress(input: &[u8], max_len: usize) -> Result<Option<Bytes>> {
    match input.strip_prefix(&XERIAL_MAGIC[..]) {
        Some(rest) => decompress_xerial(rest, max_len),
        None => decompress_raw(input, max_len),
    }
}

fn decompress_raw(input: &[u8], max_len: usize) -> Result<Option<Bytes>> {
    let len = snap::raw::decompress_len(input)
        .map_err(|e| codec_error(Compression::Snappy, "decompression", e))?;
    if len > max_len {
        return Ok(None);
    }
    let out = snap::raw::Decoder::new()
        .decompress_vec(input)
        .map_err(|e| codec_error(Compression::Snappy, "decompression", e))?;
    Ok(Some(Bytes::from(out)))
}

fn read_be_i32(input: &[u8]) -> Option<(i32, &[u8])> {
    let (head, rest) = input.split_first_chunk::<4>()?;
    Some((i32::from_be_bytes(*head), rest))
}

/// `rest` is what follows the magic: version, compatible version, blocks.
fn decompress_xerial(rest: &[u8], max_len: usize) -> Result<Option<Bytes>> {
    let truncated = || Error::compression("truncated xerial snappy header");
    let (_version, rest) = read_be_i32(rest).ok_or_else(truncated)?;
    let (_compatible, mut rest) = read_be_i32(rest).ok_or_else(truncated)?;
    let mut out: Vec<u8> = Vec::new();
    let mut dec = snap::raw::Decoder::new();
    while !rest.is_empty() {
        let (len, after) = read_be_i32(rest)
            .ok_or_else(|| Error::compression("truncated xerial snappy block length"))?;
        let len = usize::try_from(len).map_err(|_| {
            Error::compression(format!("negative xerial snappy block length {len}"))
        })?;
        if len > after.len() {
            return Err(Error::compression(format!(
                "xerial snappy block of {len} bytes exceeds the {} bytes left",
                after.len()
            )));
        }
        let (block, after) = after.split_at(len);
        rest = after;
        let n = snap::raw::decompress_len(block)
            .map_err(|e| codec_error(Compression::Snappy, "decompression", e))?;
        let start = out.len();
        if n > max_len.saturating_sub(start) {
            return Ok(None);
        }
        out.resize(start + n, 0);
        let dst = out
            .get_mut(start..)
            .ok_or_else(|| Error::compression("snappy output buffer"))?;
        dec.decompress(block, dst)
            .map_err(|e| codec_error(Compression::Snappy, "decompression", e))?;
    }
    Ok(Some(Bytes::from(out)))
}
