//! Two members of one consumer group share a topic; each processes its partitions and
//! acks what it processed into its commit sink, printing its rebalance events as they
//! happen (`a: generation 2 assigned group-example-…[0,1,2]`, `a: revoked …`).
//!
//! Member `a` starts alone and is assigned every partition; `b` joins once `a` has
//! processed a quarter of the messages, and the group rebalances. Both stop when every
//! message was processed by one of them; the summary counts messages processed twice
//! (possible around a rebalance: at least once) and the offsets the group committed.
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

use std::collections::{BTreeMap, HashMap};
use std::error::Error;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{stream, SinkExt, StreamExt, TryStreamExt};
use kafkapipe::admin::Admin;
use kafkapipe::conn::Conn;
use kafkapipe::group::GroupEvent;
use kafkapipe::reader::{Reader, ReaderConfig, TopicPartition};
use kafkapipe::writer::{Message, Writer, WriterConfig};
use tokio::sync::watch;

const N: usize = 6_000;
/// Give up (and fail) if the two members have not processed everything by then.
const LIMIT: Duration = Duration::from_secs(90);

/// How often each (partition, offset) was processed, over both members.
type Seen = Arc<Mutex<HashMap<(i32, i64), u32>>>;

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
    let broker = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:9092".to_string());
    let cooperative = std::env::args().nth(2).as_deref() == Some("cooperative");
    let id = std::process::id();
    let (topic, group) = (
        format!("group-example-{id}"),
        format!("group-example-g-{id}"),
    );
    let conn = Conn::connect(&broker).await?;
    conn.create_topic(&topic, 6, 1).await?;
    let mut writer = Writer::new(WriterConfig::new([broker.as_str()]))?;
    writer
        .send_all(
            &mut stream::iter(0..N).map(|i| Ok(Message::new(i.to_string()).with_topic(&topic))),
        )
        .await?;
    writer.close().await?;

    let seen: Seen = Arc::default();
    let (done_tx, done_rx) = watch::channel(false);
    let done_tx = Arc::new(done_tx);
    let started = Instant::now();

    let mut members = Vec::new();
    for name in ["a", "b"] {
        if name == "b" {
            // Let `a` work alone for a while, so that b's join is a visible rebalance.
            while seen_len(&seen) < N / 4 && started.elapsed() < LIMIT {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            println!("b: joining the group");
        }
        let mut config = ReaderConfig::new([broker.as_str()])
            .group_id(&group)
            .topic(&topic)
            .heartbeat_interval(Duration::from_millis(500));
        if cooperative {
            config = config.assignors(vec![Arc::new(kafkapipe::group::CooperativeStickyAssignor)]);
        }
        let mut reader = Reader::new(config).await?;
        let (Some(mut events), Some(committer)) = (reader.events(), reader.committer()) else {
            return Err("a reader with a group id has events and a committer".into());
        };
        // The event stream ends when the reader is closed.
        let printer = tokio::spawn(async move {
            while let Some(e) = events.next().await {
                println!("{name}: {}", describe(&e));
            }
        });
        let (seen, done_tx, mut done_rx) = (seen.clone(), done_tx.clone(), done_rx.clone());
        members.push(tokio::spawn(async move {
            let stop = async move {
                let _ = tokio::time::timeout(
                    LIMIT.saturating_sub(started.elapsed()),
                    done_rx.wait_for(|done| *done),
                )
                .await;
            };
            let processed = (&mut reader)
                .take_until(stop)
                .and_then(|m| {
                    let (seen, done_tx) = (seen.clone(), done_tx.clone());
                    async move {
                        // The work: a little time per message, then record it as processed.
                        tokio::time::sleep(Duration::from_millis(1)).await;
                        let distinct = {
                            let mut seen = seen.lock().unwrap_or_else(|e| e.into_inner());
                            *seen.entry((m.partition, m.offset)).or_default() += 1;
                            seen.len()
                        };
                        if distinct >= N {
                            done_tx.send_replace(true);
                        }
                        Ok(m)
                    }
                })
                // the committer acks each processed message; forward closes it, committing
                .forward(committer)
                .await;
            reader.close().await; // commits what was processed, leaves the group
            let _ = printer.await;
            (name, processed)
        }));
    }
    let mut failed = None;
    for m in members {
        let (name, r) = m.await?;
        if let Err(e) = r {
            println!("{name}: stopped with {e}");
            failed = Some(e);
        }
    }

    let committed: i64 = Admin::connect([broker.as_str()])?
        .fetch_group_offsets(&group, Some(&[topic.as_str()]))
        .await?
        .into_iter()
        .filter_map(|(_, r)| r.ok().map(|o| o.offset.max(0)))
        .sum();
    conn.delete_topics(&[topic.as_str()]).await?;
    let (distinct, processed, twice) = {
        let seen = seen.lock().unwrap_or_else(|e| e.into_inner());
        let processed: u64 = seen.values().map(|&n| u64::from(n)).sum();
        (seen.len(), processed, processed - seen.len() as u64)
    };
    println!(
        "group: messages {N}, processed {processed} ({twice} of them again after a \
         rebalance), distinct {distinct}, committed {committed} over the group's partitions"
    );
    if let Some(e) = failed {
        return Err(e.into());
    }
    if distinct == N && committed == N as i64 {
        Ok(())
    } else {
        Err("not every message was processed and committed".into())
    }
}

fn seen_len(seen: &Seen) -> usize {
    seen.lock().unwrap_or_else(|e| e.into_inner()).len()
}

/// One line per event: `generation 3 assigned clicks[0,1,2]`, `revoked clicks[3,4,5]`.
fn describe(e: &GroupEvent) -> String {
    match e {
        GroupEvent::Assigned {
            generation,
            member_id,
            partitions,
        } if partitions.is_empty() => {
            format!("generation {generation} assigned nothing new (member {member_id})")
        }
        GroupEvent::Assigned {
            generation,
            member_id,
            partitions,
        } => format!(
            "generation {generation} assigned {} (member {member_id})",
            by_topic(partitions)
        ),
        GroupEvent::Revoked { partitions } => format!("revoked {}", by_topic(partitions)),
        GroupEvent::Lost { partitions } => {
            format!("lost {} (not committed)", by_topic(partitions))
        }
    }
}

/// `clicks[0,1,2] views[4]`.
fn by_topic(partitions: &[TopicPartition]) -> String {
    let mut topics: BTreeMap<&str, Vec<i32>> = BTreeMap::new();
    for tp in partitions {
        topics.entry(&tp.topic).or_default().push(tp.partition);
    }
    if topics.is_empty() {
        return "nothing".to_string();
    }
    topics
        .into_iter()
        .map(|(topic, mut ps)| {
            ps.sort_unstable();
            let ps: Vec<String> = ps.iter().map(i32::to_string).collect();
            format!("{topic}[{}]", ps.join(","))
        })
        .collect::<Vec<_>>()
        .join(" ")
}
