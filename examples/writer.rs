//! The producer as a `Sink`: pipe a stream of messages into Kafka with `forward`, then
//! read one partition back with the low-level API and print the writer's stats.
//!
//! ```sh
//! bash scripts/example.sh writer            # starts a local Apache Kafka broker and runs this
//! cargo run --example writer -- 127.0.0.1:9092   # against your own broker
//! ```

use std::time::Instant;

use futures::{stream, SinkExt, StreamExt};
use kafkapipe::compression::Compression;
use kafkapipe::conn::{Conn, FetchOptions};
use kafkapipe::writer::{Message, Murmur2, Writer, WriterConfig};

#[tokio::main]
async fn main() -> kafkapipe::Result<()> {
    let broker = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:9092".to_string());
    let topic = format!("kafkapipe-writer-example-{}", std::process::id());
    let admin = Conn::connect(&broker).await?;
    admin.create_topic(&topic, 4, 1).await?;

    // Keyed messages: Murmur2 puts each key on the partition the Java client would pick.
    let mut writer = Writer::new(
        WriterConfig::new([broker.clone()])
            .topic(&topic)
            .balancer(Murmur2::default())
            .compression(Compression::Lz4),
    )?;
    let started = Instant::now();
    let events = (0..100_000u32).map(|i| {
        Message::keyed(format!("user-{}", i % 50), format!("event {i}"))
            .with_header("seq", i.to_string())
    });
    stream::iter(events)
        .filter(|m| futures::future::ready(!m.value.as_ref().is_some_and(|v| v.ends_with(b"13"))))
        .map(Ok)
        .forward(&mut writer)
        .await?;
    writer.close().await?;
    let stats = writer.stats();
    println!(
        "wrote {} messages in {:?} ({} produce requests, {} batches, mean latency {:?})",
        stats.messages,
        started.elapsed(),
        stats.writes,
        stats.batches,
        stats.write_time_avg
    );

    let fetched = admin.fetch(&topic, 0, 0, &FetchOptions::default()).await?;
    if let Some(first) = fetched.records.first() {
        println!(
            "partition 0 starts with key {:?}, value {:?}",
            first.key.as_deref().map(String::from_utf8_lossy),
            first.value.as_deref().map(String::from_utf8_lossy),
        );
    }
    admin.delete_topics(&[topic.as_str()]).await?;
    Ok(())
}
