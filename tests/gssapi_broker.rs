//! SASL GSSAPI (Kerberos) against a real Apache Kafka GSSAPI listener and a real MIT KDC
//! started by the harness (`tests/common/kdc.rs`): the broker's principal is
//! `kafka/localhost@KAFKAPIPE.TEST`, each client has its own principal and keytab.
//!
//! Needs the MIT KDC tools and `libkrb5-dev` (scripts/lib/kafka.sh `krb5_ensure`, run by
//! scripts/test.sh). Without the tools the tests are skipped, except with `CI=true`,
//! where they fail.
#![cfg(feature = "gssapi")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use futures::SinkExt;
use kafkapipe::config::Properties;
use kafkapipe::conn::{Conn, ConnectionConfig, FetchOptions, ProduceOptions};
use kafkapipe::group::CommitMode;
use kafkapipe::reader::{Reader, ReaderConfig};
use kafkapipe::record::Record;
use kafkapipe::sasl::Gssapi;
use kafkapipe::writer::{Message, Writer, WriterConfig};

use common::kdc::{tools_present, GssapiBroker, REALM, REAUTH_MS};

struct Setup {
    broker: GssapiBroker,
    /// Keytab of `client@REALM`.
    client_keytab: PathBuf,
    /// Keytab of `other@REALM`.
    other_keytab: PathBuf,
    /// Keytab of `ghost@REALM`, a principal deleted from the KDC after the export.
    ghost_keytab: PathBuf,
}

/// The KDC and broker, or `None` (skip) when the Kerberos tools are missing outside CI.
fn setup() -> Option<&'static Setup> {
    static S: OnceLock<Option<Setup>> = OnceLock::new();
    S.get_or_init(|| {
        if !tools_present() {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "the MIT Kerberos tools (krb5kdc, kdb5_util, kadmin.local) are missing: \
                 run scripts/test.sh, whose krb5_ensure installs them"
            );
            eprintln!("skipping: MIT Kerberos KDC tools not installed");
            return None;
        }
        let broker = GssapiBroker::start();
        let client_keytab = broker.kdc.add_principal("client", "client");
        let other_keytab = broker.kdc.add_principal("other", "other");
        let ghost_keytab = broker.kdc.add_principal("ghost", "ghost");
        broker.kdc.delete_principal("ghost");
        eprintln!(
            "kafka with GSSAPI listener on {} (KDC in {})",
            broker.gssapi_addr,
            broker.kdc.dir.display()
        );
        Some(Setup {
            broker,
            client_keytab,
            other_keytab,
            ghost_keytab,
        })
    })
    .as_ref()
}

fn client(s: &Setup) -> Gssapi {
    Gssapi::new()
        .principal(format!("client@{REALM}"))
        .keytab(&s.client_keytab)
}

fn config(m: Gssapi) -> ConnectionConfig {
    ConnectionConfig::new()
        .sasl(m)
        .connect_timeout(Duration::from_secs(5))
        .request_timeout(Duration::from_secs(15))
}

async fn next(reader: &mut Reader) -> String {
    let m = tokio::time::timeout(Duration::from_secs(30), reader.next_message())
        .await
        .expect("reader over GSSAPI timed out")
        .unwrap();
    String::from_utf8_lossy(m.value.as_deref().unwrap_or_default()).into_owned()
}

/// Writer, group Reader with commits, and a second member resuming from the commit, all
/// over the GSSAPI listener (bootstrap, partition leader and group coordinator
/// connections each run the Kerberos exchange).
#[tokio::test]
async fn gssapi_produce_consume_and_group_commit() {
    common::init_log();
    let Some(s) = setup() else { return };
    let t = common::unique_topic("gssapi-pcg");
    s.broker.create_topic(&t, 2);
    let group = common::unique_topic("gssapi-group");
    let m = client(s);

    let writer = Writer::new(
        WriterConfig::new([s.broker.gssapi_addr.clone()])
            .topic(&t)
            .sasl(m.clone()),
    )
    .unwrap();
    writer
        .write_messages((0..6).map(|i| Message::keyed(format!("k{i}"), format!("v{i}"))))
        .await
        .unwrap();

    let group_reader = || {
        ReaderConfig::new([s.broker.gssapi_addr.clone()])
            .sasl(m.clone())
            .group_id(&group)
            .topic(&t)
            .commit_mode(CommitMode::Sync)
            .max_wait(Duration::from_millis(50))
            .session_timeout(Duration::from_secs(6))
            .heartbeat_interval(Duration::from_millis(300))
            .rebalance_timeout(Duration::from_secs(5))
            .join_backoff(Duration::from_millis(200))
    };
    let mut reader = Reader::new(group_reader()).await.unwrap();
    let mut committer = reader.committer().unwrap();
    let mut seen = Vec::new();
    while seen.len() < 6 {
        let msg = tokio::time::timeout(Duration::from_secs(30), reader.next_message())
            .await
            .expect("group reader over GSSAPI timed out")
            .unwrap();
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
    let mut reader = Reader::new(group_reader()).await.unwrap();
    let mut again = Vec::new();
    while again.len() < 3 {
        again.push(next(&mut reader).await);
    }
    again.sort();
    assert_eq!(
        again,
        ["v6", "v7", "v8"],
        "the group resumes after its commit"
    );
    reader.close().await;
    drop(writer);
    // The KDC issued the client's service ticket for the broker.
    let kdc_log = s.broker.kdc.log_text();
    assert!(
        kdc_log.contains(&format!("client@{REALM} for kafka/localhost@{REALM}")),
        "the KDC issued client a ticket for the broker: {kdc_log}"
    );
}

/// The same client built from librdkafka property names, and from a Java
/// `Krb5LoginModule` JAAS line.
#[tokio::test]
async fn gssapi_from_properties_and_jaas() {
    let Some(s) = setup() else { return };
    let t = common::unique_topic("gssapi-props");
    s.broker.create_topic(&t, 1);
    let keytab = s.client_keytab.display().to_string();
    let principal = format!("client@{REALM}");
    let jaas = format!(
        "com.sun.security.auth.module.Krb5LoginModule required useKeyTab=true \
         storeKey=true keyTab=\"{keytab}\" principal=\"{principal}\";"
    );
    let sets: [Vec<(&str, &str)>; 2] = [
        vec![
            ("sasl.kerberos.keytab", keytab.as_str()),
            ("sasl.kerberos.principal", principal.as_str()),
        ],
        vec![("sasl.jaas.config", jaas.as_str())],
    ];
    for (i, set) in sets.into_iter().enumerate() {
        let mut props = vec![
            ("bootstrap.servers", s.broker.gssapi_addr.as_str()),
            ("security.protocol", "SASL_PLAINTEXT"),
            ("sasl.mechanism", "GSSAPI"),
            ("sasl.kerberos.service.name", "kafka"),
        ];
        props.extend(set);
        let p = Properties::from_pairs(props).unwrap();
        let writer = Writer::new(p.writer_config().unwrap().topic(&t)).unwrap();
        writer
            .write_messages([Message::new(format!("p{i}"))])
            .await
            .unwrap();
    }
    let mut reader = Reader::new(
        ReaderConfig::new([s.broker.gssapi_addr.clone()])
            .sasl(client(s))
            .partition(&t, 0)
            .max_wait(Duration::from_millis(50)),
    )
    .await
    .unwrap();
    assert_eq!(next(&mut reader).await, "p0");
    assert_eq!(next(&mut reader).await, "p1");
    reader.close().await;
}

/// A principal the KDC does not know, a keytab without the principal's key, and a wrong
/// service name: final authentication errors naming the principal, keytab or service.
#[tokio::test]
async fn gssapi_bad_credentials_fail_clearly() {
    let Some(s) = setup() else { return };
    let addr = &s.broker.gssapi_addr;

    let ghost = Gssapi::new()
        .principal(format!("ghost@{REALM}"))
        .keytab(&s.ghost_keytab);
    let err = Conn::connect_with(addr, config(ghost)).await.unwrap_err();
    let text = err.to_string();
    eprintln!("unknown principal: {text}");
    assert!(err.is_authentication() && !err.is_retriable(), "{text}");
    assert!(text.contains(&format!("ghost@{REALM}")), "{text}");
    assert!(text.contains("not found in Kerberos database"), "{text}");

    let wrong_keytab = Gssapi::new()
        .principal(format!("client@{REALM}"))
        .keytab(&s.other_keytab);
    let err = Conn::connect_with(addr, config(wrong_keytab))
        .await
        .unwrap_err();
    let text = err.to_string();
    eprintln!("wrong keytab: {text}");
    assert!(err.is_authentication() && !err.is_retriable(), "{text}");
    assert!(text.contains(&format!("client@{REALM}")), "{text}");
    assert!(
        text.contains(&s.other_keytab.display().to_string()),
        "{text}"
    );

    let wrong_service = client(s).service_name("not-kafka");
    let err = Conn::connect_with(addr, config(wrong_service))
        .await
        .unwrap_err();
    let text = err.to_string();
    eprintln!("wrong service name: {text}");
    assert!(err.is_authentication() && !err.is_retriable(), "{text}");
    assert!(text.contains("not-kafka/localhost"), "{text}");
    assert!(
        text.contains("sasl.kerberos.service.name=not-kafka"),
        "{text}"
    );

    // And the right settings connect.
    let conn = Conn::connect_with(addr, config(client(s))).await.unwrap();
    conn.close().await;
}

/// The broker ends GSSAPI sessions after [`REAUTH_MS`]: one connection keeps producing
/// and fetching through more than two session lifetimes, re-authenticating in place
/// (KIP-368) with a new Kerberos exchange instead of being closed by the broker.
#[tokio::test]
async fn gssapi_connection_reauthenticates() {
    common::init_log();
    let Some(s) = setup() else { return };
    let t = common::unique_topic("gssapi-reauth");
    s.broker.create_topic(&t, 1);
    let conn = Conn::connect_with(&s.broker.gssapi_addr, config(client(s)))
        .await
        .unwrap();
    let fetch = FetchOptions::default().max_wait(Duration::from_millis(10));
    let started = Instant::now();
    let mut produced = 0i64;
    while started.elapsed() < Duration::from_millis(2 * REAUTH_MS + REAUTH_MS / 2) {
        let records = [Record::new("k", format!("r{produced}"))];
        let base = conn
            .produce(&t, 0, &records, &ProduceOptions::default())
            .await
            .unwrap_or_else(|e| panic!("after {:?}: {e}", started.elapsed()));
        assert_eq!(base, produced);
        let got = conn.fetch(&t, 0, base, &fetch).await.unwrap();
        assert_eq!(got.records.len(), 1);
        produced += 1;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    conn.close().await;
}
