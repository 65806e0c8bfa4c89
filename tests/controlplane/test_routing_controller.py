"""The routing controller's Maglev and VIP ordering on a real SQLite store, with a recording
agent behind the AgentClients interface we own (for_node -> async put_services/delete_service); and
its hot path: the /metrics scraper against a raw HTTP server, the parse cache, observation writes
only on material change, concurrent pushes. Pushes by generation: tests/controlplane/test_routing_push.py."""

import asyncio
import gzip
import time
from pathlib import Path

import pytest

from common import keyspace
from common.agent_api import MaglevBatchResult, MaglevPutResult
from common.engine_metrics.material import REFRESH_AFTER_S, material_change
from common.engine_metrics.observer import EngineTarget
from common.engine_metrics.parse import MetricsParseError, SeriesCache, parse_vllm_metrics
from common.engine_metrics.scrape import MetricsScraper, ScrapeError
from common.errors import TransientError
from common.schemas import InferenceEndpoint, ReplicaObservation
from controlplane.placement import vip_pool
from controlplane.routing.controller import RoutingWorker
from controlplane.routing.strategies import UNREAD_WEIGHT
from tests.controlplane.planner_data import node, replica
from tests.controlplane.test_routing_strategies import bump
from tests.support.fake_agents import FakeAgents


class RecordingAgent:
    """An agent's Maglev API in memory: ``puts`` counts services received, ``requests`` the batches."""

    def __init__(self):
        self.services: dict[tuple, dict] = {}
        self.specs: dict[tuple, object] = {}
        self.generations: dict[str, int] = {}
        self.puts = 0
        self.requests = 0
        self.unreachable = False

    async def put_services(self, batch, timeout=None):
        if self.unreachable:
            raise TransientError("agent unreachable")
        self.requests += 1
        results = []
        for s in batch:
            held = self.generations.get(s.key, 0)
            if s.generation < held:
                results.append(MaglevPutResult(key=s.key, generation=s.generation, outcome="stale", held=held))
                continue
            self.puts += 1
            self.services[(s.vip, s.port, s.proto)] = dict(s.backends)
            self.specs[(s.vip, s.port, s.proto)] = s
            self.generations[s.key] = s.generation
            results.append(MaglevPutResult(key=s.key, generation=s.generation, outcome="applied", held=s.generation))
        return MaglevBatchResult(results=results)

    def report(self) -> dict[str, int]:
        """What its heartbeat would say: the generation of each service it holds."""
        held = {f"{vip}:{port}/{proto}" for vip, port, proto in self.services}
        return {k: g for k, g in self.generations.items() if k in held}

    async def delete_service(self, vip, port, proto):
        if self.unreachable:
            raise TransientError("agent unreachable")
        self.generations.pop(f"{vip}:{port}/{proto}", None)
        return self.services.pop((vip, port, proto), None) is not None  # False = 404


def seed(store, now):
    n = node("n1", 4)
    store.put(keyspace.nodes("n1"), n.model_copy(update={"last_heartbeat": now}).model_dump_json())
    store.put(keyspace.endpoints("ep"), InferenceEndpoint(name="ep", deployment="qwen",
                                                          routing="least_queue").model_dump_json())
    for i, queue in ((0, 0), (1, 3)):
        r = replica(i, "n1", host=f"10.0.0.{i + 1}")
        store.put(keyspace.replicas("qwen", r.replica_id), r.model_dump_json())
        store.put(keyspace.observations(r.replica_id), ReplicaObservation(
            replica_id=r.replica_id, scraped_at=now, ok=True, queue_depth=queue).model_dump_json())


def test_push_on_change_and_maglev_absent_before_vip_release(store):
    now = time.time()
    seed(store, now)
    agents = FakeAgents(lambda _: RecordingAgent())
    worker = RoutingWorker(store, agents, vip_pool.parse_pool("10.96.0.0/30"))
    worker.scrape_all = lambda snap: asyncio.sleep(0)  # observations are seeded, not scraped here

    async def run():
        await worker.tick()
        agent = agents.by_node["n1"]
        assert agent.services == {("10.96.0.1", 8000, "tcp"): {"10.0.0.1:8000": 32, "10.0.0.2:8000": 9}}
        await worker.tick()
        assert agent.puts == 1  # unchanged weights are not pushed again
        store.delete(keyspace.endpoints("ep"))
        agent.unreachable = True
        await worker.tick()
        assert vip_pool.owner_of(store, "10.96.0.1") == "ep"  # agent unreachable: VIP kept
        agent.unreachable = False
        await worker.tick()
        assert agent.services == {}
        assert vip_pool.owner_of(store, "10.96.0.1") is None
        await worker.aclose()

    asyncio.run(run())


def heartbeat(store, node_id: str, at: float, generations: dict[str, int], withdrawn: str = "") -> None:
    n = node(node_id, 4).model_copy(update={"last_heartbeat": at, "service_generations": generations,
                                            "services_withdrawn": withdrawn})
    store.put(keyspace.nodes(node_id), n.model_dump_json())


def test_an_agent_that_lost_a_service_gets_it_again_and_nothing_is_resent_on_a_timer(store):
    """Nothing is re-sent because time passed: an agent holding the plan's generation (its answer,
    then its heartbeat) gets nothing, however long. One whose heartbeat, newer than its answer,
    reports another generation or none (a restart, a hand edit) gets that service again."""
    now = time.time()
    seed(store, now)
    agents = FakeAgents(lambda _: RecordingAgent())
    clock = [now]
    worker = RoutingWorker(store, agents, vip_pool.parse_pool("10.96.0.0/30"), clock=lambda: clock[0])
    worker.scrape_all = lambda snap: asyncio.sleep(0)
    key = ("10.96.0.1", 8000, "tcp")

    async def run():
        await worker.tick()
        agent = agents.by_node["n1"]
        planned = dict(agent.services[key])
        for hour in range(1, 4):  # hours pass, readings and heartbeats agree: no push
            clock[0] = now + 3600 * hour
            seed(store, clock[0])
            heartbeat(store, "n1", clock[0], agent.report())
            await worker.tick()
        assert agent.puts == 1
        agent.services.clear()  # the agent restarted without its services
        agent.generations.clear()
        clock[0] += 10
        heartbeat(store, "n1", clock[0], {})
        await worker.tick()
        assert agent.puts == 2 and agent.services[key] == planned
        await worker.aclose()

    asyncio.run(run())


def test_a_node_that_withdrew_its_services_gets_them_again_at_once(store):
    """A fail-closed site's agent deletes its services while cut off (agent.fail_closed): its
    heartbeat then reports none, and the next tick pushes them to it again; once the report
    carries the generation, nothing more."""
    now = time.time()
    seed(store, now)
    agents = FakeAgents(lambda _: RecordingAgent())
    clock = [now]
    worker = RoutingWorker(store, agents, vip_pool.parse_pool("10.96.0.0/30"), clock=lambda: clock[0])
    worker.scrape_all = lambda snap: asyncio.sleep(0)
    key = ("10.96.0.1", 8000, "tcp")

    async def run():
        await worker.tick()
        agent = agents.by_node["n1"]
        planned = dict(agent.services[key])
        agent.services.clear()  # the agent withdrew them
        agent.generations.clear()
        clock[0] += 1
        heartbeat(store, "n1", clock[0], {}, "fail-closed: no heartbeat answered")
        await worker.tick()
        assert agent.puts == 2 and agent.services[key] == planned
        clock[0] += 1
        heartbeat(store, "n1", clock[0], agent.report())
        await worker.tick()
        assert agent.puts == 2  # back to pushing on change only
        await worker.aclose()

    asyncio.run(run())


def test_a_404_on_delete_counts_as_absent(store):
    now = time.time()
    seed(store, now)
    agents = FakeAgents(lambda _: RecordingAgent())
    worker = RoutingWorker(store, agents, vip_pool.parse_pool("10.96.0.0/30"))
    worker.scrape_all = lambda snap: asyncio.sleep(0)

    async def run():
        await worker.tick()
        agents.by_node["n1"].services.clear()  # the agent lost it (restart): its DELETE will be 404
        store.delete(keyspace.endpoints("ep"))
        await worker.tick()
        assert vip_pool.owner_of(store, "10.96.0.1") is None
        await worker.aclose()

    asyncio.run(run())


# -- the hot path: scraper, series cache, observation writes, concurrent pushes ----------------------

FIXTURES = Path(__file__).parent / "fixtures"
PAGE = "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{model_name=\"m\"} %d\n"


class EngineServer:
    """A raw HTTP/1.1 server whose answer per request is chosen by ``mode``; counts connections."""

    def __init__(self, mode="length"):
        self.mode, self.queue, self.connections, self.requests = mode, 0, 0, 0

    async def start(self):
        self.server = await asyncio.start_server(self.handle, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def handle(self, reader, writer):
        self.connections += 1
        served = False
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                assert head.startswith(b"GET /metrics HTTP/1.1\r\n") and b"\r\nhost: 127.0.0.1:" in head.lower()
                if self.mode == "one-per-connection" and served:
                    break  # kept the connection idle, then drops the next request unanswered
                served = True
                self.requests += 1
                body = (PAGE % self.queue).encode()
                if self.mode == "hang":
                    await asyncio.sleep(30)
                if self.mode == "slow":  # a busy CPU engine: the page comes, late
                    await asyncio.sleep(0.5)
                if self.mode == "503":
                    writer.write(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 4\r\n\r\nbusy")
                elif self.mode == "chunked":
                    writer.write(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
                    for part in (body[:10], body[10:]):
                        writer.write(b"%x\r\n%s\r\n" % (len(part), part))
                    writer.write(b"0\r\n\r\n")
                elif self.mode == "gzip":  # asked for identity, got gzip anyway
                    packed = gzip.compress(body)
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: %d\r\n\r\n%s"
                                 % (len(packed), packed))
                elif self.mode == "gzip-bomb":  # a small body that inflates far past any page
                    packed = gzip.compress(body + b" " * (8 << 20))
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: %d\r\n\r\n%s"
                                 % (len(packed), packed))
                elif self.mode == "close":  # no length: the body ends when the connection does
                    writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + body)
                    await writer.drain()
                    break
                else:
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    def close(self):
        self.server.close()


def test_scraper_keeps_connections_alive_and_reads_every_body_framing():
    async def run():
        scraper = MetricsScraper(timeout_s=0.5)
        servers = {m: await EngineServer(m).start() for m in ("length", "chunked", "close", "one-per-connection", "gzip")}
        for _ in range(3):
            for mode, srv in servers.items():
                srv.queue += 1
                text = await scraper.get_text("127.0.0.1", srv.port)
                assert parse_vllm_metrics(text).waiting == srv.queue, mode
                await asyncio.sleep(0.01)  # lets the closing server's FIN arrive
        assert servers["length"].connections == 1 and servers["chunked"].connections == 1  # kept alive
        assert servers["gzip"].connections == 1
        assert servers["close"].connections == 3
        # The engine dropped each reused connection: it failed before any byte, so one fresh try.
        assert servers["one-per-connection"].connections == 3
        scraper.keep_only(set())
        await scraper.aclose()
        for srv in servers.values():
            srv.close()

    asyncio.run(run())


def test_scraper_errors_are_scrape_errors():
    async def run():
        scraper = MetricsScraper(timeout_s=0.3)
        bad, slow = await EngineServer("503").start(), await EngineServer("hang").start()
        with pytest.raises(ScrapeError, match="HTTP 503"):
            await scraper.get_text("127.0.0.1", bad.port)
        with pytest.raises(ScrapeError, match="timed out"):
            await scraper.get_text("127.0.0.1", slow.port)
        # 8 KiB on the wire, 8 MiB inflated: refused once past max_bytes, never inflated whole
        bomb = await EngineServer("gzip-bomb").start()
        capped = MetricsScraper(timeout_s=2.0, max_bytes=1 << 20)
        with pytest.raises(ScrapeError, match="decompresses to over"):
            await capped.get_text("127.0.0.1", bomb.port)
        await capped.aclose()
        bomb.close()
        port = bad.port
        bad.close()
        slow.close()
        await bad.server.wait_closed()
        with pytest.raises(ScrapeError, match="connect"):
            await scraper.get_text("127.0.0.1", port)
        await scraper.aclose()

    asyncio.run(run())


def test_the_scrape_deadline_is_the_setting(store):
    """FABRIC_SCRAPE_TIMEOUT_SECS reaches the scraper: a page later than the deadline is a failed
    scrape (the replica is excluded, never read as idle); the same page within it is read."""
    async def run():
        slow = await EngineServer("slow").start()
        slow.queue = 3
        r = replica(0, "n1", host="127.0.0.1").model_copy(update={"port": slow.port})
        for timeout_s, ok in ((0.1, False), (3.0, True)):
            worker = RoutingWorker(store, FakeAgents(lambda _: RecordingAgent()), vip_pool.parse_pool("10.96.0.0/30"), scrape_timeout_s=timeout_s)
            obs = await worker.observer.observe(EngineTarget(r.replica_id, r.host, r.port, r.runtime))
            await worker.aclose()
            assert obs.ok is ok, (timeout_s, obs.error)
            assert obs.queue_depth == 3 if ok else "timed out after 0.1s" in obs.error
        slow.close()

    asyncio.run(run())


def test_series_cache_reads_what_the_parser_reads():
    odd = ('vllm:num_requests_waiting{model_name="a}b \\"q\\" c"} 3 1700000000000\n'
           'vllm:num_requests_waiting{model_name="x"} NaN\nvllm:num_requests_running 2.5\n')
    for text in [(FIXTURES / f).read_text() for f in ("vllm_0_6_metrics.txt", "vllm_0_10_metrics.txt")] + [odd]:
        cache = SeriesCache()
        for page in (text, text, bump(text, "vllm:generation_tokens_total", 1.5),
                     bump(text, "vllm:time_to_first_token_seconds_bucket", 2)):
            assert parse_vllm_metrics(page, cache) == parse_vllm_metrics(page)
        assert 0 < len(cache) < 40  # one entry per series, not per scrape
    with pytest.raises(MetricsParseError):
        parse_vllm_metrics("<html>502 Bad Gateway</html>", SeriesCache())


def test_material_change():
    base = ReplicaObservation(replica_id="r", scraped_at=100.0, ok=True, queue_depth=2, kv_cache_usage=0.5,
                              tokens_per_s=100.0)
    later = base.model_copy(update={"scraped_at": 105.0})
    assert material_change(None, later)
    assert not material_change(base, later)
    assert not material_change(base, later.model_copy(update={"kv_cache_usage": 0.502, "tokens_per_s": 101.0}))
    for update in ({"queue_depth": 3}, {"running": 1}, {"kv_cache_usage": 0.51}, {"tokens_per_s": 110.0},
                   {"tokens_per_s": None}, {"ttft_p50_s": 0.2}, {"ok": False}):
        assert material_change(base, later.model_copy(update=update)), update
    assert material_change(base, base.model_copy(update={"scraped_at": 100.0 + REFRESH_AFTER_S}))
    failed = base.model_copy(update={"ok": False, "error": "x"})
    assert not material_change(failed, failed.model_copy(update={"scraped_at": 105.0, "error": "y"}))


def test_observations_written_on_material_change_and_the_plan_uses_fresh_ones(store):
    clock = [time.time()]

    async def run():
        srv = await EngineServer().start()
        n = node("n1", 4)
        store.put(keyspace.nodes("n1"), n.model_copy(update={"last_heartbeat": clock[0] + 3600}).model_dump_json())
        store.put(keyspace.endpoints("ep"), InferenceEndpoint(name="ep", deployment="qwen",
                                                              routing="least_queue").model_dump_json())
        r = replica(0, "n1", host="127.0.0.1").model_copy(update={"port": srv.port})
        store.put(keyspace.replicas("qwen", r.replica_id), r.model_dump_json())
        agents = FakeAgents(lambda _: RecordingAgent())
        worker = RoutingWorker(store, agents, vip_pool.parse_pool("10.96.0.0/30"), clock=lambda: clock[0])
        key = keyspace.observations(r.replica_id)

        await worker.tick()
        first = store.get(key)
        assert ReplicaObservation.model_validate_json(first.value).ok
        clock[0] += 5
        await worker.tick()  # tokens_per_s appears (second scrape): written
        second = store.get(key)
        assert second.mod_revision > first.mod_revision
        clock[0] += 5
        await worker.tick()  # nothing moved: not written, yet planned from the fresh scrape
        assert store.get(key).mod_revision == second.mod_revision
        assert worker.memory.plans["ep"].entries[0].metrics["scraped_at"] == clock[0]
        srv.queue = 4
        clock[0] += 1
        await worker.tick()  # the queue moved: written (the gateway sheds on it)
        assert ReplicaObservation.model_validate_json(store.get(key).value).queue_depth == 4
        third = store.get(key)
        clock[0] += REFRESH_AFTER_S
        await worker.tick()  # unchanged but the stored one is REFRESH_AFTER_S old: written
        assert store.get(key).mod_revision > third.mod_revision

        srv.close()
        await srv.server.wait_closed()
        worker.observer.scraper.keep_only(set())  # the kept-alive connection would otherwise still answer
        clock[0] += 1
        await worker.tick()  # a failed scrape is written at once and never read as idle
        obs = ReplicaObservation.model_validate_json(store.get(key).value)
        assert not obs.ok and "ScrapeError" in obs.error
        entry = worker.memory.plans["ep"].entries[0]
        # the only replica, Ready, with no fresh page: the VIP keeps it at the equal weight
        assert entry.reason.startswith("last scrape failed") and "no replica has a fresh page" in entry.reason
        assert entry.included and entry.weight == UNREAD_WEIGHT
        await worker.aclose()

    asyncio.run(run())


def test_pushes_reach_every_agent_concurrently_and_only_on_change(store):
    now = time.time()
    seed(store, now)
    store.put(keyspace.nodes("n2"), node("n2", 4).model_copy(update={"last_heartbeat": now}).model_dump_json())
    both_started = asyncio.Event()
    started: list[str] = []

    class SlowAgent(RecordingAgent):
        def __init__(self, name):
            super().__init__()
            self.name = name

        async def put_services(self, batch, timeout=None):
            started.append(self.name)
            if len(started) == 2:
                both_started.set()
            await asyncio.wait_for(both_started.wait(), 2.0)  # a sequential push would time out here
            return await super().put_services(batch, timeout)

    agents = FakeAgents(lambda _: RecordingAgent())
    agents.by_node = {"n1": SlowAgent("n1"), "n2": SlowAgent("n2")}
    worker = RoutingWorker(store, agents, vip_pool.parse_pool("10.96.0.0/30"))
    worker.scrape_all = lambda snap: asyncio.sleep(0)

    async def run():
        await worker.tick()
        await worker.tick()
        assert sorted(started) == ["n1", "n2"]
        assert agents.by_node["n1"].puts == agents.by_node["n2"].puts == 1
        await worker.aclose()

    asyncio.run(run())


def test_weight_series_follow_the_fleet(store):
    """fabric_routing_weight{endpoint,replica}: a replica that is gone loses its series, and a deleted
    endpoint loses all of them, so "all weights zero" keeps reading the live fleet."""
    from prometheus_client import CollectorRegistry

    from controlplane.controllers import ControllerMetrics

    now = time.time()
    seed(store, now)
    registry = CollectorRegistry()
    worker = RoutingWorker(store, FakeAgents(lambda _: RecordingAgent()), vip_pool.parse_pool("10.96.0.0/30"), metrics=ControllerMetrics(registry))
    worker.scrape_all = lambda snap: asyncio.sleep(0)

    def series() -> dict[str, float]:
        return {s.labels["replica"]: s.value for m in registry.collect() if m.name == "fabric_routing_weight"
                for s in m.samples if s.labels.get("endpoint") == "ep"}

    async def run():
        await worker.tick()
        assert series() == {"qwen-0-abc": 32, "qwen-1-abc": 9}
        store.delete(keyspace.replicas("qwen", "qwen-1-abc"))
        await worker.tick()
        assert series() == {"qwen-0-abc": 32}
        store.delete(keyspace.endpoints("ep"))
        await worker.tick()
        assert series() == {}
        await worker.aclose()

    asyncio.run(run())
