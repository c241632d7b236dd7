//! The `ssl.*` keys (Java and librdkafka names) collected while reading the pairs, and
//! built into a [`TlsConfig`](crate::tls::TlsConfig) at the end.
//!
//! Owns which TLS keys go together and the errors naming them; the TLS itself is
//! [`crate::tls`]'s. Without the `tls` feature a TLS setting is an error. May not: read
//! keys other than `ssl.*` and `security.protocol`'s TLS part.

#[cfg(feature = "tls")]
use super::bad;
#[cfg(feature = "tls")]
use crate::error::Result;

/// The TLS inputs collected while reading the keys; built into a `TlsConfig` at the end.
#[derive(Default)]
pub(super) struct TlsInputs {
    pub(super) ca_location: Option<String>,
    pub(super) ca_pem: Option<String>,
    pub(super) truststore_location: Option<String>,
    pub(super) truststore_password: Option<String>,
    pub(super) truststore_type: Option<String>,
    pub(super) truststore_certificates: Option<String>,
    pub(super) certificate_location: Option<String>,
    pub(super) key_location: Option<String>,
    pub(super) certificate_pem: Option<String>,
    pub(super) key_pem: Option<String>,
    pub(super) keystore_location: Option<String>,
    pub(super) keystore_password: Option<String>,
    pub(super) keystore_type: Option<String>,
    pub(super) keystore_chain: Option<String>,
    pub(super) keystore_key: Option<String>,
    pub(super) key_password: Option<String>,
    pub(super) endpoint_identification: Option<String>,
    pub(super) server_name: Option<String>,
}

impl TlsInputs {
    /// The first key set, for "needs security.protocol=ssl" errors.
    pub(super) fn first_set(&self) -> Option<&'static str> {
        [
            ("ssl.ca.location", self.ca_location.is_some()),
            ("ssl.ca.pem", self.ca_pem.is_some()),
            (
                "ssl.truststore.location",
                self.truststore_location.is_some(),
            ),
            (
                "ssl.truststore.password",
                self.truststore_password.is_some(),
            ),
            ("ssl.truststore.type", self.truststore_type.is_some()),
            (
                "ssl.truststore.certificates",
                self.truststore_certificates.is_some(),
            ),
            (
                "ssl.certificate.location",
                self.certificate_location.is_some(),
            ),
            ("ssl.key.location", self.key_location.is_some()),
            ("ssl.certificate.pem", self.certificate_pem.is_some()),
            ("ssl.key.pem", self.key_pem.is_some()),
            ("ssl.keystore.location", self.keystore_location.is_some()),
            ("ssl.keystore.password", self.keystore_password.is_some()),
            ("ssl.keystore.type", self.keystore_type.is_some()),
            (
                "ssl.keystore.certificate.chain",
                self.keystore_chain.is_some(),
            ),
            ("ssl.keystore.key", self.keystore_key.is_some()),
            ("ssl.key.password", self.key_password.is_some()),
            ("ssl.server.name", self.server_name.is_some()),
        ]
        .into_iter()
        .find(|(_, set)| *set)
        .map(|(k, _)| k)
    }

    #[cfg(feature = "tls")]
    pub(super) fn build(self) -> Result<crate::tls::TlsConfig> {
        use crate::tls::TlsConfig;
        let store_type = |key: &str, v: &Option<String>| -> Result<()> {
            match v.as_deref().map(str::to_ascii_uppercase).as_deref() {
                None | Some("PKCS12" | "PEM") => Ok(()),
                Some("JKS") => Err(bad(
                    key,
                    "JKS is not supported: convert the store with `keytool -importkeystore \
                     -deststoretype PKCS12` and set PKCS12",
                )),
                Some(other) => Err(bad(
                    key,
                    format_args!("expected PKCS12 or PEM, got {other:?}"),
                )),
            }
        };
        store_type("ssl.truststore.type", &self.truststore_type)?;
        store_type("ssl.keystore.type", &self.keystore_type)?;
        let mut b = TlsConfig::builder();
        match self.ca_location.as_deref() {
            None => {}
            Some("probe") => b = system_roots(b)?,
            Some(path) => b = b.ca_file(path).map_err(|e| bad("ssl.ca.location", e))?,
        }
        if let Some(pem) = &self.ca_pem {
            b = b.ca_pem(pem.as_bytes()).map_err(|e| bad("ssl.ca.pem", e))?;
        }
        if let Some(pem) = &self.truststore_certificates {
            b = b
                .ca_pem(pem.as_bytes())
                .map_err(|e| bad("ssl.truststore.certificates", e))?;
        }
        if let Some(path) = &self.truststore_location {
            let password = self.truststore_password.as_deref().unwrap_or("");
            b = b
                .truststore_file(path, password)
                .map_err(|e| bad("ssl.truststore.location", e))?;
        }
        if let Some(kp) = &self.key_password {
            if self.keystore_password.as_deref() != Some(kp.as_str()) {
                return Err(bad(
                    "ssl.key.password",
                    "encrypted private keys are not supported: the key must be unencrypted, \
                     or in a PKCS#12 keystore under ssl.keystore.password",
                ));
            }
        }
        let mut client_sources = 0;
        match (&self.certificate_location, &self.key_location) {
            (Some(cert), Some(key)) => {
                b = b
                    .client_cert_files(cert, key)
                    .map_err(|e| bad("ssl.certificate.location", e))?;
                client_sources += 1;
            }
            (None, None) => {}
            (Some(_), None) => {
                return Err(bad(
                    "ssl.certificate.location",
                    "needs ssl.key.location too",
                ))
            }
            (None, Some(_)) => {
                return Err(bad(
                    "ssl.key.location",
                    "needs ssl.certificate.location too",
                ))
            }
        }
        for (cert_key, key_key, cert, key) in [
            (
                "ssl.certificate.pem",
                "ssl.key.pem",
                &self.certificate_pem,
                &self.key_pem,
            ),
            (
                "ssl.keystore.certificate.chain",
                "ssl.keystore.key",
                &self.keystore_chain,
                &self.keystore_key,
            ),
        ] {
            match (cert, key) {
                (Some(cert), Some(key)) => {
                    b = b
                        .client_cert_pem(cert.as_bytes(), key.as_bytes())
                        .map_err(|e| bad(cert_key, e))?;
                    client_sources += 1;
                }
                (None, None) => {}
                (Some(_), None) => return Err(bad(cert_key, format_args!("needs {key_key} too"))),
                (None, Some(_)) => return Err(bad(key_key, format_args!("needs {cert_key} too"))),
            }
        }
        if let Some(path) = &self.keystore_location {
            let password = self.keystore_password.as_deref().unwrap_or("");
            b = b
                .keystore_file(path, password)
                .map_err(|e| bad("ssl.keystore.location", e))?;
            client_sources += 1;
        }
        if client_sources > 1 {
            return Err(bad(
                "ssl.keystore.location",
                "give one client certificate: ssl.keystore.location, ssl.certificate.location \
                 with ssl.key.location, or the PEM text settings",
            ));
        }
        match self
            .endpoint_identification
            .as_deref()
            .map(str::to_ascii_lowercase)
            .as_deref()
        {
            None | Some("https") => {}
            Some("" | "none") => b = b.danger_accept_invalid_hostnames(true),
            Some(other) => {
                return Err(bad(
                    "ssl.endpoint.identification.algorithm",
                    format_args!("expected https, none or empty, got {other:?}"),
                ))
            }
        }
        if let Some(name) = self.server_name {
            b = b.server_name(name);
        }
        b.build()
            .map_err(|e| bad("security.protocol", format_args!("TLS settings: {e}")))
    }
}

#[cfg(all(feature = "tls", feature = "native-roots"))]
fn system_roots(b: crate::tls::TlsConfigBuilder) -> Result<crate::tls::TlsConfigBuilder> {
    b.native_roots().map_err(|e| bad("ssl.ca.location", e))
}

#[cfg(all(feature = "tls", not(feature = "native-roots")))]
fn system_roots(_: crate::tls::TlsConfigBuilder) -> Result<crate::tls::TlsConfigBuilder> {
    Err(bad(
        "ssl.ca.location",
        "`probe` needs the `native-roots` cargo feature",
    ))
}
