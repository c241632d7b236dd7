//! `produce TOPIC`: stdin lines → records through a `Writer`.

use std::io::{BufRead, Write};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::SinkExt;
use kafkapipe::writer::{Message, Writer, WriterConfig};

use crate::settings::Settings;
use crate::shutdown::Shutdown;
use crate::{Fail, ProduceArgs};

/// Prints a rate line to stderr at most every two seconds.
pub struct Progress {
    what: &'static str,
    start: Instant,
    last: Instant,
    /// Records so far.
    pub count: u64,
}

impl Progress {
    /// Start counting `what` (e.g. "produced") now.
    pub fn new(what: &'static str) -> Self {
        let now = Instant::now();
        Progress {
            what,
            start: now,
            last: now,
            count: 0,
        }
    }

    /// Count `n` more records; print the rate line if it is due.
    pub fn add(&mut self, n: u64) {
        self.count += n;
        if self.last.elapsed() >= Duration::from_secs(2) {
            self.last = Instant::now();
            let _ = writeln!(std::io::stderr(), "% {}", self.line());
        }
    }

    /// "WHAT N records in S s (R records/s)".
    pub fn line(&self) -> String {
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

/// Run `produce`: stdin lines to records until EOF or SIGINT/SIGTERM, then deliver
/// everything read and exit.
pub async fn run(brokers: &[String], settings: &Settings, args: &ProduceArgs) -> Result<(), Fail> {
    let mut headers = Vec::new();
    for h in &args.headers {
        let (k, v) = h
            .split_once('=')
            .ok_or_else(|| Fail::Usage(format!("-H wants KEY=VALUE, got {h:?}")))?;
        headers.push((k.to_string(), Bytes::from(v.to_string())));
    }
    let mut config =
        settings.writer(WriterConfig::new(brokers.to_vec()).topic(args.topic.as_str()));
    if let Some(z) = args.compression {
        config = config.compression(z);
    }
    if let Some(a) = args.acks {
        config = config.required_acks(a);
    }
    let mut shutdown = Shutdown::install().map_err(|e| Fail::Run(format!("signals: {e}")))?;
    let mut writer = Writer::new(config)?;

    // stdin is read on its own thread (blocking reads), line by line.
    let (tx, mut rx) = tokio::sync::mpsc::channel::<std::io::Result<Vec<u8>>>(4096);
    std::thread::spawn(move || {
        let stdin = std::io::stdin();
        let mut input = stdin.lock();
        loop {
            let mut line = Vec::new();
            match input.read_until(b'\n', &mut line) {
                Ok(0) => return,
                Ok(_) => {
                    if tx.blocking_send(Ok(line)).is_err() {
                        return;
                    }
                }
                Err(e) => {
                    let _ = tx.blocking_send(Err(e));
                    return;
                }
            }
        }
    });

    let mut progress = Progress::new("produced");
    let mut stopped = false;
    let mut result = Ok(());
    'read: loop {
        let first = tokio::select! {
            biased;
            _ = shutdown.wait() => { stopped = true; break 'read; }
            l = rx.recv() => l,
        };
        let Some(first) = first else { break };
        let mut chunk = Vec::new();
        let mut next = Some(first);
        while let Some(line) = next.take() {
            match line {
                Ok(line) => chunk.push(to_message(line, args, &headers)),
                Err(e) => {
                    result = Err(Fail::Run(format!("reading stdin: {e}")));
                    break;
                }
            }
            if chunk.len() >= 1000 {
                break;
            }
            next = rx.try_recv().ok();
        }
        let n = chunk.len() as u64;
        if n > 0 {
            if let Err(e) = writer.write_messages(chunk).await {
                result = Err(e.into());
                break;
            }
            progress.add(n);
        }
        if result.is_err() {
            break;
        }
    }
    let closed = writer.close().await;
    result?;
    closed?;
    let how = if stopped || shutdown.requested() {
        " (stopped by signal)"
    } else {
        ""
    };
    eprintln!("% {} to {}{how}", progress.line(), args.topic);
    Ok(())
}

fn to_message(mut line: Vec<u8>, args: &ProduceArgs, headers: &[(String, Bytes)]) -> Message {
    if line.last() == Some(&b'\n') {
        line.pop();
        if line.last() == Some(&b'\r') {
            line.pop();
        }
    }
    let line = Bytes::from(line);
    let split = args.key_delimiter.as_deref().and_then(|sep| {
        let sep = sep.as_bytes();
        (!sep.is_empty())
            .then(|| line.windows(sep.len()).position(|w| w == sep))
            .flatten()
            .map(|i| (line.slice(..i), line.slice(i + sep.len()..)))
    });
    let mut msg = match split {
        Some((k, v)) => Message::keyed(k, v),
        None => Message::new(line),
    };
    if let Some(p) = args.partition {
        msg = msg.with_partition(p);
    }
    for (k, v) in headers {
        msg = msg.with_header(k.clone(), v.clone());
    }
    msg
}
