//! The `kafkapipe` command line tool's commands, as a module so that tests can run them
//! in-process (`tests/cli_broker.rs`) and `examples/kafkapipe.rs` is only `main`.

use std::collections::BTreeMap;
use std::io::{BufRead, Write};
use std::time::{Duration, Instant};

use futures::SinkExt;
use kafkapipe::admin::{Admin, ConfigResource, OffsetSpec, TopicPartition};
use kafkapipe::cluster::Cluster;
use kafkapipe::conn::{Conn, FetchOptions, NewTopic};
use kafkapipe::writer::{Message, Writer, WriterConfig};

pub const USAGE: &str = "\
usage: kafkapipe [-b BROKER] COMMAND [ARGS]

  -b BROKER   bootstrap broker host:port (default 127.0.0.1:9092)

commands:
  topics [list]                                list topics
  topics create NAME [-p N] [-r R] [-c K=V]... create a topic (N partitions, factor R)
  topics delete NAME...                        delete topics
  topics describe NAME...                      partitions, leaders, replicas, ISR, configs
  produce TOPIC [-k SEP] [-p PARTITION]        stdin lines -> records (key SEP value)
  consume TOPIC [-p P,P..] [-o OFFSET] [-c COUNT] [-e] [-k SEP]
                                               records -> stdout lines; OFFSET is
                                               beginning, end, N, -N (N before the end)
                                               or @MS (first record at/after a time);
                                               -e exits at the end of every partition
  consume TOPIC -g GROUP [-o beginning|end] [-c COUNT] [-k SEP]
                                               as a group member, committing each
                                               record after printing it
  groups [list]                                list consumer groups
  groups describe GROUP                        members, assignments, committed offsets, lag
  groups delete GROUP...                       delete groups
  offsets TOPIC                                earliest and latest offset per partition
  cluster                                      cluster id, controller, brokers
";

/// Run one command. `input` is stdin, `out` stdout (the data), `err` stderr (progress
/// and summaries).
pub async fn run(
    args: &[String],
    input: &mut dyn BufRead,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<(), String> {
    let mut broker = "127.0.0.1:9092".to_string();
    let mut rest = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "-b" | "--broker" => broker = it.next().ok_or("-b needs a host:port")?.clone(),
            "-h" | "--help" => {
                write!(out, "{USAGE}").map_err(io)?;
                return Ok(());
            }
            _ => rest.push(a.clone()),
        }
    }
    let Some((cmd, rest)) = rest.split_first() else {
        return Err(format!("no command\n{USAGE}"));
    };
    let admin = Admin::connect([broker.clone()]).map_err(|e| e.to_string())?;
    let r = match cmd.as_str() {
        "topics" => topics(&admin, rest, out).await,
        "produce" => produce(&broker, rest, input, err).await,
        "consume" => consume(&admin, rest, out, err).await,
        "groups" => groups(&admin, rest, out).await,
        "offsets" => offsets(&admin, rest, out).await,
        "cluster" => cluster(&admin, out).await,
        other => Err(format!("unknown command {other:?}\n{USAGE}")),
    };
    admin.close().await;
    r
}

/// The error text of a closed stdout (`kafkapipe consume t | head`), which `main` treats
/// as a normal end.
pub const BROKEN_PIPE: &str = "output closed";

fn io(e: std::io::Error) -> String {
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        BROKEN_PIPE.to_string()
    } else {
        format!("write failed: {e}")
    }
}

fn kerr(e: kafkapipe::Error) -> String {
    e.to_string()
}

/// Flags of a subcommand: `-x VALUE` pairs (repeatable), bare switches and positionals.
struct Flags {
    values: Vec<(String, String)>,
    switches: Vec<String>,
    positional: Vec<String>,
}

fn parse(args: &[String], with_value: &[&str], switches: &[&str]) -> Result<Flags, String> {
    let mut f = Flags {
        values: Vec::new(),
        switches: Vec::new(),
        positional: Vec::new(),
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if with_value.contains(&a.as_str()) {
            let v = it.next().ok_or_else(|| format!("{a} needs a value"))?;
            f.values.push((a.clone(), v.clone()));
        } else if switches.contains(&a.as_str()) {
            f.switches.push(a.clone());
        } else if a.starts_with('-') && a.len() > 1 && a.parse::<i64>().is_err() {
            return Err(format!("unknown flag {a}"));
        } else {
            f.positional.push(a.clone());
        }
    }
    Ok(f)
}

impl Flags {
    fn get(&self, flag: &str) -> Option<&str> {
        self.values
            .iter()
            .rev()
            .find(|(k, _)| k == flag)
            .map(|(_, v)| v.as_str())
    }

    fn all<'a>(&'a self, flag: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.values
            .iter()
            .filter(move |(k, _)| k == flag)
            .map(|(_, v)| v.as_str())
    }

    fn has(&self, switch: &str) -> bool {
        self.switches.iter().any(|s| s == switch)
    }

    fn num<T: std::str::FromStr>(&self, flag: &str) -> Result<Option<T>, String> {
        self.get(flag)
            .map(|v| v.parse().map_err(|_| format!("{flag}: bad number {v:?}")))
            .transpose()
    }
}

async fn topics(admin: &Admin, args: &[String], out: &mut dyn Write) -> Result<(), String> {
    let (sub, rest) = match args.split_first() {
        Some((s, r)) => (s.as_str(), r),
        None => ("list", args),
    };
    match sub {
        "list" => {
            for t in admin.list_topics().await.map_err(kerr)? {
                writeln!(out, "{}\t{}", t.name, t.partitions).map_err(io)?;
            }
            Ok(())
        }
        "create" => {
            let f = parse(rest, &["-p", "-r", "-c"], &[])?;
            let [name] = f.positional.as_slice() else {
                return Err("topics create NAME [-p N] [-r R] [-c K=V]".into());
            };
            let mut topic = NewTopic::new(name, f.num("-p")?.unwrap_or(1))
                .replication_factor(f.num("-r")?.unwrap_or(-1));
            for kv in f.all("-c") {
                let (k, v) = kv.split_once('=').ok_or("-c wants KEY=VALUE")?;
                topic = topic.config(k, v);
            }
            report(admin.create_topics(&[topic], false).await, "created", out)
        }
        "delete" => {
            let names: Vec<&str> = rest.iter().map(String::as_str).collect();
            if names.is_empty() {
                return Err("topics delete NAME...".into());
            }
            report(admin.delete_topics(&names).await, "deleted", out)
        }
        "describe" => {
            let names: Vec<&str> = rest.iter().map(String::as_str).collect();
            if names.is_empty() {
                return Err("topics describe NAME...".into());
            }
            let described = admin.describe_topics(&names).await.map_err(kerr)?;
            let resources: Vec<ConfigResource> =
                names.iter().map(|n| ConfigResource::topic(*n)).collect();
            let configs = admin.describe_configs(&resources, None).await.ok();
            let mut failed = false;
            for (i, (name, r)) in described.into_iter().enumerate() {
                match r {
                    Err(e) => {
                        writeln!(out, "{name}: {e}").map_err(io)?;
                        failed = true;
                    }
                    Ok(t) => {
                        writeln!(out, "topic {name} partitions {}", t.partitions.len())
                            .map_err(io)?;
                        for p in &t.partitions {
                            writeln!(
                                out,
                                "  partition {} leader {} replicas {:?} isr {:?}",
                                p.id, p.leader, p.replicas, p.isr
                            )
                            .map_err(io)?;
                        }
                        if let Some(Ok(entries)) = configs.as_ref().map(|c| &c[i].1) {
                            for e in entries {
                                writeln!(
                                    out,
                                    "  config {}={}",
                                    e.name,
                                    e.value.as_deref().unwrap_or("")
                                )
                                .map_err(io)?;
                            }
                        }
                    }
                }
            }
            if failed {
                Err("some topics could not be described".into())
            } else {
                Ok(())
            }
        }
        other => Err(format!("unknown topics subcommand {other:?}")),
    }
}

/// Print per-resource results; fail if any failed.
fn report(
    r: kafkapipe::Result<kafkapipe::admin::Results<String>>,
    done: &str,
    out: &mut dyn Write,
) -> Result<(), String> {
    let mut failed = Vec::new();
    for (name, r) in r.map_err(kerr)? {
        match r {
            Ok(()) => writeln!(out, "{done} {name}").map_err(io)?,
            Err(e) => failed.push(format!("{name}: {e}")),
        }
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err(failed.join("\n"))
    }
}

/// Prints a rate line to stderr at most every two seconds.
struct Progress {
    what: &'static str,
    start: Instant,
    last: Instant,
    count: u64,
}

impl Progress {
    fn new(what: &'static str) -> Self {
        let now = Instant::now();
        Progress {
            what,
            start: now,
            last: now,
            count: 0,
        }
    }

    fn add(&mut self, n: u64, err: &mut dyn Write) {
        self.count += n;
        if self.last.elapsed() >= Duration::from_secs(2) {
            self.last = Instant::now();
            let _ = writeln!(err, "% {}", self.line());
        }
    }

    fn line(&self) -> String {
        let secs = self.start.elapsed().as_secs_f64();
        format!(
            "{} {} records in {:.1}s ({:.0} records/s)",
            self.what,
            self.count,
            secs,
            self.count as f64 / secs.max(1e-3)
        )
    }
}

async fn produce(
    broker: &str,
    args: &[String],
    input: &mut dyn BufRead,
    err: &mut dyn Write,
) -> Result<(), String> {
    let f = parse(args, &["-k", "-p"], &[])?;
    let [topic] = f.positional.as_slice() else {
        return Err("produce TOPIC [-k SEP] [-p PARTITION]".into());
    };
    let sep = f.get("-k").map(str::to_string);
    let partition: Option<i32> = f.num("-p")?;
    let mut writer =
        Writer::new(WriterConfig::new([broker.to_string()]).topic(topic.as_str())).map_err(kerr)?;
    let mut progress = Progress::new("produced");
    let mut chunk = Vec::new();
    let mut line = String::new();
    loop {
        line.clear();
        let n = input
            .read_line(&mut line)
            .map_err(|e| format!("reading stdin: {e}"))?;
        if n > 0 {
            let text = line.strip_suffix('\n').unwrap_or(&line);
            let text = text.strip_suffix('\r').unwrap_or(text);
            let mut msg = match sep.as_deref().and_then(|s| text.split_once(s)) {
                Some((k, v)) => Message::keyed(k.to_string(), v.to_string()),
                None => Message::new(text.to_string()),
            };
            if let Some(p) = partition {
                msg = msg.with_partition(p);
            }
            chunk.push(msg);
        }
        if (n == 0 && !chunk.is_empty()) || chunk.len() >= 1000 {
            let k = chunk.len() as u64;
            writer
                .write_messages(std::mem::take(&mut chunk))
                .await
                .map_err(kerr)?;
            progress.add(k, err);
        }
        if n == 0 {
            break;
        }
    }
    writer.close().await.map_err(kerr)?;
    writeln!(err, "% {} to {topic}", progress.line()).map_err(io)?;
    Ok(())
}

async fn consume(
    admin: &Admin,
    args: &[String],
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<(), String> {
    let f = parse(args, &["-p", "-o", "-c", "-k", "-g", "--group"], &["-e"])?;
    let [topic] = f.positional.as_slice() else {
        return Err("consume TOPIC [-p P,P..] [-o OFFSET] [-c COUNT] [-e] [-k SEP]".into());
    };
    if let Some(group) = f.get("-g").or(f.get("--group")) {
        return consume_group(admin, topic, group, &f, out, err).await;
    }
    let cluster: &Cluster = admin.cluster();
    let all = cluster.partitions(topic).await.map_err(kerr)?;
    let partitions: Vec<i32> = match f.get("-p") {
        None => all,
        Some(list) => {
            let mut ps = Vec::new();
            for p in list.split(',') {
                let p: i32 = p
                    .trim()
                    .parse()
                    .map_err(|_| format!("-p: bad partition {p:?}"))?;
                if !all.contains(&p) {
                    return Err(format!("{topic} has no partition {p}"));
                }
                ps.push(p);
            }
            ps
        }
    };
    let start = f.get("-o").unwrap_or("end");
    let spec: OffsetSpec = start.parse()?;
    let limit: Option<u64> = f.num("-c")?;
    let exit_at_end = f.has("-e");
    let sep = f.get("-k");

    // Resolve start offsets, and the end offsets for -e (and relative -N starts).
    let tps: Vec<TopicPartition> = partitions
        .iter()
        .map(|p| TopicPartition::new(topic, *p))
        .collect();
    let lookup = |s: OffsetSpec| {
        let specs: Vec<(TopicPartition, OffsetSpec)> =
            tps.iter().map(|tp| (tp.clone(), s)).collect();
        async move {
            let mut m = BTreeMap::new();
            for (tp, r) in admin.list_offsets(&specs).await.map_err(kerr)? {
                m.insert(tp.partition, r.map_err(kerr)?.offset);
            }
            Ok::<_, String>(m)
        }
    };
    let ends = lookup(OffsetSpec::Latest).await?;
    let starts = match spec {
        OffsetSpec::Offset(n) if n < 0 => {
            let earliest = lookup(OffsetSpec::Earliest).await?;
            ends.iter()
                .map(|(p, e)| (*p, (e + n).max(earliest.get(p).copied().unwrap_or(0))))
                .collect()
        }
        OffsetSpec::Timestamp(_) => {
            let found = lookup(spec).await?;
            found
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
                .collect()
        }
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
    let opts = FetchOptions {
        max_wait: Duration::from_millis(if exit_at_end { 50 } else { 500 }),
        ..FetchOptions::default()
    };
    let mut progress = Progress::new("consumed");
    let mut printed: u64 = 0;
    'outer: loop {
        if exit_at_end && cursors.iter().all(|c| c.next >= c.end) {
            break;
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
        let mut progressed = false;
        for r in futures::future::join_all(fetches).await {
            let (partition, fetched) = match r {
                Ok(x) => x,
                Err(e) if e.is_retriable() => {
                    let _ = writeln!(err, "% fetch failed, retrying: {e}");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
                Err(e) => return Err(kerr(e)),
            };
            let Some(c) = cursors.iter_mut().find(|c| c.partition == partition) else {
                continue;
            };
            let mut n = 0;
            for rec in &fetched.records {
                if limit.is_some_and(|l| printed >= l) {
                    break 'outer;
                }
                let value = String::from_utf8_lossy(rec.value.as_deref().unwrap_or_default());
                match sep {
                    Some(s) => {
                        let key = String::from_utf8_lossy(rec.key.as_deref().unwrap_or_default());
                        writeln!(out, "{key}{s}{value}").map_err(io)?;
                    }
                    None => writeln!(out, "{value}").map_err(io)?,
                }
                printed += 1;
                n += 1;
            }
            if fetched.next_offset > c.next {
                c.next = fetched.next_offset;
                progressed = true;
            }
            progress.add(n, err);
        }
        if limit.is_some_and(|l| printed >= l) {
            break;
        }
        if !progressed && exit_at_end {
            // Nothing new although the end looked further on (the end offsets were read
            // before the fetches, and a fetch may find nothing readable below them): stop
            // rather than spin.
            break;
        }
    }
    out.flush().map_err(io)?;
    writeln!(err, "% {} from {topic}", progress.line()).map_err(io)?;
    Ok(())
}

/// `consume TOPIC -g GROUP`: read as a member of GROUP, printing each record and
/// committing it after it is printed; committed on exit (after COUNT records).
async fn consume_group(
    admin: &Admin,
    topic: &str,
    group: &str,
    f: &Flags,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<(), String> {
    use kafkapipe::reader::{Reader, ReaderConfig, StartOffset};
    if f.get("-p").is_some() || f.has("-e") {
        return Err("with -g the group assigns the partitions: -p and -e do not apply".into());
    }
    let start = match f.get("-o").unwrap_or("end") {
        "beginning" => StartOffset::First,
        "end" => StartOffset::Last,
        o => return Err(format!("with -g, -o is beginning or end (not {o:?})")),
    };
    let limit: Option<u64> = f.num("-c")?;
    let sep = f.get("-k");
    let mut reader = Reader::new(
        ReaderConfig::new(admin.cluster().bootstrap().to_vec())
            .group_id(group)
            .topic(topic)
            .start_offset(start),
    )
    .await
    .map_err(kerr)?;
    let Some(mut committer) = reader.committer() else {
        return Err("no committer for a group reader".into());
    };
    let mut progress = Progress::new("consumed");
    let mut printed: u64 = 0;
    while limit.map_or(true, |l| printed < l) {
        let m = reader.next_message().await.map_err(kerr)?;
        let value = String::from_utf8_lossy(m.value.as_deref().unwrap_or_default());
        match sep {
            Some(s) => {
                let key = String::from_utf8_lossy(m.key.as_deref().unwrap_or_default());
                writeln!(out, "{key}{s}{value}").map_err(io)?;
            }
            None => writeln!(out, "{value}").map_err(io)?,
        }
        committer.feed(&m).await.map_err(kerr)?;
        printed += 1;
        progress.add(1, err);
    }
    out.flush().map_err(io)?;
    reader.close().await;
    writeln!(err, "% {} from {topic} in group {group}", progress.line()).map_err(io)?;
    Ok(())
}

async fn groups(admin: &Admin, args: &[String], out: &mut dyn Write) -> Result<(), String> {
    let (sub, rest) = match args.split_first() {
        Some((s, r)) => (s.as_str(), r),
        None => ("list", args),
    };
    match sub {
        "list" => {
            for g in admin.list_groups().await.map_err(kerr)? {
                writeln!(
                    out,
                    "{}\t{}\t{}",
                    g.group_id,
                    g.state.as_deref().unwrap_or("-"),
                    if g.protocol_type.is_empty() {
                        "-"
                    } else {
                        &g.protocol_type
                    }
                )
                .map_err(io)?;
            }
            Ok(())
        }
        "describe" => {
            let [group] = rest else {
                return Err("groups describe GROUP".into());
            };
            let (_, d) = admin
                .describe_groups(&[group])
                .await
                .map_err(kerr)?
                .pop()
                .ok_or("no result")?;
            let d = d.map_err(kerr)?;
            writeln!(
                out,
                "group {} state {} protocol {} {} coordinator {}",
                d.group_id, d.state, d.protocol_type, d.protocol, d.coordinator
            )
            .map_err(io)?;
            for m in &d.members {
                writeln!(
                    out,
                    "  member {} client {} host {}",
                    m.member_id, m.client_id, m.client_host
                )
                .map_err(io)?;
                if let Some(a) = &m.decoded_assignment {
                    for tp in &a.partitions {
                        writeln!(out, "    assigned {} {:?}", tp.topic, tp.partitions)
                            .map_err(io)?;
                    }
                }
            }
            let offsets = admin.fetch_group_offsets(group, None).await.map_err(kerr)?;
            let specs: Vec<(TopicPartition, OffsetSpec)> = offsets
                .iter()
                .map(|(tp, _)| (tp.clone(), OffsetSpec::Latest))
                .collect();
            let ends = admin.list_offsets(&specs).await.map_err(kerr)?;
            for ((tp, committed), (_, end)) in offsets.iter().zip(ends) {
                let committed = committed.as_ref().map(|c| c.offset).unwrap_or(-1);
                let end = end.map(|e| e.offset).unwrap_or(-1);
                let lag = if committed >= 0 && end >= 0 {
                    (end - committed).max(0).to_string()
                } else {
                    "-".into()
                };
                writeln!(
                    out,
                    "  offset {} {} committed {committed} end {end} lag {lag}",
                    tp.topic, tp.partition
                )
                .map_err(io)?;
            }
            Ok(())
        }
        "delete" => {
            let names: Vec<&str> = rest.iter().map(String::as_str).collect();
            if names.is_empty() {
                return Err("groups delete GROUP...".into());
            }
            report(admin.delete_groups(&names).await, "deleted", out)
        }
        other => Err(format!("unknown groups subcommand {other:?}")),
    }
}

async fn offsets(admin: &Admin, args: &[String], out: &mut dyn Write) -> Result<(), String> {
    let [topic] = args else {
        return Err("offsets TOPIC".into());
    };
    let partitions = admin.cluster().partitions(topic).await.map_err(kerr)?;
    let mut specs = Vec::new();
    for p in &partitions {
        specs.push((TopicPartition::new(topic, *p), OffsetSpec::Earliest));
        specs.push((TopicPartition::new(topic, *p), OffsetSpec::Latest));
    }
    let listed = admin.list_offsets(&specs).await.map_err(kerr)?;
    for pair in listed.chunks(2) {
        let [(tp, earliest), (_, latest)] = pair else {
            continue;
        };
        let show = |r: &kafkapipe::Result<kafkapipe::admin::ListedOffset>| match r {
            Ok(o) => o.offset.to_string(),
            Err(e) => format!("error: {e}"),
        };
        writeln!(
            out,
            "{}\t{}\t{}",
            tp.partition,
            show(earliest),
            show(latest)
        )
        .map_err(io)?;
    }
    Ok(())
}

async fn cluster(admin: &Admin, out: &mut dyn Write) -> Result<(), String> {
    let c = admin.describe_cluster().await.map_err(kerr)?;
    writeln!(
        out,
        "cluster {} controller {}",
        c.cluster_id.as_deref().unwrap_or("-"),
        c.controller_id
    )
    .map_err(io)?;
    for b in &c.brokers {
        writeln!(out, "broker {} {}", b.id, b.addr()).map_err(io)?;
    }
    Ok(())
}
