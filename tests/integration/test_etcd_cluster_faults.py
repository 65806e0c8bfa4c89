"""fabricd, its agent and two gateways on a real three-member etcd cluster whose members are
SIGKILLed and restarted under load: a follower, then the leader, then two at once (no quorum).

Load while members die: a writer creating profiles through fabricd's API (a 503 is retried with the
same name; a 409 on a retry means the first try was applied), a reader, a scaler moving the
deployment between 2 and 4 replicas (GPU reservations under faults), and chat calls through two
gateways split over one key with a request quota. After the one-at-a-time faults: every
acknowledged write is there, no GPU reserved twice or for a replica that does not hold it, the
VIP allocated once, exactly ``quota`` calls admitted across both gateways, the audit chain
verifies, and reads answered 200 while a quorum was up. With two members down, a write is
answered 503 naming the etcd cluster (not a 500, not a hang), and succeeds again once they are
back.
"""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

from common import audit_chain, keyspace
from common.store.base import open_store
from tests.gateway.gateway_harness import HMAC_SECRET, GatewayProcess, make_key
from tests.integration.orchestration_harness import deploy, start_cluster
from tests.support.etcd_cluster import EtcdCluster
from tests.support.etcd_server import ETCD_BINARY, etcd_available
from tests.support.polling import wait_for

pytestmark = [pytest.mark.e2e,
              pytest.mark.skipif(not etcd_available(), reason=f"etcd binary not found at {ETCD_BINARY}")]

DEP, EP = "quorum", "quorum-ep"
# Loopback VIPs: nothing serves them here (no dataplane), so the gateway falls to the replicas at
# once; an off-host pool would route the VIP attempt out of this machine.
POOL = "127.0.100.1-127.0.100.4"
QUOTA = 30


@pytest.fixture(scope="module")
def rig(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("etcd3")
    with EtcdCluster(3) as etcd:
        env = {"FABRIC_ADDRESS_POOL": POOL, "FABRIC_LEADER_TTL_SECS": "3"}
        with start_cluster(tmp, gpus=6, env=env, fabricd_args=("--store", etcd.url)) as cluster:
            store = open_store(etcd.url)
            gws = []
            try:
                with cluster.api() as api:
                    deploy(api, DEP, EP, 2)
                    wait_for(lambda: len(ready(api)) == 2, 90, "2 ready replicas")
                    wait_for(lambda: api.get(f"/api/ai/endpoints/{EP}").json()["status"].get("vip"), 30, "the VIP")
                gws = [GatewayProcess.start(tmp, etcd.url, gateway_id=f"gw-{n}") for n in "ab"]
                yield etcd, cluster, store, gws
            except AssertionError as exc:
                raise AssertionError(f"{exc}\n{cluster.tail()}") from None
            finally:
                for gw in gws:
                    gw.stop()
                store.close()


def ready(api) -> list[dict]:
    return [r for r in api.get(f"/api/ai/deployments/{DEP}/metrics").json()["replicas"] if r["ready"]]


class Load:
    """Background writer, reader, scaler and gateway callers; each records what it saw."""

    def __init__(self, cluster, gws, key: str):
        self.cluster, self.gws, self.key = cluster, gws, key
        self.stop = threading.Event()
        self.acked: list[str] = []
        self.codes: dict[str, list[tuple[float, int]]] = {"write": [], "read": [], "scale": [], "chat": []}
        self.threads = [threading.Thread(target=f, daemon=True)
                        for f in (self.writer, self.reader, self.scaler, self.chat)]

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for t in self.threads:
            t.join(60)

    def _note(self, kind: str, code: int) -> None:
        self.codes[kind].append((time.monotonic(), code))

    def writer(self):
        with self.cluster.api() as api:
            i = 0
            while not self.stop.is_set():
                name, retried = f"w{i}", False
                while not self.stop.is_set():
                    body = {"name": name, "gpu": {"count": 1, "vram_gib": 24}, "cpu": 1, "memory_gib": 1}
                    code = _status(api.post, "/api/ai/profiles", json=body)
                    self._note("write", code)
                    if code == 201 or (code == 409 and retried):
                        self.acked.append(name)
                        break
                    retried = True
                    time.sleep(0.2)
                i += 1
                time.sleep(0.05)

    def reader(self):
        with self.cluster.api() as api:
            while not self.stop.is_set():
                self._note("read", _status(api.get, f"/api/ai/deployments/{DEP}"))
                time.sleep(0.1)

    def scaler(self):
        with self.cluster.api() as api:
            n = 2
            while not self.stop.is_set():
                n = 4 if n == 2 else 2
                self._note("scale", _status(api.post, f"/api/ai/deployments/{DEP}/scale",
                                                    json={"replicas": n}))
                self.stop.wait(3)

    def chat(self):
        body = {"model": DEP, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        with httpx.Client(timeout=30, headers={"authorization": f"Bearer {self.key}"}) as http:
            i = 0
            while not self.stop.is_set():
                url = self.gws[i % 2].openai_base(EP) + "/chat/completions"
                self._note("chat", _status(http.post, url, json=body))
                i += 1
                time.sleep(0.15)


def _status(method, *args, **kwargs) -> int:
    try:
        r = method(*args, **kwargs)
    except httpx.TimeoutException:
        return -1  # a hang: no answer within the client's timeout
    except httpx.TransportError:
        return -2
    if r.status_code not in (200, 201, 409, 429, 503):
        print(f"unexpected {r.status_code}: {r.text[:300]}")
    return r.status_code


def fault(etcd: EtcdCluster, victim: int, api) -> list[int]:
    """SIGKILL member VICTIM, wait for a leader among the rest, read through fabricd, restart it."""
    etcd.kill(victim)
    wait_for(lambda: etcd.leader() is not None, 20, "a leader among the two live members")
    time.sleep(1.0)  # the load runs against a two-member cluster for a while
    reads = [api.get(f"/api/ai/deployments/{DEP}").status_code for _ in range(5)]
    etcd.restart(victim)
    assert etcd.wait_healthy(30), etcd.log_tail(victim)
    time.sleep(1.0)
    return reads


def test_member_faults_under_load_lose_nothing_and_admit_exactly(rig):
    etcd, cluster, store, gws = rig
    _, key = make_key(store, EP, request_quota=QUOTA)
    assert HMAC_SECRET  # the gateways verify the key with the harness's secret (BASE_ENV)
    vip = None
    with cluster.api() as api:
        vip = api.get(f"/api/ai/endpoints/{EP}").json()["status"]["vip"]
        with Load(cluster, gws, key) as load:
            time.sleep(1.5)
            # a follower first, member 0 when it is one: the store's first endpoint dies either here
            # or as the leader next, so fabricd and the gateways must fail over to another member
            leader = etcd.leader()
            follower = 0 if leader != 0 else 1
            reads_follower = fault(etcd, follower, api)
            leader = etcd.leader()
            reads_leader = fault(etcd, leader, api)
            wait_for(lambda: len([c for _, c in load.codes["chat"] if c in (200, 429)]) > QUOTA + 5, 60,
                     "the chat load to use up the quota")
        # reads while a quorum exists: the probes taken after a new leader was known
        assert reads_follower == [200] * 5 and reads_leader == [200] * 5, (reads_follower, reads_leader)
        codes = {k: [c for _, c in v] for k, v in load.codes.items()}
        for kind, seen in codes.items():
            bad = [c for c in seen if c not in (200, 201, 202, 409, 429, 503)]
            assert not bad, f"{kind}: {bad} (a 5xx other than 503, or a hang)"
        assert codes["write"].count(201) > 10 and codes["read"].count(200) > 20

        # no lost write: every acknowledged profile is there
        names = {p["name"] for p in api.get("/api/ai/profiles", params={"limit": 1000}).json()}
        missing = [n for n in load.acked if n not in names]
        assert not missing, f"acknowledged but lost: {missing}"

        # settle on 3 replicas; no GPU reserved twice, each reservation held by its replica
        assert api.post(f"/api/ai/deployments/{DEP}/scale", json={"replicas": 3}).status_code == 200
        wait_for(lambda: len(ready(api)) == 3 and len(store.list(keyspace.replicas(DEP))) == 3, 90,
                 "3 ready replicas")
        check_allocations(store, vip)

        # no over-admission: exactly QUOTA calls admitted over both gateways, the rest 429
        assert codes["chat"].count(200) == QUOTA, codes["chat"]
        wait_for(lambda: audit_chain.verify(store).ok, 20, "the audit chain to verify")


def check_allocations(store, vip: str) -> None:
    replicas = {}
    for kv in store.list(keyspace.replicas()):
        rec = json.loads(kv.value)
        assert rec["replica_id"] not in replicas, f"replica {rec['replica_id']} recorded twice"
        replicas[rec["replica_id"]] = rec
    held = {f"{r['node']}/{g}": rid for rid, r in replicas.items() for g in r["gpus"]}
    assert sum(len(r["gpus"]) for r in replicas.values()) == len(held), "a GPU held by two replicas"
    prefix = keyspace.gpu_reservations()
    reserved = {kv.key[len(prefix):]: json.loads(kv.value)["replica_id"] for kv in store.list(prefix)}
    assert reserved == held, (reserved, held)
    vprefix = keyspace.vips()
    vips = {kv.key[len(vprefix):]: json.loads(kv.value)["endpoint"] for kv in store.list(vprefix)}
    assert vips == {vip: EP}


def test_without_quorum_writes_are_refused_with_a_503_naming_the_store(rig):
    etcd, cluster, _, _ = rig
    leader = etcd.leader()
    down = [i for i in range(3) if i != leader][:1] + [leader]
    body = {"name": "no-quorum", "gpu": {"count": 1, "vram_gib": 24}, "cpu": 1, "memory_gib": 1}
    with cluster.api() as api:
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
