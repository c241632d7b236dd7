//! [`BatchBytes`]: encoded record batches whose large values are held by reference.
//!
//! Owned here, below `record/`, because the Produce request carries it and the codec
//! writes its pieces; `record` builds it and re-exports it as `record::BatchBytes`.

use bytes::{Bytes, BytesMut};

/// The bytes of one or more encoded record batches, as a produce request carries them.
///
/// Usually one contiguous buffer (`From<Bytes>`, and every batch
/// [`RecordBatchBuilder::build`](crate::record::RecordBatchBuilder::build) makes). The
/// [`Writer`](crate::writer::Writer) appends each value of 8 KiB or more to an
/// uncompressed batch as the message's own [`Bytes`] instead of copying it in: its
/// batch is then a buffer with those values spliced in at their offsets, and the
/// produce request writes the pieces with vectored writes, so a value is copied once,
/// by the kernel. Equality compares the bytes, whatever the pieces.
///
/// ```
/// use bytes::Bytes;
/// use kafkapipe::record::BatchBytes;
///
/// let whole = BatchBytes::from(Bytes::from_static(b"abcdef"));
/// assert_eq!(whole.len(), 6);
/// assert_eq!(whole.to_bytes(), Bytes::from_static(b"abcdef"));
/// assert_eq!(whole.pieces().count(), 1);
/// ```
#[derive(Clone, Default)]
pub struct BatchBytes {
    /// The batch's buffer: everything but the spliced values.
    head: Bytes,
    /// Values at their offsets in `head` (non-decreasing): each belongs before
    /// `head[offset..]`.
    spliced: Vec<(usize, Bytes)>,
    /// `head.len()` plus the spliced values' lengths.
    len: usize,
}

impl BatchBytes {
    /// Bytes `head` with `spliced` values inserted at their offsets (which must not
    /// decrease and lie within `head`).
    pub(crate) fn spliced(head: Bytes, spliced: Vec<(usize, Bytes)>) -> Self {
        debug_assert!(spliced.windows(2).all(|w| w[0].0 <= w[1].0));
        debug_assert!(spliced.last().is_none_or(|(at, _)| *at <= head.len()));
        let len = head.len() + spliced.iter().map(|(_, b)| b.len()).sum::<usize>();
        BatchBytes { head, spliced, len }
    }

    /// The number of bytes, all pieces together.
    ///
    /// ```
    /// # use kafkapipe::record::BatchBytes;
    /// assert_eq!(BatchBytes::from(vec![1u8, 2, 3]).len(), 3);
    /// ```
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there are no bytes.
    ///
    /// ```
    /// # use kafkapipe::record::BatchBytes;
    /// assert!(BatchBytes::default().is_empty());
    /// ```
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The buffer the values were spliced into (all the bytes when none was).
    pub(crate) fn head(&self) -> &Bytes {
        &self.head
    }

    /// Take the buffer the values were spliced into, leaving this empty.
    pub(crate) fn take_head(&mut self) -> Bytes {
        self.len -= self.head.len();
        std::mem::take(&mut self.head)
    }

    /// Replace the buffer with one of the same length (a copy changed in place).
    pub(crate) fn set_head(&mut self, head: Bytes) {
        self.len += head.len();
        self.head = head;
    }

    /// Whether the bytes are one buffer, nothing spliced.
    ///
    /// ```
    /// # use kafkapipe::record::BatchBytes;
    /// assert!(BatchBytes::from(vec![0u8; 10]).is_contiguous());
    /// ```
    pub fn is_contiguous(&self) -> bool {
        self.spliced.is_empty()
    }

    /// The bytes in order, as slices: pieces of the buffer and the values spliced
    /// between them (empty pieces skipped).
    ///
    /// ```
    /// use bytes::Bytes;
    /// use kafkapipe::record::BatchBytes;
    ///
    /// let b = BatchBytes::from(Bytes::from_static(b"xyz"));
    /// assert_eq!(b.pieces().collect::<Vec<_>>(), [&b"xyz"[..]]);
    /// ```
    pub fn pieces(&self) -> impl Iterator<Item = &[u8]> + '_ {
        self.parts().map(|(piece, _)| piece)
    }

    /// Like [`pieces`](Self::pieces), each with whether it is a spliced value.
    pub(crate) fn parts(&self) -> impl Iterator<Item = (&[u8], bool)> + '_ {
        parts_of(&self.head, &self.spliced)
    }

    /// The values spliced in, as shared bytes, with their offsets in the buffer.
    pub(crate) fn spliced_values(&self) -> &[(usize, Bytes)] {
        &self.spliced
    }

    /// The bytes as one buffer: the buffer itself when nothing was spliced, else a copy.
    ///
    /// ```
    /// # use bytes::Bytes;
    /// # use kafkapipe::record::BatchBytes;
    /// let b = BatchBytes::from(Bytes::from_static(b"batch"));
    /// assert_eq!(b.to_bytes(), Bytes::from_static(b"batch"));
    /// ```
    pub fn to_bytes(&self) -> Bytes {
        if self.spliced.is_empty() {
            return self.head.clone();
        }
        let mut out = BytesMut::with_capacity(self.len);
        for piece in self.pieces() {
            out.extend_from_slice(piece);
        }
        out.freeze()
    }
}

/// The pieces of `head` with `spliced` values inserted at their offsets, each with
/// whether it is a spliced value; empty pieces skipped. (Also how a request frame's
/// [`Splices`](crate::protocol::Splices) go back into order.)
pub(crate) fn parts_of<'a>(
    head: &'a [u8],
    spliced: &'a [(usize, Bytes)],
) -> impl Iterator<Item = (&'a [u8], bool)> + 'a {
    let mut from = 0;
    spliced
        .iter()
        .map(|(at, bytes)| (*at, Some(&bytes[..])))
        .chain(std::iter::once((head.len(), None)))
        .flat_map(move |(at, value)| {
            let at = at.clamp(from, head.len());
            let before = &head[from..at];
            from = at;
            [Some((before, false)), value.map(|v| (v, true))]
        })
        .flatten()
        .filter(|(piece, _)| !piece.is_empty())
}

/// The pieces of `head` with `spliced` values inserted (as in [`BatchBytes`]), from byte
/// `from` of the whole on.
pub(crate) fn parts_from<'a>(
    head: &'a [u8],
    spliced: &'a [(usize, Bytes)],
    from: usize,
) -> impl Iterator<Item = &'a [u8]> + 'a {
    let mut skip = from;
    parts_of(head, spliced).filter_map(move |(piece, _)| {
        let rest = piece.get(skip..).filter(|rest| !rest.is_empty());
        skip = skip.saturating_sub(piece.len());
        rest
    })
}

/// The CRC-32C of the bytes of `head` with `spliced` values inserted (as in
/// [`BatchBytes`]), from byte `from` of the whole on.
pub(crate) fn crc32c_of(head: &[u8], spliced: &[(usize, Bytes)], from: usize) -> u32 {
    parts_from(head, spliced, from).fold(0, crc32c::crc32c_append)
}

impl From<Bytes> for BatchBytes {
    fn from(head: Bytes) -> Self {
        BatchBytes {
            len: head.len(),
            head,
            spliced: Vec::new(),
        }
    }
}

impl From<BatchBytes> for Bytes {
    /// [`BatchBytes::to_bytes`], without a copy when nothing is spliced.
    fn from(b: BatchBytes) -> Self {
        if b.spliced.is_empty() {
            return b.head;
        }
        b.to_bytes()
    }
}

impl From<Vec<u8>> for BatchBytes {
    fn from(v: Vec<u8>) -> Self {
        Bytes::from(v).into()
    }
}

impl From<&'static [u8]> for BatchBytes {
    fn from(v: &'static [u8]) -> Self {
        Bytes::from_static(v).into()
    }
}

impl FromIterator<u8> for BatchBytes {
    fn from_iter<I: IntoIterator<Item = u8>>(iter: I) -> Self {
        Bytes::from_iter(iter).into()
    }
}

impl PartialEq for BatchBytes {
    fn eq(&self, other: &Self) -> bool {
        if self.len != other.len {
            return false;
        }
        if self.is_contiguous() && other.is_contiguous() {
            return self.head == other.head;
        }
        let (mut a, mut b) = (self.pieces(), other.pieces());
        let (mut x, mut y): (&[u8], &[u8]) = (&[], &[]);
        loop {
            if x.is_empty() {
                x = a.next().unwrap_or_default();
            }
            if y.is_empty() {
                y = b.next().unwrap_or_default();
            }
            if x.is_empty() || y.is_empty() {
                return x.is_empty() && y.is_empty();
            }
            let n = x.len().min(y.len());
            if x[..n] != y[..n] {
                return false;
            }
            (x, y) = (&x[n..], &y[n..]);
        }
    }
}

impl Eq for BatchBytes {}

impl std::fmt::Debug for BatchBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.is_contiguous() {
            return self.head.fmt(f);
        }
        f.debug_struct("BatchBytes")
            .field("len", &self.len)
            .field("head", &self.head.len())
            .field("spliced", &self.spliced.len())
            .finish()
    }
}

#[cfg(test)]
impl BatchBytes {
    /// `data` cut into a buffer and values taken out of it at the `(start, len)` pairs
    /// (sorted by start; clamped to the data and to each other): its bytes are `data`.
    pub(crate) fn cut(data: &[u8], cuts: &[(usize, usize)]) -> BatchBytes {
        let (mut head, mut spliced, mut at) = (Vec::new(), Vec::new(), 0);
        for &(start, len) in cuts {
            let start = start.clamp(at, data.len());
            let end = (start + len).min(data.len());
            head.extend_from_slice(&data[at..start]);
            spliced.push((head.len(), Bytes::copy_from_slice(&data[start..end])));
            at = end;
        }
        head.extend_from_slice(&data[at..]);
        BatchBytes::spliced(Bytes::from(head), spliced)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn pieces_crc_and_equality_see_the_same_bytes(
            data in proptest::collection::vec(any::<u8>(), 0..300),
            mut cuts in proptest::collection::vec((0usize..300, 0usize..40), 0..6),
            from in 0usize..30,
        ) {
            cuts.sort_unstable();
            let b = BatchBytes::cut(&data, &cuts);
            prop_assert_eq!(b.len(), data.len());
            prop_assert_eq!(&b.to_bytes()[..], &data[..]);
            prop_assert_eq!(b.clone(), BatchBytes::from(data.clone()));
            let from = from.min(data.len());
            prop_assert_eq!(crc32c_of(b.head(), b.spliced_values(), from), crc32c::crc32c(&data[from..]));
            if !data.is_empty() {
                let mut other = data.clone();
                other[data.len() / 2] ^= 1;
                prop_assert_ne!(b, BatchBytes::from(other));
            }
        }
    }
}
