"""The lab story end to end: one real lab (namespaces, XDP, fabricd, agent, gateway), one story.

The lab is the e2e modules' shared one (tests/e2e/conftest.py), as a fresh lab holds it. Each
test is a chapter and builds on the one before (pytest runs them in file order). Waits
poll with bounded deadlines; assertions are on behaviour (who answered, weights in the live
BPF maps, records in the store, routing ticks), never on elapsed time.
"""

from __future__ import annotations

import collections
import json
import ssl
import subprocess
from collections.abc import Iterator

import httpx
import pytest

from common.store.connect import open_store
from lab.cluster import LAB_MODEL_SOURCE, NODE_ID, LabConfig, down, status
from lab.processes import running
from lab.rigs import chaos
from lab.rigs.chaos_lab import FLOW_ENTRIES, LabRig
from lab.rigs.lab_lock import lab_unavailable
from lab.rigs.polling import wait_for as poll
from tests.e2e.lab_harness import SharedLab

MODEL, PROFILE = "story-llm", "story-h100"
ENDPOINT = f"{MODEL}-openai"


pytestmark = [pytest.mark.e2e, pytest.mark.skipif(lab_unavailable() is not None, reason=lab_unavailable() or "")]


def wait_for(what: str, check, timeout: float = 90.0, every: float = 0.25):
    return poll(check, timeout, what, every)


class Story:
    """What the chapters share: the lab handle and clients for fabricd and the agent."""

    def __init__(self, cfg: LabConfig, token: str):
        self.cfg = cfg
        self.token = token
        ctx = ssl.create_default_context(cafile=str(cfg.ca))
        self.api = httpx.Client(base_url=cfg.url, verify=ctx, timeout=15,
                                headers={"Authorization": f"Bearer {token}"})
        pki = cfg.fabricd_dir / "pki"
        agent_ctx = ssl.create_default_context(cafile=str(cfg.ca))
        agent_ctx.load_cert_chain(str(pki / "fabricd.crt"), str(pki / "fabricd.key"))
        self.agent = httpx.Client(base_url=f"https://127.0.0.1:{cfg.agent_port}", verify=agent_ctx, timeout=15)
        self.vip: str | None = None
        self.key: str | None = None

    def deployment(self) -> dict:
        return self.api.get(f"/api/ai/deployments/{MODEL}").json()

    def replicas(self) -> list[dict]:
        return self.api.get(f"/api/ai/deployments/{MODEL}/metrics").json()["replicas"]

    def maglev(self) -> dict[str, int] | None:
        """Backends and weights of the endpoint's service in the agent's live BPF maps."""
        for svc in self.agent.get("/v1/maglev/services").json()["services"]:
            if svc["vip"] == self.vip:
                return {s["address"]: s["weight"] for s in svc["stats"]} or dict(svc["backends"])
        return None

    def routing_ticks(self) -> float:
        text = self.api.get("/metrics").text
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("fabric_controller_ticks_total{") and 'controller="routing"' in line)

    def via_vip(self, n: int) -> collections.Counter:
        """n new TCP connections to the VIP from the client namespace; who answered each."""
        body = json.dumps({"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]})
        script = (f"for i in $(seq {n}); do curl -s -o /dev/null -D - --max-time 10 "
                  f"-H 'content-type: application/json' -d '{body}' "
                  f"http://{self.vip}:8000/v1/chat/completions | grep -i '^x-fabric-replica' || echo 'x-fabric-replica: none'; done")
        out = subprocess.run(["ip", "netns", "exec", self.cfg.topology.client_ns, "sh", "-c", script],
                             capture_output=True, text=True, timeout=30 + n).stdout
        return collections.Counter(line.split(":", 1)[1].strip() for line in out.splitlines() if ":" in line)


@pytest.fixture(scope="module")
def story(shared_lab) -> Iterator[Story]:
    # the shared lab has a small connection table, so the chaos chapter's scan can fill it (4x its size)
    cfg, token = shared_lab
    story = Story(cfg, token)
    yield story
    story.api.close()
    story.agent.close()


def test_deploy_three_replicas_all_ready(story: Story):
    api = story.api
    assert api.post("/api/ai/models", json={"name": MODEL, "source": LAB_MODEL_SOURCE}).status_code == 201
    assert api.post("/api/ai/profiles", json={"name": PROFILE, "runtime": "vllm", "cpu": 1, "memory_gib": 1,
                                              "gpu": {"count": 1, "vram_gib": 24}}).status_code == 201
    assert api.post("/api/ai/deployments", json={"name": MODEL, "model": MODEL, "profile": PROFILE,
                                                 "replicas": 3}).status_code == 201
    wait_for("3 ready replicas", lambda: story.deployment()["status"]["ready_replicas"] == 3)
    reps = story.replicas()
    assert len(reps) == 3 and all(r["ready"] and r["node"] == NODE_ID for r in reps)
    assert sorted(r["ordinal"] for r in reps) == [0, 1, 2]
    gpus = api.get("/api/ai/gpus").json()
    held = [g for g in (gpus["gpus"] if isinstance(gpus, dict) else gpus) if g.get("allocated_to")]
    assert len(held) == 3, "each replica holds one simulated GPU"


def test_vip_and_gateway_serve(story: Story):
    api = story.api
    r = api.post("/api/ai/endpoints", json={"name": ENDPOINT, "deployment": MODEL, "routing": "least_queue"})
    assert r.status_code == 201, r.text
    story.vip = wait_for("a VIP", lambda: api.get(f"/api/ai/endpoints/{ENDPOINT}").json()["status"].get("vip"))
    wait_for("3 backends in the live Maglev maps", lambda: len(story.maglev() or {}) == 3)
    answered = story.via_vip(9)
    assert "none" not in answered and sum(answered.values()) == 9
    assert set(answered) <= {r["replica_id"] for r in story.replicas()}

    created = api.post("/api/ai/keys", json={"name": "story-key", "endpoint": ENDPOINT})
    assert created.status_code in (200, 201), created.text
    body = created.json()
    story.key = body.get("key") or body.get("api_key") or body.get("secret")
    import openai

    tls = httpx.Client(verify=ssl.create_default_context(cafile=str(story.cfg.ca)))
    base = f"{story.cfg.gateway_url}/api/ai/openai/{ENDPOINT}/v1"
    client = openai.OpenAI(base_url=base, api_key=story.key, http_client=tls)
    out = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hello"}], max_tokens=4)
    assert out.choices[0].message.content and out.usage.completion_tokens == 4
    bad = openai.OpenAI(base_url=base, api_key="fvai_nope_nope", http_client=tls)
    with pytest.raises(openai.AuthenticationError):
        bad.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}])


def test_load_on_one_replica_lowers_its_weight_and_share(story: Story):
    loaded = min(story.replicas(), key=lambda r: r["ordinal"])
    addr = f"{loaded['host']}:{loaded['port']}"
    ticks_before = story.routing_ticks()
    httpx.post(f"http://{addr}/sim/load", json={"queue": 60}, timeout=5).raise_for_status()
    def fallen() -> dict[str, int] | None:
        m = story.maglev()
        return m if m and m.get(addr, 32) < min(v for k, v in m.items() if k != addr) else None

    weights = wait_for("the loaded replica's weight to fall in the BPF map", fallen)
    ticks_after = story.routing_ticks()
    # The scrape in flight when the load arrived may predate it; the next one sees it.
    assert ticks_after - ticks_before <= 2, f"weights moved after {ticks_after - ticks_before} routing ticks"
    answered = story.via_vip(140)
    share = answered[loaded["replica_id"]] / sum(answered.values())
    expected = weights[addr] / sum(weights.values())
    others = [answered[r["replica_id"]] for r in story.replicas() if r["replica_id"] != loaded["replica_id"]]
    assert abs(share - expected) < 0.08, (share, expected, answered, weights)
    assert all(answered[loaded["replica_id"]] < n for n in others), answered
    httpx.post(f"http://{addr}/sim/load", json={"queue": 0}, timeout=5).raise_for_status()


@pytest.mark.full  # make test: the health failure in tests/e2e/test_lab_no_drop.py, the rule in tests/controlplane/reconcile/
def test_unhealthy_replica_is_replaced_after_three_failed_probes(story: Story):
    victim = max(story.replicas(), key=lambda r: r["ordinal"])
    addr = f"{victim['host']}:{victim['port']}"
    httpx.post(f"http://{addr}/sim/faults", json={"fail_health": True}, timeout=5).raise_for_status()
    failures_while_routed: set[int] = set()

    def excluded() -> bool:
        rec = next((r for r in story.replicas() if r["replica_id"] == victim["replica_id"]), None)
        in_maps = addr in (story.maglev() or {})
        if rec is not None and in_maps:
            failures_while_routed.add(rec["health_failures"])
        return not in_maps

    wait_for("the failing replica to leave the Maglev maps", excluded, every=0.1)
    # One or two failed probes keep it; the third removes it.
    assert {1, 2} <= failures_while_routed, failures_while_routed
    answered = story.via_vip(30)
    assert victim["replica_id"] not in answered, answered
    def replaced() -> bool:
        reps = story.replicas()
        return (len(reps) == 3 and all(r["ready"] for r in reps)
                and victim["replica_id"] not in {r["replica_id"] for r in reps})

    wait_for("a replacement: 3 ready replicas without the failed one", replaced)
    assert victim["replica_id"] not in answered


def test_scale_to_five_then_back_to_two_with_drain(story: Story):
    assert story.api.post(f"/api/ai/deployments/{MODEL}/scale", json={"replicas": 5}).status_code in (200, 202)
    wait_for("5 ready replicas", lambda: story.deployment()["status"]["ready_replicas"] == 5, timeout=120)
    wait_for("5 backends in the maps", lambda: len(story.maglev() or {}) == 5)
    assert story.api.post(f"/api/ai/deployments/{MODEL}/scale", json={"replicas": 2}).status_code in (200, 202)
    # The pass marks the three one store write apiece: a read between two sees some of them.
    seen: dict[str, dict] = {}

    def three_draining() -> bool:
        seen.update({r["replica_id"]: r for r in story.replicas() if r["draining"]})
        return len(seen) >= 3

    wait_for("3 replicas draining at weight 0 before they go", three_draining, timeout=60, every=0.1)
    drained = list(seen.values())
    assert len(drained) == 3, sorted(seen)
    wait_for("2 replicas left", lambda: len(story.replicas()) == 2 and len(story.maglev() or {}) == 2, timeout=120)
    answered = story.via_vip(10)
    assert set(answered) <= {r["replica_id"] for r in story.replicas()}, answered
    assert not ({d["replica_id"] for d in drained} & set(answered))


@pytest.mark.full  # make test: the flow table under floods in tests/dataplane/, an agent restart in tests/agent/
def test_chaos_flow_table_scan_and_agent_sigkill_keep_the_vip_serving(story: Story):
    """The short chaos run (scripts/chaos runs all seven on a lab with two fabricd on etcd):
    under streaming load through the gateway and, from the client namespace, through the VIP, a
    SYN scan of 4x the connection table and then a SIGKILL of the agent. The VIP keeps serving
    through both (the table's LRU evicts, the pinned maps outlive the agent), and after each every
    Maglev service has its endpoint and only ready replicas in its ring, limits are exact and
    the audit chain verifies."""
    store = open_store(None, story.cfg.fabricd_dir)
    rig = LabRig(story.cfg, story.token, MODEL, ENDPOINT, store, vip=story.vip)
    try:
        rows = {r["injection"]: r for r in chaos.run(rig, ["flow_table_scan", "agent_sigkill"], settle_s=1.0)}
    finally:
        store.close()
    print(json.dumps(list(rows.values()), indent=1))
    for name, row in rows.items():
        assert all(v is True for v in row["invariants"].values()), (name, row["invariants"])
        assert row["component_recovery_s"] is not None, (name, row)
        assert row["paths"]["vip"]["client_calls"] > 0 and row["paths"]["gateway"]["client_calls"] > 0, row
        # neither fault is on the VIP's data path: no client through the VIP sees an error
        assert row["paths"]["vip"]["client_errors"] == 0, (name, row["paths"]["vip"])
    scan = rows["flow_table_scan"]["scan"]
    assert scan["sent"] == 4 * FLOW_ENTRIES
    assert scan["table_entries_after_scan"] >= FLOW_ENTRIES * 0.9, scan  # the scan filled the table
    assert scan["established_stream_ok"], scan  # the stream open before the scan finished
    assert scan["active_flows_after"] <= scan["active_flows_before"] + 8, scan


def test_delete_endpoint_releases_vip_and_maglev_service(story: Story):
    assert story.api.delete(f"/api/ai/endpoints/{ENDPOINT}").status_code in (200, 202, 204)
    wait_for("the Maglev service to be gone from the agent", lambda: story.maglev() is None)
    wait_for("the VIP to be released",
             lambda: story.vip not in {v["vip"] for v in story.api.get("/api/ai/capacity").json()["vips"]})


def test_lab_down_leaves_nothing_behind(story: Story, shared_lab_holder: SharedLab):
    cfg = story.cfg
    down(cfg)
    assert status(cfg) == []
    assert not cfg.pin_dir.exists()
    assert running(cfg.state_dir) == []
    left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert cfg.topology.prefix not in left
    assert subprocess.run(["ip", "link", "show", cfg.topology.host_if], capture_output=True).returncode != 0
    shared_lab_holder.close()  # a later chapter gets a new lab
