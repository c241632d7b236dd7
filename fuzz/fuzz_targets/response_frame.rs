//! Fuzz response decoding: a response header followed by a message body.
//!
//! The first input byte picks the message type, the second the API version (modulo the
//! implemented range); the rest is the frame after its length prefix. Add a match arm per
//! response type as they land.
#![no_main]

use bytes::{Bytes, BytesMut};
use kafkapipe::protocol::messages::*;
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
    let [selector, version, rest @ ..] = data else {
        return;
    };
    let mut buf = Bytes::copy_from_slice(rest);
    let version = i16::from(*version);
    match selector % 33 {
        0 => frame::<ApiVersionsRequest>(&mut buf, version),
        1 => frame::<MetadataRequest>(&mut buf, version),
        2 => frame::<ProduceRequest>(&mut buf, version),
        3 => frame::<FetchRequest>(&mut buf, version),
        4 => frame::<ListOffsetsRequest>(&mut buf, version),
        5 => frame::<CreateTopicsRequest>(&mut buf, version),
        6 => frame::<DeleteTopicsRequest>(&mut buf, version),
        7 => frame::<DescribeConfigsRequest>(&mut buf, version),
        8 => frame::<IncrementalAlterConfigsRequest>(&mut buf, version),
        9 => frame::<AlterConfigsRequest>(&mut buf, version),
        10 => frame::<CreatePartitionsRequest>(&mut buf, version),
        11 => frame::<DeleteRecordsRequest>(&mut buf, version),
        12 => frame::<DescribeClusterRequest>(&mut buf, version),
        13 => frame::<FindCoordinatorRequest>(&mut buf, version),
        14 => frame::<ListGroupsRequest>(&mut buf, version),
        15 => frame::<DescribeGroupsRequest>(&mut buf, version),
        16 => frame::<DeleteGroupsRequest>(&mut buf, version),
        17 => frame::<OffsetFetchRequest>(&mut buf, version),
        18 => frame::<OffsetCommitRequest>(&mut buf, version),
        19 => frame::<OffsetDeleteRequest>(&mut buf, version),
        20 => frame::<AddPartitionsToTxnRequest>(&mut buf, version),
        21 => frame::<AddOffsetsToTxnRequest>(&mut buf, version),
        22 => frame::<EndTxnRequest>(&mut buf, version),
        23 => frame::<TxnOffsetCommitRequest>(&mut buf, version),
        24 => frame::<ConsumerGroupHeartbeatRequest>(&mut buf, version),
        25 => frame::<ConsumerGroupDescribeRequest>(&mut buf, version),
        26 => frame::<ShareGroupHeartbeatRequest>(&mut buf, version),
        27 => frame::<ShareGroupDescribeRequest>(&mut buf, version),
        28 => frame::<ShareFetchRequest>(&mut buf, version),
        29 => frame::<ShareAcknowledgeRequest>(&mut buf, version),
        30 => frame::<DescribeShareGroupOffsetsRequest>(&mut buf, version),
        31 => frame::<AlterShareGroupOffsetsRequest>(&mut buf, version),
        _ => frame::<DeleteShareGroupOffsetsRequest>(&mut buf, version),
    }
});
