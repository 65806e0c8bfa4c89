"""The resource API through real HTTP against a real fabricd process (see conftest.py).

Each test uses its own names so the module-scoped server can be shared.
"""

from __future__ import annotations

import pytest

MODEL = {"source": "hf://Qwen/Qwen3-8B"}
PROFILE = {"runtime": "vllm", "gpu": {"count": 1, "vram_gib": 24}, "cpu": 8, "memory_gib": 32}


def error(resp, status: int) -> dict:
    assert resp.status_code == status, resp.text
    body = resp.json()
    # A validation refusal also lists its fields (for fabricctl to name its flags).
    assert set(body) == {"error"} and set(body["error"]) - {"fields"} == {"code", "message"}, body
    return body["error"]


def make_stack(api, tag: str, replicas: int = 1) -> None:
    assert api.post("/api/ai/models", json={"name": f"m-{tag}", **MODEL}).status_code == 201
    assert api.post("/api/ai/profiles", json={"name": f"p-{tag}", **PROFILE}).status_code == 201
    resp = api.post("/api/ai/deployments",
                    json={"name": f"d-{tag}", "model": f"m-{tag}", "profile": f"p-{tag}", "replicas": replicas})
    assert resp.status_code == 201, resp.text


def test_model_lifecycle_create_get_list_delete(api):
    created = api.post("/api/ai/models", json={"name": "life", **MODEL, "status": {"phase": "Ready"}})
    assert created.status_code == 201
    assert created.json()["status"]["phase"] == "Registered"  # status is the server's, not the caller's
    assert api.get("/api/ai/models/life").json()["source"] == MODEL["source"]
    assert "life" in [m["name"] for m in api.get("/api/ai/models").json()]
    assert api.delete("/api/ai/models/life").json() == {"kind": "model", "name": "life", "deleted": True}
    assert error(api.get("/api/ai/models/life"), 404)["code"] == "not_found"


def test_duplicate_create_is_409(api):
    assert api.post("/api/ai/models", json={"name": "dup", **MODEL}).status_code == 201
    err = error(api.post("/api/ai/models", json={"name": "dup", **MODEL}), 409)
    assert "dup" in err["message"] and "already exists" in err["message"]


@pytest.mark.parametrize("path", ["models", "profiles", "deployments", "endpoints"])
def test_unknown_name_is_404(api, path):
    assert "nope" in error(api.get(f"/api/ai/{path}/nope"), 404)["message"]
    error(api.delete(f"/api/ai/{path}/nope"), 404)


@pytest.mark.parametrize(
    "path, body, field, words",
    [
        ("models", {"name": "Bad_Name", **MODEL}, "body.name", "DNS label"),
        ("models", {"name": "src", "source": "s3://bucket/x"}, "body.source", "hf://ORG/NAME"),
        ("profiles", {**PROFILE, "name": "g9", "gpu": {"count": 9, "vram_gib": 24}}, "body.gpu.count",
         "less than or equal to 8"),
        ("profiles", {**PROFILE, "name": "negv", "gpu": {"count": 1, "vram_gib": -4}}, "body.gpu.vram_gib",
         "greater than 0"),
        ("profiles", {**PROFILE, "name": "rt", "runtime": "pytorch"}, "body.runtime", "unknown"),
        ("profiles", {**PROFILE, "name": "denied", "runtime": "tei"}, "body.runtime", "FABRIC_DENY_RUNTIMES"),
        ("profiles", {**PROFILE, "name": "trit", "runtime": "triton"}, "body.runtime",
         "runtime triton cannot serve an OpenAI endpoint: tritonserver serves the KServe v2 API"),
        ("profiles", {**PROFILE, "name": "nocpu", "cpu": 0}, "body.cpu", "greater than 0"),
        ("profiles", {"name": "missing"}, "body.gpu", "Field required"),
        ("endpoints", {"name": "rs", "deployment": "x", "routing": "fastest"}, "body.routing", "fastest"),
        ("endpoints", {"name": "fw", "deployment": "x", "forwarding": "dsr"}, "body.forwarding", "'dsr-ipip'"),
        ("endpoints", {"name": "fw", "deployment": "x", "forwarding": "dsr-ipip", "port": 80}, "body.forwarding",
         "port 80 needs forwarding nat"),
    ],
)
def test_invalid_body_is_422_naming_the_field(api, path, body, field, words):
    err = error(api.post(f"/api/ai/{path}", json=body), 422)
    assert err["code"] == "invalid"
    assert f"{field}:" in err["message"] and words in err["message"], err["message"]


def test_gpu_count_message_matches_the_documented_form(api):
    err = error(api.post("/api/ai/profiles", json={**PROFILE, "name": "g9b", "gpu": {"count": 9, "vram_gib": 8}}), 422)
    assert err["message"] == "body.gpu.count: Input should be less than or equal to 8"


def test_validation_refusal_lists_fields_with_limits_and_no_input(api):
    err = error(api.post("/api/ai/profiles", json={**PROFILE, "name": "g9c", "gpu": {"count": 9, "vram_gib": 8}}), 422)
    assert err["fields"] == [{"field": "gpu.count", "message": "Input should be less than or equal to 8",
                              "type": "less_than_equal", "ctx": {"le": 8}}]


@pytest.mark.parametrize("raw", [b"{not json", b'{"name": "x",', b"\xff\xfe"])
def test_malformed_json_is_400_not_422(api, raw):
    resp = api.post("/api/ai/models", content=raw, headers={"content-type": "application/json"})
    err = error(resp, 400)
    assert err["code"] == "bad_request" and "not valid JSON" in err["message"]


def test_deployment_with_missing_model_or_profile_is_422_naming_it(api):
    assert api.post("/api/ai/profiles", json={"name": "p-only", **PROFILE}).status_code == 201
    err = error(api.post("/api/ai/deployments", json={"name": "orphan", "model": "ghost", "profile": "p-only"}), 422)
    assert "model 'ghost' does not exist" in err["message"] and "profile" not in err["message"]
    err = error(api.post("/api/ai/deployments", json={"name": "orphan", "model": "ghost", "profile": "nope"}), 422)
    assert "'ghost'" in err["message"] and "'nope'" in err["message"]


def test_endpoint_for_missing_deployment_is_422(api):
    err = error(api.post("/api/ai/endpoints", json={"name": "lost", "deployment": "never"}), 422)
    assert "deployment 'never' does not exist" in err["message"]


def test_external_endpoints_spillover_and_fallbacks_are_checked(api):
    ext = {"name": "ext-prov", "deployment": "unused", "external": {
        "url": "https://provider.example/v1", "model": "big-model", "keys": [{"file": "/etc/fabric/k1", "weight": 3}]}}
    assert api.post("/api/ai/endpoints", json=ext).status_code == 201  # no deployment behind it
    bad_url = {**ext, "name": "ext-bad", "external": {**ext["external"], "url": "https://user:pw@h/v1"}}
    assert "without credentials" in error(api.post("/api/ai/endpoints", json=bad_url), 422)["message"]
    make_stack(api, "spill")
    lost = {"name": "sp-1", "deployment": "d-spill", "spillover": ["ghost"]}
    assert "'ghost' does not exist" in error(api.post("/api/ai/endpoints", json=lost), 422)["message"]
    inside = {"name": "sp-2", "deployment": "d-spill", "fallbacks": ["sp-1x"]}
    assert "not an external endpoint" in error(api.post("/api/ai/endpoints", json=inside), 422)["message"]
    ok = {"name": "sp-3", "deployment": "d-spill", "fallbacks": ["ext-prov"]}
    assert api.post("/api/ai/endpoints", json=ok).status_code == 201


def test_endpoint_forwarding_is_kept_shown_by_explain_and_a_refusal_writes_nothing(api):
    make_stack(api, "fw")
    bad = {"name": "d-fw-80", "deployment": "d-fw", "forwarding": "dsr-ipip", "port": 80}
    assert "port 80" in error(api.post("/api/ai/endpoints", json=bad), 422)["message"]
    assert api.get("/api/ai/endpoints/d-fw-80").status_code == 404
    ext = {"name": "ext-dsr", "deployment": "d-fw", "forwarding": "dsr-ipip", "external": {
        "url": "https://provider.example/v1", "model": "m", "keys": [{"file": "/etc/fabric/k1"}]}}
    assert "external endpoint has none" in error(api.post("/api/ai/endpoints", json=ext), 422)["message"]
    resp = api.post("/api/ai/endpoints", json={"name": "d-fw-dsr", "deployment": "d-fw", "forwarding": "dsr-ipip"})
    assert resp.status_code == 201 and resp.json()["forwarding"] == "dsr-ipip"
    assert api.get("/api/ai/explain/routing/d-fw-dsr").json()["forwarding"] == "dsr-ipip"
    assert api.post("/api/ai/endpoints", json={"name": "d-fw-nat", "deployment": "d-fw"}).json()["forwarding"] == "nat"


def test_deleting_a_model_or_profile_in_use_is_409_naming_the_deployment(api):
    make_stack(api, "inuse")
    err = error(api.delete("/api/ai/models/m-inuse"), 409)
    assert "d-inuse" in err["message"] and err["code"] == "in_use"
    assert "d-inuse" in error(api.delete("/api/ai/profiles/p-inuse"), 409)["message"]
    assert api.get("/api/ai/models/m-inuse").status_code == 200  # still there
    assert api.delete("/api/ai/deployments/d-inuse").status_code == 200
    assert api.delete("/api/ai/models/m-inuse").status_code == 200
    assert api.delete("/api/ai/profiles/p-inuse").status_code == 200


def test_scale_updates_replicas_and_records_an_event(api):
    make_stack(api, "scale")
    dep = api.get("/api/ai/deployments/d-scale").json()
    assert dep["status"]["phase"] == "Pending" and dep["revision"] == 1
    resp = api.post("/api/ai/deployments/d-scale/scale", json={"replicas": 3})
    assert resp.status_code == 200 and resp.json()["replicas"] == 3
    assert api.get("/api/ai/deployments/d-scale").json()["replicas"] == 3
    assert "replicas" in error(api.post("/api/ai/deployments/d-scale/scale", json={"replicas": -1}), 422)["message"]
    error(api.post("/api/ai/deployments/ghost/scale", json={"replicas": 1}), 404)
    events = api.get("/api/ai/events", params={"kind": "deployment", "name": "d-scale"}).json()
    assert [e["action"] for e in events] == ["created", "scaled"]
    assert "from 1 to 3" in events[-1]["message"]


def test_endpoint_is_pending_and_blocks_deployment_delete(api):
    make_stack(api, "ep")
    resp = api.post("/api/ai/endpoints", json={"name": "d-ep-openai", "deployment": "d-ep", "routing": "least_queue"})
    assert resp.status_code == 201
    ep = api.get("/api/ai/endpoints/d-ep-openai").json()
    assert ep["status"]["phase"] == "Pending" and ep["status"]["vip"] is None and ep["routing"] == "least_queue"
    assert "d-ep-openai" in error(api.delete("/api/ai/deployments/d-ep"), 409)["message"]
    assert api.delete("/api/ai/endpoints/d-ep-openai").status_code == 200
    assert api.delete("/api/ai/deployments/d-ep").status_code == 200
    assert api.get("/api/ai/deployments/d-ep").status_code == 404


def test_every_create_and_delete_is_an_event(api):
    assert api.post("/api/ai/models", json={"name": "evt", **MODEL}).status_code == 201
    assert api.delete("/api/ai/models/evt").status_code == 200
    events = api.get("/api/ai/events", params={"name": "evt"}).json()
    assert [(e["kind"], e["action"]) for e in events] == [("model", "created"), ("model", "deleted")]
    assert events[0]["time"] <= events[1]["time"]


def test_unknown_route_and_openapi(api, fabricd):
    assert error(api.get("/api/ai/nothing-here"), 404)["code"] == "not_found"
    with fabricd.client() as anon:
        spec = anon.get("/openapi.json").json()
    assert "/api/ai/deployments/{name}/scale" in spec["paths"] and "/api/auth/login" in spec["paths"]


def test_metrics_count_requests_by_route_template(api):
    api.get("/api/ai/models/metric-probe")
    text = api.get("/metrics").text
    line = [ln for ln in text.splitlines() if ln.startswith("fabricd_http_requests_total{")
            and 'route="/api/ai/models/{name}"' in ln and 'status="404"' in ln]
    assert line and float(line[0].rsplit(" ", 1)[1]) >= 1
    assert "metric-probe" not in text  # names never become label values
