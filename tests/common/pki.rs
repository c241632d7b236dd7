//! A throw-away PKI for the TLS listeners of the test broker, made with rcgen: a CA, a
//! server certificate for `localhost` and `127.0.0.1`, a client certificate signed by the
//! same CA (for mTLS) and an unrelated CA (for "wrong trust anchor" tests).

use std::path::{Path, PathBuf};

/// The certificates, as PEM strings and as the files the broker reads.
pub struct Pki {
    /// The test CA (what clients trust).
    pub ca_pem: String,
    /// A CA that signed nothing here.
    pub other_ca_pem: String,
    /// Client certificate signed by the test CA.
    pub client_cert_pem: String,
    /// Its PKCS#8 private key.
    pub client_key_pem: String,
    /// `ca.pem`: the broker's truststore (PEM).
    pub ca_file: PathBuf,
    /// `server-keystore.pem`: the server's PKCS#8 key followed by its certificate chain,
    /// Kafka's `ssl.keystore.type=PEM` layout (no password).
    pub server_keystore: PathBuf,
}

fn ca(name: &str) -> (rcgen::Certificate, rcgen::KeyPair) {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, name);
    (params.self_signed(&key).unwrap(), key)
}

fn leaf(
    names: &[&str],
    cn: &str,
    ca: &(rcgen::Certificate, rcgen::KeyPair),
) -> (rcgen::Certificate, rcgen::KeyPair) {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params =
        rcgen::CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>())
            .unwrap();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, cn);
    (params.signed_by(&key, &ca.0, &ca.1).unwrap(), key)
}

impl Pki {
    /// Generates everything and writes the broker's files into `dir`.
    pub fn generate(dir: &Path) -> Pki {
        let root = ca("kafkapipe test CA");
        let other = ca("some other CA");
        let server = leaf(&["localhost", "127.0.0.1"], "broker", &root);
        let client = leaf(&["client.local"], "kafkapipe test client", &root);
        let ca_file = dir.join("ca.pem");
        let server_keystore = dir.join("server-keystore.pem");
        std::fs::write(&ca_file, root.0.pem()).unwrap();
        std::fs::write(
            &server_keystore,
            format!(
                "{}{}{}",
                server.1.serialize_pem(),
                server.0.pem(),
                root.0.pem()
            ),
        )
        .unwrap();
        Pki {
            ca_pem: root.0.pem(),
            other_ca_pem: other.0.pem(),
            client_cert_pem: client.0.pem(),
            client_key_pem: client.1.serialize_pem(),
            ca_file,
            server_keystore,
        }
    }
}
