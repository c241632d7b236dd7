//! The `sasl.jaas.config` parser: Java's JAAS login module entries
//! (`Class required key="value" ...;`), as the Java client accepts them.
//!
//! Owns the syntax only; which modules and options mean what is `sasl.rs`'s and
//! `oauth.rs`'s.

use std::collections::BTreeMap;

use super::bad;
use crate::error::Result;

/// One parsed JAAS login module entry: `Class required key="value" ...;`.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Jaas {
    pub(super) module: String,
    pub(super) options: BTreeMap<String, String>,
}

/// Parses a `sasl.jaas.config` value as Kafka's `JaasConfig` does: one module class, a
/// control flag, `key=value` options (values bare or in single or double quotes, with
/// backslash escapes), a closing `;`.
pub(super) fn parse_jaas(v: &str) -> Result<Jaas> {
    const KEY: &str = "sasl.jaas.config";
    let mut chars = v.chars().peekable();
    let mut tokens: Vec<String> = Vec::new();
    let mut ended = false;
    while let Some(&c) = chars.peek() {
        if ended {
            if c.is_whitespace() {
                chars.next();
                continue;
            }
            return Err(bad(
                KEY,
                "only one login module is supported (text after `;`)",
            ));
        }
        match c {
            c if c.is_whitespace() => {
                chars.next();
            }
            ';' => {
                chars.next();
                ended = true;
            }
            '=' => {
                chars.next();
                tokens.push("=".into());
            }
            '"' | '\'' => {
                let quote = c;
                chars.next();
                let mut s = String::new();
                loop {
                    match chars.next() {
                        None => return Err(bad(KEY, "unterminated quoted value")),
                        Some('\\') => match chars.next() {
                            Some(e) => s.push(e),
                            None => return Err(bad(KEY, "unterminated quoted value")),
                        },
                        Some(q) if q == quote => break,
                        Some(other) => s.push(other),
                    }
                }
                // A quoted token is always a value; mark it so `=` cannot be taken for one.
                tokens.push(format!("\u{0}{s}"));
            }
            _ => {
                let mut s = String::new();
                while let Some(&c) = chars.peek() {
                    if c.is_whitespace() || c == '=' || c == ';' || c == '"' || c == '\'' {
                        break;
                    }
                    s.push(c);
                    chars.next();
                }
                tokens.push(s);
            }
        }
    }
    if !ended {
        return Err(bad(KEY, "the login module entry must end with `;`"));
    }
    let mut it = tokens.into_iter();
    let module = match it.next() {
        Some(m) if !m.starts_with('\u{0}') && m != "=" => m,
        _ => return Err(bad(KEY, "expected a login module class name")),
    };
    match it.next().as_deref() {
        Some("required" | "requisite" | "sufficient" | "optional") => {}
        _ => {
            return Err(bad(
                KEY,
                "expected a control flag (required, requisite, sufficient or optional) after the module",
            ))
        }
    }
    let mut options = BTreeMap::new();
    let rest: Vec<String> = it.collect();
    let mut i = 0;
    while i < rest.len() {
        let (Some(k), Some(eq), Some(val)) = (rest.get(i), rest.get(i + 1), rest.get(i + 2)) else {
            return Err(bad(KEY, "expected options as key=value"));
        };
        if eq != "=" || k == "=" || k.starts_with('\u{0}') || val == "=" {
            return Err(bad(KEY, "expected options as key=value"));
        }
        let val = val.strip_prefix('\u{0}').unwrap_or(val);
        options.insert(k.clone(), val.to_string());
        i += 3;
    }
    Ok(Jaas { module, options })
}
