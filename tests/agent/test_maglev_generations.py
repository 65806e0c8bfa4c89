"""Maglev services in plan-generation order (agent.service_generations, agent/api/maglev.py): an
older generation is refused 409 and writes nothing, whichever thread gets there last; the batch
PUT applies the others; the heartbeat reports what the dataplane holds; the held generations
survive an agent restart (the state directory's file). The real agent app served over plain HTTP
on loopback, the dataplane in memory (the BPF one: tests/dataplane/test_dataplane_pins.py)."""

from __future__ import annotations

import threading

import httpx
import pytest

from agent.api import create_app
from agent.heartbeat import HostResources, build_report
from agent.service_generations import GENERATIONS_FILE, ServiceGenerations, StaleGeneration
from agent.state import AgentState
from agent.vm.dryrun_driver import DryRunDriver
from common.agent_api import MaglevServiceSpec
from lab.rigs.memory_dataplane import MemoryDataplane
from lab.rigs.servers import serve_in_thread

PATH = "/v1/maglev/services/10.200.0.10/8000/tcp"
KEY = "10.200.0.10:8000/tcp"


class NoGpus:
    def read(self):
        return type("Inv", (), {"gpus": [], "message": "no GPUs here"})()


@pytest.fixture
def agent(tmp_path):
    state = AgentState(node_id="n1", vm_driver=DryRunDriver(tmp_path / "dry-run"), inventory=NoGpus(),
                       dataplane=MemoryDataplane())
    with serve_in_thread(create_app(state)) as port, httpx.Client(base_url=f"http://127.0.0.1:{port}",
                                                                 timeout=10) as client:
        yield state, client


def spec(generation: int, weight: int) -> dict:
    return {"generation": generation, "backends": {"10.0.0.1:8000": weight, "10.0.0.2:8000": 1}}


def test_an_older_generation_is_refused_409_and_writes_nothing(agent):
    state, client = agent
    assert client.put(PATH, json=spec(5, 20)).json()["generation"] == 5
    late = client.put(PATH, json=spec(4, 3))  # a push from an earlier pass, arriving last
    assert late.status_code == 409
    error = late.json()["error"]
    assert error["code"] == "stale_generation"
    assert "generation 4 is older than the generation 5" in error["message"]
    got = client.get(PATH).json()
    assert got["backends"]["10.0.0.1:8000"] == 20 and got["generation"] == 5
    assert client.put(PATH, json=spec(5, 20)).status_code == 200  # the same generation again: fine
    assert client.put(PATH, json=spec(6, 7)).json()["backends"]["10.0.0.1:8000"] == 7


def test_a_batch_applies_each_service_and_refuses_the_stale_one(agent):
    state, client = agent
    client.put(PATH, json=spec(5, 20))
    batch = {"services": [{"vip": "10.200.0.10", "port": 8000, "proto": "tcp", **spec(4, 3)},
                          {"vip": "10.200.0.11", "port": 8000, "proto": "tcp", **spec(2, 9)},
                          {"vip": "10.200.0.12", "port": 8000, "proto": "tcp", "generation": 2,
                           "backends": {"10.0.0.1:8000": 1}, "draining": ["10.0.0.9:8000"]}]}
    resp = client.put("/v1/maglev/services", json=batch)
    assert resp.status_code == 200
    results = {r["key"]: r for r in resp.json()["results"]}
    assert results[KEY]["outcome"] == "stale" and results[KEY]["held"] == 5
    assert results[KEY]["code"] == "stale_generation"
    assert results["10.200.0.11:8000/tcp"]["outcome"] == "applied"
    assert results["10.200.0.12:8000/tcp"]["outcome"] == "failed"  # draining names no backend of the set
    assert "draining names backends not in the set" in results["10.200.0.12:8000/tcp"]["message"]
    assert client.get(PATH).json()["backends"]["10.0.0.1:8000"] == 20
    assert client.get("/v1/maglev/services/10.200.0.11/8000/tcp").json()["generation"] == 2
    bad = client.put("/v1/maglev/services", json={"services": [{"vip": "nope", "port": 80, "backends": {}}]})
    assert bad.status_code == 422 and "vip" in bad.text


def test_delete_forgets_the_generation_and_the_heartbeat_reports_what_the_maps_hold(agent):
    state, client = agent
    client.put(PATH, json=spec(9, 20))
    client.put("/v1/maglev/services/10.200.0.11/8000/tcp", json=spec(3, 1))
    report = build_report(state, "http://127.0.0.1:1", [], "", HostResources(cpu_free=1, memory_free_gib=1), [])
    assert report.service_generations == {KEY: 9, "10.200.0.11:8000/tcp": 3}
    state.dataplane.delete_service("10.200.0.11", 8000, "tcp")  # behind the API's back (fail-closed, the CLI)
    report = build_report(state, "http://127.0.0.1:1", [], "", HostResources(cpu_free=1, memory_free_gib=1), [])
    assert report.service_generations == {KEY: 9}  # fabricd sends the lost one again
    assert client.delete(PATH).status_code == 204
    assert client.put(PATH, json=spec(1, 4)).status_code == 200  # a new endpoint on the old VIP


class BlockingDataplane(MemoryDataplane):
    """Holds the first write until released, to line two writers up."""

    def __init__(self):
        super().__init__()
        self.entered = threading.Event()
        self.release = threading.Event()
        self.writes: list[int] = []

    def put_service(self, vip, port, proto, backends, draining=(), forwarding="nat"):
        self.writes.append(backends["10.0.0.1:8000"])
        if len(self.writes) == 1:
            self.entered.set()
            assert self.release.wait(10)
        return super().put_service(vip, port, proto, backends, draining, forwarding)


def test_racing_writers_apply_in_generation_order_under_one_lock():
    """Generation 5 arrives while generation 4 is mid-write: it waits for the lock and lands last.
    Then generation 4 again (a retry of the slow one) is refused: the maps keep 5's."""
    services, plane = ServiceGenerations(), BlockingDataplane()
    errors: list[Exception] = []

    def put(generation: int, weight: int) -> None:
        try:
            services.put(plane, "10.200.0.10", 8000, "tcp", MaglevServiceSpec.model_validate(spec(generation, weight)))
        except StaleGeneration as exc:
            errors.append(exc)

    older = threading.Thread(target=put, args=(4, 3))
    older.start()
    assert plane.entered.wait(10)
    newer = threading.Thread(target=put, args=(5, 20))
    newer.start()
    newer.join(0.2)
    assert newer.is_alive() and plane.writes == [3]  # waits for the lock, has not written
    plane.release.set()
    older.join(10)
    newer.join(10)
    assert plane.writes == [3, 20]
    put(4, 3)
    assert len(errors) == 1 and errors[0].held == 5
    assert plane.get_service("10.200.0.10", 8000, "tcp")["backends"]["10.0.0.1:8000"] == 20
    assert services.held(KEY) == 5


def serve(state: AgentState):
    return serve_in_thread(create_app(state))


def test_a_restarted_agent_still_refuses_an_older_generation(tmp_path):
    """The maps outlive the agent process (pinned); so do the generations it held. Generation 6
    is applied, the agent restarts, and generation 5 (a push from before, arriving late) is still
    refused; the heartbeat of the new process reports 6, so fabricd re-sends nothing."""
    plane, path = MemoryDataplane(), tmp_path / GENERATIONS_FILE

    def agent_process() -> AgentState:
        return AgentState(node_id="n1", vm_driver=DryRunDriver(tmp_path / "dry-run"), inventory=NoGpus(),
                          dataplane=plane, services=ServiceGenerations(path))

    with serve(agent_process()) as port:
        assert httpx.put(f"http://127.0.0.1:{port}{PATH}", json=spec(6, 20), timeout=10).status_code == 200
    restarted = agent_process()
    with serve(restarted) as port:
        late = httpx.put(f"http://127.0.0.1:{port}{PATH}", json=spec(5, 3), timeout=10)
        assert late.status_code == 409 and late.json()["error"]["code"] == "stale_generation"
        assert plane.get_service("10.200.0.10", 8000, "tcp")["backends"]["10.0.0.1:8000"] == 20
        report = build_report(restarted, "http://127.0.0.1:1", [], "", HostResources(cpu_free=1, memory_free_gib=1), [])
        assert report.service_generations == {KEY: 6}
        assert httpx.delete(f"http://127.0.0.1:{port}{PATH}", timeout=10).status_code == 204
    assert ServiceGenerations(path).held(KEY) == 0  # a delete is kept too: a new endpoint may reuse the VIP


class FailingDataplane(MemoryDataplane):
    def put_service(self, *args, **kwargs):
        raise OSError("map update failed")


def test_the_file_follows_the_maps_and_an_unreadable_one_is_set_aside(tmp_path, caplog):
    path = tmp_path / GENERATIONS_FILE
    services = ServiceGenerations(path)
    services.put(MemoryDataplane(), "10.200.0.10", 8000, "tcp", MaglevServiceSpec.model_validate(spec(3, 1)))
    with pytest.raises(OSError):  # the maps refused generation 4: the file keeps 3, never ahead of the maps
        services.put(FailingDataplane(), "10.200.0.10", 8000, "tcp", MaglevServiceSpec.model_validate(spec(4, 1)))
    assert ServiceGenerations(path).held(KEY) == 3
    path.write_text('{"generations": {"10.200.0.10:8000/tcp": "many"}}')
    assert ServiceGenerations(path).held(KEY) == 0  # nothing held, as an agent before the file
    assert (tmp_path / (GENERATIONS_FILE + ".unreadable")).exists() and not path.exists()
    assert "cannot be read" in caplog.text


def test_a_batch_writes_the_generations_file_once(tmp_path, monkeypatch):
    """A pushed batch of many services rewrites service-generations.json once, after its maps,
    not once per service (each a whole-file rewrite and an fsync on the push's path)."""
    import agent.service_generations as generations

    path, writes = tmp_path / GENERATIONS_FILE, []
    real_replace = generations.os.replace
    monkeypatch.setattr(generations.os, "replace", lambda a, b: (writes.append(b), real_replace(a, b)))
    state = AgentState(node_id="n1", vm_driver=DryRunDriver(tmp_path / "dry-run"), inventory=NoGpus(),
                       dataplane=MemoryDataplane(), services=ServiceGenerations(path))
    batch = {"services": [{"vip": f"10.200.0.{i}", "port": 8000, "proto": "tcp", **spec(7, 1)} for i in range(1, 41)]}
    with serve(state) as port:
        resp = httpx.put(f"http://127.0.0.1:{port}/v1/maglev/services", json=batch, timeout=10)
        assert resp.status_code == 200 and all(r["outcome"] == "applied" for r in resp.json()["results"])
        assert writes == [path]
        assert httpx.put(f"http://127.0.0.1:{port}/v1/maglev/services", json=batch, timeout=10).status_code == 200
        assert writes == [path]  # the same generations again: nothing to write
    reloaded = ServiceGenerations(path)
    assert all(reloaded.held(f"10.200.0.{i}:8000/tcp") == 7 for i in range(1, 41))
