//! SASL/SCRAM-SHA-256 and SCRAM-SHA-512 (RFC 5802, RFC 7677; Kafka KIP-84).

use std::fmt;

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256, Sha512};

use super::{auth_error, Mechanism, Redacted, Session, StartFuture};
use crate::error::{Error, Result};
use crate::protocol::ErrorCode;

/// The hash function of a SCRAM mechanism.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScramAlgorithm {
    /// SCRAM-SHA-256.
    Sha256,
    /// SCRAM-SHA-512.
    Sha512,
}

/// Like the Java client: fewer iterations than this is refused as too weak.
const MIN_ITERATIONS: u32 = 4096;
/// Refuse absurd iteration counts from a (possibly hostile) broker.
const MAX_ITERATIONS: u32 = 1 << 20;

impl ScramAlgorithm {
    /// The mechanism name, `SCRAM-SHA-256` or `SCRAM-SHA-512`.
    pub fn name(self) -> &'static str {
        match self {
            ScramAlgorithm::Sha256 => "SCRAM-SHA-256",
            ScramAlgorithm::Sha512 => "SCRAM-SHA-512",
        }
    }

    fn hmac(self, key: &[u8], data: &[u8]) -> Result<Vec<u8>> {
        let bad_key = |_| auth_error("invalid HMAC key");
        Ok(match self {
            ScramAlgorithm::Sha256 => {
                let mut m = Hmac::<Sha256>::new_from_slice(key).map_err(bad_key)?;
                m.update(data);
                m.finalize().into_bytes().to_vec()
            }
            ScramAlgorithm::Sha512 => {
                let mut m = Hmac::<Sha512>::new_from_slice(key).map_err(bad_key)?;
                m.update(data);
                m.finalize().into_bytes().to_vec()
            }
        })
    }

    fn hash(self, data: &[u8]) -> Vec<u8> {
        match self {
            ScramAlgorithm::Sha256 => Sha256::digest(data).to_vec(),
            ScramAlgorithm::Sha512 => Sha512::digest(data).to_vec(),
        }
    }

    pub(crate) fn salted_password(self, password: &[u8], salt: &[u8], iterations: u32) -> Vec<u8> {
        match self {
            ScramAlgorithm::Sha256 => {
                let mut out = [0u8; 32];
                pbkdf2::pbkdf2_hmac::<Sha256>(password, salt, iterations, &mut out);
                out.to_vec()
            }
            ScramAlgorithm::Sha512 => {
                let mut out = [0u8; 64];
                pbkdf2::pbkdf2_hmac::<Sha512>(password, salt, iterations, &mut out);
                out.to_vec()
            }
        }
    }
}

/// SASL/SCRAM (kafka-go: `scram.Mechanism(scram.SHA512, user, pass)`): a salted challenge
/// response with a random client nonce, and verification of the broker's signature, so a
/// broker that does not know the password cannot pretend to.
///
/// The password is used as UTF-8 bytes without SASLprep normalization, like the Java
/// client. `Debug` output hides it.
///
/// ```
/// use kafkapipe::sasl::{Mechanism, Scram};
/// let m = Scram::sha512("alice", "alice-secret");
/// assert_eq!(m.name(), "SCRAM-SHA-512");
/// assert!(!format!("{m:?}").contains("alice-secret"));
/// ```
#[derive(Clone)]
pub struct Scram {
    algorithm: ScramAlgorithm,
    username: String,
    password: String,
}

impl Scram {
    /// SCRAM with `algorithm`.
    pub fn new(
        algorithm: ScramAlgorithm,
        username: impl Into<String>,
        password: impl Into<String>,
    ) -> Self {
        Scram {
            algorithm,
            username: username.into(),
            password: password.into(),
        }
    }

    /// SCRAM-SHA-256.
    pub fn sha256(username: impl Into<String>, password: impl Into<String>) -> Self {
        Self::new(ScramAlgorithm::Sha256, username, password)
    }

    /// SCRAM-SHA-512.
    pub fn sha512(username: impl Into<String>, password: impl Into<String>) -> Self {
        Self::new(ScramAlgorithm::Sha512, username, password)
    }

    fn session(&self, client_nonce: String) -> (ScramSession, Vec<u8>) {
        // RFC 5802 §5.1: ',' and '=' in the user name are escaped.
        let user = self.username.replace('=', "=3D").replace(',', "=2C");
        let client_first_bare = format!("n={user},r={client_nonce}");
        let first = format!("n,,{client_first_bare}").into_bytes();
        let session = ScramSession {
            algorithm: self.algorithm,
            password: self.password.clone(),
            client_nonce,
            client_first_bare,
            state: State::ServerFirst,
        };
        (session, first)
    }
}

impl fmt::Debug for Scram {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Scram")
            .field("algorithm", &self.algorithm)
            .field("username", &self.username)
            .field("password", &Redacted)
            .finish()
    }
}

impl Mechanism for Scram {
    fn name(&self) -> &str {
        self.algorithm.name()
    }

    fn start(&self) -> StartFuture<'_> {
        Box::pin(async move {
            let mut raw = [0u8; 24];
            getrandom::getrandom(&mut raw)
                .map_err(|e| auth_error(format!("no randomness for the SCRAM nonce: {e}")))?;
            let (session, first) = self.session(B64.encode(raw));
            Ok((Box::new(session) as Box<dyn Session>, first))
        })
    }
}

enum State {
    ServerFirst,
    ServerFinal { server_signature: Vec<u8> },
    Done,
}

struct ScramSession {
    algorithm: ScramAlgorithm,
    password: String,
    client_nonce: String,
    client_first_bare: String,
    state: State,
}

/// The broker's `e=` answer (RFC 5802 server-error, e.g. `invalid-proof` for a wrong
/// password): the same error as a SaslAuthenticate error code.
fn refused(name: &str, reason: &str) -> Error {
    Error::kafka(ErrorCode::SaslAuthenticationFailed).with_message(format!(
        "{name} authentication failed: the broker says {reason}"
    ))
}

/// The value of attribute `key` in a SCRAM message (`k=v,k=v`).
fn attribute(message: &str, key: char) -> Option<&str> {
    message.split(',').find_map(|part| {
        let mut chars = part.chars();
        (chars.next() == Some(key) && chars.next() == Some('=')).then(|| &part[2..])
    })
}

impl ScramSession {
    fn client_final(&mut self, server_first: &str) -> Result<Vec<u8>> {
        let name = self.algorithm.name();
        if let Some(e) = attribute(server_first, 'e') {
            return Err(refused(name, e));
        }
        if server_first.starts_with("m=") {
            return Err(auth_error(format!(
                "{name}: unsupported mandatory extension"
            )));
        }
        let malformed = || auth_error(format!("{name}: malformed server-first-message"));
        let nonce = attribute(server_first, 'r').ok_or_else(malformed)?;
        let salt = attribute(server_first, 's').ok_or_else(malformed)?;
        let iterations: u32 = attribute(server_first, 'i')
            .and_then(|i| i.parse().ok())
            .ok_or_else(malformed)?;
        if !nonce.starts_with(&self.client_nonce) || nonce.len() <= self.client_nonce.len() {
            return Err(auth_error(format!(
                "{name}: the broker's nonce does not extend the client nonce"
            )));
        }
        if !(MIN_ITERATIONS..=MAX_ITERATIONS).contains(&iterations) {
            return Err(auth_error(format!(
                "{name}: iteration count {iterations} outside {MIN_ITERATIONS}..={MAX_ITERATIONS}"
            )));
        }
        let salt = B64.decode(salt).map_err(|_| malformed())?;
        let alg = self.algorithm;
        let salted = alg.salted_password(self.password.as_bytes(), &salt, iterations);
        let client_key = alg.hmac(&salted, b"Client Key")?;
        let stored_key = alg.hash(&client_key);
        // "biws" is base64("n,,"): no channel binding, no authzid.
        let without_proof = format!("c=biws,r={nonce}");
        let auth_message = format!("{},{server_first},{without_proof}", self.client_first_bare);
        let client_signature = alg.hmac(&stored_key, auth_message.as_bytes())?;
        let proof: Vec<u8> = client_key
            .iter()
            .zip(&client_signature)
            .map(|(k, s)| k ^ s)
            .collect();
        let server_key = alg.hmac(&salted, b"Server Key")?;
        let server_signature = alg.hmac(&server_key, auth_message.as_bytes())?;
        self.state = State::ServerFinal { server_signature };
        Ok(format!("{without_proof},p={}", B64.encode(proof)).into_bytes())
    }

    fn verify(&self, server_final: &str, expected: &[u8]) -> Result<()> {
        let name = self.algorithm.name();
        if let Some(e) = attribute(server_final, 'e') {
            return Err(refused(name, e));
        }
        let got = attribute(server_final, 'v')
            .and_then(|v| B64.decode(v).ok())
            .ok_or_else(|| auth_error(format!("{name}: malformed server-final-message")))?;
        // Constant time: no early exit on the first differing byte.
        let same = got.len() == expected.len()
            && got
                .iter()
                .zip(expected)
                .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                == 0;
        if !same {
            return Err(auth_error(format!(
                "{name}: server signature mismatch (the broker did not prove it knows the \
                 credentials)"
            )));
        }
        Ok(())
    }
}

impl Session for ScramSession {
    fn next(&mut self, challenge: &[u8]) -> Result<Option<Vec<u8>>> {
        let name = self.algorithm.name();
        let message = std::str::from_utf8(challenge)
            .map_err(|_| auth_error(format!("{name}: server message is not UTF-8")))?;
        match std::mem::replace(&mut self.state, State::Done) {
            State::ServerFirst => self.client_final(message).map(Some),
            State::ServerFinal { server_signature } => {
                self.verify(message, &server_signature)?;
                Ok(None)
            }
            State::Done => Err(auth_error(format!(
                "{name}: unexpected message after the exchange completed"
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // RFC 7677 §3.
    const NONCE: &str = "rOprNGfwEbeRWgbNEkqO";
    const SERVER_FIRST: &str =
        "r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096";
    const CLIENT_FINAL: &str = "c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,\
                                p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=";
    const SERVER_FINAL: &str = "v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=";

    #[test]
    fn rfc7677_test_vector() {
        let (mut s, first) = Scram::sha256("user", "pencil").session(NONCE.into());
        assert_eq!(first, b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO");
        let fin = s.next(SERVER_FIRST.as_bytes()).unwrap().unwrap();
        assert_eq!(String::from_utf8(fin).unwrap(), CLIENT_FINAL);
        assert_eq!(s.next(SERVER_FINAL.as_bytes()).unwrap(), None);
        assert!(s.next(b"v=x").is_err(), "no messages after the end");
    }

    #[test]
    fn server_signature_mismatch_is_rejected() {
        let (mut s, _) = Scram::sha256("user", "pencil").session(NONCE.into());
        s.next(SERVER_FIRST.as_bytes()).unwrap();
        let forged = "v=AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=";
        let e = s.next(forged.as_bytes()).unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::Authentication);
        assert!(e.to_string().contains("signature mismatch"), "{e}");
        // A different password gives a different signature for the same exchange.
        let (mut s, _) = Scram::sha256("user", "wrong").session(NONCE.into());
        s.next(SERVER_FIRST.as_bytes()).unwrap();
        assert!(s.next(SERVER_FINAL.as_bytes()).is_err());
    }

    #[test]
    fn bad_server_first_messages_are_rejected() {
        let cases = [
            "r=someoneelse123,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096",
            "r=rOprNGfwEbeRWgbNEkqO,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096",
            "r=rOprNGfwEbeRWgbNEkqOxx,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=1",
            "r=rOprNGfwEbeRWgbNEkqOxx,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=99999999",
            "r=rOprNGfwEbeRWgbNEkqOxx,s=!!,i=4096",
            "r=rOprNGfwEbeRWgbNEkqOxx,i=4096",
            "e=unknown-user",
            "m=ext,r=rOprNGfwEbeRWgbNEkqOxx,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096",
        ];
        for c in cases {
            let (mut s, _) = Scram::sha256("user", "pencil").session(NONCE.into());
            assert!(s.next(c.as_bytes()).is_err(), "{c}");
        }
        let (mut s, _) = Scram::sha256("user", "pencil").session(NONCE.into());
        assert!(s.next(&[0xff, 0xfe]).is_err());
    }

    #[test]
    fn user_name_is_escaped_and_sha512_works() {
        let (mut s, first) = Scram::sha512("a=b,c", "pw").session("nonce".into());
        assert_eq!(first, b"n,,n=a=3Db=2Cc,r=nonce");
        let fin = s.next(b"r=nonce123,s=c2FsdA==,i=4096").unwrap().unwrap();
        let fin = String::from_utf8(fin).unwrap();
        let proof = attribute(&fin, 'p').unwrap();
        assert_eq!(B64.decode(proof).unwrap().len(), 64);
    }

    #[tokio::test]
    async fn nonces_are_random() {
        let m = Scram::sha256("u", "p");
        let (_, a) = m.start().await.unwrap();
        let (_, b) = m.start().await.unwrap();
        assert_ne!(a, b);
        assert!(a.starts_with(b"n,,n=u,r="));
    }

    #[test]
    fn debug_hides_password() {
        let d = format!("{:?}", Scram::sha256("alice", "hunter2"));
        assert!(d.contains("alice") && !d.contains("hunter2"), "{d}");
    }
}
