//! The OAUTHBEARER keys with OIDC client credentials (KIP-768, feature `oidc`):
//! librdkafka's `sasl.oauthbearer.method=oidc` and `sasl.oauthbearer.*` keys, or Java's
//! `sasl.oauthbearer.token.endpoint.url` with an `OAuthBearerLoginModule` JAAS entry.
//!
//! Owns these inputs and their build into a mechanism; the token client is
//! [`crate::sasl`]'s.

use std::sync::Arc;

use super::bad;
use super::sasl::SaslInputs;
use crate::error::Result;
use crate::sasl::Mechanism;

/// The OAUTHBEARER (OIDC client credentials, KIP-768) inputs; each with the key it came
/// from, for errors.
#[derive(Default)]
pub(super) struct OAuthInputs {
    pub(super) method: Option<String>,
    pub(super) token_url: Option<String>,
    pub(super) client_id: Option<(&'static str, String)>,
    pub(super) client_secret: Option<(&'static str, String)>,
    pub(super) scope: Option<String>,
    pub(super) extensions: Vec<(String, String)>,
    pub(super) callback_handler: Option<String>,
}

impl OAuthInputs {
    pub(super) fn first_set(&self) -> Option<&'static str> {
        [
            ("sasl.oauthbearer.method", self.method.is_some()),
            (
                "sasl.oauthbearer.token.endpoint.url",
                self.token_url.is_some(),
            ),
            (
                self.client_id.as_ref().map_or("", |(k, _)| *k),
                self.client_id.is_some(),
            ),
            (
                self.client_secret.as_ref().map_or("", |(k, _)| *k),
                self.client_secret.is_some(),
            ),
            ("sasl.oauthbearer.scope", self.scope.is_some()),
            ("sasl.oauthbearer.extensions", !self.extensions.is_empty()),
            (
                "sasl.login.callback.handler.class",
                self.callback_handler.is_some(),
            ),
        ]
        .into_iter()
        .find(|(_, set)| *set)
        .map(|(k, _)| k)
    }
}

/// `sasl.oauthbearer.extensions`: `key=value,key=value`.
pub(super) fn oauth_extensions(key: &str, v: &str) -> Result<Vec<(String, String)>> {
    v.split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .map(|e| match e.split_once('=') {
            Some((k, v)) if !k.trim().is_empty() => {
                Ok((k.trim().to_string(), v.trim().to_string()))
            }
            _ => Err(bad(key, format_args!("expected key=value,..., got {e:?}"))),
        })
        .collect()
}

impl SaslInputs {
    /// OAUTHBEARER with OIDC client credentials (KIP-768): librdkafka's
    /// `sasl.oauthbearer.method=oidc` + `sasl.oauthbearer.*` keys, or Java's
    /// `sasl.oauthbearer.token.endpoint.url` + `OAuthBearerLoginModule` options.
    pub(super) fn oauthbearer(self) -> Result<Arc<dyn Mechanism>> {
        const URL: &str = "sasl.oauthbearer.token.endpoint.url";
        let o = self.oauth;
        match o.method.as_deref().map(str::to_ascii_lowercase).as_deref() {
            None | Some("oidc") => {}
            Some("default") => {
                return Err(bad(
                    "sasl.oauthbearer.method",
                    "default (unsecured or application-supplied tokens) cannot be set from \
                     properties: set ConnectionConfig::sasl to an OAuthBearer in code, or use oidc",
                ))
            }
            Some(other) => {
                return Err(bad(
                    "sasl.oauthbearer.method",
                    format_args!("expected oidc or default, got {other:?}"),
                ))
            }
        }
        if let Some(class) = &o.callback_handler {
            if class.rsplit('.').next() != Some("OAuthBearerLoginCallbackHandler") {
                return Err(bad(
                    "sasl.login.callback.handler.class",
                    format_args!(
                        "only OAuthBearerLoginCallbackHandler (the OIDC client credentials \
                         flow, built in) is supported, got {class:?}"
                    ),
                ));
            }
        }
        for (key, set) in [
            ("sasl.username", self.username.is_some()),
            ("sasl.password", self.password.is_some()),
        ] {
            if set {
                return Err(bad(
                    key,
                    "is not used by OAUTHBEARER: give sasl.oauthbearer.client.id and \
                     sasl.oauthbearer.client.secret",
                ));
            }
        }
        let mut jaas_id = None;
        let mut jaas_secret = None;
        let mut jaas_scope = None;
        let mut extensions = o.extensions;
        if let Some(jaas) = self.jaas {
            if jaas.module.rsplit('.').next() != Some("OAuthBearerLoginModule") {
                return Err(bad(
                    "sasl.jaas.config",
                    format_args!(
                        "its login module {} does not match sasl.mechanism=OAUTHBEARER",
                        jaas.module
                    ),
                ));
            }
            for (k, v) in jaas.options {
                match k.as_str() {
                    "clientId" => jaas_id = Some(v),
                    "clientSecret" => jaas_secret = Some(v),
                    "scope" => jaas_scope = Some(v),
                    _ if k.starts_with("extension_") => {
                        extensions.push((k["extension_".len()..].to_string(), v))
                    }
                    _ if k.starts_with("unsecuredLogin") => {
                        return Err(bad(
                            "sasl.jaas.config",
                            format_args!(
                                "{k}: unsecured OAUTHBEARER tokens cannot be set from \
                                 properties: set ConnectionConfig::sasl to an OAuthBearer in code"
                            ),
                        ))
                    }
                    _ => {
                        return Err(bad(
                            "sasl.jaas.config",
                            format_args!(
                                "unknown OAuthBearerLoginModule option {k:?} (expected clientId, \
                                 clientSecret, scope, extension_NAME)"
                            ),
                        ))
                    }
                }
            }
        }
        let url = o.token_url.ok_or_else(|| {
            bad(
                URL,
                "is required for OAUTHBEARER from properties (the OIDC token endpoint)",
            )
        })?;
        let client_id = match (o.client_id, jaas_id) {
            (Some((k, _)), Some(_)) => {
                return Err(bad(
                    k,
                    "give the client id here or as clientId in sasl.jaas.config, not both",
                ))
            }
            (Some((_, v)), None) | (None, Some(v)) => v,
            (None, None) => {
                return Err(bad(
                    "sasl.oauthbearer.client.id",
                    "is required for OAUTHBEARER (or clientId in sasl.jaas.config)",
                ))
            }
        };
        let client_secret =
            match (o.client_secret, jaas_secret) {
                (Some((k, _)), Some(_)) => return Err(bad(
                    k,
                    "give the client secret here or as clientSecret in sasl.jaas.config, not both",
                )),
                (Some((_, v)), None) | (None, Some(v)) => v,
                (None, None) => {
                    return Err(bad(
                        "sasl.oauthbearer.client.secret",
                        "is required for OAUTHBEARER (or clientSecret in sasl.jaas.config)",
                    ))
                }
            };
        let scope = o.scope.or(jaas_scope);
        #[cfg(feature = "oidc")]
        {
            let mut cc = crate::sasl::ClientCredentials::new(&url, client_id, client_secret)
                .map_err(|e| bad(URL, e))?;
            if let Some(scope) = scope {
                cc = cc.scope(scope);
            }
            for (k, v) in extensions {
                cc = cc.extension(k, v);
            }
            Ok(Arc::new(cc.into_mechanism()))
        }
        #[cfg(not(feature = "oidc"))]
        {
            let _ = (url, client_id, client_secret, scope, extensions);
            Err(bad(
                URL,
                "OAUTHBEARER with OIDC client credentials needs the `oidc` cargo feature",
            ))
        }
    }
}
