"""The newcomer's demo: drive the lab with the same fabricctl an operator types, and show it work.

Every step prints the command it runs and that command's real output. Waits are bounded and
say what they wait for; a step that fails stops the demo with the reason. The demo can run
again on the same lab: an object it made before is reused (and its replica count set back),
and its key, whose secret cannot be shown twice, is rotated to get a fresh secret.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import time

from lab import processes
from lab.cluster import LAB_ADAPTER_SOURCE, LAB_MODEL_SOURCE, NODE_ID, LabConfig, write_private

MODEL, PROFILE, ROUTING = "demo-llm", "lab-h100", "least_queue"
ADAPTER = "demo-sql"  # a LoRA adapter of MODEL: a model name for clients, loaded on demand
ENDPOINT = f"{MODEL}-openai"


class DemoError(RuntimeError):
    pass


def _env(cfg: LabConfig) -> dict[str, str]:
    path = cfg.state_dir / "lab.json"
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise DemoError(f"the lab is not up ({path} is missing); run `fabric-lab up` first") from None
    except (OSError, ValueError) as exc:
        raise DemoError(f"cannot read {path}: {exc}; run `fabric-lab up` again") from None
    return {**os.environ, "FABRIC_URL": data["FABRIC_URL"], "FABRIC_TOKEN": data["FABRIC_TOKEN"],
            "FABRIC_CA": data["FABRIC_CA"]}


def lab_engine_of(cfg: LabConfig) -> str:
    """The engine the running lab's replicas run (lab.json, written by up), else the config's."""
    try:
        return json.loads((cfg.state_dir / "lab.json").read_text()).get("engine") or cfg.engine
    except (OSError, ValueError):
        return cfg.engine


def ctl(cfg: LabConfig, *args: str, echo=print, quiet: bool = False) -> str:
    cmd = [processes.bin_path("fabricctl"), "ai", *args]
    if not quiet:
        echo(f"\n$ fabricctl ai {' '.join(shlex.quote(a) for a in args)}")
    res = subprocess.run(cmd, capture_output=True, text=True, env=_env(cfg), timeout=60)
    if res.returncode != 0:
        raise DemoError(f"fabricctl ai {' '.join(args)} failed: {res.stderr.strip() or res.stdout.strip()}")
    if not quiet:
        echo(res.stdout.rstrip())
    return res.stdout


def ctl_json(cfg: LabConfig, *args: str) -> dict | list:
    return json.loads(ctl(cfg, *args, "--json", quiet=True))


def exists(cfg: LabConfig, kind: str, name: str) -> dict | None:
    """The object if the lab already has it (from an earlier demo), else None."""
    res = subprocess.run([processes.bin_path("fabricctl"), "ai", kind, "show", name, "-o", "json"],
                         capture_output=True, text=True, env=_env(cfg), timeout=60)
    if res.returncode == 0:
        return json.loads(res.stdout)
    if "not found" in res.stderr or "no key" in res.stderr:
        return None
    raise DemoError(f"fabricctl ai {kind} show {name} failed: {res.stderr.strip()}")


def ensure(cfg: LabConfig, kind: str, name: str, *create: str, echo=print) -> dict | None:
    """Run the create command unless the object exists; say which."""
    found = exists(cfg, kind, name)
    if found is None:
        ctl(cfg, *create, echo=echo)
    else:
        echo(f"\n$ fabricctl ai {' '.join(shlex.quote(a) for a in create)}\n(already there from an earlier demo: reused)")
    return found


def wait_for(what: str, check, timeout: float, echo=print, every: float = 1.0):
    echo(f"... waiting for {what}")
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(every)
    raise DemoError(f"timed out after {timeout:.0f}s waiting for {what}")


def in_client_ns(cfg: LabConfig, cmd: list[str], timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", "netns", "exec", cfg.topology.client_ns, *cmd], capture_output=True,
                          text=True, timeout=timeout)


def chat_body(content: str = "Say hello to Fabric", model: str = MODEL) -> str:
    return json.dumps({"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": 12})


def run_demo(cfg: LabConfig, echo=print) -> dict:
    engine = lab_engine_of(cfg)
    echo("\n== 1. The node registers with its simulated GPUs")
    ctl(cfg, "node", "list", echo=echo)
    ctl(cfg, "gpus", echo=echo)

    echo("\n== 2. A model with a LoRA adapter: registered, then both downloaded from the lab's HF mirror and "
         "verified on the node")
    ensure(cfg, "model", MODEL, "model", "add", MODEL, "--source", LAB_MODEL_SOURCE,
           "--adapter", f"{ADAPTER}={LAB_ADAPTER_SOURCE}", echo=echo)
    ctl(cfg, "model", "status", MODEL, echo=echo)
    ctl(cfg, "model", "materialize", MODEL, "--wait", echo=echo)
    ctl(cfg, "model", "jobs", echo=echo)

    echo("\n== 3. A profile and a deployment of 3 replicas (their VMs mount the verified model)")
    ensure(cfg, "profile", PROFILE, "profile", "add", PROFILE, "--runtime", "vllm", "--gpu", "1", "--vram", "24",
           "--cpu", "1", "--memory", "1", echo=echo)
    dep = ensure(cfg, "deployment", MODEL, "deploy", MODEL, "--profile", PROFILE, "--replicas", "3", echo=echo)
    if dep is not None and dep.get("replicas") != 3:
        ctl(cfg, "deployment", "scale", MODEL, "--replicas", "3", echo=echo)
    # Real vLLM engines (the lab's default when installed) take 30-60 s each to answer /health on
    # 2 cores, and three start at once; the simulator is Ready in seconds.
    wait_for("3 ready replicas", lambda: ctl_json(cfg, "deployment", "show", MODEL)["status"]["ready_replicas"] >= 3,
             420 if engine == "vllm" else 120, echo)
    ctl(cfg, "deployment", "show", MODEL, echo=echo)

    echo(f"\n== 4. An OpenAI endpoint with {ROUTING} routing gets a VIP")
    ensure(cfg, "endpoint", ENDPOINT, "endpoint", "expose", MODEL, "--openai-compatible", "--routing", ROUTING,
           echo=echo)
    vip = wait_for("a VIP and live Maglev weights",
                   lambda: (ctl_json(cfg, "endpoint", "show", ENDPOINT).get("status") or {}).get("vip"), 60, echo)
    port = ctl_json(cfg, "endpoint", "show", ENDPOINT).get("port", 8000)

    echo("\n== 5. An API key for the gateway")
    if exists(cfg, "key", "demo-key") is None:
        key_out = ctl_json(cfg, "key", "create", "demo-key", "--endpoint", ENDPOINT)
    else:  # its secret was shown once, by the earlier demo: rotate for a fresh one
        key_out = ctl_json(cfg, "key", "rotate", "demo-key", "--overlap-secs", "0")
    key = key_out.get("key") or key_out.get("api_key") or key_out.get("secret")
    echo(f"created key {key_out.get('id', '')} (the secret is shown once; kept in {cfg.state_dir / 'demo-key'})")
    write_private(cfg.state_dir / "demo-key", key)

    echo("\n== 6. A chat completion through the Maglev VIP from the client namespace (no key)")
    curl = ["curl", "-s", "--max-time", "20", f"http://{vip}:{port}/v1/chat/completions",
            "-H", "content-type: application/json", "-d", chat_body(), "-D", "-"]
    echo(f"$ ip netns exec {cfg.topology.client_ns} curl -s http://{vip}:{port}/v1/chat/completions ...")
    def vip_answer():
        r = in_client_ns(cfg, curl)
        return r if r.returncode == 0 and " 200" in r.stdout else None

    res = wait_for("the VIP to answer", vip_answer, 30, echo)
    echo(_short_response(res.stdout))

    echo("\n== 7. The same through the authenticated gateway with the key")
    gw = f"{cfg.gateway_url}/api/ai/openai/{ENDPOINT}/v1/chat/completions"
    echo(f"$ curl --cacert $FABRIC_CA {gw} -H 'Authorization: Bearer fvai_...' ...")
    res = subprocess.run(["curl", "-s", "--max-time", "20", "--cacert", str(cfg.ca), gw, "-D", "-",
                          "-H", f"Authorization: Bearer {key}", "-H", "content-type: application/json",
                          "-d", chat_body()], capture_output=True, text=True, timeout=30)
    if " 200" not in res.stdout:
        raise DemoError(f"gateway call failed: {res.stdout[-500:]} {res.stderr[-300:]}")
    echo(_short_response(res.stdout))
    if any(a.get("name") == ADAPTER for a in ctl_json(cfg, "model", "show", MODEL).get("adapters") or []):
        echo(f"\n$ curl ... -d '{{\"model\": \"{ADAPTER}\", ...}}'   (the LoRA adapter: the replica loads it "
             "from the files the node fetched, seen at /adapters)")
        res = subprocess.run(["curl", "-s", "--max-time", "20", "--cacert", str(cfg.ca), gw, "-D", "-",
                              "-H", f"Authorization: Bearer {key}", "-H", "content-type: application/json",
                              "-d", chat_body(model=ADAPTER)], capture_output=True, text=True, timeout=30)
        if " 200" not in res.stdout:
            raise DemoError(f"the adapter call failed: {res.stdout[-500:]} {res.stderr[-300:]}")
        echo(_short_response(res.stdout))

    echo("\n== 8. The endpoint with its live weights")
    ctl(cfg, "endpoint", "show", ENDPOINT, echo=echo)

    show_engine(cfg, engine, echo)

    echo(yours(cfg, vip, port))
    return {"vip": vip, "port": port, "key": key}


def yours(cfg: LabConfig, vip: str, port: int) -> str:
    """The demo's closing hints: how to reach what it made."""
    env_file = cfg.state_dir / "env"
    return f"""
== The lab is yours
  Operator shell:   source {env_file}; fabricctl ai endpoint show {ENDPOINT}
  Direct VIP (L4):  sudo ip netns exec {cfg.topology.client_ns} curl http://{vip}:{port}/v1/models
  Gateway (L7):     OPENAI_BASE_URL={cfg.gateway_url}/api/ai/openai/{ENDPOINT}/v1 \\
                    OPENAI_API_KEY=$(cat {cfg.state_dir / 'demo-key'}) SSL_CERT_FILE={cfg.ca} python your_client.py
  Put load on it:   scripts/lab-load --state-dir {cfg.state_dir} --replica 0 --queue 40
                    then watch: watch -n2 fabricctl ai endpoint show {ENDPOINT}
  Explain routing:  fabricctl ai explain routing {ENDPOINT}   (or GET /api/ai/explain/routing/{ENDPOINT})
  Node:             {NODE_ID}; logs under {cfg.state_dir / 'logs'}
"""


# The engine's own metric families Fabric routes, scales and bills on (common/engine_metrics/names.py).
ENGINE_FAMILIES = ("vllm:num_requests_running{", "vllm:num_requests_waiting{", "vllm:kv_cache_usage_perc{",
                   "vllm:prompt_tokens_total{", "vllm:generation_tokens_total{", "vllm:prefix_cache_queries_total{",
                   "vllm:prefix_cache_hits_total{")


def show_engine(cfg: LabConfig, engine: str, echo=print) -> None:
    """One replica's engine as a guest runs it: its processes in the replica's namespace (the real
    `vllm serve` with the guest's command line, or fabric-engine-sim) and a few of its own metrics."""
    reps = [r for r in ctl_json(cfg, "replica", "list", "--deployment", MODEL) if r.get("host")]
    if not reps:
        return
    rep = sorted(reps, key=lambda r: r.get("ordinal", 0))[0]
    what = "the real vLLM engine (CPU build)" if engine == "vllm" else "the engine simulator"
    echo(f"\n== 9. Inside replica {rep['replica_id']}: {what}, its processes and its own metrics")
    ns = f"{cfg.topology.prefix}r-{rep['replica_id']}"
    echo(f"$ ps -o pid,rss,args $(ip netns pids {ns})")
    pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True, timeout=10).stdout.split()
    if pids:
        ps = subprocess.run(["ps", "-o", "pid,rss,args", "-p", ",".join(pids)], capture_output=True, text=True,
                            timeout=10).stdout
        echo("\n".join(line if len(line) <= 600 else line[:597] + "..." for line in ps.rstrip().splitlines()))
    url = f"http://{rep['host']}:{rep.get('port', 8000)}/metrics"
    echo(f"\n$ curl -s {url} | grep -E '^vllm:(num_requests|kv_cache_usage|prompt_tokens|generation_tokens|"
         "prefix_cache)'")
    res = subprocess.run(["curl", "-s", "--max-time", "30", url], capture_output=True, text=True, timeout=40)
    echo("\n".join(line for line in res.stdout.splitlines() if line.startswith(ENGINE_FAMILIES)))


def show_state(cfg: LabConfig, echo=print) -> None:
    """What the demo made, as it stands now (for `make run` on a lab that is already up)."""
    echo("\n== The demo's objects as they stand")
    ctl(cfg, "node", "list", echo=echo)
    ctl(cfg, "deployment", "list", echo=echo)
    ctl(cfg, "endpoint", "list", echo=echo)
    ep = exists(cfg, "endpoint", ENDPOINT)
    vip = ((ep or {}).get("status") or {}).get("vip")
    if vip:
        echo(yours(cfg, vip, ep.get("port", 8000)))
    else:
        echo(f"\n(no endpoint {ENDPOINT} with a VIP yet: `fabric-lab demo` makes the demo's objects)")


def _short_response(raw: str) -> str:
    head, _, body = raw.replace("\r\n", "\n").partition("\n\n")
    status = head.splitlines()[0] if head else ""
    replica = next((line for line in head.splitlines() if line.lower().startswith("x-fabric-replica")), "")
    try:
        content = json.loads(body)["choices"][0]["message"]["content"]
    except (ValueError, KeyError, IndexError, TypeError):
        content = body[:200]
    return f"{status}  {replica}\n  assistant: {content}"
