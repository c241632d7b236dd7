//! Produce (key 0): append record batches to partitions.
//!
//! Versions 3–13 (3 is the first that carries record batch v2 and a transactional id).
//! v5 adds the log start offset to the response; v8 per-record errors and an error
//! message; v9 is flexible; v10 adds the `current_leader` (partition tag 0) and
//! `node_endpoints` (response tag 0) tagged fields for KIP-951 leader discovery; v13
//! replaces topic names with topic ids. The `records` are raw record-batch bytes
//! ([`BatchBytes`]: a producer's large values may be spliced in), left to
//! [`crate::record`].

use bytes::{BufMut, Bytes, BytesMut};

use super::{get_tagged_if, parse_tagged, put_tagged_if, tagged_value};
use crate::error::Result;
use crate::protocol::batch_bytes::BatchBytes;
use crate::protocol::primitives::*;
use crate::protocol::{check_version, ApiKey, Decode, Encode, Request, Splices, TaggedFields};

/// Produce request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProduceRequest {
    /// The transactional id, or `None` when not transactional.
    pub transactional_id: Option<String>,
    /// Required acknowledgements: 0, 1 or -1 (all in-sync replicas).
    pub acks: i16,
    /// How long the broker may wait for the acknowledgements, in ms.
    pub timeout_ms: i32,
    /// The data to write, per topic.
    pub topic_data: Vec<ProduceTopicData>,
    /// Unknown tagged fields. Flexible versions only.
    pub tagged_fields: TaggedFields,
}

/// One topic's data in a [`ProduceRequest`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProduceTopicData {
    /// The topic name. Versions 3–12.
    pub name: String,
    /// The topic id. Added in version 13.
    pub topic_id: [u8; 16],
    /// The data to write, per partition.
    pub partition_data: Vec<ProducePartitionData>,
    /// Unknown tagged fields. Flexible versions only.
    pub tagged_fields: TaggedFields,
}

/// One partition's data in a [`ProduceTopicData`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProducePartitionData {
    /// The partition index.
    pub index: i32,
    /// The encoded record batch(es), undecoded.
    pub records: Option<BatchBytes>,
    /// Unknown tagged fields. Flexible versions only.
    pub tagged_fields: TaggedFields,
}

impl Request for ProduceRequest {
    const API_KEY: ApiKey = ApiKey::PRODUCE;
    const MIN_VERSION: i16 = 3;
    const MAX_VERSION: i16 = 13;
    const FIRST_FLEXIBLE: i16 = 9;
    type Response = ProduceResponse;
}

/// Record batches at least this large are spliced rather than copied by
/// [`Encode::encode_spliced`]; smaller ones cost less to copy than an extra piece. Values
/// spliced into a batch ([`BatchBytes`]) stay spliced, and the buffer around them is
/// copied when its pieces are smaller than this.
const SPLICE_MIN: usize = 8 * 1024;

impl Encode for ProduceRequest {
    fn encode(&self, buf: &mut BytesMut, version: i16) -> Result<()> {
        self.encode_into(buf, None, version)
    }

    fn encode_spliced(
        &self,
        buf: &mut BytesMut,
        splices: &mut Splices,
        version: i16,
    ) -> Result<()> {
        self.encode_into(buf, Some(splices), version)
    }
}

impl ProduceRequest {
    /// Encode into `buf`; with `splices`, record batches of [`SPLICE_MIN`] bytes or more
    /// (and values spliced into a batch) go there instead of being copied.
    fn encode_into(
        &self,
        buf: &mut BytesMut,
        mut splices: Option<&mut Splices>,
        version: i16,
    ) -> Result<()> {
        check_version::<Self>(version)?;
        let flexible = version >= 9;
        // The record batches dominate: room for all those copied at once, rather than
        // growing (and copying) the buffer several times on the way to a megabyte or more.
        let copied = |records: &BatchBytes| {
            if splices.is_none() {
                records.len()
            } else if records.is_contiguous() {
                if records.len() >= SPLICE_MIN {
                    0
                } else {
                    records.len()
                }
            } else {
                records.head().len()
            }
        };
        let records: usize = self
            .topic_data
            .iter()
            .map(|t| {
                t.name.len()
                    + 32
                    + t.partition_data
                        .iter()
                        .map(|p| p.records.as_ref().map_or(0, copied) + 16)
                        .sum::<usize>()
            })
            .sum();
        buf.reserve(records.saturating_add(64));
        put_nullable_string(buf, self.transactional_id.as_deref(), flexible)?;
        buf.put_i16(self.acks);
        buf.put_i32(self.timeout_ms);
        put_array(buf, &self.topic_data, flexible, |buf, t| {
            if version <= 12 {
                put_string(buf, &t.name, flexible)?;
            } else {
                buf.put_slice(&t.topic_id);
            }
            put_array(buf, &t.partition_data, flexible, |buf, p| {
                buf.put_i32(p.index);
                match (splices.as_deref_mut(), &p.records) {
                    (_, None) => put_nullable_bytes(buf, None, flexible)?,
                    (Some(splices), Some(records)) if !records.is_contiguous() => {
                        put_bytes_len(buf, records.len(), flexible)?;
                        put_spliced(buf, splices, records);
                    }
                    (Some(splices), Some(records)) if records.len() >= SPLICE_MIN => {
                        put_bytes_len(buf, records.len(), flexible)?;
                        splices.push(buf.len(), records.head().clone());
                    }
                    (_, Some(records)) => {
                        put_bytes_len(buf, records.len(), flexible)?;
                        for piece in records.pieces() {
                            buf.put_slice(piece);
                        }
                    }
                }
                put_tagged_if(buf, flexible, &p.tagged_fields)
            })?;
            put_tagged_if(buf, flexible, &t.tagged_fields)
        })?;
        put_tagged_if(buf, flexible, &self.tagged_fields)
    }
}

/// Put `records`, which hold spliced values, into `buf` and `splices`: the values stay
/// spliced, so do pieces of the batch's buffer of [`SPLICE_MIN`] bytes or more; smaller
/// pieces (record headers between values) are copied.
fn put_spliced(buf: &mut BytesMut, splices: &mut Splices, records: &BatchBytes) {
    let head = records.head();
    let put_head = |buf: &mut BytesMut, splices: &mut Splices, from: usize, to: usize| {
        if to - from >= SPLICE_MIN {
            splices.push(buf.len(), head.slice(from..to));
        } else {
            buf.put_slice(&head[from..to]);
        }
    };
    let mut from = 0;
    for (at, value) in records.spliced_values() {
        let at = (*at).clamp(from, head.len());
        put_head(buf, splices, from, at);
        splices.push(buf.len(), value.clone());
        from = at;
    }
    put_head(buf, splices, from, head.len());
}

impl Decode for ProduceRequest {
    fn decode(buf: &mut Bytes, version: i16) -> Result<Self> {
        check_version::<Self>(version)?;
        let flexible = version >= 9;
        let transactional_id = get_nullable_string(buf, flexible)?;
        let acks = get_i16(buf)?;
        let timeout_ms = get_i32(buf)?;
        let topic_data = get_array(buf, flexible, 2, |buf| {
            let mut t = ProduceTopicData::default();
            if version <= 12 {
                t.name = get_string(buf, flexible)?;
            } else {
                t.topic_id = get_uuid(buf)?;
            }
            t.partition_data = get_array(buf, flexible, 5, |buf| {
                Ok(ProducePartitionData {
                    index: get_i32(buf)?,
                    records: get_nullable_bytes(buf, flexible)?.map(BatchBytes::from),
                    tagged_fields: get_tagged_if(buf, flexible)?,
                })
            })?;
            t.tagged_fields = get_tagged_if(buf, flexible)?;
            Ok(t)
        })?;
        let tagged_fields = get_tagged_if(buf, flexible)?;
        Ok(ProduceRequest {
            transactional_id,
            acks,
            timeout_ms,
            topic_data,
            tagged_fields,
        })
    }
}

/// A partition leader and its epoch, sent as a tagged field (KIP-951) in Produce and
/// Fetch responses. Always encoded in flexible (compact) form.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaderIdAndEpoch {
    /// The leader's broker id, or -1.
    pub leader_id: i32,
    /// The leader epoch, or -1.
    pub leader_epoch: i32,
    /// Unknown tagged fields.
    pub tagged_fields: TaggedFields,
}

impl Default for LeaderIdAndEpoch {
    fn default() -> Self {
        LeaderIdAndEpoch {
            leader_id: -1,
            leader_epoch: -1,
            tagged_fields: TaggedFields::new(),
        }
    }
}

impl LeaderIdAndEpoch {
    pub(crate) fn put(&self, buf: &mut BytesMut) -> Result<()> {
        buf.put_i32(self.leader_id);
        buf.put_i32(self.leader_epoch);
        put_tagged_fields(buf, &[], &self.tagged_fields)
    }

    pub(crate) fn get(buf: &mut Bytes) -> Result<Self> {
        Ok(LeaderIdAndEpoch {
            leader_id: get_i32(buf)?,
            leader_epoch: get_i32(buf)?,
            tagged_fields: get_tagged_fields(buf)?,
        })
    }
}

/// A broker endpoint, sent as a tagged field (KIP-951) in Produce and Fetch responses so
/// that clients can reach a new leader without a metadata refresh. Always compact.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeEndpoint {
    /// The broker id.
    pub node_id: i32,
    /// The broker's host name.
    pub host: String,
    /// The broker's port.
    pub port: i32,
    /// The broker's rack, if any.
    pub rack: Option<String>,
    /// Unknown tagged fields.
    pub tagged_fields: TaggedFields,
}

impl NodeEndpoint {
    pub(crate) fn put_all(buf: &mut BytesMut, all: &[NodeEndpoint]) -> Result<()> {
        put_array(buf, all, true, |buf, n| {
            buf.put_i32(n.node_id);
            put_string(buf, &n.host, true)?;
            buf.put_i32(n.port);
            put_nullable_string(buf, n.rack.as_deref(), true)?;
            put_tagged_fields(buf, &[], &n.tagged_fields)
        })
    }

    pub(crate) fn get_all(buf: &mut Bytes) -> Result<Vec<NodeEndpoint>> {
        get_array(buf, true, 11, |buf| {
            Ok(NodeEndpoint {
                node_id: get_i32(buf)?,
                host: get_string(buf, true)?,
                port: get_i32(buf)?,
                rack: get_nullable_string(buf, true)?,
                tagged_fields: get_tagged_fields(buf)?,
            })
        })
    }
}

/// Produce response.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProduceResponse {
    /// Per-topic results.
    pub responses: Vec<ProduceTopicResponse>,
    /// Throttle duration in ms.
    pub throttle_time_ms: i32,
    /// Endpoints of the brokers named in `current_leader` fields (tag 0). Added in
    /// version 10; `None` when absent.
    pub node_endpoints: Option<Vec<NodeEndpoint>>,
    /// Unknown tagged fields. Flexible versions only.
    pub tagged_fields: TaggedFields,
}

/// One topic's results in a [`ProduceResponse`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProduceTopicResponse {
    /// The topic name. Versions 3–12.
    pub name: String,
    /// The topic id. Added in version 13.
    pub topic_id: [u8; 16],
    /// Per-partition results.
    pub partition_responses: Vec<ProducePartitionResponse>,
    /// Unknown tagged fields. Flexible versions only.
    pub tagged_fields: TaggedFields,
}

/// One partition's result in a [`ProduceTopicResponse`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProducePartitionResponse {
    /// The partition index.
    pub index: i32,
    /// The error code, or 0.
    pub error_code: i16,
    /// The offset of the first record appended.
    pub base_offset: i64,
    /// The broker's append time when the topic uses `LogAppendTime`, else -1.
    pub log_append_time_ms: i64,
    /// The partition's log start offset. Added in version 5; default -1.
    pub log_start_offset: i64,
    /// The batch-relative indexes of records that caused the batch to be dropped.
    /// Added in version 8.
    pub record_errors: Vec<BatchIndexAndErrorMessage>,
    /// A summary error message. Added in version 8.
    pub error_message: Option<String>,
    /// The current leader, sent with `NOT_LEADER_OR_FOLLOWER` (tag 0). Added in
    /// version 10; `None` when absent.
    pub current_leader: Option<LeaderIdAndEpoch>,
    /// Unknown tagged fields. Flexible versions only.
    pub tagged_fields: TaggedFields,
}

impl Default for ProducePartitionResponse {
    fn default() -> Self {
        ProducePartitionResponse {
            index: 0,
            error_code: 0,
            base_offset: 0,
            log_append_time_ms: -1,
            log_start_offset: -1,
            record_errors: Vec::new(),
            error_message: None,
            current_leader: None,
            tagged_fields: TaggedFields::new(),
        }
    }
}

/// A record that caused its batch to be rejected. Added in version 8.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BatchIndexAndErrorMessage {
    /// The index of the record within its batch.
    pub batch_index: i32,
    /// The record's error message.
    pub batch_index_error_message: Option<String>,
    /// Unknown tagged fields. Flexible versions only.
    pub tagged_fields: TaggedFields,
}

impl Encode for ProduceResponse {
    fn encode(&self, buf: &mut BytesMut, version: i16) -> Result<()> {
        check_version::<ProduceRequest>(version)?;
        let flexible = version >= 9;
        put_array(buf, &self.responses, flexible, |buf, t| {
            if version <= 12 {
                put_string(buf, &t.name, flexible)?;
            } else {
                buf.put_slice(&t.topic_id);
            }
            put_array(buf, &t.partition_responses, flexible, |buf, p| {
                buf.put_i32(p.index);
                buf.put_i16(p.error_code);
                buf.put_i64(p.base_offset);
                buf.put_i64(p.log_append_time_ms);
                if version >= 5 {
                    buf.put_i64(p.log_start_offset);
                }
                if version >= 8 {
                    put_array(buf, &p.record_errors, flexible, |buf, e| {
                        buf.put_i32(e.batch_index);
                        put_nullable_string(buf, e.batch_index_error_message.as_deref(), flexible)?;
                        put_tagged_if(buf, flexible, &e.tagged_fields)
                    })?;
                    put_nullable_string(buf, p.error_message.as_deref(), flexible)?;
                }
                if flexible {
                    let mut known = Vec::new();
                    if let (true, Some(l)) = (version >= 10, &p.current_leader) {
                        known.push((0, tagged_value(|b| l.put(b))?));
                    }
                    put_tagged_fields(buf, &known, &p.tagged_fields)?;
                }
                Ok(())
            })?;
            put_tagged_if(buf, flexible, &t.tagged_fields)
        })?;
        buf.put_i32(self.throttle_time_ms);
        if flexible {
            let mut known = Vec::new();
            if let (true, Some(n)) = (version >= 10, &self.node_endpoints) {
                known.push((0, tagged_value(|b| NodeEndpoint::put_all(b, n))?));
            }
            put_tagged_fields(buf, &known, &self.tagged_fields)?;
        }
        Ok(())
    }
}

impl Decode for ProduceResponse {
    fn decode(buf: &mut Bytes, version: i16) -> Result<Self> {
        check_version::<ProduceRequest>(version)?;
        let flexible = version >= 9;
        let responses = get_array(buf, flexible, 2, |buf| {
            let mut t = ProduceTopicResponse::default();
            if version <= 12 {
                t.name = get_string(buf, flexible)?;
            } else {
                t.topic_id = get_uuid(buf)?;
            }
            t.partition_responses = get_array(buf, flexible, 22, |buf| {
                let mut p = ProducePartitionResponse {
                    index: get_i32(buf)?,
                    error_code: get_i16(buf)?,
                    base_offset: get_i64(buf)?,
                    log_append_time_ms: get_i64(buf)?,
                    ..ProducePartitionResponse::default()
                };
                if version >= 5 {
                    p.log_start_offset = get_i64(buf)?;
                }
                if version >= 8 {
                    p.record_errors = get_array(buf, flexible, 5, |buf| {
                        Ok(BatchIndexAndErrorMessage {
                            batch_index: get_i32(buf)?,
                            batch_index_error_message: get_nullable_string(buf, flexible)?,
                            tagged_fields: get_tagged_if(buf, flexible)?,
                        })
                    })?;
                    p.error_message = get_nullable_string(buf, flexible)?;
                }
                if flexible {
                    let mut current_leader = None;
                    p.tagged_fields = get_tagged_fields_with(buf, |tag, v| {
                        if tag == 0 && version >= 10 {
                            current_leader = parse_tagged(v, LeaderIdAndEpoch::get);
                            return Ok(current_leader.is_some());
                        }
                        Ok(false)
                    })?;
                    p.current_leader = current_leader;
                }
                Ok(p)
            })?;
            t.tagged_fields = get_tagged_if(buf, flexible)?;
            Ok(t)
        })?;
        let throttle_time_ms = get_i32(buf)?;
        let mut node_endpoints = None;
        let tagged_fields = if flexible {
            get_tagged_fields_with(buf, |tag, v| {
                if tag == 0 && version >= 10 {
                    node_endpoints = parse_tagged(v, NodeEndpoint::get_all);
                    return Ok(node_endpoints.is_some());
                }
                Ok(false)
            })?
        } else {
            TaggedFields::new()
        };
        Ok(ProduceResponse {
            responses,
            throttle_time_ms,
            node_endpoints,
            tagged_fields,
        })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::protocol::messages::testutil::*;
    use proptest::prelude::*;

    const VERSIONS: std::ops::RangeInclusive<i16> = 3..=13;

    fn request() -> impl Strategy<Value = ProduceRequest> {
        let partition = (any::<i32>(), opt_bytes(), tagged()).prop_map(|(index, records, tf)| {
            ProducePartitionData {
                index,
                records: records.map(BatchBytes::from),
                tagged_fields: tf,
            }
        });
        let topic = (string(), any::<[u8; 16]>(), vec(partition, 3), tagged()).prop_map(
            |(name, id, parts, tf)| ProduceTopicData {
                name,
                topic_id: id,
                partition_data: parts,
                tagged_fields: tf,
            },
        );
        (
            opt_string(),
            any::<i16>(),
            any::<i32>(),
            vec(topic, 3),
            tagged(),
        )
            .prop_map(|(tid, acks, timeout_ms, topic_data, tf)| ProduceRequest {
                transactional_id: tid,
                acks,
                timeout_ms,
                topic_data,
                tagged_fields: tf,
            })
    }

    fn normalize_request(mut r: ProduceRequest, v: i16) -> ProduceRequest {
        let flexible = v >= 9;
        for t in &mut r.topic_data {
            if v <= 12 {
                t.topic_id = [0; 16];
            } else {
                t.name.clear();
            }
            for p in &mut t.partition_data {
                if !flexible {
                    p.tagged_fields = TaggedFields::new();
                }
            }
            if !flexible {
                t.tagged_fields = TaggedFields::new();
            }
        }
        if !flexible {
            r.tagged_fields = TaggedFields::new();
        }
        r
    }

    pub(crate) fn leader() -> impl Strategy<Value = LeaderIdAndEpoch> {
        (any::<i32>(), any::<i32>(), tagged()).prop_map(|(l, e, tf)| LeaderIdAndEpoch {
            leader_id: l,
            leader_epoch: e,
            tagged_fields: tf,
        })
    }

    pub(crate) fn endpoints() -> impl Strategy<Value = Option<Vec<NodeEndpoint>>> {
        let ep = (any::<i32>(), string(), any::<i32>(), opt_string(), tagged()).prop_map(
            |(node_id, host, port, rack, tf)| NodeEndpoint {
                node_id,
                host,
                port,
                rack,
                tagged_fields: tf,
            },
        );
        prop::option::of(vec(ep, 3))
    }

    fn response() -> impl Strategy<Value = ProduceResponse> {
        let rec_err = (any::<i32>(), opt_string(), tagged()).prop_map(|(i, m, tf)| {
            BatchIndexAndErrorMessage {
                batch_index: i,
                batch_index_error_message: m,
                tagged_fields: tf,
            }
        });
        let partition = (
            any::<(i32, i16, i64, i64, i64)>(),
            vec(rec_err, 3),
            opt_string(),
            prop::option::of(leader()),
            tagged(),
        )
            .prop_map(|((i, e, bo, lat, lso), errs, msg, cl, tf)| {
                ProducePartitionResponse {
                    index: i,
                    error_code: e,
                    base_offset: bo,
                    log_append_time_ms: lat,
                    log_start_offset: lso,
                    record_errors: errs,
                    error_message: msg,
                    current_leader: cl,
                    tagged_fields: tf,
                }
            });
        let topic = (string(), any::<[u8; 16]>(), vec(partition, 3), tagged()).prop_map(
            |(name, id, parts, tf)| ProduceTopicResponse {
                name,
                topic_id: id,
                partition_responses: parts,
                tagged_fields: tf,
            },
        );
        (vec(topic, 3), any::<i32>(), endpoints(), tagged()).prop_map(|(responses, th, ne, tf)| {
            ProduceResponse {
                responses,
                throttle_time_ms: th,
                node_endpoints: ne,
                tagged_fields: tf,
            }
        })
    }

    fn normalize_response(mut r: ProduceResponse, v: i16) -> ProduceResponse {
        let flexible = v >= 9;
        for t in &mut r.responses {
            if v <= 12 {
                t.topic_id = [0; 16];
            } else {
                t.name.clear();
            }
            for p in &mut t.partition_responses {
                if v < 5 {
                    p.log_start_offset = -1;
                }
                if v < 8 {
                    p.record_errors.clear();
                    p.error_message = None;
                }
                if v < 10 {
                    p.current_leader = None;
                }
                if !flexible {
                    p.record_errors
                        .iter_mut()
                        .for_each(|e| e.tagged_fields = TaggedFields::new());
                    p.tagged_fields = TaggedFields::new();
                }
            }
            if !flexible {
                t.tagged_fields = TaggedFields::new();
            }
        }
        if v < 10 {
            r.node_endpoints = None;
        }
        if !flexible {
            r.tagged_fields = TaggedFields::new();
        }
        r
    }

    proptest! {
        #[test]
        fn request_roundtrip(r in request()) {
            for v in VERSIONS {
                roundtrip(&normalize_request(r.clone(), v), v)?;
            }
        }

        #[test]
        fn response_roundtrip(r in response()) {
            for v in VERSIONS {
                roundtrip(&normalize_response(r.clone(), v), v)?;
            }
        }

        #[test]
        fn a_spliced_encoding_assembles_to_the_plain_one(
            r in request(),
            sizes in vec(
                (prop_oneof![0..40usize, SPLICE_MIN - 1..SPLICE_MIN + 2, 20_000..20_010usize], any::<u8>()),
                9,
            ),
        ) {
            // the request's partitions get records around the splice threshold
            let mut r = r;
            let mut sizes = sizes.into_iter().cycle();
            for p in r.topic_data.iter_mut().flat_map(|t| t.partition_data.iter_mut()) {
                if let Some((n, seed)) = sizes.next() {
                    p.records = Some((0..n).map(|i| (i as u8).wrapping_mul(seed)).collect());
                }
            }
            for v in VERSIONS {
                let r = normalize_request(r.clone(), v);
                let mut whole = BytesMut::new();
                r.encode(&mut whole, v).unwrap();
                let (mut head, mut splices) = (BytesMut::from(&b"head"[..]), Splices::new());
                r.encode_spliced(&mut head, &mut splices, v).unwrap();
                prop_assert_eq!(&head[..4], b"head");
                let big = r
                    .topic_data
                    .iter()
                    .flat_map(|t| t.partition_data.iter())
                    .filter_map(|p| p.records.as_ref())
                    .filter(|b| b.len() >= SPLICE_MIN)
                    .map(BatchBytes::len)
                    .sum::<usize>();
                prop_assert_eq!(splices.len(), big);
                prop_assert_eq!(&splices.assemble(&head)[4..], &whole[..]);
            }
        }

        #[test]
        fn batches_with_spliced_values_encode_as_their_bytes(
            r in request(),
            cuts in proptest::collection::vec((0..40_000usize, 0..20_000usize), 0..5),
            buffer in 0..40_000usize,
        ) {
            // every partition gets a batch with values spliced into its buffer; written
            // plainly or spliced, the request is the one with the bytes in one piece
            let data: Vec<u8> = (0..buffer + cuts.iter().map(|c| c.1).sum::<usize>())
                .map(|i| (i % 251) as u8)
                .collect();
            let mut cuts = cuts;
            cuts.sort_unstable();
            let batch = BatchBytes::cut(&data, &cuts);
            let mut r = r;
            let mut plain = r.clone();
            for p in r.topic_data.iter_mut().flat_map(|t| t.partition_data.iter_mut()) {
                p.records = Some(batch.clone());
            }
            for p in plain.topic_data.iter_mut().flat_map(|t| t.partition_data.iter_mut()) {
                p.records = Some(BatchBytes::from(data.clone()));
            }
            prop_assert_eq!(&r, &plain);
            for v in VERSIONS {
                let (r, plain) = (normalize_request(r.clone(), v), normalize_request(plain.clone(), v));
                let mut whole = BytesMut::new();
                plain.encode(&mut whole, v).unwrap();
                let mut copied = BytesMut::new();
                r.encode(&mut copied, v).unwrap();
                prop_assert_eq!(&copied[..], &whole[..]);
                let (mut head, mut splices) = (BytesMut::new(), Splices::new());
                r.encode_spliced(&mut head, &mut splices, v).unwrap();
                prop_assert_eq!(&splices.assemble(&head)[..], &whole[..]);
                let decoded = ProduceRequest::decode(&mut whole.freeze(), v).unwrap();
                prop_assert_eq!(decoded, r);
            }
        }

        #[test]
        fn arbitrary_bytes_never_panic(data: Vec<u8>) {
            no_panic::<ProduceRequest>(&data, VERSIONS);
            no_panic::<ProduceResponse>(&data, VERSIONS);
        }
    }

    #[test]
    fn current_leader_tag_is_typed_and_reencoded() {
        let resp = ProduceResponse {
            responses: vec![ProduceTopicResponse {
                name: "t".into(),
                partition_responses: vec![ProducePartitionResponse {
                    error_code: 6,
                    current_leader: Some(LeaderIdAndEpoch {
                        leader_id: 3,
                        leader_epoch: 7,
                        tagged_fields: TaggedFields::new(),
                    }),
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        };
        let mut b = BytesMut::new();
        resp.encode(&mut b, 10).unwrap();
        let got = ProduceResponse::decode(&mut b.freeze(), 10).unwrap();
        assert_eq!(got, resp);
        assert!(got.responses[0].partition_responses[0]
            .tagged_fields
            .is_empty());
    }
}
