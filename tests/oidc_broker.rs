//! OAUTHBEARER with OIDC client credentials (KIP-768) against a real Apache Kafka broker
//! that validates real RS256 JWTs with its JWKS-based `OAuthBearerValidatorCallbackHandler`,
//! and a local identity provider (`tests/oidc/idp.py`, started by the harness in
//! `tests/common/oidc.rs`). The listener's `connections.max.reauth.ms` is 3 s, so every
//! connection here re-authenticates (KIP-368) while it lives.
#![cfg(feature = "oidc")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use futures::SinkExt;
use kafkapipe::conn::{Conn, ConnectionConfig, FetchOptions, ProduceOptions};
use kafkapipe::group::CommitMode;
use kafkapipe::protocol::ErrorCode;
use kafkapipe::reader::{Reader, ReaderConfig};
use kafkapipe::record::Record;
use kafkapipe::sasl::{ClientCredentials, OAuthBearer};
use kafkapipe::writer::{Message, Writer, WriterConfig};

use common::oidc::{OidcBroker, AUDIENCE, REAUTH_MS};

fn broker() -> &'static OidcBroker {
    static B: OnceLock<OidcBroker> = OnceLock::new();
    B.get_or_init(|| {
        let b = OidcBroker::start();
        eprintln!(
            "kafka with OIDC listener on {} (idp {})",
            b.oidc_addr, b.idp.base
        );
        b
    })
}

/// OAUTHBEARER for `client` (secret `<client>-secret`), scope `kafka`, the expected
/// audience, tokens cached.
fn oidc(client: &str) -> OAuthBearer {
    let b = broker();
    ClientCredentials::new(&b.idp.token_url(), client, format!("{client}-secret"))
        .unwrap()
        .scope("kafka")
        .audience(AUDIENCE)
        .into_mechanism()
}

fn config(m: OAuthBearer) -> ConnectionConfig {
    ConnectionConfig::new()
        .sasl(m)
        .connect_timeout(Duration::from_secs(5))
        .request_timeout(Duration::from_secs(10))
}

fn topic(prefix: &str, partitions: i32) -> String {
    let t = common::unique_topic(prefix);
    broker().create_topic(&t, partitions);
    t
}

async fn next(reader: &mut Reader) -> kafkapipe::reader::Message {
    tokio::time::timeout(Duration::from_secs(30), reader.next_message())
        .await
        .expect("reader over OIDC timed out")
        .unwrap()
}

fn group_reader(m: &OAuthBearer, group: &str, topic: &str) -> ReaderConfig {
    ReaderConfig::new([broker().oidc_addr.clone()])
        .sasl(m.clone())
        .group_id(group)
        .topic(topic)
        .commit_mode(CommitMode::Sync)
        .max_wait(Duration::from_millis(50))
        .session_timeout(Duration::from_secs(6))
        .heartbeat_interval(Duration::from_millis(300))
        .rebalance_timeout(Duration::from_secs(5))
        .join_backoff(Duration::from_millis(200))
}

/// Writer, group Reader with commits, and a second member resuming from the commit, all
/// over the OIDC listener with one cached token: the identity provider is asked once.
#[tokio::test]
async fn oidc_produce_consume_and_group_commit() {
    let b = broker();
    let t = topic("oidc-pcg", 2);
    let group = common::unique_topic("oidc-group");
    let m = oidc("kafka-client");

    let writer = Writer::new(
        WriterConfig::new([b.oidc_addr.clone()])
            .topic(&t)
            .sasl(m.clone()),
    )
    .unwrap();
    let first: Vec<Message> = (0..6)
        .map(|i| Message::keyed(format!("k{i}"), format!("v{i}")))
        .collect();
    writer.write_messages(first).await.unwrap();

    let mut reader = Reader::new(group_reader(&m, &group, &t)).await.unwrap();
    let mut committer = reader.committer().unwrap();
    let mut seen = Vec::new();
    while seen.len() < 6 {
        let msg = next(&mut reader).await;
        seen.push(String::from_utf8_lossy(msg.value.as_deref().unwrap_or_default()).into_owned());
        committer.send(&msg).await.unwrap();
    }
    seen.sort();
    assert_eq!(seen, ["v0", "v1", "v2", "v3", "v4", "v5"]);
    reader.close().await;

    writer
        .write_messages((6..9).map(|i| Message::keyed(format!("k{i}"), format!("v{i}"))))
        .await
        .unwrap();
    // The group resumes after the committed offsets: only the new three.
    let mut reader = Reader::new(group_reader(&m, &group, &t)).await.unwrap();
    let mut again = Vec::new();
    while again.len() < 3 {
        let msg = next(&mut reader).await;
        again.push(String::from_utf8_lossy(msg.value.as_deref().unwrap_or_default()).into_owned());
    }
    again.sort();
    assert_eq!(again, ["v6", "v7", "v8"]);
    reader.close().await;
    drop(writer);
    // Many connections (bootstrap, leaders, coordinator) and re-authentications every
    // ~2.5 s, one token: the cache served them all.
    assert_eq!(b.idp.issued("kafka-client"), 1, "{}", b.idp.log_text());
}

/// Refused by the broker (expired, wrong audience, signed with a key not in the JWKS) and
/// by the identity provider (wrong secret): final errors that say why.
#[tokio::test]
async fn oidc_bad_tokens_are_refused_clearly() {
    let b = broker();
    for (client, expect) in [
        ("expired", "expired"),
        ("wrong-aud", "some-other-service"),
        ("wrong-key", "kid=\"test-key-1\""),
    ] {
        let started = Instant::now();
        let err = Conn::connect_with(&b.oidc_addr, config(oidc(client)))
            .await
            .unwrap_err();
        let text = err.to_string();
        eprintln!("{client}: {text}");
        assert!(started.elapsed() < Duration::from_secs(10), "{text}");
        assert_eq!(
            err.kafka_code(),
            Some(ErrorCode::SaslAuthenticationFailed),
            "{text}"
        );
        assert!(err.is_authentication() && !err.is_retriable(), "{text}");
        assert!(
            text.contains("OAUTHBEARER") && text.contains(&b.oidc_addr),
            "{text}"
        );
        assert!(
            text.contains("invalid_token"),
            "the broker's challenge: {text}"
        );
        assert!(text.contains(expect), "{client}: {text}");
        assert!(text.contains(&format!("sub=\"{client}\"")), "{text}");
    }
    let bad_secret = ClientCredentials::new(&b.idp.token_url(), "kafka-client", "nope")
        .unwrap()
        .into_mechanism();
    let err = Conn::connect_with(&b.oidc_addr, config(bad_secret))
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(err.is_authentication() && !err.is_retriable(), "{text}");
    assert!(
        text.contains("HTTP 401") && text.contains("invalid_client"),
        "{text}"
    );
    assert!(text.contains(&b.idp.token_url()), "{text}");
    assert!(!text.contains("nope"), "{text}");
}

/// Tokens live 4 s and the broker ends sessions after at most 3 s: one connection keeps
/// producing and fetching for more than three token lifetimes, re-authenticating with
/// fresh tokens (KIP-368) instead of being closed by the broker.
#[tokio::test]
async fn oidc_connection_outlives_several_tokens() {
    let b = broker();
    let t = topic("oidc-reauth", 1);
    let conn = Conn::connect_with(&b.oidc_addr, config(oidc("short-lived")))
        .await
        .unwrap();
    let started = Instant::now();
    let mut produced = 0i64;
    let fetch = FetchOptions::default().max_wait(Duration::from_millis(10));
    while started.elapsed() < Duration::from_millis(3 * 4000 + REAUTH_MS / 2) {
        let records = [Record::new("k", format!("r{produced}"))];
        let base = conn
            .produce(&t, 0, &records, &ProduceOptions::default())
            .await
            .unwrap_or_else(|e| panic!("after {:?}: {e}", started.elapsed()));
        assert_eq!(base, produced);
        let got = conn.fetch(&t, 0, base, &fetch).await.unwrap();
        assert_eq!(got.records.len(), 1);
        produced += 1;
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let issued = b.idp.issued("short-lived");
    assert!(issued >= 3, "tokens issued: {issued}");
    conn.close().await;
}

/// The same flow configured from property maps as connector frameworks pass them:
/// librdkafka's `sasl.oauthbearer.*` keys for the Writer, the Java client's
/// `OAuthBearerLoginModule` JAAS entry for the group Reader; a wrong secret given as a
/// property is the identity provider's clear refusal.
#[tokio::test]
async fn oidc_from_property_maps() {
    use kafkapipe::config::Properties;
    let b = broker();
    let t = topic("oidc-props", 1);
    let url = b.idp.token_url();
    let group = common::unique_topic("oidc-props-g");
    let librdkafka = |id: &str, secret: &str| {
        Properties::from_pairs([
            ("bootstrap.servers", b.oidc_addr.as_str()),
            ("security.protocol", "SASL_PLAINTEXT"),
            ("sasl.mechanism", "OAUTHBEARER"),
            ("sasl.oauthbearer.method", "oidc"),
            ("sasl.oauthbearer.token.endpoint.url", url.as_str()),
            ("sasl.oauthbearer.client.id", id),
            ("sasl.oauthbearer.client.secret", secret),
            ("sasl.oauthbearer.scope", "kafka"),
        ])
        .unwrap()
    };
    // `short-lived` (4 s tokens): other tests count `kafka-client`'s tokens
    let writer = Writer::new(
        librdkafka("short-lived", "short-lived-secret")
            .writer_config()
            .unwrap()
            .topic(&t),
    )
    .unwrap();
    writer
        .write_messages((0..3).map(|i| Message::keyed(format!("k{i}"), format!("v{i}"))))
        .await
        .unwrap();

    let java = Properties::from_pairs([
        ("bootstrap.servers", b.oidc_addr.as_str()),
        ("security.protocol", "SASL_PLAINTEXT"),
        ("sasl.mechanism", "OAUTHBEARER"),
        ("sasl.oauthbearer.token.endpoint.url", url.as_str()),
        (
            "sasl.login.callback.handler.class",
            "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginCallbackHandler",
        ),
        (
            "sasl.jaas.config",
            "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required \
             clientId=\"short-lived\" clientSecret=\"short-lived-secret\" scope=\"kafka\";",
        ),
        ("group.id", group.as_str()),
        ("auto.offset.reset", "earliest"),
    ])
    .unwrap();
    let mut reader = Reader::new(
        java.reader_config()
            .unwrap()
            .topic(&t)
            .max_wait(Duration::from_millis(50)),
    )
    .await
    .unwrap();
    let mut seen = Vec::new();
    while seen.len() < 3 {
        let msg = next(&mut reader).await;
        seen.push(String::from_utf8_lossy(msg.value.as_deref().unwrap_or_default()).into_owned());
    }
    seen.sort();
    assert_eq!(seen, ["v0", "v1", "v2"]);
    reader.close().await;
    drop(writer);

    let err = Conn::connect_with(
        &b.oidc_addr,
        librdkafka("kafka-client", "nope").connection_config(),
    )
    .await
    .unwrap_err();
    let text = err.to_string();
    assert!(err.is_authentication() && !err.is_retriable(), "{text}");
    assert!(
        text.contains("invalid_client") && !text.contains("nope"),
        "{text}"
    );
}
