//! `produce TOPIC`: stdin lines → records through a `Writer`.

use std::io::{BufRead, Write};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::SinkExt;
use kafkapipe::writer::{
    Balancer, Crc32, Message, Murmur2, RoundRobin, Sticky, Writer, WriterConfig,
};

use crate::settings::Settings;
use crate::shutdown::Shutdown;
use crate::{Fail, ProduceArgs};

/// Prints a summary line to stderr every `--stats` interval (two seconds by default): the
/// count and rate, and what the command adds (lag, errors, retries).
pub struct Progress {
    /// What the count is, e.g. "produced".
    pub what: &'static str,
    start: Instant,
    last: Instant,
    /// Between summary lines; `None` prints none.
    every: Option<Duration>,
    /// Records so far.
    pub count: u64,
}

impl Progress {
    /// Start counting `what` (e.g. "produced") now, printing a line every `every`.
    pub fn new(what: &'static str, every: Option<Duration>) -> Self {
        let now = Instant::now();
        Progress {
            what,
            start: now,
            last: now,
            every,
            count: 0,
        }
    }

    /// Count `n` more records; print the summary line if it is due.
    pub fn add(&mut self, n: u64) {
        self.add_with(n, String::new);
    }

    /// Count `n` more records; print the summary line, followed by `detail()`, if it is
    /// due.
    pub fn add_with(&mut self, n: u64, detail: impl FnOnce() -> String) {
        self.count += n;
        if self.every.is_some_and(|every| self.last.elapsed() >= every) {
            self.last = Instant::now();
            let detail = detail();
            let sep = if detail.is_empty() { "" } else { ", " };
            let _ = writeln!(std::io::stderr(), "% {}{sep}{detail}", self.line());
        }
    }

    /// "WHAT N records in S s (R records/s)".
    pub fn line(&self) -> String {
        let secs = self.start.elapsed().as_secs_f64();
        format!(
            "{} {} records in {:.1}s ({:.0} records/s)",
            self.what,
            self.count,
            secs,
            self.count as f64 / secs.max(1e-3)
        )
    }
}

/// After SIGINT/SIGTERM, how long the records already read may still take to be
/// acknowledged before the command gives up on them.
const STOP_GRACE: Duration = Duration::from_secs(3);

/// Run `produce`: stdin lines to records until EOF or SIGINT/SIGTERM. Succeeds only if
/// every record read was acknowledged; after a signal, what is not acknowledged within
/// [`STOP_GRACE`] is given up and counted.
pub async fn run(brokers: &[String], settings: &Settings, args: &ProduceArgs) -> Result<(), Fail> {
    let mut headers = Vec::new();
    for h in &args.headers {
        let (k, v) = h
            .split_once('=')
            .ok_or_else(|| Fail::Usage(format!("-H wants KEY=VALUE, got {h:?}")))?;
        headers.push((k.to_string(), Bytes::from(v.to_string())));
    }
    let mut config =
        settings.writer(WriterConfig::new(brokers.to_vec()).topic(args.topic.as_str()));
    if let Some(z) = args.compression {
        config = config.compression(z);
    }
    if let Some(a) = args.acks {
        config = config.required_acks(a);
    }
    config = args.partitioner.apply(config);
    let mut shutdown = Shutdown::install().map_err(|e| Fail::Run(format!("signals: {e}")))?;
    let mut writer = Writer::new(config)?;

    // stdin is read on its own thread (blocking reads), line by line.
    let (tx, mut rx) = tokio::sync::mpsc::channel::<std::io::Result<Vec<u8>>>(4096);
    std::thread::spawn(move || {
        let stdin = std::io::stdin();
        let mut input = stdin.lock();
        loop {
            let mut line = Vec::new();
            match input.read_until(b'\n', &mut line) {
                Ok(0) => return,
                Ok(_) => {
                    if tx.blocking_send(Ok(line)).is_err() {
                        return;
                    }
                }
                Err(e) => {
                    let _ = tx.blocking_send(Err(e));
                    return;
                }
            }
        }
    });

    // Every line read from stdin counts, handed to the writer or not.
    let mut progress = Progress::new("read", args.stats.every());
    let mut failure: Option<String> = None;
    'read: loop {
        let line = tokio::select! {
            biased;
            _ = shutdown.wait() => break 'read,
            l = rx.recv() => l,
        };
        let Some(line) = line else {
            if progress.count > writer.stats().messages {
                eprintln!(
                    "% end of input: {} records read, waiting for their delivery",
                    progress.count
                );
            }
            break;
        };
        let msg = match line {
            Ok(line) => to_message(line, args, &headers),
            Err(e) => {
                failure = Some(format!("reading stdin: {e}"));
                break;
            }
        };
        progress.add_with(1, || {
            let s = writer.stats();
            format!(
                "{} delivered, {} queued, {} errors, {} retries",
                s.messages, s.queued_messages, s.errors, s.retries
            )
        });
        // `feed` waits for buffer space (a signal ends the wait; the record is then
        // dropped unsent) and fails early once a record failed for good.
        tokio::select! {
            biased;
            _ = shutdown.wait() => break 'read,
            r = writer.feed(msg) => if let Err(e) = r {
                failure = Some(e.to_string());
                break 'read;
            },
        }
    }
    if shutdown.requested() {
        // Lines the stdin thread read ahead were read too.
        while let Ok(Ok(_)) = rx.try_recv() {
            progress.add(1);
        }
    }
    // Deliver what was accepted: until done, unless a signal comes; then (or if it had
    // come) for STOP_GRACE at most.
    let flushed = if shutdown.requested() {
        tokio::time::timeout(STOP_GRACE, writer.flush()).await.ok()
    } else {
        let done = tokio::select! {
            biased;
            r = writer.flush() => Some(r),
            _ = shutdown.wait() => None,
        };
        match done {
            Some(r) => Some(r),
            None => tokio::time::timeout(STOP_GRACE, writer.flush()).await.ok(),
        }
    };
    if let Some(Err(e)) = &flushed {
        failure.get_or_insert_with(|| e.to_string());
    }
    let read = progress.count;
    let delivered = writer.stats().messages;
    let how = if shutdown.requested() {
        " (stopped by signal)"
    } else {
        ""
    };
    if flushed.is_some() && failure.is_none() && delivered >= read {
        writer.close().await?;
        progress.count = delivered;
        progress.what = "produced";
        eprintln!("% {} to {}{how}", progress.line(), args.topic);
        return Ok(());
    }
    // Not everything was acknowledged: say how much, and exit without waiting further
    // (dropping the writer; the runtime's shutdown ends its task).
    let lost = read.saturating_sub(delivered);
    let why = failure.unwrap_or_else(|| {
        format!(
            "not acknowledged within {}s of the signal",
            STOP_GRACE.as_secs()
        )
    });
    eprintln!(
        "% {delivered} records produced to {}, {lost} not delivered{how}",
        args.topic
    );
    drop(writer);
    Err(Fail::Run(format!(
        "{lost} of {read} records read from stdin were not delivered: {why}"
    )))
}

fn to_message(mut line: Vec<u8>, args: &ProduceArgs, headers: &[(String, Bytes)]) -> Message {
    if line.last() == Some(&b'\n') {
        line.pop();
        if line.last() == Some(&b'\r') {
            line.pop();
        }
    }
    let line = Bytes::from(line);
    let split = args.key_delimiter.as_deref().and_then(|sep| {
        let sep = sep.as_bytes();
        (!sep.is_empty())
            .then(|| line.windows(sep.len()).position(|w| w == sep))
            .flatten()
            .map(|i| (line.slice(..i), line.slice(i + sep.len()..)))
    });
    let mut msg = match split {
        Some((k, v)) => Message::keyed(k, v),
        None => Message::new(line),
    };
    if let Some(p) = args.partition {
        msg = msg.with_partition(p);
    }
    for (k, v) in headers {
        msg = msg.with_header(k.clone(), v.clone());
    }
    msg
}

/// `--partitioner`: where records without `-p` go, by librdkafka's `partitioner` names
/// (CONFIGURATION.md) plus `sticky` and `round_robin`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Partitioner {
    /// Keys by murmur2 (the Java client's partition), keyless records one partition at a
    /// time (the Java client's default; librdkafka `murmur2_random` with its default
    /// `sticky.partitioning.linger.ms`). The library's default, `Sticky`.
    Sticky,
    /// Keys by murmur2; keyless records hashed as an empty key (all to one partition).
    Murmur2,
    /// Keys by CRC32 (librdkafka's default); keyless records one partition at a time,
    /// empty keys round robin (librdkafka: both sticky).
    ConsistentRandom,
    /// Keys by CRC32; keyless and empty-key records all to one partition.
    Consistent,
    /// Every record to a random partition.
    Random,
    /// Every record to the next partition in turn, keys ignored (kafka-go's default).
    RoundRobin,
}

/// Parse a `--partitioner` name.
pub fn parse_partitioner(v: &str) -> Result<Partitioner, String> {
    Ok(match v {
        "sticky" | "murmur2_random" => Partitioner::Sticky,
        "murmur2" => Partitioner::Murmur2,
        "consistent_random" => Partitioner::ConsistentRandom,
        "consistent" => Partitioner::Consistent,
        "random" => Partitioner::Random,
        "round_robin" => Partitioner::RoundRobin,
        _ => {
            return Err(format!(
                "partitioner: expected sticky, murmur2_random, murmur2, consistent_random, \
                 consistent, random or round_robin, got {v:?}"
            ))
        }
    })
}

impl Partitioner {
    /// `config` with this placement as its balancer.
    fn apply(self, config: WriterConfig) -> WriterConfig {
        match self {
            Partitioner::Sticky => config.balancer(Sticky::new()),
            Partitioner::Murmur2 => config.balancer(Murmur2::consistent()),
            Partitioner::ConsistentRandom => config.balancer(Sticky::new().keys(Crc32::default())),
            Partitioner::Consistent => config.balancer(Crc32::consistent()),
            Partitioner::Random => config.balancer(Random::new()),
            Partitioner::RoundRobin => config.balancer(RoundRobin::default()),
        }
    }
}

/// librdkafka's `random` partitioner: each record to a partition picked at random.
struct Random(std::sync::atomic::AtomicU64);

impl Random {
    fn new() -> Self {
        use std::hash::{BuildHasher, Hasher};
        // A random seed without a random number crate: std's per-process hash keys.
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u8(0);
        Random(std::sync::atomic::AtomicU64::new(h.finish() | 1))
    }
}

impl Balancer for Random {
    fn partition(&self, _msg: &Message, partitions: &[i32]) -> i32 {
        use std::sync::atomic::Ordering;
        // splitmix64 over an atomic counter: lock-free, and every call a fresh number.
        let mut z = self
            .0
            .fetch_add(0x9e37_79b9_7f4a_7c15, Ordering::Relaxed)
            .wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        let n = partitions.len().max(1) as u64;
        partitions
            .get(usize::try_from(z % n).unwrap_or(0))
            .copied()
            .unwrap_or(0)
    }
}
