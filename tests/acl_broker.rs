//! Authorization on a real Apache Kafka broker: KRaft's `StandardAuthorizer`, super users
//! `User:ANONYMOUS` (the PLAINTEXT listener the controller and inter-broker traffic use,
//! and the test harness) and `User:admin` (over SASL), and a SASL_PLAINTEXT listener with
//! PLAIN (admin, alice, bob) and SCRAM-SHA-256/512 (users created here through the admin
//! API). ACLs and SCRAM credentials are made with the admin API under test; the clients
//! then show what a denied Writer, Reader and group Reader see. One broker for the
//! whole binary. The `kafkapipe acls` and `kafkapipe users scram` commands are run here
//! too, as the built binary (feature `cli`), against the same broker.
#![cfg(feature = "scram")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use futures::SinkExt;
use kafkapipe::admin::{
    AclBinding, AclBindingFilter, AclOperation, AclPermissionType, Admin, PatternType,
    ResourceType, ScramCredentialAlteration, ScramMechanism,
};
use kafkapipe::cluster::Cluster;
use kafkapipe::conn::{Conn, ConnectionConfig};
use kafkapipe::group::CommitMode;
use kafkapipe::protocol::ErrorCode;
use kafkapipe::reader::{Reader, ReaderConfig, StartOffset};
use kafkapipe::sasl::{Mechanism, Plain, Scram};
use kafkapipe::writer::{Message, Writer, WriterConfig};
use kafkapipe::Error;

use common::kafka::KafkaNode;

struct AclBroker {
    node: KafkaNode,
    sasl_addr: String,
}

fn broker() -> &'static AclBroker {
    static B: OnceLock<AclBroker> = OnceLock::new();
    B.get_or_init(|| {
        let scram = "org.apache.kafka.common.security.scram.ScramLoginModule required;";
        let mut props: Vec<(String, String)> = vec![
            (
                "authorizer.class.name".into(),
                "org.apache.kafka.metadata.authorizer.StandardAuthorizer".into(),
            ),
            ("super.users".into(), "User:ANONYMOUS;User:admin".into()),
            (
                "listener.name.sasl.sasl.enabled.mechanisms".into(),
                "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512".into(),
            ),
            (
                "listener.name.sasl.plain.sasl.jaas.config".into(),
                "org.apache.kafka.common.security.plain.PlainLoginModule required \
                 user_admin=\"admin-secret\" user_alice=\"alice-secret\" \
                 user_bob=\"bob-secret\";"
                    .into(),
            ),
        ];
        for m in ["scram-sha-256", "scram-sha-512"] {
            props.push((
                format!("listener.name.sasl.{m}.sasl.jaas.config"),
                scram.into(),
            ));
        }
        let (node, addrs) =
            common::kafka::start_single("acl", &[("SASL", "SASL_PLAINTEXT")], &props, &[]);
        eprintln!("kafka with StandardAuthorizer: sasl {}", addrs[0]);
        AclBroker {
            sasl_addr: addrs[0].clone(),
            node,
        }
    })
}

fn plain(user: &str) -> Plain {
    Plain::new(user, format!("{user}-secret"))
}

fn config(m: Arc<dyn Mechanism>) -> ConnectionConfig {
    let mut c = ConnectionConfig::new()
        .connect_timeout(Duration::from_secs(5))
        .request_timeout(Duration::from_secs(10));
    c.sasl = Some(m);
    c
}

/// An admin client over SASL as `user`.
fn admin_as(user: &str) -> Admin {
    let cluster =
        Cluster::new([broker().sasl_addr.clone()], config(Arc::new(plain(user)))).unwrap();
    Admin::new(cluster).with_retries(2, Duration::from_millis(100))
}

/// The super user's admin client (`User:admin`, over SASL/PLAIN).
fn admin() -> Admin {
    admin_as("admin")
}

fn topic(prefix: &str, partitions: i32) -> String {
    let t = common::unique_topic(prefix);
    common::create_topic(&broker().node.addr, &t, partitions, 1);
    t
}

async fn grant(acls: &[AclBinding]) {
    for (b, r) in admin().create_acls(acls).await.unwrap() {
        r.unwrap_or_else(|e| panic!("creating {b}: {e}"));
    }
}

fn code(e: &Error) -> Option<ErrorCode> {
    e.kafka_code()
}

/// Create, describe (by principal, by resource), delete by filter; a non-super user is
/// refused per binding; the broker's per-binding errors come back per binding.
#[tokio::test]
async fn acl_admin_create_describe_delete() {
    let b = broker();
    let _ = b;
    let admin = admin();
    let user = format!("User:{}", common::unique_topic("acl-admin-user"));
    let t = common::unique_topic("acl-admin");
    let acls = vec![
        AclBinding::allow(ResourceType::Topic, &t, &user, AclOperation::Read),
        AclBinding::allow(
            ResourceType::Topic,
            format!("{t}-"),
            &user,
            AclOperation::Write,
        )
        .pattern_type(PatternType::Prefixed),
        AclBinding::deny(ResourceType::Group, "g", &user, AclOperation::Read).host("192.0.2.7"),
    ];
    let created = admin.create_acls(&acls).await.unwrap();
    assert_eq!(created.len(), 3);
    for (bind, r) in &created {
        assert!(r.is_ok(), "{bind}: {r:?}");
    }

    // StandardAuthorizer applies ACL changes asynchronously: describe until visible.
    let mine = AclBindingFilter::any().principal(&user);
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut seen = admin.describe_acls(&mine).await.unwrap();
    while seen.len() < 3 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
        seen = admin.describe_acls(&mine).await.unwrap();
    }
    seen.sort_by_key(|b| b.to_string());
    let mut expect = acls.clone();
    expect.sort_by_key(|b| b.to_string());
    assert_eq!(seen, expect);

    // Narrower filters.
    let topic_only = admin
        .describe_acls(&mine.clone().resource_type(ResourceType::Topic))
        .await
        .unwrap();
    assert_eq!(topic_only.len(), 2, "{topic_only:?}");
    let denies = admin
        .describe_acls(&mine.clone().permission(AclPermissionType::Deny))
        .await
        .unwrap();
    assert_eq!(denies, vec![acls[2].clone()]);

    // A non-super user without ALTER on the cluster: refused per binding, naming it.
    let refused = admin_as("bob")
        .create_acls(&[AclBinding::allow(
            ResourceType::Topic,
            "x",
            "User:bob",
            AclOperation::All,
        )])
        .await
        .unwrap();
    let e = refused[0].1.as_ref().unwrap_err();
    assert_eq!(code(e), Some(ErrorCode::ClusterAuthorizationFailed), "{e}");
    assert!(
        e.to_string()
            .contains("User:bob ALLOW ALL on TOPIC LITERAL x"),
        "{e}"
    );
    // ... and describing is refused as a whole.
    let e = admin_as("bob")
        .describe_acls(&AclBindingFilter::any())
        .await
        .unwrap_err();
    assert_eq!(code(&e), Some(ErrorCode::ClusterAuthorizationFailed), "{e}");

    // A binding that is a filter (ANY) fails alone, here, without reaching the broker
    // (which would answer UNKNOWN_SERVER_ERROR).
    let mixed = admin
        .create_acls(&[
            AclBinding::allow(ResourceType::Topic, &t, &user, AclOperation::Any),
            AclBinding::allow(ResourceType::Topic, &t, &user, AclOperation::Describe),
        ])
        .await
        .unwrap();
    let e = mixed[0].1.as_ref().unwrap_err();
    assert_eq!(e.kind(), kafkapipe::ErrorKind::Config, "{e}");
    assert!(e.to_string().contains("ALLOW ANY on TOPIC"), "{e}");
    assert!(mixed[1].1.is_ok(), "{:?}", mixed[1].1);

    // Delete the topic ACLs with one filter, the group one with its exact filter.
    let deadline = Instant::now() + Duration::from_secs(30);
    let deleted = loop {
        let d = admin
            .delete_acls(&[
                mine.clone().resource_type(ResourceType::Topic),
                acls[2].to_filter(),
            ])
            .await
            .unwrap();
        let n: usize = d
            .iter()
            .map(|(_, r)| r.as_ref().map_or(0, |v| v.len()))
            .sum();
        if n == 4 || Instant::now() >= deadline {
            break d;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let topic_deleted = deleted[0].1.as_ref().unwrap();
    assert_eq!(topic_deleted.len(), 3, "{topic_deleted:?}");
    assert!(topic_deleted.iter().all(|(_, r)| r.is_ok()));
    let group_deleted = deleted[1].1.as_ref().unwrap();
    assert_eq!(group_deleted.len(), 1);
    assert_eq!(group_deleted[0].0, acls[2]);

    let deadline = Instant::now() + Duration::from_secs(30);
    let mut left = admin.describe_acls(&mine).await.unwrap();
    while !left.is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
        left = admin.describe_acls(&mine).await.unwrap();
    }
    assert!(left.is_empty(), "{left:?}");
    admin.close().await;
}

/// Wait until `user` can authenticate with `m` (or, with `expect_ok == false`, until it
/// cannot); returns the last outcome. Credential changes reach the listener through the
/// metadata log, a moment after the admin call returns.
async fn auth_until(m: Scram, expect_ok: bool) -> Result<(), Error> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let r = match Conn::connect_with(&broker().sasl_addr, config(Arc::new(m.clone()))).await {
            Ok(c) => {
                let r = c.metadata(Some(&[])).await.map(|_| ());
                c.close().await;
                r
            }
            Err(e) => Err(e),
        };
        if r.is_ok() == expect_ok || Instant::now() >= deadline {
            return r;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Upsert SCRAM-SHA-256 and -512 credentials for a new user with the admin API, log in
/// with each; describe shows mechanism and iterations; delete one → that login fails
/// clearly, the other still works; deleting what is not there is `ResourceNotFound`.
#[tokio::test]
async fn scram_upsert_authenticate_delete() {
    let admin = admin();
    let user = common::unique_topic("carol");
    let r = admin
        .alter_user_scram_credentials(&[
            ScramCredentialAlteration::upsert(&user, ScramMechanism::Sha256, "pw-256"),
            ScramCredentialAlteration::upsert(&user, ScramMechanism::Sha512, "pw-512")
                .iterations(8192),
        ])
        .await
        .unwrap();
    // Both for one user: Kafka takes a user once per request, the client sends two.
    assert_eq!(r.len(), 1, "one result per user: {r:?}");
    assert_eq!(r[0].0, user);
    r[0].1.as_ref().unwrap();

    auth_until(Scram::sha256(&user, "pw-256"), true)
        .await
        .unwrap();
    auth_until(Scram::sha512(&user, "pw-512"), true)
        .await
        .unwrap();
    let wrong = auth_until(Scram::sha256(&user, "pw-512"), false)
        .await
        .unwrap_err();
    assert!(wrong.is_authentication(), "{wrong}");

    let described = admin
        .describe_user_scram_credentials(&[&user])
        .await
        .unwrap();
    assert_eq!(described.len(), 1);
    let mut creds = described[0].1.clone().unwrap();
    creds.sort_by_key(|c| c.mechanism.code());
    let got: Vec<(ScramMechanism, i32)> =
        creds.iter().map(|c| (c.mechanism, c.iterations)).collect();
    assert_eq!(
        got,
        [
            (ScramMechanism::Sha256, 4096),
            (ScramMechanism::Sha512, 8192)
        ]
    );

    let r = admin
        .alter_user_scram_credentials(&[ScramCredentialAlteration::delete(
            &user,
            ScramMechanism::Sha256,
        )])
        .await
        .unwrap();
    r[0].1.as_ref().unwrap();
    let e = auth_until(Scram::sha256(&user, "pw-256"), false)
        .await
        .unwrap_err();
    assert!(e.is_authentication(), "{e}");
    assert_eq!(code(&e), Some(ErrorCode::SaslAuthenticationFailed), "{e}");
    auth_until(Scram::sha512(&user, "pw-512"), true)
        .await
        .unwrap();

    // Deleting the deleted one again, and describing a user without credentials.
    let r = admin
        .alter_user_scram_credentials(&[ScramCredentialAlteration::delete(
            &user,
            ScramMechanism::Sha256,
        )])
        .await
        .unwrap();
    let e = r[0].1.as_ref().unwrap_err();
    assert_eq!(code(e), Some(ErrorCode::ResourceNotFound), "{e}");
    assert!(e.to_string().contains(&user), "{e}");
    let nobody = common::unique_topic("nobody");
    let d = admin
        .describe_user_scram_credentials(&[&nobody])
        .await
        .unwrap();
    let e = d[0].1.as_ref().unwrap_err();
    assert_eq!(code(e), Some(ErrorCode::ResourceNotFound), "{e}");

    // Iterations below Kafka's minimum: refused per user.
    let r = admin
        .alter_user_scram_credentials(&[ScramCredentialAlteration::upsert(
            &nobody,
            ScramMechanism::Sha256,
            "pw",
        )
        .iterations(100)])
        .await
        .unwrap();
    let e = r[0].1.as_ref().unwrap_err();
    assert_eq!(code(e), Some(ErrorCode::UnacceptableCredential), "{e}");

    // A non-super user may not alter credentials.
    let r = admin_as("bob")
        .alter_user_scram_credentials(&[ScramCredentialAlteration::upsert(
            "bob2",
            ScramMechanism::Sha256,
            "pw",
        )])
        .await;
    let e = match r {
        Ok(mut v) => v.remove(0).1.unwrap_err(),
        Err(e) => e,
    };
    assert_eq!(code(&e), Some(ErrorCode::ClusterAuthorizationFailed), "{e}");
    admin.close().await;
}

fn writer_config(user: &str) -> WriterConfig {
    WriterConfig::new([broker().sasl_addr.clone()])
        .sasl(plain(user))
        .batch_timeout(Duration::from_millis(5))
        // Long: a retried authorization failure would show as a hang, not an error.
        .delivery_timeout(Duration::from_secs(120))
}

/// Wait until `user` may WRITE to `topic` (ACLs apply asynchronously): a produce that
/// succeeds. Used after granting.
async fn wait_writable(user: &str, topic: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut w = Writer::new(writer_config(user).topic(topic)).unwrap();
        let r = tokio::time::timeout(
            Duration::from_secs(20),
            w.write_messages([Message::new("probe")]),
        )
        .await;
        let _ = w.close().await;
        match r {
            Ok(Ok(())) => return,
            _ if Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(200)).await,
            other => panic!("{user} never got WRITE on {topic}: {other:?}"),
        }
    }
}

/// A Writer to a topic the user may not write: a fatal `TOPIC_AUTHORIZATION_FAILED`
/// naming the topic, at once — not retried until the delivery timeout. Granting WRITE
/// (through the admin API) makes the same write succeed.
#[tokio::test]
async fn writer_denied_topic_fails_fast_naming_it() {
    let a = topic("acl-w-denied", 1);
    let b = topic("acl-w-allowed", 1);
    // alice may write b (so her idempotent producer id is granted), not a.
    grant(&[AclBinding::allow(
        ResourceType::Topic,
        &b,
        "User:alice",
        AclOperation::Write,
    )])
    .await;
    wait_writable("alice", &b).await;

    let mut writer = Writer::new(writer_config("alice").topic(&a)).unwrap();
    let started = Instant::now();
    let r = tokio::time::timeout(
        Duration::from_secs(60),
        writer.write_messages([Message::new("x"), Message::new("y")]),
    )
    .await
    .expect("a denied write must fail, not retry until the 120 s delivery timeout");
    let e = r.unwrap_err();
    eprintln!("denied write failed after {:?}: {e}", started.elapsed());
    assert_eq!(code(&e), Some(ErrorCode::TopicAuthorizationFailed), "{e}");
    assert_eq!(e.topic(), Some(a.as_str()), "{e}");
    assert!(!e.is_retriable());
    assert!(e.to_string().contains(&a), "{e}");
    let _ = writer.close().await;

    grant(&[AclBinding::allow(
        ResourceType::Topic,
        &a,
        "User:alice",
        AclOperation::Write,
    )])
    .await;
    wait_writable("alice", &a).await;
}

/// A Writer without WRITE on any topic at all: its idempotent producer id is refused
/// (`CLUSTER_AUTHORIZATION_FAILED`, Kafka wants WRITE on some topic or IDEMPOTENT_WRITE
/// on the cluster); the error says so instead of retrying.
#[tokio::test]
async fn writer_without_any_write_fails_clearly() {
    let a = topic("acl-w-none", 1);
    let mut writer = Writer::new(writer_config("bob").topic(&a)).unwrap();
    let r = tokio::time::timeout(
        Duration::from_secs(60),
        writer.write_messages([Message::new("x")]),
    )
    .await
    .expect("a denied write must fail, not retry until the delivery timeout");
    let e = r.unwrap_err();
    eprintln!("bob's write: {e}");
    assert!(
        matches!(
            code(&e),
            Some(ErrorCode::TopicAuthorizationFailed | ErrorCode::ClusterAuthorizationFailed)
        ),
        "{e}"
    );
    assert!(!e.is_retriable(), "{e}");
    let _ = writer.close().await;
}

/// One Writer to topics A (denied) and B (allowed), messages interleaved: every B
/// message is written, every A message fails naming A, and B never stalls behind A.
#[tokio::test]
async fn writer_other_topics_keep_flowing() {
    let a = topic("acl-mix-denied", 2);
    let b = topic("acl-mix-allowed", 2);
    grant(&[AclBinding::allow(
        ResourceType::Topic,
        &b,
        "User:alice",
        AclOperation::Write,
    )])
    .await;
    wait_writable("alice", &b).await;

    let mut writer = Writer::new(writer_config("alice")).unwrap();
    let n = 40;
    let sends = (0..n).map(|i| {
        let t = if i % 2 == 0 { &a } else { &b };
        writer.produce(Message::keyed(format!("k{i}"), format!("v{i}")).with_topic(t))
    });
    let outcomes = tokio::time::timeout(Duration::from_secs(60), futures::future::join_all(sends))
        .await
        .expect("all outcomes within 60 s (delivery timeout is 120 s)");
    let mut ok_b = 0;
    for (i, r) in outcomes.into_iter().enumerate() {
        if i % 2 == 0 {
            let e = r.unwrap_err();
            assert_eq!(code(&e), Some(ErrorCode::TopicAuthorizationFailed), "{e}");
            assert_eq!(e.topic(), Some(a.as_str()), "{e}");
        } else {
            r.unwrap_or_else(|e| panic!("message {i} to allowed {b}: {e}"));
            ok_b += 1;
        }
    }
    assert_eq!(ok_b, n / 2);
    // And the writer still takes more for B afterwards.
    writer
        .write_messages((0..5).map(|i| Message::new(format!("after{i}")).with_topic(&b)))
        .await
        .unwrap();
    let _ = writer.close().await;

    // Everything for B is in B (+1 probe), nothing in A.
    let admin = admin();
    let ends = admin
        .list_offsets(&[(&a, 0), (&a, 1), (&b, 0), (&b, 1)].map(|(t, p)| {
            (
                kafkapipe::admin::TopicPartition::new(t.as_str(), p),
                kafkapipe::admin::OffsetSpec::Latest,
            )
        }))
        .await
        .unwrap();
    let count = |t: &str| -> i64 {
        ends.iter()
            .filter(|(tp, _)| tp.topic == t)
            .map(|(_, r)| r.as_ref().unwrap().offset)
            .sum()
    };
    assert_eq!(count(&a), 0);
    assert_eq!(count(&b), (n / 2 + 5 + 1) as i64);
    admin.close().await;
}

fn reader_config(user: &str, topic: &str) -> ReaderConfig {
    ReaderConfig::new([broker().sasl_addr.clone()])
        .sasl(plain(user))
        .topic(topic)
        .start_offset(StartOffset::First)
        .max_wait(Duration::from_millis(50))
}

/// A Reader without READ (or DESCRIBE) on its topic: an error naming the topic, not an
/// endless wait. Granting READ makes it read.
#[tokio::test]
async fn reader_denied_topic_names_it() {
    let t = topic("acl-r-denied", 1);
    {
        let mut w = Writer::new(WriterConfig::new([broker().node.addr.clone()]).topic(&t)).unwrap();
        w.write_messages([Message::new("secret")]).await.unwrap();
        let _ = w.close().await;
    }
    let r = tokio::time::timeout(Duration::from_secs(60), async {
        let mut reader = Reader::new(reader_config("bob", &t).partition(&t, 0)).await?;
        let m = reader.next_message().await;
        reader.close().await;
        m
    })
    .await
    .expect("a denied read must fail, not wait forever");
    let e = r.unwrap_err();
    assert_eq!(code(&e), Some(ErrorCode::TopicAuthorizationFailed), "{e}");
    assert!(e.to_string().contains(&t), "{e}");

    grant(&[AclBinding::allow(
        ResourceType::Topic,
        &t,
        "User:bob",
        AclOperation::Read,
    )])
    .await;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let r = tokio::time::timeout(Duration::from_secs(20), async {
            let mut reader = Reader::new(reader_config("bob", &t).partition(&t, 0)).await?;
            let m = reader.next_message().await;
            reader.close().await;
            m
        })
        .await;
        match r {
            Ok(Ok(m)) => {
                assert_eq!(m.value.as_deref(), Some(&b"secret"[..]));
                break;
            }
            _ if Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(200)).await,
            other => panic!("bob never could read {t}: {other:?}"),
        }
    }
}

/// `group`'s committed offsets for `topic`, asked until the coordinator answers (the
/// offsets topic may only now be created: `NOT_COORDINATOR` for a moment).
async fn committed(
    admin: &Admin,
    group: &str,
    topic: &str,
) -> kafkapipe::admin::Results<kafkapipe::admin::TopicPartition, kafkapipe::admin::CommittedOffset>
{
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match admin.fetch_group_offsets(group, Some(&[topic])).await {
            Ok(v) => return v,
            Err(e) if e.is_retriable() && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(200)).await
            }
            Err(e) => panic!("offsets of {group}: {e}"),
        }
    }
}

/// A group Reader whose user may read the topic but not the group: an error naming the
/// group, and no offsets committed. Granting group READ makes it consume and commit.
#[tokio::test]
async fn group_reader_denied_group_names_it_and_commits_nothing() {
    let t = topic("acl-g", 1);
    let group = common::unique_topic("acl-group");
    {
        let mut w = Writer::new(WriterConfig::new([broker().node.addr.clone()]).topic(&t)).unwrap();
        w.write_messages((0..3).map(|i| Message::new(format!("m{i}"))))
            .await
            .unwrap();
        let _ = w.close().await;
    }
    grant(&[AclBinding::allow(
        ResourceType::Topic,
        &t,
        "User:alice",
        AclOperation::Read,
    )])
    .await;
    let group_cfg = || {
        ReaderConfig::new([broker().sasl_addr.clone()])
            .sasl(plain("alice"))
            .topic(&t)
            .group_id(&group)
            .commit_mode(CommitMode::Sync)
            .max_wait(Duration::from_millis(50))
            .session_timeout(Duration::from_secs(6))
            .heartbeat_interval(Duration::from_millis(300))
            .rebalance_timeout(Duration::from_secs(5))
            .join_backoff(Duration::from_millis(200))
    };
    let r = tokio::time::timeout(Duration::from_secs(60), async {
        let mut reader = Reader::new(group_cfg()).await?;
        let m = reader.next_message().await;
        reader.close().await;
        m
    })
    .await
    .expect("a denied group must fail, not wait forever");
    let e = r.unwrap_err();
    assert_eq!(code(&e), Some(ErrorCode::GroupAuthorizationFailed), "{e}");
    assert!(e.to_string().contains(&group), "{e}");

    let admin = admin();
    let offsets = committed(&admin, &group, &t).await;
    assert!(
        offsets
            .iter()
            .all(|(_, r)| r.as_ref().map_or(true, |o| o.offset < 0)),
        "{offsets:?}"
    );

    grant(&[AclBinding::allow(
        ResourceType::Group,
        &group,
        "User:alice",
        AclOperation::Read,
    )])
    .await;
    let deadline = Instant::now() + Duration::from_secs(45);
    let mut got = Vec::new();
    while got.len() < 3 {
        let r = tokio::time::timeout(Duration::from_secs(30), async {
            let mut reader = Reader::new(group_cfg()).await?;
            let mut committer = reader
                .committer()
                .ok_or_else(|| Error::config("no committer"))?;
            let mut vals = Vec::new();
            while vals.len() < 3 {
                let m = reader.next_message().await?;
                vals.push(
                    String::from_utf8_lossy(m.value.as_deref().unwrap_or_default()).into_owned(),
                );
                committer.send(&m).await?;
            }
            reader.close().await;
            Ok::<_, Error>(vals)
        })
        .await;
        match r {
            Ok(Ok(v)) => got = v,
            _ if Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(200)).await,
            other => panic!("alice never could consume as {group}: {other:?}"),
        }
    }
    assert_eq!(got, ["m0", "m1", "m2"]);
    let offsets = committed(&admin, &group, &t).await;
    assert_eq!(offsets[0].1.as_ref().unwrap().offset, 3, "{offsets:?}");
    admin.close().await;
}

/// The `kafkapipe` binary's `acls` and `users scram` commands, run as a user runs them.
#[cfg(feature = "cli")]
mod cli {
    use super::*;
    use std::io::Write;
    use std::process::{Command, Stdio};

    struct Run {
        code: Option<i32>,
        out: String,
        err: String,
    }

    /// `kafkapipe -b SASL -X <SASL/PLAIN as user> ARGS` with `stdin`.
    fn run_as(user: &str, args: &[&str], stdin: &str) -> Run {
        let b = broker();
        let mut all: Vec<String> = vec![
            "-b".into(),
            b.sasl_addr.clone(),
            "-X".into(),
            "security.protocol=sasl_plaintext".into(),
            "-X".into(),
            "sasl.mechanism=PLAIN".into(),
            "-X".into(),
            format!("sasl.username={user}"),
            "-X".into(),
            format!("sasl.password={user}-secret"),
        ];
        all.extend(args.iter().map(|a| a.to_string()));
        let mut child = Command::new(env!("CARGO_BIN_EXE_kafkapipe"))
            .args(&all)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(stdin.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        Run {
            code: out.status.code(),
            out: String::from_utf8_lossy(&out.stdout).into_owned(),
            err: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    fn ok(args: &[&str], stdin: &str) -> String {
        let r = run_as("admin", args, stdin);
        assert_eq!(r.code, Some(0), "kafkapipe {args:?}: {}{}", r.out, r.err);
        r.out
    }

    /// Repeat `args` until stdout satisfies `done` (ACL changes apply asynchronously).
    fn until(args: &[&str], done: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let out = ok(args, "");
            if done(&out) || Instant::now() >= deadline {
                return out;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    #[test]
    fn cli_acls_create_list_delete() {
        let principal = format!("User:{}", common::unique_topic("cli-acl"));
        let t = common::unique_topic("cli-acl-topic");
        let out = ok(
            &[
                "acls",
                "create",
                "--resource-type",
                "topic",
                "--resource",
                &t,
                "--principal",
                &principal,
                "--operation",
                "read",
                "--operation",
                "describe",
            ],
            "",
        );
        assert_eq!(out.lines().count(), 2, "{out}");
        assert!(
            out.contains(&format!(
                "created\tTOPIC\tLITERAL\t{t}\t{principal}\t*\tREAD\tALLOW"
            )),
            "{out}"
        );

        let listed = until(&["acls", "list", "--principal", &principal], |o| {
            o.lines().count() == 2
        });
        assert_eq!(
            listed,
            format!(
                "TOPIC\tLITERAL\t{t}\t{principal}\t*\tDESCRIBE\tALLOW\n\
                 TOPIC\tLITERAL\t{t}\t{principal}\t*\tREAD\tALLOW\n"
            )
        );

        // Usage errors: exit 2, naming the bad value / the missing --all.
        let r = run_as("admin", &["acls", "list", "--operation", "reed"], "");
        assert_eq!(r.code, Some(2), "{}", r.err);
        assert!(
            r.err.contains("reed") && r.err.contains("READ"),
            "{}",
            r.err
        );
        let r = run_as("admin", &["acls", "delete"], "");
        assert_eq!(r.code, Some(2), "{}", r.err);
        assert!(r.err.contains("--all"), "{}", r.err);

        // A user without ALTER on the cluster: exit 1, the broker's refusal on stderr.
        let r = run_as(
            "bob",
            &[
                "acls",
                "create",
                "--resource-type",
                "topic",
                "--resource",
                &t,
                "--principal",
                "User:bob",
                "--operation",
                "all",
            ],
            "",
        );
        assert_eq!(r.code, Some(1), "{}{}", r.out, r.err);
        assert!(r.err.contains("cluster authorization failed"), "{}", r.err);

        let deleted = until(
            &[
                "acls",
                "delete",
                "--principal",
                &principal,
                "--operation",
                "read",
            ],
            |o| o.lines().count() == 1,
        );
        assert_eq!(
            deleted,
            format!("deleted\tTOPIC\tLITERAL\t{t}\t{principal}\t*\tREAD\tALLOW\n")
        );
        let left = until(&["acls", "list", "--principal", &principal], |o| {
            o.lines().count() == 1
        });
        assert_eq!(
            left,
            format!("TOPIC\tLITERAL\t{t}\t{principal}\t*\tDESCRIBE\tALLOW\n")
        );
        ok(&["acls", "delete", "--principal", &principal], "");
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn cli_users_scram_upsert_describe_delete() {
        let user = common::unique_topic("cli-scram");
        let out = ok(
            &[
                "users",
                "scram",
                "upsert",
                &user,
                "--mechanism",
                "SCRAM-SHA-512",
                "--iterations",
                "8192",
                "--password-stdin",
            ],
            "cli-pw\n",
        );
        assert_eq!(out, format!("upserted\t{user}\tSCRAM-SHA-512\n"));
        let described = ok(&["users", "scram", "describe", &user], "");
        assert_eq!(described, format!("{user}\tSCRAM-SHA-512\t8192\n"));
        auth_until(Scram::sha512(&user, "cli-pw"), true)
            .await
            .unwrap();

        let out = ok(&["users", "scram", "delete", &user], "");
        assert_eq!(out, format!("deleted\t{user}\tSCRAM-SHA-512\n"));
        let e = auth_until(Scram::sha512(&user, "cli-pw"), false)
            .await
            .unwrap_err();
        assert!(e.is_authentication(), "{e}");

        let r = run_as("admin", &["users", "scram", "describe", &user], "");
        assert_eq!(r.code, Some(1), "{}{}", r.out, r.err);
        assert!(r.err.contains(&user), "{}", r.err);
        let r = run_as("admin", &["users", "scram", "upsert", &user], "");
        assert_eq!(r.code, Some(2), "a password is required: {}", r.err);
    }
}
