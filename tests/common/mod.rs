//! Real-broker harness for integration tests: Apache Kafka, installed from Maven Central.
//!
//! Use it from an integration test with `mod common;` and then either [`shared`] (one
//! single-node broker per test binary, with every security listener, started on first use
//! and killed when the test process exits), [`TestBroker::start`] (a broker owned by the
//! caller, killed on drop) or [`TestCluster::start`] (three nodes that tests kill and
//! restart). See [`kafka`] for how the broker is installed and configured.
//!
//! How processes are stopped: each runs under a small `sh` watchdog whose standard input is
//! a pipe from the test process. When the pipe closes — because the handle was dropped, or
//! because the test process exited or was killed (statics such as [`shared`] are never
//! dropped) — the watchdog kills the process. Nothing outlives the test binary.
#![allow(dead_code)]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

pub mod kafka;
pub mod kdc;
pub mod oidc;
pub mod pki;
pub mod proxy;

#[allow(unused_imports)]
pub use kafka::{KafkaNode, TestBroker, TestCluster, PASSWORD, USER};

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Watchdog: `$1` is the log file, the rest is the command line. The command runs in the
/// background and its pid goes to `$1.pid`; a second background job blocks reading the
/// watchdog's stdin (kept on fd 3, because background jobs get /dev/null as stdin) and
/// kills the command on EOF. The watchdog exits with the command's status, so an early
/// crash is visible through `try_wait`.
const WATCHDOG: &str = r#"log=$1; shift
exec 3<&0
"$@" </dev/null >>"$log" 2>&1 3<&- &
pid=$!
echo "$pid" >"$log.pid"
{ cat <&3 >/dev/null; kill -9 "$pid" 2>/dev/null; } &
exec 3<&-
wait "$pid"
"#;

/// `KAFKAPIPE_TEST_LOG=1`: print the client's logs (info and above) in tests;
/// `KAFKAPIPE_TEST_LOG=debug` for debug and above.
pub fn init_log() {
    if let Some(v) = std::env::var_os("KAFKAPIPE_TEST_LOG") {
        let level = if v == "debug" {
            tracing::Level::DEBUG
        } else {
            tracing::Level::INFO
        };
        let _ = tracing_subscriber::fmt()
            .with_max_level(level)
            .with_test_writer()
            .try_init();
    }
}

/// A memory figure (`VmRSS`, `VmHWM`, …) of process `pid` (`"self"` for this one) in
/// MiB, read from `/proc/PID/status`.
pub fn proc_memory_mib(pid: &str, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kb: u64 = status
        .lines()
        .find(|l| l.strip_prefix(field).is_some_and(|r| r.starts_with(':')))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    Some(kb / 1024)
}

/// One single-node Kafka per test binary, started on first use.
pub fn shared() -> &'static TestBroker {
    static BROKER: OnceLock<TestBroker> = OnceLock::new();
    BROKER.get_or_init(|| {
        let b = TestBroker::start();
        eprintln!(
            "kafka {} on {} ready in {:?} (rss {} MiB)",
            kafka::kafka_version(),
            b.addr,
            b.startup,
            b.node.rss_mib().unwrap_or(0)
        );
        b
    })
}

/// `$TMP/kafkapipe-NAME-PID-N`, fresh. Directories left by earlier test processes that are
/// gone (statics are never dropped, so nothing removes them at exit) are removed.
pub fn temp_dir(name: &str) -> PathBuf {
    static N: AtomicU32 = AtomicU32::new(0);
    let prefix = format!("kafkapipe-{name}-");
    if let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) {
        for entry in entries.flatten() {
            let file_name = entry.file_name();
            let pid = file_name
                .to_str()
                .and_then(|n| n.strip_prefix(&prefix))
                .and_then(|p| p.split('-').next())
                .and_then(|p| p.parse::<u32>().ok());
            if let Some(pid) = pid {
                if !Path::new(&format!("/proc/{pid}")).exists() {
                    let _ = std::fs::remove_dir_all(entry.path());
                }
            }
        }
    }
    let n = N.fetch_add(1, Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("{prefix}{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Creates `name` through `addr` (CreateTopics, forwarded to the controller) and waits until
/// Metadata on `addr` shows a leader for each of its partitions.
pub fn create_topic(addr: &str, name: &str, partitions: i32, replication: i16) {
    let addr = addr.to_string();
    let name = name.to_string();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let conn = kafkapipe::conn::Conn::connect(&addr).await.unwrap();
            conn.create_topic(&name, partitions, replication)
                .await
                .unwrap_or_else(|e| panic!("create topic {name}: {e}"));
            wait_for_topic(&conn, &name, partitions).await;
            conn.close().await;
        })
    })
    .join()
    .unwrap_or_else(|e| std::panic::resume_unwind(e));
}

/// Polls Metadata on `conn` until `name` has `partitions` partitions, each with a leader,
/// and every partition led by the broker `conn` talks to answers ListOffsets. (A Kafka
/// broker's metadata cache shows the new leader a moment before its replica manager
/// takes the partition over; requests in between fail with NOT_LEADER_OR_FOLLOWER.)
pub async fn wait_for_topic(conn: &kafkapipe::conn::Conn, name: &str, partitions: i32) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(md) = conn.metadata(Some(&[name])).await {
            if let Some(t) = md.topic(name) {
                if t.error.is_none()
                    && t.partitions.len() == partitions as usize
                    && t.partitions
                        .iter()
                        .all(|p| p.leader >= 0 && p.error.is_none())
                {
                    let here = conn.connection().broker().to_string();
                    let mut led_here_ready = true;
                    for p in &t.partitions {
                        // A single broker leads everything, whatever address it
                        // advertises (behind a proxy it is not the one `conn` dialed).
                        let led_here = md.brokers.len() == 1
                            || md.broker(p.leader).is_some_and(|b| b.addr() == here);
                        if led_here && conn.last_offset(name, p.id).await.is_err() {
                            led_here_ready = false;
                            break;
                        }
                    }
                    if led_here_ready {
                        return;
                    }
                }
            }
        }
        assert!(
            Instant::now() < deadline,
            "topic {name} not ready with {partitions} partitions in 30 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Broker ids listed by a Metadata v4 request for no topics (raw, blocking).
pub fn metadata_brokers(addr: &str, timeout: Duration) -> std::io::Result<Vec<i32>> {
    // topics: empty array (no topics), allow_auto_topic_creation: false
    let resp = raw_request(addr, 3, 4, &[0, 0, 0, 0, 0], timeout)?;
    let bad = || std::io::Error::new(std::io::ErrorKind::InvalidData, "short Metadata response");
    let i32_at = |o: usize| -> std::io::Result<i32> {
        resp.get(o..o + 4)
            .map(|b| i32::from_be_bytes([b[0], b[1], b[2], b[3]]))
            .ok_or_else(bad)
    };
    let i16_at = |o: usize| -> std::io::Result<i16> {
        resp.get(o..o + 2)
            .map(|b| i16::from_be_bytes([b[0], b[1]]))
            .ok_or_else(bad)
    };
    // correlation id, throttle time, then the brokers array.
    let n = i32_at(8)?;
    let mut o = 12;
    let mut ids = Vec::new();
    for _ in 0..n.max(0) {
        ids.push(i32_at(o)?);
        let host_len = i16_at(o + 4)?.max(0) as usize;
        o += 4 + 2 + host_len + 4;
        let rack_len = i16_at(o)?;
        o += 2 + rack_len.max(0) as usize;
    }
    Ok(ids)
}

/// A topic name unique within this machine: `PREFIX-PID-COUNTER-NANOS`.
pub fn unique_topic(prefix: &str) -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!("{prefix}-{}-{n}-{nanos}", std::process::id())
}

/// Runs `program args…` under the same watchdog as the brokers: it dies when the returned
/// handle is dropped or the test process exits. Output goes to `log`.
pub struct Watched {
    child: Child,
    stdin: Option<ChildStdin>,
    /// The log file of the process.
    pub log: PathBuf,
}

impl Watched {
    /// Spawns `program` with `args` in `cwd`.
    pub fn spawn(program: &str, args: &[&str], cwd: &std::path::Path, log: PathBuf) -> Watched {
        std::fs::write(&log, b"").expect("create log file");
        let _ = std::fs::remove_file(Self::pid_file(&log));
        let mut child = Command::new("sh")
            .current_dir(cwd)
            .arg("-c")
            .arg(WATCHDOG)
            .arg("watchdog")
            .arg(&log)
            .arg(program)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {program}: {e}"));
        let stdin = child.stdin.take();
        Watched { child, stdin, log }
    }

    fn pid_file(log: &Path) -> PathBuf {
        let mut name = log.as_os_str().to_owned();
        name.push(".pid");
        PathBuf::from(name)
    }

    /// The pid of the watched process (not of the watchdog), once the watchdog wrote it.
    pub fn pid(&self) -> Option<u32> {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            if let Ok(text) = std::fs::read_to_string(Self::pid_file(&self.log)) {
                if let Ok(pid) = text.trim().parse() {
                    return Some(pid);
                }
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Whether the process already exited.
    pub fn exited(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(Some(_)))
    }

    /// The log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        drop(self.stdin.take());
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            match self.child.try_wait() {
                Ok(Some(_)) | Err(_) => return,
                Ok(None) if Instant::now() >= deadline => {
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    return;
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(10)),
            }
        }
    }
}

/// A loopback port for a test server to listen on, free a moment ago.
///
/// Not `bind(0)`: that hands out a port of the kernel's ephemeral range
/// (`ip_local_port_range`, 32768–60999 by default), the range every outgoing connection
/// takes its source port from, so between this call and the broker's own bind a client
/// connection could take the port ("Unable to start acceptor", seen in CI). Ports here
/// come from 20000–32767, below that range: only another test server could take one, and
/// the start is probed with a bind and spread by pid and a counter.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    const LOW: u32 = 20_000;
    const SPAN: u32 = 12_768;
    // One seed per process: `seed + n × 7919 (mod SPAN)` then visits every port once as n
    // counts up (7919 is prime to SPAN), so no two calls return the same port. A seed
    // drawn per call let two listeners of one broker get the same port (Kafka refused
    // to start: "two listeners on the same port").
    static SEED: OnceLock<u32> = OnceLock::new();
    let seed =
        *SEED.get_or_init(|| std::process::id().wrapping_mul(2_654_435_761) ^ (nanos() as u32));
    for _ in 0..SPAN {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let step = (u64::from(seed) + u64::from(n) * 7_919) % u64::from(SPAN);
        let port = (u64::from(LOW) + step) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free loopback port in 20000-32767");
}

fn nanos() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}

/// Sends one raw request frame (`api_key`, `version`, request header v1 with client id
/// "kafkapipe-test", then `body`) and returns the response frame after the size prefix
/// (starting with the correlation id).
pub fn raw_request(
    addr: &str,
    api_key: i16,
    version: i16,
    body: &[u8],
    timeout: Duration,
) -> std::io::Result<Vec<u8>> {
    let sock: SocketAddr = addr
        .parse()
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    let mut s = TcpStream::connect_timeout(&sock, timeout)?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    let client_id = b"kafkapipe-test";
    let mut frame = Vec::with_capacity(4 + 10 + client_id.len() + body.len());
    let size = 2 + 2 + 4 + 2 + client_id.len() + body.len();
    frame.extend_from_slice(&(size as i32).to_be_bytes());
    frame.extend_from_slice(&api_key.to_be_bytes());
    frame.extend_from_slice(&version.to_be_bytes());
    frame.extend_from_slice(&42i32.to_be_bytes());
    frame.extend_from_slice(&(client_id.len() as i16).to_be_bytes());
    frame.extend_from_slice(client_id);
    frame.extend_from_slice(body);
    s.write_all(&frame)?;
    let mut len = [0u8; 4];
    s.read_exact(&mut len)?;
    let len = i32::from_be_bytes(len);
    if !(4..=64 << 20).contains(&len) {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("bad response size {len}"),
        ));
    }
    let mut resp = vec![0u8; len as usize];
    s.read_exact(&mut resp)?;
    let _ = s.shutdown(Shutdown::Both);
    let corr = i32::from_be_bytes([resp[0], resp[1], resp[2], resp[3]]);
    if corr != 42 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("correlation id {corr}, expected 42"),
        ));
    }
    Ok(resp)
}

/// One entry of an ApiVersions response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ApiRange {
    pub api_key: i16,
    pub min_version: i16,
    pub max_version: i16,
}

/// Sends ApiVersions v0 and decodes the reply by hand:
/// `correlation_id i32, error_code i16, [api_key i16, min_version i16, max_version i16]`.
pub fn api_versions(addr: &str, timeout: Duration) -> std::io::Result<Vec<ApiRange>> {
    let resp = raw_request(addr, 18, 0, &[], timeout)?;
    let bad = |m: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, m.to_string());
    let i16_at = |o: usize| -> std::io::Result<i16> {
        resp.get(o..o + 2)
            .map(|b| i16::from_be_bytes([b[0], b[1]]))
            .ok_or_else(|| bad("short ApiVersions response"))
    };
    let error_code = i16_at(4)?;
    if error_code != 0 {
        return Err(bad(&format!("ApiVersions error code {error_code}")));
    }
    let n = resp
        .get(6..10)
        .map(|b| i32::from_be_bytes([b[0], b[1], b[2], b[3]]))
        .ok_or_else(|| bad("short ApiVersions response"))?;
    let mut out = Vec::with_capacity(n.max(0) as usize);
    for i in 0..n.max(0) as usize {
        let o = 10 + i * 6;
        out.push(ApiRange {
            api_key: i16_at(o)?,
            min_version: i16_at(o + 2)?,
            max_version: i16_at(o + 4)?,
        });
    }
    Ok(out)
}

thread_local! {
    /// The transaction protocol of the running scenario (see [`with_txn_protocol`]).
    static TXN_PROTOCOL: std::cell::Cell<kafkapipe::writer::TransactionProtocol> =
        const { std::cell::Cell::new(kafkapipe::writer::TransactionProtocol::Auto) };
}

/// The transaction protocol the running scenario's writers use ([`with_txn_protocol`];
/// `Auto` outside one).
pub fn txn_protocol() -> kafkapipe::writer::TransactionProtocol {
    TXN_PROTOCOL.with(std::cell::Cell::get)
}

/// Run scenario `f` with `protocol` for its transactional writers ([`txn_protocol`]),
/// so one scenario body runs on both transaction protocols. The protocol is kept per
/// thread: `#[tokio::test]`'s current-thread runtime runs the test's spawned tasks on
/// its thread too (asserted).
pub async fn with_txn_protocol<F: std::future::Future>(
    protocol: kafkapipe::writer::TransactionProtocol,
    f: F,
) -> F::Output {
    assert_eq!(
        tokio::runtime::Handle::current().runtime_flavor(),
        tokio::runtime::RuntimeFlavor::CurrentThread,
        "the protocol is a thread-local: scenarios need a current-thread runtime"
    );
    TXN_PROTOCOL.with(|p| p.set(protocol));
    f.await
}

/// One test per transaction protocol (`NAME::v1`, `NAME::v2`) for each scenario
/// `async fn NAME()` listed, which takes the protocol from [`txn_protocol`].
#[macro_export]
macro_rules! on_both_txn_protocols {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            use kafkapipe::writer::TransactionProtocol;
            #[tokio::test]
            async fn v1() {
                $crate::common::with_txn_protocol(TransactionProtocol::V1, super::$name()).await
            }
            #[tokio::test]
            async fn v2() {
                // transaction.version=2 is Kafka 4.0+ (on 3.x under scripts/matrix.sh)
                if $crate::common::kafka::skip_before((4, 0), concat!(stringify!($name), "::v2")) {
                    return;
                }
                $crate::common::with_txn_protocol(TransactionProtocol::V2, super::$name()).await
            }
        }
    )*};
}

/// Every record of `partition`, in offset order, fetched with `conn` (its leader, reached
/// directly rather than through a test's proxy).
pub async fn read_partition(
    conn: &kafkapipe::conn::Conn,
    topic: &str,
    partition: i32,
) -> Vec<kafkapipe::record::Record> {
    let opts = kafkapipe::conn::FetchOptions::default()
        .max_bytes(8 << 20)
        .max_wait(Duration::from_millis(10));
    let mut out = Vec::new();
    let mut offset = 0;
    loop {
        let f = conn.fetch(topic, partition, offset, &opts).await.unwrap();
        if f.next_offset <= offset && f.records.is_empty() {
            return out;
        }
        offset = f.next_offset;
        out.extend(f.records);
    }
}

/// The values of `partition` parsed as `T` (each a number written as text), in offset
/// order, read with [`read_partition`].
pub async fn read_values<T: std::str::FromStr>(
    conn: &kafkapipe::conn::Conn,
    topic: &str,
    partition: i32,
) -> Vec<T>
where
    T::Err: std::fmt::Debug,
{
    read_partition(conn, topic, partition)
        .await
        .iter()
        .map(|r| {
            std::str::from_utf8(r.value.as_deref().unwrap())
                .unwrap()
                .parse()
                .unwrap()
        })
        .collect()
}

/// Produce keys `key-0..n` to `topic` on `addr` with librdkafka (confluent-kafka, through
/// `tests/interop/produce.py`) using its `partitioner`, and return the partition each key
/// landed in.
pub fn librdkafka_partitions(
    addr: &str,
    topic: &str,
    n: usize,
    partitioner: &str,
) -> Vec<(String, i32)> {
    let out = Command::new(std::env::var("PYTHON").unwrap_or_else(|_| "python3".into()))
        .arg(format!(
            "{}/tests/interop/produce.py",
            env!("CARGO_MANIFEST_DIR")
        ))
        .args(["--broker", addr, "--topic", topic])
        .args(["--count", &n.to_string(), "--partitioner", partitioner])
        .output()
        .expect("run produce.py");
    assert!(
        out.status.success(),
        "librdkafka producer failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).expect("json line");
            (
                v["key"].as_str().unwrap().to_string(),
                v["partition"].as_i64().unwrap() as i32,
            )
        })
        .collect()
}

/// Set (`Some`) or remove (`None`) the client quota `key` (`producer_byte_rate`,
/// `consumer_byte_rate`, …) of the client id `client_id` with a raw AlterClientQuotas
/// request to the broker at `addr`; panics unless the broker accepted it.
pub async fn set_client_quota(addr: &str, client_id: &str, key: &str, value: Option<f64>) {
    use kafkapipe::protocol::messages::{
        AlterClientQuotaEntity, AlterClientQuotaEntry, AlterClientQuotaOp, AlterClientQuotasRequest,
    };
    let conn = kafkapipe::conn::Connection::connect(addr, Default::default())
        .await
        .unwrap();
    let req = AlterClientQuotasRequest {
        entries: vec![AlterClientQuotaEntry {
            entity: vec![AlterClientQuotaEntity {
                entity_type: "client-id".into(),
                entity_name: Some(client_id.into()),
                ..Default::default()
            }],
            ops: vec![AlterClientQuotaOp {
                key: key.into(),
                value: value.unwrap_or(0.0),
                remove: value.is_none(),
                ..Default::default()
            }],
            ..Default::default()
        }],
        ..Default::default()
    };
    let resp = conn.send(&req).await.unwrap();
    for e in &resp.entries {
        assert_eq!(e.error_code, 0, "AlterClientQuotas: {:?}", e.error_message);
    }
    conn.close().await;
}
