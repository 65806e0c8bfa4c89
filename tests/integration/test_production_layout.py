"""The layout docs/install.md prescribes, in make test: three fabricd on a three-member etcd.

One rig for the module (lab.rigs.chaos_rig): a three-member etcd cluster with peer and client
TLS and auth on, three `fabricd serve` with controllers on (1 s periods, a 3 s leader lease),
each logged in as the etcd user fabricd, and one agent (dry-run driver, each replica a real
fabric-engine-sim process) that heartbeats to every fabricd in turn. The tests run in file order
on that rig, each leaving it whole (every member up, one leader):

1. the leader is SIGKILLed while it is placing a replica (the record is written, the replica is
   not Ready yet); another fabricd takes the lock with a newer fence once the lease ends, finishes
   the work, and nothing is placed twice: one record and one reservation per replica, each GPU
   held once, the VIP allocated once;
2. one etcd member, its leader, is SIGKILLed: fabricd goes on writing, and the controllers go on
   placing (a scale up becomes Ready) with nothing placed twice;
3. two members are SIGKILLed: a write is refused with a 503 naming the etcd cluster (not a 500,
   not a hang) and was not applied; once they are back the same write succeeds and one fabricd
   leads again.

The long runs (members killed under load with gateways admitting exactly a quota, the chaos
injections) stay in tests/integration/test_etcd_cluster_and_chaos.py (full) and scripts/chaos.
"""

from __future__ import annotations

import json
import time

import httpx
import pytest

from common import keyspace
from common.store.locks import lock_view
from controlplane.controllers import LEADER_NAME
from lab.rigs.chaos_rig import DEP, EP, start_rig
from lab.rigs.etcd_server import ETCD_BINARY, etcd_available
from lab.rigs.polling import scrape_gauge, wait_for

pytestmark = [pytest.mark.e2e,
              pytest.mark.skipif(not etcd_available(), reason=f"etcd binary not found at {ETCD_BINARY}")]

FABRICDS = ("a", "b", "c")


@pytest.fixture(scope="module")
def rig(tmp_path_factory):
    with start_rig(tmp_path_factory.mktemp("layout"), replicas=2, fabricds=FABRICDS, gateways=0) as rig:
        yield rig


def holder_pid(view) -> int | None:
    """The pid inside a controllers.leader_identity() holder (host:pid:suffix)."""
    return None if view.holder is None else int(view.holder.split(":")[-2])


def one_leader(rig):
    """(name, lock view) when exactly one live fabricd reports leading and the store's lock names
    that process; else None."""
    view = lock_view(rig.store, LEADER_NAME)
    live = [n for n, p in rig.fabricd.items() if p.poll() is None]
    leaders = [n for n in live if scrape_gauge(rig.url(n), "fabric_controller_leader") == 1]
    if len(leaders) == 1 and holder_pid(view) == rig.fabricd[leaders[0]].pid:
        return leaders[0], view
    return None


def placed(store) -> tuple[dict[str, dict], dict[str, str], dict[str, str]]:
    """(replica id -> record, "node/pci" -> reserving replica id, VIP -> endpoint), from etcd."""
    replicas: dict[str, dict] = {}
    for kv in store.list(keyspace.replicas()):
        rec = json.loads(kv.value)
        assert rec["replica_id"] not in replicas, f"replica id {rec['replica_id']} recorded twice"
        replicas[rec["replica_id"]] = rec
    prefix, vprefix = keyspace.gpu_reservations(), keyspace.vips()
    reservations = {kv.key[len(prefix):]: json.loads(kv.value)["replica_id"] for kv in store.list(prefix)}
    vips = {kv.key[len(vprefix):]: json.loads(kv.value)["endpoint"] for kv in store.list(vprefix)}
    return replicas, reservations, vips


def check_placed_once(store, n: int, vip: str) -> dict[str, dict]:
    """n replicas, each GPU held by exactly one of them and reserved for it, ordinals 0..n-1, one VIP."""
    replicas, reservations, vips = placed(store)
    assert len(replicas) == n, sorted(replicas)
    gpus = [f"{r['node']}/{g}" for r in replicas.values() for g in r["gpus"]]
    assert len(gpus) == n and len(set(gpus)) == n, gpus
    assert {f"{r['node']}/{g}": rid for rid, r in replicas.items() for g in r["gpus"]} == reservations
    assert sorted(r["ordinal"] for r in replicas.values()) == list(range(n))
    assert vips == {vip: EP}
    return replicas


def etcd_leader(etcd) -> int:
    """The index of the etcd member that leads (0 is one: not a falsy 'none yet')."""
    def found():
        i = etcd.leader()
        return None if i is None else [i]
    return wait_for(found, 20, "an etcd leader")[0]


def scale(api: httpx.Client, n: int) -> None:
    # an etcd election can answer one call 503 (retried: a scale is idempotent)
    r = wait_for(lambda: (x := api.post(f"/api/ai/deployments/{DEP}/scale", json={"replicas": n})).status_code != 503
                 and x, 30, f"the scale to {n} to be answered")
    assert r.status_code == 200, r.text


def test_the_leader_sigkilled_mid_placement_another_takes_over_and_places_nothing_twice(rig):
    store = rig.store
    leader, view = wait_for(lambda: one_leader(rig), 30, "exactly one fabricd leading, as the store's lock says")
    other = next(n for n in FABRICDS if n != leader)
    with rig.api(other) as api:
        vip = api.get(f"/api/ai/endpoints/{EP}").json()["status"]["vip"]
        before = check_placed_once(store, 2, vip)
        scale(api, 3)
        # the leader's next pass places the third replica: SIGKILL it once the record is written,
        # while the replica is still starting (its start and readiness are the leader's to follow)
        wait_for(lambda: len(store.list(keyspace.replicas(DEP))) == 3, 30, "the leader to place a third replica",
                 interval=0.05)
        assert len(rig.ready_replicas(api)) < 3
        rig.kill_fabricd(leader)
        killed = time.monotonic()

        def taken_over():
            found = one_leader(rig)
            return found if found and found[1].holder != view.holder else None
        new_leader, new_view = wait_for(taken_over, 30, "another fabricd to take the leader lock")
        print(f"takeover {time.monotonic() - killed:.1f} s after the SIGKILL (lease 3 s)")
        assert new_leader != leader and new_view.fence > view.fence
        wait_for(lambda: len(rig.ready_replicas(api)) == 3, 90, "3 ready replicas under the new leader")
        after = check_placed_once(store, 3, vip)
        # the replicas placed before kept their GPUs; the new one took a GPU nobody held
        assert {rid: r["gpus"] for rid, r in after.items() if rid in before} == {
            rid: r["gpus"] for rid, r in before.items()}
    rig.start_fabricd(leader)  # back as a follower: the lock stays where it is
    assert wait_for(lambda: one_leader(rig), 30, "one leader with three fabricd up")[0] == new_leader


def test_one_etcd_member_killed_the_cluster_goes_on(rig):
    etcd, store = rig.etcd, rig.store
    victim = etcd_leader(etcd)
    etcd.kill(victim)
    try:
        with rig.api() as api:
            vip = api.get(f"/api/ai/endpoints/{EP}").json()["status"]["vip"]
            body = {"name": "one-member-down", "gpu": {"count": 1, "vram_gib": 24}, "cpu": 1, "memory_gib": 1}
            r = wait_for(lambda: (x := api.post("/api/ai/profiles", json=body)).status_code != 503 and x, 30,
                         "a write with two members up")
            assert r.status_code == 201, r.text
            scale(api, 4)
            wait_for(lambda: len(rig.ready_replicas(api)) == 4, 90, "4 ready replicas with a member down")
            check_placed_once(store, 4, vip)
            wait_for(lambda: one_leader(rig), 30, "one fabricd leading with a member down")
    finally:
        etcd.restart(victim)
    assert etcd.wait_healthy(30), etcd.log_tail(victim)


def test_quorum_lost_writes_are_refused_with_a_503_naming_the_store_and_recover(rig):
    etcd = rig.etcd
    leader = etcd_leader(etcd)
    down = [i for i in range(3) if i != leader][:1] + [leader]
    body = {"name": "no-quorum", "gpu": {"count": 1, "vram_gib": 24}, "cpu": 1, "memory_gib": 1}
    with rig.api() as api:
        api.timeout = httpx.Timeout(60)
        for i in down:
            etcd.kill(i)
        try:
            r = api.post("/api/ai/profiles", json=body)
            assert r.status_code == 503, r.text
            err = r.json()["error"]
            assert "etcd" in err["message"] and "cluster of 3 endpoints" in err["message"], err
        finally:
            for i in down:
                etcd.restart(i)
        assert etcd.wait_healthy(30)
        # the refused write was not applied, and the same write succeeds now
        r = wait_for(lambda: (x := api.post("/api/ai/profiles", json=body)).status_code != 503 and x, 30,
                     "a write once the quorum is back")
        assert r.status_code == 201, r.text
        wait_for(lambda: one_leader(rig), 30, "one fabricd leading again")
        vip = api.get(f"/api/ai/endpoints/{EP}").json()["status"]["vip"]
        wait_for(lambda: len(rig.ready_replicas(api)) == 4, 60, "the 4 replicas ready again")
        check_placed_once(rig.store, 4, vip)
