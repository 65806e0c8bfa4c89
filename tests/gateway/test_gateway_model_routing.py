"""One base URL: the official openai client pointed at <gateway>/v1 reaches each model's endpoint
by the body's model, sees exactly its own models, and never learns of another tenant's; aliases
made through fabricd's API and `fabricctl ai alias` route a stable name; the per-endpoint path
still works. Real fabricd, gateway and two fabric-engine-sim processes on loopback."""

from __future__ import annotations

import json
import os
import subprocess
import time

import httpx
import openai
import pytest

from common import keyspace
from common.store.connect import open_store
from enginesim.process import EngineProcess
from tests.controlplane.conftest import BIN, login, start_fabricd
from tests.gateway.gateway_harness import HMAC_SECRET, GatewayProcess, make_key, publish_endpoint

MSG = [{"role": "user", "content": "hi"}]


def _deployment(store, name: str, model: str) -> None:
    store.put(keyspace.deployments(name), json.dumps({"name": name, "model": model, "profile": "p"}))


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("models")
    with start_fabricd(tmp, env={"FABRIC_KEY_HMAC_SECRET": HMAC_SECRET}) as server:
        url = f"sqlite://{server.state_dir}/fabric.db"
        store = open_store(url)
        argv = ["--tokens-per-s", "0", "--prefill-tokens-per-s", "0"]
        with EngineProcess.start(["--model", "sim-a", *argv]) as ea, EngineProcess.start(["--model", "sim-b", *argv]) as eb:
            _deployment(store, "a-dep", "sim-a")
            store.put(keyspace.models("sim-a"), json.dumps({"name": "sim-a", "source": "file:///m",
                                                            "description": "support chat"}))
            _deployment(store, "b-dep", "sim-b")
            publish_endpoint(store, "ep-a", [ea], deployment="a-dep")
            publish_endpoint(store, "ep-b", [eb], deployment="b-dep")
            gw = GatewayProcess.start(server.state_dir, url, {"FABRIC_GATEWAY_CACHE_SECS": "0.2"})
            try:
                yield server, store, gw
            finally:
                gw.stop()
                store.close()


def _client(gw, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.url + "/v1", api_key=key, max_retries=0)


def test_root_routes_by_model_and_lists_only_the_callers_models(stack):
    _, store, gw = stack
    _, key_a = make_key(store, "ep-a", name="root-a")
    _, key_b = make_key(store, "ep-b", name="root-b")
    a, b = _client(gw, key_a), _client(gw, key_b)
    assert a.chat.completions.create(model="sim-a", messages=MSG, max_tokens=2).model == "sim-a"
    assert b.chat.completions.create(model="sim-b", messages=MSG, max_tokens=2).model == "sim-b"
    assert [(m.id, getattr(m, "description", None)) for m in a.models.list()] == [("sim-a", "support chat")]
    assert [m.id for m in b.models.list()] == ["sim-b"]
    # Another tenant's model and a model that exists nowhere: the same 404, naming nothing else.
    errors = []
    for model in ("sim-b", "no-such-model"):
        with pytest.raises(openai.NotFoundError) as exc:
            a.chat.completions.create(model=model, messages=MSG, max_tokens=2)
        errors.append(exc.value.body)
    assert all(e["code"] == "model_not_found" for e in errors), errors
    assert "ep-b" not in json.dumps(errors) and "b-dep" not in json.dumps(errors)
    # The per-endpoint path keeps working with the same key.
    per = openai.OpenAI(base_url=gw.openai_base("ep-a"), api_key=key_a, max_retries=0)
    assert per.chat.completions.create(model="sim-a", messages=MSG, max_tokens=2).model == "sim-a"


def test_root_checks_the_key_before_the_body_and_reads_bodies_like_the_endpoint_path(stack):
    _, store, gw = stack
    _, key_a = make_key(store, "ep-a", name="root-checks")
    r = httpx.post(gw.url + "/v1/chat/completions", content=b"x" * 100_000, headers={"authorization": "Bearer nope"})
    assert r.status_code == 401 and r.headers.get("connection") == "close"
    hdr = {"authorization": f"Bearer {key_a}"}
    r = httpx.post(gw.url + "/v1/chat/completions", content=b"[" * 200 + b"]" * 200,
                   headers={**hdr, "content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
    r = httpx.post(gw.url + "/v1/chat/completions", json={"messages": MSG}, headers=hdr)
    assert r.status_code == 400 and r.json()["error"]["code"] == "model_required"
    r = httpx.post(gw.url + "/v1/chat/completions", json={"model": "sim-a", "messages": MSG, "max_tokens": 10**9},
                   headers=hdr)
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    r = httpx.post(gw.url + "/v1/%2e%2e/chat/completions", json={"model": "sim-a", "messages": MSG}, headers=hdr)
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_path"


def test_model_scoped_key_sees_and_uses_only_its_model(stack):
    _, store, gw = stack
    store.put(keyspace.model_aliases("a-stable"), json.dumps({"name": "a-stable", "endpoint": "ep-a"}))
    _, scoped = make_key(store, "ep-a", name="scoped", model="sim-a")
    c = _client(gw, scoped)

    time.sleep(0.3)  # past the gateway's catalogue cache
    assert [m.id for m in c.models.list()] == ["a-stable", "sim-a"]
    assert c.chat.completions.create(model="a-stable", messages=MSG, max_tokens=2).model == "sim-a"
    store.delete(keyspace.model_aliases("a-stable"))


def test_fabricd_alias_api_and_cli_route_a_stable_name(stack, tmp_path):
    server, store, gw = stack
    with server.client() as anon:
        assert anon.get("/api/ai/aliases").status_code == 401
    with server.client(login(server)) as api:
        r = api.post("/api/ai/aliases", json={"name": "chat", "endpoint": "nope"})
        assert r.status_code == 404
        r = api.post("/api/ai/aliases", json={"name": "sim-b", "endpoint": "ep-a"})
        assert r.status_code == 409 and r.json()["error"]["code"] == "alias_shadows_model"
        r = api.post("/api/ai/aliases", json={"name": "bad name", "endpoint": "ep-a"})
        assert r.status_code == 422 and "name" in r.json()["error"]["message"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("FABRIC_")}
    env.update(FABRIC_URL=server.url, FABRIC_CONFIG_DIR=str(tmp_path), FABRIC_TOKEN=login(server))

    def ctl(*args):
        proc = subprocess.run([str(BIN / "fabricctl"), "ai", "alias", *args], capture_output=True, text=True,
                              env=env, timeout=60)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    ctl("add", "team/chat", "--endpoint", "ep-b", "--model-name", "sim-b")
    assert "team/chat" in ctl("list") and "ep-b" in ctl("list")
    _, key_b = make_key(store, "ep-b", name="alias-b")
    _, key_a = make_key(store, "ep-a", name="alias-a")

    time.sleep(0.3)
    b = _client(gw, key_b)
    assert b.chat.completions.create(model="team/chat", messages=MSG, max_tokens=2).model == "sim-b"
    assert "team/chat" in [m.id for m in b.models.list()]
    assert "team/chat" not in [m.id for m in _client(gw, key_a).models.list()]
    with pytest.raises(openai.NotFoundError):
        _client(gw, key_a).chat.completions.create(model="team/chat", messages=MSG, max_tokens=2)
    assert json.loads(ctl("delete", "team/chat", "--json"))["deleted"] is True
    time.sleep(0.3)
    with pytest.raises(openai.NotFoundError):
        b.chat.completions.create(model="team/chat", messages=MSG, max_tokens=2)
