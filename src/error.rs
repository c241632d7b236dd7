//! The crate's one error type.
//!
//! [`Error`] is small and opaque (one pointer wide); ask it what happened with
//! predicates ([`Error::is_retriable`], [`Error::is_timeout`], [`Error::is_closed`]) or
//! [`Error::kind`] / [`Error::kafka_code`]. It carries context — topic, partition and
//! broker — where the failing operation knew them, and keeps its cause in `source()`.

use std::fmt;
use std::sync::Arc;

use crate::protocol::ErrorCode;

/// A `Result` whose error is [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What kind of failure an [`Error`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The broker answered with a Kafka error code.
    Kafka(ErrorCode),
    /// Bytes from the network did not follow the protocol (truncated, bad length, bad CRC…).
    Protocol,
    /// A value could not be encoded (string too long, too many records…).
    Encode,
    /// Compressing or decompressing a record batch failed, or the codec is not compiled in.
    Compression,
    /// A socket operation failed.
    Io,
    /// An operation did not finish within its deadline.
    Timeout,
    /// The connection (or client) is closed; in-flight requests failed with it.
    Closed,
    /// The broker and this client share no version of an API.
    UnsupportedVersion,
    /// The user supplied an invalid configuration or argument.
    Config,
    /// Metadata did not name a leader or the broker we need.
    Metadata,
    /// SASL authentication failed on the client's side (malformed server message, server
    /// signature mismatch, token provider failure). Failures reported by the broker are
    /// `Kafka` errors (`SaslAuthenticationFailed`, `UnsupportedSaslMechanism`, …).
    Authentication,
    /// The TLS handshake failed (untrusted or mismatching certificate, protocol error).
    Tls,
}

/// The error type of every fallible kafkapipe operation.
///
/// Errors are `Clone` (the cause is shared), so one delivery failure can be reported to
/// every caller waiting on the affected messages.
///
/// ```
/// use kafkapipe::{Error, ErrorKind, protocol::ErrorCode};
/// let err = Error::kafka(ErrorCode::NotLeaderOrFollower).with_topic("events").with_partition(3);
/// assert!(err.is_retriable());
/// assert_eq!(err.kafka_code(), Some(ErrorCode::NotLeaderOrFollower));
/// assert!(err.to_string().contains("events"));
/// ```
#[derive(Clone)]
pub struct Error {
    inner: Box<Inner>,
}

#[derive(Clone)]
struct Inner {
    kind: ErrorKind,
    message: Option<String>,
    topic: Option<String>,
    partition: Option<i32>,
    broker: Option<String>,
    source: Option<Arc<dyn std::error::Error + Send + Sync + 'static>>,
}

impl Error {
    /// A new error of `kind` with a message.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Error {
            inner: Box::new(Inner {
                kind,
                message: Some(message.into()),
                topic: None,
                partition: None,
                broker: None,
                source: None,
            }),
        }
    }

    fn bare(kind: ErrorKind) -> Self {
        Error {
            inner: Box::new(Inner {
                kind,
                message: None,
                topic: None,
                partition: None,
                broker: None,
                source: None,
            }),
        }
    }

    /// An error carrying a Kafka error code returned by a broker.
    pub fn kafka(code: ErrorCode) -> Self {
        Self::bare(ErrorKind::Kafka(code))
    }

    /// Malformed bytes from the network.
    pub fn protocol(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Protocol, message)
    }

    /// A value that cannot be encoded.
    pub fn encode(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Encode, message)
    }

    /// A compression or decompression failure.
    pub fn compression(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Compression, message)
    }

    /// An invalid configuration or argument.
    pub fn config(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Config, message)
    }

    /// An operation that ran out of time.
    pub fn timeout(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Timeout, message)
    }

    /// A closed connection or client.
    pub fn closed(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Closed, message)
    }

    /// An I/O failure, keeping the `std::io::Error` as its source.
    pub fn io(message: impl Into<String>, err: std::io::Error) -> Self {
        let kind = if err.kind() == std::io::ErrorKind::TimedOut {
            ErrorKind::Timeout
        } else {
            ErrorKind::Io
        };
        Self::new(kind, message).with_source(err)
    }

    /// Attach a cause, returned by `source()`.
    pub fn with_source(mut self, source: impl std::error::Error + Send + Sync + 'static) -> Self {
        self.inner.source = Some(Arc::new(source));
        self
    }

    /// Attach the topic the failing operation concerned.
    pub fn with_topic(mut self, topic: impl Into<String>) -> Self {
        self.inner.topic = Some(topic.into());
        self
    }

    /// Attach the partition the failing operation concerned.
    pub fn with_partition(mut self, partition: i32) -> Self {
        self.inner.partition = Some(partition);
        self
    }

    /// Attach the broker (address or id) the failing operation talked to.
    pub fn with_broker(mut self, broker: impl Into<String>) -> Self {
        self.inner.broker = Some(broker.into());
        self
    }

    /// Replace or set the message.
    pub fn with_message(mut self, message: impl Into<String>) -> Self {
        self.inner.message = Some(message.into());
        self
    }

    /// The message, if one was set (without kind, context or source).
    pub(crate) fn message(&self) -> Option<&str> {
        self.inner.message.as_deref()
    }

    /// What kind of failure this is.
    pub fn kind(&self) -> ErrorKind {
        self.inner.kind
    }

    /// The Kafka error code, if the broker returned one.
    pub fn kafka_code(&self) -> Option<ErrorCode> {
        match self.inner.kind {
            ErrorKind::Kafka(c) => Some(c),
            _ => None,
        }
    }

    /// The topic this error concerns, if known.
    pub fn topic(&self) -> Option<&str> {
        self.inner.topic.as_deref()
    }

    /// The partition this error concerns, if known.
    pub fn partition(&self) -> Option<i32> {
        self.inner.partition
    }

    /// The broker this error concerns, if known.
    pub fn broker(&self) -> Option<&str> {
        self.inner.broker.as_deref()
    }

    /// Whether retrying (after a metadata refresh / reconnect) may succeed: retriable Kafka
    /// codes, I/O failures, timeouts and closed connections.
    pub fn is_retriable(&self) -> bool {
        match self.inner.kind {
            ErrorKind::Kafka(c) => c.is_retriable(),
            ErrorKind::Io | ErrorKind::Timeout | ErrorKind::Closed | ErrorKind::Metadata => true,
            _ => false,
        }
    }

    /// Whether this is an authentication failure: a client-side SASL failure, a TLS
    /// handshake failure, or a broker's SASL error code (`SaslAuthenticationFailed`,
    /// `UnsupportedSaslMechanism`, `IllegalSaslState`). Never retriable.
    pub fn is_authentication(&self) -> bool {
        matches!(
            self.inner.kind,
            ErrorKind::Authentication
                | ErrorKind::Tls
                | ErrorKind::Kafka(
                    ErrorCode::SaslAuthenticationFailed
                        | ErrorCode::UnsupportedSaslMechanism
                        | ErrorCode::IllegalSaslState
                )
        )
    }

    /// Whether this is a timeout.
    pub fn is_timeout(&self) -> bool {
        self.inner.kind == ErrorKind::Timeout
    }

    /// Whether the connection or client was closed.
    pub fn is_closed(&self) -> bool {
        self.inner.kind == ErrorKind::Closed
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("Error");
        d.field("kind", &self.inner.kind);
        if let Some(m) = &self.inner.message {
            d.field("message", m);
        }
        if let Some(t) = &self.inner.topic {
            d.field("topic", t);
        }
        if let Some(p) = &self.inner.partition {
            d.field("partition", p);
        }
        if let Some(b) = &self.inner.broker {
            d.field("broker", b);
        }
        if let Some(s) = &self.inner.source {
            d.field("source", s);
        }
        d.finish()
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.inner.kind, &self.inner.message) {
            (ErrorKind::Kafka(code), Some(m)) => write!(f, "{m}: {code}")?,
            (ErrorKind::Kafka(code), None) => write!(f, "{code}")?,
            (_, Some(m)) => f.write_str(m)?,
            (kind, None) => write!(f, "{kind:?}")?,
        }
        let mut ctx = Vec::new();
        if let Some(t) = &self.inner.topic {
            ctx.push(format!("topic {t}"));
        }
        if let Some(p) = self.inner.partition {
            ctx.push(format!("partition {p}"));
        }
        if let Some(b) = &self.inner.broker {
            ctx.push(format!("broker {b}"));
        }
        if !ctx.is_empty() {
            write!(f, " ({})", ctx.join(", "))?;
        }
        if let Some(s) = &self.inner.source {
            write!(f, ": {s}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.inner
            .source
            .as_ref()
            .map(|s| s.as_ref() as &(dyn std::error::Error + 'static))
    }
}

impl From<ErrorCode> for Error {
    fn from(code: ErrorCode) -> Self {
        Error::kafka(code)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_has_context_and_source() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset by peer");
        let e = Error::io("read failed", io).with_broker("127.0.0.1:9092");
        let s = e.to_string();
        assert!(s.contains("read failed"), "{s}");
        assert!(s.contains("broker 127.0.0.1:9092"), "{s}");
        assert!(s.contains("reset by peer"), "{s}");
        assert!(e.is_retriable());
        assert!(std::error::Error::source(&e).is_some());
    }

    #[test]
    fn error_is_one_pointer() {
        assert_eq!(std::mem::size_of::<Error>(), std::mem::size_of::<usize>());
    }

    #[test]
    fn authentication_errors_are_not_retriable() {
        for e in [
            Error::new(ErrorKind::Authentication, "bad signature"),
            Error::new(ErrorKind::Tls, "unknown issuer"),
            Error::kafka(ErrorCode::SaslAuthenticationFailed),
            Error::kafka(ErrorCode::UnsupportedSaslMechanism),
        ] {
            assert!(e.is_authentication(), "{e}");
            assert!(!e.is_retriable(), "{e}");
        }
        assert!(!Error::kafka(ErrorCode::NotLeaderOrFollower).is_authentication());
    }

    #[test]
    fn fatal_kafka_code_is_not_retriable() {
        let e = Error::kafka(ErrorCode::MessageTooLarge).with_topic("t");
        assert!(!e.is_retriable());
        assert_eq!(e.topic(), Some("t"));
    }
}
