"""The console over real HTTPS against a real fabricd (dry-run replicas, controllers running)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from lab.rigs.polling import wait_for
from tests.controlplane.console.conftest import CONSOLE, WAIT_S, csrf_of, signed_in

PAGES = {
    "": ["GPUs", "chat", "free of 2"],
    "/models": ["hf://Qwen/Qwen3-8B"],
    "/profiles": ["h100-1", "24"],
    "/deployments": ["chat-auto", "rev 1", "1–2 replicas", 'data-testid="scaling-now-chat-auto"'],
    "/endpoints": ["chat-openai", "/api/ai/openai/chat-openai", "hx-get"],
    "/keys": ["Create a key"],
    "/nodes": ["gpu-node-1", "0000:3b:01.0", "42.0 °C", "NVIDIA H100", "1g.10gb", "MIG slices"],
    "/events": ["deployment/chat", "created"],
}


ROOT = Path(__file__).resolve().parents[3]


def test_the_served_htmx_is_npms_at_the_locked_version(cluster):
    """/app/ai/static/htmx.min.js is the file npm ci installed (it checked the tarball against
    package-lock.json's integrity hash), at the lock's version: nothing third-party is committed."""
    locked = json.loads((ROOT / "package-lock.json").read_text())["packages"]["node_modules/htmx.org"]
    installed = ROOT / "node_modules" / "htmx.org"
    assert json.loads((installed / "package.json").read_text())["version"] == locked["version"]
    with cluster.server.client() as c:
        r = c.get(f"{CONSOLE}/static/htmx.min.js")
        assert r.status_code == 200
        assert r.content == (installed / "dist" / "htmx.min.js").read_bytes()


def test_pages_need_a_session(cluster):
    with cluster.server.client() as c:
        r = c.get(CONSOLE, follow_redirects=False)
        assert r.status_code == 303 and r.headers["location"] == f"{CONSOLE}/login"
        c.cookies.set("fabric_session", "not-a-token", domain="127.0.0.1", path=CONSOLE)
        assert c.get(CONSOLE, follow_redirects=False).status_code == 303


def test_sign_in_sets_a_strict_http_only_secure_cookie(cluster):
    with cluster.server.client() as c:
        form = c.get(f"{CONSOLE}/login")
        r = c.post(f"{CONSOLE}/login", data={"username": "admin", "password": cluster.server.password,
                                             "csrf": csrf_of(form.text)})
        assert r.status_code == 303
        cookie = next(h for h in r.headers.get_list("set-cookie") if h.startswith("fabric_session="))
        attrs = {a.strip().lower() for a in cookie.split(";")}
        assert {"httponly", "secure", "samesite=strict", "path=/app/ai"} <= attrs


def test_wrong_password_and_login_without_csrf_are_refused(cluster):
    with cluster.server.client() as c:
        form = c.get(f"{CONSOLE}/login")
        bad = c.post(f"{CONSOLE}/login", data={"username": "admin", "password": "wrong", "csrf": csrf_of(form.text)})
        assert bad.status_code == 401 and "wrong username or password" in bad.text
        assert "fabric_session" not in bad.headers.get("set-cookie", "")
    with cluster.server.client() as c:  # no login-CSRF cookie: a cross-site sign-in attempt
        r = c.post(f"{CONSOLE}/login", data={"username": "admin", "password": cluster.server.password, "csrf": "x"})
        assert r.status_code == 403


@pytest.mark.parametrize("path", sorted(PAGES))
def test_every_page_renders_real_data(cluster, path):
    with signed_in(cluster) as c:
        r = c.get(f"{CONSOLE}{path}")
        assert r.status_code == 200, r.text[:500]
        for needle in PAGES[path]:
            assert needle in r.text, f"{needle!r} missing from {path or '/'}"
        assert "default-src 'self'" in r.headers["content-security-policy"]


def test_weights_fragment_draws_one_bar_per_replica_with_its_reason(cluster):
    with signed_in(cluster) as c, cluster.api() as api:
        routing = api.get("/api/ai/explain/routing/chat-openai").json()
        r = c.get(f"{CONSOLE}/endpoints/chat-openai/weights")
        assert r.status_code == 200
        drawn = dict(re.findall(r'data-replica="([^"]+)" data-weight="([^"]+)"', r.text))
        live = [e for e in routing["replicas"] if e["replica_id"] in drawn]
        assert len(drawn) == len(routing["replicas"]) == 3
        assert all(drawn[e["replica_id"]] == str(e["weight"]) for e in live)
        assert routing["replicas"][0]["reason"] in r.text


def test_writes_without_the_csrf_token_are_refused(cluster):
    with signed_in(cluster) as c, cluster.api() as api:
        before = api.get("/api/ai/deployments/chat").json()["replicas"]
        r = c.post(f"{CONSOLE}/deployments/chat/scale", data={"replicas": "1"})
        assert r.status_code == 403 and "csrf" in r.text
        r = c.post(f"{CONSOLE}/deployments/chat/scale", data={"replicas": "1", "csrf": "0" * 64})
        assert r.status_code == 403
        r = c.post(f"{CONSOLE}/keys", data={"name": "sneaky", "endpoint": "chat-openai"})
        assert r.status_code == 403
        assert api.get("/api/ai/deployments/chat").json()["replicas"] == before
        assert all(k["name"] != "sneaky" for k in api.get("/api/ai/keys").json())


def test_key_secret_is_shown_once_then_rotate_and_revoke(cluster):
    with signed_in(cluster) as c, cluster.api() as api:
        page = c.get(f"{CONSOLE}/keys")
        r = c.post(f"{CONSOLE}/keys", data={"name": "http-key", "endpoint": "chat-openai", "ttl_secs": "0",
                                            "csrf": csrf_of(page.text)})
        assert r.status_code == 200, r.text[:500]
        secret = re.search(r'data-testid="secret-value"|id="secret-value" readonly value="([^"]+)"', r.text).group(1)
        assert secret and len(secret) > 20
        again = c.get(f"{CONSOLE}/keys")
        assert "http-key" in again.text and secret not in again.text
        key = next(k for k in api.get("/api/ai/keys").json() if k["name"] == "http-key")
        rotated = c.post(f"{CONSOLE}/keys/{key['id']}/rotate", data={"csrf": csrf_of(again.text)})
        new_secret = re.search(r'id="secret-value" readonly value="([^"]+)"', rotated.text).group(1)
        assert new_secret != secret
        gone = c.post(f"{CONSOLE}/keys/{key['id']}/revoke", data={"csrf": csrf_of(again.text)}, follow_redirects=True)
        assert gone.status_code == 200
        assert all(k["id"] != key["id"] for k in api.get("/api/ai/keys").json())


def test_api_refusals_reach_the_operator(cluster):
    with signed_in(cluster) as c:
        csrf = csrf_of(c.get(f"{CONSOLE}/keys").text)
        r = c.post(f"{CONSOLE}/keys", data={"name": "k", "endpoint": "no-such-endpoint", "csrf": csrf})
        assert r.status_code == 404 and "no-such-endpoint" in r.text
        r = c.post(f"{CONSOLE}/deployments/chat/scale", data={"replicas": "65", "csrf": csrf})
        assert r.status_code == 422 and "replicas" in r.text


def test_scale_changes_the_replica_count(cluster):
    with signed_in(cluster) as c, cluster.api() as api:
        csrf = csrf_of(c.get(f"{CONSOLE}/deployments").text)
        r = c.post(f"{CONSOLE}/deployments/chat/scale", data={"replicas": "2", "csrf": csrf})
        assert r.status_code == 303 and "scaled" in r.headers["location"]
        assert api.get("/api/ai/deployments/chat").json()["replicas"] == 2
        wait_for(lambda: len(api.get("/api/ai/replicas", params={"deployment": "chat"}).json()) == 2,
                 WAIT_S, "2 chat replicas", interval=0.2)
        assert "<strong>2</strong> desired" in c.get(f"{CONSOLE}/deployments").text
        r = c.post(f"{CONSOLE}/deployments/chat/scale", data={"replicas": "3", "csrf": csrf})
        assert r.status_code == 303
        wait_for(lambda: api.get("/api/ai/deployments/chat").json()["status"].get("ready_replicas") == 3,
                 WAIT_S, "3 ready chat replicas", interval=0.2)


def test_viewer_sees_no_write_buttons_and_the_api_refuses_its_writes(cluster):
    with signed_in(cluster, "viewer") as c, cluster.api() as api:
        for path in ("/deployments", "/keys"):
            html = c.get(f"{CONSOLE}{path}").text
            assert "read-only" in html
            assert "Scale chat" not in html and "Create key" not in html and "Revoke" not in html
        # The viewer forges the form anyway, with its own valid CSRF token (from the sign-out form).
        csrf = csrf_of(c.get(f"{CONSOLE}/deployments").text)
        r = c.post(f"{CONSOLE}/deployments/chat/scale", data={"replicas": "1", "csrf": csrf})
        assert r.status_code == 403 and "read_only" in r.text
        assert api.get("/api/ai/deployments/chat").json()["replicas"] == 3
    with cluster.server.client() as raw:
        token = raw.post("/api/auth/login", json={"username": "viewer", "password": cluster.viewer_password}).json()
        raw.headers["Authorization"] = f"Bearer {token['token']}"
        assert raw.get("/api/ai/deployments").status_code == 200
        refused = raw.post("/api/ai/deployments/chat/scale", json={"replicas": 1})
        assert refused.status_code == 403 and refused.json()["error"]["code"] == "read_only"


def test_sign_out_needs_the_token_and_ends_the_session(cluster):
    with signed_in(cluster) as c:
        assert c.post(f"{CONSOLE}/logout", data={}).status_code == 403
        csrf = csrf_of(c.get(CONSOLE).text)
        r = c.post(f"{CONSOLE}/logout", data={"csrf": csrf})
        assert r.status_code == 303
        assert c.get(CONSOLE, follow_redirects=False).status_code == 303


def test_deployment_page_shows_a_rollout_and_its_step(cluster):
    with signed_in(cluster) as c, cluster.api() as api:
        r = api.post("/api/ai/deployments/chat-auto/revisions", json={"engine_args": ["--max-num-seqs", "8"],
                                                                      "reason": "console test"})
        assert r.status_code == 201, r.text
        r = api.post("/api/ai/deployments/chat-auto/rollouts", json={})
        assert r.status_code == 201, r.text
        rollout = r.json()
        html = c.get(f"{CONSOLE}/deployments").text
        line = re.search(rf'data-testid="rollout-chat-auto-{rollout["id"]}">([^<]+)<', html)
        assert line, html[-3000:]
        assert f"rev {rollout['from_revision']} → {rollout['to_revision']}" in line.group(1)
        shown = line.group(1)  # console.views.rollout_state: a step only while a canary runs
        assert any(w in shown for w in ("Progressing", "Paused", "Succeeded: rev")), shown
        assert "Succeeded, step" not in shown


def test_names_from_the_store_are_escaped(cluster):
    evil = '<img src=x onerror="alert(1)">'
    with signed_in(cluster) as c, cluster.api() as api:
        r = api.post("/api/ai/keys", json={"name": evil, "endpoint": "chat-openai"})
        assert r.status_code == 201, r.text
        html = c.get(f"{CONSOLE}/keys").text
        assert evil not in html and "&lt;img src=x onerror=" in html
        assert api.delete(f"/api/ai/keys/{r.json()['id']}").status_code == 200


def test_a_path_name_cannot_smuggle_a_query_into_the_api_call(cluster):
    with signed_in(cluster) as c:
        r = c.get(f"{CONSOLE}/endpoints/chat-openai%3Fx=1/weights")
        assert r.status_code == 404 and "chat-openai?x=1" in r.text  # the whole name, not a query


def test_an_unknown_console_address_is_an_html_404_page(cluster):
    with signed_in(cluster) as c:
        r = c.get(f"{CONSOLE}/deployment/chat")  # a typo of /deployments
        assert r.status_code == 404 and r.headers["content-type"].startswith("text/html")
        assert "there is no console page /app/ai/deployment/chat" in r.text and "<h1>Not found</h1>" in r.text
        assert 'href="/app/ai/deployments"' in r.text  # the navigation is there to go on from
    with cluster.server.client() as anonymous:  # signed out: still HTML, no JSON
        r = anonymous.get(f"{CONSOLE}/nope")
        assert r.status_code == 404 and r.headers["content-type"].startswith("text/html")
        assert anonymous.get("/api/ai/nope").headers["content-type"].startswith("application/json")
