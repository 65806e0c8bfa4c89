"""The lab VM driver on real network namespaces: a replica is a namespace on the node's bridge
running fabric-engine-sim; a restarted driver adopts it; delete removes all of it."""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from pathlib import Path

import httpx
import pytest

from agent.vm.base import VmSpec
from agent.vm.lab_driver import LabDriver, LabNetwork
from lab.rigs.polling import wait_for
from lab.tiny_model import write_tiny_adapter

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("ip") is None,
                                reason="needs root and iproute2 for network namespaces")


def sh(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True)


@pytest.fixture
def node(tmp_path):
    """A node namespace with a bridge, and a host veth into it so the test can reach replicas."""
    tag = uuid.uuid4().hex[:5]
    ns, br, host_if, peer = f"fltest-node-{tag}", "br0", f"flt{tag}", "up0"
    sh("ip", "netns", "add", ns)
    sh("ip", "-n", ns, "link", "add", br, "type", "bridge")
    sh("ip", "-n", ns, "addr", "add", "10.252.7.1/24", "dev", br)
    sh("ip", "-n", ns, "link", "set", br, "up")
    sh("ip", "link", "add", host_if, "type", "veth", "peer", "name", peer, "netns", ns)
    sh("ip", "addr", "add", "10.252.8.1/30", "dev", host_if)
    sh("ip", "link", "set", host_if, "up")
    sh("ip", "-n", ns, "addr", "add", "10.252.8.2/30", "dev", peer)
    sh("ip", "-n", ns, "link", "set", peer, "up")
    sh("ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv4.ip_forward=1")
    sh("ip", "route", "add", "10.252.7.0/24", "via", "10.252.8.2", "dev", host_if)
    net = LabNetwork(node_netns=ns, bridge=br, subnet="10.252.7.0/24", gateway="10.252.7.1",
                     prefix=f"fltest-{tag}-")
    yield net, tmp_path
    for name in os.listdir("/var/run/netns"):
        if name.startswith(f"fltest-{tag}-"):
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
    subprocess.run(["ip", "link", "del", host_if], capture_output=True)
    subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def wait_models(host: str) -> dict:
    def models() -> dict | None:
        try:
            return httpx.get(f"http://{host}:8000/v1/models", timeout=1).json()
        except httpx.HTTPError:
            return None

    return wait_for(models, 30, f"the engine at {host} to answer", interval=0.2)


def test_replica_namespace_serves_is_adopted_after_restart_and_is_deleted_whole(node):
    net, state = node
    driver = LabDriver(net, state)
    spec = VmSpec(replica_id="m-0-abc", deployment="m", model_name="lab-model", model_source="hf://o/m")
    st = driver.create(spec)
    assert st.host == "10.252.7.10" and st.state in ("starting", "running")
    models = wait_models(st.host)
    assert [m["id"] for m in models["data"]] == ["lab-model"]
    ns = f"{net.prefix}r-m-0-abc"
    pids_before = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
    assert pids_before

    # A restarted agent (a new driver on the same state dir) adopts the replica as it is.
    again = LabDriver(net, state)
    assert [(s.id, s.state, s.host) for s in again.list()] == [("m-0-abc", "running", "10.252.7.10")]
    assert again.create(spec).host == "10.252.7.10"
    pids_after = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
    assert pids_after == pids_before, "adoption must not start a second engine"

    # A second replica gets the next address; the first keeps serving. This one's model has LoRA
    # adapters: its engine sees their set as /adapters and loads from the files there only.
    adapters = write_tiny_adapter(state / "adapter-set" / "sql").parent
    st2 = again.create(VmSpec(replica_id="m-1-def", deployment="m", model_name="lab-model", model_source="x",
                              adapters_dir=str(adapters), max_loras=2))
    assert st2.host == "10.252.7.11"
    wait_models(st2.host)
    load = "http://10.252.7.11:8000/v1/load_lora_adapter"
    assert httpx.post(load, json={"lora_name": "sql", "lora_path": "/adapters/sql"}).status_code == 200
    ghost = httpx.post(load, json={"lora_name": "ghost", "lora_path": "/adapters/ghost"})
    assert ghost.status_code == 404 and "No adapter found" in ghost.text

    assert again.delete("m-0-abc") is True
    assert not Path("/var/run/netns", ns).exists()
    assert again.get("m-0-abc") is None
    assert again.delete("m-0-abc") is False
    for pid in pids_before:
        assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split(")")[-1][:3]
    # The freed address is not handed straight to the next replica.
    st3 = again.create(VmSpec(replica_id="m-2-ghi", deployment="m", model_name="lab-model", model_source="x"))
    assert st3.host == "10.252.7.12"
    assert again.delete("m-1-def") and again.delete("m-2-ghi")


def test_a_replica_made_with_dsr_vips_decapsulates_and_holds_the_vips_in_its_namespace(node):
    """What VmCreateRequest.dsr_vips (set by fabricd for a dsr-ipip endpoint) does to a lab replica:
    the IPIP decap program on its eth0, the VIP on its loopback, ARP kept off the VIP; a replica
    made without it has none of these (the packets themselves: tests/dataplane/test_dataplane_netns.py)."""
    net, state = node
    driver = LabDriver(net, state)
    vip = "10.252.9.5"
    dsr = driver.create(VmSpec(replica_id="d-0-abc", deployment="d", model_name="lab-model", model_source="x",
                               dsr_vips=(vip,)))
    plain = driver.create(VmSpec(replica_id="d-1-def", deployment="d", model_name="lab-model", model_source="x"))

    def look(replica_id: str, *cmd: str) -> str:
        return subprocess.run(["ip", "netns", "exec", f"{net.prefix}r-{replica_id}", *cmd], capture_output=True,
                              text=True, check=True).stdout

    assert f"{vip}/32" in look("d-0-abc", "ip", "-o", "addr", "show", "dev", "lo")
    assert "prog/xdp" in look("d-0-abc", "ip", "-d", "link", "show", "dev", "eth0")
    assert look("d-0-abc", "sysctl", "-n", "net.ipv4.conf.all.arp_ignore").strip() == "1"
    assert vip not in look("d-1-def", "ip", "-o", "addr", "show", "dev", "lo")
    assert "prog/xdp" not in look("d-1-def", "ip", "-d", "link", "show", "dev", "eth0")
    assert dsr.host != plain.host
    assert driver.delete("d-0-abc") and driver.delete("d-1-def")


def test_the_simulator_takes_the_vllm_flags_it_shares_from_the_revision_and_profile(node):
    """A revision's engine args reach a lab replica: --max-num-seqs and --max-model-len (the
    profile's max_model_len, or the args', which come later) change the simulator; other vLLM
    flags are left out of its command line."""
    from agent.vm.lab_driver import sim_engine_args

    assert sim_engine_args(["--max-num-seqs", "2", "--enable-prefix-caching", "--max-model-len=1024"], 4096) == \
        ["--max-num-seqs", "2", "--max-model-len", "1024"]
    assert sim_engine_args(["--gpu-memory-utilization", "0.8"], None) == []
    net, state = node
    driver = LabDriver(net, state)
    st = driver.create(VmSpec(replica_id="a-0-abc", deployment="a", model_name="lab-model", model_source="x",
                              max_model_len=2048, extra_args=("--max-num-seqs", "3", "--enable-prefix-caching")))
    try:
        card = wait_models(st.host)["data"][0]
        assert card["max_model_len"] == 2048
        pids = subprocess.run(["ip", "netns", "pids", f"{net.prefix}r-a-0-abc"], capture_output=True,
                              text=True).stdout.split()
        cmdlines = [Path(f"/proc/{p}/cmdline").read_bytes().split(b"\0") for p in pids]
        engine = next(c for c in cmdlines if b"--replica-id" in c)
        assert engine[engine.index(b"--max-num-seqs") + 1] == b"3" and b"--enable-prefix-caching" not in engine
    finally:
        driver.delete("a-0-abc")
