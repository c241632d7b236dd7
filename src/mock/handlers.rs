//! The mock broker's request handlers: decode with the crate's request types, answer
//! from the shared state, encode with the crate's response types.

use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use tokio::time::Instant;

use super::fetch_session;
use super::{group, Shared, State};
use crate::error::{Error, Result};
use crate::protocol::messages::*;
use crate::protocol::primitives::{put_empty_tagged_fields, put_string, put_uvarint};
use crate::protocol::{
    ApiKey, Encode, ErrorCode, Request, RequestHeader, ResponseHeader, TaggedFields,
};

/// The most partitions a topic may have (CreateTopics, CreatePartitions), so one request
/// cannot make the mock allocate without bound.
const MAX_PARTITIONS: i32 = 100_000;

/// The longest a fetch long-polls, whatever its MaxWait.
const MAX_FETCH_WAIT: Duration = Duration::from_secs(60);

/// Decode the header and body of a request at `version`.
pub(super) fn parse<R: Request>(mut frame: Bytes, version: i16) -> Result<(i32, R)> {
    let h = RequestHeader::decode(&mut frame, R::request_header_version(version))?;
    let r = R::decode(&mut frame, version)?;
    Ok((h.correlation_id, r))
}

/// Encode a response with its header.
pub(super) fn reply<R: Request>(
    correlation_id: i32,
    version: i16,
    resp: &R::Response,
) -> Result<Option<BytesMut>> {
    let mut out = BytesMut::new();
    ResponseHeader {
        correlation_id,
        tagged_fields: TaggedFields::new(),
    }
    .encode(&mut out, R::response_header_version(version))?;
    resp.encode(&mut out, version)?;
    Ok(Some(out))
}

fn code(c: Option<ErrorCode>) -> i16 {
    c.map_or(0, ErrorCode::code)
}

/// Handle one request frame. `Ok(None)`: nothing to answer (acks=0); `Err`: close the
/// connection (undecodable request, unknown API).
pub(super) async fn handle(
    id: i32,
    shared: &Shared,
    frame: Bytes,
    forced: Option<ErrorCode>,
    message: Option<String>,
) -> Result<Option<BytesMut>> {
    let (api, version, correlation_id) = RequestHeader::peek(&frame)?;
    match api {
        ApiKey::API_VERSIONS => {
            let (ranges, features) = {
                let st = shared.lock();
                (supported(&st), st.features.clone())
            };
            api_versions(frame, version, correlation_id, forced, ranges, &features)
        }
        ApiKey::METADATA => {
            let (c, r) = parse::<MetadataRequest>(frame, version)?;
            let resp = metadata(&shared.lock(), &r, forced);
            reply::<MetadataRequest>(c, version, &resp)
        }
        ApiKey::PRODUCE => {
            let (c, r) = parse::<ProduceRequest>(frame, version)?;
            let resp = produce(id, &mut shared.lock(), &r, version, forced, message);
            shared.changed();
            if r.acks == 0 {
                return Ok(None);
            }
            reply::<ProduceRequest>(c, version, &resp)
        }
        ApiKey::FETCH => {
            let (c, r) = parse::<FetchRequest>(frame, version)?;
            let resp = fetch(id, shared, &r, forced).await;
            reply::<FetchRequest>(c, version, &resp)
        }
        ApiKey::LIST_OFFSETS => {
            let (c, r) = parse::<ListOffsetsRequest>(frame, version)?;
            let resp = list_offsets(id, &mut shared.lock(), &r, forced);
            reply::<ListOffsetsRequest>(c, version, &resp)
        }
        ApiKey::OFFSET_FOR_LEADER_EPOCH => {
            let (c, r) = parse::<OffsetForLeaderEpochRequest>(frame, version)?;
            let resp = offset_for_leader_epoch(id, &mut shared.lock(), &r, forced);
            reply::<OffsetForLeaderEpochRequest>(c, version, &resp)
        }
        ApiKey::CREATE_TOPICS => {
            let (c, r) = parse::<CreateTopicsRequest>(frame, version)?;
            let mut resp = create_topics(&mut shared.lock(), &r, version, forced);
            for t in resp.topics.iter_mut().filter(|_| message.is_some()) {
                t.error_message.clone_from(&message);
            }
            shared.changed();
            reply::<CreateTopicsRequest>(c, version, &resp)
        }
        ApiKey::DELETE_TOPICS => {
            let (c, r) = parse::<DeleteTopicsRequest>(frame, version)?;
            let resp = delete_topics(&mut shared.lock(), &r, forced);
            shared.changed();
            reply::<DeleteTopicsRequest>(c, version, &resp)
        }
        ApiKey::CREATE_PARTITIONS => {
            let (c, r) = parse::<CreatePartitionsRequest>(frame, version)?;
            let mut resp = create_partitions(&mut shared.lock(), &r, forced);
            for t in resp.results.iter_mut().filter(|_| message.is_some()) {
                t.error_message.clone_from(&message);
            }
            shared.changed();
            reply::<CreatePartitionsRequest>(c, version, &resp)
        }
        ApiKey::INIT_PRODUCER_ID => {
            let (c, r) = parse::<InitProducerIdRequest>(frame, version)?;
            let resp = init_producer_id(&mut shared.lock(), &r, forced);
            reply::<InitProducerIdRequest>(c, version, &resp)
        }
        ApiKey::FIND_COORDINATOR => {
            let (c, r) = parse::<FindCoordinatorRequest>(frame, version)?;
            let mut resp = find_coordinator(&shared.lock(), &r, version, forced);
            if message.is_some() {
                resp.error_message.clone_from(&message);
                for c in &mut resp.coordinators {
                    c.error_message.clone_from(&message);
                }
            }
            reply::<FindCoordinatorRequest>(c, version, &resp)
        }
        ApiKey::ADD_PARTITIONS_TO_TXN => {
            let (c, r) = parse::<AddPartitionsToTxnRequest>(frame, version)?;
            let resp = super::txn::add_partitions(id, &mut shared.lock(), &r, version, forced);
            reply::<AddPartitionsToTxnRequest>(c, version, &resp)
        }
        ApiKey::ADD_OFFSETS_TO_TXN => {
            let (c, r) = parse::<AddOffsetsToTxnRequest>(frame, version)?;
            let resp = super::txn::add_offsets(id, &shared.lock(), &r, forced);
            reply::<AddOffsetsToTxnRequest>(c, version, &resp)
        }
        ApiKey::TXN_OFFSET_COMMIT => {
            let (c, r) = parse::<TxnOffsetCommitRequest>(frame, version)?;
            let resp = super::txn::offset_commit(&mut shared.lock(), &r, forced);
            reply::<TxnOffsetCommitRequest>(c, version, &resp)
        }
        ApiKey::END_TXN => {
            let (c, r) = parse::<EndTxnRequest>(frame, version)?;
            let resp = super::txn::end(id, &mut shared.lock(), &r, version, forced);
            shared.changed();
            reply::<EndTxnRequest>(c, version, &resp)
        }
        ApiKey::DESCRIBE_CONFIGS => {
            let (c, r) = parse::<DescribeConfigsRequest>(frame, version)?;
            let resp = super::admin_apis::describe_configs(&shared.lock(), &r, forced);
            reply::<DescribeConfigsRequest>(c, version, &resp)
        }
        ApiKey::ALTER_CONFIGS => {
            let (c, r) = parse::<AlterConfigsRequest>(frame, version)?;
            let resp = super::admin_apis::alter_configs(&mut shared.lock(), &r, forced);
            reply::<AlterConfigsRequest>(c, version, &resp)
        }
        ApiKey::DESCRIBE_GROUPS => {
            let (c, r) = parse::<DescribeGroupsRequest>(frame, version)?;
            let resp = super::admin_apis::describe_groups(id, &mut shared.lock(), &r, forced);
            reply::<DescribeGroupsRequest>(c, version, &resp)
        }
        ApiKey::DELETE_GROUPS => {
            let (c, r) = parse::<DeleteGroupsRequest>(frame, version)?;
            let resp = super::admin_apis::delete_groups(id, &mut shared.lock(), &r, forced);
            reply::<DeleteGroupsRequest>(c, version, &resp)
        }
        ApiKey::JOIN_GROUP
        | ApiKey::SYNC_GROUP
        | ApiKey::HEARTBEAT
        | ApiKey::LEAVE_GROUP
        | ApiKey::OFFSET_COMMIT
        | ApiKey::OFFSET_FETCH => group::handle(id, shared, api, version, frame, forced).await,
        ApiKey::CONSUMER_GROUP_HEARTBEAT => {
            let (c, r) = parse::<ConsumerGroupHeartbeatRequest>(frame, version)?;
            let resp =
                super::consumer_group::heartbeat(id, &mut shared.lock(), &r, version, forced);
            shared.changed();
            reply::<ConsumerGroupHeartbeatRequest>(c, version, &resp)
        }
        other => Err(Error::protocol(format!(
            "the mock broker does not serve {other}"
        ))),
    }
}

fn range<R: Request>(max: i16) -> ApiVersionRange {
    ApiVersionRange {
        api_key: R::API_KEY,
        min_version: R::MIN_VERSION,
        max_version: R::MAX_VERSION.min(max),
        tagged_fields: TaggedFields::new(),
    }
}

/// The APIs and versions the mock serves. Fetch and Produce stop before topic ids
/// (v13), OffsetFetch before the per-group layout (v8).
fn supported(st: &State) -> Vec<ApiVersionRange> {
    let mut ranges = vec![
        range::<ProduceRequest>(12),
        range::<FetchRequest>(12),
        range::<ListOffsetsRequest>(i16::MAX),
        range::<OffsetForLeaderEpochRequest>(i16::MAX),
        range::<MetadataRequest>(12),
        range::<OffsetCommitRequest>(9),
        range::<OffsetFetchRequest>(7),
        range::<FindCoordinatorRequest>(i16::MAX),
        range::<JoinGroupRequest>(i16::MAX),
        range::<HeartbeatRequest>(i16::MAX),
        range::<LeaveGroupRequest>(i16::MAX),
        range::<SyncGroupRequest>(i16::MAX),
        range::<ApiVersionsRequest>(i16::MAX),
        range::<CreateTopicsRequest>(i16::MAX),
        range::<DeleteTopicsRequest>(i16::MAX),
        range::<InitProducerIdRequest>(i16::MAX),
        range::<CreatePartitionsRequest>(i16::MAX),
        range::<DescribeConfigsRequest>(i16::MAX),
        range::<AlterConfigsRequest>(i16::MAX),
        range::<DescribeGroupsRequest>(i16::MAX),
        range::<DeleteGroupsRequest>(i16::MAX),
        range::<AddPartitionsToTxnRequest>(i16::MAX),
        range::<AddOffsetsToTxnRequest>(i16::MAX),
        range::<TxnOffsetCommitRequest>(i16::MAX),
        range::<EndTxnRequest>(i16::MAX),
        range::<ConsumerGroupHeartbeatRequest>(i16::MAX),
    ];
    ranges.retain(|r| !st.without.contains(&r.api_key));
    for r in &mut ranges {
        if let Some((min, max)) = st.versions.get(&r.api_key) {
            r.min_version = *min;
            r.max_version = *max;
        }
    }
    ranges
}

/// ApiVersions: a version this side does not know gets `UNSUPPORTED_VERSION` and the
/// list encoded at v0 (header v0 too), so the client can retry with a version it finds
/// there.
fn api_versions(
    frame: Bytes,
    version: i16,
    correlation_id: i32,
    forced: Option<ErrorCode>,
    ranges: Vec<ApiVersionRange>,
    features: &[(String, i16)],
) -> Result<Option<BytesMut>> {
    let max = ApiVersionsRequest::MAX_VERSION;
    if !(ApiVersionsRequest::MIN_VERSION..=max).contains(&version) {
        let resp = ApiVersionsResponse {
            error_code: ErrorCode::UnsupportedVersion.code(),
            api_keys: vec![range::<ApiVersionsRequest>(i16::MAX)],
            ..ApiVersionsResponse::default()
        };
        return reply::<ApiVersionsRequest>(correlation_id, 0, &resp);
    }
    let (c, _) = parse::<ApiVersionsRequest>(frame, version)?;
    let mut tagged_fields = TaggedFields::new();
    if !features.is_empty() {
        // FinalizedFeaturesEpoch (tag 1), then FinalizedFeatures (tag 2).
        tagged_fields
            .0
            .push((1, Bytes::copy_from_slice(&1i64.to_be_bytes())));
        let mut raw = BytesMut::new();
        put_uvarint(
            &mut raw,
            u32::try_from(features.len() + 1).unwrap_or(u32::MAX),
        );
        for (name, level) in features {
            put_string(&mut raw, name, true)?;
            raw.put_i16(*level);
            raw.put_i16(1);
            put_empty_tagged_fields(&mut raw);
        }
        tagged_fields.0.push((2, raw.freeze()));
    }
    let resp = ApiVersionsResponse {
        error_code: code(forced),
        api_keys: ranges,
        tagged_fields,
        ..ApiVersionsResponse::default()
    };
    reply::<ApiVersionsRequest>(c, version, &resp)
}

fn metadata(st: &State, req: &MetadataRequest, forced: Option<ErrorCode>) -> MetadataResponse {
    let names: Vec<String> = match &req.topics {
        Some(ts) => ts.iter().filter_map(|t| t.name.clone()).collect(),
        None => st.topics.keys().cloned().collect(),
    };
    let live: Vec<i32> = st.live_brokers().map(|b| b.id).collect();
    let all: Vec<i32> = st.brokers.iter().map(|b| b.id).collect();
    let topics = names
        .into_iter()
        .map(|name| {
            let topic = st.topics.get(&name);
            let error = forced.or(topic
                .is_none()
                .then_some(ErrorCode::UnknownTopicOrPartition));
            let partitions = match (topic, error) {
                (Some(t), None) => t
                    .partitions
                    .iter()
                    .enumerate()
                    .map(|(i, p)| MetadataPartition {
                        error_code: if p.leader < 0 {
                            ErrorCode::LeaderNotAvailable.code()
                        } else {
                            0
                        },
                        partition_index: i32::try_from(i).unwrap_or(i32::MAX),
                        leader_id: p.leader,
                        leader_epoch: p.leader_epoch,
                        replica_nodes: all.clone(),
                        isr_nodes: live.clone(),
                        ..MetadataPartition::default()
                    })
                    .collect(),
                _ => Vec::new(),
            };
            MetadataTopic {
                error_code: code(error),
                name: Some(name),
                topic_id: topic.filter(|_| st.topic_ids).map_or([0; 16], |t| t.id),
                partitions,
                ..MetadataTopic::default()
            }
        })
        .collect();
    MetadataResponse {
        brokers: st
            .live_brokers()
            .map(|b| MetadataBroker {
                node_id: b.id,
                host: b.addr.ip().to_string(),
                port: i32::from(b.addr.port()),
                ..MetadataBroker::default()
            })
            .collect(),
        cluster_id: Some("kafkapipe-mock".to_string()),
        controller_id: live.first().copied().unwrap_or(-1),
        topics,
        ..MetadataResponse::default()
    }
}

/// A request's `current_leader_epoch` for a partition that does not match its leader
/// epoch (KIP-320; Kafka checks it before leadership).
fn fenced(st: &State, topic: &str, partition: i32, current: i32) -> Option<ErrorCode> {
    st.partition(topic, partition)?.check_epoch(current)
}

/// OffsetForLeaderEpoch (KIP-320): the end offset of each asked epoch in the leader's
/// log, after the same epoch fencing and leadership checks as Fetch.
fn offset_for_leader_epoch(
    id: i32,
    st: &mut State,
    req: &OffsetForLeaderEpochRequest,
    forced: Option<ErrorCode>,
) -> OffsetForLeaderEpochResponse {
    let topics = req
        .topics
        .iter()
        .map(|t| OffsetForLeaderTopicResult {
            topic: t.topic.clone(),
            partitions: t
                .partitions
                .iter()
                .map(|p| {
                    let mut r = OffsetForLeaderEpochEndOffset {
                        partition: p.partition,
                        leader_epoch: -1,
                        end_offset: -1,
                        ..OffsetForLeaderEpochEndOffset::default()
                    };
                    let error = forced
                        .or_else(|| {
                            st.take_partition_error(
                                ApiKey::OFFSET_FOR_LEADER_EPOCH,
                                &t.topic,
                                p.partition,
                            )
                        })
                        .or_else(|| fenced(st, &t.topic, p.partition, p.current_leader_epoch))
                        .or_else(|| route(st, id, &t.topic, p.partition));
                    match (error, st.partition(&t.topic, p.partition)) {
                        (None, Some(log)) => {
                            (r.leader_epoch, r.end_offset) = log.end_offset_for(p.leader_epoch);
                        }
                        (e, _) => {
                            r.error_code = code(e.or(Some(ErrorCode::UnknownTopicOrPartition)))
                        }
                    }
                    r
                })
                .collect(),
            ..OffsetForLeaderTopicResult::default()
        })
        .collect();
    OffsetForLeaderEpochResponse {
        topics,
        ..OffsetForLeaderEpochResponse::default()
    }
}

/// Why broker `id` cannot serve a partition, if it cannot.
fn route(st: &State, id: i32, topic: &str, partition: i32) -> Option<ErrorCode> {
    match st.partition(topic, partition) {
        None => Some(ErrorCode::UnknownTopicOrPartition),
        Some(p) if p.leader != id => Some(ErrorCode::NotLeaderOrFollower),
        Some(_) => None,
    }
}

fn produce(
    id: i32,
    st: &mut State,
    req: &ProduceRequest,
    version: i16,
    forced: Option<ErrorCode>,
    message: Option<String>,
) -> ProduceResponse {
    let responses = req
        .topic_data
        .iter()
        .map(|t| {
            let topic = st.resolve(&t.name, t.topic_id);
            let name = topic.clone().unwrap_or_default();
            ProduceTopicResponse {
                name: t.name.clone(),
                topic_id: t.topic_id,
                partition_responses: t
                    .partition_data
                    .iter()
                    .filter_map(|p| {
                        let mut r = ProducePartitionResponse {
                            index: p.index,
                            base_offset: -1,
                            log_append_time_ms: -1,
                            log_start_offset: -1,
                            ..ProducePartitionResponse::default()
                        };
                        let fault = match forced {
                            Some(_) => None,
                            None => st.take_partition_fault(ApiKey::PRODUCE, &name, p.index),
                        };
                        let omit = fault == Some(None);
                        let error = forced
                            .or(fault.flatten())
                            .or(topic.as_ref().err().copied())
                            .or_else(|| route(st, id, &name, p.index))
                            .or_else(|| {
                                // Transactions v2: Produce v12+ adds the partition.
                                let tid = req.transactional_id.as_deref()?;
                                // The batch header (producer id and epoch) is in the head.
                                let records = p
                                    .records
                                    .as_ref()
                                    .map(|r| r.head().clone())
                                    .unwrap_or_default();
                                (version >= 12 && st.transactions_v2())
                                    .then(|| super::txn::join(st, tid, &name, p.index, &records))
                                    .flatten()
                            });
                        let max = st.max_message_bytes;
                        let result = match (error, st.partition_mut(&name, p.index)) {
                            (None, Some(log)) => {
                                let records =
                                    p.records.as_ref().map(|r| r.to_bytes()).unwrap_or_default();
                                let result = log.append(&records, max);
                                r.log_start_offset = log.log_start;
                                result
                            }
                            (Some(e), _) => Err(e),
                            (None, None) => Err(ErrorCode::UnknownTopicOrPartition),
                        };
                        match result {
                            Ok(base) => r.base_offset = base,
                            Err(e) => r.error_code = e.code(),
                        }
                        if forced.is_some() {
                            r.error_message.clone_from(&message);
                        }
                        (!omit).then_some(r)
                    })
                    .collect(),
                ..ProduceTopicResponse::default()
            }
        })
        .collect();
    ProduceResponse {
        responses,
        ..ProduceResponse::default()
    }
}

/// One pass over a fetch: the response and how many record bytes it carries, and whether
/// any partition has an error.
fn fetch_once(id: i32, st: &mut State, req: &FetchRequest) -> (FetchResponse, usize, bool) {
    let mut total = 0usize;
    let mut errors = false;
    let max_bytes = usize::try_from(req.max_bytes).unwrap_or(0);
    let responses = req
        .topics
        .iter()
        .map(|t| {
            let topic = st.resolve(&t.topic, t.topic_id);
            let name = topic.clone().unwrap_or_default();
            FetchableTopicResponse {
                topic: t.topic.clone(),
                topic_id: t.topic_id,
                partitions: t
                    .partitions
                    .iter()
                    .map(|p| {
                        let mut d = FetchPartitionData {
                            partition_index: p.partition,
                            high_watermark: -1,
                            last_stable_offset: -1,
                            log_start_offset: -1,
                            aborted_transactions: Some(Vec::new()),
                            preferred_read_replica: -1,
                            records: Some(Bytes::new()),
                            ..FetchPartitionData::default()
                        };
                        let error = st
                            .take_partition_error(ApiKey::FETCH, &name, p.partition)
                            .or(topic.as_ref().err().copied())
                            .or_else(|| fenced(st, &name, p.partition, p.current_leader_epoch))
                            .or_else(|| route(st, id, &name, p.partition));
                        let log = st.partition(&name, p.partition);
                        match (error, log) {
                            (None, Some(log)) => {
                                let hw = log.high_watermark();
                                let (lso, aborted) = log.transactions();
                                let committed = req.isolation_level == 1;
                                d.high_watermark = hw;
                                d.last_stable_offset = lso;
                                d.log_start_offset = log.log_start;
                                if p.fetch_offset < log.log_start || p.fetch_offset > hw {
                                    d.error_code = ErrorCode::OffsetOutOfRange.code();
                                    errors = true;
                                } else {
                                    let part_max =
                                        usize::try_from(p.partition_max_bytes).unwrap_or(0);
                                    let limit = part_max.min(max_bytes.saturating_sub(total));
                                    let upto = if committed { lso } else { hw };
                                    let records = log.read(
                                        p.fetch_offset,
                                        upto,
                                        limit,
                                        total == 0,
                                        st.truncate_fetches,
                                    );
                                    total += records.len();
                                    d.records = Some(records);
                                    // Read committed: the aborted transactions the fetched
                                    // range overlaps (Kafka sends none otherwise).
                                    d.aborted_transactions = Some(if committed {
                                        aborted
                                            .iter()
                                            .filter(|a| {
                                                a.marker >= p.fetch_offset && a.first_offset < upto
                                            })
                                            .map(|a| AbortedTransaction {
                                                producer_id: a.producer_id,
                                                first_offset: a.first_offset,
                                                ..AbortedTransaction::default()
                                            })
                                            .collect()
                                    } else {
                                        Vec::new()
                                    });
                                }
                            }
                            (e, _) => {
                                d.error_code = code(e.or(Some(ErrorCode::UnknownTopicOrPartition)));
                                errors = true;
                            }
                        }
                        d
                    })
                    .collect(),
                ..FetchableTopicResponse::default()
            }
        })
        .collect();
    (
        FetchResponse {
            responses,
            ..FetchResponse::default()
        },
        total,
        errors,
    )
}

/// Fetch: answer at once if there is data (at least MinBytes), an error, or MinBytes is
/// 0; else wait for appends until MaxWait.
async fn fetch(
    id: i32,
    shared: &Shared,
    req: &FetchRequest,
    forced: Option<ErrorCode>,
) -> FetchResponse {
    let wait = Duration::from_millis(u64::try_from(req.max_wait_ms).unwrap_or(0));
    let deadline = Instant::now() + wait.min(MAX_FETCH_WAIT);
    if let Some(e) = forced {
        return FetchResponse {
            error_code: e.code(),
            ..FetchResponse::default()
        };
    }
    let served = match shared.lock().fetch_sessions.apply(id, req) {
        Ok(served) => served,
        Err(e) => {
            return FetchResponse {
                error_code: e.code(),
                ..FetchResponse::default()
            }
        }
    };
    let req = &served.req;
    let min_bytes = usize::try_from(req.min_bytes).unwrap_or(0);
    let mut tick = shared.tick.subscribe();
    loop {
        tick.borrow_and_update();
        let (resp, bytes, errors) = fetch_once(id, &mut shared.lock(), req);
        if errors || bytes >= min_bytes.max(1) || min_bytes == 0 || Instant::now() >= deadline {
            return answered(shared, &served, resp);
        }
        tokio::select! {
            changed = tick.changed() => {
                if changed.is_err() {
                    return answered(shared, &served, resp);
                }
            }
            _ = tokio::time::sleep_until(deadline) => {}
        }
    }
}

/// `resp` as its fetch session answers it.
fn answered(
    shared: &Shared,
    served: &fetch_session::Served,
    mut resp: FetchResponse,
) -> FetchResponse {
    shared.lock().fetch_sessions.answer(served, &mut resp);
    resp
}

fn list_offsets(
    id: i32,
    st: &mut State,
    req: &ListOffsetsRequest,
    forced: Option<ErrorCode>,
) -> ListOffsetsResponse {
    let topics = req
        .topics
        .iter()
        .map(|t| ListOffsetsTopicResponse {
            name: t.name.clone(),
            partitions: t
                .partitions
                .iter()
                .map(|p| {
                    let mut r = ListOffsetsPartitionResponse {
                        partition_index: p.partition_index,
                        timestamp: -1,
                        offset: -1,
                        leader_epoch: -1,
                        ..ListOffsetsPartitionResponse::default()
                    };
                    let error = forced
                        .or_else(|| {
                            st.take_partition_error(
                                ApiKey::LIST_OFFSETS,
                                &t.name,
                                p.partition_index,
                            )
                        })
                        .or_else(|| fenced(st, &t.name, p.partition_index, p.current_leader_epoch))
                        .or_else(|| route(st, id, &t.name, p.partition_index));
                    match (error, st.partition(&t.name, p.partition_index)) {
                        (None, Some(log)) => {
                            r.leader_epoch = log.leader_epoch;
                            let found = match p.timestamp {
                                -1 if req.isolation_level == 1 => Some((log.transactions().0, -1)),
                                -1 => Some((log.high_watermark(), -1)),
                                -2 => Some((log.log_start, -1)),
                                -3 => log.max_timestamp(),
                                ts => log.offset_for_time(ts),
                            };
                            if let Some((offset, ts)) = found {
                                r.offset = offset;
                                r.timestamp = ts;
                            }
                        }
                        (e, _) => {
                            r.error_code = code(e.or(Some(ErrorCode::UnknownTopicOrPartition)))
                        }
                    }
                    r
                })
                .collect(),
            ..ListOffsetsTopicResponse::default()
        })
        .collect();
    ListOffsetsResponse {
        topics,
        ..ListOffsetsResponse::default()
    }
}

fn valid_topic_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 249
        && name != "."
        && name != ".."
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-')
}

fn create_topics(
    st: &mut State,
    req: &CreateTopicsRequest,
    version: i16,
    forced: Option<ErrorCode>,
) -> CreateTopicsResponse {
    let live = st.live_brokers().count();
    let topics = req
        .topics
        .iter()
        .map(|t| {
            let partitions = if t.num_partitions == -1 && !t.assignments.is_empty() {
                i32::try_from(t.assignments.len()).unwrap_or(i32::MAX)
            } else if t.num_partitions == -1 {
                1
            } else {
                t.num_partitions
            };
            let rf = if t.replication_factor == -1 {
                i16::try_from(live.min(3)).unwrap_or(1)
            } else {
                t.replication_factor
            };
            let error = forced.or(if !valid_topic_name(&t.name) {
                Some(ErrorCode::InvalidTopicException)
            } else if st.topics.contains_key(&t.name) {
                Some(ErrorCode::TopicAlreadyExists)
            } else if !(1..=MAX_PARTITIONS).contains(&partitions) {
                Some(ErrorCode::InvalidPartitions)
            } else if rf < 1 || usize::try_from(rf).unwrap_or(usize::MAX) > live {
                Some(ErrorCode::InvalidReplicationFactor)
            } else {
                None
            });
            if error.is_none() && !req.validate_only {
                st.create_topic(&t.name, partitions);
                if let Some(topic) = st.topics.get_mut(&t.name) {
                    topic.configs = t
                        .configs
                        .iter()
                        .filter_map(|c| c.value.clone().map(|v| (c.name.clone(), v)))
                        .collect();
                }
            }
            CreatableTopicResult {
                name: t.name.clone(),
                topic_id: st.topics.get(&t.name).map_or([0; 16], |t| t.id),
                error_code: code(error),
                error_message: error.map(|e| e.to_string()),
                num_partitions: if error.is_none() { partitions } else { -1 },
                replication_factor: if error.is_none() { rf } else { -1 },
                configs: (version >= 5).then(Vec::new),
                ..CreatableTopicResult::default()
            }
        })
        .collect();
    CreateTopicsResponse {
        topics,
        ..CreateTopicsResponse::default()
    }
}

fn delete_topics(
    st: &mut State,
    req: &DeleteTopicsRequest,
    forced: Option<ErrorCode>,
) -> DeleteTopicsResponse {
    let mut targets: Vec<(Option<String>, [u8; 16])> = req
        .topic_names
        .iter()
        .map(|n| (Some(n.clone()), [0; 16]))
        .collect();
    targets.extend(req.topics.iter().map(|t| (t.name.clone(), t.topic_id)));
    let responses = targets
        .into_iter()
        .map(|(name, id)| {
            let name = name.or_else(|| {
                st.topics
                    .iter()
                    .find(|(_, t)| t.id == id && id != [0; 16])
                    .map(|(n, _)| n.clone())
            });
            let found = name.as_ref().and_then(|n| st.topics.get(n)).map(|t| t.id);
            let error = forced.or(found
                .is_none()
                .then_some(ErrorCode::UnknownTopicOrPartition));
            if error.is_none() {
                if let Some(n) = &name {
                    st.topics.remove(n);
                }
            }
            DeletableTopicResult {
                name,
                topic_id: found.unwrap_or(id),
                error_code: code(error),
                ..DeletableTopicResult::default()
            }
        })
        .collect();
    DeleteTopicsResponse {
        responses,
        ..DeleteTopicsResponse::default()
    }
}

fn create_partitions(
    st: &mut State,
    req: &CreatePartitionsRequest,
    forced: Option<ErrorCode>,
) -> CreatePartitionsResponse {
    let results = req
        .topics
        .iter()
        .map(|t| {
            let current = st.topics.get(&t.name).map(|t| t.partitions.len());
            let error = forced.or(match current {
                None => Some(ErrorCode::UnknownTopicOrPartition),
                Some(n)
                    if usize::try_from(t.count).unwrap_or(0) <= n || t.count > MAX_PARTITIONS =>
                {
                    Some(ErrorCode::InvalidPartitions)
                }
                Some(_) => None,
            });
            if error.is_none() && !req.validate_only {
                let n = current.unwrap_or(0);
                let add = usize::try_from(t.count).unwrap_or(0).saturating_sub(n);
                let leaders: Vec<i32> = (n..n + add).map(|i| st.pick_leader(i)).collect();
                if let Some(topic) = st.topics.get_mut(&t.name) {
                    topic
                        .partitions
                        .extend(leaders.into_iter().map(super::log::PartitionLog::new));
                }
            }
            CreatePartitionsTopicResult {
                name: t.name.clone(),
                error_code: code(error),
                error_message: error.map(|e| e.to_string()),
                ..CreatePartitionsTopicResult::default()
            }
        })
        .collect();
    CreatePartitionsResponse {
        results,
        ..CreatePartitionsResponse::default()
    }
}

fn init_producer_id(
    st: &mut State,
    req: &InitProducerIdRequest,
    forced: Option<ErrorCode>,
) -> InitProducerIdResponse {
    if let Some(e) = forced {
        return InitProducerIdResponse {
            error_code: e.code(),
            producer_id: -1,
            producer_epoch: -1,
            ..InitProducerIdResponse::default()
        };
    }
    let (producer_id, producer_epoch) = match &req.transactional_id {
        Some(tid) => super::txn::init(st, tid),
        None => {
            st.next_producer_id += 1;
            (st.next_producer_id, 0)
        }
    };
    InitProducerIdResponse {
        producer_id,
        producer_epoch,
        ..InitProducerIdResponse::default()
    }
}

fn find_coordinator(
    st: &State,
    req: &FindCoordinatorRequest,
    version: i16,
    forced: Option<ErrorCode>,
) -> FindCoordinatorResponse {
    let one = |key: &str| {
        let broker = st.coordinator(key);
        let error = forced.or(broker
            .is_none()
            .then_some(ErrorCode::CoordinatorNotAvailable));
        Coordinator {
            key: key.to_string(),
            node_id: broker.map_or(-1, |b| b.id),
            host: broker.map_or(String::new(), |b| b.addr.ip().to_string()),
            port: broker.map_or(-1, |b| i32::from(b.addr.port())),
            error_code: code(error),
            error_message: error.map(|e| e.to_string()),
            ..Coordinator::default()
        }
    };
    if version >= 4 {
        FindCoordinatorResponse {
            coordinators: req.coordinator_keys.iter().map(|k| one(k)).collect(),
            ..FindCoordinatorResponse::default()
        }
    } else {
        let c = one(&req.key);
        FindCoordinatorResponse {
            error_code: c.error_code,
            error_message: c.error_message,
            node_id: c.node_id,
            host: c.host,
            port: c.port,
            ..FindCoordinatorResponse::default()
        }
    }
}
