//! SASL/OAUTHBEARER (RFC 7628, KIP-255) with a user-supplied async token provider, and
//! [`CachedTokenProvider`], which reuses a token until a share of its lifetime has passed
//! (Java's `sasl.login.refresh.window.factor` / `.jitter`, KIP-255 and KIP-368: every new
//! connection and every re-authentication asks the provider).

use std::collections::hash_map::RandomState;
use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::hash::{BuildHasher, Hasher};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures::future::BoxFuture;
use tokio::time::Instant;
use tracing::{debug, warn};

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
    expires_at: Option<SystemTime>,
}

impl OAuthToken {
    /// A bearer token (typically a JWT).
    pub fn new(token: impl Into<String>) -> Self {
        OAuthToken {
            token: token.into(),
            extensions: BTreeMap::new(),
            expires_at: None,
        }
    }

    /// When the token expires (a JWT's `exp` claim). [`CachedTokenProvider`] reuses a
    /// token until a share of the time left has passed; tokens without an expiry are not
    /// cached.
    ///
    /// ```
    /// use std::time::{Duration, SystemTime};
    /// use kafkapipe::sasl::OAuthToken;
    /// let exp = SystemTime::now() + Duration::from_secs(3600);
    /// let t = OAuthToken::new("eyJ...").with_expiry(exp);
    /// assert_eq!(t.expires_at(), Some(exp));
    /// ```
    pub fn with_expiry(mut self, expires_at: SystemTime) -> Self {
        self.expires_at = Some(expires_at);
        self
    }

    /// When the token expires, if known (see [`OAuthToken::with_expiry`]).
    ///
    /// ```
    /// use kafkapipe::sasl::OAuthToken;
    /// assert_eq!(OAuthToken::new("t").expires_at(), None);
    /// ```
    pub fn expires_at(&self) -> Option<SystemTime> {
        self.expires_at
    }

    /// The bearer token itself (keep it out of logs).
    ///
    /// ```
    /// use kafkapipe::sasl::OAuthToken;
    /// assert_eq!(OAuthToken::new("abc").token(), "abc");
    /// ```
    pub fn token(&self) -> &str {
        &self.token
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
            .field("expires_at", &self.expires_at)
            .finish()
    }
}

/// Supplies OAUTHBEARER tokens. Called for every new connection and every
/// re-authentication, so it decides caching and refreshing (return a new token once the
/// old one is near expiry); wrap it in a [`CachedTokenProvider`] to have that done for
/// it. Plug your own identity provider in here; `ClientCredentials` (cargo feature
/// `oidc`) and `MskIamTokenProvider` (cargo feature `aws-msk-iam`) are built in.
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

/// A [`TokenProvider`] in front of another that reuses its tokens: a token is handed out
/// until a share of its lifetime has passed (80% plus up to 5% random jitter by default,
/// the Java client's `sasl.login.refresh.window.factor` and
/// `sasl.login.refresh.window.jitter`), then the next caller fetches a fresh one. Callers
/// queue behind one fetch, so many connections cost one request to the identity provider.
///
/// A token is also refreshed once less than 5 s (or half its lifetime, if shorter) is left,
/// so a connection authenticating with it gets a session long enough to re-authenticate
/// (brokers refuse a re-authentication within 1 s of the previous one).
///
/// If a refresh fails while the cached token has not expired yet, the cached token is
/// handed out (and the failure logged); the refresh is tried again on the next call after
/// a short pause. Tokens without [`OAuthToken::expires_at`] are not cached.
///
/// ```
/// use std::time::{Duration, SystemTime};
/// use kafkapipe::sasl::{CachedTokenProvider, OAuthBearer, OAuthToken, TokenProvider};
///
/// # async fn demo() -> kafkapipe::Result<()> {
/// let provider = CachedTokenProvider::new(|| async {
///     // an expensive call to the identity provider
///     Ok(OAuthToken::new("eyJ...").with_expiry(SystemTime::now() + Duration::from_secs(3600)))
/// });
/// let first = provider.token().await?;
/// let second = provider.token().await?; // the same token, no second call
/// assert_eq!(first.token(), second.token());
/// let mechanism = OAuthBearer::new(provider);
/// # Ok(()) }
/// ```
pub struct CachedTokenProvider {
    inner: Box<dyn TokenProvider>,
    state: tokio::sync::Mutex<Option<Cached>>,
    window: f64,
    jitter: f64,
}

/// A cached token is replaced once less than this (or half its lifetime) is left.
const MIN_LEFT: Duration = Duration::from_secs(5);

struct Cached {
    token: OAuthToken,
    refresh_at: Instant,
    expires: Instant,
}

impl CachedTokenProvider {
    /// Cache the tokens of `inner` (refresh window 0.8, jitter 0.05).
    pub fn new(inner: impl TokenProvider + 'static) -> Self {
        CachedTokenProvider {
            inner: Box::new(inner),
            state: tokio::sync::Mutex::new(None),
            window: 0.8,
            jitter: 0.05,
        }
    }

    /// Refresh once this share of a token's lifetime has passed; clamped to 0.5–1.0.
    /// Default 0.8. (Java: `sasl.login.refresh.window.factor`.)
    ///
    /// ```
    /// use kafkapipe::sasl::{CachedTokenProvider, OAuthToken};
    /// let p = CachedTokenProvider::new(|| async { Ok(OAuthToken::new("t")) })
    ///     .refresh_window(0.9)
    ///     .refresh_jitter(0.0);
    /// ```
    pub fn refresh_window(mut self, factor: f64) -> Self {
        self.window = if factor.is_nan() {
            0.8
        } else {
            factor.clamp(0.5, 1.0)
        };
        self
    }

    /// Add up to this share of the lifetime, at random, to the refresh point, so many
    /// clients do not refresh at once; clamped to 0–0.25. Default 0.05. (Java:
    /// `sasl.login.refresh.window.jitter`.)
    ///
    /// ```
    /// use kafkapipe::sasl::{CachedTokenProvider, OAuthToken};
    /// let p = CachedTokenProvider::new(|| async { Ok(OAuthToken::new("t")) }).refresh_jitter(0.1);
    /// ```
    pub fn refresh_jitter(mut self, jitter: f64) -> Self {
        self.jitter = if jitter.is_nan() {
            0.05
        } else {
            jitter.clamp(0.0, 0.25)
        };
        self
    }

    /// The share of the lifetime after which this token is refreshed.
    fn refresh_share(&self) -> f64 {
        let mut h = RandomState::new().build_hasher();
        h.write_u64(0);
        let unit = (h.finish() >> 11) as f64 / (1u64 << 53) as f64;
        (self.window + self.jitter * unit).min(1.0)
    }
}

impl fmt::Debug for CachedTokenProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CachedTokenProvider")
            .field("window", &self.window)
            .field("jitter", &self.jitter)
            .finish_non_exhaustive()
    }
}

impl TokenProvider for CachedTokenProvider {
    fn token(&self) -> BoxFuture<'_, Result<OAuthToken>> {
        Box::pin(async move {
            let mut state = self.state.lock().await;
            let now = Instant::now();
            if let Some(cached) = state.as_ref() {
                if now < cached.refresh_at {
                    return Ok(cached.token.clone());
                }
            }
            match self.inner.token().await {
                Ok(token) => {
                    let left = token
                        .expires_at
                        .and_then(|exp| exp.duration_since(SystemTime::now()).ok())
                        .filter(|left| !left.is_zero());
                    *state = left.map(|left| {
                        // Keep at least min(5 s, half the lifetime) in hand: a broker
                        // grants a session no longer than the token lives, and refuses a
                        // re-authentication within 1 s of the previous one, so a token
                        // handed out just before expiry would cost the connection.
                        let refresh_in = left
                            .mul_f64(self.refresh_share())
                            .min(left - MIN_LEFT.min(left / 2));
                        debug!(
                            lifetime_ms = left.as_millis() as u64,
                            refresh_in_ms = refresh_in.as_millis() as u64,
                            "OAUTHBEARER token fetched"
                        );
                        Cached {
                            token: token.clone(),
                            refresh_at: now + refresh_in,
                            expires: now + left,
                        }
                    });
                    Ok(token)
                }
                Err(e) => match state.as_mut() {
                    Some(cached) if now < cached.expires => {
                        // Try again after a tenth of the time left (at most 10 s).
                        let pause = (cached.expires - now)
                            .mul_f64(0.1)
                            .min(Duration::from_secs(10));
                        warn!(
                            error = %e,
                            valid_for_ms = (cached.expires - now).as_millis() as u64,
                            "OAUTHBEARER token refresh failed; using the cached token"
                        );
                        cached.refresh_at = now + pause;
                        Ok(cached.token.clone())
                    }
                    _ => {
                        *state = None;
                        Err(e)
                    }
                },
            }
        })
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

/// The JWT's header and claims that explain a refusal (`alg`, `kid`, `iss`, `sub`, `aud`,
/// `exp`), or the expiry the provider gave; never the token or its signature.
fn describe_token(token: &OAuthToken) -> Option<String> {
    #[cfg(feature = "oidc")]
    if let Some(claims) = super::oidc::describe_jwt(&token.token) {
        return Some(claims);
    }
    let exp = token.expires_at?;
    Some(match exp.duration_since(SystemTime::now()) {
        Ok(left) => format!("expires in {} s", left.as_secs()),
        Err(e) => format!("expired {} s ago", e.duration().as_secs()),
    })
}

struct OAuthSession {
    /// The broker's error challenge, once it sent one.
    server_error: Option<String>,
    /// What the token says about itself (JWT claims, never the token), for errors.
    token_summary: Option<String>,
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

    fn describe_failure(&self, broker_message: Option<&str>) -> Option<String> {
        let mut parts = Vec::new();
        if let Some(e) = &self.server_error {
            if broker_message != Some(e.as_str()) {
                parts.push(format!("broker's error challenge {e}"));
            }
        }
        if let Some(t) = &self.token_summary {
            parts.push(format!("the token sent: {t}"));
        }
        (!parts.is_empty()).then(|| parts.join("; "))
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
                Box::new(OAuthSession {
                    server_error: None,
                    token_summary: describe_token(&token),
                }) as Box<dyn Session>,
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
        let challenge_text = String::from_utf8_lossy(challenge).into_owned();
        assert!(s.describe_failure(None).unwrap().contains("invalid_token"));
        // Kafka's error message is the challenge itself: not said twice.
        assert_eq!(s.describe_failure(Some(&challenge_text)), None);
    }

    #[test]
    fn debug_hides_token() {
        let t = OAuthToken::new("secret-token");
        assert!(!format!("{t:?}").contains("secret-token"));
        let m = OAuthBearer::with_static_token(t);
        assert!(!format!("{m:?}").contains("secret-token"));
    }

    #[tokio::test(start_paused = true)]
    async fn cache_refreshes_after_the_window_and_falls_back_while_valid() {
        let calls = Arc::new(AtomicUsize::new(0));
        let fail = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (c, f) = (Arc::clone(&calls), Arc::clone(&fail));
        let p = CachedTokenProvider::new(move || {
            let n = c.fetch_add(1, Ordering::SeqCst);
            let failing = f.load(Ordering::SeqCst);
            async move {
                if failing {
                    return Err(auth_error("idp down"));
                }
                Ok(OAuthToken::new(format!("t{n}"))
                    .with_expiry(SystemTime::now() + Duration::from_secs(100)))
            }
        })
        .refresh_jitter(0.0);
        assert_eq!(p.token().await.unwrap().token(), "t0");
        tokio::time::advance(Duration::from_secs(79)).await;
        assert_eq!(p.token().await.unwrap().token(), "t0");
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(p.token().await.unwrap().token(), "t1");
        assert_eq!(calls.load(Ordering::SeqCst), 2);
        // The identity provider fails: the cached token (valid for 100 s) is used.
        tokio::time::advance(Duration::from_secs(81)).await;
        fail.store(true, Ordering::SeqCst);
        assert_eq!(p.token().await.unwrap().token(), "t1");
        assert_eq!(calls.load(Ordering::SeqCst), 3);
        // ...and not asked again at once.
        assert_eq!(p.token().await.unwrap().token(), "t1");
        assert_eq!(calls.load(Ordering::SeqCst), 3);
        // Past the expiry the failure surfaces.
        tokio::time::advance(Duration::from_secs(20)).await;
        assert!(p.token().await.is_err());
        // Tokens without expiry are not cached.
        let n = Arc::new(AtomicUsize::new(0));
        let n2 = Arc::clone(&n);
        let p = CachedTokenProvider::new(move || {
            n2.fetch_add(1, Ordering::SeqCst);
            async { Ok(OAuthToken::new("x")) }
        });
        p.token().await.unwrap();
        p.token().await.unwrap();
        assert_eq!(n.load(Ordering::SeqCst), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn short_lived_tokens_are_refreshed_with_time_to_spare() {
        let calls = Arc::new(AtomicUsize::new(0));
        let c = Arc::clone(&calls);
        let p = CachedTokenProvider::new(move || {
            let n = c.fetch_add(1, Ordering::SeqCst);
            async move {
                Ok(OAuthToken::new(format!("t{n}"))
                    .with_expiry(SystemTime::now() + Duration::from_secs(4)))
            }
        })
        .refresh_jitter(0.0);
        assert_eq!(p.token().await.unwrap().token(), "t0");
        // 80% would be 3.2 s, leaving 0.8 s: too little for a broker session.
        tokio::time::advance(Duration::from_millis(2100)).await;
        assert_eq!(p.token().await.unwrap().token(), "t1");
    }

    #[test]
    fn jitter_stays_within_bounds() {
        let p = CachedTokenProvider::new(|| async { Ok(OAuthToken::new("t")) }).refresh_jitter(0.2);
        for _ in 0..100 {
            let s = p.refresh_share();
            assert!((0.8..=1.0).contains(&s), "{s}");
        }
    }
}
