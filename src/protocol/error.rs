//! Kafka protocol error codes.
//!
//! Every response carries 16-bit error codes; [`ErrorCode`] names the ones Apache Kafka
//! defines (see `org.apache.kafka.common.protocol.Errors`) and keeps any code it does not
//! know as [`ErrorCode::Unknown`], so a newer broker never makes decoding fail.

use std::fmt;

macro_rules! error_codes {
    ($( $code:literal => $name:ident, $retriable:literal, $msg:literal; )*) => {
        /// A Kafka protocol error code.
        ///
        /// ```
        /// use kafkapipe::protocol::ErrorCode;
        /// let code = ErrorCode::from(6);
        /// assert_eq!(code, ErrorCode::NotLeaderOrFollower);
        /// assert!(code.is_retriable());
        /// assert_eq!(ErrorCode::from(31000), ErrorCode::Unknown(31000));
        /// ```
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[non_exhaustive]
        pub enum ErrorCode {
            $(
                #[doc = $msg]
                $name,
            )*
            /// A code this client does not know (kept as received).
            Unknown(i16),
        }

        impl ErrorCode {
            /// The numeric code as sent on the wire.
            pub fn code(self) -> i16 {
                match self {
                    $( ErrorCode::$name => $code, )*
                    ErrorCode::Unknown(c) => c,
                }
            }

            /// Whether the operation may succeed if retried (after refreshing metadata where
            /// appropriate). Mirrors the Java client's `RetriableException` hierarchy; unknown
            /// codes are treated as fatal.
            pub fn is_retriable(self) -> bool {
                match self {
                    $( ErrorCode::$name => $retriable, )*
                    ErrorCode::Unknown(_) => false,
                }
            }

            /// A short human-readable description.
            pub fn description(self) -> &'static str {
                match self {
                    $( ErrorCode::$name => $msg, )*
                    ErrorCode::Unknown(_) => "unknown error code",
                }
            }
        }

        impl From<i16> for ErrorCode {
            fn from(code: i16) -> Self {
                match code {
                    $( $code => ErrorCode::$name, )*
                    other => ErrorCode::Unknown(other),
                }
            }
        }
    };
}

error_codes! {
    -1 => UnknownServerError, false, "the server experienced an unexpected error";
    0 => None, false, "no error";
    1 => OffsetOutOfRange, false, "the requested offset is outside the range of offsets maintained by the server";
    2 => CorruptMessage, true, "the message failed its CRC checksum or is otherwise corrupt";
    3 => UnknownTopicOrPartition, true, "this server does not host this topic-partition";
    4 => InvalidFetchSize, false, "the requested fetch size is invalid";
    5 => LeaderNotAvailable, true, "there is no leader for this topic-partition as we are in the middle of a leadership election";
    6 => NotLeaderOrFollower, true, "this server is not the leader or a follower for this partition";
    7 => RequestTimedOut, true, "the request timed out";
    8 => BrokerNotAvailable, false, "the broker is not available";
    9 => ReplicaNotAvailable, true, "the replica is not available for the requested topic-partition";
    10 => MessageTooLarge, false, "the request included a message larger than the max message size the server will accept";
    11 => StaleControllerEpoch, false, "the controller moved to another broker";
    12 => OffsetMetadataTooLarge, false, "the metadata field of the offset request was too large";
    13 => NetworkException, true, "the server disconnected before a response was received";
    14 => CoordinatorLoadInProgress, true, "the coordinator is loading and hence can't process requests";
    15 => CoordinatorNotAvailable, true, "the coordinator is not available";
    16 => NotCoordinator, true, "this is not the correct coordinator";
    17 => InvalidTopicException, false, "the request attempted to perform an operation on an invalid topic";
    18 => RecordListTooLarge, false, "the request included a message batch larger than the configured segment size on the server";
    19 => NotEnoughReplicas, true, "messages are rejected since there are fewer in-sync replicas than required";
    20 => NotEnoughReplicasAfterAppend, true, "messages are written to the log, but to fewer in-sync replicas than required";
    21 => InvalidRequiredAcks, false, "produce request specified an invalid value for required acks";
    22 => IllegalGeneration, false, "specified group generation id is not valid";
    23 => InconsistentGroupProtocol, false, "the group member's supported protocols are incompatible with those of existing members";
    24 => InvalidGroupId, false, "the configured group id is invalid";
    25 => UnknownMemberId, false, "the coordinator is not aware of this member";
    26 => InvalidSessionTimeout, false, "the session timeout is not within the range allowed by the broker";
    27 => RebalanceInProgress, false, "the group is rebalancing, so a rejoin is needed";
    28 => InvalidCommitOffsetSize, false, "the committing offset data size is not valid";
    29 => TopicAuthorizationFailed, false, "topic authorization failed";
    30 => GroupAuthorizationFailed, false, "group authorization failed";
    31 => ClusterAuthorizationFailed, false, "cluster authorization failed";
    32 => InvalidTimestamp, false, "the timestamp of the message is out of acceptable range";
    33 => UnsupportedSaslMechanism, false, "the broker does not support the requested SASL mechanism";
    34 => IllegalSaslState, false, "request is not valid given the current SASL state";
    35 => UnsupportedVersion, false, "the version of API is not supported";
    36 => TopicAlreadyExists, false, "topic with this name already exists";
    37 => InvalidPartitions, false, "number of partitions is below 1";
    38 => InvalidReplicationFactor, false, "replication factor is below 1 or larger than the number of available brokers";
    39 => InvalidReplicaAssignment, false, "replica assignment is invalid";
    40 => InvalidConfig, false, "configuration is invalid";
    41 => NotController, true, "this is not the correct controller for this cluster";
    42 => InvalidRequest, false, "the request is malformed or has invalid field values";
    43 => UnsupportedForMessageFormat, false, "the message format version on the broker does not support the request";
    44 => PolicyViolation, false, "request parameters do not satisfy the configured policy";
    45 => OutOfOrderSequenceNumber, false, "the broker received an out of order sequence number";
    46 => DuplicateSequenceNumber, false, "the broker received a duplicate sequence number";
    47 => InvalidProducerEpoch, false, "producer attempted to produce with an old epoch";
    48 => InvalidTxnState, false, "the producer attempted a transactional operation in an invalid state";
    49 => InvalidProducerIdMapping, false, "the producer attempted to use a producer id which is not currently assigned to its transactional id";
    50 => InvalidTransactionTimeout, false, "the transaction timeout is larger than the maximum value allowed by the broker";
    51 => ConcurrentTransactions, true, "the producer attempted to update a transaction while another concurrent operation on the same transaction was ongoing";
    52 => TransactionCoordinatorFenced, false, "the transaction coordinator sending a WriteTxnMarker is no longer the current coordinator";
    53 => TransactionalIdAuthorizationFailed, false, "transactional id authorization failed";
    54 => SecurityDisabled, false, "security features are disabled";
    55 => OperationNotAttempted, false, "the broker did not attempt to execute this operation";
    56 => KafkaStorageError, true, "disk error when trying to access log file on the disk";
    57 => LogDirNotFound, false, "the user-specified log directory is not found in the broker config";
    58 => SaslAuthenticationFailed, false, "SASL authentication failed";
    59 => UnknownProducerId, false, "the broker could not locate the producer metadata associated with the producer id";
    60 => ReassignmentInProgress, false, "a partition reassignment is in progress";
    61 => DelegationTokenAuthDisabled, false, "delegation token feature is not enabled";
    62 => DelegationTokenNotFound, false, "delegation token is not found on server";
    63 => DelegationTokenOwnerMismatch, false, "specified principal is not valid owner/renewer";
    64 => DelegationTokenRequestNotAllowed, false, "delegation token requests are not allowed on this connection";
    65 => DelegationTokenAuthorizationFailed, false, "delegation token authorization failed";
    66 => DelegationTokenExpired, false, "delegation token is expired";
    67 => InvalidPrincipalType, false, "supplied principal type is not supported";
    68 => NonEmptyGroup, false, "the group is not empty";
    69 => GroupIdNotFound, false, "the group id does not exist";
    70 => FetchSessionIdNotFound, true, "the fetch session id was not found";
    71 => InvalidFetchSessionEpoch, true, "the fetch session epoch is invalid";
    72 => ListenerNotFound, true, "there is no listener on the leader broker that matches the listener on which metadata request was processed";
    73 => TopicDeletionDisabled, false, "topic deletion is disabled";
    74 => FencedLeaderEpoch, true, "the leader epoch in the request is older than the epoch on the broker";
    75 => UnknownLeaderEpoch, true, "the leader epoch in the request is newer than the epoch on the broker";
    76 => UnsupportedCompressionType, false, "the requesting client does not support the compression type of given partition";
    77 => StaleBrokerEpoch, false, "broker epoch has changed";
    78 => OffsetNotAvailable, true, "the leader high watermark has not caught up from a recent leader election";
    79 => MemberIdRequired, false, "the group member needs to have a valid member id before actually entering a consumer group";
    80 => PreferredLeaderNotAvailable, true, "the preferred leader was not available";
    81 => GroupMaxSizeReached, false, "the consumer group has reached its max size";
    82 => FencedInstanceId, false, "another consumer with the same group instance id has registered";
    83 => EligibleLeadersNotAvailable, true, "eligible topic partition leaders are not available";
    84 => ElectionNotNeeded, true, "leader election not needed for topic partition";
    85 => NoReassignmentInProgress, false, "no partition reassignment is in progress";
    86 => GroupSubscribedToTopic, false, "deleting offsets of a topic is forbidden while the consumer group is actively subscribed to it";
    87 => InvalidRecord, false, "this record has failed the validation on broker and hence will be rejected";
    88 => UnstableOffsetCommit, true, "there are unstable offsets that need to be cleared";
    89 => ThrottlingQuotaExceeded, true, "the throttling quota has been exceeded";
    90 => ProducerFenced, false, "there is a newer producer with the same transactional id";
    91 => ResourceNotFound, false, "a request illegally referred to a resource that does not exist";
    92 => DuplicateResource, false, "a request illegally referred to the same resource twice";
    93 => UnacceptableCredential, false, "requested credential would not meet criteria for acceptability";
    94 => InconsistentVoterSet, false, "the voter set is inconsistent";
    95 => InvalidUpdateVersion, false, "the given update version was invalid";
    96 => FeatureUpdateFailed, false, "unable to update finalized features due to an unexpected server error";
    97 => PrincipalDeserializationFailure, false, "request principal deserialization failed";
    98 => SnapshotNotFound, false, "requested snapshot was not found";
    99 => PositionOutOfRange, false, "requested position is not greater than or equal to zero, and less than the size of the snapshot";
    100 => UnknownTopicId, true, "this server does not host this topic id";
    101 => DuplicateBrokerRegistration, false, "this broker id is already in use";
    102 => BrokerIdNotRegistered, false, "the given broker id was not registered";
    103 => InconsistentTopicId, true, "the log's topic id did not match the topic id in the request";
    104 => InconsistentClusterId, false, "the clusterId in the request does not match that found on the server";
    105 => TransactionalIdNotFound, false, "the transactional id could not be found";
    106 => FetchSessionTopicIdError, true, "the fetch session encountered inconsistent topic id usage";
    107 => IneligibleReplica, false, "the new ISR contains at least one ineligible replica";
    108 => NewLeaderElected, false, "the AlterPartition request successfully updated the partition state but the leader has changed";
    109 => OffsetMovedToTieredStorage, false, "the requested offset is moved to tiered storage";
    110 => FencedMemberEpoch, false, "the member epoch is fenced by the group coordinator";
    111 => UnreleasedInstanceId, false, "the instance id is still used by another member in the consumer group";
    112 => UnsupportedAssignor, false, "the assignor or its version range is not supported by the consumer group";
    113 => StaleMemberEpoch, false, "the member epoch is stale";
    114 => MismatchedEndpointType, false, "the request was sent to an endpoint of the wrong type";
    115 => UnsupportedEndpointType, false, "this endpoint type is not supported yet";
    116 => UnknownControllerId, false, "this controller id is not known";
    117 => UnknownSubscriptionId, false, "client sent a push telemetry request with an invalid or outdated subscription id";
    118 => TelemetryTooLarge, false, "client sent a push telemetry request larger than the maximum size the broker will accept";
    119 => InvalidRegistration, false, "the controller has considered the broker registration to be invalid";
    120 => TransactionAbortable, false, "the server encountered an error with the transaction; the client can abort the transaction to continue";
    121 => InvalidRecordState, false, "the record state is invalid; the acknowledgement of delivery could not be completed";
    122 => ShareSessionNotFound, true, "the share session was not found";
    123 => InvalidShareSessionEpoch, true, "the share session epoch is invalid";
    124 => FencedStateEpoch, false, "the share coordinator rejected the request because the share-group state epoch did not match";
    125 => InvalidVoterKey, false, "the voter key doesn't match the receiving replica's key";
    126 => DuplicateVoter, false, "the voter is already part of the set of voters";
    127 => VoterNotFound, false, "the voter is not part of the set of voters";
    128 => InvalidRegularExpression, false, "the regular expression is not valid";
    129 => RebootstrapRequired, false, "client metadata is stale; the client should rebootstrap to obtain new metadata";
    130 => StreamsInvalidTopology, false, "the supplied topology is invalid";
    131 => StreamsInvalidTopologyEpoch, false, "the supplied topology epoch is invalid";
    132 => StreamsTopologyFenced, false, "the supplied topology epoch is outdated";
    133 => ShareSessionLimitReached, true, "the limit of share sessions has been reached";
}

impl ErrorCode {
    /// The error a response field's `code` reports, or `None` for 0 (no error).
    ///
    /// ```
    /// use kafkapipe::protocol::ErrorCode;
    /// assert_eq!(ErrorCode::non_zero(0), None);
    /// assert_eq!(ErrorCode::non_zero(3), Some(ErrorCode::UnknownTopicOrPartition));
    /// ```
    pub fn non_zero(code: i16) -> Option<ErrorCode> {
        (code != 0).then(|| ErrorCode::from(code))
    }

    /// `true` for [`ErrorCode::None`].
    pub fn is_ok(self) -> bool {
        self == ErrorCode::None
    }

    /// `Ok(())` for [`ErrorCode::None`], `Err(self)` otherwise.
    pub fn into_result(self) -> Result<(), ErrorCode> {
        if self.is_ok() {
            Ok(())
        } else {
            Err(self)
        }
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ErrorCode::Unknown(c) => write!(f, "unknown kafka error code {c}"),
            other => write!(
                f,
                "{} ({}): {}",
                other.name(),
                other.code(),
                other.description()
            ),
        }
    }
}

impl ErrorCode {
    fn name(self) -> String {
        format!("{self:?}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_known_code_round_trips() {
        for c in -1i16..=133 {
            let e = ErrorCode::from(c);
            assert_eq!(e.code(), c);
            assert!(
                !matches!(e, ErrorCode::Unknown(_)),
                "code {c} should be known"
            );
        }
    }

    #[test]
    fn unknown_codes_are_kept_and_fatal() {
        let e = ErrorCode::from(9999);
        assert_eq!(e, ErrorCode::Unknown(9999));
        assert_eq!(e.code(), 9999);
        assert!(!e.is_retriable());
        assert_eq!(e.to_string(), "unknown kafka error code 9999");
    }

    #[test]
    fn retriable_classification_matches_java() {
        assert!(ErrorCode::LeaderNotAvailable.is_retriable());
        assert!(ErrorCode::RequestTimedOut.is_retriable());
        assert!(!ErrorCode::MessageTooLarge.is_retriable());
        assert!(!ErrorCode::TopicAuthorizationFailed.is_retriable());
        assert!(ErrorCode::NotCoordinator.is_retriable());
    }

    #[test]
    fn transaction_and_kip848_codes() {
        // numbers from org.apache.kafka.common.protocol.Errors
        for (code, e) in [
            (47, ErrorCode::InvalidProducerEpoch),
            (48, ErrorCode::InvalidTxnState),
            (49, ErrorCode::InvalidProducerIdMapping),
            (51, ErrorCode::ConcurrentTransactions),
            (53, ErrorCode::TransactionalIdAuthorizationFailed),
            (90, ErrorCode::ProducerFenced),
            (110, ErrorCode::FencedMemberEpoch),
            (111, ErrorCode::UnreleasedInstanceId),
            (112, ErrorCode::UnsupportedAssignor),
            (113, ErrorCode::StaleMemberEpoch),
            (120, ErrorCode::TransactionAbortable),
            (128, ErrorCode::InvalidRegularExpression),
        ] {
            assert_eq!(ErrorCode::from(code), e);
            assert_eq!(e.code(), code);
        }
        // ConcurrentTransactionsException extends RetriableException; the rest are fatal
        // (or handled specially by the caller: abort, rejoin, bump the epoch)
        assert!(ErrorCode::ConcurrentTransactions.is_retriable());
        assert!(ErrorCode::CoordinatorLoadInProgress.is_retriable());
        for e in [
            ErrorCode::InvalidTxnState,
            ErrorCode::InvalidProducerIdMapping,
            ErrorCode::TransactionalIdAuthorizationFailed,
            ErrorCode::ProducerFenced,
            ErrorCode::InvalidProducerEpoch,
            ErrorCode::TransactionAbortable,
            ErrorCode::FencedMemberEpoch,
            ErrorCode::UnreleasedInstanceId,
            ErrorCode::UnsupportedAssignor,
            ErrorCode::StaleMemberEpoch,
            ErrorCode::InvalidRegularExpression,
            ErrorCode::InvalidRecordState,
            ErrorCode::RebootstrapRequired,
        ] {
            assert!(!e.is_retriable(), "{e:?}");
        }
        assert!(ErrorCode::ShareSessionNotFound.is_retriable());
        assert!(ErrorCode::InvalidShareSessionEpoch.is_retriable());
        assert!(ErrorCode::ShareSessionLimitReached.is_retriable());
    }
}
