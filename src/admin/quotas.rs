//! Client quotas (KIP-546): describe and alter the quotas of user, client-id and ip
//! entities (DescribeClientQuotas, AlterClientQuotas). Both go to any broker (a KRaft
//! broker forwards alterations to the controller).
//!
//! Quota keys are Kafka's: `producer_byte_rate`, `consumer_byte_rate`,
//! `request_percentage`, `controller_mutation_rate` (user and client-id entities) and
//! `connection_creation_rate` (ip entities). A broker over a quota answers with a throttle
//! time, which every connection of this crate honours (KIP-219, see
//! [`crate::protocol::throttle`]).

use std::collections::BTreeMap;
use std::fmt;

use super::{code_error, Admin, Results};
use crate::error::{Error, Result};
use crate::protocol::messages::{
    AlterClientQuotaEntity, AlterClientQuotaEntry, AlterClientQuotaOp, AlterClientQuotasRequest,
    ClientQuotaFilterComponent, DescribeClientQuotasRequest,
};
use crate::protocol::ErrorCode;

/// The kind of one component of a [`QuotaEntity`].
///
/// ```
/// use kafkapipe::admin::QuotaEntityType;
/// assert_eq!(QuotaEntityType::ClientId.as_str(), "client-id");
/// assert_eq!("user".parse::<QuotaEntityType>().unwrap(), QuotaEntityType::User);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum QuotaEntityType {
    /// An authenticated principal's user name (`user`).
    User,
    /// A client id (`client-id`).
    ClientId,
    /// A client IP address (`ip`; only `connection_creation_rate`).
    Ip,
    /// A type this client does not know, as the broker named it.
    Other(String),
}

impl QuotaEntityType {
    /// The wire name: `user`, `client-id`, `ip`.
    pub fn as_str(&self) -> &str {
        match self {
            QuotaEntityType::User => "user",
            QuotaEntityType::ClientId => "client-id",
            QuotaEntityType::Ip => "ip",
            QuotaEntityType::Other(s) => s,
        }
    }

    fn from_wire(s: &str) -> Self {
        match s {
            "user" => QuotaEntityType::User,
            "client-id" => QuotaEntityType::ClientId,
            "ip" => QuotaEntityType::Ip,
            other => QuotaEntityType::Other(other.to_string()),
        }
    }
}

impl fmt::Display for QuotaEntityType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for QuotaEntityType {
    type Err = Error;

    /// `user`, `client-id` (or `client_id`), `ip`; anything else is a `Config` error.
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "user" => Ok(QuotaEntityType::User),
            "client-id" | "client_id" => Ok(QuotaEntityType::ClientId),
            "ip" => Ok(QuotaEntityType::Ip),
            other => Err(Error::config(format!(
                "unknown quota entity type {other:?} (expected user, client-id or ip)"
            ))),
        }
    }
}

/// A quota entity: one or two components (a user, a client id, or both; or an ip), each
/// named or the *default* entity of its type (`None`), which applies to every user or
/// client id without a quota of its own.
///
/// ```
/// use kafkapipe::admin::QuotaEntity;
/// let e = QuotaEntity::new().user("alice").client_id("billing");
/// assert_eq!(e.to_string(), "user=alice,client-id=billing");
/// assert_eq!(QuotaEntity::new().default_client_id().to_string(), "client-id=<default>");
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct QuotaEntity {
    /// The components, in the order given: (type, name or `None` for the default).
    pub components: Vec<(QuotaEntityType, Option<String>)>,
}

impl QuotaEntity {
    /// An entity with no components yet.
    pub fn new() -> Self {
        QuotaEntity::default()
    }

    /// Add a component of `kind` named `name` (`None`: the default entity).
    pub fn with(mut self, kind: QuotaEntityType, name: Option<String>) -> Self {
        self.components.push((kind, name));
        self
    }

    /// Add the user `name`.
    pub fn user(self, name: impl Into<String>) -> Self {
        self.with(QuotaEntityType::User, Some(name.into()))
    }

    /// Add the default user.
    pub fn default_user(self) -> Self {
        self.with(QuotaEntityType::User, None)
    }

    /// Add the client id `id`.
    pub fn client_id(self, id: impl Into<String>) -> Self {
        self.with(QuotaEntityType::ClientId, Some(id.into()))
    }

    /// Add the default client id.
    pub fn default_client_id(self) -> Self {
        self.with(QuotaEntityType::ClientId, None)
    }

    /// Add the IP address `ip`.
    pub fn ip(self, ip: impl Into<String>) -> Self {
        self.with(QuotaEntityType::Ip, Some(ip.into()))
    }

    /// Add the default IP.
    pub fn default_ip(self) -> Self {
        self.with(QuotaEntityType::Ip, None)
    }

    /// The same entity with its components in a canonical order (as the broker may list
    /// them in any order).
    fn sorted(mut self) -> Self {
        self.components.sort();
        self
    }
}

impl fmt::Display for QuotaEntity {
    /// `type=name` pairs joined by commas, `<default>` for a default component.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (kind, name)) in self.components.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{kind}={}", name.as_deref().unwrap_or("<default>"))?;
        }
        Ok(())
    }
}

/// How a [`QuotaFilter`] component matches an entity's component of its type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QuotaMatch {
    /// Exactly this name.
    Exact(String),
    /// The default entity of the type.
    Default,
    /// Any named entity of the type (not the default).
    Any,
}

/// Which quota entities [`Admin::describe_client_quotas`] returns.
///
/// ```
/// use kafkapipe::admin::{QuotaEntityType, QuotaFilter, QuotaMatch};
/// // every quota of client id "billing", alone or with a user
/// let f = QuotaFilter::all().component(QuotaEntityType::ClientId, QuotaMatch::Exact("billing".into()));
/// // only entities that are exactly a client id
/// let strict = f.clone().strict(true);
/// assert!(strict.strict && !f.strict);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QuotaFilter {
    /// Components an entity must match (all of them).
    pub components: Vec<(QuotaEntityType, QuotaMatch)>,
    /// Whether entities with components of other types are left out.
    pub strict: bool,
}

impl QuotaFilter {
    /// Every entity with a quota.
    pub fn all() -> Self {
        QuotaFilter::default()
    }

    /// Add a component the entities must match.
    pub fn component(mut self, kind: QuotaEntityType, matching: QuotaMatch) -> Self {
        self.components.push((kind, matching));
        self
    }

    /// Leave out entities with components of types not in the filter.
    pub fn strict(mut self, strict: bool) -> Self {
        self.strict = strict;
        self
    }
}

/// One change to a quota entity: set a key to a value, or remove the key.
///
/// ```
/// use kafkapipe::admin::QuotaOp;
/// let ops = [QuotaOp::set("producer_byte_rate", 1_048_576.0), QuotaOp::remove("consumer_byte_rate")];
/// assert_eq!(ops[1].key(), "consumer_byte_rate");
/// ```
#[derive(Debug, Clone, PartialEq)]
pub enum QuotaOp {
    /// Set `key` to the value.
    Set(String, f64),
    /// Remove `key`.
    Remove(String),
}

impl QuotaOp {
    /// Set `key` to `value`.
    pub fn set(key: impl Into<String>, value: f64) -> Self {
        QuotaOp::Set(key.into(), value)
    }

    /// Remove `key`.
    pub fn remove(key: impl Into<String>) -> Self {
        QuotaOp::Remove(key.into())
    }

    /// The quota key.
    pub fn key(&self) -> &str {
        match self {
            QuotaOp::Set(k, _) | QuotaOp::Remove(k) => k,
        }
    }
}

/// The quotas of one entity: key → value.
pub type QuotaValues = BTreeMap<String, f64>;

impl Admin {
    /// The quotas of the entities matching `filter` (DescribeClientQuotas), each entity
    /// with its components sorted by type.
    ///
    /// ```no_run
    /// # use kafkapipe::admin::{Admin, QuotaFilter};
    /// # async fn demo(admin: Admin) -> kafkapipe::Result<()> {
    /// for (entity, values) in admin.describe_client_quotas(&QuotaFilter::all()).await? {
    ///     println!("{entity}: {values:?}");
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// `UnsupportedVersion` if the broker lacks the API (before Kafka 2.6); the broker's
    /// error (e.g. `INVALID_REQUEST` for a bad filter, `CLUSTER_AUTHORIZATION_FAILED`).
    pub async fn describe_client_quotas(
        &self,
        filter: &QuotaFilter,
    ) -> Result<Vec<(QuotaEntity, QuotaValues)>> {
        let req = DescribeClientQuotasRequest {
            components: filter
                .components
                .iter()
                .map(|(kind, m)| {
                    let (match_type, name) = match m {
                        QuotaMatch::Exact(n) => (0, Some(n.clone())),
                        QuotaMatch::Default => (1, None),
                        QuotaMatch::Any => (2, None),
                    };
                    ClientQuotaFilterComponent {
                        entity_type: kind.as_str().to_string(),
                        match_type,
                        match_: name,
                        ..Default::default()
                    }
                })
                .collect(),
            strict: filter.strict,
            ..Default::default()
        };
        let req = &req;
        let resp = self
            .retry("DescribeClientQuotas", || async move {
                let (_, c) = self.any_connection().await?;
                let r = c.send(req).await?;
                match ErrorCode::non_zero(r.error_code) {
                    Some(code) => {
                        Err(code_error(code, r.error_message.as_deref()).with_broker(c.broker()))
                    }
                    None => Ok(r),
                }
            })
            .await?;
        let mut out: Vec<(QuotaEntity, QuotaValues)> = resp
            .entries
            .unwrap_or_default()
            .into_iter()
            .map(|e| {
                let entity = QuotaEntity {
                    components: e
                        .entity
                        .into_iter()
                        .map(|c| (QuotaEntityType::from_wire(&c.entity_type), c.entity_name))
                        .collect(),
                }
                .sorted();
                let values = e.values.into_iter().map(|v| (v.key, v.value)).collect();
                (entity, values)
            })
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(out)
    }

    /// Apply `ops` to each entity (AlterClientQuotas); with `validate_only` the broker
    /// only checks them. One result per entity, in the order given.
    ///
    /// ```no_run
    /// # use kafkapipe::admin::{Admin, QuotaEntity, QuotaOp};
    /// # async fn demo(admin: Admin) -> kafkapipe::Result<()> {
    /// let entity = QuotaEntity::new().client_id("bulk-loader");
    /// let r = admin
    ///     .alter_client_quotas(&[(entity, vec![QuotaOp::set("producer_byte_rate", 1_048_576.0)])], false)
    ///     .await?;
    /// r[0].1.clone()?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// The outer error: nothing could be asked (`UnsupportedVersion` before Kafka 2.6, no
    /// broker). Per entity: the broker's error, e.g. `INVALID_REQUEST` for an unknown key or
    /// an entity type combination Kafka does not allow.
    pub async fn alter_client_quotas(
        &self,
        alterations: &[(QuotaEntity, Vec<QuotaOp>)],
        validate_only: bool,
    ) -> Result<Results<QuotaEntity>> {
        let req = AlterClientQuotasRequest {
            entries: alterations
                .iter()
                .map(|(entity, ops)| AlterClientQuotaEntry {
                    entity: entity
                        .components
                        .iter()
                        .map(|(kind, name)| AlterClientQuotaEntity {
                            entity_type: kind.as_str().to_string(),
                            entity_name: name.clone(),
                            ..Default::default()
                        })
                        .collect(),
                    ops: ops
                        .iter()
                        .map(|op| AlterClientQuotaOp {
                            key: op.key().to_string(),
                            value: match op {
                                QuotaOp::Set(_, v) => *v,
                                QuotaOp::Remove(_) => 0.0,
                            },
                            remove: matches!(op, QuotaOp::Remove(_)),
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
        let (broker, resp) = self
            .retry("AlterClientQuotas", || async move {
                let (_, c) = self.any_connection().await?;
                let r = c.send(req).await?;
                Ok((c.broker().to_string(), r))
            })
            .await?;
        let results = alterations
            .iter()
            .map(|(entity, _)| {
                let wanted = entity.clone().sorted();
                let found = resp.entries.iter().find(|e| {
                    QuotaEntity {
                        components: e
                            .entity
                            .iter()
                            .map(|c| {
                                (
                                    QuotaEntityType::from_wire(&c.entity_type),
                                    c.entity_name.clone(),
                                )
                            })
                            .collect(),
                    }
                    .sorted()
                        == wanted
                });
                let result = match found {
                    None => Err(Error::protocol(format!(
                        "AlterClientQuotas response does not mention entity {entity}"
                    ))
                    .with_broker(broker.clone())),
                    Some(e) => match ErrorCode::non_zero(e.error_code) {
                        Some(code) => Err(code_error(code, e.error_message.as_deref())
                            .with_broker(broker.clone())),
                        None => Ok(()),
                    },
                };
                (entity.clone(), result)
            })
            .collect();
        Ok(results)
    }
}
