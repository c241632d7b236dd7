//! Topics and partitions: CreateTopics, DeleteTopics and CreatePartitions at the
//! controller, and listing and describing topics from metadata.

use super::{code_error, Admin, Results, TopicListing};
use crate::conn::{Conn, NewTopic, TopicInfo};
use crate::error::{Error, Result};
use crate::protocol::messages::{
    CreatableTopic, CreatableTopicConfig, CreatePartitionsRequest, CreatePartitionsTopic,
    CreateTopicsRequest,
};
use crate::protocol::ErrorCode;
use crate::util::duration_ms;

impl Admin {
    /// Create topics (partitions, replication factor, configs), or with `validate_only`
    /// only check that they could be created. One result per topic, in request order; an
    /// existing topic gives `TopicAlreadyExists`. Sent to the controller.
    ///
    /// ```no_run
    /// # use kafkapipe::{admin::Admin, conn::NewTopic};
    /// # async fn demo(admin: Admin) -> kafkapipe::Result<()> {
    /// let topic = NewTopic::new("events", 6)
    ///     .replication_factor(3)
    ///     .config("retention.ms", "86400000");
    /// for (name, r) in admin.create_topics(&[topic], false).await? {
    ///     r?;
    ///     println!("created {name}");
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn create_topics(
        &self,
        topics: &[NewTopic],
        validate_only: bool,
    ) -> Result<Results<String>> {
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
            timeout_ms: duration_ms(self.timeout),
            validate_only,
            ..Default::default()
        };
        let req = &req;
        let (resp, broker) = self
            .retry("CreateTopics", || async move {
                let c = self.controller().await?;
                Ok((c.send(req).await?, c.broker().to_string()))
            })
            .await?;
        Ok(topics
            .iter()
            .map(|t| {
                self.cluster.invalidate(&t.name);
                let r = match resp.topics.iter().find(|r| r.name == t.name) {
                    None => Err(Error::protocol(
                        "CreateTopics response does not mention the topic",
                    )),
                    Some(r) => match ErrorCode::non_zero(r.error_code) {
                        None => Ok(()),
                        Some(code) => Err(code_error(code, r.error_message.as_deref())),
                    },
                };
                (
                    t.name.clone(),
                    r.map_err(|e| e.with_topic(&t.name).with_broker(&broker)),
                )
            })
            .collect())
    }

    /// Delete topics. One result per topic, in request order. Sent to the controller.
    ///
    /// ```no_run
    /// # async fn demo(admin: kafkapipe::admin::Admin) -> kafkapipe::Result<()> {
    /// for (topic, r) in admin.delete_topics(&["events", "old-events"]).await? {
    ///     println!("{topic}: {r:?}");
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn delete_topics(&self, names: &[&str]) -> Result<Results<String>> {
        let out = self
            .retry("DeleteTopics", || async move {
                let c = self.controller().await?;
                Conn::from_connection(c).delete_topics(names).await
            })
            .await?;
        for n in names {
            self.cluster.invalidate(n);
        }
        Ok(out)
    }

    /// Every topic, sorted by name.
    pub async fn list_topics(&self) -> Result<Vec<TopicListing>> {
        let md = self.metadata(None).await?;
        let mut out: Vec<TopicListing> = md
            .topics
            .into_iter()
            .filter(|t| t.error.is_none())
            .map(|t| TopicListing {
                name: t.name,
                internal: t.internal,
                partitions: t.partitions.len(),
            })
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    /// Describe topics: partitions with leader, replicas and in-sync replicas. One result
    /// per topic; an unknown topic gives `UnknownTopicOrPartition`.
    ///
    /// ```no_run
    /// # async fn demo(admin: kafkapipe::admin::Admin) -> kafkapipe::Result<()> {
    /// let (_, described) = admin.describe_topics(&["events"]).await?.remove(0);
    /// for p in described?.partitions {
    ///     println!("{} leader {} replicas {:?} isr {:?}", p.id, p.leader, p.replicas, p.isr);
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn describe_topics(&self, names: &[&str]) -> Result<Results<String, TopicInfo>> {
        let md = self.metadata(Some(names)).await?;
        Ok(names
            .iter()
            .map(|n| {
                let r = match md.topic(n) {
                    None => Err(Error::kafka(ErrorCode::UnknownTopicOrPartition).with_topic(*n)),
                    Some(t) => match t.error {
                        Some(code) => Err(Error::kafka(code).with_topic(*n)),
                        None => Ok(t.clone()),
                    },
                };
                ((*n).to_string(), r)
            })
            .collect())
    }

    /// Grow topics to `(topic, new total partition count)`, or with `validate_only` only
    /// check. One result per topic. Sent to the controller.
    ///
    /// ```no_run
    /// # async fn demo(admin: kafkapipe::admin::Admin) -> kafkapipe::Result<()> {
    /// admin.create_partitions(&[("events", 12)], false).await?.remove(0).1?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// `UnsupportedVersion` naming CreatePartitions if the broker lacks the API.
    pub async fn create_partitions(
        &self,
        counts: &[(&str, i32)],
        validate_only: bool,
    ) -> Result<Results<String>> {
        let req = CreatePartitionsRequest {
            topics: counts
                .iter()
                .map(|(name, count)| CreatePartitionsTopic {
                    name: (*name).to_string(),
                    count: *count,
                    assignments: None,
                    ..Default::default()
                })
                .collect(),
            timeout_ms: duration_ms(self.timeout),
            validate_only,
            ..Default::default()
        };
        let req = &req;
        let (resp, broker) = self
            .retry("CreatePartitions", || async move {
                let c = self.controller().await?;
                Ok((c.send(req).await?, c.broker().to_string()))
            })
            .await?;
        Ok(counts
            .iter()
            .map(|(name, _)| {
                self.cluster.invalidate(name);
                let r = match resp.results.iter().find(|r| r.name == *name) {
                    None => Err(Error::protocol(
                        "CreatePartitions response does not mention the topic",
                    )),
                    Some(r) => match ErrorCode::non_zero(r.error_code) {
                        None => Ok(()),
                        Some(code) => Err(code_error(code, r.error_message.as_deref())),
                    },
                };
                (
                    (*name).to_string(),
                    r.map_err(|e| e.with_topic(*name).with_broker(&broker)),
                )
            })
            .collect())
    }

    // ---------------------------------------------------------------- cluster
}
