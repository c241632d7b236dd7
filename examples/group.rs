//! Two members of one consumer group share a topic; each processes its partitions and
//! acks what it processed into its commit sink, printing its rebalance events.
//!
//! ```sh
//! bash scripts/example.sh group                      # against a fresh local Apache Kafka
//! bash scripts/example.sh group cooperative          # cooperative-sticky (KIP-429)
//! cargo run --example group -- 127.0.0.1:9092        # against your own broker
//! ```
//!
//! With `cooperative`, the members offer only the `cooperative-sticky` assignor and so
//! rebalance incrementally (KIP-429): in a later rebalance a member is revoked only the
//! partitions that move away and keeps reading the others.

use std::sync::Arc;
use std::time::Duration;

use futures::{stream, SinkExt, StreamExt, TryStreamExt};
use kafkapipe::conn::Conn;
use kafkapipe::reader::{Reader, ReaderConfig};
use kafkapipe::writer::{Message, Writer, WriterConfig};

const N: usize = 6_000;

#[tokio::main]
async fn main() -> kafkapipe::Result<()> {
    let broker = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:9092".to_string());
    let cooperative = std::env::args().nth(2).as_deref() == Some("cooperative");
    let id = std::process::id();
    let (topic, group) = (
        format!("group-example-{id}"),
        format!("group-example-g-{id}"),
    );
    Conn::connect(&broker)
        .await?
        .create_topic(&topic, 6, 1)
        .await?;
    let mut writer = Writer::new(WriterConfig::new([broker.as_str()]))?;
    writer
        .send_all(
            &mut stream::iter(0..N).map(|i| Ok(Message::new(i.to_string()).with_topic(&topic))),
        )
        .await?;
    writer.close().await?;

    let mut members = Vec::new();
    for name in ["a", "b"] {
        let mut config = ReaderConfig::new([broker.as_str()])
            .group_id(&group)
            .topic(&topic)
            .heartbeat_interval(Duration::from_millis(500));
        if cooperative {
            config = config.assignors(vec![Arc::new(kafkapipe::group::CooperativeStickyAssignor)]);
        }
        let mut reader = Reader::new(config).await?;
        let (Some(mut events), Some(committer)) = (reader.events(), reader.committer()) else {
            return Ok(());
        };
        tokio::spawn(async move {
            while let Some(e) = events.next().await {
                println!("{name}: {e:?}");
            }
        });
        members.push(tokio::spawn(async move {
            // process for a while, then stop: forward closes the committer, committing
            let processed = (&mut reader)
                .take_until(tokio::time::sleep(Duration::from_secs(8)))
                .inspect_ok(|_m| { /* process the message here */ })
                .forward(committer)
                .await;
            reader.close().await;
            (name, processed)
        }));
    }
    for m in members {
        if let Ok((name, r)) = m.await {
            println!("{name} done: {r:?}");
        }
    }
    let admin = kafkapipe::admin::Admin::connect([broker.as_str()])?;
    for (tp, r) in admin.fetch_group_offsets(&group, Some(&[&topic])).await? {
        println!("{tp} committed at {}", r?.offset);
    }
    Ok(())
}
