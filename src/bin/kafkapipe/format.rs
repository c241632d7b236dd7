//! How `consume` prints a record: the value (default), `KEY<SEP>VALUE` (`-k SEP`), a
//! kcat-style format string (`-f`) or one JSON object per line (`-J`).

use std::io::Write;

use bytes::Bytes;
use kafkapipe::record::Header;

/// One consumed record, whichever API fetched it.
pub struct Rec<'a> {
    /// The topic.
    pub topic: &'a str,
    /// The partition.
    pub partition: i32,
    /// The offset.
    pub offset: i64,
    /// Milliseconds since the epoch (-1: none).
    pub timestamp: i64,
    /// The key; `None` is a null key.
    pub key: Option<&'a Bytes>,
    /// The value; `None` is a null value.
    pub value: Option<&'a Bytes>,
    /// The headers.
    pub headers: &'a [Header],
}

/// One piece of a `-f` format string.
#[derive(Debug, Clone, PartialEq)]
pub enum Piece {
    /// Literal bytes (escapes resolved).
    Text(Vec<u8>),
    /// `%t`
    Topic,
    /// `%p`
    Partition,
    /// `%o`
    Offset,
    /// `%T`
    Timestamp,
    /// `%k`
    Key,
    /// `%K`
    KeyLen,
    /// `%s`
    Value,
    /// `%S`
    ValueLen,
    /// `%h`
    Headers,
}

/// A parsed output format.
#[derive(Debug, Clone)]
pub enum Format {
    /// Value, or key SEP value, then a newline.
    Plain { key_sep: Option<String> },
    /// A `-f` format string.
    Pattern(Vec<Piece>),
    /// JSON lines.
    Json,
}

impl Format {
    /// Parse a `-f` format string: `%t` topic, `%p` partition, `%o` offset, `%T`
    /// timestamp (ms), `%k` key, `%K` key length, `%s` value, `%S` value length, `%h`
    /// headers (`k=v,k=v`), `%%` a percent sign; escapes `\n`, `\r`, `\t`, `\\`. Lengths
    /// of null keys and values are -1; null keys and values print nothing.
    pub fn pattern(f: &str) -> Result<Format, String> {
        let mut pieces = Vec::new();
        let mut text = Vec::new();
        let mut chars = f.chars();
        while let Some(c) = chars.next() {
            let piece = match c {
                '%' => match chars.next() {
                    Some('t') => Piece::Topic,
                    Some('p') => Piece::Partition,
                    Some('o') => Piece::Offset,
                    Some('T') => Piece::Timestamp,
                    Some('k') => Piece::Key,
                    Some('K') => Piece::KeyLen,
                    Some('s') => Piece::Value,
                    Some('S') => Piece::ValueLen,
                    Some('h') => Piece::Headers,
                    Some('%') => {
                        text.push(b'%');
                        continue;
                    }
                    Some(o) => return Err(format!("-f: unknown format %{o} (see --help)")),
                    None => return Err("-f: format ends in a lone %".into()),
                },
                '\\' => {
                    match chars.next() {
                        Some('n') => text.push(b'\n'),
                        Some('r') => text.push(b'\r'),
                        Some('t') => text.push(b'\t'),
                        Some('\\') => text.push(b'\\'),
                        Some(o) => return Err(format!("-f: unknown escape \\{o}")),
                        None => return Err("-f: format ends in a lone \\".into()),
                    }
                    continue;
                }
                c => {
                    let mut buf = [0u8; 4];
                    text.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                    continue;
                }
            };
            if !text.is_empty() {
                pieces.push(Piece::Text(std::mem::take(&mut text)));
            }
            pieces.push(piece);
        }
        if !text.is_empty() {
            pieces.push(Piece::Text(text));
        }
        Ok(Format::Pattern(pieces))
    }

    /// Write one record.
    pub fn write(&self, out: &mut dyn Write, r: &Rec<'_>) -> std::io::Result<()> {
        match self {
            Format::Plain { key_sep } => {
                if let Some(sep) = key_sep {
                    out.write_all(bytes_of(r.key))?;
                    out.write_all(sep.as_bytes())?;
                }
                out.write_all(bytes_of(r.value))?;
                out.write_all(b"\n")
            }
            Format::Pattern(pieces) => {
                for p in pieces {
                    match p {
                        Piece::Text(t) => out.write_all(t)?,
                        Piece::Topic => out.write_all(r.topic.as_bytes())?,
                        Piece::Partition => write!(out, "{}", r.partition)?,
                        Piece::Offset => write!(out, "{}", r.offset)?,
                        Piece::Timestamp => write!(out, "{}", r.timestamp)?,
                        Piece::Key => out.write_all(bytes_of(r.key))?,
                        Piece::KeyLen => write!(out, "{}", len_of(r.key))?,
                        Piece::Value => out.write_all(bytes_of(r.value))?,
                        Piece::ValueLen => write!(out, "{}", len_of(r.value))?,
                        Piece::Headers => {
                            for (i, h) in r.headers.iter().enumerate() {
                                if i > 0 {
                                    out.write_all(b",")?;
                                }
                                out.write_all(h.key.as_bytes())?;
                                out.write_all(b"=")?;
                                out.write_all(bytes_of(h.value.as_ref()))?;
                            }
                        }
                    }
                }
                Ok(())
            }
            Format::Json => {
                let mut s = String::with_capacity(128);
                s.push_str("{\"topic\":");
                json_str(&mut s, r.topic.as_bytes());
                s.push_str(&format!(
                    ",\"partition\":{},\"offset\":{},\"timestamp\":{},\"key\":",
                    r.partition, r.offset, r.timestamp
                ));
                json_opt(&mut s, r.key);
                s.push_str(",\"value\":");
                json_opt(&mut s, r.value);
                s.push_str(",\"headers\":[");
                for (i, h) in r.headers.iter().enumerate() {
                    if i > 0 {
                        s.push(',');
                    }
                    s.push('[');
                    json_str(&mut s, h.key.as_bytes());
                    s.push(',');
                    json_opt(&mut s, h.value.as_ref());
                    s.push(']');
                }
                s.push_str("]}\n");
                out.write_all(s.as_bytes())
            }
        }
    }
}

fn bytes_of(b: Option<&Bytes>) -> &[u8] {
    b.map(|b| b.as_ref()).unwrap_or_default()
}

fn len_of(b: Option<&Bytes>) -> i64 {
    b.map_or(-1, |b| b.len() as i64)
}

fn json_opt(s: &mut String, b: Option<&Bytes>) {
    match b {
        Some(b) => json_str(s, b),
        None => s.push_str("null"),
    }
}

/// A JSON string of `b` (invalid UTF-8 replaced by U+FFFD).
fn json_str(s: &mut String, b: &[u8]) {
    s.push('"');
    for c in String::from_utf8_lossy(b).chars() {
        match c {
            '"' => s.push_str("\\\""),
            '\\' => s.push_str("\\\\"),
            '\n' => s.push_str("\\n"),
            '\r' => s.push_str("\\r"),
            '\t' => s.push_str("\\t"),
            c if (c as u32) < 0x20 => s.push_str(&format!("\\u{:04x}", c as u32)),
            c => s.push(c),
        }
    }
    s.push('"');
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn rec<'a>(key: Option<&'a Bytes>, value: Option<&'a Bytes>, h: &'a [Header]) -> Rec<'a> {
        Rec {
            topic: "t",
            partition: 2,
            offset: 7,
            timestamp: 1000,
            key,
            value,
            headers: h,
        }
    }

    fn show(f: &Format, r: &Rec<'_>) -> String {
        let mut out = Vec::new();
        f.write(&mut out, r).unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn pattern_and_json() {
        let (k, v) = (Bytes::from("k\"1"), Bytes::from("line\nnext\u{1}"));
        let h = [Header::new("a", "1"), Header::new("b", "2")];
        let r = rec(Some(&k), Some(&v), &h);
        let f = Format::pattern("%t %p %o %T %k(%K) %S %h 100%%\\n").unwrap();
        assert_eq!(show(&f, &r), "t 2 7 1000 k\"1(3) 10 a=1,b=2 100%\n");
        assert_eq!(
            show(&Format::Json, &r),
            "{\"topic\":\"t\",\"partition\":2,\"offset\":7,\"timestamp\":1000,\"key\":\"k\\\"1\",\
             \"value\":\"line\\nnext\\u0001\",\"headers\":[[\"a\",\"1\"],[\"b\",\"2\"]]}\n"
        );
        let null = rec(None, None, &[]);
        assert_eq!(show(&f, &null), "t 2 7 1000 (-1) -1  100%\n");
        assert!(show(&Format::Json, &null).contains("\"key\":null,\"value\":null"));
        assert!(Format::pattern("%x").is_err());
        assert!(Format::pattern("abc%").is_err());
    }
}
