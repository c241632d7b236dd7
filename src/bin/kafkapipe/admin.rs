//! The admin commands: `topics`, `groups`, `offsets`, `cluster`, `quotas`.

use std::io::Write;

use kafkapipe::admin::{Admin, ConfigResource, OffsetFetchOptions, OffsetSpec, TopicPartition};
use kafkapipe::conn::NewTopic;

use crate::{io, Fail, GroupsCmd, QuotaEntityArgs, QuotasCmd, TopicsCmd};

/// `topics [list|create|delete|describe]`.
pub async fn topics(
    admin: &Admin,
    cmd: Option<TopicsCmd>,
    out: &mut dyn Write,
) -> Result<(), Fail> {
    match cmd.unwrap_or(TopicsCmd::List) {
        TopicsCmd::List => {
            for t in admin.list_topics().await? {
                writeln!(out, "{}\t{}", t.name, t.partitions).map_err(io)?;
            }
            Ok(())
        }
        TopicsCmd::Create {
            name,
            partitions,
            replication,
            configs,
        } => {
            let mut topic = NewTopic::new(&name, partitions).replication_factor(replication);
            for kv in &configs {
                let (k, v) = kv
                    .split_once('=')
                    .ok_or_else(|| Fail::Usage(format!("-c wants KEY=VALUE, got {kv:?}")))?;
                topic = topic.config(k, v);
            }
            report(admin.create_topics(&[topic], false).await, "created", out)
        }
        TopicsCmd::Delete { names } => {
            let names: Vec<&str> = names.iter().map(String::as_str).collect();
            report(admin.delete_topics(&names).await, "deleted", out)
        }
        TopicsCmd::Describe { names } => {
            let names: Vec<&str> = names.iter().map(String::as_str).collect();
            let described = admin.describe_topics(&names).await?;
            let resources: Vec<ConfigResource> =
                names.iter().map(|n| ConfigResource::topic(*n)).collect();
            let configs = admin.describe_configs(&resources, None).await.ok();
            let mut failed = false;
            for (i, (name, r)) in described.into_iter().enumerate() {
                match r {
                    Err(e) => {
                        writeln!(out, "{name}: {e}").map_err(io)?;
                        failed = true;
                    }
                    Ok(t) => {
                        writeln!(out, "topic {name} partitions {}", t.partitions.len())
                            .map_err(io)?;
                        for p in &t.partitions {
                            writeln!(
                                out,
                                "  partition {} leader {} replicas {:?} isr {:?}",
                                p.id, p.leader, p.replicas, p.isr
                            )
                            .map_err(io)?;
                        }
                        if let Some(Ok(entries)) =
                            configs.as_ref().and_then(|c| c.get(i)).map(|c| &c.1)
                        {
                            for e in entries {
                                writeln!(
                                    out,
                                    "  config {}={}",
                                    e.name,
                                    e.value.as_deref().unwrap_or("")
                                )
                                .map_err(io)?;
                            }
                        }
                    }
                }
            }
            if failed {
                Err(Fail::Run("some topics could not be described".into()))
            } else {
                Ok(())
            }
        }
    }
}

/// Print per-resource results; fail if any failed.
fn report(
    r: kafkapipe::Result<kafkapipe::admin::Results<String>>,
    done: &str,
    out: &mut dyn Write,
) -> Result<(), Fail> {
    let mut failed = Vec::new();
    for (name, r) in r? {
        match r {
            Ok(()) => writeln!(out, "{done} {name}").map_err(io)?,
            Err(e) => failed.push(format!("{name}: {e}")),
        }
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err(Fail::Run(failed.join("\n")))
    }
}

/// `groups [list|describe|delete]`.
pub async fn groups(
    admin: &Admin,
    cmd: Option<GroupsCmd>,
    out: &mut dyn Write,
) -> Result<(), Fail> {
    match cmd.unwrap_or(GroupsCmd::List) {
        GroupsCmd::List => {
            for g in admin.list_groups().await? {
                writeln!(
                    out,
                    "{}\t{}\t{}\t{}",
                    g.group_id,
                    g.state.as_deref().unwrap_or("-"),
                    if g.protocol_type.is_empty() {
                        "-"
                    } else {
                        &g.protocol_type
                    },
                    g.group_type.as_deref().unwrap_or("-")
                )
                .map_err(io)?;
            }
            Ok(())
        }
        GroupsCmd::Describe {
            group,
            require_stable,
        } => {
            // A consumer-protocol (KIP-848) group first; a classic group (or a broker
            // without ConsumerGroupDescribe) is described with DescribeGroups.
            let consumer = match admin.describe_consumer_groups(&[&group]).await {
                Ok(mut v) => v.pop().and_then(|(_, d)| d.ok()),
                Err(_) => None,
            };
            // Else a share group (KIP-932): its start offsets instead of commits.
            let share = match consumer {
                Some(_) => None,
                None => match admin.describe_share_groups(&[&group]).await {
                    Ok(mut v) => v.pop().and_then(|(_, d)| d.ok()),
                    Err(_) => None,
                },
            };
            if let Some(d) = share {
                return describe_share(admin, d, out).await;
            }
            match consumer {
                Some(d) => {
                    writeln!(
                        out,
                        "group {} state {} protocol consumer {} epoch {} coordinator {}",
                        d.group_id, d.state, d.assignor, d.group_epoch, d.coordinator
                    )
                    .map_err(io)?;
                    for m in &d.members {
                        writeln!(
                            out,
                            "  member {} epoch {} client {} host {}",
                            m.member_id, m.member_epoch, m.client_id, m.client_host
                        )
                        .map_err(io)?;
                        let mut by_topic: std::collections::BTreeMap<&str, Vec<i32>> =
                            std::collections::BTreeMap::new();
                        for tp in &m.assignment {
                            by_topic.entry(&tp.topic).or_default().push(tp.partition);
                        }
                        for (topic, partitions) in by_topic {
                            writeln!(out, "    assigned {topic} {partitions:?}").map_err(io)?;
                        }
                    }
                }
                None => {
                    let (_, d) = admin
                        .describe_groups(&[&group])
                        .await?
                        .pop()
                        .ok_or_else(|| Fail::Run("no result".into()))?;
                    let d = d?;
                    writeln!(
                        out,
                        "group {} state {} protocol {} {} coordinator {}",
                        d.group_id, d.state, d.protocol_type, d.protocol, d.coordinator
                    )
                    .map_err(io)?;
                    for m in &d.members {
                        writeln!(
                            out,
                            "  member {} client {} host {}",
                            m.member_id, m.client_id, m.client_host
                        )
                        .map_err(io)?;
                        if let Some(a) = &m.decoded_assignment {
                            for tp in &a.partitions {
                                writeln!(out, "    assigned {} {:?}", tp.topic, tp.partitions)
                                    .map_err(io)?;
                            }
                        }
                    }
                }
            }
            let stable = OffsetFetchOptions::new().require_stable(require_stable);
            let offsets = admin
                .fetch_group_offsets_with(&group, None, &stable)
                .await?;
            let specs: Vec<(TopicPartition, OffsetSpec)> = offsets
                .iter()
                .map(|(tp, _)| (tp.clone(), OffsetSpec::Latest))
                .collect();
            let ends = admin.list_offsets(&specs).await?;
            for ((tp, committed), (_, end)) in offsets.iter().zip(ends) {
                let committed = committed.as_ref().map(|c| c.offset).unwrap_or(-1);
                let end = end.map(|e| e.offset).unwrap_or(-1);
                let lag = if committed >= 0 && end >= 0 {
                    (end - committed).max(0).to_string()
                } else {
                    "-".into()
                };
                writeln!(
                    out,
                    "  offset {} {} committed {committed} end {end} lag {lag}",
                    tp.topic, tp.partition
                )
                .map_err(io)?;
            }
            Ok(())
        }
        GroupsCmd::Delete { groups } => {
            let names: Vec<&str> = groups.iter().map(String::as_str).collect();
            report(admin.delete_groups(&names).await, "deleted", out)
        }
    }
}

/// `groups describe` of share group `d`: members, the partitions each may fetch from,
/// and the group's start offset and lag in each partition.
async fn describe_share(
    admin: &Admin,
    d: kafkapipe::admin::ShareGroupDescription,
    out: &mut dyn Write,
) -> Result<(), Fail> {
    writeln!(
        out,
        "group {} state {} protocol share {} epoch {} coordinator {}",
        d.group_id, d.state, d.assignor, d.group_epoch, d.coordinator
    )
    .map_err(io)?;
    for m in &d.members {
        writeln!(
            out,
            "  member {} epoch {} client {} host {}",
            m.member_id, m.member_epoch, m.client_id, m.client_host
        )
        .map_err(io)?;
        let mut by_topic: std::collections::BTreeMap<&str, Vec<i32>> =
            std::collections::BTreeMap::new();
        for tp in &m.assignment {
            by_topic.entry(&tp.topic).or_default().push(tp.partition);
        }
        for (topic, partitions) in by_topic {
            writeln!(out, "    assigned {topic} {partitions:?}").map_err(io)?;
        }
    }
    for o in admin
        .describe_share_group_offsets(&d.group_id, None)
        .await?
    {
        let lag = o.lag.map_or_else(|| "-".to_string(), |l| l.to_string());
        writeln!(
            out,
            "  offset {} {} start {} lag {lag}",
            o.partition.topic, o.partition.partition, o.start_offset
        )
        .map_err(io)?;
    }
    Ok(())
}

/// `offsets TOPIC`: partition, earliest and latest offset, tab-separated.
pub async fn offsets(admin: &Admin, topic: &str, out: &mut dyn Write) -> Result<(), Fail> {
    let partitions = admin.cluster().partitions(topic).await?;
    let mut specs = Vec::new();
    for p in &partitions {
        specs.push((TopicPartition::new(topic, *p), OffsetSpec::Earliest));
        specs.push((TopicPartition::new(topic, *p), OffsetSpec::Latest));
    }
    let listed = admin.list_offsets(&specs).await?;
    for pair in listed.chunks(2) {
        let [(tp, earliest), (_, latest)] = pair else {
            continue;
        };
        let show = |r: &kafkapipe::Result<kafkapipe::admin::ListedOffset>| match r {
            Ok(o) => o.offset.to_string(),
            Err(e) => format!("error: {e}"),
        };
        writeln!(
            out,
            "{}\t{}\t{}",
            tp.partition,
            show(earliest),
            show(latest)
        )
        .map_err(io)?;
    }
    Ok(())
}

/// `cluster`: the cluster id, the controller and every broker.
pub async fn cluster(admin: &Admin, out: &mut dyn Write) -> Result<(), Fail> {
    let c = admin.describe_cluster().await?;
    writeln!(
        out,
        "cluster {} controller {}",
        c.cluster_id.as_deref().unwrap_or("-"),
        c.controller_id
    )
    .map_err(io)?;
    for b in &c.brokers {
        writeln!(out, "broker {} {}", b.id, b.addr()).map_err(io)?;
    }
    Ok(())
}

/// The components given on the command line, as (type, name or `None` for the default).
fn quota_components(
    a: &QuotaEntityArgs,
) -> Vec<(kafkapipe::admin::QuotaEntityType, Option<String>)> {
    use kafkapipe::admin::QuotaEntityType as T;
    let mut c = Vec::new();
    for (kind, name, default) in [
        (T::User, &a.user, a.default_user),
        (T::ClientId, &a.client_id, a.default_client_id),
        (T::Ip, &a.ip, a.default_ip),
    ] {
        match (name, default) {
            (Some(n), _) => c.push((kind, Some(n.clone()))),
            (None, true) => c.push((kind, None)),
            (None, false) => {}
        }
    }
    c
}

/// `quotas describe|alter`.
pub async fn quotas(admin: &Admin, cmd: QuotasCmd, out: &mut dyn Write) -> Result<(), Fail> {
    use kafkapipe::admin::{QuotaEntity, QuotaFilter, QuotaMatch, QuotaOp};
    match cmd {
        QuotasCmd::Describe { entity, strict } => {
            let mut filter = QuotaFilter::all().strict(strict);
            for (kind, name) in quota_components(&entity) {
                let m = match name {
                    Some(n) => QuotaMatch::Exact(n),
                    None => QuotaMatch::Default,
                };
                filter = filter.component(kind, m);
            }
            for (entity, values) in admin.describe_client_quotas(&filter).await? {
                let values: Vec<String> = values.iter().map(|(k, v)| format!("{k}={v}")).collect();
                writeln!(out, "{entity}\t{}", values.join(",")).map_err(io)?;
            }
            Ok(())
        }
        QuotasCmd::Alter {
            entity,
            set,
            remove,
            validate_only,
        } => {
            let components = quota_components(&entity);
            if components.is_empty() {
                return Err(Fail::Usage(
                    "quotas alter needs an entity: --user, --client-id, --ip or a --default-*"
                        .into(),
                ));
            }
            let mut ops = Vec::new();
            for kv in &set {
                let (k, v) = kv
                    .split_once('=')
                    .ok_or_else(|| Fail::Usage(format!("--set wants KEY=VALUE, got {kv:?}")))?;
                let v: f64 = v
                    .parse()
                    .map_err(|_| Fail::Usage(format!("--set {k}: {v:?} is not a number")))?;
                ops.push(QuotaOp::set(k, v));
            }
            ops.extend(remove.iter().map(QuotaOp::remove));
            if ops.is_empty() {
                return Err(Fail::Usage("quotas alter needs --set or --remove".into()));
            }
            let entity = QuotaEntity { components };
            let done = if validate_only {
                "validated"
            } else {
                "altered"
            };
            let r = admin
                .alter_client_quotas(&[(entity, ops)], validate_only)
                .await
                .map(|r| r.into_iter().map(|(e, r)| (e.to_string(), r)).collect());
            report(r, done, out)
        }
    }
}
