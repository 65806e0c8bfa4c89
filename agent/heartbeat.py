"""Registration and heartbeat to fabricd.

The agent registers (POST /api/ai/nodes) and then heartbeats (POST /api/ai/nodes/{id}/heartbeat)
every ``interval_s`` with a NodeReport: GPUs (NVML inventory with nvidia-smi readings laid over
it), free CPU and memory, cached models, site, failure domain, taints, the VM driver and
whether KVM runs guests here (agent.hw.kvm), whether it observes its engines
(agent.engine_watch: fabricd then reads its reports and never scrapes them). Its
identity is its client certificate (CN = node id), so the body cannot claim another node.

A heartbeat answered 404 ``not_registered`` (fabricd lost the record, or a new store) registers
again; other failures are logged and retried on the next tick, never fatal: fabricd being down
must not stop the node serving what it already serves, unless its site is fail-closed
(agent.fail_closed: every tick tells it whether the link is up). Building the report is a pure
function of what was read, so it is tested with plain data.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx

from agent.state import AgentState, read_inventory, read_kvm
from common.agent_api import NodeReport
from common.schemas import GpuInfo, KvmStatus

log = logging.getLogger("fabric-agent.heartbeat")

DEFAULT_INTERVAL_S = 10.0


@dataclass(frozen=True)
class HostResources:
    cpu_free: int
    memory_free_gib: float


HOST_MEMORY_RESERVE = 0.10  # of MemTotal, at least HOST_MEMORY_RESERVE_MIN_GIB, kept for the host
HOST_MEMORY_RESERVE_MIN_GIB = 2.0


def allocatable_memory_gib(meminfo: str) -> float:
    """Memory this host offers to replicas: MemTotal less a host reserve. Not MemAvailable:
    running VMs pin their memory, and the scheduler already subtracts what replicas hold, so
    MemAvailable would count each VM twice."""
    for line in meminfo.splitlines():
        if line.startswith("MemTotal:"):
            total = int(line.split()[1]) / (1024 * 1024)  # kB -> GiB
            reserve = max(total * HOST_MEMORY_RESERVE, HOST_MEMORY_RESERVE_MIN_GIB)
            return round(max(total - reserve, 0.0), 2)
    return 0.0


def read_host_resources(proc: Path = Path("/proc")) -> HostResources:
    """CPUs and memory this host offers to replicas (allocatable; the scheduler subtracts what
    placed replicas hold): every CPU, and MemTotal less a host reserve. `serve --cpus` and
    `--memory-gib` override both, e.g. for a simulated node."""
    try:
        mem = allocatable_memory_gib((proc / "meminfo").read_text())
    except OSError:
        mem = 0.0
    return HostResources(os.cpu_count() or 1, mem)


def cached_models(models_dir: Path | None) -> list[str]:
    """Model directories under models_dir: NAME, or ORG/NAME when NAME sits in an org directory
    (the hf://ORG/NAME layout). Hidden and partial (``*.partial``) directories do not count."""
    if models_dir is None or not models_dir.is_dir():
        return []
    found = []
    for entry in sorted(models_dir.iterdir()):
        if not entry.is_dir() or entry.name.startswith(".") or entry.name.endswith(".partial"):
            continue
        children = [c for c in entry.iterdir() if not c.name.startswith(".")]
        if children and all(c.is_dir() for c in children):
            found += [f"{entry.name}/{c.name}" for c in sorted(children) if not c.name.endswith(".partial")]
        else:
            found.append(entry.name)
    return found


def build_report(state: AgentState, address: str, gpus: list[GpuInfo], inventory_message: str,
                 resources: HostResources, models: list[str], nvswitches: tuple[str, ...] = (),
                 kvm: KvmStatus | None = None) -> NodeReport:
    return NodeReport(
        id=state.node_id, address=address, site=state.site, failure_domain=state.failure_domain,
        taints=list(state.taints), gpus=gpus, cpu_free=resources.cpu_free,
        memory_free_gib=resources.memory_free_gib, cached_models=models,
        vm_driver=state.vm_driver.name, inventory_message=inventory_message, nvswitches=list(nvswitches),
        model_jobs=state.models is not None, kvm=kvm,
        model_disk_free_bytes=state.models.cache.free_bytes() if state.models is not None else None,
        services_withdrawn=state.fail_closed.withdrawn if state.fail_closed is not None else "",
        service_generations=state.services.report(state.dataplane) if state.dataplane is not None else {},
        observed_replicas=list(state.engines.observed) if state.engines is not None else [],
    )


SmiReader = Callable[[], object]


class Heartbeat:
    """Register + heartbeat against fabricd with one httpx.Client (mTLS configured by the caller)."""

    def __init__(self, state: AgentState, client: httpx.Client, address: str, *,
                 interval_s: float = DEFAULT_INTERVAL_S, smi_reader: SmiReader | None = None,
                 resources: Callable[[], HostResources] = read_host_resources):
        self.state = state
        self.client = client
        self.address = address
        self.interval_s = interval_s
        self.smi_reader = smi_reader
        self.resources = resources
        self.registered = False
        self.last_error = ""

    def report(self) -> NodeReport:
        inv = read_inventory(self.state.inventory)
        gpus = inv.gpus
        if self.smi_reader is not None:
            from agent.hw.gpu_inventory import apply_smi_readings

            gpus = apply_smi_readings(gpus, self.smi_reader())
        models = cached_models(self.state.models_dir)
        if self.state.models is not None:  # verified digests: the scheduler's cache preference
            models += self.state.models.cache.digests()
        return build_report(self.state, self.address, gpus, inv.message, self.resources(), models,
                            kvm=read_kvm(self.state.kvm))

    def register(self) -> dict:
        resp = self.client.post("/api/ai/nodes", json=self.report().model_dump(mode="json"))
        _raise_for(resp, "register")
        self.registered = True
        return resp.json()

    def beat(self) -> dict:
        """One heartbeat, registering first when fabricd does not know this node."""
        if not self.registered:
            return self.register()
        resp = self.client.post(f"/api/ai/nodes/{self.state.node_id}/heartbeat",
                                json=self.report().model_dump(mode="json"))
        if resp.status_code == 404:
            self.registered = False
            return self.register()
        _raise_for(resp, "heartbeat")
        return resp.json()

    def tick(self) -> None:
        """One heartbeat and what it says about the link to fabricd (agent.fail_closed)."""
        guard = self.state.fail_closed
        try:
            answer = self.beat()
        except (httpx.HTTPError, HeartbeatRefused) as exc:
            message = f"{type(exc).__name__}: {exc}"
            if message != self.last_error:  # one line per distinct failure, not per tick
                log.warning("heartbeat failed: %s", message)
            self.last_error = message
            if guard is not None:
                guard.link_down(time.time())
            return
        if self.last_error:
            log.info("heartbeat to fabricd works again")
        self.last_error = ""
        if guard is not None:
            guard.link_up(answer.get("fail_closed_unix"), time.time())

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            self.tick()
            stop.wait(self.interval_s)

    def start(self, stop: threading.Event) -> threading.Thread:
        thread = threading.Thread(target=self.run, args=(stop,), name="heartbeat", daemon=True)
        thread.start()
        return thread


class HeartbeatRefused(Exception):
    """fabricd answered a registration or heartbeat with an error (its message kept)."""

    def __init__(self, what: str, status: int, message: str):
        super().__init__(f"{what} refused with {status}: {message}")
        self.status = status


def _raise_for(resp: httpx.Response, what: str) -> None:
    if resp.status_code < 400:
        return
    try:
        message = resp.json()["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = resp.text[:200]
    raise HeartbeatRefused(what, resp.status_code, message)
