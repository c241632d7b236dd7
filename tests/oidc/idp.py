"""A small OAuth 2 / OIDC identity provider for the OAUTHBEARER tests (tests/oidc_broker.rs).

Serves on 127.0.0.1:PORT (argv[1]):
  GET  /jwks   the JSON Web Key Set Kafka's OAuthBearerValidatorCallbackHandler validates with
  POST /token  the client credentials grant (RFC 6749 4.4) with HTTP Basic client auth;
               answers a real RS256-signed JWT (iss, sub = client id, aud, scope, iat, exp)
  GET  /stats  {client id: tokens issued}

Clients (secret "<id>-secret") and what their tokens look like:
  kafka-client  1 h, signed with the published key, aud = the form's `audience` (default
                "kafka-broker")
  short-lived   4 s lifetime (re-authentication test)
  expired       expired 10 minutes ago
  wrong-aud     aud "some-other-service"
  wrong-key     signed with a key that is not in the JWKS (same kid)
Unknown clients and wrong secrets get 401 {"error": "invalid_client"}.

Needs only the `cryptography` wheel (RS256 with PKCS#1 v1.5 and SHA-256, JWS compact form).
"""

import base64
import json
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding, rsa

PORT = int(sys.argv[1])
ISSUER = f"http://127.0.0.1:{PORT}"
KID = "test-key-1"
KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
ROGUE = rsa.generate_private_key(public_exponent=65537, key_size=2048)
LIFETIME = {"kafka-client": 3600, "short-lived": 4, "wrong-aud": 3600, "wrong-key": 3600}
CLIENTS = set(LIFETIME) | {"expired"}
ISSUED = {}
LOCK = threading.Lock()


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def uint(n: int) -> str:
    return b64url(n.to_bytes((n.bit_length() + 7) // 8, "big"))


def sign(claims: dict, key) -> str:
    header = {"alg": "RS256", "typ": "JWT", "kid": KID}
    signing_input = (
        b64url(json.dumps(header, separators=(",", ":")).encode())
        + "."
        + b64url(json.dumps(claims, separators=(",", ":")).encode())
    )
    sig = key.sign(signing_input.encode(), padding.PKCS1v15(), hashes.SHA256())
    return signing_input + "." + b64url(sig)


def jwks() -> dict:
    pub = KEY.public_key().public_numbers()
    return {
        "keys": [
            {"kty": "RSA", "use": "sig", "alg": "RS256", "kid": KID, "n": uint(pub.n), "e": uint(pub.e)}
        ]
    }


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):
        sys.stderr.write("idp: " + (fmt % args) + "\n")

    def reply(self, status: int, body: dict):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/jwks":
            self.reply(200, jwks())
        elif self.path == "/stats":
            with LOCK:
                self.reply(200, dict(ISSUED))
        else:
            self.reply(404, {"error": "not_found"})

    def do_POST(self):
        length = int(self.headers.get("Content-Length", "0"))
        form = urllib.parse.parse_qs(self.rfile.read(length).decode(), keep_blank_values=True)
        if self.path != "/token":
            return self.reply(404, {"error": "not_found"})
        if form.get("grant_type") != ["client_credentials"]:
            return self.reply(400, {"error": "unsupported_grant_type"})
        auth = self.headers.get("Authorization", "")
        try:
            scheme, value = auth.split(" ", 1)
            user, secret = base64.b64decode(value).decode().split(":", 1)
            client = urllib.parse.unquote_plus(user)
            secret = urllib.parse.unquote_plus(secret)
        except Exception:
            scheme, client, secret = "", "", ""
        if scheme != "Basic" or client not in CLIENTS or secret != client + "-secret":
            return self.reply(401, {"error": "invalid_client", "error_description": "unknown client or bad secret"})
        now = int(time.time())
        audience = form.get("audience", ["kafka-broker"])[0]
        claims = {
            "iss": ISSUER,
            "sub": client,
            "aud": audience,
            "iat": now,
            "exp": now + LIFETIME.get(client, 3600),
        }
        if "scope" in form:
            claims["scope"] = form["scope"][0]
        if client == "expired":
            claims["iat"] = now - 4200
            claims["exp"] = now - 600
        if client == "wrong-aud":
            claims["aud"] = "some-other-service"
        token = sign(claims, ROGUE if client == "wrong-key" else KEY)
        with LOCK:
            ISSUED[client] = ISSUED.get(client, 0) + 1
        self.reply(
            200,
            {"access_token": token, "token_type": "Bearer", "expires_in": claims["exp"] - now},
        )


if __name__ == "__main__":
    server = ThreadingHTTPServer(("127.0.0.1", PORT), Handler)
    print(f"idp listening on {ISSUER}", flush=True)
    server.serve_forever()
