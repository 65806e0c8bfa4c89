"""The band bounds hold across gateways: two real gateway processes on one store, an endpoint whose
replica is saturated (its observation in the store), FABRIC_BAND_TOTAL=4. Each gateway holds its
share (2): the calls waiting at both never exceed 4, a higher band displaces within its gateway,
and when one gateway dies (SIGKILL) the other may hold the whole bound once its lease expires."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from common import keyspace
from common.schemas import ReplicaObservation
from lab.rigs.polling import wait_for
from tests.gateway.gateway_harness import GatewayProcess, make_key, publish_endpoint, sim_engine, sqlite_state

CHAT = {"model": "sim-m", "max_tokens": 2, "messages": [{"role": "user", "content": "hello"}]}
ENV = {"FABRIC_SATURATION_QUEUE": "2", "FABRIC_GATEWAY_CACHE_SECS": "0.1", "FABRIC_BAND_QUEUE": "4",
       "FABRIC_BAND_TOTAL": "4", "FABRIC_BAND_TTL_SECS": "20", "FABRIC_GATEWAY_SLOT_LEASE_SECS": "2"}


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    state, url, store = sqlite_state(tmp_path_factory, "bands-shared")
    engine = sim_engine("--replica-id", "shared-0")
    publish_endpoint(store, "shared", [engine], deployment="shared")
    gws = []
    try:
        gws = [GatewayProcess.start(state, url, env=ENV, gateway_id=f"gw-{n}") for n in "ab"]
        yield store, gws
    finally:
        for gw in gws:
            gw.stop()
        engine.stop()
        store.close()


def saturate(store, queue: float) -> None:
    obs = ReplicaObservation(replica_id="shared-0", scraped_at=time.time(), ok=True, queue_depth=queue)
    store.put(keyspace.observations("shared-0"), obs.model_dump_json())
    time.sleep(0.3)  # past the gateways' view cache


def waiting(gw) -> dict[str, float]:
    out = {}
    for line in httpx.get(gw.url + "/metrics").text.splitlines():
        if line.startswith('fabric_gateway_waiting{') and 'endpoint="shared"' in line:
            band = line.split('band="', 1)[1].split('"', 1)[0]
            out[band] = float(line.rsplit(" ", 1)[1])
    return out


def until(what: str, check) -> None:
    wait_for(check, 20, what, interval=0.05)


def test_two_gateways_share_the_total_and_displace_within_themselves(stack):
    store, (a, b) = stack
    _, key = make_key(store, "shared", priority="high")  # the key's priority caps the header's band
    saturate(store, 5)
    results: dict[str, httpx.Response] = {}
    threads = []

    def send(gw, name: str, band: str) -> None:
        def run():
            try:
                results[name] = httpx.post(gw.openai_base("shared") + "/chat/completions", json=CHAT, timeout=30,
                                           headers={"authorization": f"Bearer {key}", "x-request-priority": band})
            except httpx.HTTPError as exc:  # the calls waiting at a gateway that is killed
                results[name] = exc
        t = threading.Thread(target=run)
        t.start()
        threads.append(t)

    for gw, tag in ((a, "a"), (b, "b")):
        for i in range(2):
            send(gw, f"{tag}-low-{i}", "low")
            until(f"{tag} holding {i + 1}", lambda gw=gw, n=i + 1: waiting(gw).get("low") == n)
    full = httpx.post(a.openai_base("shared") + "/chat/completions", json=CHAT, timeout=30,
                      headers={"authorization": f"Bearer {key}", "x-request-priority": "low"})
    assert full.status_code == 503 and full.json()["error"]["code"] == "queue_full"
    assert "this gateway's share of 4" in full.json()["error"]["message"]
    send(b, "b-high", "high")  # b's share is full of low calls: its newest low one is displaced
    until("b-low-1 displaced", lambda: "b-low-1" in results)
    assert results["b-low-1"].status_code == 503 and results["b-low-1"].json()["error"]["code"] == "displaced"
    assert sum(waiting(a).values()) + sum(waiting(b).values()) == 4  # never more than the total

    b.proc.kill()  # b dies with its calls; its lease (2 s) expires, then a may hold the whole bound
    b.proc.wait()
    refused = httpx.post(a.openai_base("shared") + "/chat/completions", json=CHAT, timeout=30,
                         headers={"authorization": f"Bearer {key}", "x-request-priority": "low"})
    assert refused.status_code == 503  # not before the lease has expired
    time.sleep(3.5)  # the lease TTL, plus a's cached listing of live gateways (1 s)
    for i in range(2):
        send(a, f"a-more-{i}", "low")
    until("a holding 4", lambda: waiting(a).get("low") == 4)
    saturate(store, 0)  # room again: every waiting call at a goes
    for t in threads:
        t.join(20)
    assert all(results[n].status_code == 200 for n in ("a-low-0", "a-low-1", "a-more-0", "a-more-1"))
