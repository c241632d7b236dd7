//! Fetch (key 1): read record batches from partitions.
//!
//! Versions 4–18 (4 is the first that returns record batch v2 with the last stable offset
//! and aborted transactions). v5 adds log start offsets; v7 fetch sessions (KIP-227) and
//! forgotten topics; v9 the current leader epoch; v11 the rack id and preferred read
//! replica (KIP-392); v12 is flexible, adds the last fetched epoch and the tagged fields
//! `cluster_id` (request tag 0) and `diverging_epoch` / `current_leader` / `snapshot_id`
//! (partition tags 0–2); v13 uses topic ids instead of names; v15 moves the replica id
//! into the `replica_state` tag (1); v16 adds `node_endpoints` (response tag 0); v17 the
//! `replica_directory_id` partition tag (0); v18 the `high_watermark` partition tag (1).
//! The `records` are raw bytes, left to [`crate::record`].

use bytes::{BufMut, Bytes, BytesMut};

use super::{get_tagged_if, parse_tagged, put_tagged_if, tagged_value};
use super::{LeaderIdAndEpoch, NodeEndpoint};
use crate::error::Result;
use crate::protocol::primitives::*;
use crate::protocol::{check_version, ApiKey, Decode, Encode, Request, TaggedFields};

/// Fetch request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetchRequest {
    /// The cluster id, if known (tag 0). Added in version 12; `None` when absent.
    pub cluster_id: Option<String>,
    /// The fetching broker's id, or -1 for a consumer. Versions 4–14.
    pub replica_id: i32,
    /// The fetching replica's state (tag 1). Added in version 15; `None` when absent.
    pub replica_state: Option<ReplicaState>,
    /// The maximum time to wait for `min_bytes`, in ms.
    pub max_wait_ms: i32,
    /// The minimum bytes to accumulate before answering.
    pub min_bytes: i32,
    /// The maximum bytes to return in total.
    pub max_bytes: i32,
    /// 0 = read uncommitted, 1 = read committed.
    pub isolation_level: i8,
    /// The fetch session id, or 0. Added in version 7.
    pub session_id: i32,
    /// The fetch session epoch, or -1. Added in version 7.
    pub session_epoch: i32,
    /// The topics to fetch.
    pub topics: Vec<FetchTopic>,
    /// Partitions to remove from the fetch session. Added in version 7.
    pub forgotten_topics_data: Vec<ForgottenTopic>,
    /// The consumer's rack. Added in version 11.
    pub rack_id: String,
    /// Unknown tagged fields. Flexible versions only.
    pub tagged_fields: TaggedFields,
}

impl Default for FetchRequest {
    fn default() -> Self {
        FetchRequest {
            cluster_id: None,
            replica_id: -1,
            replica_state: None,
            max_wait_ms: 0,
            min_bytes: 0,
            max_bytes: i32::MAX,
            isolation_level: 0,
            session_id: 0,
            session_epoch: -1,
            topics: Vec::new(),
            forgotten_topics_data: Vec::new(),
            rack_id: String::new(),
            tagged_fields: TaggedFields::new(),
        }
    }
}

/// The state of a fetching replica (tag 1 of [`FetchRequest`]). Added in version 15.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaState {
    /// The replica's broker id, or -1.
    pub replica_id: i32,
    /// The replica's broker epoch, or -1.
    pub replica_epoch: i64,
    /// Unknown tagged fields.
    pub tagged_fields: TaggedFields,
}

impl Default for ReplicaState {
    fn default() -> Self {
        ReplicaState {
            replica_id: -1,
            replica_epoch: -1,
            tagged_fields: TaggedFields::new(),
        }
    }
}

/// A topic in a [`FetchRequest`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FetchTopic {
    /// The topic name. Versions 4–12.
    pub topic: String,
    /// The topic id. Added in version 13.
    pub topic_id: [u8; 16],
    /// The partitions to fetch.
    pub partitions: Vec<FetchPartition>,
    /// Unknown tagged fields. Flexible versions only.
    pub tagged_fields: TaggedFields,
}

/// A partition in a [`FetchTopic`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetchPartition {
    /// The partition index.
    pub partition: i32,
    /// The current leader epoch, for fencing. Added in version 9; default -1.
    pub current_leader_epoch: i32,
    /// The offset to fetch from.
    pub fetch_offset: i64,
    /// The epoch of the last fetched record. Added in version 12; default -1.
    pub last_fetched_epoch: i32,
    /// The follower's log start offset. Added in version 5; default -1.
    pub log_start_offset: i64,
    /// The maximum bytes to return for this partition.
    pub partition_max_bytes: i32,
    /// The follower's replica directory id (tag 0). Added in version 17; `None` when
    /// absent.
    pub replica_directory_id: Option<[u8; 16]>,
    /// The follower's high watermark (tag 1). Added in version 18; `None` when absent.
    pub high_watermark: Option<i64>,
    /// Unknown tagged fields. Flexible versions only.
    pub tagged_fields: TaggedFields,
}

impl Default for FetchPartition {
    fn default() -> Self {
        FetchPartition {
            partition: 0,
            current_leader_epoch: -1,
            fetch_offset: 0,
            last_fetched_epoch: -1,
            log_start_offset: -1,
            partition_max_bytes: 0,
            replica_directory_id: None,
            high_watermark: None,
            tagged_fields: TaggedFields::new(),
        }
    }
}

/// Partitions to remove from an incremental fetch session. Added in version 7.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ForgottenTopic {
    /// The topic name. Versions 7–12.
    pub topic: String,
    /// The topic id. Added in version 13.
    pub topic_id: [u8; 16],
    /// The partition indexes to forget.
    pub partitions: Vec<i32>,
    /// Unknown tagged fields. Flexible versions only.
    pub tagged_fields: TaggedFields,
}

impl Request for FetchRequest {
    const API_KEY: ApiKey = ApiKey::FETCH;
    const MIN_VERSION: i16 = 4;
    const MAX_VERSION: i16 = 18;
    const FIRST_FLEXIBLE: i16 = 12;
    type Response = FetchResponse;
}

fn put_topic_ref(buf: &mut BytesMut, name: &str, id: &[u8; 16], version: i16) -> Result<()> {
    if version >= 13 {
        buf.put_slice(id);
        Ok(())
    } else {
        put_string(buf, name, version >= 12)
    }
}

fn get_topic_ref(buf: &mut Bytes, version: i16) -> Result<(String, [u8; 16])> {
    if version >= 13 {
        Ok((String::new(), get_uuid(buf)?))
    } else {
        Ok((get_string(buf, version >= 12)?, [0; 16]))
    }
}

impl Encode for FetchRequest {
    fn encode(&self, buf: &mut BytesMut, version: i16) -> Result<()> {
        check_version::<Self>(version)?;
        let flexible = version >= 12;
        if version <= 14 {
            buf.put_i32(self.replica_id);
        }
        buf.put_i32(self.max_wait_ms);
        buf.put_i32(self.min_bytes);
        buf.put_i32(self.max_bytes);
        buf.put_i8(self.isolation_level);
        if version >= 7 {
            buf.put_i32(self.session_id);
            buf.put_i32(self.session_epoch);
        }
        put_array(buf, &self.topics, flexible, |buf, t| {
            put_topic_ref(buf, &t.topic, &t.topic_id, version)?;
            put_array(buf, &t.partitions, flexible, |buf, p| {
                buf.put_i32(p.partition);
                if version >= 9 {
                    buf.put_i32(p.current_leader_epoch);
                }
                buf.put_i64(p.fetch_offset);
                if version >= 12 {
                    buf.put_i32(p.last_fetched_epoch);
                }
                if version >= 5 {
                    buf.put_i64(p.log_start_offset);
                }
                buf.put_i32(p.partition_max_bytes);
                if flexible {
                    let mut known = Vec::new();
                    if let (true, Some(id)) = (version >= 17, &p.replica_directory_id) {
                        known.push((0, Bytes::copy_from_slice(id)));
                    }
                    if let (true, Some(hw)) = (version >= 18, p.high_watermark) {
                        known.push((1, Bytes::copy_from_slice(&hw.to_be_bytes())));
                    }
                    put_tagged_fields(buf, &known, &p.tagged_fields)?;
                }
                Ok(())
            })?;
            put_tagged_if(buf, flexible, &t.tagged_fields)
        })?;
        if version >= 7 {
            put_array(buf, &self.forgotten_topics_data, flexible, |buf, f| {
                put_topic_ref(buf, &f.topic, &f.topic_id, version)?;
                put_array(buf, &f.partitions, flexible, |buf, p| {
                    buf.put_i32(*p);
                    Ok(())
                })?;
                put_tagged_if(buf, flexible, &f.tagged_fields)
            })?;
        }
        if version >= 11 {
            put_string(buf, &self.rack_id, flexible)?;
        }
        if flexible {
            let mut known = Vec::new();
            if let Some(c) = &self.cluster_id {
                known.push((0, tagged_value(|b| put_string(b, c, true))?));
            }
            if let (true, Some(s)) = (version >= 15, &self.replica_state) {
                known.push((
                    1,
                    tagged_value(|b| {
                        b.put_i32(s.replica_id);
                        b.put_i64(s.replica_epoch);
                        put_tagged_fields(b, &[], &s.tagged_fields)
                    })?,
                ));
            }
            put_tagged_fields(buf, &known, &self.tagged_fields)?;
        }
        Ok(())
    }
}

impl Decode for FetchRequest {
    fn decode(buf: &mut Bytes, version: i16) -> Result<Self> {
        check_version::<Self>(version)?;
        let flexible = version >= 12;
        let mut req = FetchRequest::default();
        if version <= 14 {
            req.replica_id = get_i32(buf)?;
        }
        req.max_wait_ms = get_i32(buf)?;
        req.min_bytes = get_i32(buf)?;
        req.max_bytes = get_i32(buf)?;
        req.isolation_level = get_i8(buf)?;
        if version >= 7 {
            req.session_id = get_i32(buf)?;
            req.session_epoch = get_i32(buf)?;
        }
        let topic_min = if flexible { 3 } else { 6 };
        req.topics = get_array(buf, flexible, topic_min, |buf| {
            let (topic, topic_id) = get_topic_ref(buf, version)?;
            let partitions = get_array(buf, flexible, 16, |buf| {
                let mut p = FetchPartition {
                    partition: get_i32(buf)?,
                    ..FetchPartition::default()
                };
                if version >= 9 {
                    p.current_leader_epoch = get_i32(buf)?;
                }
                p.fetch_offset = get_i64(buf)?;
                if version >= 12 {
                    p.last_fetched_epoch = get_i32(buf)?;
                }
                if version >= 5 {
                    p.log_start_offset = get_i64(buf)?;
                }
                p.partition_max_bytes = get_i32(buf)?;
                if flexible {
                    let (mut dir, mut hw) = (None, None);
                    p.tagged_fields = get_tagged_fields_with(buf, |tag, v| {
                        Ok(match tag {
                            0 if version >= 17 => {
                                dir = parse_tagged(v, get_uuid);
                                dir.is_some()
                            }
                            1 if version >= 18 => {
                                hw = parse_tagged(v, get_i64);
                                hw.is_some()
                            }
                            _ => false,
                        })
                    })?;
                    p.replica_directory_id = dir;
                    p.high_watermark = hw;
                }
                Ok(p)
            })?;
            Ok(FetchTopic {
                topic,
                topic_id,
                partitions,
                tagged_fields: get_tagged_if(buf, flexible)?,
            })
        })?;
        if version >= 7 {
            req.forgotten_topics_data = get_array(buf, flexible, topic_min, |buf| {
                let (topic, topic_id) = get_topic_ref(buf, version)?;
                Ok(ForgottenTopic {
                    topic,
                    topic_id,
                    partitions: get_array(buf, flexible, 4, get_i32)?,
                    tagged_fields: get_tagged_if(buf, flexible)?,
                })
            })?;
        }
        if version >= 11 {
            req.rack_id = get_string(buf, flexible)?;
        }
        if flexible {
            let (mut cluster_id, mut replica_state) = (None, None);
            req.tagged_fields = get_tagged_fields_with(buf, |tag, v| {
                Ok(match tag {
                    0 => {
                        cluster_id = parse_tagged(v, |b| get_nullable_string(b, true)).flatten();
                        cluster_id.is_some()
                    }
                    1 if version >= 15 => {
                        replica_state = parse_tagged(v, |b| {
                            Ok(ReplicaState {
                                replica_id: get_i32(b)?,
                                replica_epoch: get_i64(b)?,
                                tagged_fields: get_tagged_fields(b)?,
                            })
                        });
                        replica_state.is_some()
                    }
                    _ => false,
                })
            })?;
            req.cluster_id = cluster_id;
            req.replica_state = replica_state;
        }
        Ok(req)
    }
}

/// Fetch response.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FetchResponse {
    /// Throttle duration in ms.
    pub throttle_time_ms: i32,
    /// The top-level error code. Added in version 7.
    pub error_code: i16,
    /// The fetch session id, or 0. Added in version 7.
    pub session_id: i32,
    /// Per-topic results.
    pub responses: Vec<FetchableTopicResponse>,
    /// Endpoints of the brokers named in `current_leader` fields (tag 0). Added in
    /// version 16; `None` when absent.
    pub node_endpoints: Option<Vec<NodeEndpoint>>,
    /// Unknown tagged fields. Flexible versions only.
    pub tagged_fields: TaggedFields,
}

/// A topic in a [`FetchResponse`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FetchableTopicResponse {
    /// The topic name. Versions 4–12.
    pub topic: String,
    /// The topic id. Added in version 13.
    pub topic_id: [u8; 16],
    /// Per-partition results.
    pub partitions: Vec<FetchPartitionData>,
    /// Unknown tagged fields. Flexible versions only.
    pub tagged_fields: TaggedFields,
}

/// A partition in a [`FetchableTopicResponse`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetchPartitionData {
    /// The partition index.
    pub partition_index: i32,
    /// The error code, or 0.
    pub error_code: i16,
    /// The high watermark.
    pub high_watermark: i64,
    /// The last stable offset, or -1.
    pub last_stable_offset: i64,
    /// The log start offset. Added in version 5; default -1.
    pub log_start_offset: i64,
    /// The diverging epoch, for follower truncation (tag 0). Added in version 12;
    /// `None` when absent.
    pub diverging_epoch: Option<EpochEndOffset>,
    /// The current leader, sent with leadership errors (tag 1). Added in version 12;
    /// `None` when absent.
    pub current_leader: Option<LeaderIdAndEpoch>,
    /// The snapshot to fetch when the offset is below the log start (tag 2). Added in
    /// version 12; `None` when absent.
    pub snapshot_id: Option<SnapshotId>,
    /// Aborted transactions in the returned range (read committed only).
    pub aborted_transactions: Option<Vec<AbortedTransaction>>,
    /// The preferred read replica, or -1. Added in version 11.
    pub preferred_read_replica: i32,
    /// The record batches, undecoded.
    pub records: Option<Bytes>,
    /// Unknown tagged fields. Flexible versions only.
    pub tagged_fields: TaggedFields,
}

impl Default for FetchPartitionData {
    fn default() -> Self {
        FetchPartitionData {
            partition_index: 0,
            error_code: 0,
            high_watermark: 0,
            last_stable_offset: -1,
            log_start_offset: -1,
            diverging_epoch: None,
            current_leader: None,
            snapshot_id: None,
            aborted_transactions: None,
            preferred_read_replica: -1,
            records: None,
            tagged_fields: TaggedFields::new(),
        }
    }
}

/// An epoch and its end offset (tag 0 of [`FetchPartitionData`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EpochEndOffset {
    /// The epoch, or -1.
    pub epoch: i32,
    /// The end offset, or -1.
    pub end_offset: i64,
    /// Unknown tagged fields.
    pub tagged_fields: TaggedFields,
}

impl Default for EpochEndOffset {
    fn default() -> Self {
        EpochEndOffset {
            epoch: -1,
            end_offset: -1,
            tagged_fields: TaggedFields::new(),
        }
    }
}

/// A snapshot id (tag 2 of [`FetchPartitionData`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotId {
    /// The snapshot's end offset, or -1.
    pub end_offset: i64,
    /// The snapshot's epoch, or -1.
    pub epoch: i32,
    /// Unknown tagged fields.
    pub tagged_fields: TaggedFields,
}

impl Default for SnapshotId {
    fn default() -> Self {
        SnapshotId {
            end_offset: -1,
            epoch: -1,
            tagged_fields: TaggedFields::new(),
        }
    }
}

/// An aborted transaction in a [`FetchPartitionData`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AbortedTransaction {
    /// The producer id of the aborted transaction.
    pub producer_id: i64,
    /// The first offset of the aborted transaction.
    pub first_offset: i64,
    /// Unknown tagged fields. Flexible versions only.
    pub tagged_fields: TaggedFields,
}

impl Encode for FetchResponse {
    fn encode(&self, buf: &mut BytesMut, version: i16) -> Result<()> {
        check_version::<FetchRequest>(version)?;
        let flexible = version >= 12;
        buf.put_i32(self.throttle_time_ms);
        if version >= 7 {
            buf.put_i16(self.error_code);
            buf.put_i32(self.session_id);
        }
        put_array(buf, &self.responses, flexible, |buf, t| {
            put_topic_ref(buf, &t.topic, &t.topic_id, version)?;
            put_array(buf, &t.partitions, flexible, |buf, p| {
                buf.put_i32(p.partition_index);
                buf.put_i16(p.error_code);
                buf.put_i64(p.high_watermark);
                buf.put_i64(p.last_stable_offset);
                if version >= 5 {
                    buf.put_i64(p.log_start_offset);
                }
                put_nullable_array(
                    buf,
                    p.aborted_transactions.as_deref(),
                    flexible,
                    |buf, a| {
                        buf.put_i64(a.producer_id);
                        buf.put_i64(a.first_offset);
                        put_tagged_if(buf, flexible, &a.tagged_fields)
                    },
                )?;
                if version >= 11 {
                    buf.put_i32(p.preferred_read_replica);
                }
                put_nullable_bytes(buf, p.records.as_deref(), flexible)?;
                if flexible {
                    let mut known = Vec::new();
                    if let Some(d) = &p.diverging_epoch {
                        known.push((
                            0,
                            tagged_value(|b| {
                                b.put_i32(d.epoch);
                                b.put_i64(d.end_offset);
                                put_tagged_fields(b, &[], &d.tagged_fields)
                            })?,
                        ));
                    }
                    if let Some(l) = &p.current_leader {
                        known.push((1, tagged_value(|b| l.put(b))?));
                    }
                    if let Some(s) = &p.snapshot_id {
                        known.push((
                            2,
                            tagged_value(|b| {
                                b.put_i64(s.end_offset);
                                b.put_i32(s.epoch);
                                put_tagged_fields(b, &[], &s.tagged_fields)
                            })?,
                        ));
                    }
                    put_tagged_fields(buf, &known, &p.tagged_fields)?;
                }
                Ok(())
            })?;
            put_tagged_if(buf, flexible, &t.tagged_fields)
        })?;
        if flexible {
            let mut known = Vec::new();
            if let (true, Some(n)) = (version >= 16, &self.node_endpoints) {
                known.push((0, tagged_value(|b| NodeEndpoint::put_all(b, n))?));
            }
            put_tagged_fields(buf, &known, &self.tagged_fields)?;
        }
        Ok(())
    }
}

impl Decode for FetchResponse {
    fn decode(buf: &mut Bytes, version: i16) -> Result<Self> {
        check_version::<FetchRequest>(version)?;
        let flexible = version >= 12;
        let mut resp = FetchResponse {
            throttle_time_ms: get_i32(buf)?,
            ..FetchResponse::default()
        };
        if version >= 7 {
            resp.error_code = get_i16(buf)?;
            resp.session_id = get_i32(buf)?;
        }
        let topic_min = if flexible { 3 } else { 6 };
        resp.responses = get_array(buf, flexible, topic_min, |buf| {
            let (topic, topic_id) = get_topic_ref(buf, version)?;
            let partitions = get_array(buf, flexible, 24, |buf| {
                let mut p = FetchPartitionData {
                    partition_index: get_i32(buf)?,
                    error_code: get_i16(buf)?,
                    high_watermark: get_i64(buf)?,
                    last_stable_offset: get_i64(buf)?,
                    ..FetchPartitionData::default()
                };
                if version >= 5 {
                    p.log_start_offset = get_i64(buf)?;
                }
                p.aborted_transactions = get_nullable_array(buf, flexible, 16, |buf| {
                    Ok(AbortedTransaction {
                        producer_id: get_i64(buf)?,
                        first_offset: get_i64(buf)?,
                        tagged_fields: get_tagged_if(buf, flexible)?,
                    })
                })?;
                if version >= 11 {
                    p.preferred_read_replica = get_i32(buf)?;
                }
                p.records = get_nullable_bytes(buf, flexible)?;
                if flexible {
                    let (mut de, mut cl, mut si) = (None, None, None);
                    p.tagged_fields = get_tagged_fields_with(buf, |tag, v| {
                        Ok(match tag {
                            0 => {
                                de = parse_tagged(v, |b| {
                                    Ok(EpochEndOffset {
                                        epoch: get_i32(b)?,
                                        end_offset: get_i64(b)?,
                                        tagged_fields: get_tagged_fields(b)?,
                                    })
                                });
                                de.is_some()
                            }
                            1 => {
                                cl = parse_tagged(v, LeaderIdAndEpoch::get);
                                cl.is_some()
                            }
                            2 => {
                                si = parse_tagged(v, |b| {
                                    Ok(SnapshotId {
                                        end_offset: get_i64(b)?,
                                        epoch: get_i32(b)?,
                                        tagged_fields: get_tagged_fields(b)?,
                                    })
                                });
                                si.is_some()
                            }
                            _ => false,
                        })
                    })?;
                    p.diverging_epoch = de;
                    p.current_leader = cl;
                    p.snapshot_id = si;
                }
                Ok(p)
            })?;
            Ok(FetchableTopicResponse {
                topic,
                topic_id,
                partitions,
                tagged_fields: get_tagged_if(buf, flexible)?,
            })
        })?;
        if flexible {
            let mut node_endpoints = None;
            resp.tagged_fields = get_tagged_fields_with(buf, |tag, v| {
                if tag == 0 && version >= 16 {
                    node_endpoints = parse_tagged(v, NodeEndpoint::get_all);
                    return Ok(node_endpoints.is_some());
                }
                Ok(false)
            })?;
            resp.node_endpoints = node_endpoints;
        }
        Ok(resp)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::messages::produce::tests::{endpoints, leader};
    use crate::protocol::messages::testutil::*;
    use proptest::prelude::*;

    const VERSIONS: std::ops::RangeInclusive<i16> = 4..=18;

    fn request() -> impl Strategy<Value = FetchRequest> {
        let partition = (
            any::<(i32, i32, i64, i32, i64, i32)>(),
            prop::option::of(any::<[u8; 16]>()),
            prop::option::of(any::<i64>()),
            tagged(),
        )
            .prop_map(
                |((p, cle, fo, lfe, lso, pmb), dir, hw, tf)| FetchPartition {
                    partition: p,
                    current_leader_epoch: cle,
                    fetch_offset: fo,
                    last_fetched_epoch: lfe,
                    log_start_offset: lso,
                    partition_max_bytes: pmb,
                    replica_directory_id: dir,
                    high_watermark: hw,
                    tagged_fields: tf,
                },
            );
        let topic = (string(), any::<[u8; 16]>(), vec(partition, 3), tagged()).prop_map(
            |(topic, id, partitions, tf)| FetchTopic {
                topic,
                topic_id: id,
                partitions,
                tagged_fields: tf,
            },
        );
        let forgotten = (string(), any::<[u8; 16]>(), vec(any::<i32>(), 3), tagged()).prop_map(
            |(topic, id, partitions, tf)| ForgottenTopic {
                topic,
                topic_id: id,
                partitions,
                tagged_fields: tf,
            },
        );
        let state = (any::<i32>(), any::<i64>(), tagged()).prop_map(|(r, e, tf)| ReplicaState {
            replica_id: r,
            replica_epoch: e,
            tagged_fields: tf,
        });
        (
            opt_string(),
            any::<i32>(),
            prop::option::of(state),
            any::<(i32, i32, i32, i8, i32, i32)>(),
            vec(topic, 3),
            vec(forgotten, 2),
            string(),
            tagged(),
        )
            .prop_map(
                |(cid, rid, rs, (mw, minb, maxb, iso, sid, se), topics, fg, rack, tf)| {
                    FetchRequest {
                        cluster_id: cid,
                        replica_id: rid,
                        replica_state: rs,
                        max_wait_ms: mw,
                        min_bytes: minb,
                        max_bytes: maxb,
                        isolation_level: iso,
                        session_id: sid,
                        session_epoch: se,
                        topics,
                        forgotten_topics_data: fg,
                        rack_id: rack,
                        tagged_fields: tf,
                    }
                },
            )
    }

    fn normalize_request(mut r: FetchRequest, v: i16) -> FetchRequest {
        let flexible = v >= 12;
        let d = FetchRequest::default();
        if v < 12 {
            r.cluster_id = None;
        }
        if v > 14 {
            r.replica_id = d.replica_id;
        }
        if v < 15 {
            r.replica_state = None;
        }
        if v < 7 {
            r.session_id = d.session_id;
            r.session_epoch = d.session_epoch;
            r.forgotten_topics_data.clear();
        }
        if v < 11 {
            r.rack_id.clear();
        }
        for t in &mut r.topics {
            if v >= 13 {
                t.topic.clear();
            } else {
                t.topic_id = [0; 16];
            }
            for p in &mut t.partitions {
                if v < 9 {
                    p.current_leader_epoch = -1;
                }
                if v < 12 {
                    p.last_fetched_epoch = -1;
                }
                if v < 5 {
                    p.log_start_offset = -1;
                }
                if v < 17 {
                    p.replica_directory_id = None;
                }
                if v < 18 {
                    p.high_watermark = None;
                }
                if !flexible {
                    p.tagged_fields = TaggedFields::new();
                }
            }
            if !flexible {
                t.tagged_fields = TaggedFields::new();
            }
        }
        for f in &mut r.forgotten_topics_data {
            if v >= 13 {
                f.topic.clear();
            } else {
                f.topic_id = [0; 16];
            }
            if !flexible {
                f.tagged_fields = TaggedFields::new();
            }
        }
        if !flexible {
            r.tagged_fields = TaggedFields::new();
        }
        r
    }

    fn response() -> impl Strategy<Value = FetchResponse> {
        let aborted =
            (any::<i64>(), any::<i64>(), tagged()).prop_map(|(p, f, tf)| AbortedTransaction {
                producer_id: p,
                first_offset: f,
                tagged_fields: tf,
            });
        let diverging =
            (any::<i32>(), any::<i64>(), tagged()).prop_map(|(e, o, tf)| EpochEndOffset {
                epoch: e,
                end_offset: o,
                tagged_fields: tf,
            });
        let snapshot = (any::<i64>(), any::<i32>(), tagged()).prop_map(|(o, e, tf)| SnapshotId {
            end_offset: o,
            epoch: e,
            tagged_fields: tf,
        });
        let partition = (
            any::<(i32, i16, i64, i64, i64, i32)>(),
            prop::option::of(diverging),
            prop::option::of(leader()),
            prop::option::of(snapshot),
            prop::option::of(vec(aborted, 3)),
            opt_bytes(),
            tagged(),
        )
            .prop_map(|((i, e, hw, lso, lst, prr), de, cl, si, ab, rec, tf)| {
                FetchPartitionData {
                    partition_index: i,
                    error_code: e,
                    high_watermark: hw,
                    last_stable_offset: lso,
                    log_start_offset: lst,
                    diverging_epoch: de,
                    current_leader: cl,
                    snapshot_id: si,
                    aborted_transactions: ab,
                    preferred_read_replica: prr,
                    records: rec,
                    tagged_fields: tf,
                }
            });
        let topic = (string(), any::<[u8; 16]>(), vec(partition, 3), tagged()).prop_map(
            |(topic, id, partitions, tf)| FetchableTopicResponse {
                topic,
                topic_id: id,
                partitions,
                tagged_fields: tf,
            },
        );
        (
            any::<(i32, i16, i32)>(),
            vec(topic, 3),
            endpoints(),
            tagged(),
        )
            .prop_map(|((th, e, sid), responses, ne, tf)| FetchResponse {
                throttle_time_ms: th,
                error_code: e,
                session_id: sid,
                responses,
                node_endpoints: ne,
                tagged_fields: tf,
            })
    }

    fn normalize_response(mut r: FetchResponse, v: i16) -> FetchResponse {
        let flexible = v >= 12;
        if v < 7 {
            r.error_code = 0;
            r.session_id = 0;
        }
        if v < 16 {
            r.node_endpoints = None;
        }
        for t in &mut r.responses {
            if v >= 13 {
                t.topic.clear();
            } else {
                t.topic_id = [0; 16];
            }
            for p in &mut t.partitions {
                if v < 5 {
                    p.log_start_offset = -1;
                }
                if v < 11 {
                    p.preferred_read_replica = -1;
                }
                if !flexible {
                    p.diverging_epoch = None;
                    p.current_leader = None;
                    p.snapshot_id = None;
                    p.tagged_fields = TaggedFields::new();
                    for a in p.aborted_transactions.iter_mut().flatten() {
                        a.tagged_fields = TaggedFields::new();
                    }
                }
            }
            if !flexible {
                t.tagged_fields = TaggedFields::new();
            }
        }
        if !flexible {
            r.tagged_fields = TaggedFields::new();
        }
        r
    }

    proptest! {
        #[test]
        fn request_roundtrip(r in request()) {
            for v in VERSIONS {
                roundtrip(&normalize_request(r.clone(), v), v)?;
            }
        }

        #[test]
        fn response_roundtrip(r in response()) {
            for v in VERSIONS {
                roundtrip(&normalize_response(r.clone(), v), v)?;
            }
        }

        #[test]
        fn arbitrary_bytes_never_panic(data: Vec<u8>) {
            no_panic::<FetchRequest>(&data, VERSIONS);
            no_panic::<FetchResponse>(&data, VERSIONS);
        }
    }
}
