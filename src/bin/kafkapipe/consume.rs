//! `consume TOPIC`: records → stdout, either by partition (`-p`, `-o`, `-e`: fetched
//! directly, nothing committed) or as a member of a consumer group (`-g`).
//!
//! Output goes through a buffer that is flushed whenever no further record is ready, so
//! a follower shows each record promptly while a backlog is written in large chunks. In a
//! group a record's offset is acked to the group only after the flush that wrote it
//! succeeded, so a commit never passes a record that did not reach stdout.

use std::collections::BTreeMap;
use std::io::{BufWriter, Write};
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use kafkapipe::admin::{Admin, OffsetSpec, TopicPartition};
use kafkapipe::conn::{Conn, FetchOptions};
use kafkapipe::group::AckToken;
use kafkapipe::reader::{Reader, ReaderConfig, StartOffset};

use crate::format::{Format, Rec};
use crate::produce::Progress;
use crate::settings::Settings;
use crate::shutdown::Shutdown;
use crate::{io, ConsumeArgs, Fail};

/// Flush (and ack) at least every this many records, even while more are ready.
const FLUSH_EVERY: usize = 10_000;

/// The buffered stdout records are written to.
type Out = BufWriter<std::io::StdoutLock<'static>>;

/// Run `consume`.
pub async fn run(brokers: &[String], settings: &Settings, args: &ConsumeArgs) -> Result<(), Fail> {
    let format = if args.json {
        Format::Json
    } else if let Some(f) = &args.format {
        Format::pattern(f).map_err(Fail::Usage)?
    } else {
        Format::Plain {
            key_sep: args.key_delimiter.clone(),
        }
    };
    let mut shutdown = Shutdown::install().map_err(|e| Fail::Run(format!("signals: {e}")))?;
    let mut out: Out = BufWriter::with_capacity(64 * 1024, std::io::stdout().lock());
    if let Some(group) = &args.share_group {
        let mut config = kafkapipe::share::ShareReaderConfig::new(brokers.to_vec(), group.as_str())
            .topic(args.topic.as_str());
        config.connection = settings.connection();
        config.max_wait = settings.fetch_options().max_wait;
        let mut c = Consumer {
            args,
            format: &format,
            out: &mut out,
            shutdown: &mut shutdown,
            progress: Progress::new("consumed", args.stats.every()),
        };
        return c.share(config, group).await;
    }
    match &args.group {
        Some(group) => {
            let start = match args.offset.as_str() {
                "beginning" | "earliest" => StartOffset::First,
                "end" | "latest" => StartOffset::Last,
                o => {
                    return Err(Fail::Usage(format!(
                        "with -g, -o is beginning or end (not {o:?})"
                    )))
                }
            };
            let config = settings.reader(
                ReaderConfig::new(brokers.to_vec())
                    .group_id(group.as_str())
                    .topic(args.topic.as_str())
                    .start_offset(start)
                    .group_protocol(if args.group_protocol == "consumer" {
                        kafkapipe::group::GroupProtocol::Consumer
                    } else {
                        kafkapipe::group::GroupProtocol::Classic
                    }),
            );
            let mut c = Consumer {
                args,
                format: &format,
                out: &mut out,
                shutdown: &mut shutdown,
                progress: Progress::new("consumed", args.stats.every()),
            };
            c.group(config, group).await
        }
        None => {
            let spec: OffsetSpec = args.offset.parse().map_err(Fail::Usage)?;
            let admin = Admin::new(settings.cluster(brokers)?);
            let opts = settings.fetch_options();
            let mut c = Consumer {
                args,
                format: &format,
                out: &mut out,
                shutdown: &mut shutdown,
                progress: Progress::new("consumed", args.stats.every()),
            };
            let r = c.partitions(&admin, spec, opts).await;
            admin.close().await;
            r
        }
    }
}

/// One run of `consume`: where records go and when to stop.
struct Consumer<'a> {
    args: &'a ConsumeArgs,
    format: &'a Format,
    out: &'a mut Out,
    shutdown: &'a mut Shutdown,
    progress: Progress,
}

impl Consumer<'_> {
    /// Whether `-c COUNT` records were printed.
    fn done(&self) -> bool {
        self.args.count.is_some_and(|c| self.progress.count >= c)
    }

    /// Flush stdout, then settle `held`: acked if the flush succeeded (those records are
    /// on stdout), failed otherwise (their partitions' commits stay before them).
    fn flush(&mut self, held: &mut Vec<AckToken>) -> Result<(), Fail> {
        match self.out.flush() {
            Ok(()) => {
                held.drain(..).for_each(AckToken::ack);
                Ok(())
            }
            Err(e) => {
                held.drain(..).for_each(AckToken::fail);
                Err(io(e))
            }
        }
    }

    /// As a member of `group`: print, flush, then ack; on a signal (or after `-c`)
    /// flush, commit what was printed and leave the group.
    async fn group(&mut self, config: ReaderConfig, group: &str) -> Result<(), Fail> {
        let mut reader = tokio::select! {
            biased;
            _ = self.shutdown.wait() => return Ok(()),
            r = Reader::new(config) => r?,
        };
        let mut held: Vec<AckToken> = Vec::new();
        let result = loop {
            if self.done() || self.shutdown.requested() {
                break Ok(());
            }
            // A record that is ready now; else flush what was printed, then wait.
            let next = match reader.next().now_or_never() {
                Some(next) => next,
                None => {
                    if let Err(e) = self.flush(&mut held) {
                        break Err(e);
                    }
                    tokio::select! {
                        biased;
                        _ = self.shutdown.wait() => break Ok(()),
                        next = reader.next() => next,
                    }
                }
            };
            let mut m = match next {
                Some(Ok(m)) => m,
                Some(Err(e)) => break Err(e.into()),
                None => break Ok(()),
            };
            held.push(m.take_ack_token());
            let rec = Rec {
                topic: &m.topic,
                partition: m.partition,
                offset: m.offset,
                timestamp: m.timestamp,
                key: m.key.as_ref(),
                value: m.value.as_ref(),
                headers: &m.headers,
            };
            if let Err(e) = self.format.write(&mut *self.out, &rec) {
                // Part of this record may have reached stdout: commit none of the held.
                held.drain(..).for_each(AckToken::fail);
                break Err(io(e));
            }
            self.progress.add_with(1, || {
                let s = reader.stats();
                format!("lag {}, {} errors, {} retries", s.lag, s.errors, s.retries)
            });
            if held.len() >= FLUSH_EVERY {
                if let Err(e) = self.flush(&mut held) {
                    break Err(e);
                }
            }
        };
        // Whatever the reason for stopping: what reached stdout is committed by close,
        // which also leaves the group.
        let flushed = self.flush(&mut held);
        reader.close().await;
        let how = if self.shutdown.requested() {
            " (stopped by signal)"
        } else {
            ""
        };
        eprintln!(
            "% {} from {} in group {group}{how}",
            self.progress.line(),
            self.args.topic
        );
        result.and(flushed)
    }

    /// As a member of share group `group`: print, flush, then accept; on a signal (or
    /// after `-c`) flush, accept what was printed, release the rest and leave.
    async fn share(
        &mut self,
        config: kafkapipe::share::ShareReaderConfig,
        group: &str,
    ) -> Result<(), Fail> {
        let mut reader = tokio::select! {
            biased;
            _ = self.shutdown.wait() => return Ok(()),
            r = kafkapipe::share::ShareReader::new(config) => r?,
        };
        let mut held: Vec<AckToken> = Vec::new();
        let result = loop {
            if self.done() || self.shutdown.requested() {
                break Ok(());
            }
            let next = match reader.next().now_or_never() {
                Some(next) => next,
                None => {
                    if let Err(e) = self.flush(&mut held) {
                        break Err(e);
                    }
                    tokio::select! {
                        biased;
                        _ = self.shutdown.wait() => break Ok(()),
                        next = reader.next() => next,
                    }
                }
            };
            let mut m = match next {
                Some(Ok(m)) => m,
                Some(Err(e)) => break Err(e.into()),
                None => break Ok(()),
            };
            held.push(m.take_ack_token());
            let rec = Rec {
                topic: &m.topic,
                partition: m.partition,
                offset: m.offset,
                timestamp: m.timestamp,
                key: m.key.as_ref(),
                value: m.value.as_ref(),
                headers: &m.headers,
            };
            if let Err(e) = self.format.write(&mut *self.out, &rec) {
                // part of it may be on stdout: release the held records to other members
                held.drain(..).for_each(AckToken::release);
                break Err(io(e));
            }
            self.progress.add_with(1, || {
                let s = reader.stats();
                format!(
                    "{} in flight, {} accepted, {} released, {} rejected",
                    s.in_flight, s.accepted, s.released, s.rejected
                )
            });
            if held.len() >= FLUSH_EVERY {
                if let Err(e) = self.flush(&mut held) {
                    break Err(e);
                }
            }
        };
        // printed and flushed: accepted; everything else the reader holds is released
        let flushed = self.flush(&mut held);
        let closed = reader.close().await;
        let how = if self.shutdown.requested() {
            " (stopped by signal)"
        } else {
            ""
        };
        eprintln!(
            "% {} from {} in share group {group}{how}",
            self.progress.line(),
            self.args.topic
        );
        result.and(flushed).and(closed.map_err(Fail::from))
    }

    /// Without a group: fetch the chosen partitions from their leaders, from the `-o`
    /// offsets, until `-e` (every partition's end), `-c`, or a signal.
    async fn partitions(
        &mut self,
        admin: &Admin,
        spec: OffsetSpec,
        mut opts: FetchOptions,
    ) -> Result<(), Fail> {
        let topic = self.args.topic.as_str();
        let cluster = admin.cluster();
        let all = cluster.partitions(topic).await?;
        let partitions: Vec<i32> = if self.args.partitions.is_empty() {
            all
        } else {
            for p in &self.args.partitions {
                if !all.contains(p) {
                    return Err(Fail::Run(format!("{topic} has no partition {p}")));
                }
            }
            self.args.partitions.clone()
        };
        let exit_at_end = self.args.exit_at_end;

        // Start offsets, and end offsets for -e (and relative -N starts).
        let tps: Vec<TopicPartition> = partitions
            .iter()
            .map(|p| TopicPartition::new(topic, *p))
            .collect();
        let lookup = |s: OffsetSpec| {
            let specs: Vec<(TopicPartition, OffsetSpec)> =
                tps.iter().map(|tp| (tp.clone(), s)).collect();
            async move {
                let mut m = BTreeMap::new();
                for (tp, r) in admin.list_offsets(&specs).await? {
                    m.insert(tp.partition, r?.offset);
                }
                Ok::<_, Fail>(m)
            }
        };
        let ends = lookup(OffsetSpec::Latest).await?;
        let starts: BTreeMap<i32, i64> = match spec {
            OffsetSpec::Offset(n) if n < 0 => {
                let earliest = lookup(OffsetSpec::Earliest).await?;
                ends.iter()
                    .map(|(p, e)| (*p, (e + n).max(earliest.get(p).copied().unwrap_or(0))))
                    .collect()
            }
            OffsetSpec::Timestamp(_) => lookup(spec)
                .await?
                .into_iter()
                .map(|(p, o)| {
                    (
                        p,
                        if o < 0 {
                            ends.get(&p).copied().unwrap_or(0)
                        } else {
                            o
                        },
                    )
                })
                .collect(),
            s => lookup(s).await?,
        };

        struct Cursor {
            partition: i32,
            next: i64,
            end: i64,
        }
        let mut cursors: Vec<Cursor> = partitions
            .iter()
            .map(|p| Cursor {
                partition: *p,
                next: starts.get(p).copied().unwrap_or(0),
                end: ends.get(p).copied().unwrap_or(0),
            })
            .collect();
        if exit_at_end {
            // Nothing waits for new records: answer at once when a partition is at its end.
            opts.max_wait = opts.max_wait.min(Duration::from_millis(50));
        }
        let result = 'outer: loop {
            if self.done() || (exit_at_end && cursors.iter().all(|c| c.next >= c.end)) {
                break Ok(());
            }
            let fetches = cursors
                .iter()
                .filter(|c| !(exit_at_end && c.next >= c.end))
                .map(|c| {
                    let (partition, offset) = (c.partition, c.next);
                    let opts = &opts;
                    async move {
                        let leader = cluster.leader_for(topic, partition).await?;
                        let conn = Conn::from_connection(cluster.connection(leader).await?);
                        let r = conn.fetch(topic, partition, offset, opts).await;
                        if r.as_ref().is_err_and(|e| e.is_retriable()) {
                            cluster.invalidate(topic);
                        }
                        r.map(|f| (partition, f))
                    }
                });
            let round = tokio::select! {
                biased;
                _ = self.shutdown.wait() => break Ok(()),
                r = futures::future::join_all(fetches) => r,
            };
            let mut progressed = false;
            for r in round {
                let (partition, fetched) = match r {
                    Ok(x) => x,
                    Err(e) if e.is_retriable() => {
                        eprintln!("% fetch failed, retrying: {e}");
                        tokio::time::sleep(Duration::from_millis(200)).await;
                        continue;
                    }
                    Err(e) => break 'outer Err(e.into()),
                };
                let Some(c) = cursors.iter_mut().find(|c| c.partition == partition) else {
                    continue;
                };
                for r in &fetched.records {
                    if self.done() {
                        break;
                    }
                    let rec = Rec {
                        topic,
                        partition,
                        offset: r.offset,
                        timestamp: r.timestamp,
                        key: r.key.as_ref(),
                        value: r.value.as_ref(),
                        headers: &r.headers,
                    };
                    if let Err(e) = self.format.write(&mut *self.out, &rec) {
                        break 'outer Err(io(e));
                    }
                    let lag = fetched.high_watermark - r.offset - 1;
                    self.progress
                        .add_with(1, || format!("partition {partition} lag {lag}"));
                }
                if fetched.next_offset > c.next {
                    c.next = fetched.next_offset;
                    progressed = true;
                }
            }
            // Nothing more is ready before the next round trip: show what was printed.
            if let Err(e) = self.out.flush() {
                break Err(io(e));
            }
            if !progressed && exit_at_end {
                // Nothing new although the end looked further on (the end offsets were
                // read before the fetches, and a fetch may find nothing readable below
                // them): stop rather than spin.
                break Ok(());
            }
        };
        let flushed = self.out.flush().map_err(io);
        let how = if self.shutdown.requested() {
            " (stopped by signal)"
        } else {
            ""
        };
        eprintln!("% {} from {topic}{how}", self.progress.line());
        result.and(flushed)
    }
}
