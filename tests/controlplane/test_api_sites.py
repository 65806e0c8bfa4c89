"""/api/ai/sites through a real fabricd, and the model's residency copied onto a deployment."""

from __future__ import annotations


def test_site_crud_and_bad_input(api):
    body = {"name": "pune", "residency": "india", "cost_tier": 0.5, "failover_sites": ["mumbai"],
            "peer_url": "http://127.0.0.1:9/", "fail_closed_unix": 1900000000}
    r = api.post("/api/ai/sites", json=body)
    assert r.status_code == 201, r.text
    assert r.json()["peer_url"] == "http://127.0.0.1:9" and r.json()["nodes"] == []
    assert api.post("/api/ai/sites", json={**body, "cost_tier": 2}).status_code == 200  # replaces
    assert api.get("/api/ai/sites/pune").json()["cost_tier"] == 2
    assert [s["name"] for s in api.get("/api/ai/sites").json()] == ["pune"]
    for bad, word in (({"failover_sites": ["pune"]}, "itself"), ({"cost_tier": -1}, "cost_tier"),
                      ({"peer_url": "http://x/../etc"}, "peer_url"), ({"residency": "Not A Label"}, "residency"),
                      ({"name": "../x"}, "name")):
        r = api.post("/api/ai/sites", json={**body, **bad})
        assert r.status_code == 422 and word in r.text, (bad, r.text)
    assert api.delete("/api/ai/sites/pune").json()["deleted"] is True
    r = api.get("/api/ai/sites/pune")
    assert r.status_code == 404 and r.json()["error"]["code"] == "site_not_found"
    assert api.delete("/api/ai/sites/pune").status_code == 404


def test_deployment_takes_the_model_residency(api):
    api.post("/api/ai/models", json={"name": "resident", "source": "hf://org/m", "residency": "india"})
    api.post("/api/ai/profiles", json={"name": "p1", "gpu": {"count": 1, "vram_gib": 24}, "cpu": 4,
                                       "memory_gib": 16})
    r = api.post("/api/ai/deployments", json={"name": "resident", "model": "resident", "profile": "p1"})
    assert r.status_code == 201 and r.json()["residency"] == "india"
    r = api.post("/api/ai/deployments", json={"name": "elsewhere", "model": "resident", "profile": "p1",
                                              "residency": "eu", "minimum_sites": 2, "max_replicas_per_site": 1})
    assert r.status_code == 422 and r.json()["error"]["code"] == "residency_conflict"
