//! Fuzz response decoding: a response header followed by a message body.
//!
//! The first input byte picks the message type (high bits) and the API version (low
//! bits); the rest is the frame after its length prefix. Only ApiVersions exists so far;
//! add a match arm per response type as they land.
#![no_main]

use bytes::{Bytes, BytesMut};
use kafkapipe::protocol::messages::ApiVersionsRequest;
use kafkapipe::protocol::{Decode, Encode, Request, ResponseHeader};
use libfuzzer_sys::fuzz_target;

/// Decode header + body of `R`'s response at `version`; re-encode what decodes.
fn frame<R: Request>(frame: &mut Bytes, version: i16) {
    let version = R::MIN_VERSION + version.rem_euclid(R::MAX_VERSION - R::MIN_VERSION + 1);
    if ResponseHeader::decode(frame, R::response_header_version(version)).is_err() {
        return;
    }
    if let Ok(body) = R::Response::decode(frame, version) {
        let _ = body.encode(&mut BytesMut::new(), version);
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let mut buf = Bytes::copy_from_slice(rest);
    let version = i16::from(selector & 0x1f);
    // `selector >> 5` will choose among response types once there is more than one.
    frame::<ApiVersionsRequest>(&mut buf, version);
});
