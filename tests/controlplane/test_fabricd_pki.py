"""`fabricd pki issue-client` (controlplane/cli_fabricd.py): the gateway's client certificate for
the agents' KV index, signed by the cluster CA on a fabricd host. Checked here with cryptography
(chain, CN, EKU, modes, the key nowhere but OUT); tests/gateway/test_kv_index_mtls.py has a real
agent admit the certificate this command writes."""

from __future__ import annotations

import stat

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from typer.testing import CliRunner

from common.pki import ensure_ca, pki_dir
from controlplane.cli_fabricd import app


def _mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_issue_client_writes_a_cluster_ca_client_certificate_and_never_prints_the_key(tmp_path):
    state, out = tmp_path / "fabricd", tmp_path / "out"
    ca_crt, _ = ensure_ca(state)
    before = sorted(p.name for p in pki_dir(state).iterdir())
    res = CliRunner().invoke(app, ["pki", "issue-client", "--state-dir", str(state), "--out", str(out)])
    assert res.exit_code == 0, res.output
    crt_path, key_path, ca_path = out / "fabric-gateway.crt", out / "fabric-gateway.key", out / "ca.crt"
    assert _mode(out) == 0o700 and _mode(key_path) == 0o600
    assert _mode(crt_path) == 0o644 and _mode(ca_path) == 0o644
    key_pem = key_path.read_text()
    assert "PRIVATE KEY" in key_pem and "PRIVATE KEY" not in res.output
    assert key_pem.splitlines()[1] not in res.output
    assert "FABRIC_GATEWAY_KV_CLIENT_KEY=/etc/fabric/kv/fabric-gateway.key" in res.output
    assert sorted(p.name for p in pki_dir(state).iterdir()) == before  # nothing of it kept on the fabricd host

    assert ca_path.read_bytes() == ca_crt.read_bytes()
    ca = x509.load_pem_x509_certificate(ca_path.read_bytes())
    cert = x509.load_pem_x509_certificate(crt_path.read_bytes())
    cert.verify_directly_issued_by(ca)  # raises unless the cluster CA signed it
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "fabric-gateway"
    ekus = list(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)
    assert ekus == [ExtendedKeyUsageOID.CLIENT_AUTH]  # a client only: no server may present it
    assert cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is False
    key = serialization.load_pem_private_key(key_pem.encode(), password=None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    assert key.public_key().public_numbers() == cert.public_key().public_numbers()


def test_issue_client_refuses_a_host_without_the_ca_and_a_name_a_node_could_hold(tmp_path):
    runner = CliRunner()
    res = runner.invoke(app, ["pki", "issue-client", "--state-dir", str(tmp_path / "none"),
                              "--out", str(tmp_path / "o1")])
    assert res.exit_code == 2 and "holds no cluster CA" in res.output
    assert not (tmp_path / "none" / "pki" / "ca.key").exists()  # no new CA made on the wrong host
    assert not (tmp_path / "o1").exists()
    ensure_ca(tmp_path / "fabricd")
    res = runner.invoke(app, ["pki", "issue-client", "--state-dir", str(tmp_path / "fabricd"),
                              "--out", str(tmp_path / "o2"), "--cn", "gpu-1"])
    assert res.exit_code == 2 and "--cn 'gpu-1'" in res.output and "act as a node" in res.output
    assert not (tmp_path / "o2").exists()


def test_issue_client_refuses_an_out_another_user_prepared(tmp_path):
    """Issue 50 (Low): a local user prepares /tmp/gw-kv (world-writable, or theirs) with a link
    by the key's name; the key must not land where they can read it or where the link points."""
    import os

    state = tmp_path / "fabricd"
    ensure_ca(state)
    runner = CliRunner()
    shared = tmp_path / "gw-kv"
    shared.mkdir()
    os.chmod(shared, 0o777)
    res = runner.invoke(app, ["pki", "issue-client", "--state-dir", str(state), "--out", str(shared)])
    assert res.exit_code == 2 and "writable by others" in res.output
    assert list(shared.iterdir()) == []
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, 4242, 4242)  # tests run as root: a directory of another user
    res = runner.invoke(app, ["pki", "issue-client", "--state-dir", str(state), "--out", str(theirs)])
    assert res.exit_code == 2 and "not to you" in res.output
    (tmp_path / "elsewhere").mkdir(mode=0o700)
    os.symlink(tmp_path / "elsewhere", tmp_path / "link-out")
    res = runner.invoke(app, ["pki", "issue-client", "--state-dir", str(state), "--out", str(tmp_path / "link-out")])
    assert res.exit_code == 2 and "symlink" in res.output
    # A link planted by the key's name inside the caller's own directory is replaced, not followed.
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o700)
    bait = tmp_path / "bait"
    (mine / "fabric-gateway.key").symlink_to(bait)
    res = runner.invoke(app, ["pki", "issue-client", "--state-dir", str(state), "--out", str(mine)])
    assert res.exit_code == 0, res.output
    assert not bait.exists() and not (mine / "fabric-gateway.key").is_symlink()
    assert _mode(mine / "fabric-gateway.key") == 0o600
