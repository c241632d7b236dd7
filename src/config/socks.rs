//! `socks5.proxy` (a kafkapipe key): `[socks5://|socks5h://][user:password@]host:port`,
//! the credentials percent-decoded, into a [`Socks5Proxy`](crate::conn::Socks5Proxy).

use super::bad;
use crate::error::Result;

/// `socks5.proxy`: `[socks5://|socks5h://][user:password@]host:port`; the user name and
/// password may be percent-encoded.
pub(super) fn socks5_proxy(key: &str, v: &str) -> Result<crate::conn::Socks5Proxy> {
    let rest = match v.split_once("://") {
        None => v,
        Some((scheme, rest))
            if scheme.eq_ignore_ascii_case("socks5") || scheme.eq_ignore_ascii_case("socks5h") =>
        {
            rest
        }
        Some((scheme, _)) => {
            return Err(bad(
                key,
                format_args!("expected a socks5:// proxy, got scheme {scheme:?}"),
            ))
        }
    };
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    let (userinfo, addr) = match rest.rsplit_once('@') {
        Some((u, a)) => (Some(u), a),
        None => (None, rest),
    };
    let port_ok = addr
        .rsplit_once(':')
        .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok());
    if !port_ok {
        return Err(bad(
            key,
            format_args!("expected host:port for the proxy, got {addr:?}"),
        ));
    }
    let proxy = crate::conn::Socks5Proxy::new(addr);
    Ok(match userinfo {
        None => proxy,
        Some(u) => {
            let (user, password) = u
                .split_once(':')
                .ok_or_else(|| bad(key, "expected user:password@ before the proxy address"))?;
            let (user, password) = (percent_decode(key, user)?, percent_decode(key, password)?);
            if user.is_empty() || password.is_empty() || user.len() > 255 || password.len() > 255 {
                return Err(bad(
                    key,
                    "the proxy user name and password must each be 1 to 255 bytes",
                ));
            }
            proxy.with_credentials(user, password)
        }
    })
}

pub(super) fn percent_decode(key: &str, s: &str) -> Result<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = s
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| bad(key, "bad percent-encoding in the proxy credentials"))?;
            out.push(hex);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| bad(key, "the proxy credentials are not UTF-8"))
}
