"""Lab VM driver: a replica is a network namespace on the node's bridge running an engine.

It stands in for a QEMU guest on a host with no GPU: the replica gets its own network stack,
an address from the node's replica subnet, a default route through the node (the bridge
address), and an engine on :8000 serving the deployment's model name: fabric-engine-sim, or with
FABRIC_LAB_ENGINE=vllm the real vLLM engine (CPU build) for runtime vllm, started with the guest's
own command line (agent/vm/lab_engine.py). Everything above the driver (reservations, binds
through the fake sysfs, the reconciler, Maglev, the gateway) runs unchanged.

Invariants:
  - Namespaces are named ``{prefix}r-{replica_id}``; the record of each replica (address, veth,
    engine pid) lives in ``{state_dir}/lab-replicas/{replica_id}.json``. A restarted agent
    adopts what it finds (namespace + record) instead of recreating or leaking it.
  - The engine runs in its own session, so it outlives an agent restart like a VM would.
  - delete() kills every process in the namespace (a real engine gets SIGTERM first, then SIGKILL
    after STOP_WAIT_S), then
    removes the namespace; the kernel removes the veth pair with it. A real engine's caches and
    sockets live in ``{state_dir}/lab-replicas/{replica_id}/`` and go with it.
Links are made with iproute2 (`ip`), which every lab host has; the bridge itself is made by the
lab topology (controlplane lab up), not by this driver.
"""

from __future__ import annotations

import hashlib
import ipaddress
import os
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from agent.dataplane.decap import enable_dsr_backend
from agent.dataplane.veth import prepare_veth_end
from agent.settings import LabEngineSettings
from agent.vm.base import VmSpec, VmStatus
from agent.vm.dryrun_driver import default_engine_command
from agent.vm.engine_env import engine_env
from agent.vm.lab_engine import (
    engine_error_line,
    guest_argv,
    in_guest_mounts,
    pick_worker_cpu,
    real_engine_argv,
    real_engine_env,
    release_shm,
    shm_segments,
    yield_cpu,
)
from agent.vm.records import RecordDir, engine_alive
from common.errors import Refused, TransientError
from common.runtimes import VLLM_KV_EVENTS_CONFIG, VLLM_SHUTDOWN_TIMEOUT_S


@dataclass(frozen=True)
class LabNetwork:
    node_netns: str  # the node namespace holding the bridge
    bridge: str  # bridge in the node namespace
    subnet: str  # replica subnet, e.g. 10.244.0.0/24
    gateway: str  # bridge address, the replicas' default route
    prefix: str = "fabric-lab-"


@dataclass
class _Record:
    replica_id: str
    netns: str
    veth: str
    address: str
    pid: int
    model: str
    port: int
    engine: str = "sim"  # what runs in it: sim or vllm (FABRIC_LAB_ENGINE)
    worker_cpu: int | None = None  # the real engine's worker core (lab_engine.pick_worker_cpu)


STOP_WAIT_S = 5.0  # a real engine given SIGTERM exits once its connections close; then SIGKILL


# The vLLM flags the simulator implements the same way (enginesim/cli.py): a revision's
# engine args and the profile's max_model_len reach the lab's replicas through these, so a canary
# of `--max-num-seqs 2` in the lab really runs fewer sequences at once. Other vLLM flags have no
# meaning for the simulator and are left out (a real engine gets them all: _start_real_engine).
SIM_SHARED_FLAGS = ("--max-num-seqs", "--max-model-len")


def sim_engine_args(extra_args: tuple[str, ...] | list[str], max_model_len: int | None) -> list[str]:
    """The simulator's share of a replica's vLLM arguments (``--flag V`` or ``--flag=V``; the last wins)."""
    chosen: dict[str, str] = {}
    if max_model_len:
        chosen["--max-model-len"] = str(max_model_len)
    args = list(extra_args)
    for i, arg in enumerate(args):
        flag, eq, value = arg.partition("=")
        if flag in SIM_SHARED_FLAGS:
            if not eq:
                value = args[i + 1] if i + 1 < len(args) else ""
            if value.isdigit():
                chosen[flag] = value
    return [x for flag in SIM_SHARED_FLAGS if flag in chosen for x in (flag, chosen[flag])]


def _ip(*args: str, netns: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    cmd = ["ip", *(["-n", netns] if netns else []), *args]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
    if check and res.returncode != 0:
        raise TransientError(f"`{' '.join(cmd)}` failed: {res.stderr.strip()}")
    return res


def _netns_pids(ns: str) -> list[str]:
    return subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()


def _netns_exists(name: str) -> bool:
    return Path("/var/run/netns", name).exists()


class LabDriver:
    name = "lab"

    def __init__(self, network: LabNetwork, state_dir: Path, engine: LabEngineSettings | None = None):
        self.net = network
        self.engine = engine or LabEngineSettings()
        self.dir = Path(state_dir) / "lab-replicas"
        self.records = RecordDir(self.dir, _Record)
        self._lock = threading.Lock()

    # ---- helpers ---------------------------------------------------------------------------
    def _netns_name(self, replica_id: str) -> str:
        return f"{self.net.prefix}r-{replica_id}"

    def _veth_name(self, replica_id: str) -> str:
        # Interface names are at most 15 bytes: a short stable hash of the replica id.
        return "flr" + hashlib.sha256(replica_id.encode()).hexdigest()[:10]

    def _free_address(self) -> str:
        """The next free address after the last one handed out (wrapping), so a replacement
        never inherits the address of the replica it replaces while flows may still name it."""
        net = ipaddress.ip_network(self.net.subnet)
        used = {r.address for r in self.records.all()} | {self.net.gateway}
        hosts = [h for h in list(net.hosts())[9:] if h.packed[-1] not in (0, 255)]  # .1-.9: node, lab
        cursor = self.dir / "last-address"
        last = cursor.read_text().strip() if cursor.exists() else ""
        start = next((i + 1 for i, h in enumerate(hosts) if str(h) == last), 0)
        for host in hosts[start:] + hosts[:start]:
            if str(host) not in used:
                cursor.write_text(str(host))
                return str(host)
        raise Refused(f"replica subnet {self.net.subnet} is full")

    def _status(self, rec: _Record) -> VmStatus:
        if not _netns_exists(rec.netns):
            return VmStatus(rec.replica_id, "failed", rec.address, rec.port, "namespace is gone")
        if not engine_alive(rec.pid, rec.replica_id):
            why = engine_error_line(self.dir / f"{rec.replica_id}.log") if rec.engine == "vllm" else ""
            return VmStatus(rec.replica_id, "failed", rec.address, rec.port,
                            f"engine process exited: {why}" if why else "engine process exited")
        return VmStatus(rec.replica_id, "running", rec.address, rec.port, f"netns {rec.netns}")

    def _start_engine(self, rec: _Record, spec: VmSpec | None) -> int:
        if spec is not None and self.engine.real_for(spec.runtime):
            return self._start_real_engine(rec, spec)
        rec.engine = "sim"
        knobs: list[str] = []
        for k, v in sorted((spec.engine_args if spec else {}).items()):
            knobs += [f"--{k}", str(v)]
        cmd = ["ip", "netns", "exec", rec.netns, *default_engine_command(), "--host", "0.0.0.0",
               "--port", str(rec.port), "--model", rec.model, "--replica-id", rec.replica_id, *knobs]
        if spec is not None:
            cmd += sim_engine_args(spec.extra_args, spec.max_model_len)
        if spec is not None and spec.adapters_dir:  # the replica's /adapters (a VM mounts the share there)
            cmd += ["--lora-root", spec.adapters_dir, "--max-loras", str(spec.max_loras or 1)]
        if spec is not None and spec.runtime != "vllm":
            # The replica answers health and metrics where that runtime would (common/runtimes.py).
            cmd += ["--runtime", spec.runtime]
        else:  # KV events as a vLLM guest publishes them (the agent's kv-index subscribes), and its stop
            cmd += ["--kv-events-config", VLLM_KV_EVENTS_CONFIG, "--shutdown-timeout", str(VLLM_SHUTDOWN_TIMEOUT_S)]
        with open(self.dir / f"{rec.replica_id}.log", "ab") as log:  # never the agent's secrets (HF_TOKEN...)
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env=engine_env(), start_new_session=True, close_fds=True)
        return proc.pid

    def _start_real_engine(self, rec: _Record, spec: VmSpec) -> int:
        """The real vLLM engine, with the guest's command line (agent/vm/lab_engine.py)."""
        model_dir = spec.model_dir or spec.model_source.removeprefix("file://")
        argv = real_engine_argv(guest_argv(spec), self.engine.python, rec.replica_id, self.engine.kv_cache_bytes)
        cmd = ["ip", "netns", "exec", rec.netns, *in_guest_mounts(argv, model_dir, spec.adapters_dir)]
        taken = [r.worker_cpu for r in self.records.all() if r.replica_id != rec.replica_id and r.engine == "vllm"
                 and r.worker_cpu is not None and engine_alive(r.pid, r.replica_id)]
        rec.worker_cpu = pick_worker_cpu(taken, list(os.sched_getaffinity(0)))
        env = real_engine_env(self.dir / rec.replica_id, lora=bool(spec.adapters_dir),
                              base=dict(self.engine.base_env), worker_cpu=rec.worker_cpu)
        rec.engine = "vllm"
        with open(self.dir / f"{rec.replica_id}.log", "ab") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env=env, start_new_session=True, close_fds=True)
        yield_cpu(proc.pid, self.engine.nice)  # a guest's engine has its own vCPUs (lab_engine.py)
        return proc.pid

    # ---- VmDriver --------------------------------------------------------------------------
    def create(self, spec: VmSpec) -> VmStatus:
        with self._lock:
            rec = self.records.load(spec.replica_id)
            if rec and _netns_exists(rec.netns):
                if not engine_alive(rec.pid, rec.replica_id):
                    rec.pid = self._start_engine(rec, spec)
                    self.records.save(rec)
                return self._status(rec)
            ns, veth = self._netns_name(spec.replica_id), self._veth_name(spec.replica_id)
            address = rec.address if rec else self._free_address()
            prefixlen = ipaddress.ip_network(self.net.subnet).prefixlen
            try:
                if not _netns_exists(ns):
                    _ip("netns", "add", ns)
                _ip("link", "del", veth, netns=self.net.node_netns, check=False)
                _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns,
                    netns=self.net.node_netns)
                _ip("link", "set", veth, "master", self.net.bridge, "up", netns=self.net.node_netns)
                _ip("link", "set", "lo", "up", netns=ns)
                _ip("addr", "add", f"{address}/{prefixlen}", "dev", "eth0", netns=ns)
                _ip("link", "set", "eth0", "up", netns=ns)
                _ip("route", "add", "default", "via", self.net.gateway, netns=ns)
                prepare_veth_end(ns, "eth0")  # the node's XDP redirects into it (docs/dataplane.md)
                if spec.dsr_vips:  # this kernel has no ipip driver: the replica decapsulates in XDP
                    enable_dsr_backend(ns, "eth0", address, list(spec.dsr_vips))
            except TransientError:
                self._teardown(ns, veth)
                raise
            rec = _Record(spec.replica_id, ns, veth, address, 0, spec.model_name, spec.port)
            rec.pid = self._start_engine(rec, spec)
            self.records.save(rec)
            return VmStatus(spec.replica_id, "starting", address, spec.port, f"netns {ns}")

    def get(self, vm_id: str) -> VmStatus | None:
        rec = self.records.load(vm_id)
        return self._status(rec) if rec else None

    def log_path(self, vm_id: str) -> Path:
        """The replica's engine output (served by GET /v1/vms/{id}/logs)."""
        return self.dir / f"{vm_id}.log"

    def list(self) -> list[VmStatus]:
        return [self._status(r) for r in self.records.all()]

    def delete(self, vm_id: str) -> bool:
        with self._lock:
            rec = self.records.load(vm_id)
            ns = rec.netns if rec else self._netns_name(vm_id)
            existed = rec is not None or _netns_exists(ns)
            self._teardown(ns, rec.veth if rec else self._veth_name(vm_id), term_first=bool(rec and rec.engine == "vllm"))
            self.records.remove(vm_id)
            (self.dir / f"{vm_id}.log").unlink(missing_ok=True)
            shutil.rmtree(self.dir / vm_id, ignore_errors=True)  # a real engine's caches and sockets
            return existed

    def _teardown(self, ns: str, veth: str, term_first: bool = False) -> None:
        if _netns_exists(ns):
            shm = shm_segments(_netns_pids(ns))  # a real engine's, for when SIGKILL leaves them
            steps = ((signal.SIGTERM, STOP_WAIT_S),) if term_first else ()
            for sig, wait in (*steps, (signal.SIGKILL, 5.0)):
                for pid in _netns_pids(ns):
                    try:
                        os.kill(int(pid), sig)
                    except (ProcessLookupError, ValueError):
                        pass
                deadline = time.monotonic() + wait
                while time.monotonic() < deadline and _netns_pids(ns):
                    time.sleep(0.05)
                if not _netns_pids(ns):
                    break
            if shm and not _netns_pids(ns):
                release_shm(shm)
            _ip("netns", "del", ns, check=False)
        _ip("link", "del", veth, netns=self.net.node_netns, check=False)
