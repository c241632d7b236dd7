//! One module per Kafka API: its request and response, both encodable and decodable for
//! every version this client speaks.
//!
//! | API | versions | flexible from |
//! | --- | --- | --- |
//! | Produce (0) | 3–13 | 9 |
//! | Fetch (1) | 4–18 | 12 |
//! | ListOffsets (2) | 1–10 | 6 |
//! | Metadata (3) | 4–13 | 9 |
//! | OffsetCommit (8) | 2–9 | 8 |
//! | OffsetFetch (9) | 1–9 | 6 |
//! | FindCoordinator (10) | 0–6 | 3 |
//! | JoinGroup (11) | 0–9 | 6 |
//! | Heartbeat (12) | 0–4 | 4 |
//! | LeaveGroup (13) | 0–5 | 4 |
//! | SyncGroup (14) | 0–5 | 4 |
//! | DescribeGroups (15) | 0–6 | 5 |
//! | ListGroups (16) | 0–5 | 3 |
//! | ApiVersions (18) | 0–4 | 3 |
//! | CreateTopics (19) | 2–7 | 5 |
//! | DeleteTopics (20) | 1–6 | 4 |
//! | DeleteRecords (21) | 0–2 | 2 |
//! | InitProducerId (22) | 0–5 | 2 |
//! | OffsetForLeaderEpoch (23) | 2–4 | 4 |
//! | AddPartitionsToTxn (24) | 0–5 | 3 |
//! | AddOffsetsToTxn (25) | 0–4 | 3 |
//! | EndTxn (26) | 0–5 | 3 |
//! | TxnOffsetCommit (28) | 0–5 | 3 |
//! | DescribeAcls (29) | 1–3 | 2 |
//! | CreateAcls (30) | 1–3 | 2 |
//! | DeleteAcls (31) | 1–3 | 2 |
//! | DescribeConfigs (32) | 1–4 | 4 |
//! | AlterConfigs (33) | 0–2 | 2 |
//! | CreatePartitions (37) | 0–3 | 2 |
//! | DeleteGroups (42) | 0–2 | 2 |
//! | IncrementalAlterConfigs (44) | 0–1 | 1 |
//! | OffsetDelete (47) | 0–0 | — |
//! | DescribeClientQuotas (48) | 0–1 | 1 |
//! | AlterClientQuotas (49) | 0–1 | 1 |
//! | DescribeUserScramCredentials (50) | 0–0 | 0 |
//! | AlterUserScramCredentials (51) | 0–0 | 0 |
//! | DescribeCluster (60) | 0–2 | 0 |
//! | ConsumerGroupHeartbeat (68) | 0–1 | 0 |
//! | ConsumerGroupDescribe (69) | 0–1 | 0 |
//! | ShareGroupHeartbeat (76) | 1–1 | 0 |
//! | ShareGroupDescribe (77) | 1–1 | 0 |
//! | ShareFetch (78) | 1–2 | 0 |
//! | ShareAcknowledge (79) | 1–2 | 0 |
//! | DescribeShareGroupOffsets (90) | 0–1 | 0 |
//! | AlterShareGroupOffsets (91) | 0–0 | 0 |
//! | DeleteShareGroupOffsets (92) | 0–0 | 0 |
//! | SaslHandshake (17) | 0–1 | never |
//! | SaslAuthenticate (36) | 0–2 | 2 |

pub mod add_offsets_to_txn;
pub mod add_partitions_to_txn;
pub mod alter_client_quotas;
pub mod alter_configs;
pub mod alter_share_group_offsets;
pub mod alter_user_scram_credentials;
pub mod api_versions;
pub mod consumer_group_describe;
pub mod consumer_group_heartbeat;
pub mod create_acls;
pub mod create_partitions;
pub mod create_topics;
pub mod delete_acls;
pub mod delete_groups;
pub mod delete_records;
pub mod delete_share_group_offsets;
pub mod delete_topics;
pub mod describe_acls;
pub mod describe_client_quotas;
pub mod describe_cluster;
pub mod describe_configs;
pub mod describe_groups;
pub mod describe_share_group_offsets;
pub mod describe_user_scram_credentials;
pub mod end_txn;
pub mod fetch;
pub mod find_coordinator;
pub mod heartbeat;
pub mod incremental_alter_configs;
pub mod init_producer_id;
pub mod join_group;
pub mod leave_group;
pub mod list_groups;
pub mod list_offsets;
pub mod metadata;
pub mod offset_commit;
pub mod offset_delete;
pub mod offset_fetch;
pub mod offset_for_leader_epoch;
pub mod produce;
pub mod sasl_authenticate;
pub mod sasl_handshake;
pub mod share_acknowledge;
pub mod share_fetch;
pub mod share_group_describe;
pub mod share_group_heartbeat;
pub mod sync_group;
pub mod txn_offset_commit;

pub use api_versions::{
    metadata_version_release, ApiVersionRange, ApiVersionsRequest, ApiVersionsResponse,
    FinalizedFeature,
};
pub use create_topics::{
    CreatableReplicaAssignment, CreatableTopic, CreatableTopicConfig, CreatableTopicConfigs,
    CreatableTopicResult, CreateTopicsRequest, CreateTopicsResponse,
};
pub use delete_topics::{
    DeletableTopicResult, DeleteTopicState, DeleteTopicsRequest, DeleteTopicsResponse,
};
pub use fetch::{
    AbortedTransaction, EpochEndOffset, FetchPartition, FetchPartitionData, FetchRequest,
    FetchResponse, FetchTopic, FetchableTopicResponse, ForgottenTopic, ReplicaState, SnapshotId,
};
pub use init_producer_id::{InitProducerIdRequest, InitProducerIdResponse};
pub use list_offsets::{
    ListOffsetsPartition, ListOffsetsPartitionResponse, ListOffsetsRequest, ListOffsetsResponse,
    ListOffsetsTopic, ListOffsetsTopicResponse,
};
pub use metadata::{
    MetadataBroker, MetadataPartition, MetadataRequest, MetadataRequestTopic, MetadataResponse,
    MetadataTopic,
};
pub use produce::{
    BatchIndexAndErrorMessage, LeaderIdAndEpoch, NodeEndpoint, ProducePartitionData,
    ProducePartitionResponse, ProduceRequest, ProduceResponse, ProduceTopicData,
    ProduceTopicResponse,
};

pub use alter_configs::{
    AlterConfigsRequest, AlterConfigsResource, AlterConfigsResourceResponse, AlterConfigsResponse,
    AlterableConfig,
};
pub use create_partitions::{
    CreatePartitionsAssignment, CreatePartitionsRequest, CreatePartitionsResponse,
    CreatePartitionsTopic, CreatePartitionsTopicResult,
};
pub use delete_groups::{DeletableGroupResult, DeleteGroupsRequest, DeleteGroupsResponse};
pub use delete_records::{
    DeleteRecordsPartition, DeleteRecordsPartitionResult, DeleteRecordsRequest,
    DeleteRecordsResponse, DeleteRecordsTopic, DeleteRecordsTopicResult,
};
pub use describe_cluster::{
    DescribeClusterBroker, DescribeClusterRequest, DescribeClusterResponse,
};
pub use describe_configs::{
    DescribeConfigsRequest, DescribeConfigsResource, DescribeConfigsResourceResult,
    DescribeConfigsResponse, DescribeConfigsResult, DescribeConfigsSynonym,
};
pub use describe_groups::{
    DescribeGroupsRequest, DescribeGroupsResponse, DescribedGroup, DescribedGroupMember,
};
pub use find_coordinator::{Coordinator, FindCoordinatorRequest, FindCoordinatorResponse};
pub use heartbeat::{HeartbeatRequest, HeartbeatResponse};
pub use incremental_alter_configs::{
    IncrementalAlterConfigsRequest, IncrementalAlterConfigsResource,
    IncrementalAlterConfigsResourceResponse, IncrementalAlterConfigsResponse,
    IncrementalAlterableConfig,
};
pub use join_group::{
    JoinGroupRequest, JoinGroupRequestProtocol, JoinGroupResponse, JoinGroupResponseMember,
};
pub use leave_group::{LeaveGroupRequest, LeaveGroupResponse, MemberIdentity, MemberResponse};
pub use list_groups::{ListGroupsRequest, ListGroupsResponse, ListedGroup};
pub use offset_commit::{
    OffsetCommitRequest, OffsetCommitRequestPartition, OffsetCommitRequestTopic,
    OffsetCommitResponse, OffsetCommitResponsePartition, OffsetCommitResponseTopic,
};
pub use offset_delete::{
    OffsetDeleteRequest, OffsetDeleteRequestPartition, OffsetDeleteRequestTopic,
    OffsetDeleteResponse, OffsetDeleteResponsePartition, OffsetDeleteResponseTopic,
};
pub use offset_fetch::{
    OffsetFetchRequest, OffsetFetchRequestGroup, OffsetFetchRequestTopic, OffsetFetchRequestTopics,
    OffsetFetchResponse, OffsetFetchResponseGroup, OffsetFetchResponsePartition,
    OffsetFetchResponsePartitions, OffsetFetchResponseTopic, OffsetFetchResponseTopics,
};
pub use offset_for_leader_epoch::{
    OffsetForLeaderEpochEndOffset, OffsetForLeaderEpochRequest, OffsetForLeaderEpochResponse,
    OffsetForLeaderPartition, OffsetForLeaderTopic, OffsetForLeaderTopicResult,
};
pub use sasl_authenticate::{SaslAuthenticateRequest, SaslAuthenticateResponse};
pub use sasl_handshake::{SaslHandshakeRequest, SaslHandshakeResponse};
pub use sync_group::{SyncGroupRequest, SyncGroupRequestAssignment, SyncGroupResponse};

pub use alter_client_quotas::{
    AlterClientQuotaEntity, AlterClientQuotaEntry, AlterClientQuotaEntryResult, AlterClientQuotaOp,
    AlterClientQuotaResultEntity, AlterClientQuotasRequest, AlterClientQuotasResponse,
};
pub use describe_client_quotas::{
    ClientQuotaFilterComponent, DescribeClientQuotasRequest, DescribeClientQuotasResponse,
    DescribedClientQuotaEntity, DescribedClientQuotaEntry, DescribedClientQuotaValue,
};

pub use add_offsets_to_txn::{AddOffsetsToTxnRequest, AddOffsetsToTxnResponse};
pub use add_partitions_to_txn::{
    AddPartitionsToTxnPartitionResult, AddPartitionsToTxnRequest, AddPartitionsToTxnResponse,
    AddPartitionsToTxnResult, AddPartitionsToTxnTopic, AddPartitionsToTxnTopicResult,
    AddPartitionsToTxnTransaction,
};
pub use end_txn::{EndTxnRequest, EndTxnResponse};
pub use txn_offset_commit::{
    TxnOffsetCommitRequest, TxnOffsetCommitRequestPartition, TxnOffsetCommitRequestTopic,
    TxnOffsetCommitResponse, TxnOffsetCommitResponsePartition, TxnOffsetCommitResponseTopic,
};

pub use alter_share_group_offsets::{
    AlterShareGroupOffsetsRequest, AlterShareGroupOffsetsRequestPartition,
    AlterShareGroupOffsetsRequestTopic, AlterShareGroupOffsetsResponse,
    AlterShareGroupOffsetsResponsePartition, AlterShareGroupOffsetsResponseTopic,
};
pub use alter_user_scram_credentials::{
    AlterUserScramCredentialsRequest, AlterUserScramCredentialsResponse,
    AlterUserScramCredentialsResult, ScramCredentialDeletion, ScramCredentialUpsertion,
};
pub use consumer_group_describe::{
    ConsumerGroupDescribeAssignment, ConsumerGroupDescribeRequest, ConsumerGroupDescribeResponse,
    ConsumerGroupDescribeTopicPartitions, ConsumerGroupDescribedGroup,
    ConsumerGroupDescribedMember,
};
pub use consumer_group_heartbeat::{
    ConsumerGroupHeartbeatAssignment, ConsumerGroupHeartbeatRequest,
    ConsumerGroupHeartbeatRequestTopicPartitions, ConsumerGroupHeartbeatResponse,
    ConsumerGroupHeartbeatResponseTopicPartitions,
};
pub use create_acls::{AclCreation, AclCreationResult, CreateAclsRequest, CreateAclsResponse};
pub use delete_acls::{
    DeleteAclsFilter, DeleteAclsFilterResult, DeleteAclsMatchingAcl, DeleteAclsRequest,
    DeleteAclsResponse,
};
pub use delete_share_group_offsets::{
    DeleteShareGroupOffsetsRequest, DeleteShareGroupOffsetsRequestTopic,
    DeleteShareGroupOffsetsResponse, DeleteShareGroupOffsetsResponseTopic,
};
pub use describe_acls::{
    AclDescription, DescribeAclsRequest, DescribeAclsResource, DescribeAclsResponse,
};
pub use describe_share_group_offsets::{
    DescribeShareGroupOffsetsRequest, DescribeShareGroupOffsetsRequestGroup,
    DescribeShareGroupOffsetsRequestTopic, DescribeShareGroupOffsetsResponse,
    DescribeShareGroupOffsetsResponseGroup, DescribeShareGroupOffsetsResponsePartition,
    DescribeShareGroupOffsetsResponseTopic,
};
pub use describe_user_scram_credentials::{
    DescribeUserScramCredentialsRequest, DescribeUserScramCredentialsResponse,
    DescribeUserScramCredentialsResult, ScramCredentialInfo, ScramCredentialsUser,
};
pub use share_acknowledge::{
    ShareAcknowledgeLeaderIdAndEpoch, ShareAcknowledgeNodeEndpoint, ShareAcknowledgePartition,
    ShareAcknowledgePartitionData, ShareAcknowledgeRequest, ShareAcknowledgeResponse,
    ShareAcknowledgeTopic, ShareAcknowledgeTopicResponse, ShareAcknowledgementBatch,
};
pub use share_fetch::{
    AcquiredRecords, ShareFetchAcknowledgementBatch, ShareFetchLeaderIdAndEpoch,
    ShareFetchNodeEndpoint, ShareFetchPartition, ShareFetchPartitionData, ShareFetchRequest,
    ShareFetchResponse, ShareFetchTopic, ShareFetchableTopicResponse, ShareForgottenTopic,
};
pub use share_group_describe::{
    ShareGroupDescribeAssignment, ShareGroupDescribeRequest, ShareGroupDescribeResponse,
    ShareGroupDescribeTopicPartitions, ShareGroupDescribedGroup, ShareGroupDescribedMember,
};
pub use share_group_heartbeat::{
    ShareGroupHeartbeatAssignment, ShareGroupHeartbeatRequest, ShareGroupHeartbeatResponse,
    ShareGroupHeartbeatTopicPartitions,
};

use bytes::{Bytes, BytesMut};

use crate::error::Result;
use crate::protocol::primitives::{get_tagged_fields, put_tagged_fields};
use crate::protocol::TaggedFields;

/// Read a tagged-field section when `flexible`, else nothing.
pub(crate) fn get_tagged_if(buf: &mut Bytes, flexible: bool) -> Result<TaggedFields> {
    if flexible {
        get_tagged_fields(buf)
    } else {
        Ok(TaggedFields::new())
    }
}

/// Write a tagged-field section (with no known fields) when `flexible`, else nothing.
pub(crate) fn put_tagged_if(buf: &mut BytesMut, flexible: bool, tf: &TaggedFields) -> Result<()> {
    if flexible {
        put_tagged_fields(buf, &[], tf)
    } else {
        Ok(())
    }
}

/// Encode a value into its own buffer, for use as the value of a known tagged field.
pub(crate) fn tagged_value(f: impl FnOnce(&mut BytesMut) -> Result<()>) -> Result<Bytes> {
    let mut b = BytesMut::new();
    f(&mut b)?;
    Ok(b.freeze())
}

/// Decode a known tagged field's value with `f`, requiring that it consume the value
/// exactly; `None` if it does not parse, so the caller can keep it raw instead.
pub(crate) fn parse_tagged<T>(
    mut value: Bytes,
    f: impl FnOnce(&mut Bytes) -> Result<T>,
) -> Option<T> {
    match f(&mut value) {
        Ok(v) if value.is_empty() => Some(v),
        _ => None,
    }
}

#[cfg(test)]
pub(crate) mod testutil {
    //! Shared helpers for the per-API property tests.
    use std::fmt::Debug;

    use bytes::{Bytes, BytesMut};
    use proptest::prelude::*;
    use proptest::test_runner::TestCaseError;

    use crate::protocol::{Decode, Encode, TaggedFields};

    /// Encode at `version`, decode, compare, require the buffer consumed; then check every
    /// strict prefix fails to decode.
    pub fn roundtrip<T: Encode + Decode + PartialEq + Debug>(
        v: &T,
        version: i16,
    ) -> Result<(), TestCaseError> {
        let mut b = BytesMut::new();
        v.encode(&mut b, version)
            .map_err(|e| TestCaseError::fail(format!("encode v{version}: {e}")))?;
        let bytes = b.freeze();
        let mut r = bytes.clone();
        let got = T::decode(&mut r, version)
            .map_err(|e| TestCaseError::fail(format!("decode v{version}: {e}")))?;
        prop_assert_eq!(&got, v, "version {}", version);
        prop_assert!(r.is_empty(), "{} bytes left at v{}", r.len(), version);
        // truncations are errors, never panics
        for cut in [0, bytes.len() / 2, bytes.len().saturating_sub(1)] {
            if cut < bytes.len() {
                let mut t = bytes.slice(..cut);
                prop_assert!(
                    T::decode(&mut t, version).is_err(),
                    "prefix {} decoded",
                    cut
                );
            }
        }
        Ok(())
    }

    /// Decoding arbitrary bytes at every version must not panic.
    pub fn no_panic<T: Decode>(data: &[u8], versions: std::ops::RangeInclusive<i16>) {
        for v in versions {
            let mut b = Bytes::copy_from_slice(data);
            let _ = T::decode(&mut b, v);
        }
    }

    /// Unknown tagged fields with tags that no message here interprets.
    pub fn tagged() -> impl Strategy<Value = TaggedFields> {
        prop::collection::btree_map(5u32..200, prop::collection::vec(any::<u8>(), 0..6), 0..3)
            .prop_map(|m| TaggedFields(m.into_iter().map(|(k, v)| (k, Bytes::from(v))).collect()))
    }

    /// A short string.
    pub fn string() -> impl Strategy<Value = String> {
        "[a-zA-Z0-9._-]{0,12}"
    }

    /// A short nullable string.
    pub fn opt_string() -> impl Strategy<Value = Option<String>> {
        prop::option::of(string())
    }

    /// Nullable bytes.
    pub fn opt_bytes() -> impl Strategy<Value = Option<Bytes>> {
        prop::option::of(prop::collection::vec(any::<u8>(), 0..40).prop_map(Bytes::from))
    }

    /// A vector of 0..n elements.
    pub fn vec<S: Strategy>(s: S, n: usize) -> impl Strategy<Value = Vec<S::Value>> {
        prop::collection::vec(s, 0..n)
    }
}
