"""`fabric-engine-sim --host H --port P --model NAME [--runtime NAME] [knobs]`: the simulated engine.

It is a vLLM-like engine; `--runtime` makes it serve another runtime's metric names, metrics
path/port and health path (common/runtimes.py, runtime_metrics.py).

Also runnable as `python -m enginesim`. Flags mirror vLLM's where vLLM has
one (--max-num-seqs, --max-model-len); the rest are the simulator's knobs.
"""

from __future__ import annotations

import argparse
import sys

from common.runtimes import RUNTIME_NAMES
from enginesim.settings import EngineSettings


def build_parser() -> argparse.ArgumentParser:
    d = EngineSettings()
    p = argparse.ArgumentParser(prog="fabric-engine-sim", description="Simulated vLLM engine (OpenAI API)")
    p.add_argument("--host", default=d.host)
    p.add_argument("--port", type=int, default=d.port)
    p.add_argument("--model", default=d.model, help="served model name")
    p.add_argument("--replica-id", default=None, help="x-fabric-replica header value (default: hostname)")
    p.add_argument("--max-num-seqs", type=int, default=d.max_num_seqs, help="sequences that run at once")
    p.add_argument("--max-model-len", type=int, default=d.max_model_len, help="context length in tokens")
    p.add_argument("--prefill-tokens-per-s", type=float, default=d.prefill_tokens_per_s,
                   help="prompt tokens processed per second (0 = instant)")
    p.add_argument("--tokens-per-s", type=float, default=d.tokens_per_s,
                   help="generated tokens per second per sequence (0 = as fast as possible)")
    p.add_argument("--default-max-tokens", type=int, default=d.default_max_tokens,
                   help="output length when a chat request gives no max_tokens")
    p.add_argument("--natural-length", type=int, default=d.natural_length,
                   help="when > 0, outputs stop by themselves around this many tokens")
    p.add_argument("--kv-capacity-tokens", type=int, default=d.kv_capacity_tokens,
                   help="tokens the KV cache holds; usage = running tokens / this")
    p.add_argument("--prefix-cache-blocks", type=int, default=d.prefix_cache_blocks,
                   help="16-token blocks the prefix cache holds (0: off); hits skip their prefill")
    p.add_argument("--kv-events-config", default=None,
                   help="vLLM's KV-events JSON, e.g. '{\"enable_kv_cache_events\":true,\"publisher\":\"zmq\","
                        "\"endpoint\":\"tcp://*:5557\",\"replay_endpoint\":\"tcp://*:5558\"}': the prefix "
                        "cache publishes its blocks as vLLM does")
    p.add_argument("--max-loras", type=int, default=d.max_loras,
                   help="LoRA adapters loaded at once through /v1/load_lora_adapter")
    p.add_argument("--lora-root", default=None,
                   help="the directory this replica sees as /adapters (a lab or dry-run replica has no "
                        "guest mount): lora_path /adapters/NAME is read from DIR/NAME")
    p.add_argument("--chars-per-token", type=int, default=d.chars_per_token)
    p.add_argument("--embedding-dim", type=int, default=d.embedding_dim)
    p.add_argument("--legacy-metric-names", action="store_true",
                   help="export vllm:gpu_cache_usage_perc instead of vllm:kv_cache_usage_perc")
    p.add_argument("--runtime", default=d.runtime, choices=list(RUNTIME_NAMES),
                   help="serve this runtime's metric names, metrics path and health path")
    p.add_argument("--metrics-port", type=int, default=None,
                   help="port for /metrics (default: the runtime's own, e.g. Triton 8002, TEI 9000; else --port)")
    p.add_argument("--fail-health", action="store_true", help="GET /health answers 503")
    p.add_argument("--error-rate", type=float, default=d.error_rate,
                   help="fraction of requests answered with 500 (0-1)")
    p.add_argument("--added-latency-ms", type=int, default=d.added_latency_ms,
                   help="extra delay before each request is queued")
    p.add_argument("--seed", type=int, default=d.seed, help="seed for the error-rate draws")
    p.add_argument("--shutdown-timeout", dest="shutdown_timeout_s", type=float, default=d.shutdown_timeout_s,
                   help="as vLLM's: at SIGTERM, 0 stops at once (requests in flight get nothing more); N lets "
                        "them finish for up to N s")
    p.add_argument("--log-level", default=d.log_level, choices=["critical", "error", "warning", "info", "debug"])
    return p


def settings_from_args(argv: list[str] | None = None) -> EngineSettings:
    parser = build_parser()
    args = parser.parse_args(argv)
    fields = {k: v for k, v in vars(args).items() if v is not None}
    try:
        return EngineSettings(**fields)
    except ValueError as err:
        parser.error(str(err))
        raise  # unreachable: parser.error exits


def main(argv: list[str] | None = None) -> None:
    from enginesim.server import run

    settings = settings_from_args(argv if argv is not None else sys.argv[1:])
    # One line to the log on start, as a real engine's first output would be (it is what
    # `fabricctl ai logs` shows for a lab or dry-run replica before any warning).
    print(f"fabric-engine-sim: serving {settings.model} on {settings.host}:{settings.port} "
          f"(replica {settings.replica_id or '-'})", flush=True)
    run(settings)


if __name__ == "__main__":
    main()
