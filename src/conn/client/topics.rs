//! Topics on a [`Conn`]: Metadata, CreateTopics and DeleteTopics, and the cache of topic
//! ids (filled from every Metadata answer, emptied for deleted topics) that Produce and
//! Fetch use from the versions that name topics by id (KIP-516).
//!
//! May not: produce, fetch or list offsets; the other files ask here for a topic's id or
//! for the last version that still names topics.

use crate::util::duration_ms;

use super::types::{Broker, Metadata, NewTopic, PartitionInfo, TopicInfo};
use super::{Conn, ZERO_UUID};
use crate::error::{Error, Result};
use crate::protocol::messages::{
    CreatableTopic, CreatableTopicConfig, CreateTopicsRequest, DeleteTopicState,
    DeleteTopicsRequest, MetadataRequest, MetadataRequestTopic, MetadataResponse,
};
use crate::protocol::{ErrorCode, Request};

impl Conn {
    /// List metadata for `topics` (`None`: all topics). Topics are not auto-created.
    pub async fn metadata(&self, topics: Option<&[&str]>) -> Result<Metadata> {
        self.metadata_with(topics, false).await
    }

    /// Like [`Conn::metadata`], asking the broker to create missing `topics` with its
    /// defaults when `allow_auto_topic_creation` is set (and the broker's
    /// `auto.create.topics.enable` allows it).
    pub async fn metadata_with(
        &self,
        topics: Option<&[&str]>,
        allow_auto_topic_creation: bool,
    ) -> Result<Metadata> {
        let req = MetadataRequest {
            topics: topics.map(|ts| {
                ts.iter()
                    .map(|t| MetadataRequestTopic {
                        name: Some((*t).to_string()),
                        ..Default::default()
                    })
                    .collect()
            }),
            allow_auto_topic_creation,
            ..Default::default()
        };
        let resp: MetadataResponse = self.connection.send(&req).await?;
        let code = ErrorCode::from(resp.error_code);
        if !code.is_ok() {
            return Err(Error::kafka(code).with_broker(self.connection.broker()));
        }
        let md = Metadata {
            cluster_id: resp.cluster_id,
            controller_id: resp.controller_id,
            brokers: resp
                .brokers
                .into_iter()
                .map(|b| Broker {
                    id: b.node_id,
                    host: b.host,
                    port: b.port,
                    rack: b.rack,
                })
                .collect(),
            topics: resp
                .topics
                .into_iter()
                .map(|t| {
                    let mut partitions: Vec<PartitionInfo> = t
                        .partitions
                        .into_iter()
                        .map(|p| PartitionInfo {
                            id: p.partition_index,
                            leader: p.leader_id,
                            leader_epoch: p.leader_epoch,
                            replicas: p.replica_nodes,
                            isr: p.isr_nodes,
                            error: ErrorCode::non_zero(p.error_code),
                        })
                        .collect();
                    partitions.sort_by_key(|p| p.id);
                    TopicInfo {
                        name: t.name.unwrap_or_default(),
                        id: t.topic_id,
                        internal: t.is_internal,
                        partitions,
                        error: ErrorCode::non_zero(t.error_code),
                    }
                })
                .collect(),
        };
        if let Ok(mut ids) = self.topic_ids.lock() {
            for t in &md.topics {
                if t.id != ZERO_UUID {
                    ids.insert(t.name.clone(), t.id);
                }
            }
        }
        Ok(md)
    }

    /// Create one topic; see [`Conn::create_topics`].
    pub async fn create_topic(
        &self,
        name: &str,
        partitions: i32,
        replication_factor: i16,
    ) -> Result<()> {
        let topic = NewTopic::new(name, partitions).replication_factor(replication_factor);
        match self.create_topics(&[topic]).await?.into_iter().next() {
            Some((_, result)) => result,
            None => Err(Error::protocol("CreateTopics gave no result").with_topic(name)),
        }
    }

    /// Create topics. Returns one result per topic, in request order; a topic that
    /// already exists gives `TopicAlreadyExists`. Send this to the controller (any broker
    /// forwards it in KRaft clusters).
    pub async fn create_topics(&self, topics: &[NewTopic]) -> Result<Vec<(String, Result<()>)>> {
        let req = CreateTopicsRequest {
            topics: topics
                .iter()
                .map(|t| CreatableTopic {
                    name: t.name.clone(),
                    num_partitions: t.partitions,
                    replication_factor: t.replication_factor,
                    configs: t
                        .configs
                        .iter()
                        .map(|(k, v)| CreatableTopicConfig {
                            name: k.clone(),
                            value: Some(v.clone()),
                            ..Default::default()
                        })
                        .collect(),
                    ..Default::default()
                })
                .collect(),
            timeout_ms: duration_ms(self.connection.config().request_timeout),
            validate_only: false,
            ..Default::default()
        };
        let resp = self.connection.send(&req).await?;
        Ok(topics
            .iter()
            .map(|t| {
                let result = match resp.topics.iter().find(|r| r.name == t.name) {
                    None => Err(Error::protocol(
                        "CreateTopics response does not mention the topic",
                    )
                    .with_topic(&t.name)),
                    Some(r) => match ErrorCode::non_zero(r.error_code) {
                        None => Ok(()),
                        Some(code) => {
                            let mut e = Error::kafka(code).with_topic(&t.name);
                            if let Some(m) = &r.error_message {
                                e = e.with_message(m.clone());
                            }
                            Err(e.with_broker(self.connection.broker()))
                        }
                    },
                };
                (t.name.clone(), result)
            })
            .collect())
    }

    /// Delete topics by name. Returns one result per topic, in request order.
    pub async fn delete_topics(&self, names: &[&str]) -> Result<Vec<(String, Result<()>)>> {
        let req = DeleteTopicsRequest {
            topics: names
                .iter()
                .map(|n| DeleteTopicState {
                    name: Some((*n).to_string()),
                    ..Default::default()
                })
                .collect(),
            topic_names: names.iter().map(|n| (*n).to_string()).collect(),
            timeout_ms: duration_ms(self.connection.config().request_timeout),
            ..Default::default()
        };
        let resp = self.connection.send(&req).await?;
        if let Ok(mut ids) = self.topic_ids.lock() {
            for n in names {
                ids.remove(*n);
            }
        }
        Ok(names
            .iter()
            .map(|n| {
                let result = match resp
                    .responses
                    .iter()
                    .find(|r| r.name.as_deref() == Some(*n))
                {
                    None => Err(Error::protocol(
                        "DeleteTopics response does not mention the topic",
                    )
                    .with_topic(*n)),
                    Some(r) => match ErrorCode::non_zero(r.error_code) {
                        None => Ok(()),
                        Some(code) => Err(Error::kafka(code)
                            .with_topic(*n)
                            .with_broker(self.connection.broker())),
                    },
                };
                ((*n).to_string(), result)
            })
            .collect())
    }

    /// The version of `R` (Produce or Fetch) to use when `topic`'s id is unknown, so the
    /// request must name the topic: 12, the last version with names, if the broker still
    /// accepts it. Otherwise the broker cannot know the topic: `UnknownTopicOrPartition`.
    pub(super) fn by_name_version<R: Request>(&self, topic: &str, partition: i32) -> Result<i16> {
        const LAST_WITH_NAMES: i16 = 12;
        match self
            .connection
            .api_versions()
            .and_then(|v| v.range(R::API_KEY))
        {
            Some((broker_min, _)) if broker_min <= LAST_WITH_NAMES => Ok(LAST_WITH_NAMES),
            _ => Err(self
                .err(ErrorCode::UnknownTopicOrPartition, topic, partition)
                .with_message(format!(
                    "no topic id known for the topic and the broker requires {} v13+",
                    R::API_KEY
                ))),
        }
    }

    pub(super) async fn topic_id(&self, topic: &str) -> Result<[u8; 16]> {
        if let Some(id) = self
            .topic_ids
            .lock()
            .ok()
            .and_then(|ids| ids.get(topic).copied())
        {
            return Ok(id);
        }
        let md = self.metadata(Some(&[topic])).await?;
        Ok(md.topic(topic).map_or(ZERO_UUID, |t| t.id))
    }
}
