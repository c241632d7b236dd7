//! The group coordinator as a group member sees it: found with FindCoordinator (asked of
//! any live broker, each attempt time-boxed) and reached over a connection of its own —
//! never the per-broker connection the fetch task long-polls on — as the Java client's
//! `AbstractCoordinator` does. Heartbeats, JoinGroup/SyncGroup, OffsetFetch,
//! OffsetCommit and LeaveGroup all go over it.
//!
//! A coordinator that fails (connection error or timeout, `NOT_COORDINATOR`,
//! `COORDINATOR_NOT_AVAILABLE`) is marked unknown: its connection is closed at once
//! (failing whatever else was in flight on it) and the next call finds the coordinator
//! again — except the offsets connection when another connection failed: it is let go
//! of, and closes once the commit in flight on it (if any) was answered, so an older
//! commit is never applied after a newer one sent over a new connection. The
//! membership (generation, member id) is untouched by that.
//!
//! A layer of its own below the writer and the groups: consumer groups, share groups and
//! transactions (the writer's transaction coordinator, found with key type 1) all use it.

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

/// Which of the member's two coordinator connections a request goes over. Kafka handles
/// one request per connection at a time, so an OffsetCommit waiting for the offsets
/// topic's replicas (up to `offsets.commit.timeout.ms`) would hold back a heartbeat on
/// the same connection: commits and offset fetches get their own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lane {
    /// Heartbeat, JoinGroup, SyncGroup, LeaveGroup.
    Membership = 0,
    /// OffsetCommit, OffsetFetch.
    Offsets = 1,
}

#[derive(Default)]
struct State {
    /// The coordinator, while known.
    node: Option<i32>,
    /// The connection of each lane to it.
    conns: [Option<Connection>; 2],
}

/// The dedicated coordinator connections of one group member.
pub(crate) struct Coordinator {
    group_id: String,
    /// FindCoordinator key type: 0 for a group, 1 for a transactional id.
    key_type: i8,
    cluster: Cluster,
    /// How long one FindCoordinator attempt (one broker) or one dial may take.
    attempt_timeout: Duration,
    state: Mutex<State>,
    /// The broker that coordinated last: asked last for the new coordinator.
    last_node: Mutex<Option<i32>>,
    /// Serializes lookups and dials: concurrent callers share one.
    lookup: tokio::sync::Mutex<()>,
}

impl Coordinator {
    pub(crate) fn new(group_id: String, cluster: Cluster, attempt_timeout: Duration) -> Self {
        Coordinator {
            group_id,
            key_type: 0,
            cluster,
            attempt_timeout,
            state: Mutex::default(),
            last_node: Mutex::new(None),
            lookup: tokio::sync::Mutex::new(()),
        }
    }

    /// The coordinator of transactional id `id` (FindCoordinator key type 1) rather than of
    /// a group.
    pub(crate) fn transaction(id: String, cluster: Cluster, attempt_timeout: Duration) -> Self {
        Coordinator {
            key_type: 1,
            ..Coordinator::new(id, cluster, attempt_timeout)
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn cached(&self, lane: Lane) -> Option<Connection> {
        self.state().conns[lane as usize]
            .as_ref()
            .filter(|c| !c.is_closed())
            .cloned()
    }

    /// The coordinator connection of `lane`: the open one, else the coordinator is
    /// dialed (found first if unknown: one pass over the live brokers), every step
    /// time-boxed.
    ///
    /// # Errors
    ///
    /// The last lookup or dial error; the caller retries after a backoff.
    pub(crate) async fn connection(&self, lane: Lane) -> Result<Connection> {
        if let Some(c) = self.cached(lane) {
            return Ok(c);
        }
        let _lookup = self.lookup.lock().await;
        if let Some(c) = self.cached(lane) {
            return Ok(c);
        }
        let known = self.state().node;
        let node = match known {
            Some(n) => n,
            None => self.find().await?,
        };
        let dialed = async {
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
                .await?;
            Ok::<_, Error>((addr, conn))
        };
        let (addr, conn) = match dialed.await {
            Ok(v) => v,
            Err(e) => {
                // a dead coordinator: find it again, asking another broker first
                self.forget(node);
                return Err(e);
            }
        };
        debug!(group = %self.group_id, coordinator = node, broker = %addr, ?lane, "connected to the group coordinator");
        if known.is_none() {
            info!(group = %self.group_id, coordinator = node, broker = %addr, "group coordinator found");
        }
        let old = {
            let mut st = self.state();
            st.node = Some(node);
            st.conns[lane as usize].replace(conn.clone())
        };
        if let Some(old) = old {
            close(old);
        }
        Ok(conn)
    }

    /// The coordinator `node` is gone: close every connection to it — except that the
    /// offsets connection is only let go of, not closed: an OffsetCommit on its way
    /// over it keeps it open until the broker answered, so its outcome is known before a
    /// newer commit goes out over a new connection (a broker still applies a request it
    /// read from a connection closed meanwhile, and it would then apply the older
    /// commit after the newer one). With no request in flight it closes with its last
    /// handle, at once.
    fn forget(&self, node: i32) {
        *self.last_node() = Some(node);
        let (membership, offsets) = {
            let mut st = self.state();
            if st.node != Some(node) {
                return;
            }
            st.node = None;
            (st.conns[0].take(), st.conns[1].take())
        };
        if let Some(c) = membership {
            close(c);
        }
        drop(offsets);
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
                Admin::find_coordinator_key_on(&c, &self.group_id, self.key_type).await
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

    /// `conn` failed with `error`, a coordinator loss: `conn` is closed at once. Unless
    /// the request merely timed out (the coordinator may be busy), the coordinator is
    /// forgotten — every connection to it closed, the next call finds it again.
    pub(crate) fn mark_unknown(&self, conn: &Connection, error: &Error) {
        let (node, old) = {
            let mut st = self.state();
            let Some(lane) = st
                .conns
                .iter()
                .position(|c| c.as_ref().is_some_and(|c| c.same(conn)))
            else {
                return;
            };
            (st.node, st.conns[lane].take())
        };
        if let Some(old) = old {
            close(old);
        }
        if error.is_timeout() {
            debug!(group = %self.group_id, coordinator = ?node, error = %error, "group coordinator request timed out; reconnecting");
            return;
        }
        if let Some(node) = node {
            info!(group = %self.group_id, coordinator = node, error = %error, "group coordinator lost; finding it again");
            self.forget(node);
        }
    }

    /// Close `lane`'s connection, if open, keeping the coordinator: the next call dials a
    /// fresh one. For a request abandoned while in flight (Kafka answers a connection's
    /// requests in order, so one never answered would hold back every later one).
    pub(crate) fn reset(&self, lane: Lane) {
        let old = self.state().conns[lane as usize].take();
        if let Some(old) = old {
            debug!(group = %self.group_id, ?lane, "group coordinator connection reset");
            close(old);
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
            // the connection this attempt uses, to drop if it times out
            let used: Mutex<Option<Connection>> = Mutex::new(None);
            let step = async {
                let c = self.connection(Lane::Offsets).await?;
                *used
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(c.clone());
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
                    let used = used
                        .into_inner()
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                    if let Some(c) = used {
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

    /// Close the coordinator connections (the reader closes).
    pub(crate) async fn close(&self) {
        let old = {
            let mut st = self.state();
            st.node = None;
            [st.conns[0].take(), st.conns[1].take()]
        };
        for c in old.into_iter().flatten() {
            c.close().await;
        }
    }
}

fn close(conn: Connection) {
    if let Ok(rt) = tokio::runtime::Handle::try_current() {
        rt.spawn(async move { conn.close().await });
    }
}
