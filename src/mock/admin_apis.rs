//! The mock's admin APIs beyond topics: DescribeConfigs and AlterConfigs for topics,
//! DescribeGroups and DeleteGroups on the group coordinator.

use super::{State, Topic};
use crate::protocol::messages::*;
use crate::protocol::{ApiKey, ErrorCode};

/// Config resource type of a topic.
const TOPIC: i8 = 2;
/// Config resource type of a broker.
const BROKER: i8 = 4;
/// Config source: set on the topic.
const DYNAMIC_TOPIC_CONFIG: i8 = 1;
/// Config source: the default.
const DEFAULT_CONFIG: i8 = 5;

/// The topic configs every topic reports, with their defaults.
const DEFAULTS: &[(&str, &str)] = &[
    ("cleanup.policy", "delete"),
    ("compression.type", "producer"),
    ("max.message.bytes", "1048588"),
    ("min.insync.replicas", "1"),
    ("retention.bytes", "-1"),
    ("retention.ms", "604800000"),
    ("segment.ms", "604800000"),
];

fn entry(name: &str, value: &str, source: i8) -> DescribeConfigsResourceResult {
    DescribeConfigsResourceResult {
        name: name.to_string(),
        value: Some(value.to_string()),
        config_source: source,
        ..DescribeConfigsResourceResult::default()
    }
}

/// A topic's configs: the ones set on it, then the defaults of the others.
fn topic_configs(topic: &Topic) -> Vec<DescribeConfigsResourceResult> {
    let mut out: Vec<_> = topic
        .configs
        .iter()
        .map(|(k, v)| entry(k, v, DYNAMIC_TOPIC_CONFIG))
        .collect();
    out.extend(
        DEFAULTS
            .iter()
            .filter(|(k, _)| !topic.configs.contains_key(*k))
            .map(|(k, v)| entry(k, v, DEFAULT_CONFIG)),
    );
    out
}

pub(super) fn describe_configs(
    st: &State,
    req: &DescribeConfigsRequest,
    forced: Option<ErrorCode>,
) -> DescribeConfigsResponse {
    let results = req
        .resources
        .iter()
        .map(|r| {
            let mut out = DescribeConfigsResult {
                resource_type: r.resource_type,
                resource_name: r.resource_name.clone(),
                ..DescribeConfigsResult::default()
            };
            let configs = match (forced, r.resource_type) {
                (Some(e), _) => Err(e),
                (None, TOPIC) => st
                    .topics
                    .get(&r.resource_name)
                    .map(topic_configs)
                    .ok_or(ErrorCode::UnknownTopicOrPartition),
                (None, BROKER) => Ok(Vec::new()),
                (None, _) => Err(ErrorCode::InvalidRequest),
            };
            match configs {
                Ok(all) => {
                    out.configs = all
                        .into_iter()
                        .filter(|c| {
                            r.configuration_keys
                                .as_ref()
                                .is_none_or(|keys| keys.contains(&c.name))
                        })
                        .collect();
                }
                Err(e) => out.error_code = e.code(),
            }
            out
        })
        .collect();
    DescribeConfigsResponse {
        results,
        ..DescribeConfigsResponse::default()
    }
}

/// AlterConfigs replaces every config set on a topic with the request's.
pub(super) fn alter_configs(
    st: &mut State,
    req: &AlterConfigsRequest,
    forced: Option<ErrorCode>,
) -> AlterConfigsResponse {
    let responses = req
        .resources
        .iter()
        .map(|r| {
            let error = forced.or(match r.resource_type {
                TOPIC if st.topics.contains_key(&r.resource_name) => None,
                TOPIC => Some(ErrorCode::UnknownTopicOrPartition),
                _ => Some(ErrorCode::InvalidRequest),
            });
            if error.is_none() && !req.validate_only {
                if let Some(t) = st.topics.get_mut(&r.resource_name) {
                    t.configs = r
                        .configs
                        .iter()
                        .filter_map(|c| c.value.clone().map(|v| (c.name.clone(), v)))
                        .collect();
                }
            }
            AlterConfigsResourceResponse {
                error_code: error.map_or(0, ErrorCode::code),
                resource_type: r.resource_type,
                resource_name: r.resource_name.clone(),
                ..AlterConfigsResourceResponse::default()
            }
        })
        .collect();
    AlterConfigsResponse {
        responses,
        ..AlterConfigsResponse::default()
    }
}

/// The error for `group` on broker `id`: an injected one, or NOT_COORDINATOR.
fn group_error(
    st: &mut State,
    id: i32,
    api: ApiKey,
    group: &str,
    forced: Option<ErrorCode>,
) -> Option<ErrorCode> {
    forced
        .or_else(|| st.take_partition_error(api, group, super::GROUP_PARTITION))
        .or_else(|| {
            st.coordinator(group)
                .is_none_or(|b| b.id != id)
                .then_some(ErrorCode::NotCoordinator)
        })
}

pub(super) fn describe_groups(
    id: i32,
    st: &mut State,
    req: &DescribeGroupsRequest,
    forced: Option<ErrorCode>,
) -> DescribeGroupsResponse {
    let groups = req
        .groups
        .iter()
        .map(|name| {
            let error = group_error(st, id, ApiKey::DESCRIBE_GROUPS, name, forced);
            let mut out = match (error, st.groups.get(name)) {
                (None, Some(g)) => g.describe(),
                (None, None) => DescribedGroup {
                    group_state: "Dead".to_string(),
                    ..DescribedGroup::default()
                },
                (Some(e), _) => DescribedGroup {
                    error_code: e.code(),
                    ..DescribedGroup::default()
                },
            };
            out.group_id = name.clone();
            out
        })
        .collect();
    DescribeGroupsResponse {
        groups,
        ..DescribeGroupsResponse::default()
    }
}

pub(super) fn delete_groups(
    id: i32,
    st: &mut State,
    req: &DeleteGroupsRequest,
    forced: Option<ErrorCode>,
) -> DeleteGroupsResponse {
    let results = req
        .groups_names
        .iter()
        .map(|name| {
            let error =
                group_error(st, id, ApiKey::DELETE_GROUPS, name, forced).or_else(|| {
                    match st.groups.get(name) {
                        None => Some(ErrorCode::GroupIdNotFound),
                        Some(g) if !g.member_ids().is_empty() => Some(ErrorCode::NonEmptyGroup),
                        Some(_) => None,
                    }
                });
            if error.is_none() {
                st.groups.remove(name);
            }
            DeletableGroupResult {
                group_id: name.clone(),
                error_code: error.map_or(0, ErrorCode::code),
                ..DeletableGroupResult::default()
            }
        })
        .collect();
    DeleteGroupsResponse {
        results,
        ..DeleteGroupsResponse::default()
    }
}
