"""Every setting the agent reads from its environment, parsed and validated once at start.

``fabric-agent serve`` calls ``load`` before it touches a device; a bad value stops it with a
message naming each bad variable (exit status 2). The result, one frozen ``AgentSettings``,
travels in AgentState.settings to the API and the workers; nothing else reads os.environ.

  FABRIC_UDP_FLOW_SECS, FABRIC_MISS_INSERTS, FABRIC_XDP_FORWARD   the dataplane (agent/dataplane/settings.py)
  FABRIC_BGP, FABRIC_BGP_*                                          VIP announcements (agent/bgp/settings.py)
  FABRIC_MODEL_*, HF_ENDPOINT, HF_TOKEN, FABRIC_HF_TOKEN_FILE       model downloads (agent/models/settings.py)
  FABRIC_VFIO_KEEP_BOUND (0)    1: released GPUs stay on vfio-pci for the next VM (docs/gpu-hosts.md)
  FABRIC_PCI_MIG (0)            1: this agent creates and destroys MIG instances (agent/hw/mig.py)
  FABRIC_IMAGES_DIR             where the guest pieces live (default: the repository's images/)
  FABRIC_FAIL_CLOSED_WINDOW_SECS (30)  a fail-closed site's node withdraws its services after this long
                                without an answered heartbeat (agent/fail_closed.py)
  FABRIC_LAB_ENGINE (sim), FABRIC_LAB_ENGINE_PYTHON, FABRIC_LAB_ENGINE_KV_BYTES, FABRIC_LAB_ENGINE_NICE   the lab's engine (LabEngineSettings below; agent/vm/lab_engine.py runs it)
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from agent.bgp.settings import BgpSettings
from agent.models.settings import ModelSettings
from common.errors import FabricError, InvalidInput

if TYPE_CHECKING:  # the dataplane package loads numba: imported when a value is made, not here
    from agent.dataplane.settings import DataplaneSettings

# Names whose values a cloud-init seed must never contain (agent/vm/cloud_init.check_no_secrets).
SECRET_ENV = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HUGGINGFACE_TOKEN")
SECRET_WORDS = ("TOKEN", "KEY", "SECRET", "PASSWORD")

# The lab's engine (agent/vm/lab_engine.py runs it)
ENGINES = ("sim", "vllm")
DEFAULT_KV_BYTES = 128 << 20
DEFAULT_NICE = 10
REPO_ENGINE_PYTHON = Path(__file__).resolve().parents[1] / ".venv-engine" / "bin" / "python"
BASE_ENV = ("PATH", "LANG", "LC_ALL", "TZ")  # what the engine inherits from the agent


class AgentSettingsError(ValueError):
    """One or more of the agent's variables are unusable; the message names each one."""


@dataclass(frozen=True)
class LabEngineSettings:
    engine: str = "sim"
    python: Path = REPO_ENGINE_PYTHON
    kv_cache_bytes: int = DEFAULT_KV_BYTES
    nice: int = DEFAULT_NICE
    # PATH and locale of the agent's own environment, as read at start: the engine's base
    base_env: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise InvalidInput(f"FABRIC_LAB_ENGINE must be one of {', '.join(ENGINES)}, got {self.engine!r}")
        if not 16 << 20 <= self.kv_cache_bytes <= 64 << 30:
            raise InvalidInput(f"FABRIC_LAB_ENGINE_KV_BYTES must be from 16 MiB to 64 GiB, got {self.kv_cache_bytes}")
        if not 0 <= self.nice <= 19:
            raise InvalidInput(f"FABRIC_LAB_ENGINE_NICE must be from 0 to 19, got {self.nice}")

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> LabEngineSettings:
        """env: the process environment its settings read at start (agent/settings.py, the lab CLI)."""
        kv = _whole(env, "FABRIC_LAB_ENGINE_KV_BYTES", DEFAULT_KV_BYTES, "a whole number of bytes")
        nice = _whole(env, "FABRIC_LAB_ENGINE_NICE", DEFAULT_NICE, "a whole number from 0 to 19")
        python = env.get("FABRIC_LAB_ENGINE_PYTHON", "").strip()
        return cls(engine=env.get("FABRIC_LAB_ENGINE", "").strip().lower() or "sim",
                   python=Path(python) if python else REPO_ENGINE_PYTHON, kv_cache_bytes=kv, nice=nice,
                   base_env=tuple((k, env[k]) for k in BASE_ENV if k in env))

    def real_for(self, runtime: str) -> bool:
        return self.engine == "vllm" and runtime == "vllm"


def _whole(env: Mapping[str, str], name: str, default: int, what: str) -> int:
    raw = env.get(name, "").strip()
    try:
        return int(raw) if raw else default
    except ValueError:
        raise InvalidInput(f"{name} must be {what}, got {raw!r}") from None



@dataclass(frozen=True)
class AgentSettings:
    dataplane: DataplaneSettings = field(default_factory=lambda: _dataplane_settings({}))
    bgp: BgpSettings = field(default_factory=BgpSettings)
    models: ModelSettings = field(default_factory=ModelSettings)
    vfio_keep_bound: bool = False
    pci_mig: bool = False
    images_dir: Path | None = None  # None: the repository's images/
    lab_engine: LabEngineSettings = field(default_factory=LabEngineSettings)
    fail_closed_window_s: float = 30.0


def _dataplane_settings(env: Mapping[str, str]) -> DataplaneSettings:
    from agent.dataplane.settings import DataplaneSettings

    return DataplaneSettings.from_env(env)


def _flag(env: Mapping[str, str], name: str, errors: list[str]) -> bool:
    raw = env.get(name, "").strip()
    if raw not in ("", "0", "1"):
        errors.append(f"{name} must be 0 or 1, got {raw!r}")
    return raw == "1"


def load(env: Mapping[str, str] | None = None, *, node_ip: str | None = None) -> AgentSettings:
    """Parse and validate every setting; AgentSettingsError naming each bad variable."""
    env = os.environ if env is None else env
    errors: list[str] = []

    def part(make):
        try:
            return make()
        except (ValueError, FabricError) as exc:
            errors.append(str(getattr(exc, "message", exc)))
            return None

    dataplane = part(lambda: _dataplane_settings(env))
    bgp = part(lambda: BgpSettings.from_env(env, node_ip=node_ip))
    models = part(lambda: ModelSettings.from_env(dict(env)))
    lab_engine = part(lambda: LabEngineSettings.from_env(env))
    keep = _flag(env, "FABRIC_VFIO_KEEP_BOUND", errors)
    mig = _flag(env, "FABRIC_PCI_MIG", errors)
    images = env.get("FABRIC_IMAGES_DIR", "").strip()
    if images and not images.startswith("/"):
        errors.append(f"FABRIC_IMAGES_DIR={images!r} is not an absolute path")
    window = _seconds(env, "FABRIC_FAIL_CLOSED_WINDOW_SECS", 30.0, errors)
    if errors:
        raise AgentSettingsError("; ".join(errors))
    return AgentSettings(dataplane, bgp, models, vfio_keep_bound=keep, pci_mig=mig,
                         images_dir=Path(images) if images else None, lab_engine=lab_engine,
                         fail_closed_window_s=window)


def _seconds(env: Mapping[str, str], name: str, default: float, errors: list[str]) -> float:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 1 <= value <= 86400:
        errors.append(f"{name} must be seconds between 1 and 86400, got {raw!r}")
        return default
    return value


def images_dir_override(env: Mapping[str, str] | None = None) -> Path | None:
    """FABRIC_IMAGES_DIR (checked at start by load), for agent/vm/cloud_init.images_dir."""
    env = os.environ if env is None else env
    raw = env.get("FABRIC_IMAGES_DIR", "").strip()
    return Path(raw) if raw else None


def secret_values(env: Mapping[str, str] | None = None) -> list[tuple[str, str]]:
    """(name, value) of every secret this process can see, for a seed's defence-in-depth check:
    the Hugging Face token names, and FABRIC_* names holding TOKEN, KEY, SECRET or PASSWORD."""
    env = os.environ if env is None else env
    return [(name, value) for name, value in env.items()
            if name in SECRET_ENV or (name.startswith("FABRIC_") and any(w in name for w in SECRET_WORDS))]


def inherited_env(names: tuple[str, ...]) -> dict[str, str]:
    """The agent's own values of ``names`` (PATH, locale...): the base of an engine child's environment,
    read where the child starts so that nothing else of the agent's environment reaches it."""
    return {k: os.environ[k] for k in names if k in os.environ}
