"""Leader-only writes are fenced by the orchestration lease, on a real SQLite store.

A process whose lease expired or was taken over must not write replica records, GPU
reservations, VIPs, observations or statuses, nor call agents, even in the middle of a pass:
the workers get a FencedStore / FencedAgents that check ``lock.held()`` right before each write.
A RecordingStore under the fence sees every write that got through.
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from prometheus_client import CollectorRegistry

from common import keyspace
from common.agent_api import GpuBindResult, MaglevBatchResult, MaglevPutResult, VmInfo
from common.store.locks import FencedStore, LeaseLock, LeaseLost
from common.store.sqlite_store import SqliteStore
from controlplane.controllers import ControllerHandle, FencedAgents, LeaseKeeper, lead, sweep
from controlplane.placement import vip_pool
from controlplane.reconcile import plan as rp
from controlplane.reconcile.apply import ReconcileWorker
from controlplane.routing.controller import RoutingWorker
from controlplane.settings import ControllerSettings, FabricdSettings
from controlplane.state import AppState
from lab.rigs.polling import wait_for
from tests.controlplane.planner_data import deployment, model, node, profile
from tests.support.fake_agents import FakeAgents

LOCK = "orchestration"


class RecordingStore:
    """Passes everything to the real store and records each write that reaches it."""

    WRITES = ("put", "put_all", "create", "cas", "delete", "delete_prefix")

    def __init__(self, inner):
        self.inner = inner
        self.writes: list[tuple[str, str]] = []
        self._mu = threading.Lock()

    def __getattr__(self, name):
        attr = getattr(self.inner, name)
        if name not in self.WRITES:
            return attr

        def write(key, *args, **kwargs):
            with self._mu:  # put_all: one entry per key it writes
                self.writes += [(name, k) for k, _ in key] if name == "put_all" else [(name, key)]
            return attr(key, *args, **kwargs)

        return write

    def since(self, mark: int) -> list[tuple[str, str]]:
        with self._mu:
            return [w for w in self.writes[mark:] if not w[1].startswith(keyspace.locks())]


class Agent:
    def __init__(self, log: list, block_create: threading.Event | None = None, started=None):
        self.log, self.block_create, self.started = log, block_create, started

    async def bind_gpu(self, pci):
        self.log.append(("bind", pci))
        return GpuBindResult(bdf=pci, changed=False)

    async def release_gpu(self, pci):
        self.log.append(("release", pci))
        return GpuBindResult(bdf=pci, changed=False)

    async def create_vm(self, req):
        self.log.append(("create_vm", req.replica_id))
        if self.block_create is not None:
            self.started.set()
            while not self.block_create.is_set():  # the agent is slow: the lease is lost meanwhile
                await asyncio.sleep(0.02)
        return VmInfo(id=req.replica_id, state="running", host="127.0.0.1", port=1)

    async def delete_vm(self, vm_id):
        self.log.append(("delete_vm", vm_id))
        return True

    async def put_services(self, batch, timeout=None):
        self.log.extend(("put_service", s.vip) for s in batch)
        return MaglevBatchResult(results=[MaglevPutResult(key=s.key, generation=s.generation, outcome="applied",
                                                          held=s.generation) for s in batch])

    async def delete_service(self, vip, port, proto):
        self.log.append(("delete_service", vip))
        return True


@pytest.fixture
def raw(tmp_path):
    s = SqliteStore(tmp_path / "fabric.db")
    yield s
    s.close()


def seed(store, replicas=1):
    store.put(keyspace.models("qwen"), model().model_dump_json())
    store.put(keyspace.profiles("p24"), profile().model_dump_json())
    # loopback VMs (the fake's) are only taken from an agent on loopback (controlplane.node_trust)
    n = node("n1", 2).model_copy(update={"last_heartbeat": time.time() + 600, "address": "https://127.0.0.1:7443"})
    store.put(keyspace.nodes("n1"), n.model_dump_json())
    store.put(keyspace.deployments("qwen"), deployment(replicas).model_dump_json())


def test_fenced_store_writes_only_while_held(raw):
    lock = LeaseLock(raw, LOCK, holder="a", ttl=1)
    assert lock.try_acquire()
    fenced = FencedStore(raw, lock)
    fenced.put("/fabric/x", "1")
    wait_for(lambda: not lock.held(), 2.0, "the local validity to lapse", interval=0.02)  # 0.8 x TTL
    before = raw.revision()
    for write in (lambda: fenced.put("/fabric/x", "2"), lambda: fenced.create("/fabric/y", "1"),
                  lambda: fenced.cas("/fabric/x", "3", 1), lambda: fenced.delete("/fabric/x"),
                  lambda: fenced.delete_prefix("/fabric/")):
        with pytest.raises(LeaseLost, match="no longer holds"):
            write()
    assert raw.get("/fabric/x").value == "1" and fenced.get("/fabric/x").value == "1"  # reads still work
    assert raw.get("/fabric/y") is None and raw.revision() == before


def test_a_leader_whose_lease_expired_and_was_taken_over_writes_nothing(raw):
    rec = RecordingStore(raw)
    a = LeaseLock(raw, LOCK, holder="a", ttl=1)
    assert a.try_acquire()
    seed(raw, replicas=1)
    rec_endpoint = '{"name": "ep", "deployment": "qwen"}'
    raw.put(keyspace.endpoints("ep"), rec_endpoint)
    store, agents = FencedStore(rec, a), FakeAgents(lambda pool: Agent(pool.calls))
    fenced_agents = FencedAgents(agents, a)
    reconcile = ReconcileWorker(store, fenced_agents, rp.ReconcileSettings())
    routing = RoutingWorker(store, fenced_agents, vip_pool.parse_pool("10.96.0.0/30"))

    async def run():
        # While leading, the same handles write: the fence is not what stops writes below.
        await reconcile.tick()
        assert [k for _, k in rec.since(0) if k.startswith(keyspace.replicas())]
        assert [k for _, k in rec.since(0) if k.startswith(keyspace.gpu_reservations())]
        assert ("bind", "0000:10:00.0") in agents.calls

        # The lease expires (no refresh for its TTL) and another process takes the lock.
        await asyncio.sleep(1.1)
        b = LeaseLock(raw, LOCK, holder="b", ttl=30)
        assert b.try_acquire()
        raw.put(keyspace.deployments("qwen"), deployment(2).model_dump_json())  # more work to do
        # An orphan reservation the sweep would otherwise release on the agent and delete.
        raw.put(keyspace.gpu_reservations("n1", "0000:11:00.0"), '{"replica_id": "gone-0-x"}')
        mark, calls = len(rec.writes), len(agents.calls)
        before = {kv.key: kv.value for kv in raw.list(f"{keyspace.ROOT}/") if not kv.key.startswith(keyspace.locks())}

        for tick in (reconcile.tick, routing.tick, lambda: sweep(store, reconcile)):
            with pytest.raises(LeaseLost):
                await tick()
        assert rec.since(mark) == []
        assert agents.calls[calls:] == []
        after = {kv.key: kv.value for kv in raw.list(f"{keyspace.ROOT}/") if not kv.key.startswith(keyspace.locks())}
        assert after == before
        assert vip_pool.allocations(raw) == {}  # no VIP taken by the stale leader
        assert not a.keep_alive() and not lead(a)  # and it cannot take the lock back from b
        await reconcile.aclose()
        await routing.aclose()

    asyncio.run(run())


def test_a_revoked_lease_is_noticed_at_the_next_refresh(raw):
    """Taken over before the local clock says so (lease revoked in the store): the keeper's next
    refresh (every TTL/3) finds it, and from then on nothing is written."""
    a = LeaseLock(raw, LOCK, holder="a", ttl=30)
    assert lead(a)
    raw.revoke_lease(a.lease_id)
    b = LeaseLock(raw, LOCK, holder="b", ttl=30)
    assert b.try_acquire()
    assert a.held()  # the local clock alone cannot know yet
    assert not lead(a)
    with pytest.raises(LeaseLost):
        FencedStore(raw, a).put(keyspace.replicas("qwen", "x"), "{}")
    assert raw.get(keyspace.replicas("qwen", "x")) is None


def test_the_controller_loop_stops_writing_mid_pass_when_its_lease_is_taken_over(raw, tmp_path):
    rec = RecordingStore(raw)
    seed(raw, replicas=1)
    release, started = threading.Event(), threading.Event()
    agents = FakeAgents(lambda pool: Agent(pool.calls, block_create=release, started=started))
    state = AppState(store=rec, state_dir=tmp_path, settings=FabricdSettings(run_controllers=False),
                     registry=CollectorRegistry())
    handle = ControllerHandle(state, ControllerSettings(reconcile_s=0.2, routing_s=0.2, leader_ttl_s=1),
                              agents=agents).start()
    try:
        # The first pass creates a replica and waits on the agent's create_vm.
        assert started.wait(10), "the leader never called create_vm"
        replica_keys = [kv.key for kv in raw.list(keyspace.replicas())]
        assert len(replica_keys) == 1
        # Meanwhile another process takes over (the lease is revoked under the holder).
        b = LeaseLock(raw, LOCK, holder="b", ttl=30)
        def took_over() -> bool:
            lease = handle.lock.lease_id
            if lease is not None:
                raw.revoke_lease(lease)
            return b.try_acquire()

        wait_for(took_over, 1, "b to take the lock", interval=0.05)
        assert b.held()
        wait_for(lambda: not handle.lock.held(), 3.0, "the keeper to notice the takeover", interval=0.02)
        mark, calls = len(rec.writes), len(agents.calls)
        raw.put(keyspace.deployments("qwen"), deployment(2).model_dump_json())
        release.set()  # create_vm returns; the pass would now record host/port and go on
        time.sleep(1.5)
        assert rec.since(mark) == []
        assert agents.calls[calls:] == []
        stored = [kv for kv in raw.list(keyspace.replicas())]
        assert [kv.key for kv in stored] == replica_keys and '"host":null' in stored[0].value.replace(" ", "")
        lost = state.registry.get_sample_value("fabric_controller_ticks_total",
                                               {"controller": "reconcile", "outcome": "lease_lost"})
        assert lost == 1
        assert state.registry.get_sample_value("fabric_controller_leader") == 0

        # Once b lets go, the process leads again and its writes resume (the recorder sees them).
        b.release()
        wait_for(lambda: len(raw.list(keyspace.replicas())) == 2, 10, "the new leader to scale to 2", interval=0.02)
        assert rec.since(mark)
    finally:
        release.set()
        handle.stop()


def test_a_pass_that_holds_the_event_loop_past_the_ttl_keeps_the_lease(raw):
    """The lease is refreshed on the keeper's own thread: a pass that does not yield for three
    TTLs (a long synchronous stretch) neither loses the lock nor lets another process take it."""
    lock = LeaseLock(raw, LOCK, holder="a", ttl=1)
    changes: list[bool] = []
    keeper = LeaseKeeper(lock, 0.2, lambda leading, _: changes.append(leading)).start()
    try:
        wait_for(lock.held, 2.0, "the keeper to take the lock", interval=0.02)
        fence = lock.fence

        async def long_pass() -> bool:
            time.sleep(3.0)  # holds the loop: no task, no await, for three TTLs
            return lock.held()

        assert asyncio.run(long_pass())
        assert lock.fence == fence and changes == [True]  # never lost, never retaken
        assert not LeaseLock(raw, LOCK, holder="b", ttl=1).try_acquire()
    finally:
        keeper.stop()
        lock.release()


def test_a_wedged_loop_lets_the_lock_go_and_takes_it_again_when_it_comes_round(raw):
    """The keeper runs on its own thread, so a loop that never comes round again (an await that
    never ends) must not keep the leadership: once it has not beaten for stall_after_s the lock
    goes and another process takes it; after the loop's next beat the keeper leads again."""
    lock = LeaseLock(raw, LOCK, holder="a", ttl=1)
    changes: list[bool] = []
    keeper = LeaseKeeper(lock, 0.05, lambda leading, _: changes.append(leading), stall_after_s=0.5).start()
    other = LeaseLock(raw, LOCK, holder="b", ttl=1)
    try:
        wait_for(lock.held, 2.0, "the keeper to take the lock", interval=0.02)
        # no beat: the loop is wedged
        wait_for(lambda: not lock.held(), 5.0, "the keeper to let the lock go", interval=0.02)
        assert raw.get(keyspace.locks(LOCK)) is None  # released, not left to expire
        assert other.try_acquire()
        other.release()
        keeper.beat()
        wait_for(lock.held, 2.0, "the keeper to take the lock again after a beat", interval=0.02)
        assert changes[:3] == [True, False, True]
    finally:
        keeper.stop()
        lock.release()


def test_an_unexpected_error_in_a_refresh_does_not_end_the_keeper(raw, monkeypatch):
    """A bug in one refresh is logged; the thread goes on, so the process can still lead."""
    lock = LeaseLock(raw, LOCK, holder="a", ttl=1)
    calls = {"n": 0}
    real = LeaseLock.try_acquire

    def flaky(self):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("boom")
        return real(self)

    monkeypatch.setattr(LeaseLock, "try_acquire", flaky)
    keeper = LeaseKeeper(lock, 0.05, lambda leading, _: None).start()
    try:
        wait_for(lock.held, 3.0, "the keeper to take the lock after a failed try", interval=0.02)
        assert calls["n"] >= 2
    finally:
        keeper.stop()
        lock.release()
