//! SASL GSSAPI: Kerberos V5 authentication (RFC 4752) as Apache Kafka speaks it, through
//! the system's MIT Kerberos GSS-API library (cargo feature `gssapi`; building needs
//! Debian's `libkrb5-dev` or its equivalent, running needs `libgssapi-krb5-2`).
//!
//! The exchange is the Java client's (`GssKrb5Client`): the client asks the KDC for a
//! ticket to the service principal `<service>/<broker host>@REALM` (`service` is
//! `sasl.kerberos.service.name`, `kafka` by default; the host is the one the connection
//! dialled, as the broker advertises it), sends the `gss_init_sec_context` tokens in
//! SaslAuthenticate requests until the context is established (mutual authentication),
//! then answers the broker's wrapped 4-byte security-layer offer with "no security layer"
//! (the TLS listener, if any, protects the data). The FFI and every `unsafe` block are in
//! `ffi.rs`.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tracing::debug;

use super::{auth_error, Mechanism, Session, StartFuture};
use crate::error::{Error, Result};

#[allow(unsafe_code)]
mod ffi;

use ffi::{Context, Credential, GssError, Name};

/// RFC 4752 security layer bit: no security layer.
const NO_SECURITY_LAYER: u8 = 1;

/// SASL GSSAPI (Kerberos) credentials and target service.
///
/// Credentials come from, in order of preference:
/// - a keytab given with [`Gssapi::keytab`] (`sasl.kerberos.keytab`, or the Java
///   `Krb5LoginModule`'s `useKeyTab=true keyTab=…`), for [`Gssapi::principal`] or the
///   keytab's first principal; tickets are kept in a private in-memory cache and renewed
///   from the keytab by the library;
/// - else the ticket cache (`kinit`, `KRB5CCNAME`), for [`Gssapi::principal`] if set;
/// - MIT's client keytab `KRB5_CLIENT_KTNAME`, which the library uses on its own when the
///   cache has no ticket.
///
/// The library reads `krb5.conf` (`KRB5_CONFIG`): realm, KDCs, and host name
/// canonicalisation (set `dns_canonicalize_hostname = false` and `rdns = false` to use
/// broker host names exactly as advertised, as Kafka's Java client does).
///
/// ```no_run
/// use kafkapipe::conn::{Conn, ConnectionConfig};
/// use kafkapipe::sasl::Gssapi;
///
/// # async fn demo() -> kafkapipe::Result<()> {
/// let kerberos = Gssapi::new()
///     .service_name("kafka")
///     .principal("app@EXAMPLE.COM")
///     .keytab("/etc/security/keytabs/app.keytab");
/// let config = ConnectionConfig::new().sasl(kerberos);
/// // The ticket is for kafka/broker1.example.com@EXAMPLE.COM.
/// let conn = Conn::connect_with("broker1.example.com:9092", config).await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Gssapi {
    service_name: String,
    principal: Option<String>,
    keytab: Option<PathBuf>,
    /// Credentials acquired on first use and shared by every connection (and clone).
    credential: Arc<Mutex<Option<Arc<Credential>>>>,
}

impl Default for Gssapi {
    fn default() -> Self {
        Gssapi::new()
    }
}

impl Gssapi {
    /// Service `kafka`, the default credentials (ticket cache or `KRB5_CLIENT_KTNAME`).
    ///
    /// ```
    /// use kafkapipe::sasl::{Gssapi, Mechanism};
    /// assert_eq!(Gssapi::new().name(), "GSSAPI");
    /// ```
    pub fn new() -> Self {
        Gssapi {
            service_name: "kafka".to_string(),
            principal: None,
            keytab: None,
            credential: Arc::new(Mutex::new(None)),
        }
    }

    /// The brokers' Kerberos service name (`sasl.kerberos.service.name`), the first part
    /// of their principal `service/host@REALM`. Default `kafka`.
    ///
    /// ```
    /// let g = kafkapipe::sasl::Gssapi::new().service_name("kafka-prod");
    /// assert!(format!("{g:?}").contains("kafka-prod"));
    /// ```
    pub fn service_name(mut self, name: impl Into<String>) -> Self {
        self.service_name = name.into();
        self
    }

    /// The client principal, e.g. `app@EXAMPLE.COM` (`sasl.kerberos.principal`, JAAS
    /// `principal=`). Default: the keytab's first entry or the ticket cache's principal.
    ///
    /// ```
    /// let g = kafkapipe::sasl::Gssapi::new().principal("app@EXAMPLE.COM");
    /// assert!(format!("{g:?}").contains("app@EXAMPLE.COM"));
    /// ```
    pub fn principal(mut self, principal: impl Into<String>) -> Self {
        self.principal = Some(principal.into());
        self
    }

    /// Take the client's keys from this keytab (`sasl.kerberos.keytab`, JAAS
    /// `useKeyTab=true keyTab=…`) instead of the ticket cache.
    ///
    /// ```
    /// let g = kafkapipe::sasl::Gssapi::new().keytab("/etc/app.keytab");
    /// assert!(format!("{g:?}").contains("/etc/app.keytab"));
    /// ```
    pub fn keytab(mut self, path: impl AsRef<Path>) -> Self {
        self.keytab = Some(path.as_ref().to_path_buf());
        self
    }

    /// Who the client is, for messages.
    fn who(&self, credential: Option<&Credential>) -> String {
        self.principal
            .clone()
            .or_else(|| credential.and_then(Credential::principal))
            .unwrap_or_else(|| "the default principal".to_string())
    }

    fn source(&self) -> String {
        match &self.keytab {
            Some(k) => format!("keytab {}", k.display()),
            None => "the ticket cache".to_string(),
        }
    }

    /// The shared credential, acquired on first use; `None` for the library's defaults.
    /// Blocking (may read a keytab).
    fn credential(&self) -> Result<Option<Arc<Credential>>> {
        if self.principal.is_none() && self.keytab.is_none() {
            return Ok(None);
        }
        let mut slot = self
            .credential
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(c) = slot.as_ref() {
            return Ok(Some(c.clone()));
        }
        let name =
            match &self.principal {
                Some(p) => Some(Name::principal(p).map_err(|e| {
                    auth_error(format!("GSSAPI: invalid principal name {p:?}: {e}"))
                })?),
                None => None,
            };
        static CACHES: AtomicU64 = AtomicU64::new(0);
        let ccache = format!(
            "MEMORY:kafkapipe-{}-{}",
            std::process::id(),
            CACHES.fetch_add(1, Ordering::Relaxed)
        );
        let keytab = self.keytab.as_ref().map(|k| k.display().to_string());
        let credential =
            Credential::acquire(name.as_ref(), keytab.as_deref(), &ccache).map_err(|e| {
                let hint = match &self.keytab {
                    Some(k) => format!(
                        "; check that the keytab holds this principal's key (klist -kt {})",
                        k.display()
                    ),
                    None => "; run kinit, or set sasl.kerberos.keytab".to_string(),
                };
                auth_error(format!(
                    "GSSAPI: no Kerberos credentials for {} in {}: {e}{hint}",
                    self.who(None),
                    self.source()
                ))
            })?;
        let credential = Arc::new(credential);
        *slot = Some(credential.clone());
        Ok(Some(credential))
    }

    /// Blocking: credentials, then the first token (a service ticket from the KDC).
    fn first_token(&self, host: &str) -> Result<(GssapiSession, Vec<u8>)> {
        let credential = self.credential()?;
        let target = Name::host_service(&self.service_name, host).map_err(|e| {
            auth_error(format!(
                "GSSAPI: invalid service name {}@{host}: {e}",
                self.service_name
            ))
        })?;
        let mut context = Context::new(target);
        let step = context.step(credential.as_deref(), &[]).map_err(|e| {
            auth_error(format!(
                "GSSAPI: {} (from {}) could not get a ticket for service {}/{host} \
                 (sasl.kerberos.service.name={}): {e}",
                self.who(credential.as_deref()),
                self.source(),
                self.service_name,
                self.service_name,
            ))
        })?;
        let client = self.who(credential.as_deref());
        debug!(client = %client, service = %self.service_name, host, "GSSAPI: first token ready");
        let session = GssapiSession {
            state: if step.complete {
                State::SecurityLayer
            } else {
                State::Context
            },
            context,
            credential,
            client,
        };
        Ok((session, step.token))
    }
}

impl fmt::Debug for Gssapi {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Gssapi")
            .field("service_name", &self.service_name)
            .field("principal", &self.principal)
            .field("keytab", &self.keytab)
            .finish()
    }
}

/// The host of a `host:port` or `[v6]:port` broker address.
fn broker_host(broker: &str) -> &str {
    if let Some(rest) = broker.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    match broker.rsplit_once(':') {
        Some((host, port)) if !host.contains(':') && port.bytes().all(|b| b.is_ascii_digit()) => {
            host
        }
        _ => broker,
    }
}

impl Mechanism for Gssapi {
    fn name(&self) -> &str {
        "GSSAPI"
    }

    fn start(&self) -> StartFuture<'_> {
        Box::pin(async {
            Err(auth_error(
                "GSSAPI needs the broker's host name: start it with Mechanism::start_for",
            ))
        })
    }

    fn start_for(&self, broker: &str) -> StartFuture<'_> {
        let host = broker_host(broker).to_string();
        let this = self.clone();
        Box::pin(async move {
            if host.is_empty() {
                return Err(auth_error(format!(
                    "GSSAPI: no host name in broker address {host:?}"
                )));
            }
            let (session, token) = tokio::task::spawn_blocking(move || this.first_token(&host))
                .await
                .map_err(|e| auth_error(format!("GSSAPI: the Kerberos task failed: {e}")))??;
            Ok((Box::new(session) as Box<dyn Session>, token))
        })
    }
}

enum State {
    /// Exchanging context tokens.
    Context,
    /// Context established: the next server message is the wrapped security-layer offer.
    SecurityLayer,
    /// Our wrapped answer is sent; the broker's final (empty) answer ends the exchange.
    Finishing,
}

struct GssapiSession {
    state: State,
    context: Context,
    credential: Option<Arc<Credential>>,
    client: String,
}

impl GssapiSession {
    fn fail(&self, what: &str, e: GssError) -> Error {
        auth_error(format!(
            "GSSAPI: {what} (client {}, service {}): {e}",
            self.client,
            self.context.target()
        ))
    }
}

impl Session for GssapiSession {
    fn next(&mut self, challenge: &[u8]) -> Result<Option<Vec<u8>>> {
        match self.state {
            State::Context => {
                let step = self
                    .context
                    .step(self.credential.as_deref(), challenge)
                    .map_err(|e| self.fail("the broker's Kerberos reply was refused", e))?;
                if step.complete {
                    self.state = State::SecurityLayer;
                }
                // An empty message when the context completes without one to send
                // (the Java client's `EMPTY`).
                Ok(Some(step.token))
            }
            State::SecurityLayer => {
                let offer = self.context.unwrap(challenge).map_err(|e| {
                    self.fail("the broker's security-layer offer did not verify", e)
                })?;
                let Some(&layers) = offer.first().filter(|_| offer.len() == 4) else {
                    return Err(auth_error(format!(
                        "GSSAPI: the broker's security-layer offer has {} bytes, expected 4",
                        offer.len()
                    )));
                };
                if layers & NO_SECURITY_LAYER == 0 {
                    return Err(auth_error(format!(
                        "GSSAPI: the broker requires a SASL security layer (offered mask \
                         {layers:#04x}; sasl.kerberos qop auth-int/auth-conf is not supported)"
                    )));
                }
                // No security layer, maximum message size 0, no authorization id (the
                // broker then authorises the authenticated principal).
                let answer = self
                    .context
                    .wrap(&[NO_SECURITY_LAYER, 0, 0, 0])
                    .map_err(|e| self.fail("wrapping the security-layer answer failed", e))?;
                self.state = State::Finishing;
                Ok(Some(answer))
            }
            State::Finishing => Ok(None),
        }
    }

    fn describe_failure(&self, _broker_message: Option<&str>) -> Option<String> {
        Some(format!(
            "client principal {}, service principal {}",
            self.client,
            self.context.target()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_of_broker_address() {
        assert_eq!(broker_host("localhost:9092"), "localhost");
        assert_eq!(broker_host("b1.example.com:9093"), "b1.example.com");
        assert_eq!(broker_host("[::1]:9092"), "::1");
        assert_eq!(broker_host("b1.example.com"), "b1.example.com");
    }

    #[test]
    fn debug_names_the_settings() {
        let g = Gssapi::new()
            .service_name("svc")
            .principal("a@R")
            .keytab("/k");
        let d = format!("{g:?}");
        assert!(
            d.contains("svc") && d.contains("a@R") && d.contains("/k"),
            "{d}"
        );
    }

    #[tokio::test]
    async fn start_without_a_host_is_an_error() {
        assert!(Gssapi::new().start().await.is_err());
    }
}
