"""/metrics: vLLM names, parsable, moving with traffic and synthetic load; legacy names."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

from enginesim.process import EngineProcess


def samples(url: str) -> dict[tuple[str, tuple], float]:
    text = httpx.get(url + "/metrics").text
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(snap: dict, name: str, **labels: str) -> float:
    # vLLM labels every series with its engine index; the simulator is engine "0".
    wanted = {"engine": "0", **labels} if name.startswith("vllm:") else labels
    return snap[(name, tuple(sorted(wanted.items())))]


def test_vllm_metric_names_are_present_and_labelled(fast_engine: EngineProcess):
    snap = samples(fast_engine.url)
    names = {name for name, _ in snap}
    for expected in (
        "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
        "vllm:time_to_first_token_seconds_bucket", "vllm:time_to_first_token_seconds_count",
        "vllm:e2e_request_latency_seconds_bucket", "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total", "vllm:request_success_total",
    ):
        assert expected in names, expected
    assert "vllm:gpu_cache_usage_perc" not in names
    assert all(dict(labels).get("model_name") == "sim-m" for _, labels in snap)
    ttft_buckets = {dict(lbl)["le"] for n, lbl in snap if n == "vllm:time_to_first_token_seconds_bucket"}
    assert {"0.001", "0.04", "2560.0", "+Inf"} <= ttft_buckets


def test_counters_follow_requests(fast_engine: EngineProcess):
    before = samples(fast_engine.url)
    body = {"model": "sim-m", "messages": [{"role": "user", "content": "count me"}], "max_tokens": 7}
    httpx.post(fast_engine.url + "/v1/chat/completions", json=body).raise_for_status()
    no_limit = {"model": "sim-m", "messages": [{"role": "user", "content": "count me"}]}
    httpx.post(fast_engine.url + "/v1/chat/completions", json=no_limit).raise_for_status()
    after = samples(fast_engine.url)

    def delta(name: str, **labels: str) -> float:
        return value(after, name, model_name="sim-m", **labels) - value(before, name, model_name="sim-m", **labels)

    assert delta("vllm:generation_tokens_total") == 7 + 16
    assert delta("vllm:prompt_tokens_total") > 0
    assert delta("vllm:request_success_total", finished_reason="length") == 1
    assert delta("vllm:request_success_total", finished_reason="stop") == 1
    assert delta("vllm:time_to_first_token_seconds_count") == 2
    assert delta("vllm:e2e_request_latency_seconds_count") == 2


def test_injected_failures_count_as_finished_reason_abort(fast_engine: EngineProcess):
    """fabricd's rollout windows read failed requests from this series."""
    body = {"model": "sim-m", "messages": [{"role": "user", "content": "fail me"}], "max_tokens": 2}
    assert httpx.post(fast_engine.url + "/sim/faults", json={"error_rate": 1.0}).status_code == 200
    try:
        for _ in range(3):
            assert httpx.post(fast_engine.url + "/v1/chat/completions", json=body).status_code == 500
    finally:
        httpx.post(fast_engine.url + "/sim/faults", json={"error_rate": 0.0}).raise_for_status()
    snap = samples(fast_engine.url)
    assert value(snap, "vllm:request_success_total", model_name="sim-m", finished_reason="abort") == 3


def test_synthetic_load_shows_in_gauges_and_state(fast_engine: EngineProcess):
    url = fast_engine.url
    try:
        resp = httpx.post(url + "/sim/load", json={"queue": 5, "running": 3, "kv_tokens": 8192})
        assert resp.status_code == 200
        snap = samples(url)
        assert value(snap, "vllm:num_requests_waiting", model_name="sim-m") == 5
        assert value(snap, "vllm:num_requests_running", model_name="sim-m") == 3
        assert 0 < value(snap, "vllm:kv_cache_usage_perc", model_name="sim-m") <= 1
        state = httpx.get(url + "/sim/state").json()
        assert state["synthetic_load"]["waiting"] == 5 and state["scheduler"]["waiting"] == 0
        bad = httpx.post(url + "/sim/load", json={"waiting": -1})
        assert bad.status_code == 422 and "waiting" in bad.json()["error"]["message"]
        typo = httpx.post(url + "/sim/load", json={"wating": 1})
        assert typo.status_code == 422 and "wating" in typo.json()["error"]["message"]
    finally:
        httpx.post(url + "/sim/load", json={"waiting": 0, "running": 0, "kv_tokens": 0})
    assert value(samples(url), "vllm:num_requests_waiting", model_name="sim-m") == 0


def test_legacy_metric_names_option():
    with EngineProcess.start(["--model", "old", "--legacy-metric-names"]) as engine:
        httpx.post(engine.url + "/sim/load", json={"kv_tokens": 4096}).raise_for_status()
        snap = samples(engine.url)
    names = {name for name, _ in snap}
    assert "vllm:gpu_cache_usage_perc" in names and "vllm:kv_cache_usage_perc" not in names
    assert value(snap, "vllm:gpu_cache_usage_perc", model_name="old") == 4096 / 16384
