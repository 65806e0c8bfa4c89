"""A lifecycle that drops nothing, in the real lab (namespaces, XDP Maglev, fabricd, agent,
gateway, simulated engines).

Steady long streams (about 5 s each at the engines' 50 tokens/s) run through the VIP from the
client namespace (a new TCP connection per call, so every call is a new flow through the XDP
program) and through the gateway, while the deployment goes through every kind of removal:
a scale-in, a canary rollout then promote, a health failure of one replica, and finally the
deletion of its endpoint and the deployment itself. Counted by the clients: every stream
that started ends with data: [DONE] and no error (0 truncated, 0 errors). Before the drain
work, the scale-in alone reset the streams on the drained replicas (curl exit 56) and the
gateway ended its cut streams as if complete.
Run under `flock /tmp/fabric-lab.lock` (the lab's names are fixed).
"""

from __future__ import annotations

import json
import ssl
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from lab.cluster import LAB_MODEL_SOURCE
from lab.rigs.chaos_vip import in_client_ns
from lab.rigs.lab_lock import lab_unavailable
from lab.rigs.polling import wait_for
from tests.e2e.test_lab_story import Story

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(lab_unavailable() is not None, reason=lab_unavailable() or "")]

DEP, PROFILE, EP = "nodrop-llm", "nodrop-h100", "nodrop-llm-openai"
MAX_TOKENS = 250  # ~5 s per stream at the lab engines' 50 tokens/s
STREAM_TIMEOUT_S = 60.0
ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Tally:
    ok: int = 0
    bad: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, ok: bool, error: str) -> None:
        with self.lock:
            if ok:
                self.ok += 1
            else:
                self.bad.append(f"{time.monotonic():.1f}: {error}")


class VipStreams:
    """lab.rigs.vip_stream in the client namespace: WORKERS long streams to the VIP, each a
    new connection; stopped (no new calls, the ones in flight finish) by closing its stdin."""

    def __init__(self, netns: str, vip: str, workers: int = 3):
        self.tally = Tally()
        self.proc = subprocess.Popen(
            in_client_ns(netns, "lab.rigs.vip_stream", "--url", f"http://{vip}:8000", "--model", DEP,
                         "--workers", str(workers), "--max-tokens", str(MAX_TOKENS),
                         "--timeout", str(STREAM_TIMEOUT_S)),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=ROOT)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            rec = json.loads(line)
            if "end" in rec:
                self.tally.add(rec["ok"], rec["error"])

    def stop(self) -> Tally:
        self.proc.stdin.close()
        self.proc.wait(STREAM_TIMEOUT_S + 10)
        self.reader.join(5)
        return self.tally


def gateway_stream(http: httpx.Client, url: str, body: dict) -> tuple[bool, str]:
    """One streamed call; ok only when it ends with [DONE] and carries no error event."""
    start = time.monotonic()
    try:
        with http.stream("POST", url, json=body) as r:
            text = "".join(r.iter_text())
            status, replica = r.status_code, r.headers.get("x-fabric-replica", "?")
    except httpx.HTTPError as exc:
        return False, f"{type(exc).__name__} after {time.monotonic() - start:.1f}s"
    if status != 200 or "data: [DONE]" not in text or '"error"' in text:
        return False, f"http {status} from {replica} started {start:.1f}: {text[-200:]!r}"
    return True, ""


class GatewayStreams:
    """WORKERS threads streaming through the gateway with an API key; a cut stream (error event,
    no [DONE]) or any refusal counts as bad."""

    def __init__(self, url: str, key: str, verify: ssl.SSLContext, workers: int = 3):
        self.tally = Tally()
        self.halt = threading.Event()
        self.url, self.key, self.verify = url, key, verify
        self.threads = [threading.Thread(target=self._work, daemon=True) for _ in range(workers)]
        for t in self.threads:
            t.start()

    def _work(self) -> None:
        body = {"model": DEP, "stream": True, "max_tokens": MAX_TOKENS, "messages": [{"role": "user", "content": "hi"}]}
        with httpx.Client(timeout=STREAM_TIMEOUT_S, verify=self.verify,
                          headers={"authorization": f"Bearer {self.key}"}) as http:
            while not self.halt.is_set():
                self.tally.add(*gateway_stream(http, self.url, body))

    def stop(self) -> Tally:
        self.halt.set()
        for t in self.threads:
            t.join(STREAM_TIMEOUT_S + 10)
        return self.tally


@pytest.fixture(scope="module")
def lab(shared_lab):
    """The e2e modules' shared lab (tests/e2e/conftest.py), as a fresh lab holds it."""
    cfg, token = shared_lab
    story = Story(cfg, token)
    yield cfg, story
    story.api.close()
    story.agent.close()


def test_every_removal_drains_and_no_stream_is_cut(lab):
    cfg, story = lab
    api = story.api
    assert api.post("/api/ai/models", json={"name": DEP, "source": LAB_MODEL_SOURCE}).status_code == 201
    assert api.post("/api/ai/profiles", json={"name": PROFILE, "runtime": "vllm", "cpu": 1, "memory_gib": 1,
                                              "gpu": {"count": 1, "vram_gib": 24}}).status_code == 201
    assert api.post("/api/ai/deployments", json={"name": DEP, "model": DEP, "profile": PROFILE,
                                                 "replicas": 3}).status_code == 201
    assert api.post("/api/ai/endpoints", json={"name": EP, "deployment": DEP, "routing": "equal"}).status_code == 201

    def replicas() -> list[dict]:
        return api.get(f"/api/ai/deployments/{DEP}/metrics").json()["replicas"]

    def settled(n: int) -> bool:
        reps = replicas()
        return len(reps) == n and all(r["ready"] and not r["draining"] for r in reps)

    wait_for(lambda: settled(3), 120, "3 ready replicas")
    vip = wait_for(lambda: api.get(f"/api/ai/endpoints/{EP}").json()["status"].get("vip"), 60, "a VIP")
    story.vip = vip
    wait_for(lambda: len(story.maglev() or {}) == 3, 60, "3 backends in the BPF maps")
    created = api.post("/api/ai/keys", json={"name": "nodrop-key", "endpoint": EP})
    assert created.status_code in (200, 201), created.text
    key = created.json().get("key") or created.json().get("api_key") or created.json().get("secret")
    verify = ssl.create_default_context(cafile=str(cfg.ca))
    gw_url = f"{cfg.gateway_url}/api/ai/openai/{EP}/v1/chat/completions"

    vip_load = VipStreams(cfg.topology.client_ns, vip)
    gw_load = GatewayStreams(gw_url, key, verify)
    phases: dict[str, float] = {"t0": round(time.monotonic(), 1)}
    try:
        time.sleep(3)  # streams in flight on every replica
        t0 = time.monotonic()
        # 1. scale-in: the two drained replicas hold streams when the drain starts
        assert api.post(f"/api/ai/deployments/{DEP}/scale", json={"replicas": 1}).status_code in (200, 202)
        wait_for(lambda: settled(1), 120, "scale-in to 1 replica")
        phases["scale_in_s"] = round(time.monotonic() - t0, 1)
        phases["rollout_at"] = round(time.monotonic(), 1)

        # 2. a canary rollout to revision 2, then promote: revision 1's replica drains away
        t0 = time.monotonic()
        assert api.post(f"/api/ai/deployments/{DEP}/revisions", json={"engine_args": ["--enforce-eager"]}
                        ).status_code == 201
        r = api.post(f"/api/ai/deployments/{DEP}/rollouts", json={
            "strategy": "canary", "steps": [{"percent": 50, "secs": 3600}, {"percent": 100}]})
        assert r.status_code == 201, r.text
        rollout = r.json()["id"]
        wait_for(lambda: api.get(f"/api/ai/explain/rollout/{DEP}").json().get("rollout", {}).get("share") == 50,
                 120, "the canary at 50 %")
        time.sleep(3)  # streams on both revisions
        assert api.post(f"/api/ai/deployments/{DEP}/rollouts/{rollout}/promote").status_code == 200
        wait_for(lambda: api.get(f"/api/ai/deployments/{DEP}/rollouts/{rollout}").json()["phase"] == "Succeeded",
                 120, "the rollout to succeed")
        wait_for(lambda: settled(1) and all(r.get("revision", 2) == 2 for r in
                                            api.get("/api/ai/replicas", params={"deployment": DEP}).json()),
                 120, "only revision 2 left")
        phases["rollout_s"] = round(time.monotonic() - t0, 1)
        phases["health_at"] = round(time.monotonic(), 1)

        # 3. health failure of one replica (its engine still streams): it drains, a replacement starts
        t0 = time.monotonic()
        assert api.post(f"/api/ai/deployments/{DEP}/scale", json={"replicas": 2}).status_code in (200, 202)
        wait_for(lambda: settled(2), 120, "2 ready replicas")
        wait_for(lambda: len([w for w in (story.maglev() or {}).values() if w]) == 2, 60, "2 weighted backends")
        time.sleep(3)
        victim = replicas()[0]
        httpx.post(f"http://{victim['host']}:{victim['port']}/sim/faults", json={"fail_health": True},
                   timeout=5).raise_for_status()
        wait_for(lambda: victim["replica_id"] not in {r["replica_id"] for r in replicas()} and settled(2), 120,
                 "the failing replica drained away and replaced")
        phases["health_failure_s"] = round(time.monotonic() - t0, 1)
        phases["delete_at"] = round(time.monotonic(), 1)
        time.sleep(3)

        # 4. deletion: the loads stop starting calls, then the endpoint (its VIP drains) and the
        #    deployment (its replicas drain) go while the calls in flight must finish whole
        t0 = time.monotonic()
        vip_load.proc.stdin.close()
        gw_load.halt.set()
        assert api.delete(f"/api/ai/endpoints/{EP}").status_code in (200, 202)
        assert api.get(f"/api/ai/endpoints/{EP}").json()["status"]["phase"] == "Deleting"
        assert api.delete(f"/api/ai/deployments/{DEP}").status_code in (200, 202)
        wait_for(lambda: api.get(f"/api/ai/deployments/{DEP}").status_code == 404, 120, "the deployment gone")
        wait_for(lambda: api.get(f"/api/ai/endpoints/{EP}").status_code == 404, 120, "the endpoint gone")
        wait_for(lambda: story.maglev() is None, 60, "the VIP's service gone")
        phases["delete_s"] = round(time.monotonic() - t0, 1)
    finally:
        vip_tally, gw_tally = vip_load.stop(), gw_load.stop()
    print(json.dumps({"vip_streams_ok": vip_tally.ok, "vip_bad": vip_tally.bad, "gateway_streams_ok": gw_tally.ok,
                      "gateway_bad": gw_tally.bad, **phases}))
    assert vip_tally.ok > 0 and gw_tally.ok > 0
    assert vip_tally.bad == [], vip_tally.bad  # 0 truncated, 0 errors through the VIP
    assert gw_tally.bad == [], gw_tally.bad  # and through the gateway
