//! The ApiVersions handshake of a [`Connection`] (KIP-35, KIP-511) and the choice of each
//! request's version: the highest both sides support.
//!
//! Owns the negotiated ranges' use ([`Connection::negotiate_versions`],
//! [`Connection::version_for`]); the ranges themselves live in the connection's shared
//! state, set once. May not: send anything but ApiVersions, or change a version after
//! the handshake.
//!
//! Reference: <https://kafka.apache.org/protocol#api_versions>.

use bytes::Bytes;
use tracing::debug;

use super::Connection;
use crate::error::{Error, ErrorKind, Result};
use crate::protocol::messages::{ApiVersionsRequest, ApiVersionsResponse};
use crate::protocol::{ApiKey, Decode, ErrorCode, Request, TaggedFields};

impl Connection {
    /// Perform the ApiVersions handshake and remember the broker's version ranges.
    ///
    /// Sends ApiVersions v3 with the client software name `kafkapipe` and this crate's
    /// version (KIP-511). A broker that does not know v3 answers `UNSUPPORTED_VERSION` with a
    /// v0 body listing its ranges; the request is then repeated at the highest version the
    /// broker allows (or v0).
    ///
    /// # Errors
    ///
    /// `Config` if the versions were already negotiated; `Kafka` if the broker answers with
    /// an error code; otherwise the errors of [`Connection::send_version`].
    pub async fn negotiate_versions(&self) -> Result<()> {
        if self.shared.api_versions.get().is_some() {
            return Err(self.err(Error::config("API versions were already negotiated")));
        }
        const FIRST: i16 = 3;
        let req = ApiVersionsRequest {
            client_software_name: "kafkapipe".to_string(),
            client_software_version: env!("CARGO_PKG_VERSION").to_string(),
            tagged_fields: TaggedFields::new(),
        };
        let mut body = self.request_body(&req, FIRST).await?;
        let error_code = peek_i16(&body).unwrap_or(0);
        let response = if error_code == ErrorCode::UnsupportedVersion.code() {
            let v0 = ApiVersionsResponse::decode(&mut body, 0).map_err(|e| self.err(e))?;
            let fallback = v0
                .range(ApiKey::API_VERSIONS)
                .map_or(0, |(_, max)| max.min(FIRST - 1))
                .max(0);
            debug!(
                broker = %self.shared.broker,
                api = %ApiKey::API_VERSIONS,
                fallback,
                "broker does not support ApiVersions v3, retrying"
            );
            self.send_version(&req, fallback).await?
        } else {
            ApiVersionsResponse::decode(&mut body, FIRST).map_err(|e| self.err(e))?
        };
        if response.error_code != 0 {
            return Err(self.err(
                Error::kafka(ErrorCode::from(response.error_code))
                    .with_message("ApiVersions handshake failed"),
            ));
        }
        debug!(
            broker = %self.shared.broker,
            apis = response.api_keys.len(),
            "negotiated API versions"
        );
        if self.shared.api_versions.set(response).is_err() {
            return Err(self.err(Error::config("API versions were already negotiated")));
        }
        Ok(())
    }

    /// The broker's ApiVersions response, once the handshake is done.
    pub fn api_versions(&self) -> Option<&ApiVersionsResponse> {
        self.shared.api_versions.get()
    }

    /// The version of `R` to use with this broker: the highest version both sides support,
    /// `min(R::MAX_VERSION, broker max)`.
    ///
    /// # Errors
    ///
    /// `UnsupportedVersion` (naming the API and both ranges) if the broker lacks the API,
    /// the ranges do not overlap, or no handshake was done.
    pub fn version_for<R: Request>(&self) -> Result<i16> {
        let Some(versions) = self.shared.api_versions.get() else {
            return Err(self.err(Error::new(
                ErrorKind::UnsupportedVersion,
                format!(
                    "cannot choose a version of {}: no ApiVersions handshake was done",
                    R::API_KEY
                ),
            )));
        };
        let Some((broker_min, broker_max)) = versions.range(R::API_KEY) else {
            return Err(self.err(Error::new(
                ErrorKind::UnsupportedVersion,
                format!(
                    "broker does not support {} (client supports {}..={})",
                    R::API_KEY,
                    R::MIN_VERSION,
                    R::MAX_VERSION
                ),
            )));
        };
        let version = R::MAX_VERSION.min(broker_max);
        if version < R::MIN_VERSION.max(broker_min) {
            return Err(self.err(Error::new(
                ErrorKind::UnsupportedVersion,
                format!(
                    "no common version of {}: client supports {}..={}, broker supports {}..={}",
                    R::API_KEY,
                    R::MIN_VERSION,
                    R::MAX_VERSION,
                    broker_min,
                    broker_max
                ),
            )));
        }
        Ok(version)
    }
}

fn peek_i16(buf: &Bytes) -> Option<i16> {
    let bytes = buf.get(..2)?;
    Some(i16::from_be_bytes([bytes[0], bytes[1]]))
}
