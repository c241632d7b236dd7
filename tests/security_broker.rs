//! TLS and SASL against real servers.
//!
//! TLS: tansu 0.6 has no working TLS listener, so Debian's `stunnel4` terminates TLS in
//! front of it (a real, independent TLS server, OpenSSL-based), with tansu advertising the
//! stunnel port. Certificates come from a CA generated here with rcgen. A second stunnel
//! requires client certificates (mTLS).
//!
//! SASL: SCRAM users persist only in a tansu built with libsql storage
//! (`TANSU_LIBSQL_BIN`, see `tests/common`). Recipe: start it on a sqlite file without
//! `--authentication`, create users and topics with the tansu CLI, restart it with
//! `--authentication` on the same file. tansu offers SCRAM-SHA-256, SCRAM-SHA-512 and
//! OAUTHBEARER, not PLAIN.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use common::{free_port, BrokerOptions, TestBroker, Watched};
use kafkapipe::conn::{Conn, ConnectionConfig, FetchOptions, ProduceOptions};
use kafkapipe::protocol::ErrorCode;
use kafkapipe::reader::{Reader, ReaderConfig};
use kafkapipe::record::Record;
use kafkapipe::sasl::{Mechanism, OAuthBearer, OAuthToken, Plain, Scram};
use kafkapipe::tls::TlsConfig;
use kafkapipe::writer::{Message, Writer, WriterConfig};
use kafkapipe::ErrorKind;

const USER256: (&str, &str) = ("alice", "alice-secret-256");
const USER512: (&str, &str) = ("bob", "bob-secret-512");

// ---------------------------------------------------------------------------------------
// PKI and stunnel

struct Pki {
    dir: PathBuf,
    ca_pem: String,
    other_ca_pem: String,
    client_cert_pem: String,
    client_key_pem: String,
}

/// `$TMP/kafkapipe-NAME-PID`, fresh. Directories left by earlier test processes that are
/// gone (statics are never dropped, so nothing removes them at exit) are removed.
fn temp_dir(name: &str) -> PathBuf {
    let prefix = format!("kafkapipe-{name}-");
    if let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) {
        for entry in entries.flatten() {
            let file_name = entry.file_name();
            let pid = file_name
                .to_str()
                .and_then(|n| n.strip_prefix(&prefix))
                .and_then(|p| p.parse::<u32>().ok());
            if let Some(pid) = pid {
                if !Path::new(&format!("/proc/{pid}")).exists() {
                    let _ = std::fs::remove_dir_all(entry.path());
                }
            }
        }
    }
    let dir = std::env::temp_dir().join(format!("{prefix}{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn ca(name: &str) -> (rcgen::Certificate, rcgen::KeyPair) {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, name);
    (params.self_signed(&key).unwrap(), key)
}

fn leaf(
    names: &[&str],
    cn: &str,
    ca: &(rcgen::Certificate, rcgen::KeyPair),
) -> (rcgen::Certificate, rcgen::KeyPair) {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params =
        rcgen::CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>())
            .unwrap();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, cn);
    (params.signed_by(&key, &ca.0, &ca.1).unwrap(), key)
}

/// A test CA, a server certificate for `localhost` and `127.0.0.1`, a client
/// certificate, and an unrelated CA; written to a temp dir for stunnel.
fn pki() -> &'static Pki {
    static PKI: OnceLock<Pki> = OnceLock::new();
    PKI.get_or_init(|| {
        let dir = temp_dir("pki");
        let root = ca("kafkapipe test CA");
        let other = ca("some other CA");
        let server = leaf(&["localhost", "127.0.0.1"], "broker", &root);
        let client = leaf(&["client.local"], "kafkapipe test client", &root);
        std::fs::write(dir.join("ca.pem"), root.0.pem()).unwrap();
        std::fs::write(dir.join("server.pem"), server.0.pem()).unwrap();
        std::fs::write(dir.join("server.key"), server.1.serialize_pem()).unwrap();
        Pki {
            dir,
            ca_pem: root.0.pem(),
            other_ca_pem: other.0.pem(),
            client_cert_pem: client.0.pem(),
            client_key_pem: client.1.serialize_pem(),
        }
    })
}

fn stunnel_bin() -> &'static str {
    for candidate in ["stunnel4", "stunnel"] {
        if Command::new(candidate).arg("-version").output().is_ok() {
            return candidate;
        }
    }
    panic!("stunnel4 not found: `apt-get install stunnel4` (bash .ci/run installs it)");
}

/// stunnel terminating TLS on a free port and forwarding to `backend`; with `mtls` it
/// requires a client certificate signed by the test CA.
struct Stunnel {
    addr: String,
    _process: Watched,
}

fn stunnel(backend: &str, mtls: bool) -> Stunnel {
    let pki = pki();
    let port = free_port();
    let name = format!("stunnel-{port}");
    let conf = pki.dir.join(format!("{name}.conf"));
    let d = pki.dir.display();
    let mut text = format!(
        "foreground = yes\npid =\ndebug = notice\n[kafka]\naccept = 127.0.0.1:{port}\n\
         connect = {backend}\ncert = {d}/server.pem\nkey = {d}/server.key\n"
    );
    if mtls {
        text.push_str(&format!(
            "CAfile = {d}/ca.pem\nverifyChain = yes\nrequireCert = yes\n"
        ));
    }
    std::fs::write(&conf, text).unwrap();
    let mut process = Watched::spawn(
        stunnel_bin(),
        &[conf.to_str().unwrap()],
        &pki.dir,
        pki.dir.join(format!("{name}.log")),
    );
    let addr = format!("127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(&addr).is_err() {
        assert!(
            !process.exited() && Instant::now() < deadline,
            "stunnel did not start; log:\n{}",
            process.log_text()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    Stunnel {
        addr,
        _process: process,
    }
}

// ---------------------------------------------------------------------------------------
// brokers

/// The default tansu, advertising the TLS port; one stunnel without and one with
/// client-certificate verification in front of it.
struct TlsSetup {
    broker: TestBroker,
    tls: Stunnel,
    mtls: Stunnel,
}

fn tls_setup() -> &'static TlsSetup {
    static SETUP: OnceLock<TlsSetup> = OnceLock::new();
    SETUP.get_or_init(|| {
        let broker_port = free_port();
        let tls = stunnel(&format!("127.0.0.1:{broker_port}"), false);
        let mtls = stunnel(&format!("127.0.0.1:{broker_port}"), true);
        let broker = TestBroker::start_opts(&BrokerOptions {
            advertised: Some(tls.addr.clone()),
            port: Some(broker_port),
            ..BrokerOptions::default()
        });
        TlsSetup { broker, tls, mtls }
    })
}

/// The libsql tansu with SCRAM users, `--authentication`, advertising its TLS port.
struct ScramSetup {
    broker: TestBroker,
    tls: Stunnel,
    topics: Vec<String>,
}

fn cli(tansu: &Path, args: &[&str]) {
    let out = Command::new(tansu)
        .args(args)
        .env("NO_COLOR", "1")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "tansu {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn scram_setup() -> Option<&'static ScramSetup> {
    static SETUP: OnceLock<Option<ScramSetup>> = OnceLock::new();
    SETUP
        .get_or_init(|| {
            let tansu = common::tansu_libsql_bin()?;
            let dir = temp_dir("scram");
            let port = free_port();
            let tls = stunnel(&format!("127.0.0.1:{port}"), false);
            let opts = BrokerOptions {
                tansu: tansu.clone(),
                advertised: Some(tls.addr.clone()),
                args: vec!["--storage-engine".into(), "sqlite://kafkapipe.db".into()],
                cwd: Some(dir),
                port: Some(port),
            };
            let topics: Vec<String> = (0..6).map(|i| format!("secure-{i}")).collect();
            {
                let setup = TestBroker::start_opts(&opts);
                let url = setup.url();
                for (user, pass, mechanism) in [
                    (USER256.0, USER256.1, "scram256"),
                    (USER512.0, USER512.1, "scram512"),
                ] {
                    cli(
                        &tansu,
                        &[
                            "user",
                            "create",
                            "--broker",
                            &url,
                            user,
                            pass,
                            "--mechanism",
                            mechanism,
                        ],
                    );
                }
                for t in &topics {
                    setup.create_topic_cli(t, 1);
                }
            }
            let mut opts = opts;
            opts.args.push("--authentication".into());
            let broker = TestBroker::start_opts(&opts);
            Some(ScramSetup {
                broker,
                tls,
                topics,
            })
        })
        .as_ref()
}

// ---------------------------------------------------------------------------------------
// helpers

fn tls_config(ca_pem: &str) -> TlsConfig {
    TlsConfig::builder()
        .ca_pem(ca_pem.as_bytes())
        .unwrap()
        .build()
        .unwrap()
}

fn config(tls: Option<TlsConfig>, sasl: Option<Arc<dyn Mechanism>>) -> ConnectionConfig {
    ConnectionConfig {
        tls,
        sasl,
        connect_timeout: Duration::from_secs(5),
        request_timeout: Duration::from_secs(10),
        ..ConnectionConfig::default()
    }
}

fn fetch_opts() -> FetchOptions {
    FetchOptions {
        max_wait: Duration::from_millis(10),
        ..FetchOptions::default()
    }
}

/// Produce `n` records to partition 0 of `topic` and read them back on `conn`.
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

/// All values on partition 0 of `topic`.
async fn read_values(conn: &Conn, topic: &str) -> Vec<String> {
    let f = conn.fetch(topic, 0, 0, &fetch_opts()).await.unwrap();
    f.records
        .iter()
        .filter_map(|r| r.value.as_deref())
        .map(|v| String::from_utf8_lossy(v).into_owned())
        .collect()
}

// ---------------------------------------------------------------------------------------
// TLS

#[tokio::test]
async fn tls_produce_and_consume_with_conn_and_writer() {
    let s = tls_setup();
    let tls = tls_config(&pki().ca_pem);
    let conn = Conn::connect_with(&s.tls.addr, config(Some(tls.clone()), None))
        .await
        .unwrap();
    let topic = common::unique_topic("tls");
    conn.create_topic(&topic, 1, 1).await.unwrap();
    produce_consume(&conn, &topic, "over-tls").await;

    // The Writer discovers the broker (the TLS port) through metadata and dials it with TLS.
    let writer = Writer::new(
        WriterConfig::new([s.tls.addr.clone()])
            .topic(&topic)
            .tls(tls),
    )
    .unwrap();
    writer
        .write_messages([Message::new("from-writer")])
        .await
        .unwrap();
    drop(writer);
    assert!(read_values(&conn, &topic)
        .await
        .contains(&"from-writer".to_string()));
    conn.close().await;
}

#[tokio::test]
async fn mtls_with_and_without_client_certificate() {
    let s = tls_setup();
    let pki = pki();
    let with_cert = TlsConfig::builder()
        .ca_pem(pki.ca_pem.as_bytes())
        .unwrap()
        .client_cert_pem(
            pki.client_cert_pem.as_bytes(),
            pki.client_key_pem.as_bytes(),
        )
        .unwrap()
        .build()
        .unwrap();
    let conn = Conn::connect_with(&s.mtls.addr, config(Some(with_cert), None))
        .await
        .unwrap();
    let topic = common::unique_topic("mtls");
    s.broker.create_topic_cli(&topic, 1);
    produce_consume(&conn, &topic, "over-mtls").await;
    conn.close().await;

    // Without a certificate stunnel refuses (with TLS 1.3 the client learns it on the
    // first read, so the error may come from the ApiVersions exchange).
    let started = Instant::now();
    let err = Conn::connect_with(&s.mtls.addr, config(Some(tls_config(&pki.ca_pem)), None))
        .await
        .unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(5), "{err}");
    assert_eq!(err.kind(), ErrorKind::Tls, "{err}");
    assert!(err.to_string().contains("CertificateRequired"), "{err}");
    assert!(!err.is_retriable());
    assert_eq!(err.broker(), Some(s.mtls.addr.as_str()), "{err}");
}

#[tokio::test]
async fn wrong_ca_fails_fast_with_a_tls_error() {
    let s = tls_setup();
    let started = Instant::now();
    let err = Conn::connect_with(
        &s.tls.addr,
        config(Some(tls_config(&pki().other_ca_pem)), None),
    )
    .await
    .unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(2), "{err}");
    assert_eq!(err.kind(), ErrorKind::Tls, "{err}");
    assert!(!err.is_retriable());
    let text = err.to_string();
    assert!(text.contains(&s.tls.addr), "{text}");
    assert!(text.contains("UnknownIssuer"), "{text}");
}

#[tokio::test]
async fn server_name_mismatch_is_a_tls_error() {
    let s = tls_setup();
    let tls = tls_config(&pki().ca_pem).with_server_name("kafka.example.com");
    let err = Conn::connect_with(&s.tls.addr, config(Some(tls), None))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Tls, "{err}");
    assert!(err.to_string().contains("kafka.example.com"), "{err}");
    // And the name in the certificate works when dialing by IP.
    let tls = tls_config(&pki().ca_pem).with_server_name("localhost");
    Conn::connect_with(&s.tls.addr, config(Some(tls), None))
        .await
        .unwrap()
        .close()
        .await;
}

// ---------------------------------------------------------------------------------------
// SASL

fn scram256() -> Arc<dyn Mechanism> {
    Arc::new(Scram::sha256(USER256.0, USER256.1))
}

fn scram512() -> Arc<dyn Mechanism> {
    Arc::new(Scram::sha512(USER512.0, USER512.1))
}

#[tokio::test]
async fn scram_sha256_produce_and_consume() {
    let Some(s) = scram_setup() else { return };
    let conn = Conn::connect_with(&s.broker.addr, config(None, Some(scram256())))
        .await
        .unwrap();
    produce_consume(&conn, &s.topics[0], "scram256").await;
    conn.close().await;
}

#[tokio::test]
async fn scram_sha512_produce_and_consume() {
    let Some(s) = scram_setup() else { return };
    let conn = Conn::connect_with(&s.broker.addr, config(None, Some(scram512())))
        .await
        .unwrap();
    produce_consume(&conn, &s.topics[1], "scram512").await;
    conn.close().await;
}

#[tokio::test]
async fn tls_plus_scram_with_writer() {
    let Some(s) = scram_setup() else { return };
    let tls = tls_config(&pki().ca_pem);
    let topic = &s.topics[2];
    let writer = Writer::new(
        WriterConfig::new([s.tls.addr.clone()])
            .topic(topic)
            .tls(tls.clone())
            .sasl(Scram::sha512(USER512.0, USER512.1)),
    )
    .unwrap();
    writer
        .write_messages([Message::new("tls+scram-1"), Message::new("tls+scram-2")])
        .await
        .unwrap();
    drop(writer);
    let conn = Conn::connect_with(&s.tls.addr, config(Some(tls), Some(scram256())))
        .await
        .unwrap();
    assert_eq!(
        read_values(&conn, topic).await,
        ["tls+scram-1", "tls+scram-2"]
    );
    produce_consume(&conn, topic, "tls-scram-conn").await;
    conn.close().await;

    // The Reader dials the broker it discovers with the same TLS and SASL settings.
    let mut reader = Reader::new(
        ReaderConfig::new([s.tls.addr.clone()])
            .topic(topic)
            .tls(tls_config(&pki().ca_pem))
            .sasl(Scram::sha256(USER256.0, USER256.1)),
    )
    .await
    .unwrap();
    let mut got = Vec::new();
    while got.len() < 2 {
        let m = tokio::time::timeout(Duration::from_secs(20), reader.next_message())
            .await
            .expect("reader over TLS+SCRAM timed out")
            .unwrap();
        got.push(String::from_utf8_lossy(m.value.as_deref().unwrap_or_default()).to_string());
    }
    assert_eq!(got, ["tls+scram-1", "tls+scram-2"]);
    reader.close().await;
}

#[tokio::test]
async fn wrong_password_fails_fast_and_is_not_retried() {
    let Some(s) = scram_setup() else { return };
    let wrong: Arc<dyn Mechanism> = Arc::new(Scram::sha512(USER512.0, "not-the-password"));
    let started = Instant::now();
    let err = Conn::connect_with(&s.broker.addr, config(None, Some(wrong)))
        .await
        .unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(2), "{err}");
    // tansu answers the wrong proof with a SCRAM server-error (`e=invalid-proof`).
    assert_eq!(
        err.kafka_code(),
        Some(ErrorCode::SaslAuthenticationFailed),
        "{err}"
    );
    assert!(!err.is_retriable());
    let text = err.to_string();
    assert!(
        text.contains("SCRAM-SHA-512") && text.contains(&s.broker.addr),
        "{text}"
    );
    assert!(text.contains("invalid-proof"), "{text}");
    assert!(!text.contains("not-the-password"), "{text}");

    // The Writer gives up at once instead of retrying until its attempts run out.
    let writer = Writer::new(
        WriterConfig::new([s.broker.addr.clone()])
            .topic(&s.topics[3])
            .sasl(Scram::sha512(USER512.0, "not-the-password"))
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

#[tokio::test]
async fn unknown_user_fails() {
    let Some(s) = scram_setup() else { return };
    let nobody: Arc<dyn Mechanism> = Arc::new(Scram::sha256("nobody", "x"));
    let err = Conn::connect_with(&s.broker.addr, config(None, Some(nobody)))
        .await
        .unwrap_err();
    assert!(err.is_authentication(), "{err}");
}

/// tansu 0.6 does not answer UNSUPPORTED_SASL_MECHANISM with its mechanisms: it hangs up
/// (and would list only the requested one). The error names the mechanism and is final;
/// listing the offered mechanisms is covered with a scripted broker in
/// `conn::connection::auth` unit tests.
#[tokio::test]
async fn unsupported_mechanism_is_a_clear_final_error() {
    let Some(s) = scram_setup() else { return };
    let plain: Arc<dyn Mechanism> = Arc::new(Plain::new(USER256.0, USER256.1));
    let started = Instant::now();
    let err = Conn::connect_with(&s.broker.addr, config(None, Some(plain)))
        .await
        .unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(2), "{err}");
    assert!(err.is_authentication(), "{err}");
    assert!(!err.is_retriable());
    let text = err.to_string();
    assert!(
        text.contains("PLAIN") && text.contains(&s.broker.addr),
        "{text}"
    );
}

/// tansu 0.6 lists OAUTHBEARER but its authentication callback accepts only PLAIN and
/// SCRAM, so every OAUTHBEARER exchange fails there. This checks our side of that: the
/// token reaches the broker in a well-formed exchange and the failure is clear and final.
/// Successful OAUTHBEARER is covered by unit tests only.
#[tokio::test]
async fn oauthbearer_is_refused_by_tansu() {
    let Some(s) = scram_setup() else { return };
    let oauth: Arc<dyn Mechanism> = Arc::new(OAuthBearer::with_static_token(OAuthToken::new(
        "eyJhbGciOiJub25lIn0.eyJzdWIiOiJhbGljZSJ9.",
    )));
    let err = Conn::connect_with(&s.broker.addr, config(None, Some(oauth)))
        .await
        .unwrap_err();
    assert_eq!(
        err.kafka_code(),
        Some(ErrorCode::SaslAuthenticationFailed),
        "{err}"
    );
    assert!(err.to_string().contains("OAUTHBEARER"), "{err}");
    assert!(!format!("{err:?}").contains("eyJ"), "{err:?}");
}
