//! Apache Kafka brokers for the integration tests: a single node with every security
//! listener, and a 3-node cluster whose nodes can be killed and restarted.
//!
//! The broker is the pinned `org.apache.kafka:kafka_2.13` from Maven Central, collected by
//! `testing/kafka/pom.xml` into a cache directory (see [`kafka_libs`]) and started without
//! the distribution's shell scripts: `kafka.tools.StorageTool format`, then `kafka.Kafka`,
//! in KRaft combined mode (`process.roles=broker,controller`).
//!
//! Every JVM runs under the watchdog of [`super::Watched`]: when the handle is dropped or the
//! test process exits (statics are never dropped, so this is how the shared broker ends),
//! the broker is killed. No broker outlives the test binary.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use super::pki::Pki;
use super::{free_port, temp_dir, Watched};

/// How long a node may take from spawn until it answers ApiVersions and lists itself.
pub const START_DEADLINE: Duration = Duration::from_secs(180);

/// The SASL user of the test brokers (PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512).
pub const USER: &str = "alice";
/// Its password.
pub const PASSWORD: &str = "alice-secret";
/// A second SCRAM user with a SCRAM-SHA-512 credential only.
pub const USER512: (&str, &str) = ("bob", "bob-secret-512");

const CLUSTER_ID: &str = "a2Fma2FwaXBlLXRlc3Q";

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The Kafka version the tests run against: `KAFKAPIPE_KAFKA_VERSION` when set (the version
/// matrix, `scripts/matrix.sh`), else the one pinned in `testing/kafka/pom.xml`.
pub fn kafka_version() -> String {
    if let Some(v) = std::env::var("KAFKAPIPE_KAFKA_VERSION")
        .ok()
        .filter(|v| !v.trim().is_empty())
    {
        return v.trim().to_string();
    }
    pom_kafka_version()
}

/// The Kafka version pinned in `testing/kafka/pom.xml` (the suite's default broker).
pub fn pom_kafka_version() -> String {
    let pom = std::fs::read_to_string(repo_root().join("testing/kafka/pom.xml"))
        .expect("read testing/kafka/pom.xml");
    pom.split("<kafka.version>")
        .nth(1)
        .and_then(|s| s.split("</kafka.version>").next())
        .expect("<kafka.version> in testing/kafka/pom.xml")
        .trim()
        .to_string()
}

/// `(major, minor)` of [`kafka_version`], e.g. `(3, 9)` for 3.9.2.
pub fn version_major_minor() -> (u32, u32) {
    let v = kafka_version();
    let mut parts = v.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    (parts.next().unwrap_or(0), parts.next().unwrap_or(0))
}

/// For a test (or part of one) that needs Kafka `at_least` (`(major, minor)`): `true`, with
/// a line on stderr naming what is skipped and why, when the broker under test is older
/// (only under `KAFKAPIPE_KAFKA_VERSION`, i.e. `scripts/matrix.sh`); `false` when it runs.
/// Panics if the suite's own broker (the pom's version, what CI runs) were too old: a
/// version-gated test never skips there.
pub fn skip_before(at_least: (u32, u32), what: &str) -> bool {
    if version_major_minor() >= at_least {
        return false;
    }
    let version = kafka_version();
    assert!(
        version != pom_kafka_version(),
        "{what} needs Kafka {}.{}+, but the suite's broker (testing/kafka/pom.xml) is {version}",
        at_least.0,
        at_least.1
    );
    // Straight to stderr: libtest captures eprintln! of a passing test, and a skip must
    // show in the matrix's output.
    use std::io::Write;
    let _ = writeln!(
        std::io::stderr().lock(),
        "SKIPPED {what}: needs Kafka {}.{}+, the broker under test is {version} \
         (KAFKAPIPE_KAFKA_VERSION)",
        at_least.0,
        at_least.1
    );
    true
}

/// The directory holding the broker's jars: `KAFKAPIPE_KAFKA_LIBS`, else
/// `$HOME/.cache/kafkapipe/kafka-VERSION` (what `scripts/lib/kafka.sh` fills). Collected
/// with Maven here if it is missing, so a plain `cargo test` works too.
pub fn kafka_libs() -> &'static Path {
    static LIBS: OnceLock<PathBuf> = OnceLock::new();
    LIBS.get_or_init(|| {
        let dir = match std::env::var_os("KAFKAPIPE_KAFKA_LIBS").filter(|p| !p.is_empty()) {
            Some(p) => PathBuf::from(p),
            None => {
                let home = std::env::var_os("HOME").map_or_else(std::env::temp_dir, PathBuf::from);
                home.join(".cache/kafkapipe")
                    .join(format!("kafka-{}", kafka_version()))
            }
        };
        if !dir.join(".complete").is_file() {
            install_libs(&dir);
        }
        dir
    })
}

fn install_libs(dir: &Path) {
    let tmp = dir.with_extension(format!("tmp-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    let out = Command::new("mvn")
        .args(["-q", "-B", "-f"])
        .arg(repo_root().join("testing/kafka/pom.xml"))
        .args([
            "dependency:copy-dependencies",
            "-DincludeScope=runtime",
            &format!("-Dkafka.version={}", kafka_version()),
            &format!("-DoutputDirectory={}", tmp.display()),
        ])
        .stdin(Stdio::null())
        .output()
        .expect("run mvn (Maven) to collect the Kafka broker");
    assert!(
        out.status.success(),
        "mvn dependency:copy-dependencies failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::write(tmp.join(".complete"), b"").unwrap();
    if let Some(parent) = dir.parent() {
        std::fs::create_dir_all(parent).unwrap();
    }
    // Another process may have finished first; either copy is fine.
    if std::fs::rename(&tmp, dir).is_err() {
        let _ = std::fs::remove_dir_all(&tmp);
    }
}

fn java() -> PathBuf {
    std::env::var_os("JAVA_HOME")
        .filter(|p| !p.is_empty())
        .map(|h| PathBuf::from(h).join("bin/java"))
        .filter(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from("java"))
}

fn classpath() -> String {
    format!("{}/*", kafka_libs().display())
}

const LOG4J2: &str = "\
status = warn
appender.console.type = Console
appender.console.name = STDOUT
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = info
rootLogger.appenderRef.stdout.ref = STDOUT
logger.kafka.name = kafka
logger.kafka.level = info
logger.oak.name = org.apache.kafka
logger.oak.level = warn
logger.state.name = state.change.logger
logger.state.level = warn
logger.request.name = kafka.request.logger
logger.request.level = warn
logger.log.name = kafka.log
logger.log.level = warn
logger.cleaner.name = kafka.log.LogCleaner
logger.cleaner.level = warn
logger.coord.name = org.apache.kafka.coordinator
logger.coord.level = info
logger.auth.name = org.apache.kafka.common.security
logger.auth.level = debug
";

/// Settings common to every test node: fast groups, small internal topics, fast fencing.
fn base_props(replication: usize) -> BTreeMap<String, String> {
    let rf = replication.to_string();
    let isr = if replication >= 3 { "2" } else { "1" };
    [
        ("process.roles", "broker,controller"),
        ("controller.listener.names", "CONTROLLER"),
        ("inter.broker.listener.name", "PLAINTEXT"),
        ("num.partitions", "1"),
        ("auto.create.topics.enable", "false"),
        ("default.replication.factor", rf.as_str()),
        ("min.insync.replicas", isr),
        ("offsets.topic.replication.factor", rf.as_str()),
        ("offsets.topic.num.partitions", "6"),
        ("transaction.state.log.replication.factor", rf.as_str()),
        ("transaction.state.log.min.isr", isr),
        ("transaction.state.log.num.partitions", "4"),
        (
            "share.coordinator.state.topic.replication.factor",
            rf.as_str(),
        ),
        ("share.coordinator.state.topic.min.isr", isr),
        ("group.initial.rebalance.delay.ms", "0"),
        ("group.min.session.timeout.ms", "500"),
        ("group.consumer.min.session.timeout.ms", "3000"),
        ("group.consumer.session.timeout.ms", "10000"),
        ("group.consumer.min.heartbeat.interval.ms", "500"),
        ("group.consumer.heartbeat.interval.ms", "1000"),
        ("log.cleaner.dedupe.buffer.size", "2097152"),
        // Client quotas (KIP-219 tests): rates over 2 samples of 1 s instead of 11, so a
        // quota bites after about a second's worth of bytes, not ten.
        ("quota.window.num", "2"),
        ("quota.window.size.seconds", "1"),
        ("log.segment.bytes", "67108864"),
        ("broker.heartbeat.interval.ms", "500"),
        ("broker.session.timeout.ms", "3000"),
        ("controlled.shutdown.enable", "true"),
        ("unclean.leader.election.enable", "false"),
        (
            "transaction.remove.expired.transaction.cleanup.interval.ms",
            "60000",
        ),
        ("delete.topic.enable", "true"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

/// One Kafka process (KRaft combined broker and controller) with its data directory.
/// Dropping it kills the process.
pub struct KafkaNode {
    /// The node id (`node.id`, also the broker id in Metadata).
    pub id: i32,
    /// `127.0.0.1:PORT` of the PLAINTEXT listener.
    pub addr: String,
    /// Time from the last spawn until the node was ready.
    pub startup: Duration,
    dir: PathBuf,
    config: PathBuf,
    log: PathBuf,
    process: Option<Watched>,
    restarts: u32,
    /// Node ids that must be listed in Metadata before the node counts as ready.
    expect_brokers: Vec<i32>,
    /// Extra JVM options (`-Dname=value` system properties).
    jvm_args: Vec<String>,
}

impl KafkaNode {
    fn format(&self, scram: &[String]) {
        let mut args: Vec<String> = vec![
            format!(
                "-Dlog4j2.configurationFile={}",
                self.dir.join("log4j2.properties").display()
            ),
            "-cp".into(),
            classpath(),
            "kafka.tools.StorageTool".into(),
            "format".into(),
            "--cluster-id".into(),
            CLUSTER_ID.into(),
            "--config".into(),
            self.config.display().to_string(),
        ];
        for s in scram {
            args.push("--add-scram".into());
            args.push(s.clone());
        }
        let out = Command::new(java())
            .args(&args)
            .stdin(Stdio::null())
            .output()
            .expect("run java kafka.tools.StorageTool");
        assert!(
            out.status.success(),
            "StorageTool format failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Spawns the JVM; does not wait.
    fn spawn(&mut self) {
        let log4j = format!(
            "-Dlog4j2.configurationFile={}",
            self.dir.join("log4j2.properties").display()
        );
        let java = java();
        let cp = classpath();
        let config = self.config.display().to_string();
        let mut args = vec![
            "-Xmx512m",
            "-Xms128m",
            "-XX:+UseSerialGC",
            "-XX:+ExitOnOutOfMemoryError",
            "-Djava.awt.headless=true",
            log4j.as_str(),
        ];
        args.extend(self.jvm_args.iter().map(String::as_str));
        args.extend(["-cp", cp.as_str(), "kafka.Kafka", config.as_str()]);
        self.process = Some(Watched::spawn(
            java.to_str().expect("java path"),
            &args,
            &self.dir,
            self.log.clone(),
        ));
    }

    /// Waits until the node answers ApiVersions and Metadata lists every expected broker.
    fn wait_ready(&mut self, started: Instant) {
        if let Err(e) = self.try_wait_ready(started) {
            panic!("{e}");
        }
    }

    /// [`KafkaNode::wait_ready`], returning what went wrong instead of panicking.
    fn try_wait_ready(&mut self, started: Instant) -> Result<(), String> {
        let deadline = started + START_DEADLINE;
        loop {
            if let Ok(ids) = super::metadata_brokers(&self.addr, Duration::from_millis(1000)) {
                if self.expect_brokers.iter().all(|id| ids.contains(id)) {
                    self.startup = started.elapsed();
                    return Ok(());
                }
            }
            if let Some(p) = self.process.as_mut() {
                if p.exited() {
                    return Err(format!(
                        "kafka node {} exited during startup; log:\n{}",
                        self.id,
                        tail(&self.log_text(), 80)
                    ));
                }
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "kafka node {} on {} not ready within {START_DEADLINE:?}; log:\n{}",
                    self.id,
                    self.addr,
                    tail(&self.log_text(), 80)
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The process id of the JVM, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.process.as_ref().and_then(|p| p.pid())
    }

    /// Whether the JVM is running.
    pub fn is_running(&mut self) -> bool {
        self.process.as_mut().is_some_and(|p| !p.exited())
    }

    fn signal(&mut self, sig: &str) {
        let pid = self.pid().expect("kafka node is not running");
        let status = Command::new("kill")
            .args([sig, &pid.to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill {sig} {pid} failed");
    }

    fn wait_exit(&mut self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if !self.is_running() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    /// SIGKILL: the node dies at once (data kept for [`KafkaNode::restart`]).
    pub fn kill(&mut self) {
        self.signal("-KILL");
        assert!(
            self.wait_exit(Duration::from_secs(10)),
            "node {} survived SIGKILL",
            self.id
        );
        self.process = None;
    }

    /// SIGTERM: a controlled shutdown (leadership moves away first); waits for the exit.
    pub fn terminate(&mut self) {
        self.signal("-TERM");
        if !self.wait_exit(Duration::from_secs(60)) {
            self.signal("-KILL");
            self.wait_exit(Duration::from_secs(10));
        }
        self.process = None;
    }

    /// SIGSTOP: the node freezes (no heartbeats, no replication, connections stay open)
    /// until [`KafkaNode::resume`]; the controller fences it after
    /// `broker.session.timeout.ms` and takes it out of every ISR.
    pub fn suspend(&mut self) {
        self.signal("-STOP");
    }

    /// SIGCONT after [`KafkaNode::suspend`].
    pub fn resume(&mut self) {
        self.signal("-CONT");
    }

    /// Starts the node again on its data and ports; waits until it is ready.
    pub fn restart(&mut self) {
        assert!(!self.is_running(), "restart of a running node {}", self.id);
        let started = Instant::now();
        // Keep the earlier run's log beside the new one.
        let _ = std::fs::rename(
            &self.log,
            self.log.with_extension(format!("log.{}", self.restarts)),
        );
        self.restarts += 1;
        self.spawn();
        self.wait_ready(started);
    }

    /// The node's log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Resident memory of the JVM in MiB, from /proc.
    pub fn rss_mib(&self) -> Option<u64> {
        super::proc_memory_mib(&self.pid()?.to_string(), "VmRSS")
    }
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

fn write_props(path: &Path, props: &BTreeMap<String, String>) {
    let mut text = String::new();
    for (k, v) in props {
        text.push_str(k);
        text.push('=');
        text.push_str(v);
        text.push('\n');
    }
    std::fs::write(path, text).unwrap();
}

/// The single test broker: one node with every listener the security tests need.
pub struct TestBroker {
    /// PLAINTEXT listener, `127.0.0.1:PORT`: the bootstrap address for most tests.
    pub addr: String,
    /// SASL_PLAINTEXT with PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 and OAUTHBEARER (unsecured
    /// JWS validator).
    pub sasl_addr: String,
    /// SASL_SSL with the same mechanisms.
    pub sasl_ssl_addr: String,
    /// SSL, no client authentication.
    pub ssl_addr: String,
    /// SSL with client certificates required (mTLS).
    pub mtls_addr: String,
    /// The CA and certificates of the TLS listeners.
    pub pki: Pki,
    /// Time from spawn until the broker was ready (format not included).
    pub startup: Duration,
    /// The node itself (kill, restart, log).
    pub node: KafkaNode,
}

impl TestBroker {
    /// Formats a fresh data directory and starts the node; waits until it is ready.
    pub fn start() -> TestBroker {
        Self::start_with(None)
    }

    /// Like [`TestBroker::start`], but the PLAINTEXT listener advertises `advertised`
    /// (`host:port`) in Metadata instead of its own address — for putting a TCP proxy in
    /// front of it. `addr` stays the address the broker really listens on.
    pub fn start_advertised(advertised: &str) -> TestBroker {
        Self::start_with(Some(advertised))
    }

    fn start_with(advertised: Option<&str>) -> TestBroker {
        // A listener port taken between picking it and the broker's bind (by another test
        // process) fails the start: pick new ports and start again.
        let mut attempt = 1;
        loop {
            match Self::try_start_with(advertised) {
                Ok(broker) => return broker,
                Err(e) if attempt < 3 && e.contains("Unable to start acceptor") => {
                    eprintln!("kafka broker start {attempt} lost a port race; retrying");
                    attempt += 1;
                }
                Err(e) => panic!("{e}"),
            }
        }
    }

    fn try_start_with(advertised: Option<&str>) -> Result<TestBroker, String> {
        let dir = temp_dir("kafka");
        let pki = Pki::generate(&dir);
        let ports: Vec<u16> = (0..6).map(|_| free_port()).collect();
        let [plain, sasl, sasl_ssl, ssl, mtls, controller] = ports[..] else {
            unreachable!()
        };
        let mut p = base_props(1);
        let listeners = format!(
            "PLAINTEXT://127.0.0.1:{plain},SASL://127.0.0.1:{sasl},SASLSSL://127.0.0.1:{sasl_ssl},\
             SSL://127.0.0.1:{ssl},MTLS://127.0.0.1:{mtls}"
        );
        p.insert("node.id".into(), "1".into());
        p.insert(
            "controller.quorum.voters".into(),
            format!("1@127.0.0.1:{controller}"),
        );
        p.insert(
            "listeners".into(),
            format!("{listeners},CONTROLLER://127.0.0.1:{controller}"),
        );
        let advertised_listeners = match advertised {
            Some(a) => listeners.replacen(
                &format!("PLAINTEXT://127.0.0.1:{plain}"),
                &format!("PLAINTEXT://{a}"),
                1,
            ),
            None => listeners.clone(),
        };
        p.insert("advertised.listeners".into(), advertised_listeners);
        p.insert(
            "listener.security.protocol.map".into(),
            "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,SASL:SASL_PLAINTEXT,SASLSSL:SASL_SSL,\
             SSL:SSL,MTLS:SSL"
                .into(),
        );
        p.insert("log.dirs".into(), dir.join("data").display().to_string());
        let mechanisms = "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512,OAUTHBEARER";
        for l in ["sasl", "saslssl"] {
            p.insert(
                format!("listener.name.{l}.sasl.enabled.mechanisms"),
                mechanisms.into(),
            );
            p.insert(
                format!("listener.name.{l}.plain.sasl.jaas.config"),
                format!(
                    "org.apache.kafka.common.security.plain.PlainLoginModule required \
                     user_{USER}=\"{PASSWORD}\";"
                ),
            );
            for m in ["scram-sha-256", "scram-sha-512"] {
                p.insert(
                    format!("listener.name.{l}.{m}.sasl.jaas.config"),
                    "org.apache.kafka.common.security.scram.ScramLoginModule required;".into(),
                );
            }
            p.insert(
                format!("listener.name.{l}.oauthbearer.sasl.jaas.config"),
                "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required \
                 unsecuredLoginStringClaim_sub=\"admin\";"
                    .into(),
            );
            p.insert(
                format!("listener.name.{l}.oauthbearer.sasl.server.callback.handler.class"),
                "org.apache.kafka.common.security.oauthbearer.internals.unsecured.\
                 OAuthBearerUnsecuredValidatorCallbackHandler"
                    .replace(' ', ""),
            );
        }
        for l in ["saslssl", "ssl", "mtls"] {
            p.insert(format!("listener.name.{l}.ssl.keystore.type"), "PEM".into());
            p.insert(
                format!("listener.name.{l}.ssl.keystore.location"),
                pki.server_keystore.display().to_string(),
            );
            p.insert(
                format!("listener.name.{l}.ssl.truststore.type"),
                "PEM".into(),
            );
            p.insert(
                format!("listener.name.{l}.ssl.truststore.location"),
                pki.ca_file.display().to_string(),
            );
        }
        p.insert(
            "listener.name.mtls.ssl.client.auth".into(),
            "required".into(),
        );
        let node = prepare_node(
            &dir,
            1,
            plain,
            &p,
            &[
                format!("SCRAM-SHA-256=[name={USER},password={PASSWORD}]"),
                format!("SCRAM-SHA-512=[name={USER},password={PASSWORD}]"),
                format!("SCRAM-SHA-512=[name={},password={}]", USER512.0, USER512.1),
            ],
            vec![1],
        );
        let mut node = node;
        let started = Instant::now();
        node.spawn();
        node.try_wait_ready(started)?;
        Ok(TestBroker {
            addr: format!("127.0.0.1:{plain}"),
            sasl_addr: format!("127.0.0.1:{sasl}"),
            sasl_ssl_addr: format!("127.0.0.1:{sasl_ssl}"),
            ssl_addr: format!("127.0.0.1:{ssl}"),
            mtls_addr: format!("127.0.0.1:{mtls}"),
            pki,
            startup: node.startup,
            node,
        })
    }

    /// The broker's log so far.
    pub fn log_text(&self) -> String {
        self.node.log_text()
    }

    /// Creates `name` with `partitions` partitions and waits until Metadata shows a leader
    /// for each; panics on failure.
    pub fn create_topic(&self, name: &str, partitions: i32) {
        super::create_topic(&self.addr, name, partitions, 1);
    }
}

/// A single node with a PLAINTEXT listener (its `addr`) and the `extra` listeners
/// (`(NAME, SECURITY_PROTOCOL)`, on fresh ports), `props` added to the base settings and
/// `jvm_args` (`-D…` system properties) on the JVM; waits until it is ready. Returns the
/// node and the `127.0.0.1:PORT` of each extra listener. For tests whose listeners need
/// something the shared broker does not have (an identity provider, a KDC).
pub fn start_single(
    name: &str,
    extra: &[(&str, &str)],
    props: &[(String, String)],
    jvm_args: &[String],
) -> (KafkaNode, Vec<String>) {
    start_single_advertised(name, extra, props, jvm_args, "127.0.0.1")
}

/// [`start_single`] whose extra listeners are advertised (and returned) as
/// `host:PORT`, e.g. `localhost` for Kerberos, whose service principal names the host the
/// client dials. They still bind 127.0.0.1.
pub fn start_single_advertised(
    name: &str,
    extra: &[(&str, &str)],
    props: &[(String, String)],
    jvm_args: &[String],
    host: &str,
) -> (KafkaNode, Vec<String>) {
    let dir = temp_dir(name);
    let plain = free_port();
    let controller = free_port();
    let ports: Vec<u16> = extra.iter().map(|_| free_port()).collect();
    let mut p = base_props(1);
    let mut listeners = format!("PLAINTEXT://127.0.0.1:{plain}");
    let mut advertised = listeners.clone();
    let mut map = "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT".to_string();
    for ((l, proto), port) in extra.iter().zip(&ports) {
        listeners.push_str(&format!(",{l}://127.0.0.1:{port}"));
        advertised.push_str(&format!(",{l}://{host}:{port}"));
        map.push_str(&format!(",{l}:{proto}"));
    }
    p.insert("node.id".into(), "1".into());
    p.insert(
        "controller.quorum.voters".into(),
        format!("1@127.0.0.1:{controller}"),
    );
    p.insert(
        "listeners".into(),
        format!("{listeners},CONTROLLER://127.0.0.1:{controller}"),
    );
    p.insert("advertised.listeners".into(), advertised);
    p.insert("listener.security.protocol.map".into(), map);
    p.insert("log.dirs".into(), dir.join("data").display().to_string());
    for (k, v) in props {
        p.insert(k.clone(), v.clone());
    }
    let mut node = prepare_node(&dir, 1, plain, &p, &[], vec![1]);
    node.jvm_args = jvm_args.to_vec();
    let started = Instant::now();
    node.spawn();
    node.wait_ready(started);
    let addrs = ports.iter().map(|p| format!("{host}:{p}")).collect();
    (node, addrs)
}

fn prepare_node(
    dir: &Path,
    id: i32,
    plain_port: u16,
    props: &BTreeMap<String, String>,
    scram: &[String],
    expect_brokers: Vec<i32>,
) -> KafkaNode {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("log4j2.properties"), LOG4J2).unwrap();
    let config = dir.join("server.properties");
    write_props(&config, props);
    let node = KafkaNode {
        id,
        addr: format!("127.0.0.1:{plain_port}"),
        startup: Duration::ZERO,
        dir: dir.to_path_buf(),
        config,
        log: dir.join("kafka.log"),
        process: None,
        restarts: 0,
        expect_brokers,
        jvm_args: Vec::new(),
    };
    node.format(scram);
    node
}

/// Three (or N) combined nodes with a static controller quorum of all of them,
/// replication factor N and `min.insync.replicas=2`.
pub struct TestCluster {
    /// The nodes, `nodes[i].id == i + 1`.
    pub nodes: Vec<KafkaNode>,
}

impl TestCluster {
    /// Formats and starts `n` nodes; waits until every node lists all of them.
    pub fn start(n: usize) -> TestCluster {
        Self::start_advertised(n, None)
    }

    /// Like [`TestCluster::start`], but node `i`'s client listener advertises
    /// `advertised[i]` (`host:port`, e.g. a TCP proxy in front of it) in Metadata. The
    /// brokers talk to each other on a separate INTERNAL listener, so a proxy only ever
    /// carries client connections. Returns the cluster; `nodes[i].addr` stays the address
    /// the node really listens on.
    pub fn start_proxied(advertised: &[String]) -> TestCluster {
        Self::start_advertised(advertised.len(), Some(advertised))
    }

    fn start_advertised(n: usize, advertised: Option<&[String]>) -> TestCluster {
        let dir = temp_dir("kafka-cluster");
        let internal: Vec<u16> = (0..n).map(|_| free_port()).collect();
        let plain: Vec<u16> = (0..n).map(|_| free_port()).collect();
        let controller: Vec<u16> = (0..n).map(|_| free_port()).collect();
        let voters = (0..n)
            .map(|i| format!("{}@127.0.0.1:{}", i + 1, controller[i]))
            .collect::<Vec<_>>()
            .join(",");
        let ids: Vec<i32> = (1..=n as i32).collect();
        let mut nodes = Vec::new();
        for i in 0..n {
            let mut p = base_props(n);
            p.insert("node.id".into(), (i + 1).to_string());
            p.insert("controller.quorum.voters".into(), voters.clone());
            p.insert(
                "listeners".into(),
                format!(
                    "PLAINTEXT://127.0.0.1:{},INTERNAL://127.0.0.1:{},CONTROLLER://127.0.0.1:{}",
                    plain[i], internal[i], controller[i]
                ),
            );
            let client =
                advertised.map_or_else(|| format!("127.0.0.1:{}", plain[i]), |a| a[i].clone());
            p.insert(
                "advertised.listeners".into(),
                format!("PLAINTEXT://{client},INTERNAL://127.0.0.1:{}", internal[i]),
            );
            p.insert(
                "listener.security.protocol.map".into(),
                "PLAINTEXT:PLAINTEXT,INTERNAL:PLAINTEXT,CONTROLLER:PLAINTEXT".into(),
            );
            p.insert("inter.broker.listener.name".into(), "INTERNAL".into());
            let node_dir = dir.join(format!("node{}", i + 1));
            p.insert(
                "log.dirs".into(),
                node_dir.join("data").display().to_string(),
            );
            nodes.push(prepare_node(
                &node_dir,
                i as i32 + 1,
                plain[i],
                &p,
                &[],
                ids.clone(),
            ));
        }
        let started = Instant::now();
        for node in &mut nodes {
            node.spawn();
        }
        for node in &mut nodes {
            node.wait_ready(started);
        }
        TestCluster { nodes }
    }

    /// `host:port,host:port,…` of every node.
    pub fn bootstrap(&self) -> String {
        self.addrs().join(",")
    }

    /// Every node's PLAINTEXT address.
    pub fn addrs(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.addr.clone()).collect()
    }

    /// The node with broker id `id`.
    pub fn node(&mut self, id: i32) -> &mut KafkaNode {
        self.nodes
            .iter_mut()
            .find(|n| n.id == id)
            .unwrap_or_else(|| panic!("no node {id}"))
    }

    /// The address of a node that is running (for admin requests while another is down).
    pub fn live_addr(&mut self) -> String {
        self.nodes
            .iter_mut()
            .find_map(|n| n.is_running().then(|| n.addr.clone()))
            .expect("no node running")
    }

    /// Runs Kafka's `LeaderElectionCommand` (`kafka-leader-election.sh`) for one partition
    /// against a live node: `election` is `preferred` or `unclean` (an unclean election
    /// picks a live replica outside the ISR when the partition has no leader, whatever
    /// `unclean.leader.election.enable` says). Returns whether the tool succeeded, and its
    /// output.
    pub fn elect_leader(&mut self, election: &str, topic: &str, partition: i32) -> (bool, String) {
        let addr = self.live_addr();
        let out = Command::new(java())
            .args([
                "-Xmx256m",
                &format!(
                    "-Dlog4j2.configurationFile={}",
                    self.nodes[0].dir.join("log4j2.properties").display()
                ),
                "-cp",
                &classpath(),
                "org.apache.kafka.tools.LeaderElectionCommand",
                "--bootstrap-server",
                &addr,
                "--election-type",
                election,
                "--topic",
                topic,
                "--partition",
                &partition.to_string(),
            ])
            .stdin(Stdio::null())
            .output()
            .expect("run java LeaderElectionCommand");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.success(), text)
    }

    /// Creates a topic with replication factor = cluster size and waits for leaders.
    pub fn create_topic(&mut self, name: &str, partitions: i32) {
        let rf = self.nodes.len() as i16;
        let addr = self.live_addr();
        super::create_topic(&addr, name, partitions, rf);
    }
}
