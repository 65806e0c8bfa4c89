"""capacity_class through the real fabricd: create, the tenant policy's cap (create and apply),
apply changing the class in place, a bad class refused in the caller's error shape."""

from __future__ import annotations

import httpx

from tests.controlplane.conftest import login, start_fabricd


def doc(name: str, cls: str | None, tenant: str | None = None) -> dict:
    spec = {"model": "m", "profile": "p", "replicas": 0, **({"tenant": tenant} if tenant else {})}
    if cls is not None:
        spec["capacity_class"] = cls
    return {"apiVersion": "fabric/v1", "kind": "InferenceDeployment", "metadata": {"name": name}, "spec": spec}


def test_capacity_class_create_policy_and_apply(tmp_path):
    with start_fabricd(tmp_path) as server:
        api = httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {login(server)}"}, timeout=10)
        assert api.post("/api/ai/models", json={"name": "m", "source": "hf://o/m"}).status_code == 201
        assert api.post("/api/ai/profiles", json={"name": "p", "gpu": {"count": 1, "vram_gib": 24}, "cpu": 1,
                                                  "memory_gib": 1}).status_code == 201
        r = api.post("/api/ai/deployments", json={"name": "d", "model": "m", "profile": "p", "replicas": 0})
        assert r.status_code == 201 and r.json()["capacity_class"] == "standard"
        r = api.post("/api/ai/deployments", json={"name": "e", "model": "m", "profile": "p", "capacity_class": "gold"})
        assert r.status_code == 422 and "capacity_class" in r.text

        # apply changes the class in place and says so.
        r = api.post("/api/ai/apply", json={"documents": [doc("d", "opportunistic")]})
        assert r.status_code == 200, r.text
        assert r.json()["results"][0]["action"] == "updated"
        assert api.get("/api/ai/deployments/d").json()["capacity_class"] == "opportunistic"

        # A tenant allowed only standard and opportunistic: critical is refused at create and apply.
        assert api.post("/api/ai/policies", json={"tenant": "acme", "allowed_capacity_classes": [
            "standard", "opportunistic"]}).status_code == 201
        r = api.post("/api/ai/deployments", json={"name": "t", "model": "m", "profile": "p", "replicas": 0,
                                                  "tenant": "acme", "capacity_class": "critical"})
        assert r.status_code == 403 and r.json()["error"]["code"] == "policy_refused", r.text
        assert "allowed_capacity_classes" in r.json()["error"]["message"]
        assert api.post("/api/ai/apply", json={"documents": [doc("t", "standard", "acme")]}).status_code == 200
        r = api.post("/api/ai/apply", json={"documents": [doc("t", "critical", "acme")]})
        assert r.status_code == 403 and "allowed_capacity_classes" in r.text, r.text
        assert api.get("/api/ai/deployments/t").json()["capacity_class"] == "standard"
