//! Partition balancers: which partition a message without an explicit partition goes to.
//!
//! Each balancer reproduces the partition choice of a well-known client, so that a
//! kafkapipe writer and that client send the same key to the same partition:
//!
//! | balancer | same partition as |
//! | --- | --- |
//! | [`RoundRobin`] | kafka-go `RoundRobin` (kafka-go's default; keys ignored) |
//! | [`LeastBytes`] | kafka-go `LeastBytes` |
//! | [`Hash`] | kafka-go `Hash` and Sarama's hash partitioner (FNV-1a) |
//! | [`ReferenceHash`] | kafka-go `ReferenceHash` and Sarama's reference hash partitioner |
//! | [`Crc32`] | librdkafka `consistent_random` (or `consistent`) |
//! | [`Murmur2`] | the Java client's default partitioner for keyed messages, librdkafka `murmur2_random` |
//! | [`Sticky`] | the Java client's default partitioner (keys as [`Murmur2`], messages without a key sticky); the writer's default |
//!
//! Where the reference client picks a *random* partition for messages without a key,
//! these balancers use round robin instead (no random number generator dependency; the
//! distribution is as even), except [`Sticky`], which sends such messages to one
//! partition at a time.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;

use super::Message;
use crate::record::crc32::crc32;

/// Chooses a partition for a message.
///
/// `partitions` is the topic's partition ids, sorted ascending and never empty; the
/// returned id must be one of them. Implementations must be cheap and thread safe: the
/// writer calls `partition` once per message without an explicit partition.
///
/// ```
/// use kafkapipe::writer::{Balancer, Message};
///
/// /// Everything to the last partition.
/// struct Last;
/// impl Balancer for Last {
///     fn partition(&self, _msg: &Message, partitions: &[i32]) -> i32 {
///         partitions[partitions.len() - 1]
///     }
/// }
/// assert_eq!(Last.partition(&Message::new("v"), &[0, 1, 2]), 2);
/// ```
pub trait Balancer: Send + Sync + 'static {
    /// The partition (an element of `partitions`) for `msg`.
    fn partition(&self, msg: &Message, partitions: &[i32]) -> i32;
}

fn pick(partitions: &[i32], index: u64) -> i32 {
    let n = partitions.len().max(1) as u64;
    partitions
        .get(usize::try_from(index % n).unwrap_or(0))
        .copied()
        .unwrap_or(0)
}

/// Spreads messages evenly, one partition after the other (kafka-go `RoundRobin`).
///
/// ```
/// use kafkapipe::writer::{Balancer, Message, RoundRobin};
/// let rr = RoundRobin::default();
/// let m = Message::new("v");
/// let picks: Vec<i32> = (0..4).map(|_| rr.partition(&m, &[0, 1, 2])).collect();
/// assert_eq!(picks, [0, 1, 2, 0]);
/// ```
#[derive(Debug, Default)]
pub struct RoundRobin {
    next: AtomicU32,
}

impl Balancer for RoundRobin {
    fn partition(&self, _msg: &Message, partitions: &[i32]) -> i32 {
        pick(
            partitions,
            u64::from(self.next.fetch_add(1, Ordering::Relaxed)),
        )
    }
}

/// Sends each message to the partition that has received the fewest key+value bytes
/// from this balancer so far (kafka-go `LeastBytes`; ties go to the lowest id). The
/// counters restart when the number of partitions changes.
///
/// ```
/// use kafkapipe::writer::{Balancer, LeastBytes, Message};
/// let lb = LeastBytes::default();
/// assert_eq!(lb.partition(&Message::new("a long value"), &[0, 1]), 0);
/// assert_eq!(lb.partition(&Message::new("x"), &[0, 1]), 1);
/// assert_eq!(lb.partition(&Message::new("y"), &[0, 1]), 1);
/// ```
#[derive(Debug, Default)]
pub struct LeastBytes {
    counters: Mutex<Vec<(i32, u64)>>,
}

impl Balancer for LeastBytes {
    fn partition(&self, msg: &Message, partitions: &[i32]) -> i32 {
        let mut counters = self
            .counters
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if counters.len() != partitions.len() {
            *counters = partitions.iter().map(|p| (*p, 0)).collect();
            counters.sort_unstable();
        }
        let size = (msg.key.as_ref().map_or(0, |k| k.len())
            + msg.value.as_ref().map_or(0, |v| v.len())) as u64;
        let mut best: Option<&mut (i32, u64)> = None;
        for c in counters.iter_mut() {
            if best.as_ref().is_none_or(|b| c.1 < b.1) {
                best = Some(c);
            }
        }
        match best {
            Some(c) => {
                c.1 = c.1.saturating_add(size);
                c.0
            }
            None => pick(partitions, 0),
        }
    }
}

/// FNV-1a, 32 bit.
pub(crate) fn fnv1a32(data: &[u8]) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for &b in data {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h
}

/// Java's `Utils.murmur2` (seed `0x9747b28c`), as used by the Java client's default
/// partitioner.
pub(crate) fn murmur2(data: &[u8]) -> u32 {
    const SEED: u32 = 0x9747_b28c;
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;
    let len = data.len();
    // Java hashes an `int` length; keys are far below 2^31 bytes.
    let mut h = SEED ^ (len as u32);
    let mut chunks = data.chunks_exact(4);
    for c in &mut chunks {
        let mut k = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    let rest = chunks.remainder();
    if rest.len() >= 3 {
        h ^= u32::from(rest[2]) << 16;
    }
    if rest.len() >= 2 {
        h ^= u32::from(rest[1]) << 8;
    }
    if let Some(&b) = rest.first() {
        h ^= u32::from(b);
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h
}

/// Hashes the key with FNV-1a and takes `|int32(hash) % n|` — kafka-go's `Hash` and
/// Sarama's default hash partitioner. Messages without a key go round robin.
///
/// ```
/// use kafkapipe::writer::{Balancer, Hash, Message};
/// let p: Vec<i32> = (0..16).collect();
/// // kafka-go's test vector: the hash of "20" has its top bit set.
/// assert_eq!(Hash::default().partition(&Message::keyed("20", "v"), &p), 1);
/// ```
#[derive(Debug, Default)]
pub struct Hash {
    rr: RoundRobin,
}

impl Balancer for Hash {
    fn partition(&self, msg: &Message, partitions: &[i32]) -> i32 {
        let Some(key) = &msg.key else {
            return self.rr.partition(msg, partitions);
        };
        let n = i64::try_from(partitions.len()).unwrap_or(1).max(1);
        // Reinterpret as signed, as Go's int32() conversion does.
        let h = i64::from(fnv1a32(key) as i32);
        pick(partitions, (h % n).unsigned_abs())
    }
}

/// Hashes the key with FNV-1a and takes `(int32(hash) & 0x7fffffff) % n` — kafka-go's
/// `ReferenceHash` and Sarama's reference hash partitioner. Messages without a key go
/// round robin (kafka-go picks a random partition).
///
/// ```
/// use kafkapipe::writer::{Balancer, Message, ReferenceHash};
/// let p: Vec<i32> = (0..8).collect();
/// assert_eq!(ReferenceHash::default().partition(&Message::keyed("hello world", "v"), &p), 7);
/// ```
#[derive(Debug, Default)]
pub struct ReferenceHash {
    rr: RoundRobin,
}

impl Balancer for ReferenceHash {
    fn partition(&self, msg: &Message, partitions: &[i32]) -> i32 {
        let Some(key) = &msg.key else {
            return self.rr.partition(msg, partitions);
        };
        pick(partitions, u64::from(fnv1a32(key) & 0x7fff_ffff))
    }
}

/// CRC-32 (IEEE) of the key modulo the partition count — librdkafka's `consistent_random`
/// partitioner (the confluent-kafka default), or `consistent` when
/// [`Crc32::consistent`] is set. Like librdkafka, a missing and an empty key are the same;
/// without `consistent` such messages go round robin (librdkafka: random).
///
/// ```
/// use kafkapipe::writer::{Balancer, Crc32, Message};
/// let p: Vec<i32> = (0..17).map(|i| i * i).collect();
/// // librdkafka's test vector (tests/0048-partitioner.c).
/// assert_eq!(Crc32::default().partition(&Message::keyed("hejsan", "v"), &p), p[0xd077037e % 17]);
/// ```
#[derive(Debug, Default)]
pub struct Crc32 {
    consistent: bool,
    rr: RoundRobin,
}

impl Crc32 {
    /// Hash missing and empty keys too (all to one partition), like librdkafka's
    /// `consistent` partitioner.
    pub fn consistent() -> Self {
        Crc32 {
            consistent: true,
            rr: RoundRobin::default(),
        }
    }
}

impl Balancer for Crc32 {
    fn partition(&self, msg: &Message, partitions: &[i32]) -> i32 {
        let key = msg.key.as_deref().unwrap_or_default();
        if key.is_empty() && !self.consistent {
            return self.rr.partition(msg, partitions);
        }
        pick(partitions, u64::from(crc32(key)))
    }
}

/// `toPositive(murmur2(key)) % n` — the Java client's default partitioner for keyed
/// messages (and librdkafka's `murmur2_random`). Without [`Murmur2::consistent`], messages
/// without a key go round robin (Java: sticky/round robin, librdkafka: random); an empty
/// key is a key and is hashed.
///
/// ```
/// use kafkapipe::writer::{Balancer, Message, Murmur2};
/// let p: Vec<i32> = (0..1000).collect();
/// // kafka-python's test vector (test/test_partitioner.py).
/// assert_eq!(Murmur2::default().partition(&Message::keyed("123456789", "v"), &p), 566);
/// ```
#[derive(Debug, Default)]
pub struct Murmur2 {
    consistent: bool,
    rr: RoundRobin,
}

impl Murmur2 {
    /// Hash messages without a key as if their key were empty (librdkafka `murmur2`).
    pub fn consistent() -> Self {
        Murmur2 {
            consistent: true,
            rr: RoundRobin::default(),
        }
    }
}

impl Balancer for Murmur2 {
    fn partition(&self, msg: &Message, partitions: &[i32]) -> i32 {
        let key = match &msg.key {
            Some(k) => k.as_ref(),
            None if self.consistent => &[],
            None => return self.rr.partition(msg, partitions),
        };
        pick(partitions, u64::from(murmur2(key) & 0x7fff_ffff))
    }
}

/// Messages without a key go to one partition until [`Sticky::switch_bytes`] of them
/// (by [`Message::size`]) have gone there, then to another partition picked at random;
/// keyed messages go where the key balancer says ([`Murmur2`] unless [`Sticky::keys`]
/// chooses another). This is the Java client's default partitioner (KIP-480, KIP-794
/// without its adaptive weighting) and how librdkafka (`sticky.partitioning.linger.ms`)
/// and franz-go place unkeyed messages.
///
/// Round robin over many partitions fills every partition's batch a message at a time:
/// with 100 partitions, 100 small batches and a large produce request per linger. Sticky
/// placement fills one batch at a time, so each request carries a few full batches; the
/// partitions still even out over many switches. Keep `switch_bytes` near the writer's
/// `batch_bytes` (or its `batch_size` messages, whichever seals a batch first). Each topic
/// has its own current partition.
///
/// ```
/// use kafkapipe::writer::{Balancer, Message, Sticky};
/// let sticky = Sticky::new().switch_bytes(1000);
/// let p: Vec<i32> = (0..8).collect();
/// let m = Message::new(vec![0u8; 79]); // 100 bytes by Message::size
/// let first = sticky.partition(&m, &p);
/// // ten messages (1000 bytes) to the first partition, then another one
/// assert!((1..10).all(|_| sticky.partition(&m, &p) == first));
/// assert_ne!(sticky.partition(&m, &p), first);
/// // keyed messages: where the Java client sends them
/// assert_eq!(sticky.partition(&Message::keyed("123456789", "v"), &(0..1000).collect::<Vec<_>>()), 566);
/// ```
pub struct Sticky {
    keys: Box<dyn Balancer>,
    switch_bytes: usize,
    state: Mutex<StickyState>,
}

#[derive(Debug)]
struct StickyState {
    /// Per topic (`None`: the writer's own): the current partition and its bytes so far.
    topics: Vec<(Option<String>, StickyTo)>,
    /// xorshift64* state for the next pick.
    rng: u64,
}

impl StickyState {
    /// The next pseudo-random number (xorshift64*).
    fn random(&mut self) -> u64 {
        let mut x = self.rng;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A partition of `partitions` picked at random, other than the one at index `skip`
    /// when there is another.
    fn pick_other(&mut self, partitions: &[i32], skip: Option<usize>) -> i32 {
        let n = partitions.len() as u64;
        match skip {
            Some(skip) if n > 1 => {
                let i = self.random() % (n - 1);
                pick(partitions, if i >= skip as u64 { i + 1 } else { i })
            }
            _ => pick(partitions, self.random()),
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct StickyTo {
    partition: i32,
    bytes: usize,
}

impl std::fmt::Debug for Sticky {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sticky")
            .field("switch_bytes", &self.switch_bytes)
            .finish_non_exhaustive()
    }
}

impl Default for Sticky {
    fn default() -> Self {
        Self::new()
    }
}

impl Sticky {
    /// The bytes sent to one partition before switching when none are set: the writer's
    /// default `batch_bytes` (1 MiB).
    pub const DEFAULT_SWITCH_BYTES: usize = 1 << 20;

    /// Keys by [`Murmur2`], switching after [`Sticky::DEFAULT_SWITCH_BYTES`].
    pub fn new() -> Self {
        use std::hash::{BuildHasher, Hasher};
        // A random seed without a random number crate: std's per-process hash keys.
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u8(0);
        Sticky {
            keys: Box::new(Murmur2::default()),
            switch_bytes: Self::DEFAULT_SWITCH_BYTES,
            state: Mutex::new(StickyState {
                topics: Vec::new(),
                rng: h.finish() | 1,
            }),
        }
    }

    /// Switch partitions once `bytes` (at least 1) of messages without a key went to the
    /// current one.
    pub fn switch_bytes(mut self, bytes: usize) -> Self {
        self.switch_bytes = bytes.max(1);
        self
    }

    /// Place keyed messages with `balancer` (for example [`Hash`](struct@Hash), kafka-go's
    /// choice) instead of [`Murmur2`].
    pub fn keys(mut self, balancer: impl Balancer) -> Self {
        self.keys = Box::new(balancer);
        self
    }
}

impl Balancer for Sticky {
    fn partition(&self, msg: &Message, partitions: &[i32]) -> i32 {
        if msg.key.is_some() {
            return self.keys.partition(msg, partitions);
        }
        let mut state = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let at = match state.topics.iter().position(|(t, _)| *t == msg.topic) {
            Some(at) => at,
            None => {
                let partition = state.pick_other(partitions, None);
                state.topics.push((
                    msg.topic.clone(),
                    StickyTo {
                        partition,
                        bytes: 0,
                    },
                ));
                state.topics.len() - 1
            }
        };
        let to = state.topics[at].1;
        // A partition no longer in the list is left at once, for any other.
        let here = partitions.binary_search(&to.partition).ok();
        let to = if here.is_none() || to.bytes >= self.switch_bytes {
            StickyTo {
                partition: state.pick_other(partitions, here),
                bytes: 0,
            }
        } else {
            to
        };
        state.topics[at].1 = StickyTo {
            bytes: to.bytes.saturating_add(msg.size()),
            ..to
        };
        to.partition
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keyed(k: &[u8]) -> Message {
        Message::keyed(k.to_vec(), "v")
    }

    #[test]
    fn murmur2_matches_java_utils_test() {
        // org.apache.kafka.common.utils.UtilsTest#testMurmur2
        let cases: [(&[u8], i32); 6] = [
            (b"21", -973932308),
            (b"foobar", -790332482),
            (b"a-little-bit-long-string", -985981536),
            (b"a-little-bit-longer-string", -1486304829),
            (
                b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8",
                -58897971,
            ),
            (b"abc", 479470107),
        ];
        for (k, want) in cases {
            assert_eq!(murmur2(k) as i32, want, "{k:?}");
        }
    }

    #[test]
    fn murmur2_matches_librdkafka_vectors() {
        // librdkafka src/rdmurmur2.c unit test, as quoted by kafka-go's balancer_test.go.
        let cases: [(&[u8], u32); 11] = [
            (b"kafka", 0xd067cf64),
            (b"giberish123456789", 0x8f552b0c),
            (b"1234", 0x9fc97b14),
            (b"234", 0xe7c009ca),
            (b"34", 0x873930da),
            (b"4", 0x5a4b5ca1),
            (b"PreAmbleWillBeRemoved,ThePrePartThatIs", 0x78424f1c),
            (b"reAmbleWillBeRemoved,ThePrePartThatIs", 0x4a62b377),
            (b"eAmbleWillBeRemoved,ThePrePartThatIs", 0xe0e4e09e),
            (b"AmbleWillBeRemoved,ThePrePartThatIs", 0x62b8b43f),
            (b"", 0x106e08d9),
        ];
        for (k, want) in cases {
            assert_eq!(murmur2(k), want, "{k:?}");
        }
    }

    #[test]
    fn murmur2_balancer_matches_librdkafka_and_kafka_python() {
        let squares: Vec<i32> = (0..17).map(|i| i * i).collect();
        let b = Murmur2::default();
        for (k, h) in [
            (&b""[..], 0x106e08d9u32),
            (b"23456", 0x058d780f),
            (
                b"this is another string with more length to it perhaps",
                0x4f7703da,
            ),
            (b"hejsan", 0x5ec19395),
        ] {
            assert_eq!(
                b.partition(&keyed(k), &squares),
                squares[(h % 17) as usize],
                "{k:?}"
            );
        }
        let thousand: Vec<i32> = (0..1000).collect();
        for (k, want) in [
            (&b""[..], 681),
            (b"a", 524),
            (b"ab", 434),
            (b"abc", 107),
            (b"123456789", 566),
            (b"\x00 ", 742),
        ] {
            assert_eq!(b.partition(&keyed(k), &thousand), want, "{k:?}");
        }
    }

    #[test]
    fn murmur2_values_match_kafka_python() {
        // kafka.partitioner.default.murmur2, computed with kafka-python 2.x.
        for (k, want) in [
            (&b"kafka"[..], 3496464228u32),
            (b"hello", 2132663229),
            (b"hello world", 1221641059),
            (b"key-0", 29210041),
            (b"\xff\x00\x80", 3324477906),
        ] {
            assert_eq!(murmur2(k), want, "{k:?}");
        }
    }

    #[test]
    fn crc32_balancer_matches_librdkafka() {
        // librdkafka tests/0048-partitioner.c, as quoted by kafka-go's balancer_test.go.
        let p: Vec<i32> = (0..17).map(|i| i * i).collect();
        let b = Crc32::default();
        for (k, h) in [
            (&b"23456"[..], 0xb1b451d7u32),
            (
                b"this is another string with more length to it perhaps",
                0xb0150df7,
            ),
            (b"hejsan", 0xd077037e),
        ] {
            assert_eq!(b.partition(&keyed(k), &p), p[(h % 17) as usize], "{k:?}");
        }
        let c = Crc32::consistent();
        let first = c.partition(&Message::new("v"), &p);
        assert_eq!(first, p[0], "crc32 of nothing is 0");
        assert_eq!(c.partition(&keyed(b""), &p), first);
    }

    #[test]
    fn hash_matches_kafka_go() {
        // kafka-go balancer_test.go TestHashBalancer.
        let h = Hash::default();
        assert_eq!(h.partition(&keyed(b"blah"), &[0, 1]), 0);
        assert_eq!(h.partition(&keyed(b"blah"), &[0, 1, 2]), 1);
        assert_eq!(h.partition(&keyed(b"boop"), &[0, 1, 2]), 2);
        let sixteen: Vec<i32> = (0..16).collect();
        assert_eq!(h.partition(&keyed(b"20"), &sixteen), 1);
        // Without a key: round robin.
        assert_eq!(h.partition(&Message::new("v"), &[0, 1, 2]), 0);
        assert_eq!(h.partition(&Message::new("v"), &[0, 1, 2]), 1);
    }

    #[test]
    fn fnv1a_and_reference_hash() {
        // FNV-1a 32 reference values (offset basis for the empty input).
        assert_eq!(fnv1a32(b""), 0x811c9dc5);
        assert_eq!(fnv1a32(b"a"), 0xe40c292c);
        assert_eq!(fnv1a32(b"foobar"), 0xbf9cf968);
        let r = ReferenceHash::default();
        let eight: Vec<i32> = (0..8).collect();
        // Hash and ReferenceHash differ exactly when the hash has its top bit set.
        assert_eq!(r.partition(&keyed(b"hello world"), &eight), 7);
        assert_eq!(Hash::default().partition(&keyed(b"hello world"), &eight), 1);
        assert_eq!(r.partition(&keyed(b"kafka"), &eight), 1);
    }

    #[test]
    fn least_bytes_matches_kafka_go() {
        let lb = LeastBytes::default();
        let mut last = -1;
        for k in [&b"a"[..], b"ab", b"abc", b"abcd"] {
            last = lb.partition(&Message::default().with_key(k.to_vec()), &[0, 1, 2]);
        }
        assert_eq!(last, 0);
        let lb = LeastBytes::default();
        for (i, ps) in [&[0, 1][..], &[0, 1], &[0, 1, 2]].into_iter().enumerate() {
            last = lb.partition(
                &Message::default().with_key(format!("hello world {}", i + 1)),
                ps,
            );
        }
        assert_eq!(last, 0, "partition gained resets the counters");
    }

    #[test]
    fn explicit_lists_are_respected() {
        let p = [3, 5, 9];
        for b in [
            &RoundRobin::default() as &dyn Balancer,
            &LeastBytes::default(),
            &Hash::default(),
            &ReferenceHash::default(),
            &Crc32::default(),
            &Murmur2::default(),
        ] {
            for i in 0..20 {
                let got = b.partition(&keyed(format!("k{i}").as_bytes()), &p);
                assert!(p.contains(&got), "{got}");
            }
        }
    }

    fn unkeyed(topic: Option<&str>, len: usize) -> Message {
        let mut m = Message::new(vec![0u8; len]);
        m.topic = topic.map(str::to_string);
        m
    }

    /// Unkeyed messages stay on a partition for `switch_bytes` (by `Message::size`), then
    /// move to a different one; over many switches every partition gets its share.
    #[test]
    fn sticky_switches_after_its_bytes_and_evens_out() {
        let parts: Vec<i32> = (0..10).collect();
        let sticky = Sticky::new().switch_bytes(10 * 100);
        let m = unkeyed(None, 100 - 21); // 100 bytes by Message::size
        assert_eq!(m.size(), 100);
        let mut counts = [0usize; 10];
        let mut runs = Vec::new();
        let mut last = None;
        for _ in 0..100_000 {
            let p = sticky.partition(&m, &parts);
            counts[p as usize] += 1;
            match last {
                Some((q, n)) if q == p => last = Some((q, n + 1)),
                Some(run) => {
                    runs.push(run);
                    last = Some((p, 1));
                }
                None => last = Some((p, 1)),
            }
        }
        assert!(
            runs.iter().all(|(_, n)| *n == 10),
            "every run is 10 messages"
        );
        // 10 000 runs over 10 partitions: each gets about 1 000 of them
        for (p, c) in counts.iter().enumerate() {
            assert!((8_000..12_000).contains(c), "partition {p}: {c} of 100 000");
        }
    }

    #[test]
    fn sticky_keeps_keys_where_the_key_balancer_puts_them() {
        let parts: Vec<i32> = (0..1000).collect();
        let sticky = Sticky::new().switch_bytes(1);
        for _ in 0..3 {
            assert_eq!(sticky.partition(&keyed(b"123456789"), &parts), 566);
        }
        let hashed = Sticky::new().keys(Hash::default());
        let p16: Vec<i32> = (0..16).collect();
        assert_eq!(hashed.partition(&keyed(b"20"), &p16), 1);
    }

    /// Each topic has its own current partition, and a partition that is no longer in the
    /// list is left at once.
    #[test]
    fn sticky_per_topic_and_follows_the_partition_list() {
        let sticky = Sticky::new();
        let all: Vec<i32> = (0..50).collect();
        let a = sticky.partition(&unkeyed(Some("a"), 10), &all);
        let picks: Vec<i32> = (0..20)
            .map(|_| sticky.partition(&unkeyed(Some("b"), 10), &all))
            .collect();
        assert!(picks.iter().all(|p| *p == picks[0]));
        assert_eq!(sticky.partition(&unkeyed(Some("a"), 10), &all), a);
        let without: Vec<i32> = all.iter().copied().filter(|p| *p != a).collect();
        let moved = sticky.partition(&unkeyed(Some("a"), 10), &without);
        assert!(moved != a && without.contains(&moved));
        // a single partition: always it
        assert_eq!(sticky.partition(&unkeyed(None, 10), &[7]), 7);
        let one = Sticky::new().switch_bytes(1);
        assert!((0..5).all(|_| one.partition(&unkeyed(None, 10), &[3]) == 3));
    }
}
