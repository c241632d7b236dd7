//! Bridges between Kafka and the rest of a program, both ways, with backpressure:
//!
//! 1. **Any `Stream` into Kafka**: a generated stream of sensor readings `forward`ed into a
//!    `Writer` whose buffer is bounded to 64 KiB. The writer stops accepting at the bound
//!    until the broker acknowledges, so the stream is polled only as fast as Kafka takes
//!    it; the output shows the buffer's peak and how often the stream had to wait.
//! 2. **Kafka into other sinks**, at least once: a group `Reader` fanned out to a sink that
//!    appends JSON lines to a file and to a bounded tokio channel feeding a pool of
//!    workers. Each message's ack token is shared between the two: the file sink acks its
//!    part once the line is flushed to the file, a worker once it has done its side
//!    effect, and the group commits the message only when both did. A full channel makes
//!    the reader wait for a free worker (counted in the output).
//!
//! ```sh
//! bash scripts/example.sh bridge                      # against a fresh local Apache Kafka
//! cargo run --example bridge -- 127.0.0.1:9092        # against your own broker
//! ```

use std::error::Error;
use std::io::Write;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::{sink, stream, Sink, SinkExt, StreamExt, TryStreamExt};
use kafkapipe::admin::Admin;
use kafkapipe::conn::Conn;
use kafkapipe::group::SharedAck;
use kafkapipe::reader::{self, Reader, ReaderConfig, StartOffset};
use kafkapipe::writer::{Message, Writer, WriterConfig};
use tokio::sync::mpsc;

const N: u64 = 5_000;
const WRITER_BUFFER: usize = 64 * 1024;
const CHANNEL: usize = 32;
const WORKERS: usize = 4;

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
    let broker = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:9092".to_string());
    let id = std::process::id();
    let (topic, group) = (format!("bridge-{id}"), format!("bridge-g-{id}"));
    let path = std::env::temp_dir().join(format!("kafkapipe-bridge-{id}.jsonl"));
    let conn = Conn::connect(&broker).await?;
    conn.create_topic(&topic, 3, 1).await?;

    // 1. Any stream into Kafka. The stream is polled only when the writer has room.
    let mut writer = Writer::new(
        WriterConfig::new([broker.as_str()])
            .topic(&topic)
            .max_buffered_bytes(WRITER_BUFFER),
    )?;
    let handle = writer.handle();
    let (mut peak, mut waits, mut largest) = (0u64, 0u64, 0usize);
    let mut readings = stream::iter(0..N).map(|i| {
        // What the writer holds as the stream makes its next item: at the bound, the
        // writer's poll_ready waits for acknowledgements before it takes this one.
        let buffered = handle.stats().buffered_bytes;
        peak = peak.max(buffered);
        if buffered >= WRITER_BUFFER as u64 {
            waits += 1;
        }
        let value = format!(r#"{{"sensor":{},"reading":{i}}}"#, i % 7);
        let m = Message::keyed(format!("sensor-{}", i % 7), value);
        // What the writer's bound counts for it: its bytes plus the message struct.
        largest = largest.max(m.size() + std::mem::size_of::<Message>());
        Ok(m)
    });
    writer.send_all(&mut readings).await?;
    writer.close().await?;
    let sent = writer.stats().messages;
    println!(
        "stream -> kafka: {sent} readings written to {topic}; writer buffer peaked at \
         {peak} bytes (bound {WRITER_BUFFER}); the stream found the writer full {waits} times"
    );

    // 2. Kafka into a JSON-lines file and a worker pool, at least once.
    let mut reader = Reader::new(
        ReaderConfig::new([broker.as_str()])
            .group_id(&group)
            .topic(&topic)
            .start_offset(StartOffset::First),
    )
    .await?;
    let mut lines = JsonLines::create(&path)?;

    let (tx, rx) = mpsc::channel::<Job>(CHANNEL);
    let rx = Arc::new(tokio::sync::Mutex::new(rx));
    let (processed, sum) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let workers: Vec<_> = (0..WORKERS)
        .map(|_| {
            let (rx, processed, sum) = (rx.clone(), processed.clone(), sum.clone());
            tokio::spawn(async move {
                loop {
                    let Some(job) = rx.lock().await.recv().await else {
                        break; // the channel is closed and drained
                    };
                    // The side effect: a slow computation, then the message is processed.
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    sum.fetch_add(reading(&job.message).unwrap_or(0), Ordering::Relaxed);
                    processed.fetch_add(1, Ordering::Relaxed);
                    job.ack.ack();
                }
            })
        })
        .collect();

    // The channel as a Sink: `send` waits while every slot is taken (backpressure).
    let worker_waits = Arc::new(AtomicU64::new(0));
    let to_workers = sink::unfold(
        (tx, worker_waits.clone()),
        |(tx, waits), job: Job| async move {
            let job = match tx.try_send(job) {
                Ok(()) => return Ok((tx, waits)),
                Err(mpsc::error::TrySendError::Full(job)) => job,
                Err(mpsc::error::TrySendError::Closed(job)) => {
                    job.ack.fail(); // a dropped ack would count as processed
                    return Err(kafkapipe::Error::closed("the worker pool stopped"));
                }
            };
            waits.fetch_add(1, Ordering::Relaxed);
            match tx.send(job).await {
                Ok(()) => Ok((tx, waits)),
                Err(mpsc::error::SendError(job)) => {
                    job.ack.fail();
                    Err(kafkapipe::Error::closed("the worker pool stopped"))
                }
            }
        },
    );

    let mut read = 0u64;
    (&mut reader)
        .take(sent as usize)
        .map_ok(|mut message| {
            read += 1;
            // One token, two owners: committed once the file and a worker are done.
            let ack = message.take_ack_token().share();
            Job { message, ack }
        })
        // Each job goes to both sinks (a clone to each); the channel sink is dropped when
        // `forward` returns, which closes the channel and lets the workers finish.
        .forward((&mut lines).fanout(to_workers))
        .await?;
    for w in workers {
        w.await?;
    }
    reader.close().await; // waits for the shared tokens, commits, leaves the group

    let on_disk = std::fs::read_to_string(&path)?.lines().count();
    std::fs::remove_file(&path)?;
    let committed: i64 = Admin::connect([broker.as_str()])?
        .fetch_group_offsets(&group, Some(&[topic.as_str()]))
        .await?
        .into_iter()
        .filter_map(|(_, r)| r.ok().map(|o| o.offset.max(0)))
        .sum();
    conn.delete_topics(&[topic.as_str()]).await?;

    let processed = processed.load(Ordering::Relaxed);
    let expected_sum: u64 = (0..N).sum();
    println!(
        "bridge: sent {sent} from a stream (writer buffer peaked at {peak} bytes of its bound \
         {WRITER_BUFFER} + one message of at most {largest}; the stream waited {waits} times), \
         read {read}, wrote {on_disk} JSON lines to {}, worker pool processed {processed} \
         (sum of readings {} of {expected_sum}; the reader waited for a free worker {} times, \
         {CHANNEL} slots, {WORKERS} workers), committed {committed}",
        path.display(),
        sum.load(Ordering::Relaxed),
        worker_waits.load(Ordering::Relaxed),
    );
    let all = [read, on_disk as u64, processed, committed as u64];
    if sent == N && all.iter().all(|&n| n == N) && sum.load(Ordering::Relaxed) == expected_sum {
        Ok(())
    } else {
        Err("the counts do not add up".into())
    }
}

/// One consumed message on its way to the file and the worker pool; cloned by `fanout`
/// (a reader message's clone carries no token, the shared ack is cloned).
#[derive(Clone)]
struct Job {
    message: reader::Message,
    ack: SharedAck,
}

fn reading(m: &reader::Message) -> Option<u64> {
    let v: serde_json::Value = serde_json::from_slice(m.value.as_deref()?).ok()?;
    v.get("reading")?.as_u64()
}

/// A `Sink` of jobs into a file of JSON lines. It holds each job's ack until a flush has
/// written its line to the file (`forward` flushes whenever the reader has nothing ready,
/// and at the end; `poll_ready` flushes every 256 lines), so the group never commits a
/// message whose line is still in a buffer. File I/O is blocking here for brevity.
struct JsonLines {
    file: std::io::BufWriter<std::fs::File>,
    held: Vec<SharedAck>,
}

impl JsonLines {
    fn create(path: &std::path::Path) -> std::io::Result<JsonLines> {
        Ok(JsonLines {
            file: std::io::BufWriter::new(std::fs::File::create(path)?),
            held: Vec::new(),
        })
    }

    /// Flush the file, then ack the lines it holds — or fail them if the flush failed.
    fn flush_and_ack(&mut self) -> kafkapipe::Result<()> {
        let flushed = self.file.flush();
        for ack in self.held.drain(..) {
            if flushed.is_ok() {
                ack.ack();
            } else {
                ack.fail();
            }
        }
        flushed.map_err(|e| kafkapipe::Error::io("writing the JSON lines", e))
    }
}

impl Drop for JsonLines {
    /// Lines never flushed are not processed (a dropped ack would count as processed).
    fn drop(&mut self) {
        for ack in self.held.drain(..) {
            ack.fail();
        }
    }
}

impl Sink<Job> for JsonLines {
    type Error = kafkapipe::Error;

    fn poll_ready(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<kafkapipe::Result<()>> {
        let this = self.get_mut();
        if this.held.len() >= 256 {
            this.flush_and_ack()?;
        }
        Poll::Ready(Ok(()))
    }

    fn start_send(self: Pin<&mut Self>, job: Job) -> kafkapipe::Result<()> {
        let this = self.get_mut();
        let m = &job.message;
        let text = |b: Option<&bytes::Bytes>| b.map(|b| String::from_utf8_lossy(b).into_owned());
        let line = serde_json::json!({
            "topic": &*m.topic,
            "partition": m.partition,
            "offset": m.offset,
            "timestamp": m.timestamp,
            "key": text(m.key.as_ref()),
            "value": text(m.value.as_ref()),
        });
        match writeln!(this.file, "{line}") {
            Ok(()) => {
                this.held.push(job.ack);
                Ok(())
            }
            Err(e) => {
                job.ack.fail();
                Err(kafkapipe::Error::io("writing the JSON lines", e))
            }
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<kafkapipe::Result<()>> {
        Poll::Ready(self.get_mut().flush_and_ack())
    }

    fn poll_close(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<kafkapipe::Result<()>> {
        self.poll_flush(cx)
    }
}
