"""The etcd CA and its certificates (`fabricd store issue-server`, `fabricd store issue-client`).

The etcd CA is its own CA, kept apart from the cluster CA in {state_dir}/etcd-pki (ca.crt, and
ca.key 0600): an agent's node certificate (cluster CA) does not open etcd's port, and an etcd
client certificate does not act as a node toward fabricd.

  - server certificates, one per member (CN = member name, SANs = its addresses), carry both
    serverAuth and clientAuth: members use them toward their peers (--peer-client-cert-auth),
    and etcd's JSON gateway dials its own gRPC port with it;
  - client certificates have no CN (O=Fabric, OU=the role they are for): etcd's JSON gateway
    answers 400 to a client certificate with a CN once auth is on, since it cannot pass the CN
    on; the role comes from the process's login (common.store.etcd_access).
"""

from __future__ import annotations

from pathlib import Path

from cryptography import x509
from cryptography.x509.oid import NameOID

from common.pki import ensure_ca, sign_leaf, write_leaf

CA_NAME = "fabric-etcd-ca"


def etcd_ca_dir(state_dir: Path) -> Path:
    return Path(state_dir) / "etcd-pki"


def ensure_etcd_ca(state_dir: Path) -> tuple[Path, Path]:
    """(ca.crt, ca.key) of the etcd CA, made the first time only."""
    return ensure_ca(state_dir, ca_dir=etcd_ca_dir(state_dir), common_name=CA_NAME)


def issue_server(state_dir: Path, member: str, hosts: list[str], out: Path) -> tuple[Path, Path, Path]:
    """Write OUT/MEMBER.crt, OUT/MEMBER.key (0600) and OUT/ca.crt for one etcd member."""
    ca_crt, _ = ensure_etcd_ca(state_dir)
    cert_pem, key_pem = sign_leaf(state_dir, member, server=True, client=True, role=None, hosts=hosts,
                                  ca_dir=etcd_ca_dir(state_dir))
    return (*write_leaf(out, member, cert_pem, key_pem, ca_crt), out / "ca.crt")


def issue_client(state_dir: Path, role: str, out: Path) -> tuple[Path, Path, Path]:
    """Write OUT/etcd-ROLE.crt, OUT/etcd-ROLE.key (0600) and OUT/ca.crt: a client certificate
    without CN for a process that logs in to etcd as ROLE."""
    ca_crt, _ = ensure_etcd_ca(state_dir)
    subject = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Fabric"),
                         x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, role)])
    cert_pem, key_pem = sign_leaf(state_dir, role, server=False, client=True, role=None, hosts=[],
                                  ca_dir=etcd_ca_dir(state_dir), subject=subject)
    return (*write_leaf(out, f"etcd-{role}", cert_pem, key_pem, ca_crt), out / "ca.crt")
