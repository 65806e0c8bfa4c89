"""`fabric-engine-sim --runtime NAME`: each runtime's health path, metrics path/port and metric
names, read back through fabricd's adapter for that runtime (controlplane/routing/runtime_metrics)."""

from __future__ import annotations

import httpx
import pytest

from common.engine_metrics.names import METRIC_NAMES
from common.engine_metrics.parse import MetricsParseError, metric_lines, observe, parse_lines
from common.runtimes import RUNTIME_TABLE
from enginesim.process import EngineProcess, free_port

LACKS = {  # what each runtime's page does not carry, as the docs say (docs/runtimes.md)
    "vllm": [],
    "tensorrt-llm": [],
    "triton": ["running", "kv_cache", "ttft", "tokens"],
    "llama.cpp": ["ttft", "failures"],
    "tei": ["running", "kv_cache", "ttft", "tokens"],
}


@pytest.fixture(scope="module", params=sorted(RUNTIME_TABLE))
def engine(request):
    runtime = request.param
    args = ["--model", "sim-m", "--runtime", runtime, "--tokens-per-s", "0", "--prefill-tokens-per-s", "0"]
    metrics_port = None
    if RUNTIME_TABLE[runtime].metrics_port:
        metrics_port = free_port()
        args += ["--metrics-port", str(metrics_port)]
    with EngineProcess.start(args) as proc:
        yield runtime, proc, metrics_port or proc.port


def page(engine) -> str:
    runtime, proc, port = engine
    resp = httpx.get(f"http://{proc.host}:{port}{RUNTIME_TABLE[runtime].metrics_path}")
    assert resp.status_code == 200
    return resp.text


def test_health_answers_on_the_runtime_path_only(engine):
    runtime, proc, _ = engine
    path = RUNTIME_TABLE[runtime].health_path
    assert httpx.get(proc.url + path).status_code == 200
    if path != "/health":
        assert httpx.get(proc.url + "/health").status_code == 404


def test_metrics_sit_where_the_runtime_serves_them(engine):
    runtime, proc, port = engine
    rt = RUNTIME_TABLE[runtime]
    if port != proc.port or rt.metrics_path != "/metrics":
        assert httpx.get(proc.url + "/metrics").status_code == 404
    text = page(engine)
    prefix = {"vllm": "vllm:", "tensorrt-llm": "trtllm_", "triton": "nv_inference_", "llama.cpp": "llamacpp:",
              "tei": "te_"}[runtime]
    samples = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert samples and all(line.startswith(prefix) for line in samples), text[:500]


def test_the_adapter_reads_load_and_traffic_and_names_the_gaps(engine):
    runtime, proc, _ = engine
    names = METRIC_NAMES[runtime]
    first = parse_lines(metric_lines(page(engine), names), names)
    assert set(LACKS[runtime]) <= set(first.missing)
    body = {"model": "sim-m", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 5}
    for _ in range(3):
        httpx.post(proc.url + "/v1/chat/completions", json=body).raise_for_status()
    httpx.post(proc.url + "/sim/load", json={"queue": 7}).raise_for_status()
    httpx.post(proc.url + "/sim/faults", json={"error_rate": 1.0}).raise_for_status()
    assert httpx.post(proc.url + "/v1/chat/completions", json=body).status_code == 500
    httpx.post(proc.url + "/sim/faults", json={"error_rate": 0.0}).raise_for_status()
    later = parse_lines(metric_lines(page(engine), names), names)
    httpx.post(proc.url + "/sim/load", json={"queue": 0}).raise_for_status()
    assert later.waiting == 7
    assert sorted(later.missing) == sorted(LACKS[runtime])
    obs = observe("r", later, first, 10.0, 100.0)
    assert obs.missing == list(later.missing)
    if "tokens" not in LACKS[runtime]:
        assert later.generation_tokens - first.generation_tokens == 15 and obs.tokens_per_s == 1.5
    if "ttft" not in LACKS[runtime]:
        assert later.ttft_count - first.ttft_count == 3 and obs.ttft_p50_s is not None
    if "failures" not in LACKS[runtime] and runtime != "vllm":
        assert later.finished - first.finished == 4 and later.failed - first.failed == 1
        assert obs.failure_ratio == pytest.approx(0.25)


def test_a_page_of_another_runtime_is_refused(engine):
    runtime, _, _ = engine
    other = "llama.cpp" if runtime != "llama.cpp" else "vllm"
    with pytest.raises(MetricsParseError, match=other):
        names = METRIC_NAMES[other]
        parse_lines(metric_lines(page(engine), names), names)
