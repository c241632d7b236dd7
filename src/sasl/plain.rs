//! SASL/PLAIN (RFC 4616).

use std::fmt;

use super::{Mechanism, Redacted, Session, StartFuture};
use crate::error::Result;

/// SASL/PLAIN: username and password in clear text (use it over TLS only).
///
/// The message is `authzid NUL username NUL password`, with an empty authorization id
/// unless [`Plain::with_authzid`] sets one.
///
/// ```
/// use kafkapipe::sasl::{Mechanism, Plain};
/// let plain = Plain::new("alice", "s3cret");
/// assert_eq!(plain.name(), "PLAIN");
/// assert!(!format!("{plain:?}").contains("s3cret"));
/// ```
#[derive(Clone)]
pub struct Plain {
    authzid: String,
    username: String,
    password: String,
}

impl Plain {
    /// PLAIN credentials.
    pub fn new(username: impl Into<String>, password: impl Into<String>) -> Self {
        Plain {
            authzid: String::new(),
            username: username.into(),
            password: password.into(),
        }
    }

    /// Act as `authzid` (the authorization identity); empty by default.
    pub fn with_authzid(mut self, authzid: impl Into<String>) -> Self {
        self.authzid = authzid.into();
        self
    }

    /// The message PLAIN sends: `authzid NUL username NUL password`.
    pub(crate) fn message(&self) -> Vec<u8> {
        let mut m =
            Vec::with_capacity(self.authzid.len() + self.username.len() + self.password.len() + 2);
        m.extend_from_slice(self.authzid.as_bytes());
        m.push(0);
        m.extend_from_slice(self.username.as_bytes());
        m.push(0);
        m.extend_from_slice(self.password.as_bytes());
        m
    }
}

impl fmt::Debug for Plain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Plain")
            .field("authzid", &self.authzid)
            .field("username", &self.username)
            .field("password", &Redacted)
            .finish()
    }
}

struct PlainSession;

impl Session for PlainSession {
    fn next(&mut self, _challenge: &[u8]) -> Result<Option<Vec<u8>>> {
        // The broker answers the single PLAIN message with an empty token (or an error code).
        Ok(None)
    }
}

impl Mechanism for Plain {
    fn name(&self) -> &str {
        "PLAIN"
    }

    fn start(&self) -> StartFuture<'_> {
        let message = self.message();
        Box::pin(async move { Ok((Box::new(PlainSession) as Box<dyn Session>, message)) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn message_format() {
        let (mut s, first) = Plain::new("alice", "pw").start().await.unwrap();
        assert_eq!(first, b"\0alice\0pw");
        assert_eq!(s.next(b"").unwrap(), None);
        let with = Plain::new("alice", "pw").with_authzid("admin");
        assert_eq!(with.message(), b"admin\0alice\0pw");
    }

    #[test]
    fn debug_hides_password() {
        let d = format!("{:?}", Plain::new("alice", "hunter2"));
        assert!(d.contains("alice"), "{d}");
        assert!(!d.contains("hunter2"), "{d}");
    }
}
