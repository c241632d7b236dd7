//! The group coordinator as a group member sees it: found with FindCoordinator (asked of
//! any live broker, each attempt time-boxed) and reached over a connection of its own —
//! never the per-broker connection the fetch task long-polls on — as the Java client's
//! `AbstractCoordinator` does. Heartbeats, JoinGroup/SyncGroup, OffsetFetch,
//! OffsetCommit and LeaveGroup all go over it.
//!
//! A coordinator that fails (connection error or timeout, `NOT_COORDINATOR`,
//! `COORDINATOR_NOT_AVAILABLE`) is marked unknown: its connection is closed at once
//! (failing whatever else was in flight on it) and the next call finds the coordinator
//! again. The membership (generation, member id) is untouched by that.

use std::future::Future;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tracing::{debug, info};

use crate::admin::Admin;
use crate::cluster::Cluster;
use crate::conn::Connection;
use crate::error::{Error, ErrorKind, Result};
use crate::protocol::ErrorCode;

/// Whether `e` means the coordinator is gone or moved: find it again and retry.
pub(crate) fn coordinator_lost(e: &Error) -> bool {
    match e.kind() {
        ErrorKind::Kafka(c) => matches!(
            c,
            ErrorCode::NotCoordinator | ErrorCode::CoordinatorNotAvailable
        ),
        ErrorKind::Io | ErrorKind::Timeout | ErrorKind::Closed | ErrorKind::Metadata => true,
        _ => false,
    }
}

/// Whether `e` is a coordinator error a member retries silently (after finding the
/// coordinator again where needed): it never concerns the membership.
pub(crate) fn coordinator_retriable(e: &Error) -> bool {
    coordinator_lost(e) || e.kafka_code() == Some(ErrorCode::CoordinatorLoadInProgress)
}

struct Current {
    node: i32,
    conn: Connection,
}

/// The dedicated coordinator connection of one group member.
pub(crate) struct Coordinator {
    group_id: String,
    cluster: Cluster,
    /// How long one FindCoordinator attempt (one broker) or one dial may take.
    attempt_timeout: Duration,
    current: Mutex<Option<Current>>,
    /// The broker that coordinated last: asked last for the new coordinator.
    last_node: Mutex<Option<i32>>,
    /// Serializes lookups: concurrent callers (heartbeat, committer) share one.
    lookup: tokio::sync::Mutex<()>,
}

impl Coordinator {
    pub(crate) fn new(group_id: String, cluster: Cluster, attempt_timeout: Duration) -> Self {
        Coordinator {
            group_id,
            cluster,
            attempt_timeout,
            current: Mutex::new(None),
            last_node: Mutex::new(None),
            lookup: tokio::sync::Mutex::new(()),
        }
    }

    fn current(&self) -> std::sync::MutexGuard<'_, Option<Current>> {
        self.current
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn cached(&self) -> Option<Connection> {
        self.current()
            .as_ref()
            .filter(|c| !c.conn.is_closed())
            .map(|c| c.conn.clone())
    }

    /// The coordinator connection: the open one, else the coordinator is found and
    /// dialed (one pass over the live brokers, every step time-boxed).
    ///
    /// # Errors
    ///
    /// The last lookup or dial error; the caller retries after a backoff.
    pub(crate) async fn connection(&self) -> Result<Connection> {
        if let Some(c) = self.cached() {
            return Ok(c);
        }
        let _lookup = self.lookup.lock().await;
        if let Some(c) = self.cached() {
            return Ok(c);
        }
        let node = self.find().await?;
        let addr = match self.cluster.broker_addr(node) {
            Some(a) => a,
            None => {
                self.bounded(self.cluster.refresh(&[])).await?;
                self.cluster.broker_addr(node).ok_or_else(|| {
                    Error::new(
                        ErrorKind::Metadata,
                        format!("unknown group coordinator broker id {node}"),
                    )
                })?
            }
        };
        let conn = self
            .bounded(Connection::connect(&addr, self.cluster.config().clone()))
            .await
            .inspect_err(|_| {
                // dead coordinator: ask another broker first next time
                *self.last_node() = Some(node);
            })?;
        info!(group = %self.group_id, coordinator = node, broker = %addr, "connected to the group coordinator");
        *self.last_node() = Some(node);
        if let Some(old) = self.current().replace(Current {
            node,
            conn: conn.clone(),
        }) {
            close(old.conn);
        }
        Ok(conn)
    }

    fn last_node(&self) -> std::sync::MutexGuard<'_, Option<i32>> {
        self.last_node
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    async fn bounded<T>(&self, f: impl Future<Output = Result<T>>) -> Result<T> {
        match tokio::time::timeout(self.attempt_timeout, f).await {
            Ok(r) => r,
            Err(_) => Err(Error::new(
                ErrorKind::Timeout,
                format!(
                    "group coordinator step timed out after {} ms",
                    self.attempt_timeout.as_millis()
                ),
            )),
        }
    }

    /// FindCoordinator, asked of one broker after another (brokers with an open
    /// connection first, the last coordinator last) until one answers.
    async fn find(&self) -> Result<i32> {
        let mut brokers = self.cluster.brokers();
        if brokers.is_empty() {
            self.bounded(self.cluster.refresh(&[])).await?;
            brokers = self.cluster.brokers();
        }
        let last = *self.last_node();
        let mut ids: Vec<(u8, i32)> = brokers
            .iter()
            .map(|(id, _)| {
                let rank = if Some(*id) == last {
                    2
                } else if self.cluster.open_connection(*id).is_some() {
                    0
                } else {
                    1
                };
                (rank, *id)
            })
            .collect();
        ids.sort();
        let mut last_err = None;
        for (_, id) in ids {
            let attempt = async {
                let c = match self.cluster.open_connection(id) {
                    Some(c) => c,
                    None => self.cluster.connection(id).await?,
                };
                Admin::find_coordinator_on(&c, &self.group_id).await
            };
            match self.bounded(attempt).await {
                Ok(node) => return Ok(node),
                // the broker answered: no use asking the others right now
                Err(e) if e.kafka_code().is_some() => return Err(e),
                Err(e) => {
                    debug!(group = %self.group_id, broker_id = id, error = %e, "FindCoordinator attempt failed; trying another broker");
                    last_err = Some(e);
                }
            }
        }
        // every known broker failed: maybe the broker list is stale
        if let Err(e) = self.bounded(self.cluster.refresh(&[])).await {
            debug!(group = %self.group_id, error = %e, "broker list refresh failed");
        }
        Err(last_err.unwrap_or_else(|| {
            Error::new(ErrorKind::Metadata, "no broker to find the coordinator")
        }))
    }

    /// Forget the coordinator `conn` leads to (it failed with `error`): its connection
    /// is closed at once, the next call finds the coordinator again.
    pub(crate) fn mark_unknown(&self, conn: &Connection, error: &Error) {
        let mut cur = self.current();
        if let Some(old) = cur.take_if(|c| c.conn.same(conn)) {
            drop(cur);
            info!(group = %self.group_id, coordinator = old.node, error = %error, "group coordinator lost; finding it again");
            close(old.conn);
        }
    }

    /// Run `f` on the coordinator until it succeeds, fails for good, or `deadline`
    /// passes: coordinator losses are retried (found again), as is
    /// `COORDINATOR_LOAD_IN_PROGRESS`, with a backoff from 100 ms to 1 s. Each attempt
    /// is time-boxed by `attempt` and the deadline.
    pub(crate) async fn call<T, F, Fut>(
        &self,
        op: &'static str,
        deadline: Instant,
        attempt: Duration,
        f: F,
    ) -> Result<T>
    where
        F: Fn(Connection) -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        let mut backoff = Duration::from_millis(100);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let step = async {
                let c = self.connection().await?;
                let r = f(c.clone()).await;
                if let Err(e) = &r {
                    if coordinator_lost(e) {
                        self.mark_unknown(&c, e);
                    }
                }
                r
            };
            let r = match tokio::time::timeout(attempt.min(left), step).await {
                Ok(r) => r,
                Err(_) => {
                    let e = Error::new(ErrorKind::Timeout, format!("{op} timed out"));
                    if let Some(c) = self.cached() {
                        self.mark_unknown(&c, &e);
                    }
                    Err(e)
                }
            };
            match r {
                Err(e) if coordinator_retriable(&e) && Instant::now() + backoff < deadline => {
                    debug!(group = %self.group_id, op, error = %e, "coordinator call failed; retrying");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(1));
                }
                r => return r,
            }
        }
    }

    /// Close the coordinator connection (the reader closes).
    pub(crate) async fn close(&self) {
        let cur = self.current().take();
        if let Some(c) = cur {
            c.conn.close().await;
        }
    }
}

fn close(conn: Connection) {
    if let Ok(rt) = tokio::runtime::Handle::try_current() {
        rt.spawn(async move { conn.close().await });
    }
}
