//! Consume → transform → produce, exactly once: a group `Reader` filtered and mapped into
//! an `ExactlyOnceSink` (a `TransactionalWriter` turned into a pipeline sink). The
//! uppercased values and the consumed offsets are committed in the same transactions, so
//! after any crash or rebalance each input's result is in the output exactly once for
//! read_committed readers. Inputs the filter leaves out move the committed offsets too.
//! It ends with one summary line: what became of every input, what the output holds
//! (read with read_committed), and the group's committed offsets.
//!
//! ```sh
//! bash scripts/example.sh exactly_once                      # against a fresh local Apache Kafka
//! cargo run --example exactly_once -- 127.0.0.1:9092        # against your own broker
//! ```

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use futures::{future, stream, SinkExt, StreamExt, TryStreamExt};
use kafkapipe::admin::Admin;
use kafkapipe::conn::{Conn, IsolationLevel};
use kafkapipe::reader::{Reader, ReaderConfig, StartOffset};
use kafkapipe::writer::{Message, PipelineConfig, TransactionalWriter, Writer, WriterConfig};

const N: usize = 10_000;

/// The filter: words containing a 7 are left out.
fn keep(word: &str) -> bool {
    !word.contains('7')
}

#[tokio::main]
async fn main() -> kafkapipe::Result<()> {
    let broker = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:9092".to_string());
    let id = std::process::id();
    let (input, output) = (format!("eos-in-{id}"), format!("eos-out-{id}"));
    let group = format!("eos-{id}");
    let admin = Conn::connect(&broker).await?;
    admin.create_topic(&input, 3, 1).await?;
    admin.create_topic(&output, 3, 1).await?;

    // The input: N words.
    let mut writer = Writer::new(WriterConfig::new([broker.as_str()]).topic(&input))?;
    writer
        .send_all(&mut stream::iter(0..N).map(|i| Ok(Message::new(format!("word-{i}")))))
        .await?;
    writer.close().await?;

    // The pipeline: read the input as a group member (read_committed), keep, uppercase,
    // write. Each output message carries its input's ack token: that is how the sink
    // knows which offsets its transaction commits. The group never commits by itself.
    let reader = Reader::new(
        ReaderConfig::new([broker.as_str()])
            .group_id(&group)
            .topic(&input)
            .start_offset(StartOffset::First)
            .isolation_level(IsolationLevel::ReadCommitted),
    )
    .await?;
    let handle = reader.handle();
    let mut sink = TransactionalWriter::new(
        WriterConfig::new([broker.as_str()])
            .topic(&output)
            .transactional_id(format!("eos-example-{id}")),
    )?
    .pipeline(&handle, PipelineConfig::new())
    .await?;

    // Stop once the group's committed offsets reach the input's end: every input is
    // processed and its transaction committed. Closing the reader ends its stream, and
    // `forward` then closes the sink.
    let stopper = tokio::spawn({
        let (broker, group, input) = (broker.clone(), group.clone(), input.clone());
        async move {
            let deadline = Instant::now() + Duration::from_secs(120);
            while committed(&broker, &group, &input).await.unwrap_or(0) < N as i64
                && Instant::now() < deadline
            {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            handle.close().await;
        }
    });
    let (mut read, mut filtered) = (0usize, 0usize);
    reader
        .inspect_ok(|_| read += 1)
        .try_filter(|m| {
            let kept = keep(&value(m));
            if !kept {
                filtered += 1; // its token is dropped here: processed, nothing to write
            }
            future::ready(kept)
        })
        .map_ok(|mut m| Message::new(value(&m).to_uppercase()).with_ack(m.take_ack_token()))
        .forward(&mut sink)
        .await?;
    let stats = sink.stats();
    stopper
        .await
        .map_err(|e| kafkapipe::Error::protocol(e.to_string()))?;

    // The output, read_committed: each kept input exactly once?
    let expected: BTreeSet<String> = (0..N)
        .map(|i| format!("word-{i}"))
        .filter(|w| keep(w))
        .map(|w| w.to_uppercase())
        .collect();
    let mut check = Reader::new(
        ReaderConfig::new([broker.as_str()])
            .topic(&output)
            .start_offset(StartOffset::First)
            .isolation_level(IsolationLevel::ReadCommitted)
            .max_wait(Duration::from_millis(100)),
    )
    .await?;
    let mut seen = BTreeSet::new();
    let (mut records, mut duplicates) = (0usize, 0usize);
    while let Ok(Some(m)) = tokio::time::timeout(Duration::from_secs(3), check.next()).await {
        records += 1;
        if !seen.insert(value(&m?)) {
            duplicates += 1;
        }
    }
    check.close().await;
    let missing = expected.difference(&seen).count();
    let unexpected = seen.difference(&expected).count();
    let committed = committed(&broker, &group, &input).await?;
    println!(
        "exactly_once: read {read}, filtered out {filtered}, wrote {} in {} transactions \
         ({} aborted); output (read_committed) {records} records, {} distinct, expected {}, \
         missing {missing}, duplicates {duplicates}, unexpected {unexpected}; \
         committed {committed} of {N} for group {group}",
        stats.messages_committed,
        stats.transactions_committed,
        stats.transactions_aborted,
        seen.len(),
        expected.len(),
    );
    admin.delete_topics(&[&input, &output]).await?;
    if missing == 0 && duplicates == 0 && unexpected == 0 && committed == N as i64 {
        Ok(())
    } else {
        Err(kafkapipe::Error::protocol(
            "the output does not hold each kept input exactly once",
        ))
    }
}

fn value(m: &kafkapipe::reader::Message) -> String {
    String::from_utf8_lossy(m.value.as_deref().unwrap_or_default()).into_owned()
}

/// The group's committed offsets of `topic`, summed (the topic was written from offset
/// 0: the number of inputs committed as processed).
async fn committed(broker: &str, group: &str, topic: &str) -> kafkapipe::Result<i64> {
    Ok(Admin::connect([broker])?
        .fetch_group_offsets(group, Some(&[topic]))
        .await?
        .into_iter()
        .filter_map(|(_, r)| r.ok().map(|o| o.offset.max(0)))
        .sum())
}
