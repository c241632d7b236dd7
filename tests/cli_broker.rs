//! Real-broker test of the `kafkapipe` command line tool (`examples/kafkapipe.rs`): the
//! command functions run in-process, with stdin, stdout and stderr as buffers.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

#[path = "../examples/kafkapipe/cli.rs"]
#[allow(dead_code)]
mod cli;

struct Output {
    ok: Result<(), String>,
    out: String,
    err: String,
}

async fn kafkapipe(args: &[&str], stdin: &str) -> Output {
    let mut full = vec!["-b".to_string(), common::shared().addr.clone()];
    full.extend(args.iter().map(|a| a.to_string()));
    let mut input = std::io::Cursor::new(stdin.as_bytes().to_vec());
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let ok = cli::run(&full, &mut input, &mut out, &mut err).await;
    Output {
        ok,
        out: String::from_utf8(out).unwrap(),
        err: String::from_utf8(err).unwrap(),
    }
}

async fn ok(args: &[&str], stdin: &str) -> String {
    let o = kafkapipe(args, stdin).await;
    assert!(o.ok.is_ok(), "{args:?}: {:?}\n{}", o.ok, o.err);
    o.out
}

#[tokio::test]
async fn topics_produce_consume_offsets_groups() {
    let topic = common::unique_topic("cli");
    let out = ok(
        &[
            "topics",
            "create",
            &topic,
            "-p",
            "2",
            "-c",
            "retention.ms=3600000",
        ],
        "",
    )
    .await;
    assert_eq!(out, format!("created {topic}\n"));
    // Like kafka-topics.sh, `topics create` returns once the controller created the
    // topic; the broker serves it a moment later.
    let conn = kafkapipe::conn::Conn::connect(&common::shared().addr)
        .await
        .unwrap();
    common::wait_for_topic(&conn, &topic, 2).await;
    conn.close().await;
    let out = ok(&["topics", "list"], "").await;
    assert!(out.lines().any(|l| l == format!("{topic}\t2")), "{out}");
    let out = ok(&["topics", "describe", &topic], "").await;
    assert!(
        out.starts_with(&format!("topic {topic} partitions 2\n")),
        "{out}"
    );
    assert_eq!(out.matches("  partition ").count(), 2, "{out}");
    assert!(out.contains("  config retention.ms=3600000\n"), "{out}");

    // Explicit partitions, one record per line, so every broker's end offsets agree.
    let lines: Vec<String> = (0..5).map(|i| format!("key{i}:value {i}")).collect();
    for l in &lines {
        let o = kafkapipe(
            &["produce", &topic, "-k", ":", "-p", "1"],
            &format!("{l}\n"),
        )
        .await;
        assert!(o.ok.is_ok(), "{:?}", o.ok);
        assert!(o.err.contains("produced 1 records"), "{}", o.err);
    }
    let o = kafkapipe(&["produce", &topic, "-p", "0"], "plain\n").await;
    assert!(o.ok.is_ok(), "{:?}", o.ok);

    let out = ok(
        &[
            "consume",
            &topic,
            "-p",
            "1",
            "-o",
            "beginning",
            "-e",
            "-k",
            "=",
        ],
        "",
    )
    .await;
    let want: Vec<String> = (0..5).map(|i| format!("key{i}=value {i}")).collect();
    assert_eq!(out.lines().collect::<Vec<_>>(), want);

    let out = ok(
        &["consume", &topic, "-o", "beginning", "-c", "3", "-p", "1"],
        "",
    )
    .await;
    assert_eq!(out, "value 0\nvalue 1\nvalue 2\n");
    let out = ok(&["consume", &topic, "-p", "1", "-o", "-2", "-e"], "").await;
    assert_eq!(out, "value 3\nvalue 4\n");
    let out = ok(&["consume", &topic, "-o", "beginning", "-e"], "").await;
    assert_eq!(out.lines().count(), 6, "{out}");
    assert!(out.lines().any(|l| l == "plain"));
    let out = ok(&["consume", &topic, "-o", "end", "-e"], "").await;
    assert_eq!(out, "");

    let out = ok(&["offsets", &topic], "").await;
    assert_eq!(out, "0\t0\t1\n1\t0\t5\n");

    // As a group member: every record once, committed after printing.
    let member = common::unique_topic("cli-member");
    let out = ok(
        &[
            "consume",
            &topic,
            "--group",
            &member,
            "-o",
            "beginning",
            "-c",
            "6",
        ],
        "",
    )
    .await;
    assert_eq!(out.lines().count(), 6, "{out}");
    let admin = kafkapipe::admin::Admin::connect([common::shared().addr.clone()]).unwrap();
    let committed: i64 = admin
        .fetch_group_offsets(&member, Some(&[&topic]))
        .await
        .unwrap()
        .into_iter()
        .map(|(_, r)| r.unwrap().offset.max(0))
        .sum();
    assert_eq!(committed, 6);
    let o = kafkapipe(&["consume", &topic, "-g", &member, "-e"], "").await;
    assert!(o.ok.unwrap_err().contains("-e do not apply"));

    // A group with committed offsets: describe shows them with the lag.
    let group = common::unique_topic("cli-group");
    let admin = kafkapipe::admin::Admin::connect([common::shared().addr.clone()]).unwrap();
    let tp = kafkapipe::admin::TopicPartition::new(&topic, 1);
    admin
        .commit_group_offsets(&group, &[(tp, 2)])
        .await
        .unwrap()[0]
        .1
        .clone()
        .unwrap();
    let out = ok(&["groups"], "").await;
    assert!(
        out.lines().any(|l| l.starts_with(&format!("{group}\t"))),
        "{out}"
    );
    let out = ok(&["groups", "describe", &group], "").await;
    assert!(out.starts_with(&format!("group {group} state ")), "{out}");
    assert!(
        out.contains(&format!("  offset {topic} 1 committed 2 end 5 lag 3\n")),
        "{out}"
    );
    assert_eq!(
        ok(&["groups", "delete", &group], "").await,
        format!("deleted {group}\n")
    );

    let out = ok(&["cluster"], "").await;
    assert!(out.contains(&common::shared().addr), "{out}");

    let o = kafkapipe(&["topics", "describe", "no-such-topic-cli"], "").await;
    assert!(o.ok.is_err());
    assert!(o.out.contains("UnknownTopicOrPartition"), "{}", o.out);
    let o = kafkapipe(&["frobnicate"], "").await;
    assert!(o.ok.unwrap_err().contains("unknown command"));

    let out = ok(&["topics", "delete", &topic], "").await;
    assert_eq!(out, format!("deleted {topic}\n"));
}
