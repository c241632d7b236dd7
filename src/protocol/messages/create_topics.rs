//! CreateTopics (key 19): create topics with a partition count and replication factor
//! or an explicit replica assignment, plus configs.
//!
//! Versions 2–7. v4 allows -1 (broker default) partitions / replication factor; v5 is
//! flexible and returns partition count, replication factor and configs, plus the
//! `topic_config_error_code` tagged field (tag 0); v7 returns topic ids.

use bytes::{BufMut, Bytes, BytesMut};

use super::{get_tagged_if, put_tagged_if, tagged_value};
use crate::error::Result;
use crate::protocol::primitives::*;
use crate::protocol::{check_version, ApiKey, Decode, Encode, Request, TaggedFields};

/// CreateTopics request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CreateTopicsRequest {
    /// The topics to create.
    pub topics: Vec<CreatableTopic>,
    /// How long to wait for creation, in ms.
    pub timeout_ms: i32,
    /// Only validate the request, do not create.
    pub validate_only: bool,
    /// Unknown tagged fields. Flexible versions only.
    pub tagged_fields: TaggedFields,
}

/// A topic to create.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CreatableTopic {
    /// The topic name.
    pub name: String,
    /// The number of partitions, or -1 (with assignments, or for the broker default).
    pub num_partitions: i32,
    /// The replication factor, or -1 (with assignments, or for the broker default).
    pub replication_factor: i16,
    /// Explicit replica assignments, if any.
    pub assignments: Vec<CreatableReplicaAssignment>,
    /// Topic configs.
    pub configs: Vec<CreatableTopicConfig>,
    /// Unknown tagged fields. Flexible versions only.
    pub tagged_fields: TaggedFields,
}

/// The replicas of one partition of a [`CreatableTopic`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CreatableReplicaAssignment {
    /// The partition index.
    pub partition_index: i32,
    /// The brokers to place the replicas on.
    pub broker_ids: Vec<i32>,
    /// Unknown tagged fields. Flexible versions only.
    pub tagged_fields: TaggedFields,
}

/// A config of a [`CreatableTopic`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CreatableTopicConfig {
    /// The config name.
    pub name: String,
    /// The config value.
    pub value: Option<String>,
    /// Unknown tagged fields. Flexible versions only.
    pub tagged_fields: TaggedFields,
}

impl Request for CreateTopicsRequest {
    const API_KEY: ApiKey = ApiKey::CREATE_TOPICS;
    const MIN_VERSION: i16 = 2;
    const MAX_VERSION: i16 = 7;
    const FIRST_FLEXIBLE: i16 = 5;
    type Response = CreateTopicsResponse;
}

impl Encode for CreateTopicsRequest {
    fn encode(&self, buf: &mut BytesMut, version: i16) -> Result<()> {
        check_version::<Self>(version)?;
        let flexible = version >= 5;
        put_array(buf, &self.topics, flexible, |buf, t| {
            put_string(buf, &t.name, flexible)?;
            buf.put_i32(t.num_partitions);
            buf.put_i16(t.replication_factor);
            put_array(buf, &t.assignments, flexible, |buf, a| {
                buf.put_i32(a.partition_index);
                put_array(buf, &a.broker_ids, flexible, |buf, b| {
                    buf.put_i32(*b);
                    Ok(())
                })?;
                put_tagged_if(buf, flexible, &a.tagged_fields)
            })?;
            put_array(buf, &t.configs, flexible, |buf, c| {
                put_string(buf, &c.name, flexible)?;
                put_nullable_string(buf, c.value.as_deref(), flexible)?;
                put_tagged_if(buf, flexible, &c.tagged_fields)
            })?;
            put_tagged_if(buf, flexible, &t.tagged_fields)
        })?;
        buf.put_i32(self.timeout_ms);
        put_bool(buf, self.validate_only);
        put_tagged_if(buf, flexible, &self.tagged_fields)
    }
}

impl Decode for CreateTopicsRequest {
    fn decode(buf: &mut Bytes, version: i16) -> Result<Self> {
        check_version::<Self>(version)?;
        let flexible = version >= 5;
        let topics = get_array(buf, flexible, 9, |buf| {
            Ok(CreatableTopic {
                name: get_string(buf, flexible)?,
                num_partitions: get_i32(buf)?,
                replication_factor: get_i16(buf)?,
                assignments: get_array(buf, flexible, 5, |buf| {
                    Ok(CreatableReplicaAssignment {
                        partition_index: get_i32(buf)?,
                        broker_ids: get_array(buf, flexible, 4, get_i32)?,
                        tagged_fields: get_tagged_if(buf, flexible)?,
                    })
                })?,
                configs: get_array(buf, flexible, 2, |buf| {
                    Ok(CreatableTopicConfig {
                        name: get_string(buf, flexible)?,
                        value: get_nullable_string(buf, flexible)?,
                        tagged_fields: get_tagged_if(buf, flexible)?,
                    })
                })?,
                tagged_fields: get_tagged_if(buf, flexible)?,
            })
        })?;
        let timeout_ms = get_i32(buf)?;
        let validate_only = get_bool(buf)?;
        let tagged_fields = get_tagged_if(buf, flexible)?;
        Ok(CreateTopicsRequest {
            topics,
            timeout_ms,
            validate_only,
            tagged_fields,
        })
    }
}

/// CreateTopics response.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CreateTopicsResponse {
    /// Throttle duration in ms.
    pub throttle_time_ms: i32,
    /// Per-topic results.
    pub topics: Vec<CreatableTopicResult>,
    /// Unknown tagged fields. Flexible versions only.
    pub tagged_fields: TaggedFields,
}

/// One topic's result in a [`CreateTopicsResponse`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreatableTopicResult {
    /// The topic name.
    pub name: String,
    /// The topic id. Added in version 7.
    pub topic_id: [u8; 16],
    /// The error code, or 0.
    pub error_code: i16,
    /// The error message.
    pub error_message: Option<String>,
    /// Why the configs could not be returned (tag 0). Added in version 5; `None` when
    /// absent.
    pub topic_config_error_code: Option<i16>,
    /// The number of partitions. Added in version 5; default -1.
    pub num_partitions: i32,
    /// The replication factor. Added in version 5; default -1.
    pub replication_factor: i16,
    /// The topic's configs. Added in version 5; `None` when absent or null.
    pub configs: Option<Vec<CreatableTopicConfigs>>,
    /// Unknown tagged fields. Flexible versions only.
    pub tagged_fields: TaggedFields,
}

impl Default for CreatableTopicResult {
    fn default() -> Self {
        CreatableTopicResult {
            name: String::new(),
            topic_id: [0; 16],
            error_code: 0,
            error_message: None,
            topic_config_error_code: None,
            num_partitions: -1,
            replication_factor: -1,
            configs: None,
            tagged_fields: TaggedFields::new(),
        }
    }
}

/// A config of a created topic. Added in version 5.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreatableTopicConfigs {
    /// The config name.
    pub name: String,
    /// The config value.
    pub value: Option<String>,
    /// Whether the config is read-only.
    pub read_only: bool,
    /// The config source, or -1.
    pub config_source: i8,
    /// Whether the config is sensitive.
    pub is_sensitive: bool,
    /// Unknown tagged fields.
    pub tagged_fields: TaggedFields,
}

impl Default for CreatableTopicConfigs {
    fn default() -> Self {
        CreatableTopicConfigs {
            name: String::new(),
            value: None,
            read_only: false,
            config_source: -1,
            is_sensitive: false,
            tagged_fields: TaggedFields::new(),
        }
    }
}

impl Encode for CreateTopicsResponse {
    fn encode(&self, buf: &mut BytesMut, version: i16) -> Result<()> {
        check_version::<CreateTopicsRequest>(version)?;
        let flexible = version >= 5;
        buf.put_i32(self.throttle_time_ms);
        put_array(buf, &self.topics, flexible, |buf, t| {
            put_string(buf, &t.name, flexible)?;
            if version >= 7 {
                buf.put_slice(&t.topic_id);
            }
            buf.put_i16(t.error_code);
            put_nullable_string(buf, t.error_message.as_deref(), flexible)?;
            if flexible {
                buf.put_i32(t.num_partitions);
                buf.put_i16(t.replication_factor);
                put_nullable_array(buf, t.configs.as_deref(), true, |buf, c| {
                    put_string(buf, &c.name, true)?;
                    put_nullable_string(buf, c.value.as_deref(), true)?;
                    put_bool(buf, c.read_only);
                    buf.put_i8(c.config_source);
                    put_bool(buf, c.is_sensitive);
                    put_tagged_fields(buf, &[], &c.tagged_fields)
                })?;
                let mut known = Vec::new();
                if let Some(code) = t.topic_config_error_code {
                    known.push((
                        0,
                        tagged_value(|b| {
                            b.put_i16(code);
                            Ok(())
                        })?,
                    ));
                }
                put_tagged_fields(buf, &known, &t.tagged_fields)?;
            }
            Ok(())
        })?;
        put_tagged_if(buf, flexible, &self.tagged_fields)
    }
}

impl Decode for CreateTopicsResponse {
    fn decode(buf: &mut Bytes, version: i16) -> Result<Self> {
        check_version::<CreateTopicsRequest>(version)?;
        let flexible = version >= 5;
        let throttle_time_ms = get_i32(buf)?;
        let topics = get_array(buf, flexible, 4, |buf| {
            let mut t = CreatableTopicResult {
                name: get_string(buf, flexible)?,
                ..CreatableTopicResult::default()
            };
            if version >= 7 {
                t.topic_id = get_uuid(buf)?;
            }
            t.error_code = get_i16(buf)?;
            t.error_message = get_nullable_string(buf, flexible)?;
            if flexible {
                t.num_partitions = get_i32(buf)?;
                t.replication_factor = get_i16(buf)?;
                t.configs = get_nullable_array(buf, true, 6, |buf| {
                    Ok(CreatableTopicConfigs {
                        name: get_string(buf, true)?,
                        value: get_nullable_string(buf, true)?,
                        read_only: get_bool(buf)?,
                        config_source: get_i8(buf)?,
                        is_sensitive: get_bool(buf)?,
                        tagged_fields: get_tagged_fields(buf)?,
                    })
                })?;
                let mut code = None;
                t.tagged_fields = get_tagged_fields_with(buf, |tag, v| {
                    if tag == 0 {
                        code = super::parse_tagged(v, get_i16);
                        return Ok(code.is_some());
                    }
                    Ok(false)
                })?;
                t.topic_config_error_code = code;
            }
            Ok(t)
        })?;
        let tagged_fields = get_tagged_if(buf, flexible)?;
        Ok(CreateTopicsResponse {
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

    const VERSIONS: std::ops::RangeInclusive<i16> = 2..=7;

    fn request() -> impl Strategy<Value = CreateTopicsRequest> {
        let assignment = (any::<i32>(), vec(any::<i32>(), 4), tagged()).prop_map(|(p, b, tf)| {
            CreatableReplicaAssignment {
                partition_index: p,
                broker_ids: b,
                tagged_fields: tf,
            }
        });
        let config =
            (string(), opt_string(), tagged()).prop_map(|(name, value, tf)| CreatableTopicConfig {
                name,
                value,
                tagged_fields: tf,
            });
        let topic = (
            string(),
            any::<i32>(),
            any::<i16>(),
            vec(assignment, 3),
            vec(config, 3),
            tagged(),
        )
            .prop_map(|(name, n, r, a, c, tf)| CreatableTopic {
                name,
                num_partitions: n,
                replication_factor: r,
                assignments: a,
                configs: c,
                tagged_fields: tf,
            });
        (vec(topic, 3), any::<i32>(), any::<bool>(), tagged()).prop_map(
            |(topics, timeout_ms, validate_only, tf)| CreateTopicsRequest {
                topics,
                timeout_ms,
                validate_only,
                tagged_fields: tf,
            },
        )
    }

    fn normalize_request(mut r: CreateTopicsRequest, v: i16) -> CreateTopicsRequest {
        if v < 5 {
            for t in &mut r.topics {
                t.assignments
                    .iter_mut()
                    .for_each(|a| a.tagged_fields = TaggedFields::new());
                t.configs
                    .iter_mut()
                    .for_each(|c| c.tagged_fields = TaggedFields::new());
                t.tagged_fields = TaggedFields::new();
            }
            r.tagged_fields = TaggedFields::new();
        }
        r
    }

    fn response() -> impl Strategy<Value = CreateTopicsResponse> {
        let config = (string(), opt_string(), any::<(bool, i8, bool)>(), tagged()).prop_map(
            |(name, value, (ro, src, sens), tf)| CreatableTopicConfigs {
                name,
                value,
                read_only: ro,
                config_source: src,
                is_sensitive: sens,
                tagged_fields: tf,
            },
        );
        let result = (
            string(),
            any::<[u8; 16]>(),
            any::<i16>(),
            opt_string(),
            prop::option::of(any::<i16>()),
            any::<(i32, i16)>(),
            prop::option::of(vec(config, 3)),
            tagged(),
        )
            .prop_map(
                |(name, id, e, m, ce, (n, rf), configs, tf)| CreatableTopicResult {
                    name,
                    topic_id: id,
                    error_code: e,
                    error_message: m,
                    topic_config_error_code: ce,
                    num_partitions: n,
                    replication_factor: rf,
                    configs,
                    tagged_fields: tf,
                },
            );
        (any::<i32>(), vec(result, 3), tagged()).prop_map(|(th, topics, tf)| CreateTopicsResponse {
            throttle_time_ms: th,
            topics,
            tagged_fields: tf,
        })
    }

    fn normalize_response(mut r: CreateTopicsResponse, v: i16) -> CreateTopicsResponse {
        for t in &mut r.topics {
            if v < 7 {
                t.topic_id = [0; 16];
            }
            if v < 5 {
                let d = CreatableTopicResult::default();
                t.topic_config_error_code = None;
                t.num_partitions = d.num_partitions;
                t.replication_factor = d.replication_factor;
                t.configs = None;
                t.tagged_fields = TaggedFields::new();
            }
        }
        if v < 5 {
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
            no_panic::<CreateTopicsRequest>(&data, VERSIONS);
            no_panic::<CreateTopicsResponse>(&data, VERSIONS);
        }
    }
}
