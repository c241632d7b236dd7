//! InitProducerId (key 22): obtain a producer id and epoch for an idempotent (or, with a
//! transactional id, transactional) producer.
//!
//! Versions 0–5. v2 is flexible; v3 adds the current producer id and epoch to the request
//! (so a producer can bump its epoch); v4 and v5 only change error semantics.

use bytes::{BufMut, Bytes, BytesMut};

use super::{get_tagged_if, put_tagged_if};
use crate::error::Result;
use crate::protocol::primitives::*;
use crate::protocol::{check_version, ApiKey, Decode, Encode, Request, TaggedFields};

/// InitProducerId request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InitProducerIdRequest {
    /// The transactional id, or `None` for an idempotent-only producer.
    pub transactional_id: Option<String>,
    /// How long a transaction may stay open, in ms (ignored without a transactional id).
    pub transaction_timeout_ms: i32,
    /// The current producer id, or -1. Added in version 3.
    pub producer_id: i64,
    /// The current producer epoch, or -1. Added in version 3.
    pub producer_epoch: i16,
    /// Unknown tagged fields. Flexible versions only.
    pub tagged_fields: TaggedFields,
}

impl Default for InitProducerIdRequest {
    fn default() -> Self {
        InitProducerIdRequest {
            transactional_id: None,
            transaction_timeout_ms: i32::MAX,
            producer_id: -1,
            producer_epoch: -1,
            tagged_fields: TaggedFields::new(),
        }
    }
}

impl Request for InitProducerIdRequest {
    const API_KEY: ApiKey = ApiKey::INIT_PRODUCER_ID;
    const MIN_VERSION: i16 = 0;
    const MAX_VERSION: i16 = 5;
    const FIRST_FLEXIBLE: i16 = 2;
    type Response = InitProducerIdResponse;
}

impl Encode for InitProducerIdRequest {
    fn encode(&self, buf: &mut BytesMut, version: i16) -> Result<()> {
        check_version::<Self>(version)?;
        let flexible = version >= 2;
        put_nullable_string(buf, self.transactional_id.as_deref(), flexible)?;
        buf.put_i32(self.transaction_timeout_ms);
        if version >= 3 {
            buf.put_i64(self.producer_id);
            buf.put_i16(self.producer_epoch);
        }
        put_tagged_if(buf, flexible, &self.tagged_fields)
    }
}

impl Decode for InitProducerIdRequest {
    fn decode(buf: &mut Bytes, version: i16) -> Result<Self> {
        check_version::<Self>(version)?;
        let flexible = version >= 2;
        let mut req = InitProducerIdRequest {
            transactional_id: get_nullable_string(buf, flexible)?,
            transaction_timeout_ms: get_i32(buf)?,
            ..InitProducerIdRequest::default()
        };
        if version >= 3 {
            req.producer_id = get_i64(buf)?;
            req.producer_epoch = get_i16(buf)?;
        }
        req.tagged_fields = get_tagged_if(buf, flexible)?;
        Ok(req)
    }
}

/// InitProducerId response.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InitProducerIdResponse {
    /// Throttle duration in ms.
    pub throttle_time_ms: i32,
    /// The error code, or 0.
    pub error_code: i16,
    /// The producer id assigned.
    pub producer_id: i64,
    /// The producer epoch assigned.
    pub producer_epoch: i16,
    /// Unknown tagged fields. Flexible versions only.
    pub tagged_fields: TaggedFields,
}

impl Encode for InitProducerIdResponse {
    fn encode(&self, buf: &mut BytesMut, version: i16) -> Result<()> {
        check_version::<InitProducerIdRequest>(version)?;
        buf.put_i32(self.throttle_time_ms);
        buf.put_i16(self.error_code);
        buf.put_i64(self.producer_id);
        buf.put_i16(self.producer_epoch);
        put_tagged_if(buf, version >= 2, &self.tagged_fields)
    }
}

impl Decode for InitProducerIdResponse {
    fn decode(buf: &mut Bytes, version: i16) -> Result<Self> {
        check_version::<InitProducerIdRequest>(version)?;
        Ok(InitProducerIdResponse {
            throttle_time_ms: get_i32(buf)?,
            error_code: get_i16(buf)?,
            producer_id: get_i64(buf)?,
            producer_epoch: get_i16(buf)?,
            tagged_fields: get_tagged_if(buf, version >= 2)?,
        })
    }
}
