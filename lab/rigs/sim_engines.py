"""Simulated vLLM engines for benchmarks: one helper process serving many loopback ports.

Each port answers GET /metrics with a vLLM 0.10-sized page (~470 lines, 50 KB: the routing families
plus the other latency/token histograms, process and GC metrics) and GET /health with 200. Kinds:
  busy   every scrape advances the counters and the TTFT histogram (4 requests finished, 480
         tokens), so no page equals the previous one and every rate moves: the worst case;
  quiet  the same 50 KB page with nothing running, frozen until POST /sim/busy "1" (on any port)
         makes every engine busy; "0" freezes them again (idle engines: their lines repeat);
  small  4 gauges and counters that never change.
POST /sim/load on a port sets that engine's vllm:num_requests_waiting; GET /sim/stats (any port)
answers JSON: connections accepted, /metrics and /health requests, all ports together; POST
/sim/drop-idle closes every idle kept-alive connection (lab.rigs.loopback_http).

``SimEngines(count, kind)`` starts the helper (``python -m lab.rigs.sim_engines``) and stops it;
scripts/bench-control and scripts/bench-scale (lab.rigs.scale) run their engines this way.
"""

from __future__ import annotations

import asyncio
import json
import sys

from lab.rigs.loopback_http import HelperProcess, LoopbackServers

SMALL = ("# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{model_name=\"m\"} %d\n"
         "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name=\"m\"} 2\n"
         "# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{model_name=\"m\"} 0.25\n"
         "# TYPE vllm:generation_tokens_total counter\nvllm:generation_tokens_total{model_name=\"m\"} 1000\n")
L = 'engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"'
BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
           80.0, 160.0, 640.0, 2560.0)


def histogram(name: str, doc: str, count: int, total: float) -> list[str]:
    out = [f"# HELP {name} {doc}", f"# TYPE {name} histogram"]
    for i, le in enumerate(BUCKETS):
        out.append(f'{name}_bucket{{{L},le="{le}"}} {float(count * min(1.0, (i + 1) / 12))}')
    out += [f'{name}_bucket{{{L},le="+Inf"}} {float(count)}', f"{name}_count{{{L}}} {float(count)}",
            f"{name}_sum{{{L}}} {total}", f"{name}_created{{{L}}} 1.7e9"]
    return out


def other_families() -> str:
    """Families routing does not read, as a vLLM 0.10 engine exposes them (static: skipped either way)."""
    out: list[str] = []
    for n in ("time_per_output_token_seconds", "e2e_request_latency_seconds", "request_queue_time_seconds",
              "request_inference_time_seconds", "request_prefill_time_seconds", "request_decode_time_seconds",
              "request_prompt_tokens", "request_generation_tokens", "iteration_tokens_total",
              "request_max_num_generation_tokens", "request_params_max_tokens", "request_params_n",
              "inter_token_latency_seconds", "request_time_per_output_token_seconds"):
        out += histogram(f"vllm:{n}", "A vLLM histogram routing does not read.", 5000, 1234.5)
    for n in ("prompt_tokens", "num_preemptions", "prefix_cache_queries", "prefix_cache_hits"):
        out += [f"# HELP vllm:{n}_total A vLLM counter.", f"# TYPE vllm:{n}_total counter",
                f"vllm:{n}_total{{{L}}} 123456.0", f"vllm:{n}_created{{{L}}} 1.7e9"]
    out += ['# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig',
            '# TYPE vllm:cache_config_info gauge',
            'vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="True",'
            'gpu_memory_utilization="0.9",num_gpu_blocks="27000",engine="0"} 1.0']
    for g in range(3):
        out += [f'python_gc_objects_collected_total{{generation="{g}"}} 1234.0',
                f'python_gc_collections_total{{generation="{g}"}} 56.0']
    for n in ("virtual_memory_bytes", "resident_memory_bytes", "start_time_seconds", "cpu_seconds_total",
              "open_fds", "max_fds"):
        out += [f"# TYPE process_{n} gauge", f"process_{n} 1.0e9"]
    return "\n".join(out) + "\n"


OTHER = other_families()


def full_page(k: int, waiting: float, running: bool = True) -> str:
    """The 50 KB page after ``k`` scrapes' worth of work (4 requests finished and 480 tokens each);
    ``running`` False: nothing running (an idle engine: a running count without token progress
    would read as a stalled engine, controlplane.routing.stall)."""
    lines = ["# TYPE vllm:num_requests_running gauge",
             f"vllm:num_requests_running{{{L}}} {4 + k % 3 if running else 0}.0",
             "# TYPE vllm:num_requests_waiting gauge", f"vllm:num_requests_waiting{{{L}}} {float(waiting)}",
             "# TYPE vllm:kv_cache_usage_perc gauge", f"vllm:kv_cache_usage_perc{{{L}}} {0.2 + (k % 7) / 100}",
             "# TYPE vllm:generation_tokens_total counter", f"vllm:generation_tokens_total{{{L}}} {480.0 * k}",
             "# TYPE vllm:request_success_total counter",
             f'vllm:request_success_total{{{L},finished_reason="stop"}} {3.0 * k}',
             f'vllm:request_success_total{{{L},finished_reason="length"}} {1.0 * k}',
             f'vllm:request_success_total{{{L},finished_reason="abort"}} {float(k // 10)}',
             "# TYPE vllm:time_to_first_token_seconds histogram"]
    n = 4 * k
    for i, le in enumerate(BUCKETS):
        lines.append(f'vllm:time_to_first_token_seconds_bucket{{{L},le="{le}"}} {float(n if i >= 9 else n // (10 - i))}')
    lines += [f'vllm:time_to_first_token_seconds_bucket{{{L},le="+Inf"}} {float(n)}',
              f"vllm:time_to_first_token_seconds_count{{{L}}} {float(n)}",
              f"vllm:time_to_first_token_seconds_sum{{{L}}} {0.21 * n}"]
    return "\n".join(lines) + "\n" + OTHER


class Engines:
    def __init__(self, count: int, kind: str):
        self.kind = kind
        self.busy = kind == "busy"
        self.waiting: dict[int, int] = {}
        self.scrapes: dict[int, int] = {}
        self.stats = {"metrics": 0, "health": 0}
        self.servers = LoopbackServers(count, self.handle)

    async def handle(self, port: int, method: str, path: str, body: bytes) -> tuple[int, bytes]:
        if path.startswith("/sim/load"):
            self.waiting[port] = int(body or b"0")
            return 200, b"ok"
        if path.startswith("/sim/drop-idle"):
            self.servers.drop_idle()
            return 200, b"ok"
        if path.startswith("/sim/busy"):
            self.busy = body.strip() == b"1"
            return 200, b"ok"
        if path.startswith("/sim/stats"):
            return 200, json.dumps({**self.stats, "connections": sum(self.servers.connections.values())}).encode()
        if path.startswith("/health"):
            self.stats["health"] += 1
            return 200, b""
        self.stats["metrics"] += 1
        waiting = self.waiting.get(port, 0)
        if self.kind == "small":
            return 200, (SMALL % waiting).encode()
        if self.busy:
            self.scrapes[port] = self.scrapes.get(port, 0) + 1
        return 200, full_page(self.scrapes.get(port, 0), waiting, running=self.busy).encode()


class SimEngines(HelperProcess):
    """``SimEngines(count, kind)``: the helper process serving ``count`` engines on the ``ports``
    it chose (see the module docstring); a context manager."""

    module = "lab.rigs.sim_engines"

    def set_load(self, port: int, waiting: int) -> None:
        self.post(port, "/sim/load", str(waiting).encode())

    def set_busy(self, busy: bool) -> None:
        self.post(self.ports[0], "/sim/busy", b"1" if busy else b"0")


if __name__ == "__main__":
    asyncio.run(Engines(int(sys.argv[1]), sys.argv[2]).servers.serve_forever())
