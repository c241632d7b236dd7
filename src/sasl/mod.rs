//! SASL authentication mechanisms (KIP-43, KIP-152), in the style of kafka-go's `sasl`
//! package.
//!
//! A [`Mechanism`] is a factory: for every connection (and every KIP-368
//! re-authentication) the connection calls [`Mechanism::start`], which returns a fresh
//! [`Session`] — the state machine of one exchange — and the client's first message. The
//! connection sends each client message in a SaslAuthenticate request and feeds the
//! broker's answer to [`Session::next`] until the session says it is done.
//!
//! Built in: [`Plain`] (PLAIN), [`Scram`] (SCRAM-SHA-256 and SCRAM-SHA-512, cargo feature
//! `scram`, on by default) and [`OAuthBearer`] (OAUTHBEARER with an async
//! [`TokenProvider`]: your own, `ClientCredentials` for an OIDC token endpoint (KIP-768,
//! feature `oidc`), or `MskIamTokenProvider` for AWS MSK IAM (feature `aws-msk-iam`);
//! [`CachedTokenProvider`] reuses tokens until 80% of their lifetime). Sessions the broker
//! limits (`connections.max.reauth.ms`, token expiry) are re-authenticated (KIP-368). Set one on [`ConnectionConfig::sasl`](crate::conn::ConnectionConfig::sasl):
//!
//! ```no_run
//! use kafkapipe::conn::{Conn, ConnectionConfig};
//! use kafkapipe::sasl::Scram;
//!
//! # async fn demo() -> kafkapipe::Result<()> {
//! let config = ConnectionConfig::new().sasl(Scram::sha512("alice", "alice-secret"));
//! let conn = Conn::connect_with("broker:9092", config).await?;
//! # Ok(()) }
//! ```
//!
//! Passwords and tokens never appear in `Debug` output or logs.

use std::fmt;

use futures::future::BoxFuture;

use crate::error::{Error, ErrorKind, Result};

#[cfg(feature = "aws-msk-iam")]
mod aws_msk_iam;
#[cfg(feature = "gssapi")]
mod gssapi;
#[cfg(feature = "oidc")]
mod http;
mod oauthbearer;
#[cfg(feature = "oidc")]
mod oidc;
mod plain;
#[cfg(feature = "scram")]
mod scram;

#[cfg(feature = "aws-msk-iam")]
pub use aws_msk_iam::{AwsCredentials, MskIamTokenProvider};
#[cfg(feature = "gssapi")]
pub use gssapi::Gssapi;
pub use oauthbearer::{CachedTokenProvider, OAuthBearer, OAuthToken, TokenProvider};
#[cfg(feature = "oidc")]
pub use oidc::ClientCredentials;
pub use plain::Plain;
#[cfg(feature = "scram")]
pub use scram::{Scram, ScramAlgorithm};

/// What [`Mechanism::start`] returns: a future of the new session and the client's first
/// message.
pub type StartFuture<'a> = BoxFuture<'a, Result<(Box<dyn Session>, Vec<u8>)>>;

/// A SASL mechanism: a name and a way to start an exchange.
///
/// Implement it for mechanisms this crate does not ship.
///
/// ```
/// use kafkapipe::sasl::{Mechanism, Session, StartFuture};
///
/// /// ANONYMOUS-like mechanism: one empty message, then done.
/// #[derive(Debug)]
/// struct Anonymous;
/// struct Done;
/// impl Session for Done {
///     fn next(&mut self, _challenge: &[u8]) -> kafkapipe::Result<Option<Vec<u8>>> {
///         Ok(None)
///     }
/// }
/// impl Mechanism for Anonymous {
///     fn name(&self) -> &str {
///         "ANONYMOUS"
///     }
///     fn start(&self) -> StartFuture<'_> {
///         Box::pin(async { Ok((Box::new(Done) as Box<dyn Session>, Vec::new())) })
///     }
/// }
/// ```
pub trait Mechanism: fmt::Debug + Send + Sync {
    /// The mechanism's IANA name as sent in the SaslHandshake, e.g. `SCRAM-SHA-512`.
    fn name(&self) -> &str;

    /// Begin one exchange: a fresh session and the client's first message.
    ///
    /// Called once per connection and once per re-authentication, so a mechanism can
    /// fetch fresh credentials here (OAUTHBEARER asks its token provider).
    fn start(&self) -> StartFuture<'_>;

    /// Begin one exchange with the broker at `broker` (the `host:port` the connection
    /// dialled). The connection calls this; by default it is [`Mechanism::start`].
    /// Mechanisms that name the server in their first message override it: GSSAPI asks
    /// for a ticket to `service/host`.
    ///
    /// ```
    /// # async fn demo() -> kafkapipe::Result<()> {
    /// use kafkapipe::sasl::{Mechanism, Plain};
    /// let (_session, first) = Plain::new("a", "b").start_for("broker1:9092").await?;
    /// assert_eq!(first, b"\0a\0b");
    /// # Ok(()) }
    /// ```
    fn start_for(&self, broker: &str) -> StartFuture<'_> {
        let _ = broker;
        self.start()
    }
}

/// The state machine of one SASL exchange, created by [`Mechanism::start`].
pub trait Session: Send {
    /// Handle the broker's message (a challenge, or the final server message) and return
    /// the next client message, or `None` once the exchange is complete on the client's
    /// side.
    ///
    /// # Errors
    ///
    /// A malformed or failed server message, or a server that fails to prove itself (SCRAM
    /// server signature). The connection attempt then ends with that error.
    fn next(&mut self, challenge: &[u8]) -> Result<Option<Vec<u8>>>;

    /// What the client knows that explains a failure the broker reported with
    /// `broker_message` (OAUTHBEARER: the broker's error challenge, unless the message
    /// already is it, and the token's claims, never the token), appended to the
    /// authentication error. `None` by default.
    ///
    /// ```
    /// use kafkapipe::sasl::Session;
    /// struct S;
    /// impl Session for S {
    ///     fn next(&mut self, _: &[u8]) -> kafkapipe::Result<Option<Vec<u8>>> {
    ///         Ok(None)
    ///     }
    ///     fn describe_failure(&self, _broker_message: Option<&str>) -> Option<String> {
    ///         Some("credentials issued for realm X".into())
    ///     }
    /// }
    /// assert!(S.describe_failure(None).is_some());
    /// ```
    fn describe_failure(&self, broker_message: Option<&str>) -> Option<String> {
        let _ = broker_message;
        None
    }
}

/// A client-side authentication failure (bad server message, signature mismatch).
pub(crate) fn auth_error(message: impl Into<String>) -> Error {
    Error::new(ErrorKind::Authentication, message)
}

/// Hides a secret in `Debug` output.
pub(crate) struct Redacted;

impl fmt::Debug for Redacted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("\"<redacted>\"")
    }
}
