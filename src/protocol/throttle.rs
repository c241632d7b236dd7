//! Client-side quota throttling (KIP-219): which responses carry a `throttle_time_ms` the
//! client must honour, and reading it from a response body without decoding the rest.
//!
//! Since KIP-219 (Kafka 2.0) a broker whose quota a client exceeded answers at once with
//! `throttle_time_ms` set and expects the client to send nothing more on that connection
//! until the time has passed (the broker also stops reading the socket for that long, as
//! a guard against clients that do not). Older request versions were throttled by the
//! broker delaying the response instead; for those the client must not pause again. The
//! first versions that the client throttles are Apache Kafka's own
//! (`AbstractResponse.shouldClientThrottle` of each response class in kafka-clients 4.4):
//! APIs added after KIP-219 throttle in every version that has the field.
//!
//! In every response that has it, `throttle_time_ms` is the first field of the body,
//! except in OffsetDelete (after the error code), Produce (after the per-topic responses)
//! and ApiVersions (after the API ranges), which are decoded whole, and in the
//! delegation-token APIs, which this client does not send (checked against every
//! `*Response.json` schema of kafka-clients 4.4).
//!
//! ```
//! use bytes::Bytes;
//! use kafkapipe::protocol::{throttle, ApiKey};
//! // A Fetch v12 response body starts with throttle_time_ms = 250.
//! let body = Bytes::from_static(&[0, 0, 0, 250, 0, 0]);
//! assert_eq!(throttle::client_throttle_ms(ApiKey::FETCH, 12, &body), Some(250));
//! // Fetch v7 was throttled by the broker delaying the response: nothing to honour.
//! assert_eq!(throttle::client_throttle_ms(ApiKey::FETCH, 7, &body), None);
//! ```

use bytes::Bytes;

use super::messages::{ApiVersionsResponse, ProduceResponse};
use super::{ApiKey, Decode};

/// The first version of `api` whose response the client throttles on (see the module
/// docs), or `None` for APIs without a throttle time (SaslHandshake, SaslAuthenticate)
/// and APIs this table does not know.
///
/// ```
/// use kafkapipe::protocol::{throttle, ApiKey};
/// assert_eq!(throttle::first_client_throttled_version(ApiKey::PRODUCE), Some(6));
/// assert_eq!(throttle::first_client_throttled_version(ApiKey::SASL_HANDSHAKE), None);
/// ```
pub fn first_client_throttled_version(api: ApiKey) -> Option<i16> {
    let v = match api.0 {
        0 => 6,                 // Produce
        1 => 8,                 // Fetch
        2 => 3,                 // ListOffsets
        3 => 6,                 // Metadata
        8 | 9 => 4,             // OffsetCommit, OffsetFetch
        10 => 2,                // FindCoordinator
        11 => 3,                // JoinGroup
        12..=16 => 2,           // Heartbeat, LeaveGroup, SyncGroup, DescribeGroups, ListGroups
        18 => 2,                // ApiVersions
        19 => 3,                // CreateTopics
        20 => 2,                // DeleteTopics
        21 | 22 => 1,           // DeleteRecords, InitProducerId
        23 => 2,                // OffsetForLeaderEpoch (the field since v2)
        24..=26 | 28..=31 => 1, // transactions, ACLs
        32 => 2,                // DescribeConfigs
        33..=35 | 37 | 42 => 1, // AlterConfigs, log dirs, CreatePartitions, DeleteGroups
        // The delegation-token APIs (38–41) have variable fields before the throttle
        // time; this client does not send them.
        // Added after KIP-219: throttled in every version.
        43..=49 | 50 | 51 | 57 | 60 | 61 | 65 | 66 | 68 | 69 | 71 | 72 | 74..=79 | 90..=92 => 0,
        _ => return None,
    };
    Some(v)
}

/// The throttle time in milliseconds that a response of `api` at `version` with `body`
/// (the bytes after the response header) asks the client to honour: `Some` only when the
/// API and version are client-throttled (see [`first_client_throttled_version`]) and the
/// time is positive. An undecodable body yields `None` (the caller's own decode reports
/// it).
///
/// ```
/// use bytes::Bytes;
/// use kafkapipe::protocol::{throttle, ApiKey};
/// let body = Bytes::from_static(&[0, 0, 0, 0, 0, 0]);
/// assert_eq!(throttle::client_throttle_ms(ApiKey::METADATA, 12, &body), None);
/// ```
pub fn client_throttle_ms(api: ApiKey, version: i16, body: &Bytes) -> Option<i32> {
    let first = first_client_throttled_version(api)?;
    if version < first {
        return None;
    }
    let ms = match api {
        ApiKey::PRODUCE => {
            ProduceResponse::decode(&mut body.clone(), version)
                .ok()?
                .throttle_time_ms
        }
        ApiKey::API_VERSIONS => {
            ApiVersionsResponse::decode(&mut body.clone(), version)
                .ok()?
                .throttle_time_ms
        }
        // OffsetDelete: error_code (int16), then throttle_time_ms.
        ApiKey::OFFSET_DELETE => {
            let b = body.get(2..6)?;
            i32::from_be_bytes([b[0], b[1], b[2], b[3]])
        }
        _ => {
            let b = body.get(..4)?;
            i32::from_be_bytes([b[0], b[1], b[2], b[3]])
        }
    };
    (ms > 0).then_some(ms)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::messages::{
        FetchResponse, MetadataResponse, ProduceTopicResponse, ShareFetchResponse,
    };
    use crate::protocol::{Encode, Request};
    use bytes::BytesMut;

    fn encoded<T: Encode>(v: &T, version: i16) -> Bytes {
        let mut buf = BytesMut::new();
        v.encode(&mut buf, version).unwrap();
        buf.freeze()
    }

    #[test]
    fn reads_the_first_field_of_every_version_that_throttles() {
        for version in 8..=crate::protocol::messages::FetchRequest::MAX_VERSION {
            let resp = FetchResponse {
                throttle_time_ms: 1234,
                ..FetchResponse::default()
            };
            let body = encoded(&resp, version);
            assert_eq!(
                client_throttle_ms(ApiKey::FETCH, version, &body),
                Some(1234),
                "fetch v{version}"
            );
        }
        for version in 6..=crate::protocol::messages::MetadataRequest::MAX_VERSION {
            let resp = MetadataResponse {
                throttle_time_ms: 7,
                ..MetadataResponse::default()
            };
            let body = encoded(&resp, version);
            assert_eq!(
                client_throttle_ms(ApiKey::METADATA, version, &body),
                Some(7)
            );
        }
        let resp = ShareFetchResponse {
            throttle_time_ms: 9,
            ..ShareFetchResponse::default()
        };
        let v = crate::protocol::messages::ShareFetchRequest::MAX_VERSION;
        assert_eq!(
            client_throttle_ms(ApiKey::SHARE_FETCH, v, &encoded(&resp, v)),
            Some(9)
        );
    }

    #[test]
    fn produce_and_api_versions_are_decoded_whole() {
        for version in 6..=crate::protocol::messages::ProduceRequest::MAX_VERSION {
            let resp = ProduceResponse {
                responses: vec![ProduceTopicResponse::default()],
                throttle_time_ms: 500,
                ..ProduceResponse::default()
            };
            let body = encoded(&resp, version);
            assert_eq!(
                client_throttle_ms(ApiKey::PRODUCE, version, &body),
                Some(500),
                "produce v{version}"
            );
        }
        let resp = ApiVersionsResponse {
            throttle_time_ms: 3,
            ..ApiVersionsResponse::default()
        };
        assert_eq!(
            client_throttle_ms(ApiKey::API_VERSIONS, 3, &encoded(&resp, 3)),
            Some(3)
        );
    }

    /// OffsetDelete has its error code before the throttle time: a NOT_COORDINATOR (16)
    /// with no throttle once read as 1048576 ms (0x0010_0000), holding the connection
    /// for 17 minutes.
    #[test]
    fn offset_delete_reads_the_throttle_after_the_error_code() {
        use crate::protocol::messages::OffsetDeleteResponse;
        for version in 0..=crate::protocol::messages::OffsetDeleteRequest::MAX_VERSION {
            let resp = OffsetDeleteResponse {
                error_code: 16,
                ..OffsetDeleteResponse::default()
            };
            let body = encoded(&resp, version);
            assert_eq!(
                client_throttle_ms(ApiKey::OFFSET_DELETE, version, &body),
                None
            );
            let resp = OffsetDeleteResponse {
                error_code: 16,
                throttle_time_ms: 250,
                ..OffsetDeleteResponse::default()
            };
            let body = encoded(&resp, version);
            assert_eq!(
                client_throttle_ms(ApiKey::OFFSET_DELETE, version, &body),
                Some(250)
            );
        }
    }

    /// Delegation-token responses have variable fields before the throttle time; this
    /// client does not send them, and must not guess at their bodies.
    #[test]
    fn delegation_token_responses_are_not_read() {
        let body = Bytes::from_static(&[0, 16, 0, 0, 0, 0, 0, 0]);
        for api in 38..=41 {
            assert_eq!(client_throttle_ms(ApiKey(api), 3, &body), None, "api {api}");
        }
    }

    #[test]
    fn broker_throttled_versions_zero_and_garbage_are_none() {
        let resp = ProduceResponse {
            throttle_time_ms: 500,
            ..ProduceResponse::default()
        };
        // v5: the broker delayed the response itself (pre KIP-219).
        assert_eq!(
            client_throttle_ms(ApiKey::PRODUCE, 5, &encoded(&resp, 5)),
            None
        );
        let zero = Bytes::from_static(&[0, 0, 0, 0]);
        assert_eq!(client_throttle_ms(ApiKey::FETCH, 12, &zero), None);
        let negative = Bytes::from_static(&[0xff, 0xff, 0xff, 0xff]);
        assert_eq!(client_throttle_ms(ApiKey::FETCH, 12, &negative), None);
        let short = Bytes::from_static(&[0, 1]);
        assert_eq!(client_throttle_ms(ApiKey::FETCH, 12, &short), None);
        assert_eq!(client_throttle_ms(ApiKey::PRODUCE, 9, &short), None);
        assert_eq!(
            client_throttle_ms(ApiKey::SASL_AUTHENTICATE, 2, &zero),
            None
        );
        assert_eq!(client_throttle_ms(ApiKey(9999), 0, &zero), None);
    }
}
