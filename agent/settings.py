"""Every setting the agent reads from its environment, parsed and validated once at start.

``fabric-agent serve`` calls ``load`` before it touches a device; a bad value stops it with a
message naming each bad variable (exit status 2). The result, one frozen ``AgentSettings``,
travels in AgentState.settings to the API, the drivers and the workers; nothing else reads
os.environ (tests/common/test_settings_only_read_env.py). This module imports nothing of the
agent's: every agent package may import it.

  FABRIC_UDP_FLOW_SECS (30), FABRIC_MISS_INSERTS (10000), FABRIC_XDP_FORWARD (1)   the dataplane
                                (DataplaneSettings: written into the config map at attach)
  FABRIC_BGP, FABRIC_BGP_*      VIP announcements (BgpSettings below, docs/dataplane.md)
  FABRIC_MODEL_*, HF_ENDPOINT, HF_TOKEN, FABRIC_HF_TOKEN_FILE       model downloads (ModelSettings, docs/models.md)
  FABRIC_VFIO_KEEP_BOUND (0)    1: released GPUs stay on vfio-pci for the next VM (docs/gpu-hosts.md)
  FABRIC_PCI_MIG (0)            1: this agent creates and destroys MIG instances (agent/hw/mig.py)
  FABRIC_IMAGES_DIR             where the guest pieces live (default: the package's images/)
  FABRIC_FAIL_CLOSED_WINDOW_SECS (30)  a fail-closed site's node withdraws its services after this long
                                without an answered heartbeat (agent/fail_closed.py)
  FABRIC_OBSERVE_ENGINES (1), FABRIC_OBSERVE_SECS (5)   the agent scrapes the engines on its host
                                every FABRIC_OBSERVE_SECS and reports what changed materially to
                                fabricd (agent/engine_watch.py); 0: fabricd scrapes them itself
  FABRIC_SCRAPE_TIMEOUT_SECS (2)   one engine scrape's deadline there, its /health probe included
                                (0.1-60; the same name and default as fabricd's)
  FABRIC_LAB_ENGINE (sim), FABRIC_LAB_ENGINE_PYTHON, FABRIC_LAB_ENGINE_KV_BYTES, FABRIC_LAB_ENGINE_NICE   the lab's engine (LabEngineSettings below; agent/vm/lab_engine.py runs it)
  HF_TOKEN..., FABRIC_*TOKEN*/KEY/SECRET/PASSWORD   kept (never shown) so that a cloud-init seed is
                                refused if it holds one (agent/vm/cloud_init.check_no_secrets)
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from common.errors import FabricError, InvalidInput
from common.model_manifest import DEFAULT_MAX_FILES

# Names whose values a cloud-init seed must never contain (agent/vm/cloud_init.check_no_secrets).
SECRET_ENV = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HUGGINGFACE_TOKEN")
SECRET_WORDS = ("TOKEN", "KEY", "SECRET", "PASSWORD")

# The lab's engine (agent/vm/lab_engine.py runs it)
ENGINES = ("sim", "vllm")
DEFAULT_KV_BYTES = 128 << 20
DEFAULT_NICE = 10
REPO_ENGINE_PYTHON = Path(__file__).resolve().parents[1] / ".venv-engine" / "bin" / "python"
BASE_ENV = ("PATH", "LANG", "LC_ALL", "TZ")  # what the engine inherits from the agent

# The dataplane: node-wide values the agent writes into the config map at attach. Nothing else
# writes them: a process that merely opens the pinned maps (the CLI, a test) never changes
# node_ip or the flow timeouts of a running node.
UDP_FLOW_SECS = 30  # FABRIC_UDP_FLOW_SECS: a UDP flow silent this long is picked again
MISS_INSERTS = 10000  # FABRIC_MISS_INSERTS: non-SYN misses recorded per CPU per second
# FABRIC_XDP_FORWARD: translated packets leave by fib lookup + redirect (1, default) or
# through the kernel stack (0: slower, for comparison or a device that drops XDP frames)
XDP_FORWARD = True

# BGP (FABRIC_BGP_*), off by default:
#   FABRIC_BGP=1                      turn announcements on (anything but 0/1/unset is refused)
#   FABRIC_BGP_LOCAL_ASN=65001        this node's AS number (1-4294967294); required when on
#   FABRIC_BGP_PEERS=IP:ASN[,IP:ASN]  the routers to peer with; required when on
#   FABRIC_BGP_ROUTER_ID=IPv4         default: the node address (--node-ip), else the first peer's
#                                     source address as BIRD picks it
#   FABRIC_BGP_COMMUNITIES=A:B[,A:B]  standard communities attached to every announcement
#   FABRIC_BGP_HOLD_SECS=9            hold time offered to peers (3-65535); keepalives every third
#   FABRIC_BGP_BFD=0|1                BFD on every session (sub-second failure detection)
#   FABRIC_BGP_BFD_INTERVAL_MS=100    BFD tx/rx interval (10-10000); detection is 3 intervals
#   FABRIC_BGP_BIRD=bird              the BIRD 2 binary the agent runs (birdc is found beside it)
DEFAULT_HOLD_SECS = 9
DEFAULT_BFD_INTERVAL_MS = 100
MAX_ASN = 4294967294  # 4294967295 is reserved (RFC 7300)


class AgentSettingsError(ValueError):
    """One or more of the agent's variables are unusable; the message names each one."""


@dataclass(frozen=True)
class DataplaneSettings:
    udp_flow_secs: int = UDP_FLOW_SECS
    miss_inserts: int = MISS_INSERTS
    xdp_forward: bool = XDP_FORWARD

    def __post_init__(self) -> None:
        if not isinstance(self.xdp_forward, bool):
            raise InvalidInput(f"FABRIC_XDP_FORWARD must be 0 or 1, got {self.xdp_forward!r}")
        _check("FABRIC_UDP_FLOW_SECS", self.udp_flow_secs, 1, 86400)
        _check("FABRIC_MISS_INSERTS", self.miss_inserts, 1, 10_000_000)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> DataplaneSettings:
        return cls(udp_flow_secs=_int(env, "FABRIC_UDP_FLOW_SECS", UDP_FLOW_SECS),
                   miss_inserts=_int(env, "FABRIC_MISS_INSERTS", MISS_INSERTS),
                   xdp_forward=_flag01(env, "FABRIC_XDP_FORWARD", XDP_FORWARD))


@dataclass(frozen=True)
class Peer:
    address: str
    asn: int

    @property
    def name(self) -> str:
        """BIRD protocol name: letters, digits and underscores only."""
        return "peer_" + self.address.replace(".", "_")


@dataclass(frozen=True)
class BgpSettings:
    enabled: bool = False
    local_asn: int = 0
    peers: tuple[Peer, ...] = ()
    router_id: str | None = None
    communities: tuple[tuple[int, int], ...] = ()
    hold_secs: int = DEFAULT_HOLD_SECS
    bfd: bool = False
    bfd_interval_ms: int = DEFAULT_BFD_INTERVAL_MS
    bird: str = "bird"

    def __post_init__(self) -> None:
        if not self.enabled:
            return
        if not isinstance(self.local_asn, int) or not 1 <= self.local_asn <= MAX_ASN:
            raise InvalidInput(f"FABRIC_BGP_LOCAL_ASN must be an AS number 1-{MAX_ASN}, got {self.local_asn!r}")
        if not self.peers:
            raise InvalidInput("FABRIC_BGP_PEERS must name at least one peer (IP:ASN) when FABRIC_BGP=1")
        if len({p.address for p in self.peers}) != len(self.peers):
            raise InvalidInput("FABRIC_BGP_PEERS names a peer twice")
        if not 3 <= self.hold_secs <= 65535:
            raise InvalidInput(f"FABRIC_BGP_HOLD_SECS must be an integer 3-65535, got {self.hold_secs!r}")
        if not 10 <= self.bfd_interval_ms <= 10000:
            raise InvalidInput(f"FABRIC_BGP_BFD_INTERVAL_MS must be an integer 10-10000, got {self.bfd_interval_ms!r}")
        if not self.bird or any(c.isspace() for c in self.bird):
            raise InvalidInput(f"FABRIC_BGP_BIRD must be a path without spaces, got {self.bird!r}")

    @property
    def keepalive_secs(self) -> int:
        return max(1, self.hold_secs // 3)

    @classmethod
    def from_env(cls, env: Mapping[str, str], node_ip: str | None = None) -> BgpSettings:
        raw = env.get("FABRIC_BGP", "")
        if raw not in ("", "0", "1"):
            raise InvalidInput(f"FABRIC_BGP must be 0 or 1, got {raw!r}")
        if raw != "1":
            return cls()
        router_id = env.get("FABRIC_BGP_ROUTER_ID", "") or node_ip or None
        if router_id is not None:
            router_id = _ipv4("FABRIC_BGP_ROUTER_ID" if env.get("FABRIC_BGP_ROUTER_ID") else "--node-ip", router_id)
        bfd = env.get("FABRIC_BGP_BFD", "")
        if bfd not in ("", "0", "1"):
            raise InvalidInput(f"FABRIC_BGP_BFD must be 0 or 1, got {bfd!r}")
        return cls(enabled=True,
                   local_asn=_int(env, "FABRIC_BGP_LOCAL_ASN", 0),
                   peers=_peers(env.get("FABRIC_BGP_PEERS", "")),
                   router_id=router_id,
                   communities=_communities(env.get("FABRIC_BGP_COMMUNITIES", "")),
                   hold_secs=_int(env, "FABRIC_BGP_HOLD_SECS", DEFAULT_HOLD_SECS),
                   bfd=bfd == "1",
                   bfd_interval_ms=_int(env, "FABRIC_BGP_BFD_INTERVAL_MS", DEFAULT_BFD_INTERVAL_MS),
                   bird=env.get("FABRIC_BGP_BIRD", "") or "bird")


@dataclass(frozen=True)
class ModelSettings:
    model_dir: str = "/srv/models"  # FABRIC_MODEL_DIR: local sources must be under it
    max_files: int = DEFAULT_MAX_FILES  # FABRIC_MODEL_MAX_FILES
    signing_key: bytes | None = field(default=None, repr=False)  # FABRIC_MODEL_SIGNING_KEY
    retries: int = 3  # FABRIC_MODEL_RETRIES
    retry_base_s: float = 1.0
    download_workers: int = 4  # FABRIC_MODEL_DOWNLOAD_WORKERS: files fetched at once
    env: dict[str, str] = field(default_factory=dict, repr=False)  # HF_ENDPOINT, HF_TOKEN, FABRIC_HF_TOKEN_FILE

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> ModelSettings:

        def number(name: str, default: int) -> int:
            raw = env.get(name, "").strip()
            try:
                value = int(raw) if raw else default
            except ValueError:
                raise ValueError(f"{name}={raw!r} is not a whole number") from None
            if value < 0:
                raise ValueError(f"{name}={raw!r} must not be negative")
            return value

        key = env.get("FABRIC_MODEL_SIGNING_KEY", "")
        return cls(model_dir=env.get("FABRIC_MODEL_DIR", "/srv/models") or "/srv/models",
                   max_files=number("FABRIC_MODEL_MAX_FILES", DEFAULT_MAX_FILES),
                   signing_key=key.encode() if key else None,
                   retries=number("FABRIC_MODEL_RETRIES", 3),
                   download_workers=number("FABRIC_MODEL_DOWNLOAD_WORKERS", 4) or 1,
                   env={k: v for k, v in env.items() if k in ("HF_ENDPOINT", "HF_TOKEN", "FABRIC_HF_TOKEN_FILE")})


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
    dataplane: DataplaneSettings = field(default_factory=DataplaneSettings)
    bgp: BgpSettings = field(default_factory=BgpSettings)
    models: ModelSettings = field(default_factory=ModelSettings)
    vfio_keep_bound: bool = False
    pci_mig: bool = False
    images_dir: Path | None = None  # None: the repository's images/
    lab_engine: LabEngineSettings = field(default_factory=LabEngineSettings)
    fail_closed_window_s: float = 30.0
    observe_engines: bool = True  # FABRIC_OBSERVE_ENGINES: agent.engine_watch reports this host's engines
    observe_secs: float = 5.0  # FABRIC_OBSERVE_SECS: how often it scrapes them
    scrape_timeout_s: float = 2.0  # FABRIC_SCRAPE_TIMEOUT_SECS: one scrape's (and probe's) deadline
    # (name, value) of every secret the agent's environment holds (SECRET_ENV, and FABRIC_* names
    # holding SECRET_WORDS): a seed holding one is refused (agent/vm/cloud_init.check_no_secrets)
    secrets: tuple[tuple[str, str], ...] = field(default=(), repr=False)


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

    dataplane = part(lambda: DataplaneSettings.from_env(env))
    bgp = part(lambda: BgpSettings.from_env(env, node_ip=node_ip))
    models = part(lambda: ModelSettings.from_env(env))
    lab_engine = part(lambda: LabEngineSettings.from_env(env))
    keep = _flag(env, "FABRIC_VFIO_KEEP_BOUND", errors)
    mig = _flag(env, "FABRIC_PCI_MIG", errors)
    images = env.get("FABRIC_IMAGES_DIR", "").strip()
    if images and not images.startswith("/"):
        errors.append(f"FABRIC_IMAGES_DIR={images!r} is not an absolute path")
    window = _seconds(env, "FABRIC_FAIL_CLOSED_WINDOW_SECS", 30.0, errors)
    observe = part(lambda: _flag01(env, "FABRIC_OBSERVE_ENGINES", True))
    observe_secs = _seconds(env, "FABRIC_OBSERVE_SECS", 5.0, errors)
    scrape_timeout = _seconds(env, "FABRIC_SCRAPE_TIMEOUT_SECS", 2.0, errors, lo=0.1, hi=60)
    if errors:
        raise AgentSettingsError("; ".join(errors))
    return AgentSettings(dataplane, bgp, models, vfio_keep_bound=keep, pci_mig=mig,
                         images_dir=Path(images) if images else None, lab_engine=lab_engine,
                         fail_closed_window_s=window, observe_engines=bool(observe), observe_secs=observe_secs,
                         scrape_timeout_s=scrape_timeout,
                         secrets=secret_values(env))


def _seconds(env: Mapping[str, str], name: str, default: float, errors: list[str],
             lo: float = 1, hi: float = 86400) -> float:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not lo <= value <= hi:
        errors.append(f"{name} must be seconds between {lo:g} and {hi:g}, got {raw!r}")
        return default
    return value


def secret_values(env: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """(name, value) of every secret in ``env``: the Hugging Face token names, and FABRIC_* names
    holding TOKEN, KEY, SECRET or PASSWORD."""
    return tuple((name, value) for name, value in env.items()
                 if name in SECRET_ENV or (name.startswith("FABRIC_") and any(w in name for w in SECRET_WORDS)))


def _flag01(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    if raw not in ("0", "1"):
        raise InvalidInput(f"{name} must be 0 or 1, got {raw!r}")
    return raw == "1"


def _int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise InvalidInput(f"{name} must be an integer, got {raw!r}") from None


def _check(name: str, value: object, low: int, high: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise InvalidInput(f"{name} must be an integer {low}-{high}, got {value!r}")


def _ipv4(name: str, raw: str) -> str:
    try:
        addr = ipaddress.IPv4Address(raw.strip())
    except ValueError:
        raise InvalidInput(f"{name} must be an IPv4 address, got {raw!r}") from None
    if addr.is_unspecified or addr.is_multicast or addr.is_loopback:
        raise InvalidInput(f"{name} must be a unicast, non-loopback IPv4 address, got {raw!r}")
    return str(addr)


def _peers(raw: str) -> tuple[Peer, ...]:
    peers = []
    for item in (p.strip() for p in raw.split(",")):
        if not item:
            continue
        ip, sep, asn = item.rpartition(":")
        if not sep:
            raise InvalidInput(f"FABRIC_BGP_PEERS: expected IP:ASN, got {item!r}")
        address = _ipv4("FABRIC_BGP_PEERS", ip)
        try:
            number = int(asn)
        except ValueError:
            raise InvalidInput(f"FABRIC_BGP_PEERS: ASN of {address} must be an integer, got {asn!r}") from None
        if not 1 <= number <= MAX_ASN:
            raise InvalidInput(f"FABRIC_BGP_PEERS: ASN of {address} must be 1-{MAX_ASN}, got {number}")
        peers.append(Peer(address, number))
    return tuple(peers)


def _communities(raw: str) -> tuple[tuple[int, int], ...]:
    out = []
    for item in (c.strip() for c in raw.split(",")):
        if not item:
            continue
        a, sep, b = item.partition(":")
        try:
            pair = (int(a), int(b)) if sep else None
        except ValueError:
            pair = None
        if pair is None or not all(0 <= v <= 65535 for v in pair):
            raise InvalidInput(f"FABRIC_BGP_COMMUNITIES: expected A:B with 0-65535 each, got {item!r}")
        out.append(pair)
    return tuple(out)
