//! End-to-end tour of the low-level `Conn` API: create a topic, produce batches with
//! each compression codec, read them back, list offsets, delete the topic.
//!
//! ```sh
//! bash scripts/example.sh            # starts a local Apache Kafka broker and runs this
//! cargo run --example quickstart -- 127.0.0.1:9092   # against your own broker
//! ```

use std::time::Instant;

use kafkapipe::compression::Compression;
use kafkapipe::conn::{Conn, FetchOptions, ProduceOptions};
use kafkapipe::record::Record;

#[tokio::main(flavor = "current_thread")]
async fn main() -> kafkapipe::Result<()> {
    let broker = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:9092".to_string());
    let conn = Conn::connect(&broker).await?;
    let md = conn.metadata(None).await?;
    println!(
        "connected to {broker}: cluster {:?}, {} broker(s), {} topic(s)",
        md.cluster_id,
        md.brokers.len(),
        md.topics.len()
    );

    let topic = format!("kafkapipe-quickstart-{}", std::process::id());
    conn.create_topic(&topic, 5, 1).await?;
    println!("created topic {topic} with 5 partitions");

    let codecs = [
        Compression::None,
        Compression::Gzip,
        Compression::Snappy,
        Compression::Lz4,
        Compression::Zstd,
    ];
    for (partition, codec) in codecs.into_iter().enumerate() {
        let partition = partition as i32;
        let records: Vec<Record> = (0..1000)
            .map(|i| {
                Record::new(
                    format!("user-{}", i % 17),
                    format!("{{\"event\":\"click\",\"n\":{i}}}"),
                )
                .with_header("source", "quickstart")
            })
            .collect();
        let opts = ProduceOptions::default().compression(codec);
        let started = Instant::now();
        // Kafka creates a topic's partitions asynchronously: for a moment after
        // CreateTopics returns, the leader may answer NOT_LEADER_OR_FOLLOWER. `Conn` is the
        // low-level API and does not retry (the `Writer` does), so retry here.
        let mut attempt = 0;
        let base = loop {
            match conn.produce(&topic, partition, &records, &opts).await {
                Err(e) if e.is_retriable() && attempt < 50 => {
                    attempt += 1;
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
                result => break result?,
            }
        };
        let produced = started.elapsed();

        let started = Instant::now();
        let mut offset = base;
        let mut read = 0;
        while read < records.len() {
            let fetched = conn
                .fetch(&topic, partition, offset, &FetchOptions::default())
                .await?;
            read += fetched.records.len();
            offset = fetched.next_offset;
        }
        let first = conn.first_offset(&topic, partition).await?;
        println!(
            "partition {partition} ({codec}): produced 1000 records at offset {base} in {produced:?}, \
             read {read} back in {:?}; log starts at {first}, next offset {offset}",
            started.elapsed()
        );
    }

    for (name, result) in conn.delete_topics(&[topic.as_str()]).await? {
        result?;
        println!("deleted topic {name}");
    }
    conn.close().await;
    Ok(())
}
