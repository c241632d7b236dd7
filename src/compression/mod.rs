//! Compression codecs for record batches: gzip, snappy, lz4 and zstd.
//!
//! Owns the [`Compression`] enum (the codec id stored in the low three bits of a batch's
//! attributes) and the bounded [`Compression::compress`] / [`Compression::decompress`]
//! functions used by [`crate::record`].
//!
//! Each codec sits behind a cargo feature (`gzip` → `flate2`, `snappy` → `snap`,
//! `lz4` → `lz4_flex`, `zstd` → `zstd`); a codec that is compiled out fails with an
//! [`ErrorKind::Compression`](crate::ErrorKind::Compression) error naming the feature.
//!
//! Wire formats, as the Java client writes them (references: Apache Kafka
//! `org.apache.kafka.common.compress.*`, KIP-57 for LZ4, KIP-110 for zstd, and
//! xerial `snappy-java`'s `SnappyOutputStream`):
//!
//! - **gzip**: an RFC 1952 gzip stream (multi-member streams are read).
//! - **snappy**: xerial framing — magic `\x82SNAPPY\0`, `i32` version 1, `i32`
//!   compatible version 1, then blocks of `[i32 length][raw snappy block]`, each
//!   compressing at most 32 KiB of input. Reading also accepts a bare raw snappy block,
//!   which some non-Java producers write.
//! - **lz4**: the standard LZ4 frame format (independent blocks, 64 KiB).
//! - **zstd**: a standard zstd frame.
//!
//! Decompression is bounded: output larger than `max_len` is an error, detected while
//! streaming (or from the declared size, for raw snappy) so that a small hostile
//! payload cannot make us allocate gigabytes. Corrupt or truncated input is an error,
//! never a panic.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};

use crate::bufpool::BufPool;
use crate::error::{Error, Result};

#[cfg(feature = "lz4")]
mod lz4;
#[cfg(feature = "snappy")]
mod snappy;

/// A record batch compression codec.
///
/// ```
/// use kafkapipe::compression::Compression;
/// assert_eq!(Compression::from_attributes(0x0a).unwrap(), Compression::Snappy);
/// assert_eq!(Compression::Zstd.code(), 4);
/// assert_eq!("lz4".parse::<Compression>().unwrap(), Compression::Lz4);
/// assert_eq!(Compression::default(), Compression::None);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Compression {
    /// No compression (code 0).
    #[default]
    None,
    /// gzip (code 1).
    Gzip,
    /// snappy, xerial-framed (code 2).
    Snappy,
    /// LZ4 frame format (code 3).
    Lz4,
    /// zstd (code 4; record batch v2 only).
    Zstd,
}

impl Compression {
    /// Every codec, in code order.
    pub const ALL: [Compression; 5] = [
        Compression::None,
        Compression::Gzip,
        Compression::Snappy,
        Compression::Lz4,
        Compression::Zstd,
    ];

    /// The codec named by the low three bits of batch (or legacy message) attributes.
    pub fn from_attributes(attributes: i16) -> Result<Self> {
        Self::from_code(attributes & 0x07)
    }

    /// The codec with attribute code `code` (0..=4).
    pub fn from_code(code: i16) -> Result<Self> {
        match code {
            0 => Ok(Compression::None),
            1 => Ok(Compression::Gzip),
            2 => Ok(Compression::Snappy),
            3 => Ok(Compression::Lz4),
            4 => Ok(Compression::Zstd),
            other => Err(Error::protocol(format!(
                "unknown compression codec {other} in attributes"
            ))),
        }
    }

    /// The attribute code (0..=4).
    pub fn code(self) -> i16 {
        match self {
            Compression::None => 0,
            Compression::Gzip => 1,
            Compression::Snappy => 2,
            Compression::Lz4 => 3,
            Compression::Zstd => 4,
        }
    }

    /// The codec's name as used in Kafka configuration (`none`, `gzip`, …).
    pub fn name(self) -> &'static str {
        match self {
            Compression::None => "none",
            Compression::Gzip => "gzip",
            Compression::Snappy => "snappy",
            Compression::Lz4 => "lz4",
            Compression::Zstd => "zstd",
        }
    }

    /// Whether this codec is compiled into this build.
    pub fn is_available(self) -> bool {
        match self {
            Compression::None => true,
            Compression::Gzip => cfg!(feature = "gzip"),
            Compression::Snappy => cfg!(feature = "snappy"),
            Compression::Lz4 => cfg!(feature = "lz4"),
            Compression::Zstd => cfg!(feature = "zstd"),
        }
    }

    /// Compress `input`, appending the compressed bytes to `out`.
    pub fn compress(&self, input: &[u8], out: &mut BytesMut) -> Result<()> {
        match self {
            Compression::None => {
                out.extend_from_slice(input);
                Ok(())
            }
            Compression::Gzip => gzip_compress(input, out),
            Compression::Snappy => snappy_compress(input, out),
            Compression::Lz4 => lz4_compress(input, out),
            Compression::Zstd => zstd_compress(input, out),
        }
    }

    /// Like [`compress`](Self::compress) for the concatenation of `parts`, with the same
    /// output: LZ4 compresses from the parts themselves; the other codecs compress one
    /// contiguous copy, gathered in a per-thread buffer.
    pub(crate) fn compress_parts(&self, parts: &[&[u8]], out: &mut BytesMut) -> Result<()> {
        match (self, parts) {
            (_, []) => self.compress(&[], out),
            (_, [whole]) => self.compress(whole, out),
            (Compression::None, _) => {
                parts.iter().for_each(|p| out.extend_from_slice(p));
                Ok(())
            }
            #[cfg(feature = "lz4")]
            (Compression::Lz4, _) => {
                lz4::compress_frame_parts(parts, out);
                Ok(())
            }
            _ => with_gathered(parts, |whole| self.compress(whole, out)),
        }
    }

    /// Decompress `input`; output longer than `max_len` bytes is an error.
    pub fn decompress(&self, input: &[u8], max_len: usize) -> Result<Bytes> {
        self.decompress_within(input, max_len)?
            .ok_or_else(|| too_large(*self, max_len))
    }

    /// Decompress `input` into at most `max_len` bytes: `Ok(None)` when the output would
    /// be longer (decompression stops as soon as that is known, so at most about
    /// `max_len` bytes are ever produced), an error when `input` is corrupt.
    pub(crate) fn decompress_within(&self, input: &[u8], max_len: usize) -> Result<Option<Bytes>> {
        self.decompress_pooled(input, max_len, None)
    }

    /// [`decompress_within`](Self::decompress_within), with the output in a buffer of
    /// `pool` (when given) that returns there once the last slice of it is dropped (gzip,
    /// lz4 and zstd; snappy allocates its own).
    pub(crate) fn decompress_pooled(
        &self,
        input: &[u8],
        max_len: usize,
        pool: Option<&Arc<BufPool>>,
    ) -> Result<Option<Bytes>> {
        match self {
            Compression::None => {
                Ok((input.len() <= max_len).then(|| Bytes::copy_from_slice(input)))
            }
            Compression::Gzip => gzip_decompress(input, max_len, pool),
            Compression::Snappy => snappy_decompress(input, max_len),
            Compression::Lz4 => lz4_decompress(input, max_len, pool),
            Compression::Zstd => zstd_decompress(input, max_len, pool),
        }
    }
}

impl fmt::Display for Compression {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Compression {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        Compression::ALL
            .into_iter()
            .find(|c| c.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| Error::config(format!("unknown compression codec {s:?}")))
    }
}

fn too_large(codec: Compression, max_len: usize) -> Error {
    Error::compression(format!(
        "{codec} payload decompresses to more than the {max_len}-byte limit"
    ))
}

#[allow(dead_code)] // unused when every codec is compiled out
fn codec_error(codec: Compression, op: &str, err: impl fmt::Display) -> Error {
    Error::compression(format!("{codec} {op} failed: {err}"))
}

#[allow(dead_code)]
fn not_compiled(codec: Compression) -> Error {
    Error::compression(format!(
        "{codec} support is not compiled in (enable the `{codec}` cargo feature)"
    ))
}

/// An empty buffer with room for `len` bytes: from `pool` when there is one.
#[allow(dead_code)] // unused when every codec is compiled out
fn take_buf(pool: Option<&Arc<BufPool>>, len: usize) -> Vec<u8> {
    match pool {
        Some(p) => p.take(len),
        None => Vec::with_capacity(len),
    }
}

/// `buf` as [`Bytes`], going back to `pool` (when there is one) once its last slice is
/// dropped.
#[allow(dead_code)]
fn freeze_buf(pool: Option<&Arc<BufPool>>, mut buf: Vec<u8>) -> Bytes {
    match pool {
        Some(p) => p.freeze(buf),
        None => {
            if crate::bufpool::oversized(buf.len(), buf.capacity()) {
                buf.shrink_to_fit();
            }
            Bytes::from(buf)
        }
    }
}

/// The largest output a one-shot decoder allocates up front, from what a header declares
/// (a zstd frame's content size, an LZ4 frame's block headers), for a payload of
/// `compressed_len` bytes: 1 MiB, or 256 times the payload. Kafka batches compress far
/// less than that (LZ4 cannot expand more than about 255 times); a payload claiming more
/// streams, its output growing only as data is really decompressed.
#[allow(dead_code)]
fn one_shot_limit(compressed_len: usize) -> usize {
    compressed_len.saturating_mul(256).max(1 << 20)
}

/// Read all of `reader` into a buffer, stopping with `None` once more than `max_len`
/// bytes come out. `hint` sizes the first allocation (capped by `max_len`).
#[allow(dead_code)]
fn read_bounded(
    reader: impl std::io::Read,
    codec: Compression,
    max_len: usize,
    hint: usize,
    pool: Option<&Arc<BufPool>>,
) -> Result<Option<Bytes>> {
    use std::io::Read;
    let first = hint.min(max_len);
    let mut out = take_buf(pool, first);
    let limit = u64::try_from(max_len).unwrap_or(u64::MAX).saturating_add(1);
    let read = reader.take(limit).read_to_end(&mut out);
    let freeze = |out: Vec<u8>| freeze_buf(pool, out);
    if let Err(e) = read {
        drop(freeze(out));
        return Err(codec_error(codec, "decompression", e));
    }
    if out.len() > max_len {
        drop(freeze(out));
        return Ok(None);
    }
    Ok(Some(freeze(out)))
}

// ---- gzip ------------------------------------------------------------------------------

#[cfg(feature = "gzip")]
fn gzip_compress(input: &[u8], out: &mut BytesMut) -> Result<()> {
    use bytes::BufMut;
    use std::io::Write;
    let mut enc = flate2::write::GzEncoder::new(out.writer(), flate2::Compression::default());
    enc.write_all(input)
        .and_then(|_| enc.finish())
        .map(drop)
        .map_err(|e| codec_error(Compression::Gzip, "compression", e))
}

#[cfg(feature = "gzip")]
fn gzip_decompress(
    input: &[u8],
    max_len: usize,
    pool: Option<&Arc<BufPool>>,
) -> Result<Option<Bytes>> {
    let dec = flate2::read::MultiGzDecoder::new(input);
    read_bounded(
        dec,
        Compression::Gzip,
        max_len,
        input.len().saturating_mul(4),
        pool,
    )
}

#[cfg(not(feature = "gzip"))]
fn gzip_compress(_input: &[u8], _out: &mut BytesMut) -> Result<()> {
    Err(not_compiled(Compression::Gzip))
}

#[cfg(not(feature = "gzip"))]
fn gzip_decompress(
    _input: &[u8],
    _max_len: usize,
    _pool: Option<&Arc<BufPool>>,
) -> Result<Option<Bytes>> {
    Err(not_compiled(Compression::Gzip))
}

thread_local! {
    /// Where [`with_gathered`] joins parts, kept per thread (up to
    /// [`KEPT_SCRATCH`](crate::bufpool::KEPT_SCRATCH)).
    static GATHERED: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Run `f` on the concatenation of `parts`, joined in this thread's buffer (a new one when
/// it is in use further up the stack).
fn with_gathered<R>(parts: &[&[u8]], f: impl FnOnce(&[u8]) -> R) -> R {
    crate::bufpool::with_thread_scratch(&GATHERED, Vec::capacity, |buf| {
        buf.clear();
        parts.iter().for_each(|p| buf.extend_from_slice(p));
        f(buf)
    })
}

// ---- snappy ----------------------------------------------------------------------------

#[cfg(feature = "snappy")]
fn snappy_compress(input: &[u8], out: &mut BytesMut) -> Result<()> {
    snappy::compress_xerial(input, out)
}

#[cfg(feature = "snappy")]
fn snappy_decompress(input: &[u8], max_len: usize) -> Result<Option<Bytes>> {
    snappy::decompress(input, max_len)
}

#[cfg(not(feature = "snappy"))]
fn snappy_compress(_input: &[u8], _out: &mut BytesMut) -> Result<()> {
    Err(not_compiled(Compression::Snappy))
}

#[cfg(not(feature = "snappy"))]
fn snappy_decompress(_input: &[u8], _max_len: usize) -> Result<Option<Bytes>> {
    Err(not_compiled(Compression::Snappy))
}

// ---- lz4 -------------------------------------------------------------------------------

#[cfg(feature = "lz4")]
fn lz4_compress(input: &[u8], out: &mut BytesMut) -> Result<()> {
    lz4::compress_frame(input, out);
    Ok(())
}

#[cfg(feature = "lz4")]
fn lz4_decompress(
    input: &[u8],
    max_len: usize,
    pool: Option<&Arc<BufPool>>,
) -> Result<Option<Bytes>> {
    if let Some(done) = lz4::decompress_sized(input, max_len, pool) {
        return done;
    }
    lz4_decompress_streaming(input, max_len, pool)
}

/// LZ4 through `lz4_flex`'s streaming frame decoder: every frame the fast path
/// ([`lz4::decompress_sized`]) leaves, and the error reports for corrupt ones.
#[cfg(feature = "lz4")]
fn lz4_decompress_streaming(
    input: &[u8],
    max_len: usize,
    pool: Option<&Arc<BufPool>>,
) -> Result<Option<Bytes>> {
    let dec = lz4_flex::frame::FrameDecoder::new(input);
    read_bounded(
        dec,
        Compression::Lz4,
        max_len,
        input.len().saturating_mul(4),
        pool,
    )
}

#[cfg(not(feature = "lz4"))]
fn lz4_compress(_input: &[u8], _out: &mut BytesMut) -> Result<()> {
    Err(not_compiled(Compression::Lz4))
}

#[cfg(not(feature = "lz4"))]
fn lz4_decompress(
    _input: &[u8],
    _max_len: usize,
    _pool: Option<&Arc<BufPool>>,
) -> Result<Option<Bytes>> {
    Err(not_compiled(Compression::Lz4))
}

// ---- zstd ------------------------------------------------------------------------------

/// The zstd level the Java client uses by default.
#[cfg(feature = "zstd")]
const ZSTD_LEVEL: i32 = 3;

/// Largest zstd block written: just under zstd's 128 KiB, which turns off the block
/// pre-splitter zstd 1.5.7 runs at level 3 (it only splits blocks of a full 128 KiB). The
/// splitter cost 8% of the CPU of producing 10 KB values with zstd (6% with 100 B ones)
/// for no gain on such batches; the zstd of librdkafka (1.5.4 here) and of the Java
/// client (zstd-jni 1.5.6) have no splitter.
#[cfg(feature = "zstd")]
const ZSTD_MAX_BLOCK: u32 = 127 << 10;

/// Turn off zstd's block pre-splitter through `set` (see [`ZSTD_MAX_BLOCK`]), on the
/// zstd versions that have it. Best effort: the block size is an experimental parameter,
/// which a zstd older than 1.5.6 (a system library, with `ZSTD_SYS_USE_PKG_CONFIG`) does
/// not know; compression then goes on with zstd's defaults.
#[cfg(feature = "zstd")]
fn skip_block_splitter(set: impl FnOnce(zstd::zstd_safe::CParameter) -> std::io::Result<()>) {
    if zstd::zstd_safe::version_number() >= 10507 {
        // An error leaves the parameter unset, which is what older versions do anyway.
        let _ = set(zstd::zstd_safe::CParameter::MaxBlockSize(ZSTD_MAX_BLOCK));
    }
}

#[cfg(feature = "zstd")]
thread_local! {
    /// A zstd compression context per thread (at [`ZSTD_LEVEL`]) and the buffer it
    /// compresses into (kept up to 4 MiB), reused from batch to batch: a context made per
    /// batch allocates (and page-faults) its megabyte workspace every time.
    static ZSTD_CCTX: std::cell::RefCell<Option<(zstd::bulk::Compressor<'static>, Vec<u8>)>> =
        const { std::cell::RefCell::new(None) };
}

#[cfg(feature = "zstd")]
fn zstd_compress(input: &[u8], out: &mut BytesMut) -> Result<()> {
    let err = |e| codec_error(Compression::Zstd, "compression", e);
    // One shot with this thread's context; the frame declares its content size, which
    // lets the decoder size its window (and buffer) to the payload.
    let done = ZSTD_CCTX.with(|cell| {
        let mut slot = cell.try_borrow_mut().ok()?;
        if slot.is_none() {
            let mut c = zstd::bulk::Compressor::new(ZSTD_LEVEL).ok()?;
            skip_block_splitter(|p| c.set_parameter(p).map(drop));
            *slot = Some((c, Vec::new()));
        }
        let (cctx, buf) = slot.as_mut()?;
        buf.clear();
        buf.reserve(zstd::zstd_safe::compress_bound(input.len()));
        let done = cctx
            .compress_to_buffer(input, buf)
            .map(|_| out.extend_from_slice(buf));
        if buf.capacity() > crate::bufpool::KEPT_SCRATCH {
            *buf = Vec::new();
        }
        Some(done)
    });
    match done {
        Some(r) => r.map_err(err),
        // the context could not be made (or is in use further up this thread's stack)
        None => zstd_compress_streaming(input, out).map_err(err),
    }
}

#[cfg(feature = "zstd")]
fn zstd_compress_streaming(input: &[u8], out: &mut BytesMut) -> std::io::Result<()> {
    use bytes::BufMut;
    use std::io::Write;
    let mut enc = zstd::stream::write::Encoder::new(out.writer(), ZSTD_LEVEL)?;
    skip_block_splitter(|p| enc.set_parameter(p));
    enc.set_pledged_src_size(u64::try_from(input.len()).ok())?;
    enc.write_all(input)?;
    enc.finish().map(drop)
}

#[cfg(feature = "zstd")]
thread_local! {
    /// A zstd decompression context per thread, reused from payload to payload.
    static ZSTD_DCTX: std::cell::RefCell<Option<zstd::bulk::Decompressor<'static>>> =
        const { std::cell::RefCell::new(None) };
}

/// Decompress a zstd payload whose (first) frame declares its content size in one shot
/// into a buffer of exactly that size, with this thread's reused context: no streaming
/// window and no growing output buffer allocated per payload (Kafka's producers,
/// librdkafka's and kafkapipe's declare the size). `None` when that does not apply or
/// fails (no declared size, several frames, corrupt input): the caller streams instead,
/// which handles every case and reports errors.
#[cfg(feature = "zstd")]
fn zstd_decompress_sized(
    input: &[u8],
    max_len: usize,
    pool: Option<&Arc<BufPool>>,
) -> Option<Result<Option<Bytes>>> {
    let declared = zstd::zstd_safe::get_frame_content_size(input).ok()??;
    let size = match usize::try_from(declared) {
        Ok(size) if size > max_len => {
            // A valid frame holds exactly its declared size: over the limit.
            return Some(Ok(None));
        }
        Ok(size) => size,
        Err(_) => return Some(Ok(None)),
    };
    // The header is not trusted for an allocation the payload cannot plausibly fill: a
    // 20-byte frame may declare hundreds of MiB. Such frames take the streaming path,
    // whose output grows only as data is really decompressed.
    if size > one_shot_limit(input.len()) {
        return None;
    }
    let mut out = take_buf(pool, size);
    let done = ZSTD_DCTX.with(|cell| {
        let mut slot = cell.try_borrow_mut().ok()?;
        if slot.is_none() {
            *slot = zstd::bulk::Decompressor::new().ok();
        }
        let dctx = slot.as_mut()?;
        // Never writes past `out`'s capacity: a longer output is an error.
        dctx.decompress_to_buffer(input, &mut out).ok()
    });
    let freeze = |out: Vec<u8>| freeze_buf(pool, out);
    match done {
        Some(_) if out.len() <= max_len => Some(Ok(Some(freeze(out)))),
        _ => {
            drop(freeze(out));
            None
        }
    }
}

#[cfg(feature = "zstd")]
fn zstd_decompress(
    input: &[u8],
    max_len: usize,
    pool: Option<&Arc<BufPool>>,
) -> Result<Option<Bytes>> {
    if let Some(done) = zstd_decompress_sized(input, max_len, pool) {
        return done;
    }
    let dec = zstd::stream::read::Decoder::with_buffer(input)
        .map_err(|e| codec_error(Compression::Zstd, "decompression", e))?;
    read_bounded(
        dec,
        Compression::Zstd,
        max_len,
        input.len().saturating_mul(4),
        pool,
    )
}

#[cfg(not(feature = "zstd"))]
fn zstd_compress(_input: &[u8], _out: &mut BytesMut) -> Result<()> {
    Err(not_compiled(Compression::Zstd))
}

#[cfg(not(feature = "zstd"))]
fn zstd_decompress(
    _input: &[u8],
    _max_len: usize,
    _pool: Option<&Arc<BufPool>>,
) -> Result<Option<Bytes>> {
    Err(not_compiled(Compression::Zstd))
}

#[cfg(all(
    test,
    feature = "gzip",
    feature = "snappy",
    feature = "lz4",
    feature = "zstd"
))]
mod tests;

#[cfg(all(test, not(feature = "gzip")))]
mod without_gzip {
    #[test]
    fn compiled_out_codec_is_a_clear_error() {
        use super::*;
        let c = Compression::Gzip;
        assert!(!c.is_available());
        let err = c.compress(b"x", &mut BytesMut::new()).unwrap_err();
        assert_eq!(err.kind(), crate::ErrorKind::Compression);
        assert!(err.to_string().contains("feature"), "{err}");
        assert!(c.decompress(b"x", 10).is_err());
    }
}
