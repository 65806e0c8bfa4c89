"""The inference runtimes Fabric launches, in one table: how each is started in the guest,
where it answers health, and where its Prometheus metrics are.

Every runtime serves its API on the replica's port (8000). The agent renders the guest unit
from `command_line`; fabricd probes `health_path` and scrapes `metrics_port`/`metrics_path`
(common/engine_metrics/names.py reads each runtime's own metric names); the engine
simulator serves the same paths with `--runtime NAME`. Facts come from each project's docs:

  vllm           `vllm serve`, GET /health, /metrics on the API port; --shutdown-timeout 30 drains
                 the requests in flight at SIGTERM instead of aborting them
  tensorrt-llm   `trtllm-serve serve`, GET /health, /prometheus/metrics on the API port, which
                 exists only with `return_perf_metrics` and has gauges only with
                 `enable_iter_perf_stats`: both are in the LLM-API options YAML the guest gets
                 (TRTLLM_CONFIG_PATH, passed with --extra_llm_api_options). The trtllm_* queue,
                 KV and token readings exist from the 1.3 line (images/guest/versions.env pins
                 it); trtllm-serve has no --served_model_name.
  triton         `tritonserver`, GET /v2/health/ready, /metrics on --metrics-port (8002). It
                 serves KServe v2, not OpenAI /v1 (the OpenAI frontend is a separate program),
                 so a profile naming it is refused with 422 (OPENAI_INCAPABLE,
                 common.schemas) and the agent refuses to start it.
  llama.cpp      `llama-server` (needs --metrics), GET /health, /metrics on the API port; -m
                 takes the model's .gguf file (the agent finds it in the model directory)
  tei            `text-embeddings-router`, GET /health, /metrics on --prometheus-port (9000)

Each runtime has a start budget (``start_budget_s``): how long its replica may take to become
Ready; the gateway holds a call at zero replicas that long by default.

Tensor parallelism is a flag only where the runtime has one (vLLM, TensorRT-LLM); Triton's
is fixed when the engine is built, llama.cpp splits layers over every visible GPU by itself,
and TEI runs one GPU. A context length (`max_model_len`) maps to the runtime's flag where it
has one; a profile that sets it for a runtime without one is refused (common.schemas).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_PLACEHOLDER = re.compile(r"\{(model|name|port)\}")


@dataclass(frozen=True)
class Runtime:
    name: str
    description: str
    binary: str  # absolute path inside the baked guest image
    health_path: str
    metrics_path: str
    metrics_port: int | None  # None: the API port
    tensor_parallel_flag: str | None  # None: the runtime has no such flag
    max_len_flag: str | None
    args: tuple[str, ...]  # after the binary; {model}, {name}, {port} are filled in
    service_user: str = "fabric"
    # The start budget: how long a replica of this runtime may take from its creation to Ready on
    # a GPU host (the VM's boot, the driver, the weights' load, the engine's own warm-up). The
    # gateway holds a call at zero replicas this long unless told otherwise (gateway.cold_start).
    start_budget_s: float = 600.0

    def command_line(self, *, model_path: str, served_name: str, port: int, tensor_parallel: int,
                     max_model_len: int | None = None, extra_args: tuple[str, ...] = ()) -> list[str]:
        """argv of the guest's engine process (the binary first). Placeholders are filled in one
        pass, so a value that itself contains "{port}" stays as written."""
        values = {"model": model_path, "name": served_name, "port": str(port)}
        argv = [self.binary, *(_PLACEHOLDER.sub(lambda m: values[m.group(1)], a) for a in self.args)]
        if self.tensor_parallel_flag:
            argv += [self.tensor_parallel_flag, str(max(1, tensor_parallel))]
        if max_model_len:
            if not self.max_len_flag:
                raise ValueError(f"runtime {self.name} has no context-length flag (max_model_len)")
            argv += [self.max_len_flag, str(max_model_len)]
        return argv + list(extra_args)

    def scrape_port(self, api_port: int) -> int:
        return self.metrics_port or api_port

    def flags(self) -> tuple[str, ...]:
        """Every option name the table puts on this runtime's command line (its arguments, the
        tensor-parallel and context-length flags): what a bake finds in the installed engine's
        --help (images/guest/engine-args.json). vLLM's whole command lines are parsed instead."""
        names = [a.split("=", 1)[0] for a in self.args if a.startswith("-")]
        names += [f for f in (self.tensor_parallel_flag, self.max_len_flag) if f]
        return tuple(dict.fromkeys(names))


TRITON_METRICS_PORT = 8002
# vLLM's KV-cache events (docs/kv-events.md): PUB on 5557, replay ROUTER on 5558, in the guest; the
# node agent's kv-index subscribes over the guest's network (agent/kv_index).
VLLM_KV_EVENTS_PORT, VLLM_KV_REPLAY_PORT = 5557, 5558
VLLM_KV_EVENTS_CONFIG = ('{"enable_kv_cache_events":true,"publisher":"zmq",'
                         f'"endpoint":"tcp://*:{VLLM_KV_EVENTS_PORT}","replay_endpoint":"tcp://*:{VLLM_KV_REPLAY_PORT}",'
                         '"topic":"kv"}')
TEI_METRICS_PORT = 9000
# vLLM's graceful stop (0.32's --shutdown-timeout; its default 0 aborts every request in flight at
# SIGTERM): up to this long for running requests to finish, then abort the rest. The reconciler
# drains a replica before it deletes it, so this covers the stops it does not plan (a guest shut
# down under the engine, a host going away), inside systemd's 90 s stop timeout.
VLLM_SHUTDOWN_TIMEOUT_S = 30
# Start budgets (Runtime.start_budget_s): a GPU VM's boot is 1-2 min; on top, vLLM loads the
# weights and captures CUDA graphs (minutes for a large model), TensorRT-LLM and Triton
# deserialize whole engines (longer still), while llama.cpp maps one GGUF file and TEI loads a
# small encoder. The reconcile pass replaces a replica not ready within its runtime's budget (at
# most fabricd's FABRIC_START_TIMEOUT_SECS, 900 s by default), and the gateway holds a call at zero
# replicas as long, so a hold never outwaits the replica it waits for.

RUNTIME_TABLE: dict[str, Runtime] = {
    r.name: r
    for r in (
        Runtime("vllm", "vLLM OpenAI-compatible server", "/opt/vllm/bin/vllm", "/health", "/metrics", None,
                "--tensor-parallel-size", "--max-model-len",
                ("serve", "{model}", "--served-model-name", "{name}", "--host", "0.0.0.0", "--port", "{port}",
                 "--kv-events-config", VLLM_KV_EVENTS_CONFIG, "--shutdown-timeout", str(VLLM_SHUTDOWN_TIMEOUT_S)),
                service_user="vllm", start_budget_s=600.0),
        Runtime("tensorrt-llm", "TensorRT-LLM trtllm-serve", "/opt/trtllm/bin/trtllm-serve", "/health",
                "/prometheus/metrics", None, "--tp_size", "--max_seq_len",
                ("serve", "{model}", "--host", "0.0.0.0", "--port", "{port}",
                 "--extra_llm_api_options", "/etc/fabric/trtllm-config.yaml"), start_budget_s=900.0),
        # The model directory is a Triton model repository; HTTP on the API port, gRPC beside it.
        Runtime("triton", "Triton Inference Server", "/opt/tritonserver/bin/tritonserver",
                "/v2/health/ready", "/metrics", TRITON_METRICS_PORT, None, None,
                ("--model-repository={model}", "--http-port={port}", "--grpc-port=8001",
                 f"--metrics-port={TRITON_METRICS_PORT}", "--allow-metrics=true"), start_budget_s=900.0),
        # -m names the GGUF file; -ngl 999 offloads every layer to the GPUs; --metrics enables /metrics.
        Runtime("llama.cpp", "llama.cpp llama-server", "/opt/llama.cpp/bin/llama-server", "/health", "/metrics",
                None, None, "--ctx-size",
                ("-m", "{model}", "--alias", "{name}", "--host", "0.0.0.0", "--port", "{port}", "--metrics",
                 "-ngl", "999"), start_budget_s=300.0),
        Runtime("tei", "text-embeddings-inference router", "/opt/tei/bin/text-embeddings-router", "/health",
                "/metrics", TEI_METRICS_PORT, None, None,
                ("--model-id", "{model}", "--served-model-name", "{name}", "--hostname", "0.0.0.0",
                 "--port", "{port}", f"--prometheus-port={TEI_METRICS_PORT}"), start_budget_s=300.0),
    )
}
RUNTIME_NAMES = tuple(RUNTIME_TABLE)

# TensorRT-LLM's LLM-API options, written into the guest at TRTLLM_CONFIG_PATH: without them
# /prometheus/metrics does not exist (return_perf_metrics) or has no gauges (enable_iter_perf_stats).
TRTLLM_CONFIG_PATH = "/etc/fabric/trtllm-config.yaml"
TRTLLM_CONFIG = {"return_perf_metrics": True, "enable_iter_perf_stats": True}
# Runtimes that do not serve the OpenAI API Fabric's endpoints proxy, and why.
OPENAI_INCAPABLE = {
    "triton": ("tritonserver serves the KServe v2 API (/v2/...), not OpenAI /v1; Triton's OpenAI "
               "frontend is a separate program Fabric does not start: serve the model with vllm, "
               "tensorrt-llm or llama.cpp"),
}


def vllm_lora_ranks(version: str) -> tuple[int, ...]:
    """The max_lora_rank values vLLM's LoRAConfig accepts in `version` (the baked one):
    8..256 before 0.7, then up to 512 (with 320), and rank 1 from 0.9."""
    parts = tuple(int(p) for p in re.findall(r"\d+", version)[:2]) or (0, 0)
    if parts < (0, 7):
        return (8, 16, 32, 64, 128, 256)
    if parts < (0, 9):
        return (8, 16, 32, 64, 128, 256, 320, 512)
    return (1, 8, 16, 32, 64, 128, 256, 320, 512)


def runtime(name: str) -> Runtime:
    try:
        return RUNTIME_TABLE[name]
    except KeyError:
        raise ValueError(f"runtime {name!r} is unknown; expected one of {', '.join(RUNTIME_NAMES)}") from None


def start_budget(name: str) -> float:
    """The runtime's start budget in seconds; an unknown name (a record from a newer release) reads as vLLM's."""
    return RUNTIME_TABLE.get(name, RUNTIME_TABLE["vllm"]).start_budget_s


def health_path(name: str) -> str:
    """The runtime's health path; an unknown name (a record from a newer release) reads as vLLM's."""
    return RUNTIME_TABLE.get(name, RUNTIME_TABLE["vllm"]).health_path
