//! The dial hook (`kafkapipe::conn::Dialer`) against a real Apache Kafka broker that
//! advertises an address nobody can reach (`kafka-1.kafkapipe.invalid:9092`): an address
//! map makes Writer → Reader (consumer group, commits) work through it, and a custom
//! connector, or a real SOCKS5 proxy (Debian's `microsocks` on loopback), sees every
//! connection the client makes. With `CI=true` a missing `microsocks` fails the SOCKS5
//! tests instead of skipping them (`scripts/lib/socks.sh` installs it).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::BTreeMap;
use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use futures::SinkExt;
use kafkapipe::admin::Admin;
use kafkapipe::cluster::Cluster;
use kafkapipe::conn::{BoxedBrokerStream, Conn, ConnectionConfig, Connector, Dialer, Socks5Proxy};
use kafkapipe::group::CommitMode;
use kafkapipe::reader::{Reader, ReaderConfig};
use kafkapipe::writer::{Message, Writer, WriterConfig};
use kafkapipe::ErrorKind;

/// What the test broker advertises in Metadata: a name that does not resolve.
const ADVERTISED: &str = "kafka-1.kafkapipe.invalid:9092";

/// This binary's broker, advertising [`ADVERTISED`]; `addr` is where it really listens.
fn broker() -> &'static common::TestBroker {
    static BROKER: OnceLock<common::TestBroker> = OnceLock::new();
    BROKER.get_or_init(|| common::TestBroker::start_advertised(ADVERTISED))
}

async fn topic(prefix: &str, partitions: i32) -> String {
    let t = common::unique_topic(prefix);
    tokio::task::spawn_blocking(move || {
        broker().create_topic(&t, partitions);
        t
    })
    .await
    .unwrap()
}

/// Writes `n` messages to `topic` with `dialer`, then reads them back in a consumer
/// group with `dialer`, committing each; returns the group's committed offsets, read
/// with an admin client that dials through `dialer` too.
async fn round_trip(dialer: Dialer, topic: &str, n: usize) -> BTreeMap<i32, i64> {
    let mut writer = Writer::new(
        WriterConfig::new([broker().addr.clone()])
            .topic(topic)
            .dialer(dialer.clone()),
    )
    .unwrap();
    for i in 0..n {
        writer
            .feed(Message::keyed(format!("k{i}"), format!("v{i}")))
            .await
            .unwrap();
    }
    tokio::time::timeout(Duration::from_secs(60), writer.close())
        .await
        .expect("writer flushed in time")
        .unwrap();

    let group = common::unique_topic("dial-g");
    let mut reader = Reader::new(
        ReaderConfig::new([broker().addr.clone()])
            .group_id(&group)
            .topic(topic)
            .commit_mode(CommitMode::Sync)
            .max_wait(Duration::from_millis(50))
            .dialer(dialer.clone()),
    )
    .await
    .unwrap();
    let mut committer = reader.committer().unwrap();
    let mut values = Vec::new();
    while values.len() < n {
        let m = tokio::time::timeout(Duration::from_secs(60), reader.next_message())
            .await
            .expect("a message in time")
            .unwrap();
        values.push(String::from_utf8(m.value.clone().unwrap_or_default().to_vec()).unwrap());
        committer.send(&m).await.unwrap();
    }
    reader.close().await;
    values.sort();
    let mut want: Vec<String> = (0..n).map(|i| format!("v{i}")).collect();
    want.sort();
    assert_eq!(values, want);

    let cluster = Cluster::new(
        [broker().addr.clone()],
        ConnectionConfig::new().dialer(dialer),
    )
    .unwrap();
    let admin = Admin::new(cluster);
    let mut committed = BTreeMap::new();
    for (tp, r) in admin
        .fetch_group_offsets(&group, Some(&[topic]))
        .await
        .unwrap()
    {
        committed.insert(tp.partition, r.unwrap().offset);
    }
    committed
}

/// Opens plain TCP connections and remembers every address it was asked for.
#[derive(Default)]
struct Recording {
    dialed: Mutex<Vec<String>>,
}

impl Connector for Recording {
    fn connect<'a>(&'a self, addr: &'a str) -> BoxFuture<'a, std::io::Result<BoxedBrokerStream>> {
        Box::pin(async move {
            self.dialed.lock().unwrap().push(addr.to_string());
            let tcp = tokio::net::TcpStream::connect(addr).await?;
            tcp.set_nodelay(true)?;
            Ok(Box::new(tcp) as BoxedBrokerStream)
        })
    }
}

/// An address map that sends [`ADVERTISED`] to the broker's real address and counts
/// every address it is asked about (each dial asks once).
fn counting_map(asked: Arc<Mutex<Vec<String>>>) -> Dialer {
    let real = broker().addr.clone();
    Dialer::new().with_address_map(move |addr| {
        asked.lock().unwrap().push(addr.to_string());
        (addr == ADVERTISED).then(|| real.clone())
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn address_map_reaches_an_unreachable_advertised_broker_and_the_connector_sees_every_dial() {
    common::init_log();
    let topic = topic("dial-map", 2).await;

    // without the map, the partition leader (the advertised address) cannot be dialed
    let err = Conn::dial_leader(&broker().addr, &topic, 0, ConnectionConfig::default())
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("kafka-1.kafkapipe.invalid"),
        "unexpected error: {err}"
    );

    let asked = Arc::new(Mutex::new(Vec::new()));
    let connector = Arc::new(Recording::default());
    let dialer = counting_map(Arc::clone(&asked)).with_connector(connector.clone());
    let committed = round_trip(dialer, &topic, 20).await;
    assert_eq!(committed.values().sum::<i64>(), 20, "{committed:?}");

    let asked = asked.lock().unwrap().clone();
    let dialed = connector.dialed.lock().unwrap().clone();
    // bootstrap (writer, reader, admin) and the advertised broker (leaders, coordinator)
    assert!(asked.contains(&broker().addr), "{asked:?}");
    assert!(asked.iter().any(|a| a == ADVERTISED), "{asked:?}");
    // every dial went through the map and then the connector, to the real address
    assert_eq!(
        asked.len(),
        dialed.len(),
        "map {asked:?} vs connector {dialed:?}"
    );
    assert!(dialed.iter().all(|a| *a == broker().addr), "{dialed:?}");
    assert!(dialed.len() >= 4, "{dialed:?}");
}

// ---------------------------------------------------------------------------------------
// SOCKS5 through Debian's microsocks

/// A microsocks process on loopback, killed on drop; its log has a `connected to` line
/// per connection it made for a client.
struct Microsocks {
    addr: String,
    child: Child,
    log: std::path::PathBuf,
}

impl Drop for Microsocks {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Microsocks {
    /// Starts microsocks requiring `user`/`password`; `None` when it is not installed
    /// and `CI` is not `true` (the test then skips), a panic under CI.
    fn start(user: &str, password: &str) -> Option<Microsocks> {
        if Command::new("microsocks")
            .arg("-h")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_err()
        {
            if std::env::var("CI").as_deref() == Ok("true") {
                panic!(
                    "microsocks is not installed (scripts/lib/socks.sh socks_ensure installs it)"
                );
            }
            eprintln!("skipping: microsocks is not installed (apt-get install microsocks)");
            return None;
        }
        let port = common::free_port();
        let dir = common::temp_dir("microsocks");
        let log = dir.join("microsocks.log");
        // it logs each connection to stderr (unbuffered)
        let out = std::fs::File::create(&log).unwrap();
        let child = Command::new("microsocks")
            .args([
                "-i",
                "127.0.0.1",
                "-p",
                &port.to_string(),
                "-u",
                user,
                "-P",
                password,
            ])
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .unwrap();
        let addr = format!("127.0.0.1:{port}");
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(&addr).is_err() {
            assert!(
                Instant::now() < deadline,
                "microsocks did not listen on {addr}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Some(Microsocks { addr, child, log })
    }

    /// The targets of the connections it made, in order.
    fn connected(&self) -> Vec<String> {
        let mut text = String::new();
        if let Ok(mut f) = std::fs::File::open(&self.log) {
            let _ = f.read_to_string(&mut text);
        }
        text.lines()
            .filter_map(|l| {
                l.split_once("connected to ")
                    .map(|(_, t)| t.trim().to_string())
            })
            .collect()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn socks5_proxy_carries_produce_consume_and_group_commits() {
    common::init_log();
    let Some(proxy) = Microsocks::start("kafkapipe", "proxy-secret") else {
        return;
    };
    let topic = topic("dial-socks", 2).await;

    let asked = Arc::new(Mutex::new(Vec::new()));
    let dialer = counting_map(Arc::clone(&asked)).with_socks5_proxy(
        Socks5Proxy::new(&proxy.addr).with_credentials("kafkapipe", "proxy-secret"),
    );
    let committed = round_trip(dialer, &topic, 20).await;
    assert_eq!(committed.values().sum::<i64>(), 20, "{committed:?}");

    // every dial became one proxied connection to the real broker address
    let dials = asked.lock().unwrap().len();
    let deadline = Instant::now() + Duration::from_secs(10);
    let connected = loop {
        let c = proxy.connected();
        if c.len() >= dials || Instant::now() > deadline {
            break c;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(connected.len(), dials, "{connected:?}");
    assert!(dials >= 4, "{dials} dials");
    assert!(
        connected.iter().all(|t| *t == broker().addr),
        "{connected:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn socks5_wrong_credentials_fail_clearly() {
    common::init_log();
    let Some(proxy) = Microsocks::start("kafkapipe", "proxy-secret") else {
        return;
    };
    let wrong = Dialer::new()
        .with_socks5_proxy(Socks5Proxy::new(&proxy.addr).with_credentials("kafkapipe", "nope"));
    let err = Conn::connect_with(
        &broker().addr,
        ConnectionConfig::new().dialer(wrong.clone()),
    )
    .await
    .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Authentication, "{err}");
    assert!(!err.is_retriable());
    let text = err.to_string();
    assert!(
        text.contains("rejected the username/password") && text.contains(&proxy.addr),
        "{text}"
    );

    // no credentials at all: the proxy offers only username/password
    let none = Dialer::new().with_socks5_proxy(Socks5Proxy::new(&proxy.addr));
    let err = Conn::connect_with(&broker().addr, ConnectionConfig::new().dialer(none))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Authentication, "{err}");

    // a Writer fails its delivery with the same error instead of retrying forever
    let mut writer = Writer::new(
        WriterConfig::new([broker().addr.clone()])
            .topic(topic("dial-socks-denied", 1).await)
            .dialer(wrong),
    )
    .unwrap();
    writer.feed(Message::keyed("k", "v")).await.unwrap();
    let err = tokio::time::timeout(Duration::from_secs(60), writer.flush())
        .await
        .expect("the writer gave up in time")
        .unwrap_err();
    assert!(err.is_authentication(), "{err}");
    assert!(proxy.connected().is_empty(), "{:?}", proxy.connected());
}
