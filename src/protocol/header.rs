//! Request header v0–v2 and response header v0–v1.
//!
//! Which header version goes with which API version is decided by [`super::Request`]:
//! flexible versions use request header v2 and response header v1, except ApiVersions,
//! whose response header is always v0 (so that a client can parse the reply to a
//! version it sent too new).

use bytes::{BufMut, Bytes, BytesMut};

use super::primitives::*;
use super::{ApiKey, TaggedFields};
use crate::error::{Error, Result};

/// A request header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestHeader {
    /// The API key of the request.
    pub api_key: ApiKey,
    /// The API version of the request.
    pub api_version: i16,
    /// Echoed in the response so it can be matched to this request.
    pub correlation_id: i32,
    /// The client id (absent in header v0). Always a classic nullable string, even in v2.
    pub client_id: Option<String>,
    /// Unknown tagged fields (header v2).
    pub tagged_fields: TaggedFields,
}

impl RequestHeader {
    /// Encode at header `version` (0, 1 or 2).
    pub fn encode(&self, buf: &mut BytesMut, version: i16) -> Result<()> {
        buf.put_i16(self.api_key.0);
        buf.put_i16(self.api_version);
        buf.put_i32(self.correlation_id);
        if version >= 1 {
            put_nullable_string(buf, self.client_id.as_deref(), false)?;
        }
        if version >= 2 {
            put_tagged_fields(buf, &[], &self.tagged_fields)?;
        }
        if !(0..=2).contains(&version) {
            return Err(Error::encode(format!(
                "unknown request header version {version}"
            )));
        }
        Ok(())
    }

    /// Decode at header `version`.
    pub fn decode(buf: &mut Bytes, version: i16) -> Result<Self> {
        let api_key = ApiKey(get_i16(buf)?);
        let api_version = get_i16(buf)?;
        let correlation_id = get_i32(buf)?;
        let client_id = if version >= 1 {
            get_nullable_string(buf, false)?
        } else {
            None
        };
        let tagged_fields = if version >= 2 {
            get_tagged_fields(buf)?
        } else {
            TaggedFields::new()
        };
        Ok(RequestHeader {
            api_key,
            api_version,
            correlation_id,
            client_id,
            tagged_fields,
        })
    }

    /// Peek the API key and version of an encoded request without consuming it.
    pub fn peek(buf: &Bytes) -> Result<(ApiKey, i16, i32)> {
        let mut b = buf.clone();
        Ok((ApiKey(get_i16(&mut b)?), get_i16(&mut b)?, get_i32(&mut b)?))
    }
}

/// A response header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResponseHeader {
    /// The correlation id of the request this answers.
    pub correlation_id: i32,
    /// Unknown tagged fields (header v1).
    pub tagged_fields: TaggedFields,
}

impl ResponseHeader {
    /// Encode at header `version` (0 or 1).
    pub fn encode(&self, buf: &mut BytesMut, version: i16) -> Result<()> {
        buf.put_i32(self.correlation_id);
        if version >= 1 {
            put_tagged_fields(buf, &[], &self.tagged_fields)?;
        }
        Ok(())
    }

    /// Decode at header `version`.
    pub fn decode(buf: &mut Bytes, version: i16) -> Result<Self> {
        let correlation_id = get_i32(buf)?;
        let tagged_fields = if version >= 1 {
            get_tagged_fields(buf)?
        } else {
            TaggedFields::new()
        };
        Ok(ResponseHeader {
            correlation_id,
            tagged_fields,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_header_roundtrip_all_versions() {
        for v in 0..=2 {
            let h = RequestHeader {
                api_key: ApiKey::FETCH,
                api_version: 12,
                correlation_id: 42,
                client_id: if v >= 1 { Some("me".into()) } else { None },
                tagged_fields: if v >= 2 {
                    TaggedFields(vec![(3, Bytes::from_static(b"x"))])
                } else {
                    TaggedFields::new()
                },
            };
            let mut b = BytesMut::new();
            h.encode(&mut b, v).unwrap();
            let mut r = b.freeze();
            assert_eq!(RequestHeader::decode(&mut r, v).unwrap(), h);
            assert!(r.is_empty());
        }
    }

    #[test]
    fn header_v2_client_id_is_classic_string() {
        let h = RequestHeader {
            api_key: ApiKey::API_VERSIONS,
            api_version: 3,
            correlation_id: 1,
            client_id: Some("ab".into()),
            tagged_fields: TaggedFields::new(),
        };
        let mut b = BytesMut::new();
        h.encode(&mut b, 2).unwrap();
        assert_eq!(&b[..], &[0, 18, 0, 3, 0, 0, 0, 1, 0, 2, b'a', b'b', 0]);
    }

    #[test]
    fn response_header_roundtrip() {
        for v in 0..=1 {
            let h = ResponseHeader {
                correlation_id: -7,
                tagged_fields: TaggedFields::new(),
            };
            let mut b = BytesMut::new();
            h.encode(&mut b, v).unwrap();
            let mut r = b.freeze();
            assert_eq!(ResponseHeader::decode(&mut r, v).unwrap(), h);
        }
    }
}
