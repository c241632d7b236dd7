//! The pre-revoke hook ([`ReaderConfig::on_revoke`]) against `crate::mock::MockCluster`
//! (feature `mock`): a stage that buffers every message it reads (holding their tokens)
//! flushes when the hook tells it to, and the group commits what it flushed before the
//! partitions go — on an eager and a cooperative rebalance and on close. (KIP-848 shares
//! the `give_up` path; `tests/group_broker.rs` runs it on Apache Kafka.)

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use tokio::sync::{mpsc, oneshot};

use super::{CooperativeStickyAssignor, GroupEvent, GroupEvents};
use crate::mock::MockCluster;
use crate::reader::{Message, Reader, ReaderConfig, ReaderHandle, TopicPartition};
use crate::record::Record;

/// Messages per partition the stage buffers (two partitions: 100 in all).
const PER_PARTITION: usize = 50;

async fn mock() -> MockCluster {
    let mock = MockCluster::builder().topic("t", 2).start().await.unwrap();
    for p in 0..2 {
        let records: Vec<Record> = (0..PER_PARTITION)
            .map(|i| Record::new("k", format!("{p}-{i}")))
            .collect();
        mock.produce("t", p, &records).unwrap();
    }
    mock
}

fn config(mock: &MockCluster, cooperative: bool) -> ReaderConfig {
    let config = ReaderConfig::new(mock.bootstrap())
        .group_id("g")
        .topic("t")
        .commit_mode(super::CommitMode::Interval(Duration::from_secs(3600)))
        .max_wait(Duration::from_millis(20))
        .heartbeat_interval(Duration::from_millis(50))
        .session_timeout(Duration::from_secs(3))
        .rebalance_timeout(Duration::from_secs(3));
    if cooperative {
        config.assignors(vec![Arc::new(CooperativeStickyAssignor)])
    } else {
        config
    }
}

type Flush = mpsc::Sender<oneshot::Sender<()>>;

/// The hook: asks the stage to flush and waits until it did.
fn hook(flush: Flush) -> impl Fn(Vec<TopicPartition>) -> futures::future::BoxFuture<'static, ()> {
    move |_partitions| {
        let flush = flush.clone();
        Box::pin(async move {
            let (done, flushed) = oneshot::channel();
            if flush.send(done).await.is_ok() {
                let _ = flushed.await;
            }
        })
    }
}

/// A stage that buffers every message it reads and acks them all only when told to
/// flush (never at the end of the stream). Returns how many it buffered so far.
fn stage(
    mut reader: Reader,
    mut flush: mpsc::Receiver<oneshot::Sender<()>>,
) -> (
    ReaderHandle,
    Arc<std::sync::atomic::AtomicUsize>,
    tokio::task::JoinHandle<()>,
) {
    let handle = reader.handle();
    let buffered = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = buffered.clone();
    let task = tokio::spawn(async move {
        let mut buf: Vec<Message> = Vec::new();
        let mut open = true;
        loop {
            tokio::select! {
                m = reader.next(), if open => match m {
                    Some(Ok(m)) => {
                        buf.push(m);
                        count.store(buf.len(), std::sync::atomic::Ordering::SeqCst);
                    }
                    Some(Err(e)) => panic!("reader error: {e}"),
                    None => open = false,
                },
                done = flush.recv() => {
                    let Some(done) = done else { return };
                    for mut m in buf.drain(..) {
                        m.take_ack_token().ack();
                    }
                    let _ = done.send(());
                }
            }
        }
    });
    (handle, buffered, task)
}

async fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn next_event(events: &mut GroupEvents) -> GroupEvent {
    tokio::time::timeout(Duration::from_secs(15), events.next())
        .await
        .expect("a group event in time")
        .expect("events go on")
}

/// Member `a`'s stage buffers the 100 messages; member `b` joins. The hook makes the
/// stage flush, so `a` commits all 100 before giving the partitions up, and `b` starts
/// each partition it takes after them.
async fn flushed_on_rebalance(cooperative: bool) {
    let mock = mock().await;
    let (flush_tx, flush_rx) = mpsc::channel(1);
    let a = Reader::new(config(&mock, cooperative).on_revoke(hook(flush_tx)))
        .await
        .unwrap();
    let mut events = a.events().unwrap();
    let (a_handle, buffered, a_task) = stage(a, flush_rx);
    wait_until("the stage to buffer 100 messages", || {
        buffered.load(std::sync::atomic::Ordering::SeqCst) == 2 * PER_PARTITION
    })
    .await;
    assert_eq!(mock.committed("g", "t", 0), None);
    let mut b = Reader::new(config(&mock, cooperative)).await.unwrap();
    let mut b_events = b.events().unwrap();
    let revoked = loop {
        match next_event(&mut events).await {
            GroupEvent::Revoked { partitions } => break partitions,
            GroupEvent::Assigned { .. } => {}
            other => panic!("{other:?}"),
        }
    };
    assert_eq!(revoked.len(), if cooperative { 1 } else { 2 });
    for tp in &revoked {
        assert_eq!(
            mock.committed("g", "t", tp.partition),
            Some(PER_PARTITION as i64),
            "{tp}: the flushed messages are committed before the partition is given up"
        );
    }
    // one more message per partition: the first b reads of each partition it takes
    for p in 0..2 {
        mock.produce("t", p, &[Record::new("k", format!("{p}-late"))])
            .unwrap();
    }
    let taken = loop {
        match next_event(&mut b_events).await {
            GroupEvent::Assigned { partitions, .. } if !partitions.is_empty() => break partitions,
            _ => {}
        }
    };
    assert_eq!(taken.len(), 1);
    let m = tokio::time::timeout(Duration::from_secs(15), b.next_message())
        .await
        .expect("b reads in time")
        .unwrap();
    assert_eq!(
        (m.partition, m.offset),
        (taken[0].partition, PER_PARTITION as i64),
        "b does not read the flushed messages again"
    );
    b.close().await;
    a_handle.close().await;
    a_task.abort();
}

#[tokio::test]
async fn an_eager_revoke_commits_what_the_hook_flushed() {
    flushed_on_rebalance(false).await;
}

#[tokio::test]
async fn a_cooperative_revoke_commits_what_the_hook_flushed() {
    flushed_on_rebalance(true).await;
}

/// On close the hook runs with every owned partition before the final commit: the
/// stage's 100 messages are committed, and the close does not wait for their tokens
/// until the rebalance timeout.
#[tokio::test]
async fn close_runs_the_hook_before_the_final_commit() {
    let mock = mock().await;
    let (flush_tx, flush_rx) = mpsc::channel(1);
    let revoking = Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = revoking.clone();
    let flush = hook(flush_tx);
    let a = Reader::new(
        config(&mock, false)
            .rebalance_timeout(Duration::from_secs(20))
            .on_revoke(move |partitions: Vec<TopicPartition>| {
                seen.lock().unwrap().push(partitions.clone());
                flush(partitions)
            }),
    )
    .await
    .unwrap();
    let (a_handle, buffered, a_task) = stage(a, flush_rx);
    wait_until("the stage to buffer 100 messages", || {
        buffered.load(std::sync::atomic::Ordering::SeqCst) == 2 * PER_PARTITION
    })
    .await;
    let t0 = Instant::now();
    tokio::time::timeout(Duration::from_secs(15), a_handle.close())
        .await
        .expect("closed well within the 20 s rebalance timeout");
    let took = t0.elapsed();
    for p in 0..2 {
        assert_eq!(
            mock.committed("g", "t", p),
            Some(PER_PARTITION as i64),
            "partition {p} (close took {took:?})"
        );
    }
    assert_eq!(
        *revoking.lock().unwrap(),
        [vec![
            TopicPartition::new("t", 0),
            TopicPartition::new("t", 1)
        ]]
    );
    a_task.abort();
}
