//! An MIT Kerberos KDC (Debian `krb5-kdc`, `krb5-admin-server` for `kadmin.local`)
//! started unprivileged in a temporary directory, and a broker with a GSSAPI listener.
//!
//! The realm [`REALM`] lives in `<dir>/principal`, made by `kdb5_util create -s`; its
//! `krb5.conf` and `kdc.conf` are pointed at by `KRB5_CONFIG` / `KRB5_KDC_PROFILE` (the
//! KDC's environment, and this test process's once the KDC is up, so the client library
//! finds the realm). Host names are used as given (`rdns = false`,
//! `dns_canonicalize_hostname = false`): the broker's service principal is
//! `kafka/localhost`, and its GSSAPI listener is advertised as `localhost:PORT`.

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use super::kafka::{start_single_advertised, KafkaNode};
use super::{free_port, temp_dir, Watched};

/// The test realm.
pub const REALM: &str = "KAFKAPIPE.TEST";

/// The GSSAPI listener ends sessions after this long unless the client re-authenticates
/// (KIP-368, `connections.max.reauth.ms`).
pub const REAUTH_MS: u64 = 2000;

/// The KDC process and its files.
pub struct Kdc {
    /// The directory holding the database, configs and keytabs.
    pub dir: PathBuf,
    /// `krb5.conf` for clients (`KRB5_CONFIG`, Java's `java.security.krb5.conf`).
    pub krb5_conf: PathBuf,
    kdc_conf: PathBuf,
    process: Watched,
}

/// Whether the MIT KDC tools are installed (scripts/lib/kafka.sh `krb5_ensure`).
pub fn tools_present() -> bool {
    ["krb5kdc", "kdb5_util", "kadmin.local"].iter().all(|t| {
        ["/usr/sbin", "/usr/bin", "/sbin", "/bin"]
            .iter()
            .any(|d| Path::new(d).join(t).exists())
    })
}

impl Kdc {
    /// Creates the realm and starts `krb5kdc -n` on a free port; returns once it accepts
    /// TCP connections.
    pub fn start() -> Kdc {
        let dir = temp_dir("kdc");
        std::fs::create_dir_all(&dir).unwrap();
        let port = free_port();
        let d = dir.display();
        let krb5_conf = dir.join("krb5.conf");
        std::fs::write(
            &krb5_conf,
            format!(
                "[libdefaults]\n default_realm = {REALM}\n dns_lookup_kdc = false\n \
                 dns_lookup_realm = false\n rdns = false\n dns_canonicalize_hostname = false\n \
                 udp_preference_limit = 1\n default_ccache_name = FILE:{d}/ccache\n \
                 ticket_lifetime = 1h\n\
                 [realms]\n {REALM} = {{\n  kdc = 127.0.0.1:{port}\n }}\n\
                 [domain_realm]\n localhost = {REALM}\n"
            ),
        )
        .unwrap();
        let kdc_conf = dir.join("kdc.conf");
        std::fs::write(
            &kdc_conf,
            format!(
                "[kdcdefaults]\n kdc_ports = {port}\n kdc_tcp_ports = {port}\n\
                 [realms]\n {REALM} = {{\n  database_name = {d}/principal\n  \
                 key_stash_file = {d}/stash\n  acl_file = {d}/kadm5.acl\n  max_life = 1h\n }}\n\
                 [logging]\n kdc = FILE:{d}/kdc.log\n"
            ),
        )
        .unwrap();
        run(
            &dir,
            &krb5_conf,
            &kdc_conf,
            "kdb5_util",
            &["create", "-s", "-r", REALM, "-P", "kafkapipe-master"],
        );
        let env_conf = format!("KRB5_CONFIG={}", krb5_conf.display());
        let env_profile = format!("KRB5_KDC_PROFILE={}", kdc_conf.display());
        let process = Watched::spawn(
            "env",
            &[&env_conf, &env_profile, "krb5kdc", "-n", "-r", REALM],
            &dir,
            dir.join("krb5kdc.out"),
        );
        let mut kdc = Kdc {
            dir: dir.clone(),
            krb5_conf,
            kdc_conf,
            process,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                !kdc.process.exited(),
                "krb5kdc exited: {}",
                kdc.process.log_text()
            );
            assert!(
                Instant::now() < deadline,
                "krb5kdc not listening on {port}: {}",
                kdc.process.log_text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        kdc
    }

    fn kadmin(&self, query: &str) -> String {
        let text = run(
            &self.dir,
            &self.krb5_conf,
            &self.kdc_conf,
            "kadmin.local",
            &["-r", REALM, "-q", query],
        );
        // kadmin.local exits 0 even when the query fails; it prints
        // "kadmin.local: <reason>" then.
        assert!(
            !text.contains("kadmin.local: "),
            "kadmin.local -q {query:?}: {text}"
        );
        text
    }

    /// Adds `principal` (without realm) with a random key and writes its key to a new
    /// keytab `<name>.keytab`; returns the keytab's path.
    pub fn add_principal(&self, principal: &str, keytab: &str) -> PathBuf {
        self.kadmin(&format!("addprinc -randkey {principal}"));
        let path = self.dir.join(format!("{keytab}.keytab"));
        self.kadmin(&format!("ktadd -k {} {principal}", path.display()));
        path
    }

    /// Deletes `principal` from the database (its keytab stays).
    pub fn delete_principal(&self, principal: &str) {
        self.kadmin(&format!("delprinc -force {principal}"));
    }

    /// The KDC's log.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(self.dir.join("kdc.log")).unwrap_or_default()
    }
}

/// Runs a Kerberos admin tool against the realm in `dir`; its output.
fn run(dir: &Path, krb5_conf: &Path, kdc_conf: &Path, program: &str, args: &[&str]) -> String {
    let out = Command::new(program)
        .args(args)
        .env("KRB5_CONFIG", krb5_conf)
        .env("KRB5_KDC_PROFILE", kdc_conf)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| panic!("run {program} (is krb5-kdc installed?): {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{program} {args:?} failed: {text}");
    text
}

/// A KDC and a broker whose `GSSAPI` listener (SASL_PLAINTEXT, mechanism GSSAPI, service
/// name `kafka`) authenticates with the keytab of `kafka/localhost@REALM`; sessions last
/// [`REAUTH_MS`], so every client connection re-authenticates while it lives.
pub struct GssapiBroker {
    /// The PLAINTEXT listener (topic creation).
    pub addr: String,
    /// The GSSAPI listener, `localhost:PORT`.
    pub gssapi_addr: String,
    /// The KDC.
    pub kdc: Kdc,
    /// The broker.
    pub node: KafkaNode,
}

impl GssapiBroker {
    /// Starts the KDC, adds the broker's principal, points this process's Kerberos
    /// library at the realm (`KRB5_CONFIG`), then starts the broker.
    pub fn start() -> GssapiBroker {
        let kdc = Kdc::start();
        let keytab = kdc.add_principal("kafka/localhost", "broker");
        // SAFETY of the env change: done once, before this process uses Kerberos.
        std::env::set_var("KRB5_CONFIG", &kdc.krb5_conf);
        std::env::set_var(
            "KRB5CCNAME",
            format!("FILE:{}/client-ccache", kdc.dir.display()),
        );
        let jaas = format!(
            "com.sun.security.auth.module.Krb5LoginModule required useKeyTab=true \
             storeKey=true keyTab=\"{}\" principal=\"kafka/localhost@{REALM}\";",
            keytab.display()
        );
        let props: Vec<(String, String)> = [
            (
                "listener.name.gssapi.sasl.enabled.mechanisms",
                "GSSAPI".to_string(),
            ),
            ("listener.name.gssapi.gssapi.sasl.jaas.config", jaas),
            ("sasl.kerberos.service.name", "kafka".to_string()),
            (
                "listener.name.gssapi.gssapi.connections.max.reauth.ms",
                REAUTH_MS.to_string(),
            ),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        let jvm = [format!(
            "-Djava.security.krb5.conf={}",
            kdc.krb5_conf.display()
        )];
        let (node, addrs) = start_single_advertised(
            "kafka-gssapi",
            &[("GSSAPI", "SASL_PLAINTEXT")],
            &props,
            &jvm,
            "localhost",
        );
        GssapiBroker {
            addr: node.addr.clone(),
            gssapi_addr: addrs[0].clone(),
            kdc,
            node,
        }
    }

    /// Creates `name` and waits for its leaders.
    pub fn create_topic(&self, name: &str, partitions: i32) {
        super::create_topic(&self.addr, name, partitions, 1);
    }
}
