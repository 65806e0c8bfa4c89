"""Crash loops park, with a real fabricd (controllers on) and a dry-run fabric-agent whose replicas
are real fabric-engine-sim processes: an engine that dies each time it starts is a Failed replica
(event ReplicaFailed, the engine's exit in the reason), counted across replacements with backoff;
after FABRIC_CRASHLOOP_AFTER failures the deployment parks in CrashLoop (no new replica, its GPU
given back), the gateway-facing state names it, and `deployment restart` unparks it. A drain
asked for one replica ends when its stream ends, not at the grace."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import pytest

from lab.rigs.polling import wait_for
from tests.integration.orchestration_harness import deploy, start_cluster

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
from lifecycle_bench import ENV, engine_killer, measure_drain  # noqa: E402  (scripts/lifecycle_bench.py)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("crashloop")
    with start_cluster(tmp, gpus=4, env=ENV) as c:
        c.tmp = tmp
        yield c


def test_an_engine_that_keeps_dying_parks_the_deployment_and_restart_unparks_it(cluster):
    with cluster.api() as api:
        deploy(api, "okdep", "okdep-ep", 1)  # model "okdep" and profile g1 for the crashing one too
        assert api.post("/api/ai/deployments", json={"name": "crashy", "model": "okdep", "profile": "g1",
                                                     "replicas": 1}).status_code == 201
        stop, killed = threading.Event(), []
        killer = threading.Thread(target=engine_killer, args=(cluster.tmp / "agent", "crashy", stop, killed),
                                  daemon=True)
        killer.start()
        try:
            dep = wait_for(lambda: (d := api.get("/api/ai/deployments/crashy").json())["status"]["phase"]
                           == "CrashLoop" and d, 90, "the deployment to park in CrashLoop")
        finally:
            stop.set()
            killer.join(5)
        status = dep["status"]
        assert status["failures"] == 3 and "engine exited" in status["last_failure"]
        assert "deployment restart crashy" in status["message"]
        time.sleep(2.5)  # a few reconcile passes: parked means nothing new is created
        assert api.get("/api/ai/replicas", params={"deployment": "crashy"}).json() == []
        gpus = api.get("/api/ai/gpus").json()
        held = [g for g in (gpus["gpus"] if isinstance(gpus, dict) else gpus) if g.get("allocated_to")]
        assert len(held) == 1, "only okdep's replica holds a GPU; the failed ones gave theirs back"
        events = api.get("/api/ai/events", params={"name": "crashy"}).json()
        events = events.get("events", events) if isinstance(events, dict) else events
        assert any(e["reason"] == "CrashLoop" for e in events), events
        failed_id = status["last_failure"].split(":", 1)[0]
        why = api.get(f"/api/ai/explain/failure/{failed_id}").json()
        assert "engine exited" in why["summary"], why
        assert 'fabric_deployment_crashloop{deployment="crashy"} 1.0' in api.get("/metrics").text

        r = api.post("/api/ai/deployments/crashy/restart")
        assert r.status_code == 200 and r.json()["previous_failures"] == 3
        wait_for(lambda: [x for x in api.get("/api/ai/deployments/crashy/metrics").json()["replicas"] if x["ready"]],
                 60, "a replica again after the restart")
        d = api.get("/api/ai/deployments/crashy").json()["status"]
        assert d["phase"] != "CrashLoop" and d["failures"] == 0
        assert 'fabric_deployment_crashloop{deployment="crashy"} 0.0' in api.get("/metrics").text


def test_a_drain_ends_when_the_stream_ends_not_at_the_grace(cluster):
    with cluster.api() as api:
        assert api.post("/api/ai/deployments/okdep/scale", json={"replicas": 2}).status_code in (200, 202)
        wait_for(lambda: len([r for r in api.get("/api/ai/deployments/okdep/metrics").json()["replicas"]
                              if r["ready"]]) == 2, 60, "2 ready replicas")
        out = measure_drain(api, "okdep")
        history = api.get(f"/api/ai/explain/failure/{out['drain_replica']}").json()["history"]
    assert out["drain_stream_whole"], out  # the stream on the drained replica finished whole
    deleted = [e["message"] for e in history if e["reason"] == "ReplicaDeleted"]
    # the grace is 60 s: the drain ended because the engine reported nothing running
    assert deleted and "drained: no requests running or waiting" in deleted[-1], history
