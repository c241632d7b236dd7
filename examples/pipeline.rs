//! A Kafka-to-Kafka pipeline from ordinary stream combinators: a `Reader` (a `Stream`)
//! filtered and mapped into a `Writer` (a `Sink`).
//!
//! ```sh
//! bash scripts/example.sh pipeline                      # against a fresh local Apache Kafka
//! cargo run --example pipeline -- 127.0.0.1:9092        # against your own broker
//! ```

use futures::{future, stream, SinkExt, StreamExt, TryStreamExt};
use kafkapipe::conn::Conn;
use kafkapipe::reader::{Reader, ReaderConfig};
use kafkapipe::writer::{Message, Writer, WriterConfig};

const N: usize = 10_000;

#[tokio::main]
async fn main() -> kafkapipe::Result<()> {
    let broker = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:9092".to_string());
    let id = std::process::id();
    let (input, output) = (format!("pipeline-in-{id}"), format!("pipeline-out-{id}"));
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

    // Read them back, keep the even ones, double them, write them to the output topic.
    let mut reader = Reader::new(ReaderConfig::new([broker.as_str()]).topic(&input)).await?;
    let mut kept = 0usize;
    (&mut reader)
        .take(N)
        .try_filter(|m| future::ready(parse(m).is_some_and(|n| n % 2 == 0)))
        .map_ok(|m| {
            kept += 1;
            let n = parse(&m).unwrap_or_default();
            let mut out = Message::new((2 * n).to_string()).with_topic(&output);
            out.key = m.key;
            out
        })
        .forward(&mut writer) // flushes, then closes the writer
        .await?;
    reader.close().await;

    // Check the output.
    let mut check = Reader::new(ReaderConfig::new([broker.as_str()]).topic(&output)).await?;
    let sum: u64 = (&mut check)
        .take(kept)
        .try_fold(0u64, |acc, m| {
            future::ready(Ok(acc + parse(&m).unwrap_or(0)))
        })
        .await?;
    check.close().await;
    let expected: u64 = (0..N as u64).filter(|n| n % 2 == 0).map(|n| 2 * n).sum();
    println!("forwarded {kept} of {N} messages; sum of output values {sum} (expected {expected})");
    admin.delete_topics(&[&input, &output]).await?;
    if sum == expected {
        Ok(())
    } else {
        Err(kafkapipe::Error::protocol("output does not match"))
    }
}

fn parse(m: &kafkapipe::reader::Message) -> Option<u64> {
    std::str::from_utf8(m.value.as_deref()?).ok()?.parse().ok()
}
