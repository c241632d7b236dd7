//! TLS settings for broker connections (rustls with the `ring` provider; cargo feature
//! `tls`, on by default). No OpenSSL.
//!
//! Build a [`TlsConfig`] and put it in
//! [`ConnectionConfig::tls`](crate::conn::ConnectionConfig::tls); every connection the
//! client opens (bootstrap, every broker) then speaks TLS, checking the broker's
//! certificate against the given roots and the host name of the address dialed (or
//! [`TlsConfigBuilder::server_name`]).
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
//! let config = ConnectionConfig { tls: Some(tls), ..ConnectionConfig::default() };
//! # Ok(()) }
//! ```

use std::fmt;
use std::path::Path;
use std::sync::Arc;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::rustls;
use tokio_rustls::TlsConnector;

use crate::error::{Error, ErrorKind, Result};

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
    /// A builder with no trusted roots yet.
    ///
    /// ```
    /// let builder = kafkapipe::tls::TlsConfig::builder();
    /// assert!(builder.build().is_err(), "no roots configured");
    /// ```
    pub fn builder() -> TlsConfigBuilder {
        TlsConfigBuilder {
            roots: rustls::RootCertStore::empty(),
            client_auth: None,
            server_name: None,
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
    pub fn with_server_name(mut self, name: impl Into<String>) -> Self {
        self.server_name = Some(name.into());
        self
    }

    /// The TLS handshake over `tcp` to the broker `addr` (`host:port`).
    pub(crate) async fn handshake(
        &self,
        tcp: TcpStream,
        addr: &str,
    ) -> Result<TlsStream<TcpStream>> {
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
                Error::new(kind, format!("TLS handshake with {host:?} failed"))
                    .with_broker(addr)
                    .with_source(e)
            })
    }
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
    client_auth: Option<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)>,
    server_name: Option<String>,
}

impl fmt::Debug for TlsConfigBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsConfigBuilder")
            .field("roots", &self.roots.len())
            .field("client_certificate", &self.client_auth.is_some())
            .field("server_name", &self.server_name)
            .finish()
    }
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
    /// Trust the CA certificates in `pem` (one or more `CERTIFICATE` blocks).
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

    /// Trust the CA certificates in the PEM file at `path`.
    ///
    /// # Errors
    ///
    /// `Config` if the file cannot be read or parsed.
    pub fn ca_file(self, path: impl AsRef<Path>) -> Result<Self> {
        let pem = read(path.as_ref(), "CA file")?;
        self.ca_pem(&pem)
    }

    /// Trust the Mozilla root certificates compiled into the `webpki-roots` crate.
    #[cfg(feature = "webpki-roots")]
    pub fn webpki_roots(mut self) -> Self {
        self.roots
            .extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
        self
    }

    /// Trust the operating system's root certificates (`rustls-native-certs`).
    ///
    /// # Errors
    ///
    /// `Config` if no system certificate could be loaded.
    #[cfg(feature = "native-roots")]
    pub fn native_roots(mut self) -> Result<Self> {
        let found = rustls_native_certs::load_native_certs();
        let (added, _ignored) = self.roots.add_parsable_certificates(found.certs);
        if added == 0 {
            return Err(Error::config(format!(
                "no usable system root certificates ({} errors)",
                found.errors.len()
            )));
        }
        Ok(self)
    }

    /// Present a client certificate (mutual TLS): `cert_pem` holds the certificate chain
    /// (leaf first), `key_pem` its private key (PKCS#8, PKCS#1 or SEC1).
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

    /// Like [`client_cert_pem`](Self::client_cert_pem), reading both PEM files.
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

    /// Verify broker certificates against `name` instead of the host being dialed.
    pub fn server_name(mut self, name: impl Into<String>) -> Self {
        self.server_name = Some(name.into());
        self
    }

    /// The finished configuration (TLS 1.2 and 1.3, rustls' safe defaults).
    ///
    /// # Errors
    ///
    /// `Config` if no root certificate was added, or the client key does not fit its
    /// certificate.
    pub fn build(self) -> Result<TlsConfig> {
        if self.roots.is_empty() {
            return Err(Error::config(
                "TLS needs at least one trusted root: call ca_pem, ca_file, webpki_roots or \
                 native_roots",
            ));
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| pem_error("TLS protocol versions", e))?
            .with_root_certificates(self.roots);
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
}
