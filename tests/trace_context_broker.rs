//! Feature `trace-context` against Apache Kafka: the W3C trace context a producer puts in
//! a message's `traceparent` header comes out of `reader::Message::trace_context` — from
//! our `Writer` and from librdkafka (confluent-kafka, the header set as a plain header, as
//! its OpenTelemetry instrumentation does).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::process::Command;
use std::time::Duration;

use futures::{SinkExt, TryStreamExt};
use kafkapipe::reader::{Reader, ReaderConfig, StartOffset};
use kafkapipe::trace_context::TraceContext;
use kafkapipe::writer::{Message, Writer, WriterConfig};

/// Read `n` messages of `topic` from the start, with a deadline.
async fn read(topic: &str, n: usize) -> Vec<kafkapipe::reader::Message> {
    let mut reader = Reader::new(
        ReaderConfig::new([common::shared().addr.clone()])
            .topic(topic)
            .start_offset(StartOffset::First),
    )
    .await
    .unwrap();
    let mut out = Vec::new();
    while out.len() < n {
        let m = tokio::time::timeout(Duration::from_secs(30), reader.try_next())
            .await
            .expect("a message within 30 s")
            .unwrap();
        out.extend(m);
    }
    reader.close().await;
    out
}

#[tokio::test]
async fn the_trace_id_set_on_produce_comes_out_on_consume() {
    let topic = common::unique_topic("trace-context");
    common::create_topic(&common::shared().addr, &topic, 1, 1);
    let cx =
        TraceContext::parse("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01").unwrap();
    let other = TraceContext::new([0xab; 16], [0xcd; 8], 0).unwrap();
    let mut writer =
        Writer::new(WriterConfig::new([common::shared().addr.clone()]).topic(&topic)).unwrap();
    writer
        .write_messages([
            Message::new("traced").with_trace_context(&cx),
            Message::new("untraced"),
            // a context set twice: the last one wins, one header
            Message::new("retraced")
                .with_trace_context(&cx)
                .with_trace_context(&other),
        ])
        .await
        .unwrap();
    writer.close().await.unwrap();
    let got = read(&topic, 3).await;
    assert_eq!(got[0].trace_context(), Some(cx));
    assert_eq!(
        got[0].trace_context().unwrap().trace_id_hex(),
        "0af7651916cd43dd8448eb211c80319c"
    );
    assert_eq!(got[1].trace_context(), None);
    assert_eq!(got[2].trace_context(), Some(other));
    assert_eq!(got[2].headers.len(), 1);
    assert!(!got[2].trace_context().unwrap().sampled());
}

#[tokio::test]
async fn a_librdkafka_producers_traceparent_is_read_the_same_way() {
    let topic = common::unique_topic("trace-context-rdkafka");
    common::create_topic(&common::shared().addr, &topic, 1, 1);
    let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let out = Command::new(std::env::var("PYTHON").unwrap_or_else(|_| "python3".into()))
        .arg(format!(
            "{}/tests/interop/produce.py",
            env!("CARGO_MANIFEST_DIR")
        ))
        .args(["--broker", &common::shared().addr, "--topic", &topic])
        .args(["--count", "3", "--partition", "0"])
        .args(["--header", &format!("traceparent={traceparent}")])
        .output()
        .expect("run produce.py");
    assert!(
        out.status.success(),
        "librdkafka producer failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got = read(&topic, 3).await;
    for m in &got {
        let cx = m.trace_context().expect("a trace context");
        assert_eq!(cx.trace_id_hex(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(cx.span_id_hex(), "00f067aa0ba902b7");
        assert!(cx.sampled());
        assert_eq!(cx.to_string(), traceparent);
    }
}
