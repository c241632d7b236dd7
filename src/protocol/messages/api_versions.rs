//! ApiVersions (key 18): which versions of which APIs a broker speaks.
//!
//! Versions 0–4. v1 adds `throttle_time_ms`; v3 is flexible and adds the client software
//! name and version (KIP-511); v4 only changes error handling. The response header is
//! always v0, and a broker that does not know the requested version answers with a v0
//! body carrying `UNSUPPORTED_VERSION` and its own ranges.

use bytes::{BufMut, Bytes, BytesMut};

use crate::error::Result;
use crate::protocol::primitives::*;
use crate::protocol::{check_version, ApiKey, Decode, Encode, Request, TaggedFields};

/// ApiVersions request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ApiVersionsRequest {
    /// The name of the client software. Added in version 3.
    pub client_software_name: String,
    /// The version of the client software. Added in version 3.
    pub client_software_version: String,
    /// Unknown tagged fields.
    pub tagged_fields: TaggedFields,
}

impl Request for ApiVersionsRequest {
    const API_KEY: ApiKey = ApiKey::API_VERSIONS;
    const MIN_VERSION: i16 = 0;
    const MAX_VERSION: i16 = 4;
    const FIRST_FLEXIBLE: i16 = 3;
    type Response = ApiVersionsResponse;

    fn response_header_version(_version: i16) -> i16 {
        0
    }
}

impl Encode for ApiVersionsRequest {
    fn encode(&self, buf: &mut BytesMut, version: i16) -> Result<()> {
        check_version::<Self>(version)?;
        if version >= 3 {
            put_string(buf, &self.client_software_name, true)?;
            put_string(buf, &self.client_software_version, true)?;
            put_tagged_fields(buf, &[], &self.tagged_fields)?;
        }
        Ok(())
    }
}

impl Decode for ApiVersionsRequest {
    fn decode(buf: &mut Bytes, version: i16) -> Result<Self> {
        check_version::<Self>(version)?;
        let mut req = ApiVersionsRequest::default();
        if version >= 3 {
            req.client_software_name = get_string(buf, true)?;
            req.client_software_version = get_string(buf, true)?;
            req.tagged_fields = get_tagged_fields(buf)?;
        }
        Ok(req)
    }
}

/// The version range a broker supports for one API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiVersionRange {
    /// The API key.
    pub api_key: ApiKey,
    /// The lowest supported version.
    pub min_version: i16,
    /// The highest supported version.
    pub max_version: i16,
    /// Unknown tagged fields. Flexible versions only.
    pub tagged_fields: TaggedFields,
}

/// ApiVersions response.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ApiVersionsResponse {
    /// The top-level error code.
    pub error_code: i16,
    /// The APIs the broker supports.
    pub api_keys: Vec<ApiVersionRange>,
    /// Throttle duration in ms. Added in version 1.
    pub throttle_time_ms: i32,
    /// Tagged fields (supported/finalized features, ZK migration flag) kept raw.
    pub tagged_fields: TaggedFields,
}

/// A feature level the cluster finalized (ApiVersions v3+, tagged field 2), such as
/// `transaction.version` = 2 (KIP-890 transactions v2).
///
/// ```
/// use kafkapipe::protocol::messages::{ApiVersionsResponse, FinalizedFeature};
/// let resp = ApiVersionsResponse::default();
/// assert_eq!(resp.finalized_features().unwrap(), Vec::<FinalizedFeature>::new());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FinalizedFeature {
    /// The feature name.
    pub name: String,
    /// The highest finalized level.
    pub max_version_level: i16,
    /// The lowest finalized level.
    pub min_version_level: i16,
}

/// Tag of `FinalizedFeatures` in the ApiVersions response (after `SupportedFeatures`,
/// 0, and `FinalizedFeaturesEpoch`, 1).
const FINALIZED_FEATURES_TAG: u32 = 2;

impl ApiVersionsResponse {
    /// The cluster's finalized features, decoded from the raw tagged fields (empty before
    /// ApiVersions v3 or when the broker sends none).
    ///
    /// # Errors
    ///
    /// `Protocol` if the field is malformed.
    ///
    /// ```
    /// use kafkapipe::protocol::messages::ApiVersionsResponse;
    /// let resp = ApiVersionsResponse::default();
    /// assert!(resp.finalized_features().unwrap().is_empty());
    /// ```
    pub fn finalized_features(&self) -> Result<Vec<FinalizedFeature>> {
        let Some(raw) = self.tagged_fields.get(FINALIZED_FEATURES_TAG) else {
            return Ok(Vec::new());
        };
        let mut b = raw.clone();
        get_array(&mut b, true, 6, |b| {
            let name = get_string(b, true)?;
            let max_version_level = get_i16(b)?;
            let min_version_level = get_i16(b)?;
            get_tagged_fields(b)?;
            Ok(FinalizedFeature {
                name,
                max_version_level,
                min_version_level,
            })
        })
    }

    /// The finalized (maximum) level of feature `name`; 0 when it is not finalized or the
    /// field cannot be read.
    ///
    /// ```
    /// use kafkapipe::protocol::messages::ApiVersionsResponse;
    /// let tv = ApiVersionsResponse::default().finalized_level("transaction.version");
    /// assert_eq!(tv, 0);
    /// ```
    pub fn finalized_level(&self, name: &str) -> i16 {
        self.finalized_features()
            .ok()
            .and_then(|fs| fs.into_iter().find(|f| f.name == name))
            .map_or(0, |f| f.max_version_level)
    }

    /// The broker's range for `key`, if it supports the API at all.
    pub fn range(&self, key: ApiKey) -> Option<(i16, i16)> {
        self.api_keys
            .iter()
            .find(|r| r.api_key == key)
            .map(|r| (r.min_version, r.max_version))
    }

    /// The release of the cluster's finalized `metadata.version` (KRaft), such as
    /// `"3.9-IV0"`: the closest thing ApiVersions says to the broker's version. `None`
    /// before ApiVersions v3, on a ZooKeeper cluster, or for a level this crate does not
    /// know (see [`metadata_version_release`]).
    ///
    /// ```
    /// use kafkapipe::protocol::messages::ApiVersionsResponse;
    /// assert_eq!(ApiVersionsResponse::default().metadata_version(), None);
    /// ```
    pub fn metadata_version(&self) -> Option<&'static str> {
        metadata_version_release(self.finalized_level("metadata.version"))
    }
}

/// Apache Kafka's `metadata.version` feature levels and the releases that introduced
/// them (`org.apache.kafka.server.common.MetadataVersion`, read from Kafka 4.4.0).
const METADATA_VERSIONS: &[&str] = &[
    "3.0-IV1", "3.1-IV0", "3.2-IV0", "3.3-IV0", "3.3-IV1", "3.3-IV2", "3.3-IV3", "3.4-IV0",
    "3.5-IV0", "3.5-IV1", "3.5-IV2", "3.6-IV0", "3.6-IV1", "3.6-IV2", "3.7-IV0", "3.7-IV1",
    "3.7-IV2", "3.7-IV3", "3.7-IV4", "3.8-IV0", "3.9-IV0", "4.0-IV0", "4.0-IV1", "4.0-IV2",
    "4.0-IV3", "4.1-IV0", "4.1-IV1", "4.2-IV0", "4.2-IV1", "4.3-IV0", "4.4-IV0", "4.4-IV1",
    "4.4-IV2",
];

/// The release name of `metadata.version` feature level `level` (1 = `"3.0-IV1"`,
/// 21 = `"3.9-IV0"`, 22 = `"4.0-IV0"`, 33 = `"4.4-IV2"`), or `None` for 0 (not finalized)
/// and levels newer than this crate knows.
///
/// ```
/// use kafkapipe::protocol::messages::metadata_version_release;
/// assert_eq!(metadata_version_release(21), Some("3.9-IV0"));
/// assert_eq!(metadata_version_release(27), Some("4.1-IV1"));
/// assert_eq!(metadata_version_release(0), None);
/// ```
pub fn metadata_version_release(level: i16) -> Option<&'static str> {
    usize::try_from(level)
        .ok()
        .and_then(|l| l.checked_sub(1))
        .and_then(|i| METADATA_VERSIONS.get(i).copied())
}

impl Encode for ApiVersionsResponse {
    fn encode(&self, buf: &mut BytesMut, version: i16) -> Result<()> {
        check_version::<ApiVersionsRequest>(version)?;
        let flexible = version >= 3;
        buf.put_i16(self.error_code);
        put_array(buf, &self.api_keys, flexible, |buf, r| {
            buf.put_i16(r.api_key.0);
            buf.put_i16(r.min_version);
            buf.put_i16(r.max_version);
            if flexible {
                put_tagged_fields(buf, &[], &r.tagged_fields)?;
            }
            Ok(())
        })?;
        if version >= 1 {
            buf.put_i32(self.throttle_time_ms);
        }
        if flexible {
            put_tagged_fields(buf, &[], &self.tagged_fields)?;
        }
        Ok(())
    }
}

impl Decode for ApiVersionsResponse {
    fn decode(buf: &mut Bytes, version: i16) -> Result<Self> {
        check_version::<ApiVersionsRequest>(version)?;
        let flexible = version >= 3;
        let error_code = get_i16(buf)?;
        let api_keys = get_array(buf, flexible, 6, |buf| {
            Ok(ApiVersionRange {
                api_key: ApiKey(get_i16(buf)?),
                min_version: get_i16(buf)?,
                max_version: get_i16(buf)?,
                tagged_fields: if flexible {
                    get_tagged_fields(buf)?
                } else {
                    TaggedFields::new()
                },
            })
        })?;
        let throttle_time_ms = if version >= 1 { get_i32(buf)? } else { 0 };
        let tagged_fields = if flexible {
            get_tagged_fields(buf)?
        } else {
            TaggedFields::new()
        };
        Ok(ApiVersionsResponse {
            error_code,
            api_keys,
            throttle_time_ms,
            tagged_fields,
        })
    }
}
