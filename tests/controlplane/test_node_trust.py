"""The pure decisions of controlplane.node_trust: a registered node's address and site are
fixed, and a VM's reported address must lie in the node's replica networks."""

from __future__ import annotations

from common.schemas import Node
from controlplane.node_trust import identity_change, replica_host_refusal

LAB = Node(id="lab", address="http://127.0.0.1:9100")
GPU = Node(id="gpu-1", address="https://10.0.0.5:9443", site="east")


def test_identity_change_names_what_changed_and_the_fix():
    assert identity_change(GPU, "https://10.0.0.5:9443/", "east") is None
    why = identity_change(GPU, "https://10.0.0.6:9443", "east")
    assert "address https://10.0.0.5:9443" in why and "PUT /api/ai/nodes/gpu-1/identity" in why
    assert "site east" in identity_change(GPU, GPU.address, "west")


def test_replica_hosts_without_networks_must_be_private():
    assert replica_host_refusal(GPU, "10.77.0.3", 8000) is None
    assert replica_host_refusal(GPU, "192.168.122.9", 8000) is None
    assert replica_host_refusal(GPU, None, 8000) is None  # no address yet
    for host in ("8.8.8.8", "169.254.169.254", "0.0.0.0", "224.0.0.1", "etcd.internal"):
        assert replica_host_refusal(GPU, host, 8000), host
    assert replica_host_refusal(GPU, "127.0.0.1", 2379)  # loopback is the agent's own host: lab only
    assert replica_host_refusal(LAB, "127.0.0.1", 8000) is None
    assert replica_host_refusal(GPU, "10.77.0.3", 0)


def test_replica_networks_bound_the_hosts():
    node = GPU.model_copy(update={"replica_networks": ["10.77.0.0/16"]})
    assert replica_host_refusal(node, "10.77.1.2", 8000) is None
    why = replica_host_refusal(node, "10.0.0.9", 2379)
    assert why and "10.77.0.0/16" in why
