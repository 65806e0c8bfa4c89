"""The simulator's settings (fixed at start) and the fault/load state that changes at runtime.

`EngineSettings` is what `fabric-engine-sim` flags fill (enginesim.cli; the simulator reads no
environment variable), made once at start and handed down as the engine's one handle
(`Engine.settings`); `Faults` and `SyntheticLoad`
start from it and are replaced wholesale by POST /sim/faults and POST /sim/load, so
a reader never sees a half-applied update.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass, field

from common.runtimes import RUNTIME_TABLE


@dataclass(frozen=True)
class EngineSettings:
    model: str = "sim-model"
    host: str = "127.0.0.1"
    port: int = 8000
    # Shown in the x-fabric-replica header so balancing tests can tell who answered.
    replica_id: str = field(default_factory=socket.gethostname)
    max_num_seqs: int = 8
    max_model_len: int = 4096
    # 0 means "as fast as possible": no sleep at all for that phase.
    prefill_tokens_per_s: float = 5000.0
    tokens_per_s: float = 50.0
    default_max_tokens: int = 16
    # When > 0, each prompt has a deterministic natural length around this value and
    # stops there (finish_reason "stop") if max_tokens does not cut it first.
    natural_length: int = 0
    kv_capacity_tokens: int = 16384
    prefix_cache_blocks: int = 0  # 16-token blocks the prefix cache holds; 0: no prefix caching
    # vLLM's --kv-events-config JSON: the prefix cache publishes BlockStored/BlockRemoved over ZMQ
    kv_events_config: str | None = None
    max_loras: int = 4  # LoRA adapters loaded at once (vLLM --max-loras; lora_routes)
    lora_root: str | None = None  # what the replica sees as /adapters (lora_routes); None: paths as given
    chars_per_token: int = 4
    embedding_dim: int = 256
    legacy_metric_names: bool = False
    # Which runtime's metric names, metrics path and health path to serve (common/runtimes.py);
    # metrics_port None means that runtime's own (Triton 8002, TEI 9000, else the API port).
    runtime: str = "vllm"
    metrics_port: int | None = None
    fail_health: bool = False
    error_rate: float = 0.0
    added_latency_ms: int = 0
    seed: int = 0
    log_level: str = "warning"
    # vLLM's --shutdown-timeout: 0 (its default) stops the engine at SIGTERM (requests in flight get
    # nothing more); N > 0 lets them run to their end for up to N s, then stops it (Fabric's guests: 30).
    shutdown_timeout_s: float = 0.0

    def __post_init__(self) -> None:
        # Reject impossible knobs at start rather than misbehaving under load.
        problems = []
        if self.max_num_seqs < 1:
            problems.append("max_num_seqs must be >= 1")
        if self.max_model_len < 1:
            problems.append("max_model_len must be >= 1")
        if self.prefill_tokens_per_s < 0 or self.tokens_per_s < 0:
            problems.append("token rates must be >= 0 (0 = as fast as possible)")
        if self.default_max_tokens < 1:
            problems.append("default_max_tokens must be >= 1")
        if self.natural_length < 0:
            problems.append("natural_length must be >= 0")
        if self.max_loras < 1:
            problems.append("max_loras must be >= 1")
        if self.prefix_cache_blocks < 0:
            problems.append("prefix_cache_blocks must be >= 0")
        if self.kv_capacity_tokens < 1:
            problems.append("kv_capacity_tokens must be >= 1")
        if self.chars_per_token < 1:
            problems.append("chars_per_token must be >= 1")
        if self.embedding_dim < 1:
            problems.append("embedding_dim must be >= 1")
        if not 0.0 <= self.error_rate <= 1.0:
            problems.append("error_rate must be within 0..1")
        if self.added_latency_ms < 0:
            problems.append("added_latency_ms must be >= 0")
        if self.kv_events_config is not None:
            from common.kv_events import parse_kv_events_config

            try:
                parse_kv_events_config(self.kv_events_config)
            except ValueError as err:
                problems.append(str(err))
        if self.runtime not in RUNTIME_TABLE:
            problems.append(f"runtime must be one of {', '.join(RUNTIME_TABLE)}")
        if self.metrics_port is not None and not 0 < self.metrics_port < 65536:
            problems.append("metrics_port must be 1-65535")
        if problems:
            raise ValueError("; ".join(problems))

    @property
    def serving_metrics_port(self) -> int:
        """Where /metrics is served: the API port unless the runtime (or --metrics-port) says."""
        if self.metrics_port is not None:
            return self.metrics_port
        return RUNTIME_TABLE[self.runtime].scrape_port(self.port)

    def initial_faults(self) -> Faults:
        return Faults(
            fail_health=self.fail_health,
            error_rate=self.error_rate,
            added_latency_ms=self.added_latency_ms,
        )


@dataclass(frozen=True)
class Faults:
    fail_health: bool = False
    error_rate: float = 0.0
    added_latency_ms: int = 0


@dataclass(frozen=True)
class SyntheticLoad:
    """Load that is reported in metrics but not simulated (no real sequences).

    It lets a test or the lab demo make one replica look busy (queue, running,
    KV usage) without sending traffic; real requests are not slowed by it.
    """

    waiting: int = 0
    running: int = 0
    kv_tokens: int = 0
