//! Results and offsets in one database transaction: a group `Reader` whose partitions
//! start where an SQLite database says ([`OffsetStore`]), and a worker that stores each
//! record's result together with its partition's next offset in one SQLite transaction.
//! Kafka's committed offsets play no part in where a partition resumes, so a crash at any
//! point — even between the database commit and Kafka's — neither loses nor repeats a
//! record (the seed's `saveOffsetToDB` / `loadOffsetFromDB` pattern).
//!
//! The example writes N records over 3 partitions, runs a first worker process that
//! crashes in the middle of a transaction, then a second one that finishes the work, and
//! prints one line: what the database holds, missing and duplicate records.
//!
//! ```sh
//! bash scripts/example.sh sqlite_offsets                    # against a fresh local Apache Kafka
//! cargo run --example sqlite_offsets -- 127.0.0.1:9092      # against your own broker
//! ```
//!
//! [`OffsetStore`]: kafkapipe::group::OffsetStore

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{stream, SinkExt, StreamExt};
use kafkapipe::conn::Conn;
use kafkapipe::reader::{Reader, ReaderConfig, StartOffset, TopicPartition};
use kafkapipe::writer::{Message, Writer, WriterConfig};
use kafkapipe::{Error, ErrorKind};
use rusqlite::{params, Connection, OptionalExtension};

const N: i64 = 2_000;
/// The first worker dies inside its transaction for this record.
const CRASH_AT: usize = 700;

#[tokio::main]
async fn main() -> kafkapipe::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--worker") {
        // --worker BROKER TOPIC GROUP DB CRASH_AT (0: never)
        let arg = |i: usize| args.get(i).cloned().unwrap_or_default();
        let crash_at = arg(6).parse().unwrap_or(0);
        return worker(&arg(2), &arg(3), &arg(4), Path::new(&arg(5)), crash_at).await;
    }
    let broker = args
        .get(1)
        .cloned()
        .unwrap_or_else(|| "127.0.0.1:9092".to_string());
    let id = std::process::id();
    let (topic, group) = (format!("sqlite-in-{id}"), format!("sqlite-{id}"));
    let db = std::env::temp_dir().join(format!("kafkapipe-sqlite-offsets-{id}.db"));
    let _ = std::fs::remove_file(&db);

    let admin = Conn::connect(&broker).await?;
    admin.create_topic(&topic, 3, 1).await?;
    let mut writer = Writer::new(WriterConfig::new([broker.as_str()]).topic(&topic))?;
    writer
        .send_all(&mut stream::iter(0..N).map(|i| Ok(Message::new(format!("order-{i}")))))
        .await?;
    writer.close().await?;

    // Two worker processes, one after the other: the first crashes, the second finishes.
    let first = run_worker(&broker, &topic, &group, &db, CRASH_AT)?;
    let after_crash = count_rows(&db)?;
    let second = run_worker(&broker, &topic, &group, &db, 0)?;

    let conn = open(&db)?;
    let (rows, distinct): (i64, i64) = conn
        .query_row(
            "SELECT COUNT(*), COUNT(DISTINCT value) FROM results",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .map_err(db_error)?;
    let stored: i64 = conn
        .query_row("SELECT COALESCE(SUM(next), 0) FROM offsets", [], |r| {
            r.get(0)
        })
        .map_err(db_error)?;
    let (missing, duplicates) = (N - distinct, rows - distinct);
    println!(
        "sqlite_offsets: {N} records; first worker {first} (database held {after_crash} \
         results after it), second worker {second}; database: {rows} results, {distinct} \
         distinct, missing {missing}, duplicates {duplicates}, stored offsets sum {stored}"
    );
    admin.delete_topics(&[&topic]).await?;
    let _ = std::fs::remove_file(&db);
    if missing == 0 && duplicates == 0 && stored == N {
        Ok(())
    } else {
        Err(Error::protocol(
            "the database does not hold each record once",
        ))
    }
}

/// Runs this program as a worker process and describes how it ended.
fn run_worker(
    broker: &str,
    topic: &str,
    group: &str,
    db: &Path,
    crash_at: usize,
) -> kafkapipe::Result<String> {
    let exe = std::env::current_exe().map_err(|e| Error::io("finding this program", e))?;
    let status = Command::new(exe)
        .args(["--worker", broker, topic, group])
        .arg(db)
        .arg(crash_at.to_string())
        .status()
        .map_err(|e| Error::io("starting a worker", e))?;
    Ok(match status.code() {
        Some(0) => "finished".to_string(),
        Some(CRASHED) => "crashed mid-transaction".to_string(),
        other => return Err(Error::protocol(format!("a worker failed: {other:?}"))),
    })
}

const CRASHED: i32 = 3;

/// One worker: reads the group's partitions from where the database says, stores each
/// result with its offset in one transaction, and stops once every record is stored.
async fn worker(
    broker: &str,
    topic: &str,
    group: &str,
    db: &Path,
    crash_at: usize,
) -> kafkapipe::Result<()> {
    let conn = Arc::new(Mutex::new(open(db)?));
    let store = conn.clone();
    let mut reader = Reader::new(
        ReaderConfig::new([broker])
            .group_id(group)
            .topic(topic)
            .start_offset(StartOffset::First)
            .max_wait(Duration::from_millis(100))
            // the crashed worker never leaves the group: let the broker notice soon
            .session_timeout(Duration::from_secs(6))
            .heartbeat_interval(Duration::from_secs(1))
            // where each newly assigned partition starts: the database's next offset
            .offset_store(move |partitions: Vec<TopicPartition>| {
                let conn = store.clone();
                async move {
                    tokio::task::spawn_blocking(move || load_offsets(&conn, &partitions))
                        .await
                        .map_err(|e| Error::protocol(e.to_string()))?
                }
            }),
    )
    .await?;
    let mut processed = 0usize;
    while stored_sum(&conn)? < N {
        let Some(message) = reader.next().await else {
            break;
        };
        let mut message = message?;
        processed += 1;
        let crash = processed == crash_at;
        let (t, p, offset) = (message.topic.clone(), message.partition, message.offset);
        let value =
            String::from_utf8_lossy(message.value.as_deref().unwrap_or_default()).to_uppercase();
        let conn = conn.clone();
        tokio::task::spawn_blocking(move || -> kafkapipe::Result<()> {
            let mut conn = conn.lock().map_err(|_| Error::protocol("database lock"))?;
            let tx = conn.transaction().map_err(db_error)?;
            tx.execute(
                "INSERT INTO results (topic, partition, offset, value) VALUES (?1, ?2, ?3, ?4)",
                params![t, p, offset, value],
            )
            .map_err(db_error)?;
            if crash {
                // die with the transaction open: SQLite rolls it back on the next open
                std::process::exit(CRASHED);
            }
            tx.execute(
                "INSERT INTO offsets (topic, partition, next) VALUES (?1, ?2, ?3)
                 ON CONFLICT (topic, partition) DO UPDATE SET next = excluded.next",
                params![t, p, offset + 1],
            )
            .map_err(db_error)?;
            tx.commit().map_err(db_error)
        })
        .await
        .map_err(|e| Error::protocol(e.to_string()))??;
        // The group's commits to Kafka follow (for lag monitoring); the database decides.
        message.take_ack_token().ack();
    }
    reader.close().await;
    Ok(())
}

fn open(db: &Path) -> kafkapipe::Result<Connection> {
    let conn = Connection::open(db).map_err(db_error)?;
    conn.execute_batch(
        // WAL with synchronous NORMAL survives a crash of the process (what this example
        // does); keep the default FULL to survive a power loss too
        "PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL;
         CREATE TABLE IF NOT EXISTS results (
             topic TEXT NOT NULL, partition INTEGER NOT NULL, offset INTEGER NOT NULL,
             value TEXT NOT NULL);
         CREATE TABLE IF NOT EXISTS offsets (
             topic TEXT NOT NULL, partition INTEGER NOT NULL, next INTEGER NOT NULL,
             PRIMARY KEY (topic, partition));",
    )
    .map_err(db_error)?;
    Ok(conn)
}

fn load_offsets(
    conn: &Mutex<Connection>,
    partitions: &[TopicPartition],
) -> kafkapipe::Result<HashMap<TopicPartition, i64>> {
    let conn = conn.lock().map_err(|_| Error::protocol("database lock"))?;
    let mut next = HashMap::new();
    for tp in partitions {
        let at: Option<i64> = conn
            .query_row(
                "SELECT next FROM offsets WHERE topic = ?1 AND partition = ?2",
                params![tp.topic, tp.partition],
                |r| r.get(0),
            )
            .optional()
            .map_err(db_error)?;
        if let Some(at) = at {
            next.insert(tp.clone(), at);
        }
    }
    Ok(next)
}

fn stored_sum(conn: &Mutex<Connection>) -> kafkapipe::Result<i64> {
    let conn = conn.lock().map_err(|_| Error::protocol("database lock"))?;
    conn.query_row("SELECT COALESCE(SUM(next), 0) FROM offsets", [], |r| {
        r.get(0)
    })
    .map_err(db_error)
}

fn count_rows(db: &Path) -> kafkapipe::Result<i64> {
    open(db)?
        .query_row("SELECT COUNT(*) FROM results", [], |r| r.get(0))
        .map_err(db_error)
}

fn db_error(e: rusqlite::Error) -> Error {
    Error::new(ErrorKind::Io, format!("sqlite: {e}"))
}
