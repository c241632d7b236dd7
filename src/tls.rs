//! TLS settings for broker connections (rustls with the `ring` provider; cargo feature
//! `tls`, on by default). No OpenSSL.
//!
//! Build a [`TlsConfig`] and put it in
//! [`ConnectionConfig::tls`](crate::conn::ConnectionConfig::tls); every connection the
//! client opens (bootstrap, every broker) then speaks TLS, checking the broker's
//! certificate against the trusted roots and the host name of the address dialed (or
//! [`TlsConfigBuilder::server_name`]).
//!
//! Trust, as in the Java client and librdkafka: a configuration given no CA trusts the
//! operating system's roots (cargo feature `native-roots`, on by default, which reads
//! `SSL_CERT_FILE` / `SSL_CERT_DIR` when set, else the platform store), so
//! `TlsConfig::builder().build()` connects to a managed cluster with a public
//! certificate. A CA given with [`ca_file`](TlsConfigBuilder::ca_file),
//! [`ca_pem`](TlsConfigBuilder::ca_pem) or a truststore replaces the system roots (add
//! them back with [`native_roots`](TlsConfigBuilder::native_roots)).
//!
//! Keystores and truststores: PEM files, and PKCS#12 files (Java's
//! `ssl.keystore.type=PKCS12`; cargo feature `pkcs12`) through
//! [`keystore_file`](TlsConfigBuilder::keystore_file) and
//! [`truststore_file`](TlsConfigBuilder::truststore_file). JKS files are refused with a
//! message saying how to convert them.
//!
//! Host names are always verified unless
//! [`danger_accept_invalid_hostnames`](TlsConfigBuilder::danger_accept_invalid_hostnames)
//! turns that off (Java's `ssl.endpoint.identification.algorithm=`); a mismatch fails the
//! handshake with an error saying "hostname mismatch".
//!
//! ```no_run
//! use kafkapipe::conn::ConnectionConfig;
//! use kafkapipe::tls::TlsConfig;
//!
//! # fn demo() -> kafkapipe::Result<()> {
//! let tls = TlsConfig::builder()
//!     .ca_file("/etc/kafka/ca.pem")?
//!     .client_cert_files("/etc/kafka/client.pem", "/etc/kafka/client.key")? // mTLS
//!     .build()?;
//! let config = ConnectionConfig::new().tls(tls);
//! # Ok(()) }
//! ```

use std::fmt;
use std::path::Path;
use std::sync::Arc;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio_rustls::client::TlsStream;
use tokio_rustls::rustls;
use tokio_rustls::TlsConnector;

use crate::error::{Error, ErrorKind, Result};

mod verify;

/// TLS settings: trusted roots, optional client certificate, optional server name.
///
/// Cheap to clone (an `Arc` around the rustls configuration). `Debug` output never shows
/// key material.
#[derive(Clone)]
pub struct TlsConfig {
    client: Arc<rustls::ClientConfig>,
    server_name: Option<String>,
}

impl TlsConfig {
    /// A builder with no CA given yet: built as it is, it trusts the system roots
    /// (feature `native-roots`, on by default).
    ///
    /// ```no_run
    /// // A managed cluster with a publicly trusted certificate: nothing to configure.
    /// let tls = kafkapipe::tls::TlsConfig::builder().build()?;
    /// # Ok::<(), kafkapipe::Error>(())
    /// ```
    pub fn builder() -> TlsConfigBuilder {
        TlsConfigBuilder {
            roots: rustls::RootCertStore::empty(),
            system_roots: false,
            client_auth: None,
            server_name: None,
            accept_invalid_hostnames: false,
        }
    }

    /// Use a rustls client configuration built by the caller (custom verifiers, ALPN…).
    ///
    /// ```no_run
    /// # fn demo(config: std::sync::Arc<tokio_rustls::rustls::ClientConfig>) {
    /// let tls = kafkapipe::tls::TlsConfig::from_rustls(config);
    /// # }
    /// ```
    pub fn from_rustls(config: Arc<rustls::ClientConfig>) -> Self {
        TlsConfig {
            client: config,
            server_name: None,
        }
    }

    /// Check the broker certificates against `name` instead of the host being dialed
    /// (useful when brokers are reached through addresses not in their certificates).
    ///
    /// ```
    /// # fn demo(tls: kafkapipe::tls::TlsConfig) {
    /// let tls = tls.with_server_name("kafka.internal.example.com");
    /// # }
    /// ```
    pub fn with_server_name(mut self, name: impl Into<String>) -> Self {
        self.server_name = Some(name.into());
        self
    }

    /// The TLS handshake over `tcp` to the broker `addr` (`host:port`).
    pub(crate) async fn handshake<S>(&self, tcp: S, addr: &str) -> Result<TlsStream<S>>
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    {
        let host = match &self.server_name {
            Some(n) => n.clone(),
            None => host_of(addr).to_string(),
        };
        let name = ServerName::try_from(host.clone()).map_err(|e| {
            Error::config(format!("invalid TLS server name {host:?}: {e}")).with_broker(addr)
        })?;
        TlsConnector::from(Arc::clone(&self.client))
            .connect(name, tcp)
            .await
            .map_err(|e| {
                let kind = if e.kind() == std::io::ErrorKind::TimedOut {
                    ErrorKind::Timeout
                } else {
                    ErrorKind::Tls
                };
                let message = if is_name_mismatch(&e) {
                    format!(
                        "TLS hostname mismatch: the certificate of {host:?} does not name it \
                         (dial a name the certificate has, set the server name, or turn \
                         hostname verification off with danger_accept_invalid_hostnames)"
                    )
                } else {
                    format!("TLS handshake with {host:?} failed")
                };
                Error::new(kind, message).with_broker(addr).with_source(e)
            })
    }
}

/// Whether a handshake failed because the certificate does not name the host.
fn is_name_mismatch(e: &std::io::Error) -> bool {
    use rustls::{CertificateError, Error as TlsError};
    matches!(
        e.get_ref()
            .and_then(|inner| inner.downcast_ref::<TlsError>()),
        Some(TlsError::InvalidCertificate(
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. }
        ))
    )
}

/// The host part of `host:port`, `[v6]:port` or a bare host.
fn host_of(addr: &str) -> &str {
    if let Some(rest) = addr.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    match addr.rsplit_once(':') {
        Some((host, port)) if !host.contains(':') && port.parse::<u16>().is_ok() => host,
        _ => addr,
    }
}

impl fmt::Debug for TlsConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsConfig")
            .field("server_name", &self.server_name)
            .field(
                "client_certificate",
                &self.client.client_auth_cert_resolver.has_certs(),
            )
            .finish_non_exhaustive()
    }
}

impl PartialEq for TlsConfig {
    /// Equal when they share the same rustls configuration and server name.
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.client, &other.client) && self.server_name == other.server_name
    }
}

impl Eq for TlsConfig {}

/// Builds a [`TlsConfig`]; see [`TlsConfig::builder`].
pub struct TlsConfigBuilder {
    roots: rustls::RootCertStore,
    /// `native_roots` was called (the roots are in `roots`).
    system_roots: bool,
    client_auth: Option<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)>,
    server_name: Option<String>,
    accept_invalid_hostnames: bool,
}

impl fmt::Debug for TlsConfigBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsConfigBuilder")
            .field("roots", &self.roots.len())
            .field("system_roots", &self.system_roots)
            .field("client_certificate", &self.client_auth.is_some())
            .field("server_name", &self.server_name)
            .field("accept_invalid_hostnames", &self.accept_invalid_hostnames)
            .finish()
    }
}

/// What a keystore or truststore file holds, told from its first bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StoreFormat {
    Pem,
    Pkcs12,
    Jks,
}

fn store_format(data: &[u8]) -> StoreFormat {
    let text = data.trim_ascii_start();
    if text.starts_with(b"-----BEGIN") {
        StoreFormat::Pem
    } else if data.starts_with(&[0xFE, 0xED, 0xFE, 0xED])
        || data.starts_with(&[0xCE, 0xCE, 0xCE, 0xCE])
    {
        StoreFormat::Jks
    } else {
        // DER (a SEQUENCE); anything else fails in the PKCS#12 parser with its reason.
        StoreFormat::Pkcs12
    }
}

fn jks_error(what: &str, path: &Path) -> Error {
    Error::config(format!(
        "{what} {} is a Java KeyStore (JKS), which is not supported: convert it with \
         `keytool -importkeystore -srckeystore {0} -destkeystore store.p12 -deststoretype PKCS12`",
        path.display()
    ))
}

fn pem_error(what: &str, e: impl fmt::Display) -> Error {
    Error::config(format!("{what}: {e}"))
}

fn read(path: &Path, what: &str) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| {
        Error::new(
            ErrorKind::Config,
            format!("reading {what} {}", path.display()),
        )
        .with_source(e)
    })
}

impl TlsConfigBuilder {
    /// Trust the CA certificates in `pem` (one or more `CERTIFICATE` blocks) instead of
    /// the system roots.
    ///
    /// ```no_run
    /// let pem = std::fs::read("/etc/kafka/ca.pem")?;
    /// let tls = kafkapipe::tls::TlsConfig::builder().ca_pem(&pem)?.build()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// `Config` if the PEM holds no certificate or one cannot be parsed.
    pub fn ca_pem(mut self, pem: &[u8]) -> Result<Self> {
        let mut n = 0;
        for cert in CertificateDer::pem_slice_iter(pem) {
            let cert = cert.map_err(|e| pem_error("invalid CA certificate PEM", e))?;
            self.roots
                .add(cert)
                .map_err(|e| pem_error("unusable CA certificate", e))?;
            n += 1;
        }
        if n == 0 {
            return Err(Error::config("CA PEM contains no certificate"));
        }
        Ok(self)
    }

    /// Trust the CA certificates in the PEM file at `path` instead of the system roots
    /// (librdkafka `ssl.ca.location`).
    ///
    /// ```no_run
    /// let tls = kafkapipe::tls::TlsConfig::builder().ca_file("/etc/kafka/ca.pem")?.build()?;
    /// # Ok::<(), kafkapipe::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// `Config` if the file cannot be read or parsed.
    pub fn ca_file(self, path: impl AsRef<Path>) -> Result<Self> {
        let pem = read(path.as_ref(), "CA file")?;
        self.ca_pem(&pem)
    }

    /// Trust the Mozilla root certificates compiled into the `webpki-roots` crate.
    ///
    /// ```
    /// let tls = kafkapipe::tls::TlsConfig::builder().webpki_roots().build().unwrap();
    /// ```
    #[cfg(feature = "webpki-roots")]
    pub fn webpki_roots(mut self) -> Self {
        self.roots
            .extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
        self
    }

    /// Trust the operating system's root certificates (`rustls-native-certs`: the files
    /// named by `SSL_CERT_FILE` and the directories in `SSL_CERT_DIR` when either is set,
    /// else the platform's store), in addition to any CA given. A builder given no CA
    /// does this on its own in [`build`](Self::build).
    ///
    /// ```no_run
    /// let tls = kafkapipe::tls::TlsConfig::builder()
    ///     .ca_file("/etc/kafka/private-ca.pem")?
    ///     .native_roots()? // and the public CAs too
    ///     .build()?;
    /// # Ok::<(), kafkapipe::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// `Config` if no system certificate could be loaded.
    #[cfg(feature = "native-roots")]
    pub fn native_roots(mut self) -> Result<Self> {
        let found = rustls_native_certs::load_native_certs();
        let errors = found.errors.len();
        let (added, _ignored) = self.roots.add_parsable_certificates(found.certs);
        if added == 0 {
            let first = found
                .errors
                .first()
                .map(|e| format!(": {e}"))
                .unwrap_or_default();
            return Err(Error::config(format!(
                "no usable system root certificates (SSL_CERT_FILE / SSL_CERT_DIR or the \
                 platform store; {errors} errors{first})"
            )));
        }
        tracing::debug!(roots = added, errors, "loaded system root certificates");
        self.system_roots = true;
        Ok(self)
    }

    /// Present a client certificate (mutual TLS): `cert_pem` holds the certificate chain
    /// (leaf first), `key_pem` its private key (PKCS#8, PKCS#1 or SEC1, unencrypted).
    /// Both may be the same text (Java's PEM keystore: key and chain in one file).
    ///
    /// ```no_run
    /// let cert = std::fs::read("/etc/kafka/client.pem")?;
    /// let key = std::fs::read("/etc/kafka/client.key")?;
    /// let tls = kafkapipe::tls::TlsConfig::builder().client_cert_pem(&cert, &key)?.build()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// `Config` if either PEM cannot be parsed.
    pub fn client_cert_pem(mut self, cert_pem: &[u8], key_pem: &[u8]) -> Result<Self> {
        let chain = CertificateDer::pem_slice_iter(cert_pem)
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|e| pem_error("invalid client certificate PEM", e))?;
        if chain.is_empty() {
            return Err(Error::config(
                "client certificate PEM contains no certificate",
            ));
        }
        // The parse error names no key bytes.
        let key = PrivateKeyDer::from_pem_slice(key_pem)
            .map_err(|e| pem_error("invalid client private key PEM", e))?;
        self.client_auth = Some((chain, key));
        Ok(self)
    }

    /// Like [`client_cert_pem`](Self::client_cert_pem), reading both PEM files
    /// (librdkafka `ssl.certificate.location` and `ssl.key.location`).
    ///
    /// ```no_run
    /// let tls = kafkapipe::tls::TlsConfig::builder()
    ///     .client_cert_files("/etc/kafka/client.pem", "/etc/kafka/client.key")?
    ///     .build()?;
    /// # Ok::<(), kafkapipe::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// `Config` if a file cannot be read or parsed.
    pub fn client_cert_files(
        self,
        cert_path: impl AsRef<Path>,
        key_path: impl AsRef<Path>,
    ) -> Result<Self> {
        let cert = read(cert_path.as_ref(), "client certificate file")?;
        let key = read(key_path.as_ref(), "client key file")?;
        self.client_cert_pem(&cert, &key)
    }

    /// Present the client certificate and key of a keystore file (Java
    /// `ssl.keystore.location` / `ssl.keystore.password`; librdkafka's PKCS#12
    /// `ssl.keystore.location`): a PEM file holding the unencrypted key and the
    /// certificate chain (Java's `ssl.keystore.type=PEM`; `password` unused), or a
    /// PKCS#12 file (feature `pkcs12`) opened with `password` (`""` when it has none).
    /// The format is told from the file's content; a JKS file is refused with the
    /// `keytool` command that converts it.
    ///
    /// ```no_run
    /// let tls = kafkapipe::tls::TlsConfig::builder()
    ///     .keystore_file("/etc/kafka/client.p12", "keystore-password")?
    ///     .build()?;
    /// # Ok::<(), kafkapipe::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// `Config` if the file cannot be read or parsed, the password is wrong, it holds no
    /// private key, or it is PKCS#12 and the feature is off.
    pub fn keystore_file(self, path: impl AsRef<Path>, password: &str) -> Result<Self> {
        let path = path.as_ref();
        let data = read(path, "keystore")?;
        match store_format(&data) {
            StoreFormat::Pem => self.client_cert_pem(&data, &data),
            StoreFormat::Jks => Err(jks_error("keystore", path)),
            StoreFormat::Pkcs12 => self
                .pkcs12_keystore(&data, password)
                .map_err(|e| in_file(e, "keystore", path)),
        }
    }

    /// Trust the certificates of a truststore file (Java `ssl.truststore.location` /
    /// `ssl.truststore.password`) instead of the system roots: PEM certificates, or a
    /// PKCS#12 file (feature `pkcs12`) of trusted certificate entries as `keytool
    /// -importcert -storetype PKCS12` writes them. The format is told from the content.
    ///
    /// ```no_run
    /// let tls = kafkapipe::tls::TlsConfig::builder()
    ///     .truststore_file("/etc/kafka/truststore.p12", "truststore-password")?
    ///     .build()?;
    /// # Ok::<(), kafkapipe::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// `Config` if the file cannot be read or parsed, the password is wrong, or it holds
    /// no trusted certificate.
    pub fn truststore_file(self, path: impl AsRef<Path>, password: &str) -> Result<Self> {
        let path = path.as_ref();
        let data = read(path, "truststore")?;
        match store_format(&data) {
            StoreFormat::Pem => self
                .ca_pem(&data)
                .map_err(|e| in_file(e, "truststore", path)),
            StoreFormat::Jks => Err(jks_error("truststore", path)),
            StoreFormat::Pkcs12 => self
                .pkcs12_truststore(&data, password)
                .map_err(|e| in_file(e, "truststore", path)),
        }
    }

    /// Present the private key and certificate chain of a PKCS#12 keystore (DER bytes,
    /// opened with `password`). PBES2/AES (what Java and OpenSSL 3 write) and the legacy
    /// 3DES/RC2 encryptions are read.
    ///
    /// ```no_run
    /// let p12 = std::fs::read("/etc/kafka/client.p12")?;
    /// let tls = kafkapipe::tls::TlsConfig::builder().pkcs12_keystore(&p12, "secret")?.build()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// `Config` if it cannot be parsed (a wrong password shows as a MAC or decryption
    /// failure) or holds no private key.
    pub fn pkcs12_keystore(mut self, der: &[u8], password: &str) -> Result<Self> {
        self.client_auth = Some(pkcs12::key_chain(der, password)?);
        Ok(self)
    }

    /// Trust the trusted-certificate entries of a PKCS#12 truststore (DER bytes, opened
    /// with `password`) instead of the system roots.
    ///
    /// ```no_run
    /// let p12 = std::fs::read("/etc/kafka/truststore.p12")?;
    /// let tls = kafkapipe::tls::TlsConfig::builder().pkcs12_truststore(&p12, "secret")?.build()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// `Config` if it cannot be parsed or holds no trusted certificate.
    pub fn pkcs12_truststore(mut self, der: &[u8], password: &str) -> Result<Self> {
        for cert in pkcs12::trusted_certs(der, password)? {
            self.roots
                .add(cert)
                .map_err(|e| pem_error("unusable truststore certificate", e))?;
        }
        Ok(self)
    }

    /// Verify broker certificates against `name` instead of the host being dialed.
    ///
    /// ```
    /// let builder = kafkapipe::tls::TlsConfig::builder().server_name("kafka.example.com");
    /// ```
    pub fn server_name(mut self, name: impl Into<String>) -> Self {
        self.server_name = Some(name.into());
        self
    }

    /// **Dangerous**: accept a broker certificate that does not name the host dialed (or
    /// [`server_name`](Self::server_name)), as long as it chains to a trusted root. Off by
    /// default; Java's `ssl.endpoint.identification.algorithm=` (empty) and librdkafka's
    /// `ssl.endpoint.identification.algorithm=none`. Anyone holding any certificate from
    /// the trusted CAs can then impersonate the brokers: prefer
    /// [`server_name`](Self::server_name), or a certificate that names the advertised
    /// addresses. The certificate chain, its validity dates and the handshake signatures
    /// are still checked.
    ///
    /// ```
    /// let builder = kafkapipe::tls::TlsConfig::builder().danger_accept_invalid_hostnames(true);
    /// ```
    pub fn danger_accept_invalid_hostnames(mut self, accept: bool) -> Self {
        self.accept_invalid_hostnames = accept;
        self
    }

    /// The finished configuration (TLS 1.2 and 1.3, rustls' safe defaults). Given no CA,
    /// it trusts the system roots (feature `native-roots`).
    ///
    /// ```no_run
    /// let tls = kafkapipe::tls::TlsConfig::builder().build()?;
    /// # Ok::<(), kafkapipe::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// `Config` if no root certificate was added and the system has none (or feature
    /// `native-roots` is off), or the client key does not fit its certificate.
    pub fn build(mut self) -> Result<TlsConfig> {
        if self.roots.is_empty() && !self.system_roots {
            self = self.default_roots()?;
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
            .map_err(|e| pem_error("TLS protocol versions", e))?;
        let builder = if self.accept_invalid_hostnames {
            tracing::warn!("TLS hostname verification is off (danger_accept_invalid_hostnames)");
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(verify::AnyHostname::new(
                    self.roots, provider,
                )))
        } else {
            builder.with_root_certificates(self.roots)
        };
        let client = match self.client_auth {
            Some((chain, key)) => builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| pem_error("unusable client certificate or key", e))?,
            None => builder.with_no_client_auth(),
        };
        Ok(TlsConfig {
            client: Arc::new(client),
            server_name: self.server_name,
        })
    }

    #[cfg(feature = "native-roots")]
    fn default_roots(self) -> Result<Self> {
        self.native_roots()
    }

    #[cfg(not(feature = "native-roots"))]
    fn default_roots(self) -> Result<Self> {
        Err(Error::config(
            "TLS needs at least one trusted root: call ca_pem, ca_file, truststore_file, \
             webpki_roots, or enable the `native-roots` feature for the system roots",
        ))
    }
}

/// `e`, saying which file it came from.
fn in_file(e: Error, what: &str, path: &Path) -> Error {
    Error::config(format!("{what} {}: {e}", path.display()))
}

/// PKCS#12 parsing (feature `pkcs12`).
#[cfg(feature = "pkcs12")]
mod pkcs12 {
    use p12_keystore::{KeyStore, KeyStoreEntry};
    use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

    use crate::error::{Error, Result};

    type KeyChain = (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>);

    fn open(der: &[u8], password: &str) -> Result<KeyStore> {
        // The parser's messages name no secret.
        KeyStore::from_pkcs12(der, password).map_err(|e| {
            Error::config(format!(
                "cannot open the PKCS#12 file (wrong password or damaged file): {e}"
            ))
        })
    }

    /// The first private key and its certificate chain (leaf first).
    pub(super) fn key_chain(der: &[u8], password: &str) -> Result<KeyChain> {
        let store = open(der, password)?;
        let Some((_alias, chain)) = store.private_key_chain() else {
            return Err(Error::config("the PKCS#12 keystore holds no private key"));
        };
        let certs: Vec<CertificateDer<'static>> = chain
            .chain()
            .iter()
            .map(|c| CertificateDer::from(c.as_der().to_vec()))
            .collect();
        if certs.is_empty() {
            return Err(Error::config(
                "the PKCS#12 keystore's private key has no certificate",
            ));
        }
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(chain.key().to_vec()));
        Ok((certs, key))
    }

    /// The trusted certificate entries.
    pub(super) fn trusted_certs(
        der: &[u8],
        password: &str,
    ) -> Result<Vec<CertificateDer<'static>>> {
        let store = open(der, password)?;
        let certs: Vec<_> = store
            .entries()
            .filter_map(|(_, e)| match e {
                KeyStoreEntry::Certificate(c) => Some(CertificateDer::from(c.as_der().to_vec())),
                KeyStoreEntry::PrivateKeyChain(_) => None,
            })
            .collect();
        if certs.is_empty() {
            return Err(Error::config(
                "the PKCS#12 truststore holds no trusted certificate entry (Java's keytool \
                 -importcert writes them; OpenSSL needs -jdktrust anyExtendedKeyUsage)",
            ));
        }
        Ok(certs)
    }
}

/// Without the `pkcs12` feature: every PKCS#12 input is a configuration error.
#[cfg(not(feature = "pkcs12"))]
mod pkcs12 {
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};

    use crate::error::{Error, Result};

    fn off() -> Error {
        Error::config("PKCS#12 keystores need the `pkcs12` cargo feature")
    }

    pub(super) fn key_chain(
        _der: &[u8],
        _password: &str,
    ) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)> {
        Err(off())
    }

    pub(super) fn trusted_certs(
        _der: &[u8],
        _password: &str,
    ) -> Result<Vec<CertificateDer<'static>>> {
        Err(off())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ca() -> rcgen::CertifiedKey {
        rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap()
    }

    #[test]
    fn host_of_handles_ports_and_ipv6() {
        assert_eq!(host_of("broker:9092"), "broker");
        assert_eq!(host_of("127.0.0.1:9092"), "127.0.0.1");
        assert_eq!(host_of("[::1]:9092"), "::1");
        assert_eq!(host_of("broker"), "broker");
    }

    #[test]
    fn builder_parses_pem_and_hides_keys() {
        let root = ca();
        let client = ca();
        let tls = TlsConfig::builder()
            .ca_pem(root.cert.pem().as_bytes())
            .unwrap()
            .client_cert_pem(
                client.cert.pem().as_bytes(),
                client.key_pair.serialize_pem().as_bytes(),
            )
            .unwrap()
            .server_name("localhost")
            .build()
            .unwrap();
        let d = format!("{tls:?}");
        assert!(d.contains("client_certificate: true"), "{d}");
        assert!(!d.contains("PRIVATE"), "{d}");
        assert_eq!(tls.clone(), tls);
    }

    #[test]
    fn bad_pem_is_a_config_error() {
        let e = TlsConfig::builder().ca_pem(b"not a pem").unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Config);
        let e = TlsConfig::builder()
            .client_cert_pem(ca().cert.pem().as_bytes(), b"nope")
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Config);
        let e = TlsConfig::builder()
            .ca_file("/nonexistent/ca.pem")
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Config);
    }

    fn temp_file(name: &str, data: &[u8]) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("kafkapipe-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(name);
        std::fs::write(&path, data).unwrap();
        path
    }

    #[test]
    fn store_formats_are_told_apart() {
        assert_eq!(
            store_format(b"\n-----BEGIN CERTIFICATE-----"),
            StoreFormat::Pem
        );
        assert_eq!(
            store_format(&[0xFE, 0xED, 0xFE, 0xED, 0, 0]),
            StoreFormat::Jks
        );
        assert_eq!(store_format(&[0x30, 0x82, 0x01]), StoreFormat::Pkcs12);
    }

    #[test]
    fn pem_keystore_and_truststore_files() {
        let root = ca();
        let client = ca();
        // Java's PEM keystore layout: key, then the chain, in one file.
        let keystore = temp_file(
            "keystore.pem",
            format!("{}{}", client.key_pair.serialize_pem(), client.cert.pem()).as_bytes(),
        );
        let truststore = temp_file("truststore.pem", root.cert.pem().as_bytes());
        let tls = TlsConfig::builder()
            .truststore_file(&truststore, "")
            .unwrap()
            .keystore_file(&keystore, "")
            .unwrap()
            .build()
            .unwrap();
        assert!(format!("{tls:?}").contains("client_certificate: true"));
    }

    #[test]
    fn jks_files_are_refused_with_the_conversion_command() {
        let jks = temp_file("store.jks", &[0xFE, 0xED, 0xFE, 0xED, 0, 0, 0, 2]);
        let e = TlsConfig::builder().keystore_file(&jks, "x").unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Config);
        assert!(e.to_string().contains("JKS"), "{e}");
        assert!(e.to_string().contains("keytool -importkeystore"), "{e}");
        let e = TlsConfig::builder().truststore_file(&jks, "x").unwrap_err();
        assert!(e.to_string().contains("JKS"), "{e}");
    }

    #[test]
    fn accepting_invalid_hostnames_is_visible_in_debug_of_the_builder() {
        let b = TlsConfig::builder()
            .ca_pem(ca().cert.pem().as_bytes())
            .unwrap()
            .danger_accept_invalid_hostnames(true);
        assert!(format!("{b:?}").contains("accept_invalid_hostnames: true"));
        b.build().unwrap();
    }

    #[cfg(feature = "pkcs12")]
    mod pkcs12_files {
        use super::*;
        use p12_keystore::{Certificate, KeyStore, KeyStoreEntry, PrivateKeyChain};

        fn p12(client: &rcgen::CertifiedKey, trusted: &rcgen::CertifiedKey) -> Vec<u8> {
            let mut store = KeyStore::new();
            let cert = Certificate::from_der(client.cert.der()).unwrap();
            store.add_entry(
                "client",
                KeyStoreEntry::PrivateKeyChain(PrivateKeyChain::new(
                    client.key_pair.serialize_der(),
                    [1u8; 20],
                    [cert],
                )),
            );
            store.add_entry(
                "ca",
                KeyStoreEntry::Certificate(Certificate::from_der(trusted.cert.der()).unwrap()),
            );
            store.writer("store-secret").write().unwrap()
        }

        #[test]
        fn keystore_and_truststore_are_read() {
            let (client, root) = (ca(), ca());
            let path = temp_file("store.p12", &p12(&client, &root));
            let tls = TlsConfig::builder()
                .truststore_file(&path, "store-secret")
                .unwrap()
                .keystore_file(&path, "store-secret")
                .unwrap()
                .build()
                .unwrap();
            assert!(format!("{tls:?}").contains("client_certificate: true"));
        }

        #[test]
        fn wrong_password_names_the_file_and_not_the_password() {
            let path = temp_file("wrong.p12", &p12(&ca(), &ca()));
            let e = TlsConfig::builder()
                .keystore_file(&path, "not-the-secret")
                .unwrap_err();
            assert_eq!(e.kind(), ErrorKind::Config);
            let text = format!("{e} {e:?}");
            assert!(text.contains("wrong.p12"), "{text}");
            assert!(text.contains("wrong password"), "{text}");
            assert!(!text.contains("not-the-secret"), "{text}");
        }

        #[test]
        fn a_keystore_without_trusted_entries_is_no_truststore() {
            let client = ca();
            let mut store = KeyStore::new();
            store.add_entry(
                "client",
                KeyStoreEntry::PrivateKeyChain(PrivateKeyChain::new(
                    client.key_pair.serialize_der(),
                    [1u8; 20],
                    [Certificate::from_der(client.cert.der()).unwrap()],
                )),
            );
            let der = store.writer("pw").write().unwrap();
            let e = TlsConfig::builder()
                .pkcs12_truststore(&der, "pw")
                .unwrap_err();
            assert!(e.to_string().contains("no trusted certificate"), "{e}");
        }
    }
}
