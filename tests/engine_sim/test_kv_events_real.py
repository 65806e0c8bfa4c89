"""The gateway's block hashes held to the real engine's own KV events, byte for byte: one `vllm
serve` (vLLM 0.32's CPU build, .venv-engine) of the lab's tiny model on loopback with
--kv-events-config, --enforce-eager and a small KV cache; its BlockStored events (read from its
replay socket) for a chat, a completion, a salted chat and a LoRA chat must name exactly the blocks gateway/engine_hash.py
computes from the same requests with the model's own tokenizer and chat template (token ids and
parent chain included). An agent subscriber started late gets the blocks from the replay socket,
then the live stream (the engine's PUB connects to the subscriber's bound loopback address). Bounded: the engine has 300 s to serve (~30-60 s on 2 cores)."""

from __future__ import annotations

import json
import os
import subprocess
import time

import httpx
import pytest

from agent.kv_index.subscriber import EventSource, KvEventSubscriber
from common.kv_events import END_SEQ, BlockHasher, as_hash, decode_batch
from common.kv_index import KvIndex
from gateway.engine_hash import EngineTokenizer, RequestHasher
from tests.support.real_engine import MODEL, real_engine_command, tiny_model_and_adapters
from tests.support.servers import free_port

pytestmark = pytest.mark.timeout(600)
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


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("kv-events")
    model, adapters = tiny_model_and_adapters(tmp, {"sql": 1})
    port, pub, replay = free_port(), free_port(), free_port()
    cfg = json.dumps({"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://127.0.0.1:{pub}",
                      "replay_endpoint": f"tcp://127.0.0.1:{replay}", "topic": "kv"})
    argv, env = real_engine_command(model, port, "kv-events", tmp / "dir", max_loras=1,
                                    extra=("--kv-events-config", cfg))
    log = tmp / "engine.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(1)
        else:
            raise AssertionError("the engine did not serve: " + log.read_text()[-3000:])
        yield {"url": url, "model": model, "pub": pub, "replay": replay, "adapter": str(adapters / "sql")}
    finally:
        os.killpg(proc.pid, 15)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait(10)


def _wait(pred, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.1)
    return False


def test_the_gateways_block_hashes_are_the_engines(engine):
    url = engine["url"]
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
