//! ListOffsets (key 2): look up offsets by timestamp (or earliest / latest).
//!
//! Versions 1–10 (v0's multi-offset form is not spoken). v2 adds the isolation level and
//! throttle time; v4 the current leader epoch and the returned leader epoch; v6 is
//! flexible; v7 allows `MAX_TIMESTAMP` (-3), v8 `EARLIEST_LOCAL` (-4), v9
//! `LATEST_TIERED` (-5) — changes of meaning only; v10 adds a request timeout.

use bytes::{BufMut, Bytes, BytesMut};

use super::{get_tagged_if, put_tagged_if};
use crate::error::Result;
use crate::protocol::primitives::*;
use crate::protocol::{check_version, ApiKey, Decode, Encode, Request, TaggedFields};

/// ListOffsets request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListOffsetsRequest {
    /// The requesting broker's id, or -1 for a client.
    pub replica_id: i32,
    /// 0 = read uncommitted, 1 = read committed. Added in version 2.
    pub isolation_level: i8,
    /// The topics to look up.
    pub topics: Vec<ListOffsetsTopic>,
    /// How long the broker may wait for a tiered-storage lookup, in ms. Added in
    /// version 10.
    pub timeout_ms: i32,
    /// Unknown tagged fields. Flexible versions only.
    pub tagged_fields: TaggedFields,
}

impl Default for ListOffsetsRequest {
    fn default() -> Self {
        ListOffsetsRequest {
            replica_id: -1,
            isolation_level: 0,
            topics: Vec::new(),
            timeout_ms: 0,
            tagged_fields: TaggedFields::new(),
        }
    }
}

/// A topic in a [`ListOffsetsRequest`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListOffsetsTopic {
    /// The topic name.
    pub name: String,
    /// The partitions to look up.
    pub partitions: Vec<ListOffsetsPartition>,
    /// Unknown tagged fields. Flexible versions only.
    pub tagged_fields: TaggedFields,
}

/// A partition in a [`ListOffsetsTopic`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListOffsetsPartition {
    /// The partition index.
    pub partition_index: i32,
    /// The current leader epoch, for fencing. Added in version 4; default -1.
    pub current_leader_epoch: i32,
    /// The target timestamp, or -1 (latest), -2 (earliest), -3 (max timestamp), …
    pub timestamp: i64,
    /// Unknown tagged fields. Flexible versions only.
    pub tagged_fields: TaggedFields,
}

impl Default for ListOffsetsPartition {
    fn default() -> Self {
        ListOffsetsPartition {
            partition_index: 0,
            current_leader_epoch: -1,
            timestamp: 0,
            tagged_fields: TaggedFields::new(),
        }
    }
}

impl Request for ListOffsetsRequest {
    const API_KEY: ApiKey = ApiKey::LIST_OFFSETS;
    const MIN_VERSION: i16 = 1;
    const MAX_VERSION: i16 = 10;
    const FIRST_FLEXIBLE: i16 = 6;
    type Response = ListOffsetsResponse;
}

impl Encode for ListOffsetsRequest {
    fn encode(&self, buf: &mut BytesMut, version: i16) -> Result<()> {
        check_version::<Self>(version)?;
        let flexible = version >= 6;
        buf.put_i32(self.replica_id);
        if version >= 2 {
            buf.put_i8(self.isolation_level);
        }
        put_array(buf, &self.topics, flexible, |buf, t| {
            put_string(buf, &t.name, flexible)?;
            put_array(buf, &t.partitions, flexible, |buf, p| {
                buf.put_i32(p.partition_index);
                if version >= 4 {
                    buf.put_i32(p.current_leader_epoch);
                }
                buf.put_i64(p.timestamp);
                put_tagged_if(buf, flexible, &p.tagged_fields)
            })?;
            put_tagged_if(buf, flexible, &t.tagged_fields)
        })?;
        if version >= 10 {
            buf.put_i32(self.timeout_ms);
        }
        put_tagged_if(buf, flexible, &self.tagged_fields)
    }
}

impl Decode for ListOffsetsRequest {
    fn decode(buf: &mut Bytes, version: i16) -> Result<Self> {
        check_version::<Self>(version)?;
        let flexible = version >= 6;
        let mut req = ListOffsetsRequest {
            replica_id: get_i32(buf)?,
            ..ListOffsetsRequest::default()
        };
        if version >= 2 {
            req.isolation_level = get_i8(buf)?;
        }
        req.topics = get_array(buf, flexible, if flexible { 3 } else { 6 }, |buf| {
            Ok(ListOffsetsTopic {
                name: get_string(buf, flexible)?,
                partitions: get_array(buf, flexible, 12, |buf| {
                    let partition_index = get_i32(buf)?;
                    let current_leader_epoch = if version >= 4 { get_i32(buf)? } else { -1 };
                    Ok(ListOffsetsPartition {
                        partition_index,
                        current_leader_epoch,
                        timestamp: get_i64(buf)?,
                        tagged_fields: get_tagged_if(buf, flexible)?,
                    })
                })?,
                tagged_fields: get_tagged_if(buf, flexible)?,
            })
        })?;
        if version >= 10 {
            req.timeout_ms = get_i32(buf)?;
        }
        req.tagged_fields = get_tagged_if(buf, flexible)?;
        Ok(req)
    }
}

/// ListOffsets response.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListOffsetsResponse {
    /// Throttle duration in ms. Added in version 2.
    pub throttle_time_ms: i32,
    /// Per-topic results.
    pub topics: Vec<ListOffsetsTopicResponse>,
    /// Unknown tagged fields. Flexible versions only.
    pub tagged_fields: TaggedFields,
}

/// A topic in a [`ListOffsetsResponse`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListOffsetsTopicResponse {
    /// The topic name.
    pub name: String,
    /// Per-partition results.
    pub partitions: Vec<ListOffsetsPartitionResponse>,
    /// Unknown tagged fields. Flexible versions only.
    pub tagged_fields: TaggedFields,
}

/// A partition in a [`ListOffsetsTopicResponse`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListOffsetsPartitionResponse {
    /// The partition index.
    pub partition_index: i32,
    /// The error code, or 0.
    pub error_code: i16,
    /// The timestamp of the returned offset, or -1.
    pub timestamp: i64,
    /// The returned offset, or -1.
    pub offset: i64,
    /// The leader epoch of the returned offset. Added in version 4; default -1.
    pub leader_epoch: i32,
    /// Unknown tagged fields. Flexible versions only.
    pub tagged_fields: TaggedFields,
}

impl Default for ListOffsetsPartitionResponse {
    fn default() -> Self {
        ListOffsetsPartitionResponse {
            partition_index: 0,
            error_code: 0,
            timestamp: -1,
            offset: -1,
            leader_epoch: -1,
            tagged_fields: TaggedFields::new(),
        }
    }
}

impl Encode for ListOffsetsResponse {
    fn encode(&self, buf: &mut BytesMut, version: i16) -> Result<()> {
        check_version::<ListOffsetsRequest>(version)?;
        let flexible = version >= 6;
        if version >= 2 {
            buf.put_i32(self.throttle_time_ms);
        }
        put_array(buf, &self.topics, flexible, |buf, t| {
            put_string(buf, &t.name, flexible)?;
            put_array(buf, &t.partitions, flexible, |buf, p| {
                buf.put_i32(p.partition_index);
                buf.put_i16(p.error_code);
                buf.put_i64(p.timestamp);
                buf.put_i64(p.offset);
                if version >= 4 {
                    buf.put_i32(p.leader_epoch);
                }
                put_tagged_if(buf, flexible, &p.tagged_fields)
            })?;
            put_tagged_if(buf, flexible, &t.tagged_fields)
        })?;
        put_tagged_if(buf, flexible, &self.tagged_fields)
    }
}

impl Decode for ListOffsetsResponse {
    fn decode(buf: &mut Bytes, version: i16) -> Result<Self> {
        check_version::<ListOffsetsRequest>(version)?;
        let flexible = version >= 6;
        let throttle_time_ms = if version >= 2 { get_i32(buf)? } else { 0 };
        let topics = get_array(buf, flexible, if flexible { 3 } else { 6 }, |buf| {
            Ok(ListOffsetsTopicResponse {
                name: get_string(buf, flexible)?,
                partitions: get_array(buf, flexible, 22, |buf| {
                    Ok(ListOffsetsPartitionResponse {
                        partition_index: get_i32(buf)?,
                        error_code: get_i16(buf)?,
                        timestamp: get_i64(buf)?,
                        offset: get_i64(buf)?,
                        leader_epoch: if version >= 4 { get_i32(buf)? } else { -1 },
                        tagged_fields: get_tagged_if(buf, flexible)?,
                    })
                })?,
                tagged_fields: get_tagged_if(buf, flexible)?,
            })
        })?;
        let tagged_fields = get_tagged_if(buf, flexible)?;
        Ok(ListOffsetsResponse {
            throttle_time_ms,
            topics,
            tagged_fields,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::messages::testutil::*;
    use proptest::prelude::*;

    const VERSIONS: std::ops::RangeInclusive<i16> = 1..=10;

    fn request() -> impl Strategy<Value = ListOffsetsRequest> {
        let partition = (any::<(i32, i32, i64)>(), tagged()).prop_map(|((i, e, ts), tf)| {
            ListOffsetsPartition {
                partition_index: i,
                current_leader_epoch: e,
                timestamp: ts,
                tagged_fields: tf,
            }
        });
        let topic = (string(), vec(partition, 3), tagged()).prop_map(|(name, parts, tf)| {
            ListOffsetsTopic {
                name,
                partitions: parts,
                tagged_fields: tf,
            }
        });
        (any::<(i32, i8, i32)>(), vec(topic, 3), tagged()).prop_map(|((r, iso, to), topics, tf)| {
            ListOffsetsRequest {
                replica_id: r,
                isolation_level: iso,
                topics,
                timeout_ms: to,
                tagged_fields: tf,
            }
        })
    }

    fn normalize_request(mut r: ListOffsetsRequest, v: i16) -> ListOffsetsRequest {
        let flexible = v >= 6;
        if v < 2 {
            r.isolation_level = 0;
        }
        if v < 10 {
            r.timeout_ms = 0;
        }
        for t in &mut r.topics {
            for p in &mut t.partitions {
                if v < 4 {
                    p.current_leader_epoch = -1;
                }
                if !flexible {
                    p.tagged_fields = TaggedFields::new();
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

    fn response() -> impl Strategy<Value = ListOffsetsResponse> {
        let partition =
            (any::<(i32, i16, i64, i64, i32)>(), tagged()).prop_map(|((i, e, ts, o, ep), tf)| {
                ListOffsetsPartitionResponse {
                    partition_index: i,
                    error_code: e,
                    timestamp: ts,
                    offset: o,
                    leader_epoch: ep,
                    tagged_fields: tf,
                }
            });
        let topic = (string(), vec(partition, 3), tagged()).prop_map(|(name, parts, tf)| {
            ListOffsetsTopicResponse {
                name,
                partitions: parts,
                tagged_fields: tf,
            }
        });
        (any::<i32>(), vec(topic, 3), tagged()).prop_map(|(th, topics, tf)| ListOffsetsResponse {
            throttle_time_ms: th,
            topics,
            tagged_fields: tf,
        })
    }

    fn normalize_response(mut r: ListOffsetsResponse, v: i16) -> ListOffsetsResponse {
        let flexible = v >= 6;
        if v < 2 {
            r.throttle_time_ms = 0;
        }
        for t in &mut r.topics {
            for p in &mut t.partitions {
                if v < 4 {
                    p.leader_epoch = -1;
                }
                if !flexible {
                    p.tagged_fields = TaggedFields::new();
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
            no_panic::<ListOffsetsRequest>(&data, VERSIONS);
            no_panic::<ListOffsetsResponse>(&data, VERSIONS);
        }
    }
}
