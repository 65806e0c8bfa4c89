"""`fabricctl ai node add` and `node join-token` send where the new node registers (site, replica
networks, balancer role) in the same fields, and leave out nothing the operator gave."""

from __future__ import annotations

from contextlib import contextmanager

import pytest

import fabricctl
from fabricctl import nodes


@pytest.fixture
def sent(monkeypatch) -> list[tuple[str, dict]]:
    calls: list[tuple[str, dict]] = []

    class Recorder:
        def post(self, path: str, body: dict) -> dict:
            calls.append((path, body))
            if path.endswith("/certificate"):
                return {"node_id": "gpu-1", "key_pem": "KEY", "cert_pem": "CERT", "ca_pem": "CA"}
            return {"token": "t", "command": "fabric-agent join ..."}

    @contextmanager
    def session(*_args, **_kwargs):
        yield Recorder()

    monkeypatch.setattr(nodes, "session", session)
    return calls


def run(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as done:
        fabricctl.main(argv)
    assert done.value.code == 0


def test_add_and_join_token_send_the_same_registration(sent, tmp_path):
    where = ["--host", "gpu-1.lan", "--site", "west", "--replica-network", "10.8.0.0/16",
             "--replica-network", "10.9.0.0/16", "--no-balancer"]
    run(["ai", "node", "add", "gpu-1", "--out", str(tmp_path / "pki"), *where])
    run(["ai", "node", "join-token", "--node-id", "gpu-1", "--ttl", "120", *where])
    (add_path, add_body), (join_path, join_body) = sent
    registration = {"hosts": ["gpu-1.lan"], "site": "west", "replica_networks": ["10.8.0.0/16", "10.9.0.0/16"],
                    "balancer": False}
    assert (add_path, add_body) == ("/api/ai/nodes/gpu-1/certificate", registration)
    assert (join_path, join_body) == ("/api/ai/join-tokens", {"node_id": "gpu-1", "ttl_s": 120, **registration})


def test_the_role_is_left_to_fabricd_unless_given(sent, tmp_path):
    run(["ai", "node", "add", "gpu-2", "--out", str(tmp_path / "pki")])
    run(["ai", "node", "join-token", "--balancer"])
    assert sent[0][1] == {"hosts": [], "site": None, "replica_networks": [], "balancer": None}
    assert sent[1][1]["balancer"] is True and sent[1][1]["node_id"] is None
