//! A small bounded pool of byte buffers, so the multi-megabyte buffers of the consume path
//! (fetch response frames, decompressed batch payloads) are reused from fetch to fetch
//! instead of being allocated, faulted in page by page, and unmapped every time.
//!
//! A buffer leaves the pool with [`BufPool::take`], is filled, and is frozen into
//! [`Bytes`] with [`BufPool::freeze`]; records are zero-copy slices of those bytes, so the
//! buffer comes back (in the owner's `Drop`) only once the last message that points into it
//! is dropped. The pool keeps at most `max_buffers` buffers and `max_bytes` of capacity,
//! and never keeps a buffer larger than `max_buffer`: a one-off huge response is freed as
//! before, not pinned. A pool that is gone (its connection or reader closed) just frees
//! the buffers that come back later.

use std::sync::{Arc, Mutex, Weak};

use bytes::Bytes;

/// How much larger than its contents a buffer [`BufPool::freeze`] keeps may be, as a
/// factor (above [`SHRINK_ABOVE`] bytes).
const OVERSIZE: usize = 4;
/// The largest per-thread scratch buffer (compression output, joined parts) kept after
/// use; a larger one (after an unusually large batch) is freed rather than pinned for the
/// thread's lifetime.
pub(crate) const KEPT_SCRATCH: usize = 4 << 20;

/// Buffers up to this size are kept whatever they hold.
const SHRINK_ABOVE: usize = 8 << 10;

/// Contents larger than this stay in their buffer whatever its size: copying them out
/// would cost fresh memory each time (a fetch response of a few MiB in a pooled 16 MiB
/// buffer), and they are few at a time.
const SHRINK_UP_TO: usize = 256 << 10;

/// The largest buffer [`BufPool::for_fetches`] keeps: 16 MiB of records and 1 MiB for
/// the rest of a response.
const FETCH_BUFFER_MAX: usize = 17 << 20;

/// New buffers of at least this size from [`BufPool::take_rounded`] are rounded up to a
/// multiple of it.
const ROUND_ABOVE: usize = 1 << 20;

/// `min` rounded up to a whole MiB from 1 MiB on (see [`BufPool::take_rounded`]).
fn rounded(min: usize) -> usize {
    if min < ROUND_ABOVE {
        return min;
    }
    min.div_ceil(ROUND_ABOVE).saturating_mul(ROUND_ABOVE)
}

/// Whether a buffer of `capacity` holding `len` bytes holds so little that its contents
/// should move to a buffer of their size rather than pin it: a small payload (a small
/// batch decompressed into a large buffer) that records may keep alive long after the
/// buffer could serve again.
pub(crate) fn oversized(len: usize, capacity: usize) -> bool {
    capacity > SHRINK_ABOVE && len <= SHRINK_UP_TO && len.saturating_mul(OVERSIZE) < capacity
}

/// Run `f` with this thread's scratch value in `key` (a fresh `B::default()` when it is in
/// use further up this thread's stack). Afterwards, one whose `capacity` grew past
/// [`KEPT_SCRATCH`] (after an unusually large batch) is
/// replaced by an empty one rather than pinned for the thread's lifetime.
pub(crate) fn with_thread_scratch<B: Default, R>(
    key: &'static std::thread::LocalKey<std::cell::RefCell<B>>,
    capacity: fn(&B) -> usize,
    f: impl FnOnce(&mut B) -> R,
) -> R {
    key.with(|cell| match cell.try_borrow_mut() {
        Ok(mut scratch) => {
            let r = f(&mut scratch);
            if capacity(&scratch) > KEPT_SCRATCH {
                *scratch = B::default();
            }
            r
        }
        Err(_) => f(&mut B::default()),
    })
}

/// Take the smallest of `spare` whose capacity (`cap`) is at least `min`, if any: larger
/// ones stay for larger needs. (The pool's rule, and the writer's for batch buffers.)
pub(crate) fn take_best_fit<T>(
    spare: &mut Vec<T>,
    min: usize,
    cap: impl Fn(&T) -> usize,
) -> Option<T> {
    let best = spare
        .iter()
        .enumerate()
        .filter(|(_, b)| cap(b) >= min)
        .min_by_key(|(_, b)| cap(b))
        .map(|(i, _)| i)?;
    Some(spare.swap_remove(best))
}

/// Free the smallest of `spare` until at most `max_items` are left, of at most
/// `max_bytes` of capacity (`cap`) together. (The pool's rule, and the writer's for batch
/// buffers.)
pub(crate) fn keep_largest<T>(
    spare: &mut Vec<T>,
    max_items: usize,
    max_bytes: usize,
    cap: impl Fn(&T) -> usize,
) {
    loop {
        let total: usize = spare.iter().map(&cap).sum();
        if spare.len() <= max_items && total <= max_bytes {
            return;
        }
        let smallest = spare
            .iter()
            .enumerate()
            .min_by_key(|(_, b)| cap(b))
            .map(|(i, _)| i);
        match smallest {
            Some(i) => drop(spare.swap_remove(i)),
            None => return,
        }
    }
}

/// A bounded pool of reusable `Vec<u8>` buffers; see the module documentation.
#[derive(Debug)]
pub(crate) struct BufPool {
    free: Mutex<Vec<Vec<u8>>>,
    max_buffers: usize,
    max_buffer: usize,
    max_bytes: usize,
}

impl BufPool {
    /// A pool keeping at most `max_buffers` buffers, none larger than `max_buffer` bytes,
    /// at most `max_bytes` together.
    pub(crate) fn new(max_buffers: usize, max_buffer: usize, max_bytes: usize) -> Arc<Self> {
        Arc::new(BufPool {
            free: Mutex::new(Vec::new()),
            max_buffers,
            max_buffer,
            max_bytes,
        })
    }

    /// The pool for the consume path: 8 buffers of at most 17 MiB, 34 MiB in total.
    /// A fetch of 16 partitions at the default 1 MiB each answers a little over 16 MiB
    /// (the response's own fields on top), so the bound is 16 MiB plus room for those:
    /// at exactly 16 MiB, every such response was read into fresh memory.
    pub(crate) fn for_fetches() -> Arc<Self> {
        Self::new(8, FETCH_BUFFER_MAX, 2 * FETCH_BUFFER_MAX)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Vec<u8>>> {
        self.free
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// An empty buffer with room for at least `min` bytes: the smallest pooled buffer
    /// that is large enough, else a new one.
    pub(crate) fn take(&self, min: usize) -> Vec<u8> {
        self.take_or_new(min, min)
    }

    /// Like [`take`](Self::take), for buffers whose sizes vary a little from one use to
    /// the next (response frames): a new buffer of 1 MiB or more is rounded up to a whole
    /// MiB, so it also serves the next frame when that one is a few bytes larger. The
    /// extra room costs no memory until it is written.
    pub(crate) fn take_rounded(&self, min: usize) -> Vec<u8> {
        self.take_or_new(min, rounded(min))
    }

    fn take_or_new(&self, min: usize, new: usize) -> Vec<u8> {
        let found = {
            let mut free = self.lock();
            take_best_fit(&mut free, min, Vec::capacity)
        };
        match found {
            Some(mut b) => {
                b.clear();
                b
            }
            None => Vec::with_capacity(new),
        }
    }

    /// `buf` as [`Bytes`]; the buffer returns to this pool when the last slice of it is
    /// dropped. Contents of at most 256 KiB filling less than a quarter of a buffer of
    /// more than 8 KiB are copied out and the buffer goes back now: records are slices of
    /// it, so a small batch decompressed into a large buffer would pin all of it while
    /// they live.
    pub(crate) fn freeze(self: &Arc<Self>, buf: Vec<u8>) -> Bytes {
        if oversized(buf.len(), buf.capacity()) {
            let exact = Bytes::copy_from_slice(&buf);
            self.give_back(buf);
            return exact;
        }
        Bytes::from_owner(Pooled {
            buf,
            pool: Arc::downgrade(self),
        })
    }

    /// Keep `buf` for reuse if it fits the bounds; when the pool is full, the smallest
    /// buffer (pooled or this one) is the one freed.
    fn give_back(&self, buf: Vec<u8>) {
        let cap = buf.capacity();
        if cap == 0 || cap > self.max_buffer {
            return;
        }
        let mut free = self.lock();
        free.push(buf);
        keep_largest(&mut free, self.max_buffers, self.max_bytes, Vec::capacity);
    }

    /// The number of buffers kept and their total capacity.
    #[cfg(test)]
    pub(crate) fn kept(&self) -> (usize, usize) {
        let free = self.lock();
        (free.len(), free.iter().map(Vec::capacity).sum())
    }
}

/// The owner behind a pooled [`Bytes`]: gives its buffer back when dropped.
struct Pooled {
    buf: Vec<u8>,
    pool: Weak<BufPool>,
}

impl AsRef<[u8]> for Pooled {
    fn as_ref(&self) -> &[u8] {
        &self.buf
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        if let Some(pool) = self.pool.upgrade() {
            pool.give_back(std::mem::take(&mut self.buf));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_buffer_comes_back_when_its_last_slice_is_dropped_and_is_reused() {
        let pool = BufPool::new(4, 1 << 20, 4 << 20);
        let mut b = pool.take(1000);
        b.extend_from_slice(&[7u8; 1000]);
        let ptr = b.as_ptr();
        let bytes = pool.freeze(b);
        let slice = bytes.slice(10..20);
        drop(bytes);
        assert_eq!(pool.kept().0, 0, "a slice is still alive");
        assert_eq!(&slice[..], &[7u8; 10]);
        drop(slice);
        assert_eq!(pool.kept().0, 1);
        let again = pool.take(500);
        assert_eq!(again.as_ptr(), ptr, "the pooled buffer is reused");
        assert!(again.is_empty());
        assert_eq!(pool.kept().0, 0);
    }

    #[test]
    fn the_pool_stays_within_its_bounds() {
        let pool = BufPool::new(2, 1 << 20, 1536 << 10);
        // Larger than max_buffer: freed, not kept.
        drop(pool.freeze(Vec::with_capacity(2 << 20)));
        assert_eq!(pool.kept(), (0, 0));
        // Three buffers, room for two by count and 1.5 MiB by bytes: the smallest go.
        for cap in [100 << 10, 1 << 20, 512 << 10] {
            drop(pool.freeze(Vec::with_capacity(cap)));
        }
        let (n, bytes) = pool.kept();
        assert_eq!(n, 2);
        assert!(bytes <= 1536 << 10, "{bytes}");
        // Nothing pooled is large enough: a new buffer.
        assert!(pool.take(4 << 20).capacity() >= 4 << 20);
        assert_eq!(pool.kept().0, 2);
    }

    /// Records are slices of the buffer: a small payload in a large pooled buffer would pin
    /// all of it for as long as its records live.
    #[test]
    fn a_small_payload_in_a_large_buffer_is_copied_out_and_the_buffer_reused() {
        let pool = BufPool::new(4, 16 << 20, 32 << 20);
        drop(pool.freeze(Vec::with_capacity(16 << 20)));
        let mut small = pool.take(1000);
        assert!(small.capacity() >= 16 << 20, "the pooled buffer");
        small.extend_from_slice(&[5u8; 1000]);
        let frozen = pool.freeze(small);
        assert_eq!(&frozen[..], &[5u8; 1000]);
        assert_eq!(pool.kept().0, 1, "back in the pool while the payload lives");
        // A payload filling a good part of its buffer stays in it.
        let mut large = pool.take(8 << 20);
        large.resize(8 << 20, 1);
        let frozen = pool.freeze(large);
        assert_eq!(pool.kept().0, 0);
        drop(frozen);
        assert_eq!(pool.kept().0, 1);
    }

    /// A fetch response for 16 partitions of 1 MiB each is a little over 16 MiB (the
    /// response's own fields): the consume path's pool must keep such frames, and reuse
    /// one for the next response even when that one is a few bytes larger.
    #[test]
    fn full_responses_of_sixteen_one_mib_partitions_are_pooled_and_reused() {
        let pool = BufPool::for_fetches();
        let frame = (16 << 20) + 647;
        let mut a = pool.take_rounded(frame);
        a.resize(frame, 1);
        let mut b = pool.take_rounded(frame);
        b.resize(frame, 2);
        let (pa, pb) = (a.as_ptr(), b.as_ptr());
        drop((pool.freeze(a), pool.freeze(b)));
        assert_eq!(pool.kept().0, 2, "both frames are kept");
        let next = pool.take_rounded(frame + 1000);
        assert!(
            next.as_ptr() == pa || next.as_ptr() == pb,
            "a kept frame is reused"
        );
    }

    #[test]
    fn buffers_outliving_their_pool_are_freed() {
        let pool = BufPool::new(2, 1 << 20, 1 << 20);
        let bytes = pool.freeze(vec![1, 2, 3]);
        drop(pool);
        assert_eq!(&bytes[..], &[1, 2, 3]);
        drop(bytes);
    }
}
