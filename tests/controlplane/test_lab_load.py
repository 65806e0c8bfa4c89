"""scripts/lab-load on everyday mistakes, through the real script against a real fabricd (HTTPS)
named by a lab.json like the lab's: a deployment, endpoint or replica that does not exist is one
line naming what does; replicas are picked by name or ordinal; the watch shows replica names."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from lab.load import pick_replica, weights_line
from tests.controlplane.conftest import login, start_fabricd

SCRIPT = Path(__file__).parents[2] / "scripts" / "lab-load"


@pytest.fixture(scope="module")
def lab_state(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("labload")
    with start_fabricd(tmp / "fabricd", insecure=False) as server:
        token = login(server)
        with server.client(token) as c:
            assert c.post("/api/ai/models", json={"name": "chat", "source": "hf://fab/chat"}).status_code == 201
            assert c.post("/api/ai/profiles", json={"name": "p", "gpu": {"count": 1, "vram_gib": 24}, "cpu": 1,
                                                    "memory_gib": 1}).status_code == 201
            for name in ("chat", "embed"):
                assert c.post("/api/ai/deployments", json={"name": name, "model": "chat", "profile": "p",
                                                           "replicas": 1}).status_code == 201
        state = tmp / "lab"
        state.mkdir()
        (state / "lab.json").write_text(json.dumps({"FABRIC_URL": server.url, "FABRIC_TOKEN": token,
                                                    "FABRIC_CA": str(server.ca)}))
        yield state


def load(state: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FABRIC_")}
    proc = subprocess.run([str(SCRIPT), "--state-dir", str(state), *args], capture_output=True, text=True, env=env,
                          timeout=60)
    assert "Traceback" not in proc.stderr and "KeyError" not in proc.stderr, proc.stderr
    return proc


def test_an_unknown_deployment_is_named_with_the_ones_there_are(lab_state):
    proc = load(lab_state, "--deployment", "nope", "--replica", "0", "--queue", "1")
    assert proc.returncode == 1
    assert proc.stderr.strip() == "lab-load: error: deployment 'nope' not found; deployments: chat, embed"


def test_a_missing_replica_lists_the_replicas_and_a_missing_endpoint_says_how_to_expose(lab_state):
    proc = load(lab_state, "--deployment", "chat", "--replica", "3", "--queue", "1")
    assert proc.returncode == 1 and "deployment chat has no replica '3'; it has: " in proc.stderr, proc.stderr
    proc = load(lab_state, "--deployment", "chat", "--watch", "1")
    assert proc.returncode == 1 and "endpoint 'chat-openai' not found" in proc.stderr
    assert "fabricctl ai endpoint expose chat" in proc.stderr


def test_usage_names_the_script():
    proc = subprocess.run([str(SCRIPT), "--help"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.startswith("usage: scripts/lab-load"), proc.stdout[:200]


REPS = [{"replica_id": "demo-llm-3-aaaaaa", "ordinal": 3, "host": "10.244.0.13", "port": 8000},
        {"replica_id": "demo-llm-4-bbbbbb", "ordinal": 4, "host": None, "phase": "Pending"}]


def test_a_replica_is_picked_by_its_name_or_its_ordinal():
    assert pick_replica(REPS, "demo-llm-3-aaaaaa", "demo-llm")["ordinal"] == 3
    assert pick_replica(REPS, "3", "demo-llm")["replica_id"] == "demo-llm-3-aaaaaa"
    with pytest.raises(SystemExit, match=r"no replica '1'; it has: demo-llm-3-aaaaaa \(ordinal 3\), "
                                         r"demo-llm-4-bbbbbb \(ordinal 4\)"):
        pick_replica(REPS, "1", "demo-llm")
    with pytest.raises(SystemExit, match="demo-llm-4-bbbbbb has no address yet"):
        pick_replica(REPS, "demo-llm-4-bbbbbb", "demo-llm")


def test_the_watch_shows_replica_names():
    plan = {"replicas": [{"replica_id": "demo-llm-0-83466d", "weight": 32}, {"replica_id": "demo-llm-1-e48a8f",
                                                                            "weight": 4}],
            "backends": [{"backend": "10.244.0.10", "weight": 32}, {"backend": "10.244.0.11", "weight": 4}]}
    assert weights_line(plan) == "demo-llm-0-83466d=32  demo-llm-1-e48a8f=4"
