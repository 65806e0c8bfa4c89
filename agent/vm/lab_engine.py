"""Which engine a lab replica runs, and the real vLLM engine's command line and environment.

``FABRIC_LAB_ENGINE`` (read once, into the agent's settings): ``sim`` (the default) runs
fabric-engine-sim; ``vllm`` runs the real vLLM engine for replicas of runtime ``vllm``: the CPU
build installed by scripts/setup-engine.sh in .venv-engine (``FABRIC_LAB_ENGINE_PYTHON`` names
another interpreter). Other runtimes always get the simulator.

The real engine's command line is the one a GPU VM's guest unit runs (common/runtimes.py through
agent/vm/cloud_init.engine_argv: ``vllm serve /models --served-model-name NAME --host 0.0.0.0
--port 8000 --tensor-parallel-size 1 ...`` with the deployment's flags and the LoRA flags), so
vLLM's own argument parser checks the flags Fabric sends to GPU guests. Only the binary and these
CPU-specific settings differ:

  binary       ENGINE_PYTHON agent/vm/vllm_launcher.py --fabric-replica-id ID (the CPU build's fix)
  --enforce-eager                 no torch.compile: /health in ~30 s instead of ~60 s
  --kv-cache-memory-bytes N       FABRIC_LAB_ENGINE_KV_BYTES (128 MiB): else the CPU engine takes most RAM
  --tensor-parallel-size 1        the lab's GPUs are simulated; one CPU worker
The guest's --kv-events-config (common/runtimes.VLLM_KV_EVENTS_CONFIG: PUB tcp://*:5557, replay
tcp://*:5558) stays: the replica's own network namespace holds the ports, and the node agent's
kv-index subscribes there as it does to a guest (docs/kv-events.md).
  VLLM_HOST_IP / VLLM_LOOPBACK_IP 127.0.0.1: its internal sockets stay on the replica's loopback
  VLLM_CACHE_ROOT, TMPDIR, TORCHINDUCTOR_CACHE_DIR, HOME, XDG_CACHE_HOME
                                  under the replica's own directory, removed with it
  VLLM_RPC_BASE_PATH              @fabric-vllm-HASH: abstract sockets, the replica's netns's own
  HF_HUB_OFFLINE=1, VLLM_NO_USAGE_STATS=1, DO_NOT_TRACK=1   the model is already on disk
  VLLM_CPU_OMP_THREADS_BIND N     the CPU worker's core, one per replica (pick_worker_cpu), as a
                                  guest has vCPUs of its own: vLLM's "auto" bound every lab
                                  replica's worker to the host's core 0
The engine's processes run at nice ``FABRIC_LAB_ENGINE_NICE`` (10; 0 leaves them alone), and so
does the session's autogroup (``/proc/PID/autogroup``: with autogroups, Linux shares CPU between
sessions first, so a process's own nice only counts inside its session). A GPU VM's engine has
vCPUs of its own, and the gateway, agent and fabricd run elsewhere; on a 2-core lab host the
engine's worker and EngineCore keep both cores busy, and at nice 0 the gateway waited on the run
queue for ~10 ms at each wakeup (15 s of waiting in an 8 s, 4-client run, 0.2 s of CPU), which
made a gateway call take 2.5x a direct one in the same engine batches (docs/runtimes.md).
The replica gets a private mount namespace (``ip netns exec`` makes one) in which the verified
model directory is bound read-only at /models and the adapter set at /adapters, where a guest
sees them; the two empty mount points are made on the host when missing.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from pathlib import Path

from agent.settings import BASE_ENV, REPO_ENGINE_PYTHON
from common.errors import InvalidInput

LAUNCHER = Path(__file__).with_name("vllm_launcher.py")
GUEST_MODELS, GUEST_ADAPTERS = "/models", "/adapters"


def engine_installed(python: Path = REPO_ENGINE_PYTHON) -> str | None:
    """None when the real engine can run from ``python``, else why not (for `make run`'s fallback)."""
    if not python.exists():
        return f"{python} is missing (scripts/setup-engine.sh installs it)"
    site = next(iter(python.parent.parent.glob("lib/python3*/site-packages")), None)
    if site is None or not any(site.glob("vllm_cpu-*.dist-info")):
        return f"vllm-cpu is not installed beside {python}"
    return None


def guest_argv(spec) -> list[str]:
    """The vLLM guest's argv for ``spec`` (binary first), built from the same pieces as the guest
    unit's ExecStart (agent/vm/cloud_init.render_engine_unit): the model at /models, the parallel
    plan for the spec's GPUs (none here: 1), the LoRA flags, the profile's and deployment's flags."""
    from agent.vm import cloud_init, runtime_units
    from agent.vm.parallelism import choose_parallel, read_model_config
    from common.runtimes import runtime

    host_dir = cloud_init.host_model_dir(spec, None)
    config = read_model_config(host_dir) if host_dir is not None else None
    plan = choose_parallel(config, len(spec.gpus), pipeline_ok=True)
    extra = tuple(spec.extra_args)
    if plan.pipeline > 1:
        extra = ("--pipeline-parallel-size", str(plan.pipeline), *extra)
    extra = (*cloud_init.lora_args(spec), *extra)
    runtime_units.check_extra_args(extra)
    return runtime(spec.runtime).command_line(
        model_path=GUEST_MODELS, served_name=spec.model_name, port=spec.port, tensor_parallel=plan.tensor,
        max_model_len=spec.max_model_len, extra_args=extra)


def real_engine_argv(guest_argv: list[str], python: Path, replica_id: str, kv_cache_bytes: int) -> list[str]:
    """The guest's argv with the binary replaced by the launcher, plus the CPU-only flags."""
    cpu = ["--enforce-eager", "--kv-cache-memory-bytes", str(kv_cache_bytes)]
    if "--tensor-parallel-size" in guest_argv:  # the lab's GPUs are simulated: one CPU worker (last flag wins)
        cpu += ["--tensor-parallel-size", "1"]
    return [str(python), str(LAUNCHER), "--fabric-replica-id", replica_id, *guest_argv[1:], *cpu]


def rpc_base(replica_dir: Path) -> str:
    """VLLM_RPC_BASE_PATH: Linux's abstract socket namespace ("@" in zmq's ipc:// addresses), which
    belongs to the network namespace, so a replica's sockets are its own, leave no file behind, and
    keep clear of the 107-byte limit of a socket path (a long state directory would pass it)."""
    return "@fabric-vllm-" + hashlib.sha256(str(replica_dir).encode()).hexdigest()[:12]


def pick_worker_cpu(taken: list[int], allowed: list[int]) -> int:
    """The core for a new replica's CPU worker: of the cores this process may use (``allowed``),
    the one fewest live lab engines' workers hold (``taken``), the lowest on a tie. A lab host is
    the replicas' shared "GPU": like a VM's own vCPUs, each engine gets a core of its own while
    there are cores left, and the replicas share them evenly after that."""
    if not allowed:
        raise InvalidInput("no CPU is allowed for the engine's worker")
    return min(sorted(allowed), key=lambda cpu: taken.count(cpu))


def real_engine_env(replica_dir: Path, *, lora: bool, base: Mapping[str, str],
                    worker_cpu: int | None = None) -> dict[str, str]:
    """The engine's environment: PATH and locale from ``base`` (LabEngineSettings.base_env), every
    cache and socket under ``replica_dir`` (made here), the worker bound to ``worker_cpu`` when
    given (else vLLM's own "auto" binding)."""
    dirs = {name: replica_dir / name for name in ("cache", "tmp", "inductor", "home")}
    for d in dirs.values():
        d.mkdir(parents=True, exist_ok=True)
    env = {k: base[k] for k in BASE_ENV if k in base}
    env |= {
        "HOME": str(dirs["home"]), "XDG_CACHE_HOME": str(dirs["cache"]), "VLLM_CACHE_ROOT": str(dirs["cache"]),
        "VLLM_RPC_BASE_PATH": rpc_base(replica_dir), "TMPDIR": str(dirs["tmp"]),
        "TORCHINDUCTOR_CACHE_DIR": str(dirs["inductor"]), "VLLM_HOST_IP": "127.0.0.1",
        "VLLM_LOOPBACK_IP": "127.0.0.1", "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1", "VLLM_TARGET_DEVICE": "cpu", "PYTHONUNBUFFERED": "1",
    }
    if lora:
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
    if worker_cpu is not None:
        env["VLLM_CPU_OMP_THREADS_BIND"] = str(worker_cpu)
    return env


# Run inside `ip netns exec` (which gives the command its own mount namespace): bind the model
# read-only at /models and the adapter set at /adapters, then exec the engine.
_MOUNT_SCRIPT = ('set -e; mount --bind "$1" /models; mount -o remount,bind,ro /models; '
                 'if [ -n "$2" ]; then mount --bind "$2" /adapters; mount -o remount,bind,ro /adapters; fi; '
                 'shift 2; exec "$@"')


def in_guest_mounts(argv: list[str], model_dir: str, adapters_dir: str | None) -> list[str]:
    for point in (GUEST_MODELS, GUEST_ADAPTERS):
        Path(point).mkdir(exist_ok=True)
    if not Path(model_dir).is_dir():
        raise InvalidInput(f"model directory {model_dir} does not exist")
    return ["sh", "-c", _MOUNT_SCRIPT, "fabric-mounts", model_dir, adapters_dir or "", *argv]


def yield_cpu(pid: int, nice: int) -> None:
    """Lower a freshly started engine's CPU priority: the process (its children inherit it; vLLM
    starts EngineCore and the worker seconds later, after its imports) and its session's
    autogroup, which is what Linux weighs against the gateway's and the agent's sessions when
    autogroups are on. A kernel without autogroups has no such file: the process nice is all.
    An engine that already exited is left to the driver's status (its own error line)."""
    if nice <= 0:
        return
    try:
        os.setpriority(os.PRIO_PROCESS, pid, nice)
        Path(f"/proc/{pid}/autogroup").write_text(str(nice))
    except (FileNotFoundError, ProcessLookupError):
        pass


def shm_segments(pids: list[str]) -> set[Path]:
    """The /dev/shm files these processes have mapped (vLLM's shared-memory queues, psm_*). A
    SIGKILLed engine cannot unlink its own; ``release_shm`` does once its processes are gone."""
    found: set[Path] = set()
    for pid in pids:
        try:
            maps = Path(f"/proc/{pid}/maps").read_text()
        except OSError:
            continue
        for line in maps.splitlines():
            path = line.split(maxsplit=5)[-1] if line.count(" ") >= 5 else ""
            if path.startswith("/dev/shm/") and "/" not in path[len("/dev/shm/"):]:
                found.add(Path(path.removesuffix(" (deleted)")))
    return found


def release_shm(segments: set[Path]) -> None:
    for seg in segments:
        seg.unlink(missing_ok=True)


def engine_error_line(log: Path, tail_bytes: int = 16384) -> str:
    """The engine's own last error line from its log ("ValueError: ..."), for a replica whose
    engine exited (a model it cannot load: a bad config, no tokenizer); "" when there is none."""
    try:
        with open(log, "rb") as f:
            f.seek(max(0, f.seek(0, 2) - tail_bytes))
            lines = f.read().decode(errors="replace").splitlines()
    except OSError:
        return ""
    for line in reversed(lines):
        text = line.split("] ", 1)[-1].strip() if line.startswith("(") else line.strip()
        head = text.split(":", 1)[0]
        if ":" in text and (head.endswith(("Error", "Exception")) or head in ("RuntimeError", "OSError")):
            return text[:300]
    return ""
