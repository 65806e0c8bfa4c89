"""Bring the whole lab cluster up and down: topology, fabricd, one agent, one gateway.

`up` refuses a lab that is up (`LabIsUp`: live processes of its state directory, or a listener
on fabricd's port), since cleaning would wipe every deployment, endpoint, key and tenant in it;
``force=True`` takes it down first. Otherwise it cleans what a crashed run left (stale namespaces,
links, pinned maps, processes), then builds the topology, initialises fabricd's state, issues the node's certificate from the
cluster CA, starts the three processes, waits until each answers, logs in and writes
``{state}/env`` with FABRIC_URL, FABRIC_TOKEN and FABRIC_CA for the operator's shell.
"""

from __future__ import annotations

import json
import os
import secrets
import shlex
import shutil
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from common.pki import ROLE_GATEWAY, ROLE_NODE, ensure_ca, issue_cert, pki_dir
from common.private_fs import private_dir, write_private
from lab import processes
from lab.topology import LabTopology, leftovers
from lab.topology import down as topo_down
from lab.topology import up as topo_up

NODE_ID = "lab-node-0"
DEFAULT_STATE = Path("/var/lib/fabric/lab")


def lab_state_dir(env: dict[str, str] | None = None) -> Path:
    """Where the lab lives, the same from every directory: $FABRIC_LAB_STATE (made absolute),
    else /var/lib/fabric/lab."""
    env = dict(os.environ) if env is None else env
    return Path(env["FABRIC_LAB_STATE"]).expanduser().resolve() if env.get("FABRIC_LAB_STATE") else DEFAULT_STATE




def env_file_text(op_env: dict[str, str], bin_dir: str) -> str:
    """The operator's `source`-able environment: the venv's bin first on PATH, so `fabricctl` is
    the one this lab runs, then FABRIC_URL, FABRIC_TOKEN and FABRIC_CA (values shell-quoted)."""
    lines = [f"export PATH={shlex.quote(bin_dir)}:\"$PATH\"\n"]
    lines += [f"export {k}={shlex.quote(v)}\n" for k, v in op_env.items()]
    return "".join(lines)


# The lab's model: a tiny safetensors model the lab's loopback HF mirror serves under this name.
LAB_MODEL_REPO = "fabric-lab/tiny-chat"
LAB_MODEL_SOURCE = f"hf://{LAB_MODEL_REPO}"
LAB_ADAPTER_REPO = "fabric-lab/tiny-chat-sql-lora"  # a LoRA adapter of the lab model (docs/models.md)
LAB_ADAPTER_SOURCE = f"hf://{LAB_ADAPTER_REPO}"


@dataclass(frozen=True)
class LabConfig:
    state_dir: Path
    api_port: int = 8443
    agent_port: int = 9443
    gateway_port: int = 8444
    mirror_port: int = 8445
    gpus: int = 8
    gpu_name: str = "h100"
    pin_dir: Path = Path("/sys/fs/bpf/fabric-lab")
    reconcile_secs: float = 2.0
    routing_secs: float = 2.0
    autoscale_secs: float = 15.0
    topology: LabTopology = field(default_factory=LabTopology)
    # fabricd's and the gateway's store: None is SQLite in the state dir; "etcd://A,B,C" an etcd
    # cluster someone else runs (the chaos run's), so a second fabricd and gateway can join it.
    store: str | None = None
    # how each process kind ("fabricd", "gateway") reaches that etcd: its FABRIC_ETCD_* (TLS
    # files and login, docs/store.md); empty for SQLite
    store_env: dict[str, dict[str, str]] = field(default_factory=dict, hash=False, compare=False)
    # the agent's connection-table size (None: the dataplane's default, 1Mi entries)
    flow_entries: int | None = None
    # what a replica of runtime vllm runs: "sim" (fabric-engine-sim) or "vllm" (the real engine,
    # scripts/setup-engine.sh); the agent's FABRIC_LAB_ENGINE (agent/vm/lab_engine.py)
    engine: str = "sim"

    @property
    def scrape_timeout_secs(self) -> float:
        """fabricd's deadline for one /metrics scrape and one health probe: a real CPU engine busy generating on a shared
        2-core machine can take several seconds to render its page (seen: 4-30 s under load), and a
        missed scrape takes the replica out of the Maglev map for that tick (three missed probes
        replace it); the simulator answers
        in milliseconds, so it keeps fabricd's default."""
        return 10.0 if self.engine == "vllm" else 2.0

    @property
    def drain_grace_secs(self) -> float:
        """How long a drained replica may finish its streams: a CPU engine generates 100-400 tokens/s
        on this machine, so a long stream outlasts fabricd's 30 s default under load."""
        return 120.0 if self.engine == "vllm" else 30.0

    @property
    def fabricd_dir(self) -> Path:
        return self.state_dir / "fabricd"

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.api_port}"

    @property
    def mirror_url(self) -> str:
        return f"http://127.0.0.1:{self.mirror_port}"

    @property
    def gateway_url(self) -> str:
        return f"https://127.0.0.1:{self.gateway_port}"

    @property
    def ca(self) -> Path:
        return pki_dir(self.fabricd_dir) / "ca.crt"

    def console_hint(self) -> str:
        """Where the web console is and how to sign in (password files, never the passwords)."""
        return (f"console: {self.url}/app/ai  login admin (password in {self.fabricd_dir / 'admin-password'}) "
                f"or read-only viewer ({self.fabricd_dir / 'viewer-password'}); the certificate is from {self.ca}")


@dataclass(frozen=True)
class LabHandle:
    config: LabConfig
    token: str
    env: dict[str, str]


def _wait_http(url: str, ca: Path, what: str, timeout: float = 60.0, log: Path | None = None) -> None:
    ctx = ssl.create_default_context(cafile=str(ca))
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        try:
            r = httpx.get(url, verify=ctx, timeout=2.0)
            if r.status_code < 500:
                return
            last = f"HTTP {r.status_code}"
        except httpx.HTTPError as exc:
            last = str(exc)
        time.sleep(0.3)
    tail = log.read_text()[-2000:] if log and log.exists() else ""
    raise RuntimeError(f"{what} did not answer at {url} within {timeout:.0f}s ({last})\n{tail}")


def _wait_plain_http(url: str, what: str, timeout: float = 30.0, log: Path | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    tail = log.read_text()[-2000:] if log and log.exists() else ""
    raise RuntimeError(f"{what} did not answer at {url} within {timeout:.0f}s\n{tail}")


@contextmanager
def mirror_socket(port: int) -> Iterator[socket.socket]:
    """A listening socket on 127.0.0.1:port bound by the lab (RuntimeError naming the holder when
    the port is taken); the mirror process inherits it, the lab's copy closes after the start."""
    from common.port_holder import busy

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(("127.0.0.1", port))
    except OSError:
        sock.close()
        raise RuntimeError(f"the lab's HF mirror port: {busy('127.0.0.1', port) or f'127.0.0.1:{port} is taken'}; "
                           "free it or set another mirror port") from None
    sock.listen(64)
    try:
        yield sock
    finally:
        sock.close()


def service_env(cfg: LabConfig, process: str) -> dict[str, str]:
    """The environment of the lab's fabricd or gateway (`process`): what they share, and the
    store login of that process kind."""
    t = cfg.topology
    return {
        **cfg.store_env.get(process, {}),
        "FABRIC_ADDRESS_POOL": t.vip_pool,
        "FABRIC_KEY_HMAC_SECRET_FILE": str(cfg.state_dir / "key-hmac-secret"),
        "FABRIC_RECONCILE_SECS": str(cfg.reconcile_secs),
        "FABRIC_ROUTING_SECS": str(cfg.routing_secs),
        "FABRIC_AUTOSCALE_SECS": str(cfg.autoscale_secs),
        "FABRIC_SCRAPE_TIMEOUT_SECS": str(cfg.scrape_timeout_secs),
        "FABRIC_HEALTH_TIMEOUT_SECS": str(cfg.scrape_timeout_secs),  # /health waits behind the same busy loop
        "FABRIC_DRAIN_GRACE_SECS": str(cfg.drain_grace_secs),
        "PYTHONUNBUFFERED": "1",
    }


class LabIsUp(RuntimeError):
    """`up` found the lab running; cleaning first would wipe its store. ``signs`` say what is live."""

    def __init__(self, signs: list[str]):
        self.signs = signs
        super().__init__("the lab is up; 'fabric-lab down' first, or --force  (" + "; ".join(signs) + ")")


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def up_signs(cfg: LabConfig) -> list[str]:
    """What says this lab is up, [] if nothing: a live process of its state directory (from the pid
    files or a command line naming the directory: a directory alone proves nothing, a crashed run
    leaves one), or something answering on fabricd's port (a lab started from another state directory)."""
    signs = []
    if cfg.state_dir.exists():
        names = {}
        for pidfile in (cfg.state_dir / "pids").glob("*.pid") if (cfg.state_dir / "pids").exists() else []:
            try:
                names[int(pidfile.read_text().strip())] = pidfile.stem
            except ValueError:
                pass
        signs += [f"{names.get(pid, 'process')} pid {pid}" for pid in processes.running(cfg.state_dir)]
    if not signs and _listening(cfg.api_port):
        signs.append(f"something listens on fabricd's port {cfg.api_port}")
    return signs


def down(cfg: LabConfig) -> list[str]:
    """Stop processes, remove namespaces, links and pinned maps. Safe to run any time."""
    removed = [f"process {p}" for p in processes.stop_all(cfg.state_dir)] if cfg.state_dir.exists() else []
    removed += topo_down(cfg.topology)
    if cfg.pin_dir.exists():
        shutil.rmtree(cfg.pin_dir, ignore_errors=True)
        removed.append(f"pins {cfg.pin_dir}")
    return removed


def status(cfg: LabConfig) -> list[str]:
    left = leftovers(cfg.topology)
    if cfg.state_dir.exists():
        left += [f"process {p}" for p in processes.running(cfg.state_dir)]
    if cfg.pin_dir.exists():
        left.append(f"pins {cfg.pin_dir}")
    return left


def fabricd_command(cfg: LabConfig, state_dir: Path, port: int) -> list[str]:
    store = ["--store", cfg.store] if cfg.store else []
    return [processes.bin_path("fabricd"), "serve", "--state-dir", str(state_dir),
            "--listen", f"127.0.0.1:{port}", *store]


def gateway_command(cfg: LabConfig, port: int, gateway_id: str | None = None) -> list[str]:
    extra = (["--store", cfg.store] if cfg.store else []) + (["--gateway-id", gateway_id] if gateway_id else [])
    return [processes.bin_path("fabric-gateway"), "serve", "--state-dir", str(cfg.fabricd_dir),
            "--listen", f"127.0.0.1:{port}", *extra]


def kv_index_env(cfg: LabConfig) -> dict[str, str]:
    """The gateway's client certificate for the agents' KV index (CN fabric-gateway, which the
    agents admit on /v1/kv-index* only), so prefix endpoints route precisely (docs/kv-events.md)."""
    crt, key = issue_cert(cfg.fabricd_dir, "fabric-gateway", server=False, client=True, role=ROLE_GATEWAY)
    return {"FABRIC_GATEWAY_KV_CLIENT_CERT": str(crt), "FABRIC_GATEWAY_KV_CLIENT_KEY": str(key),
            "FABRIC_GATEWAY_KV_CA": str(cfg.ca)}


def agent_command(cfg: LabConfig) -> list[str]:
    t = cfg.topology
    cmd = [
        processes.bin_path("fabric-agent"), "serve", "--node-id", NODE_ID,
        "--listen", f"127.0.0.1:{cfg.agent_port}", "--control-plane", cfg.url,
        "--state-dir", str(cfg.state_dir / "agent"), "--pki-dir", str(cfg.state_dir / "agent-pki"),
        "--vm-driver", "lab", "--fake-gpus", str(cfg.gpus), "--fake-gpu-name", cfg.gpu_name,
        "--pin-dir", str(cfg.pin_dir), "--dataplane-netns", t.node_ns,
        "--lab-netns", t.node_ns, "--lab-bridge", t.bridge, "--lab-subnet", t.replica_subnet,
        "--lab-gateway", t.bridge_addr, "--heartbeat-secs", "2",
        # A simulated 8-GPU server offers the CPU and memory such a server would.
        "--cpus", "128", "--memory-gib", "1024",
        # The lab's one site, named like its failure domain, so node list and capacity show it.
        "--site", "default",
    ]
    for iface in t.xdp_ifaces:
        cmd += ["--dataplane-iface", iface]
    if cfg.flow_entries:
        cmd += ["--flow-entries", str(cfg.flow_entries)]
    return cmd


def start_agent(cfg: LabConfig) -> int:
    """Start (or start again, after a crash) the lab's agent; its pid. The agent downloads
    models from the lab's mirror (HF_ENDPOINT, the library's own setting)."""
    return processes.start(cfg.state_dir, "agent", agent_command(cfg),
                           {"PYTHONUNBUFFERED": "1", "HF_ENDPOINT": cfg.mirror_url, "FABRIC_LAB_ENGINE": cfg.engine,
                            # it scrapes its engines as often as the lab routes (agent.engine_watch),
                            # with fabricd's deadline: a real engine's busy loop answers late
                            "FABRIC_OBSERVE_SECS": str(max(1.0, cfg.routing_secs)),
                            "FABRIC_SCRAPE_TIMEOUT_SECS": str(cfg.scrape_timeout_secs)})


def up(cfg: LabConfig, echo=print, force: bool = False) -> LabHandle:
    signs = up_signs(cfg)
    if signs and not force:
        raise LabIsUp(signs)
    down(cfg)
    # A lab starts from nothing: the store, certificates and records of an earlier run go too.
    shutil.rmtree(cfg.state_dir, ignore_errors=True)
    private_dir(cfg.state_dir)
    t = cfg.topology
    echo(f"lab: network namespaces {t.node_ns} (XDP on {', '.join(t.xdp_ifaces)}, bridge {t.bridge}) "
         f"and {t.client_ns}")
    topo_up(t)
    env = service_env(cfg, "fabricd")
    secret = cfg.state_dir / "key-hmac-secret"
    if not secret.exists():
        write_private(secret, secrets.token_hex(32))
    fd = cfg.fabricd_dir
    subprocess.run([processes.bin_path("fabricd"), "init", "--state-dir", str(fd)], check=True,
                   capture_output=True, env={**env})
    ensure_ca(fd)
    node_pki = cfg.state_dir / "agent-pki"
    private_dir(node_pki)
    crt, key = issue_cert(fd, NODE_ID, server=True, client=True, role=ROLE_NODE, hosts=["127.0.0.1", "localhost"])
    shutil.copy(crt, node_pki / f"{NODE_ID}.crt")
    shutil.copy(key, node_pki / f"{NODE_ID}.key")
    shutil.copy(cfg.ca, node_pki / "ca.crt")

    # The agent starts first: compiling the BPF program is most of a lab's start (seconds of one
    # CPU), and fabricd and the mirror start beside it. The agent heartbeats until fabricd
    # answers (every --heartbeat-secs) and downloads from the mirror only when a replica is placed.
    engine = "the real vLLM engine (CPU build)" if cfg.engine == "vllm" else "fabric-engine-sim"
    echo(f"lab: starting fabric-agent {NODE_ID} (lab VM driver, {cfg.gpus} simulated {cfg.gpu_name} GPUs, "
         f"replicas run {engine})")
    start_agent(cfg)

    echo(f"lab: starting fabricd on {cfg.url}")
    # the console's playground calls the lab's gateway, verified with the lab's CA
    console = {"FABRIC_CONSOLE_GATEWAY_URL": cfg.gateway_url, "FABRIC_CONSOLE_GATEWAY_CA": str(cfg.ca)}
    processes.start(cfg.state_dir, "fabricd", fabricd_command(cfg, fd, cfg.api_port), {**env, **console})

    echo(f"lab: starting a Hugging Face mirror on {cfg.mirror_url} serving {LAB_MODEL_REPO}")
    # The lab binds the mirror's port itself and hands the socket over: a 200 from whatever else
    # listens on a fixed port is never taken for the mirror (the agent would fetch weights from it).
    with mirror_socket(cfg.mirror_port) as sock:
        processes.start(cfg.state_dir, "hf-mirror", [
            sys.executable, "-m", "lab.hf_mirror", "serve", "--root", str(cfg.state_dir / "hf-mirror"),
            "--listen-fd", str(sock.fileno()), "--tiny", LAB_MODEL_REPO, "--tiny-adapter", LAB_ADAPTER_REPO],
            {"PYTHONUNBUFFERED": "1"}, pass_fds=(sock.fileno(),))
    _wait_http(f"{cfg.url}/openapi.json", cfg.ca, "fabricd", log=cfg.state_dir / "logs" / "fabricd.log")
    _wait_plain_http(f"{cfg.mirror_url}/api/models/{LAB_MODEL_REPO}", "the HF mirror",
                     log=cfg.state_dir / "logs" / "hf-mirror.log")

    echo(f"lab: starting fabric-gateway on {cfg.gateway_url}")
    processes.start(cfg.state_dir, "gateway", gateway_command(cfg, cfg.gateway_port),
                    {**service_env(cfg, "gateway"), **kv_index_env(cfg)})

    password = (fd / "admin-password").read_text().strip()
    ctx = ssl.create_default_context(cafile=str(cfg.ca))
    r = httpx.post(f"{cfg.url}/api/auth/login", json={"username": "admin", "password": password},
                   verify=ctx, timeout=10)
    r.raise_for_status()
    token = r.json()["token"]
    _wait_http(f"{cfg.gateway_url}/metrics", cfg.ca, "fabric-gateway", log=cfg.state_dir / "logs" / "gateway.log")
    _wait_node(cfg, token)
    op_env = {"FABRIC_URL": cfg.url, "FABRIC_TOKEN": token, "FABRIC_CA": str(cfg.ca)}
    write_private(cfg.state_dir / "env", env_file_text(op_env, str(Path(processes.bin_path("fabricctl")).parent)))
    write_private(cfg.state_dir / "lab.json", json.dumps({"gateway": cfg.gateway_url, "engine": cfg.engine, **op_env}))
    return LabHandle(cfg, token, op_env)


def _wait_node(cfg: LabConfig, token: str, timeout: float = 60.0) -> None:
    ctx = ssl.create_default_context(cafile=str(cfg.ca))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            r = httpx.get(f"{cfg.url}/api/ai/nodes/{NODE_ID}", headers={"Authorization": f"Bearer {token}"},
                          verify=ctx, timeout=2)
            if r.status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    log = cfg.state_dir / "logs" / "agent.log"
    raise RuntimeError(f"node {NODE_ID} did not register within {timeout:.0f}s\n"
                       + (log.read_text()[-3000:] if log.exists() else ""))
