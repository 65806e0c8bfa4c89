"""Views for people, through the real fabricctl (issue 41), on real fabricd and a real agent
(dry-run VMs, 4 GPUs, 64 CPUs and 256 GiB offered): every view of a node's CPU and memory shows
the same figures (`node list`, `node show`, `capacity`, the console's strip); human output has
no reprs or raw epochs; --wait says "created" at once and what it got; -o name names."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from controlplane.console.views import capacity_strip
from lab.rigs.polling import wait_for
from tests.controlplane.conftest import BIN
from tests.integration.orchestration_harness import start_cluster

# full (scripts/test-full; 24 s); make test covers it with fabricctl's outputs and waits against a fabricd (tests/controlplane/test_fabricctl_cli.py, tests/integration/test_cli_mistakes.py)
pytestmark = [pytest.mark.e2e, pytest.mark.full]


def run_ctl(cluster, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FABRIC_")}
    env.update(FABRIC_URL=cluster.url, FABRIC_TOKEN=cluster.token, HOME=str(cluster.state_dir))
    proc = subprocess.run([str(BIN / "fabricctl"), "ai", *args], capture_output=True, text=True, env=env, timeout=60)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def ctl(cluster, *args: str) -> str:
    proc = run_ctl(cluster, *args)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with start_cluster(tmp_path_factory.mktemp("views")) as running:
        yield running


def column(table: str, header: str) -> list[str]:
    """A column's cells by the header's position (a blank cell elsewhere cannot shift it)."""
    lines = [line for line in table.splitlines() if line.strip()]
    head = next(i for i, line in enumerate(lines) if header in line.split())
    start = lines[head].index(header)
    return [line[start:].split()[0] for line in lines[head + 1:] if line[start:].strip()]


def test_node_list_show_capacity_and_console_agree_on_free_cpu_and_memory(cluster):
    with cluster.api() as api:
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


def test_human_output_and_waits_through_the_console_script(cluster):
    shown = ctl(cluster, "node", "show", "node-a")
    assert "{'" not in shown and "e+0" not in shown and "None" not in shown, shown
    fields = {line.split()[0]: line.split(None, 1)[1] for line in shown.splitlines() if len(line.split()) > 1}
    assert fields["gpus"] == "4 (below)" and fields["last_heartbeat"].endswith(" ago)"), shown
    assert any(line.split()[:3] == ["INDEX", "PCI", "NAME"] for line in shown.splitlines())
    exact = json.loads(ctl(cluster, "node", "show", "node-a", "-o", "json"))
    assert isinstance(exact["last_heartbeat"], float) and len(exact["gpus"]) == 4  # -o json is the server's

    # deploy --wait says "created" first, and still has on a timeout (8 GPUs cannot fit a 4-GPU node).
    ctl(cluster, "model", "add", "wm", "--source", "hf://Qwen/Qwen3-0.6B")
    ctl(cluster, "profile", "add", "g8", "--gpu", "8", "--vram", "24", "--cpu", "1", "--memory", "1")
    stuck = run_ctl(cluster, "deploy", "wm", "--profile", "g8", "--name", "stuck", "--wait", "--timeout", "2")
    assert stuck.returncode == 1 and "timed out after 2s" in stuck.stderr
    assert stuck.stdout.startswith("deployment stuck created (1 replicas of wm with g8)"), stuck.stdout
    ctl(cluster, "profile", "add", "g1", "--gpu", "1", "--vram", "24", "--cpu", "1", "--memory", "1")
    done = ctl(cluster, "deploy", "wm", "--profile", "g1", "--name", "small", "--wait", "--timeout", "120")
    assert done.splitlines()[0].startswith("deployment small created") and "deployment small ready: 1/1" in done
    exposed = ctl(cluster, "endpoint", "expose", "small", "--wait", "--timeout", "60")
    assert "assigned shortly" not in exposed and "endpoint small-openai serves on VIP " in exposed, exposed
    # endpoint show with the deployment's name points at the endpoint's.
    miss = run_ctl(cluster, "endpoint", "show", "small")
    assert miss.returncode == 1 and "exposed as endpoint small-openai: fabricctl ai endpoint show small-openai" \
        in miss.stderr, miss.stderr
    assert ctl(cluster, "deployment", "autoscale", "small", "--enable", "--min", "1", "--max", "2",
               "-o", "name").split() == ["deployment/small"]
    scaling = ctl(cluster, "explain", "scaling", "small")
    assert "None" not in scaling and "TTFT" in scaling, scaling
    # finops: no tenant reads "-", and the tenant table's tokens are its deployments' sum.
    tables = ctl(cluster, "finops").split("\n\n")
    assert column(tables[0], "TENANT")[0] == "-" and column(tables[1], "TENANT") == ["-"], tables
    assert sum(int(t) for t in column(tables[0], "TOKENS")) == int(column(tables[1], "TOKENS")[0])
    # A refusal names the field as people know it, without FastAPI's "body." location.
    bad = run_ctl(cluster, "quota", "set", "acme", "--max-gpus", "-1")
    assert bad.returncode == 1 and "--max-gpus: must be at least 0" in bad.stderr and "body." not in bad.stderr, bad.stderr
