//! The Kafka wire protocol: a pure codec over [`bytes`], no I/O.
//!
//! - [`primitives`]: integers, varints, strings, bytes, arrays, UUIDs, tagged fields.
//! - [`header`]: request header v0–v2 and response header v0–v1.
//! - [`messages`]: one module per API, each with its request and response, both of which
//!   encode *and* decode (so tests and fake peers can play either side).
//! - [`ErrorCode`]: the protocol's error codes.
//! - [`throttle`]: which responses carry a quota throttle time the client honours (KIP-219).
//! - [`consumer_protocol`]: the Java consumer's subscription and assignment bytes carried
//!   inside group requests.
//!
//! Every message implements [`Encode`] and [`Decode`] for an explicit version; requests
//! implement [`Request`], which names the API key, the versions this client speaks, the
//! first flexible version (KIP-482) and the response type.
//!
//! Reference: <https://kafka.apache.org/protocol> and Apache Kafka's message schemas
//! (`clients/src/main/resources/common/message/*.json`).

pub(crate) mod batch_bytes;
pub mod consumer_protocol;
pub mod error;
pub mod header;
pub mod messages;
pub mod primitives;
pub mod throttle;

pub use error::ErrorCode;
pub use header::{RequestHeader, ResponseHeader};
pub use primitives::TaggedFields;

use bytes::{Bytes, BytesMut};

use crate::error::{Error, Result};

/// Encode a value at a protocol version.
pub trait Encode {
    /// Append the encoding of `self` at `version` to `buf`.
    fn encode(&self, buf: &mut BytesMut, version: i16) -> Result<()>;

    /// Like [`Encode::encode`], except that large byte fields may be left out of `buf` and
    /// recorded in `splices` instead, to be written from their own memory (a produce
    /// request's record batches). The default copies everything into `buf`.
    ///
    /// ```
    /// use bytes::{Bytes, BytesMut};
    /// use kafkapipe::protocol::messages::produce::{ProducePartitionData, ProduceRequest, ProduceTopicData};
    /// use kafkapipe::protocol::{Encode, Splices};
    ///
    /// let req = ProduceRequest {
    ///     acks: -1,
    ///     topic_data: vec![ProduceTopicData {
    ///         name: "events".into(),
    ///         partition_data: vec![ProducePartitionData {
    ///             index: 0,
    ///             records: Some(Bytes::from(vec![7u8; 100_000]).into()),
    ///             ..Default::default()
    ///         }],
    ///         ..Default::default()
    ///     }],
    ///     ..Default::default()
    /// };
    /// let (mut head, mut splices) = (BytesMut::new(), Splices::new());
    /// req.encode_spliced(&mut head, &mut splices, 9)?;
    /// assert_eq!(splices.len(), 100_000);
    /// let mut whole = BytesMut::new();
    /// req.encode(&mut whole, 9)?;
    /// assert_eq!(splices.assemble(&head), whole);
    /// # Ok::<(), kafkapipe::Error>(())
    /// ```
    fn encode_spliced(
        &self,
        buf: &mut BytesMut,
        splices: &mut Splices,
        version: i16,
    ) -> Result<()> {
        let _ = splices;
        self.encode(buf, version)
    }
}

/// Byte strings an encoder left out of its buffer (see [`Encode::encode_spliced`]): each
/// belongs at an offset of that buffer, before the byte then at that offset. Writing the
/// buffer's pieces and the splices in turn (a vectored write) sends the whole encoding
/// without copying the splices.
///
/// ```
/// use bytes::Bytes;
/// use kafkapipe::protocol::Splices;
///
/// let mut splices = Splices::new();
/// splices.push(2, Bytes::from_static(b"cd"));
/// let pieces: Vec<&[u8]> = splices.pieces(b"abef").collect();
/// assert_eq!(pieces, [&b"ab"[..], b"cd", b"ef"]);
/// assert_eq!(splices.assemble(b"abef"), &b"abcdef"[..]);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Splices {
    parts: Vec<(usize, Bytes)>,
    len: usize,
}

impl Splices {
    /// No splices.
    pub fn new() -> Self {
        Self::default()
    }

    /// Record `bytes`, belonging at `offset` of the buffer. Offsets must not decrease.
    pub fn push(&mut self, offset: usize, bytes: Bytes) {
        debug_assert!(self.parts.last().is_none_or(|(at, _)| *at <= offset));
        self.len += bytes.len();
        self.parts.push((offset, bytes));
    }

    /// The number of bytes spliced out, together.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing was spliced out.
    pub fn is_empty(&self) -> bool {
        self.parts.is_empty()
    }

    /// The whole encoding in order: pieces of `head` (the buffer the splices were taken
    /// from) and the splices between them. Empty pieces are skipped.
    pub fn pieces<'a>(&'a self, head: &'a [u8]) -> impl Iterator<Item = &'a [u8]> + 'a {
        batch_bytes::parts_of(head, &self.parts).map(|(piece, _)| piece)
    }

    /// The whole encoding in one buffer (a copy: for tests and small frames).
    pub fn assemble(&self, head: &[u8]) -> BytesMut {
        let mut out = BytesMut::with_capacity(head.len() + self.len);
        for piece in self.pieces(head) {
            out.extend_from_slice(piece);
        }
        out
    }
}

/// Decode a value at a protocol version.
pub trait Decode: Sized {
    /// Decode one value at `version` from the front of `buf`.
    fn decode(buf: &mut Bytes, version: i16) -> Result<Self>;
}

/// A request type: what API it belongs to, the versions this client speaks, and its
/// response.
pub trait Request: Encode + Decode {
    /// The API key.
    const API_KEY: ApiKey;
    /// The lowest version this client implements.
    const MIN_VERSION: i16;
    /// The highest version this client implements.
    const MAX_VERSION: i16;
    /// The first flexible version (compact encodings and tagged fields), or `i16::MAX`.
    const FIRST_FLEXIBLE: i16;
    /// The matching response.
    type Response: Encode + Decode;

    /// Whether `version` is flexible.
    fn is_flexible(version: i16) -> bool {
        version >= Self::FIRST_FLEXIBLE
    }

    /// The request header version used with `version`.
    fn request_header_version(version: i16) -> i16 {
        if Self::is_flexible(version) {
            2
        } else {
            1
        }
    }

    /// The response header version used with `version`.
    fn response_header_version(version: i16) -> i16 {
        if Self::is_flexible(version) {
            1
        } else {
            0
        }
    }
}

/// Check that `version` is within `R`'s implemented range.
pub fn check_version<R: Request>(version: i16) -> Result<()> {
    if version < R::MIN_VERSION || version > R::MAX_VERSION {
        Err(Error::new(
            crate::error::ErrorKind::UnsupportedVersion,
            format!(
                "{} version {version} is outside the implemented range {}..={}",
                R::API_KEY,
                R::MIN_VERSION,
                R::MAX_VERSION
            ),
        ))
    } else {
        Ok(())
    }
}

/// A Kafka API key.
///
/// ```
/// use kafkapipe::protocol::ApiKey;
/// assert_eq!(ApiKey::FETCH.0, 1);
/// assert_eq!(ApiKey::FETCH.to_string(), "Fetch");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ApiKey(pub i16);

macro_rules! api_keys {
    ($( $konst:ident = $v:literal, $name:literal; )*) => {
        impl ApiKey {
            $(
                #[doc = concat!("`", $name, "` (", stringify!($v), ")")]
                pub const $konst: ApiKey = ApiKey($v);
            )*

            /// The API's name, or `"Unknown"`.
            pub fn name(self) -> &'static str {
                match self.0 {
                    $( $v => $name, )*
                    _ => "Unknown",
                }
            }
        }
    };
}

api_keys! {
    PRODUCE = 0, "Produce";
    FETCH = 1, "Fetch";
    LIST_OFFSETS = 2, "ListOffsets";
    METADATA = 3, "Metadata";
    OFFSET_COMMIT = 8, "OffsetCommit";
    OFFSET_FETCH = 9, "OffsetFetch";
    FIND_COORDINATOR = 10, "FindCoordinator";
    JOIN_GROUP = 11, "JoinGroup";
    HEARTBEAT = 12, "Heartbeat";
    LEAVE_GROUP = 13, "LeaveGroup";
    SYNC_GROUP = 14, "SyncGroup";
    DESCRIBE_GROUPS = 15, "DescribeGroups";
    LIST_GROUPS = 16, "ListGroups";
    SASL_HANDSHAKE = 17, "SaslHandshake";
    API_VERSIONS = 18, "ApiVersions";
    CREATE_TOPICS = 19, "CreateTopics";
    DELETE_TOPICS = 20, "DeleteTopics";
    DELETE_RECORDS = 21, "DeleteRecords";
    INIT_PRODUCER_ID = 22, "InitProducerId";
    OFFSET_FOR_LEADER_EPOCH = 23, "OffsetForLeaderEpoch";
    ADD_PARTITIONS_TO_TXN = 24, "AddPartitionsToTxn";
    ADD_OFFSETS_TO_TXN = 25, "AddOffsetsToTxn";
    END_TXN = 26, "EndTxn";
    TXN_OFFSET_COMMIT = 28, "TxnOffsetCommit";
    DESCRIBE_ACLS = 29, "DescribeAcls";
    CREATE_ACLS = 30, "CreateAcls";
    DELETE_ACLS = 31, "DeleteAcls";
    DESCRIBE_CONFIGS = 32, "DescribeConfigs";
    ALTER_CONFIGS = 33, "AlterConfigs";
    SASL_AUTHENTICATE = 36, "SaslAuthenticate";
    CREATE_PARTITIONS = 37, "CreatePartitions";
    DELETE_GROUPS = 42, "DeleteGroups";
    INCREMENTAL_ALTER_CONFIGS = 44, "IncrementalAlterConfigs";
    OFFSET_DELETE = 47, "OffsetDelete";
    DESCRIBE_CLIENT_QUOTAS = 48, "DescribeClientQuotas";
    ALTER_CLIENT_QUOTAS = 49, "AlterClientQuotas";
    DESCRIBE_USER_SCRAM_CREDENTIALS = 50, "DescribeUserScramCredentials";
    ALTER_USER_SCRAM_CREDENTIALS = 51, "AlterUserScramCredentials";
    DESCRIBE_CLUSTER = 60, "DescribeCluster";
    CONSUMER_GROUP_HEARTBEAT = 68, "ConsumerGroupHeartbeat";
    CONSUMER_GROUP_DESCRIBE = 69, "ConsumerGroupDescribe";
    SHARE_GROUP_HEARTBEAT = 76, "ShareGroupHeartbeat";
    SHARE_GROUP_DESCRIBE = 77, "ShareGroupDescribe";
    SHARE_FETCH = 78, "ShareFetch";
    SHARE_ACKNOWLEDGE = 79, "ShareAcknowledge";
    DESCRIBE_SHARE_GROUP_OFFSETS = 90, "DescribeShareGroupOffsets";
    ALTER_SHARE_GROUP_OFFSETS = 91, "AlterShareGroupOffsets";
    DELETE_SHARE_GROUP_OFFSETS = 92, "DeleteShareGroupOffsets";
}

impl std::fmt::Display for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.name() {
            "Unknown" => write!(f, "ApiKey({})", self.0),
            n => f.write_str(n),
        }
    }
}
