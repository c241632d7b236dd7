//! SASL authentication of a [`Connection`] (KIP-43, KIP-152) and KIP-368
//! re-authentication.

use std::sync::Arc;
use std::time::Duration;

use tracing::{debug, warn};

use super::{lock, Connection, Failure};
use crate::error::{Error, ErrorKind, Result};
use crate::protocol::messages::{
    SaslAuthenticateRequest, SaslAuthenticateResponse, SaslHandshakeRequest, SaslHandshakeResponse,
};
use crate::protocol::{ApiKey, Decode, ErrorCode, TaggedFields};
use crate::sasl::Mechanism;

/// Re-authenticate when this share of the session lifetime has passed (the Java client
/// picks 85–95%).
const REAUTH_AT: f64 = 0.85;

/// Sessions shorter than this are warned about: Apache Kafka refuses a re-authentication
/// started within 1 s of the previous one (`KafkaChannel.maybeBeginServerReauthentication`).
const MIN_SESSION: Duration = Duration::from_millis(1200);

impl Connection {
    /// Authenticate with `mechanism` and, if the broker limits the session, start the
    /// re-authentication timer.
    pub(super) async fn authenticate(&self, mechanism: Arc<dyn Mechanism>) -> Result<()> {
        let lifetime = self.sasl_exchange(&*mechanism, false).await?;
        if let Some(lifetime) = lifetime {
            self.schedule_reauth(mechanism, lifetime);
        }
        Ok(())
    }

    /// One SaslHandshake + SaslAuthenticate exchange. Returns the session lifetime the
    /// broker granted, if limited. With `exclusive` the caller holds every in-flight slot.
    async fn sasl_exchange(
        &self,
        mechanism: &dyn Mechanism,
        exclusive: bool,
    ) -> Result<Option<Duration>> {
        let name = mechanism.name().to_string();
        let broker = self.broker().to_string();
        debug!(broker = %broker, mechanism = %name, "SASL authentication starting");
        let handshake_max = self
            .api_versions()
            .and_then(|v| v.range(ApiKey::SASL_HANDSHAKE))
            .map(|(_, max)| max);
        match handshake_max {
            Some(max) if max >= 1 => {}
            Some(_) => {
                return Err(self.err(Error::new(
                    ErrorKind::UnsupportedVersion,
                    "broker speaks only SaslHandshake v0 (unframed SASL, Kafka < 1.0), which \
                     this client does not implement",
                )))
            }
            None => {
                return Err(self.err(Error::new(
                    ErrorKind::UnsupportedVersion,
                    format!(
                        "SASL {name} is configured but the broker does not offer SaslHandshake"
                    ),
                )))
            }
        }
        let handshake = SaslHandshakeRequest {
            mechanism: name.clone(),
        };
        let mut body = match self.request_body_with(&handshake, 1, exclusive).await {
            Ok(body) => body,
            // A hang-up here says nothing about the credentials (Apache Kafka answers an
            // unknown mechanism with UNSUPPORTED_SASL_MECHANISM and its list): the broker
            // may be restarting. The connection error stays retriable so the caller redials.
            Err(e) if matches!(e.kind(), ErrorKind::Closed | ErrorKind::Io) => {
                warn!(broker = %broker, mechanism = %name, error = %e, "broker hung up on the SASL handshake");
                return Err(self.err(e));
            }
            Err(e) => return Err(e),
        };
        let handshake = SaslHandshakeResponse::decode(&mut body, 1).map_err(|e| self.err(e))?;
        if handshake.error_code != 0 {
            let code = ErrorCode::from(handshake.error_code);
            let offered = if handshake.mechanisms.is_empty() {
                "none".to_string()
            } else {
                handshake.mechanisms.join(", ")
            };
            let listed = handshake.mechanisms.contains(&name);
            let message = if code == ErrorCode::UnsupportedSaslMechanism && listed {
                format!(
                    "broker refused SASL mechanism {name} although it lists it (offers: \
                     {offered}){}",
                    if exclusive {
                        "; it does not support re-authentication (KIP-368)"
                    } else {
                        ""
                    }
                )
            } else if code == ErrorCode::UnsupportedSaslMechanism {
                format!("broker does not offer SASL mechanism {name}; it offers: {offered}")
            } else {
                format!("SaslHandshake for {name} failed (broker offers: {offered})")
            };
            warn!(broker = %broker, mechanism = %name, offered = %offered, error = %code, "SASL handshake refused");
            return Err(self.err(Error::kafka(code).with_message(message)));
        }
        let version = self.version_for::<SaslAuthenticateRequest>()?;
        let timeout = self.config().request_timeout;
        let (mut session, mut message) =
            match tokio::time::timeout(timeout, mechanism.start_for(&broker)).await {
                Ok(r) => r.map_err(|e| self.err(e))?,
                Err(_) => {
                    return Err(self.err(Error::timeout(format!(
                        "SASL {name}: preparing the first message took longer than {} ms",
                        timeout.as_millis()
                    ))))
                }
            };
        let mut round = 0u32;
        loop {
            round += 1;
            if round > 16 {
                return Err(self.err(Error::new(
                    ErrorKind::Authentication,
                    format!("SASL {name}: exchange did not finish after 16 rounds"),
                )));
            }
            let req = SaslAuthenticateRequest {
                auth_bytes: message.into(),
                tagged_fields: TaggedFields::new(),
            };
            let mut body = self.request_body_with(&req, version, exclusive).await?;
            let resp =
                SaslAuthenticateResponse::decode(&mut body, version).map_err(|e| self.err(e))?;
            if resp.error_code != 0 {
                let code = ErrorCode::from(resp.error_code);
                let detail = resp.error_message.as_deref().unwrap_or("no details");
                let client_side = session
                    .describe_failure(resp.error_message.as_deref())
                    .map(|d| format!("; {d}"))
                    .unwrap_or_default();
                warn!(broker = %broker, mechanism = %name, error = %code, "SASL authentication failed");
                return Err(self.err(Error::kafka(code).with_message(format!(
                    "SASL {name} authentication failed: {detail}{client_side}"
                ))));
            }
            match session.next(&resp.auth_bytes) {
                Ok(Some(next)) => message = next,
                Ok(None) => {
                    let lifetime = u64::try_from(resp.session_lifetime_ms)
                        .ok()
                        .filter(|ms| *ms > 0)
                        .map(Duration::from_millis);
                    debug!(
                        broker = %broker,
                        mechanism = %name,
                        session_lifetime_ms = resp.session_lifetime_ms,
                        "SASL authentication succeeded"
                    );
                    return Ok(lifetime);
                }
                Err(e) => {
                    warn!(broker = %broker, mechanism = %name, error = %e, "SASL authentication failed on the client side");
                    return Err(self.err(e));
                }
            }
        }
    }

    /// Re-authenticate at [`REAUTH_AT`] of each granted session lifetime, for as long as
    /// the connection lives. The task holds only a weak reference between rounds.
    fn schedule_reauth(&self, mechanism: Arc<dyn Mechanism>, lifetime: Duration) {
        if lifetime < MIN_SESSION {
            // Apache Kafka refuses a re-authentication within 1 s of the previous one.
            warn!(broker = %self.broker(), session_lifetime_ms = lifetime.as_millis() as u64, "SASL session shorter than 1.2 s: re-authentication may be refused (credentials about to expire?)");
        }
        let weak = Arc::downgrade(&self.shared);
        let task = tokio::spawn(async move {
            let mut lifetime = lifetime;
            loop {
                tokio::time::sleep(lifetime.mul_f64(REAUTH_AT)).await;
                let Some(shared) = weak.upgrade() else { return };
                let conn = Connection { shared };
                if conn.is_closed() {
                    return;
                }
                match conn.reauthenticate(&*mechanism).await {
                    Ok(Some(next)) => {
                        if next < MIN_SESSION {
                            warn!(broker = %conn.broker(), session_lifetime_ms = next.as_millis() as u64, "SASL session shorter than 1.2 s after re-authentication: the next one may be refused");
                        }
                        lifetime = next
                    }
                    Ok(None) => return,
                    Err(e) => {
                        // Fall back to closing: a new connection authenticates afresh, and
                        // if the credentials really are bad that fails for good. (tansu 0.6
                        // grants 60 s sessions but cannot re-authenticate a connection.)
                        warn!(broker = %conn.broker(), error = %e, "SASL re-authentication failed; closing the connection");
                        // The failure's error names the broker again; say it once.
                        let reason = e
                            .to_string()
                            .replace(&format!(" (broker {})", conn.broker()), "");
                        conn.shared.state.fail(Failure::new(
                            ErrorKind::Closed,
                            format!(
                                "SASL re-authentication failed, connection closed (a new \
                                 connection authenticates afresh): {reason}"
                            ),
                        ));
                        conn.shared.state.shutdown.notify_one();
                        return;
                    }
                }
            }
        });
        if let Some(old) = lock(&self.shared.reauth).replace(task) {
            old.abort();
        }
    }

    /// Take every in-flight slot (waiting for in-flight requests to finish and holding
    /// back new ones), then run the exchange alone on the connection.
    async fn reauthenticate(&self, mechanism: &dyn Mechanism) -> Result<Option<Duration>> {
        let slots = u32::try_from(self.config().max_in_flight).map_err(|_| {
            self.err(Error::config(
                "max_in_flight above u32::MAX: cannot re-authenticate",
            ))
        })?;
        let wait = self.config().request_timeout;
        let acquire = Arc::clone(&self.shared.state.in_flight).acquire_many_owned(slots);
        let _all = tokio::time::timeout(wait, acquire)
            .await
            .map_err(|_| {
                self.err(Error::timeout(
                    "in-flight requests did not finish in time for SASL re-authentication",
                ))
            })?
            .map_err(|_| self.shared.state.error())?;
        debug!(broker = %self.broker(), mechanism = mechanism.name(), "SASL re-authentication");
        self.sasl_exchange(mechanism, true).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conn::ConnectionConfig;
    use crate::protocol::messages::{ApiVersionRange, ApiVersionsRequest, ApiVersionsResponse};
    use crate::protocol::{Encode, Request, RequestHeader, ResponseHeader};
    use crate::sasl::Plain;
    use bytes::{BufMut, Bytes, BytesMut};
    use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

    const T: Duration = Duration::from_secs(5);

    /// A scripted broker on the other end of a duplex pipe.
    struct Broker {
        io: DuplexStream,
    }

    struct Seen {
        key: ApiKey,
        version: i16,
        correlation_id: i32,
        body: Bytes,
    }

    impl Broker {
        async fn read(&mut self) -> Option<Seen> {
            let size = tokio::time::timeout(T, self.io.read_i32())
                .await
                .ok()?
                .ok()?;
            let mut frame = vec![0u8; size as usize];
            self.io.read_exact(&mut frame).await.ok()?;
            let mut frame = Bytes::from(frame);
            let (key, version, _) = RequestHeader::peek(&frame).unwrap();
            let header_version = match key {
                ApiKey::API_VERSIONS => ApiVersionsRequest::request_header_version(version),
                ApiKey::SASL_HANDSHAKE => SaslHandshakeRequest::request_header_version(version),
                _ => SaslAuthenticateRequest::request_header_version(version),
            };
            let header = RequestHeader::decode(&mut frame, header_version).unwrap();
            Some(Seen {
                key,
                version,
                correlation_id: header.correlation_id,
                body: frame,
            })
        }

        async fn reply<T: Encode>(&mut self, seen: &Seen, flexible: bool, resp: &T) {
            let mut body = BytesMut::new();
            ResponseHeader {
                correlation_id: seen.correlation_id,
                tagged_fields: TaggedFields::new(),
            }
            .encode(&mut body, i16::from(flexible))
            .unwrap();
            resp.encode(&mut body, seen.version).unwrap();
            let mut frame = BytesMut::new();
            frame.put_i32(body.len() as i32);
            frame.extend_from_slice(&body);
            self.io.write_all(&frame).await.unwrap();
        }

        async fn api_versions(&mut self) {
            let seen = self.read().await.unwrap();
            assert_eq!(seen.key, ApiKey::API_VERSIONS);
            let range = |key, max| ApiVersionRange {
                api_key: key,
                min_version: 0,
                max_version: max,
                tagged_fields: TaggedFields::new(),
            };
            let resp = ApiVersionsResponse {
                api_keys: vec![
                    range(ApiKey::API_VERSIONS, 3),
                    range(ApiKey::SASL_HANDSHAKE, 1),
                    range(ApiKey::SASL_AUTHENTICATE, 2),
                ],
                ..ApiVersionsResponse::default()
            };
            self.reply(&seen, false, &resp).await;
        }

        async fn handshake(&mut self, error_code: i16) -> String {
            self.handshake_listing(error_code, &["SCRAM-SHA-256", "OAUTHBEARER"])
                .await
        }

        async fn handshake_listing(&mut self, error_code: i16, mechanisms: &[&str]) -> String {
            let mut seen = self.read().await.unwrap();
            assert_eq!(seen.key, ApiKey::SASL_HANDSHAKE);
            assert_eq!(seen.version, 1);
            let req = SaslHandshakeRequest::decode(&mut seen.body, 1).unwrap();
            let resp = SaslHandshakeResponse {
                error_code,
                mechanisms: mechanisms.iter().map(|m| m.to_string()).collect(),
            };
            self.reply(&seen, false, &resp).await;
            req.mechanism
        }

        async fn authenticate(&mut self, resp: SaslAuthenticateResponse) -> Bytes {
            let mut seen = self.read().await.unwrap();
            assert_eq!(seen.key, ApiKey::SASL_AUTHENTICATE);
            assert_eq!(seen.version, 2);
            let req = SaslAuthenticateRequest::decode(&mut seen.body, 2).unwrap();
            self.reply(&seen, true, &resp).await;
            req.auth_bytes
        }
    }

    fn pair() -> (DuplexStream, Broker) {
        let (client, broker) = tokio::io::duplex(64 * 1024);
        (client, Broker { io: broker })
    }

    fn plain_config() -> ConnectionConfig {
        ConnectionConfig {
            request_timeout: T,
            sasl: Some(Arc::new(Plain::new("alice", "pw"))),
            ..ConnectionConfig::default()
        }
    }

    #[test]
    fn config_debug_hides_secrets() {
        let c = ConnectionConfig {
            sasl: Some(Arc::new(Plain::new("alice", "hunter2"))),
            ..ConnectionConfig::default()
        };
        let d = format!("{c:?}");
        assert!(d.contains("alice") && !d.contains("hunter2"), "{d}");
        let c = ConnectionConfig {
            sasl: Some(Arc::new(crate::sasl::OAuthBearer::with_static_token(
                crate::sasl::OAuthToken::new("tok-123"),
            ))),
            ..ConnectionConfig::default()
        };
        assert!(!format!("{c:?}").contains("tok-123"));
    }

    // Paused time: the re-authentication timer (85% of the lifetime) is checked exactly,
    // not against a loaded machine's scheduling delays (a real-time check flaked at 313 ms).
    #[tokio::test(start_paused = true)]
    async fn plain_success_then_reauthentication_before_expiry() {
        let (client, mut broker) = pair();
        let serve = async {
            broker.api_versions().await;
            assert_eq!(broker.handshake(0).await, "PLAIN");
            let sent = broker
                .authenticate(SaslAuthenticateResponse {
                    session_lifetime_ms: 300,
                    ..SaslAuthenticateResponse::default()
                })
                .await;
            assert_eq!(&sent[..], b"\0alice\0pw");
        };
        let (conn, ()) = tokio::join!(
            Connection::from_stream(client, "b:1", plain_config()),
            serve
        );
        let conn = conn.unwrap();
        let started = tokio::time::Instant::now();
        // KIP-368: the client re-authenticates on the same connection before 300 ms pass.
        assert_eq!(broker.handshake(0).await, "PLAIN");
        let sent = broker
            .authenticate(SaslAuthenticateResponse::default())
            .await;
        assert_eq!(&sent[..], b"\0alice\0pw");
        let elapsed = started.elapsed();
        assert!(elapsed < Duration::from_millis(300), "{elapsed:?}");
        assert!(!conn.is_closed());
        // Requests flow again after re-authentication.
        let req = ApiVersionsRequest::default();
        let (r, ()) = tokio::join!(conn.send_version(&req, 3), async {
            let seen = broker.read().await.unwrap();
            broker
                .reply(&seen, false, &ApiVersionsResponse::default())
                .await;
        });
        r.unwrap();
        conn.close().await;
    }

    #[tokio::test]
    async fn failed_reauthentication_kills_the_connection() {
        let (client, mut broker) = pair();
        let serve = async {
            broker.api_versions().await;
            broker.handshake(0).await;
            broker
                .authenticate(SaslAuthenticateResponse {
                    session_lifetime_ms: 100,
                    ..SaslAuthenticateResponse::default()
                })
                .await;
        };
        let (conn, ()) = tokio::join!(
            Connection::from_stream(client, "b:1", plain_config()),
            serve
        );
        let conn = conn.unwrap();
        broker.handshake(0).await;
        broker
            .authenticate(SaslAuthenticateResponse {
                error_code: ErrorCode::SaslAuthenticationFailed.code(),
                error_message: Some("expired".into()),
                ..SaslAuthenticateResponse::default()
            })
            .await;
        assert!(broker.read().await.is_none(), "connection must be closed");
        let err = conn
            .send_version(&ApiVersionsRequest::default(), 3)
            .await
            .unwrap_err();
        assert!(err.to_string().contains("re-authentication"), "{err}");
        assert!(err.to_string().contains("expired"), "{err}");
        assert_eq!(err.to_string().matches("broker b:1").count(), 1, "{err}");
        // Closed, so the cluster redials and authenticates afresh.
        assert!(err.is_closed() && err.is_retriable(), "{err}");
    }

    /// tansu 0.6 grants 60 s sessions but answers a second handshake on the connection
    /// with UNSUPPORTED_SASL_MECHANISM, listing the very mechanism (measured live).
    #[tokio::test]
    async fn broker_without_reauthentication_support_gets_the_connection_closed() {
        let (client, mut broker) = pair();
        let serve = async {
            broker.api_versions().await;
            broker.handshake_listing(0, &["PLAIN"]).await;
            broker
                .authenticate(SaslAuthenticateResponse {
                    session_lifetime_ms: 100,
                    ..SaslAuthenticateResponse::default()
                })
                .await;
        };
        let (conn, ()) = tokio::join!(
            Connection::from_stream(client, "b:1", plain_config()),
            serve
        );
        let conn = conn.unwrap();
        broker
            .handshake_listing(ErrorCode::UnsupportedSaslMechanism.code(), &["PLAIN"])
            .await;
        assert!(broker.read().await.is_none(), "connection must be closed");
        let req = ApiVersionsRequest::default();
        let err = conn.send_version(&req, 3).await.unwrap_err();
        assert!(err.is_closed() && err.is_retriable(), "{err}");
        assert!(
            err.to_string()
                .contains("does not support re-authentication"),
            "{err}"
        );
    }

    #[tokio::test]
    async fn unsupported_mechanism_names_offered_ones_and_closes() {
        let (client, mut broker) = pair();
        let serve = async {
            broker.api_versions().await;
            broker
                .handshake(ErrorCode::UnsupportedSaslMechanism.code())
                .await;
            // Nothing else may be sent: the next read sees the connection closed.
            assert!(broker.read().await.is_none());
        };
        let (conn, ()) = tokio::join!(
            Connection::from_stream(client, "b:1", plain_config()),
            serve
        );
        let err = conn.unwrap_err();
        assert_eq!(err.kafka_code(), Some(ErrorCode::UnsupportedSaslMechanism));
        let text = err.to_string();
        assert!(
            text.contains("PLAIN") && text.contains("SCRAM-SHA-256, OAUTHBEARER"),
            "{text}"
        );
        assert!(text.contains("b:1"), "{text}");
        assert!(!err.is_retriable());
        assert!(err.is_authentication());
    }

    #[tokio::test]
    async fn authentication_failure_is_clear_and_closes() {
        let (client, mut broker) = pair();
        let serve = async {
            broker.api_versions().await;
            broker.handshake(0).await;
            broker
                .authenticate(SaslAuthenticateResponse {
                    error_code: ErrorCode::SaslAuthenticationFailed.code(),
                    error_message: Some("Invalid credentials".into()),
                    ..SaslAuthenticateResponse::default()
                })
                .await;
            assert!(broker.read().await.is_none());
        };
        let (conn, ()) = tokio::join!(
            Connection::from_stream(client, "b:1", plain_config()),
            serve
        );
        let err = conn.unwrap_err();
        assert_eq!(err.kafka_code(), Some(ErrorCode::SaslAuthenticationFailed));
        let text = err.to_string();
        assert!(
            text.contains("Invalid credentials") && text.contains("b:1"),
            "{text}"
        );
        assert!(!text.contains("pw"), "{text}");
        assert!(!err.is_retriable());
    }

    /// A broker that hangs up while answering SaslHandshake (restarting, a load balancer
    /// cutting idle connections) gives a retriable connection error, not an authentication
    /// failure: Apache Kafka answers an unknown mechanism with UNSUPPORTED_SASL_MECHANISM,
    /// so a hang-up says nothing about the credentials and a redial must be allowed.
    #[tokio::test]
    async fn hang_up_during_the_handshake_is_retriable() {
        let (client, mut broker) = pair();
        let serve = async {
            broker.api_versions().await;
            // Read the SaslHandshake request, then hang up without answering.
            assert!(broker.read().await.is_some());
            drop(broker);
        };
        let (conn, ()) = tokio::join!(
            Connection::from_stream(client, "b:1", plain_config()),
            serve
        );
        let err = conn.unwrap_err();
        assert!(err.is_retriable(), "{err}");
        assert!(!err.is_authentication(), "{err}");
        assert!(err.to_string().contains("b:1"), "{err}");
    }
}
