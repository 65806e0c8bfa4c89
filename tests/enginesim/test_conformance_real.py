"""The simulator held to the real engine: the same probes against `vllm serve` (vLLM 0.32's CPU
build, .venv-engine) and `fabric-engine-sim`, comparing what Fabric reads.

  /health while starting    refused until the engine serves; the first 200 means /v1/models works
  /metrics                  the label sets of every family Fabric's adapters read, the
                            finished_reason values, and the parser's reading of both pages
  /v1/models                with a LoRA adapter loaded at run time: its card's parent and root
  errors                    unknown model, unknown adapter, adapter path with no files, loaded twice
  streaming                 chunk shapes, chat and completions, with and without the usage chunk
  KV events                 the real engine's BlockStored events (its replay socket, then the live
                            stream to an agent subscriber) name exactly the blocks the gateway's
                            hasher computes (gateway/engine_hash.py), token ids and chain included
  SIGTERM                   with --shutdown-timeout 30 (Fabric's guests): /health stays 200 and a new
                            request gets 500 while the running requests finish; then the process exits

Both engines run the tiny model of lab/tiny_model.py with --max-num-seqs 2 and
--max-loras 2. One real engine for the module (~30-60 s to start on 2 cores); no wall-clock
assertions beyond bounded waits.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent.kv_index.subscriber import EventSource, KvEventSubscriber
from common.engine_metrics.parse import VLLM_NAMES, parse_vllm_metrics
from common.kv_events import END_SEQ, BlockHasher, as_hash, decode_batch
from common.kv_index import KvIndex
from common.runtimes import VLLM_SHUTDOWN_TIMEOUT_S
from gateway.engine_hash import EngineTokenizer, RequestHasher
from lab.rigs.servers import free_port
from tests.support.real_engine import MODEL, real_engine_command, tiny_model_and_adapters

pytestmark = pytest.mark.timeout(600)
READ_FAMILIES = (*VLLM_NAMES.families, "vllm:prefix_cache_queries", "vllm:prefix_cache_hits")


@dataclass
class Subject:
    name: str
    url: str
    proc: subprocess.Popen
    adapters: Path
    log: Path
    health_seen: list[str] = field(default_factory=list)

    def lora_path(self, adapter: str) -> str:
        # The real engine reads the path as given; the simulator maps /adapters/NAME to --lora-root.
        return str(self.adapters / adapter) if self.name == "real" else f"/adapters/{adapter}"


def _health(url: str) -> str:
    """The status, "refused", "closed" (the connection was taken and closed without an answer:
    a probe that met the process exiting) or the error's name."""
    try:
        return str(httpx.get(f"{url}/health", timeout=2).status_code)
    except httpx.ConnectError:
        return "refused"
    except (httpx.ReadError, httpx.RemoteProtocolError):
        return "closed"
    except httpx.HTTPError as exc:
        return type(exc).__name__


def _start(name: str, argv: list[str], env: dict[str, str], url: str, tmp: Path, adapters: Path) -> Subject:
    log = tmp / f"{name}.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    subject = Subject(name, url, proc, adapters, log)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        seen = _health(url)
        if not subject.health_seen or subject.health_seen[-1] != seen:
            subject.health_seen.append(seen)
        if seen == "200":
            return subject
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    _stop(subject)
    raise AssertionError(f"{name} engine did not serve: {subject.health_seen}\n{log.read_text()[-3000:]}")


def _stop(subject: Subject) -> None:
    if subject.proc.poll() is None:
        os.killpg(subject.proc.pid, signal.SIGKILL)
    subject.proc.wait(30)


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("conformance")
    model, adapters = tiny_model_and_adapters(tmp, {"sql": 1, "poem": 2})
    port, pub, replay = free_port(), free_port(), free_port()
    stop = ("--shutdown-timeout", str(VLLM_SHUTDOWN_TIMEOUT_S))  # as every Fabric guest runs
    kv = json.dumps({"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://127.0.0.1:{pub}",
                     "replay_endpoint": f"tcp://127.0.0.1:{replay}", "topic": "kv"})
    real = _start("real", *real_engine_command(model, port, "conformance", tmp / "real-dir", max_loras=2,
                                               extra=(*stop, "--kv-events-config", kv)),
                  f"http://127.0.0.1:{port}", tmp, adapters)
    try:
        sim_port = free_port()
        sim = _start("sim", [sys.executable, "-m", "enginesim", "--host", "127.0.0.1", "--port", str(sim_port),
                             "--model", MODEL, "--max-num-seqs", "2", "--lora-root", str(adapters), "--max-loras", "2",
                             "--tokens-per-s", "100", *stop],
                     {**os.environ}, f"http://127.0.0.1:{sim_port}", tmp, adapters)
    except BaseException:
        _stop(real)
        raise
    try:
        yield {"real": real, "sim": sim, "kv": {"url": real.url, "model": model, "pub": pub, "replay": replay,
                                                "adapter": str(adapters / "sql")}}
    finally:
        for s in (real, sim):
            _stop(s)


def both(engines) -> list[Subject]:
    return [engines["real"], engines["sim"]]


def test_health_while_starting_is_refused_until_it_serves(engines):
    for s in both(engines):
        assert s.health_seen[-1] == "200" and set(s.health_seen[:-1]) <= {"refused"}, (s.name, s.health_seen)
        assert httpx.get(f"{s.url}/v1/models", timeout=10).status_code == 200


def _labels(text: str) -> dict[str, set[frozenset[str]]]:
    out: dict[str, set[frozenset[str]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            base = sample.name.removesuffix("_total")
            for suffix in ("_bucket", "_sum", "_count", "_created"):
                base = base.removesuffix(suffix)
            if base in READ_FAMILIES:
                out.setdefault(base, set()).add(frozenset(k for k in sample.labels if k != "le"))
    return out


def _reasons(text: str) -> set[str]:
    return {s.labels["finished_reason"] for f in text_string_to_metric_families(text) for s in f.samples
            if s.name == "vllm:request_success_total"}


def _chat(url: str, model: str = MODEL, **extra) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 3, **extra}
    return httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60)


def test_metric_families_and_label_sets_fabric_reads(engines):
    for s in both(engines):
        assert _chat(s.url).status_code == 200
    pages = {s.name: httpx.get(f"{s.url}/metrics", timeout=10).text for s in both(engines)}
    real, sim = _labels(pages["real"]), _labels(pages["sim"])
    assert set(real) == set(READ_FAMILIES) - {"vllm:gpu_cache_usage_perc"}  # the pre-0.7 name is gone
    assert sim == real
    assert _reasons(pages["sim"]) == _reasons(pages["real"])
    for name, page in pages.items():
        sample = parse_vllm_metrics(page)
        assert sample.missing == () and sample.generation_tokens >= 3 and sample.finished >= 1, (name, sample)


def test_models_list_with_a_runtime_lora_adapter(engines):
    for s in both(engines):
        load = httpx.post(f"{s.url}/v1/load_lora_adapter", json={"lora_name": "sql", "lora_path": s.lora_path("sql")},
                          timeout=60)
        assert load.status_code == 200 and "added successfully" in load.text, (s.name, load.text)
        cards = {c["id"]: c for c in httpx.get(f"{s.url}/v1/models", timeout=10).json()["data"]}
        assert list(cards) == [MODEL, "sql"], s.name
        assert cards["sql"]["parent"] == MODEL and cards["sql"]["root"] == s.lora_path("sql"), (s.name, cards)
        assert cards[MODEL]["parent"] is None and cards[MODEL]["owned_by"] == "vllm"
        assert {"id", "object", "created", "owned_by", "root", "parent", "max_model_len"} <= set(cards["sql"])
        answer = _chat(s.url, "sql")
        assert answer.status_code == 200 and answer.json()["model"] == "sql", (s.name, answer.text)


def test_error_bodies_for_unknown_model_and_adapter(engines):
    for s in both(engines):
        unknown = _chat(s.url, "no-such-model")
        err = unknown.json()["error"]
        assert unknown.status_code == 404 and err["type"] == "NotFoundError" and err["param"] == "model", (s.name, err)
        assert "does not exist" in err["message"]
        gone = httpx.post(f"{s.url}/v1/unload_lora_adapter", json={"lora_name": "ghost"}, timeout=30)
        assert gone.status_code == 404 and gone.json()["error"]["type"] == "NotFoundError", (s.name, gone.text)
        assert "cannot be found" in gone.json()["error"]["message"]
        nofiles = httpx.post(f"{s.url}/v1/load_lora_adapter",
                             json={"lora_name": "nofiles", "lora_path": s.lora_path("nofiles")}, timeout=30)
        assert nofiles.status_code == 404 and nofiles.json()["error"]["type"] == "NotFoundError", (s.name, nofiles.text)
        assert "No adapter found" in nofiles.json()["error"]["message"]
        again = httpx.post(f"{s.url}/v1/load_lora_adapter", json={"lora_name": "sql", "lora_path": s.lora_path("sql")},
                           timeout=30)
        assert again.status_code == 400 and "already been loaded" in again.text, (s.name, again.text)
        assert _chat(s.url).status_code == 200  # still serving


def _stream_shape(url: str, path: str, body: dict) -> list[str]:
    """One word per SSE event: role, token (+:finish), finish, usage, DONE."""
    shape = []
    with httpx.stream("POST", f"{url}{path}", json={**body, "stream": True}, timeout=60) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                shape.append("DONE")
                continue
            chunk = json.loads(line[6:])
            if not chunk["choices"]:
                assert set(chunk["usage"]) >= {"prompt_tokens", "completion_tokens", "total_tokens"}
                shape.append(f"usage:{chunk['usage']['completion_tokens']}")
                continue
            choice = chunk["choices"][0]
            word = "role" if choice.get("delta", {}).get("role") else "token"
            shape.append(word + (f":{choice['finish_reason']}" if choice["finish_reason"] else ""))
    return shape


def _runs_merged(shape: list[str]) -> list[str]:
    """The shape with each run of plain token chunks as one "token*": a busy vLLM server puts
    every token its engine has ready into one chunk (its output processor drains what is queued),
    so how many chunks carry the first tokens depends on load; the order of the kinds of chunk, the
    last token's finish reason and the usage count do not."""
    out: list[str] = []
    for part in shape:
        if part == "token":
            if not out or out[-1] != "token*":
                out.append("token*")
        else:
            out.append(part)
    return out


def test_streaming_chunk_shapes_with_and_without_usage(engines):
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
    completion = {"model": MODEL, "prompt": "Hello", "max_tokens": 4}
    for path, body in (("/v1/chat/completions", chat), ("/v1/completions", completion)):
        for usage in (False, True):
            extra = {"stream_options": {"include_usage": True}} if usage else {}
            shapes = {s.name: _stream_shape(s.url, path, {**body, **extra}) for s in both(engines)}
            assert _runs_merged(shapes["sim"]) == _runs_merged(shapes["real"]), (path, usage, shapes)
    assert _runs_merged(shapes["real"]) == ["token*", "token:length", "usage:4", "DONE"]
    assert shapes["sim"] == ["token", "token", "token", "token:length", "usage:4", "DONE"]  # one token per chunk


WORDS = ("the quick brown fox jumps over a lazy dog while fabric routes every token to the replica that "
         "already holds its prefix ")


def replayed(replay_endpoint: str) -> dict[int, dict]:
    """Every BlockStored the engine still buffers, by block hash: asked of its replay socket from seq 0."""
    import zmq

    sock = zmq.Context.instance().socket(zmq.DEALER)
    stored: dict[int, dict] = {}
    try:
        sock.connect(replay_endpoint)
        sock.send_multipart((b"", (0).to_bytes(8, "big")))
        while sock.poll(5000):
            _, _, seq, payload = sock.recv_multipart()
            if seq == END_SEQ:
                break
            for ev in decode_batch(payload).events:
                if ev["type"] != "BlockStored":
                    continue
                n, parent = ev["block_size"], ev["parent_block_hash"]
                for i, h in enumerate(ev["block_hashes"]):
                    stored[as_hash(h)] = {"parent": parent, "tokens": ev["token_ids"][i * n:(i + 1) * n],
                                          "block_size": n, "lora_name": ev.get("lora_name")}
                    parent = h
    finally:
        sock.close(linger=0)
    return stored


def _wait(pred, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.1)
    return False


def test_the_gateways_block_hashes_are_the_engines(engines):
    """The gateway's block hashes held to the real engine's own KV events (docs/kv-events.md)."""
    engine = engines["kv"]
    url = engine["url"]
    if "sql" not in {c["id"] for c in httpx.get(url + "/v1/models", timeout=30).json()["data"]}:  # the LoRA test's
        r = httpx.post(url + "/v1/load_lora_adapter", timeout=60, json={"lora_name": "sql", "lora_path": engine["adapter"]})
        assert r.status_code == 200, r.text
    requests = [
        ("/v1/chat/completions", {"model": MODEL, "max_tokens": 1, "messages": [
            {"role": "system", "content": "chat one. " + WORDS * 12}, {"role": "user", "content": "why?"}]}),
        ("/v1/completions", {"model": MODEL, "max_tokens": 1, "prompt": "completion two. " + WORDS * 12}),
        ("/v1/chat/completions", {"model": MODEL, "max_tokens": 1, "cache_salt": "tenant-7", "messages": [
            {"role": "user", "content": "salted three. " + WORDS * 12}]}),
        ("/v1/chat/completions", {"model": "sql", "max_tokens": 1, "messages": [
            {"role": "user", "content": "adapter four. " + WORDS * 12}]}),
    ]
    for path, body in requests:
        r = httpx.post(url + path, json=body, timeout=120)
        assert r.status_code == 200, r.text
    replay = f"tcp://127.0.0.1:{engine['replay']}"
    stored: dict[int, dict] = {}
    assert _wait(lambda: len(stored.update(replayed(replay)) or stored) >= 8)
    (block_size,) = {b["block_size"] for b in stored.values()}  # the CPU engine's: 128
    tok = EngineTokenizer.from_model_dir(engine["model"])
    hasher = RequestHasher(tok, BlockHasher(block_size), lora_paths=(("sql", engine["adapter"]),))
    for path, body in requests:
        ids = hasher.token_ids(body)
        mine = hasher.request_hashes(body)
        assert len(mine) == len(ids) // block_size >= 2, (len(ids), block_size)
        parent = None
        for i, h in enumerate(mine):
            assert h in stored, (path, body["model"], i, "the engine announced other blocks")
            got = stored[h]
            assert got["tokens"] == ids[i * block_size:(i + 1) * block_size]  # the same token ids
            assert got["parent"] == parent  # the same chain
            parent = h
        if body["model"] == "sql":
            assert stored[mine[0]]["lora_name"] == "sql"
    # without the salt the same text names other blocks: the salt is in the hash
    salted = requests[2][1]
    plain = hasher.request_hashes({k: v for k, v in salted.items() if k != "cache_salt"})
    assert plain[0] != hasher.request_hashes(salted)[0] and plain[0] not in stored
    # an agent's subscriber that starts now: the replay socket's snapshot, then the live stream
    sub = KvEventSubscriber(KvIndex())
    try:
        sub.watch(EventSource("real", f"tcp://127.0.0.1:{engine['pub']}", replay, "kv", bind=True))
        chat = hasher.request_hashes(requests[0][1])
        assert _wait(lambda: sub.match(chat, ["real"]) == {"real": len(chat)})
        seen = sub.status()["real"]["last_seq"]
        live = {"model": MODEL, "max_tokens": 1, "prompt": "live five. " + WORDS * 12}
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # the engine's PUB reconnects to the bound SUB within a few s
            assert httpx.post(url + "/v1/completions", json=live, timeout=120).status_code == 200
            if _wait(lambda s=seen: sub.status()["real"]["last_seq"] > s, timeout=3):
                break
            seen = sub.status()["real"]["last_seq"]
            live["prompt"] = "again " + live["prompt"]
        else:
            raise AssertionError("no live event reached the subscriber")
        assert sub.match(hasher.request_hashes(live), ["real"])["real"] == len(hasher.request_hashes(live))
    finally:
        sub.close()


def _sigterm_in_flight(s: Subject) -> tuple[list[dict], list[str], str]:
    """Three long streams (two run, one waits), SIGTERM once two have tokens: what each got, the
    /health answers until the process exits, and a new request's answer after the signal."""
    seen: list[dict] = []

    def stream() -> None:
        got = {"tokens": 0, "done": False, "tail": "", "at_term": 0}
        seen.append(got)
        body = {"model": MODEL, "prompt": "Hello", "max_tokens": 600, "ignore_eos": True, "stream": True}
        try:
            with httpx.stream("POST", f"{s.url}/v1/completions", json=body, timeout=httpx.Timeout(120, read=20)) as r:
                for line in r.iter_lines():
                    if line == "data: [DONE]":
                        got["done"] = True
                    elif line.startswith("data: "):
                        got["tokens"] += 1
                        got["tail"] = line[-160:]
        except httpx.HTTPError as exc:
            got["error"] = type(exc).__name__

    threads = [threading.Thread(target=stream, daemon=True) for _ in range(3)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and sum(1 for g in seen if g["tokens"]) < 2:
        time.sleep(0.01)
    for g in seen:
        g["at_term"] = g["tokens"]
    s.proc.send_signal(signal.SIGTERM)
    health = [_health(s.url)]
    try:
        late = httpx.post(f"{s.url}/v1/completions", timeout=10,
                          json={"model": MODEL, "prompt": "Say hello to Fabric", "max_tokens": 2})
        new = f"{late.status_code} {late.text}"
    except httpx.HTTPError as exc:
        new = type(exc).__name__
    while s.proc.poll() is None and time.monotonic() - deadline < 120:
        if health[-1] != (now := _health(s.url)):
            health.append(now)
        time.sleep(0.1)
    for t in threads:
        t.join(60)
    s.proc.wait(60)
    return seen, health, new


def test_sigterm_with_shutdown_timeout_lets_the_running_requests_finish(engines):
    """Both run with Fabric's guests' --shutdown-timeout 30 (common/runtimes.py)."""
    for s in both(engines):
        streams, health, new = _sigterm_in_flight(s)
        running = [g for g in streams if g["at_term"]]
        assert len(streams) == 3 and len(running) >= 2, (s.name, streams)
        # The running ones run to their end: every token, the finish reason, [DONE].
        for g in running:
            assert g["done"] and '"finish_reason":"length"' in g["tail"].replace(" ", ""), (s.name, streams)
        # While it drains the listener stays open and /health answers 200; a new request is refused
        # with a 500 (the real engine's own words); then the process exits (a probe in flight at
        # that moment has its connection closed: one clean run in a few met it).
        gone = next((i for i, h in enumerate(health) if h != "200"), len(health))  # 200 until the exit
        assert health[0] == "200" and set(health[gone:]) <= {"refused", "closed"}, (s.name, health)
        assert new.startswith("500 ") and "cannot schedule new futures after shutdown" in new, (s.name, new)
        assert s.proc.returncode is not None
        # A stream still waiting at the signal: on the real engine it got nothing and no [DONE] in
        # one run, and ran to its end in another (it had been scheduled); Fabric counts on neither.
