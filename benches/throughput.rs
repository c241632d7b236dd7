//! Producer throughput against a running broker:
//!
//! ```text
//! KAFKAPIPE_BENCH_BROKER=127.0.0.1:9092 cargo bench --bench throughput
//! ```
//!
//! Starts nothing itself (`scripts/bench.sh` starts Apache Kafka and runs this). Creates a fresh
//! topic, writes N unkeyed messages of S bytes through a `Writer` with
//! `stream.forward(writer)`, closes the writer (so every message is acknowledged) and prints
//! one JSON line: `{client, msgs, size, bytes, secs, msgs_per_sec, mb_per_sec, cpu_secs, …}`.
//!
//! Knobs (environment): `KAFKAPIPE_BENCH_MSGS` (default 1000000), `KAFKAPIPE_BENCH_SIZE`
//! (value bytes, default 100), `KAFKAPIPE_BENCH_PARTITIONS` (default 8),
//! `KAFKAPIPE_BENCH_BATCH` (batch_size, default 1000), `KAFKAPIPE_BENCH_COMPRESSION`
//! (none|gzip|snappy|lz4|zstd, default none), `KAFKAPIPE_BENCH_ACKS` (0|1|all, default all),
//! `KAFKAPIPE_BENCH_IDEMPOTENT` (1 to enable, default off).
//! Without `KAFKAPIPE_BENCH_BROKER` it prints a note and exits successfully, so
//! `cargo test --all-targets` can build and run it harmlessly.

use std::time::Instant;

use bytes::Bytes;
use futures::{stream, SinkExt, StreamExt};
use kafkapipe::compression::Compression;
use kafkapipe::conn::{Conn, RequiredAcks};
use kafkapipe::writer::{Message, RoundRobin, Writer, WriterConfig};

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// User + system CPU seconds of this process so far (Linux `/proc/self/stat`, assuming
/// the usual 100 clock ticks per second), or `None` elsewhere.
fn cpu_secs() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) / 100.0)
}

fn main() -> kafkapipe::Result<()> {
    let Ok(broker) = std::env::var("KAFKAPIPE_BENCH_BROKER") else {
        eprintln!(
            "throughput bench skipped: set KAFKAPIPE_BENCH_BROKER=host:port (scripts/bench.sh does)"
        );
        return Ok(());
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| kafkapipe::Error::io("starting the Tokio runtime", e))?;
    runtime.block_on(run(broker))
}

async fn run(broker: String) -> kafkapipe::Result<()> {
    let msgs: usize = env_or("KAFKAPIPE_BENCH_MSGS", 1_000_000);
    let size: usize = env_or("KAFKAPIPE_BENCH_SIZE", 100);
    let partitions: i32 = env_or("KAFKAPIPE_BENCH_PARTITIONS", 8);
    let batch: usize = env_or("KAFKAPIPE_BENCH_BATCH", 1000);
    let compression: Compression = env_or("KAFKAPIPE_BENCH_COMPRESSION", Compression::None);
    let idempotent = std::env::var("KAFKAPIPE_BENCH_IDEMPOTENT").is_ok_and(|v| v == "1");
    let acks = match std::env::var("KAFKAPIPE_BENCH_ACKS").as_deref() {
        Ok("0") => RequiredAcks::None,
        Ok("1") => RequiredAcks::Leader,
        _ => RequiredAcks::All,
    };

    let topic = format!("bench-{}-{}", std::process::id(), msgs);
    let admin = Conn::connect(&broker).await?;
    admin.create_topic(&topic, partitions, 1).await?;
    admin.close().await;

    let mut writer = Writer::new(
        WriterConfig::new([broker.clone()])
            .topic(&topic)
            // every partition in turn, as measured so far (the default is now sticky)
            .balancer(RoundRobin::default())
            .batch_size(batch)
            .compression(compression)
            .required_acks(acks)
            .idempotent(idempotent),
    )?;
    let value = Bytes::from(vec![b'x'; size]);
    let cpu0 = cpu_secs();
    let started = Instant::now();
    stream::iter(0..msgs)
        .map(|_| Ok(Message::new(value.clone())))
        .forward(&mut writer)
        .await?;
    writer.close().await?;
    let secs = started.elapsed().as_secs_f64();
    let cpu = cpu_secs().zip(cpu0).map(|(b, a)| b - a);
    let stats = writer.stats();
    let bytes = msgs * size;
    println!(
        "{{\"client\":\"kafkapipe\",\"msgs\":{msgs},\"size\":{size},\"bytes\":{bytes},\"secs\":{secs:.3},\
         \"msgs_per_sec\":{:.0},\"mb_per_sec\":{:.2},\"cpu_secs\":{},\"partitions\":{partitions},\
         \"batch_size\":{batch},\"compression\":\"{}\",\"acks\":{},\"idempotent\":{idempotent},\
         \"requests\":{},\"batches\":{}}}",
        msgs as f64 / secs,
        bytes as f64 / secs / 1e6,
        cpu.map_or("null".to_string(), |c| format!("{c:.3}")),
        compression.name(),
        acks.code(),
        stats.writes,
        stats.batches,
    );
    Ok(())
}
