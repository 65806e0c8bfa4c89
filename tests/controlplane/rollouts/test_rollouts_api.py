"""Revisions and rollouts through real HTTP against a real fabricd (controllers off: the API's
own writes only; the planner runs in the integration tests)."""

from __future__ import annotations

import pytest

from tests.controlplane.test_api_resources import error, make_stack

PROFILE = {"runtime": "vllm", "gpu": {"count": 1, "vram_gib": 48}, "cpu": 8, "memory_gib": 32}


def base(api, tag):
    make_stack(api, tag, replicas=2)
    return f"/api/ai/deployments/d-{tag}"


def test_create_writes_revision_1_and_changes_write_the_next(api):
    path = base(api, "rv1")
    revs = api.get(f"{path}/revisions").json()
    assert [(r["revision"], r["template"]["model"], r["who"]) for r in revs] == [(1, "m-rv1", "admin")]
    assert api.post("/api/ai/profiles", json={"name": "p-rv1-big", **PROFILE}).status_code == 201
    resp = api.post(f"{path}/revisions", json={"profile": "p-rv1-big", "engine_args": ["--max-num-seqs", "64"],
                                               "reason": "bigger GPUs"})
    assert resp.status_code == 201, resp.text
    rev = resp.json()
    assert rev["revision"] == 2 and rev["template"] == {"model": "m-rv1", "profile": "p-rv1-big",
                                                        "engine_args": ["--max-num-seqs", "64"]}
    assert rev["reason"] == "bigger GPUs" and rev["who"] == "admin"
    assert api.get(f"{path}/revisions/2").json() == rev
    # Writing a revision does not touch the running deployment.
    assert api.get(path).json()["revision"] == 1 and api.get(path).json()["profile"] == "p-rv1"
    assert error(api.post(f"{path}/revisions", json={"profile": "p-rv1-big", "engine_args": ["--max-num-seqs", "64"]}),
                 409)["code"] == "unchanged"
    events = api.get("/api/ai/events", params={"kind": "rollout", "name": "d-rv1"}).json()
    assert any("revision 2" in e["message"] for e in events)


@pytest.mark.parametrize("body,status,words", [
    ({"profile": "nope"}, 422, "profile 'nope' does not exist"),
    ({"model": "Bad Name"}, 422, "not a DNS label"),
    ({"engine_args": ["ok", "two\nlines"]}, 422, "one line"),
    ({"colour": "red"}, 422, "colour"),
])
def test_bad_revisions_are_refused_naming_the_field(api, body, status, words):
    path = base(api, f"rvb{abs(hash(str(body))) % 10000}")
    assert words in error(api.post(f"{path}/revisions", json=body), status)["message"]
    assert len(api.get(f"{path}/revisions").json()) == 1  # nothing half-written


def test_unknown_deployment_and_revision_are_404(api):
    assert error(api.get("/api/ai/deployments/ghost/revisions"), 404)["message"] == "deployment 'ghost' not found"
    path = base(api, "rv404")
    assert "revision 7" in error(api.get(f"{path}/revisions/7"), 404)["message"]
    assert "revision 7" in error(api.post(f"{path}/rollouts", json={"to_revision": 7}), 404)["message"]


def test_rollout_lifecycle_through_the_api(api):
    path = base(api, "ro1")
    assert api.post(f"{path}/revisions", json={"engine_args": ["--seed", "1"]}).status_code == 201
    resp = api.post(f"{path}/rollouts", json={"strategy": "canary", "steps": [
        {"percent": 10, "secs": 60}, {"percent": 100}], "thresholds": {"error_rate_max": 0.02}})
    assert resp.status_code == 201, resp.text
    rec = resp.json()
    assert (rec["id"], rec["from_revision"], rec["to_revision"], rec["phase"]) == (1, 1, 2, "Progressing")
    assert (rec["old_target"], rec["new_target"], rec["share"], rec["replicas"]) == (2, 0, 0, 2)
    assert error(api.post(f"{path}/rollouts", json={"strategy": "rolling"}), 409)["code"] == "rollout_active"
    assert api.post(f"{path}/rollouts/1/pause").json()["phase"] == "Paused"
    assert error(api.post(f"{path}/rollouts/1/pause"), 409)["code"] == "already_paused"
    assert api.post(f"{path}/rollouts/1/resume").json()["phase"] == "Progressing"
    assert api.post(f"{path}/rollouts/1/promote").json()["promote"] is True
    assert error(api.post(f"{path}/rollouts/1/explode"), 404)["message"].startswith("no rollout action")
    back = api.post(f"{path}/rollouts/1/rollback").json()
    assert back["phase"] == "RollingBack" and back["share"] == 0
    assert api.get(f"{path}/rollouts/1").json()["phase"] == "RollingBack"
    assert [r["id"] for r in api.get(f"{path}/rollouts").json()] == [1]
    explain = api.get("/api/ai/explain/rollout/d-ro1").json()
    assert explain["phase"] == "RollingBack" and explain["sets"]["new"]["revision"] == 2
    assert explain["window"]["min_requests"] == 20
    actions = [e["action"] for e in api.get("/api/ai/events", params={"kind": "rollout", "name": "d-ro1"}).json()]
    assert actions[-5:] == ["started", "pause", "resume", "promote", "rollback"]


@pytest.mark.parametrize("body,words", [
    ({"strategy": "canary", "steps": [{"percent": 50, "secs": 1}, {"percent": 20}]}, "rise strictly"),
    ({"strategy": "canary", "steps": [{"percent": 50, "secs": 1}]}, "last step must be 100"),
    ({"strategy": "rolling", "canary_percent": 10}, "canary strategy"),
    ({"strategy": "rolling", "max_surge": 0, "max_unavailable": 0}, "cannot both be 0"),
    ({"strategy": "sideways"}, "strategy"),
    ({"strategy": "canary", "canary_percent": 100}, "canary_percent"),
])
def test_bad_rollouts_are_422(api, body, words):
    path = base(api, f"rob{abs(hash(str(body))) % 10000}")
    api.post(f"{path}/revisions", json={"engine_args": ["--seed", "2"]})
    assert words in error(api.post(f"{path}/rollouts", json=body), 422)["message"]
    assert api.get(f"{path}/rollouts").json() == []


def test_a_profile_an_active_rollout_moves_to_cannot_be_deleted(api):
    path = base(api, "roprof")
    assert api.post("/api/ai/profiles", json={"name": "p-roprof-2", **PROFILE}).status_code == 201
    assert api.post(f"{path}/revisions", json={"profile": "p-roprof-2"}).status_code == 201
    assert api.post(f"{path}/rollouts", json={"strategy": "canary"}).status_code == 201
    refused = error(api.delete("/api/ai/profiles/p-roprof-2"), 409)
    assert refused["code"] == "in_use" and "rollout of d-roprof" in refused["message"]
    assert api.post(f"{path}/rollouts/1/rollback").status_code == 200  # still active while rolling back
    assert error(api.delete("/api/ai/profiles/p-roprof-2"), 409)["code"] == "in_use"


def test_rollout_to_the_running_revision_is_409(api):
    path = base(api, "rosame")
    assert error(api.post(f"{path}/rollouts", json={"to_revision": 1}), 409)["code"] == "same_revision"


def test_explain_without_a_rollout(api):
    base(api, "roexp")
    body = api.get("/api/ai/explain/rollout/d-roexp").json()
    assert body["rollout"] is None and "revision 1 serves every replica" in body["message"]


def test_revisions_and_rollouts_are_bounded(monkeypatch):
    """The oldest superseded revisions and finished rollouts go beyond the kept counts."""
    import tempfile
    from pathlib import Path

    from common.records import rollouts as rollout_records
    from common.rollouts import Rollout
    from common.schemas import Template
    from common.store.sqlite_store import SqliteStore

    monkeypatch.setattr(rollout_records, "KEEP_REVISIONS", 3)
    monkeypatch.setattr(rollout_records, "KEEP_ROLLOUTS", 2)
    with tempfile.TemporaryDirectory() as tmp:
        store = SqliteStore(Path(tmp) / "s.db")
        for i in range(5):
            rollout_records.write_revision(store, "d", Template(model="m", profile="p", engine_args=[f"--x={i}"]),
                                   who="a", reason="", now=1.0)
            if i < 3:
                rollout_records.mark_superseded(store, "d", i + 1, 2.0)
        assert [r.revision for r in rollout_records.list_revisions(store, "d")] == [3, 4, 5]
        for i in range(1, 5):
            phase = "Progressing" if i == 4 else "Succeeded"
            rollout_records.create_rollout(store, Rollout(id=i, deployment="d", strategy="rolling", from_revision=1,
                                                  to_revision=2, replicas=1, phase=phase))
            rollout_records.prune_rollouts(store, "d")
        assert [r.id for r, _ in rollout_records.list_rollouts(store, "d")] == [3, 4]
        store.close()


def test_the_singular_rollout_route_is_the_same_operation_and_a_surge_passes_the_tenants_quota(api):
    assert api.post("/api/ai/models", json={"name": "m-sq", "source": "hf://o/m", "tenant": "surge"}).status_code == 201
    assert api.post("/api/ai/profiles", json={"name": "p-sq", "tenant": "surge", **PROFILE}).status_code == 201
    assert api.post("/api/ai/quotas", json={"tenant": "surge", "max_cpu": 24}).status_code == 200
    assert api.post("/api/ai/deployments", json={"name": "d-sq", "model": "m-sq", "profile": "p-sq", "replicas": 2,
                                                 "tenant": "surge"}).status_code == 201  # 16 of 24 cores
    path = "/api/ai/deployments/d-sq"
    assert api.post(f"{path}/revisions", json={"engine_args": ["--seed", "1"]}).status_code == 201
    # A canary's last step runs 2 new replicas beside the 2 old: 16 more cores, over 24.
    refused = error(api.post(f"{path}/rollout", json={"strategy": "canary"}), 409)
    assert refused["code"] == "quota_exceeded"
    assert refused["message"] == ("tenant 'surge' CPU quota is 24 (max_cpu); it uses 16 and this needs 16 more "
                                  "(32 > 24)")
    assert api.get(f"{path}/rollouts").json() == []  # nothing started
    # A rolling update with one surge replica fits (24 of 24), through the singular route.
    started = api.post(f"{path}/rollout", json={"strategy": "rolling", "max_surge": 1})
    assert started.status_code == 201, started.text
    assert [r["id"] for r in api.get(f"{path}/rollouts").json()] == [started.json()["id"]] == [1]
    assert error(api.post(f"{path}/rollouts", json={}), 409)["code"] == "rollout_active"  # one operation, one record
    events = api.get("/api/ai/events", params={"object": "deployment/d-sq"}).json()
    assert [e["type"] for e in events if e["reason"] == "QuotaRefused"] == ["Warning"]


def test_a_running_blue_green_holds_its_green_set_against_the_tenants_max_gpus(api):
    """A blue/green runs N new replicas beside the N old ones until it ends: those GPUs stay the
    tenant's while it runs, so a second rollout or a new deployment cannot take them again."""
    assert api.post("/api/ai/models", json={"name": "m-bg", "source": "hf://o/m", "tenant": "bg"}).status_code == 201
    assert api.post("/api/ai/profiles", json={"name": "p-bg", "tenant": "bg", **PROFILE}).status_code == 201
    assert api.post("/api/ai/quotas", json={"tenant": "bg", "max_gpus": 3}).status_code == 200
    for name in ("d-bg1", "d-bg2"):
        assert api.post("/api/ai/deployments", json={"name": name, "model": "m-bg", "profile": "p-bg", "replicas": 1,
                                                     "tenant": "bg"}).status_code == 201  # 1 GPU each
        assert api.post(f"/api/ai/deployments/{name}/revisions", json={"engine_args": ["--seed", "1"]}).status_code == 201
    # 2 GPUs held and 1 more for the green set: 3 of 3.
    started = api.post("/api/ai/deployments/d-bg1/rollouts", json={"strategy": "blue-green"})
    assert started.status_code == 201, started.text
    # The green set of d-bg1 is running: another blue/green needs a 4th GPU.
    refused = error(api.post("/api/ai/deployments/d-bg2/rollouts", json={"strategy": "blue-green"}), 409)
    assert refused["code"] == "quota_exceeded"
    assert refused["message"] == "tenant 'bg' GPU quota is 3 (max_gpus); it uses 3 and this needs 1 more (4 > 3)"
    assert api.get("/api/ai/deployments/d-bg2/rollouts").json() == []
    assert error(api.post("/api/ai/deployments", json={"name": "d-bg3", "model": "m-bg", "profile": "p-bg",
                                                       "replicas": 1, "tenant": "bg"}), 409)["code"] == "quota_exceeded"
    assert error(api.post("/api/ai/deployments/d-bg2/scale", json={"replicas": 2}), 409)["code"] == "quota_exceeded"
    assert [q["used_gpus"] for q in api.get("/api/ai/quotas").json() if q["tenant"] == "bg"] == [3]
    # Rolled back, the green set goes and its GPU is free again.
    assert api.post("/api/ai/deployments/d-bg1/rollouts/1/rollback").status_code == 200
