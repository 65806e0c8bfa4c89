"""The loopback rig the chaos run and the etcd-cluster tests share: real processes, no netns.

A three-member etcd cluster (peer and client TLS, auth on); two `fabricd serve --store
etcd://A,B,C` ("a" and "b"; ``fabricds=`` names more: controllers on, one leader by the store
lock, copies of one state dir, each logged in as the etcd user fabricd); one `fabric-agent`
(dry-run driver: each replica a real fabric-engine-sim process, fake GPUs) heartbeating to
fabricd "b" first and failing over to the others; two `fabric-gateway` processes (``gateways=``)
on the same cluster as the etcd user gateway; a loopback HF mirror. One deployment with an endpoint is deployed
and Ready when ``start_rig`` yields. The VIP is allocated from a loopback pool (127.0.100.x) that
nothing serves here (no dataplane), so the endpoint routes round_robin: the gateway picks the
replica itself and never goes through the VIP.

Every process can be SIGKILLed and started again on the same ports and state (``kill_*`` /
``restart_*``), which is what the chaos injections and the etcd tests do.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from common.store.base import Store
from common.store.locks import lock_view
from controlplane.controllers import LEADER_NAME
from lab.rigs.etcd_cluster import EtcdCluster
from lab.rigs.polling import clean_env, wait_for
from lab.rigs.servers import free_port
from tests.gateway.gateway_harness import GatewayProcess, make_key
from tests.integration.orchestration_harness import (
    BIN,
    _log,
    _start_fabricd,
    _stop,
    _wait_fabricd,
    agent_command,
    deploy,
    model_mirror,
    stop_engines,
)

DEP, EP = "chaos", "chaos-ep"
POOL = "127.0.100.1-127.0.100.4"
NODE = "node-a"


@dataclass
class Rig:
    tmp: Path
    etcd: EtcdCluster
    store: Store
    env: dict[str, str]
    ports: dict[str, int]
    fabricd: dict[str, subprocess.Popen] = field(default_factory=dict)
    agent: subprocess.Popen | None = None
    agent_port: int = 0
    gateways: list[GatewayProcess] = field(default_factory=list)
    token: str = ""
    files: list = field(default_factory=list)
    gateway_env: dict[str, str] = field(default_factory=dict)  # extra FABRIC_GATEWAY_* for both gateways
    # what lab.rigs.chaos asks of any rig
    dep: str = DEP
    ep: str = EP
    node: str = NODE
    vip: str = ""  # no dataplane here: no load or invariant through a VIP
    gateway_verify: bool = True

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.ports[name]}"

    def serving(self) -> str:
        """A fabricd that answers now ("a" first): one may be restarting after an injection."""
        for name in self.fabricd:
            try:
                if self.fabricd[name].poll() is None and httpx.get(f"{self.url(name)}/healthz", timeout=2).status_code == 200:
                    return name
            except httpx.TransportError:
                continue
        raise AssertionError("no fabricd answers")

    def api(self, name: str | None = None) -> httpx.Client:
        name = name or self.serving()
        return httpx.Client(base_url=self.url(name), headers={"Authorization": f"Bearer {self.token}"}, timeout=30)

    def log(self, name: str) -> Path:
        return self.tmp / f"{name}.log"

    def tail(self) -> str:
        names = [*(f"fabricd-{n}" for n in self.fabricd), "agent"]
        text = "\n".join(f"--- {n}\n{self.log(n).read_text(errors='replace')[-2500:]}"
                         for n in names if self.log(n).exists())
        return text + "\n" + "\n".join(f"--- gateway {g.port}\n{g.log_text()[-1500:]}" for g in self.gateways)

    # -- fabricd ------------------------------------------------------------------------

    def start_fabricd(self, name: str, mode: str = "wb", *, wait: bool = True) -> None:
        self.fabricd[name] = _start_fabricd(self.tmp / f"fabricd-{name}", self.ports[name], self.log(f"fabricd-{name}"),
                                            self.env, self.files, mode, ("--store", self.etcd.url))
        if wait:
            _wait_fabricd(self.url(name), self.fabricd[name], self.log(f"fabricd-{name}"))

    def leader(self) -> str | None:
        """Which fabricd ("a"/"b") the store's leader lock names, by pid."""
        holder = lock_view(self.store, LEADER_NAME).holder
        if holder is None:
            return None
        pid = int(holder.split(":")[-2])
        return next((n for n, p in self.fabricd.items() if p.pid == pid and p.poll() is None), None)

    def kill_fabricd(self, name: str) -> None:
        self.fabricd[name].send_signal(signal.SIGKILL)
        self.fabricd[name].wait(15)

    # -- agent --------------------------------------------------------------------------

    def start_agent(self, mode: str = "wb") -> None:
        self.agent = subprocess.Popen(
            agent_command() + [
                "--node-id", NODE, "--listen", f"127.0.0.1:{self.agent_port}",
                "--control-plane", ",".join(self.url(n) for n in sorted(self.ports, key=lambda n: n != "b")),
                "--insecure", "--vm-driver", "dry-run", "--fake-gpus", "6", "--no-dataplane",
                "--heartbeat-secs", "1", "--cpus", "64", "--memory-gib", "256",
                "--state-dir", str(self.tmp / "agent"), "--sysfs-root", str(self.tmp / "agent" / "sysfs"),
                "--log-level", "warning"],
            stdout=_log(self.log("agent"), self.files, mode), stderr=subprocess.STDOUT, env=self.env)

    def kill_agent(self) -> None:
        self.agent.kill()
        self.agent.wait(10)

    def agent_up(self) -> bool:
        try:
            return httpx.get(f"http://127.0.0.1:{self.agent_port}/healthz", timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    # -- gateways -----------------------------------------------------------------------

    def kill_gateway(self, i: int) -> None:
        self.gateways[i].proc.kill()
        self.gateways[i].proc.wait(10)

    def chat_urls(self) -> list[str]:
        return [g.openai_base(EP) + "/chat/completions" for g in self.gateways]

    def new_key(self, request_quota: int | None = None) -> str:
        fields = {"request_quota": request_quota} if request_quota else {}
        return make_key(self.store, EP, **fields)[1]

    def restart_gateway(self, i: int) -> None:
        old = self.gateways[i]
        self.gateways[i] = GatewayProcess.start(self.tmp, self.etcd.url, self.gateway_env, gateway_id=f"gw-{i}",
                                                port=old.port)

    def ready_replicas(self, api: httpx.Client) -> list[dict]:
        return [r for r in api.get(f"/api/ai/deployments/{DEP}/metrics").json()["replicas"] if r["ready"]]


@contextmanager
def start_rig(tmp: Path, replicas: int = 2, gateway_env: dict[str, str] | None = None,
              fabricds: tuple[str, ...] = ("a", "b"), gateways: int = 2):
    with EtcdCluster(3) as etcd:
        mirror = model_mirror(tmp)
        env = clean_env({"FABRIC_RECONCILE_SECS": "1", "FABRIC_ROUTING_SECS": "1", "FABRIC_LEADER_TTL_SECS": "3",
                         "FABRIC_MODEL_JOBS_SECS": "0.5", "FABRIC_ADDRESS_POOL": POOL, "HF_ENDPOINT": mirror.url,
                         **etcd.env("fabricd")})  # peer and client TLS, fabricd's login
        env.pop("HF_TOKEN", None)
        subprocess.run([str(BIN / "fabricd"), "init", "--state-dir", str(tmp / "fabricd-a")], check=True,
                       capture_output=True, env=env)
        # one init, copied: all share the admin password, the CA and the HMAC secret
        for name in fabricds[1:]:
            shutil.copytree(tmp / "fabricd-a", tmp / f"fabricd-{name}")
        rig = Rig(tmp, etcd, etcd.open("fabricd"), env, {n: free_port() for n in fabricds}, agent_port=free_port(),
                  gateway_env={**(gateway_env or {}), **etcd.env("gateway")})
        try:
            for name in fabricds:
                rig.start_fabricd(name, wait=False)
            for name in fabricds:
                _wait_fabricd(rig.url(name), rig.fabricd[name], rig.log(f"fabricd-{name}"))
            password = (tmp / "fabricd-a" / "admin-password").read_text().strip()
            rig.token = httpx.post(f"{rig.url('a')}/api/auth/login", json={"username": "admin", "password": password},
                                   timeout=10).json()["token"]
            rig.start_agent()
            with rig.api() as api:
                wait_for(lambda: api.get(f"/api/ai/nodes/{NODE}").status_code == 200, 30, "the node to register")
                # round_robin: the gateway picks a replica itself (affinity would send each call to
                # the VIP first, which only the lab's dataplane serves)
                deploy(api, DEP, EP, replicas, routing_l7="round_robin")
                wait_for(lambda: len(rig.ready_replicas(api)) == replicas, 90, f"{replicas} ready replicas")
                wait_for(lambda: api.get(f"/api/ai/endpoints/{EP}").json()["status"].get("vip"), 30, "the VIP")
            rig.gateways = [GatewayProcess.start(tmp, etcd.url, rig.gateway_env, gateway_id=f"gw-{i}")
                            for i in range(gateways)]
            wait_for(rig.leader, 30, "a fabricd to hold the leader lock")
            yield rig
        except (AssertionError, RuntimeError) as exc:
            raise AssertionError(f"{exc}\n{rig.tail()}") from None
        finally:
            for gw in rig.gateways:
                gw.stop()
            if rig.agent is not None:
                _stop(rig.agent)
            for proc in rig.fabricd.values():
                _stop(proc)
            stop_engines(tmp / "agent")
            for f in rig.files:
                f.close()
            rig.store.close()
            mirror.stop()


def wait_until(predicate, timeout: float) -> float | None:
    """Seconds until PREDICATE held (polled every 0.1 s), or None if it did not within TIMEOUT."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if predicate():
            return round(time.monotonic() - t0, 2)
        time.sleep(0.1)
    return None
