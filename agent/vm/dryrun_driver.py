"""The dry-run VM driver: no VM and no GPU bind, one real `fabric-engine-sim` process per replica.

Everything above the driver (agent API, control plane, routing, gateway) then runs for real
against a real OpenAI-compatible HTTP server on a loopback port.

Invariants:
  - One record file per replica under ``state_dir`` (``<replica_id>.json``: pid, port, host,
    command line). It is written before create returns, so an agent restart adopts the
    process instead of starting a second one; a record whose process is gone (or whose pid
    was reused by something else, checked through /proc/PID/cmdline) reads as ``failed``.
  - Engines run in their own session so they outlive an agent restart; delete ends the
    whole process group (SIGTERM, then SIGKILL after a bounded wait) and removes the record.
  - create of an existing replica returns its status; delete of an absent one returns False.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from agent.vm.base import VmSpec, VmStatus
from agent.vm.engine_env import engine_env
from agent.vm.records import RecordDir, engine_alive
from common.errors import TransientError

STOP_WAIT_S = 5.0


def default_engine_command() -> list[str]:
    """The engine from the agent's own install (the console script beside this interpreter), else
    one on PATH, else the module (same code, e.g. in a bare checkout)."""
    venv_exe = Path(sys.executable).with_name("fabric-engine-sim")
    exe = str(venv_exe) if venv_exe.exists() else shutil.which("fabric-engine-sim")
    return [exe] if exe else [sys.executable, "-m", "enginesim.cli"]


def free_loopback_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def engine_argv(base: list[str], spec: VmSpec, host: str, port: int) -> list[str]:
    """The engine sim command for one replica. Knobs from spec.engine_args become --KEY VALUE;
    a value of "true" (or "") is a bare flag such as --legacy-metric-names, "false" omits it."""
    argv = [*base, "--host", host, "--port", str(port), "--model", spec.model_name,
            "--replica-id", spec.replica_id]
    if spec.runtime != "vllm":
        # Health and metrics where that runtime serves them; Triton and TEI take their fixed
        # metrics port (8002, 9000), so one host holds one such dry-run replica at a time.
        argv += ["--runtime", spec.runtime]
    if spec.adapters_dir:  # what the replica sees as /adapters (a VM mounts the share there)
        argv += ["--lora-root", spec.adapters_dir, "--max-loras", str(spec.max_loras or 1)]
    if spec.max_model_len and "max_model_len" not in spec.engine_args:
        argv += ["--max-model-len", str(spec.max_model_len)]
    for key, value in sorted(spec.engine_args.items()):
        flag = f"--{key.replace('_', '-')}"
        if str(value).lower() in ("true", ""):
            argv.append(flag)
        elif str(value).lower() != "false":
            argv += [flag, str(value)]
    return argv


@dataclass(frozen=True)
class EngineRecord:
    replica_id: str
    pid: int
    host: str
    port: int
    argv: list[str]
    started_at: float


def _port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.2):
            return True
    except OSError:
        return False


class DryRunDriver:
    name = "dry-run"

    def __init__(self, state_dir: str | Path, *, engine_command: list[str] | None = None,
                 host: str = "127.0.0.1"):
        self.state_dir = Path(state_dir)
        self.records = RecordDir(self.state_dir, EngineRecord)
        self.engine_command = engine_command or default_engine_command()
        self.host = host
        self._children: dict[str, subprocess.Popen] = {}  # reaped by us; adopted ones are not
        self._lock = threading.Lock()

    def _alive(self, rec: EngineRecord) -> bool:
        child = self._children.get(rec.replica_id)
        if child is not None:
            # Our own child: poll() is exact, and right after fork /proc/PID/cmdline may still
            # show the parent's command line, so the cmdline check is for adopted engines only.
            return child.poll() is None
        return engine_alive(rec.pid, rec.replica_id)

    def _status(self, rec: EngineRecord) -> VmStatus:
        if not self._alive(rec):
            child = self._children.get(rec.replica_id)
            code = child.returncode if child is not None else None
            why = f" (exit code {code})" if code is not None else ""
            return VmStatus(rec.replica_id, "failed", rec.host, rec.port,
                            f"engine process {rec.pid} is not running{why}")
        if _port_open(rec.host, rec.port):
            return VmStatus(rec.replica_id, "running", rec.host, rec.port,
                            f"engine sim pid {rec.pid} listening on {rec.host}:{rec.port}")
        return VmStatus(rec.replica_id, "starting", rec.host, rec.port,
                        f"engine sim pid {rec.pid} not yet listening on {rec.host}:{rec.port}")

    # VmDriver --------------------------------------------------------------------------
    def create(self, spec: VmSpec) -> VmStatus:
        with self._lock:
            rec = self.records.load(spec.replica_id)
            if rec is not None and self._alive(rec):
                return self._status(rec)
            if rec is not None:  # a dead engine: start it again under the same record name
                self._stop(rec)
            port = free_loopback_port(self.host)
            argv = engine_argv(self.engine_command, spec, self.host, port)
            try:
                with open(self.log_path(spec.replica_id), "ab") as log:
                    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, env=engine_env(),
                                            stderr=subprocess.STDOUT, start_new_session=True)
            except OSError as exc:
                raise TransientError(f"cannot start the engine sim for {spec.replica_id}: {exc}") from exc
            self._children[spec.replica_id] = proc
            rec = EngineRecord(spec.replica_id, proc.pid, self.host, port, argv, time.time())
            self.records.save(rec)
            return self._status(rec)

    def get(self, vm_id: str) -> VmStatus | None:
        rec = self.records.load(vm_id)
        return None if rec is None else self._status(rec)

    def list(self) -> list[VmStatus]:
        return [self._status(rec) for rec in self.records.all()]

    def delete(self, vm_id: str) -> bool:
        with self._lock:
            rec = self.records.load(vm_id)
            if rec is None:
                return False
            self._stop(rec)
            self.records.remove(vm_id)
            self.log_path(vm_id).unlink(missing_ok=True)
            return True

    def log_path(self, vm_id: str) -> Path:
        """Where the engine's output goes (served by GET /v1/vms/{id}/logs)."""
        return self.state_dir / f"{vm_id}.log"

    def _stop(self, rec: EngineRecord) -> None:
        child = self._children.pop(rec.replica_id, None)
        if self._alive_or_child(rec, child):
            _signal_group(rec.pid, signal.SIGTERM)
            deadline = time.monotonic() + STOP_WAIT_S
            while time.monotonic() < deadline and self._alive_or_child(rec, child):
                time.sleep(0.05)
            if self._alive_or_child(rec, child):
                _signal_group(rec.pid, signal.SIGKILL)
        if child is not None:
            try:
                child.wait(timeout=STOP_WAIT_S)
            except subprocess.TimeoutExpired:
                pass

    @staticmethod
    def _alive_or_child(rec: EngineRecord, child: subprocess.Popen | None) -> bool:
        if child is not None:
            return child.poll() is None
        return engine_alive(rec.pid, rec.replica_id)


def _signal_group(pid: int, sig: int) -> None:
    # The engine leads its own session (start_new_session), so its group id is its pid.
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass
    except PermissionError:
        os.kill(pid, sig)
