//! A Kafka-to-Kafka pipeline from ordinary stream combinators, at least once: a group
//! `Reader` (a `Stream`) filtered and mapped into a `Writer` (a `Sink`). Each written
//! message carries the ack token of the message it was made from, so the group commits a
//! consumed message only once its result is acknowledged by the broker; the messages the
//! filter leaves out are acked as processed. It ends with one summary line saying what
//! became of every message read (filtered out or written) and how many were committed.
//!
//! ```sh
//! bash scripts/example.sh pipeline                      # against a fresh local Apache Kafka
//! cargo run --example pipeline -- 127.0.0.1:9092        # against your own broker
//! ```

use futures::{future, stream, SinkExt, StreamExt, TryStreamExt};
use kafkapipe::admin::Admin;
use kafkapipe::conn::Conn;
use kafkapipe::reader::{Reader, ReaderConfig, StartOffset};
use kafkapipe::writer::{Message, Writer, WriterConfig};

const N: usize = 10_000;

#[tokio::main]
async fn main() -> kafkapipe::Result<()> {
    let broker = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:9092".to_string());
    let id = std::process::id();
    let (input, output) = (format!("pipeline-in-{id}"), format!("pipeline-out-{id}"));
    let group = format!("pipeline-{id}");
    let admin = Conn::connect(&broker).await?;
    admin.create_topic(&input, 3, 1).await?;
    admin.create_topic(&output, 3, 1).await?;

    // Produce N numbered messages.
    let mut writer = Writer::new(WriterConfig::new([broker.as_str()]))?;
    // `send_all` flushes but, unlike `forward`, does not close the sink.
    writer
        .send_all(
            &mut stream::iter(0..N)
                .map(|i| Ok(Message::keyed(format!("k{i}"), i.to_string()).with_topic(&input))),
        )
        .await?;

    // As a group member: read all N, keep the even numbers, double them, write them to
    // the output topic. `Message::from(m)` keeps m's key and carries its ack token to the
    // writer, which acks it once the broker has the doubled number. An odd number is
    // processed by being filtered out: its token is acked here. (Dropping the token would
    // count too, but only once the reader is polled again, and `take(N)` stops polling
    // after the N-th message: a last message dropped by the filter would stay uncommitted.)
    let mut reader = Reader::new(
        ReaderConfig::new([broker.as_str()])
            .group_id(&group)
            .topic(&input)
            .start_offset(StartOffset::First),
    )
    .await?;
    let (mut read, mut filtered, mut wrote) = (0usize, 0usize, 0usize);
    (&mut reader)
        .take(N)
        .try_filter_map(|mut m| {
            read += 1;
            let out = match parse(&m) {
                Some(n) if n % 2 == 0 => {
                    wrote += 1;
                    Some(
                        Message::from(m)
                            .with_value((2 * n).to_string())
                            .with_topic(&output),
                    )
                }
                _ => {
                    filtered += 1;
                    m.take_ack_token().ack(); // processed: nothing to write
                    None
                }
            };
            future::ready(Ok(out))
        })
        .forward(&mut writer) // flushes, then closes the writer: every write acknowledged
        .await?;
    let held = reader.stats().unacked;
    reader.close().await; // commits what was processed, leaves the group

    // Check the output and the group's commits.
    let mut check = Reader::new(
        ReaderConfig::new([broker.as_str()])
            .topic(&output)
            .start_offset(StartOffset::First),
    )
    .await?;
    let sum: u64 = (&mut check)
        .take(wrote)
        .try_fold(0u64, |acc, m| {
            future::ready(Ok(acc + parse(&m).unwrap_or(0)))
        })
        .await?;
    check.close().await;
    let expected: u64 = (0..N as u64).filter(|n| n % 2 == 0).map(|n| 2 * n).sum();
    // The committed offsets of a topic written from offset 0: their sum is the number of
    // messages committed as processed.
    let committed: i64 = Admin::connect([broker.as_str()])?
        .fetch_group_offsets(&group, Some(&[input.as_str()]))
        .await?
        .into_iter()
        .filter_map(|(_, r)| r.ok().map(|o| o.offset.max(0)))
        .sum();
    println!(
        "pipeline: read {read}, filtered out {filtered} (odd), wrote {wrote} to {output} \
         (sum of values {sum}, expected {expected}), committed {committed} for group {group} \
         (unacked {held})"
    );
    admin.delete_topics(&[&input, &output]).await?;
    if read == N
        && wrote == N / 2
        && filtered + wrote == read
        && committed == read as i64
        && sum == expected
        && held == 0
    {
        Ok(())
    } else {
        Err(kafkapipe::Error::protocol(
            "output or commits do not match the input",
        ))
    }
}

fn parse(m: &kafkapipe::reader::Message) -> Option<u64> {
    std::str::from_utf8(m.value.as_deref()?).ok()?.parse().ok()
}
