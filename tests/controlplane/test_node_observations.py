"""POST /api/ai/nodes/{id}/observations through real mutual TLS: a node reports only the engines
placed on it. Its own replica's observation is stored with its time moved onto fabricd's clock;
another node's replica refuses the whole report (403 not_your_replica) and stores nothing; a
report under another node's path is refused by identity; a replica already gone is ignored."""

from __future__ import annotations

import time

import pytest

from agent.engine_watch import EngineWatch, compact
from common import keyspace
from common.agent_api import NodeReport, ObservationReport, ObservedReplica
from common.records import replicas as replica_records
from common.schemas import ReplicaObservation
from controlplane.settings import FabricdSettings
from tests.controlplane.planner_data import replica
from tests.controlplane.test_nodes_mtls import admin, as_node, node_files, serve_fabricd  # noqa: F401 - a fixture


@pytest.fixture(scope="module")
def fabricd(tmp_path_factory):
    """An API-only fabricd: no reconcile pass removes the replicas these records stand for."""
    yield from serve_fabricd(tmp_path_factory.mktemp("fabricd"), FabricdSettings(run_controllers=False))

SKEW_S = 1000.0  # the agent's clock runs this far behind fabricd's


def body(*items: tuple[str, str], sent_at: float, queue: float = 2) -> str:
    return ObservationReport(sent_at=sent_at, observations=[
        ObservedReplica(replica_id=rid, deployment=dep, scraped_at=sent_at - 1, ok=True, queue_depth=queue)
        for rid, dep in items]).model_dump_json(exclude_defaults=True)


def stored(state, rid: str) -> ReplicaObservation | None:
    kv = state.store.get(keyspace.observations(rid))
    return None if kv is None else ReplicaObservation.model_validate_json(kv.value)


def test_a_node_reports_only_its_own_replicas(fabricd, admin, tmp_path):  # noqa: F811 - the fixture
    state = fabricd["state"]
    mine = replica(0, "obs-a", host="10.0.0.1")
    theirs = replica(1, "obs-b", host="10.0.0.2")
    for r in (mine, theirs):
        replica_records.put(state.store, r)
    files = node_files(admin, tmp_path, "obs-a")
    sent_at = time.time() - SKEW_S
    with as_node(fabricd, files) as c:
        ok = c.post("/api/ai/nodes/obs-a/observations", content=body((mine.replica_id, "qwen"), ("gone-0", "qwen"),
                                                                      sent_at=sent_at),
                    headers={"content-type": "application/json"})
        assert ok.status_code == 200, ok.text
        assert ok.json() == {"accepted": 1, "ignored": ["gone-0"]}
        obs = stored(state, mine.replica_id)
        assert obs is not None and obs.queue_depth == 2
        assert abs(obs.scraped_at - (time.time() - 1)) < 30  # on fabricd's clock, not 1000 s old

        other = c.post("/api/ai/nodes/obs-a/observations",
                       content=body((mine.replica_id, "qwen"), (theirs.replica_id, "qwen"), sent_at=time.time(),
                                    queue=7), headers={"content-type": "application/json"})
        assert other.status_code == 403 and other.json()["error"]["code"] == "not_your_replica", other.text
        assert stored(state, theirs.replica_id) is None
        assert stored(state, mine.replica_id).queue_depth == 2  # the refused report stored nothing

        as_b = c.post("/api/ai/nodes/obs-b/observations", content=body((theirs.replica_id, "qwen"),
                                                                       sent_at=time.time()),
                      headers={"content-type": "application/json"})
        assert as_b.status_code == 403, as_b.text
        assert stored(state, theirs.replica_id) is None

        bad = c.post("/api/ai/nodes/obs-a/observations", json={"sent_at": 1, "observations": [{"replica_id": "x"}]})
        assert bad.status_code in (400, 422), bad.text


def test_what_a_node_stores_per_replica_is_bounded(fabricd, admin, tmp_path):  # noqa: F811 - the fixture
    """A node's report and heartbeat fields are bounded per item (under the body limit): an error
    text, a queue history or a replica name the size of a megabyte is refused 422 and stores
    nothing, so a node cannot grow its replicas' records (and every mirror of them) at will."""
    state = fabricd["state"]
    mine = replica(2, "obs-c", host="10.0.0.3")
    replica_records.put(state.store, mine)
    files = node_files(admin, tmp_path, "obs-c")
    one = {"replica_id": mine.replica_id, "deployment": "qwen", "scraped_at": time.time(), "ok": True}
    with as_node(fabricd, files) as c:
        for huge in ({"error": "x" * 5000}, {"health_error": "x" * 5000}, {"queue_reads": [1.0] * 1000},
                     {"missing": ["queue"] * 100}, {"replica_id": "r" * 300}):
            refused = c.post("/api/ai/nodes/obs-c/observations",
                             json={"sent_at": time.time(), "observations": [one | huge]})
            assert refused.status_code == 422, (huge.keys(), refused.text)
        assert stored(state, mine.replica_id) is None
        ok = c.post("/api/ai/nodes/obs-c/observations",
                    json={"sent_at": time.time(), "observations": [one | {"error": "x" * 200}]})
        assert ok.status_code == 200 and ok.json()["accepted"] == 1, ok.text
    with pytest.raises(ValueError):
        NodeReport(id="obs-c", address="https://127.0.0.1:1", observed_replicas=["r" * 300])
    with pytest.raises(ValueError):
        NodeReport(id="obs-c", address="https://127.0.0.1:1", service_generations={"k" * 100: 1})


def test_an_agents_gzip_report_is_decompressed_and_stored(fabricd, admin, tmp_path):  # noqa: F811 - the fixture
    """The agent's own sender (agent.engine_watch) over real mutual TLS: its report goes
    gzip-compressed, fabricd's request guard decompresses it, and the route stores it."""
    state = fabricd["state"]
    mine = replica(2, "obs-z", host="10.0.0.3")
    replica_records.put(state.store, mine)
    files = node_files(admin, tmp_path, "obs-z")
    with as_node(fabricd, files) as c:
        watch = EngineWatch("obs-z", None, None, c, clock=time.time)
        item = ObservedReplica(replica_id=mine.replica_id, deployment="qwen", scraped_at=time.time() - 1, ok=True,
                               queue_depth=4, queue_reads=[4.0])
        assert watch.send([compact(item)])
        assert watch.gzip and watch.last_error == ""  # taken compressed: no plain resend
    obs = stored(state, mine.replica_id)
    assert obs is not None and obs.queue_depth == 4 and obs.queue_reads == [4.0]


def test_a_report_reads_its_replicas_in_one_store_round_trip(tmp_path):
    """A report of a node's 8 engines costs fabricd one read of their placements, not one per
    replica (1,000 nodes report every few seconds: per-replica reads were most of the handler)."""
    from types import SimpleNamespace

    from common.store.sqlite_store import SqliteStore
    from controlplane.ops.nodes import report_observations
    from lab.rigs.scale import CountingStore

    store = CountingStore(SqliteStore(str(tmp_path / "s.db")))
    mine = [replica(i, "obs-n", host="10.0.0.9") for i in range(8)]
    for r in mine:
        replica_records.put(store, r)
    reads0, calls0, now = store.reads, dict(store.calls), time.time()
    answer = report_observations(SimpleNamespace(store=store), "obs-n", ObservationReport(sent_at=now, observations=[
        ObservedReplica(replica_id=r.replica_id, deployment=r.deployment, scraped_at=now, ok=True, queue_depth=1)
        for r in mine] + [ObservedReplica(replica_id="gone-9", deployment="qwen", scraped_at=now, ok=True)]), now)
    assert answer.accepted == 8 and answer.ignored == ["gone-9"]
    assert store.reads - reads0 == 1 and store.calls == calls0 | {"get_all": 1}
    assert all(stored(SimpleNamespace(store=store), r.replica_id).queue_depth == 1 for r in mine)
