"""Real `fabricd` (controllers on) and real `fabric-agent` (dry-run driver, fake GPUs) processes
on loopback, for the orchestration integration tests. Plain HTTP on loopback (--insecure both
sides), the lab's all-in-one mode; each replica is a real fabric-engine-sim process.
``Cluster.kill_fabricd()`` / ``Cluster.start_fabricd()`` restart the control plane on the same
state directory and port while the agent and its engines keep running."""

from __future__ import annotations

import functools
import json
import signal
import subprocess
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from agent.vm.dryrun_driver import DryRunDriver
from lab.hf_mirror import HfMirror, MirrorConfig
from lab.rigs.polling import clean_env, wait_for
from lab.rigs.servers import free_port
from lab.tiny_model import write_tiny_model
from tests.support.fabricd_init import init_state

BIN = Path(sys.executable).parent
MIRRORED_REPOS = ("Qwen/Qwen3-8B", "Qwen/Qwen3-0.6B")
AGENT_FALLBACK = "import typer; from agent.server_cli import serve; typer.run(serve)"


@functools.cache
def agent_command() -> list[str]:
    """The `fabric-agent` console script; its `serve` code directly if the script cannot start
    (the CLI module imports the dataplane's debugging commands, which may be absent). Probed
    once per test session (a `--help` run costs 1-4 s of imports; ~15 clusters start)."""
    probe = subprocess.run([str(BIN / "fabric-agent"), "--help"], capture_output=True, check=False)
    if probe.returncode == 0:
        return [str(BIN / "fabric-agent"), "serve"]
    return [sys.executable, "-c", AGENT_FALLBACK]



def deploy(api: httpx.Client, dep: str, ep: str, replicas: int, **endpoint) -> None:
    """Create model DEP, profile g1 (one 24 GiB GPU), deployment DEP with REPLICAS and endpoint EP."""
    assert api.post("/api/ai/models", json={"name": dep, "source": "hf://Qwen/Qwen3-8B"}).status_code == 201
    assert api.post("/api/ai/profiles", json={"name": "g1", "gpu": {"count": 1, "vram_gib": 24}, "cpu": 1,
                                              "memory_gib": 1}).status_code == 201
    r = api.post("/api/ai/deployments", json={"name": dep, "model": dep, "profile": "g1", "replicas": replicas})
    assert r.status_code == 201, r.text
    r = api.post("/api/ai/endpoints", json={"name": ep, "deployment": dep, **endpoint})
    assert r.status_code == 201, r.text

@dataclass
class Cluster:
    url: str
    state_dir: Path
    token: str
    procs: list[subprocess.Popen]  # [fabricd, agent]
    logs: list[Path]  # [fabricd.log, agent.log]
    env: dict[str, str] | None = None
    files: list | None = None  # open log handles, closed by start_cluster
    fabricd_args: tuple[str, ...] = ()  # extra `fabricd serve` flags, e.g. ("--store", "etcd://...")
    mirror: HfMirror | None = None  # the loopback HF mirror the agent downloads from

    def api(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {self.token}"}, timeout=15)

    def tail(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in self.logs if p.exists())

    def kill_fabricd(self, sig: int = signal.SIGKILL) -> None:
        """Kill fabricd without letting it clean up (its leader lease is left to expire)."""
        self.procs[0].send_signal(sig)
        self.procs[0].wait(15)

    def start_fabricd(self) -> None:
        """Start fabricd again on the same state directory and port, its log appended."""
        assert self.procs[0].poll() is not None, "fabricd is still running"
        port = self.url.rsplit(":", 1)[1]
        self.procs[0] = _start_fabricd(self.state_dir, port, self.logs[0], self.env or {}, self.files, "ab",
                                       self.fabricd_args)
        _wait_fabricd(self.url, self.procs[0], self.logs[0])


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _log(path: Path, files: list, mode: str = "wb"):
    f = path.open(mode)  # closed by start_cluster once its processes are stopped
    files.append(f)
    return f


def _start_fabricd(state_dir: Path, port, log: Path, env: dict[str, str], files: list,
                   mode: str = "wb", extra: tuple[str, ...] = ()) -> subprocess.Popen:
    return subprocess.Popen(
        [str(BIN / "fabricd"), "serve", "--state-dir", str(state_dir), "--listen", f"127.0.0.1:{port}",
         "--insecure", "--log-level", "info", *extra],
        stdout=_log(log, files, mode), stderr=subprocess.STDOUT, env=env)


def _wait_fabricd(url: str, proc: subprocess.Popen, log: Path) -> None:
    with httpx.Client(base_url=url, timeout=5) as c:
        def up():
            if proc.poll() is not None:
                raise RuntimeError(f"fabricd exited: {log.read_text()[-2000:]}")
            try:
                return c.get("/healthz").status_code == 200
            except httpx.TransportError:
                return False
        wait_for(up, 30, "fabricd /healthz")


def model_mirror(tmp: Path) -> HfMirror:
    """A started loopback HF mirror of MIRRORED_REPOS (tiny safetensors models): the agent
    materializes a model before its replicas start, so agents get HF_ENDPOINT = mirror.url."""
    for repo in MIRRORED_REPOS:
        write_tiny_model(tmp / "hf-mirror" / repo)
    return HfMirror(MirrorConfig(tmp / "hf-mirror")).start()


@contextmanager
def start_cluster(tmp: Path, *, gpus: int = 4, env: dict[str, str] | None = None,
                  fabricd_args: tuple[str, ...] = ()):
    mirror = model_mirror(tmp)
    env = clean_env({"FABRIC_RECONCILE_SECS": "1", "FABRIC_ROUTING_SECS": "1", "FABRIC_OBSERVE_SECS": "1",
                     "FABRIC_MODEL_JOBS_SECS": "0.5",
                     "HF_ENDPOINT": mirror.url, **(env or {})})
    env.pop("HF_TOKEN", None)
    state_dir = tmp / "fabricd"
    init_state(state_dir)
    fport, aport = free_port(), free_port()
    url = f"http://127.0.0.1:{fport}"
    procs, logs, files = [], [], []
    fd_log = tmp / "fabricd.log"
    logs.append(fd_log)
    procs.append(_start_fabricd(state_dir, fport, fd_log, env, files, extra=fabricd_args))
    try:
        _wait_fabricd(url, procs[0], fd_log)
        with httpx.Client(base_url=url, timeout=5) as c:
            password = (state_dir / "admin-password").read_text().strip()
            token = c.post("/api/auth/login", json={"username": "admin", "password": password}).json()["token"]
        ag_log = tmp / "agent.log"
        logs.append(ag_log)
        procs.append(subprocess.Popen(
            agent_command() + [
                "--node-id", "node-a", "--listen", f"127.0.0.1:{aport}", "--control-plane", url, "--insecure",
                "--vm-driver", "dry-run", "--fake-gpus", str(gpus), "--no-dataplane", "--heartbeat-secs", "1",
                # a simulated node's allocatable, not this host's: replicas' CPU and memory count
                "--cpus", "64", "--memory-gib", "256",
                "--state-dir", str(tmp / "agent"), "--sysfs-root", str(tmp / "agent" / "sysfs"),
                "--log-level", "warning"],
            stdout=_log(ag_log, files), stderr=subprocess.STDOUT, env=env))
        cluster = Cluster(url, state_dir, token, procs, logs, env=env, files=files, fabricd_args=fabricd_args,
                          mirror=mirror)
        with cluster.api() as api:
            def registered():
                if procs[1].poll() is not None:
                    raise RuntimeError(f"agent exited: {ag_log.read_text()[-2000:]}")
                return api.get("/api/ai/nodes/node-a").status_code == 200
            wait_for(registered, 30, "node-a to register")
        yield cluster
    finally:
        for proc in reversed(procs):
            _stop(proc)
        stop_engines(tmp / "agent")
        for f in files:
            f.close()
        mirror.stop()


def stop_engines(agent_dir: Path) -> None:
    """The dry-run engines run in their own sessions and outlive the agent: stop every one it
    recorded (the driver's delete checks that the pid is still that replica's engine)."""
    for record in agent_dir.rglob("*.json"):
        try:
            replica_id = json.loads(record.read_text()).get("replica_id")
        except (OSError, ValueError, AttributeError):
            continue
        if replica_id and record.stem == replica_id:
            DryRunDriver(record.parent).delete(replica_id)
