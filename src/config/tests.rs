use std::time::Duration;

use proptest::prelude::*;

use super::*;
use crate::conn::FetchOptions;
use crate::group::CommitMode;
use crate::reader::ReaderConfig;
use crate::writer::WriterConfig;
use crate::ErrorKind;

fn props(pairs: &[(&str, &str)]) -> Result<Properties> {
    Properties::from_pairs(pairs.iter().copied())
}

fn err(pairs: &[(&str, &str)]) -> String {
    match props(pairs) {
        Ok(p) => panic!("{pairs:?} was accepted: {p:?}"),
        Err(e) => {
            assert_eq!(e.kind(), ErrorKind::Config, "{e}");
            e.to_string()
        }
    }
}

const B: (&str, &str) = ("bootstrap.servers", "b1:9092, b2:9092");

#[test]
fn producer_settings_reach_the_writer_config() {
    let p = props(&[
        B,
        ("client.id", "billing"),
        ("acks", "1"),
        ("linger.ms", "25"),
        ("batch.size", "65536"),
        ("batch.num.messages", "500"),
        ("compression.type", "LZ4"),
        ("enable.idempotence", "true"),
        ("delivery.timeout.ms", "60000"),
        ("request.timeout.ms", "7000"),
        ("retries", "3"),
        ("retry.backoff.ms", "50"),
        ("buffer.memory", "1048576"),
        ("max.request.size", "2097152"),
        ("max.in.flight.requests.per.connection", "1"),
        ("transactional.id", "tx-1"),
        ("transaction.timeout.ms", "30000"),
        ("allow.auto.create.topics", "true"),
    ])
    .unwrap();
    let w = p.writer_config().unwrap();
    assert_eq!(w.brokers, ["b1:9092", "b2:9092"]);
    assert_eq!(w.connection.client_id, "billing");
    assert_eq!(w.required_acks, RequiredAcks::Leader);
    assert_eq!(w.batch_timeout, Duration::from_millis(25));
    assert_eq!(w.batch_bytes, 65536);
    assert_eq!(w.batch_size, 500);
    assert_eq!(w.compression, Compression::Lz4);
    assert_eq!(w.idempotent, Some(true));
    assert_eq!(w.delivery_timeout, Duration::from_secs(60));
    assert_eq!(w.connection.request_timeout, Duration::from_secs(7));
    assert_eq!(w.max_attempts, 4);
    assert_eq!(w.backoff_min, Duration::from_millis(50));
    assert!(w.backoff_max >= w.backoff_min);
    assert_eq!(w.max_buffered_bytes, 1048576);
    assert_eq!(w.max_request_bytes, 2097152);
    assert_eq!(w.max_in_flight_per_partition, 1);
    assert_eq!(w.transactional_id.as_deref(), Some("tx-1"));
    assert_eq!(w.transaction_timeout, Duration::from_secs(30));
    assert!(w.allow_auto_topic_creation);
    let c = p.connection_config();
    assert_eq!(c.request_timeout, Duration::from_secs(7));
    assert_eq!(c.max_in_flight, 1);
}

#[test]
fn consumer_settings_reach_the_reader_config() {
    let p = props(&[
        B,
        ("group.id", "g"),
        ("group.instance.id", "g-1"),
        ("group.protocol", "consumer"),
        ("group.remote.assignor", "uniform"),
        ("session.timeout.ms", "45000"),
        ("heartbeat.interval.ms", "1500"),
        ("max.poll.interval.ms", "120000"),
        ("auto.commit.interval.ms", "250"),
        ("auto.offset.reset", "latest"),
        ("client.rack", "use1-az1"),
        ("fetch.min.bytes", "10"),
        ("fetch.max.bytes", "1000000"),
        ("max.partition.fetch.bytes", "100000"),
        ("fetch.wait.max.ms", "50"),
        ("isolation.level", "read_committed"),
        ("check.crcs", "false"),
        ("request.timeout.ms", "9000"),
        ("socket.connection.setup.timeout.ms", "2500"),
    ])
    .unwrap();
    let r = p.reader_config().unwrap();
    assert_eq!(r.group_id.as_deref(), Some("g"));
    assert_eq!(r.group_instance_id.as_deref(), Some("g-1"));
    assert_eq!(r.group_protocol, GroupProtocol::Consumer);
    assert_eq!(r.group_remote_assignor.as_deref(), Some("uniform"));
    assert_eq!(r.session_timeout, Duration::from_secs(45));
    assert_eq!(r.heartbeat_interval, Duration::from_millis(1500));
    assert_eq!(r.rebalance_timeout, Duration::from_secs(120));
    assert_eq!(
        r.commit_mode,
        CommitMode::Interval(Duration::from_millis(250))
    );
    assert_eq!(r.start_offset, StartOffset::Last);
    assert_eq!(r.offset_reset, OffsetReset::Latest);
    assert_eq!(r.client_rack.as_deref(), Some("use1-az1"));
    assert_eq!(r.min_bytes, 10);
    assert_eq!(r.max_bytes, 1_000_000);
    assert_eq!(r.max_partition_bytes, 100_000);
    assert_eq!(r.max_wait, Duration::from_millis(50));
    assert_eq!(r.isolation_level, IsolationLevel::ReadCommitted);
    assert!(!r.check_crcs);
    assert_eq!(r.connection.request_timeout, Duration::from_secs(9));
    assert_eq!(r.connection.connect_timeout, Duration::from_millis(2500));
    let o = p.apply_to_fetch_options(FetchOptions::default());
    assert_eq!((o.min_bytes, o.max_bytes), (10, 100_000));
    assert_eq!(o.isolation_level, IsolationLevel::ReadCommitted);
}

#[test]
fn auto_offset_reset_names_and_assignors() {
    for (v, start, reset) in [
        ("earliest", StartOffset::First, OffsetReset::Earliest),
        ("smallest", StartOffset::First, OffsetReset::Earliest),
        ("largest", StartOffset::Last, OffsetReset::Latest),
        ("none", StartOffset::First, OffsetReset::Error),
    ] {
        let r = props(&[B, ("auto.offset.reset", v)])
            .unwrap()
            .reader_config()
            .unwrap();
        assert_eq!((r.start_offset, r.offset_reset), (start, reset), "{v}");
    }
    let r = props(&[
        B,
        (
            "partition.assignment.strategy",
            "org.apache.kafka.clients.consumer.CooperativeStickyAssignor",
        ),
    ])
    .unwrap()
    .reader_config()
    .unwrap();
    assert_eq!(r.assignors.len(), 1);
    assert!(err(&[("partition.assignment.strategy", "sticky")])
        .contains("partition.assignment.strategy"));
}

#[test]
fn unset_settings_keep_the_defaults() {
    let p = props(&[B]).unwrap();
    let (w, d) = (
        p.writer_config().unwrap(),
        WriterConfig::new(["b1:9092", "b2:9092"]),
    );
    assert_eq!(w.brokers, d.brokers);
    assert_eq!(
        (
            w.batch_timeout,
            w.batch_bytes,
            w.required_acks,
            w.connection.request_timeout,
            w.max_attempts
        ),
        (
            d.batch_timeout,
            d.batch_bytes,
            d.required_acks,
            d.connection.request_timeout,
            d.max_attempts
        )
    );
    assert_eq!(p.connection_config(), ConnectionConfig::default());
    assert!(p
        .apply_to_reader(ReaderConfig::new(["x:1"]))
        .group_id
        .is_none());
    // A config's own values stay where the properties say nothing.
    let w = p.apply_to_writer(
        WriterConfig::new(["x:1"])
            .client_id("mine")
            .connect_timeout(Duration::from_secs(2)),
    );
    assert_eq!(w.connection.client_id, "mine");
    assert_eq!(w.connection.connect_timeout, Duration::from_secs(2));
    let r = p.apply_to_reader(ReaderConfig::new(["x:1"]).client_id("mine"));
    assert_eq!(r.connection.client_id, "mine");
}

#[test]
fn later_pairs_override_earlier_ones_and_aliases_are_one_setting() {
    let p = props(&[B, ("linger.ms", "5"), ("queue.buffering.max.ms", "9")]).unwrap();
    assert_eq!(
        p.writer_config().unwrap().batch_timeout,
        Duration::from_millis(9)
    );
    let p = props(&[
        ("metadata.broker.list", "x:1"),
        ("request.required.acks", "0"),
    ])
    .unwrap();
    assert_eq!(p.bootstrap_servers(), ["x:1"]);
    assert_eq!(p.writer_config().unwrap().required_acks, RequiredAcks::None);
}

#[test]
fn unknown_and_invalid_keys_are_errors_naming_the_key() {
    assert!(err(&[("no.such.key", "1")]).contains("no.such.key"));
    assert!(err(&[("group.idd", "g")]).contains("group.idd"));
    for (k, v) in [
        ("linger.ms", "soon"),
        ("linger.ms", "-1"),
        ("batch.size", "big"),
        ("acks", "2"),
        ("request.required.acks", "all-of-them"),
        ("compression.type", "brotli"),
        ("compression.codec", "brotli"),
        ("enable.idempotence", "yes"),
        ("isolation.level", "serializable"),
        ("auto.offset.reset", "middle"),
        ("group.protocol", "share"),
        ("security.protocol", "tls"),
        ("max.in.flight.requests.per.connection", "0"),
        ("bootstrap.servers", " , "),
        ("session.timeout.ms", "1.5"),
    ] {
        let e = err(&[(k, v)]);
        assert!(e.contains(k), "{k}={v}: {e}");
    }
    assert!(props(&[])
        .unwrap()
        .reader_config()
        .unwrap_err()
        .to_string()
        .contains("bootstrap.servers"));
    assert!(props(&[]).unwrap().writer_config().is_err());
    assert!(props(&[]).unwrap().admin().is_err());
}

#[test]
fn ignored_keys_are_accepted() {
    let pairs: Vec<(&str, &str)> = IGNORED_KEYS.iter().map(|(k, _)| (*k, "anything")).collect();
    props(&pairs).unwrap();
}

#[test]
fn every_listed_key_is_read() {
    // Each key in KEYS is known to the parser: any error is about its value or its
    // context, never "unknown property".
    for (k, _) in KEYS {
        if let Err(e) = props(&[(k, "x")]) {
            assert!(!e.to_string().contains("unknown property"), "{k}: {e}");
        }
    }
}

#[test]
fn jaas_plain_and_scram_modules() {
    let j = parse_jaas(
        r#"org.apache.kafka.common.security.plain.PlainLoginModule required username="alice" password="a\"b;c";"#,
    )
    .unwrap();
    assert_eq!(
        j.module,
        "org.apache.kafka.common.security.plain.PlainLoginModule"
    );
    assert_eq!(j.options["username"], "alice");
    assert_eq!(j.options["password"], "a\"b;c");
    // Confluent Cloud's template uses single quotes.
    let j = parse_jaas(
        "org.apache.kafka.common.security.scram.ScramLoginModule required\n  username='KEY'  password='SEC=RET' ;",
    )
    .unwrap();
    assert_eq!(j.options["password"], "SEC=RET");
    for bad_jaas in [
        "PlainLoginModule required username=\"a\" password=\"b\"",
        "PlainLoginModule username=\"a\";",
        "PlainLoginModule required username;",
        "PlainLoginModule required username=\"a;",
        "PlainLoginModule required a=\"1\"; Other required;",
        ";",
    ] {
        let e = parse_jaas(bad_jaas).unwrap_err().to_string();
        assert!(e.contains("sasl.jaas.config"), "{bad_jaas}: {e}");
    }
}

#[test]
fn sasl_from_username_or_jaas() {
    let plain = "org.apache.kafka.common.security.plain.PlainLoginModule required username=\"u\" password=\"p\";";
    let scram = "org.apache.kafka.common.security.scram.ScramLoginModule required username=\"u\" password=\"p\";";
    let name = |pairs: &[(&str, &str)]| {
        props(pairs)
            .unwrap()
            .connection_config()
            .sasl
            .unwrap()
            .name()
            .to_string()
    };
    assert_eq!(
        name(&[
            ("security.protocol", "SASL_PLAINTEXT"),
            ("sasl.username", "u"),
            ("sasl.password", "p")
        ]),
        "PLAIN"
    );
    assert_eq!(
        name(&[
            ("security.protocol", "sasl_plaintext"),
            ("sasl.jaas.config", plain)
        ]),
        "PLAIN"
    );
    assert_eq!(
        name(&[
            ("security.protocol", "sasl_plaintext"),
            ("sasl.mechanism", "scram-sha-512"),
            ("sasl.jaas.config", scram)
        ]),
        "SCRAM-SHA-512"
    );
    let sp = ("security.protocol", "sasl_plaintext");
    assert!(err(&[sp, ("sasl.jaas.config", scram)]).contains("sasl.mechanism"));
    assert!(
        err(&[sp, ("sasl.mechanism", "PLAIN"), ("sasl.jaas.config", scram)])
            .contains("sasl.jaas.config")
    );
    assert!(err(&[sp, ("sasl.jaas.config", plain), ("sasl.username", "u")]).contains("not both"));
    assert!(err(&[sp, ("sasl.username", "u")]).contains("sasl.password"));
    assert!(err(&[
        sp,
        ("sasl.mechanism", "GSSAPI"),
        ("sasl.username", "u"),
        ("sasl.password", "p")
    ])
    .contains("sasl.mechanism"));
    let msk_iam = "software.amazon.msk.auth.iam.IAMLoginModule required;";
    assert!(err(&[sp, ("sasl.jaas.config", msk_iam)]).contains("IAMLoginModule"));
    // SASL settings without a SASL protocol.
    assert!(err(&[("sasl.username", "u")]).contains("security.protocol"));
}

#[test]
fn gssapi_from_kerberos_keys_or_krb5_jaas() {
    let sp = ("security.protocol", "sasl_plaintext");
    let krb5 = "com.sun.security.auth.module.Krb5LoginModule required useKeyTab=true \
                storeKey=true keyTab=\"/etc/app.keytab\" principal=\"app@EXAMPLE.COM\";";
    let keys = [
        sp,
        ("sasl.mechanism", "GSSAPI"),
        ("sasl.kerberos.service.name", "kafka-prod"),
        ("sasl.kerberos.keytab", "/etc/app.keytab"),
        ("sasl.kerberos.principal", "app@EXAMPLE.COM"),
    ];
    #[cfg(feature = "gssapi")]
    {
        for pairs in [&keys[..], &[sp, ("sasl.jaas.config", krb5)][..]] {
            let sasl = props(pairs).unwrap().connection_config().sasl.unwrap();
            assert_eq!(sasl.name(), "GSSAPI");
            let d = format!("{sasl:?}");
            assert!(
                d.contains("/etc/app.keytab") && d.contains("app@EXAMPLE.COM"),
                "{d}"
            );
        }
        let sasl = props(&keys).unwrap().connection_config().sasl.unwrap();
        assert!(format!("{sasl:?}").contains("kafka-prod"));
        // The ticket cache: no keytab, no principal.
        let cache = props(&[sp, ("sasl.mechanism", "gssapi")]).unwrap();
        assert_eq!(cache.connection_config().sasl.unwrap().name(), "GSSAPI");
    }
    #[cfg(not(feature = "gssapi"))]
    assert!(err(&keys).contains("`gssapi` cargo feature"));
    // Kerberos keys with another mechanism, or a JAAS entry that contradicts them.
    let e = err(&[
        sp,
        ("sasl.mechanism", "PLAIN"),
        ("sasl.kerberos.keytab", "/k"),
    ]);
    assert!(
        e.contains("sasl.kerberos.keytab") && e.contains("GSSAPI"),
        "{e}"
    );
    let e = err(&[
        sp,
        ("sasl.jaas.config", krb5),
        ("sasl.kerberos.principal", "other@EXAMPLE.COM"),
    ]);
    assert!(
        e.contains("sasl.jaas.config") && e.contains("contradicts"),
        "{e}"
    );
    let e = err(&[
        sp,
        (
            "sasl.jaas.config",
            "com.sun.security.auth.module.Krb5LoginModule required useKeyTab=true;",
        ),
    ]);
    assert!(e.contains("keyTab"), "{e}");
    let plain = "org.apache.kafka.common.security.plain.PlainLoginModule required username=\"u\" password=\"p\";";
    let e = err(&[
        sp,
        ("sasl.mechanism", "GSSAPI"),
        ("sasl.jaas.config", plain),
    ]);
    assert!(e.contains("Krb5LoginModule"), "{e}");
}

#[test]
fn debug_shows_no_secret() {
    let p = props(&[
        ("security.protocol", "sasl_plaintext"),
        ("sasl.username", "u"),
        ("sasl.password", "hunter2-secret"),
    ])
    .unwrap();
    let d = format!("{p:?}");
    assert!(!d.contains("hunter2-secret"), "{d}");
    let p = props(&[
        ("security.protocol", "sasl_plaintext"),
        (
            "sasl.jaas.config",
            "x.PlainLoginModule required username=\"u\" password=\"jaas-secret\";",
        ),
    ])
    .unwrap();
    assert!(!format!("{p:?}").contains("jaas-secret"));
    // A bad value of a secret is never echoed: secrets are not validated beyond presence.
    let e = err(&[("sasl.password", "pw-secret")]);
    assert!(!e.contains("pw-secret"), "{e}");
}

#[cfg(feature = "tls")]
#[test]
fn ssl_settings() {
    assert!(err(&[("ssl.ca.location", "/x.pem")]).contains("ssl.ca.location"));
    let e = err(&[
        ("security.protocol", "ssl"),
        ("ssl.ca.location", "/no/such/ca.pem"),
    ]);
    assert!(
        e.contains("ssl.ca.location") && e.contains("/no/such/ca.pem"),
        "{e}"
    );
    assert!(err(&[("security.protocol", "ssl"), ("ssl.keystore.type", "JKS")]).contains("keytool"));
    assert!(
        err(&[("security.protocol", "ssl"), ("ssl.truststore.type", "BKS")])
            .contains("ssl.truststore.type")
    );
    assert!(err(&[
        ("security.protocol", "ssl"),
        ("ssl.certificate.location", "/c.pem")
    ])
    .contains("ssl.key.location"));
    assert!(err(&[
        ("security.protocol", "ssl"),
        ("ssl.endpoint.identification.algorithm", "dns")
    ])
    .contains("ssl.endpoint.identification.algorithm"));
    assert!(
        err(&[("security.protocol", "ssl"), ("ssl.key.password", "k")])
            .contains("ssl.key.password")
    );
    let ca = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
    let pem = ca.cert.pem();
    for hostname_check in ["https", "", "none"] {
        let p = props(&[
            ("security.protocol", "SSL"),
            ("ssl.ca.pem", pem.as_str()),
            ("ssl.endpoint.identification.algorithm", hostname_check),
        ])
        .unwrap();
        assert!(p.connection_config().tls.is_some());
        assert!(p.writer_config().is_err(), "no bootstrap");
    }
    let p = props(&[
        ("security.protocol", "ssl"),
        ("ssl.ca.pem", pem.as_str()),
        ("ssl.certificate.pem", pem.as_str()),
        ("ssl.key.pem", ca.key_pair.serialize_pem().as_str()),
    ])
    .unwrap();
    assert!(!format!("{p:?}").contains("PRIVATE KEY"));
}

#[test]
fn properties_text() {
    let text = "# comment\n! also a comment\n\nbootstrap.servers = a:1,b:2\nclient.id: c1\n\
                linger.ms 7\nsasl.jaas.config=x.PlainLoginModule \\\n    required username='u' \\\n    password='p';\n\
                security.protocol=SASL_SSL\n";
    let pairs = parse_text(text).unwrap();
    assert_eq!(
        pairs,
        [
            ("bootstrap.servers".to_string(), "a:1,b:2".to_string()),
            ("client.id".into(), "c1".into()),
            ("linger.ms".into(), "7".into()),
            (
                "sasl.jaas.config".into(),
                "x.PlainLoginModule required username='u' password='p';".into()
            ),
            ("security.protocol".into(), "SASL_SSL".into()),
        ]
    );
    assert!(parse_text("a=1\\").is_err());
}

proptest! {
    /// Any key outside the known and ignored lists is refused, and the error names it.
    #[test]
    fn unknown_keys_are_named(key in "[a-z][a-z.]{0,30}") {
        prop_assume!(!KEYS.iter().chain(IGNORED_KEYS).any(|(k, _)| *k == key));
        prop_assume!(![
            "metadata.broker.list", "sasl.mechanisms", "fetch.wait.max.ms",
            "request.required.acks", "compression.codec", "queue.buffering.max.ms",
            "message.max.bytes", "message.timeout.ms", "message.send.max.retries",
            "max.in.flight",
        ].contains(&key.as_str()));
        let e = Properties::from_pairs([(key.as_str(), "1")]).unwrap_err();
        prop_assert!(e.to_string().contains(&key));
    }

    /// Millisecond settings take any u64 and nothing else.
    #[test]
    fn millis_round_trip(n in any::<u64>(), junk in "[a-z]{1,8}") {
        let p = Properties::from_pairs([("bootstrap.servers", "b:1"), ("linger.ms", &n.to_string())]).unwrap();
        prop_assert_eq!(p.writer_config().unwrap().batch_timeout, Duration::from_millis(n));
        let bad_value = format!("{n}{junk}");
        let e = Properties::from_pairs([("linger.ms", bad_value.as_str())]).unwrap_err();
        prop_assert!(e.to_string().contains("linger.ms"));
    }

    /// The JAAS parser never panics, and reads back quoted values it is given.
    #[test]
    fn jaas_round_trip(user in "[ -~]{0,20}", password in "[ -~]{0,20}", text in "[ -~]{0,60}") {
        let _ = parse_jaas(&text);
        let q = |s: &str| s.replace('\\', "\\\\").replace('"', "\\\"");
        let j = parse_jaas(&format!(
            "m.PlainLoginModule required username=\"{}\" password=\"{}\";", q(&user), q(&password)
        )).unwrap();
        prop_assert_eq!(&j.options["username"], &user);
        prop_assert_eq!(&j.options["password"], &password);
    }
}

#[test]
fn socks5_proxy_key_sets_the_dialer_everywhere() {
    let p = props(&[
        B,
        (
            "socks5.proxy",
            "socks5://al%40ice:p%3Ass@proxy.example.com:1080",
        ),
    ])
    .unwrap();
    let proxy = p
        .connection_config()
        .dialer
        .socks5_proxy()
        .cloned()
        .unwrap();
    assert_eq!(proxy.addr(), "proxy.example.com:1080");
    assert_eq!(proxy.username(), Some("al@ice"));
    assert_eq!(
        proxy,
        crate::conn::Socks5Proxy::new("proxy.example.com:1080").with_credentials("al@ice", "p:ss")
    );
    assert_eq!(
        p.reader_config().unwrap().connection.dialer,
        p.connection_config().dialer
    );
    assert_eq!(
        p.writer_config().unwrap().connection.dialer,
        p.connection_config().dialer
    );
    assert!(!format!("{p:?}").contains("p:ss"), "{p:?}");

    let bare = props(&[("socks5.proxy", "127.0.0.1:1080")]).unwrap();
    let proxy = bare
        .connection_config()
        .dialer
        .socks5_proxy()
        .cloned()
        .unwrap();
    assert_eq!((proxy.addr(), proxy.username()), ("127.0.0.1:1080", None));
    // without the key, reader and writer keep their own dialer
    let mine = crate::conn::Dialer::new().map_address("a:1", "b:1");
    let c = props(&[B])
        .unwrap()
        .apply_to_writer(WriterConfig::new(["x:1"]).dialer(mine.clone()));
    assert_eq!(c.connection.dialer, mine);

    for (v, want) in [
        ("http://proxy:8080", "scheme"),
        ("socks5://proxy", "host:port"),
        ("socks5://user@proxy:1080", "user:password@"),
        ("socks5://:pw@proxy:1080", "1 to 255 bytes"),
        ("socks5://u:%zz@proxy:1080", "percent-encoding"),
    ] {
        let e = err(&[("socks5.proxy", v)]);
        assert!(e.contains("socks5.proxy") && e.contains(want), "{v}: {e}");
    }
}

#[test]
fn oauthbearer_keys_need_the_mechanism_and_name_what_is_missing() {
    let sasl = ("security.protocol", "SASL_SSL");
    let oauth = ("sasl.mechanism", "OAUTHBEARER");
    let url = ("sasl.oauthbearer.token.endpoint.url", "https://idp/token");
    let id = ("sasl.oauthbearer.client.id", "c");
    let secret = ("sasl.oauthbearer.client.secret", "s");
    // OAuth keys with another mechanism, or without SASL
    let e = err(&[
        sasl,
        ("sasl.mechanism", "PLAIN"),
        url,
        ("sasl.username", "u"),
        ("sasl.password", "p"),
    ]);
    assert!(
        e.contains("sasl.oauthbearer.token.endpoint.url") && e.contains("OAUTHBEARER"),
        "{e}"
    );
    let e = err(&[url]);
    assert!(
        e.contains("sasl.oauthbearer.token.endpoint.url") && e.contains("security.protocol"),
        "{e}"
    );
    // what is missing is named
    let e = err(&[sasl, oauth, id, secret]);
    assert!(
        e.contains("property sasl.oauthbearer.token.endpoint.url: is required"),
        "{e}"
    );
    let e = err(&[sasl, oauth, url, secret]);
    assert!(
        e.contains("property sasl.oauthbearer.client.id: is required"),
        "{e}"
    );
    let e = err(&[sasl, oauth, url, id]);
    assert!(
        e.contains("property sasl.oauthbearer.client.secret: is required"),
        "{e}"
    );
    // unsupported forms
    let e = err(&[
        sasl,
        oauth,
        ("sasl.oauthbearer.method", "default"),
        url,
        id,
        secret,
    ]);
    assert!(
        e.contains("sasl.oauthbearer.method") && e.contains("in code"),
        "{e}"
    );
    let e = err(&[sasl, oauth, url, id, secret, ("sasl.username", "u")]);
    assert!(
        e.contains("property sasl.username: is not used by OAUTHBEARER"),
        "{e}"
    );
    let e = err(&[
        sasl,
        oauth,
        url,
        (
            "sasl.jaas.config",
            "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required \
             unsecuredLoginStringClaim_sub=\"alice\";",
        ),
    ]);
    assert!(
        e.contains("sasl.jaas.config") && e.contains("unsecuredLoginStringClaim_sub"),
        "{e}"
    );
    let e = err(&[
        sasl,
        oauth,
        url,
        id,
        secret,
        ("sasl.login.callback.handler.class", "com.example.Mine"),
    ]);
    assert!(e.contains("sasl.login.callback.handler.class"), "{e}");
    let e = err(&[
        sasl,
        oauth,
        url,
        id,
        secret,
        ("sasl.oauthbearer.extensions", "novalue"),
    ]);
    assert!(e.contains("sasl.oauthbearer.extensions"), "{e}");
    let e = err(&[
        sasl,
        oauth,
        url,
        id,
        secret,
        (
            "sasl.jaas.config",
            "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required clientId=\"c2\";",
        ),
    ]);
    assert!(
        e.contains("property sasl.oauthbearer.client.id: give the client id here"),
        "{e}"
    );
}

#[cfg(feature = "oidc")]
#[test]
fn oauthbearer_oidc_from_librdkafka_and_java_keys() {
    let librdkafka = props(&[
        B,
        ("security.protocol", "SASL_SSL"),
        ("sasl.mechanisms", "OAUTHBEARER"),
        ("sasl.oauthbearer.method", "OIDC"),
        (
            "sasl.oauthbearer.token.endpoint.url",
            "https://idp.example.com/token",
        ),
        ("sasl.oauthbearer.client.id", "my-client"),
        ("sasl.oauthbearer.client.secret", "top-secret"),
        ("sasl.oauthbearer.scope", "kafka"),
        (
            "sasl.oauthbearer.extensions",
            "logicalCluster=lkc-1,identityPoolId=pool-2",
        ),
    ])
    .unwrap();
    let m = librdkafka.connection_config().sasl.unwrap();
    assert_eq!(m.name(), "OAUTHBEARER");
    let debug = format!("{librdkafka:?}");
    assert!(!debug.contains("top-secret"), "{debug}");
    assert!(librdkafka
        .reader_config()
        .unwrap()
        .connection
        .sasl
        .is_some());

    // Java (KIP-768): the endpoint as a property, the client in the JAAS entry
    let java = props(&[
        B,
        ("security.protocol", "SASL_SSL"),
        ("sasl.mechanism", "OAUTHBEARER"),
        ("sasl.oauthbearer.token.endpoint.url", "https://idp.example.com/token"),
        (
            "sasl.login.callback.handler.class",
            "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginCallbackHandler",
        ),
        (
            "sasl.jaas.config",
            "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required \
             clientId='my-client' clientSecret='top-secret' scope='kafka' extension_logicalCluster='lkc-1';",
        ),
    ])
    .unwrap();
    assert_eq!(java.connection_config().sasl.unwrap().name(), "OAUTHBEARER");
    // the JAAS entry alone implies the mechanism; Kafka 4.1's client.credentials keys
    let implied = props(&[
        ("security.protocol", "SASL_PLAINTEXT"),
        (
            "sasl.oauthbearer.token.endpoint.url",
            "http://127.0.0.1:1/token",
        ),
        ("sasl.oauthbearer.client.credentials.client.id", "c"),
        ("sasl.oauthbearer.client.credentials.client.secret", "s"),
        (
            "sasl.jaas.config",
            "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required;",
        ),
    ])
    .unwrap();
    assert_eq!(
        implied.connection_config().sasl.unwrap().name(),
        "OAUTHBEARER"
    );
    let e = err(&[
        ("security.protocol", "SASL_SSL"),
        ("sasl.mechanism", "OAUTHBEARER"),
        ("sasl.oauthbearer.token.endpoint.url", "ftp://idp/token"),
        ("sasl.oauthbearer.client.id", "c"),
        ("sasl.oauthbearer.client.secret", "s"),
    ]);
    assert!(
        e.contains("property sasl.oauthbearer.token.endpoint.url"),
        "{e}"
    );
}

#[cfg(not(feature = "oidc"))]
#[test]
fn oauthbearer_without_the_oidc_feature_names_the_key() {
    let e = err(&[
        ("security.protocol", "SASL_SSL"),
        ("sasl.mechanism", "OAUTHBEARER"),
        ("sasl.oauthbearer.token.endpoint.url", "https://idp/token"),
        ("sasl.oauthbearer.client.id", "c"),
        ("sasl.oauthbearer.client.secret", "s"),
    ]);
    assert!(
        e.contains("property sasl.oauthbearer.token.endpoint.url")
            && e.contains("`oidc` cargo feature"),
        "{e}"
    );
}
