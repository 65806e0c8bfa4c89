"""Whether a replica's engine is evicting, as the agent's KV index learns it from the engine's
BlockRemoved events (common/kv_index.KvIndex.evicting) and answers it on POST /v1/kv-index/match:
true for EVICT_WINDOW_S after a GPU removal (fake clock), false before and after, null for a
replica that sent no events; an offload tier's removal and a prefix-cache reset are no eviction,
a restart clears it, a resync assumes one. The real subscriber over ZMQ on loopback too."""

from __future__ import annotations

import asyncio
import time

import httpx
from fastapi import FastAPI

from agent.kv_index.routes import kv_index_router
from agent.kv_index.subscriber import EventSource, KvEventSubscriber
from common.kv_events import (
    Batch,
    ZmqEventPublisher,
    all_cleared,
    block_removed,
    block_stored,
)
from common.kv_index import EVICT_WINDOW_S, KvIndex
from lab.rigs.polling import wait_for
from lab.rigs.servers import free_port


def _b(*events) -> Batch:  # as the subscriber decodes one (common/kv_events.decode_batch)
    return Batch(0.0, list(events), 0)


def test_a_block_removed_makes_the_replica_evicting_until_the_window_passes():
    idx = KvIndex()
    assert EVICT_WINDOW_S == 10.0  # the simulated bench's window (gateway/router_profiles.BenchConfig)
    assert idx.evicting(["r1"], now=0.0) == {"r1": None}  # never heard from: not known
    idx.apply("r1", 0, _b(block_stored([1, 2, 3], None, [], 16)), now=100.0)
    assert idx.evicting(["r1"], now=100.0) == {"r1": False}  # stores only: room to spare
    idx.apply("r1", 1, _b(block_removed([1])), now=105.0)
    assert idx.evicting(["r1"], now=105.0) == {"r1": True}
    assert idx.evicting(["r1"], now=114.9) == {"r1": True}
    assert idx.evicting(["r1"], now=115.0) == {"r1": False}  # the window passed without another
    assert idx.evicting(["r1"], window_s=30.0, now=115.0) == {"r1": True}
    idx.apply("r1", 2, _b(block_stored([4], None, [], 16)), now=116.0)
    assert idx.evicting(["r1"], now=116.0) == {"r1": False}  # a later store does not renew it
    assert idx.status(now=116.0)["r1"]["last_eviction_age_s"] == 11.0

    idx.apply("r1", 3, _b(block_removed([2], medium="CPU")), now=120.0)  # an offload tier's
    idx.apply("r1", 4, _b(all_cleared()), now=120.0)  # a prefix-cache reset, not pressure
    idx.apply("r1", 5, _b(block_removed([])), now=120.0)  # names no block
    assert idx.evicting(["r1"], now=120.0) == {"r1": False}
    idx.apply("r1", 6, _b(block_removed([3])), now=121.0)
    assert idx.apply("r1", 3, _b(block_removed([3])), now=140.0) == "duplicate"  # not applied: no renewal
    assert idx.evicting(["r1"], now=140.0) == {"r1": False}
    assert idx.apply("r1", 0, _b(block_stored([9], None, [], 16)), now=141.0) == "restart"
    idx.apply("r1", 1, _b(block_removed([9])), now=142.0)
    assert idx.evicting(["r1"], now=142.0) == {"r1": True}
    idx.apply("r1", 0, _b(block_stored([9], None, [], 16)), now=143.0)  # restarted: an empty cache
    assert idx.evicting(["r1"], now=143.0) == {"r1": False}
    idx.resync("r1", now=150.0)  # lost batches may have evicted
    assert idx.evicting(["r1"], now=155.0) == {"r1": True} and idx.evicting(["r1"], now=160.0) == {"r1": False}
    idx.resync("r2", now=150.0)  # never heard from: still not known
    assert idx.evicting(["r2"], now=150.0) == {"r2": None}


def test_the_match_route_answers_each_replicas_evicting_flag():
    sub = KvEventSubscriber(KvIndex())
    try:
        now = time.monotonic()
        for r in ("hot", "cool", "roomy"):
            sub.index.apply(r, 0, _b(block_stored([1], None, [], 16)), now=now)
        sub.index.apply("hot", 1, _b(block_removed([1])), now=now)
        sub.index.apply("cool", 1, _b(block_removed([1])), now=now - EVICT_WINDOW_S - 1)
        app = FastAPI()
        app.include_router(kv_index_router(sub))
        narrow = FastAPI()
        narrow.include_router(kv_index_router(sub, evict_window_s=0.0))

        async def ask(a):
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=a), base_url="http://agent") as c:
                return (await c.post("/v1/kv-index/match", json={"hashes": [1], "replicas":
                                                                 ["hot", "cool", "roomy", "gone"]})).json()

        rows = asyncio.run(ask(app))["replicas"]
        assert {r: row["evicting"] for r, row in rows.items()} == {"hot": True, "cool": False, "roomy": False,
                                                                  "gone": None}
        assert rows["hot"]["matched_blocks"] == 0 and rows["roomy"]["matched_blocks"] == 1
        assert asyncio.run(ask(narrow))["replicas"]["hot"]["evicting"] is False  # the agent's window
    finally:
        sub.close()


def test_the_subscriber_learns_an_eviction_from_an_engines_live_stream():
    port, rport = free_port(), free_port()
    pub = ZmqEventPublisher(f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.1:{rport}", topic="kv")
    sub = KvEventSubscriber(KvIndex())
    try:
        pub.publish([block_stored([100, 101], None, [], 16)])  # before anyone listens: the replay has it
        wait_for(lambda: len(pub._buffer) == 1, 10, "the publisher buffer to hold the batch", interval=0.02)
        sub.watch(EventSource("r1", f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.1:{rport}", "kv", bind=True))
        wait_for(lambda: sub.match([100, 101], ["r1"]) == {"r1": 2}, 10, "r1 to match 2 blocks", interval=0.02)
        assert sub.evicting(["r1"], EVICT_WINDOW_S) == {"r1": False}
        pub.publish([block_removed([101])])

        def evicting() -> bool:  # a re-announced block behind it: a removal the live stream lost is a gap, replayed
            pub.publish([block_stored([100], None, [], 16)])
            return sub.evicting(["r1"], EVICT_WINDOW_S) == {"r1": True}

        wait_for(evicting, 10, "r1 to be evicting", interval=0.05)
        assert sub.match([100, 101], ["r1"]) == {"r1": 1}
        assert sub.evicting(["r1"], EVICT_WINDOW_S, now=time.monotonic() + EVICT_WINDOW_S) == {"r1": False}
    finally:
        sub.close()
        pub.close()
