//! SASL/OAUTHBEARER (RFC 7628, KIP-255) with a user-supplied async token provider.

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::sync::Arc;

use futures::future::BoxFuture;

use super::{auth_error, Mechanism, Redacted, Session, StartFuture};
use crate::error::Result;

/// An OAuth 2 bearer token and optional SASL extensions (KIP-342).
///
/// `Debug` output hides the token.
///
/// ```
/// use kafkapipe::sasl::OAuthToken;
/// let t = OAuthToken::new("eyJhbGciOi...").with_extension("traceId", "123");
/// assert!(!format!("{t:?}").contains("eyJ"));
/// ```
#[derive(Clone, Default)]
pub struct OAuthToken {
    token: String,
    extensions: BTreeMap<String, String>,
}

impl OAuthToken {
    /// A bearer token (typically a JWT).
    pub fn new(token: impl Into<String>) -> Self {
        OAuthToken {
            token: token.into(),
            extensions: BTreeMap::new(),
        }
    }

    /// Add a SASL extension `key=value` sent with the token. `auth` is reserved.
    pub fn with_extension(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.extensions.insert(key.into(), value.into());
        self
    }
}

impl fmt::Debug for OAuthToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OAuthToken")
            .field("token", &Redacted)
            .field("extensions", &self.extensions)
            .finish()
    }
}

/// Supplies OAUTHBEARER tokens. Called for every new connection and every
/// re-authentication, so it decides caching and refreshing (return a new token once the
/// old one is near expiry).
///
/// Any `Fn() -> impl Future<Output = Result<OAuthToken>>` closure is a provider:
///
/// ```
/// use kafkapipe::sasl::{OAuthBearer, OAuthToken};
/// let mechanism = OAuthBearer::new(|| async {
///     // fetch from your identity provider here
///     Ok(OAuthToken::new("token"))
/// });
/// ```
pub trait TokenProvider: Send + Sync {
    /// A currently valid token.
    fn token(&self) -> BoxFuture<'_, Result<OAuthToken>>;
}

impl<F, Fut> TokenProvider for F
where
    F: Fn() -> Fut + Send + Sync,
    Fut: Future<Output = Result<OAuthToken>> + Send + 'static,
{
    fn token(&self) -> BoxFuture<'_, Result<OAuthToken>> {
        Box::pin(self())
    }
}

/// SASL/OAUTHBEARER with tokens from a [`TokenProvider`].
///
/// ```
/// use kafkapipe::sasl::{Mechanism, OAuthBearer, OAuthToken};
/// let m = OAuthBearer::with_static_token(OAuthToken::new("abc"));
/// assert_eq!(m.name(), "OAUTHBEARER");
/// ```
#[derive(Clone)]
pub struct OAuthBearer {
    provider: Arc<dyn TokenProvider>,
}

impl OAuthBearer {
    /// OAUTHBEARER asking `provider` for a token at each authentication.
    pub fn new(provider: impl TokenProvider + 'static) -> Self {
        OAuthBearer {
            provider: Arc::new(provider),
        }
    }

    /// OAUTHBEARER always sending `token` (tests, long-lived tokens).
    pub fn with_static_token(token: OAuthToken) -> Self {
        Self::new(move || {
            let token = token.clone();
            async move { Ok(token) }
        })
    }
}

impl fmt::Debug for OAuthBearer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OAuthBearer").finish_non_exhaustive()
    }
}

/// The client's initial response (RFC 7628 §3.1, Kafka's layout):
/// `n,,\x01auth=Bearer TOKEN[\x01key=value]*\x01\x01`.
pub(crate) fn initial_response(token: &OAuthToken) -> Result<Vec<u8>> {
    const SEP: char = '\u{1}';
    if token.token.is_empty() || token.token.contains(SEP) {
        return Err(auth_error("OAUTHBEARER token is empty or contains 0x01"));
    }
    let mut m = format!("n,,{SEP}auth=Bearer {}", token.token);
    for (k, v) in &token.extensions {
        let key_ok = !k.is_empty() && k != "auth" && k.chars().all(|c| c.is_ascii_alphabetic());
        if !key_ok || v.contains(SEP) {
            return Err(auth_error(format!(
                "invalid OAUTHBEARER extension key {k:?} (letters only, not \"auth\") or value"
            )));
        }
        m.push(SEP);
        m.push_str(k);
        m.push('=');
        m.push_str(v);
    }
    m.push(SEP);
    m.push(SEP);
    Ok(m.into_bytes())
}

struct OAuthSession {
    /// The broker's error challenge, once it sent one.
    server_error: Option<String>,
}

impl Session for OAuthSession {
    fn next(&mut self, challenge: &[u8]) -> Result<Option<Vec<u8>>> {
        if let Some(e) = &self.server_error {
            return Err(auth_error(format!(
                "OAUTHBEARER rejected by the broker: {e}"
            )));
        }
        if challenge.is_empty() {
            return Ok(None);
        }
        // RFC 7628 §3.2.3: an error challenge (JSON) is answered with a single 0x01; the
        // broker then fails the exchange with an error code.
        self.server_error = Some(String::from_utf8_lossy(challenge).into_owned());
        Ok(Some(vec![1]))
    }
}

impl Mechanism for OAuthBearer {
    fn name(&self) -> &str {
        "OAUTHBEARER"
    }

    fn start(&self) -> StartFuture<'_> {
        Box::pin(async move {
            let token = self.provider.token().await?;
            let first = initial_response(&token)?;
            Ok((
                Box::new(OAuthSession { server_error: None }) as Box<dyn Session>,
                first,
            ))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn initial_response_layout() {
        let t = OAuthToken::new("tok").with_extension("traceId", "7");
        assert_eq!(
            initial_response(&t).unwrap(),
            b"n,,\x01auth=Bearer tok\x01traceId=7\x01\x01"
        );
        assert_eq!(
            initial_response(&OAuthToken::new("t")).unwrap(),
            b"n,,\x01auth=Bearer t\x01\x01"
        );
        assert!(initial_response(&OAuthToken::new("")).is_err());
        assert!(initial_response(&OAuthToken::new("t").with_extension("auth", "x")).is_err());
    }

    #[tokio::test]
    async fn provider_is_asked_per_start_and_errors_are_answered_with_0x01() {
        let calls = Arc::new(AtomicUsize::new(0));
        let c = Arc::clone(&calls);
        let m = OAuthBearer::new(move || {
            let n = c.fetch_add(1, Ordering::SeqCst);
            async move { Ok(OAuthToken::new(format!("token{n}"))) }
        });
        let (mut s, first) = m.start().await.unwrap();
        assert!(first.ends_with(b"Bearer token0\x01\x01"));
        assert_eq!(s.next(b"").unwrap(), None);
        let (mut s, first) = m.start().await.unwrap();
        assert!(first.ends_with(b"Bearer token1\x01\x01"));
        assert_eq!(calls.load(Ordering::SeqCst), 2);
        let challenge = br#"{"status":"invalid_token"}"#;
        assert_eq!(s.next(challenge).unwrap(), Some(vec![1]));
        let e = s.next(b"").unwrap_err();
        assert!(e.to_string().contains("invalid_token"), "{e}");
    }

    #[test]
    fn debug_hides_token() {
        let t = OAuthToken::new("secret-token");
        assert!(!format!("{t:?}").contains("secret-token"));
        let m = OAuthBearer::with_static_token(t);
        assert!(!format!("{m:?}").contains("secret-token"));
    }
}
