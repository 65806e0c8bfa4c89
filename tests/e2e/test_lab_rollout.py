"""A canary at 20 % and autoscaling in the real lab (namespaces, XDP Maglev, fabricd, agent,
engine sims), on the e2e modules' shared lab (each test has its own deployment and endpoint).

Four replicas of revision 1, a canary to revision 2 held at 20 %: the new set's share of the
live BPF Maglev table is within 0.1 point of 20 %, and of 500 new TCP connections through the
VIP the engines of the new set answered 20 % +- 5 points (counted from the engines' own
vllm:request_success_total). A rollback then takes the new set's share back to 0.

Autoscaling: queue 20 on the only replica scales the deployment out to 2 and both replicas'
backends reach the live BPF Maglev map; removing the load scales it back in to 1, the drained
replica's backend leaves the map, and new TCP connections through the VIP are all served.
Run under `flock /tmp/fabric-lab.lock` (the lab's names are fixed).
"""

from __future__ import annotations

import json
import subprocess

import httpx
import pytest

from lab.cluster import LAB_MODEL_SOURCE, LabConfig
from lab.rigs.lab_lock import lab_unavailable
from lab.rigs.polling import wait_for
from tests.e2e.test_lab_story import Story

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(lab_unavailable() is not None, reason=lab_unavailable() or "")]

DEP, PROFILE, EP = "canary-llm", "canary-h100", "canary-llm-openai"
AS_DEP, AS_PROFILE, AS_EP = "auto-llm", "auto-h100", "auto-llm-openai"
CONNECTIONS = 500


@pytest.fixture(scope="module")
def lab(shared_lab):
    """The e2e modules' shared lab (tests/e2e/conftest.py), as a fresh lab holds it."""
    cfg, token = shared_lab
    story = Story(cfg, token)
    yield cfg, story.api, story.agent
    story.api.close()
    story.agent.close()


def table(agent, vip) -> dict[str, tuple[int, int]] | None:
    """address -> (weight, slots) of the VIP's service in the live BPF maps."""
    for svc in agent.get("/v1/maglev/services").json()["services"]:
        if svc["vip"] == vip:
            return {s["address"]: (s["weight"], s["slots"]) for s in svc["stats"]}
    return None


def set_load(api, addr: str, waiting: int) -> None:
    """Set the simulated queue of the engine at ``addr``; when it cannot be reached, fail saying
    what the control plane shows of the deployment (replicas, their phases, its events). A timeout
    is tried again twice (a 2-core machine running the suite can starve the engine's accept for
    seconds: one clean run in five hit it); a refusal or an error status fails at once."""
    try:
        for attempt in range(3):
            try:
                r = httpx.post(f"http://{addr}/sim/load", json={"waiting": waiting}, timeout=5)
                break
            except httpx.TimeoutException:
                if attempt == 2:
                    raise
        assert r.status_code == 200, r.text
    except httpx.HTTPError as exc:
        replicas = api.get(f"/api/ai/deployments/{AS_DEP}/metrics").json().get("replicas")
        events = [(e["object"], e["reason"], e["message"]) for e in
                  api.get("/api/ai/events", params={"object": f"deployment/{AS_DEP}"}).json()]
        replica_events = [(e["object"], e["reason"], e["message"]) for e in
                          api.get("/api/ai/events", params={"kind": "replica"}).json()][-20:]
        raise AssertionError(f"engine {addr} unreachable ({exc!r}); replicas {replicas}; events {events}; "
                             f"replica events {replica_events}") from exc


def served(addr: str) -> float:
    text = httpx.get(f"http://{addr}/metrics", timeout=5).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("vllm:request_success_total{"))


def connect(cfg: LabConfig, vip: str, n: int, model: str = DEP) -> int:
    """n new TCP connections (one request each) from the client namespace; how many got 200."""
    body = json.dumps({"model": model, "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]})
    script = (f"ok=0; for i in $(seq {n}); do c=$(curl -s -o /dev/null -w '%{{http_code}}' --max-time 10 "
              f"-H 'content-type: application/json' -d '{body}' http://{vip}:8000/v1/chat/completions); "
              f"[ \"$c\" = 200 ] && ok=$((ok+1)); done; echo $ok")
    out = subprocess.run(["ip", "netns", "exec", cfg.topology.client_ns, "sh", "-c", script],
                         capture_output=True, text=True, timeout=60 + n)
    return int(out.stdout.strip().splitlines()[-1])


def deploy(api, dep: str, profile: str, replicas: int, endpoint: dict) -> None:
    """The lab's model as DEP, a one-GPU PROFILE, REPLICAS of it, and ENDPOINT in front."""
    assert api.post("/api/ai/models", json={"name": dep, "source": LAB_MODEL_SOURCE}).status_code == 201
    assert api.post("/api/ai/profiles", json={"name": profile, "runtime": "vllm", "cpu": 1, "memory_gib": 1,
                                              "gpu": {"count": 1, "vram_gib": 24}}).status_code == 201
    assert api.post("/api/ai/deployments", json={"name": dep, "model": dep, "profile": profile,
                                                 "replicas": replicas}).status_code == 201
    assert api.post("/api/ai/endpoints", json=endpoint).status_code == 201


def test_canary_at_20_percent_through_the_vip(lab):
    cfg, api, agent = lab
    deploy(api, DEP, PROFILE, 4, {"name": EP, "deployment": DEP, "routing": "equal"})
    wait_for(lambda: api.get(f"/api/ai/deployments/{DEP}").json()["status"]["ready_replicas"] == 4, 120,
             "4 ready replicas")
    vip = wait_for(lambda: api.get(f"/api/ai/endpoints/{EP}").json()["status"].get("vip"), 60, "a VIP")
    wait_for(lambda: len(table(agent, vip) or {}) == 4, 60, "4 backends in the BPF maps")

    assert api.post(f"/api/ai/deployments/{DEP}/revisions", json={"engine_args": ["--enforce-eager"]}
                    ).status_code == 201
    r = api.post(f"/api/ai/deployments/{DEP}/rollouts", json={
        "strategy": "canary", "steps": [{"percent": 20, "secs": 3600}, {"percent": 100}]})
    assert r.status_code == 201, r.text

    def split_live():
        body = api.get(f"/api/ai/explain/rollout/{DEP}").json()
        if body.get("rollout", {}).get("share") != 20:
            return None
        new = {f"{m['host']}:{m['port']}" for m in body["sets"]["new"]["members"] if m["ready"]}
        old = {f"{m['host']}:{m['port']}" for m in body["sets"]["old"]["members"] if m["ready"]}
        live = table(agent, vip) or {}
        if len(new) != 1 or len(old) != 4 or set(live) != new | old or not live[next(iter(new))][0]:
            return None
        return new, old, live
    new, old, live = wait_for(split_live, 120, "the 20 % split in the BPF maps")

    total = sum(slots for _w, slots in live.values())
    new_share = sum(live[a][1] for a in new) / total
    assert abs(new_share - 0.20) <= 0.001, (new_share, live)

    before = {a: served(a) for a in new | old}
    assert connect(cfg, vip, CONNECTIONS) == CONNECTIONS
    delta = {a: served(a) - before[a] for a in before}
    assert sum(delta.values()) == CONNECTIONS, delta
    share = sum(delta[a] for a in new) / CONNECTIONS
    print(f"canary 20%: BPF table share {new_share:.5f}, engines' share of {CONNECTIONS} connections {share:.3f}")
    assert abs(share - 0.20) <= 0.05, (share, delta)

    # Rollback: the new set's slots go to 0 in one push; it then drains away.
    rollout_id = api.get(f"/api/ai/explain/rollout/{DEP}").json()["rollout"]["id"]
    assert api.post(f"/api/ai/deployments/{DEP}/rollouts/{rollout_id}/rollback").status_code == 200
    wait_for(lambda: all((table(agent, vip) or {}).get(a, (0, 0))[1] == 0 for a in new), 60,
             "the new set's slots back to 0")
    done = wait_for(lambda: (b := api.get(f"/api/ai/explain/rollout/{DEP}").json())["phase"] == "RolledBack" and b,
                    120, "RolledBack")
    assert done["revision"] == 1 and done["sets"]["old"]["ready"] == 4


def test_queue_scales_out_into_the_bpf_map_and_back_in(lab):
    cfg, api, agent = lab
    deploy(api, AS_DEP, AS_PROFILE, 1, {"name": AS_EP, "deployment": AS_DEP})
    vip = wait_for(lambda: api.get(f"/api/ai/endpoints/{AS_EP}").json()["status"].get("vip"), 120, "a VIP")
    wait_for(lambda: len(table(agent, vip) or {}) == 1, 120, "1 backend in the BPF maps")
    spec = {"min_replicas": 1, "max_replicas": 2, "scale_out_queue": 5, "scale_out_seconds": 2,
            "scale_in_queue": 1, "scale_in_seconds": 3, "cooldown_seconds": 1}
    assert api.put(f"/api/ai/deployments/{AS_DEP}/autoscaling", json=spec).status_code == 200

    first = next(iter(table(agent, vip)))
    set_load(api, first, 20)
    wait_for(lambda: len(table(agent, vip) or {}) == 2, 120, "scale out: 2 backends in the BPF maps")
    assert api.get(f"/api/ai/deployments/{AS_DEP}").json()["replicas"] == 2
    events = api.get("/api/ai/events", params={"object": f"deployment/{AS_DEP}"}).json()
    assert "ScaledOut" in [e["reason"] for e in events]

    set_load(api, first, 0)
    wait_for(lambda: len(table(agent, vip) or {}) == 1, 120, "scale in: 1 backend in the BPF maps")
    wait_for(lambda: len(api.get(f"/api/ai/deployments/{AS_DEP}/metrics").json()["replicas"]) == 1, 60,
             "the drained replica deleted")
    assert connect(cfg, vip, 20, model=AS_DEP) == 20
