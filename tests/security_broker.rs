//! TLS and SASL against the real listeners of the shared Apache Kafka test broker
//! (`tests/common/kafka.rs`): SSL, SSL with required client certificates (mTLS),
//! SASL_PLAINTEXT and SASL_SSL with PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 and OAUTHBEARER
//! (Kafka's unsecured JWS validator). Certificates come from the CA in `tests/common/pki.rs`.
//! Also: the system trust roots (`SSL_CERT_DIR` / `SSL_CERT_FILE`, in a subprocess), the
//! hostname check and its opt-out, PKCS#12 stores written by OpenSSL and Java's keytool,
//! and a client configured from a Java property map (`kafkapipe::config::Properties`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::kafka::USER512;
use common::{PASSWORD, USER};
use kafkapipe::config::Properties;
use kafkapipe::conn::{Conn, ConnectionConfig, FetchOptions, ProduceOptions};
use kafkapipe::protocol::ErrorCode;
use kafkapipe::reader::{Reader, ReaderConfig};
use kafkapipe::record::Record;
use kafkapipe::sasl::{Mechanism, OAuthBearer, OAuthToken, Plain, Scram, Session, StartFuture};
use kafkapipe::tls::TlsConfig;
use kafkapipe::writer::{Message, Writer, WriterConfig};
use kafkapipe::{Error, ErrorKind};

/// The broker's SASL mechanisms, in its configured order.
const MECHANISMS: [&str; 4] = ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER"];

// ---------------------------------------------------------------------------------------
// helpers

fn tls_config(ca_pem: &str) -> TlsConfig {
    TlsConfig::builder()
        .ca_pem(ca_pem.as_bytes())
        .unwrap()
        .build()
        .unwrap()
}

fn trusted() -> TlsConfig {
    tls_config(&common::shared().pki.ca_pem)
}

fn config(tls: Option<TlsConfig>, sasl: Option<Arc<dyn Mechanism>>) -> ConnectionConfig {
    let mut c = ConnectionConfig::new()
        .connect_timeout(Duration::from_secs(5))
        .request_timeout(Duration::from_secs(10));
    c.tls = tls;
    c.sasl = sasl;
    c
}

fn fetch_opts() -> FetchOptions {
    FetchOptions::default().max_wait(Duration::from_millis(10))
}

/// A fresh single-partition topic on the shared broker.
fn topic(prefix: &str) -> String {
    let t = common::unique_topic(prefix);
    common::shared().create_topic(&t, 1);
    t
}

/// Produce three records to partition 0 of `topic` on `conn` and read them back.
async fn produce_consume(conn: &Conn, topic: &str, tag: &str) {
    let records: Vec<Record> = (0..3)
        .map(|i| Record::new(format!("k{i}"), format!("{tag}-{i}")))
        .collect();
    let base = conn
        .produce(topic, 0, &records, &ProduceOptions::default())
        .await
        .unwrap();
    let fetched = conn.fetch(topic, 0, base, &fetch_opts()).await.unwrap();
    let values: Vec<&[u8]> = fetched
        .records
        .iter()
        .filter_map(|r| r.value.as_deref())
        .collect();
    assert_eq!(
        values,
        vec![
            format!("{tag}-0").as_bytes(),
            format!("{tag}-1").as_bytes(),
            format!("{tag}-2").as_bytes()
        ]
    );
}

/// Connects, produces and consumes; panics with the error otherwise.
async fn round_trip(addr: &str, tls: Option<TlsConfig>, sasl: Arc<dyn Mechanism>, tag: &str) {
    let t = topic(tag);
    let conn = Conn::connect_with(addr, config(tls, Some(sasl)))
        .await
        .unwrap_or_else(|e| panic!("{tag}: {e}"));
    produce_consume(&conn, &t, tag).await;
    conn.close().await;
}

/// A connection attempt that must fail, and fail fast (no hang, no retry loop).
async fn refused(addr: &str, tls: Option<TlsConfig>, sasl: Option<Arc<dyn Mechanism>>) -> Error {
    let started = Instant::now();
    let err = match Conn::connect_with(addr, config(tls, sasl)).await {
        Ok(conn) => {
            // Some refusals (TLS 1.3 client certificates) only show on the first request.
            let r = conn.metadata(None).await;
            conn.close().await;
            match r {
                Ok(_) => panic!("connection to {addr} was accepted"),
                Err(e) => e,
            }
        }
        Err(e) => e,
    };
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "refusal took {:?}: {err}",
        started.elapsed()
    );
    assert!(!err.is_retriable(), "{err}");
    err
}

/// Asserts a SASL authentication failure: SASL_AUTHENTICATION_FAILED, final, naming the
/// mechanism and broker, never echoing `secret`.
fn assert_auth_failed(err: &Error, mechanism: &str, addr: &str, secret: &str) {
    assert_eq!(
        err.kafka_code(),
        Some(ErrorCode::SaslAuthenticationFailed),
        "{err}"
    );
    assert!(err.is_authentication(), "{err}");
    let text = err.to_string();
    assert!(text.contains(mechanism), "{text}");
    assert!(text.contains(addr), "{text}");
    assert!(!text.contains(secret), "{text}");
    assert!(!format!("{err:?}").contains(secret), "{err:?}");
}

fn plain(user: &str, password: &str) -> Arc<dyn Mechanism> {
    Arc::new(Plain::new(user, password))
}

fn scram256(user: &str, password: &str) -> Arc<dyn Mechanism> {
    Arc::new(Scram::sha256(user, password))
}

fn scram512(user: &str, password: &str) -> Arc<dyn Mechanism> {
    Arc::new(Scram::sha512(user, password))
}

fn oauth(token: &str) -> Arc<dyn Mechanism> {
    Arc::new(OAuthBearer::with_static_token(OAuthToken::new(token)))
}

/// Base64 (standard alphabet, padded).
fn base64(data: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(A[(n >> (18 - 6 * i)) as usize & 63] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// One JWS part: `json` padded with spaces until its base64 form has no `+`, `/` or `=`,
/// so standard and URL-safe decoders (Kafka ≤ 4.1 uses the standard one) read it alike.
fn jws_part(json: &str) -> String {
    let mut json = json.to_string();
    loop {
        let enc = base64(json.as_bytes());
        if !enc.contains(['+', '/', '=']) {
            return enc;
        }
        json.insert(json.len() - 1, ' ');
    }
}

/// An unsecured JWS (`alg: none`) for `sub` valid from `iat` to `exp` (seconds).
fn unsecured_jws(sub: &str, iat: i64, exp: i64) -> String {
    format!(
        "{}.{}.",
        jws_part(r#"{"alg":"none"}"#),
        jws_part(&format!(r#"{{"sub":"{sub}","iat":{iat},"exp":{exp}}}"#))
    )
}

fn now_s() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// A mechanism the broker does not offer.
#[derive(Debug)]
struct Anonymous;

struct Done;

impl Session for Done {
    fn next(&mut self, _challenge: &[u8]) -> kafkapipe::Result<Option<Vec<u8>>> {
        Ok(None)
    }
}

impl Mechanism for Anonymous {
    fn name(&self) -> &str {
        "ANONYMOUS"
    }
    fn start(&self) -> StartFuture<'_> {
        Box::pin(async { Ok((Box::new(Done) as Box<dyn Session>, Vec::new())) })
    }
}

// ---------------------------------------------------------------------------------------
// TLS

#[tokio::test]
async fn tls_with_the_trusted_ca_produces_and_consumes() {
    let b = common::shared();
    let t = topic("tls");
    let conn = Conn::connect_with(&b.ssl_addr, config(Some(trusted()), None))
        .await
        .unwrap();
    produce_consume(&conn, &t, "over-tls").await;
    conn.close().await;
}

#[tokio::test]
async fn wrong_ca_fails_fast_with_a_tls_error() {
    let b = common::shared();
    let err = refused(&b.ssl_addr, Some(tls_config(&b.pki.other_ca_pem)), None).await;
    assert_eq!(err.kind(), ErrorKind::Tls, "{err}");
    let text = err.to_string();
    assert!(text.contains(&b.ssl_addr), "{text}");
    assert!(text.contains("UnknownIssuer"), "{text}");
}

#[tokio::test]
async fn server_name_is_checked() {
    let b = common::shared();
    let tls = trusted().with_server_name("kafka.example.com");
    let err = refused(&b.ssl_addr, Some(tls), None).await;
    assert_eq!(err.kind(), ErrorKind::Tls, "{err}");
    assert!(err.to_string().contains("kafka.example.com"), "{err}");
    // The other name in the certificate works when dialing by IP.
    let tls = trusted().with_server_name("localhost");
    Conn::connect_with(&b.ssl_addr, config(Some(tls), None))
        .await
        .unwrap()
        .close()
        .await;
}

#[tokio::test]
async fn tls_client_against_a_plaintext_listener_fails_fast() {
    let b = common::shared();
    let err = refused(&b.addr, Some(trusted()), None).await;
    assert_eq!(err.kind(), ErrorKind::Tls, "{err}");
}

#[tokio::test]
async fn mtls_with_a_client_certificate_works() {
    let b = common::shared();
    let with_cert = TlsConfig::builder()
        .ca_pem(b.pki.ca_pem.as_bytes())
        .unwrap()
        .client_cert_pem(
            b.pki.client_cert_pem.as_bytes(),
            b.pki.client_key_pem.as_bytes(),
        )
        .unwrap()
        .build()
        .unwrap();
    let t = topic("mtls");
    let conn = Conn::connect_with(&b.mtls_addr, config(Some(with_cert), None))
        .await
        .unwrap();
    produce_consume(&conn, &t, "over-mtls").await;
    conn.close().await;
}

#[tokio::test]
async fn mtls_without_a_client_certificate_is_refused_clearly() {
    let b = common::shared();
    let err = refused(&b.mtls_addr, Some(trusted()), None).await;
    assert_eq!(err.kind(), ErrorKind::Tls, "{err}");
    assert_eq!(err.broker(), Some(b.mtls_addr.as_str()), "{err}");
    // Java's TLS 1.3 server answers a missing certificate with `bad_certificate` (not
    // `certificate_required`); with TLS 1.3 it arrives on the first read.
    assert!(err.to_string().contains("BadCertificate"), "{err}");
}

// ---------------------------------------------------------------------------------------
// SASL PLAIN

#[tokio::test]
async fn plain_produces_and_consumes() {
    let b = common::shared();
    round_trip(&b.sasl_addr, None, plain(USER, PASSWORD), "plain").await;
}

#[tokio::test]
async fn plain_wrong_password_is_a_clear_final_error() {
    let b = common::shared();
    let err = refused(&b.sasl_addr, None, Some(plain(USER, "not-the-password"))).await;
    assert_auth_failed(&err, "PLAIN", &b.sasl_addr, "not-the-password");
    assert!(
        err.to_string().contains("Invalid username or password"),
        "{err}"
    );
    let err = refused(&b.sasl_addr, None, Some(plain("nobody", "x"))).await;
    assert_auth_failed(&err, "PLAIN", &b.sasl_addr, "\"x\"");
}

// ---------------------------------------------------------------------------------------
// SASL SCRAM

#[tokio::test]
async fn scram_sha256_produces_and_consumes() {
    let b = common::shared();
    round_trip(&b.sasl_addr, None, scram256(USER, PASSWORD), "scram256").await;
}

#[tokio::test]
async fn scram_sha512_produces_and_consumes() {
    let b = common::shared();
    round_trip(&b.sasl_addr, None, scram512(USER, PASSWORD), "scram512").await;
    round_trip(
        &b.sasl_addr,
        None,
        scram512(USER512.0, USER512.1),
        "scram512-bob",
    )
    .await;
}

#[tokio::test]
async fn scram_wrong_password_is_a_clear_final_error() {
    let b = common::shared();
    for (m, name) in [
        (scram256(USER, "not-the-password"), "SCRAM-SHA-256"),
        (scram512(USER, "not-the-password"), "SCRAM-SHA-512"),
    ] {
        let err = refused(&b.sasl_addr, None, Some(m)).await;
        assert_auth_failed(&err, name, &b.sasl_addr, "not-the-password");
    }
}

#[tokio::test]
async fn scram_user_without_a_credential_for_the_mechanism_is_refused() {
    let b = common::shared();
    // bob has a SCRAM-SHA-512 credential only.
    let err = refused(&b.sasl_addr, None, Some(scram256(USER512.0, USER512.1))).await;
    assert_auth_failed(&err, "SCRAM-SHA-256", &b.sasl_addr, USER512.1);
    let err = refused(&b.sasl_addr, None, Some(scram512("nobody", "x"))).await;
    assert_auth_failed(&err, "SCRAM-SHA-512", &b.sasl_addr, "\"x\"");
}

#[tokio::test]
async fn wrong_password_makes_the_writer_give_up_at_once() {
    let b = common::shared();
    let t = topic("sasl-writer-fail");
    let writer = Writer::new(
        WriterConfig::new([b.sasl_addr.clone()])
            .topic(&t)
            .sasl(Scram::sha512(USER, "not-the-password"))
            .backoff(Duration::from_millis(500), Duration::from_secs(1)),
    )
    .unwrap();
    let started = Instant::now();
    let err = writer
        .write_messages([Message::new("never")])
        .await
        .unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(3), "{err}");
    assert!(err.is_authentication(), "{err}");
    assert!(!format!("{err:?}").contains("not-the-password"));
}

// ---------------------------------------------------------------------------------------
// SASL OAUTHBEARER

#[tokio::test]
async fn oauthbearer_unsecured_token_is_accepted() {
    let b = common::shared();
    let now = now_s();
    let token = unsecured_jws(USER, now - 10, now + 3600);
    round_trip(&b.sasl_addr, None, oauth(&token), "oauth").await;
}

#[tokio::test]
async fn oauthbearer_expired_or_malformed_token_is_refused() {
    let b = common::shared();
    let now = now_s();
    let expired = unsecured_jws(USER, now - 7200, now - 3600);
    let no_sub = format!(
        "{}.{}.",
        jws_part(r#"{"alg":"none"}"#),
        jws_part(&format!(r#"{{"iat":{now},"exp":{}}}"#, now + 3600))
    );
    for bad in [expired.as_str(), no_sub.as_str(), "not-a-jws"] {
        let err = refused(&b.sasl_addr, None, Some(oauth(bad))).await;
        assert_auth_failed(&err, "OAUTHBEARER", &b.sasl_addr, bad);
    }
}

/// A JWS whose header has no `alg` makes Kafka 4.1's unsecured validator throw a
/// NullPointerException, and the broker closes the connection without a
/// SaslAuthenticate answer. The client reports a closed connection (quickly, naming the
/// broker) — it cannot tell this from a broker going away, so it stays retriable.
#[tokio::test]
async fn oauthbearer_token_without_alg_makes_kafka_hang_up() {
    let b = common::shared();
    let now = now_s();
    let no_alg = format!(
        "{}.{}.",
        jws_part("{}"),
        jws_part(&format!(
            r#"{{"sub":"{USER}","iat":{now},"exp":{}}}"#,
            now + 3600
        ))
    );
    let started = Instant::now();
    let err = Conn::connect_with(&b.sasl_addr, config(None, Some(oauth(&no_alg))))
        .await
        .unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(5), "{err}");
    assert!(
        matches!(err.kind(), ErrorKind::Closed | ErrorKind::Io),
        "{err}"
    );
    assert_eq!(err.broker(), Some(b.sasl_addr.as_str()), "{err}");
    assert!(!format!("{err:?}").contains(&no_alg), "{err:?}");
}

// ---------------------------------------------------------------------------------------
// mechanisms

#[tokio::test]
async fn unsupported_mechanism_lists_the_brokers_mechanisms() {
    let b = common::shared();
    let err = refused(&b.sasl_addr, None, Some(Arc::new(Anonymous))).await;
    assert_eq!(
        err.kafka_code(),
        Some(ErrorCode::UnsupportedSaslMechanism),
        "{err}"
    );
    assert!(err.is_authentication(), "{err}");
    let text = err.to_string();
    assert!(text.contains("ANONYMOUS"), "{text}");
    assert!(text.contains(&b.sasl_addr), "{text}");
    for m in MECHANISMS {
        assert!(text.contains(m), "{m} missing: {text}");
    }
}

// ---------------------------------------------------------------------------------------
// SASL_SSL

#[tokio::test]
async fn sasl_ssl_with_every_mechanism() {
    let b = common::shared();
    let now = now_s();
    let token = unsecured_jws(USER, now - 10, now + 3600);
    for (m, tag) in [
        (plain(USER, PASSWORD), "ssl-plain"),
        (scram256(USER, PASSWORD), "ssl-scram256"),
        (scram512(USER, PASSWORD), "ssl-scram512"),
        (oauth(&token), "ssl-oauth"),
    ] {
        round_trip(&b.sasl_ssl_addr, Some(trusted()), m, tag).await;
    }
    let err = refused(
        &b.sasl_ssl_addr,
        Some(trusted()),
        Some(plain(USER, "not-the-password")),
    )
    .await;
    assert_auth_failed(&err, "PLAIN", &b.sasl_ssl_addr, "not-the-password");
    let err = refused(
        &b.sasl_ssl_addr,
        Some(tls_config(&b.pki.other_ca_pem)),
        Some(plain(USER, PASSWORD)),
    )
    .await;
    assert_eq!(err.kind(), ErrorKind::Tls, "{err}");
}

/// The Writer and the Reader discover the broker through Metadata (which on this listener
/// advertises the SASL_SSL address) and dial it with the same TLS and SASL settings.
#[tokio::test]
async fn writer_to_reader_over_sasl_ssl() {
    let b = common::shared();
    let t = topic("sasl-ssl-rt");
    let writer = Writer::new(
        WriterConfig::new([b.sasl_ssl_addr.clone()])
            .topic(&t)
            .tls(trusted())
            .sasl(Scram::sha512(USER512.0, USER512.1)),
    )
    .unwrap();
    writer
        .write_messages([Message::new("secure-1"), Message::new("secure-2")])
        .await
        .unwrap();
    drop(writer);

    let mut reader = Reader::new(
        ReaderConfig::new([b.sasl_ssl_addr.clone()])
            .topic(&t)
            .tls(trusted())
            .sasl(Scram::sha256(USER, PASSWORD)),
    )
    .await
    .unwrap();
    let mut got = Vec::new();
    while got.len() < 2 {
        let m = tokio::time::timeout(Duration::from_secs(20), reader.next_message())
            .await
            .expect("reader over SASL_SSL timed out")
            .unwrap();
        got.push(String::from_utf8_lossy(m.value.as_deref().unwrap_or_default()).to_string());
    }
    assert_eq!(got, ["secure-1", "secure-2"]);
    reader.close().await;
}

/// Writer → Reader over mTLS (SSL listener with required client certificates).
#[tokio::test]
async fn writer_to_reader_over_mtls() {
    let b = common::shared();
    let with_cert = || {
        TlsConfig::builder()
            .ca_pem(b.pki.ca_pem.as_bytes())
            .unwrap()
            .client_cert_pem(
                b.pki.client_cert_pem.as_bytes(),
                b.pki.client_key_pem.as_bytes(),
            )
            .unwrap()
            .build()
            .unwrap()
    };
    let t = topic("mtls-rt");
    let writer = Writer::new(
        WriterConfig::new([b.mtls_addr.clone()])
            .topic(&t)
            .tls(with_cert()),
    )
    .unwrap();
    writer
        .write_messages([Message::new("m-1"), Message::new("m-2")])
        .await
        .unwrap();
    drop(writer);
    let mut reader = Reader::new(
        ReaderConfig::new([b.mtls_addr.clone()])
            .topic(&t)
            .tls(with_cert()),
    )
    .await
    .unwrap();
    let mut got = Vec::new();
    while got.len() < 2 {
        let m = tokio::time::timeout(Duration::from_secs(20), reader.next_message())
            .await
            .expect("reader over mTLS timed out")
            .unwrap();
        got.push(String::from_utf8_lossy(m.value.as_deref().unwrap_or_default()).to_string());
    }
    assert_eq!(got, ["m-1", "m-2"]);
    reader.close().await;
}

// ---------------------------------------------------------------------------------------
// TLS out of the box: system roots, hostname verification, PKCS#12

/// Set in the environment of the subprocess `system_roots_child` runs in: the broker to
/// dial with a `TlsConfig` given no CA.
const CHILD_ADDR: &str = "KAFKAPIPE_TEST_SYSTEM_ROOTS_ADDR";

/// Runs in a subprocess of `no_ca_setting_trusts_the_system_roots`, whose environment
/// (`SSL_CERT_DIR` / `SSL_CERT_FILE`) is the system trust store under test: environment
/// variables cannot be set safely in a multi-threaded test binary.
#[tokio::test]
#[ignore = "run as a subprocess by no_ca_setting_trusts_the_system_roots"]
async fn system_roots_child() {
    let addr = std::env::var(CHILD_ADDR).expect("run by no_ca_setting_trusts_the_system_roots");
    let tls = TlsConfig::builder().build().unwrap(); // no CA: the system roots
    let conn = Conn::connect_with(&addr, config(Some(tls), None))
        .await
        .unwrap_or_else(|e| panic!("CHILD-ERROR {e}"));
    conn.metadata(None).await.unwrap();
    conn.close().await;
}

/// `system_roots_child` with `env`; its success and output.
fn system_roots_child_run(addr: &str, env: &[(&str, &Path)]) -> (bool, String) {
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "system_roots_child", "--ignored", "--nocapture"])
        .env(CHILD_ADDR, addr)
        .env_remove("SSL_CERT_FILE")
        .env_remove("SSL_CERT_DIR")
        .envs(env.iter().map(|(k, v)| (*k, *v)))
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[tokio::test]
async fn no_ca_setting_trusts_the_system_roots() {
    let b = common::shared();
    // A private trust directory holding the test CA, as `SSL_CERT_DIR` (what OpenSSL and
    // rustls-native-certs read): the client is given no CA at all.
    let trust_dir = common::temp_dir("system-trust");
    let ca_file = trust_dir.join("kafkapipe-test-ca.pem");
    std::fs::write(&ca_file, &b.pki.ca_pem).unwrap();
    let (ok, out) = system_roots_child_run(&b.ssl_addr, &[("SSL_CERT_DIR", &trust_dir)]);
    assert!(ok && out.contains("1 passed"), "SSL_CERT_DIR:\n{out}");
    let (ok, out) = system_roots_child_run(&b.ssl_addr, &[("SSL_CERT_FILE", &ca_file)]);
    assert!(ok && out.contains("1 passed"), "SSL_CERT_FILE:\n{out}");
    // A trust store without the test CA: refused, so the roots came from the variable.
    let other_dir = common::temp_dir("system-trust-other");
    std::fs::write(other_dir.join("other-ca.pem"), &b.pki.other_ca_pem).unwrap();
    let (ok, out) = system_roots_child_run(&b.ssl_addr, &[("SSL_CERT_DIR", &other_dir)]);
    assert!(!ok, "{out}");
    assert!(
        out.contains("CHILD-ERROR") && out.contains("UnknownIssuer"),
        "{out}"
    );
}

#[tokio::test]
async fn hostname_mismatch_says_so_and_the_opt_out_still_checks_the_chain() {
    let b = common::shared();
    // (Not `refused`: its 5 s bound is about retry loops, which the other TLS tests
    // cover; this one is about what the error says.)
    let err = Conn::connect_with(
        &b.ssl_addr,
        config(Some(trusted().with_server_name("kafka.example.com")), None),
    )
    .await
    .unwrap_err();
    assert!(!err.is_retriable(), "{err}");
    assert_eq!(err.kind(), ErrorKind::Tls, "{err}");
    let text = err.to_string();
    assert!(text.contains("hostname mismatch"), "{text}");
    assert!(text.contains("kafka.example.com"), "{text}");
    assert_eq!(err.broker(), Some(b.ssl_addr.as_str()), "{err}");

    // The loudly named opt-out connects under the same wrong name...
    let lax = |ca: &str| {
        TlsConfig::builder()
            .ca_pem(ca.as_bytes())
            .unwrap()
            .server_name("kafka.example.com")
            .danger_accept_invalid_hostnames(true)
            .build()
            .unwrap()
    };
    let t = topic("any-hostname");
    let conn = Conn::connect_with(&b.ssl_addr, config(Some(lax(&b.pki.ca_pem)), None))
        .await
        .unwrap();
    produce_consume(&conn, &t, "any-hostname").await;
    conn.close().await;
    // ...and still refuses a certificate that does not chain to a trusted root.
    let err = Conn::connect_with(&b.ssl_addr, config(Some(lax(&b.pki.other_ca_pem)), None))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Tls, "{err}");
    assert!(err.to_string().contains("UnknownIssuer"), "{err}");
}

/// Runs a tool that writes a key store; panics with its output if it fails.
fn store_tool(program: &str, args: &[&str]) {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{program} (from openssl / the JDK) is needed: {e}"));
    assert!(
        out.status.success(),
        "{program} {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A client keystore written by OpenSSL 3 (its default PKCS#12: PBES2/AES-256-CBC,
/// HMAC-SHA-256, as Java writes them too) and a truststore written by Java's keytool:
/// mTLS to the listener that requires client certificates.
#[tokio::test]
async fn pkcs12_keystore_and_truststore_work_for_mtls() {
    let b = common::shared();
    let dir = common::temp_dir("pkcs12");
    let path = |name: &str| dir.join(name).to_str().unwrap().to_string();
    std::fs::write(path("client.pem"), &b.pki.client_cert_pem).unwrap();
    std::fs::write(path("client.key"), &b.pki.client_key_pem).unwrap();
    std::fs::write(path("ca.pem"), &b.pki.ca_pem).unwrap();
    store_tool(
        "openssl",
        &[
            "pkcs12",
            "-export",
            "-in",
            &path("client.pem"),
            "-inkey",
            &path("client.key"),
            "-certfile",
            &path("ca.pem"),
            "-name",
            "client",
            "-passout",
            "pass:ks-secret",
            "-out",
            &path("client.p12"),
        ],
    );
    store_tool(
        "keytool",
        &[
            "-importcert",
            "-noprompt",
            "-alias",
            "test-ca",
            "-file",
            &path("ca.pem"),
            "-keystore",
            &path("truststore.p12"),
            "-storetype",
            "PKCS12",
            "-storepass",
            "ts-secret",
        ],
    );
    let tls = TlsConfig::builder()
        .truststore_file(path("truststore.p12"), "ts-secret")
        .unwrap()
        .keystore_file(path("client.p12"), "ks-secret")
        .unwrap()
        .build()
        .unwrap();
    let t = topic("pkcs12");
    let conn = Conn::connect_with(&b.mtls_addr, config(Some(tls), None))
        .await
        .unwrap();
    produce_consume(&conn, &t, "over-pkcs12").await;
    conn.close().await;

    // The same stores from properties, as a Java client's configuration names them.
    let props = Properties::from_pairs([
        ("bootstrap.servers", b.mtls_addr.as_str()),
        ("security.protocol", "SSL"),
        ("ssl.truststore.location", &path("truststore.p12")),
        ("ssl.truststore.password", "ts-secret"),
        ("ssl.truststore.type", "PKCS12"),
        ("ssl.keystore.location", &path("client.p12")),
        ("ssl.keystore.password", "ks-secret"),
        ("ssl.key.password", "ks-secret"),
        ("ssl.keystore.type", "PKCS12"),
    ])
    .unwrap();
    let topics = props.admin().unwrap().list_topics().await.unwrap();
    assert!(topics.iter().any(|l| l.name == t), "{t} not listed");
    // A wrong keystore password is a configuration error naming the key and the file.
    let err = Properties::from_pairs([
        ("security.protocol", "SSL"),
        ("ssl.keystore.location", &path("client.p12")),
        ("ssl.keystore.password", "not-the-secret"),
    ])
    .unwrap_err();
    let text = format!("{err} {err:?}");
    assert!(
        text.contains("ssl.keystore.location") && text.contains("client.p12"),
        "{text}"
    );
    assert!(!text.contains("not-the-secret"), "{text}");
}

// ---------------------------------------------------------------------------------------
// Property maps

/// A Java-style property map (SASL_SSL, SCRAM-SHA-512 through `sasl.jaas.config`, the
/// test CA as `ssl.ca.location`) configures a Writer, a group Reader and an Admin.
#[tokio::test]
async fn property_map_connects_over_sasl_ssl() {
    let b = common::shared();
    let t = topic("props");
    let group = common::unique_topic("props-group");
    let jaas = format!(
        "org.apache.kafka.common.security.scram.ScramLoginModule required \
         username=\"{USER}\" password=\"{PASSWORD}\";"
    );
    let props = Properties::from_pairs([
        ("bootstrap.servers", b.sasl_ssl_addr.as_str()),
        ("security.protocol", "SASL_SSL"),
        ("sasl.mechanism", "SCRAM-SHA-512"),
        ("sasl.jaas.config", &jaas),
        ("ssl.ca.location", b.pki.ca_file.to_str().unwrap()),
        ("client.id", "props-test"),
        ("acks", "all"),
        ("enable.idempotence", "true"),
        ("linger.ms", "5"),
        ("compression.type", "zstd"),
        ("group.id", &group),
        ("auto.offset.reset", "earliest"),
        ("isolation.level", "read_committed"),
        ("session.timeout.ms", "10000"),
        (
            "key.serializer",
            "org.apache.kafka.common.serialization.StringSerializer",
        ),
    ])
    .unwrap();
    let writer = Writer::new(props.writer_config().unwrap().topic(&t)).unwrap();
    writer
        .write_messages([Message::new("prop-1"), Message::new("prop-2")])
        .await
        .unwrap();
    drop(writer);
    let mut reader = Reader::new(props.reader_config().unwrap().topic(&t))
        .await
        .unwrap();
    let mut got = Vec::new();
    while got.len() < 2 {
        let m = tokio::time::timeout(Duration::from_secs(30), reader.next_message())
            .await
            .expect("group reader from properties timed out")
            .unwrap();
        got.push(String::from_utf8_lossy(m.value.as_deref().unwrap_or_default()).to_string());
    }
    assert_eq!(got, ["prop-1", "prop-2"]);
    reader.close().await;
    let admin = props.admin().unwrap();
    assert!(admin
        .list_topics()
        .await
        .unwrap()
        .iter()
        .any(|l| l.name == t));
    admin.close().await;

    // PLAIN from sasl.username / sasl.password; a wrong password is a final auth error.
    let plain = |password: &str| {
        Properties::from_pairs([
            ("bootstrap.servers", b.sasl_ssl_addr.as_str()),
            ("security.protocol", "sasl_ssl"),
            ("sasl.mechanisms", "PLAIN"),
            ("sasl.username", USER),
            ("sasl.password", password),
            ("ssl.truststore.location", b.pki.ca_file.to_str().unwrap()),
            ("ssl.truststore.type", "PEM"),
        ])
        .unwrap()
    };
    let admin = plain(PASSWORD).admin().unwrap();
    assert!(admin
        .list_topics()
        .await
        .unwrap()
        .iter()
        .any(|l| l.name == t));
    admin.close().await;
    let admin = plain("not-the-password").admin().unwrap();
    let err = admin.list_topics().await.unwrap_err();
    assert!(err.is_authentication(), "{err}");
    admin.close().await;
}
