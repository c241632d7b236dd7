//! Describe and alter configs of topics and brokers.

use crate::protocol::ErrorCode;
use std::collections::BTreeMap;

use tracing::debug;

use super::types::apply_ops;
use super::{code_error, Admin, AlterConfigOp, ConfigEntry, ConfigResource, ConfigSource, Results};
use crate::conn::Connection;
use crate::error::{Error, ErrorKind, Result};
use crate::protocol::messages::{
    AlterConfigsRequest, AlterConfigsResource, AlterableConfig, DescribeConfigsRequest,
    DescribeConfigsResource, IncrementalAlterConfigsRequest, IncrementalAlterConfigsResource,
    IncrementalAlterableConfig,
};

/// Resources grouped by the broker that must answer for them (`None`: any broker).
fn by_target<T>(items: &[(ConfigResource, T)]) -> BTreeMap<Option<i32>, Vec<usize>> {
    let mut m: BTreeMap<Option<i32>, Vec<usize>> = BTreeMap::new();
    for (i, (r, _)) in items.iter().enumerate() {
        m.entry(r.broker_id()).or_default().push(i);
    }
    m
}

fn find<'a, T>(list: &'a [T], r: &ConfigResource, key: impl Fn(&T) -> (i8, &str)) -> Result<&'a T> {
    list.iter()
        .find(|x| key(x) == (r.wire_type(), r.name()))
        .ok_or_else(|| Error::protocol(format!("response does not mention config resource {r:?}")))
}

impl Admin {
    async fn config_connection(&self, target: Option<i32>) -> Result<Connection> {
        match target {
            Some(id) => self.cluster.connection(id).await,
            None => Ok(self.any_connection().await?.1),
        }
    }

    /// Describe the configs of topics and brokers, with synonyms and documentation. With
    /// `keys`, only those configs are returned. One result per resource; broker resources
    /// are asked of that broker.
    ///
    /// All configs are always requested and `keys` applied here (tansu 0.6 drops the
    /// connection on a DescribeConfigs with a key list).
    ///
    /// ```no_run
    /// # use kafkapipe::admin::{Admin, ConfigResource};
    /// # async fn demo(admin: Admin) -> kafkapipe::Result<()> {
    /// let topic = ConfigResource::topic("events");
    /// let r = admin.describe_configs(&[topic], Some(&["retention.ms"])).await?;
    /// for entry in r[0].1.as_ref().map_err(Clone::clone)? {
    ///     println!("{} = {:?} ({:?})", entry.name, entry.value, entry.source);
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn describe_configs(
        &self,
        resources: &[ConfigResource],
        keys: Option<&[&str]>,
    ) -> Result<Results<ConfigResource, Vec<ConfigEntry>>> {
        let items: Vec<(ConfigResource, ())> = resources.iter().map(|r| (r.clone(), ())).collect();
        let mut out: Vec<Option<Result<Vec<ConfigEntry>>>> =
            resources.iter().map(|_| None).collect();
        for (target, idxs) in by_target(&items) {
            let req = DescribeConfigsRequest {
                resources: idxs
                    .iter()
                    .map(|&i| DescribeConfigsResource {
                        resource_type: resources[i].wire_type(),
                        resource_name: resources[i].name().to_string(),
                        configuration_keys: None,
                        ..Default::default()
                    })
                    .collect(),
                include_synonyms: true,
                include_documentation: true,
                ..Default::default()
            };
            let req = &req;
            let resp = self
                .retry("DescribeConfigs", || async move {
                    let c = self.config_connection(target).await?;
                    debug!(
                        broker = c.broker(),
                        resources = req.resources.len(),
                        "describe configs"
                    );
                    c.send(req).await
                })
                .await;
            for i in idxs {
                let r = &resources[i];
                out[i] = Some(resp.as_ref().map_err(Clone::clone).and_then(|resp| {
                    let res = find(&resp.results, r, |x| {
                        (x.resource_type, x.resource_name.as_str())
                    })?;
                    if let Some(code) = ErrorCode::non_zero(res.error_code) {
                        return Err(code_error(code, res.error_message.as_deref()));
                    }
                    Ok(res
                        .configs
                        .iter()
                        .filter(|c| keys.is_none_or(|k| k.contains(&c.name.as_str())))
                        .map(|c| ConfigEntry {
                            name: c.name.clone(),
                            value: c.value.clone(),
                            read_only: c.read_only,
                            source: ConfigSource::from(c.config_source),
                            sensitive: c.is_sensitive,
                            synonyms: c
                                .synonyms
                                .iter()
                                .map(|s| {
                                    (
                                        s.name.clone(),
                                        s.value.clone(),
                                        ConfigSource::from(s.source),
                                    )
                                })
                                .collect(),
                            documentation: c.documentation.clone(),
                        })
                        .collect())
                }));
            }
        }
        Ok(resources
            .iter()
            .cloned()
            .zip(out)
            .map(|(r, o)| (r, o.unwrap_or_else(|| Err(Error::protocol("no result")))))
            .collect())
    }

    /// Change individual configs (set, delete, append to or subtract from list configs)
    /// of topics and brokers, or with `validate_only` only check the changes. One result
    /// per resource.
    ///
    /// Brokers without IncrementalAlterConfigs (before Kafka 2.3) get the equivalent
    /// AlterConfigs request instead: the resource's explicitly set configs are read,
    /// changed locally and written back as a whole (not atomic with concurrent changes).
    ///
    /// ```no_run
    /// # use kafkapipe::admin::{Admin, AlterConfigOp, ConfigResource};
    /// # async fn demo(admin: Admin) -> kafkapipe::Result<()> {
    /// let ops = vec![AlterConfigOp::Set("retention.ms".into(), "3600000".into())];
    /// let changes = [(ConfigResource::topic("events"), ops)];
    /// for (resource, r) in admin.incremental_alter_configs(&changes, false).await? {
    ///     r?;
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn incremental_alter_configs(
        &self,
        changes: &[(ConfigResource, Vec<AlterConfigOp>)],
        validate_only: bool,
    ) -> Result<Results<ConfigResource>> {
        let mut out: Vec<Option<Result<()>>> = changes.iter().map(|_| None).collect();
        for (target, idxs) in by_target(changes) {
            let c = self
                .retry("IncrementalAlterConfigs", || self.config_connection(target))
                .await?;
            let incremental = match c.version_for::<IncrementalAlterConfigsRequest>() {
                Ok(_) => true,
                Err(e) if e.kind() == ErrorKind::UnsupportedVersion => false,
                Err(e) => return Err(e),
            };
            if !incremental {
                debug!(
                    broker = c.broker(),
                    "no IncrementalAlterConfigs, falling back to AlterConfigs"
                );
                let resources: Vec<ConfigResource> =
                    idxs.iter().map(|&i| changes[i].0.clone()).collect();
                let current = self.describe_configs(&resources, None).await?;
                let mut full = Vec::new();
                let mut full_idx = Vec::new();
                for (&i, (_, cur)) in idxs.iter().zip(current) {
                    match cur {
                        Err(e) => out[i] = Some(Err(e)),
                        Ok(entries) => {
                            let set: Vec<(String, String)> = entries
                                .into_iter()
                                .filter(|e| {
                                    matches!(
                                        e.source,
                                        ConfigSource::DynamicTopic
                                            | ConfigSource::DynamicBroker
                                            | ConfigSource::DynamicDefaultBroker
                                            | ConfigSource::DynamicBrokerLogger
                                    )
                                })
                                .filter_map(|e| e.value.map(|v| (e.name, v)))
                                .collect();
                            full.push((changes[i].0.clone(), apply_ops(set, &changes[i].1)));
                            full_idx.push(i);
                        }
                    }
                }
                for (i, (_, r)) in full_idx
                    .into_iter()
                    .zip(self.alter_configs(&full, validate_only).await?)
                {
                    out[i] = Some(r);
                }
                continue;
            }
            let req = IncrementalAlterConfigsRequest {
                resources: idxs
                    .iter()
                    .map(|&i| IncrementalAlterConfigsResource {
                        resource_type: changes[i].0.wire_type(),
                        resource_name: changes[i].0.name().to_string(),
                        configs: changes[i]
                            .1
                            .iter()
                            .map(|op| {
                                let (name, operation, value) = op.parts();
                                IncrementalAlterableConfig {
                                    name: name.to_string(),
                                    config_operation: operation,
                                    value: value.map(str::to_string),
                                    ..Default::default()
                                }
                            })
                            .collect(),
                        ..Default::default()
                    })
                    .collect(),
                validate_only,
                ..Default::default()
            };
            let req = &req;
            let resp = self
                .retry("IncrementalAlterConfigs", || async move {
                    self.config_connection(target).await?.send(req).await
                })
                .await;
            for i in idxs {
                let r = &changes[i].0;
                out[i] = Some(resp.as_ref().map_err(Clone::clone).and_then(|resp| {
                    let res = find(&resp.responses, r, |x| {
                        (x.resource_type, x.resource_name.as_str())
                    })?;
                    match ErrorCode::non_zero(res.error_code) {
                        Some(code) => Err(code_error(code, res.error_message.as_deref())),
                        None => Ok(()),
                    }
                }));
            }
        }
        Ok(changes
            .iter()
            .zip(out)
            .map(|((r, _), o)| {
                (
                    r.clone(),
                    o.unwrap_or_else(|| Err(Error::protocol("no result"))),
                )
            })
            .collect())
    }

    /// Replace the whole set of explicitly set configs of each resource (the legacy
    /// AlterConfigs API: configs not listed go back to their defaults). Prefer
    /// [`Admin::incremental_alter_configs`]. One result per resource.
    ///
    /// # Errors
    ///
    /// `UnsupportedVersion` naming AlterConfigs if the broker lacks the API.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # use kafkapipe::admin::ConfigResource;
    /// # async fn demo(admin: kafkapipe::admin::Admin) -> kafkapipe::Result<()> {
    /// let configs = vec![("retention.ms".to_string(), "3600000".to_string())];
    /// admin.alter_configs(&[(ConfigResource::topic("events"), configs)], false).await?;
    /// # Ok(()) }
    /// ```
    pub async fn alter_configs(
        &self,
        resources: &[(ConfigResource, Vec<(String, String)>)],
        validate_only: bool,
    ) -> Result<Results<ConfigResource>> {
        let mut out: Vec<Option<Result<()>>> = resources.iter().map(|_| None).collect();
        for (target, idxs) in by_target(resources) {
            let req = AlterConfigsRequest {
                resources: idxs
                    .iter()
                    .map(|&i| AlterConfigsResource {
                        resource_type: resources[i].0.wire_type(),
                        resource_name: resources[i].0.name().to_string(),
                        configs: resources[i]
                            .1
                            .iter()
                            .map(|(k, v)| AlterableConfig {
                                name: k.clone(),
                                value: Some(v.clone()),
                                ..Default::default()
                            })
                            .collect(),
                        ..Default::default()
                    })
                    .collect(),
                validate_only,
                ..Default::default()
            };
            let req = &req;
            let resp = self
                .retry("AlterConfigs", || async move {
                    self.config_connection(target).await?.send(req).await
                })
                .await?;
            for i in idxs {
                let r = &resources[i].0;
                out[i] = Some(
                    find(&resp.responses, r, |x| {
                        (x.resource_type, x.resource_name.as_str())
                    })
                    .and_then(|res| {
                        match ErrorCode::non_zero(res.error_code) {
                            Some(code) => Err(code_error(code, res.error_message.as_deref())),
                            None => Ok(()),
                        }
                    }),
                );
            }
        }
        Ok(resources
            .iter()
            .zip(out)
            .map(|((r, _), o)| {
                (
                    r.clone(),
                    o.unwrap_or_else(|| Err(Error::protocol("no result"))),
                )
            })
            .collect())
    }
}
