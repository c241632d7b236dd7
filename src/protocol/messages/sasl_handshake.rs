//! SaslHandshake (key 17): choose a SASL mechanism and learn which ones the broker enables.
//!
//! Versions 0–1, never flexible. Version 0 is followed by unframed SASL tokens on the raw
//! socket; version 1 (KIP-152) by SaslAuthenticate requests, which is what this client
//! speaks.

use bytes::{BufMut, Bytes, BytesMut};

use crate::error::Result;
use crate::protocol::primitives::*;
use crate::protocol::{check_version, ApiKey, Decode, Encode, Request};

/// SaslHandshake request.
///
/// ```
/// use kafkapipe::protocol::messages::SaslHandshakeRequest;
/// let req = SaslHandshakeRequest { mechanism: "SCRAM-SHA-512".into() };
/// assert_eq!(req.mechanism, "SCRAM-SHA-512");
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SaslHandshakeRequest {
    /// The SASL mechanism chosen by the client, e.g. `SCRAM-SHA-256`.
    pub mechanism: String,
}

impl Request for SaslHandshakeRequest {
    const API_KEY: ApiKey = ApiKey::SASL_HANDSHAKE;
    const MIN_VERSION: i16 = 0;
    const MAX_VERSION: i16 = 1;
    const FIRST_FLEXIBLE: i16 = i16::MAX;
    type Response = SaslHandshakeResponse;
}

impl Encode for SaslHandshakeRequest {
    fn encode(&self, buf: &mut BytesMut, version: i16) -> Result<()> {
        check_version::<Self>(version)?;
        put_string(buf, &self.mechanism, false)
    }
}

impl Decode for SaslHandshakeRequest {
    fn decode(buf: &mut Bytes, version: i16) -> Result<Self> {
        check_version::<Self>(version)?;
        Ok(SaslHandshakeRequest {
            mechanism: get_string(buf, false)?,
        })
    }
}

/// SaslHandshake response.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SaslHandshakeResponse {
    /// The error code, or 0 (`UNSUPPORTED_SASL_MECHANISM` if the chosen one is not enabled).
    pub error_code: i16,
    /// The mechanisms enabled on the broker.
    pub mechanisms: Vec<String>,
}

impl Encode for SaslHandshakeResponse {
    fn encode(&self, buf: &mut BytesMut, version: i16) -> Result<()> {
        check_version::<SaslHandshakeRequest>(version)?;
        buf.put_i16(self.error_code);
        put_array(buf, &self.mechanisms, false, |buf, m| {
            put_string(buf, m, false)
        })
    }
}

impl Decode for SaslHandshakeResponse {
    fn decode(buf: &mut Bytes, version: i16) -> Result<Self> {
        check_version::<SaslHandshakeRequest>(version)?;
        let error_code = get_i16(buf)?;
        let mechanisms = get_array(buf, false, 2, |buf| get_string(buf, false))?;
        Ok(SaslHandshakeResponse {
            error_code,
            mechanisms,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::messages::testutil::*;
    use proptest::prelude::*;

    const VERSIONS: std::ops::RangeInclusive<i16> = 0..=1;

    proptest! {
        #[test]
        fn request_roundtrip(mechanism in string()) {
            for v in VERSIONS {
                roundtrip(&SaslHandshakeRequest { mechanism: mechanism.clone() }, v)?;
            }
        }

        #[test]
        fn response_roundtrip(error_code: i16, mechanisms in vec(string(), 4)) {
            let r = SaslHandshakeResponse { error_code, mechanisms };
            for v in VERSIONS {
                roundtrip(&r, v)?;
            }
        }

        #[test]
        fn arbitrary_bytes_never_panic(data: Vec<u8>) {
            no_panic::<SaslHandshakeRequest>(&data, VERSIONS);
            no_panic::<SaslHandshakeResponse>(&data, VERSIONS);
        }
    }
}
