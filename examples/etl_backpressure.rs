//! Backpressure from a slow stage back to the broker: a group `Reader` feeds a stage that
//! takes a couple of milliseconds per message, then a `Writer`. The reader fetches ahead
//! only up to its bounded buffer (`queue_capacity_bytes`; one fetch response of at most
//! `max_bytes` may land on top of it) and then stops fetching until the stage catches up,
//! so memory stays flat however large the topic is. Every few hundred messages it prints
//! the process's resident memory (`VmRSS` from `/proc/self/status` on Linux, `n/a`
//! elsewhere) and the reader's stats: what it holds fetched and not yet yielded, and how
//! many fetches it made.
//!
//! ```sh
//! bash scripts/example.sh etl_backpressure                 # against a fresh local Apache Kafka
//! cargo run --example etl_backpressure -- 127.0.0.1:9092   # against your own broker
//! ```

use std::error::Error;
use std::time::Duration;

use futures::{stream, SinkExt, StreamExt, TryStreamExt};
use kafkapipe::admin::Admin;
use kafkapipe::conn::Conn;
use kafkapipe::reader::{Reader, ReaderConfig, StartOffset};
use kafkapipe::writer::{Message, Writer, WriterConfig};

/// Messages in the input topic, and the size of each value: 64 MiB in all.
const N: usize = 2_000;
const VALUE: usize = 32 * 1024;
/// The reader's buffer bound and the largest fetch response it asks for.
const QUEUE_BYTES: usize = 256 * 1024;
const MAX_BYTES: usize = 256 * 1024;
/// The slow stage's time per message.
const WORK: Duration = Duration::from_millis(2);

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
    let broker = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:9092".to_string());
    let id = std::process::id();
    let (input, output, group) = (
        format!("etl-in-{id}"),
        format!("etl-out-{id}"),
        format!("etl-{id}"),
    );
    let conn = Conn::connect(&broker).await?;
    conn.create_topic(&input, 3, 1).await?;
    conn.create_topic(&output, 3, 1).await?;

    // The input: N values of VALUE bytes, in batches well under the reader's max_bytes.
    let mut writer = Writer::new(
        WriterConfig::new([broker.as_str()])
            .topic(&input)
            .batch_bytes(128 * 1024),
    )?;
    writer
        .send_all(&mut stream::iter(0..N).map(|i| {
            let mut value = format!("{i:08}").into_bytes();
            value.resize(VALUE, b'.');
            Ok(Message::new(value))
        }))
        .await?;
    writer.close().await?;
    let topic_bytes = N * VALUE;

    let mut reader = Reader::new(
        ReaderConfig::new([broker.as_str()])
            .group_id(&group)
            .topic(&input)
            .start_offset(StartOffset::First)
            .queue_capacity_bytes(QUEUE_BYTES)
            .max_bytes(i32::try_from(MAX_BYTES)?),
    )
    .await?;
    let handle = reader.handle();
    let mut out = Writer::new(WriterConfig::new([broker.as_str()]).topic(&output))?;

    let rss_start = rss_kib();
    let (mut read, mut peak_queue, mut peak_rss) = (0usize, 0usize, rss_start);
    println!(
        "etl: {N} messages of {VALUE} bytes ({topic_bytes} bytes) to process at {WORK:?} each; \
         reader buffer bound {QUEUE_BYTES} bytes, fetch max_bytes {MAX_BYTES}; VmRSS {}",
        kib(rss_start)
    );
    (&mut reader)
        .take(N)
        .and_then(|m| async move {
            tokio::time::sleep(WORK).await; // the slow stage: a transform, an API call…
            Ok(m)
        })
        .map_ok(|m| {
            read += 1;
            let stats = handle.stats();
            peak_queue = peak_queue.max(stats.queue_bytes);
            if read % 20 == 0 {
                peak_rss = max_opt(peak_rss, rss_kib());
            }
            if read % 250 == 0 {
                println!(
                    "  {read:>5}/{N}: VmRSS {}; reader holds {} bytes in {} messages \
                     (at most {} + one fetch response), {} fetches so far, lag {}",
                    kib(rss_kib()),
                    stats.queue_bytes,
                    stats.queue_length,
                    stats.queue_capacity_bytes,
                    stats.fetches,
                    stats.lag,
                );
            }
            // The output carries the input message's ack token: committed once written.
            Message::from(m)
        })
        .forward(&mut out) // flushes, then closes the writer
        .await?;
    let wrote = out.stats().messages;
    reader.close().await; // commits what was written, leaves the group
    let rss_end = rss_kib();
    peak_rss = max_opt(peak_rss, rss_end);

    let committed: i64 = Admin::connect([broker.as_str()])?
        .fetch_group_offsets(&group, Some(&[input.as_str()]))
        .await?
        .into_iter()
        .filter_map(|(_, r)| r.ok().map(|o| o.offset.max(0)))
        .sum();
    conn.delete_topics(&[input.as_str(), output.as_str()])
        .await?;

    let bound = QUEUE_BYTES + MAX_BYTES;
    let growth = match (rss_start, peak_rss) {
        (Some(start), Some(peak)) => format!(
            "RSS grew by {} KiB (VmRSS {start} KiB at the start, peak {peak} KiB)",
            peak.saturating_sub(start)
        ),
        _ => "RSS n/a".to_string(),
    };
    println!(
        "etl: read {read}, wrote {wrote}, committed {committed}; reader queue_bytes peaked at \
         {peak_queue} (capacity + max_bytes = {bound}) while the topic holds {topic_bytes} \
         bytes; {growth}"
    );
    if read == N && wrote == N as u64 && committed == N as i64 && peak_queue <= bound {
        Ok(())
    } else {
        Err("the counts do not add up, or the reader buffered past its bound".into())
    }
}

/// The resident set size in KiB (`VmRSS` in `/proc/self/status`); `None` where there is
/// no such file (not Linux).
fn rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn kib(v: Option<u64>) -> String {
    v.map_or_else(|| "n/a".to_string(), |k| format!("{k} KiB"))
}

fn max_opt(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    }
}
