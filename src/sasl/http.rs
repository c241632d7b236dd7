//! A minimal HTTP/1.1 client for OAuth token endpoints (cargo feature `oidc`): one
//! `POST` of a form per connection (`Connection: close`), over TCP or TLS (rustls, the
//! crate's [`TlsConfig`]). Enough for RFC 6749 §4.4 token requests; not a general client
//! (no redirects, no proxies, no keep-alive).

use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::error::{Error, ErrorKind, Result};
use crate::tls::TlsConfig;

/// The largest response accepted (token responses are a few KiB).
const MAX_RESPONSE: usize = 1 << 20;

/// A parsed `http://` or `https://` URL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Url {
    pub(crate) https: bool,
    /// Host as written (IPv6 without brackets).
    pub(crate) host: String,
    pub(crate) port: u16,
    /// Path and query, starting with `/`.
    pub(crate) target: String,
}

impl Url {
    pub(crate) fn parse(url: &str) -> Result<Url> {
        let bad = |why: &str| Error::config(format!("invalid token endpoint URL {url:?}: {why}"));
        let (https, rest) = if let Some(r) = url.strip_prefix("https://") {
            (true, r)
        } else if let Some(r) = url.strip_prefix("http://") {
            (false, r)
        } else {
            return Err(bad("only http:// and https:// are supported"));
        };
        let (authority, target) = match rest.find(['/', '?']) {
            Some(i) if rest[i..].starts_with('/') => (&rest[..i], rest[i..].to_string()),
            Some(i) => (&rest[..i], format!("/{}", &rest[i..])),
            None => (rest, "/".to_string()),
        };
        if authority.contains('@') {
            return Err(bad("credentials in the URL are not supported"));
        }
        let default_port = if https { 443 } else { 80 };
        let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
            let (host, after) = v6.split_once(']').ok_or_else(|| bad("unclosed '['"))?;
            let port = match after.strip_prefix(':') {
                Some(p) => p.parse().map_err(|_| bad("bad port"))?,
                None if after.is_empty() => default_port,
                None => return Err(bad("garbage after ']'")),
            };
            (host.to_string(), port)
        } else {
            match authority.rsplit_once(':') {
                Some((h, p)) => (h.to_string(), p.parse().map_err(|_| bad("bad port"))?),
                None => (authority.to_string(), default_port),
            }
        };
        if host.is_empty() {
            return Err(bad("no host"));
        }
        Ok(Url {
            https,
            host,
            port,
            target,
        })
    }

    /// `host:port` (IPv6 in brackets), for connecting and the `Host` header.
    pub(crate) fn authority(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

/// An HTTP response: status code and body.
#[derive(Debug)]
pub(crate) struct Response {
    pub(crate) status: u16,
    pub(crate) body: Vec<u8>,
}

/// `POST url` with an `application/x-www-form-urlencoded` `body` and extra `headers`,
/// within `timeout` (connect, TLS, request and response together).
pub(crate) async fn post_form(
    url: &Url,
    headers: &[(&str, String)],
    body: &str,
    tls: Option<&TlsConfig>,
    timeout: Duration,
) -> Result<Response> {
    let authority = url.authority();
    let mut request = format!(
        "POST {} HTTP/1.1\r\nHost: {authority}\r\nUser-Agent: kafkapipe/{}\r\n\
         Accept: application/json\r\nContent-Type: application/x-www-form-urlencoded\r\n\
         Content-Length: {}\r\nConnection: close\r\n",
        url.target,
        env!("CARGO_PKG_VERSION"),
        body.len()
    );
    for (name, value) in headers {
        if value.contains(['\r', '\n']) {
            return Err(Error::config(format!(
                "HTTP header {name} contains a line break"
            )));
        }
        request.push_str(name);
        request.push_str(": ");
        request.push_str(value);
        request.push_str("\r\n");
    }
    request.push_str("\r\n");
    request.push_str(body);
    let exchange = async {
        let tcp = TcpStream::connect(&authority)
            .await
            .map_err(|e| Error::io(format!("connecting to token endpoint {authority}"), e))?;
        let _ = tcp.set_nodelay(true);
        if url.https {
            let default;
            let tls = match tls {
                Some(t) => t,
                None => {
                    default = TlsConfig::builder().build()?;
                    &default
                }
            };
            let stream = tls.handshake(tcp, &authority).await.map_err(|e| {
                Error::new(
                    ErrorKind::Tls,
                    format!("TLS handshake with token endpoint {authority} failed"),
                )
                .with_source(e)
            })?;
            return exchange_on(stream, request.as_bytes(), &authority).await;
        }
        exchange_on(tcp, request.as_bytes(), &authority).await
    };
    tokio::time::timeout(timeout, exchange).await.map_err(|_| {
        Error::timeout(format!(
            "token endpoint {authority} did not answer within {} ms",
            timeout.as_millis()
        ))
    })?
}

async fn exchange_on<S: AsyncRead + AsyncWrite + Unpin>(
    mut stream: S,
    request: &[u8],
    authority: &str,
) -> Result<Response> {
    let io = |e| Error::io(format!("HTTP exchange with token endpoint {authority}"), e);
    stream.write_all(request).await.map_err(io)?;
    stream.flush().await.map_err(io)?;
    let mut raw = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        let n = match stream.read(&mut buf).await {
            Ok(n) => n,
            // Servers that close without TLS close_notify: what arrived is complete if the
            // framing says so (checked below).
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => 0,
            Err(e) => return Err(io(e)),
        };
        if n == 0 {
            break;
        }
        raw.extend_from_slice(&buf[..n]);
        if raw.len() > MAX_RESPONSE {
            return Err(Error::protocol(format!(
                "token endpoint {authority} sent more than {MAX_RESPONSE} bytes"
            )));
        }
        if let Some(resp) = parse_response(&raw, false)? {
            return Ok(resp);
        }
    }
    parse_response(&raw, true)?.ok_or_else(|| {
        Error::new(
            ErrorKind::Io,
            format!("token endpoint {authority} closed the connection mid-response"),
        )
    })
}

/// Parses a complete response from `raw`; `Ok(None)` while more bytes are needed. With
/// `eof`, a body without length runs to the end.
pub(crate) fn parse_response(raw: &[u8], eof: bool) -> Result<Option<Response>> {
    let Some(head_end) = raw.windows(4).position(|w| w == b"\r\n\r\n") else {
        return Ok(None);
    };
    let head = std::str::from_utf8(&raw[..head_end])
        .map_err(|_| Error::protocol("HTTP response head is not UTF-8"))?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let mut parts = status_line.splitn(3, ' ');
    let version = parts.next().unwrap_or_default();
    let status: u16 = parts
        .next()
        .and_then(|s| s.parse().ok())
        .filter(|_| version.starts_with("HTTP/1."))
        .ok_or_else(|| Error::protocol(format!("bad HTTP status line {status_line:?}")))?;
    let mut length = None;
    let mut chunked = false;
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        if name.eq_ignore_ascii_case("content-length") {
            length = Some(
                value
                    .parse::<usize>()
                    .map_err(|_| Error::protocol("bad HTTP Content-Length"))?,
            );
        } else if name.eq_ignore_ascii_case("transfer-encoding")
            && value.to_ascii_lowercase().contains("chunked")
        {
            chunked = true;
        }
    }
    let rest = &raw[head_end + 4..];
    if chunked {
        return Ok(dechunk(rest)?.map(|body| Response { status, body }));
    }
    match length {
        Some(n) if rest.len() >= n => Ok(Some(Response {
            status,
            body: rest[..n].to_vec(),
        })),
        Some(_) => Ok(None),
        None if eof => Ok(Some(Response {
            status,
            body: rest.to_vec(),
        })),
        None => Ok(None),
    }
}

/// Decodes a chunked body; `Ok(None)` until the last chunk arrived.
fn dechunk(mut rest: &[u8]) -> Result<Option<Vec<u8>>> {
    let mut body = Vec::new();
    loop {
        let Some(eol) = rest.windows(2).position(|w| w == b"\r\n") else {
            return Ok(None);
        };
        let size_text = std::str::from_utf8(&rest[..eol])
            .map_err(|_| Error::protocol("bad HTTP chunk size"))?;
        let size_text = size_text.split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(size_text, 16)
            .map_err(|_| Error::protocol(format!("bad HTTP chunk size {size_text:?}")))?;
        rest = &rest[eol + 2..];
        if size == 0 {
            return Ok(Some(body));
        }
        if rest.len() < size + 2 {
            return Ok(None);
        }
        body.extend_from_slice(&rest[..size]);
        rest = &rest[size + 2..];
    }
}

/// `application/x-www-form-urlencoded` encoding of one value (RFC 6749 Appendix B).
pub(crate) fn form_encode(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for b in value.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'*' => {
                out.push(b as char)
            }
            b' ' => out.push('+'),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let u = Url::parse("https://idp.example.com/oauth2/token?x=1").unwrap();
        assert_eq!(
            (u.https, u.host.as_str(), u.port, u.target.as_str()),
            (true, "idp.example.com", 443, "/oauth2/token?x=1")
        );
        let u = Url::parse("http://127.0.0.1:8080").unwrap();
        assert_eq!((u.port, u.target.as_str()), (8080, "/"));
        assert_eq!(u.authority(), "127.0.0.1:8080");
        let u = Url::parse("http://[::1]:9/t").unwrap();
        assert_eq!(u.authority(), "[::1]:9");
        for bad in ["ftp://x/", "http://", "http://u:p@h/", "http://h:port/"] {
            assert!(Url::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn responses() {
        let r = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}";
        let resp = parse_response(r, false).unwrap().unwrap();
        assert_eq!((resp.status, resp.body.as_slice()), (200, &b"{}"[..]));
        assert!(parse_response(&r[..r.len() - 1], false).unwrap().is_none());
        let r = b"HTTP/1.1 401 Unauthorized\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2;x\r\nde\r\n0\r\n\r\n";
        let resp = parse_response(r, false).unwrap().unwrap();
        assert_eq!((resp.status, resp.body.as_slice()), (401, &b"abcde"[..]));
        let r = b"HTTP/1.0 200 OK\r\n\r\nall of it";
        assert!(parse_response(r, false).unwrap().is_none());
        assert_eq!(parse_response(r, true).unwrap().unwrap().body, b"all of it");
        assert!(parse_response(b"SMTP 220 hi\r\n\r\n", true).is_err());
    }

    #[test]
    fn form_encoding() {
        assert_eq!(form_encode("a b&c=d/é"), "a+b%26c%3Dd%2F%C3%A9");
    }
}
