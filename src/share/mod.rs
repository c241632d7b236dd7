//! Share groups (KIP-932, Apache Kafka 4.2+): Kafka as a queue. [`ShareReader`] is a
//! `Stream<Item = Result<Message>>` over a share group: any number of members read the
//! same partitions, each record handed to one member at a time under an acquisition lock
//! and acknowledged on its own.
//!
//! This module owns the share reader: `mod.rs` the [`ShareReader`] stream, its
//! [`ShareReaderConfig`] and [`ShareStats`], and the ledger of acquired records that the
//! messages' [`AckToken`](crate::group::AckToken)s settle; `task.rs` the background task
//! (ShareGroupHeartbeat membership, one share session per partition leader with ShareFetch
//! and ShareAcknowledge, acknowledgements piggy-backed on fetches, leaving on close).
//!
//! # Acknowledgements
//!
//! Each message's [`AckToken`](crate::group::AckToken) decides how its record is
//! acknowledged, by the same rules as a consumer group's commit:
//!
//! | the token | acknowledged as |
//! | --- | --- |
//! | [`ack`](crate::group::AckToken::ack)ed, or carried by a [`writer::Message`](crate::writer::Message) the broker acknowledged | ACCEPT |
//! | dropped, and the reader polled afterwards (a `filter`, a finished [`Tracked`](crate::reader::Tracked)) | ACCEPT ([`AckMode::Implicit`], the default) or RELEASE ([`AckMode::Explicit`]) |
//! | [`release`](crate::group::AckToken::release)d / [`fail`](crate::group::AckToken::fail)ed, its writer delivery failed, dropped in a panic | RELEASE: delivered again, delivery count + 1 |
//! | [`reject`](crate::group::AckToken::reject)ed | REJECT: archived, never delivered again |
//! | dropped and the reader never polled again (the pipeline failed and dropped the reader) | RELEASE when the reader goes |
//! | still held when [`ShareReader::close`] gives up waiting (`close_timeout`) | RELEASE |
//!
//! A dropped token does not ACCEPT work still in flight as long as the work keeps the
//! token: in front of `buffer_unordered` / `try_for_each_concurrent` use
//! [`map_tracked`](crate::reader::MessageStreamExt::map_tracked) or
//! [`process_concurrent`](crate::reader::MessageStreamExt::process_concurrent), exactly as
//! for a consumer group (`reader.map_ok(|m| m.value)` drops the token before the work
//! starts); or choose [`AckMode::Explicit`], where only an explicit ack (or a writer's)
//! accepts.
//!
//! # Backpressure and locks
//!
//! The reader holds at most [`ShareReaderConfig::max_in_flight`] acquired records that are
//! not yet settled (buffered or in the pipeline): it asks each ShareFetch for no more than
//! the room left (`MaxRecords`, with the record-limit acquire mode where the broker has
//! ShareFetch v2, so the bound is exact) and stops fetching when the pipeline holds that
//! many, sending acknowledgements with ShareAcknowledge meanwhile.
//!
//! Each record is acquired under the broker's acquisition lock
//! (`group.share.record.lock.duration.ms`, 30 s by default; per group
//! `share.record.lock.duration.ms`, 15–60 s). While the reader holds a record (buffered,
//! or yielded with its token alive and not yet settled) it renews the lock each time half
//! of it has passed (KIP-1222 RENEW acknowledgements, brokers with ShareAcknowledge v2:
//! Apache Kafka 4.2+), so a slow stage keeps its record. Renewal stops once the record has
//! been held [`ShareReaderConfig::max_lock_hold`] (default 5 minutes): a stuck stage holds
//! a record at most that long plus one lock duration. A record whose lock ran out (past
//! the bound, renewal off or unsupported) is released by the broker and may be delivered
//! to another member; its late acknowledgement fails ([`ShareStats::ack_errors`]).
//!
//! Renewal is automatic, not an explicit call on the token as the Java
//! `KafkaShareConsumer`'s `acknowledge(record, AcknowledgeType.RENEW)`: an unsettled token
//! already says that the work is in progress, and `max_lock_hold` bounds it.
//!
//! Reference: KIP-932 (Queues for Kafka), KIP-1222 (acquisition lock renewal), Kafka's
//! `ShareConsumerImpl` and `ShareSessionHandler`.

mod task;

use std::collections::{BTreeMap, HashMap};
use std::pin::Pin;
use std::sync::atomic::{AtomicI32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::Stream;
use tokio::sync::{mpsc, watch, Notify};
use tokio::time::Instant;

use crate::conn::ConnectionConfig;
use crate::error::{Error, ErrorKind, Result};
use crate::group::{ShareLedger, ShareOutcome};
use crate::reader::Message;

/// A topic id and partition.
pub(crate) type Tp = ([u8; 16], i32);

/// Acknowledge types of ShareFetch / ShareAcknowledge.
pub(crate) const GAP: i8 = 0;
pub(crate) const ACCEPT: i8 = 1;
pub(crate) const RELEASE: i8 = 2;
pub(crate) const REJECT: i8 = 3;
/// Renew the acquisition lock (KIP-1222, ShareAcknowledge v2).
pub(crate) const RENEW: i8 = 4;

/// What a dropped token means (see the [module docs](self)).
///
/// ```
/// use kafkapipe::share::{AckMode, ShareReaderConfig};
/// let strict = ShareReaderConfig::new(["127.0.0.1:9092"], "g").ack_mode(AckMode::Explicit);
/// assert_eq!(AckMode::default(), AckMode::Implicit);
/// # let _ = strict;
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AckMode {
    /// A token dropped before the reader is polled again counts as processed: ACCEPT
    /// (the consumer group rule, and the Java `KafkaShareConsumer`'s implicit mode).
    #[default]
    Implicit,
    /// Only an explicit ack (or a writer's acknowledgement) accepts; a dropped token
    /// releases its record.
    Explicit,
}

/// The settings of a [`ShareReader`].
///
/// ```
/// use kafkapipe::share::{AckMode, ShareReaderConfig};
///
/// let config = ShareReaderConfig::new(["127.0.0.1:9092"], "workers")
///     .topic("jobs")
///     .max_in_flight(100)
///     .ack_mode(AckMode::Explicit);
/// assert_eq!(config.max_records, 100);
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ShareReaderConfig {
    /// Bootstrap broker addresses (`host:port`). Required.
    pub brokers: Vec<String>,
    /// The share group id (Java `group.id`). Required.
    pub group_id: String,
    /// The topics to subscribe to. At least one.
    pub topics: Vec<String>,
    /// Most records one ShareFetch asks for (`MaxRecords`; Java `max.poll.records`).
    /// Default 500, at most `max_in_flight`.
    pub max_records: usize,
    /// Most acquired records held at once, buffered or in the pipeline, not yet settled.
    /// Default 1000.
    pub max_in_flight: usize,
    /// How long a ShareFetch waits for records (Java `fetch.max.wait.ms`). Default
    /// 500 ms.
    pub max_wait: Duration,
    /// Most bytes one ShareFetch returns (Java `fetch.max.bytes`). Default 50 MiB.
    pub max_bytes: i32,
    /// What a dropped token means. Default [`AckMode::Implicit`].
    pub ack_mode: AckMode,
    /// How long [`ShareReader::close`] waits for the records it yielded to be settled
    /// before it releases the rest. Default 10 s.
    pub close_timeout: Duration,
    /// The member's rack (Java `client.rack`). Default none.
    pub client_rack: Option<String>,
    /// How long the reader keeps renewing the acquisition lock of a record it holds
    /// (KIP-1222: RENEW acknowledgements, brokers with ShareAcknowledge v2, Apache Kafka
    /// 4.2+, group config `share.renew.acknowledge.enable`, on by default). A record is
    /// renewed while its token is alive and not yet settled, each time half of its lock
    /// has passed, until it has been held this long; then its lock runs out (at most one
    /// lock duration later) and the broker may deliver it to another member. The bound
    /// keeps a stuck stage from holding records forever. `Duration::ZERO` turns renewal
    /// off. Default 5 minutes (no Java equivalent: the Java `KafkaShareConsumer` renews
    /// only on an explicit `acknowledge(record, RENEW)`).
    pub max_lock_hold: Duration,
    /// The settings of every broker connection (client id, timeouts, TLS, SASL,
    /// dialer); a ShareFetch's `max_wait` is added to its request timeout. Default
    /// [`ConnectionConfig::default`]. Set it whole with
    /// [`connection`](Self::connection) or one setting at a time.
    pub connection: ConnectionConfig,
}

impl ShareReaderConfig {
    /// A config for share group `group_id` with the defaults.
    ///
    /// ```
    /// let c = kafkapipe::share::ShareReaderConfig::new(["127.0.0.1:9092"], "g");
    /// assert_eq!(c.max_in_flight, 1000);
    /// ```
    pub fn new<I, S>(brokers: I, group_id: impl Into<String>) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        ShareReaderConfig {
            brokers: brokers.into_iter().map(Into::into).collect(),
            group_id: group_id.into(),
            topics: Vec::new(),
            max_records: 500,
            max_in_flight: 1000,
            max_wait: Duration::from_millis(500),
            max_bytes: 50 * 1024 * 1024,
            ack_mode: AckMode::Implicit,
            close_timeout: Duration::from_secs(10),
            client_rack: None,
            max_lock_hold: Duration::from_secs(300),
            connection: ConnectionConfig::default(),
        }
    }

    /// Subscribe to `topic` too.
    ///
    /// ```
    /// let c = kafkapipe::share::ShareReaderConfig::new(["b:9092"], "g").topic("a").topic("b");
    /// assert_eq!(c.topics, ["a", "b"]);
    /// ```
    pub fn topic(mut self, topic: impl Into<String>) -> Self {
        self.topics.push(topic.into());
        self
    }

    /// Set [`max_records`](Self::max_records).
    ///
    /// ```
    /// let c = kafkapipe::share::ShareReaderConfig::new(["b:9092"], "g").max_records(10);
    /// assert_eq!(c.max_records, 10);
    /// ```
    pub fn max_records(mut self, n: usize) -> Self {
        self.max_records = n;
        self
    }

    /// Set [`max_in_flight`](Self::max_in_flight) (and lower `max_records` to it).
    ///
    /// ```
    /// let c = kafkapipe::share::ShareReaderConfig::new(["b:9092"], "g").max_in_flight(8);
    /// assert_eq!((c.max_in_flight, c.max_records), (8, 8));
    /// ```
    pub fn max_in_flight(mut self, n: usize) -> Self {
        self.max_in_flight = n;
        self.max_records = self.max_records.min(n);
        self
    }

    /// Set [`max_wait`](Self::max_wait).
    ///
    /// ```
    /// use std::time::Duration;
    /// let c = kafkapipe::share::ShareReaderConfig::new(["b:9092"], "g")
    ///     .max_wait(Duration::from_millis(100));
    /// assert_eq!(c.max_wait, Duration::from_millis(100));
    /// ```
    pub fn max_wait(mut self, d: Duration) -> Self {
        self.max_wait = d;
        self
    }

    /// Set [`ack_mode`](Self::ack_mode).
    ///
    /// ```
    /// use kafkapipe::share::{AckMode, ShareReaderConfig};
    /// let c = ShareReaderConfig::new(["b:9092"], "g").ack_mode(AckMode::Explicit);
    /// assert_eq!(c.ack_mode, AckMode::Explicit);
    /// ```
    pub fn ack_mode(mut self, mode: AckMode) -> Self {
        self.ack_mode = mode;
        self
    }

    /// Set [`close_timeout`](Self::close_timeout).
    ///
    /// ```
    /// use std::time::Duration;
    /// let c = kafkapipe::share::ShareReaderConfig::new(["b:9092"], "g")
    ///     .close_timeout(Duration::from_secs(1));
    /// assert_eq!(c.close_timeout, Duration::from_secs(1));
    /// ```
    pub fn close_timeout(mut self, d: Duration) -> Self {
        self.close_timeout = d;
        self
    }

    /// Set [`max_lock_hold`](Self::max_lock_hold) (`Duration::ZERO`: no lock renewal).
    ///
    /// ```
    /// use std::time::Duration;
    /// let c = kafkapipe::share::ShareReaderConfig::new(["b:9092"], "g")
    ///     .max_lock_hold(Duration::from_secs(60));
    /// assert_eq!(c.max_lock_hold, Duration::from_secs(60));
    /// ```
    pub fn max_lock_hold(mut self, d: Duration) -> Self {
        self.max_lock_hold = d;
        self
    }

    /// Set the client id sent with every request.
    ///
    /// ```
    /// let c = kafkapipe::share::ShareReaderConfig::new(["b:9092"], "g").client_id("worker-1");
    /// assert_eq!(c.connection.client_id, "worker-1");
    /// ```
    pub fn client_id(mut self, id: impl Into<String>) -> Self {
        self.connection.client_id = id.into();
        self
    }

    /// Use `connection` for every broker connection: replaces the client id, timeouts,
    /// TLS, SASL and dialer set so far (one [`ConnectionConfig`] can serve share readers,
    /// readers and writers alike).
    ///
    /// ```
    /// use kafkapipe::conn::ConnectionConfig;
    /// use kafkapipe::share::ShareReaderConfig;
    /// let conn = ConnectionConfig::new().client_id("worker-1");
    /// let c = ShareReaderConfig::new(["b:9092"], "g").connection(conn.clone());
    /// assert_eq!(c.connection, conn);
    /// ```
    pub fn connection(mut self, connection: ConnectionConfig) -> Self {
        self.connection = connection;
        self
    }

    /// Set how long establishing a broker connection may take
    /// ([`ConnectionConfig::connect_timeout`]).
    ///
    /// ```
    /// use std::time::Duration;
    /// let c = kafkapipe::share::ShareReaderConfig::new(["b:9092"], "g")
    ///     .connect_timeout(Duration::from_secs(3));
    /// assert_eq!(c.connection.connect_timeout, Duration::from_secs(3));
    /// ```
    pub fn connect_timeout(mut self, d: Duration) -> Self {
        self.connection.connect_timeout = d;
        self
    }

    /// Set how long one request may take ([`ConnectionConfig::request_timeout`]; a
    /// ShareFetch's [`max_wait`](Self::max_wait) is added to it).
    ///
    /// ```
    /// use std::time::Duration;
    /// let c = kafkapipe::share::ShareReaderConfig::new(["b:9092"], "g")
    ///     .request_timeout(Duration::from_secs(5));
    /// assert_eq!(c.connection.request_timeout, Duration::from_secs(5));
    /// ```
    pub fn request_timeout(mut self, d: Duration) -> Self {
        self.connection.request_timeout = d;
        self
    }

    /// Set the TLS of every broker connection ([`ConnectionConfig::tls`]).
    ///
    /// ```no_run
    /// # fn demo() -> kafkapipe::Result<()> {
    /// use kafkapipe::share::ShareReaderConfig;
    /// use kafkapipe::tls::TlsConfig;
    /// let tls = TlsConfig::builder().ca_file("ca.pem")?.build()?;
    /// let c = ShareReaderConfig::new(["broker:9093"], "g").topic("jobs").tls(tls);
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "tls")]
    pub fn tls(mut self, tls: crate::tls::TlsConfig) -> Self {
        self.connection.tls = Some(tls);
        self
    }

    /// Set the SASL mechanism of every broker connection ([`ConnectionConfig::sasl`]).
    ///
    /// ```
    /// use kafkapipe::sasl::Scram;
    /// use kafkapipe::share::ShareReaderConfig;
    /// let c = ShareReaderConfig::new(["broker:9093"], "g").sasl(Scram::sha256("alice", "secret"));
    /// assert!(c.connection.sasl.is_some());
    /// ```
    pub fn sasl(mut self, mechanism: impl crate::sasl::Mechanism + 'static) -> Self {
        self.connection.sasl = Some(std::sync::Arc::new(mechanism));
        self
    }

    /// Set how broker connections are opened ([`ConnectionConfig::dialer`]).
    ///
    /// ```
    /// use kafkapipe::conn::{Dialer, Socks5Proxy};
    /// use kafkapipe::share::ShareReaderConfig;
    /// let c = ShareReaderConfig::new(["broker:9092"], "g")
    ///     .dialer(Dialer::new().with_socks5_proxy(Socks5Proxy::new("127.0.0.1:1080")));
    /// assert!(c.connection.dialer.socks5_proxy().is_some());
    /// ```
    pub fn dialer(mut self, dialer: crate::conn::Dialer) -> Self {
        self.connection.dialer = dialer;
        self
    }

    fn validate(&self) -> Result<()> {
        let bad = |what: &str| {
            Err(Error::new(
                ErrorKind::Config,
                format!("share reader: {what}"),
            ))
        };
        if self.brokers.is_empty() {
            return bad("no brokers");
        }
        if self.group_id.is_empty() {
            return bad("empty group id");
        }
        if self.topics.is_empty() {
            return bad("no topics");
        }
        if self.max_in_flight == 0 || self.max_records == 0 {
            return bad("max_in_flight and max_records must be at least 1");
        }
        if self.max_in_flight > i32::MAX as usize {
            return bad("max_in_flight above i32::MAX");
        }
        Ok(())
    }
}

/// Counters of a [`ShareReader`] (see [`ShareReader::stats`]).
///
/// ```
/// let s = kafkapipe::share::ShareStats::default();
/// assert_eq!(s.accepted, 0);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ShareStats {
    /// ShareFetch requests answered.
    pub fetches: u64,
    /// Records acquired (yielded or buffered).
    pub acquired: u64,
    /// Records acknowledged ACCEPT (sent).
    pub accepted: u64,
    /// Records acknowledged RELEASE (sent).
    pub released: u64,
    /// Records acknowledged REJECT (sent).
    pub rejected: u64,
    /// Acquired offsets without a record to yield (control records), acknowledged GAP.
    pub gaps: u64,
    /// Acknowledgements the broker refused (for instance after the lock expired).
    pub ack_errors: u64,
    /// Lock renewals the broker confirmed (records, counted per renewal).
    pub renewed: u64,
    /// Lock renewals the broker refused (the lock had expired, or renewal is off for
    /// the group).
    pub renew_errors: u64,
    /// Acquired records not settled yet.
    pub in_flight: usize,
    /// The broker's acquisition lock duration (ms), as the last ShareFetch said.
    pub lock_timeout_ms: i32,
    /// The member epoch (0 before joining).
    pub member_epoch: i32,
    /// The number of partitions assigned to this member.
    pub assigned_partitions: usize,
}

#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) fetches: AtomicU64,
    pub(crate) acquired: AtomicU64,
    pub(crate) accepted: AtomicU64,
    pub(crate) released: AtomicU64,
    pub(crate) rejected: AtomicU64,
    pub(crate) gaps: AtomicU64,
    pub(crate) ack_errors: AtomicU64,
    pub(crate) renewed: AtomicU64,
    pub(crate) renew_errors: AtomicU64,
    pub(crate) lock_timeout_ms: AtomicI32,
    pub(crate) member_epoch: AtomicI32,
    pub(crate) assigned: AtomicUsize,
}

impl Counters {
    pub(crate) fn sent(&self, kind: i8, n: u64) {
        match kind {
            ACCEPT => &self.accepted,
            RELEASE => &self.released,
            REJECT => &self.rejected,
            _ => &self.gaps,
        }
        .fetch_add(n, Ordering::Relaxed);
    }
}

#[derive(Debug)]
struct Held {
    tp: Tp,
    offset: i64,
    /// When the reader asked for it (its first lock started after this).
    acquired: Instant,
    /// When its current lock started, at the latest (the request that acquired or
    /// renewed it was sent).
    locked: Instant,
    /// A renewal is in flight.
    renewing: bool,
    /// The broker refused a renewal: the lock is gone, no more renewals.
    lost: bool,
}

/// What the broker said of a lock renewal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Renewal {
    /// Locked again from the instant the request was sent.
    Locked(Instant),
    /// The request failed as a whole: try again when due.
    Retry,
    /// Refused for the partition: the lock is gone.
    Lost,
}

/// Lock renewal policy: renew a held record's lock once half of it has passed, for as
/// long as the record has been held less than `max_hold`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RenewPolicy {
    pub(crate) lock: Duration,
    pub(crate) max_hold: Duration,
}

impl RenewPolicy {
    /// When `h`'s lock falls due for renewal, if it ever will again.
    fn due(&self, h: &Held) -> Option<Instant> {
        if h.renewing || h.lost || self.lock.is_zero() {
            return None;
        }
        let at = h.locked + self.lock / 2;
        (at < h.acquired + self.max_hold).then_some(at)
    }
}

#[derive(Debug, Default)]
struct LedgerState {
    next_id: u64,
    held: HashMap<u64, Held>,
    /// Tokens dropped: (id, the reader's poll count then).
    dropped: Vec<(u64, u64)>,
    /// Acknowledgements to send, per partition: offset → type.
    acks: BTreeMap<Tp, BTreeMap<i64, i8>>,
    /// The reader is going: `Some(true)` closed (drops count as processed),
    /// `Some(false)` dropped (drops release).
    closing: Option<bool>,
}

/// The acquired records of one reader and how their tokens ended.
#[derive(Debug)]
pub(crate) struct Ledger {
    state: Mutex<LedgerState>,
    polls: AtomicU64,
    explicit: bool,
    /// Acknowledgements to send, or room for more records.
    pub(crate) changed: Notify,
}

impl Ledger {
    fn new(mode: AckMode) -> Self {
        Ledger {
            state: Mutex::default(),
            polls: AtomicU64::new(0),
            explicit: mode == AckMode::Explicit,
            changed: Notify::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, LedgerState> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A record acquired by a request sent at `locked`: its id for the token.
    pub(crate) fn acquire(&self, tp: Tp, offset: i64, locked: Instant) -> u64 {
        let mut s = self.lock();
        s.next_id += 1;
        let id = s.next_id;
        s.held.insert(
            id,
            Held {
                tp,
                offset,
                acquired: locked,
                locked,
                renewing: false,
                lost: false,
            },
        );
        id
    }

    /// The held records whose locks are due for renewal at `now`, by partition (sorted
    /// offsets), and when the next one not yet due falls due.
    pub(crate) fn due_renewals(
        &self,
        now: Instant,
        policy: RenewPolicy,
    ) -> (BTreeMap<Tp, Vec<i64>>, Option<Instant>) {
        let s = self.lock();
        let mut due: BTreeMap<Tp, Vec<i64>> = BTreeMap::new();
        let mut next: Option<Instant> = None;
        for h in s.held.values() {
            match policy.due(h) {
                Some(at) if at <= now => due.entry(h.tp).or_default().push(h.offset),
                Some(at) => next = Some(next.map_or(at, |n| n.min(at))),
                None => {}
            }
        }
        for v in due.values_mut() {
            v.sort_unstable();
        }
        (due, next)
    }

    /// Renewals of the records of `renew` are being sent.
    pub(crate) fn renewing(&self, renew: &BTreeMap<Tp, Vec<i64>>) {
        self.mark(renew, |h| h.renewing = true);
    }

    /// The broker answered renewals of partition `tp`'s records `offsets`.
    pub(crate) fn renewed(&self, tp: Tp, offsets: &[i64], how: Renewal) {
        let one = BTreeMap::from([(tp, offsets.to_vec())]);
        self.mark(&one, |h| {
            h.renewing = false;
            match how {
                Renewal::Locked(at) => h.locked = at,
                Renewal::Retry => {}
                Renewal::Lost => h.lost = true,
            }
        });
    }

    fn mark(&self, records: &BTreeMap<Tp, Vec<i64>>, f: impl Fn(&mut Held)) {
        let mut s = self.lock();
        for h in s.held.values_mut() {
            if records
                .get(&h.tp)
                .is_some_and(|v| v.binary_search(&h.offset).is_ok())
            {
                f(h);
            }
        }
    }

    /// Acquired offsets with nothing to yield: acknowledged GAP.
    pub(crate) fn gap(&self, tp: Tp, offset: i64) {
        self.lock().acks.entry(tp).or_default().insert(offset, GAP);
    }

    /// Settle record `id` as `kind` now (records the reader gives up itself).
    pub(crate) fn settle_now(&self, id: u64, kind: i8) {
        Self::finish(&mut self.lock(), id, kind);
    }

    /// Acquired records not settled yet.
    pub(crate) fn outstanding(&self) -> usize {
        self.lock().held.len()
    }

    fn finish(s: &mut LedgerState, id: u64, kind: i8) -> bool {
        match s.held.remove(&id) {
            Some(h) => {
                s.acks.entry(h.tp).or_default().insert(h.offset, kind);
                true
            }
            None => false,
        }
    }

    /// The consumer polls the reader: tokens dropped before now count as processed.
    fn polled(&self) {
        let now = self.polls.fetch_add(1, Ordering::SeqCst) + 1;
        let mut s = self.lock();
        if s.dropped.is_empty() {
            return;
        }
        let dropped = std::mem::take(&mut s.dropped);
        let mut any = false;
        for (id, at) in dropped {
            if at < now {
                any |= Self::finish(&mut s, id, ACCEPT);
            } else {
                s.dropped.push((id, at));
            }
        }
        drop(s);
        if any {
            self.changed.notify_one();
        }
    }

    /// The reader is going: `confirm` (an orderly close) counts the drops so far (and
    /// those to come) as processed; otherwise they release.
    pub(crate) fn begin_close(&self, confirm: bool) {
        let mut s = self.lock();
        if s.closing.is_some() {
            return;
        }
        s.closing = Some(confirm);
        let kind = if confirm && !self.explicit {
            ACCEPT
        } else {
            RELEASE
        };
        for (id, _) in std::mem::take(&mut s.dropped) {
            Self::finish(&mut s, id, kind);
        }
        drop(s);
        self.changed.notify_one();
    }

    /// Release every record still held (the close gave up waiting, or the records were
    /// never yielded).
    pub(crate) fn release_all(&self) {
        let mut s = self.lock();
        let ids: Vec<u64> = s.held.keys().copied().collect();
        for id in ids {
            Self::finish(&mut s, id, RELEASE);
        }
    }

    /// Take the acknowledgements waiting for the partitions `want` picks, sorted by
    /// offset.
    pub(crate) fn take_acks(&self, want: impl Fn(&Tp) -> bool) -> BTreeMap<Tp, Vec<(i64, i8)>> {
        let mut s = self.lock();
        let keys: Vec<Tp> = s.acks.keys().filter(|k| want(k)).copied().collect();
        keys.into_iter()
            .filter_map(|k| {
                s.acks
                    .remove(&k)
                    .map(|m| (k, m.into_iter().collect::<Vec<_>>()))
            })
            .collect()
    }

    /// Acknowledgements a failed request did not deliver: to be sent again.
    pub(crate) fn requeue(&self, acks: BTreeMap<Tp, Vec<(i64, i8)>>) {
        let mut s = self.lock();
        for (tp, v) in acks {
            let m = s.acks.entry(tp).or_default();
            for (o, k) in v {
                m.entry(o).or_insert(k);
            }
        }
    }

    /// Partitions with acknowledgements waiting.
    pub(crate) fn ack_partitions(&self) -> Vec<Tp> {
        self.lock().acks.keys().copied().collect()
    }
}

impl ShareLedger for Ledger {
    fn settle(&self, id: u64, how: ShareOutcome) {
        let mut s = self.lock();
        let kind = match how {
            ShareOutcome::Accept => ACCEPT,
            ShareOutcome::Release => RELEASE,
            ShareOutcome::Reject => REJECT,
            ShareOutcome::Dropped => match s.closing {
                _ if self.explicit => RELEASE,
                Some(true) => ACCEPT,
                Some(false) => RELEASE,
                None => {
                    if s.held.contains_key(&id) {
                        let at = self.polls.load(Ordering::SeqCst);
                        s.dropped.push((id, at));
                    }
                    return;
                }
            },
        };
        let done = Self::finish(&mut s, id, kind);
        drop(s);
        if done {
            self.changed.notify_one();
        }
    }
}

/// Group acknowledgements `(offset, type)` sorted by offset into batches of consecutive
/// offsets of one type: `(first, last, type)`.
pub(crate) fn ack_batches(acks: &[(i64, i8)]) -> Vec<(i64, i64, i8)> {
    let mut out: Vec<(i64, i64, i8)> = Vec::new();
    for &(o, k) in acks {
        match out.last_mut() {
            Some((_, last, kind)) if *kind == k && last.checked_add(1) == Some(o) => *last = o,
            _ => out.push((o, o, k)),
        }
    }
    out
}

/// A share-group consumer: a `Stream` of the records the group hands this member (see
/// the [module docs](self) for acknowledgements, backpressure and locks).
///
/// Messages carry [`Message::delivery_count`]; their `high_watermark` is -1 (ShareFetch
/// does not carry it). The reader joins the group when created and leaves it on
/// [`close`](ShareReader::close) or drop.
///
/// ```no_run
/// use futures::StreamExt;
/// use kafkapipe::share::{ShareReader, ShareReaderConfig};
///
/// # async fn demo() -> kafkapipe::Result<()> {
/// let mut reader =
///     ShareReader::new(ShareReaderConfig::new(["127.0.0.1:9092"], "workers").topic("jobs"))
///         .await?;
/// while let Some(m) = reader.next().await {
///     let mut m = m?;
///     if m.delivery_count() >= Some(3) {
///         m.take_ack_token().reject(); // poison: archive it
///         continue;
///     }
///     println!("{:?}", m.value);
///     // dropping the message accepts it once the reader is polled again
/// }
/// reader.close().await?;
/// # Ok(()) }
/// ```
///
/// # Cancellation safety
///
/// `poll_next` is cancel safe: a message is removed from the reader only when returned.
#[derive(Debug)]
pub struct ShareReader {
    rx: mpsc::UnboundedReceiver<Result<Message>>,
    ledger: Arc<Ledger>,
    counters: Arc<Counters>,
    close_tx: watch::Sender<bool>,
    task: Option<tokio::task::JoinHandle<Result<()>>>,
    close_timeout: Duration,
}

impl ShareReader {
    /// Join share group `config.group_id` and start fetching.
    ///
    /// ```no_run
    /// # async fn demo() -> kafkapipe::Result<()> {
    /// use kafkapipe::share::{ShareReader, ShareReaderConfig};
    /// let reader = ShareReader::new(ShareReaderConfig::new(["127.0.0.1:9092"], "g").topic("t")).await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// A `Config` error for a config without brokers, group or topics. Broker errors
    /// (share groups not enabled, authorization) come through the stream.
    ///
    /// # Cancellation safety
    ///
    /// Cancel safe: the task is spawned last.
    pub async fn new(config: ShareReaderConfig) -> Result<ShareReader> {
        config.validate()?;
        let ledger = Arc::new(Ledger::new(config.ack_mode));
        let counters = Arc::new(Counters::default());
        let (tx, rx) = mpsc::unbounded_channel();
        let (close_tx, close_rx) = watch::channel(false);
        let close_timeout = config.close_timeout;
        let task = task::ShareTask::new(config, ledger.clone(), counters.clone(), tx, close_rx)?;
        let task = tokio::spawn(task.run());
        Ok(ShareReader {
            rx,
            ledger,
            counters,
            close_tx,
            task: Some(task),
            close_timeout,
        })
    }

    /// The reader's counters.
    ///
    /// ```no_run
    /// # fn demo(r: &kafkapipe::share::ShareReader) {
    /// println!("{} accepted", r.stats().accepted);
    /// # }
    /// ```
    pub fn stats(&self) -> ShareStats {
        let c = &self.counters;
        ShareStats {
            fetches: c.fetches.load(Ordering::Relaxed),
            acquired: c.acquired.load(Ordering::Relaxed),
            accepted: c.accepted.load(Ordering::Relaxed),
            released: c.released.load(Ordering::Relaxed),
            rejected: c.rejected.load(Ordering::Relaxed),
            gaps: c.gaps.load(Ordering::Relaxed),
            ack_errors: c.ack_errors.load(Ordering::Relaxed),
            renewed: c.renewed.load(Ordering::Relaxed),
            renew_errors: c.renew_errors.load(Ordering::Relaxed),
            in_flight: self.ledger.outstanding(),
            lock_timeout_ms: c.lock_timeout_ms.load(Ordering::Relaxed),
            member_epoch: c.member_epoch.load(Ordering::Relaxed),
            assigned_partitions: c.assigned.load(Ordering::Relaxed),
        }
    }

    /// Close the reader: the tokens dropped so far count as processed, records buffered
    /// and not yet yielded are released, the reader waits up to
    /// [`close_timeout`](ShareReaderConfig::close_timeout) for the records it yielded to
    /// be settled (and releases those still held then), sends the last
    /// acknowledgements, closes its share sessions and leaves the group.
    ///
    /// ```no_run
    /// # async fn demo(reader: kafkapipe::share::ShareReader) -> kafkapipe::Result<()> {
    /// reader.close().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// The error that ended the reader's task, if one did.
    ///
    /// # Cancellation safety
    ///
    /// Not cancel safe: a dropped call leaves the task to finish the close on its own.
    pub async fn close(mut self) -> Result<()> {
        self.ledger.polled();
        self.rx.close();
        while let Ok(m) = self.rx.try_recv() {
            if let Ok(mut m) = m {
                m.take_ack_token().release();
            }
        }
        self.ledger.begin_close(true);
        let _ = self.close_tx.send(true);
        let Some(task) = self.task.take() else {
            return Ok(());
        };
        // the task waits close_timeout for held records, then needs a few round trips
        let limit = self.close_timeout + Duration::from_secs(30);
        match tokio::time::timeout(limit, task).await {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => Err(Error::new(
                ErrorKind::Closed,
                format!("share reader task failed: {e}"),
            )),
            Err(_) => Err(Error::new(
                ErrorKind::Timeout,
                "share reader close timed out",
            )),
        }
    }
}

impl Drop for ShareReader {
    fn drop(&mut self) {
        if self.task.is_some() {
            // Dropped without close: nothing polls again, so dropped tokens release; the
            // task sends what it can, closes its sessions and leaves in the background.
            self.ledger.begin_close(false);
            let _ = self.close_tx.send(true);
        }
    }
}

impl Stream for ShareReader {
    type Item = Result<Message>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        this.ledger.polled();
        this.rx.poll_recv(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::group::AckToken;

    fn token(l: &Arc<Ledger>, offset: i64) -> AckToken {
        let id = l.acquire(([1; 16], 0), offset, Instant::now());
        AckToken::share_record(l.clone(), id)
    }

    fn acks(l: &Ledger) -> Vec<(i64, i8)> {
        l.take_acks(|_| true).into_values().flatten().collect()
    }

    #[test]
    fn explicit_outcomes_are_acknowledged_at_once() {
        let l = Arc::new(Ledger::new(AckMode::Implicit));
        token(&l, 0).ack();
        token(&l, 1).release();
        token(&l, 2).reject();
        token(&l, 3).fail();
        assert_eq!(
            acks(&l),
            [(0, ACCEPT), (1, RELEASE), (2, REJECT), (3, RELEASE)]
        );
        assert_eq!(l.outstanding(), 0);
    }

    #[test]
    fn a_drop_accepts_only_after_the_next_poll() {
        let l = Arc::new(Ledger::new(AckMode::Implicit));
        drop(token(&l, 5));
        assert!(acks(&l).is_empty(), "not before the reader is polled again");
        assert_eq!(l.outstanding(), 1);
        l.polled();
        assert_eq!(acks(&l), [(5, ACCEPT)]);
    }

    #[test]
    fn a_drop_without_a_later_poll_releases_when_the_reader_is_dropped() {
        let l = Arc::new(Ledger::new(AckMode::Implicit));
        drop(token(&l, 5));
        l.begin_close(false);
        assert_eq!(acks(&l), [(5, RELEASE)]);
        // later drops release too
        drop(token(&l, 6));
        assert_eq!(acks(&l), [(6, RELEASE)]);
    }

    #[test]
    fn an_orderly_close_counts_drops_as_processed() {
        let l = Arc::new(Ledger::new(AckMode::Implicit));
        drop(token(&l, 5));
        let held = token(&l, 6);
        l.begin_close(true);
        drop(held);
        assert_eq!(acks(&l), [(5, ACCEPT), (6, ACCEPT)]);
    }

    #[test]
    fn explicit_mode_releases_dropped_tokens() {
        let l = Arc::new(Ledger::new(AckMode::Explicit));
        drop(token(&l, 5));
        l.polled();
        token(&l, 6).ack();
        assert_eq!(acks(&l), [(5, RELEASE), (6, ACCEPT)]);
    }

    #[test]
    fn a_panicking_holder_releases() {
        let l = Arc::new(Ledger::new(AckMode::Implicit));
        let t = token(&l, 9);
        let r = std::thread::spawn(move || {
            let _t = t;
            panic!("stage failed");
        })
        .join();
        assert!(r.is_err());
        l.polled();
        assert_eq!(acks(&l), [(9, RELEASE)]);
    }

    #[test]
    fn shared_and_merged_tokens_settle_once_all_parts_do() {
        let l = Arc::new(Ledger::new(AckMode::Implicit));
        let shared = token(&l, 1).share();
        let (a, b) = (shared.clone(), shared);
        a.ack();
        assert!(acks(&l).is_empty());
        b.ack();
        assert_eq!(acks(&l), [(1, ACCEPT)]);
        let shared = token(&l, 2).share();
        let (a, b) = (shared.clone(), shared);
        a.ack();
        AckToken::from(b).reject();
        assert_eq!(acks(&l), [(2, REJECT)]);
        let merged: AckToken = vec![token(&l, 3), token(&l, 4)].into_iter().collect();
        merged.release();
        assert_eq!(acks(&l), [(3, RELEASE), (4, RELEASE)]);
    }

    #[test]
    fn settling_twice_counts_once() {
        let l = Arc::new(Ledger::new(AckMode::Implicit));
        let t = token(&l, 1);
        t.ack_ref();
        drop(t);
        l.polled();
        assert_eq!(acks(&l), [(1, ACCEPT)]);
    }

    #[test]
    fn renewals_fall_due_at_half_the_lock_until_the_hold_bound() {
        let l = Arc::new(Ledger::new(AckMode::Implicit));
        let tp = ([1; 16], 0);
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let p = RenewPolicy {
            lock: s(10),
            max_hold: s(12),
        };
        let id = l.acquire(tp, 7, t0);
        let held = AckToken::share_record(l.clone(), id);
        let (due, next) = l.due_renewals(t0 + s(1), p);
        assert!(due.is_empty());
        assert_eq!(next, Some(t0 + s(5)), "half the lock");
        let (due, _) = l.due_renewals(t0 + s(5), p);
        assert_eq!(due, BTreeMap::from([(tp, vec![7])]));
        l.renewing(&due);
        assert_eq!(
            l.due_renewals(t0 + s(6), p),
            (BTreeMap::new(), None),
            "in flight"
        );
        // a failed request: due again
        l.renewed(tp, &[7], Renewal::Retry);
        assert_eq!(l.due_renewals(t0 + s(6), p).0.len(), 1);
        l.renewed(tp, &[7], Renewal::Locked(t0 + s(6)));
        let (due, next) = l.due_renewals(t0 + s(7), p);
        assert!(due.is_empty());
        assert_eq!(next, Some(t0 + s(11)));
        l.renewed(tp, &[7], Renewal::Locked(t0 + s(11)));
        // the next would be at 16 s, past the 12 s bound: the lock runs out
        assert_eq!(l.due_renewals(t0 + s(20), p), (BTreeMap::new(), None));
        held.ack();
        assert_eq!(acks(&l), [(7, ACCEPT)]);
        // refused: never again; settled: never
        let id = l.acquire(tp, 8, t0);
        let _held = AckToken::share_record(l.clone(), id);
        l.renewed(tp, &[8], Renewal::Lost);
        assert_eq!(l.due_renewals(t0 + s(5), p), (BTreeMap::new(), None));
        let id = l.acquire(tp, 9, t0);
        AckToken::share_record(l.clone(), id).release();
        assert_eq!(l.due_renewals(t0 + s(5), p), (BTreeMap::new(), None));
        // off when the lock is unknown
        let id = l.acquire(tp, 10, t0);
        let _held = AckToken::share_record(l.clone(), id);
        let off = RenewPolicy {
            lock: Duration::ZERO,
            max_hold: s(12),
        };
        assert_eq!(l.due_renewals(t0 + s(5), off), (BTreeMap::new(), None));
    }

    #[test]
    fn batches_group_runs_of_one_type() {
        assert_eq!(
            ack_batches(&[
                (1, ACCEPT),
                (2, ACCEPT),
                (3, RELEASE),
                (5, RELEASE),
                (6, GAP)
            ]),
            [
                (1, 2, ACCEPT),
                (3, 3, RELEASE),
                (5, 5, RELEASE),
                (6, 6, GAP)
            ]
        );
        assert!(ack_batches(&[]).is_empty());
    }
}
