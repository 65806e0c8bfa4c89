"""Two fabricd processes on one real etcd: the leader dies, the other takes over and carries on.

Two real `fabricd serve --store etcd://...` processes (controllers on, 1 s periods, a 3 s leader
lease, copies of one state dir so they share the admin password and CA) and one real
fabric-agent with the dry-run driver (each replica a real fabric-engine-sim process) that
heartbeats to the second fabricd; both read the same store. Three replicas are deployed through
the first fabricd's API and an endpoint gets a VIP: exactly one process leads, and the store
holds exactly three replica records and three GPU reservations on distinct GPUs. The process
holding the leader lock is SIGKILLed; the survivor takes the lock (new holder, new fence), a
scale to 4 through the survivor's API adds a fourth Ready replica on a GPU nobody else holds, and
nothing is duplicated: reservations, replica ids, the VIP (same address, allocated once).
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
from pathlib import Path

import httpx
import pytest

from common import keyspace
from common.store.locks import lock_view
from controlplane.controllers import LEADER_NAME
from tests.integration.orchestration_harness import (
    BIN,
    _log,
    _stop,
    _wait_fabricd,
    agent_command,
    deploy,
    model_mirror,
    stop_engines,
)
from tests.support.etcd_server import ETCD_BINARY, EtcdServer, etcd_available
from tests.support.polling import clean_env, scrape_gauge, wait_for
from tests.support.servers import free_port

# full: make test keeps the lease and fencing (tests/controlplane/test_leader_fencing.py) and a restarted
# fabricd (tests/integration/test_fabricd_restart.py).
pytestmark = [pytest.mark.full, pytest.mark.e2e,
              pytest.mark.skipif(not etcd_available(), reason=f"etcd binary not found at {ETCD_BINARY}")]

DEP, EP = "ha", "ha-openai"
POOL = "10.96.0.40-10.96.0.43"


def holder_pid(view) -> int | None:
    """The pid inside a controllers.leader_identity() holder (host:pid:suffix)."""
    if view.holder is None:
        return None
    return int(view.holder.split(":")[-2])


def leader_gauge(url: str) -> float | None:
    return scrape_gauge(url, "fabric_controller_leader")


def ready(api) -> dict[str, dict]:
    return {r["replica_id"]: r for r in api.get(f"/api/ai/deployments/{DEP}/metrics").json()["replicas"]
            if r["ready"]}


def store_records(store) -> tuple[dict[str, dict], dict[str, str], dict[str, str]]:
    """(replica id -> record, "node/pci" -> reserving replica id, VIP -> endpoint) from etcd."""
    replicas = {}
    for kv in store.list(keyspace.replicas()):
        rec = json.loads(kv.value)
        assert rec["replica_id"] not in replicas, f"replica id {rec['replica_id']} recorded twice"
        replicas[rec["replica_id"]] = rec
    prefix = keyspace.gpu_reservations()
    reservations = {kv.key[len(prefix):]: json.loads(kv.value)["replica_id"]
                    for kv in store.list(prefix)}
    vprefix = keyspace.vips()
    vips = {kv.key[len(vprefix):]: json.loads(kv.value)["endpoint"] for kv in store.list(vprefix)}
    return replicas, reservations, vips


def check_no_duplicates(store, n: int) -> tuple[dict[str, dict], dict[str, str]]:
    replicas, reservations, _ = store_records(store)
    assert len(replicas) == n, sorted(replicas)
    assert len(reservations) == n, reservations
    # each replica's GPUs are exactly the ones reserved for it, and no GPU is in two records
    gpus = [f"{r['node']}/{g}" for r in replicas.values() for g in r["gpus"]]
    assert len(gpus) == n and len(set(gpus)) == n, gpus
    assert {f"{r['node']}/{g}": rid for rid, r in replicas.items() for g in r["gpus"]} == reservations
    assert sorted(r["ordinal"] for r in replicas.values()) == list(range(n))
    return replicas, reservations


def test_leader_killed_survivor_takes_over_and_scales(tmp_path):
    with EtcdServer() as etcd:
        store = etcd.open("fabricd")
        mirror = model_mirror(tmp_path)
        env = clean_env({"FABRIC_RECONCILE_SECS": "1", "FABRIC_ROUTING_SECS": "1", "FABRIC_LEADER_TTL_SECS": "3",
                         "FABRIC_ADDRESS_POOL": POOL, "HF_ENDPOINT": mirror.url, **etcd.env("fabricd")})
        # One `fabricd init`, copied: both processes share the admin password and the CA.
        state_a, state_b = tmp_path / "fabricd-a", tmp_path / "fabricd-b"
        subprocess.run([str(BIN / "fabricd"), "init", "--state-dir", str(state_a)], check=True,
                       capture_output=True, env=env)
        shutil.copytree(state_a, state_b)
        procs: dict[str, subprocess.Popen] = {}
        logs: list[Path] = []
        files: list = []
        urls: dict[str, str] = {}
        try:
            for name, state in (("a", state_a), ("b", state_b)):
                port = free_port()
                urls[name] = f"http://127.0.0.1:{port}"
                log = tmp_path / f"fabricd-{name}.log"
                logs.append(log)
                procs[name] = subprocess.Popen(
                    [str(BIN / "fabricd"), "serve", "--state-dir", str(state), "--listen", f"127.0.0.1:{port}",
                     "--store", etcd.url, "--insecure", "--log-level", "info"],
                    stdout=_log(log, files), stderr=subprocess.STDOUT, env=env)
            for name in ("a", "b"):
                _wait_fabricd(urls[name], procs[name], logs[["a", "b"].index(name)])
            ag_log = tmp_path / "agent.log"
            logs.append(ag_log)
            procs["agent"] = subprocess.Popen(
                agent_command() + [
                    "--node-id", "node-a", "--listen", f"127.0.0.1:{free_port()}", "--control-plane", urls["b"],
                    "--insecure", "--vm-driver", "dry-run", "--fake-gpus", "6", "--no-dataplane",
                    "--heartbeat-secs", "1", "--cpus", "64", "--memory-gib", "256",
                    "--state-dir", str(tmp_path / "agent"), "--sysfs-root", str(tmp_path / "agent" / "sysfs"),
                    "--log-level", "warning"],
                stdout=_log(ag_log, files), stderr=subprocess.STDOUT, env=env)
            try:
                run(store, procs, urls, state_a)
            except AssertionError as exc:
                tail = "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in logs if p.exists())
                raise AssertionError(f"{exc}\n{tail}") from None
        finally:
            for proc in reversed(list(procs.values())):
                _stop(proc)
            stop_engines(tmp_path / "agent")
            for f in files:
                f.close()
            store.close()
            mirror.stop()


def login(url: str, password: str) -> httpx.Client:
    with httpx.Client(base_url=url, timeout=10) as c:
        token = c.post("/api/auth/login", json={"username": "admin", "password": password}).json()["token"]
    return httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=15)


def run(store, procs, urls, state_dir: Path) -> None:
    password = (state_dir / "admin-password").read_text().strip()
    with login(urls["a"], password) as api_a:
        def registered():
            if procs["agent"].poll() is not None:
                raise AssertionError("the agent exited")
            return api_a.get("/api/ai/nodes/node-a").status_code == 200
        wait_for(registered, 30, "node-a to register (via fabricd b, seen through a)")

        deploy(api_a, DEP, EP, 3)

        # 1. Three Ready replicas; one leader; three records and reservations on distinct GPUs.
        wait_for(lambda: len(ready(api_a)) == 3, 90, "3 ready replicas")
        vip = wait_for(lambda: api_a.get(f"/api/ai/endpoints/{EP}").json()["status"].get("vip"), 30, "the VIP")
        before = ready(api_a)

    pids = {name: procs[name].pid for name in ("a", "b")}

    def one_leader():
        view = lock_view(store, LEADER_NAME)
        gauges = {name: leader_gauge(urls[name]) for name in ("a", "b")}
        leaders = [name for name, g in gauges.items() if g == 1]
        if len(leaders) == 1 and holder_pid(view) == pids[leaders[0]]:
            return leaders[0], view
        return None
    leader, view = wait_for(one_leader, 30, "exactly one fabricd to report holding the lock the store names")
    survivor = "b" if leader == "a" else "a"
    replicas, reservations = check_no_duplicates(store, 3)
    assert set(replicas) == set(before) == set(reservations.values())
    gpus_before = {rid: r["gpus"] for rid, r in replicas.items()}
    _, _, vips = store_records(store)
    assert vips == {vip: EP}

    # 2. SIGKILL the lock holder: no clean release, its lease is left to expire.
    procs[leader].send_signal(signal.SIGKILL)
    procs[leader].wait(15)

    def taken_over():
        v = lock_view(store, LEADER_NAME)
        return (v.holder is not None and v.holder != view.holder and v.fence != view.fence
                and holder_pid(v) == pids[survivor] and leader_gauge(urls[survivor]) == 1 and v)
    new_view = wait_for(taken_over, 30, f"fabricd {survivor} to take the lock")
    assert new_view.fence > view.fence

    # 3. Scale to 4 through the survivor; the new replica gets a GPU nobody else holds.
    with login(urls[survivor], password) as api:
        r = api.post(f"/api/ai/deployments/{DEP}/scale", json={"replicas": 4})
        assert r.status_code == 200, r.text
        wait_for(lambda: len(ready(api)) == 4, 90, "4 ready replicas")
        after = ready(api)
        assert set(before) < set(after)
        [new_id] = [rid for rid in after if rid not in before]
        replicas, reservations = check_no_duplicates(store, 4)
        assert set(replicas) == set(after) == set(reservations.values())
        assert replicas[new_id]["ordinal"] == 3
        new_gpus = {f"{replicas[new_id]['node']}/{g}" for g in replicas[new_id]["gpus"]}
        old_gpus = {f"{r['node']}/{g}" for rid, r in replicas.items() if rid != new_id for g in r["gpus"]}
        assert new_gpus and not new_gpus & old_gpus
        # the survivor kept the old replicas as they were (same GPUs), and the VIP as it was
        assert {rid: r["gpus"] for rid, r in replicas.items() if rid != new_id} == gpus_before
        assert api.get(f"/api/ai/endpoints/{EP}").json()["status"]["vip"] == vip
        _, _, vips = store_records(store)
        assert vips == {vip: EP}
        assert [v["vip"] for v in api.get("/api/ai/capacity").json()["vips"]] == [vip]
        assert lock_view(store, LEADER_NAME) == new_view  # still the survivor, no flapping
