"""The agent's KV block index: sequence handling (gap, duplicate, restart, resync), the subscriber's
replay snapshot and gap repair over real ZMQ sockets on loopback, and the simulator's events
matching the hashes a gateway computes from the prompt text."""

from __future__ import annotations

import json
import time

import httpx

from agent.kv_index.subscriber import EventSource, KvEventSubscriber
from common.kv_events import (
    Batch,
    BlockHasher,
    ZmqEventPublisher,
    all_cleared,
    block_removed,
    block_stored,
    decode_batch,
    encode_batch,
    sim_token_ids,
)
from common.kv_index import KvIndex
from enginesim.process import EngineProcess
from lab.rigs.polling import wait_for
from lab.rigs.servers import free_port


def _b(*events) -> Batch:
    return decode_batch(encode_batch(list(events)))


def test_sequence_verdicts_and_match_counts_only_a_leading_prefix():
    idx = KvIndex()
    assert idx.match([1, 2], ["r1"]) == {"r1": None}  # never heard from: blind
    assert idx.apply("r1", 0, _b(block_stored([1, 2, 3], None, list(range(48)), 16))) == "ok"
    assert idx.replicas["r1"].block_size == 16
    assert idx.match([1, 2, 9, 3], ["r1"]) == {"r1": 2}
    assert idx.apply("r1", 0, _b(block_removed([1]))) == "duplicate"
    assert idx.match([1], ["r1"]) == {"r1": 1}  # the duplicate was not applied
    assert idx.apply("r1", 5, _b(block_removed([1]))) == "gap"
    assert idx.replicas["r1"].gaps == 1 and idx.match([1], ["r1"]) == {"r1": 1}
    assert idx.apply("r1", 1, _b(block_removed([2]))) == "ok"
    assert idx.match([1, 2, 3], ["r1"]) == {"r1": 1}
    assert idx.apply("r1", 0, _b(block_stored([7], None, [], 16))) == "restart"
    assert idx.match([1], ["r1"]) == {"r1": 0} and idx.match([7], ["r1"]) == {"r1": 1}
    assert idx.apply("r1", 1, _b(all_cleared())) == "ok" and idx.match([7], ["r1"]) == {"r1": 0}
    idx.resync("r1")
    assert idx.replicas["r1"].last_seq is None and idx.replicas["r1"].resyncs == 1
    assert idx.apply("r1", 40, _b(block_stored([8], None, [], 16))) == "ok"  # starts again anywhere
    assert idx.apply("r1", 41, _b({"type": "Bogus"})) == "ok" and idx.replicas["r1"].bad_events == 1


def test_offload_tiers_do_not_count_as_held():
    idx = KvIndex()
    idx.apply("r", 0, _b(block_stored([1], None, [], 16, medium="CPU")))
    assert idx.match([1], ["r"]) == {"r": 0}


def test_a_new_subscriber_starts_from_the_replay_snapshot_and_repairs_a_gap():
    port, rport = free_port(), free_port()
    pub = ZmqEventPublisher(f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.1:{rport}", topic="kv")
    sub = KvEventSubscriber(KvIndex())
    try:
        for i in range(5):  # before anyone listens: only the replay buffer has them
            pub.publish([block_stored([100 + i], None, [], 16)])
        wait_for(lambda: len(pub._buffer) == 5, 10, "the publisher buffer to hold 5 events", interval=0.02)
        sub.watch(EventSource("r1", f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.1:{rport}", "kv", bind=True))
        wait_for(lambda: sub.match([100, 101, 102, 103, 104], ["r1"]) == {"r1": 5},
                 10, "r1 to match 5 blocks", interval=0.02)
        # a batch the live stream lost: seq 5 only in the buffer, seq 6 arrives -> replay 5
        pub._buffer.append((5, encode_batch([block_stored([105], None, [], 16)])))
        pub._seq = 6
        sub._feed(EventSource("r1", f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.1:{rport}", "kv", bind=True),
                  [b"kv", (6).to_bytes(8, "big"), encode_batch([block_stored([106], None, [], 16)])])
        assert sub.match([100, 101, 102, 103, 104, 105, 106], ["r1"]) == {"r1": 7}
        st = sub.status()["r1"]
        assert st["gaps"] == 1 and st["resyncs"] == 0 and st["last_seq"] == 6
        # a gap the buffer no longer covers: resync (blocks forgotten, the next batch starts it)
        pub._buffer.clear()
        sub._feed(EventSource("r1", f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.1:{rport}", "kv", bind=True),
                  [b"kv", (9).to_bytes(8, "big"), encode_batch([block_stored([109], None, [], 16)])])
        st = sub.status()["r1"]
        assert st["resyncs"] == 1 and st["last_seq"] == 9
        assert sub.match([100], ["r1"]) == {"r1": 0} and sub.match([109], ["r1"]) == {"r1": 1}
        sub.forget("r1")
        wait_for(lambda: "r1" not in sub.status(), 10, "r1 to leave the subscriber", interval=0.02)
    finally:
        sub.close()
        pub.close()


def test_the_simulators_events_name_the_blocks_a_gateway_hashes_from_the_prompt():
    port, rport = free_port(), free_port()
    cfg = json.dumps({"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://127.0.0.1:{port}",
                      "replay_endpoint": f"tcp://127.0.0.1:{rport}", "topic": "kv@sim"})
    sub = KvEventSubscriber(KvIndex())
    system = "You are a careful assistant. " * 20
    with EngineProcess.start(["--model", "sim-m", "--tokens-per-s", "0", "--prefill-tokens-per-s", "0",
                              "--prefix-cache-blocks", "12", "--kv-events-config", cfg]) as eng:
        try:
            sub.watch(EventSource("sim", f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.1:{rport}", "kv@sim", bind=True))
            texts = []
            for q in ("first question", "second"):
                msgs = [{"role": "system", "content": system}, {"role": "user", "content": q}]
                r = httpx.post(eng.url + "/v1/chat/completions", timeout=10,
                               json={"model": "sim-m", "max_tokens": 2, "messages": msgs})
                assert r.status_code == 200
                texts.append("".join(f"<|{m['role']}|>{m['content']}\n" for m in msgs))
            want = BlockHasher(16).hashes(sim_token_ids(texts[1]))
            assert len(want) == 9

            def announced():  # the PUB connects to the bound SUB within ~0.1-1 s; until then a
                # batch goes nowhere, and the engine re-announces the blocks on the next reuse
                if sub.match(want, ["sim"]) == {"sim": 9}:
                    return True
                httpx.post(eng.url + "/v1/completions", timeout=10, json={"model": "sim-m", "max_tokens": 1,
                                                                          "prompt": texts[1]})
                return False

            wait_for(announced, 10, "the engine blocks to be announced", interval=0.02)
            # a third, unrelated prompt evicts blocks past the 12-block bound: BlockRemoved arrives
            other = "z" * 64 * 10
            assert httpx.post(eng.url + "/v1/completions", timeout=10,
                              json={"model": "sim-m", "max_tokens": 2, "prompt": other}).status_code == 200
            wait_for(lambda: sub.status()["sim"]["blocks"] == 12, 10, "12 blocks from the sim", interval=0.02)
            assert sub.match(want, ["sim"])["sim"] < 9
        finally:
            sub.close()


def test_the_agent_service_watches_running_replicas_and_serves_match_and_metrics():
    from fastapi import FastAPI
    from fastapi.testclient import TestClient
    from prometheus_client import CollectorRegistry, generate_latest

    from agent.kv_index.routes import kv_index_router
    from agent.kv_index.service import KvIndexService
    from agent.vm.base import VmStatus

    port, rport = free_port(), free_port()

    class Driver:
        statuses = [VmStatus("r1", "running", "127.0.0.1", 8000, ""), VmStatus("r2", "running", "127.0.0.2", 8000, ""),
                    VmStatus("r3", "starting", None, 8000, "")]

        def list(self):
            return self.statuses

    def source(replica, address):  # r1 publishes on loopback (its PUB connects to the bound SUB); r2 never does
        if replica == "r1":
            return EventSource("r1", f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.1:{rport}", "kv", bind=True)
        return EventSource(replica, f"tcp://127.0.0.1:{free_port()}", None, "kv", bind=True)

    registry = CollectorRegistry()
    svc = KvIndexService(Driver(), registry, sync_s=3600, source=source, blind_after_s=0.0)
    pub = ZmqEventPublisher(f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.1:{rport}", topic="kv")
    try:
        svc.sync(Driver.statuses)
        assert set(svc.subscriber.status()) == {"r1", "r2"}  # r3 has no address yet
        app = FastAPI()
        app.include_router(kv_index_router(svc.subscriber, blind_after_s=svc.blind_after_s))  # silent: blind at once
        client = TestClient(app)

        def matched():
            pub.publish([block_stored([11, 12, 13], None, [], 16)])
            return client.post("/v1/kv-index/match", json={"hashes": [11, 12, 99]}).json()["replicas"]

        wait_for(lambda: matched()["r1"] == {"matched_blocks": 2, "blind": False, "state": "live",
                                             "block_size": None, "evicting": False}, 10, "r1 to match 2 live blocks",
                 interval=0.02)
        assert matched()["r2"] == {"matched_blocks": None, "blind": True, "state": "blind", "block_size": None,
                                   "evicting": None}
        patient = FastAPI()  # the agent's own bound: a replica silent for less than 60 s is warming, not blind
        patient.include_router(kv_index_router(svc.subscriber))
        rows = TestClient(patient).post("/v1/kv-index/match", json={"hashes": [11], "replicas": ["r2", "r9"]})
        assert rows.json()["replicas"]["r2"]["state"] == "warming" and rows.json()["replicas"]["r2"]["blind"] is False
        assert rows.json()["replicas"]["r9"] == {"matched_blocks": None, "blind": False, "state": "unwatched",
                                                 "block_size": None, "evicting": None}
        assert client.post("/v1/kv-index/match", json={"hashes": ["x"]}).status_code == 422
        text = generate_latest(registry).decode()
        assert 'fabric_kv_index_replicas{state="blind"} 1.0' in text
        assert 'fabric_kv_index_replicas{state="live"} 1.0' in text
        assert 'fabric_kv_index_replicas{state="warming"} 0.0' in text
        assert 'fabric_kv_index_blocks{replica="r1"} 3.0' in text
        assert client.get("/v1/kv-index").json()["replicas"]["r1"]["events"] is True
        svc.sync([Driver.statuses[0]])  # r2 went away
        wait_for(lambda: set(svc.subscriber.status()) == {"r1"}, 10, "r1 alone in the subscriber", interval=0.02)
    finally:
        pub.close()
        svc.close()


def test_the_gateways_cn_may_call_the_kv_index_routes_and_nothing_else():
    from agent.api import DEFAULT_KV_INDEX_CNS, caller_refusal
    from common.peer_cert import CN_KEY, ROLE_KEY, TLS_EXT

    roles = {"fabric-gateway": "gateway", "fabricd": "fabricd", "node-b": "node"}

    def scope(path, cn):
        return {"scheme": "https", "path": path, "extensions": {TLS_EXT: {CN_KEY: cn, ROLE_KEY: roles[cn]}}}

    allowed, readers = {"fabricd"}, set(DEFAULT_KV_INDEX_CNS)
    assert readers == {"fabric-gateway"}
    for path in ("/v1/kv-index", "/v1/kv-index/match", "/v1/kv-index/tokenizer/" + "a" * 64):
        assert caller_refusal(scope(path, "fabric-gateway"), allowed, readers) is None
        assert "node-b" in caller_refusal(scope(path, "node-b"), allowed, readers)
    for path in ("/v1/vms", "/v1/health", "/metrics", "/v1/kv-indexes", "/v1/gpus/0000:3b:00.0/bind"):
        assert "fabric-gateway" in caller_refusal(scope(path, "fabric-gateway"), allowed, readers)
    assert caller_refusal(scope("/v1/vms", "fabricd"), allowed, readers) is None


def test_an_engine_cannot_flood_the_subscriber_with_huge_messages_or_an_endless_replay():
    """The attacks (issue 50, Low): a compromised replica's engine sends one huge message, and
    answers a replay with batches that never end."""
    import threading

    import zmq

    port, rport = free_port(), free_port()
    ctx = zmq.Context.instance()
    pub = ctx.socket(zmq.PUB)
    router = ctx.socket(zmq.ROUTER)
    router.bind(f"tcp://127.0.0.1:{rport}")
    stop = threading.Event()
    replayed = []

    def endless_replay():  # answers every replay request with batches and never the end marker
        while not stop.is_set():
            if router.poll(50):
                ident, *_ = router.recv_multipart()
                seq = 0
                while not stop.is_set() and seq < 100_000:
                    router.send_multipart([ident, b"", b"kv", seq.to_bytes(8, "big"),
                                           encode_batch([block_stored([7000 + seq % 10], None, [], 16)])])
                    seq += 1
                    replayed.append(seq)
                    time.sleep(0.001)

    server = threading.Thread(target=endless_replay, daemon=True)
    server.start()
    sub = KvEventSubscriber(KvIndex(), max_message_bytes=64 << 10, max_replay_frames=50, replay_deadline_s=30)
    try:
        sub.watch(EventSource("r1", f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.1:{rport}", "kv", bind=True))
        # the watch's replay stopped at 50 batches
        wait_for(lambda: sub.replays_cut == 1, 60, "the watch replay to be cut once", interval=0.02)
        assert sub.status()["r1"]["last_seq"] == 49
        pub.connect(f"tcp://127.0.0.1:{port}")
        huge = encode_batch([block_stored([999], None, list(range(200_000)), 16)])
        assert len(huge) > 64 << 10
        small = encode_batch([block_stored([50], None, [], 16)])

        def sent_until_seen() -> bool:
            pub.send_multipart([b"kv", (50).to_bytes(8, "big"), huge])
            pub.send_multipart([b"kv", (50).to_bytes(8, "big"), small])
            return sub.match([50], ["r1"]) == {"r1": 1}

        wait_for(sent_until_seen, 60, "the subscriber to see what was sent", interval=0.02)
        assert sub.match([999], ["r1"]) == {"r1": 0}  # the huge batch was never read
    finally:
        stop.set()
        server.join(5)
        sub.close()
        pub.close(linger=0)
        router.close(linger=0)
