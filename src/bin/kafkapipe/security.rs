//! The security admin commands: `acls list|create|delete` and
//! `users scram describe|upsert|delete`.

use std::io::{BufRead, Write};

use clap::{Args, Subcommand};
use kafkapipe::admin::{
    AclBinding, AclBindingFilter, AclOperation, AclPermissionType, Admin, PatternType,
    ResourceType, ScramCredentialAlteration, ScramMechanism, DEFAULT_SCRAM_ITERATIONS,
};

use crate::{io, Fail};

/// `acls` subcommands.
#[derive(Debug, Subcommand)]
pub enum AclsCmd {
    /// List the ACLs matching the filter options (default: all). Columns: resource type,
    /// pattern type, resource name, principal, host, operation, permission.
    List(AclFilterArgs),
    /// Create ACLs: one per --operation, for the principal on the resource.
    Create(AclCreateArgs),
    /// Delete the ACLs matching the filter options (at least one option, or --all), and
    /// print each deleted one.
    Delete {
        #[command(flatten)]
        filter: AclFilterArgs,
        /// Delete every ACL in the cluster (when no filter option is given).
        #[arg(long)]
        all: bool,
    },
}

/// Options that narrow an ACL filter; each one left out matches anything.
#[derive(Debug, Args)]
pub struct AclFilterArgs {
    /// Resource type: topic, group, cluster, transactional-id, delegation-token, user, any.
    #[arg(long = "resource-type", value_name = "TYPE")]
    resource_type: Option<ResourceType>,
    /// Resource name.
    #[arg(long = "resource", value_name = "NAME")]
    resource: Option<String>,
    /// Pattern type: literal, prefixed, match (what applies to --resource), any.
    #[arg(long = "pattern-type", value_name = "PATTERN")]
    pattern_type: Option<PatternType>,
    /// Principal, e.g. User:alice.
    #[arg(long, value_name = "PRINCIPAL")]
    principal: Option<String>,
    /// Client host.
    #[arg(long, value_name = "HOST")]
    host: Option<String>,
    /// Operation: read, write, create, delete, alter, describe, cluster-action,
    /// describe-configs, alter-configs, idempotent-write, all, any, ...
    #[arg(long, value_name = "OP")]
    operation: Option<AclOperation>,
    /// Permission: allow, deny, any.
    #[arg(long, value_name = "PERMISSION")]
    permission: Option<AclPermissionType>,
}

impl AclFilterArgs {
    fn is_empty(&self) -> bool {
        self.resource_type.is_none()
            && self.resource.is_none()
            && self.pattern_type.is_none()
            && self.principal.is_none()
            && self.host.is_none()
            && self.operation.is_none()
            && self.permission.is_none()
    }

    fn filter(&self) -> AclBindingFilter {
        let mut f = AclBindingFilter::any();
        if let Some(t) = self.resource_type {
            f = f.resource_type(t);
        }
        if let Some(n) = &self.resource {
            f = f.resource_name(n);
        }
        if let Some(p) = self.pattern_type {
            f = f.pattern_type(p);
        }
        if let Some(p) = &self.principal {
            f = f.principal(p);
        }
        if let Some(h) = &self.host {
            f = f.host(h);
        }
        if let Some(o) = self.operation {
            f = f.operation(o);
        }
        if let Some(p) = self.permission {
            f = f.permission(p);
        }
        f
    }
}

/// `acls create` options.
#[derive(Debug, Args)]
pub struct AclCreateArgs {
    /// Resource type: topic, group, cluster, transactional-id, delegation-token, user.
    #[arg(long = "resource-type", value_name = "TYPE")]
    resource_type: ResourceType,
    /// Resource name (`*`: every resource of the type; `kafka-cluster` for the cluster).
    #[arg(long = "resource", value_name = "NAME")]
    resource: String,
    /// Pattern type: literal or prefixed.
    #[arg(
        long = "pattern-type",
        value_name = "PATTERN",
        default_value = "literal"
    )]
    pattern_type: PatternType,
    /// Principal, e.g. User:alice.
    #[arg(long, value_name = "PRINCIPAL")]
    principal: String,
    /// Client host (`*`: any).
    #[arg(long, value_name = "HOST", default_value = "*")]
    host: String,
    /// Operation (repeatable): read, write, create, delete, alter, describe, all, ...
    #[arg(long = "operation", value_name = "OP", required = true)]
    operations: Vec<AclOperation>,
    /// Deny instead of allow.
    #[arg(long)]
    deny: bool,
}

fn row(b: &AclBinding) -> String {
    format!(
        "{}\t{}\t{}\t{}\t{}\t{}\t{}",
        b.resource_type,
        b.pattern_type,
        b.resource_name,
        b.principal,
        b.host,
        b.operation,
        b.permission
    )
}

/// `acls list|create|delete`.
pub async fn acls(admin: &Admin, cmd: AclsCmd, out: &mut dyn Write) -> Result<(), Fail> {
    match cmd {
        AclsCmd::List(f) => {
            let mut found = admin.describe_acls(&f.filter()).await?;
            found.sort_by_key(row);
            for b in &found {
                writeln!(out, "{}", row(b)).map_err(io)?;
            }
            Ok(())
        }
        AclsCmd::Create(a) => {
            let permission = if a.deny {
                AclPermissionType::Deny
            } else {
                AclPermissionType::Allow
            };
            let bindings: Vec<AclBinding> = a
                .operations
                .iter()
                .map(|op| {
                    AclBinding::new(
                        a.resource_type,
                        &a.resource,
                        a.pattern_type,
                        &a.principal,
                        &a.host,
                        *op,
                        permission,
                    )
                })
                .collect();
            let mut failed = Vec::new();
            for (b, r) in admin.create_acls(&bindings).await? {
                match r {
                    Ok(()) => writeln!(out, "created\t{}", row(&b)).map_err(io)?,
                    Err(e) => failed.push(e.to_string()),
                }
            }
            done(failed)
        }
        AclsCmd::Delete { filter, all } => {
            if filter.is_empty() && !all {
                return Err(Fail::Usage(
                    "acls delete without a filter option deletes every ACL: pass --all to \
                     mean it"
                        .into(),
                ));
            }
            let mut failed = Vec::new();
            for (_, r) in admin.delete_acls(&[filter.filter()]).await? {
                match r {
                    Err(e) => failed.push(e.to_string()),
                    Ok(matched) => {
                        for (b, r) in matched {
                            match r {
                                Ok(()) => writeln!(out, "deleted\t{}", row(&b)).map_err(io)?,
                                Err(e) => failed.push(e.to_string()),
                            }
                        }
                    }
                }
            }
            done(failed)
        }
    }
}

/// `users` subcommands.
#[derive(Debug, Subcommand)]
pub enum UsersCmd {
    /// SCRAM credentials (KIP-554).
    Scram {
        #[command(subcommand)]
        cmd: ScramCmd,
    },
}

/// `users scram` subcommands.
#[derive(Debug, Subcommand)]
pub enum ScramCmd {
    /// Print each user's SCRAM mechanisms and iteration counts (default: every user).
    /// Columns: user, mechanism, iterations.
    Describe {
        /// The users.
        users: Vec<String>,
    },
    /// Create or replace a user's SCRAM credential (the password is salted and hashed
    /// here, as the Java admin client does; only the result is sent).
    Upsert {
        /// The user.
        user: String,
        /// SCRAM-SHA-256 or SCRAM-SHA-512 (repeatable; default both).
        #[arg(long = "mechanism", value_name = "MECHANISM")]
        mechanisms: Vec<ScramMechanism>,
        /// PBKDF2 iterations (Kafka accepts 4096..=16384).
        #[arg(long, default_value_t = DEFAULT_SCRAM_ITERATIONS)]
        iterations: i32,
        /// The password (visible in the process list: prefer --password-stdin).
        #[arg(
            long,
            conflicts_with = "password_stdin",
            required_unless_present = "password_stdin"
        )]
        password: Option<String>,
        /// Read the password from the first line of stdin.
        #[arg(long)]
        password_stdin: bool,
    },
    /// Delete a user's SCRAM credential.
    Delete {
        /// The user.
        user: String,
        /// SCRAM-SHA-256 or SCRAM-SHA-512 (repeatable; default both that exist).
        #[arg(long = "mechanism", value_name = "MECHANISM")]
        mechanisms: Vec<ScramMechanism>,
    },
}

/// `users scram describe|upsert|delete`.
pub async fn users(admin: &Admin, cmd: UsersCmd, out: &mut dyn Write) -> Result<(), Fail> {
    let UsersCmd::Scram { cmd } = cmd;
    match cmd {
        ScramCmd::Describe { users } => {
            let names: Vec<&str> = users.iter().map(String::as_str).collect();
            let mut failed = Vec::new();
            for (user, r) in admin.describe_user_scram_credentials(&names).await? {
                match r {
                    Ok(creds) => {
                        for c in creds {
                            writeln!(out, "{user}\t{}\t{}", c.mechanism, c.iterations)
                                .map_err(io)?;
                        }
                    }
                    Err(e) => failed.push(e.to_string()),
                }
            }
            done(failed)
        }
        ScramCmd::Upsert {
            user,
            mechanisms,
            iterations,
            password,
            password_stdin,
        } => {
            let password = match (password, password_stdin) {
                (Some(p), _) => p,
                (None, _) => {
                    let mut line = String::new();
                    std::io::stdin()
                        .lock()
                        .read_line(&mut line)
                        .map_err(|e| Fail::Run(format!("reading the password from stdin: {e}")))?;
                    line.trim_end_matches(['\n', '\r']).to_string()
                }
            };
            if password.is_empty() {
                return Err(Fail::Usage("the password is empty".into()));
            }
            let mechanisms = or_both(mechanisms);
            let changes: Vec<ScramCredentialAlteration> = mechanisms
                .iter()
                .map(|m| {
                    ScramCredentialAlteration::upsert(&user, *m, &password).iterations(iterations)
                })
                .collect();
            alter(admin, &changes, &mechanisms, "upserted", out).await
        }
        ScramCmd::Delete { user, mechanisms } => {
            let explicit = !mechanisms.is_empty();
            let mechanisms = if explicit {
                mechanisms
            } else {
                // Both: only those the user has (deleting a missing one is an error).
                let (_, r) = admin
                    .describe_user_scram_credentials(&[&user])
                    .await?
                    .pop()
                    .ok_or_else(|| Fail::Run(format!("no result for user {user}")))?;
                r?.into_iter().map(|c| c.mechanism).collect()
            };
            let changes: Vec<ScramCredentialAlteration> = mechanisms
                .iter()
                .map(|m| ScramCredentialAlteration::delete(&user, *m))
                .collect();
            alter(admin, &changes, &mechanisms, "deleted", out).await
        }
    }
}

fn or_both(mechanisms: Vec<ScramMechanism>) -> Vec<ScramMechanism> {
    if mechanisms.is_empty() {
        vec![ScramMechanism::Sha256, ScramMechanism::Sha512]
    } else {
        mechanisms
    }
}

async fn alter(
    admin: &Admin,
    changes: &[ScramCredentialAlteration],
    mechanisms: &[ScramMechanism],
    what: &str,
    out: &mut dyn Write,
) -> Result<(), Fail> {
    let mut failed = Vec::new();
    for (user, r) in admin.alter_user_scram_credentials(changes).await? {
        match r {
            Ok(()) => {
                for m in mechanisms {
                    writeln!(out, "{what}\t{user}\t{m}").map_err(io)?;
                }
            }
            Err(e) => failed.push(e.to_string()),
        }
    }
    done(failed)
}

fn done(failed: Vec<String>) -> Result<(), Fail> {
    if failed.is_empty() {
        Ok(())
    } else {
        Err(Fail::Run(failed.join("\n")))
    }
}
