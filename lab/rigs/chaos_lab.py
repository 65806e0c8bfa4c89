"""The chaos run on the real lab: namespaces, XDP Maglev on the node, engine sims in replica
namespaces, clients in the client namespace hitting the VIP.

``start_lab_rig`` starts a three-member etcd cluster (lab.rigs.etcd_cluster), brings the lab
up on it (``LabConfig(store=etcd://...)``: fabricd "a", the agent with a small connection table so
a scan can fill it, gateway 0), then starts fabricd "b" (a copy of "a"'s state dir: same CA,
passwords and server certificate) and gateway 1 on the same cluster, deploys the lab's tiny model
with two replicas and an endpoint, and yields once the VIP's Maglev service has both backends.

``LabRig`` also wraps a lab that someone else brought up (one fabricd on SQLite, one gateway:
tests/e2e's story), for the injections that do not need a second fabricd or etcd.
Whatever brings the lab up runs under /tmp/fabric-lab.lock (lab.rigs.lab_lock).
"""

from __future__ import annotations

import os
import shutil
import signal
import ssl
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from common.store.base import Store
from common.store.locks import lock_view
from controlplane.controllers import LEADER_NAME
from lab import processes
from lab.cluster import (
    LAB_MODEL_SOURCE,
    NODE_ID,
    LabConfig,
    fabricd_command,
    gateway_command,
    service_env,
    start_agent,
)
from lab.rigs.polling import wait_for
from lab.rigs.servers import free_port

FLOW_ENTRIES = 4096  # the chaos lab's connection table: a scan of 4x this fills it


@dataclass
class LabRig:
    cfg: LabConfig
    token: str
    dep: str
    ep: str
    store: Store
    etcd: object | None = None  # lab.rigs.etcd_cluster.EtcdCluster when the lab runs on one
    fabricd_ports: dict[str, int] = field(default_factory=dict)  # "a" is cfg.api_port
    gateway_ports: list[int] = field(default_factory=list)  # [0] is cfg.gateway_port
    node: str = NODE_ID
    vip: str = ""

    def __post_init__(self) -> None:
        self.fabricd_ports = self.fabricd_ports or {"a": self.cfg.api_port}
        self.gateway_ports = self.gateway_ports or [self.cfg.gateway_port]
        self.ctx = ssl.create_default_context(cafile=str(self.cfg.ca))
        pki = self.cfg.fabricd_dir / "pki"
        self.agent_ctx = ssl.create_default_context(cafile=str(self.cfg.ca))
        self.agent_ctx.load_cert_chain(str(pki / "fabricd.crt"), str(pki / "fabricd.key"))

    # -- processes by pid file -------------------------------------------------------------

    def _pid(self, name: str) -> int | None:
        try:
            return int((self.cfg.state_dir / "pids" / f"{name}.pid").read_text().strip())
        except (OSError, ValueError):
            return None

    def _sigkill(self, name: str) -> None:
        pid = self._pid(name)
        if pid is None:
            raise AssertionError(f"no pid file for the lab's {name}")
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: not processes.alive(pid), 10, f"{name} (pid {pid}) to die")

    # -- fabricd ------------------------------------------------------------------------

    def fabricd_url(self, name: str) -> str:
        return f"https://127.0.0.1:{self.fabricd_ports[name]}"

    def _answers(self, url: str, path: str, ctx: ssl.SSLContext) -> bool:
        try:
            return httpx.get(url + path, verify=ctx, timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def serving(self) -> str:
        for name in sorted(self.fabricd_ports):
            if self._answers(self.fabricd_url(name), "/healthz", self.ctx):
                return name
        raise AssertionError("no fabricd answers")

    def api(self, name: str | None = None) -> httpx.Client:
        return httpx.Client(base_url=self.fabricd_url(name or self.serving()), verify=self.ctx, timeout=30,
                            headers={"Authorization": f"Bearer {self.token}"})

    def leader(self) -> str | None:
        holder = lock_view(self.store, LEADER_NAME).holder
        if holder is None:
            return None
        pid = int(holder.split(":")[-2])
        return next((n for n in self.fabricd_ports if self._pid(f"fabricd-{n}") == pid and processes.alive(pid)), None)

    def kill_fabricd(self, name: str) -> None:
        self._sigkill(f"fabricd-{name}")

    def start_fabricd(self, name: str, mode: str = "", *, wait: bool = True) -> None:
        state = self.cfg.fabricd_dir if name == "a" else self.cfg.state_dir / f"fabricd-{name}"
        processes.start(self.cfg.state_dir, f"fabricd-{name}",
                        fabricd_command(self.cfg, state, self.fabricd_ports[name]),
                        service_env(self.cfg, "fabricd"))
        if wait:
            wait_for(lambda: self._answers(self.fabricd_url(name), "/healthz", self.ctx), 60, f"fabricd {name}")

    # -- agent --------------------------------------------------------------------------

    def kill_agent(self) -> None:
        self._sigkill("agent")

    def start_agent(self, mode: str = "") -> None:
        start_agent(self.cfg)

    def agent_up(self) -> bool:
        return self._answers(f"https://127.0.0.1:{self.cfg.agent_port}", "/healthz", self.agent_ctx)

    def maglev_services(self) -> list[dict]:
        """Services in the agent's live BPF maps (GET /v1/maglev/services: read from the pinned maps)."""
        r = httpx.get(f"https://127.0.0.1:{self.cfg.agent_port}/v1/maglev/services", verify=self.agent_ctx, timeout=10)
        r.raise_for_status()
        return r.json()["services"]

    def agent_metrics(self) -> str:
        return httpx.get(f"https://127.0.0.1:{self.cfg.agent_port}/metrics", verify=self.agent_ctx, timeout=10).text

    # -- gateways -----------------------------------------------------------------------

    @property
    def gateway_verify(self) -> ssl.SSLContext:
        return self.ctx

    def gateway_name(self, i: int) -> str:
        return "gateway" if i == 0 else f"gateway-{i}"

    def chat_urls(self) -> list[str]:
        return [f"https://127.0.0.1:{p}/api/ai/openai/{self.ep}/v1/chat/completions" for p in self.gateway_ports]

    def kill_gateway(self, i: int) -> None:
        self._sigkill(self.gateway_name(i))

    def restart_gateway(self, i: int) -> None:
        port = self.gateway_ports[i]
        processes.start(self.cfg.state_dir, self.gateway_name(i), gateway_command(self.cfg, port, f"gw-{i}"),
                        service_env(self.cfg, "gateway"))
        wait_for(lambda: self._answers(f"https://127.0.0.1:{port}", "/metrics", self.ctx), 60, f"gateway {i}")

    def new_key(self, request_quota: int | None = None) -> str:
        body = {"name": f"chaos-{time.monotonic_ns() % 10**9}", "endpoint": self.ep}
        if request_quota:
            body["request_quota"] = request_quota
        with self.api() as api:
            r = api.post("/api/ai/keys", json=body)
        assert r.status_code in (200, 201), r.text
        return r.json()["key"]

    # -- replicas -----------------------------------------------------------------------

    def ready_replicas(self, api: httpx.Client) -> list[dict]:
        return [r for r in api.get(f"/api/ai/deployments/{self.dep}/metrics").json()["replicas"] if r["ready"]]

    def tail(self) -> str:
        logs = sorted((self.cfg.state_dir / "logs").glob("*.log"))
        return "".join(f"\n--- {p.name}\n{p.read_text(errors='replace')[-2000:]}" for p in logs)


def deploy_lab_model(api: httpx.Client, dep: str, ep: str, replicas: int) -> None:
    for path, body in (("/api/ai/models", {"name": dep, "source": LAB_MODEL_SOURCE}),
                       ("/api/ai/profiles", {"name": f"{dep}-h100", "runtime": "vllm", "cpu": 1, "memory_gib": 1,
                                             "gpu": {"count": 1, "vram_gib": 24}}),
                       ("/api/ai/deployments", {"name": dep, "model": dep, "profile": f"{dep}-h100",
                                                "replicas": replicas}),
                       ("/api/ai/endpoints", {"name": ep, "deployment": dep, "routing": "least_queue"})):
        r = api.post(path, json=body)
        assert r.status_code == 201, f"{path}: {r.status_code} {r.text}"


def wait_vip_served(rig: LabRig, replicas: int, timeout: float = 120) -> str:
    """Wait for REPLICAS ready replicas, the VIP and that many backends in the live maps; the VIP."""
    with rig.api() as api:
        wait_for(lambda: len(rig.ready_replicas(api)) == replicas, timeout, f"{replicas} ready replicas")
        vip = wait_for(lambda: api.get(f"/api/ai/endpoints/{rig.ep}").json()["status"].get("vip"), 60, "a VIP")

    def served() -> bool:
        svc = next((s for s in rig.maglev_services() if s["vip"] == vip), None)
        return svc is not None and sum(1 for b in svc["stats"] if b["slots"]) == replicas
    wait_for(served, 60, f"{replicas} backends in the VIP's live Maglev ring")
    rig.vip = vip
    return vip


@contextmanager
def start_lab_rig(base: Path, replicas: int = 2, dep: str = "chaos-llm"):
    """The whole chaos lab (see the module doc). BASE: a fresh directory for the lab's state."""
    from lab.cluster import down, up
    from lab.rigs.etcd_cluster import EtcdCluster

    # Secured as docs/store.md prescribes: fabricd and the gateways log in as their own etcd users.
    with EtcdCluster(3) as etcd:
        cfg = LabConfig(state_dir=base / "lab", api_port=free_port(), agent_port=free_port(),
                        gateway_port=free_port(), mirror_port=free_port(),
                        pin_dir=Path(f"/sys/fs/bpf/fabric-chaos-{base.name[-6:]}"), reconcile_secs=1.0,
                        routing_secs=1.0, store=etcd.url, flow_entries=FLOW_ENTRIES,
                        store_env={"fabricd": etcd.env("fabricd"), "gateway": etcd.env("gateway")})
        store = etcd.open("fabricd")
        rig = None
        try:
            handle = up(cfg, echo=lambda *_: None)
            shutil.copytree(cfg.fabricd_dir, cfg.state_dir / "fabricd-b")
            # `up` named its fabricd "fabricd" and its gateway "gateway": the rig's names for them
            (cfg.state_dir / "pids" / "fabricd.pid").rename(cfg.state_dir / "pids" / "fabricd-a.pid")
            rig = LabRig(cfg, handle.token, dep, f"{dep}-openai", store, etcd,
                         fabricd_ports={"a": cfg.api_port, "b": free_port()},
                         gateway_ports=[cfg.gateway_port, free_port()])
            rig.start_fabricd("b")
            rig.restart_gateway(1)
            with rig.api() as api:
                deploy_lab_model(api, rig.dep, rig.ep, replicas)
            wait_vip_served(rig, replicas)
            wait_for(rig.leader, 30, "a fabricd to hold the leader lock")
            yield rig
        except Exception as exc:  # whatever broke, the lab's logs come with it
            raise AssertionError(f"{type(exc).__name__}: {exc}\n{rig.tail() if rig else ''}") from exc
        finally:
            down(cfg)
            store.close()
