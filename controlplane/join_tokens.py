"""Node join tokens and the certificates they buy: the one door to their records.

A join token is made by an admin (`fabricctl ai node join-token`, POST
/api/ai/nodes/join-tokens) and handed to one new GPU host, whose `fabric-agent join` trades it
once, before it expires, for a certificate from the cluster CA (CN = the node id) signed over
a key the node made itself: no private key is copied by hand, and none leaves the node.

    token = "fjt1.<id>.<secret>.<ca sha256>"
    record at {ROOT}/join-tokens/<id>: sha256(secret), the node id it is bound to (or any), the
    SAN hosts the admin allowed, created/expires times (the record has a store lease too)

Only the secret's SHA-256 is stored (the secret is 32 random bytes, so a plain hash is enough);
the CA's hash in the token lets the agent check the CA it downloads before trusting it. Trading
deletes the record with a compare-and-swap, so two agents racing with one token get one
certificate. The hosts come from the admin, never from the node: a token holder cannot get a
certificate naming fabricd's address. The site and replica networks the node registers with come
from the token too (controlplane.node_certs), and a token without a node id only creates a new
node. Joined and renewed certificates live JOINED_CERT_DAYS;
the node renews with its current certificate (POST /api/ai/nodes/{id}/renew) when a third of
that is left.
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
import ipaddress
import secrets
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID

from common import join_token as common_join_token
from common.errors import InvalidInput, Unauthorized
from common.pki import LEAF_BACKDATE_S, ROLE_NODE, ensure_ca, leaf_subject
from common.records import join_tokens as token_records
from common.records.join_tokens import JoinTokenRecord
from common.store.base import Store

PREFIX = token_records.PREFIX
DEFAULT_TTL_S = 900
MAX_TTL_S = 86_400
JOINED_CERT_DAYS = 90


def ca_sha256(state_dir: Path) -> str:
    """SHA-256 of the cluster CA certificate (DER): what a joining agent pins."""
    crt, _ = ensure_ca(state_dir)
    return hashlib.sha256(x509.load_pem_x509_certificate(crt.read_bytes()).public_bytes(
        serialization.Encoding.DER)).hexdigest()


def parse_token(token: str) -> tuple[str, str, str]:
    """(id, secret, ca sha256) of a token string; InvalidInput when it is not one."""
    try:
        return common_join_token.parse_token(token)
    except common_join_token.BadJoinToken as exc:
        raise InvalidInput(str(exc)) from None


def create(store: Store, state_dir: Path, *, node_id: str | None, hosts: list[str], ttl_s: int,
           now: float, site: str | None = None, replica_networks: list[str] | None = None,
           balancer: bool | None = None) -> tuple[str, JoinTokenRecord]:
    if not 60 <= ttl_s <= MAX_TTL_S:
        raise InvalidInput(f"ttl must be 60-{MAX_TTL_S} seconds, got {ttl_s}")
    token_id, secret = secrets.token_hex(6), secrets.token_urlsafe(32)
    record = JoinTokenRecord(id=token_id, secret_sha256=hashlib.sha256(secret.encode()).hexdigest(),
                             node_id=node_id, hosts=hosts, site=site, replica_networks=replica_networks or [], balancer=balancer,
                             created_at=now, expires_at=now + ttl_s)
    # the store forgets an unused token by itself
    if not token_records.create_leased(store, record, ttl_s + 60):
        raise InvalidInput("join token id collision; ask again")
    return common_join_token.format_token(token_id, secret, ca_sha256(state_dir)), record


def consume(store: Store, token: str, node_id: str, now: float) -> JoinTokenRecord:
    """The token's record, deleted so it cannot be used again; Unauthorized when the token is
    unknown, used, expired, for another node, or its secret is wrong (one message for all)."""
    token_id, secret, _ca = parse_token(token)
    refused = Unauthorized("join token is invalid, used or expired; ask an admin for a new one",
                           code="bad_join_token")
    found = token_records.versioned(store, token_id)
    if found is None:
        raise refused
    record, revision = found
    good = hmac.compare_digest(record.secret_sha256, hashlib.sha256(secret.encode()).hexdigest())
    if not good or now > record.expires_at or (record.node_id and record.node_id != node_id):
        raise refused
    if not token_records.discard(store, token_id, revision):
        raise refused  # another joiner traded it first
    return record


def for_any_node(store: Store, token: str) -> bool:
    """Whether the token names an unspent any-node token (its secret is checked by consume)."""
    try:
        token_id = parse_token(token)[0]
    except InvalidInput:
        return False
    found = token_records.versioned(store, token_id)
    return found is not None and found[0].node_id is None


def list_active(store: Store, now: float) -> list[JoinTokenRecord]:
    return sorted((r for r in token_records.list(store) if r.expires_at >= now), key=lambda r: r.created_at)


def sign_csr(state_dir: Path, csr_pem: str, node_id: str, hosts: list[str],
             days: int = JOINED_CERT_DAYS) -> tuple[str, str, float]:
    """(certificate PEM, CA PEM, not_after) for the CSR's key: CN=node_id, role node, SANs
    node_id + hosts, client and server use. The CSR's own subject and extensions are ignored."""
    try:
        csr = x509.load_pem_x509_csr(csr_pem.encode())
    except ValueError:
        raise InvalidInput("csr_pem is not a PEM certificate signing request") from None
    if not csr.is_signature_valid:
        raise InvalidInput("the CSR's signature does not verify")
    ca_crt, ca_key_path = ensure_ca(state_dir)
    ca_cert = x509.load_pem_x509_certificate(ca_crt.read_bytes())
    ca_key = serialization.load_pem_private_key(ca_key_path.read_bytes(), password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey), "the CA key ensure_ca writes is an EC key"
    now = datetime.datetime.now(datetime.timezone.utc)
    names: list[x509.GeneralName] = []
    for host in dict.fromkeys([node_id, *hosts]):
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    cert = (x509.CertificateBuilder()
            .subject_name(leaf_subject(node_id, ROLE_NODE))
            .issuer_name(ca_cert.subject).public_key(csr.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(seconds=LEAF_BACKDATE_S))
            .not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                           critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .sign(ca_key, hashes.SHA256()))
    return (cert.public_bytes(serialization.Encoding.PEM).decode(), ca_crt.read_text(),
            cert.not_valid_after_utc.timestamp())


def cert_hosts(cert_pem: str) -> list[str]:
    """The SAN hosts of a certificate (what a renewal keeps)."""
    cert = x509.load_pem_x509_certificate(cert_pem.encode())
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return []
    return [str(v) for v in san.get_values_for_type(x509.DNSName)] + [
        str(v) for v in san.get_values_for_type(x509.IPAddress)]
