//! The cluster view shared by the `Writer` (and later the reader and admin client):
//! a metadata cache and one lazily established [`Connection`] per broker.
//!
//! [`Cluster`] is a cheap handle (an `Arc`). It knows the bootstrap addresses and the
//! [`ConnectionConfig`] to dial with; it learns brokers and partition leaders from
//! Metadata requests, caches them, and refreshes a topic on demand — when it is first
//! asked for, when it is older than [`Cluster::with_metadata_max_age`], or after
//! [`Cluster::invalidate`] (which callers use when a broker answered
//! `NotLeaderOrFollower`, `LeaderNotAvailable`, `UnknownTopicOrPartition` or the
//! connection failed). Refreshes of the same topic are at least
//! [`Cluster::with_refresh_backoff`] apart (Java: `retry.backoff.ms`), and concurrent
//! refreshes are coalesced into one request.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tracing::debug;

use crate::conn::{Conn, Connection, ConnectionConfig, Metadata};
use crate::error::{Error, ErrorKind, Result};
use crate::protocol::ErrorCode;

/// One partition of a topic and the broker leading it.
///
/// ```
/// use kafkapipe::cluster::{PartitionLeader, TopicMetadata};
/// let t = TopicMetadata {
///     name: "events".into(),
///     partitions: vec![PartitionLeader { id: 0, leader: 1 }, PartitionLeader { id: 1, leader: -1 }],
/// };
/// assert_eq!(t.partition_ids(), [0, 1]);
/// assert_eq!(t.leader(0), Some(1));
/// assert_eq!(t.leader(1), None); // no leader right now
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartitionLeader {
    /// Partition index.
    pub id: i32,
    /// Leader broker id, `-1` while there is none.
    pub leader: i32,
}

/// The cached metadata of one topic (see [`PartitionLeader`] for an example).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicMetadata {
    /// Topic name.
    pub name: String,
    /// Partitions, sorted by id.
    pub partitions: Vec<PartitionLeader>,
}

impl TopicMetadata {
    /// The partition ids, sorted.
    pub fn partition_ids(&self) -> Vec<i32> {
        self.partitions.iter().map(|p| p.id).collect()
    }

    /// The leader of `partition`, if the partition exists and has one.
    pub fn leader(&self, partition: i32) -> Option<i32> {
        self.partitions
            .iter()
            .find(|p| p.id == partition)
            .map(|p| p.leader)
            .filter(|l| *l >= 0)
    }
}

struct TopicEntry {
    result: std::result::Result<Arc<TopicMetadata>, ErrorCode>,
    /// Each partition's leader epoch as Metadata reported it (KIP-320; absent or -1 when
    /// the broker did not say).
    epochs: HashMap<i32, i32>,
    fetched: Instant,
    stale: bool,
}

#[derive(Default)]
struct Meta {
    brokers: HashMap<i32, String>,
    topics: HashMap<String, TopicEntry>,
    brokers_fetched: Option<Instant>,
}

type Slot = Arc<tokio::sync::Mutex<Option<Connection>>>;

struct Inner {
    bootstrap: Vec<String>,
    config: ConnectionConfig,
    refresh_backoff: Duration,
    max_age: Duration,
    auto_create: bool,
    meta: Mutex<Meta>,
    refresh_lock: tokio::sync::Mutex<Option<Connection>>,
    conns: Mutex<HashMap<i32, Slot>>,
}

/// A handle on a Kafka cluster: metadata cache plus one connection per broker.
///
/// ```no_run
/// use kafkapipe::cluster::Cluster;
/// use kafkapipe::conn::ConnectionConfig;
///
/// # async fn demo() -> kafkapipe::Result<()> {
/// let cluster = Cluster::new(["127.0.0.1:9092"], ConnectionConfig::default())?;
/// let partitions = cluster.partitions("events").await?;
/// let leader = cluster.leader_for("events", partitions[0]).await?;
/// let conn = cluster.connection(leader).await?;
/// assert!(!conn.is_closed());
/// cluster.close().await;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Cluster {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("bootstrap", &self.inner.bootstrap)
            .finish()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Cluster {
    /// A cluster reached through `bootstrap` addresses (`host:port`). Nothing is dialed
    /// until the first request.
    ///
    /// # Errors
    ///
    /// `Config` if `bootstrap` is empty.
    pub fn new<I, S>(bootstrap: I, config: ConnectionConfig) -> Result<Cluster>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let bootstrap: Vec<String> = bootstrap.into_iter().map(Into::into).collect();
        if bootstrap.is_empty() {
            return Err(Error::config("at least one bootstrap broker is needed"));
        }
        Ok(Cluster {
            inner: Arc::new(Inner {
                bootstrap,
                config,
                refresh_backoff: Duration::from_millis(100),
                max_age: Duration::from_secs(300),
                auto_create: false,
                meta: Mutex::new(Meta::default()),
                refresh_lock: tokio::sync::Mutex::new(None),
                conns: Mutex::new(HashMap::new()),
            }),
        })
    }

    fn inner_mut(&mut self) -> Option<&mut Inner> {
        Arc::get_mut(&mut self.inner)
    }

    /// The least time between two metadata refreshes of one topic. Default 100 ms
    /// (Java: `retry.backoff.ms`). Only takes effect before the handle is cloned.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use kafkapipe::{cluster::Cluster, conn::ConnectionConfig};
    /// let c = Cluster::new(["b:9092"], ConnectionConfig::default())?
    ///     .with_refresh_backoff(Duration::from_millis(50));
    /// # Ok::<(), kafkapipe::Error>(())
    /// ```
    pub fn with_refresh_backoff(mut self, backoff: Duration) -> Self {
        if let Some(inner) = self.inner_mut() {
            inner.refresh_backoff = backoff;
        }
        self
    }

    /// How long cached metadata is trusted before it is refreshed anyway. Default 5 min
    /// (Java: `metadata.max.age.ms`). Only takes effect before the handle is cloned.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use kafkapipe::{cluster::Cluster, conn::ConnectionConfig};
    /// let c = Cluster::new(["b:9092"], ConnectionConfig::default())?
    ///     .with_metadata_max_age(Duration::from_secs(30));
    /// # Ok::<(), kafkapipe::Error>(())
    /// ```
    pub fn with_metadata_max_age(mut self, max_age: Duration) -> Self {
        if let Some(inner) = self.inner_mut() {
            inner.max_age = max_age;
        }
        self
    }

    /// Ask brokers to create missing topics when looking them up (Metadata
    /// `allow_auto_topic_creation`; the broker's `auto.create.topics.enable` decides).
    /// Default off. Only takes effect before the handle is cloned.
    ///
    /// ```
    /// # use kafkapipe::{cluster::Cluster, conn::ConnectionConfig};
    /// let c = Cluster::new(["b:9092"], ConnectionConfig::default())?.with_auto_create_topics(true);
    /// # Ok::<(), kafkapipe::Error>(())
    /// ```
    pub fn with_auto_create_topics(mut self, allow: bool) -> Self {
        if let Some(inner) = self.inner_mut() {
            inner.auto_create = allow;
        }
        self
    }

    /// The connection configuration used for every broker.
    pub fn config(&self) -> &ConnectionConfig {
        &self.inner.config
    }

    /// The bootstrap addresses.
    pub fn bootstrap(&self) -> &[String] {
        &self.inner.bootstrap
    }

    /// The cached metadata of `topic`, refreshed first if missing, stale or too old.
    ///
    /// # Errors
    ///
    /// The topic's error code as reported by the broker (`UnknownTopicOrPartition`,
    /// `LeaderNotAvailable` while it is being created, …) with the topic attached, or the
    /// error of the Metadata request if no broker could be asked.
    pub async fn topic(&self, topic: &str) -> Result<Arc<TopicMetadata>> {
        if let Some(r) = self.cached_topic(topic, Instant::now()) {
            return r;
        }
        self.refresh(&[topic]).await?;
        match self.lookup(topic) {
            Some(Ok(t)) => Ok(t),
            Some(Err(code)) => Err(Error::kafka(code).with_topic(topic)),
            None => Err(Error::kafka(ErrorCode::UnknownTopicOrPartition).with_topic(topic)),
        }
    }

    /// The partition ids of `topic`, sorted (see [`Cluster::topic`]).
    pub async fn partitions(&self, topic: &str) -> Result<Vec<i32>> {
        Ok(self.topic(topic).await?.partition_ids())
    }

    /// The broker id leading `topic`/`partition` (see [`Cluster::topic`]).
    ///
    /// # Errors
    ///
    /// `UnknownTopicOrPartition` if the partition does not exist, `LeaderNotAvailable`
    /// (retriable) if it has no leader right now.
    pub async fn leader_for(&self, topic: &str, partition: i32) -> Result<i32> {
        let t = self.topic(topic).await?;
        match t.partitions.iter().find(|p| p.id == partition) {
            None => Err(Error::kafka(ErrorCode::UnknownTopicOrPartition)
                .with_topic(topic)
                .with_partition(partition)),
            Some(p) if p.leader < 0 => Err(Error::kafka(ErrorCode::LeaderNotAvailable)
                .with_topic(topic)
                .with_partition(partition)),
            Some(p) => Ok(p.leader),
        }
    }

    /// The broker id leading `topic`/`partition` and the partition's leader epoch (`-1`
    /// if the broker did not report one), as [`Cluster::leader_for`]. Consumers send the
    /// epoch with Fetch and ListOffsets, so a broker that is not the leader of that epoch
    /// refuses them (KIP-320).
    ///
    /// ```no_run
    /// # async fn demo(cluster: &kafkapipe::cluster::Cluster) -> kafkapipe::Result<()> {
    /// let (leader, epoch) = cluster.leader_and_epoch("events", 0).await?;
    /// println!("partition 0 is led by broker {leader} in leader epoch {epoch}");
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`Cluster::leader_for`].
    pub async fn leader_and_epoch(&self, topic: &str, partition: i32) -> Result<(i32, i32)> {
        let leader = self.leader_for(topic, partition).await?;
        let epoch = lock(&self.inner.meta)
            .topics
            .get(topic)
            .and_then(|e| e.epochs.get(&partition).copied())
            .unwrap_or(-1);
        Ok((leader, epoch))
    }

    /// Mark `topic`'s metadata stale: the next lookup refreshes it (no sooner than the
    /// refresh backoff after the previous refresh). Call it when a broker says it no longer
    /// leads a partition or a connection to the leader failed.
    pub fn invalidate(&self, topic: &str) {
        if let Some(e) = lock(&self.inner.meta).topics.get_mut(topic) {
            e.stale = true;
        }
    }

    /// The address of broker `id`, if known from metadata.
    pub fn broker_addr(&self, id: i32) -> Option<String> {
        lock(&self.inner.meta).brokers.get(&id).cloned()
    }

    /// The brokers known from the last metadata refresh, as `(id, "host:port")` sorted by
    /// id; empty before the first refresh (see [`Cluster::refresh`]).
    pub fn brokers(&self) -> Vec<(i32, String)> {
        let mut v: Vec<(i32, String)> = lock(&self.inner.meta)
            .brokers
            .iter()
            .map(|(id, a)| (*id, a.clone()))
            .collect();
        v.sort();
        v
    }

    /// The connection to broker `id`: established on first use, and re-established if the
    /// previous one is closed. Concurrent callers share one dial.
    ///
    /// # Errors
    ///
    /// `Metadata` if the broker id is unknown even after a refresh, or the error of
    /// [`Connection::connect`].
    pub async fn connection(&self, id: i32) -> Result<Connection> {
        let slot: Slot = lock(&self.inner.conns).entry(id).or_default().clone();
        let mut guard = slot.lock().await;
        if let Some(c) = guard.as_ref() {
            if !c.is_closed() {
                return Ok(c.clone());
            }
            debug!(
                broker_id = id,
                broker = c.broker(),
                "replacing closed connection"
            );
        }
        let addr = match self.broker_addr(id) {
            Some(a) => a,
            None => {
                self.refresh(&[]).await?;
                self.broker_addr(id).ok_or_else(|| {
                    Error::new(ErrorKind::Metadata, format!("unknown broker id {id}"))
                })?
            }
        };
        let conn = Connection::connect(&addr, self.inner.config.clone()).await?;
        *guard = Some(conn.clone());
        Ok(conn)
    }

    /// The open connection to broker `id`, if one is established; never dials.
    pub fn open_connection(&self, id: i32) -> Option<Connection> {
        let slot = lock(&self.inner.conns).get(&id).cloned()?;
        let guard = slot.try_lock().ok()?;
        guard.as_ref().filter(|c| !c.is_closed()).cloned()
    }

    /// Fetch metadata for `topics` now (an empty slice refreshes the broker list only)
    /// and update the cache. Concurrent refreshes are coalesced; a topic refreshed less
    /// than the refresh backoff ago is not asked for again before that backoff elapsed.
    ///
    /// # Errors
    ///
    /// The last error if no known or bootstrap broker answered.
    pub async fn refresh(&self, topics: &[&str]) -> Result<()> {
        let asked = Instant::now();
        let mut meta_conn = self.inner.refresh_lock.lock().await;
        // Someone else refreshed everything we want while we waited for the lock.
        let wait = {
            let meta = lock(&self.inner.meta);
            let fresh = |fetched: Instant| fetched >= asked;
            let done = if topics.is_empty() {
                meta.brokers_fetched.is_some_and(fresh)
            } else {
                topics.iter().all(|t| {
                    meta.topics
                        .get(*t)
                        .is_some_and(|e| !e.stale && fresh(e.fetched))
                })
            };
            if done {
                return Ok(());
            }
            topics
                .iter()
                .filter_map(|t| meta.topics.get(*t))
                .map(|e| {
                    e.fetched
                        .checked_add(self.inner.refresh_backoff)
                        .unwrap_or(e.fetched)
                })
                .max()
        };
        if let Some(at) = wait {
            if at > Instant::now() {
                tokio::time::sleep_until(at.into()).await;
            }
        }
        let md = self.fetch_metadata(&mut meta_conn, topics).await?;
        self.store(topics, md);
        Ok(())
    }

    async fn fetch_metadata(
        &self,
        meta_conn: &mut Option<Connection>,
        topics: &[&str],
    ) -> Result<Metadata> {
        let mut last_err = None;
        if let Some(c) = meta_conn.as_ref().filter(|c| !c.is_closed()) {
            match Conn::from_connection(c.clone())
                .metadata_with(Some(topics), self.inner.auto_create)
                .await
            {
                Ok(md) => return Ok(md),
                Err(e) => {
                    debug!(broker = c.broker(), error = %e, "metadata request failed");
                    last_err = Some(e);
                }
            }
        }
        let mut candidates: Vec<String> =
            lock(&self.inner.meta).brokers.values().cloned().collect();
        candidates.sort();
        for b in &self.inner.bootstrap {
            if !candidates.contains(b) {
                candidates.push(b.clone());
            }
        }
        for addr in candidates {
            let conn = match Connection::connect(&addr, self.inner.config.clone()).await {
                Ok(c) => c,
                Err(e) => {
                    debug!(broker = %addr, error = %e, "metadata connect failed");
                    last_err = Some(e);
                    continue;
                }
            };
            match Conn::from_connection(conn.clone())
                .metadata_with(Some(topics), self.inner.auto_create)
                .await
            {
                Ok(md) => {
                    if let Some(old) = meta_conn.replace(conn) {
                        old.close().await;
                    }
                    return Ok(md);
                }
                Err(e) => {
                    debug!(broker = %addr, error = %e, "metadata request failed");
                    conn.close().await;
                    last_err = Some(e);
                }
            }
        }
        Err(last_err.unwrap_or_else(|| Error::new(ErrorKind::Metadata, "no broker to ask")))
    }

    fn store(&self, asked: &[&str], md: Metadata) {
        let now = Instant::now();
        let mut meta = lock(&self.inner.meta);
        meta.brokers = md.brokers.iter().map(|b| (b.id, b.addr())).collect();
        meta.brokers_fetched = Some(now);
        for t in &md.topics {
            let result = match t.error {
                Some(code) => Err(code),
                None => Ok(Arc::new(TopicMetadata {
                    name: t.name.clone(),
                    partitions: t
                        .partitions
                        .iter()
                        .map(|p| PartitionLeader {
                            id: p.id,
                            leader: if p.error == Some(ErrorCode::LeaderNotAvailable) {
                                -1
                            } else {
                                p.leader
                            },
                        })
                        .collect(),
                })),
            };
            let epochs = t
                .partitions
                .iter()
                .map(|p| (p.id, p.leader_epoch))
                .collect();
            meta.topics.insert(
                t.name.clone(),
                TopicEntry {
                    result,
                    epochs,
                    fetched: now,
                    stale: false,
                },
            );
        }
        for name in asked {
            if md.topic(name).is_none() {
                meta.topics.insert(
                    (*name).to_string(),
                    TopicEntry {
                        result: Err(ErrorCode::UnknownTopicOrPartition),
                        epochs: HashMap::new(),
                        fetched: now,
                        stale: false,
                    },
                );
            }
        }
        debug!(
            brokers = meta.brokers.len(),
            topics = md.topics.len(),
            "metadata refreshed"
        );
    }

    fn lookup(&self, topic: &str) -> Option<std::result::Result<Arc<TopicMetadata>, ErrorCode>> {
        lock(&self.inner.meta)
            .topics
            .get(topic)
            .map(|e| e.result.clone())
    }

    /// The cached answer for `topic` if it may be used at `now` without a refresh.
    fn cached_topic(&self, topic: &str, now: Instant) -> Option<Result<Arc<TopicMetadata>>> {
        let meta = lock(&self.inner.meta);
        let e = meta.topics.get(topic)?;
        if e.stale {
            return None;
        }
        let age = now.saturating_duration_since(e.fetched);
        match &e.result {
            Ok(t) if age < self.inner.max_age => Some(Ok(t.clone())),
            // Errors are cached only for the refresh backoff, so a topic being created
            // shows up soon.
            Err(code) if age < self.inner.refresh_backoff => {
                Some(Err(Error::kafka(*code).with_topic(topic)))
            }
            _ => None,
        }
    }

    /// The cached leader of `topic`/`partition` without any I/O, if known and fresh.
    pub fn cached_leader(&self, topic: &str, partition: i32) -> Option<i32> {
        match self.cached_topic(topic, Instant::now())? {
            Ok(t) => t.leader(partition),
            Err(_) => None,
        }
    }

    /// Close every broker connection. The handle stays usable: later calls dial again.
    pub async fn close(&self) {
        let slots: Vec<Slot> = lock(&self.inner.conns).drain().map(|(_, s)| s).collect();
        for s in slots {
            if let Some(c) = s.lock().await.take() {
                c.close().await;
            }
        }
        if let Some(c) = self.inner.refresh_lock.lock().await.take() {
            c.close().await;
        }
    }
}

#[cfg(test)]
mod tests;
