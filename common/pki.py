"""The cluster PKI: one CA made at `fabricd init`, certificates signed by it, TLS contexts.

Layout under the state directory (the directory is 0700, keys 0600, certificates 0644):
    {state_dir}/pki/ca.crt, ca.key          the cluster CA (EC P-256), made once
    {state_dir}/pki/{name}.crt, {name}.key  leaf certificates (fabricd, agents, gateway)

fabricd serves its REST API with a leaf from this CA; the control plane and the agents use
the same CA for mutual TLS, where the peer's identity is the certificate's common name
(`peer_common_name`) and what it may do is its role (`peer_role`): one of ROLES, written into
the subject's organizational unit (OU) by the signer only. Every mTLS route checks the role as
well as the name (a gateway's client certificate is never a node, whatever its CN), and a
certificate without a role is nobody's. Calling `ensure_ca` again never replaces an existing CA,
because every certificate already handed out would stop verifying.

Node ids are server names in the node's certificate (fabricd pins an agent's TLS to its id), so
`node_id_refusal` keeps special names out: a component's certificate name, `localhost` and its
kin, and anything a resolver or a TLS library could read as an address.
"""

from __future__ import annotations

import datetime
import ipaddress
import re
import ssl
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from common.private_fs import private_dir, write_new, write_private

CA_DAYS = 3650
LEAF_DAYS = 825
LEAF_BACKDATE_S = 300  # not_valid_before is this far before the signing (clock skew)
# What a certificate's holder is; written as the subject's OU "fabric-<role>".
ROLE_NODE, ROLE_GATEWAY, ROLE_FABRICD, ROLE_TOOL = "node", "gateway", "fabricd", "tool"
ROLES = (ROLE_NODE, ROLE_GATEWAY, ROLE_FABRICD, ROLE_TOOL)
_ROLE_OU = "fabric-"
# Leaf names fabricd and the gateway use in the PKI directory, and names a TLS client treats
# specially: a node by one of these would overwrite their certificates or be served under them.
RESERVED_CERT_NAMES = frozenset({"ca", "fabricd", "fabric-gateway", "gateway", "fabricctl", "etcd", "root",
                                 "localhost", "localdomain", "ip6-localhost", "ip6-loopback", "broadcasthost",
                                 "wpad"})
_ADDRESS_LIKE = re.compile(r"^(0x[0-9a-f]+|[0-9]+)$")  # 2130706433 and 0x7f000001 read as 127.0.0.1


def pki_dir(state_dir: Path) -> Path:
    return Path(state_dir) / "pki"


_write_private = write_private  # keys: 0600 from creation, never briefly world-readable


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


def ensure_ca(state_dir: Path, *, ca_dir: Path | None = None,
              common_name: str = "fabric-cluster-ca") -> tuple[Path, Path]:
    """Return (ca.crt, ca.key), creating the CA the first time only. ``ca_dir`` keeps a CA of
    another purpose apart from the cluster CA (the etcd CA: common.store.etcd_pki)."""
    d = private_dir(ca_dir if ca_dir is not None else pki_dir(state_dir))
    crt, key_path = d / "ca.crt", d / "ca.key"
    if crt.exists() and key_path.exists():
        return crt, key_path
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=CA_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
                key_encipherment=False, data_encipherment=False, key_agreement=False,
                encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    _write_private(key_path, _key_pem(key))
    crt.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return crt, key_path


MAX_SAN_HOSTS = 16
_DNS_NAME = re.compile(r"^(?=.{1,253}$)([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*$")


def check_san_host(host: str) -> str:
    """An IP address or an ASCII DNS name (no wildcard, no empty label), as a SAN may carry one.

    Raises ValueError naming the host; internationalised names go in their xn-- (punycode) form."""
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        pass
    name = host.lower()
    if not _DNS_NAME.match(name):
        raise ValueError(f"host {host!r} is neither an IP address nor a DNS name (ASCII letters, digits, '-' and "
                         "'.' between labels of 1-63; no wildcard; an internationalised name in its xn-- form)")
    return name


def node_id_refusal(node_id: str) -> str | None:
    """Why ``node_id`` may not name a node (None: it may). Callers check the DNS-label shape first."""
    if node_id in RESERVED_CERT_NAMES or node_id.startswith("localhost"):
        return f"node id {node_id!r} is reserved (a Fabric component's certificate or a special host name)"
    if _ADDRESS_LIKE.match(node_id):
        return f"node id {node_id!r} reads as an IP address; a node id needs a letter that is not a hex digit"
    return None


def _san(hosts: list[str]) -> x509.SubjectAlternativeName:
    names: list[x509.GeneralName] = []
    for h in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            names.append(x509.DNSName(h))
    return x509.SubjectAlternativeName(names)


def issue_cert(
    state_dir: Path,
    name: str,
    *,
    server: bool,
    client: bool,
    role: str | None,
    hosts: list[str] | None = None,
) -> tuple[Path, Path]:
    """Sign a leaf for `name` (CN=name, OU=the role, SANs from hosts, plus `name` itself when it
    is a DNS label) and write {name}.crt/.key; reissues on each call. The name as a SAN is what
    fabricd pins an agent's certificate to (controlplane.agent_client: the node id as TLS server name)."""
    cert_pem, key_pem = sign_leaf(state_dir, name, server=server, client=client, role=role, hosts=hosts)
    d = pki_dir(state_dir)
    crt_path, key_path = d / f"{name}.crt", d / f"{name}.key"
    _write_private(key_path, key_pem)
    crt_path.write_bytes(cert_pem)
    return crt_path, key_path


def sign_leaf(
    state_dir: Path,
    name: str,
    *,
    server: bool,
    client: bool,
    role: str | None,
    hosts: list[str] | None = None,
    ca_dir: Path | None = None,
    subject: x509.Name | None = None,
) -> tuple[bytes, bytes]:
    """(certificate PEM, key PEM) of a new leaf signed by the CA, as issue_cert makes it, written
    nowhere: for a key that belongs on another host (`fabricd pki issue-client`). ``role`` is one
    of ROLES (None only for another CA's leaves: etcd's, where Fabric's roles mean nothing).
    ``ca_dir`` signs with another CA than the cluster's; ``subject`` replaces CN=name (etcd's
    gateway refuses client certificates that carry a CN once its auth is on)."""
    if not (server or client):
        raise ValueError("a certificate must be for a server, a client or both")
    if subject is None:
        subject = leaf_subject(name, role)
    hosts = ["127.0.0.1", "localhost"] if hosts is None else hosts
    if server and _DNS_NAME.match(name) and name not in hosts:
        hosts = [name, *hosts]
    ca_crt_path, ca_key_path = ensure_ca(state_dir, ca_dir=ca_dir)
    ca_cert = x509.load_pem_x509_certificate(ca_crt_path.read_bytes())
    ca_key = serialization.load_pem_private_key(ca_key_path.read_bytes(), password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey), "the CA key ensure_ca writes is an EC key"
    key = ec.generate_private_key(ec.SECP256R1())
    ekus = ([ExtendedKeyUsageOID.SERVER_AUTH] if server else []) + (
        [ExtendedKeyUsageOID.CLIENT_AUTH] if client else []
    )
    now = _now()
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(seconds=LEAF_BACKDATE_S))
        .not_valid_after(now + datetime.timedelta(days=LEAF_DAYS))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage(ekus), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
    )
    if hosts:
        builder = builder.add_extension(_san(hosts), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    return cert.public_bytes(serialization.Encoding.PEM), _key_pem(key)


def leaf_subject(name: str, role: str | None) -> x509.Name:
    """CN=name, and OU=fabric-<role> when a role is given (the one place a role is written)."""
    if role is not None and role not in ROLES:
        raise ValueError(f"role {role!r} is not one of {', '.join(ROLES)}")
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, name)]
    if role is not None:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, _ROLE_OU + role))
    return x509.Name(attrs)


def write_leaf(out: Path, name: str, cert_pem: bytes, key_pem: bytes, ca_crt: Path) -> tuple[Path, Path]:
    """OUT/NAME.crt and OUT/ca.crt (0644), OUT/NAME.key (0600) in a 0700 OUT: a leaf for another
    host (`fabricd pki issue-*`, `fabricd store issue-*`). Each file is created anew,
    O_EXCL|O_NOFOLLOW, so a link planted by its name is never followed."""
    private_dir(out)
    crt, key, ca = out / f"{name}.crt", out / f"{name}.key", out / "ca.crt"
    write_new(key, key_pem)
    write_new(crt, cert_pem, 0o644)
    write_new(ca, ca_crt.read_bytes(), 0o644)
    return crt, key


def server_ssl_context(
    cert: Path, key: Path, ca: Path | None = None, require_client_cert: bool = False
) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(str(cert), str(key))
    if ca is not None:
        ctx.load_verify_locations(cafile=str(ca))
        ctx.verify_mode = ssl.CERT_REQUIRED if require_client_cert else ssl.CERT_OPTIONAL
    elif require_client_cert:
        raise ValueError("requiring client certificates needs the CA that signs them")
    return ctx


def client_ssl_context(ca: Path, cert: Path | None = None, key: Path | None = None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=str(ca))
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if (cert is None) != (key is None):
        raise ValueError("a client certificate needs both cert and key")
    if cert is not None and key is not None:
        ctx.load_cert_chain(str(cert), str(key))
    return ctx


def peer_role(peercert: dict | None) -> str | None:
    """The Fabric role of a verified peer certificate (`getpeercert()`'s dict); None without one."""
    roles = [value[len(_ROLE_OU):] for rdn in (peercert or {}).get("subject", ()) for attr, value in rdn
             if attr == "organizationalUnitName" and value.startswith(_ROLE_OU)]
    return roles[0] if len(roles) == 1 and roles[0] in ROLES else None


def peer_common_name(peercert: dict | None) -> str | None:
    """CN from `SSLSocket.getpeercert()` (or the ASGI TLS extension's equivalent dict); None if absent."""
    if not peercert:
        return None
    for rdn in peercert.get("subject", ()):
        for attr, value in rdn:
            if attr == "commonName":
                return value
    return None
