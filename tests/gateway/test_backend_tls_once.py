"""The gateway's upstream TLS context is built once per process (gateway.assemble.create_app) and
shared by the HTTP pool and the WebSocket bridge: a WebSocket call builds none of its own, and the
bridge does not reach up into gateway.assemble for one."""

from __future__ import annotations

import ast
import ssl
from pathlib import Path

from common import pki
from common.store.sqlite_store import SqliteStore
from gateway import assemble
from gateway.settings import BackendTls, GatewaySettings

ROOT = Path(__file__).resolve().parents[2]


def test_one_context_for_the_pool_and_the_bridge(tmp_path, monkeypatch):
    ca, _ = pki.ensure_ca(tmp_path)
    crt, key = pki.issue_cert(tmp_path, "gateway", server=False, client=True, role="gateway")
    built = []
    real = assemble.backend_ssl
    monkeypatch.setattr(assemble, "backend_ssl", lambda tls: built.append(tls) or real(tls))
    store = SqliteStore(tmp_path / "fabric.db")
    states = []
    try:
        tls = GatewaySettings(backend_tls=BackendTls(True, str(crt), str(key), str(ca)))
        state = assemble.create_app(tls, store, b"k" * 32, "gw-test").state
        states.append(state)
        assert isinstance(state.backend_ssl, ssl.SSLContext) and len(built) == 1
        assert state.client.ssl_context is state.backend_ssl
        plain = assemble.create_app(GatewaySettings(), store, b"k" * 32, "gw-plain").state
        states.append(plain)
        assert plain.backend_ssl is None and plain.client.ssl_context is None
    finally:
        for st in states:  # the writer threads create_app started
            st.audit.close()
            st.limits.usage.close()
            if st.ledger is not None:
                st.ledger.close()
        store.close()


def test_the_bridge_does_not_import_the_assembly():
    tree = ast.parse((ROOT / "gateway" / "websocket_bridge.py").read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert "gateway.assemble" not in imported
