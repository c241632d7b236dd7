//! Metadata (key 3): brokers, topics, partitions and their leaders.
//!
//! Versions 4–13 (4 is the first with `allow_auto_topic_creation`, Kafka 0.11). v5 adds
//! offline replicas; v7 leader epochs; v8 authorized operations (the cluster-level flag
//! and result exist only in v8–10); v9 is flexible; v10 adds topic ids and makes the
//! requested topic name nullable; v12 makes the response topic name nullable; v13 adds a
//! top-level error code.

use bytes::{BufMut, Bytes, BytesMut};

use super::{get_tagged_if, put_tagged_if};
use crate::error::Result;
use crate::protocol::primitives::*;
use crate::protocol::{check_version, ApiKey, Decode, Encode, Request, TaggedFields};

/// Metadata request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetadataRequest {
    /// The topics to fetch metadata for; `None` means all topics.
    pub topics: Option<Vec<MetadataRequestTopic>>,
    /// Whether the broker may auto-create the requested topics. Default `true`.
    pub allow_auto_topic_creation: bool,
    /// Whether to include cluster authorized operations. Versions 8–10 only.
    pub include_cluster_authorized_operations: bool,
    /// Whether to include topic authorized operations. Added in version 8.
    pub include_topic_authorized_operations: bool,
    /// Unknown tagged fields. Flexible versions only.
    pub tagged_fields: TaggedFields,
}

impl Default for MetadataRequest {
    fn default() -> Self {
        MetadataRequest {
            topics: Some(Vec::new()),
            allow_auto_topic_creation: true,
            include_cluster_authorized_operations: false,
            include_topic_authorized_operations: false,
            tagged_fields: TaggedFields::new(),
        }
    }
}

/// A topic named in a [`MetadataRequest`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MetadataRequestTopic {
    /// The topic id (all zeros when unknown). Added in version 10.
    pub topic_id: [u8; 16],
    /// The topic name; nullable from version 10 (when asking by id).
    pub name: Option<String>,
    /// Unknown tagged fields. Flexible versions only.
    pub tagged_fields: TaggedFields,
}

impl Request for MetadataRequest {
    const API_KEY: ApiKey = ApiKey::METADATA;
    const MIN_VERSION: i16 = 4;
    const MAX_VERSION: i16 = 13;
    const FIRST_FLEXIBLE: i16 = 9;
    type Response = MetadataResponse;
}

impl Encode for MetadataRequest {
    fn encode(&self, buf: &mut BytesMut, version: i16) -> Result<()> {
        check_version::<Self>(version)?;
        let flexible = version >= 9;
        put_nullable_array(buf, self.topics.as_deref(), flexible, |buf, t| {
            if version >= 10 {
                buf.put_slice(&t.topic_id);
            }
            put_nullable_string(buf, t.name.as_deref(), flexible)?;
            put_tagged_if(buf, flexible, &t.tagged_fields)
        })?;
        put_bool(buf, self.allow_auto_topic_creation);
        if (8..=10).contains(&version) {
            put_bool(buf, self.include_cluster_authorized_operations);
        }
        if version >= 8 {
            put_bool(buf, self.include_topic_authorized_operations);
        }
        put_tagged_if(buf, flexible, &self.tagged_fields)
    }
}

impl Decode for MetadataRequest {
    fn decode(buf: &mut Bytes, version: i16) -> Result<Self> {
        check_version::<Self>(version)?;
        let flexible = version >= 9;
        let mut req = MetadataRequest {
            topics: get_nullable_array(buf, flexible, if version >= 10 { 18 } else { 1 }, |buf| {
                Ok(MetadataRequestTopic {
                    topic_id: if version >= 10 {
                        get_uuid(buf)?
                    } else {
                        [0; 16]
                    },
                    name: get_nullable_string(buf, flexible)?,
                    tagged_fields: get_tagged_if(buf, flexible)?,
                })
            })?,
            allow_auto_topic_creation: get_bool(buf)?,
            ..MetadataRequest::default()
        };
        if (8..=10).contains(&version) {
            req.include_cluster_authorized_operations = get_bool(buf)?;
        }
        if version >= 8 {
            req.include_topic_authorized_operations = get_bool(buf)?;
        }
        req.tagged_fields = get_tagged_if(buf, flexible)?;
        Ok(req)
    }
}

/// Metadata response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetadataResponse {
    /// Throttle duration in ms.
    pub throttle_time_ms: i32,
    /// The brokers in the cluster.
    pub brokers: Vec<MetadataBroker>,
    /// The cluster id.
    pub cluster_id: Option<String>,
    /// The controller's broker id, or -1.
    pub controller_id: i32,
    /// Per-topic metadata.
    pub topics: Vec<MetadataTopic>,
    /// Cluster authorized operations bit field. Versions 8–10 only; default `i32::MIN`.
    pub cluster_authorized_operations: i32,
    /// The top-level error code. Added in version 13.
    pub error_code: i16,
    /// Unknown tagged fields. Flexible versions only.
    pub tagged_fields: TaggedFields,
}

impl Default for MetadataResponse {
    fn default() -> Self {
        MetadataResponse {
            throttle_time_ms: 0,
            brokers: Vec::new(),
            cluster_id: None,
            controller_id: -1,
            topics: Vec::new(),
            cluster_authorized_operations: i32::MIN,
            error_code: 0,
            tagged_fields: TaggedFields::new(),
        }
    }
}

/// A broker in a [`MetadataResponse`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MetadataBroker {
    /// The broker id.
    pub node_id: i32,
    /// The broker's host name.
    pub host: String,
    /// The broker's port.
    pub port: i32,
    /// The broker's rack, if any.
    pub rack: Option<String>,
    /// Unknown tagged fields. Flexible versions only.
    pub tagged_fields: TaggedFields,
}

/// A topic in a [`MetadataResponse`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetadataTopic {
    /// The topic error code.
    pub error_code: i16,
    /// The topic name; nullable from version 12.
    pub name: Option<String>,
    /// The topic id (all zeros when unknown). Added in version 10.
    pub topic_id: [u8; 16],
    /// Whether the topic is internal.
    pub is_internal: bool,
    /// Per-partition metadata.
    pub partitions: Vec<MetadataPartition>,
    /// Topic authorized operations bit field. Added in version 8; default `i32::MIN`.
    pub topic_authorized_operations: i32,
    /// Unknown tagged fields. Flexible versions only.
    pub tagged_fields: TaggedFields,
}

impl Default for MetadataTopic {
    fn default() -> Self {
        MetadataTopic {
            error_code: 0,
            name: Some(String::new()),
            topic_id: [0; 16],
            is_internal: false,
            partitions: Vec::new(),
            topic_authorized_operations: i32::MIN,
            tagged_fields: TaggedFields::new(),
        }
    }
}

/// A partition in a [`MetadataTopic`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetadataPartition {
    /// The partition error code.
    pub error_code: i16,
    /// The partition index.
    pub partition_index: i32,
    /// The leader's broker id, or -1.
    pub leader_id: i32,
    /// The leader epoch. Added in version 7; default -1.
    pub leader_epoch: i32,
    /// The replicas' broker ids.
    pub replica_nodes: Vec<i32>,
    /// The in-sync replicas' broker ids.
    pub isr_nodes: Vec<i32>,
    /// The offline replicas' broker ids. Added in version 5.
    pub offline_replicas: Vec<i32>,
    /// Unknown tagged fields. Flexible versions only.
    pub tagged_fields: TaggedFields,
}

impl Default for MetadataPartition {
    fn default() -> Self {
        MetadataPartition {
            error_code: 0,
            partition_index: 0,
            leader_id: -1,
            leader_epoch: -1,
            replica_nodes: Vec::new(),
            isr_nodes: Vec::new(),
            offline_replicas: Vec::new(),
            tagged_fields: TaggedFields::new(),
        }
    }
}

fn put_i32s(buf: &mut BytesMut, v: &[i32], flexible: bool) -> Result<()> {
    put_array(buf, v, flexible, |buf, x| {
        buf.put_i32(*x);
        Ok(())
    })
}

impl Encode for MetadataResponse {
    fn encode(&self, buf: &mut BytesMut, version: i16) -> Result<()> {
        check_version::<MetadataRequest>(version)?;
        let flexible = version >= 9;
        buf.put_i32(self.throttle_time_ms);
        put_array(buf, &self.brokers, flexible, |buf, b| {
            buf.put_i32(b.node_id);
            put_string(buf, &b.host, flexible)?;
            buf.put_i32(b.port);
            put_nullable_string(buf, b.rack.as_deref(), flexible)?;
            put_tagged_if(buf, flexible, &b.tagged_fields)
        })?;
        put_nullable_string(buf, self.cluster_id.as_deref(), flexible)?;
        buf.put_i32(self.controller_id);
        put_array(buf, &self.topics, flexible, |buf, t| {
            buf.put_i16(t.error_code);
            put_nullable_string(buf, t.name.as_deref(), flexible)?;
            if version >= 10 {
                buf.put_slice(&t.topic_id);
            }
            put_bool(buf, t.is_internal);
            put_array(buf, &t.partitions, flexible, |buf, p| {
                buf.put_i16(p.error_code);
                buf.put_i32(p.partition_index);
                buf.put_i32(p.leader_id);
                if version >= 7 {
                    buf.put_i32(p.leader_epoch);
                }
                put_i32s(buf, &p.replica_nodes, flexible)?;
                put_i32s(buf, &p.isr_nodes, flexible)?;
                if version >= 5 {
                    put_i32s(buf, &p.offline_replicas, flexible)?;
                }
                put_tagged_if(buf, flexible, &p.tagged_fields)
            })?;
            if version >= 8 {
                buf.put_i32(t.topic_authorized_operations);
            }
            put_tagged_if(buf, flexible, &t.tagged_fields)
        })?;
        if (8..=10).contains(&version) {
            buf.put_i32(self.cluster_authorized_operations);
        }
        if version >= 13 {
            buf.put_i16(self.error_code);
        }
        put_tagged_if(buf, flexible, &self.tagged_fields)
    }
}

impl Decode for MetadataResponse {
    fn decode(buf: &mut Bytes, version: i16) -> Result<Self> {
        check_version::<MetadataRequest>(version)?;
        let flexible = version >= 9;
        let mut resp = MetadataResponse {
            throttle_time_ms: get_i32(buf)?,
            ..MetadataResponse::default()
        };
        resp.brokers = get_array(buf, flexible, 10, |buf| {
            Ok(MetadataBroker {
                node_id: get_i32(buf)?,
                host: get_string(buf, flexible)?,
                port: get_i32(buf)?,
                rack: get_nullable_string(buf, flexible)?,
                tagged_fields: get_tagged_if(buf, flexible)?,
            })
        })?;
        resp.cluster_id = get_nullable_string(buf, flexible)?;
        resp.controller_id = get_i32(buf)?;
        resp.topics = get_array(buf, flexible, 8, |buf| {
            let mut t = MetadataTopic {
                error_code: get_i16(buf)?,
                name: get_nullable_string(buf, flexible)?,
                ..MetadataTopic::default()
            };
            if version >= 10 {
                t.topic_id = get_uuid(buf)?;
            }
            t.is_internal = get_bool(buf)?;
            t.partitions = get_array(buf, flexible, 12, |buf| {
                let mut p = MetadataPartition {
                    error_code: get_i16(buf)?,
                    partition_index: get_i32(buf)?,
                    leader_id: get_i32(buf)?,
                    ..MetadataPartition::default()
                };
                if version >= 7 {
                    p.leader_epoch = get_i32(buf)?;
                }
                p.replica_nodes = get_array(buf, flexible, 4, get_i32)?;
                p.isr_nodes = get_array(buf, flexible, 4, get_i32)?;
                if version >= 5 {
                    p.offline_replicas = get_array(buf, flexible, 4, get_i32)?;
                }
                p.tagged_fields = get_tagged_if(buf, flexible)?;
                Ok(p)
            })?;
            if version >= 8 {
                t.topic_authorized_operations = get_i32(buf)?;
            }
            t.tagged_fields = get_tagged_if(buf, flexible)?;
            Ok(t)
        })?;
        if (8..=10).contains(&version) {
            resp.cluster_authorized_operations = get_i32(buf)?;
        }
        if version >= 13 {
            resp.error_code = get_i16(buf)?;
        }
        resp.tagged_fields = get_tagged_if(buf, flexible)?;
        Ok(resp)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::messages::testutil::*;
    use proptest::prelude::*;

    const VERSIONS: std::ops::RangeInclusive<i16> = 4..=13;

    fn request() -> impl Strategy<Value = MetadataRequest> {
        let topic = (any::<[u8; 16]>(), opt_string(), tagged()).prop_map(|(id, name, tf)| {
            MetadataRequestTopic {
                topic_id: id,
                name,
                tagged_fields: tf,
            }
        });
        (
            prop::option::of(vec(topic, 4)),
            any::<bool>(),
            any::<bool>(),
            any::<bool>(),
            tagged(),
        )
            .prop_map(|(topics, a, c, t, tf)| MetadataRequest {
                topics,
                allow_auto_topic_creation: a,
                include_cluster_authorized_operations: c,
                include_topic_authorized_operations: t,
                tagged_fields: tf,
            })
    }

    fn normalize_request(mut r: MetadataRequest, v: i16) -> MetadataRequest {
        let flexible = v >= 9;
        for t in r.topics.iter_mut().flatten() {
            if v < 10 {
                t.topic_id = [0; 16];
            }
            if !flexible {
                t.tagged_fields = TaggedFields::new();
            }
        }
        if !(8..=10).contains(&v) {
            r.include_cluster_authorized_operations = false;
        }
        if v < 8 {
            r.include_topic_authorized_operations = false;
        }
        if !flexible {
            r.tagged_fields = TaggedFields::new();
        }
        r
    }

    fn response() -> impl Strategy<Value = MetadataResponse> {
        let broker = (any::<i32>(), string(), any::<i32>(), opt_string(), tagged()).prop_map(
            |(node_id, host, port, rack, tf)| MetadataBroker {
                node_id,
                host,
                port,
                rack,
                tagged_fields: tf,
            },
        );
        let partition = (
            any::<(i16, i32, i32, i32)>(),
            vec(any::<i32>(), 4),
            vec(any::<i32>(), 4),
            vec(any::<i32>(), 4),
            tagged(),
        )
            .prop_map(|((e, i, l, ep), r, isr, off, tf)| MetadataPartition {
                error_code: e,
                partition_index: i,
                leader_id: l,
                leader_epoch: ep,
                replica_nodes: r,
                isr_nodes: isr,
                offline_replicas: off,
                tagged_fields: tf,
            });
        let topic = (
            any::<i16>(),
            opt_string(),
            any::<[u8; 16]>(),
            any::<bool>(),
            vec(partition, 3),
            any::<i32>(),
            tagged(),
        )
            .prop_map(|(e, name, id, internal, parts, ops, tf)| MetadataTopic {
                error_code: e,
                name,
                topic_id: id,
                is_internal: internal,
                partitions: parts,
                topic_authorized_operations: ops,
                tagged_fields: tf,
            });
        (
            any::<i32>(),
            vec(broker, 3),
            opt_string(),
            any::<i32>(),
            vec(topic, 3),
            any::<i32>(),
            any::<i16>(),
            tagged(),
        )
            .prop_map(
                |(th, brokers, cid, ctl, topics, ops, e, tf)| MetadataResponse {
                    throttle_time_ms: th,
                    brokers,
                    cluster_id: cid,
                    controller_id: ctl,
                    topics,
                    cluster_authorized_operations: ops,
                    error_code: e,
                    tagged_fields: tf,
                },
            )
    }

    fn normalize_response(mut r: MetadataResponse, v: i16) -> MetadataResponse {
        let flexible = v >= 9;
        let d = MetadataResponse::default();
        for b in &mut r.brokers {
            if !flexible {
                b.tagged_fields = TaggedFields::new();
            }
        }
        for t in &mut r.topics {
            if v < 10 {
                t.topic_id = [0; 16];
            }
            if v < 8 {
                t.topic_authorized_operations = i32::MIN;
            }
            for p in &mut t.partitions {
                if v < 7 {
                    p.leader_epoch = -1;
                }
                if v < 5 {
                    p.offline_replicas.clear();
                }
                if !flexible {
                    p.tagged_fields = TaggedFields::new();
                }
            }
            if !flexible {
                t.tagged_fields = TaggedFields::new();
            }
        }
        if !(8..=10).contains(&v) {
            r.cluster_authorized_operations = d.cluster_authorized_operations;
        }
        if v < 13 {
            r.error_code = 0;
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
            no_panic::<MetadataRequest>(&data, VERSIONS);
            no_panic::<MetadataResponse>(&data, VERSIONS);
        }
    }

    #[test]
    fn out_of_range_versions_are_rejected() {
        let mut b = BytesMut::new();
        assert!(MetadataRequest::default().encode(&mut b, 3).is_err());
        assert!(MetadataRequest::default().encode(&mut b, 14).is_err());
    }
}
