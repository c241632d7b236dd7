//! kafkapipe's side of `benches/compare` (`cargo bench --bench compare_peer -- MODE …`):
//! one client process per run, with the same flags as the Go peers in
//! `benches/compare/go/`, so `benches/compare/run.sh` can time it with `/usr/bin/time`
//! exactly like every other client.
//!
//! ```text
//! compare_peer produce  --brokers B --topic T --count N --size S [--compression none|lz4|zstd|…]
//!                       [--acks 0|1|all] [--linger-ms 5] [--batch-bytes 1048576]
//!                       [--batch-msgs 10000] [--idempotent false]
//!                       [--balancer round-robin|sticky] [--sticky-bytes N]
//! (`KAFKAPIPE_COMPARE_STATS=1`: `produce` also prints the Writer's stats to stderr.)
//! compare_peer consume  --brokers B --topic T[,T2…] --count N [--group G] [--check-crcs false]
//!                        [--queue-bytes N]
//! compare_peer latency  --brokers B --topic T --count N --size S --rate R
//!                       [--e2e shared|separate|false]
//!                       [produce flags]
//! compare_peer create-topic --brokers B --topic T --partitions P
//! compare_peer delete-topic --brokers B --topic T
//! ```
//!
//! `produce` writes N unkeyed values of S bytes through the `Writer` sink and closes it
//! (every message acknowledged); `consume` reads N messages from the first offset of every
//! partition (as a member of consumer group G with `--group`: acknowledgement tracking and
//! commits included). Each prints one JSON line with its own timing; the harness uses the process
//! numbers from `/usr/bin/time` (CPU, wall, peak RSS) for the table.
//! `KAFKAPIPE_COMPARE_FETCH_SESSIONS=0` makes `consume` send full fetches only
//! (`ReaderConfig::fetch_sessions(false)`).
//!
//! `latency` creates the topic itself, starts a `Reader` on it (on the writer's runtime;
//! `--e2e separate`: on a runtime and thread of its own; `--e2e false`: none, produce
//! latency only), then offers N messages at R
//! msgs/s on a fixed schedule (paced by `std::thread::sleep` on a thread of its own, never
//! before the due time): message i is due at `t0 + i/R`, whenever it is actually
//! handed to the writer, and its latencies are measured from that due time (no coordinated
//! omission: a stall delays every message behind it and all of them count). The due time
//! (ns since the Unix epoch) is the value's first 8 bytes and also the record's CreateTime
//! (ms); the next 8 bytes are the message's index. Produce latency = acknowledgement (from
//! [`Writer::deliveries`]) − due time; end-to-end = consumed by the reader − due time. The
//! same two are also given from the time the message was actually handed to the writer
//! (`produce_from_send`, `e2e_from_send`), which is what librdkafka's `rdkafka_performance -l`
//! measures. Prints p50/p99/p99.9/max in ms, and the writer's batch count, queue time
//! (first message accepted → batch sent) and produce request time from
//! [`Writer::stats`].
//!
//! With no mode (as under `cargo test --all-targets`) it prints the usage and exits 0.

use std::collections::HashMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use futures::{stream, SinkExt, StreamExt};
use kafkapipe::compression::Compression;
use kafkapipe::conn::{Conn, RequiredAcks};
use kafkapipe::reader::{Reader, ReaderConfig, StartOffset};
use kafkapipe::writer::{Message, RoundRobin, Sticky, Writer, WriterConfig};
use kafkapipe::{Error, Result};

const USAGE: &str = "usage: compare_peer produce|consume|latency|create-topic|delete-topic \
--brokers B --topic T [--count N] [--size S] [--partitions P] [--compression C] [--acks 0|1|all] \
[--linger-ms MS] [--batch-bytes N] [--batch-msgs N] [--idempotent true|false] \
[--balancer round-robin|sticky] [--rate MSGS_PER_SEC]";

struct Opts {
    mode: String,
    flags: HashMap<String, String>,
}

impl Opts {
    fn parse() -> Result<Option<Opts>> {
        let mut args = std::env::args().skip(1).filter(|a| a != "--bench");
        // No mode, or only libtest-style flags (`cargo test --all-targets -- --nocapture`):
        // nothing to do.
        let Some(mode) = args.next().filter(|m| !m.starts_with('-')) else {
            return Ok(None);
        };
        let mut flags = HashMap::new();
        while let Some(arg) = args.next() {
            let Some(name) = arg.strip_prefix("--") else {
                return Err(Error::config(format!(
                    "unexpected argument {arg:?}\n{USAGE}"
                )));
            };
            let (name, value) = match name.split_once('=') {
                Some((n, v)) => (n.to_string(), v.to_string()),
                None => {
                    let v = args
                        .next()
                        .ok_or_else(|| Error::config(format!("--{name} needs a value")))?;
                    (name.to_string(), v)
                }
            };
            flags.insert(name, value);
        }
        Ok(Some(Opts { mode, flags }))
    }

    fn str(&self, name: &str) -> Result<&str> {
        self.flags
            .get(name)
            .map(String::as_str)
            .ok_or_else(|| Error::config(format!("--{name} is required\n{USAGE}")))
    }

    fn num<T: std::str::FromStr>(&self, name: &str, default: Option<T>) -> Result<T> {
        match self.flags.get(name) {
            Some(v) => v
                .parse()
                .map_err(|_| Error::config(format!("--{name}: not a number: {v:?}"))),
            None => default.ok_or_else(|| Error::config(format!("--{name} is required\n{USAGE}"))),
        }
    }

    fn writer_config(&self, brokers: &str, topic: &str) -> Result<WriterConfig> {
        let compression: Compression = self
            .flags
            .get("compression")
            .map_or(Ok(Compression::None), |c| c.parse())?;
        let acks = match self.flags.get("acks").map_or("all", String::as_str) {
            "0" => RequiredAcks::None,
            "1" => RequiredAcks::Leader,
            "all" | "-1" => RequiredAcks::All,
            other => return Err(Error::config(format!("--acks: {other:?}"))),
        };
        let batch_bytes = self.num("batch-bytes", Some(1024 * 1024))?;
        let config = WriterConfig::new(brokers.split(','));
        // `--balancer`, else `KAFKAPIPE_COMPARE_BALANCER`: round robin (as kafka-go; the
        // rows measured so far), or sticky placement of the unkeyed messages (the writer's
        // default balancer), switching partitions after a batch's worth of bytes.
        let balancer = match self.flags.get("balancer") {
            Some(b) => b.clone(),
            None => std::env::var("KAFKAPIPE_COMPARE_BALANCER")
                .unwrap_or_else(|_| "round-robin".to_string()),
        };
        let config = match balancer.as_str() {
            "round-robin" => config.balancer(RoundRobin::default()),
            "sticky" => config
                .balancer(Sticky::new().switch_bytes(self.num("sticky-bytes", Some(batch_bytes))?)),
            other => return Err(Error::config(format!("--balancer: {other:?}"))),
        };
        Ok(config
            .topic(topic)
            .batch_size(self.num("batch-msgs", Some(10_000))?)
            .batch_bytes(batch_bytes)
            .batch_timeout(Duration::from_millis(self.num("linger-ms", Some(5))?))
            .compression(compression)
            .required_acks(acks)
            .idempotent(self.idempotent()))
    }
}

impl Opts {
    /// `--idempotent true|false`, else `KAFKAPIPE_COMPARE_IDEMPOTENT=1`; off by default,
    /// like every peer in the harness (`enable.idempotence=false`), although the writer's
    /// own default is on with acks=all.
    fn idempotent(&self) -> bool {
        match self.flags.get("idempotent") {
            Some(v) => v == "true",
            None => std::env::var("KAFKAPIPE_COMPARE_IDEMPOTENT").is_ok_and(|v| v == "1"),
        }
    }
}

fn main() -> Result<()> {
    let Some(opts) = Opts::parse()? else {
        eprintln!("{USAGE}");
        return Ok(());
    };
    // Built with feature `metrics` (the cost comparison in BENCHMARKS.md): the clients
    // publish into a real Prometheus recorder, rendered once at the end as a scrape would.
    #[cfg(feature = "metrics")]
    let prometheus = metrics_exporter_prometheus::PrometheusBuilder::new()
        .install_recorder()
        .map_err(|e| Error::config(format!("installing the metrics recorder: {e}")))?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| Error::io("starting the Tokio runtime", e))?;
    let result = runtime.block_on(async {
        match opts.mode.as_str() {
            "produce" => produce(&opts).await,
            "consume" => consume(&opts).await,
            "latency" => latency(&opts).await,
            "create-topic" => {
                let conn = Conn::connect(first_broker(&opts)?).await?;
                let (topic, partitions) = (opts.str("topic")?, opts.num("partitions", Some(1))?);
                conn.create_topic(topic, partitions, 1).await?;
                wait_for_leaders(&conn, topic, partitions).await?;
                conn.close().await;
                Ok(())
            }
            "delete-topic" => {
                let conn = Conn::connect(first_broker(&opts)?).await?;
                let topic = opts.str("topic")?;
                for (_, result) in conn.delete_topics(&[topic]).await? {
                    result?;
                }
                conn.close().await;
                Ok(())
            }
            other => Err(Error::config(format!("unknown mode {other:?}\n{USAGE}"))),
        }
    });
    #[cfg(feature = "metrics")]
    eprintln!(
        "metrics: {} bytes of exposition text",
        prometheus.render().len()
    );
    result
}

/// Wait (at most 10 s) until metadata lists every partition of a new topic with a leader,
/// plus a moment for the broker to host them: some clients (kafka-go) fail at once on
/// `UNKNOWN_TOPIC_OR_PARTITION` instead of retrying.
async fn wait_for_leaders(conn: &Conn, topic: &str, partitions: i32) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let md = conn.metadata(Some(&[topic])).await?;
        let ready = md.topics.iter().any(|t| {
            t.name == topic
                && t.error.is_none()
                && t.partitions.len() == partitions as usize
                && t.partitions.iter().all(|p| p.leader >= 0)
        });
        if ready || Instant::now() > deadline {
            tokio::time::sleep(Duration::from_millis(100)).await;
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn first_broker(opts: &Opts) -> Result<&str> {
    Ok(opts.str("brokers")?.split(',').next().unwrap_or_default())
}

fn report(client_secs: f64, msgs: usize, bytes: usize) {
    println!(
        "{{\"client\":\"kafkapipe\",\"msgs\":{msgs},\"bytes\":{bytes},\"secs\":{client_secs:.3},\
         \"msgs_per_sec\":{:.0},\"mb_per_sec\":{:.2}}}",
        msgs as f64 / client_secs,
        bytes as f64 / client_secs / 1e6
    );
}

async fn produce(opts: &Opts) -> Result<()> {
    let (brokers, topic) = (opts.str("brokers")?, opts.str("topic")?);
    let count: usize = opts.num("count", None)?;
    let size: usize = opts.num("size", Some(100))?;
    let mut writer = Writer::new(opts.writer_config(brokers, topic)?)?;
    let value = Bytes::from(vec![b'x'; size]);
    let started = Instant::now();
    stream::iter(0..count)
        .map(|_| Ok(Message::new(value.clone())))
        .forward(&mut writer)
        .await?;
    writer.close().await?;
    if std::env::var_os("KAFKAPIPE_COMPARE_STATS").is_some() {
        eprintln!("{:?}", writer.stats());
    }
    report(started.elapsed().as_secs_f64(), count, count * size);
    Ok(())
}

async fn consume(opts: &Opts) -> Result<()> {
    let (brokers, topic) = (opts.str("brokers")?, opts.str("topic")?);
    let count: usize = opts.num("count", None)?;
    // `--topic a,b,c`: every partition of each (the many-topics rows of BENCHMARKS.md).
    let mut config = topic
        .split(',')
        .fold(ReaderConfig::new(brokers.split(',')), |c, t| c.topic(t))
        .start_offset(StartOffset::First);
    // `KAFKAPIPE_COMPARE_FETCH_SESSIONS=0`: full fetches only (the fetch sessions A/B of
    // BENCHMARKS.md).
    if std::env::var("KAFKAPIPE_COMPARE_FETCH_SESSIONS").is_ok_and(|v| v == "0") {
        config = config.fetch_sessions(false);
    }
    if let Some(group) = opts.flags.get("group") {
        config = config.group_id(group.as_str());
    }
    if let Some(check) = opts.flags.get("check-crcs") {
        config = config.check_crcs(check != "false");
    }
    if opts.flags.contains_key("queue-bytes") {
        config = config.queue_capacity_bytes(opts.num("queue-bytes", None)?);
    }
    let mut reader = Reader::new(config).await?;
    let started = Instant::now();
    let mut bytes = 0usize;
    for _ in 0..count {
        let m = reader.next_message().await?;
        bytes += m.key.as_ref().map_or(0, |k| k.len()) + m.value.as_ref().map_or(0, |v| v.len());
    }
    let secs = started.elapsed().as_secs_f64();
    reader.close().await;
    report(secs, count, bytes);
    Ok(())
}

fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// The due time (ns since the epoch) and the message's index, from the value's first
/// 16 bytes.
fn stamp_of(value: Option<&Bytes>) -> Option<(u64, usize)> {
    let v = value?;
    let due: [u8; 8] = v.get(..8)?.try_into().ok()?;
    let index: [u8; 8] = v.get(8..16)?.try_into().ok()?;
    Some((u64::from_le_bytes(due), u64::from_le_bytes(index) as usize))
}

/// `{"p50_ms":…,"p99_ms":…,"p999_ms":…,"max_ms":…}` of latencies in ns.
fn percentiles(mut ns: Vec<u64>) -> String {
    ns.sort_unstable();
    let at = |q: f64| {
        let i = ((ns.len() as f64 * q).ceil() as usize).clamp(1, ns.len().max(1)) - 1;
        ns.get(i).map_or(f64::NAN, |&v| v as f64 / 1e6)
    };
    format!(
        "{{\"n\":{},\"p50_ms\":{:.3},\"p99_ms\":{:.3},\"p999_ms\":{:.3},\"max_ms\":{:.3}}}",
        ns.len(),
        at(0.5),
        at(0.99),
        at(0.999),
        at(1.0)
    )
}

/// Read `count` messages: when each (by index) was consumed, and the largest skew
/// between a record's CreateTime and its due time (ms).
async fn consume_stamps(mut reader: Reader, count: usize) -> Result<(Vec<(usize, u64)>, i64)> {
    let mut seen = Vec::with_capacity(count);
    let mut create_time_skew_ms = 0i64;
    for _ in 0..count {
        let m = reader.next_message().await?;
        let now = now_ns();
        if let Some((due, i)) = stamp_of(m.value.as_ref()) {
            seen.push((i, now));
            create_time_skew_ms =
                create_time_skew_ms.max((m.timestamp - (due / 1_000_000) as i64).abs());
        }
    }
    reader.close().await;
    Ok((seen, create_time_skew_ms))
}

async fn latency(opts: &Opts) -> Result<()> {
    let (brokers, topic) = (opts.str("brokers")?, opts.str("topic")?);
    let count: usize = opts.num("count", None)?;
    let size: usize = opts.num::<usize>("size", Some(100))?.max(16);
    let rate: f64 = opts.num("rate", Some(10_000.0))?;
    let partitions: i32 = opts.num("partitions", Some(1))?;
    let conn = Conn::connect(first_broker(opts)?).await?;
    conn.create_topic(topic, partitions, 1).await?;
    conn.close().await;

    // The reader: when each message was consumed. `--e2e shared` (the default): on the
    // writer's runtime; `separate`: on a runtime and thread of its own, not sharing the
    // writer's runtime threads (as librdkafka's consumer is a process of its own);
    // `false`: none (produce latency only).
    let e2e = opts.flags.get("e2e").map_or("shared", String::as_str);
    let reader_config = ReaderConfig::new(brokers.split(','))
        .topic(topic)
        .start_offset(StartOffset::First);
    let (done_tx, consumer) = tokio::sync::oneshot::channel();
    match e2e {
        "false" => {
            let _ = done_tx.send(Ok((Vec::new(), 0)));
        }
        "shared" => {
            let reader = Reader::new(reader_config).await?;
            tokio::spawn(async move {
                let _ = done_tx.send(consume_stamps(reader, count).await);
            });
        }
        "separate" => {
            let (ready_tx, ready) = tokio::sync::oneshot::channel();
            std::thread::Builder::new()
                .name("e2e-reader".into())
                .spawn(move || {
                    let runtime = match tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                    {
                        Ok(rt) => rt,
                        Err(e) => {
                            let _ = ready_tx.send(Err(Error::io("the reader's runtime", e)));
                            return;
                        }
                    };
                    runtime.block_on(async move {
                        match Reader::new(reader_config).await {
                            Ok(reader) => {
                                let _ = ready_tx.send(Ok(()));
                                let _ = done_tx.send(consume_stamps(reader, count).await);
                            }
                            Err(e) => {
                                let _ = ready_tx.send(Err(e));
                            }
                        }
                    });
                })
                .map_err(|e| Error::io("starting the reader's thread", e))?;
            ready
                .await
                .map_err(|_| Error::protocol("the reader's thread ended"))??;
        }
        other => return Err(Error::config(format!("--e2e: {other:?}"))),
    }

    let mut writer = Writer::new(opts.writer_config(brokers, topic)?)?;
    let mut deliveries = writer.deliveries();
    let acks = tokio::spawn(async move {
        let mut acked = Vec::with_capacity(count);
        while let Some(d) = deliveries.next().await {
            let now = now_ns();
            d.result?;
            if let Some((_, i)) = stamp_of(d.message.value.as_ref()) {
                acked.push((i, now));
            }
            if acked.len() == count {
                break;
            }
        }
        Ok::<_, Error>(acked)
    });

    // The generator runs on a thread of its own and paces with `std::thread::sleep`
    // (a nanosecond timer), not Tokio's millisecond timer: on Tokio's, the sends of a
    // millisecond went out in a burst up to 2 ms after their due times, lateness of the
    // load generator that the due-time latencies charged to the writer. It never sends a
    // message before its due time; a sleep's overshoot (tens of µs) stays in the
    // due-time numbers.
    let filler = vec![b'x'; size - 16];
    let t0 = now_ns() + 20_000_000; // start 20 ms from now
    let interval = 1e9 / rate;
    let started = Instant::now();
    let generator = tokio::task::spawn_blocking(move || {
        let mut late_sends = 0usize;
        // When each message was due, and when it was actually handed to the writer.
        let (mut due_at, mut sent_at) = (Vec::with_capacity(count), Vec::with_capacity(count));
        for i in 0..count {
            let due = t0 + (i as f64 * interval) as u64;
            let now = now_ns();
            if due > now {
                std::thread::sleep(Duration::from_nanos(due - now));
            } else if now - due > 1_000_000 {
                late_sends += 1;
            }
            let mut value = Vec::with_capacity(size);
            value.extend_from_slice(&due.to_le_bytes());
            value.extend_from_slice(&(i as u64).to_le_bytes());
            value.extend_from_slice(&filler);
            due_at.push(due);
            sent_at.push(now_ns());
            futures::executor::block_on(
                writer.feed(Message::new(value).with_timestamp((due / 1_000_000) as i64)),
            )?;
        }
        Ok::<_, Error>((writer, due_at, sent_at, late_sends))
    });
    let (mut writer, due_at, sent_at, late_sends) = generator
        .await
        .map_err(|e| Error::protocol(format!("generator: {e}")))??;
    writer.flush().await?;
    let offered_secs = started.elapsed().as_secs_f64();
    let acked = acks
        .await
        .map_err(|e| Error::protocol(format!("delivery task: {e}")))??;
    let (seen, skew) = consumer
        .await
        .map_err(|_| Error::protocol("the reader ended without an answer"))??;
    // The writer's own view: how long batches waited before they were sent (linger and
    // in-flight limits) and how long produce requests took, to tell the two apart.
    let stats = writer.stats();
    writer.close().await?;
    // Latencies from the due time (no coordinated omission) and from the actual send (what
    // librdkafka's `rdkafka_performance -l` measures).
    let since = |events: &[(usize, u64)], from: &[u64]| -> Vec<u64> {
        events
            .iter()
            .filter_map(|&(i, t)| from.get(i).map(|&f| t.saturating_sub(f)))
            .collect()
    };
    println!(
        "{{\"client\":\"kafkapipe\",\"msgs\":{count},\"size\":{size},\"rate\":{rate},\
         \"achieved_rate\":{:.0},\"sent_over_1ms_late\":{late_sends},\
         \"create_time_max_skew_ms\":{skew},\"produce\":{},\"e2e\":{},\
         \"produce_from_send\":{},\"e2e_from_send\":{},\"batches\":{},\
         \"queue_time_avg_ms\":{:.3},\"queue_time_max_ms\":{:.3},\
         \"write_time_avg_ms\":{:.3},\"write_time_max_ms\":{:.3}}}",
        count as f64 / offered_secs,
        percentiles(since(&acked, &due_at)),
        percentiles(since(&seen, &due_at)),
        percentiles(since(&acked, &sent_at)),
        percentiles(since(&seen, &sent_at)),
        stats.batches,
        stats.queue_time_avg.as_secs_f64() * 1e3,
        stats.queue_time_max.as_secs_f64() * 1e3,
        stats.write_time_avg.as_secs_f64() * 1e3,
        stats.write_time_max.as_secs_f64() * 1e3,
    );
    Ok(())
}
