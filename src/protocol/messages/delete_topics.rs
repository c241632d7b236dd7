//! DeleteTopics (key 20): delete topics by name (or, from version 6, by id).
//!
//! Versions 1–6. v4 is flexible; v5 adds a per-topic error message; v6 replaces the list
//! of names with [`DeleteTopicState`]s (name or id) and returns topic ids, with a
//! nullable name.

use bytes::{BufMut, Bytes, BytesMut};

use super::{get_tagged_if, put_tagged_if};
use crate::error::Result;
use crate::protocol::primitives::*;
use crate::protocol::{check_version, ApiKey, Decode, Encode, Request, TaggedFields};

/// DeleteTopics request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeleteTopicsRequest {
    /// The topics to delete, by name or id. Added in version 6.
    pub topics: Vec<DeleteTopicState>,
    /// The names of the topics to delete. Versions 1–5.
    pub topic_names: Vec<String>,
    /// How long to wait for the deletion to complete, in ms.
    pub timeout_ms: i32,
    /// Unknown tagged fields. Flexible versions only.
    pub tagged_fields: TaggedFields,
}

/// A topic to delete, by name or id. Added in version 6.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeleteTopicState {
    /// The topic name, or `None` to delete by id.
    pub name: Option<String>,
    /// The topic id, or all zeros to delete by name.
    pub topic_id: [u8; 16],
    /// Unknown tagged fields.
    pub tagged_fields: TaggedFields,
}

impl Request for DeleteTopicsRequest {
    const API_KEY: ApiKey = ApiKey::DELETE_TOPICS;
    const MIN_VERSION: i16 = 1;
    const MAX_VERSION: i16 = 6;
    const FIRST_FLEXIBLE: i16 = 4;
    type Response = DeleteTopicsResponse;
}

impl Encode for DeleteTopicsRequest {
    fn encode(&self, buf: &mut BytesMut, version: i16) -> Result<()> {
        check_version::<Self>(version)?;
        let flexible = version >= 4;
        if version >= 6 {
            put_array(buf, &self.topics, true, |buf, t| {
                put_nullable_string(buf, t.name.as_deref(), true)?;
                buf.put_slice(&t.topic_id);
                put_tagged_fields(buf, &[], &t.tagged_fields)
            })?;
        } else {
            put_array(buf, &self.topic_names, flexible, |buf, n| {
                put_string(buf, n, flexible)
            })?;
        }
        buf.put_i32(self.timeout_ms);
        put_tagged_if(buf, flexible, &self.tagged_fields)
    }
}

impl Decode for DeleteTopicsRequest {
    fn decode(buf: &mut Bytes, version: i16) -> Result<Self> {
        check_version::<Self>(version)?;
        let flexible = version >= 4;
        let mut req = DeleteTopicsRequest::default();
        if version >= 6 {
            req.topics = get_array(buf, true, 18, |buf| {
                Ok(DeleteTopicState {
                    name: get_nullable_string(buf, true)?,
                    topic_id: get_uuid(buf)?,
                    tagged_fields: get_tagged_fields(buf)?,
                })
            })?;
        } else {
            req.topic_names = get_array(buf, flexible, 1, |buf| get_string(buf, flexible))?;
        }
        req.timeout_ms = get_i32(buf)?;
        req.tagged_fields = get_tagged_if(buf, flexible)?;
        Ok(req)
    }
}

/// DeleteTopics response.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeleteTopicsResponse {
    /// Throttle duration in ms.
    pub throttle_time_ms: i32,
    /// Per-topic results.
    pub responses: Vec<DeletableTopicResult>,
    /// Unknown tagged fields. Flexible versions only.
    pub tagged_fields: TaggedFields,
}

/// One topic's result in a [`DeleteTopicsResponse`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeletableTopicResult {
    /// The topic name; nullable from version 6.
    pub name: Option<String>,
    /// The topic id. Added in version 6.
    pub topic_id: [u8; 16],
    /// The error code, or 0.
    pub error_code: i16,
    /// The error message. Added in version 5.
    pub error_message: Option<String>,
    /// Unknown tagged fields. Flexible versions only.
    pub tagged_fields: TaggedFields,
}

impl Encode for DeleteTopicsResponse {
    fn encode(&self, buf: &mut BytesMut, version: i16) -> Result<()> {
        check_version::<DeleteTopicsRequest>(version)?;
        let flexible = version >= 4;
        buf.put_i32(self.throttle_time_ms);
        put_array(buf, &self.responses, flexible, |buf, r| {
            put_nullable_string(buf, r.name.as_deref(), flexible)?;
            if version >= 6 {
                buf.put_slice(&r.topic_id);
            }
            buf.put_i16(r.error_code);
            if version >= 5 {
                put_nullable_string(buf, r.error_message.as_deref(), flexible)?;
            }
            put_tagged_if(buf, flexible, &r.tagged_fields)
        })?;
        put_tagged_if(buf, flexible, &self.tagged_fields)
    }
}

impl Decode for DeleteTopicsResponse {
    fn decode(buf: &mut Bytes, version: i16) -> Result<Self> {
        check_version::<DeleteTopicsRequest>(version)?;
        let flexible = version >= 4;
        let throttle_time_ms = get_i32(buf)?;
        let responses = get_array(buf, flexible, 3, |buf| {
            let mut r = DeletableTopicResult {
                name: get_nullable_string(buf, flexible)?,
                ..DeletableTopicResult::default()
            };
            if version >= 6 {
                r.topic_id = get_uuid(buf)?;
            }
            r.error_code = get_i16(buf)?;
            if version >= 5 {
                r.error_message = get_nullable_string(buf, flexible)?;
            }
            r.tagged_fields = get_tagged_if(buf, flexible)?;
            Ok(r)
        })?;
        let tagged_fields = get_tagged_if(buf, flexible)?;
        Ok(DeleteTopicsResponse {
            throttle_time_ms,
            responses,
            tagged_fields,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::messages::testutil::*;
    use proptest::prelude::*;

    const VERSIONS: std::ops::RangeInclusive<i16> = 1..=6;

    fn request() -> impl Strategy<Value = DeleteTopicsRequest> {
        let state = (opt_string(), any::<[u8; 16]>(), tagged()).prop_map(|(name, id, tf)| {
            DeleteTopicState {
                name,
                topic_id: id,
                tagged_fields: tf,
            }
        });
        (vec(state, 3), vec(string(), 4), any::<i32>(), tagged()).prop_map(
            |(topics, topic_names, timeout_ms, tf)| DeleteTopicsRequest {
                topics,
                topic_names,
                timeout_ms,
                tagged_fields: tf,
            },
        )
    }

    fn normalize_request(mut r: DeleteTopicsRequest, v: i16) -> DeleteTopicsRequest {
        if v >= 6 {
            r.topic_names.clear();
        } else {
            r.topics.clear();
        }
        if v < 4 {
            r.tagged_fields = TaggedFields::new();
        }
        r
    }

    fn response() -> impl Strategy<Value = DeleteTopicsResponse> {
        let result = (
            opt_string(),
            any::<[u8; 16]>(),
            any::<i16>(),
            opt_string(),
            tagged(),
        )
            .prop_map(|(name, id, e, m, tf)| DeletableTopicResult {
                name,
                topic_id: id,
                error_code: e,
                error_message: m,
                tagged_fields: tf,
            });
        (any::<i32>(), vec(result, 4), tagged()).prop_map(|(th, responses, tf)| {
            DeleteTopicsResponse {
                throttle_time_ms: th,
                responses,
                tagged_fields: tf,
            }
        })
    }

    fn normalize_response(mut r: DeleteTopicsResponse, v: i16) -> DeleteTopicsResponse {
        for t in &mut r.responses {
            if v < 6 {
                t.topic_id = [0; 16];
            }
            if v < 5 {
                t.error_message = None;
            }
            if v < 4 {
                t.tagged_fields = TaggedFields::new();
            }
        }
        if v < 4 {
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
            no_panic::<DeleteTopicsRequest>(&data, VERSIONS);
            no_panic::<DeleteTopicsResponse>(&data, VERSIONS);
        }
    }
}
