"""The queue hold: a replica's queue is the highest waiting reading of its last 3 scrapes within
15 s, so a gauge that reads 0 between two busy readings does not send its weight back to 32; the
reason in explain routing names the readings the weight came from."""

import asyncio

import pytest

from common import keyspace
from common.engine_metrics.hold import QUEUE_HOLD_S, describe, hold, kept
from common.schemas import InferenceEndpoint, ReplicaObservation
from common.store.sqlite_store import SqliteStore
from controlplane.placement import vip_pool
from controlplane.routing.controller import RoutingWorker
from controlplane.routing.strategies import plan_routing, to_weight
from tests.controlplane.planner_data import NOW, node, replica
from tests.controlplane.test_routing_controller import EngineServer, RecordingAgent
from tests.controlplane.test_routing_strategies import ep
from tests.support.fake_agents import FakeAgents


def read(t, queue, ok=True):
    return ReplicaObservation(replica_id="qwen-0-abc", scraped_at=t, ok=ok, queue_depth=queue)


@pytest.mark.parametrize("earlier,now_queue,held,reads", [
    ([], 0, 0, [0]),  # the first scrape is its own reading
    ([(NOW - 4, 6), (NOW - 2, 0)], 0, 6, [6, 0, 0]),  # a zero between busy readings: held
    ([(NOW - 6, 9), (NOW - 4, 6), (NOW - 2, 0)], 0, 6, [6, 0, 0]),  # only the last 3 scrapes count
    ([(NOW - QUEUE_HOLD_S, 9), (NOW - 2, 1)], 0, 1, [1, 0]),  # none older than 15 s
    ([(NOW - 4, 2)], 5, 5, [2, 5]),  # a rise counts at once
])
def test_hold_keeps_the_highest_recent_reading(earlier, now_queue, held, reads):
    out = hold(read(NOW, now_queue), earlier)
    assert (out.queue_depth, out.queue_reads) == (held, reads)


def test_a_failed_scrape_is_not_held_and_keeps_the_readings():
    failed = read(NOW, 0, ok=False)
    assert hold(failed, [(NOW - 2, 6)]) is failed
    assert kept([(NOW - 2, 6)], NOW) == [(NOW - 2, 6)]


def test_the_reason_names_the_readings_the_weight_came_from():
    reps = [replica(0, host="10.0.0.1"), replica(1, host="10.0.0.2")]
    held = hold(read(NOW, 0), [(NOW - 4, 6), (NOW - 2, 0)])
    idle = ReplicaObservation(replica_id="qwen-1-abc", scraped_at=NOW, ok=True, queue_reads=[0, 0])
    plan = plan_routing(ep("least_queue"), reps, {"qwen-0-abc": held, "qwen-1-abc": idle},
                        {"n1": node("n1", 8)}, NOW)
    reasons = {e.replica_id: e.reason for e in plan.entries}
    assert plan.weights == {"qwen-0-abc": to_weight(1 / 7), "qwen-1-abc": 32}
    assert reasons["qwen-0-abc"] == "least_queue: weight 5 from queue 6 (the highest of its last 3 scrapes: 6, 0, 0)"
    assert reasons["qwen-1-abc"] == "least_queue: weight 32 from queue 0"  # held or not, nothing to say
    assert describe(hold(read(NOW, 3), [(NOW - 2, 1)])) == ""  # this scrape's reading set it


def test_the_controller_holds_each_replicas_readings_across_ticks(tmp_path):
    """A real engine page read every 2 s: 6 waiting, then 0 three times; the weight stays low for
    the two scrapes the 6 is held, then evens out; the stored observation carries the held queue."""
    store = SqliteStore(tmp_path / "f.db")
    clock = [NOW]

    async def run():
        srv = await EngineServer().start()
        n = node("n1", 4).model_copy(update={"last_heartbeat": NOW + 3600})
        store.put(keyspace.nodes("n1"), n.model_dump_json())
        store.put(keyspace.endpoints("ep"), InferenceEndpoint(name="ep", deployment="qwen",
                                                              routing="least_queue").model_dump_json())
        r = replica(0, "n1", host="127.0.0.1").model_copy(update={"port": srv.port})
        store.put(keyspace.replicas("qwen", r.replica_id), r.model_dump_json())
        worker = RoutingWorker(store, FakeAgents(lambda _: RecordingAgent()), vip_pool.parse_pool("10.96.0.0/30"),
                               clock=lambda: clock[0])
        seen = []
        for queue in (6, 0, 0, 0):
            srv.queue = queue
            await worker.tick()
            stored = ReplicaObservation.model_validate_json(store.get(keyspace.observations(r.replica_id)).value)
            seen.append((stored.queue_depth, worker.memory.plans["ep"].entries[0].weight))
            clock[0] += 2
        assert seen == [(6, 5), (6, 5), (6, 5), (0, 32)]
        clock[0] += QUEUE_HOLD_S  # a long gap: nothing earlier counts
        srv.queue = 0
        await worker.tick()
        assert worker.observer.queue_reads[r.replica_id] == [(clock[0], 0)]
        store.delete(keyspace.replicas("qwen", r.replica_id))
        await worker.tick()
        assert r.replica_id not in worker.observer.queue_reads  # forgotten with the replica
        srv.close()
        await worker.aclose()

    asyncio.run(run())
    store.close()
