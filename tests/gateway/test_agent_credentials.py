"""Agent Runtime credentials (controlplane.api.agent_credentials) end to end: a real fabricd issues
them (API and `fabricctl ai credential`), a real gateway in front of fabric-engine-sim accepts
them for their one endpoint only, through a renewal's overlap, and refuses them once expired or
revoked. Expiry is reached by moving the stored record's times into the past (the gateway reads
the wall clock), never by waiting."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import time

import httpx
import pytest

from common import keyspace
from common.schemas import ApiKeyRecord
from common.store.connect import open_store
from fabricctl import credentials
from fabricctl.client import ClientError, FabricClient
from fabricctl.contexts import Resolved
from lab.rigs.polling import wait_for
from tests.controlplane.conftest import BIN, login, start_fabricd
from tests.gateway.gateway_harness import HMAC_SECRET, GatewayProcess, publish_endpoint, sim_engine


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("agent-cred")
    port = _free_port()  # fabricd names the gateway's URL at start, so the port is chosen first
    env = {"FABRIC_KEY_HMAC_SECRET": HMAC_SECRET, "FABRIC_CONSOLE_GATEWAY_URL": f"http://127.0.0.1:{port}"}
    with start_fabricd(tmp, env=env) as server:
        store = open_store(f"sqlite://{server.state_dir}/fabric.db")
        with sim_engine() as eng:
            publish_endpoint(store, "chat", [eng])
            publish_endpoint(store, "other", [eng])
            gw = GatewayProcess.start(server.state_dir, f"sqlite://{server.state_dir}/fabric.db",
                                      {"FABRIC_GATEWAY_CACHE_SECS": "0.2"}, port=port)
            try:
                yield server, store, gw
            finally:
                gw.stop()
                store.close()


def _call(base: str, key: str) -> httpx.Response:
    return httpx.post(f"{base}/chat/completions", headers={"Authorization": f"Bearer {key}"}, timeout=30,
                      json={"model": "sim-m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})


def _eventually(check, what: str) -> None:
    """The gateway caches a record for FABRIC_GATEWAY_CACHE_SECS (0.2 s): a change is seen within a few calls."""
    wait_for(check, 5, what, interval=0.05)


def _age(store, key_id: str, **times: float) -> None:
    kv = store.get(keyspace.api_keys(key_id))
    record = ApiKeyRecord.model_validate_json(kv.value)
    assert store.cas(kv.key, record.model_copy(update=times).model_dump_json(), kv.mod_revision)


def test_a_credential_calls_its_endpoint_only_and_renews_with_overlap(stack):
    server, store, gw = stack
    with server.client(login(server)) as api:
        issued = api.post("/api/ai/endpoints/chat/credentials", json={"runtime": "coder", "ttl_secs": 120})
        assert issued.status_code == 201, issued.text
        first = issued.json()
        assert first["inference_base"] == gw.openai_base("chat") == first["env"]["FABRIC_INFERENCE_BASE"]
        assert first["env"]["FABRIC_AI_API_KEY"] == first["key"] and first["name"] == "agent-runtime-coder"
        assert first["refresh_after"] == pytest.approx(first["expires_at"] - 40)
        assert _call(first["inference_base"], first["key"]).status_code == 200
        wrong = _call(gw.openai_base("other"), first["key"])
        assert wrong.status_code == 403 and wrong.json()["error"]["code"] == "endpoint_not_allowed"
        # One credential per runtime and endpoint: a second issue is refused, a refresh is the way.
        again = api.post("/api/ai/endpoints/chat/credentials", json={"runtime": "coder"})
        assert again.status_code == 409, again.text

        renewed = api.post(f"/api/ai/endpoints/chat/credentials/{first['id']}/refresh")
        assert renewed.status_code == 200, renewed.text
        second = renewed.json()
        assert second["id"] == first["id"] and second["key"] != first["key"]
        assert second["expires_at"] >= first["expires_at"]
        # The overlap: both secrets work, the old one exactly until it was due to expire (the new
        # one from the gateway's next record refresh).
        _eventually(lambda: _call(second["inference_base"], second["key"]).status_code == 200,
                    "the renewed secret is never accepted")
        assert _call(first["inference_base"], first["key"]).status_code == 200
        shown = api.get(f"/api/ai/keys/{first['id']}").json()
        assert shown["previous_valid_until"] == pytest.approx(first["expires_at"]) and shown["rotating"] is True
        assert first["key"] not in json.dumps(shown) and second["key"] not in json.dumps(shown)

        _age(store, first["id"], previous_valid_until=1.0)  # the first secret's expiry has passed
        _eventually(lambda: _call(first["inference_base"], first["key"]).status_code == 401,
                    "the first secret still works after its expiry")
        assert _call(second["inference_base"], second["key"]).status_code == 200
        _age(store, first["id"], expires_at=1.0)  # and the second's
        _eventually(lambda: _call(second["inference_base"], second["key"]).json().get("error", {}).get("code")
                    == "expired_api_key", "an expired credential is still accepted")


def test_a_revoked_credential_is_refused_and_bad_requests_say_why(stack):
    server, _, gw = stack
    with server.client(login(server)) as api:
        cred = api.post("/api/ai/endpoints/chat/credentials", json={"runtime": "revokee"}).json()
        assert _call(cred["inference_base"], cred["key"]).status_code == 200
        # Only agent runtime credentials of that endpoint are reachable here.
        assert api.delete(f"/api/ai/endpoints/other/credentials/{cred['id']}").status_code == 404
        plain = api.post("/api/ai/keys", json={"name": "plain", "endpoint": "chat"}).json()
        assert api.post(f"/api/ai/endpoints/chat/credentials/{plain['id']}/refresh").status_code == 404
        gone = api.delete(f"/api/ai/endpoints/chat/credentials/{cred['id']}")
        assert gone.status_code == 200 and gone.json()["deleted"] is True
        _eventually(lambda: _call(cred["inference_base"], cred["key"]).status_code == 401,
                    "a revoked credential is still accepted")
        for body, field in (({"runtime": "x", "ttl_secs": 5}, "ttl_secs"), ({"runtime": "Bad_Name"}, "runtime"),
                            ({"runtime": "x", "ttl_secs": 10**6}, "ttl_secs")):
            bad = api.post("/api/ai/endpoints/chat/credentials", json=body)
            assert bad.status_code == 422 and field in bad.text, bad.text
        missing = api.post("/api/ai/endpoints/nope/credentials", json={"runtime": "x"})
        assert missing.status_code == 404


def test_fabricctl_writes_the_runtime_env_file_and_revokes(stack, tmp_path):
    server, _, gw = stack
    env = {k: v for k, v in os.environ.items() if not k.startswith("FABRIC_")}
    env.update(FABRIC_URL=server.url, FABRIC_CONFIG_DIR=str(tmp_path), FABRIC_TOKEN=login(server))

    def ctl(*args):
        proc = subprocess.run([str(BIN / "fabricctl"), "ai", "credential", *args], capture_output=True, text=True,
                              env=env, timeout=60)
        assert proc.returncode == 0, proc.stderr
        return proc

    target = tmp_path / "agent.env"
    done = ctl("issue", "chat", "--runtime", "cli", "--ttl-secs", "300", "--env-file", str(target))
    assert "FABRIC_AI_API_KEY" not in done.stdout + done.stderr and "fvai_" not in done.stdout + done.stderr
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    values = dict(line.split("=", 1) for line in target.read_text().splitlines())
    assert values["FABRIC_INFERENCE_BASE"] == gw.openai_base("chat")
    assert _call(values["FABRIC_INFERENCE_BASE"], values["FABRIC_AI_API_KEY"]).status_code == 200
    with server.client(login(server)) as api:
        cred_id = next(k["id"] for k in api.get("/api/ai/keys").json() if k["name"] == "agent-runtime-cli")
    assert "revoked" in ctl("revoke", "chat", cred_id).stdout
    _eventually(lambda: _call(values["FABRIC_INFERENCE_BASE"], values["FABRIC_AI_API_KEY"]).status_code == 401,
                "a credential revoked with fabricctl is still accepted")


def test_watch_renews_and_rewrites_the_env_file_atomically(stack, tmp_path):
    """`credential issue --env-file F --watch`'s loop (credentials.keep_fresh) stepped by a clock
    and sleep of the test's: it renews at refresh_after, rewrites F (0600, a new file renamed over
    it) only after the settle, retries while fabricd is unreachable, and stops at a revocation."""
    server, _, gw = stack
    token = login(server)
    resolved = Resolved(url=server.url, ca=None, token=token, context=None, token_source="flag",
                        config_path=tmp_path / "config")
    dead = Resolved(**{**resolved.__dict__, "url": f"http://127.0.0.1:{_free_port()}"})
    live, away = FabricClient(resolved), FabricClient(dead)
    target = tmp_path / "agent.env"
    first = live.post("/api/ai/endpoints/chat/credentials", {"runtime": "watcher", "ttl_secs": 120})
    credentials.write_env_file(target, first)

    def values() -> dict[str, str]:
        return dict(line.split("=", 1) for line in target.read_text().splitlines())

    now = [time.time()]
    slept: list[float] = []
    keys = [first["key"]]
    state = {"unreachable": False}

    class Client:  # the real client; once, fabricd unreachable (a refused connection)
        def post(self, path: str, body: dict):
            if state["unreachable"]:
                state["unreachable"] = False
                return away.post(path, body)
            return live.post(path, body)

    def sleep(s: float) -> None:
        slept.append(s)
        now[0] += s
        n = len(slept)
        if n == 2:  # the settle after the first renewal: F still holds the first key, which still works
            assert values()["FABRIC_AI_API_KEY"] == first["key"]
        if n == 3:  # F rewritten with the renewed key: a new file (renamed over F), 0600, no temp left
            renewed = values()["FABRIC_AI_API_KEY"]
            assert renewed not in keys and target.stat().st_ino != inode
            assert stat.S_IMODE(target.stat().st_mode) == 0o600
            assert sorted(p.name for p in tmp_path.iterdir()) == ["agent.env"]
            _eventually(lambda: _call(values()["FABRIC_INFERENCE_BASE"], renewed).status_code == 200,
                        "the renewed key is refused")
            assert _call(gw.openai_base("chat"), first["key"]).status_code == 200  # overlap: old still valid
            keys.append(renewed)
            state["unreachable"] = True
        if n == 6:  # the renewal after the retry written; revoke: the next refresh is refused (404)
            keys.append(values()["FABRIC_AI_API_KEY"])
            live.delete(f"/api/ai/endpoints/chat/credentials/{first['id']}")

    inode = target.stat().st_ino
    with pytest.raises(ClientError) as refused:
        credentials.keep_fresh(Client(), "chat", target, first, clock=lambda: now[0], sleep=sleep,
                               settle_s=2.0, retry_s=3.0)
    assert refused.value.status == 404
    assert slept[0] == pytest.approx(80, abs=5)  # refresh_after: two thirds into the 120 s TTL
    assert slept[1] == 2.0 and slept[3] == pytest.approx(3.0)  # the settle; the retry after the refused connection
    assert slept[4] == 2.0 and len(slept) == 6
    assert len(set(keys)) == 3 and values()["FABRIC_AI_API_KEY"] == keys[-1]
    live.close()
    away.close()
