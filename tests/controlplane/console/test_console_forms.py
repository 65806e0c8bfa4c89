"""The console's forms, detail pages, charts and playground over real HTTPS against the real
fabricd of conftest.py: each form posts to the REST route, an API refusal shows next to the
field it names, and the viewer is refused every write by the console form and by the API."""

from __future__ import annotations

import json

import pytest

from lab.rigs.polling import wait_for
from tests.controlplane.console.conftest import CONSOLE, csrf_of, signed_in

WRITES = [  # (console form action, REST call the same write makes)
    ("/models/new", {"name": "v-m", "source": "hf://org/m"}, ("POST", "/api/ai/models")),
    ("/profiles/new", {"name": "v-p", "gpu.vram_gib": "24", "cpu": "1", "memory_gib": "1"}, ("POST", "/api/ai/profiles")),
    ("/deployments/new", {"name": "v-d", "model": "chat", "profile": "h100-1", "replicas": "1"},
     ("POST", "/api/ai/deployments")),
    ("/endpoints/new", {"name": "v-e", "deployment": "chat"}, ("POST", "/api/ai/endpoints")),
    ("/deployments/chat/autoscaling", {"min_replicas": "1", "max_replicas": "2", "enabled": "on"},
     ("PUT", "/api/ai/deployments/chat/autoscaling")),
    ("/deployments/chat/rollouts", {"strategy": "rolling"}, ("POST", "/api/ai/deployments/chat/rollouts")),
    ("/deployments/chat/rollouts/1/pause", {}, ("POST", "/api/ai/deployments/chat/rollouts/1/pause")),
]


def _post(c, path: str, data: dict, page: str | None = None):
    html = c.get(f"{CONSOLE}{page or '/keys'}").text
    return c.post(f"{CONSOLE}{path}", data={**data, "csrf": csrf_of(html)})


@pytest.mark.parametrize("path,data,rest", WRITES, ids=[w[0] for w in WRITES])
def test_viewer_is_refused_each_write_by_form_and_api(cluster, path, data, rest):
    with signed_in(cluster, "viewer") as c:
        r = _post(c, path, data, page="/deployments/chat")
        assert r.status_code == 403, r.text[:300]
        assert "read_only" in r.text or "read-only" in r.text
    viewer = cluster.server.client()
    token = viewer.post("/api/auth/login", json={"username": "viewer", "password": cluster.viewer_password}).json()
    with cluster.server.client(token["token"]) as api:
        body = {k: v for k, v in data.items()}
        assert api.request(rest[0], rest[1], json=body).status_code == 403
    viewer.close()
    with cluster.api() as api:  # nothing was written
        for kind, name in (("models", "v-m"), ("profiles", "v-p"), ("deployments", "v-d"), ("endpoints", "v-e")):
            assert api.get(f"/api/ai/{kind}/{name}").status_code == 404


def test_a_write_without_csrf_is_refused(cluster):
    with signed_in(cluster) as c:
        r = c.post(f"{CONSOLE}/profiles/new", data={"name": "no-csrf", "gpu.vram_gib": "24", "cpu": "1",
                                                     "memory_gib": "1"})
        assert r.status_code == 403 and "csrf" in r.text
    with cluster.api() as api:
        assert api.get("/api/ai/profiles/no-csrf").status_code == 404


def test_the_apis_validation_message_sits_next_to_its_field(cluster):
    with signed_in(cluster) as c:
        r = _post(c, "/profiles/new", {"name": "bad-p", "gpu.vram_gib": "24", "cpu": "0", "memory_gib": "1"})
        assert r.status_code == 422
        assert 'data-testid="error-cpu"' in r.text and "greater than 0" in r.text
        r = _post(c, "/profiles/new", {"name": "bad-p", "gpu.vram_gib": "lots", "cpu": "1", "memory_gib": "1"})
        assert r.status_code == 422 and 'data-testid="error-gpu.vram_gib"' in r.text
        r = _post(c, "/models/new", {"name": "bad-m", "source": "ftp://nope"})
        assert r.status_code == 422 and 'data-testid="error-source"' in r.text


def test_model_dry_run_writes_nothing_and_lists_the_checks(cluster):
    with signed_in(cluster) as c:
        r = _post(c, "/models/new", {"name": "dry-m", "source": "hf://org/m", "revision": "abc123",
                                     "license": "apache-2.0", "adapters": "sql=hf://org/sql", "dry_run": "1"})
        assert r.status_code == 200, r.text[:500]
        assert 'data-testid="dry-run-ok"' in r.text and "hf://org/m@abc123" in r.text
        assert "recorded: apache-2.0" in r.text and "adapter sql" in r.text
    with cluster.api() as api:
        assert api.get("/api/ai/models/dry-m").status_code == 404


def test_an_operators_model_dry_run_is_allowed_and_checks_what_a_create_checks(cluster):
    with cluster.api() as api:
        r = api.post("/api/ai/users", json={"name": "ops-dry", "role": "operator", "password": "ops-dry-password-1"})
        assert r.status_code == 201, r.text
    with signed_in(cluster, "ops-dry", "ops-dry-password-1") as c:
        r = _post(c, "/models/new", {"name": "ops-dry-m", "source": "hf://org/m", "dry_run": "1"})
        assert r.status_code == 200 and 'data-testid="dry-run-ok"' in r.text, r.text[:500]
        # The dry run is the create's own check: a taken name is the create's 409, shown on the form.
        r = _post(c, "/models/new", {"name": "chat", "source": "hf://org/m", "dry_run": "1"})
        assert r.status_code == 409 and "already exists" in r.text
    with cluster.api() as api:
        assert api.get("/api/ai/models/ops-dry-m").status_code == 404


def test_the_profile_forms_runtimes_are_exactly_those_the_api_accepts(cluster):
    import re

    from common.runtimes import RUNTIME_NAMES

    with signed_in(cluster) as c:
        html = c.get(f"{CONSOLE}/profiles/new").text
    select = html[html.index('name="runtime"'):]
    offered = re.findall(r"<option(?: selected)?>([^<]+)</option>", select[:select.index("</select>")])
    with cluster.api() as api:
        accepted = [r for r in RUNTIME_NAMES
                    if api.post("/api/ai/profiles", json={"name": f"rt-{r.replace('.', '').replace('_', '-')}",
                                                          "runtime": r, "gpu": {"count": 1, "vram_gib": 24},
                                                          "cpu": 1, "memory_gib": 1}).status_code == 201]
    assert offered == accepted and "sglang" not in offered and "tensorrt-llm" in offered


def test_add_profile_deploy_expose_autoscale_and_roll_out_through_forms(cluster):
    with signed_in(cluster) as c:
        r = _post(c, "/models/new", {"name": "form-m", "source": "hf://org/form", "license": "mit"})
        assert r.status_code == 303
        r = _post(c, "/profiles/new", {"name": "form-p", "runtime": "vllm", "gpu.count": "1", "gpu.vram_gib": "24",
                                       "cpu": "1", "memory_gib": "1"})
        assert r.status_code == 303
        r = _post(c, "/deployments/new", {"name": "form-d", "model": "form-m", "profile": "form-p", "replicas": "0"})
        assert r.status_code == 303 and r.headers["location"].startswith(f"{CONSOLE}/deployments/form-d")
        r = _post(c, "/endpoints/new", {"name": "form-e", "deployment": "form-d", "routing": "least_queue"})
        assert r.status_code == 303
        r = _post(c, "/deployments/form-d/autoscaling", {"min_replicas": "3", "max_replicas": "2", "enabled": "on"},
                  page="/deployments/form-d")
        assert r.status_code == 422 and "above max_replicas" in r.text
        r = _post(c, "/deployments/form-d/autoscaling", {"min_replicas": "0", "max_replicas": "2", "enabled": "on",
                                                         "scale_out_queue": "5", "scale_in_queue": "1"},
                  page="/deployments/form-d")
        assert r.status_code == 303
        r = _post(c, "/deployments/form-d/rollouts", {"model": "chat", "strategy": "rolling", "reason": "form"},
                  page="/deployments/form-d")
        assert r.status_code == 303, r.text[:500]
        page = c.get(f"{CONSOLE}/deployments/form-d")
        assert page.status_code == 200
        for needle in ('data-testid="chart-form-d-replicas"', 'data-testid="placement"', "Start rollout",
                       "AutoscalingSet", "rollout 1"):
            assert needle in page.text, needle
    with cluster.api() as api:
        assert api.get("/api/ai/models/form-m").json()["license"] == "mit"
        assert api.get("/api/ai/deployments/form-d").json()["autoscaling"]["max_replicas"] == 2
        assert api.get("/api/ai/endpoints/form-e").json()["routing"] == "least_queue"
        assert api.get("/api/ai/deployments/form-d/rollouts").json()[-1]["to_revision"] == 2
        api.delete("/api/ai/endpoints/form-e")


def test_endpoint_page_charts_the_weight_history(cluster):
    with signed_in(cluster) as c:
        def charted():
            r = c.get(f"{CONSOLE}/endpoints/chat-openai/charts")
            return r.status_code == 200 and 'data-series="chat-' in r.text and r.text
        html = wait_for(charted, 30, "a weight point per replica", interval=0.2)
        assert 'data-testid="chart-chat-openai-weight"' in html and "fabricd history" in html
        page = c.get(f"{CONSOLE}/endpoints/chat-openai")
        assert page.status_code == 200 and "/endpoints/chat-openai/try" in page.text
        nodes = c.get(f"{CONSOLE}/nodes")
        assert 'data-testid="chart-node-gpu-node-1"' in nodes.text


def test_playground_page_and_its_answer_without_a_gateway(cluster):
    with signed_in(cluster) as c:
        page = c.get(f"{CONSOLE}/endpoints/chat-openai/try")
        assert page.status_code == 200
        assert "$FABRIC_API_KEY" in page.text and "fvai_" not in page.text
        token = csrf_of(page.text) if 'name="csrf"' in page.text else None
        csrf = page.text.split('data-csrf="')[1].split('"')[0]
        assert token is None or token == csrf
        r = c.post(f"{CONSOLE}/endpoints/chat-openai/try/chat", content=json.dumps({"prompt": "hi"}))
        assert r.status_code == 403  # no CSRF header
        r = c.post(f"{CONSOLE}/endpoints/chat-openai/try/chat", content=json.dumps({"prompt": "hi"}),
                   headers={"x-csrf-token": csrf})
        assert r.status_code == 200 and "event: error" in r.text and "no_gateway" in r.text


def test_the_viewer_playground_follows_the_endpoints_key_policy(cluster):
    with signed_in(cluster, "viewer") as c:
        page = c.get(f"{CONSOLE}/endpoints/chat-openai/try")
        assert page.status_code == 200
        assert 'id="send" disabled' in page.text and "--viewer-playground" in page.text
    with cluster.api() as api:
        assert api.put("/api/ai/key-policies/chat-openai", json={"viewer_playground": True}).status_code == 200
        try:
            with signed_in(cluster, "viewer") as c:
                page = c.get(f"{CONSOLE}/endpoints/chat-openai/try")
                assert 'id="send">' in page.text and "Viewers may use this playground" in page.text
        finally:
            api.put("/api/ai/key-policies/chat-openai", json={})
