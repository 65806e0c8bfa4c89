"""Rollouts end to end: real fabricd (controllers on, 1 s periods), a real fabric-agent with the
dry-run driver and real fabric-engine-sim replicas whose /metrics the routing job scrapes.

Story: a canary with a short step succeeds (revision 2 active, revision 1 superseded, every
replica on revision 2); then a canary to revision 3 is live at 20 % when fabricd is killed and
started again: the new process continues the same step (same record, same step clock); its
engine then fails every request (POST /sim/faults) and the rollout pauses and rolls back by
itself, leaving revision 2 serving with its replicas."""

from __future__ import annotations

import subprocess

import httpx
import pytest

from lab.rigs.polling import wait_for
from tests.integration.orchestration_harness import BIN, deploy, start_cluster

# full: make test keeps the canary through the VIP (tests/e2e/test_lab_rollout.py, test_lab_no_drop.py) and
# the planner's tables (tests/controlplane/rollouts/).
pytestmark = [pytest.mark.e2e, pytest.mark.full]

DEP, EP = "cq", "cq-openai"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("rollouts")
    with start_cluster(tmp, gpus=4, env={"FABRIC_ADDRESS_POOL": "10.96.0.9", "FABRIC_DRAIN_GRACE_SECS": "1",
                                           "FABRIC_LEADER_TTL_SECS": "3"}) as c:
        yield c


def explain(api) -> dict:
    return api.get(f"/api/ai/explain/rollout/{DEP}").json()


def replicas(api) -> list[dict]:
    return api.get(f"/api/ai/deployments/{DEP}/metrics").json()["replicas"]


def revisions_of_ready(api) -> list[int]:
    body = explain(api)
    return sorted(m["replica_id"] for s in body.get("sets", {}).values() for m in s["members"] if m["ready"])


def rollout_phase(api, phase):
    def check():
        body = explain(api)
        return body.get("phase") == phase and body
    return check


def test_canary_succeeds_then_a_failing_canary_rolls_back_by_itself(cluster):
    with cluster.api() as api, httpx.Client(timeout=5) as plain:
        deploy(api, DEP, EP, 2)
        try:
            wait_for(lambda: sum(r["ready"] for r in replicas(api)) == 2, 90, "2 ready replicas")
        except AssertionError:
            raise AssertionError(cluster.tail()) from None

        # 1. A canary with a 2 s step at 50 %: the new replica gets half the weight, then the
        #    old set goes and revision 2 is active.
        assert api.post(f"/api/ai/deployments/{DEP}/revisions", json={"engine_args": ["--enforce-eager"]}
                        ).status_code == 201
        r = api.post(f"/api/ai/deployments/{DEP}/rollouts", json={
            "strategy": "canary", "steps": [{"percent": 50, "secs": 2}, {"percent": 100}],
            "thresholds": {"error_rate_max": 0.2, "min_requests": 10, "ttft_ms_max": None}})
        assert r.status_code == 201, r.text
        live = wait_for(lambda: (b := explain(api)).get("rollout", {}).get("share") == 50 and b, 60,
                        "the 50 % step to go live")
        assert live["sets"]["new"]["ready"] == 1 and live["sets"]["old"]["ready"] == 2
        try:
            done = wait_for(rollout_phase(api, "Succeeded"), 90, "the first canary to succeed")
        except AssertionError:
            raise AssertionError(f"{explain(api)}\n{cluster.tail()}") from None
        assert done["revision"] == 2 and done["rollout"]["to_revision"] == 2
        dep = api.get(f"/api/ai/deployments/{DEP}").json()
        assert dep["revision"] == 2 and dep["engine_args"] == ["--enforce-eager"]
        revs = {r["revision"]: r for r in api.get(f"/api/ai/deployments/{DEP}/revisions").json()}
        assert revs[1]["superseded_at"] is not None and revs[2]["superseded_at"] is None
        wait_for(lambda: sum(r["ready"] for r in replicas(api)) == 2 and len(replicas(api)) == 2, 60,
                 "two revision-2 replicas only")
        events = [e["action"] for e in api.get("/api/ai/events", params={"kind": "rollout", "name": DEP}).json()]
        assert events[:2] == ["revision", "started"] and "step" in events and events[-1] == "succeeded"

        # 2. Revision 3's canary engine fails every request: the window's error rate passes 20 %
        #    after 10 requests, so the rollout pauses and rolls back without anyone asking.
        assert api.post(f"/api/ai/deployments/{DEP}/revisions", json={"engine_args": []}).status_code == 201
        r = api.post(f"/api/ai/deployments/{DEP}/rollouts", json={
            "strategy": "canary", "steps": [{"percent": 20, "secs": 600}, {"percent": 100}],
            "thresholds": {"error_rate_max": 0.2, "min_requests": 10, "ttft_ms_max": None}})
        assert r.status_code == 201, r.text
        live = wait_for(lambda: (b := explain(api)).get("rollout", {}).get("share") == 20 and b, 60,
                        "the 20 % step to go live")
        # fabricd killed mid-step: the restarted process continues the phase, never starts over.
        cluster.kill_fabricd()
        cluster.start_fabricd()
        wait_for(lambda: api.get("/metrics").text.count('fabric_controller_leader 1.0') == 1, 30, "a leader again")
        again = explain(api)
        assert again["rollout"]["id"] == live["rollout"]["id"] and again["rollout"]["step"] == 0
        assert again["rollout"]["step_started_at"] == live["rollout"]["step_started_at"]
        assert again["phase"] == "Progressing" and again["rollout"]["share"] == 20
        canary = live["sets"]["new"]["members"][0]
        engine = f"http://{canary['host']}:{canary['port']}"
        weights = live["endpoints"][0]["weights"]
        assert set(weights) == {m["replica_id"] for s in live["sets"].values() for m in s["members"] if m["ready"]}
        assert plain.post(f"{engine}/sim/faults", json={"error_rate": 1.0}).status_code == 200
        for _ in range(12):
            resp = plain.post(f"{engine}/v1/chat/completions",
                              json={"model": DEP, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
            assert resp.status_code == 500
        try:
            back = wait_for(rollout_phase(api, "RolledBack"), 60, "the failing canary to roll back")
        except AssertionError:
            raise AssertionError(f"{explain(api)}\n{cluster.tail()}") from None
        assert "rolled back: error rate 100.0% of the new revision" in back["rollout"]["message"], back
        assert back["revision"] == 2
        events = api.get("/api/ai/events", params={"kind": "rollout", "name": DEP}).json()
        actions = [e["action"] for e in events]
        assert actions[-3:] == ["paused", "rollback", "rolled-back"], actions
        assert "error rate" in next(e["message"] for e in events if e["action"] == "paused")
        # The new set is gone; revision 2's two replicas still serve.
        wait_for(lambda: len(replicas(api)) == 2 and sum(r["ready"] for r in replicas(api)) == 2, 60,
                 "revision 2's replicas only")
        dep = api.get(f"/api/ai/deployments/{DEP}").json()
        assert dep["revision"] == 2
        revs = {r["revision"]: r for r in api.get(f"/api/ai/deployments/{DEP}/revisions").json()}
        assert revs[2]["superseded_at"] is None and revs[3]["superseded_at"] is None


def test_rolling_update_keeps_two_routed_replicas_throughout(cluster):
    """Rolling from revision 2 to 4 (max_surge 1, max_unavailable 0, 1 s healthy): replicas are
    replaced one at a time and the endpoint routes to two ready replicas at every sample."""
    with cluster.api() as api:
        assert api.post(f"/api/ai/deployments/{DEP}/revisions", json={"engine_args": ["--seed", "4"]}
                        ).status_code == 201
        # Started and followed by the CLI: -w returns 0 once the rollout Succeeded.
        env = {**(cluster.env or {}), "FABRIC_URL": cluster.url, "FABRIC_TOKEN": cluster.token,
               "HOME": str(cluster.state_dir), "XDG_CONFIG_HOME": str(cluster.state_dir / "xdg")}
        cli = subprocess.Popen([str(BIN / "fabricctl"), "ai", "deployment", "rollout", DEP, "--to-revision", "4",
                                "--strategy", "rolling", "--max-surge", "1", "--max-unavailable", "0",
                                "--min-healthy-secs", "1", "-w"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, env=env)
        lowest, most = 99, 0

        def done():
            nonlocal lowest, most
            routed = [x for x in api.get(f"/api/ai/explain/routing/{EP}").json()["replicas"] if x["included"]]
            reps = replicas(api)
            lowest, most = min(lowest, len(routed)), max(most, len([x for x in reps if not x["draining"]]))
            body = explain(api)
            return body.get("phase") == "Succeeded" and body
        try:
            body = wait_for(done, 120, "the rolling update to finish", interval=0.2)
        except AssertionError:
            raise AssertionError(f"{explain(api)}\n{cluster.tail()}") from None
        out, err = cli.communicate(timeout=30)
        assert cli.returncode == 0, err
        assert "rollout 3 of cq started (rolling to revision 4)" in out and "Succeeded" in out.splitlines()[-1]
        assert lowest >= 2, lowest  # never fewer than N routed (max_unavailable 0)
        assert most <= 3, most  # never more than N + max_surge live
        assert body["revision"] == 4
        revs = {r["revision"]: r for r in api.get(f"/api/ai/deployments/{DEP}/revisions").json()}
        assert revs[2]["superseded_at"] is not None and revs[4]["superseded_at"] is None
        wait_for(lambda: len(replicas(api)) == 2 and all(
            m["ready"] for m in explain(api)["sets"]["new"]["members"]), 60, "two revision-4 replicas only")
