//! An OIDC identity provider (`tests/oidc/idp.py`: token endpoint + JWKS signing real
//! RS256 JWTs, Python with the `cryptography` wheel) and a broker whose `OIDC` listener
//! (SASL_PLAINTEXT, OAUTHBEARER) validates tokens with Kafka's JWKS-based
//! `OAuthBearerValidatorCallbackHandler`.
//!
//! Broker settings (Kafka 4.1 names): `sasl.oauthbearer.jwt.validator.class` =
//! `BrokerJwtValidator` (see below), `sasl.oauthbearer.jwks.endpoint.url`,
//! `sasl.oauthbearer.expected.audience`, `sasl.oauthbearer.expected.issuer`, and the
//! listener's `oauthbearer.connections.max.reauth.ms` (KIP-368), here
//! [`REAUTH_MS`]. Kafka 4.x fetches only URLs listed in the JVM system property
//! `org.apache.kafka.sasl.oauthbearer.allowed.urls`.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::kafka::{start_single, KafkaNode};
use super::{free_port, temp_dir, Watched};

/// The broker closes a session after this long unless the client re-authenticates.
pub const REAUTH_MS: u64 = 3000;

/// The audience the broker expects.
pub const AUDIENCE: &str = "kafka-broker";

/// The identity provider process.
pub struct Idp {
    /// `http://127.0.0.1:PORT`, also the tokens' `iss`.
    pub base: String,
    process: Watched,
}

impl Idp {
    /// Starts the identity provider and waits until it serves its JWKS.
    pub fn start() -> Idp {
        let port = free_port();
        let dir = temp_dir("idp");
        std::fs::create_dir_all(&dir).unwrap();
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/oidc/idp.py");
        let script = script.display().to_string();
        let port_arg = port.to_string();
        let mut process = Watched::spawn(
            "python3",
            &["-u", &script, &port_arg],
            &dir,
            dir.join("idp.log"),
        );
        let addr = format!("127.0.0.1:{port}");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if get(&addr, "/jwks").is_some_and(|b| b.contains("\"keys\"")) {
                break;
            }
            assert!(
                !process.exited(),
                "identity provider exited (is the `cryptography` wheel installed?): {}",
                process.log_text()
            );
            assert!(
                Instant::now() < deadline,
                "identity provider not ready: {}",
                process.log_text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Idp {
            base: format!("http://{addr}"),
            process,
        }
    }

    /// The token endpoint URL.
    pub fn token_url(&self) -> String {
        format!("{}/token", self.base)
    }

    /// How many tokens the IdP issued to `client`.
    pub fn issued(&self, client: &str) -> u64 {
        let addr = self.base.trim_start_matches("http://");
        let body = get(addr, "/stats").expect("idp /stats");
        let stats: serde_json::Value = serde_json::from_str(&body).expect("stats JSON");
        stats.get(client).and_then(|v| v.as_u64()).unwrap_or(0)
    }

    /// The IdP's log.
    pub fn log_text(&self) -> String {
        self.process.log_text()
    }
}

/// A blocking `GET` of `path` on `addr`; the body, if the answer was 200.
fn get(addr: &str, path: &str) -> Option<String> {
    let mut s = TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let (head, body) = text.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.1 200").then(|| body.to_string())
}

/// The identity provider and a broker validating its tokens.
pub struct OidcBroker {
    /// The PLAINTEXT listener (topic creation).
    pub addr: String,
    /// SASL_PLAINTEXT with OAUTHBEARER validated against the IdP's JWKS.
    pub oidc_addr: String,
    /// The identity provider.
    pub idp: Idp,
    /// The broker.
    pub node: KafkaNode,
}

impl OidcBroker {
    /// Starts the IdP, then the broker (which loads the JWKS at startup).
    pub fn start() -> OidcBroker {
        let idp = Idp::start();
        let jwks = format!("{}/jwks", idp.base);
        let props: Vec<(String, String)> = [
            (
                "listener.name.oidc.sasl.enabled.mechanisms",
                "OAUTHBEARER".to_string(),
            ),
            (
                "listener.name.oidc.oauthbearer.sasl.jaas.config",
                "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required;"
                    .to_string(),
            ),
            (
                "listener.name.oidc.oauthbearer.sasl.server.callback.handler.class",
                "org.apache.kafka.common.security.oauthbearer.OAuthBearerValidatorCallbackHandler"
                    .to_string(),
            ),
            (
                "listener.name.oidc.oauthbearer.connections.max.reauth.ms",
                REAUTH_MS.to_string(),
            ),
            // Kafka 4.1.1's default `DefaultJwtValidator`, as the handler instantiates
            // it, falls back to `ClientJwtValidator`, which checks neither signature nor
            // expiry (an expired token was accepted here): name the broker validator.
            (
                "sasl.oauthbearer.jwt.validator.class",
                "org.apache.kafka.common.security.oauthbearer.BrokerJwtValidator".to_string(),
            ),
            ("sasl.oauthbearer.jwks.endpoint.url", jwks.clone()),
            ("sasl.oauthbearer.expected.audience", AUDIENCE.to_string()),
            ("sasl.oauthbearer.expected.issuer", idp.base.clone()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        let jvm = [format!(
            "-Dorg.apache.kafka.sasl.oauthbearer.allowed.urls={jwks}"
        )];
        let (node, addrs) = start_single("kafka-oidc", &[("OIDC", "SASL_PLAINTEXT")], &props, &jvm);
        OidcBroker {
            addr: node.addr.clone(),
            oidc_addr: addrs[0].clone(),
            idp,
            node,
        }
    }

    /// Creates `name` and waits for its leaders.
    pub fn create_topic(&self, name: &str, partitions: i32) {
        super::create_topic(&self.addr, name, partitions, 1);
    }
}
