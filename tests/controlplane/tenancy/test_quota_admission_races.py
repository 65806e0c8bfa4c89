"""Tenant GPU admission is exact under concurrency: many creates and scales of one tenant, sent at
once over real HTTP to two real fabricd processes sharing one store (SQLite file, or a real
etcd), never admit more GPUs than the tenant's max_gpus, and the use stays right after deletes.
(controlplane.tenancy.admission serialises the check and the write per tenant.)"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from lab.rigs.etcd_server import etcd_server  # noqa: F401  (a fixture, used by name)
from tests.controlplane.conftest import login, start_fabricd

MAX_GPUS = 4
CALLERS = 12


@pytest.fixture(params=["sqlite", "etcd"])
def two_fabricds(request, tmp_path):
    """Two fabricd processes on one store, each with an admin client."""
    etcd = None if request.param == "sqlite" else request.getfixturevalue("etcd_server")
    url = f"sqlite://{tmp_path}/shared.db" if etcd is None else etcd.url
    env = None if etcd is None else etcd.env("fabricd")  # TLS and fabricd's login
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with start_fabricd(tmp_path / "a", store=url, env=env) as a, start_fabricd(tmp_path / "b", store=url, env=env) as b:
        clients = [a.client(login(a)), b.client(login(b))]
        try:
            yield clients, request.param
        finally:
            for c in clients:
                c.close()


def at_once(calls):
    """Run every call on its own thread, released together; the responses in order."""
    gate = threading.Barrier(len(calls))

    def go(call):
        gate.wait()
        return call()

    with ThreadPoolExecutor(len(calls)) as pool:
        return list(pool.map(go, calls))


def used(api, tenant: str) -> int:
    return {r["tenant"]: r for r in api.get("/api/ai/quotas").json()}[tenant]["used_gpus"]


def held(api, tenant: str) -> int:
    """GPUs the tenant's deployment records hold (1 GPU a replica here), summed independently."""
    return sum(d["replicas"] for d in api.get("/api/ai/deployments").json() if d.get("tenant") == tenant)


def test_concurrent_creates_and_scales_never_exceed_the_quota(two_fabricds):
    (a, b), backend = two_fabricds
    tenant = f"t-{backend}"
    assert a.post("/api/ai/models", json={"name": "m", "source": "hf://Qwen/Qwen3-8B"}).status_code == 201
    assert a.post("/api/ai/profiles", json={"name": "p1", "runtime": "vllm", "cpu": 4, "memory_gib": 16,
                                            "gpu": {"count": 1, "vram_gib": 24}}).status_code == 201
    assert b.post("/api/ai/quotas", json={"tenant": tenant, "max_gpus": MAX_GPUS}).status_code == 200

    def create(i):
        api = (a, b)[i % 2]
        return lambda: api.post("/api/ai/deployments", json={"name": f"d{i}", "model": "m", "profile": "p1",
                                                             "replicas": 1, "tenant": tenant})

    # 12 creates of 1 GPU each against a quota of 4: exactly 4 admitted, the rest a clean 409.
    answers = at_once([create(i) for i in range(CALLERS)])
    codes = sorted(r.status_code for r in answers)
    assert codes == [201] * MAX_GPUS + [409] * (CALLERS - MAX_GPUS), [r.text for r in answers]
    assert all(r.json()["error"]["code"] == "quota_exceeded" for r in answers if r.status_code == 409)
    admitted = [r.json()["name"] for r in answers if r.status_code == 201]
    assert held(a, tenant) == used(b, tenant) == MAX_GPUS

    # Free 2 GPUs, then race scale-ups (+2 each) of the two that remain with 1-GPU creates: the
    # room (2) goes to one scale or to two creates, never more.
    for name in admitted[:2]:
        assert a.delete(f"/api/ai/deployments/{name}").status_code == 200
    assert used(a, tenant) == MAX_GPUS - 2
    scales = [lambda n=n, api=api: api.post(f"/api/ai/deployments/{n}/scale", json={"replicas": 3})
              for n, api in zip(admitted[2:], (a, b))]
    creates = [create(i) for i in range(CALLERS, CALLERS + 4)]
    answers = at_once(scales + creates)
    assert {r.status_code for r in answers} <= {200, 201, 409}, [r.text for r in answers]
    gained = sum(2 for r in answers[:2] if r.status_code == 200) + sum(1 for r in answers[2:] if r.status_code == 201)
    assert gained == 2  # what was free is taken, and no more
    assert held(b, tenant) == used(a, tenant) == MAX_GPUS

    # Deleting gives the room back: use follows, and a new create fits again.
    for d in a.get("/api/ai/deployments").json():
        assert b.delete(f"/api/ai/deployments/{d['name']}").status_code == 200
    assert used(a, tenant) == 0
    again = a.post("/api/ai/deployments", json={"name": "after", "model": "m", "profile": "p1",
                                               "replicas": MAX_GPUS, "tenant": tenant})
    assert again.status_code == 201, again.text
    assert used(b, tenant) == MAX_GPUS
