//! OAUTHBEARER tokens from an OpenID Connect / OAuth 2 identity provider with the client
//! credentials grant (KIP-768, RFC 6749 §4.4), cargo feature `oidc`.
//!
//! [`ClientCredentials`] posts `grant_type=client_credentials` (and `scope`, `audience`)
//! to the token endpoint with HTTP Basic client authentication, as the Java client's
//! `ClientCredentialsJwtRetriever` does, and reads `access_token` and its expiry from the
//! answer. [`ClientCredentials::into_mechanism`] puts a [`CachedTokenProvider`] in front,
//! so tokens are reused until 80% (+ jitter) of their lifetime and refreshed for new
//! connections and KIP-368 re-authentications.

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine;
use futures::future::BoxFuture;
use serde_json::Value;
use tracing::debug;

use super::http::{form_encode, post_form, Url};
use super::{auth_error, CachedTokenProvider, OAuthBearer, OAuthToken, Redacted, TokenProvider};
use crate::error::{Error, ErrorKind, Result};
use crate::tls::TlsConfig;

/// OAuth 2 client credentials for OAUTHBEARER (KIP-768): the token endpoint, the client id
/// and secret, and optionally the scope and audience.
///
/// Java client equivalents: `sasl.oauthbearer.token.endpoint.url`,
/// `sasl.oauthbearer.client.credentials.client.id`,
/// `sasl.oauthbearer.client.credentials.client.secret`, `sasl.oauthbearer.scope`;
/// `sasl.login.connect.timeout.ms` + `sasl.login.read.timeout.ms` for
/// [`ClientCredentials::timeout`].
///
/// ```no_run
/// use kafkapipe::conn::ConnectionConfig;
/// use kafkapipe::sasl::ClientCredentials;
///
/// # fn demo() -> kafkapipe::Result<()> {
/// let oidc = ClientCredentials::new(
///     "https://idp.example.com/oauth2/token",
///     "my-client",
///     "my-secret",
/// )?
/// .scope("kafka")
/// .audience("kafka-cluster");
/// let config = ConnectionConfig::new().sasl(oidc.into_mechanism());
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct ClientCredentials {
    url: Url,
    endpoint: String,
    client_id: String,
    client_secret: String,
    params: Vec<(String, String)>,
    extensions: Vec<(String, String)>,
    tls: Option<TlsConfig>,
    timeout: Duration,
}

impl ClientCredentials {
    /// Credentials for the token endpoint `url` (`http://` or `https://`).
    ///
    /// # Errors
    ///
    /// `Config` if `url` is not an `http`/`https` URL with a host.
    ///
    /// ```
    /// use kafkapipe::sasl::ClientCredentials;
    /// assert!(ClientCredentials::new("https://idp/token", "id", "secret").is_ok());
    /// assert!(ClientCredentials::new("ftp://idp/token", "id", "secret").is_err());
    /// ```
    pub fn new(
        url: &str,
        client_id: impl Into<String>,
        client_secret: impl Into<String>,
    ) -> Result<Self> {
        Ok(ClientCredentials {
            url: Url::parse(url)?,
            endpoint: url.to_string(),
            client_id: client_id.into(),
            client_secret: client_secret.into(),
            params: Vec::new(),
            extensions: Vec::new(),
            tls: None,
            timeout: Duration::from_secs(10),
        })
    }

    /// The `scope` requested (space-separated scopes). Default: none sent.
    ///
    /// ```
    /// # use kafkapipe::sasl::ClientCredentials;
    /// let c = ClientCredentials::new("https://idp/token", "id", "s").unwrap().scope("kafka");
    /// ```
    pub fn scope(self, scope: impl Into<String>) -> Self {
        self.param("scope", scope)
    }

    /// The `audience` requested (Auth0, Okta and Keycloak read this form parameter; the
    /// broker checks it against `sasl.oauthbearer.expected.audience`). Default: none sent.
    ///
    /// ```
    /// # use kafkapipe::sasl::ClientCredentials;
    /// let c = ClientCredentials::new("https://idp/token", "id", "s").unwrap().audience("kafka");
    /// ```
    pub fn audience(self, audience: impl Into<String>) -> Self {
        self.param("audience", audience)
    }

    /// Any further form parameter of the token request (e.g. `resource`, RFC 8707).
    ///
    /// ```
    /// # use kafkapipe::sasl::ClientCredentials;
    /// let c = ClientCredentials::new("https://idp/token", "id", "s")
    ///     .unwrap()
    ///     .param("resource", "urn:kafka:prod");
    /// ```
    pub fn param(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.params.push((key.into(), value.into()));
        self
    }

    /// A SASL extension (KIP-342) sent with every token, e.g. Confluent Cloud's
    /// `logicalCluster` and `identityPoolId`. (Java: `sasl.jaas.config` `extension_KEY`.)
    ///
    /// ```
    /// # use kafkapipe::sasl::ClientCredentials;
    /// let c = ClientCredentials::new("https://idp/token", "id", "s")
    ///     .unwrap()
    ///     .extension("logicalCluster", "lkc-abc123")
    ///     .extension("identityPoolId", "pool-xyz");
    /// ```
    pub fn extension(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.extensions.push((key.into(), value.into()));
        self
    }

    /// TLS for an `https://` token endpoint. Default: `TlsConfig::builder().build()`.
    ///
    /// ```no_run
    /// # use kafkapipe::sasl::ClientCredentials;
    /// # use kafkapipe::tls::TlsConfig;
    /// # fn demo() -> kafkapipe::Result<()> {
    /// let tls = TlsConfig::builder().ca_file("/etc/idp-ca.pem")?.build()?;
    /// let c = ClientCredentials::new("https://idp/token", "id", "s")?.tls(tls);
    /// # Ok(()) }
    /// ```
    pub fn tls(mut self, tls: TlsConfig) -> Self {
        self.tls = Some(tls);
        self
    }

    /// The deadline of one token request (connect, TLS and answer). Default 10 s.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use kafkapipe::sasl::ClientCredentials;
    /// let c = ClientCredentials::new("https://idp/token", "id", "s")
    ///     .unwrap()
    ///     .timeout(Duration::from_secs(5));
    /// ```
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// OAUTHBEARER with these credentials behind a [`CachedTokenProvider`] (defaults:
    /// refresh at 80% of the token's lifetime plus up to 5% jitter).
    ///
    /// ```
    /// # use kafkapipe::sasl::{ClientCredentials, Mechanism};
    /// let m = ClientCredentials::new("https://idp/token", "id", "s").unwrap().into_mechanism();
    /// assert_eq!(m.name(), "OAUTHBEARER");
    /// ```
    pub fn into_mechanism(self) -> OAuthBearer {
        OAuthBearer::new(CachedTokenProvider::new(self))
    }

    /// Requests a token now, without caching.
    ///
    /// # Errors
    ///
    /// `Io` / `Timeout` when the endpoint cannot be reached (retriable); `Authentication`
    /// when it refuses the request (the message has its status and `error` /
    /// `error_description`) or answers without `access_token`.
    ///
    /// ```no_run
    /// # use kafkapipe::sasl::ClientCredentials;
    /// # async fn demo() -> kafkapipe::Result<()> {
    /// let token = ClientCredentials::new("https://idp/token", "id", "s")?.fetch().await?;
    /// println!("expires at {:?}", token.expires_at());
    /// # Ok(()) }
    /// ```
    pub async fn fetch(&self) -> Result<OAuthToken> {
        let basic = base64::engine::general_purpose::STANDARD.encode(format!(
            "{}:{}",
            form_encode(&self.client_id),
            form_encode(&self.client_secret)
        ));
        let mut body = String::from("grant_type=client_credentials");
        for (k, v) in &self.params {
            body.push('&');
            body.push_str(&form_encode(k));
            body.push('=');
            body.push_str(&form_encode(v));
        }
        let resp = post_form(
            &self.url,
            &[("Authorization", format!("Basic {basic}"))],
            &body,
            self.tls.as_ref(),
            self.timeout,
        )
        .await
        .map_err(|e| {
            let m = format!(
                "OAuth token request to {}: {}",
                self.endpoint,
                e.message().unwrap_or("failed")
            );
            e.with_message(m)
        })?;
        let endpoint = &self.endpoint;
        let json: Option<Value> = serde_json::from_slice(&resp.body).ok();
        if resp.status != 200 {
            let detail = match &json {
                Some(j) => {
                    let field = |k: &str| j.get(k).and_then(Value::as_str).unwrap_or("");
                    format!("{} {}", field("error"), field("error_description"))
                }
                None => {
                    String::from_utf8_lossy(&resp.body[..resp.body.len().min(200)]).into_owned()
                }
            };
            let kind = if resp.status >= 500 || resp.status == 429 {
                ErrorKind::Io
            } else {
                ErrorKind::Authentication
            };
            return Err(Error::new(
                kind,
                format!(
                    "token endpoint {endpoint} refused client {:?}: HTTP {}: {}",
                    self.client_id,
                    resp.status,
                    detail.trim()
                ),
            ));
        }
        let json = json.ok_or_else(|| {
            auth_error(format!(
                "token endpoint {endpoint} answered with invalid JSON"
            ))
        })?;
        let access_token = json
            .get("access_token")
            .and_then(Value::as_str)
            .filter(|t| !t.is_empty())
            .ok_or_else(|| {
                auth_error(format!(
                    "token endpoint {endpoint} answered without an access_token"
                ))
            })?;
        let now = SystemTime::now();
        let from_expires_in = json
            .get("expires_in")
            .and_then(|v| v.as_u64().or_else(|| v.as_str()?.parse().ok()))
            .map(|s| now + Duration::from_secs(s));
        let from_jwt = jwt_claims(access_token)
            .and_then(|c| c.get("exp").and_then(Value::as_f64))
            .filter(|exp| exp.is_finite() && *exp >= 0.0)
            .map(|exp| UNIX_EPOCH + Duration::from_secs_f64(exp));
        let mut token = OAuthToken::new(access_token);
        if let Some(exp) = [from_expires_in, from_jwt].into_iter().flatten().min() {
            token = token.with_expiry(exp);
        }
        for (k, v) in &self.extensions {
            token = token.with_extension(k, v);
        }
        debug!(endpoint = %endpoint, client_id = %self.client_id, "OAuth token fetched");
        Ok(token)
    }
}

impl fmt::Debug for ClientCredentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientCredentials")
            .field("endpoint", &self.endpoint)
            .field("client_id", &self.client_id)
            .field("client_secret", &Redacted)
            .field("params", &self.params)
            .field("extensions", &self.extensions)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl TokenProvider for ClientCredentials {
    /// Asks the token endpoint, every time: wrap in a [`CachedTokenProvider`] (as
    /// [`ClientCredentials::into_mechanism`] does) to reuse tokens.
    fn token(&self) -> BoxFuture<'_, Result<OAuthToken>> {
        Box::pin(self.fetch())
    }
}

/// Decodes one base64url JWT part (padding optional).
fn b64url(part: &str) -> Option<Vec<u8>> {
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(part.trim_end_matches('='))
        .ok()
}

/// The claims (payload) of a JWS compact serialisation, if it is one.
fn jwt_claims(token: &str) -> Option<Value> {
    let mut parts = token.split('.');
    let _header = parts.next()?;
    serde_json::from_slice(&b64url(parts.next()?)?).ok()
}

/// `alg`, `kid`, `iss`, `sub`, `aud` and `exp` of a JWT, for error messages.
pub(crate) fn describe_jwt(token: &str) -> Option<String> {
    let header: Value = serde_json::from_slice(&b64url(token.split('.').next()?)?).ok()?;
    let claims = jwt_claims(token)?;
    let mut out = Vec::new();
    for (name, v) in [
        ("alg", header.get("alg")),
        ("kid", header.get("kid")),
        ("iss", claims.get("iss")),
        ("sub", claims.get("sub")),
        ("aud", claims.get("aud")),
    ] {
        if let Some(v) = v {
            out.push(format!("{name}={v}"));
        }
    }
    if let Some(exp) = claims.get("exp").and_then(Value::as_i64) {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs() as i64)
            .unwrap_or(0);
        if exp <= now {
            out.push(format!("exp={exp} (expired {} s ago)", now - exp));
        } else {
            out.push(format!("exp={exp} (expires in {} s)", exp - now));
        }
    }
    Some(format!("JWT {}", out.join(", ")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    fn jwt(header: &str, claims: &str) -> String {
        let e = |s: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s);
        format!("{}.{}.c2ln", e(header), e(claims))
    }

    #[test]
    fn describes_claims_without_the_signature() {
        let t = jwt(
            r#"{"alg":"RS256","kid":"k1"}"#,
            r#"{"iss":"idp","sub":"svc","aud":["kafka"],"exp":1000}"#,
        );
        let d = describe_jwt(&t).unwrap();
        assert!(d.contains(r#"kid="k1""#), "{d}");
        assert!(d.contains(r#"aud=["kafka"]"#), "{d}");
        assert!(d.contains("expired"), "{d}");
        assert!(!d.contains("c2ln"), "{d}");
        assert_eq!(describe_jwt("opaque-token"), None);
    }

    /// A one-shot HTTP server answering `answer`, returning what it was sent.
    async fn serve_once(answer: String) -> (String, tokio::task::JoinHandle<String>) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let task = tokio::spawn(async move {
            let (mut s, _) = l.accept().await.unwrap();
            let mut req = Vec::new();
            let mut buf = [0u8; 4096];
            loop {
                let n = s.read(&mut buf).await.unwrap();
                req.extend_from_slice(&buf[..n]);
                let text = String::from_utf8_lossy(&req);
                if let Some(i) = text.find("\r\n\r\n") {
                    let len: usize = text
                        .lines()
                        .find_map(|l| l.strip_prefix("Content-Length: "))
                        .unwrap()
                        .parse()
                        .unwrap();
                    if req.len() >= i + 4 + len {
                        break;
                    }
                }
            }
            s.write_all(answer.as_bytes()).await.unwrap();
            s.shutdown().await.unwrap();
            String::from_utf8(req).unwrap()
        });
        (format!("http://{addr}/oauth2/token"), task)
    }

    fn http(status: &str, body: &str) -> String {
        format!(
            "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
    }

    #[tokio::test]
    async fn client_credentials_request_and_answer() {
        let exp = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs()
            + 3600;
        let token = jwt(
            r#"{"alg":"RS256"}"#,
            &format!(r#"{{"sub":"svc","exp":{exp}}}"#),
        );
        let body = format!(r#"{{"access_token":"{token}","token_type":"Bearer","expires_in":60}}"#);
        let (url, server) = serve_once(http("200 OK", &body)).await;
        let c = ClientCredentials::new(&url, "my client", "s3cr:t")
            .unwrap()
            .scope("kafka write")
            .audience("aud-1")
            .extension("logicalCluster", "lkc-1");
        let t = c.fetch().await.unwrap();
        let req = server.await.unwrap();
        assert!(req.starts_with("POST /oauth2/token HTTP/1.1\r\n"), "{req}");
        // Basic base64("my+client:s3cr%3At")
        let basic = base64::engine::general_purpose::STANDARD.encode("my+client:s3cr%3At");
        assert!(
            req.contains(&format!("Authorization: Basic {basic}\r\n")),
            "{req}"
        );
        assert!(
            req.ends_with("grant_type=client_credentials&scope=kafka+write&audience=aud-1"),
            "{req}"
        );
        assert_eq!(t.token(), token);
        // expires_in (60 s) is sooner than the JWT's exp (1 h): the sooner wins.
        let left = t
            .expires_at()
            .unwrap()
            .duration_since(SystemTime::now())
            .unwrap();
        assert!(
            left <= Duration::from_secs(60) && left > Duration::from_secs(50),
            "{left:?}"
        );
        assert!(super::super::oauthbearer::initial_response(&t)
            .unwrap()
            .ends_with(b"\x01logicalCluster=lkc-1\x01\x01"));
    }

    #[tokio::test]
    async fn refusals_are_clear_and_do_not_leak_the_secret() {
        let (url, _server) = serve_once(http(
            "401 Unauthorized",
            r#"{"error":"invalid_client","error_description":"bad secret"}"#,
        ))
        .await;
        let e = ClientCredentials::new(&url, "me", "hunter2")
            .unwrap()
            .fetch()
            .await
            .unwrap_err();
        let text = e.to_string();
        assert!(e.is_authentication(), "{e}");
        assert!(!e.is_retriable(), "{e}");
        assert!(
            text.contains("HTTP 401") && text.contains("invalid_client bad secret"),
            "{text}"
        );
        assert!(!text.contains("hunter2"), "{text}");
        let (url, _server) = serve_once(http("200 OK", r#"{"token_type":"Bearer"}"#)).await;
        let e = ClientCredentials::new(&url, "me", "x")
            .unwrap()
            .fetch()
            .await
            .unwrap_err();
        assert!(e.to_string().contains("without an access_token"), "{e}");
        let (url, _server) = serve_once(http("503 Service Unavailable", "busy")).await;
        let e = ClientCredentials::new(&url, "me", "x")
            .unwrap()
            .fetch()
            .await
            .unwrap_err();
        assert!(e.is_retriable(), "{e}");
        assert!(!format!(
            "{:?}",
            ClientCredentials::new(&url, "me", "hunter2").unwrap()
        )
        .contains("hunter2"));
    }
}
