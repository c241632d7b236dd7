//! A worker pool over a share group (KIP-932, Apache Kafka 4.2+): N workers, each its own
//! `ShareReader` member of one share group, read a 1-partition topic together — more
//! consumers than partitions, which a consumer group cannot do. One message is poison:
//! its processing always fails, so the worker releases it and the broker delivers it
//! again (to any worker) with a higher delivery count; at the third delivery the worker
//! writes it to a dead-letter topic through a `Writer` and, once the broker acknowledged
//! the dead letter, rejects it, so the broker archives it and never delivers it again (if
//! the dead letter cannot be written, the record is released instead: at least once).
//!
//! It prints how many messages each worker processed and the dead letter, and checks that
//! every good message was processed once.
//!
//! ```sh
//! bash scripts/example.sh share_workers                 # against a fresh local Apache Kafka
//! cargo run --example share_workers -- 127.0.0.1:9092   # against your own broker (4.2+)
//! ```

use std::collections::BTreeMap;
use std::error::Error;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use kafkapipe::admin::{Admin, AlterConfigOp, ConfigResource};
use kafkapipe::conn::Conn;
use kafkapipe::protocol::ErrorCode;
use kafkapipe::share::{ShareReader, ShareReaderConfig};
use kafkapipe::writer::{Message, Writer, WriterConfig};

/// Workers, good messages, and the delivery at which a failing message is given up.
const WORKERS: usize = 4;
const N: usize = 200;
const MAX_DELIVERIES: u16 = 3;

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
    let broker = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:9092".to_string());
    let id = std::process::id();
    let (jobs, dead, group) = (
        format!("jobs-{id}"),
        format!("jobs-dlq-{id}"),
        format!("workers-{id}"),
    );
    let conn = Conn::connect(&broker).await?;
    conn.create_topic(&jobs, 1, 1).await?;
    conn.create_topic(&dead, 1, 1).await?;
    conn.close().await;

    // A share group starts at the log end unless told otherwise (a GROUP config).
    let admin = Admin::connect([broker.as_str()])?;
    let ops = vec![AlterConfigOp::Set(
        "share.auto.offset.reset".into(),
        "earliest".into(),
    )];
    for (_, r) in admin
        .incremental_alter_configs(&[(ConfigResource::group(&group), ops)], false)
        .await?
    {
        r?;
    }

    let mut input = Writer::new(WriterConfig::new([broker.as_str()]).topic(jobs.as_str()))?;
    let mut msgs: Vec<Message> = (0..N).map(|i| Message::new(format!("job-{i}"))).collect();
    msgs.insert(N / 2, Message::new("poison"));
    input.write_messages(msgs).await?;
    input.close().await?;

    let done: Arc<Mutex<BTreeMap<String, usize>>> = Arc::default();
    let per_worker: Arc<Mutex<Vec<usize>>> = Arc::new(Mutex::new(vec![0; WORKERS]));
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut workers = Vec::new();
    for w in 0..WORKERS {
        let config = ShareReaderConfig::new([broker.as_str()], group.as_str())
            .topic(jobs.as_str())
            .max_in_flight(10)
            .max_wait(Duration::from_millis(200));
        let dlq = Writer::new(WriterConfig::new([broker.as_str()]).topic(dead.as_str()))?;
        let (done, per_worker, mut stop) = (done.clone(), per_worker.clone(), stop_rx.clone());
        workers.push(tokio::spawn(async move {
            let mut dlq = dlq;
            let mut reader = ShareReader::new(config).await?;
            loop {
                let mut m = tokio::select! {
                    _ = stop.changed() => break,
                    m = reader.next() => match m {
                        Some(m) => m?,
                        None => break,
                    },
                };
                let value =
                    String::from_utf8_lossy(m.value.as_deref().unwrap_or_default()).into_owned();
                let deliveries = m.delivery_count().unwrap_or(1);
                if value == "poison" {
                    // processing fails every time
                    if deliveries >= MAX_DELIVERIES {
                        let letter = Message::new(value.clone())
                            .with_header("deliveries", deliveries.to_string());
                        match dlq.write_messages(vec![letter]).await {
                            Ok(()) => {
                                m.take_ack_token().reject();
                                println!("worker {w}: {value} dead-lettered after {deliveries} deliveries, rejected");
                            }
                            Err(e) => {
                                m.take_ack_token().release();
                                return Err(e);
                            }
                        }
                    } else {
                        println!("worker {w}: {value} failed (delivery {deliveries}), released");
                        m.take_ack_token().release();
                    }
                    continue;
                }
                tokio::time::sleep(Duration::from_millis(5)).await; // the work
                *done
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .entry(value)
                    .or_default() += 1;
                per_worker.lock().unwrap_or_else(|e| e.into_inner())[w] += 1;
                m.take_ack_token().ack();
            }
            dlq.close().await?;
            reader.close().await?;
            Ok::<_, kafkapipe::Error>(())
        }));
    }

    // Wait until every good message is processed and the poison is dead-lettered.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    let dlq_conn = Conn::connect(&broker).await?;
    let dead_letters = loop {
        let processed = done.lock().unwrap_or_else(|e| e.into_inner()).len();
        let letters = match dlq_conn.fetch(&dead, 0, 0, &Default::default()).await {
            Ok(fetched) => fetched.records,
            // A topic created a moment ago may not be in this broker's metadata yet.
            Err(e) if e.kafka_code() == Some(ErrorCode::UnknownTopicOrPartition) => Vec::new(),
            Err(e) => return Err(e.into()),
        };
        if processed == N && !letters.is_empty() {
            break letters;
        }
        if tokio::time::Instant::now() > deadline {
            return Err(format!(
                "timed out: {processed} of {N} processed, {} dead letters",
                letters.len()
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let _ = stop_tx.send(true);
    for w in workers {
        w.await??;
    }
    dlq_conn.close().await;

    let done = done.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let per_worker = per_worker.lock().unwrap_or_else(|e| e.into_inner()).clone();
    println!("processed per worker: {per_worker:?}");
    let twice: Vec<&String> = done
        .iter()
        .filter(|(_, n)| **n > 1)
        .map(|(v, _)| v)
        .collect();
    println!(
        "summary: processed={} duplicates={} dead_letters={}",
        done.len(),
        twice.len(),
        dead_letters.len()
    );
    if done.len() != N || dead_letters.len() != 1 {
        return Err("not every job processed, or not one dead letter".into());
    }
    admin.close().await;
    Ok(())
}
