//! Wire primitives: fixed-width integers, (zigzag) varints, classic and compact strings,
//! bytes and arrays, UUIDs and tagged fields.
//!
//! Reference: the "Protocol Primitive Types" section of the Kafka protocol guide and
//! KIP-482 (flexible versions: compact encodings and tagged fields).
//!
//! Decoding reads from a [`Bytes`] cursor so that byte fields are zero-copy slices of
//! the received frame. Every length read from the wire is checked against the bytes that
//! are actually left *before* anything is allocated, so a hostile length prefix cannot
//! make us allocate; every failure is an [`Error`] of kind `Protocol`, never a panic.
//! Encoding appends to a [`BytesMut`]; values that do not fit their wire type are an
//! `Encode` error.

use bytes::{Buf, BufMut, Bytes, BytesMut};

use crate::error::{Error, Result};

#[inline]
fn need(buf: &Bytes, n: usize, what: &str) -> Result<()> {
    if buf.remaining() < n {
        Err(Error::protocol(format!(
            "truncated {what}: need {n} bytes, {} left",
            buf.remaining()
        )))
    } else {
        Ok(())
    }
}

/// Read an `INT8`.
pub fn get_i8(buf: &mut Bytes) -> Result<i8> {
    need(buf, 1, "int8")?;
    Ok(buf.get_i8())
}

/// Read a `BOOLEAN`.
pub fn get_bool(buf: &mut Bytes) -> Result<bool> {
    Ok(get_i8(buf)? != 0)
}

/// Read an `INT16`.
pub fn get_i16(buf: &mut Bytes) -> Result<i16> {
    need(buf, 2, "int16")?;
    Ok(buf.get_i16())
}

/// Read an `INT32`.
pub fn get_i32(buf: &mut Bytes) -> Result<i32> {
    need(buf, 4, "int32")?;
    Ok(buf.get_i32())
}

/// Read a `UINT32`.
pub fn get_u32(buf: &mut Bytes) -> Result<u32> {
    need(buf, 4, "uint32")?;
    Ok(buf.get_u32())
}

/// Read an `INT64`.
pub fn get_i64(buf: &mut Bytes) -> Result<i64> {
    need(buf, 8, "int64")?;
    Ok(buf.get_i64())
}

/// Read a `FLOAT64`.
pub fn get_f64(buf: &mut Bytes) -> Result<f64> {
    need(buf, 8, "float64")?;
    Ok(buf.get_f64())
}

/// Read a `UUID` (16 bytes).
pub fn get_uuid(buf: &mut Bytes) -> Result<[u8; 16]> {
    need(buf, 16, "uuid")?;
    let mut out = [0u8; 16];
    buf.copy_to_slice(&mut out);
    Ok(out)
}

/// Read an `UNSIGNED_VARINT` (at most 5 bytes).
pub fn get_uvarint(buf: &mut Bytes) -> Result<u32> {
    let mut value: u32 = 0;
    for i in 0..5 {
        need(buf, 1, "unsigned varint")?;
        let b = buf.get_u8();
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

/// Read an unsigned 64-bit varint (at most 10 bytes).
pub fn get_uvarlong(buf: &mut Bytes) -> Result<u64> {
    let mut value: u64 = 0;
    for i in 0..10 {
        need(buf, 1, "unsigned varlong")?;
        let b = buf.get_u8();
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

/// Read a zigzag `VARINT`.
pub fn get_varint(buf: &mut Bytes) -> Result<i32> {
    let v = get_uvarint(buf)?;
    Ok(((v >> 1) as i32) ^ -((v & 1) as i32))
}

/// Read a zigzag `VARLONG`.
pub fn get_varlong(buf: &mut Bytes) -> Result<i64> {
    let v = get_uvarlong(buf)?;
    Ok(((v >> 1) as i64) ^ -((v & 1) as i64))
}

/// Read a length prefix: `INT16`/`INT32` when classic, `UNSIGNED_VARINT` (N+1) when
/// compact. `None` means null. The length is checked against the remaining bytes
/// (each element takes at least `min_elem` bytes).
fn get_len(
    buf: &mut Bytes,
    compact: bool,
    wide: bool,
    min_elem: usize,
    what: &str,
) -> Result<Option<usize>> {
    let len: i64 = if compact {
        i64::from(get_uvarint(buf)?) - 1
    } else if wide {
        i64::from(get_i32(buf)?)
    } else {
        i64::from(get_i16(buf)?)
    };
    if len < -1 {
        return Err(Error::protocol(format!("negative {what} length {len}")));
    }
    if len == -1 {
        return Ok(None);
    }
    let len = len as usize;
    let min_bytes = len.saturating_mul(min_elem);
    if min_bytes > buf.remaining() {
        return Err(Error::protocol(format!(
            "{what} length {len} exceeds the {} bytes left",
            buf.remaining()
        )));
    }
    Ok(Some(len))
}

/// Read a `NULLABLE_STRING` (classic, `INT16` length) or `COMPACT_NULLABLE_STRING`.
pub fn get_nullable_string(buf: &mut Bytes, compact: bool) -> Result<Option<String>> {
    match get_len(buf, compact, false, 1, "string")? {
        None => Ok(None),
        Some(n) => {
            let raw = buf.split_to(n);
            String::from_utf8(raw.to_vec())
                .map(Some)
                .map_err(|_| Error::protocol("string is not valid UTF-8"))
        }
    }
}

/// Read a non-null `STRING` / `COMPACT_STRING`.
pub fn get_string(buf: &mut Bytes, compact: bool) -> Result<String> {
    get_nullable_string(buf, compact)?
        .ok_or_else(|| Error::protocol("null in a non-nullable string"))
}

/// Read `NULLABLE_BYTES` (classic, `INT32` length) or `COMPACT_NULLABLE_BYTES`, zero-copy.
pub fn get_nullable_bytes(buf: &mut Bytes, compact: bool) -> Result<Option<Bytes>> {
    Ok(get_len(buf, compact, true, 1, "bytes")?.map(|n| buf.split_to(n)))
}

/// Read non-null `BYTES` / `COMPACT_BYTES`, zero-copy.
pub fn get_bytes(buf: &mut Bytes, compact: bool) -> Result<Bytes> {
    get_nullable_bytes(buf, compact)?.ok_or_else(|| Error::protocol("null in non-nullable bytes"))
}

/// Read an array length (classic `INT32` or compact), checked so that `len` elements of
/// at least `min_elem` bytes each fit in what is left. `None` means a null array.
pub fn get_array_len(buf: &mut Bytes, compact: bool, min_elem: usize) -> Result<Option<usize>> {
    get_len(buf, compact, true, min_elem.max(1), "array")
}

/// At most this many bytes are reserved up front for a collection whose element count
/// came off the wire; beyond that it grows as elements actually decode.
const MAX_PREALLOC_BYTES: usize = 64 * 1024;

/// The capacity to reserve for `n` elements of `T` whose count was read from the wire.
///
/// The count is already checked against the bytes left, but one wire byte can decode
/// into a much larger `T` (a struct with strings, vectors and options), so reserving `n`
/// outright would let a hostile frame reserve gigabytes; this caps the up-front
/// reservation at [`MAX_PREALLOC_BYTES`].
pub(crate) fn capacity_for<T>(n: usize) -> usize {
    n.min(MAX_PREALLOC_BYTES / std::mem::size_of::<T>().max(1))
}

/// Read a nullable array, decoding each element with `f`.
pub fn get_nullable_array<T>(
    buf: &mut Bytes,
    compact: bool,
    min_elem: usize,
    mut f: impl FnMut(&mut Bytes) -> Result<T>,
) -> Result<Option<Vec<T>>> {
    match get_array_len(buf, compact, min_elem)? {
        None => Ok(None),
        Some(n) => {
            let mut out = Vec::with_capacity(capacity_for::<T>(n));
            for _ in 0..n {
                out.push(f(buf)?);
            }
            Ok(Some(out))
        }
    }
}

/// Read a non-null array (a null array on the wire decodes as empty, as the Java client
/// does for non-nullable arrays sent by lenient brokers).
pub fn get_array<T>(
    buf: &mut Bytes,
    compact: bool,
    min_elem: usize,
    f: impl FnMut(&mut Bytes) -> Result<T>,
) -> Result<Vec<T>> {
    Ok(get_nullable_array(buf, compact, min_elem, f)?.unwrap_or_default())
}

/// Tagged fields (KIP-482) that this client does not interpret, kept raw so that
/// re-encoding a decoded message reproduces them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TaggedFields(pub Vec<(u32, Bytes)>);

impl TaggedFields {
    /// No tagged fields.
    pub fn new() -> Self {
        TaggedFields(Vec::new())
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The raw value of tag `tag`, if present.
    pub fn get(&self, tag: u32) -> Option<&Bytes> {
        self.0.iter().find(|(t, _)| *t == tag).map(|(_, v)| v)
    }
}

/// Read a tagged-field section, handing each field to `known(tag, value)`; fields for
/// which it returns `Ok(false)` are kept raw. Tags must be strictly increasing.
pub fn get_tagged_fields_with(
    buf: &mut Bytes,
    mut known: impl FnMut(u32, Bytes) -> Result<bool>,
) -> Result<TaggedFields> {
    let n = get_uvarint(buf)? as usize;
    // each field needs at least two bytes (tag, size)
    if n.saturating_mul(2) > buf.remaining() {
        return Err(Error::protocol(format!(
            "tagged field count {n} exceeds the {} bytes left",
            buf.remaining()
        )));
    }
    let mut unknown = Vec::new();
    let mut last: Option<u32> = None;
    for _ in 0..n {
        let tag = get_uvarint(buf)?;
        if let Some(prev) = last {
            if tag <= prev {
                return Err(Error::protocol("tagged fields out of order"));
            }
        }
        last = Some(tag);
        let size = get_uvarint(buf)? as usize;
        need(buf, size, "tagged field")?;
        let value = buf.split_to(size);
        if !known(tag, value.clone())? {
            unknown.push((tag, value));
        }
    }
    Ok(TaggedFields(unknown))
}

/// Read a tagged-field section, keeping every field raw.
pub fn get_tagged_fields(buf: &mut Bytes) -> Result<TaggedFields> {
    get_tagged_fields_with(buf, |_, _| Ok(false))
}

// ---------------------------------------------------------------------------------------
// encoding

/// Append an `UNSIGNED_VARINT`.
pub fn put_uvarint(buf: &mut BytesMut, mut v: u32) {
    while v >= 0x80 {
        buf.put_u8((v as u8) | 0x80);
        v >>= 7;
    }
    buf.put_u8(v as u8);
}

/// Append an unsigned 64-bit varint.
pub fn put_uvarlong(buf: &mut BytesMut, mut v: u64) {
    while v >= 0x80 {
        buf.put_u8((v as u8) | 0x80);
        v >>= 7;
    }
    buf.put_u8(v as u8);
}

/// Append a zigzag `VARINT`.
pub fn put_varint(buf: &mut BytesMut, v: i32) {
    put_uvarint(buf, ((v << 1) ^ (v >> 31)) as u32);
}

/// Append a zigzag `VARLONG`.
pub fn put_varlong(buf: &mut BytesMut, v: i64) {
    put_uvarlong(buf, ((v << 1) ^ (v >> 63)) as u64);
}

/// Number of bytes `put_uvarint(v)` writes.
pub fn uvarint_len(v: u32) -> usize {
    match v {
        0..=0x7f => 1,
        0x80..=0x3fff => 2,
        0x4000..=0x1f_ffff => 3,
        0x20_0000..=0x0fff_ffff => 4,
        _ => 5,
    }
}

/// Number of bytes `put_varint(v)` writes.
pub fn varint_len(v: i32) -> usize {
    uvarint_len(((v << 1) ^ (v >> 31)) as u32)
}

/// Number of bytes `put_varlong(v)` writes.
pub fn varlong_len(v: i64) -> usize {
    let mut z = ((v << 1) ^ (v >> 63)) as u64;
    let mut n = 1;
    while z >= 0x80 {
        z >>= 7;
        n += 1;
    }
    n
}

/// Append a `BOOLEAN`.
pub fn put_bool(buf: &mut BytesMut, v: bool) {
    buf.put_i8(i8::from(v));
}

fn put_len(
    buf: &mut BytesMut,
    len: Option<usize>,
    compact: bool,
    wide: bool,
    what: &str,
) -> Result<()> {
    match (len, compact) {
        (None, true) => put_uvarint(buf, 0),
        (None, false) if wide => buf.put_i32(-1),
        (None, false) => buf.put_i16(-1),
        (Some(n), true) => {
            let v = u32::try_from(n)
                .ok()
                .and_then(|n| n.checked_add(1))
                .filter(|v| *v <= i32::MAX as u32)
                .ok_or_else(|| Error::encode(format!("{what} too long: {n}")))?;
            put_uvarint(buf, v);
        }
        (Some(n), false) if wide => {
            let v = i32::try_from(n).map_err(|_| Error::encode(format!("{what} too long: {n}")))?;
            buf.put_i32(v);
        }
        (Some(n), false) => {
            let v = i16::try_from(n).map_err(|_| Error::encode(format!("{what} too long: {n}")))?;
            buf.put_i16(v);
        }
    }
    Ok(())
}

/// Append a `NULLABLE_STRING` / `COMPACT_NULLABLE_STRING`.
pub fn put_nullable_string(buf: &mut BytesMut, s: Option<&str>, compact: bool) -> Result<()> {
    put_len(buf, s.map(str::len), compact, false, "string")?;
    if let Some(s) = s {
        buf.put_slice(s.as_bytes());
    }
    Ok(())
}

/// Append a `STRING` / `COMPACT_STRING`.
pub fn put_string(buf: &mut BytesMut, s: &str, compact: bool) -> Result<()> {
    put_nullable_string(buf, Some(s), compact)
}

/// Append `NULLABLE_BYTES` / `COMPACT_NULLABLE_BYTES`.
pub fn put_nullable_bytes(buf: &mut BytesMut, b: Option<&[u8]>, compact: bool) -> Result<()> {
    put_len(buf, b.map(<[u8]>::len), compact, true, "bytes")?;
    if let Some(b) = b {
        buf.put_slice(b);
    }
    Ok(())
}

/// Append the length prefix of a `BYTES` / `COMPACT_BYTES` of `len` bytes, without the
/// bytes (they are written from elsewhere, see [`super::Splices`]).
pub fn put_bytes_len(buf: &mut BytesMut, len: usize, compact: bool) -> Result<()> {
    put_len(buf, Some(len), compact, true, "bytes")
}

/// Append `BYTES` / `COMPACT_BYTES`.
pub fn put_bytes(buf: &mut BytesMut, b: &[u8], compact: bool) -> Result<()> {
    put_nullable_bytes(buf, Some(b), compact)
}

/// Append an array length (classic `INT32`, or compact N+1; `None` = null).
pub fn put_array_len(buf: &mut BytesMut, len: Option<usize>, compact: bool) -> Result<()> {
    put_len(buf, len, compact, true, "array")
}

/// Append an array, encoding each element with `f`.
pub fn put_array<T>(
    buf: &mut BytesMut,
    items: &[T],
    compact: bool,
    mut f: impl FnMut(&mut BytesMut, &T) -> Result<()>,
) -> Result<()> {
    put_array_len(buf, Some(items.len()), compact)?;
    for item in items {
        f(buf, item)?;
    }
    Ok(())
}

/// Append a nullable array.
pub fn put_nullable_array<T>(
    buf: &mut BytesMut,
    items: Option<&[T]>,
    compact: bool,
    f: impl FnMut(&mut BytesMut, &T) -> Result<()>,
) -> Result<()> {
    match items {
        None => put_array_len(buf, None, compact),
        Some(items) => put_array(buf, items, compact, f),
    }
}

/// Append a tagged-field section: `known` fields (already encoded, tag → value) merged
/// with the raw `unknown` ones, in increasing tag order.
pub fn put_tagged_fields(
    buf: &mut BytesMut,
    known: &[(u32, Bytes)],
    unknown: &TaggedFields,
) -> Result<()> {
    let mut all: Vec<&(u32, Bytes)> = known.iter().chain(unknown.0.iter()).collect();
    all.sort_by_key(|(t, _)| *t);
    put_uvarint(buf, all.len() as u32);
    for (tag, value) in all {
        put_uvarint(buf, *tag);
        let len = u32::try_from(value.len()).map_err(|_| Error::encode("tagged field too long"))?;
        put_uvarint(buf, len);
        buf.put_slice(value);
    }
    Ok(())
}

/// Append an empty tagged-field section.
pub fn put_empty_tagged_fields(buf: &mut BytesMut) {
    buf.put_u8(0);
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn wire_counts_reserve_bounded_capacity() {
        assert_eq!(capacity_for::<u8>(10), 10);
        assert_eq!(capacity_for::<[u8; 1024]>(1_000_000), 64);
        assert_eq!(capacity_for::<()>(5), 5);
        // A count that fits the bytes left still decodes fully past the reservation.
        let mut b = BytesMut::new();
        put_array_len(&mut b, Some(100_000), false).unwrap();
        for i in 0..100_000 {
            b.put_i32(i);
        }
        let got = get_array(&mut b.freeze(), false, 4, get_i32).unwrap();
        assert_eq!(got.len(), 100_000);
        assert_eq!(got[99_999], 99_999);
    }

    fn roundtrip<T: PartialEq + std::fmt::Debug>(
        v: T,
        put: impl Fn(&mut BytesMut, &T),
        get: impl Fn(&mut Bytes) -> Result<T>,
    ) {
        let mut b = BytesMut::new();
        put(&mut b, &v);
        let mut r = b.freeze();
        let got = get(&mut r).unwrap();
        assert_eq!(got, v);
        assert!(r.is_empty());
    }

    proptest! {
        #[test]
        fn varint_roundtrip(v: i32) {
            roundtrip(v, |b, v| put_varint(b, *v), get_varint);
            let mut b = BytesMut::new();
            put_varint(&mut b, v);
            prop_assert_eq!(b.len(), varint_len(v));
        }

        #[test]
        fn varlong_roundtrip(v: i64) {
            roundtrip(v, |b, v| put_varlong(b, *v), get_varlong);
            let mut b = BytesMut::new();
            put_varlong(&mut b, v);
            prop_assert_eq!(b.len(), varlong_len(v));
        }

        #[test]
        fn uvarint_roundtrip(v: u32) {
            roundtrip(v, |b, v| put_uvarint(b, *v), get_uvarint);
        }

        #[test]
        fn strings_roundtrip(s: Option<String>, compact: bool) {
            roundtrip(s, |b, s| put_nullable_string(b, s.as_deref(), compact).unwrap(), |b| get_nullable_string(b, compact));
        }

        #[test]
        fn bytes_roundtrip(v: Option<Vec<u8>>, compact: bool) {
            roundtrip(v.map(Bytes::from), |b, v| put_nullable_bytes(b, v.as_deref(), compact).unwrap(), |b| get_nullable_bytes(b, compact));
        }

        #[test]
        fn arrays_roundtrip(v: Option<Vec<i32>>, compact: bool) {
            roundtrip(v, |b, v| put_nullable_array(b, v.as_deref(), compact, |b, x| { b.put_i32(*x); Ok(()) }).unwrap(),
                |b| get_nullable_array(b, compact, 4, get_i32));
        }

        #[test]
        fn arbitrary_bytes_never_panic(data: Vec<u8>) {
            let b = Bytes::from(data);
            let _ = get_nullable_string(&mut b.clone(), true);
            let _ = get_nullable_string(&mut b.clone(), false);
            let _ = get_nullable_bytes(&mut b.clone(), true);
            let _ = get_nullable_array(&mut b.clone(), false, 4, get_i32);
            let _ = get_tagged_fields(&mut b.clone());
            let _ = get_varlong(&mut b.clone());
        }
    }

    #[test]
    fn known_varint_encodings() {
        let mut b = BytesMut::new();
        put_varint(&mut b, -1);
        put_varint(&mut b, 1);
        put_varint(&mut b, 300);
        assert_eq!(&b[..], &[0x01, 0x02, 0xd8, 0x04]);
    }

    #[test]
    fn oversized_lengths_are_rejected_without_allocating() {
        // an array claiming i32::MAX elements in a 4-byte buffer
        let mut b = Bytes::from_static(&[0x7f, 0xff, 0xff, 0xff, 0, 0, 0, 0]);
        let err = get_array(&mut b, false, 4, get_i32).unwrap_err();
        assert!(err.to_string().contains("exceeds"), "{err}");
        // a compact string claiming 2^28 bytes
        let mut b = Bytes::from_static(&[0xff, 0xff, 0xff, 0x7f, b'a']);
        assert!(get_nullable_string(&mut b, true).is_err());
        // a negative string length other than -1
        let mut b = Bytes::from_static(&[0xff, 0xfe]);
        assert!(get_nullable_string(&mut b, false).is_err());
    }

    #[test]
    fn overlong_varint_is_an_error() {
        let mut b = Bytes::from_static(&[0xff, 0xff, 0xff, 0xff, 0xff, 0x01]);
        assert!(get_uvarint(&mut b).is_err());
        let mut b = Bytes::from_static(&[0x80]);
        assert!(get_uvarint(&mut b).is_err());
    }

    #[test]
    fn unknown_tagged_fields_are_kept_and_reencoded() {
        let mut b = BytesMut::new();
        put_tagged_fields(
            &mut b,
            &[(0, Bytes::from_static(b"k"))],
            &TaggedFields(vec![(7, Bytes::from_static(b"xyz"))]),
        )
        .unwrap();
        let bytes = b.freeze();
        let mut r = bytes.clone();
        let mut seen_known = false;
        let t = get_tagged_fields_with(&mut r, |tag, v| {
            if tag == 0 {
                assert_eq!(&v[..], b"k");
                seen_known = true;
                Ok(true)
            } else {
                Ok(false)
            }
        })
        .unwrap();
        assert!(seen_known);
        assert_eq!(t.0, vec![(7, Bytes::from_static(b"xyz"))]);
    }

    #[test]
    fn tagged_fields_out_of_order_rejected() {
        let mut b = Bytes::from_static(&[2, 5, 0, 3, 0]);
        assert!(get_tagged_fields(&mut b).is_err());
    }
}
