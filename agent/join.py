"""`fabric-agent join` and `fabric-agent renew-cert`: the node's certificate without copying keys.

join: the token (`fabricctl ai node join-token`) is fjt1.ID.SECRET.CA_SHA256. The agent
downloads the cluster CA from any control-plane URL (GET /api/ai/join/ca, over TLS it cannot
verify yet) and keeps it only when its SHA-256 is the token's; then, verifying fabricd with
that CA, it sends a CSR for a key it made itself (POST /api/ai/join). The key never leaves the
node. Files: PKI_DIR/NODE.key (0600), NODE.crt, ca.crt, the layout `serve --pki-dir` reads.

renew-cert: when less than RENEW_FRACTION of the certificate's life is left, a new key and CSR
go to POST /api/ai/nodes/NODE/renew over mutual TLS with the current certificate; the new files
replace the old ones atomically. `--check` only says whether it is due (exit 0 due, 1 not),
which the renewal timer's ExecCondition= uses (images/host/systemd/fabric-agent-renew.*).

Every URL given is tried in turn (agent.control_plane.FailoverClient).
"""

from __future__ import annotations

import datetime
import hashlib
import os
import ssl
from dataclasses import dataclass
from pathlib import Path

import httpx
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from agent.control_plane import FailoverClient
from common import join_token
from common.private_fs import private_dir, write_private

RENEW_FRACTION = 1 / 3  # renew when a third of the lifetime is left (30 of 90 days)


class JoinFailed(Exception):
    """The join or renewal could not complete; the message says why."""


@dataclass(frozen=True)
class NodeFiles:
    cert: Path
    key: Path
    ca: Path


def node_files(pki_dir: Path, node_id: str) -> NodeFiles:
    d = Path(pki_dir)
    return NodeFiles(d / f"{node_id}.crt", d / f"{node_id}.key", d / "ca.crt")


def parse_token(token: str) -> tuple[str, str, str]:
    try:
        return join_token.parse_token(token)
    except join_token.BadJoinToken as exc:
        raise JoinFailed(str(exc)) from None


def _key_and_csr(node_id: str) -> tuple[bytes, str]:
    key = ec.generate_private_key(ec.SECP256R1())
    csr = (x509.CertificateSigningRequestBuilder()
           .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, node_id)]))
           .sign(key, hashes.SHA256()))
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    return key_pem, csr.public_bytes(serialization.Encoding.PEM).decode()


def _ca_sha256(pem: str) -> str:
    return hashlib.sha256(x509.load_pem_x509_certificate(pem.encode()).public_bytes(
        serialization.Encoding.DER)).hexdigest()


def _write_atomic(path: Path, data: bytes, *, private: bool) -> None:
    tmp = path.with_name(f".{path.name}.new")
    if private:
        tmp.unlink(missing_ok=True)
        write_private(tmp, data)
    else:
        tmp.write_bytes(data)
    os.replace(tmp, path)


def _save(files: NodeFiles, key_pem: bytes, answer: dict) -> None:
    private_dir(files.cert.parent)
    _write_atomic(files.ca, answer["ca_pem"].encode(), private=False)
    _write_atomic(files.key, key_pem, private=True)
    _write_atomic(files.cert, answer["cert_pem"].encode(), private=False)


def _error(resp: httpx.Response) -> str:
    try:
        return resp.json()["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return resp.text[:200]


def fetch_ca(urls: list[str], ca_sha256: str) -> str:
    """The cluster CA from the first URL that serves the one the token names."""
    problems = []
    for url in urls:
        try:
            # Not verified yet: the CA is what we are fetching. Its hash in the token is the check.
            resp = httpx.get(f"{url}/api/ai/join/ca", verify=False, timeout=10)
        except httpx.HTTPError as exc:
            problems.append(f"{url}: {exc}")
            continue
        if resp.status_code != 200:
            problems.append(f"{url}: {resp.status_code} {_error(resp)}")
            continue
        try:
            if _ca_sha256(resp.text) == ca_sha256.lower():
                return resp.text
        except ValueError:
            pass
        problems.append(f"{url}: its CA is not the one the token names (wrong cluster, or someone in between)")
    raise JoinFailed("cannot get the cluster CA: " + "; ".join(problems))


def _post_csr(client: FailoverClient, path: str, body: dict, what: str, files: NodeFiles, key_pem: bytes) -> None:
    """POST a CSR, then save the signed certificate the control plane answers with beside its key."""
    try:
        resp = client.post(path, json=body)
    except httpx.HTTPError as exc:
        raise JoinFailed(f"no control plane answered: {exc}") from None
    finally:
        client.close()
    if resp.status_code != 200:
        raise JoinFailed(f"{what} refused ({resp.status_code}): {_error(resp)}")
    _save(files, key_pem, resp.json())


def join(token: str, node_id: str, urls: list[str], pki_dir: Path) -> NodeFiles:
    _token_id, _secret, ca_hash = parse_token(token)
    ca_pem = fetch_ca(urls, ca_hash)
    files = node_files(pki_dir, node_id)
    private_dir(files.cert.parent)
    _write_atomic(files.ca, ca_pem.encode(), private=False)
    key_pem, csr = _key_and_csr(node_id)
    _post_csr(FailoverClient(urls, verify=ssl.create_default_context(cafile=str(files.ca))), "/api/ai/join",
              {"token": token, "node_id": node_id, "csr_pem": csr}, "join", files, key_pem)
    return files


def not_after(cert_path: Path) -> datetime.datetime:
    return x509.load_pem_x509_certificate(Path(cert_path).read_bytes()).not_valid_after_utc


def renewal_due(cert_path: Path, now: datetime.datetime | None = None) -> bool:
    cert = x509.load_pem_x509_certificate(Path(cert_path).read_bytes())
    now = now or datetime.datetime.now(datetime.timezone.utc)
    life = cert.not_valid_after_utc - cert.not_valid_before_utc
    return cert.not_valid_after_utc - now <= life * RENEW_FRACTION


def renew(node_id: str, urls: list[str], pki_dir: Path, *, force: bool = False) -> bool:
    """True when a new certificate was written; False when it was not due yet."""
    files = node_files(pki_dir, node_id)
    if not force and not renewal_due(files.cert):
        return False
    key_pem, csr = _key_and_csr(node_id)
    ctx = ssl.create_default_context(cafile=str(files.ca))
    ctx.load_cert_chain(str(files.cert), str(files.key))
    _post_csr(FailoverClient(urls, verify=ctx), f"/api/ai/nodes/{node_id}/renew", {"csr_pem": csr}, "renewal",
              files, key_pem)
    return True


def export_expiry(registry, cert_path: Path) -> None:
    """fabric_agent_certificate_expiry_timestamp_seconds: when the serving/client cert ends
    (docs/dashboards/alerts.yml alerts two weeks before; the renewal timer acts at 30 days)."""
    from prometheus_client import Gauge

    gauge = Gauge("fabric_agent_certificate_expiry_timestamp_seconds",
                  "Unix time the agent's certificate stops being valid", registry=registry)
    gauge.set_function(lambda: _expiry_or_zero(cert_path))


def _expiry_or_zero(cert_path: Path) -> float:
    try:
        return not_after(cert_path).timestamp()
    except (OSError, ValueError):
        return 0.0

