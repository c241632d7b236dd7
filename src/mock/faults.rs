//! [`MockCluster`]'s fault injection and request capture: the [`Fault`]s, faults per API, broker,
//! partition or group (`fault*`, `omit_from_produce_response`, `set_max_message_bytes`,
//! `clear_faults`), the coordinator a group is placed on, and the requests captured for
//! a test to inspect (`capture`, `captured*`).

use super::*;

/// A fault injected into the requests of one API (see [`MockCluster::fault`]).
///
/// ```
/// use std::time::Duration;
/// use kafkapipe::conn::{Conn, ConnectionConfig};
/// use kafkapipe::mock::{Fault, MockCluster};
/// use kafkapipe::protocol::ApiKey;
/// use kafkapipe::ErrorKind;
///
/// # fn main() -> kafkapipe::Result<()> {
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| kafkapipe::Error::io("runtime", e))?.block_on(async {
/// let cluster = MockCluster::builder().topic("t", 1).start().await?;
/// let config = ConnectionConfig::new().request_timeout(Duration::from_millis(100));
/// let conn = Conn::connect_with(&cluster.bootstrap()[0], config).await?;
/// // The next ListOffsets is never answered: the client's request timeout fires.
/// cluster.fault(ApiKey::LIST_OFFSETS, Fault::Hang, 1);
/// let err = conn.last_offset("t", 0).await.unwrap_err();
/// assert_eq!(err.kind(), ErrorKind::Timeout);
/// # Ok(()) })
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Fault {
    /// Answer with this error code and change nothing: a produce is not appended, a join
    /// does not join. The code goes where the API reports errors — every partition of a
    /// Produce or ListOffsets, every topic of Metadata, the top-level code of Fetch (with
    /// no partitions, as a fetch session error), of the group APIs and of
    /// FindCoordinator. For one partition's error in a Fetch, see
    /// [`MockCluster::fault_partition`].
    Error(ErrorCode),
    /// Like [`Error`](Self::Error), with this error message where the response has a
    /// field for it (Produce partitions, CreateTopics, CreatePartitions,
    /// FindCoordinator).
    ErrorWithMessage(ErrorCode, String),
    /// Handle the request normally, but only after this long.
    Delay(Duration),
    /// Handle the request normally once the [`Gate`] lets it through (one request per
    /// [`Gate::release`]); the broker's connection reads nothing more meanwhile.
    Hold(Gate),
    /// Never answer; the connection stays open and reads nothing more.
    Hang,
    /// Close the connection on receiving the request, without handling it.
    CloseOnRequest,
    /// Handle the request, write the first half of the response frame, then close the
    /// connection.
    CloseMidResponse,
    /// Handle the request and answer with a frame whose correlation id matches no request.
    Corrupt,
    /// Handle the request and answer with a well-framed response to the right
    /// correlation id whose every following byte is `0xff`.
    GarbageBody,
    /// Handle the request and answer with its response cut short by this many bytes
    /// (the size prefix says the shorter length).
    Truncate(usize),
    /// Handle the request and write these bytes instead of the response frame (a size
    /// prefix, if wanted, is part of them).
    Raw(Bytes),
}

#[derive(Debug, Clone)]
pub(super) struct FaultRule {
    pub(super) api: ApiKey,
    pub(super) broker: Option<i32>,
    pub(super) fault: Fault,
    /// How many more requests it applies to; `u32::MAX` never runs out.
    pub(super) remaining: u32,
}

#[derive(Debug, Clone)]
pub(super) struct PartitionFault {
    pub(super) api: ApiKey,
    pub(super) topic: String,
    pub(super) partition: i32,
    /// The error to answer, or `None`: handle the partition and leave it out of the
    /// response.
    pub(super) code: Option<ErrorCode>,
    pub(super) remaining: u32,
}

impl MockCluster {
    /// Apply `fault` to the next `times` requests of `api` on any broker (`u32::MAX`:
    /// every request until [`clear_faults`](Self::clear_faults)). Faults are matched in
    /// the order they were added.
    pub fn fault(&self, api: ApiKey, fault: Fault, times: u32) {
        self.add_fault(None, api, fault, times);
    }

    /// Like [`fault`](Self::fault), for requests to broker `id` only.
    ///
    /// ```
    /// use kafkapipe::conn::Conn;
    /// use kafkapipe::mock::{Fault, MockCluster};
    /// use kafkapipe::protocol::{ApiKey, ErrorCode};
    ///
    /// # fn main() -> kafkapipe::Result<()> {
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| kafkapipe::Error::io("runtime", e))?.block_on(async {
    /// let cluster = MockCluster::builder().brokers(2).topic("t", 2).start().await?;
    /// // Only broker 2 (the leader of partition 1) refuses.
    /// cluster.fault_on(2, ApiKey::LIST_OFFSETS, Fault::Error(ErrorCode::LeaderNotAvailable), 1);
    /// let one = Conn::connect(&cluster.bootstrap()[0]).await?;
    /// let two = Conn::connect(&cluster.bootstrap()[1]).await?;
    /// assert_eq!(one.last_offset("t", 0).await?, 0);
    /// assert!(two.last_offset("t", 1).await.is_err());
    /// assert_eq!(two.last_offset("t", 1).await?, 0);
    /// # Ok(()) })
    /// # }
    /// ```
    pub fn fault_on(&self, id: i32, api: ApiKey, fault: Fault, times: u32) {
        self.add_fault(Some(id), api, fault, times);
    }

    pub(super) fn add_fault(&self, broker: Option<i32>, api: ApiKey, fault: Fault, times: u32) {
        if times == 0 {
            return;
        }
        self.shared.lock().faults.push(FaultRule {
            api,
            broker,
            fault,
            remaining: times,
        });
    }

    /// Answer `code` for one partition in the next `times` requests of `api` that carry
    /// it (`u32::MAX`: until [`clear_faults`](Self::clear_faults)); the request's other
    /// partitions are served normally. For Produce, Fetch, ListOffsets and OffsetFetch.
    ///
    /// ```
    /// use kafkapipe::conn::{Conn, ProduceOptions};
    /// use kafkapipe::mock::MockCluster;
    /// use kafkapipe::protocol::{ApiKey, ErrorCode};
    /// use kafkapipe::record::Record;
    ///
    /// # fn main() -> kafkapipe::Result<()> {
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| kafkapipe::Error::io("runtime", e))?.block_on(async {
    /// let cluster = MockCluster::builder().topic("t", 2).start().await?;
    /// cluster.fault_partition(ApiKey::PRODUCE, "t", 1, ErrorCode::KafkaStorageError, 1);
    /// let conn = Conn::connect(&cluster.bootstrap()[0]).await?;
    /// let records = [Record::new("k", "v")];
    /// let opts = ProduceOptions::default();
    /// assert_eq!(conn.produce("t", 0, &records, &opts).await?, 0);
    /// let err = conn.produce("t", 1, &records, &opts).await.unwrap_err();
    /// assert_eq!(err.kafka_code(), Some(ErrorCode::KafkaStorageError));
    /// assert_eq!(conn.produce("t", 1, &records, &opts).await?, 0);
    /// # Ok(()) })
    /// # }
    /// ```
    pub fn fault_partition(
        &self,
        api: ApiKey,
        topic: &str,
        partition: i32,
        code: ErrorCode,
        times: u32,
    ) {
        if times == 0 {
            return;
        }
        self.shared.lock().partition_faults.push(PartitionFault {
            api,
            topic: topic.to_string(),
            partition,
            code: Some(code),
            remaining: times,
        });
    }

    /// Make broker `id` the coordinator of `group` (`None`: back to the default, a live
    /// broker chosen by a hash of the id). While a pinned coordinator is down the group
    /// has none (`COORDINATOR_NOT_AVAILABLE`). The group's state (members, generation,
    /// offsets) moves with it; the old coordinator answers `NOT_COORDINATOR`.
    ///
    /// ```
    /// use kafkapipe::admin::Admin;
    /// use kafkapipe::mock::MockCluster;
    ///
    /// # fn main() -> kafkapipe::Result<()> {
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| kafkapipe::Error::io("runtime", e))?.block_on(async {
    /// let cluster = MockCluster::builder().brokers(3).start().await?;
    /// cluster.set_coordinator("g", Some(3));
    /// let admin = Admin::connect(cluster.bootstrap())?;
    /// assert_eq!(admin.find_coordinator("g").await?, 3);
    /// # Ok(()) })
    /// # }
    /// ```
    pub fn set_coordinator(&self, group: &str, id: Option<i32>) {
        {
            let mut st = self.shared.lock();
            match id {
                Some(id) => st.pinned_coordinators.insert(group.to_string(), id),
                None => st.pinned_coordinators.remove(group),
            };
        }
        self.shared.changed();
    }

    /// The coordinator of `group` now, if a broker is up to be it.
    ///
    /// ```
    /// use kafkapipe::mock::MockCluster;
    ///
    /// # fn main() -> kafkapipe::Result<()> {
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| kafkapipe::Error::io("runtime", e))?.block_on(async {
    /// let cluster = MockCluster::builder().brokers(2).start().await?;
    /// cluster.set_coordinator("g", Some(2));
    /// assert_eq!(cluster.coordinator("g"), Some(2));
    /// cluster.kill(2);
    /// assert_eq!(cluster.coordinator("g"), None, "pinned to a broker that is down");
    /// # Ok(()) })
    /// # }
    /// ```
    pub fn coordinator(&self, group: &str) -> Option<i32> {
        self.shared.lock().coordinator(group).map(|b| b.id)
    }

    /// Answer `code` for `group` in the next `times` DescribeGroups or DeleteGroups
    /// requests (per `api`) that name it; the request's other groups are served normally.
    ///
    /// ```
    /// use kafkapipe::admin::Admin;
    /// use kafkapipe::mock::MockCluster;
    /// use kafkapipe::protocol::{ApiKey, ErrorCode};
    ///
    /// # fn main() -> kafkapipe::Result<()> {
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| kafkapipe::Error::io("runtime", e))?.block_on(async {
    /// let cluster = MockCluster::builder().start().await?;
    /// cluster.fault_group(ApiKey::DESCRIBE_GROUPS, "secret", ErrorCode::GroupAuthorizationFailed, 1);
    /// let admin = Admin::connect(cluster.bootstrap())?;
    /// let r = admin.describe_groups(&["open", "secret"]).await?;
    /// assert!(r[0].1.is_ok());
    /// assert_eq!(r[1].1.as_ref().err().and_then(|e| e.kafka_code()), Some(ErrorCode::GroupAuthorizationFailed));
    /// # Ok(()) })
    /// # }
    /// ```
    pub fn fault_group(&self, api: ApiKey, group: &str, code: ErrorCode, times: u32) {
        self.fault_partition(api, group, GROUP_PARTITION, code, times);
    }

    /// Append what the next `times` Produce requests carry for a partition, but leave
    /// the partition out of their responses (a broker bug the client must survive: it
    /// cannot know whether the batch was written).
    ///
    /// ```
    /// use kafkapipe::conn::{Conn, ProduceOptions};
    /// use kafkapipe::mock::MockCluster;
    /// use kafkapipe::record::Record;
    ///
    /// # fn main() -> kafkapipe::Result<()> {
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| kafkapipe::Error::io("runtime", e))?.block_on(async {
    /// let cluster = MockCluster::builder().topic("t", 1).start().await?;
    /// cluster.omit_from_produce_response("t", 0, 1);
    /// let conn = Conn::connect(&cluster.bootstrap()[0]).await?;
    /// // Written, but the answer does not say so.
    /// assert!(conn.produce("t", 0, &[Record::new("k", "v")], &ProduceOptions::default()).await.is_err());
    /// assert_eq!(cluster.high_watermark("t", 0), Some(1));
    /// # Ok(()) })
    /// # }
    /// ```
    pub fn omit_from_produce_response(&self, topic: &str, partition: i32, times: u32) {
        if times == 0 {
            return;
        }
        self.shared.lock().partition_faults.push(PartitionFault {
            api: ApiKey::PRODUCE,
            topic: topic.to_string(),
            partition,
            code: None,
            remaining: times,
        });
    }

    /// Refuse produced batches larger than `bytes` with `MESSAGE_TOO_LARGE`, as Kafka's
    /// `max.message.bytes` does (`None`: no limit, the default).
    ///
    /// ```
    /// use kafkapipe::conn::{Conn, ProduceOptions};
    /// use kafkapipe::mock::MockCluster;
    /// use kafkapipe::protocol::ErrorCode;
    /// use kafkapipe::record::Record;
    ///
    /// # fn main() -> kafkapipe::Result<()> {
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| kafkapipe::Error::io("runtime", e))?.block_on(async {
    /// let cluster = MockCluster::builder().topic("t", 1).start().await?;
    /// cluster.set_max_message_bytes(Some(100));
    /// let conn = Conn::connect(&cluster.bootstrap()[0]).await?;
    /// let big = Record::new("k", vec![0u8; 200]);
    /// let err = conn.produce("t", 0, &[big], &ProduceOptions::default()).await.unwrap_err();
    /// assert_eq!(err.kafka_code(), Some(ErrorCode::MessageTooLarge));
    /// # Ok(()) })
    /// # }
    /// ```
    pub fn set_max_message_bytes(&self, bytes: Option<usize>) {
        self.shared.lock().max_message_bytes = bytes;
    }

    /// Remove every injected fault not used up yet (requests already hanging stay so).
    ///
    /// ```
    /// use kafkapipe::conn::Conn;
    /// use kafkapipe::mock::{Fault, MockCluster};
    /// use kafkapipe::protocol::{ApiKey, ErrorCode};
    ///
    /// # fn main() -> kafkapipe::Result<()> {
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| kafkapipe::Error::io("runtime", e))?.block_on(async {
    /// let cluster = MockCluster::builder().topic("t", 1).start().await?;
    /// cluster.fault(ApiKey::LIST_OFFSETS, Fault::Error(ErrorCode::LeaderNotAvailable), u32::MAX);
    /// let conn = Conn::connect(&cluster.bootstrap()[0]).await?;
    /// assert!(conn.last_offset("t", 0).await.is_err());
    /// cluster.clear_faults();
    /// assert_eq!(conn.last_offset("t", 0).await?, 0);
    /// # Ok(()) })
    /// # }
    /// ```
    pub fn clear_faults(&self) {
        let mut st = self.shared.lock();
        st.faults.clear();
        st.partition_faults.clear();
    }

    /// Keep the frames of every request of `api` received from now on, for
    /// [`captured`](Self::captured).
    ///
    /// ```
    /// use kafkapipe::conn::Conn;
    /// use kafkapipe::mock::MockCluster;
    /// use kafkapipe::protocol::messages::ListOffsetsRequest;
    /// use kafkapipe::protocol::ApiKey;
    ///
    /// # fn main() -> kafkapipe::Result<()> {
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| kafkapipe::Error::io("runtime", e))?.block_on(async {
    /// let cluster = MockCluster::builder().topic("t", 1).start().await?;
    /// cluster.capture(ApiKey::LIST_OFFSETS);
    /// let conn = Conn::connect(&cluster.bootstrap()[0]).await?;
    /// conn.first_offset("t", 0).await?;
    /// let asked = cluster.captured::<ListOffsetsRequest>();
    /// assert_eq!(asked[0].topics[0].partitions[0].timestamp, -2, "earliest");
    /// # Ok(()) })
    /// # }
    /// ```
    pub fn capture(&self, api: ApiKey) {
        self.shared.lock().captured.entry(api).or_default();
    }

    /// The requests of type `R` received since [`capture`](Self::capture) was called for
    /// its API, decoded, in arrival order (frames that do not decode are left out).
    ///
    /// ```
    /// use kafkapipe::conn::Conn;
    /// use kafkapipe::mock::MockCluster;
    /// use kafkapipe::protocol::messages::MetadataRequest;
    /// use kafkapipe::protocol::ApiKey;
    ///
    /// # fn main() -> kafkapipe::Result<()> {
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| kafkapipe::Error::io("runtime", e))?.block_on(async {
    /// let cluster = MockCluster::builder().topic("t", 1).start().await?;
    /// cluster.capture(ApiKey::METADATA);
    /// let conn = Conn::connect(&cluster.bootstrap()[0]).await?;
    /// conn.metadata(Some(&["t"])).await?;
    /// let asked = cluster.captured::<MetadataRequest>();
    /// let names: Vec<_> = asked[0].topics.iter().flatten().filter_map(|t| t.name.clone()).collect();
    /// assert_eq!(names, ["t"]);
    /// # Ok(()) })
    /// # }
    /// ```
    pub fn captured<R: Request>(&self) -> Vec<R> {
        self.captured_by_broker::<R>()
            .into_iter()
            .map(|(_, r)| r)
            .collect()
    }

    /// Like [`captured`](Self::captured), with the id of the broker each request went to.
    ///
    /// ```
    /// use kafkapipe::conn::Conn;
    /// use kafkapipe::mock::MockCluster;
    /// use kafkapipe::protocol::messages::MetadataRequest;
    /// use kafkapipe::protocol::ApiKey;
    ///
    /// # fn main() -> kafkapipe::Result<()> {
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| kafkapipe::Error::io("runtime", e))?.block_on(async {
    /// let cluster = MockCluster::builder().brokers(2).start().await?;
    /// cluster.capture(ApiKey::METADATA);
    /// let conn = Conn::connect(&cluster.bootstrap()[1]).await?;
    /// conn.metadata(None).await?;
    /// let brokers: Vec<i32> = cluster.captured_by_broker::<MetadataRequest>().iter().map(|(b, _)| *b).collect();
    /// assert_eq!(brokers, [2]);
    /// # Ok(()) })
    /// # }
    /// ```
    pub fn captured_by_broker<R: Request>(&self) -> Vec<(i32, R)> {
        self.captured_versions::<R>()
            .into_iter()
            .map(|(broker, _, r)| (broker, r))
            .collect()
    }

    /// Like [`captured`](Self::captured), with the broker each request went to and the
    /// version it was sent at.
    ///
    /// ```
    /// use kafkapipe::conn::Conn;
    /// use kafkapipe::mock::MockCluster;
    /// use kafkapipe::protocol::messages::MetadataRequest;
    /// use kafkapipe::protocol::ApiKey;
    ///
    /// # fn main() -> kafkapipe::Result<()> {
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| kafkapipe::Error::io("runtime", e))?.block_on(async {
    /// // Metadata up to v9 only: the client speaks v9.
    /// let cluster = MockCluster::builder().api_versions(ApiKey::METADATA, 4, 9).start().await?;
    /// cluster.capture(ApiKey::METADATA);
    /// let conn = Conn::connect(&cluster.bootstrap()[0]).await?;
    /// conn.metadata(None).await?;
    /// let versions: Vec<i16> = cluster.captured_versions::<MetadataRequest>().iter().map(|(_, v, _)| *v).collect();
    /// assert_eq!(versions, [9]);
    /// # Ok(()) })
    /// # }
    /// ```
    pub fn captured_versions<R: Request>(&self) -> Vec<(i32, i16, R)> {
        let frames = self
            .shared
            .lock()
            .captured
            .get(&R::API_KEY)
            .cloned()
            .unwrap_or_default();
        frames
            .into_iter()
            .filter_map(|(broker, version, frame)| {
                handlers::parse::<R>(frame, version)
                    .ok()
                    .map(|(_, r)| (broker, version, r))
            })
            .collect()
    }
}
