//! W3C Trace Context propagation through record headers (feature `trace-context`):
//! [`TraceContext`], the `traceparent` header's value, written into a produced message
//! with [`writer::Message::with_trace_context`](crate::writer::Message::with_trace_context)
//! and read from a consumed one with
//! [`reader::Message::trace_context`](crate::reader::Message::trace_context) — so a
//! consumer's span can link to the producer's in any tracing backend. The header is the
//! one the OpenTelemetry Kafka instrumentations of the Java client and librdkafka use
//! (a plain `traceparent` record header holding `00-<trace id>-<span id>-<flags>`), so
//! their messages read the same way.
//!
//! This module owns the format only (<https://www.w3.org/TR/trace-context/#traceparent-header>);
//! it depends on no OpenTelemetry crate. With `opentelemetry`, build a `TraceContext` from
//! a `SpanContext`'s `trace_id().to_bytes()`, `span_id().to_bytes()` and
//! `trace_flags().to_u8()`, and back.
//!
//! ```
//! use kafkapipe::trace_context::TraceContext;
//! use kafkapipe::writer::Message;
//!
//! let cx = TraceContext::parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").unwrap();
//! let msg = Message::new("payload").with_trace_context(&cx);
//! assert_eq!(msg.headers[0].key, "traceparent");
//! assert_eq!(cx.to_string(), "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
//! assert!(cx.sampled());
//! ```

use std::fmt;

/// The record header the trace context travels in.
pub const TRACEPARENT: &str = "traceparent";

/// A W3C trace context: the `traceparent` of the span that produced a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TraceContext {
    /// The trace id (16 bytes, never all zero).
    pub trace_id: [u8; 16],
    /// The parent span id (8 bytes, never all zero): the producer's span.
    pub span_id: [u8; 8],
    /// The trace flags; bit 0 is "sampled".
    pub flags: u8,
}

impl TraceContext {
    /// A context for `trace_id` and `span_id` with `flags`; `None` if either id is all
    /// zero (invalid in W3C Trace Context).
    ///
    /// ```
    /// use kafkapipe::trace_context::TraceContext;
    /// let cx = TraceContext::new([1; 16], [2; 8], 1).unwrap();
    /// assert_eq!(cx.trace_id_hex(), "01010101010101010101010101010101");
    /// assert!(TraceContext::new([0; 16], [2; 8], 1).is_none());
    /// ```
    pub fn new(trace_id: [u8; 16], span_id: [u8; 8], flags: u8) -> Option<Self> {
        (trace_id != [0; 16] && span_id != [0; 8]).then_some(TraceContext {
            trace_id,
            span_id,
            flags,
        })
    }

    /// Parse a `traceparent` value: `version-traceid-parentid-flags`, lowercase hex.
    /// Version `00` must have exactly those four fields; a later version may append
    /// fields (ignored, as the specification says). `None` for anything else, version
    /// `ff` and all-zero ids.
    ///
    /// ```
    /// use kafkapipe::trace_context::TraceContext;
    /// assert!(TraceContext::parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00").is_some());
    /// assert!(TraceContext::parse("00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-00").is_none());
    /// assert!(TraceContext::parse("garbage").is_none());
    /// ```
    pub fn parse(value: &str) -> Option<Self> {
        let value = value.trim();
        let mut parts = value.split('-');
        let version = hex::<1>(parts.next()?)?[0];
        let trace_id = hex::<16>(parts.next()?)?;
        let span_id = hex::<8>(parts.next()?)?;
        let flags_field = parts.next()?;
        // a later version may add fields after the flags; version 00 may not
        if version == 0xff || (version == 0 && parts.next().is_some()) {
            return None;
        }
        let flags = hex::<1>(flags_field)?[0];
        TraceContext::new(trace_id, span_id, flags)
    }

    /// Parse a `traceparent` header value given as bytes (as record headers carry it).
    pub fn from_header(value: &[u8]) -> Option<Self> {
        std::str::from_utf8(value).ok().and_then(Self::parse)
    }

    /// Whether the producer's span was sampled (flag bit 0).
    pub fn sampled(&self) -> bool {
        self.flags & 1 == 1
    }

    /// The trace id as 32 lowercase hex digits.
    pub fn trace_id_hex(&self) -> String {
        to_hex(&self.trace_id)
    }

    /// The span id as 16 lowercase hex digits.
    pub fn span_id_hex(&self) -> String {
        to_hex(&self.span_id)
    }
}

impl fmt::Display for TraceContext {
    /// The `traceparent` value, version `00`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "00-{}-{}-{:02x}",
            self.trace_id_hex(),
            self.span_id_hex(),
            self.flags
        )
    }
}

fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Exactly `2 * N` lowercase hex digits.
fn hex<const N: usize>(s: &str) -> Option<[u8; N]> {
    let s = s.as_bytes();
    if s.len() != 2 * N {
        return None;
    }
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    let mut out = [0u8; N];
    for (i, pair) in s.chunks_exact(2).enumerate() {
        out[i] = digit(pair[0])? << 4 | digit(pair[1])?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints_the_w3c_examples_and_refuses_invalid_values() {
        let v = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let cx = TraceContext::parse(v).unwrap();
        assert_eq!(cx.trace_id_hex(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(cx.span_id_hex(), "00f067aa0ba902b7");
        assert!(cx.sampled());
        assert_eq!(cx.to_string(), v);
        assert_eq!(TraceContext::from_header(v.as_bytes()), Some(cx));
        // a future version may append fields
        assert!(
            TraceContext::parse("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-xyz")
                .is_some()
        );
        for bad in [
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-xyz",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",
            "",
        ] {
            assert_eq!(TraceContext::parse(bad), None, "{bad}");
        }
        assert_eq!(TraceContext::from_header(&[0xff, 0xfe]), None);
    }
}
