//! Fuzz response decoding: a response header followed by a message body, for every API
//! the client speaks.
//!
//! The first input byte picks the message type (high 3 bits) and the API version (low 5
//! bits, wrapped into the type's range); the rest is the frame after its length prefix.
//! Whatever decodes is re-encoded; a Fetch response's `records` are decoded as record
//! batches, as `Conn::fetch` does. Selector 7 decodes a request instead (what the test
//! suite's fake broker does), with the API key taken from the request header.
#![no_main]

use bytes::{Bytes, BytesMut};
use kafkapipe::protocol::messages::{
    ApiVersionsRequest, CreateTopicsRequest, DeleteTopicsRequest, FetchRequest, FetchResponse,
    ListOffsetsRequest, MetadataRequest, ProduceRequest,
};
use kafkapipe::protocol::{ApiKey, Decode, Encode, Request, RequestHeader, ResponseHeader};
use libfuzzer_sys::fuzz_target;

/// Map any small number onto `R`'s version range.
fn wrap<R: Request>(version: i16) -> i16 {
    R::MIN_VERSION + version.rem_euclid(R::MAX_VERSION - R::MIN_VERSION + 1)
}

/// Decode header + body of `R`'s response at `version`; re-encode what decodes.
fn frame<R: Request>(frame: &mut Bytes, version: i16) -> Option<R::Response> {
    let version = wrap::<R>(version);
    ResponseHeader::decode(frame, R::response_header_version(version)).ok()?;
    let body = R::Response::decode(frame, version).ok()?;
    let _ = body.encode(&mut BytesMut::new(), version);
    Some(body)
}

/// Decode a request body of `R` at `version`; re-encode what decodes.
fn request<R: Request>(frame: &mut Bytes, version: i16) {
    if version < R::MIN_VERSION || version > R::MAX_VERSION {
        return;
    }
    if RequestHeader::decode(frame, R::request_header_version(version)).is_err() {
        return;
    }
    if let Ok(req) = R::decode(frame, version) {
        let _ = req.encode(&mut BytesMut::new(), version);
    }
}

fn fetch_records(resp: FetchResponse) {
    for p in resp.responses.into_iter().flat_map(|t| t.partitions) {
        if let Some(data) = p.records {
            if let Ok(decoded) = kafkapipe::record::decode_batches(data, 1 << 20) {
                for batch in &decoded.batches {
                    let _ = batch.control_record();
                }
            }
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let mut buf = Bytes::copy_from_slice(rest);
    let version = i16::from(selector & 0x1f);
    match selector >> 5 {
        0 => {
            frame::<ApiVersionsRequest>(&mut buf, version);
        }
        1 => {
            frame::<MetadataRequest>(&mut buf, version);
        }
        2 => {
            frame::<ProduceRequest>(&mut buf, version);
        }
        3 => {
            if let Some(resp) = frame::<FetchRequest>(&mut buf, version) {
                fetch_records(resp);
            }
        }
        4 => {
            frame::<ListOffsetsRequest>(&mut buf, version);
        }
        5 => {
            frame::<CreateTopicsRequest>(&mut buf, version);
        }
        6 => {
            frame::<DeleteTopicsRequest>(&mut buf, version);
        }
        _ => {
            let Ok((key, version, _)) = RequestHeader::peek(&buf) else {
                return;
            };
            match key {
                ApiKey::API_VERSIONS => request::<ApiVersionsRequest>(&mut buf, version),
                ApiKey::METADATA => request::<MetadataRequest>(&mut buf, version),
                ApiKey::PRODUCE => request::<ProduceRequest>(&mut buf, version),
                ApiKey::FETCH => request::<FetchRequest>(&mut buf, version),
                ApiKey::LIST_OFFSETS => request::<ListOffsetsRequest>(&mut buf, version),
                ApiKey::CREATE_TOPICS => request::<CreateTopicsRequest>(&mut buf, version),
                ApiKey::DELETE_TOPICS => request::<DeleteTopicsRequest>(&mut buf, version),
                _ => {}
            }
        }
    }
});
