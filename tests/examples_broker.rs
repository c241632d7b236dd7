//! The examples, run as built binaries against Apache Kafka (the shared single-node test
//! broker), as a user runs them: each must exit 0 and print its summary, whose counts the
//! tests check add up.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

/// The directory of the built examples. `cargo build --examples` runs once per test binary
/// (a no-op under `cargo test --all-targets`, which built them already; under
/// `cargo test --test examples_broker` it builds them all in one go).
fn examples_dir() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        // The features this test was built with, so that under `scripts/test.sh` the
        // build is a no-op and examples behind a feature (`mock`) are there.
        let features: Vec<&str> = [
            ("cli", cfg!(feature = "cli")),
            ("mock", cfg!(feature = "mock")),
        ]
        .into_iter()
        .filter_map(|(f, on)| on.then_some(f))
        .collect();
        let out = Command::new(cargo)
            .args(["build", "--examples", "--features", &features.join(",")])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "building the examples: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let exe = std::env::current_exe().unwrap();
        exe.parent()
            .and_then(|d| d.parent())
            .unwrap()
            .join("examples")
    })
}

/// Run example `name` with the shared broker's address (and `args`); it must exit 0.
fn run(name: &str, args: &[&str]) -> String {
    let out = Command::new(examples_dir().join(name))
        .arg(&common::shared().addr)
        .args(args)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "example {name} failed: {:?}\nstdout:\n{stdout}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    println!("{name}:\n{stdout}"); // shown with --nocapture or when a test fails
    stdout
}

/// The summary line: the last line starting with `prefix`.
fn summary<'a>(out: &'a str, prefix: &str) -> &'a str {
    out.lines()
        .rev()
        .find(|l| l.starts_with(prefix))
        .unwrap_or_else(|| panic!("no line starting with {prefix:?} in:\n{out}"))
}

/// The number right after `label` in `line` (e.g. `number(l, "read ")`).
fn number(line: &str, label: &str) -> u64 {
    let at = line
        .find(label)
        .unwrap_or_else(|| panic!("no {label:?} in {line:?}"));
    let digits: String = line[at + label.len()..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits
        .parse()
        .unwrap_or_else(|_| panic!("no number after {label:?} in {line:?}"))
}

/// `examples/pipeline.rs`: group reader → filter → map → writer, at least once; it checks
/// its own output and the group's commits and fails otherwise. The summary must say what
/// happened to every message read: filtered out or written, and all of them committed.
#[test]
fn pipeline_example_writes_and_commits_every_processed_message() {
    let out = run("pipeline", &[]);
    let line = summary(&out, "pipeline:");
    let read = number(line, "read ");
    assert!(read > 0, "{line}");
    let (filtered, wrote) = (number(line, "filtered out "), number(line, "wrote "));
    assert!(filtered > 0 && wrote > 0, "{line}");
    assert_eq!(filtered + wrote, read, "{line}");
    assert_eq!(number(line, "committed "), read, "{line}");
    assert_eq!(number(line, "unacked "), 0, "{line}");
}

/// `examples/bridge.rs`: a stream into Kafka through a writer with a small buffer bound,
/// then Kafka into a JSON-lines file and a worker pool behind a bounded channel, committed
/// after both. Every count must be the number sent, and the writer's buffer must have
/// stayed within its bound.
#[test]
fn bridge_example_counts_add_up() {
    let out = run("bridge", &[]);
    let line = summary(&out, "bridge:");
    let sent = number(line, "sent ");
    assert!(sent > 0, "{line}");
    for label in ["read ", "wrote ", "worker pool processed ", "committed "] {
        assert_eq!(number(line, label), sent, "{label}in {line}");
    }
    // The writer admits a message while its buffer is at most at the bound.
    let peak = number(line, "writer buffer peaked at ");
    let bound = number(line, "bytes of its bound ") + number(line, "one message of at most ");
    assert!(peak > 0 && peak <= bound, "{line}");
    // How often each side waited depends on scheduling: printed, not asserted.
    number(line, "the stream waited ");
    number(line, "waited for a free worker ");
}

/// `examples/etl_backpressure.rs`: a slow stage between a group reader and a writer. The
/// reader's buffered bytes (from its stats, sampled at every message) must stay within
/// `queue_capacity_bytes` plus one fetch response (`max_bytes`), while the topic holds
/// many times that; everything read is written and committed, and the process's resident
/// memory (`VmRSS`, printed at intervals) grows by much less than the topic holds.
#[test]
fn etl_backpressure_example_stays_within_the_reader_capacity() {
    let out = run("etl_backpressure", &[]);
    assert!(out.contains("VmRSS"), "{out}");
    let line = summary(&out, "etl:");
    let n = number(line, "read ");
    assert!(n > 0, "{line}");
    assert_eq!(number(line, "wrote "), n, "{line}");
    assert_eq!(number(line, "committed "), n, "{line}");
    let peak = number(line, "queue_bytes peaked at ");
    let bound = number(line, "capacity + max_bytes = ");
    let topic = number(line, "topic holds ");
    assert!(peak > 0 && peak <= bound, "{line}");
    assert!(
        topic >= 4 * bound,
        "the topic must not fit in the buffer: {line}"
    );
    // Memory stays flat: resident memory grows by far less than the topic's size (a
    // generous bound; the reader's own buffer is checked exactly above).
    if !line.contains("RSS n/a") {
        let grew = number(line, "RSS grew by ") * 1024;
        assert!(grew <= 32 << 20 && grew < topic / 2, "{line}");
    }
}

/// `examples/group.rs`: two members share a topic; one readable line per rebalance event,
/// then a summary: every message processed (some twice after a rebalance is allowed) and
/// committed exactly once over the group.
#[test]
fn group_example_prints_events_and_commits_everything() {
    let out = run("group", &[]);
    assert!(!out.contains("Assigned {"), "raw Debug output: {out}");
    assert!(
        out.lines()
            .any(|l| l.contains("assigned") && l.contains("generation")),
        "{out}"
    );
    let line = summary(&out, "group:");
    let n = number(line, "messages ");
    assert_eq!(number(line, "distinct "), n, "{line}");
    assert_eq!(number(line, "committed "), n, "{line}");
}

/// `examples/group.rs cooperative`: the same with the cooperative-sticky assignor
/// (KIP-429): when `b` joins, `a` is revoked only the partitions that move, so the
/// generation where it keeps the rest assigns it nothing new — a readable line too.
#[test]
fn group_example_cooperative_prints_incremental_events() {
    let out = run("group", &["cooperative"]);
    assert!(!out.contains("Assigned {"), "raw Debug output: {out}");
    assert!(
        out.lines()
            .any(|l| l.starts_with("a: revoked ") && !l.contains("nothing")),
        "a gives up some partitions: {out}"
    );
    let line = summary(&out, "group:");
    let n = number(line, "messages ");
    assert_eq!(number(line, "distinct "), n, "{line}");
    assert_eq!(number(line, "committed "), n, "{line}");
}

/// `examples/exactly_once.rs`: group reader → filter → uppercase → `ExactlyOnceSink`; it
/// reads its own output with read_committed and fails unless each kept input is there
/// exactly once and the group committed the whole input. The summary must say so too.
#[test]
fn exactly_once_example_output_holds_each_kept_input_once() {
    let out = run("exactly_once", &[]);
    let line = summary(&out, "exactly_once:");
    let read = number(line, "read ");
    let filtered = number(line, "filtered out ");
    assert!(read >= 10_000 && filtered > 0, "{line}");
    // read may exceed the input if a transaction was aborted and its inputs read again;
    // "filtered out" then counts those twice, so the expected count is the example's own
    let expected = number(line, "expected ");
    assert!(expected > 0 && expected < 10_000, "{line}");
    assert_eq!(number(line, "read_committed) "), expected, "{line}");
    assert_eq!(number(line, "missing "), 0, "{line}");
    assert_eq!(number(line, "duplicates "), 0, "{line}");
    assert_eq!(number(line, "unexpected "), 0, "{line}");
    assert_eq!(number(line, "committed "), 10_000, "{line}");
    assert!(number(line, " in ") > 0, "at least one transaction: {line}");
}

/// `examples/mock.rs`: a user's pipeline tested against `MockCluster` with injected
/// faults (refused produces, a cut fetch): every kept input written once, in order, and
/// every input committed.
#[cfg(feature = "mock")]
#[test]
fn mock_pipeline_example_survives_its_faults() {
    let out = run("mock", &[]);
    let line = summary(&out, "mock:");
    assert_eq!(number(line, "read "), 41, "{line}");
    assert_eq!(number(line, "filtered out "), 20, "{line}");
    assert_eq!(number(line, "wrote "), 21, "{line}");
    assert!(line.contains("committed offset Some(41)"), "{line}");
}

/// `examples/quickstart.rs` (the `Conn` tour): 1000 records per codec produced and read
/// back on each of its 5 partitions, then the topic deleted.
#[test]
fn quickstart_example_round_trips_every_codec() {
    let out = run("quickstart", &[]);
    let lines: Vec<&str> = out
        .lines()
        .filter(|l| l.starts_with("partition "))
        .collect();
    assert_eq!(lines.len(), 5, "one line per codec:\n{out}");
    for l in &lines {
        assert_eq!(number(l, "produced "), 1000, "{l}");
        assert_eq!(number(l, "read "), 1000, "{l}");
    }
    assert!(out.contains("deleted topic"), "{out}");
}

/// `examples/writer.rs`: 100,000 keyed events through a filter (values ending in "13"
/// dropped) into a Writer: every message the filter kept is acknowledged.
#[test]
fn writer_example_writes_what_the_filter_keeps() {
    let out = run("writer", &[]);
    let line = summary(&out, "wrote ");
    let kept = (0..100_000u32)
        .filter(|i| !format!("event {i}").ends_with("13"))
        .count() as u64;
    assert_eq!(number(line, "wrote "), kept, "{line}");
    assert!(out.contains("partition 0 starts with key"), "{out}");
}

/// `examples/sqlite_offsets.rs`: results and offsets in one SQLite transaction, start
/// offsets from the database (`OffsetStore`); a first worker process dies inside a
/// transaction, a second finishes. Every record must be in the database exactly once.
#[test]
fn sqlite_offsets_example_survives_a_crash_without_loss_or_duplicates() {
    let out = run("sqlite_offsets", &[]);
    let line = summary(&out, "sqlite_offsets:");
    assert!(
        line.contains("first worker crashed mid-transaction"),
        "{line}"
    );
    assert!(line.contains("second worker finished"), "{line}");
    // the crashed worker stored part of the input, not all of it
    let after_crash = number(line, "database held ");
    assert!(after_crash > 0 && after_crash < 2_000, "{line}");
    assert_eq!(number(line, "database: "), 2_000, "{line}");
    assert_eq!(number(line, "missing "), 0, "{line}");
    assert_eq!(number(line, "duplicates "), 0, "{line}");
    assert_eq!(number(line, "stored offsets sum "), 2_000, "{line}");
}

/// `examples/share_workers.rs`: four workers in one share group over a 1-partition topic;
/// the poison message is released twice and dead-lettered (and rejected) at its third
/// delivery; every good job is processed once.
#[test]
fn share_workers_example_dead_letters_the_poison_and_processes_every_job_once() {
    let out = run("share_workers", &[]);
    let line = summary(&out, "summary:");
    assert_eq!(number(line, "processed="), 200, "{line}");
    assert_eq!(number(line, "duplicates="), 0, "{line}");
    assert_eq!(number(line, "dead_letters="), 1, "{line}");
    assert!(
        out.contains("poison dead-lettered after 3 deliveries"),
        "{out}"
    );
}
