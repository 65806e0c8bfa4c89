"""Two control-plane processes on one real etcd allocate VIPs and GPUs at the same time and never
hold the same one. Each OS process runs fabricd's own allocation code (vip_pool.allocate and the
scheduler + reconcile.apply.reserve_gpus path the reconciler uses), released by a shared start
time so the races are real."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from common import keyspace
from common.schemas import GpuInfo, Node

WORKER = r"""
import json, os, sys, time
from common.store import etcd_access
from common.store.connect import open_store
from common.errors import Conflict
from controlplane.placement import vip_pool
from controlplane.orchestration_state import load_snapshot
from controlplane.reconcile.apply import reserve_gpus
from controlplane.placement.index import place
from common.schemas import GpuRequest, InferenceDeployment, InferenceProfile, ModelArtifact

url, me, start = sys.argv[1], sys.argv[2], float(sys.argv[3])
store = open_store(url, access=etcd_access.from_env(os.environ))  # TLS and fabricd's login
pool = vip_pool.parse_pool("10.96.0.0/28")
dep = InferenceDeployment(name=f"dep-{me}", model="m", profile="p", replicas=20)
profile = InferenceProfile(name="p", gpu=GpuRequest(count=1, vram_gib=24), cpu=1, memory_gib=1)
model = ModelArtifact(name="m", source="hf://org/m")
while time.time() < start:
    time.sleep(0.005)
vips, gpus = [], []
for i in range(10):
    try:
        vips.append(vip_pool.allocate(store, f"ep-{me}-{i}", pool))
    except Conflict:
        pass
    for attempt in range(5):  # a lost race re-plans from a fresh snapshot, as the reconciler does
        snap = load_snapshot(store)
        plan = place(dep, profile, model, list(snap.nodes.values()), snap.reserved_by_node(), time.time())
        if plan.node is None:
            break
        if reserve_gpus(store, plan.node, plan.gpus, f"dep-{me}-{i}-{attempt}", dep.name, time.time()):
            gpus.extend(f"{plan.node}/{g}" for g in plan.gpus)
            break
print(json.dumps({"vips": vips, "gpus": gpus}))
"""


def node(nid: str) -> Node:
    gpus = [GpuInfo(index=i, uuid=f"{nid}-{i}", name="NVIDIA H100", pci=f"0000:{0x20 + i:02x}:00.0",
                    memory_total_mib=81920) for i in range(8)]
    return Node(id=nid, address=f"https://{nid}:9443", gpus=gpus, cpu_free=64, memory_free_gib=512,
                last_heartbeat=time.time() + 600)


def test_two_processes_never_double_allocate(etcd_server):
    store = etcd_server.open("fabricd")
    store.delete_prefix(f"{keyspace.ROOT}/")
    for nid in ("n1", "n2"):
        store.put(keyspace.nodes(nid), node(nid).model_dump_json())
    start = time.time() + 3.0
    env = {**os.environ, **etcd_server.env("fabricd")}
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, etcd_server.url, me, str(start)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for me in ("a", "b")]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err[-2000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    a, b = results
    # The /28 has 14 usable addresses for 20 requests: all taken, none twice.
    assert not set(a["vips"]) & set(b["vips"])
    assert len(a["vips"]) + len(b["vips"]) == 14
    owners = {kv.key.rsplit("/", 1)[1]: json.loads(kv.value)["endpoint"] for kv in store.list(keyspace.vips())}
    assert sorted(owners) == sorted(a["vips"] + b["vips"])
    # 16 GPUs for 20 one-GPU replicas: all reserved, each by exactly one process.
    assert not set(a["gpus"]) & set(b["gpus"])
    assert len(a["gpus"]) + len(b["gpus"]) == 16
    assert len(store.list(keyspace.gpu_reservations())) == 16
    store.delete_prefix(f"{keyspace.ROOT}/")
    store.close()
