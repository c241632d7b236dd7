//! The Java consumer's embedded protocol (`ConsumerProtocol`): the bytes a consumer puts
//! in JoinGroup's member metadata (its [`Subscription`]) and the bytes the group leader
//! hands out through SyncGroup (each member's [`Assignment`]). DescribeGroups returns both
//! raw for groups whose protocol type is `consumer`.
//!
//! Both are classic (non-flexible) encodings that start with an `i16` version.
//! Subscription: v0 topics and user data; v1 adds owned partitions (KIP-429); v2 the
//! generation id (KIP-792); v3 the rack id (KIP-881). Assignment: v0 partitions and user
//! data; v1–v3 add nothing. As in the Java client, data written by a newer version is
//! decoded with the newest layout known here and trailing bytes are ignored.
//!
//! Reference: Apache Kafka's `ConsumerProtocolSubscription.json` and
//! `ConsumerProtocolAssignment.json`.

use bytes::{BufMut, Bytes, BytesMut};

use crate::error::Result;
use crate::protocol::primitives::*;

/// The newest subscription version this module knows.
pub const SUBSCRIPTION_VERSION: i16 = 3;
/// The newest assignment version this module knows.
pub const ASSIGNMENT_VERSION: i16 = 3;

/// Partitions of one topic.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TopicPartitions {
    /// The topic.
    pub topic: String,
    /// The partition indexes.
    pub partitions: Vec<i32>,
}

/// What a consumer subscribes to, as sent in its JoinGroup member metadata.
///
/// ```
/// use kafkapipe::protocol::consumer_protocol::Subscription;
/// let s = Subscription { version: 1, topics: vec!["events".into()], ..Subscription::default() };
/// let bytes = s.encode(1)?;
/// assert_eq!(Subscription::decode(bytes)?, s);
/// # Ok::<(), kafkapipe::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subscription {
    /// The version the bytes were written with.
    pub version: i16,
    /// Subscribed topics.
    pub topics: Vec<String>,
    /// Assignor-specific user data.
    pub user_data: Option<Bytes>,
    /// Partitions the member owned before this rebalance. Version 1 and later.
    pub owned_partitions: Vec<TopicPartitions>,
    /// The member's generation, or -1. Version 2 and later.
    pub generation_id: i32,
    /// The member's rack. Version 3 and later.
    pub rack_id: Option<String>,
}

impl Default for Subscription {
    fn default() -> Self {
        Subscription {
            version: 0,
            topics: Vec::new(),
            user_data: None,
            owned_partitions: Vec::new(),
            generation_id: -1,
            rack_id: None,
        }
    }
}

/// The partitions the group leader assigned to a member, as returned by SyncGroup.
///
/// ```
/// use kafkapipe::protocol::consumer_protocol::{Assignment, TopicPartitions};
/// let a = Assignment {
///     partitions: vec![TopicPartitions { topic: "events".into(), partitions: vec![0, 2] }],
///     ..Assignment::default()
/// };
/// assert_eq!(Assignment::decode(a.encode(0)?)?, a);
/// # Ok::<(), kafkapipe::Error>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Assignment {
    /// The version the bytes were written with.
    pub version: i16,
    /// Assigned partitions per topic.
    pub partitions: Vec<TopicPartitions>,
    /// Assignor-specific user data.
    pub user_data: Option<Bytes>,
}

fn put_topic_partitions(buf: &mut BytesMut, tps: &[TopicPartitions]) -> Result<()> {
    put_array(buf, tps, false, |buf, tp| {
        put_string(buf, &tp.topic, false)?;
        put_array(buf, &tp.partitions, false, |buf, p| {
            buf.put_i32(*p);
            Ok(())
        })
    })
}

fn get_topic_partitions(buf: &mut Bytes) -> Result<Vec<TopicPartitions>> {
    get_array(buf, false, 6, |buf| {
        Ok(TopicPartitions {
            topic: get_string(buf, false)?,
            partitions: get_array(buf, false, 4, get_i32)?,
        })
    })
}

fn check(version: i16) -> Result<()> {
    if version < 0 {
        return Err(crate::Error::protocol(format!(
            "negative consumer protocol version {version}"
        )));
    }
    Ok(())
}

impl Subscription {
    /// Encode at `version` (0–3); fields newer than `version` are left out. The
    /// `version` field of `self` is ignored.
    ///
    /// # Errors
    ///
    /// `Encode` for a version outside 0–3 or an over-long string.
    pub fn encode(&self, version: i16) -> Result<Bytes> {
        if !(0..=SUBSCRIPTION_VERSION).contains(&version) {
            return Err(crate::Error::encode(format!(
                "consumer protocol subscription version {version} is not 0..={SUBSCRIPTION_VERSION}"
            )));
        }
        let mut buf = BytesMut::new();
        buf.put_i16(version);
        put_array(&mut buf, &self.topics, false, |buf, t| {
            put_string(buf, t, false)
        })?;
        put_nullable_bytes(&mut buf, self.user_data.as_deref(), false)?;
        if version >= 1 {
            put_topic_partitions(&mut buf, &self.owned_partitions)?;
        }
        if version >= 2 {
            buf.put_i32(self.generation_id);
        }
        if version >= 3 {
            put_nullable_string(&mut buf, self.rack_id.as_deref(), false)?;
        }
        Ok(buf.freeze())
    }

    /// Decode subscription bytes of any version (newer ones by their known prefix).
    ///
    /// # Errors
    ///
    /// `Protocol` if the bytes are truncated or malformed.
    pub fn decode(mut buf: Bytes) -> Result<Subscription> {
        let version = get_i16(&mut buf)?;
        check(version)?;
        let topics = get_array(&mut buf, false, 2, |b| get_string(b, false))?;
        let user_data = get_nullable_bytes(&mut buf, false)?;
        let mut s = Subscription {
            version,
            topics,
            user_data,
            ..Subscription::default()
        };
        if version >= 1 {
            s.owned_partitions = get_topic_partitions(&mut buf)?;
        }
        if version >= 2 {
            s.generation_id = get_i32(&mut buf)?;
        }
        if version >= 3 {
            s.rack_id = get_nullable_string(&mut buf, false)?;
        }
        Ok(s)
    }
}

impl Assignment {
    /// Encode at `version` (0–3; all share one layout). The `version` field of `self` is
    /// ignored.
    ///
    /// # Errors
    ///
    /// `Encode` for a version outside 0–3 or an over-long string.
    pub fn encode(&self, version: i16) -> Result<Bytes> {
        if !(0..=ASSIGNMENT_VERSION).contains(&version) {
            return Err(crate::Error::encode(format!(
                "consumer protocol assignment version {version} is not 0..={ASSIGNMENT_VERSION}"
            )));
        }
        let mut buf = BytesMut::new();
        buf.put_i16(version);
        put_topic_partitions(&mut buf, &self.partitions)?;
        put_nullable_bytes(&mut buf, self.user_data.as_deref(), false)?;
        Ok(buf.freeze())
    }

    /// Decode assignment bytes of any version. An empty buffer (a member that has not
    /// been assigned anything yet) decodes as an empty assignment.
    ///
    /// # Errors
    ///
    /// `Protocol` if the bytes are truncated or malformed.
    pub fn decode(mut buf: Bytes) -> Result<Assignment> {
        if buf.is_empty() {
            return Ok(Assignment::default());
        }
        let version = get_i16(&mut buf)?;
        check(version)?;
        let partitions = get_topic_partitions(&mut buf)?;
        let user_data = get_nullable_bytes(&mut buf, false)?;
        Ok(Assignment {
            version,
            partitions,
            user_data,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::messages::testutil::*;
    use proptest::prelude::*;

    fn tps() -> impl Strategy<Value = Vec<TopicPartitions>> {
        vec(
            (string(), vec(any::<i32>(), 4))
                .prop_map(|(topic, partitions)| TopicPartitions { topic, partitions }),
            3,
        )
    }

    /// A subscription as the Java client writes it (v1, one topic, one owned partition),
    /// built byte by byte from the schema.
    #[test]
    fn java_layout_v1() {
        let mut b = BytesMut::new();
        b.put_i16(1);
        b.put_i32(1);
        b.put_i16(6);
        b.put_slice(b"events");
        b.put_i32(-1); // null user data
        b.put_i32(1);
        b.put_i16(6);
        b.put_slice(b"events");
        b.put_i32(1);
        b.put_i32(2);
        let s = Subscription::decode(b.clone().freeze()).unwrap();
        assert_eq!(s.topics, vec!["events".to_string()]);
        assert_eq!(s.user_data, None);
        assert_eq!(s.owned_partitions[0].partitions, vec![2]);
        assert_eq!(s.encode(1).unwrap(), b.freeze());
        // A future version with trailing fields decodes by its known prefix.
        let mut future = BytesMut::from(&s.encode(3).unwrap()[..]);
        future[1] = 9;
        future.put_slice(b"later fields");
        let f = Subscription::decode(future.freeze()).unwrap();
        assert_eq!((f.version, f.topics), (9, s.topics));
    }

    proptest! {
        #[test]
        fn subscription_roundtrip(
            topics in vec(string(), 3),
            user_data in opt_bytes(),
            owned in tps(),
            generation_id: i32,
            rack_id in opt_string(),
            version in 0i16..=3,
        ) {
            let mut s = Subscription { version, topics, user_data, owned_partitions: owned, generation_id, rack_id };
            if version < 1 { s.owned_partitions.clear(); }
            if version < 2 { s.generation_id = -1; }
            if version < 3 { s.rack_id = None; }
            let bytes = s.encode(version).unwrap();
            prop_assert_eq!(Subscription::decode(bytes.clone()).unwrap(), s);
            for cut in 1..bytes.len() {
                let _ = Subscription::decode(bytes.slice(..cut));
            }
        }

        #[test]
        fn assignment_roundtrip(partitions in tps(), user_data in opt_bytes(), version in 0i16..=3) {
            let a = Assignment { version, partitions, user_data };
            let bytes = a.encode(version).unwrap();
            prop_assert_eq!(Assignment::decode(bytes.clone()).unwrap(), a);
            for cut in 1..bytes.len() {
                prop_assert!(Assignment::decode(bytes.slice(..cut)).is_err());
            }
        }

        #[test]
        fn arbitrary_bytes_never_panic(data: Vec<u8>) {
            let _ = Subscription::decode(Bytes::from(data.clone()));
            let _ = Assignment::decode(Bytes::from(data));
        }
    }
}
