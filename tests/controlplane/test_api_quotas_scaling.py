"""Quotas, autoscaling specs, explain scaling/failure and event filters through real HTTP against
a real fabricd (controllers off; see conftest.py), plus fabricd refusing to start on a bad
FABRIC_* setting. Each test uses its own names so the module-scoped server can be shared."""

from __future__ import annotations

import subprocess

from tests.controlplane.conftest import BIN, fabricd_env

MODEL = {"source": "hf://Qwen/Qwen3-8B"}
PROFILE2 = {"runtime": "vllm", "gpu": {"count": 2, "vram_gib": 24}, "cpu": 8, "memory_gib": 32}


def error(resp, status: int) -> dict:
    assert resp.status_code == status, resp.text
    return resp.json()["error"]


def stack(api, tag: str, tenant: str | None, replicas: int):
    assert api.post("/api/ai/models", json={"name": f"m-{tag}", **MODEL}).status_code == 201
    assert api.post("/api/ai/profiles", json={"name": f"p-{tag}", **PROFILE2}).status_code == 201
    return api.post("/api/ai/deployments", json={"name": f"d-{tag}", "model": f"m-{tag}", "profile": f"p-{tag}",
                                                 "replicas": replicas, "tenant": tenant})


def test_quota_limits_create_and_scale_with_a_409_naming_tenant_quota_and_use(api):
    q = api.post("/api/ai/quotas", json={"tenant": "acme", "max_gpus": 6})
    assert q.status_code == 200 and q.json() == {**q.json(), "tenant": "acme", "max_gpus": 6, "used_gpus": 0}
    assert stack(api, "q1", "acme", 2).status_code == 201  # 2 replicas x 2 GPUs = 4 of 6
    over = error(api.post("/api/ai/deployments/d-q1/scale", json={"replicas": 4}), 409)
    assert over["code"] == "quota_exceeded"
    assert over["message"] == ("tenant 'acme' GPU quota is 6 (max_gpus); it uses 4 and this needs 4 more (8 > 6)")
    assert api.get("/api/ai/deployments/d-q1").json()["replicas"] == 2  # nothing half-written
    assert api.post("/api/ai/deployments/d-q1/scale", json={"replicas": 3}).status_code == 200  # exactly 6
    created = error(stack(api, "q2", "acme", 1), 409)  # a second deployment of the tenant counts too
    assert "it uses 6 and this needs 2 more" in created["message"]
    assert api.post("/api/ai/deployments/d-q1/scale", json={"replicas": 1}).status_code == 200  # down: always
    rows = {r["tenant"]: r for r in api.get("/api/ai/quotas").json()}
    assert rows["acme"]["used_gpus"] == 2
    # Other tenants and deployments without a tenant are not limited by acme's quota.
    assert stack(api, "q3", None, 8).status_code == 201
    refused = [e for e in api.get("/api/ai/events", params={"object": "deployment/d-q1"}).json()
               if e["reason"] == "QuotaRefused"]
    assert len(refused) == 1 and refused[0]["type"] == "Warning"


def test_quota_input_is_checked(api):
    assert error(api.post("/api/ai/quotas", json={"tenant": "acme", "max_gpus": -1}), 422)
    assert error(api.post("/api/ai/quotas", json={"tenant": "../x", "max_gpus": 1}), 422)
    assert error(api.post("/api/ai/quotas", json={"tenant": "a", "max_gpus": 1, "extra": 1}), 422)


def test_autoscaling_spec_is_stored_and_explained(api):
    assert stack(api, "as1", None, 1).status_code == 201
    spec = {"min_replicas": 1, "max_replicas": 3, "scale_out_queue": 20, "scale_out_seconds": 30,
            "scale_in_queue": 2, "scale_in_seconds": 60, "scale_to_zero": True}
    resp = api.put("/api/ai/deployments/d-as1/autoscaling", json=spec)
    assert resp.status_code == 200, resp.text
    assert resp.json()["autoscaling"]["scale_to_zero"] is True
    explain = api.get("/api/ai/explain/scaling/d-as1").json()
    assert explain["enabled"] is True and explain["decision"]["action"] == "hold"
    assert explain["decision"]["code"] == "starting"  # no replica is ready (no controllers here)
    assert explain["conditions"]["scale_out_queue"] == {"value": None, "threshold": 20, "holding": False,
                                                       "held_s": 0, "needed_s": 30}
    bad = error(api.put("/api/ai/deployments/d-as1/autoscaling", json={"min_replicas": 5, "max_replicas": 2}), 422)
    assert "min_replicas" in bad["message"]
    assert error(api.put("/api/ai/deployments/nope/autoscaling", json={}), 404)
    assert error(api.get("/api/ai/explain/scaling/nope"), 404)
    events = api.get("/api/ai/events", params={"object": "d-as1", "since": "10m"}).json()
    assert [e["reason"] for e in events] == ["created", "AutoscalingSet"]


def test_explain_failure_and_bad_since(api):
    assert error(api.get("/api/ai/explain/failure/no-such-replica"), 404)
    assert error(api.get("/api/ai/events", params={"since": "yesterday"}), 422)["code"] == "invalid_since"


def test_fabricd_refuses_to_start_on_a_bad_setting(tmp_path):
    """The issue's example plus a second bad value: exit 2, every bad variable named."""
    state = tmp_path / "state"
    subprocess.run([str(BIN / "fabricd"), "init", "--state-dir", str(state)], check=True, capture_output=True,
                   env=fabricd_env(None))
    env = {"FABRIC_ADDRESS_POOL": "fd00::/64", "FABRIC_AUTOSCALE_SECS": "soon"}
    proc = subprocess.run([str(BIN / "fabricd"), "serve", "--state-dir", str(state), "--listen", "127.0.0.1:1",
                           "--insecure"], capture_output=True, text=True, timeout=60, env=fabricd_env(env))
    assert proc.returncode == 2, proc.stderr
    assert "will not start" in proc.stderr
    assert "FABRIC_ADDRESS_POOL='fd00::/64'" in proc.stderr and "FABRIC_AUTOSCALE_SECS='soon'" in proc.stderr


def test_cpu_and_memory_quotas_refuse_growth_and_the_room_left_is_shown(api):
    q = api.post("/api/ai/quotas", json={"tenant": "cpu-t", "max_gpus": 6, "max_cpu": 20, "max_memory_gib": 100,
                                         "guaranteed_gpus": 2})
    assert q.status_code == 200, q.text
    assert stack(api, "c1", "cpu-t", 2).status_code == 201  # 4 GPUs, 16 cores, 64 GiB
    over = error(api.post("/api/ai/deployments/d-c1/scale", json={"replicas": 3}), 409)
    # GPUs (6 of 6) and memory (96 of 100) would fit: only the cores are named.
    assert over == {**over, "code": "quota_exceeded",
                    "message": "tenant 'cpu-t' CPU quota is 20 (max_cpu); it uses 16 and this needs 8 more (24 > 20)"}
    row = {r["tenant"]: r for r in api.get("/api/ai/quotas").json()}["cpu-t"]
    assert (row["used_gpus"], row["used_cpu"], row["used_memory_gib"]) == (4, 16, 64)
    assert row["room"] == {"gpus": 2, "cpu": 4, "memory_gib": 36} and row["guaranteed_gpus"] == 2
    fit = api.get("/api/ai/capacity/fit", params={"profile": "p-c1", "tenant": "cpu-t"}).json()
    assert fit["tenant"] == {"tenant": "cpu-t", "quota": True, "room": {"gpus": 2, "cpu": 4, "memory_gib": 36},
                             "replicas": 0, "fits_for_tenant": 0}
    free = api.get("/api/ai/capacity/fit", params={"profile": "p-c1", "tenant": "nobody"}).json()["tenant"]
    assert (free["quota"], free["replicas"], free["fits_for_tenant"]) == (False, None, free["fits_for_tenant"])
    # POST replaces the whole quota: a limit not given is unset.
    assert api.post("/api/ai/quotas", json={"tenant": "cpu-t", "max_cpu": 24}).json()["max_gpus"] is None


def test_a_guarantee_above_the_gpu_limit_is_refused(api):
    bad = error(api.post("/api/ai/quotas", json={"tenant": "g-t", "max_gpus": 1, "guaranteed_gpus": 2}), 422)
    assert "guaranteed_gpus 2 is above max_gpus 1" in bad["message"]
    assert error(api.post("/api/ai/quotas", json={"tenant": "g-t", "max_cpu": -1}), 422)
    assert error(api.get("/api/ai/capacity/fit", params={"profile": "p-c1", "tenant": "Bad Name"}), 422)
