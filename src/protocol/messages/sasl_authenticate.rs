//! SaslAuthenticate (key 36): one SASL token each way (KIP-152).
//!
//! Versions 0–2. v1 adds the session lifetime (KIP-368 re-authentication); v2 is flexible.

use bytes::{BufMut, Bytes, BytesMut};

use super::{get_tagged_if, put_tagged_if};
use crate::error::Result;
use crate::protocol::primitives::*;
use crate::protocol::{check_version, ApiKey, Decode, Encode, Request, TaggedFields};

/// SaslAuthenticate request. Its `Debug` output hides the token, which may hold a password.
///
/// ```
/// use bytes::Bytes;
/// use kafkapipe::protocol::messages::SaslAuthenticateRequest;
/// let req = SaslAuthenticateRequest {
///     auth_bytes: Bytes::from_static(b"\0user\0secret"),
///     ..Default::default()
/// };
/// assert!(!format!("{req:?}").contains("secret"));
/// ```
#[derive(Clone, Default, PartialEq, Eq)]
pub struct SaslAuthenticateRequest {
    /// The SASL token for the mechanism chosen in the handshake.
    pub auth_bytes: Bytes,
    /// Unknown tagged fields. Flexible versions only.
    pub tagged_fields: TaggedFields,
}

impl std::fmt::Debug for SaslAuthenticateRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SaslAuthenticateRequest")
            .field(
                "auth_bytes",
                &format_args!("<{} bytes>", self.auth_bytes.len()),
            )
            .field("tagged_fields", &self.tagged_fields)
            .finish()
    }
}

impl Request for SaslAuthenticateRequest {
    const API_KEY: ApiKey = ApiKey::SASL_AUTHENTICATE;
    const MIN_VERSION: i16 = 0;
    const MAX_VERSION: i16 = 2;
    const FIRST_FLEXIBLE: i16 = 2;
    type Response = SaslAuthenticateResponse;
}

impl Encode for SaslAuthenticateRequest {
    fn encode(&self, buf: &mut BytesMut, version: i16) -> Result<()> {
        check_version::<Self>(version)?;
        let flexible = version >= 2;
        put_bytes(buf, &self.auth_bytes, flexible)?;
        put_tagged_if(buf, flexible, &self.tagged_fields)
    }
}

impl Decode for SaslAuthenticateRequest {
    fn decode(buf: &mut Bytes, version: i16) -> Result<Self> {
        check_version::<Self>(version)?;
        let flexible = version >= 2;
        Ok(SaslAuthenticateRequest {
            auth_bytes: get_bytes(buf, flexible)?,
            tagged_fields: get_tagged_if(buf, flexible)?,
        })
    }
}

/// SaslAuthenticate response.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SaslAuthenticateResponse {
    /// The error code, or 0 (`SASL_AUTHENTICATION_FAILED` for bad credentials).
    pub error_code: i16,
    /// The broker's description of the error.
    pub error_message: Option<String>,
    /// The SASL token from the broker (a challenge, or the final server message).
    pub auth_bytes: Bytes,
    /// How long the authenticated session lasts, in ms; 0 for no limit. Version 1+.
    pub session_lifetime_ms: i64,
    /// Unknown tagged fields. Flexible versions only.
    pub tagged_fields: TaggedFields,
}

impl Encode for SaslAuthenticateResponse {
    fn encode(&self, buf: &mut BytesMut, version: i16) -> Result<()> {
        check_version::<SaslAuthenticateRequest>(version)?;
        let flexible = version >= 2;
        buf.put_i16(self.error_code);
        put_nullable_string(buf, self.error_message.as_deref(), flexible)?;
        put_bytes(buf, &self.auth_bytes, flexible)?;
        if version >= 1 {
            buf.put_i64(self.session_lifetime_ms);
        }
        put_tagged_if(buf, flexible, &self.tagged_fields)
    }
}

impl Decode for SaslAuthenticateResponse {
    fn decode(buf: &mut Bytes, version: i16) -> Result<Self> {
        check_version::<SaslAuthenticateRequest>(version)?;
        let flexible = version >= 2;
        let error_code = get_i16(buf)?;
        let error_message = get_nullable_string(buf, flexible)?;
        let auth_bytes = get_bytes(buf, flexible)?;
        let session_lifetime_ms = if version >= 1 { get_i64(buf)? } else { 0 };
        let tagged_fields = get_tagged_if(buf, flexible)?;
        Ok(SaslAuthenticateResponse {
            error_code,
            error_message,
            auth_bytes,
            session_lifetime_ms,
            tagged_fields,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::messages::testutil::*;
    use proptest::prelude::*;

    const VERSIONS: std::ops::RangeInclusive<i16> = 0..=2;

    fn bytes() -> impl Strategy<Value = Bytes> {
        prop::collection::vec(any::<u8>(), 0..40).prop_map(Bytes::from)
    }

    proptest! {
        #[test]
        fn request_roundtrip(auth_bytes in bytes(), tf in tagged()) {
            for v in VERSIONS {
                let r = SaslAuthenticateRequest {
                    auth_bytes: auth_bytes.clone(),
                    tagged_fields: if v >= 2 { tf.clone() } else { TaggedFields::new() },
                };
                roundtrip(&r, v)?;
            }
        }

        #[test]
        fn response_roundtrip(
            error_code: i16,
            error_message in opt_string(),
            auth_bytes in bytes(),
            lifetime: i64,
            tf in tagged(),
        ) {
            for v in VERSIONS {
                let r = SaslAuthenticateResponse {
                    error_code,
                    error_message: error_message.clone(),
                    auth_bytes: auth_bytes.clone(),
                    session_lifetime_ms: if v >= 1 { lifetime } else { 0 },
                    tagged_fields: if v >= 2 { tf.clone() } else { TaggedFields::new() },
                };
                roundtrip(&r, v)?;
            }
        }

        #[test]
        fn arbitrary_bytes_never_panic(data: Vec<u8>) {
            no_panic::<SaslAuthenticateRequest>(&data, VERSIONS);
            no_panic::<SaslAuthenticateResponse>(&data, VERSIONS);
        }
    }
}
