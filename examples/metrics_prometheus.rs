//! Prometheus metrics of a running pipeline (feature `metrics`): install
//! `metrics-exporter-prometheus` as the `metrics` recorder, serve `/metrics`, and run a
//! writer and a group reader whose counters, gauges and per-partition lag show there
//! (the list is in the `kafkapipe::metrics` module docs).
//!
//! ```sh
//! cargo run --features metrics --example metrics_prometheus -- 127.0.0.1:9092 127.0.0.1:9464
//! curl -s http://127.0.0.1:9464/metrics | grep kafka_consumer_records_lag
//! ```
//!
//! It writes 1000 messages, reads them back in a consumer group, prints a scrape excerpt
//! and then goes on serving until Ctrl-C.

use std::time::Duration;

use futures::{SinkExt, TryStreamExt};
use kafkapipe::conn::Conn;
use kafkapipe::reader::{Reader, ReaderConfig};
use kafkapipe::writer::{Message, Writer, WriterConfig};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// Serve `handle`'s exposition text on `GET /metrics` (HTTP/1.x, one response per
/// connection), forever.
pub async fn serve_metrics(listener: TcpListener, handle: PrometheusHandle) {
    loop {
        let Ok((mut sock, _)) = listener.accept().await else {
            continue;
        };
        let handle = handle.clone();
        tokio::spawn(async move {
            let mut req = Vec::new();
            let mut buf = [0u8; 1024];
            // read the request head
            while !req.windows(4).any(|w| w == b"\r\n\r\n") && req.len() < 16 * 1024 {
                match sock.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => req.extend_from_slice(&buf[..n]),
                }
            }
            let (status, body) = if req.starts_with(b"GET /metrics ") {
                ("200 OK", handle.render())
            } else {
                ("404 Not Found", String::new())
            };
            let head = format!(
                "HTTP/1.1 {status}\r\ncontent-type: text/plain; version=0.0.4\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                body.len()
            );
            let _ = sock.write_all(head.as_bytes()).await;
            let _ = sock.write_all(body.as_bytes()).await;
            let _ = sock.shutdown().await;
        });
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let broker = args.next().unwrap_or_else(|| "127.0.0.1:9092".to_string());
    let listen = args.next().unwrap_or_else(|| "127.0.0.1:9464".to_string());

    let handle = PrometheusBuilder::new().install_recorder()?;
    let listener = TcpListener::bind(&listen).await?;
    println!("serving http://{}/metrics", listener.local_addr()?);
    tokio::spawn(serve_metrics(listener, handle.clone()));

    let topic = format!("kafkapipe-metrics-example-{}", std::process::id());
    Conn::connect(&broker)
        .await?
        .create_topic(&topic, 3, 1)
        .await?;
    let mut writer = Writer::new(
        WriterConfig::new([broker.clone()])
            .topic(&topic)
            .client_id("metrics-example-writer"),
    )?;
    let messages: Vec<Message> = (0..1000)
        .map(|i| Message::new(format!("event {i}")))
        .collect();
    writer.write_messages(messages).await?;
    writer.close().await?; // futures::SinkExt::close: flush, then close

    let mut reader = Reader::new(
        ReaderConfig::new([broker])
            .group_id(format!("{topic}-group"))
            .topic(&topic)
            .client_id("metrics-example-reader")
            .metrics_interval(Duration::from_millis(200)),
    )
    .await?;
    let mut read = 0;
    while read < 1000 {
        if reader.try_next().await?.is_some() {
            read += 1;
        }
    }
    tokio::time::sleep(Duration::from_millis(500)).await; // one more collector tick
    for line in handle.render().lines() {
        if line.starts_with("kafka_consumer_records_lag")
            || line.starts_with("kafka_consumer_records_consumed_total")
            || line.starts_with("kafka_producer_record_send_total")
        {
            println!("{line}");
        }
    }
    println!("read {read} messages; serving until Ctrl-C");
    tokio::signal::ctrl_c().await?;
    reader.close().await;
    Ok(())
}
