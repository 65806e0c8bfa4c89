"""API keys end to end: fabricd's /api/ai/keys (real process), fabricctl ai key (real CLI), and
the key it prints used through a real gateway against fabric-engine-sim."""

from __future__ import annotations

import json
import os
import subprocess

import openai
import pytest

from common import keyspace
from common.store.connect import open_store
from tests.controlplane.conftest import BIN, login, start_fabricd
from tests.gateway.gateway_harness import HMAC_SECRET, GatewayProcess, publish_endpoint, sim_engine


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("keys")
    with start_fabricd(tmp, env={"FABRIC_KEY_HMAC_SECRET": HMAC_SECRET}) as server:
        store = open_store(f"sqlite://{server.state_dir}/fabric.db")
        with sim_engine() as eng:
            publish_endpoint(store, "chat", [eng])
            gw = GatewayProcess.start(server.state_dir, f"sqlite://{server.state_dir}/fabric.db",
                                      {"FABRIC_GATEWAY_CACHE_SECS": "0.2"})
            try:
                yield server, store, gw
            finally:
                gw.stop()
                store.close()


def test_keys_api_create_list_rotate_delete_never_shows_a_hash(stack):
    server, _, _ = stack
    with server.client() as anon:
        assert anon.get("/api/ai/keys").status_code == 401
    with server.client(login(server)) as api:
        created = api.post("/api/ai/keys", json={"name": "k1", "endpoint": "chat", "request_quota": 5})
        assert created.status_code == 201, created.text
        body = created.json()
        assert body["key"].startswith("fvai_") and "hash" not in body and "previous_hash" not in body
        listed = api.get("/api/ai/keys").json()
        assert [k["id"] for k in listed] == [body["id"]]
        assert all("hash" not in k and "key" not in k for k in listed) and body["key"] not in json.dumps(listed)
        assert api.post("/api/ai/keys", json={"name": "k2", "endpoint": "nope"}).status_code == 404
        bad = api.post("/api/ai/keys", json={"name": "k2", "endpoint": "chat", "max_concurrent": 0})
        assert bad.status_code == 422 and "max_concurrent" in bad.text
        bad = api.post("/api/ai/keys", json={"name": "k2", "endpoint": "chat", "priority": "urgent"})
        assert bad.status_code == 422 and "priority" in bad.text
        banded = api.post("/api/ai/keys", json={"name": "k3", "endpoint": "chat", "priority": "low",
                                                "fallbacks": ["ext-a"]}).json()
        assert (banded["priority"], banded["fallbacks"]) == ("low", ["ext-a"])
        assert api.delete(f"/api/ai/keys/{banded['id']}").status_code == 200
        shadowed = api.post("/api/ai/keys", json={"name": "k4", "endpoint": "chat", "tokens_per_minute": 100,
                                                  "shadow_limits": ["tokens_per_minute", "FABRIC_TENANT_TPM"]})
        assert shadowed.json()["shadow_limits"] == ["FABRIC_TENANT_TPM", "tokens_per_minute"]
        bad = api.post("/api/ai/keys", json={"name": "k5", "endpoint": "chat", "shadow_limits": ["tpm"]})
        assert bad.status_code == 422 and "shadow_limits" in bad.text
        assert api.delete(f"/api/ai/keys/{shadowed.json()['id']}").status_code == 200
        rotated = api.post(f"/api/ai/keys/{body['id']}/rotate", json={}).json()
        assert rotated["key"] != body["key"] and rotated["rotating"] is True
        assert api.get("/api/ai/audit/verify").json()["ok"] is True
        assert api.delete(f"/api/ai/keys/{body['id']}").status_code == 200
        assert api.get(f"/api/ai/keys/{body['id']}").status_code == 404


def test_fabricctl_key_commands_and_the_key_works_at_the_gateway(stack, tmp_path):
    server, _, gw = stack
    env = {k: v for k, v in os.environ.items() if not k.startswith("FABRIC_")}
    env.update(FABRIC_URL=server.url, FABRIC_CONFIG_DIR=str(tmp_path), FABRIC_TOKEN=login(server))

    def ctl(*args):
        proc = subprocess.run([str(BIN / "fabricctl"), "ai", "key", *args], capture_output=True, text=True,
                              env=env, timeout=60)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    created = json.loads(ctl("create", "cli-key", "--endpoint", "chat", "--request-quota", "2", "--json"))
    c = openai.OpenAI(base_url=gw.openai_base("chat"), api_key=created["key"], max_retries=0)
    assert c.chat.completions.create(model="sim-m", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert "cli-key" in ctl("list")
    rotated = json.loads(ctl("rotate", created["id"], "--overlap-secs", "600", "--json"))
    c2 = openai.OpenAI(base_url=gw.openai_base("chat"), api_key=rotated["key"], max_retries=0)
    assert c2.chat.completions.create(model="sim-m", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    with pytest.raises(openai.RateLimitError):  # quota 2, both secrets share it
        c.chat.completions.create(model="sim-m", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert json.loads(ctl("show", created["id"], "--json"))["requests_used"] == 2
    ctl("delete", created["id"])
    assert "cli-key" not in ctl("list")


def test_missing_or_empty_hmac_secret_file_is_an_error_not_a_fallback(tmp_path):
    empty = tmp_path / "empty"
    empty.write_text("")
    from common.apikeys import HmacSecretError, load_hmac_secret

    with pytest.raises(HmacSecretError):
        load_hmac_secret({"FABRIC_KEY_HMAC_SECRET_FILE": str(empty), "FABRIC_KEY_HMAC_SECRET": "x"})
    with pytest.raises(HmacSecretError):
        load_hmac_secret({"FABRIC_KEY_HMAC_SECRET_FILE": str(tmp_path / "absent")})
    with pytest.raises(HmacSecretError):
        load_hmac_secret({})
    proc = subprocess.run([str(BIN / "fabric-gateway"), "serve", "--state-dir", str(tmp_path), "--insecure",
                           "--listen", "127.0.0.1:1"], capture_output=True, text=True, timeout=60,
                          env={"PATH": os.environ["PATH"], "FABRIC_KEY_HMAC_SECRET_FILE": str(empty)})
    assert proc.returncode == 2 and "empty" in proc.stderr


def test_key_names_unique_per_endpoint_refs_by_name_model_scope_and_usage(stack, tmp_path):
    server, store, gw = stack
    from common.schemas import InferenceDeployment

    store.put(keyspace.deployments("chat-dep"),
              InferenceDeployment(name="chat-dep", model="sim-m", profile="p").model_dump_json())
    env = {k: v for k, v in os.environ.items() if not k.startswith("FABRIC_")}
    env.update(FABRIC_URL=server.url, XDG_CONFIG_HOME=str(tmp_path), FABRIC_TOKEN=login(server))

    def ctl(*args, rc=0):
        proc = subprocess.run([str(BIN / "fabricctl"), "ai", "key", *args], capture_output=True, text=True,
                              env=env, timeout=60)
        assert proc.returncode == rc, proc.stderr
        assert "Traceback" not in proc.stderr
        return proc

    refused = ctl("create", "wrong-model", "--endpoint", "chat", "--model", "gpt-4", rc=1).stderr
    assert "--model: endpoint 'chat' serves chat-dep, sim-m" in refused and "never be used" in refused
    created = json.loads(ctl("create", "named", "--endpoint", "chat", "--model", "sim-m", "-o", "json").stdout)
    assert "already has a key named 'named'" in ctl("create", "named", "--endpoint", "chat", rc=1).stderr

    # No quota: still counted.
    c = openai.OpenAI(base_url=gw.openai_base("chat"), api_key=created["key"], max_retries=0)
    for _ in range(3):
        c.chat.completions.create(model="sim-m", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    shown = json.loads(ctl("show", "named", "-o", "json").stdout)
    assert shown["id"] == created["id"] and shown["requests_used"] == 3 and shown["request_quota"] is None

    rotated = json.loads(ctl("rotate", "named", "--overlap-secs", "0", "-o", "json").stdout)
    assert rotated["id"] == created["id"] and rotated["key"] != created["key"]
    assert f"key {created['id']} deleted" in ctl("delete", "named").stdout
    assert "no key with id or name 'named'" in ctl("show", "named", rc=1).stderr


def test_concurrent_creates_of_one_key_name_admit_exactly_one(stack):
    """The name claim is atomic (an index key created with the record in one create-all): of 12
    simultaneous creates over HTTP exactly one is 201, the rest 409, and nothing of the losers is
    stored; after a delete the index is gone and the name is free again."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    server, store, _ = stack
    token = login(server)
    gate = threading.Barrier(12)

    def create(_):
        with server.client(token) as api:
            gate.wait()
            return api.post("/api/ai/keys", json={"name": "racy", "endpoint": "chat"})

    with ThreadPoolExecutor(12) as pool:
        answers = list(pool.map(create, range(12)))
    codes = sorted(r.status_code for r in answers)
    assert codes == [201] + [409] * 11, [r.text for r in answers]
    assert all(r.json()["error"]["code"] == "already_exists" for r in answers if r.status_code == 409)
    winner = next(r.json() for r in answers if r.status_code == 201)
    named = [kv for kv in store.list(keyspace.api_keys()) if json.loads(kv.value)["name"] == "racy"]
    assert [json.loads(kv.value)["id"] for kv in named] == [winner["id"]]
    assert store.get(keyspace.api_key_names("chat", "racy")).value == winner["id"]
    assert [kv.value for kv in store.list(keyspace.api_key_prefixes())].count(winner["id"]) == 1
    with server.client(token) as api:
        assert api.delete("/api/ai/keys/racy").status_code == 200
        assert store.get(keyspace.api_key_names("chat", "racy")) is None
        again = api.post("/api/ai/keys", json={"name": "racy", "endpoint": "chat"})
        assert again.status_code == 201, again.text
        assert store.get(keyspace.api_key_names("chat", "racy")).value == again.json()["id"]
        assert api.delete(f"/api/ai/keys/{again.json()['id']}").status_code == 200
