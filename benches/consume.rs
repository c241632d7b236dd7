//! Consumer throughput: `KAFKAPIPE_BENCH_BROKER=host:port cargo bench --bench consume`.
//!
//! Produces `KAFKAPIPE_BENCH_MESSAGES` (default 1 000 000) messages of
//! `KAFKAPIPE_BENCH_VALUE_LEN` (default 100) bytes into a fresh topic of
//! `KAFKAPIPE_BENCH_PARTITIONS` (default 6) partitions, then times a `Reader` consuming all
//! of them from the first offset, and prints one JSON line:
//! `{"msgs":…,"bytes":…,"secs":…,"msgs_per_sec":…,"mb_per_sec":…}` (bytes are keys plus
//! values; MB is 10^6 bytes).
//!
//! With `--bench`, the same topic is then consumed by librdkafka through
//! `benches/consume_rdkafka.py` (python confluent-kafka) as a baseline in the same run,
//! printing a second JSON line with `"client":"librdkafka"` (set
//! `KAFKAPIPE_BENCH_BASELINE=0` to skip it; it is skipped if the script fails). Python's
//! per-message overhead dominates that baseline for small messages.
//!
//! Under `cargo test` (no `--bench` argument) it does a 10 000-message smoke run without
//! baseline, and without `KAFKAPIPE_BENCH_BROKER` it exits at once.

use std::time::{Duration, Instant};

use kafkapipe::conn::{Conn, ProduceOptions};
use kafkapipe::reader::{Reader, ReaderConfig};
use kafkapipe::record::Record;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() -> kafkapipe::Result<()> {
    let Ok(broker) = std::env::var("KAFKAPIPE_BENCH_BROKER") else {
        eprintln!("consume bench: KAFKAPIPE_BENCH_BROKER not set, skipping");
        return Ok(());
    };
    let bench = std::env::args().any(|a| a == "--bench");
    let msgs = env_usize(
        "KAFKAPIPE_BENCH_MESSAGES",
        if bench { 1_000_000 } else { 10_000 },
    );
    let value_len = env_usize("KAFKAPIPE_BENCH_VALUE_LEN", 100);
    let partitions = env_usize("KAFKAPIPE_BENCH_PARTITIONS", 6).max(1);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| kafkapipe::Error::io("tokio runtime", e))?;
    let baseline = bench && std::env::var("KAFKAPIPE_BENCH_BASELINE").map_or(true, |v| v != "0");
    rt.block_on(run(&broker, msgs, value_len, partitions, baseline))
}

/// Consume `topic` with librdkafka and print its JSON line.
fn rdkafka_baseline(broker: &str, topic: &str, msgs: usize) {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/benches/consume_rdkafka.py");
    let out = std::process::Command::new("python3")
        .args([script, "--broker", broker, "--topic", topic, "--expect"])
        .arg(msgs.to_string())
        .output();
    match out {
        Ok(o) if o.status.success() => print!("{}", String::from_utf8_lossy(&o.stdout)),
        Ok(o) => eprintln!(
            "librdkafka baseline failed: {}",
            String::from_utf8_lossy(&o.stderr)
        ),
        Err(e) => eprintln!("librdkafka baseline not run: {e}"),
    }
}

async fn run(
    broker: &str,
    msgs: usize,
    value_len: usize,
    partitions: usize,
    baseline: bool,
) -> kafkapipe::Result<()> {
    let topic = format!(
        "bench-consume-{}-{}",
        std::process::id(),
        Instant::now().elapsed().as_nanos()
    );
    let conn = Conn::connect(broker).await?;
    conn.create_topic(&topic, partitions as i32, 1).await?;
    let value = vec![b'x'; value_len];
    let per = msgs / partitions;
    let mut bytes = 0u64;
    for p in 0..partitions {
        let mut i = 0;
        while i < per {
            let n = (per - i).min(1000);
            let records: Vec<Record> = (i..i + n)
                .map(|k| Record::new(format!("key-{k:08}"), value.clone()))
                .collect();
            bytes += records
                .iter()
                .map(|r| (r.key.as_ref().map_or(0, |k| k.len()) + value_len) as u64)
                .sum::<u64>();
            conn.produce(&topic, p as i32, &records, &ProduceOptions::default())
                .await?;
            i += n;
        }
    }
    let total = per * partitions;
    // Let the broker settle after the burst of produce requests before timing.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut reader = Reader::new(
        ReaderConfig::new([broker])
            .topic(&topic)
            .max_wait(Duration::from_millis(100)),
    )
    .await?;
    let started = Instant::now();
    let mut got = 0usize;
    let mut got_bytes = 0u64;
    while got < total {
        let m = reader.next_message().await?;
        got += 1;
        got_bytes += (m.key.as_ref().map_or(0, |k| k.len())
            + m.value.as_ref().map_or(0, |v| v.len())) as u64;
    }
    let secs = started.elapsed().as_secs_f64();
    reader.close().await;
    if got_bytes != bytes {
        return Err(kafkapipe::Error::protocol(format!(
            "consumed {got_bytes} bytes, produced {bytes}"
        )));
    }
    println!(
        "{{\"msgs\":{total},\"bytes\":{got_bytes},\"secs\":{secs:.3},\"msgs_per_sec\":{:.0},\"mb_per_sec\":{:.1}}}",
        total as f64 / secs,
        got_bytes as f64 / secs / 1e6
    );
    if baseline {
        let (broker, topic2) = (broker.to_string(), topic.clone());
        tokio::task::spawn_blocking(move || rdkafka_baseline(&broker, &topic2, total))
            .await
            .map_err(|e| kafkapipe::Error::protocol(format!("baseline task: {e}")))?;
    }
    let _ = conn.delete_topics(&[&topic]).await;
    Ok(())
}
