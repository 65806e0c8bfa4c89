"""Every view of a node's CPU and memory shows the same figures (issue 41): `node list`, `node
show`, `capacity` and the console's capacity strip, through the real API and the real fabricctl,
after replicas took some; real fabricd, a real agent (dry-run VMs, 64 CPUs and 256 GiB offered)."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from controlplane.console.views import capacity_strip
from tests.controlplane.conftest import BIN
from tests.integration.orchestration_harness import start_cluster
from tests.support.polling import wait_for

pytestmark = pytest.mark.e2e


def ctl(cluster, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FABRIC_")}
    env.update(FABRIC_URL=cluster.url, FABRIC_TOKEN=cluster.token, HOME=str(cluster.state_dir))
    proc = subprocess.run([str(BIN / "fabricctl"), "ai", *args], capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def column(table: str, header: str) -> list[str]:
    """A column's cells by the header's position (a blank cell elsewhere cannot shift it)."""
    lines = [line for line in table.splitlines() if line.strip()]
    head = next(i for i, line in enumerate(lines) if header in line.split())
    start = lines[head].index(header)
    return [line[start:].split()[0] for line in lines[head + 1:] if line[start:].strip()]


def test_node_list_show_capacity_and_console_agree_on_free_cpu_and_memory(tmp_path):
    with start_cluster(tmp_path) as cluster, cluster.api() as api:
        assert api.post("/api/ai/models", json={"name": "m", "source": "hf://Qwen/Qwen3-0.6B"}).status_code == 201
        assert api.post("/api/ai/profiles", json={"name": "p", "gpu": {"count": 1, "vram_gib": 24}, "cpu": 3,
                                                  "memory_gib": 5}).status_code == 201
        assert api.post("/api/ai/deployments", json={"name": "d", "model": "m", "profile": "p",
                                                     "replicas": 2}).status_code == 201
        wait_for(lambda: api.get("/api/ai/capacity").json()["nodes"][0]["cpu_committed"] == 6, 30,
                 "both replicas to hold their CPU")
        listed = api.get("/api/ai/nodes").json()[0]
        shown = api.get("/api/ai/nodes/node-a").json()
        cap = api.get("/api/ai/capacity").json()["nodes"][0]
        for view in (listed, shown, cap):
            assert (view["cpu_free"], view["cpu_allocatable"], view["cpu_committed"]) == (58, 64, 6), view
            assert (view["memory_free_gib"], view["memory_allocatable_gib"]) == (246, 256), view
        strip = {row["label"]: row for row in capacity_strip(api.get("/api/ai/capacity").json())}
        assert (strip["CPU"]["free"], strip["CPU"]["total"]) == (58, 64)
        assert (strip["Memory"]["free"], strip["Memory"]["total"]) == (246, 256)
        # The people's views, through the console script: the same figures in each table.
        assert column(ctl(cluster, "node", "list"), "CPU_FREE") == ["58"]
        assert column(ctl(cluster, "node", "list"), "MEM_FREE_GIB") == ["246"]
        capacity = ctl(cluster, "capacity")
        assert column(capacity, "CPU_FREE") == ["58"] and column(capacity, "MEM_FREE_GIB") == ["246"]
        assert json.loads(ctl(cluster, "node", "show", "node-a", "-o", "json"))["cpu_free"] == 58
