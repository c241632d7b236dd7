//! Testing a pipeline without a broker: the user's pipeline (a group `Reader` → filter →
//! map → `Writer`, at least once) runs against [`MockCluster`] (cargo feature `mock`), an
//! in-process Kafka cluster, with faults injected where a real broker cannot be made to
//! fail on demand: the leader refuses two produce requests (`NOT_LEADER_OR_FOLLOWER`) and
//! a fetch connection is cut mid-response. The checks are what a user's test would
//! assert: every kept input is in the output exactly once, in order, and the group
//! committed every input it processed (the filtered ones included).
//!
//! ```sh
//! cargo run --example mock --features mock
//! ```
//!
//! The same code, as a `#[tokio::test]` in a user's crate, needs
//! `kafkapipe = { version = "…", features = ["mock"] }` in `[dev-dependencies]`.

use std::time::Duration;

use futures::{future, StreamExt, TryStreamExt};
use kafkapipe::group::CommitMode;
use kafkapipe::mock::{Fault, MockCluster};
use kafkapipe::protocol::{ApiKey, ErrorCode};
use kafkapipe::reader::{Reader, ReaderConfig, StartOffset};
use kafkapipe::record::Record;
use kafkapipe::writer::{Message, Writer, WriterConfig};

/// The pipeline under test: the first `n` messages of the reader, empty values dropped,
/// the rest uppercased into the writer's topic. Each written message carries its source's
/// ack token, so a source is committed once its result is acknowledged; a dropped one
/// counts as processed.
async fn uppercase(reader: &mut Reader, writer: &mut Writer, n: usize) -> kafkapipe::Result<()> {
    reader
        .take(n)
        .try_filter(|m| future::ready(m.value.as_ref().is_some_and(|v| !v.is_empty())))
        .map_ok(|m| {
            let upper = m
                .value
                .as_deref()
                .map(|v| v.to_ascii_uppercase())
                .unwrap_or_default();
            Message::from(m).with_value(upper)
        })
        .forward(writer)
        .await
}

#[tokio::main]
async fn main() -> kafkapipe::Result<()> {
    let cluster = MockCluster::builder()
        .brokers(3)
        .topic("in", 1)
        .topic("out", 1)
        .start()
        .await?;
    // Input: "a", "", "b", "", …, ending with a kept value (a value the filter drops is
    // committed once the reader is polled again, and `take(n)` stops polling after n).
    let inputs: Vec<String> = (0..40)
        .map(|i| {
            if i % 2 == 1 {
                String::new()
            } else {
                format!("v{i}")
            }
        })
        .chain(std::iter::once("last".to_string()))
        .collect();
    let records: Vec<Record> = inputs
        .iter()
        .enumerate()
        .map(|(i, v)| Record::new(format!("k{i}"), v.clone()))
        .collect();
    cluster.produce("in", 0, &records)?;

    // The faults: two refused produces, then one fetch cut mid-response.
    cluster.fault(
        ApiKey::PRODUCE,
        Fault::Error(ErrorCode::NotLeaderOrFollower),
        2,
    );
    cluster.fault(ApiKey::FETCH, Fault::CloseMidResponse, 1);

    let mut reader = Reader::new(
        ReaderConfig::new(cluster.bootstrap())
            .group_id("uppercaser")
            .topic("in")
            .start_offset(StartOffset::First)
            .max_wait(Duration::from_millis(50))
            .commit_mode(CommitMode::Sync),
    )
    .await?;
    let mut writer = Writer::new(WriterConfig::new(cluster.bootstrap()).topic("out"))?;
    uppercase(&mut reader, &mut writer, inputs.len()).await?;
    reader.close().await; // the final commit, then LeaveGroup

    // What a test asserts.
    let got: Vec<String> = cluster
        .records("out", 0)
        .into_iter()
        .map(|r| String::from_utf8_lossy(r.value.as_deref().unwrap_or_default()).into_owned())
        .collect();
    let expected: Vec<String> = inputs
        .iter()
        .filter(|v| !v.is_empty())
        .map(|v| v.to_ascii_uppercase())
        .collect();
    let committed = cluster.committed("uppercaser", "in", 0);
    let (refused, fetches) = (
        cluster.requests(ApiKey::PRODUCE),
        cluster.requests(ApiKey::FETCH),
    );
    println!(
        "mock: read {}, filtered out {} (empty), wrote {} to out (expected {}), \
         committed offset {:?}; produce requests {refused} (2 refused), fetch requests \
         {fetches} (1 cut)",
        inputs.len(),
        inputs.len() - expected.len(),
        got.len(),
        expected.len(),
        committed
    );
    if got == expected && committed == Some(inputs.len() as i64) {
        Ok(())
    } else {
        Err(kafkapipe::Error::protocol(format!(
            "the pipeline lost, repeated or misordered messages: got {got:?}"
        )))
    }
}
