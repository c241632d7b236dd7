//! SCRAM credential administration (KIP-554): describe users' SCRAM credentials, upsert
//! them (the client salts and hashes the password, so it never crosses the wire) and
//! delete them — DescribeUserScramCredentials and AlterUserScramCredentials.
//!
//! Upserting needs the `scram` feature (on by default: PBKDF2 from the RustCrypto
//! crates). The caller needs `ALTER` (upsert, delete) or `DESCRIBE` (describe) on the
//! cluster, or must be a super user. A credential is usable on a SASL/SCRAM listener as
//! soon as the call returns.
//!
//! ```no_run
//! use kafkapipe::admin::{Admin, ScramCredentialAlteration, ScramMechanism};
//!
//! # async fn demo() -> kafkapipe::Result<()> {
//! let admin = Admin::connect(["127.0.0.1:9092"])?;
//! let upsert = ScramCredentialAlteration::upsert("alice", ScramMechanism::Sha512, "s3cret");
//! admin.alter_user_scram_credentials(&[upsert]).await?.remove(0).1?;
//! for (user, creds) in admin.describe_user_scram_credentials(&["alice"]).await? {
//!     for c in creds? {
//!         println!("{user}: {} ({} iterations)", c.mechanism, c.iterations);
//!     }
//! }
//! # Ok(()) }
//! ```

use std::fmt;
use std::str::FromStr;

use bytes::Bytes;

use super::{code_error, Admin, Results};
use crate::error::{Error, Result};
use crate::protocol::messages::{
    AlterUserScramCredentialsRequest, DescribeUserScramCredentialsRequest, ScramCredentialDeletion,
    ScramCredentialUpsertion, ScramCredentialsUser,
};
use crate::protocol::ErrorCode;

/// Iterations when none are given: Kafka's minimum, and `kafka-configs.sh`'s default.
pub const DEFAULT_SCRAM_ITERATIONS: i32 = 4096;

/// A SCRAM mechanism as the admin APIs name it (Java: `ScramMechanism`).
///
/// ```
/// use kafkapipe::admin::ScramMechanism;
/// assert_eq!("SCRAM-SHA-512".parse::<ScramMechanism>()?, ScramMechanism::Sha512);
/// assert_eq!("sha256".parse::<ScramMechanism>()?, ScramMechanism::Sha256);
/// assert_eq!(ScramMechanism::Sha256.to_string(), "SCRAM-SHA-256");
/// assert_eq!(ScramMechanism::from_code(9), ScramMechanism::Unknown(9));
/// # Ok::<(), kafkapipe::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ScramMechanism {
    /// SCRAM-SHA-256 (wire code 1).
    Sha256,
    /// SCRAM-SHA-512 (wire code 2).
    Sha512,
    /// A code this client does not know, kept as is.
    Unknown(i8),
}

impl ScramMechanism {
    /// The code on the wire.
    pub fn code(self) -> i8 {
        match self {
            ScramMechanism::Sha256 => 1,
            ScramMechanism::Sha512 => 2,
            ScramMechanism::Unknown(c) => c,
        }
    }

    /// The mechanism for a wire code.
    pub fn from_code(code: i8) -> Self {
        match code {
            1 => ScramMechanism::Sha256,
            2 => ScramMechanism::Sha512,
            c => ScramMechanism::Unknown(c),
        }
    }
}

impl fmt::Display for ScramMechanism {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ScramMechanism::Sha256 => f.write_str("SCRAM-SHA-256"),
            ScramMechanism::Sha512 => f.write_str("SCRAM-SHA-512"),
            ScramMechanism::Unknown(c) => write!(f, "UNKNOWN({c})"),
        }
    }
}

impl FromStr for ScramMechanism {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        let norm: String = s
            .chars()
            .filter(|c| *c != '-' && *c != '_')
            .flat_map(char::to_lowercase)
            .collect();
        match norm.trim_start_matches("scram") {
            "sha256" => Ok(ScramMechanism::Sha256),
            "sha512" => Ok(ScramMechanism::Sha512),
            _ => Err(Error::config(format!(
                "unknown SCRAM mechanism {s:?} (one of: SCRAM-SHA-256, SCRAM-SHA-512)"
            ))),
        }
    }
}

/// One SCRAM credential of a user, as described by the broker (never the secret).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct ScramCredential {
    /// The mechanism.
    pub mechanism: ScramMechanism,
    /// The PBKDF2 iteration count.
    pub iterations: i32,
}

/// A change to one user's SCRAM credential: upsert (set the password) or delete.
///
/// ```
/// use kafkapipe::admin::{ScramCredentialAlteration, ScramMechanism};
/// let up = ScramCredentialAlteration::upsert("alice", ScramMechanism::Sha256, "pw")
///     .iterations(8192);
/// let del = ScramCredentialAlteration::delete("bob", ScramMechanism::Sha512);
/// assert_eq!(up.user(), "alice");
/// assert_eq!(del.mechanism(), ScramMechanism::Sha512);
/// assert!(!format!("{up:?}").contains("pw"));
/// ```
#[derive(Clone, PartialEq, Eq)]
pub enum ScramCredentialAlteration {
    /// Create or replace `user`'s credential for `mechanism` with `password`.
    Upsert {
        /// The user name.
        user: String,
        /// The mechanism.
        mechanism: ScramMechanism,
        /// PBKDF2 iterations (Kafka accepts 4096..=16384).
        iterations: i32,
        /// The password (salted and hashed by the client before sending).
        password: String,
    },
    /// Delete `user`'s credential for `mechanism`.
    Delete {
        /// The user name.
        user: String,
        /// The mechanism.
        mechanism: ScramMechanism,
    },
}

impl fmt::Debug for ScramCredentialAlteration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ScramCredentialAlteration::Upsert {
                user,
                mechanism,
                iterations,
                ..
            } => f
                .debug_struct("Upsert")
                .field("user", user)
                .field("mechanism", mechanism)
                .field("iterations", iterations)
                .field("password", &"<redacted>")
                .finish(),
            ScramCredentialAlteration::Delete { user, mechanism } => f
                .debug_struct("Delete")
                .field("user", user)
                .field("mechanism", mechanism)
                .finish(),
        }
    }
}

impl ScramCredentialAlteration {
    /// Set `user`'s `mechanism` password, with [`DEFAULT_SCRAM_ITERATIONS`].
    ///
    /// ```
    /// # use kafkapipe::admin::*;
    /// let up = ScramCredentialAlteration::upsert("alice", ScramMechanism::Sha512, "pw");
    /// # assert_eq!(up.user(), "alice");
    /// ```
    pub fn upsert(
        user: impl Into<String>,
        mechanism: ScramMechanism,
        password: impl Into<String>,
    ) -> Self {
        ScramCredentialAlteration::Upsert {
            user: user.into(),
            mechanism,
            iterations: DEFAULT_SCRAM_ITERATIONS,
            password: password.into(),
        }
    }

    /// Delete `user`'s `mechanism` credential.
    ///
    /// ```
    /// # use kafkapipe::admin::*;
    /// let del = ScramCredentialAlteration::delete("alice", ScramMechanism::Sha512);
    /// # assert_eq!(del.user(), "alice");
    /// ```
    pub fn delete(user: impl Into<String>, mechanism: ScramMechanism) -> Self {
        ScramCredentialAlteration::Delete {
            user: user.into(),
            mechanism,
        }
    }

    /// An upsert with `n` iterations (no effect on a deletion).
    ///
    /// ```
    /// # use kafkapipe::admin::*;
    /// let up = ScramCredentialAlteration::upsert("a", ScramMechanism::Sha256, "pw").iterations(8192);
    /// # assert!(matches!(up, ScramCredentialAlteration::Upsert { iterations: 8192, .. }));
    /// ```
    pub fn iterations(mut self, n: i32) -> Self {
        if let ScramCredentialAlteration::Upsert { iterations, .. } = &mut self {
            *iterations = n;
        }
        self
    }

    /// The user this alteration is for.
    ///
    /// ```
    /// # use kafkapipe::admin::*;
    /// assert_eq!(ScramCredentialAlteration::delete("a", ScramMechanism::Sha256).user(), "a");
    /// ```
    pub fn user(&self) -> &str {
        match self {
            ScramCredentialAlteration::Upsert { user, .. }
            | ScramCredentialAlteration::Delete { user, .. } => user,
        }
    }

    /// The mechanism this alteration is for.
    ///
    /// ```
    /// # use kafkapipe::admin::*;
    /// let d = ScramCredentialAlteration::delete("a", ScramMechanism::Sha256);
    /// assert_eq!(d.mechanism(), ScramMechanism::Sha256);
    /// ```
    pub fn mechanism(&self) -> ScramMechanism {
        match self {
            ScramCredentialAlteration::Upsert { mechanism, .. }
            | ScramCredentialAlteration::Delete { mechanism, .. } => *mechanism,
        }
    }
}

/// The salt and salted password of an upsert, as the Java AdminClient computes them:
/// a fresh random salt and PBKDF2-HMAC over the UTF-8 password.
#[cfg(feature = "scram")]
fn salted(mechanism: ScramMechanism, password: &str, iterations: i32) -> Result<(Bytes, Bytes)> {
    use crate::sasl::ScramAlgorithm;
    let alg = match mechanism {
        ScramMechanism::Sha256 => ScramAlgorithm::Sha256,
        ScramMechanism::Sha512 => ScramAlgorithm::Sha512,
        ScramMechanism::Unknown(c) => {
            return Err(Error::config(format!(
                "cannot compute a credential for unknown SCRAM mechanism {c}"
            )))
        }
    };
    let rounds = u32::try_from(iterations)
        .ok()
        .filter(|n| *n > 0)
        .ok_or_else(|| Error::config(format!("SCRAM iterations must be positive: {iterations}")))?;
    let mut salt = [0u8; 32];
    getrandom::getrandom(&mut salt)
        .map_err(|e| Error::config(format!("no randomness for the SCRAM salt: {e}")))?;
    let hashed = alg.salted_password(password.as_bytes(), &salt, rounds);
    Ok((Bytes::copy_from_slice(&salt), Bytes::from(hashed)))
}

#[cfg(not(feature = "scram"))]
fn salted(_: ScramMechanism, _: &str, _: i32) -> Result<(Bytes, Bytes)> {
    Err(Error::config(
        "upserting SCRAM credentials needs the `scram` feature of kafkapipe",
    ))
}

fn result_of(code: i16, message: Option<&str>) -> Result<()> {
    match ErrorCode::non_zero(code) {
        None => Ok(()),
        Some(code) => Err(code_error(code, message)),
    }
}

impl Admin {
    /// The SCRAM credentials (mechanism and iterations) of `users`, or of every user
    /// with a credential when `users` is empty. One result per user; a user without
    /// credentials gives `ResourceNotFound`. Sent to any broker.
    ///
    /// ```no_run
    /// # async fn demo(admin: kafkapipe::admin::Admin) -> kafkapipe::Result<()> {
    /// for (user, creds) in admin.describe_user_scram_credentials(&[]).await? {
    ///     println!("{user}: {:?}", creds?);
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// The outer error: the call could not be made, or the broker refused it as a whole
    /// (`ClusterAuthorizationFailed` without DESCRIBE on the cluster).
    pub async fn describe_user_scram_credentials(
        &self,
        users: &[&str],
    ) -> Result<Results<String, Vec<ScramCredential>>> {
        let req = DescribeUserScramCredentialsRequest {
            users: if users.is_empty() {
                None
            } else {
                Some(
                    users
                        .iter()
                        .map(|u| ScramCredentialsUser {
                            name: (*u).to_string(),
                            ..Default::default()
                        })
                        .collect(),
                )
            },
            ..Default::default()
        };
        let req = &req;
        let resp = self
            .retry("DescribeUserScramCredentials", || async move {
                let (_, c) = self.any_connection().await?;
                let resp = c.send(req).await?;
                result_of(resp.error_code, resp.error_message.as_deref())
                    .map_err(|e| e.with_broker(c.broker()))?;
                Ok(resp)
            })
            .await?;
        Ok(resp
            .results
            .into_iter()
            .map(|r| {
                let creds = result_of(r.error_code, r.error_message.as_deref())
                    .map_err(|e| {
                        e.with_message(format!("user {}: {}", r.user, msg(&r.error_message)))
                    })
                    .map(|()| {
                        r.credential_infos
                            .iter()
                            .map(|c| ScramCredential {
                                mechanism: ScramMechanism::from_code(c.mechanism),
                                iterations: c.iterations,
                            })
                            .collect()
                    });
                (r.user, creds)
            })
            .collect())
    }

    /// Upsert and delete SCRAM credentials. One result per distinct user, in first-seen
    /// order: the first failure among the user's alterations, if any. Kafka takes a user
    /// once per request, so a user's second alteration goes in a second request (sent
    /// after the first). Sent to any broker (KRaft brokers forward it to the controller).
    ///
    /// ```no_run
    /// # use kafkapipe::admin::*;
    /// # async fn demo(admin: Admin) -> kafkapipe::Result<()> {
    /// let changes = [
    ///     ScramCredentialAlteration::upsert("alice", ScramMechanism::Sha256, "pw256"),
    ///     ScramCredentialAlteration::delete("bob", ScramMechanism::Sha512),
    /// ];
    /// for (user, r) in admin.alter_user_scram_credentials(&changes).await? {
    ///     println!("{user}: {r:?}");
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// The outer error: the call could not be made, or an upsert could not be computed
    /// (an unknown mechanism, iterations ≤ 0, no `scram` feature). Per user:
    /// `ResourceNotFound` (deleting a credential that does not exist),
    /// `UnacceptableCredential` (iterations outside 4096..=16384, empty user name),
    /// `DuplicateResource` (the same user and mechanism twice), `UnsupportedSaslMechanism`,
    /// `ClusterAuthorizationFailed`.
    ///
    /// # Cancellation safety
    ///
    /// Not cancel safe: a dropped call may still apply the alterations.
    pub async fn alter_user_scram_credentials(
        &self,
        alterations: &[ScramCredentialAlteration],
    ) -> Result<Results<String>> {
        if alterations.is_empty() {
            return Ok(Vec::new());
        }
        // Kafka refuses a user twice in one request (DUPLICATE_RESOURCE): a user's n-th
        // alteration goes into the n-th request.
        let mut rounds: Vec<AlterUserScramCredentialsRequest> = Vec::new();
        let mut users: Vec<(String, usize)> = Vec::new();
        for a in alterations {
            let round = match users.iter_mut().find(|(u, _)| u == a.user()) {
                Some((_, n)) => {
                    *n += 1;
                    *n - 1
                }
                None => {
                    users.push((a.user().to_string(), 1));
                    0
                }
            };
            if rounds.len() <= round {
                rounds.push(AlterUserScramCredentialsRequest::default());
            }
            let req = &mut rounds[round];
            match a {
                ScramCredentialAlteration::Upsert {
                    user,
                    mechanism,
                    iterations,
                    password,
                } => {
                    let (salt, salted_password) = salted(*mechanism, password, *iterations)?;
                    req.upsertions.push(ScramCredentialUpsertion {
                        name: user.clone(),
                        mechanism: mechanism.code(),
                        iterations: *iterations,
                        salt,
                        salted_password,
                        ..Default::default()
                    });
                }
                ScramCredentialAlteration::Delete { user, mechanism } => {
                    req.deletions.push(ScramCredentialDeletion {
                        name: user.clone(),
                        mechanism: mechanism.code(),
                        ..Default::default()
                    });
                }
            }
        }
        let mut results: Vec<(String, Result<()>)> =
            users.into_iter().map(|(u, _)| (u, Ok(()))).collect();
        for req in &rounds {
            let (resp, broker) = self
                .retry("AlterUserScramCredentials", || async move {
                    let (_, c) = self.any_connection().await?;
                    Ok((c.send(req).await?, c.broker().to_string()))
                })
                .await?;
            let in_round = req
                .upsertions
                .iter()
                .map(|u| &u.name)
                .chain(req.deletions.iter().map(|d| &d.name));
            for u in in_round {
                let Some((_, slot)) = results.iter_mut().find(|(name, _)| name == u) else {
                    continue;
                };
                if slot.is_err() {
                    continue;
                }
                let r = match resp.results.iter().find(|r| r.user == *u) {
                    None => Err(Error::protocol(format!(
                        "AlterUserScramCredentials response does not mention user {u}"
                    ))),
                    Some(r) => result_of(r.error_code, r.error_message.as_deref()).map_err(|e| {
                        e.with_message(format!("user {u}: {}", msg(&r.error_message)))
                    }),
                };
                *slot = r.map_err(|e| e.with_broker(&broker));
            }
        }
        Ok(results)
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
    fn mechanism_names_and_codes() {
        for (s, m) in [
            ("SCRAM-SHA-256", ScramMechanism::Sha256),
            ("scram_sha_512", ScramMechanism::Sha512),
            ("SHA-512", ScramMechanism::Sha512),
        ] {
            assert_eq!(s.parse::<ScramMechanism>().unwrap(), m);
            assert_eq!(ScramMechanism::from_code(m.code()), m);
        }
        assert!("md5".parse::<ScramMechanism>().is_err());
    }

    /// The salted password is PBKDF2-HMAC over the salt sent with it (what the broker
    /// reproduces at login), with a fresh salt per upsert.
    #[cfg(feature = "scram")]
    #[test]
    fn upsert_salts_freshly_and_derives_with_pbkdf2() {
        let (salt1, hashed1) = salted(ScramMechanism::Sha256, "pencil", 4096).unwrap();
        let (salt2, hashed2) = salted(ScramMechanism::Sha256, "pencil", 4096).unwrap();
        assert_eq!(salt1.len(), 32);
        assert_ne!(salt1, salt2, "a fresh salt per upsert");
        assert_ne!(hashed1, hashed2);
        assert_eq!(hashed1.len(), 32);
        let (_, h512) = salted(ScramMechanism::Sha512, "pencil", 4096).unwrap();
        assert_eq!(h512.len(), 64);
        let mut expect = [0u8; 32];
        pbkdf2::pbkdf2_hmac::<sha2::Sha256>(b"pencil", &salt1, 4096, &mut expect);
        assert_eq!(&hashed1[..], &expect[..]);
        assert!(salted(ScramMechanism::Unknown(7), "p", 4096).is_err());
        assert!(salted(ScramMechanism::Sha256, "p", 0).is_err());
    }
}
