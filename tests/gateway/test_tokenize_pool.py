"""A tenant's chat template cannot stall the gateway (issue 50, High): templates render in
bounded worker processes (gateway/tokenize_pool.py, gateway/tokenize_worker.py) inside a sandbox
that refuses unbounded ranges and huge repetitions (gateway/engine_hash.py); a call whose hash
misses its deadline routes approximately and the model is benched."""

from __future__ import annotations

import asyncio
import json

import pytest

from common.schemas import EndpointStatus, InferenceEndpoint, Replica
from gateway.engine_hash import EngineTokenizer, RequestHasher, SimTokenizer, Untokenizable
from gateway.replica_router import ReplicaRouter
from gateway.tokenize_pool import PooledHasher, TokenizePool
from gateway.upstreams import EndpointView
from lab.tiny_model import CHAT_TEMPLATE, tokenizer_json

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hello there, how are you today? " * 8}]}
NESTED = ("{% for a in range(10000) %}{% for b in range(10000) %}{% for c in range(10000) %}"
          "{% endfor %}{% endfor %}{% endfor %}{{ messages[0].content }}")


def _files(template: str) -> dict[str, str]:
    return {"tokenizer.json": tokenizer_json(),
            "tokenizer_config.json": json.dumps({"chat_template": template, "bos_token": "<s>", "eos_token": "</s>"})}


def _view(name: str) -> EndpointView:
    ep = InferenceEndpoint(name=name, deployment=name, routing_l7="prefix", status=EndpointStatus())
    return EndpointView(ep, (Replica(replica_id=f"{name}-r0", deployment=name, ordinal=0, node="n",
                                     host="10.0.0.1", ready=True),), {})


class Kv:
    """A KV source: one hasher per endpoint, every replica holding nothing."""

    def __init__(self, hashers: dict) -> None:
        self.hashers = hashers

    async def hasher(self, view):
        return self.hashers[view.endpoint.name]

    async def match(self, view, hashes):
        return {r.replica_id: 0 for r in view.replicas}


@pytest.mark.parametrize("template", [
    "{{ 'x' * 1000000000 }}",
    "{% for i in range(1000000) %}{% endfor %}",
    "{% set s = 'y' * 4000000 %}{{ s + s }}",
    "{{ 7 ** 10000000 }}",
    "{{ [1] * 100000000 }}",
])
def test_the_sandbox_refuses_unbounded_ranges_and_repetitions(template):
    tok = EngineTokenizer.from_files(_files(template))
    with pytest.raises(Untokenizable):
        tok.chat_ids(CHAT["messages"])


def test_a_hostile_template_on_one_endpoint_leaves_another_tenants_calls_answered():
    """The attack: tenant A's model renders three nested range(10000) loops (10^12 steps). Its
    call is still hashing in a worker while tenant B's call on another endpoint is answered."""
    pool = TokenizePool(workers=1, deadline_s=120, cpu_s=120)
    evil = PooledHasher(pool, "evil", _files(NESTED))
    router = ReplicaRouter(kv=Kv({"evil": evil, "good": RequestHasher(SimTokenizer())}))

    async def main():
        hostile = asyncio.create_task(router.apick(_view("evil"), CHAT, 0.0))
        while pool.asked == 0:  # the hostile template is rendering now
            await asyncio.sleep(0.02)
        picked, why = await asyncio.wait_for(router.apick(_view("good"), CHAT, 0.0), 60)
        assert picked == "good-r0" and why["kv_index"] == "precise"
        assert not hostile.done()  # answered while the hostile render still runs
        hostile.cancel()
        with pytest.raises(asyncio.CancelledError):
            await hostile
        assert pool.killed == 1  # a worker in doubt is replaced
        await pool.close()

    asyncio.run(asyncio.wait_for(main(), 120))


def test_a_hash_that_misses_its_deadline_routes_approximately_and_benches_the_model():
    pool = TokenizePool(workers=1, deadline_s=2, cpu_s=60)
    evil = PooledHasher(pool, "evil", _files(NESTED))
    fine = PooledHasher(pool, "fine", _files(CHAT_TEMPLATE))
    router = ReplicaRouter(kv=Kv({"evil": evil, "good": fine}))

    async def main():
        _, why = await router.apick(_view("evil"), CHAT, 0.0)
        assert why["kv_index"] == "approximate: the request cannot be tokenized here in time"
        assert pool.killed == 1 and pool.benched("evil")
        _, again = await router.apick(_view("evil"), CHAT, 0.0)  # benched: no worker asked
        assert again["kv_index"] == why["kv_index"] and pool.asked == 1 and pool.killed == 1
        pool.deadline_s = 60  # the replacement worker (started in the background) may still be loading
        _, good = await router.apick(_view("good"), CHAT, 0.0)
        assert good["kv_index"] == "precise" and not pool.benched("fine")
        want = RequestHasher(EngineTokenizer.from_files(_files(CHAT_TEMPLATE))).request_hashes(CHAT)
        assert await fine.hash_request(CHAT) == want  # the worker's hashes are the engine tokenizer's
        await pool.close()

    asyncio.run(asyncio.wait_for(main(), 120))


def test_a_worker_that_exceeds_its_cpu_limit_is_ended_by_the_kernel():
    """Without the pool's deadline (here: longer than the CPU limit) the worker's RLIMIT_CPU ends it."""
    pool = TokenizePool(workers=1, deadline_s=120, cpu_s=1)

    async def main():
        assert await PooledHasher(pool, "evil", _files(NESTED)).hash_request(CHAT) is None
        assert pool.killed == 1 and pool.benched("evil")
        await pool.close()

    asyncio.run(asyncio.wait_for(main(), 120))


def test_a_call_that_finds_every_worker_busy_routes_approximately_without_a_bench():
    pool = TokenizePool(workers=1, deadline_s=60, cpu_s=60)
    evil = PooledHasher(pool, "evil", _files(NESTED))
    fine = PooledHasher(pool, "fine", _files(CHAT_TEMPLATE))

    async def main():
        hostile = asyncio.create_task(evil.hash_request(CHAT))
        while pool.asked == 0:
            await asyncio.sleep(0.02)
        pool.deadline_s = 0.2  # for the next call's wait for a free worker
        assert await fine.hash_request(CHAT) is None and not pool.benched("fine")
        hostile.cancel()
        with pytest.raises(asyncio.CancelledError):
            await hostile
        pool.deadline_s = 60
        assert await fine.hash_request(CHAT)  # the replaced worker serves it
        await pool.close()

    asyncio.run(asyncio.wait_for(main(), 120))
