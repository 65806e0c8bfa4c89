"""An OIDC identity provider on loopback for tests: serves a JSON Web Key Set of RSA keys (the
``published`` ones, with a Cache-Control max-age), counts fetches, can hang, and signs tokens.
Used by the gateway's JWKS tests and by the control plane's OIDC login tests."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import jwt
from cryptography.hazmat.primitives.asymmetric import rsa

ISSUER = "https://idp.jwks.test"


class RotatingIdp:
    """Serves whichever keys are published now, with a Cache-Control max-age; counts fetches."""

    def __init__(self, max_age: int, issuer: str = ISSUER, hang: bool = False) -> None:
        self.keys = {kid: rsa.generate_private_key(public_exponent=65537, key_size=2048) for kid in ("k1", "k2")}
        self.published = {"k1"}
        self.fetches = 0
        self.issuer = issuer
        self.fetching, self.release = threading.Event(), threading.Event()
        idp = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                idp.fetches += 1
                idp.fetching.set()
                if hang:
                    idp.release.wait(30)
                keys = [{**json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(idp.keys[k].public_key())), "kid": k,
                         "use": "sig", "alg": "RS256"} for k in sorted(idp.published)]
                doc = json.dumps({"keys": keys}).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("cache-control", f"public, max-age={max_age}")
                self.send_header("content-length", str(len(doc)))
                self.end_headers()
                self.wfile.write(doc)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.jwks_url = f"http://127.0.0.1:{self.server.server_address[1]}/jwks"

    def token(self, kid: str = "k1", signer: str | None = None, endpoints=("chat",)) -> str:
        body = {"iss": self.issuer, "aud": "fabric-inference", "sub": "bob", "exp": int(time.time()) + 600,
                "fabric_endpoints": list(endpoints)}
        return jwt.encode(body, self.keys[signer or kid], algorithm="RS256", headers={"kid": kid})

    def sign(self, claims: dict, kid: str = "k1") -> str:
        """Any claims, signed with key ``kid`` (published or not)."""
        return jwt.encode(claims, self.keys[kid], algorithm="RS256", headers={"kid": kid})

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
