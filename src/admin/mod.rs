//! The admin client: topics, partitions, configs, groups, group offsets, offsets, records,
//! ACLs, SCRAM credentials and cluster description, over a [`Cluster`].
//!
//! [`Admin`] is a cheap handle. Every call routes each request to the broker that must
//! answer it — the controller for topic and partition changes, the partition leader for
//! offsets and record deletion, the group coordinator (found with FindCoordinator) for
//! group calls, the broker itself for broker configs — retries retriable failures with
//! exponential backoff, and returns one result per resource, so one failed topic does
//! not fail the others: calls return `Result<Vec<(resource, Result<value>)>>`, where the
//! outer error means the call as a whole could not be made (no broker reachable, the
//! broker lacks the API: `UnsupportedVersion` naming it).
//!
//! ```no_run
//! use kafkapipe::admin::{Admin, OffsetSpec, TopicPartition};
//! use kafkapipe::conn::NewTopic;
//!
//! # async fn demo() -> kafkapipe::Result<()> {
//! let admin = Admin::connect(["127.0.0.1:9092"])?;
//! for (topic, result) in admin.create_topics(&[NewTopic::new("events", 3)], false).await? {
//!     println!("{topic}: {result:?}");
//! }
//! let ends = admin
//!     .list_offsets(&[(TopicPartition::new("events", 0), OffsetSpec::Latest)])
//!     .await?;
//! println!("{ends:?}");
//! # Ok(()) }
//! ```

mod acls;
mod configs;
mod groups;
mod offsets;
mod quotas;
mod scram;
mod share;
mod topics;
mod types;

pub use acls::{
    AclBinding, AclBindingFilter, AclOperation, AclPermissionType, PatternType, ResourceType,
};
pub use quotas::{QuotaEntity, QuotaEntityType, QuotaFilter, QuotaMatch, QuotaOp, QuotaValues};
pub use scram::{
    ScramCredential, ScramCredentialAlteration, ScramMechanism, DEFAULT_SCRAM_ITERATIONS,
};
pub use share::{ShareGroupDescription, ShareGroupOffset, ShareMemberDescription};

pub use types::{
    AlterConfigOp, ClusterDescription, CommittedOffset, ConfigEntry, ConfigResource, ConfigSource,
    ConsumerGroupDescription, ConsumerGroupMemberDescription, GroupDescription, GroupListing,
    ListedOffset, MemberDescription, OffsetFetchOptions, OffsetSpec, TopicListing, TopicPartition,
};

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tracing::debug;

use crate::cluster::Cluster;
use crate::conn::{Broker, Conn, Connection, ConnectionConfig, Metadata};
use crate::error::{Error, ErrorKind, Result};
use crate::protocol::messages::{ApiVersionRange, DescribeClusterRequest};
use crate::protocol::ErrorCode;

/// Per-resource results of an admin call.
pub type Results<K, V = ()> = Vec<(K, Result<V>)>;

/// An admin client over a [`Cluster`].
///
/// ```no_run
/// use kafkapipe::admin::Admin;
///
/// # async fn demo() -> kafkapipe::Result<()> {
/// let admin = Admin::connect(["127.0.0.1:9092"])?;
/// let cluster = admin.describe_cluster().await?;
/// println!("cluster {:?}, controller {}", cluster.cluster_id, cluster.controller_id);
/// for t in admin.list_topics().await? {
///     println!("{} ({} partitions)", t.name, t.partitions);
/// }
/// # Ok(()) }
/// ```
///
/// # Cancellation safety
///
/// Dropping a call's future leaves the `Admin` (and the [`Cluster`] it shares) usable:
/// connections stay in sync (see [`Connection::send`]), a dial or metadata refresh
/// dropped midway leaves the cache as it was, and the call's retries simply stop. The
/// calls that only read (`list_*`, `describe_*`, `fetch_group_offsets(_with)`, `list_offsets`,
/// `find_coordinator`, `api_versions`) are therefore cancel safe. The calls that change
/// something (`create_topics`, `delete_topics`, `create_partitions`, `alter_configs`,
/// `incremental_alter_configs`, `delete_groups`, `commit_group_offsets`,
/// `reset_group_offsets`, `delete_group_offsets`, `delete_records`, `create_acls`,
/// `delete_acls`, `alter_user_scram_credentials`) are not: a request
/// already handed to its connection may still take effect after the future is dropped,
/// and a call spread over several brokers (`delete_records` to each partition leader,
/// broker configs to each broker, retries of the resources that failed) may be partly
/// applied, with no result to say which part. Describe the resources to find out, or
/// repeat the call (its per-resource results tell, e.g. `TopicAlreadyExists`). A call
/// dropped before its last step changes nothing (`reset_group_offsets` looks the
/// offsets up before it commits them).
#[derive(Debug, Clone)]
pub struct Admin {
    cluster: Cluster,
    attempts: u32,
    backoff: Duration,
    max_backoff: Duration,
    timeout: Duration,
    /// Group coordinators found so far, dropped when a call to one fails retriably.
    coordinators: Arc<Mutex<HashMap<String, i32>>>,
}

/// The error for a non-zero `code`, with the broker's message if it sent a useful one.
fn code_error(code: ErrorCode, message: Option<&str>) -> Error {
    let e = Error::kafka(code);
    match message {
        Some(m) if !m.is_empty() && m != "No error." => e.with_message(m.to_string()),
        _ => e,
    }
}

impl Admin {
    /// An admin client over `cluster` (sharing its metadata cache and connections).
    pub fn new(cluster: Cluster) -> Admin {
        Admin {
            cluster,
            attempts: 4,
            backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(1),
            timeout: Duration::from_secs(30),
            coordinators: Arc::default(),
        }
    }

    /// An admin client for the cluster reached through `bootstrap` (`host:port`
    /// addresses), with the default [`ConnectionConfig`]. Nothing is dialed yet.
    ///
    /// # Errors
    ///
    /// `Config` if `bootstrap` is empty.
    pub fn connect<I, S>(bootstrap: I) -> Result<Admin>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Ok(Admin::new(Cluster::new(
            bootstrap,
            ConnectionConfig::default(),
        )?))
    }

    /// How often a call is tried when it fails with a retriable error (default 4), and
    /// the first backoff between tries (default 100 ms, doubling up to 1 s).
    ///
    /// ```
    /// # use std::time::Duration;
    /// let admin = kafkapipe::admin::Admin::connect(["b:9092"])?
    ///     .with_retries(2, Duration::from_millis(10));
    /// # Ok::<(), kafkapipe::Error>(())
    /// ```
    pub fn with_retries(mut self, attempts: u32, backoff: Duration) -> Self {
        self.attempts = attempts.max(1);
        self.backoff = backoff;
        self.max_backoff = self.max_backoff.max(backoff);
        self
    }

    /// The broker-side timeout sent with topic, partition and record changes (default
    /// 30 s); also how long a call waits for a coordinator that is still loading its
    /// groups (`COORDINATOR_LOAD_IN_PROGRESS`) beyond the retry attempts.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The underlying cluster handle.
    pub fn cluster(&self) -> &Cluster {
        &self.cluster
    }

    /// Close every broker connection (the handle stays usable).
    pub async fn close(&self) {
        self.cluster.close().await;
    }

    fn delay(&self, attempt: u32) -> Duration {
        self.backoff
            .saturating_mul(1u32 << attempt.min(16))
            .min(self.max_backoff)
    }

    /// Whether `e` is a coordinator still loading its groups and the call, `started`
    /// then, is still within the timeout: waited for beyond the retry attempts.
    fn still_loading(&self, e: &Error, started: std::time::Instant) -> bool {
        e.kafka_code() == Some(ErrorCode::CoordinatorLoadInProgress)
            && started.elapsed() < self.timeout
    }

    /// Run `f` until it succeeds, fails with a non-retriable error, or the attempts are
    /// used up (a coordinator still loading is waited for within the timeout).
    async fn retry<T, F, Fut>(&self, op: &'static str, mut f: F) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        let mut attempt = 0;
        let started = std::time::Instant::now();
        loop {
            match f().await {
                Ok(v) => return Ok(v),
                Err(e)
                    if e.is_retriable()
                        && (attempt + 1 < self.attempts || self.still_loading(&e, started)) =>
                {
                    let delay = self.delay(attempt);
                    debug!(
                        op,
                        attempt,
                        error = %e,
                        delay_ms = delay.as_millis() as u64,
                        "admin call failed, retrying"
                    );
                    tokio::time::sleep(delay).await;
                    attempt += 1;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// A connection to any live broker (lowest id first). When none of the cached
    /// brokers answers, the broker list is refreshed (through the bootstrap addresses if
    /// need be) and tried once more.
    async fn any_connection(&self) -> Result<(i32, Connection)> {
        let mut last = None;
        for round in 0..2 {
            let mut brokers = self.cluster.brokers();
            if brokers.is_empty() || round == 1 {
                self.cluster.refresh(&[]).await?;
                brokers = self.cluster.brokers();
            }
            for (id, _) in brokers {
                match self.cluster.connection(id).await {
                    Ok(c) => return Ok((id, c)),
                    Err(e) => {
                        debug!(broker_id = id, error = %e, "broker unreachable");
                        last = Some(e);
                    }
                }
            }
        }
        Err(last.unwrap_or_else(|| Error::new(ErrorKind::Metadata, "no brokers known")))
    }

    /// Metadata for `topics` (`None`: all) from any broker.
    pub(crate) async fn metadata(&self, topics: Option<&[&str]>) -> Result<Metadata> {
        self.retry("Metadata", || async move {
            let (_, c) = self.any_connection().await?;
            Conn::from_connection(c).metadata(topics).await
        })
        .await
    }

    /// A connection to the controller (any broker if the controller is unknown; KRaft
    /// brokers forward controller requests).
    async fn controller(&self) -> Result<Connection> {
        let md = self.metadata(Some(&[])).await?;
        if md.controller_id >= 0 {
            match self.cluster.connection(md.controller_id).await {
                Ok(c) => return Ok(c),
                Err(e) => {
                    debug!(controller = md.controller_id, error = %e, "controller unreachable")
                }
            }
        }
        Ok(self.any_connection().await?.1)
    }

    /// Send `items` (grouped per partition leader, concurrently) with `send`, retrying the
    /// partitions that failed retriably after a metadata refresh. Results are in input
    /// order.
    async fn per_leader<K, V, F, Fut>(
        &self,
        op: &'static str,
        items: Vec<(TopicPartition, K)>,
        send: F,
    ) -> Results<TopicPartition, V>
    where
        K: Clone,
        F: Fn(Connection, Vec<(TopicPartition, K)>) -> Fut,
        Fut: Future<Output = Result<Results<TopicPartition, V>>>,
    {
        self.fan_out(
            op,
            items,
            |tp: TopicPartition| async move { self.cluster.leader_for(&tp.topic, tp.partition).await },
            |tp: &TopicPartition| self.cluster.invalidate(&tp.topic),
            |c, _, batch| send(c, batch),
        )
        .await
    }

    /// Send `items` grouped by the broker `route` picks for each key — one request per
    /// broker, concurrently — and retry the keys that failed retriably (after `forget`,
    /// which drops what routed them there) with backoff. A key listed twice goes into the
    /// next round (Kafka rejects duplicates in one request). Results are in input order.
    async fn fan_out<Key, K, V, R, RFut, G, F, Fut>(
        &self,
        op: &'static str,
        items: Vec<(Key, K)>,
        route: R,
        forget: G,
        send: F,
    ) -> Results<Key, V>
    where
        Key: Clone + Eq + std::hash::Hash + std::fmt::Display,
        K: Clone,
        R: Fn(Key) -> RFut,
        RFut: Future<Output = Result<i32>>,
        G: Fn(&Key),
        F: Fn(Connection, i32, Vec<(Key, K)>) -> Fut,
        Fut: Future<Output = Result<Results<Key, V>>>,
    {
        let mut results: Vec<Option<Result<V>>> = items.iter().map(|_| None).collect();
        let mut pending: Vec<usize> = (0..items.len()).collect();
        let mut attempt = 0;
        let started = std::time::Instant::now();
        while !pending.is_empty() {
            let last = attempt + 1 >= self.attempts;
            let mut outcome: Vec<(usize, Result<V>)> = Vec::new();
            let mut groups: BTreeMap<i32, Vec<usize>> = BTreeMap::new();
            let mut seen = std::collections::HashSet::new();
            let mut deferred = Vec::new();
            for &i in &pending {
                let key = &items[i].0;
                if !seen.insert(key) {
                    deferred.push(i);
                    continue;
                }
                match route(key.clone()).await {
                    Ok(node) => groups.entry(node).or_default().push(i),
                    Err(e) => outcome.push((i, Err(e))),
                }
            }
            let send = &send;
            let items_ref = &items;
            let sends = groups.into_iter().map(|(node, idxs)| async move {
                let batch: Vec<(Key, K)> = idxs.iter().map(|&i| items_ref[i].clone()).collect();
                debug!(op, broker_id = node, keys = batch.len(), "admin request");
                let r = match self.cluster.connection(node).await {
                    Ok(c) => send(c, node, batch).await,
                    Err(e) => Err(e),
                };
                (idxs, r)
            });
            for (idxs, r) in futures::future::join_all(sends).await {
                match r {
                    Ok(list) => {
                        let mut by_key: HashMap<Key, Result<V>> = list.into_iter().collect();
                        for i in idxs {
                            let key = &items[i].0;
                            let r = by_key.remove(key).unwrap_or_else(|| {
                                Err(Error::protocol(format!(
                                    "{op} response does not mention {key}"
                                )))
                            });
                            outcome.push((i, r));
                        }
                    }
                    Err(e) => outcome.extend(idxs.into_iter().map(|i| (i, Err(e.clone())))),
                }
            }
            let mut retry = false;
            pending = deferred;
            for (i, r) in outcome {
                match r {
                    Err(e) if e.is_retriable() && (!last || self.still_loading(&e, started)) => {
                        let key = &items[i].0;
                        debug!(op, key = %key, error = %e, "retrying");
                        forget(key);
                        pending.push(i);
                        retry = true;
                    }
                    r => results[i] = Some(r),
                }
            }
            pending.sort_unstable();
            if retry {
                tokio::time::sleep(self.delay(attempt)).await;
                attempt += 1;
            }
        }
        items
            .into_iter()
            .zip(results)
            .map(|((key, _), r)| {
                let r = r.unwrap_or_else(|| Err(Error::protocol(format!("{op}: no result"))));
                (key, r)
            })
            .collect()
    }

    // ---------------------------------------------------------------- topics

    /// The cluster id, controller and brokers: DescribeCluster where the broker speaks
    /// it, else Metadata.
    pub async fn describe_cluster(&self) -> Result<ClusterDescription> {
        let (_, c) = self
            .retry("DescribeCluster", || self.any_connection())
            .await?;
        if c.version_for::<DescribeClusterRequest>().is_ok() {
            let c = &c;
            let resp = self
                .retry("DescribeCluster", || async move {
                    let r = c.send(&DescribeClusterRequest::default()).await?;
                    match ErrorCode::non_zero(r.error_code) {
                        Some(code) => {
                            Err(code_error(code, r.error_message.as_deref())
                                .with_broker(c.broker()))
                        }
                        None => Ok(r),
                    }
                })
                .await?;
            let mut brokers: Vec<Broker> = resp
                .brokers
                .into_iter()
                .map(|b| Broker {
                    id: b.broker_id,
                    host: b.host,
                    port: b.port,
                    rack: b.rack,
                })
                .collect();
            brokers.sort_by_key(|b| b.id);
            return Ok(ClusterDescription {
                cluster_id: Some(resp.cluster_id),
                controller_id: resp.controller_id,
                brokers,
            });
        }
        let md = self.metadata(Some(&[])).await?;
        let mut brokers = md.brokers;
        brokers.sort_by_key(|b| b.id);
        Ok(ClusterDescription {
            cluster_id: md.cluster_id,
            controller_id: md.controller_id,
            brokers,
        })
    }

    /// The API version ranges each broker supports (from its ApiVersions handshake).
    ///
    /// ```no_run
    /// # async fn demo(admin: kafkapipe::admin::Admin) -> kafkapipe::Result<()> {
    /// for (broker, ranges) in admin.api_versions().await? {
    ///     for r in ranges? {
    ///         println!("{} {} {}..={}", broker.id, r.api_key, r.min_version, r.max_version);
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn api_versions(&self) -> Result<Results<Broker, Vec<ApiVersionRange>>> {
        let md = self.metadata(Some(&[])).await?;
        let mut brokers = md.brokers;
        brokers.sort_by_key(|b| b.id);
        let mut out = Vec::with_capacity(brokers.len());
        for b in brokers {
            let r = self
                .retry("ApiVersions", || self.cluster.connection(b.id))
                .await
                .and_then(|c| {
                    c.api_versions().map(|v| v.api_keys.clone()).ok_or_else(|| {
                        Error::new(ErrorKind::UnsupportedVersion, "no ApiVersions handshake")
                    })
                });
            out.push((b, r));
        }
        Ok(out)
    }
}

// The admin's routing and retry tests run against MockCluster.
#[cfg(all(test, feature = "mock"))]
mod tests;
