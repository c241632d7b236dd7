//! ACL administration: typed ACL bindings and filters, and the [`Admin`] calls that
//! create, describe and delete them (CreateAcls, DescribeAcls, DeleteAcls; KIP-140, with
//! prefixed resource patterns from KIP-290).
//!
//! An [`AclBinding`] says "principal P may (or may not) do operation O on resource R
//! from host H". An [`AclBindingFilter`] matches bindings; each of its fields left unset
//! matches anything. Brokers serve these calls only when an authorizer is configured
//! (`authorizer.class.name`, e.g. KRaft's
//! `org.apache.kafka.metadata.authorizer.StandardAuthorizer`); without one they answer
//! `SECURITY_DISABLED`. The caller needs `ALTER` (create, delete) or `DESCRIBE` (describe)
//! on the cluster, or must be a super user.
//!
//! ```no_run
//! use kafkapipe::admin::{AclBinding, AclBindingFilter, AclOperation, Admin, ResourceType};
//!
//! # async fn demo() -> kafkapipe::Result<()> {
//! let admin = Admin::connect(["127.0.0.1:9092"])?;
//! let grant = AclBinding::allow(ResourceType::Topic, "events", "User:alice", AclOperation::Write);
//! for (binding, r) in admin.create_acls(&[grant]).await? {
//!     r?;
//!     println!("created {binding}");
//! }
//! for b in admin.describe_acls(&AclBindingFilter::any().principal("User:alice")).await? {
//!     println!("{b}");
//! }
//! # Ok(()) }
//! ```

use std::fmt;
use std::str::FromStr;

use super::{code_error, Admin, Results};
use crate::error::{Error, Result};
use crate::protocol::messages::{
    AclCreation, CreateAclsRequest, DeleteAclsFilter, DeleteAclsRequest, DescribeAclsRequest,
};
use crate::protocol::ErrorCode;

/// Generates an `i8`-coded enum with an `Unknown(i8)` fallback, its wire conversions,
/// `Display` (Kafka's upper-case name) and `FromStr` (case-insensitive; `-` and `_` are
/// interchangeable, and the CamelCase Java names are accepted too).
macro_rules! wire_enum {
    (
        $(#[$meta:meta])*
        pub enum $name:ident {
            $( $(#[$vmeta:meta])* $variant:ident = $code:literal, $text:literal; )*
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum $name {
            $( $(#[$vmeta])* $variant, )*
            /// A code this client does not know (from a newer broker), kept as is.
            Unknown(i8),
        }

        impl $name {
            /// The code on the wire.
            pub fn code(self) -> i8 {
                match self {
                    $( $name::$variant => $code, )*
                    $name::Unknown(c) => c,
                }
            }

            /// The value for a wire code (`Unknown` for codes this client does not know).
            pub fn from_code(code: i8) -> Self {
                match code {
                    $( $code => $name::$variant, )*
                    c => $name::Unknown(c),
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                match self {
                    $( $name::$variant => f.write_str($text), )*
                    $name::Unknown(c) => write!(f, "UNKNOWN({c})"),
                }
            }
        }

        impl FromStr for $name {
            type Err = Error;

            fn from_str(s: &str) -> Result<Self> {
                let norm: String = s
                    .chars()
                    .filter(|c| *c != '_' && *c != '-')
                    .flat_map(char::to_lowercase)
                    .collect();
                $(
                    if norm == $text.replace('_', "").to_lowercase() {
                        return Ok($name::$variant);
                    }
                )*
                Err(Error::config(format!(
                    concat!("unknown ", stringify!($name), " {:?} (one of: {})"),
                    s,
                    [$($text),*].join(", ")
                )))
            }
        }
    };
}

wire_enum! {
    /// The type of a resource an ACL protects (Java: `ResourceType`).
    ///
    /// ```
    /// use kafkapipe::admin::ResourceType;
    /// assert_eq!("topic".parse::<ResourceType>()?, ResourceType::Topic);
    /// assert_eq!(ResourceType::TransactionalId.to_string(), "TRANSACTIONAL_ID");
    /// assert_eq!(ResourceType::from_code(99), ResourceType::Unknown(99));
    /// # Ok::<(), kafkapipe::Error>(())
    /// ```
    pub enum ResourceType {
        /// Any resource type (filters only).
        Any = 1, "ANY";
        /// A topic.
        Topic = 2, "TOPIC";
        /// A consumer (or share) group.
        Group = 3, "GROUP";
        /// The cluster (resource name `kafka-cluster`).
        Cluster = 4, "CLUSTER";
        /// A transactional id.
        TransactionalId = 5, "TRANSACTIONAL_ID";
        /// A delegation token.
        DelegationToken = 6, "DELEGATION_TOKEN";
        /// A user (for delegation tokens created on behalf of others).
        User = 7, "USER";
    }
}

wire_enum! {
    /// How an ACL's resource name matches resource names (Java: `PatternType`).
    ///
    /// ```
    /// use kafkapipe::admin::PatternType;
    /// assert_eq!("prefixed".parse::<PatternType>()?, PatternType::Prefixed);
    /// assert_eq!(PatternType::Literal.code(), 3);
    /// # Ok::<(), kafkapipe::Error>(())
    /// ```
    pub enum PatternType {
        /// Any pattern type (filters only).
        Any = 1, "ANY";
        /// Filters only: bindings that would apply to the filter's resource name (literal,
        /// wildcard `*` and matching prefixed bindings).
        Match = 2, "MATCH";
        /// The name is the exact resource name, or `*` for every resource.
        Literal = 3, "LITERAL";
        /// The name is a prefix of the resource names it applies to (KIP-290).
        Prefixed = 4, "PREFIXED";
    }
}

wire_enum! {
    /// The operation an ACL allows or denies (Java: `AclOperation`).
    ///
    /// ```
    /// use kafkapipe::admin::AclOperation;
    /// assert_eq!("describe-configs".parse::<AclOperation>()?, AclOperation::DescribeConfigs);
    /// assert_eq!("IdempotentWrite".parse::<AclOperation>()?, AclOperation::IdempotentWrite);
    /// # Ok::<(), kafkapipe::Error>(())
    /// ```
    pub enum AclOperation {
        /// Any operation (filters only).
        Any = 1, "ANY";
        /// Every operation.
        All = 2, "ALL";
        /// Read (fetch, group membership, offset commits).
        Read = 3, "READ";
        /// Write (produce).
        Write = 4, "WRITE";
        /// Create topics.
        Create = 5, "CREATE";
        /// Delete topics, records, groups.
        Delete = 6, "DELETE";
        /// Alter (partitions, ACLs on the cluster).
        Alter = 7, "ALTER";
        /// Describe (metadata, offsets, groups, ACLs on the cluster).
        Describe = 8, "DESCRIBE";
        /// Inter-broker actions.
        ClusterAction = 9, "CLUSTER_ACTION";
        /// Describe configs.
        DescribeConfigs = 10, "DESCRIBE_CONFIGS";
        /// Alter configs.
        AlterConfigs = 11, "ALTER_CONFIGS";
        /// Idempotent produce (implied by WRITE on a topic since Kafka 3.0).
        IdempotentWrite = 12, "IDEMPOTENT_WRITE";
        /// Create delegation tokens.
        CreateTokens = 13, "CREATE_TOKENS";
        /// Describe delegation tokens.
        DescribeTokens = 14, "DESCRIBE_TOKENS";
        /// Two-phase commit transactions (KIP-939).
        TwoPhaseCommit = 15, "TWO_PHASE_COMMIT";
    }
}

wire_enum! {
    /// Whether an ACL allows or denies (Java: `AclPermissionType`).
    ///
    /// ```
    /// use kafkapipe::admin::AclPermissionType;
    /// assert_eq!("deny".parse::<AclPermissionType>()?, AclPermissionType::Deny);
    /// # Ok::<(), kafkapipe::Error>(())
    /// ```
    pub enum AclPermissionType {
        /// Any permission (filters only).
        Any = 1, "ANY";
        /// Deny: wins over any allow.
        Deny = 2, "DENY";
        /// Allow.
        Allow = 3, "ALLOW";
    }
}

/// One ACL: `principal` is (`permission`) allowed or denied `operation` on the resources
/// that `resource_name` matches (per `pattern_type`), when connecting from `host`.
///
/// ```
/// use kafkapipe::admin::{AclBinding, AclOperation, AclPermissionType, PatternType, ResourceType};
///
/// let b = AclBinding::allow(ResourceType::Topic, "orders-", "User:alice", AclOperation::Read)
///     .pattern_type(PatternType::Prefixed);
/// assert_eq!(b.permission, AclPermissionType::Allow);
/// assert_eq!(b.host, "*");
/// assert_eq!(
///     b.to_string(),
///     "User:alice ALLOW READ on TOPIC PREFIXED orders- from *"
/// );
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct AclBinding {
    /// The type of resource.
    pub resource_type: ResourceType,
    /// The resource name (or prefix, or `*` for all resources of the type).
    pub resource_name: String,
    /// How `resource_name` matches (default `Literal`).
    pub pattern_type: PatternType,
    /// The principal, `User:<name>` (or `User:*` for everyone).
    pub principal: String,
    /// The client host the ACL applies to (`*`: any host; the default).
    pub host: String,
    /// The operation.
    pub operation: AclOperation,
    /// Allow or deny.
    pub permission: AclPermissionType,
}

impl AclBinding {
    /// A binding with every field given.
    ///
    /// ```
    /// use kafkapipe::admin::*;
    /// let b = AclBinding::new(
    ///     ResourceType::Group, "billing", PatternType::Literal,
    ///     "User:bob", "10.0.0.7", AclOperation::Read, AclPermissionType::Deny,
    /// );
    /// assert_eq!(b.host, "10.0.0.7");
    /// ```
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        resource_type: ResourceType,
        resource_name: impl Into<String>,
        pattern_type: PatternType,
        principal: impl Into<String>,
        host: impl Into<String>,
        operation: AclOperation,
        permission: AclPermissionType,
    ) -> Self {
        AclBinding {
            resource_type,
            resource_name: resource_name.into(),
            pattern_type,
            principal: principal.into(),
            host: host.into(),
            operation,
            permission,
        }
    }

    /// Allow `principal` `operation` on the resource named exactly `name`, from any host.
    ///
    /// ```
    /// use kafkapipe::admin::{AclBinding, AclOperation, ResourceType};
    /// let b = AclBinding::allow(ResourceType::Topic, "events", "User:alice", AclOperation::Write);
    /// assert_eq!(b.resource_name, "events");
    /// ```
    pub fn allow(
        resource_type: ResourceType,
        name: impl Into<String>,
        principal: impl Into<String>,
        operation: AclOperation,
    ) -> Self {
        Self::new(
            resource_type,
            name,
            PatternType::Literal,
            principal,
            "*",
            operation,
            AclPermissionType::Allow,
        )
    }

    /// Deny `principal` `operation` on the resource named exactly `name`, from any host.
    ///
    /// ```
    /// use kafkapipe::admin::{AclBinding, AclOperation, AclPermissionType, ResourceType};
    /// let b = AclBinding::deny(ResourceType::Topic, "*", "User:mallory", AclOperation::All);
    /// assert_eq!(b.permission, AclPermissionType::Deny);
    /// ```
    pub fn deny(
        resource_type: ResourceType,
        name: impl Into<String>,
        principal: impl Into<String>,
        operation: AclOperation,
    ) -> Self {
        Self {
            permission: AclPermissionType::Deny,
            ..Self::allow(resource_type, name, principal, operation)
        }
    }

    /// The same binding with `pattern_type` (e.g. `Prefixed`).
    ///
    /// ```
    /// use kafkapipe::admin::*;
    /// let b = AclBinding::allow(ResourceType::Topic, "logs-", "User:a", AclOperation::Read)
    ///     .pattern_type(PatternType::Prefixed);
    /// assert_eq!(b.pattern_type, PatternType::Prefixed);
    /// ```
    pub fn pattern_type(mut self, pattern_type: PatternType) -> Self {
        self.pattern_type = pattern_type;
        self
    }

    /// The same binding for clients connecting from `host` only.
    ///
    /// ```
    /// use kafkapipe::admin::*;
    /// let b = AclBinding::allow(ResourceType::Topic, "t", "User:a", AclOperation::Read)
    ///     .host("192.0.2.1");
    /// assert_eq!(b.host, "192.0.2.1");
    /// ```
    pub fn host(mut self, host: impl Into<String>) -> Self {
        self.host = host.into();
        self
    }

    /// The filter that matches exactly this binding (to delete it).
    ///
    /// ```
    /// use kafkapipe::admin::*;
    /// let b = AclBinding::allow(ResourceType::Topic, "t", "User:a", AclOperation::Read);
    /// assert!(b.to_filter().matches(&b));
    /// ```
    pub fn to_filter(&self) -> AclBindingFilter {
        AclBindingFilter {
            resource_type: self.resource_type,
            resource_name: Some(self.resource_name.clone()),
            pattern_type: self.pattern_type,
            principal: Some(self.principal.clone()),
            host: Some(self.host.clone()),
            operation: self.operation,
            permission: self.permission,
        }
    }
}

impl fmt::Display for AclBinding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {} {} on {} {} {} from {}",
            self.principal,
            self.permission,
            self.operation,
            self.resource_type,
            self.pattern_type,
            self.resource_name,
            self.host
        )
    }
}

/// Matches ACL bindings, to describe or delete them. Every field starts as "any"; narrow
/// it with the builder methods.
///
/// ```
/// use kafkapipe::admin::*;
/// let f = AclBindingFilter::any()
///     .resource_type(ResourceType::Topic)
///     .resource_name("events")
///     .principal("User:alice");
/// let b = AclBinding::allow(ResourceType::Topic, "events", "User:alice", AclOperation::Write);
/// assert!(f.matches(&b));
/// assert!(!f.matches(&AclBinding::allow(ResourceType::Topic, "other", "User:alice", AclOperation::Write)));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct AclBindingFilter {
    /// The resource type to match (`Any`: all).
    pub resource_type: ResourceType,
    /// The resource name to match (`None`: all).
    pub resource_name: Option<String>,
    /// The pattern type to match (`Any`: all; `Match`: what applies to `resource_name`).
    pub pattern_type: PatternType,
    /// The principal to match (`None`: all).
    pub principal: Option<String>,
    /// The host to match (`None`: all).
    pub host: Option<String>,
    /// The operation to match (`Any`: all).
    pub operation: AclOperation,
    /// The permission to match (`Any`: all).
    pub permission: AclPermissionType,
}

impl Default for AclBindingFilter {
    fn default() -> Self {
        Self::any()
    }
}

impl AclBindingFilter {
    /// The filter that matches every binding.
    ///
    /// ```
    /// use kafkapipe::admin::{AclBindingFilter, AclOperation};
    /// assert_eq!(AclBindingFilter::any().operation, AclOperation::Any);
    /// ```
    pub fn any() -> Self {
        AclBindingFilter {
            resource_type: ResourceType::Any,
            resource_name: None,
            pattern_type: PatternType::Any,
            principal: None,
            host: None,
            operation: AclOperation::Any,
            permission: AclPermissionType::Any,
        }
    }

    /// Only bindings on resources of `t`.
    ///
    /// ```
    /// # use kafkapipe::admin::*;
    /// let f = AclBindingFilter::any().resource_type(ResourceType::Group);
    /// # assert_eq!(f.resource_type, ResourceType::Group);
    /// ```
    pub fn resource_type(mut self, t: ResourceType) -> Self {
        self.resource_type = t;
        self
    }

    /// Only bindings whose resource name is `name`.
    ///
    /// ```
    /// # use kafkapipe::admin::*;
    /// let f = AclBindingFilter::any().resource_name("events");
    /// # assert_eq!(f.resource_name.as_deref(), Some("events"));
    /// ```
    pub fn resource_name(mut self, name: impl Into<String>) -> Self {
        self.resource_name = Some(name.into());
        self
    }

    /// Only bindings of pattern type `p` (`Match`: those that apply to the resource
    /// name, whatever their pattern).
    ///
    /// ```
    /// # use kafkapipe::admin::*;
    /// let f = AclBindingFilter::any().pattern_type(PatternType::Prefixed);
    /// # assert_eq!(f.pattern_type, PatternType::Prefixed);
    /// ```
    pub fn pattern_type(mut self, p: PatternType) -> Self {
        self.pattern_type = p;
        self
    }

    /// Only bindings for `principal` (`User:<name>`).
    ///
    /// ```
    /// # use kafkapipe::admin::*;
    /// let f = AclBindingFilter::any().principal("User:alice");
    /// # assert_eq!(f.principal.as_deref(), Some("User:alice"));
    /// ```
    pub fn principal(mut self, principal: impl Into<String>) -> Self {
        self.principal = Some(principal.into());
        self
    }

    /// Only bindings for `host`.
    ///
    /// ```
    /// # use kafkapipe::admin::*;
    /// let f = AclBindingFilter::any().host("*");
    /// # assert_eq!(f.host.as_deref(), Some("*"));
    /// ```
    pub fn host(mut self, host: impl Into<String>) -> Self {
        self.host = Some(host.into());
        self
    }

    /// Only bindings for operation `op`.
    ///
    /// ```
    /// # use kafkapipe::admin::*;
    /// let f = AclBindingFilter::any().operation(AclOperation::Write);
    /// # assert_eq!(f.operation, AclOperation::Write);
    /// ```
    pub fn operation(mut self, op: AclOperation) -> Self {
        self.operation = op;
        self
    }

    /// Only bindings with permission `p`.
    ///
    /// ```
    /// # use kafkapipe::admin::*;
    /// let f = AclBindingFilter::any().permission(AclPermissionType::Deny);
    /// # assert_eq!(f.permission, AclPermissionType::Deny);
    /// ```
    pub fn permission(mut self, p: AclPermissionType) -> Self {
        self.permission = p;
        self
    }

    /// Whether `b` matches this filter, field by field as the broker matches (a
    /// `Match` pattern type is treated as `Any` here: resolving it needs the broker).
    ///
    /// ```
    /// # use kafkapipe::admin::*;
    /// let b = AclBinding::allow(ResourceType::Topic, "t", "User:a", AclOperation::Read);
    /// assert!(AclBindingFilter::any().matches(&b));
    /// assert!(!AclBindingFilter::any().operation(AclOperation::Write).matches(&b));
    /// ```
    pub fn matches(&self, b: &AclBinding) -> bool {
        let pattern_ok = matches!(self.pattern_type, PatternType::Any | PatternType::Match)
            || self.pattern_type == b.pattern_type;
        pattern_ok
            && (self.resource_type == ResourceType::Any || self.resource_type == b.resource_type)
            && self
                .resource_name
                .as_ref()
                .is_none_or(|n| *n == b.resource_name)
            && self.principal.as_ref().is_none_or(|p| *p == b.principal)
            && self.host.as_ref().is_none_or(|h| *h == b.host)
            && (self.operation == AclOperation::Any || self.operation == b.operation)
            && (self.permission == AclPermissionType::Any || self.permission == b.permission)
    }
}

impl fmt::Display for AclBindingFilter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let any = |o: &Option<String>| o.clone().unwrap_or_else(|| "(any)".to_string());
        write!(
            f,
            "{} {} {} on {} {} {} from {}",
            any(&self.principal),
            self.permission,
            self.operation,
            self.resource_type,
            self.pattern_type,
            any(&self.resource_name),
            any(&self.host)
        )
    }
}

/// The error for a non-zero wire `code` (none for 0).
fn result_of(code: i16, message: Option<&str>) -> Result<()> {
    match ErrorCode::non_zero(code) {
        None => Ok(()),
        Some(code) => Err(code_error(code, message)),
    }
}

impl Admin {
    /// The ACL bindings that match `filter`. Sent to any broker.
    ///
    /// ```no_run
    /// # use kafkapipe::admin::*;
    /// # async fn demo(admin: Admin) -> kafkapipe::Result<()> {
    /// let topic_acls = AclBindingFilter::any().resource_type(ResourceType::Topic);
    /// for b in admin.describe_acls(&topic_acls).await? {
    ///     println!("{b}");
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// `SecurityDisabled` when the broker has no authorizer; `ClusterAuthorizationFailed`
    /// without DESCRIBE on the cluster; `UnsupportedVersion` naming DescribeAcls if the
    /// broker lacks the API.
    pub async fn describe_acls(&self, filter: &AclBindingFilter) -> Result<Vec<AclBinding>> {
        let req = DescribeAclsRequest {
            resource_type_filter: filter.resource_type.code(),
            resource_name_filter: filter.resource_name.clone(),
            pattern_type_filter: filter.pattern_type.code(),
            principal_filter: filter.principal.clone(),
            host_filter: filter.host.clone(),
            operation: filter.operation.code(),
            permission_type: filter.permission.code(),
            ..Default::default()
        };
        let req = &req;
        let resp = self
            .retry("DescribeAcls", || async move {
                let (_, c) = self.any_connection().await?;
                let resp = c.send(req).await?;
                result_of(resp.error_code, resp.error_message.as_deref())
                    .map_err(|e| e.with_broker(c.broker()))?;
                Ok(resp)
            })
            .await?;
        let mut out = Vec::new();
        for r in resp.resources {
            for a in r.acls {
                out.push(AclBinding {
                    resource_type: ResourceType::from_code(r.resource_type),
                    resource_name: r.resource_name.clone(),
                    pattern_type: PatternType::from_code(r.pattern_type),
                    principal: a.principal,
                    host: a.host,
                    operation: AclOperation::from_code(a.operation),
                    permission: AclPermissionType::from_code(a.permission_type),
                });
            }
        }
        Ok(out)
    }

    /// Create ACL bindings. One result per binding, in request order (creating a binding
    /// that exists already succeeds). Sent to any broker (KRaft brokers forward it to the
    /// controller).
    ///
    /// ```no_run
    /// # use kafkapipe::admin::*;
    /// # async fn demo(admin: Admin) -> kafkapipe::Result<()> {
    /// let acls = [
    ///     AclBinding::allow(ResourceType::Topic, "events", "User:alice", AclOperation::Write),
    ///     AclBinding::allow(ResourceType::Group, "billing", "User:bob", AclOperation::Read),
    /// ];
    /// for (binding, r) in admin.create_acls(&acls).await? {
    ///     if let Err(e) = r {
    ///         eprintln!("{binding}: {e}");
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// The outer error: the call could not be made (`UnsupportedVersion` naming
    /// CreateAcls, no broker reachable). Per binding: `Config` for a binding with a
    /// filter-only value (`Any`, `Match`) or an `Unknown` one (not sent); from the broker,
    /// `SecurityDisabled` without an authorizer, `ClusterAuthorizationFailed` without
    /// ALTER on the cluster, `InvalidRequest` for a binding it refuses.
    ///
    /// # Cancellation safety
    ///
    /// Not cancel safe: a dropped call may still create some of the bindings.
    pub async fn create_acls(&self, bindings: &[AclBinding]) -> Result<Results<AclBinding>> {
        // Bindings that are filters (ANY, MATCH) or hold unknown values fail here, as in
        // the Java client (the broker would answer UNKNOWN_SERVER_ERROR).
        let checked: Vec<Result<()>> = bindings.iter().map(creatable).collect();
        let to_send: Vec<&AclBinding> = bindings
            .iter()
            .zip(&checked)
            .filter(|(_, c)| c.is_ok())
            .map(|(b, _)| b)
            .collect();
        if to_send.is_empty() {
            return Ok(bindings.iter().cloned().zip(checked).collect());
        }
        let req = CreateAclsRequest {
            creations: to_send
                .iter()
                .map(|b| AclCreation {
                    resource_type: b.resource_type.code(),
                    resource_name: b.resource_name.clone(),
                    resource_pattern_type: b.pattern_type.code(),
                    principal: b.principal.clone(),
                    host: b.host.clone(),
                    operation: b.operation.code(),
                    permission_type: b.permission.code(),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        };
        let req = &req;
        let (resp, broker) = self
            .retry("CreateAcls", || async move {
                let (_, c) = self.any_connection().await?;
                Ok((c.send(req).await?, c.broker().to_string()))
            })
            .await?;
        if resp.results.len() != to_send.len() {
            return Err(Error::protocol(format!(
                "CreateAcls: {} results for {} creations",
                resp.results.len(),
                to_send.len()
            ))
            .with_broker(broker));
        }
        let mut sent = resp.results.into_iter();
        Ok(bindings
            .iter()
            .zip(checked)
            .map(|(b, c)| {
                let r = c.and_then(|()| match sent.next() {
                    None => Err(Error::protocol("CreateAcls: missing result")),
                    Some(r) => result_of(r.error_code, r.error_message.as_deref()).map_err(|e| {
                        e.with_broker(&broker)
                            .with_message(format!("creating ACL {b}: {}", msg(&r.error_message)))
                    }),
                });
                (b.clone(), r)
            })
            .collect())
    }

    /// Delete the ACL bindings that match each filter. One result per filter, in request
    /// order: the bindings it matched, each with its own deletion result. Sent to any
    /// broker.
    ///
    /// ```no_run
    /// # use kafkapipe::admin::*;
    /// # async fn demo(admin: Admin) -> kafkapipe::Result<()> {
    /// let alice = AclBindingFilter::any().principal("User:alice");
    /// for (filter, r) in admin.delete_acls(&[alice]).await? {
    ///     for (binding, deleted) in r? {
    ///         println!("{binding}: {deleted:?}");
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`Admin::create_acls`], per filter and per matched binding.
    ///
    /// # Cancellation safety
    ///
    /// Not cancel safe: a dropped call may still delete bindings.
    pub async fn delete_acls(
        &self,
        filters: &[AclBindingFilter],
    ) -> Result<Results<AclBindingFilter, Results<AclBinding>>> {
        if filters.is_empty() {
            return Ok(Vec::new());
        }
        let req = DeleteAclsRequest {
            filters: filters
                .iter()
                .map(|f| DeleteAclsFilter {
                    resource_type_filter: f.resource_type.code(),
                    resource_name_filter: f.resource_name.clone(),
                    pattern_type_filter: f.pattern_type.code(),
                    principal_filter: f.principal.clone(),
                    host_filter: f.host.clone(),
                    operation: f.operation.code(),
                    permission_type: f.permission.code(),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        };
        let req = &req;
        let (resp, broker) = self
            .retry("DeleteAcls", || async move {
                let (_, c) = self.any_connection().await?;
                Ok((c.send(req).await?, c.broker().to_string()))
            })
            .await?;
        if resp.filter_results.len() != filters.len() {
            return Err(Error::protocol(format!(
                "DeleteAcls: {} results for {} filters",
                resp.filter_results.len(),
                filters.len()
            ))
            .with_broker(broker));
        }
        Ok(filters
            .iter()
            .zip(resp.filter_results)
            .map(|(f, r)| {
                let matched = result_of(r.error_code, r.error_message.as_deref())
                    .map_err(|e| {
                        e.with_broker(&broker).with_message(format!(
                            "deleting ACLs matching {f}: {}",
                            msg(&r.error_message)
                        ))
                    })
                    .map(|()| {
                        r.matching_acls
                            .into_iter()
                            .map(|m| {
                                let res = result_of(m.error_code, m.error_message.as_deref());
                                let b = AclBinding {
                                    resource_type: ResourceType::from_code(m.resource_type),
                                    resource_name: m.resource_name,
                                    pattern_type: PatternType::from_code(m.pattern_type),
                                    principal: m.principal,
                                    host: m.host,
                                    operation: AclOperation::from_code(m.operation),
                                    permission: AclPermissionType::from_code(m.permission_type),
                                };
                                let res = res.map_err(|e| {
                                    e.with_broker(&broker).with_message(format!(
                                        "deleting ACL {b}: {}",
                                        msg(&m.error_message)
                                    ))
                                });
                                (b, res)
                            })
                            .collect()
                    });
                (f.clone(), matched)
            })
            .collect())
    }
}

/// Whether `b` can be created: no filter-only values (ANY, MATCH) and no unknown ones.
fn creatable(b: &AclBinding) -> Result<()> {
    let bad = matches!(
        b.resource_type,
        ResourceType::Any | ResourceType::Unknown(_)
    ) || matches!(
        b.pattern_type,
        PatternType::Any | PatternType::Match | PatternType::Unknown(_)
    ) || matches!(b.operation, AclOperation::Any | AclOperation::Unknown(_))
        || matches!(
            b.permission,
            AclPermissionType::Any | AclPermissionType::Unknown(_)
        );
    if bad {
        Err(Error::config(format!(
            "ACL binding {b} cannot be created: ANY and MATCH are only for filters, and \
             UNKNOWN values are not allowed"
        )))
    } else {
        Ok(())
    }
}

/// The broker's message, or a placeholder when it sent none.
fn msg(m: &Option<String>) -> &str {
    match m.as_deref() {
        Some(m) if !m.is_empty() => m,
        _ => "refused by the broker",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn enums_round_trip_codes_and_names() {
        for c in -2..20i8 {
            let r = ResourceType::from_code(c);
            assert_eq!(r.code(), c);
            if !matches!(r, ResourceType::Unknown(_)) {
                assert_eq!(r.to_string().parse::<ResourceType>().unwrap(), r);
            }
            let o = AclOperation::from_code(c);
            assert_eq!(o.code(), c);
            if !matches!(o, AclOperation::Unknown(_)) {
                assert_eq!(o.to_string().parse::<AclOperation>().unwrap(), o);
            }
            assert_eq!(PatternType::from_code(c).code(), c);
            assert_eq!(AclPermissionType::from_code(c).code(), c);
        }
        assert_eq!(
            "ClusterAction".parse::<AclOperation>().unwrap(),
            AclOperation::ClusterAction
        );
        assert_eq!(
            "cluster-action".parse::<AclOperation>().unwrap(),
            AclOperation::ClusterAction
        );
        let e = "writ".parse::<AclOperation>().unwrap_err().to_string();
        assert!(e.contains("writ") && e.contains("WRITE"), "{e}");
    }

    #[test]
    fn filter_matching() {
        let b = AclBinding::allow(ResourceType::Topic, "t", "User:a", AclOperation::Read)
            .pattern_type(PatternType::Prefixed);
        assert!(b.to_filter().matches(&b));
        assert!(AclBindingFilter::any().matches(&b));
        assert!(AclBindingFilter::any()
            .pattern_type(PatternType::Prefixed)
            .matches(&b));
        assert!(!AclBindingFilter::any()
            .pattern_type(PatternType::Literal)
            .matches(&b));
        assert!(!AclBindingFilter::any()
            .resource_type(ResourceType::Group)
            .matches(&b));
        assert!(!AclBindingFilter::any().principal("User:b").matches(&b));
        assert!(!AclBindingFilter::any().host("h").matches(&b));
        assert!(!AclBindingFilter::any()
            .permission(AclPermissionType::Deny)
            .matches(&b));
    }
}
