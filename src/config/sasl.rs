//! The `sasl.*` keys collected while reading the pairs, built into a SASL
//! [`Mechanism`]: PLAIN, SCRAM (feature `scram`) and GSSAPI (feature `gssapi`) from
//! their own keys or a `sasl.jaas.config`; OAUTHBEARER goes on in `oauth.rs`.
//!
//! Owns the choice of mechanism and its inputs' consistency (the errors name the keys);
//! the mechanisms themselves are [`crate::sasl`]'s.

use std::sync::Arc;

use super::bad;
use super::jaas::Jaas;
use super::oauth::OAuthInputs;
use crate::error::Result;
use crate::sasl::Mechanism;

/// The SASL inputs collected while reading the keys.
#[derive(Default)]
pub(super) struct SaslInputs {
    pub(super) mechanism: Option<String>,
    pub(super) username: Option<String>,
    pub(super) password: Option<String>,
    pub(super) jaas: Option<Jaas>,
    pub(super) oauth: OAuthInputs,
    pub(super) kerberos_service_name: Option<String>,
    pub(super) kerberos_keytab: Option<String>,
    pub(super) kerberos_principal: Option<String>,
}

impl SaslInputs {
    pub(super) fn first_set(&self) -> Option<&'static str> {
        if let Some(k) = self.oauth.first_set() {
            Some(k)
        } else if self.mechanism.is_some() {
            Some("sasl.mechanism")
        } else if self.username.is_some() {
            Some("sasl.username")
        } else if self.password.is_some() {
            Some("sasl.password")
        } else if self.jaas.is_some() {
            Some("sasl.jaas.config")
        } else {
            self.first_kerberos()
        }
    }

    fn first_kerberos(&self) -> Option<&'static str> {
        if self.kerberos_service_name.is_some() {
            Some("sasl.kerberos.service.name")
        } else if self.kerberos_keytab.is_some() {
            Some("sasl.kerberos.keytab")
        } else if self.kerberos_principal.is_some() {
            Some("sasl.kerberos.principal")
        } else {
            None
        }
    }

    /// `GSSAPI` is chosen by `sasl.mechanism` or implied by a `Krb5LoginModule`.
    fn is_gssapi(&self) -> bool {
        let krb5 = self
            .jaas
            .as_ref()
            .is_some_and(|j| j.module.rsplit('.').next().unwrap_or(&j.module) == "Krb5LoginModule");
        match self.mechanism.as_deref() {
            Some(m) => m == "GSSAPI",
            None => krb5,
        }
    }

    /// GSSAPI from `sasl.kerberos.*` and/or a `Krb5LoginModule` JAAS entry.
    fn build_gssapi(self) -> Result<Arc<dyn Mechanism>> {
        if let Some(key) = [
            ("sasl.username", self.username.is_some()),
            ("sasl.password", self.password.is_some()),
        ]
        .iter()
        .find_map(|(k, set)| set.then_some(*k))
        {
            return Err(bad(
                key,
                "not used by sasl.mechanism=GSSAPI (Kerberos): give sasl.kerberos.keytab and sasl.kerberos.principal",
            ));
        }
        let (mut keytab, mut principal, mut service) = (
            self.kerberos_keytab,
            self.kerberos_principal,
            self.kerberos_service_name,
        );
        if let Some(jaas) = &self.jaas {
            let class = jaas.module.rsplit('.').next().unwrap_or(&jaas.module);
            if class != "Krb5LoginModule" {
                return Err(bad(
                    "sasl.jaas.config",
                    format_args!("its login module does not match sasl.mechanism=GSSAPI (expected Krb5LoginModule, got {class})"),
                ));
            }
            let opt = |name: &str| jaas.options.get(name).cloned();
            let use_keytab = opt("useKeyTab").is_some_and(|v| v.eq_ignore_ascii_case("true"));
            let merge = |slot: &mut Option<String>, value: Option<String>, key: &str| match (
                slot.as_ref(),
                value,
            ) {
                (Some(a), Some(b)) if *a != b => Err(bad(
                    "sasl.jaas.config",
                    format_args!("its value {b:?} contradicts {key}={a:?}"),
                )),
                (None, Some(b)) => {
                    *slot = Some(b);
                    Ok(())
                }
                _ => Ok(()),
            };
            if use_keytab {
                let Some(k) = opt("keyTab") else {
                    return Err(bad(
                        "sasl.jaas.config",
                        "Krb5LoginModule useKeyTab=true needs a keyTab option",
                    ));
                };
                merge(&mut keytab, Some(k), "sasl.kerberos.keytab")?;
            }
            merge(&mut principal, opt("principal"), "sasl.kerberos.principal")?;
            merge(
                &mut service,
                opt("serviceName"),
                "sasl.kerberos.service.name",
            )?;
        }
        #[cfg(feature = "gssapi")]
        {
            let mut g = crate::sasl::Gssapi::new();
            if let Some(s) = service {
                if s.is_empty() {
                    return Err(bad("sasl.kerberos.service.name", "is empty"));
                }
                g = g.service_name(s);
            }
            if let Some(k) = keytab {
                g = g.keytab(k);
            }
            if let Some(p) = principal {
                g = g.principal(p);
            }
            Ok(Arc::new(g))
        }
        #[cfg(not(feature = "gssapi"))]
        {
            let _ = (keytab, principal, service);
            Err(bad(
                "sasl.mechanism",
                "GSSAPI (Kerberos) needs the `gssapi` cargo feature",
            ))
        }
    }

    pub(super) fn build(self) -> Result<Arc<dyn Mechanism>> {
        let oauth_jaas = self
            .jaas
            .as_ref()
            .is_some_and(|j| j.module.rsplit('.').next() == Some("OAuthBearerLoginModule"));
        match self.mechanism.as_deref() {
            Some("OAUTHBEARER") => return self.oauthbearer(),
            None if oauth_jaas => return self.oauthbearer(),
            _ => {}
        }
        if self.is_gssapi() {
            return self.build_gssapi();
        }
        if let Some(key) = self.oauth.first_set() {
            return Err(bad(key, "needs sasl.mechanism=OAUTHBEARER"));
        }
        if let Some(key) = self.first_kerberos() {
            return Err(bad(
                key,
                format_args!(
                    "is for sasl.mechanism=GSSAPI (it is {})",
                    self.mechanism.as_deref().unwrap_or("PLAIN")
                ),
            ));
        }
        let from_jaas = match &self.jaas {
            None => None,
            Some(jaas) => {
                let class = jaas.module.rsplit('.').next().unwrap_or(&jaas.module);
                let implied = match class {
                    "PlainLoginModule" => "PLAIN",
                    "ScramLoginModule" => "SCRAM",
                    "OAuthBearerLoginModule" => "OAUTHBEARER",
                    _ => {
                        return Err(bad(
                            "sasl.jaas.config",
                            format_args!(
                            "login module {} is not supported from properties (PlainLoginModule, \
                                 ScramLoginModule and OAuthBearerLoginModule are); set \
                                 ConnectionConfig::sasl in code",
                            jaas.module
                        ),
                        ))
                    }
                };
                if self.username.is_some() || self.password.is_some() {
                    return Err(bad(
                        "sasl.jaas.config",
                        "give the credentials either here or in sasl.username/sasl.password, not both",
                    ));
                }
                let field = |name: &str| {
                    jaas.options.get(name).cloned().ok_or_else(|| {
                        bad(
                            "sasl.jaas.config",
                            format_args!("{class} needs a {name} option"),
                        )
                    })
                };
                Some((implied, field("username")?, field("password")?))
            }
        };
        let mechanism = match (self.mechanism.as_deref(), from_jaas.as_ref()) {
            (Some(m), Some((implied, ..))) if !m.starts_with(implied) => {
                return Err(bad(
                    "sasl.jaas.config",
                    format_args!("its login module does not match sasl.mechanism={m}"),
                ))
            }
            (Some(m), _) => m.to_string(),
            (None, Some(("SCRAM", ..))) => {
                return Err(bad(
                    "sasl.mechanism",
                    "ScramLoginModule needs sasl.mechanism=SCRAM-SHA-256 or SCRAM-SHA-512",
                ))
            }
            (None, _) => "PLAIN".to_string(),
        };
        let (user, password) = match from_jaas {
            Some((_, u, p)) => (u, p),
            None => match (self.username, self.password) {
                (Some(u), Some(p)) => (u, p),
                _ => {
                    return Err(bad(
                        "security.protocol",
                        "SASL needs sasl.username and sasl.password (or sasl.jaas.config)",
                    ))
                }
            },
        };
        let m: Arc<dyn Mechanism> = match mechanism.as_str() {
            "PLAIN" => Arc::new(crate::sasl::Plain::new(user, password)),
            #[cfg(feature = "scram")]
            "SCRAM-SHA-256" => Arc::new(crate::sasl::Scram::sha256(user, password)),
            #[cfg(feature = "scram")]
            "SCRAM-SHA-512" => Arc::new(crate::sasl::Scram::sha512(user, password)),
            #[cfg(not(feature = "scram"))]
            "SCRAM-SHA-256" | "SCRAM-SHA-512" => {
                return Err(bad(
                    "sasl.mechanism",
                    "SCRAM needs the `scram` cargo feature",
                ))
            }
            other => {
                return Err(bad(
                    "sasl.mechanism",
                    format_args!(
                        "expected PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, OAUTHBEARER or GSSAPI, \
                         got {other:?} (other mechanisms are set in code: ConnectionConfig::sasl)"
                    ),
                ))
            }
        };
        Ok(m)
    }
}
