"""Plain-data builders shared by the planner tests (nodes, GPUs, deployments)."""

from common.schemas import (
    GpuInfo,
    GpuRequest,
    InferenceDeployment,
    InferenceProfile,
    ModelArtifact,
    Node,
    Replica,
)

NOW = 1_000_000.0


def gpu(i, mib=81920, name="NVIDIA H100 80GB HBM3", temp=40.0, ecc=0, mig=False, power=300.0):
    return GpuInfo(index=i, uuid=f"GPU-{i}", name=name, pci=f"0000:{0x10 + i:02x}:00.0",
                   memory_total_mib=mib, temperature_c=temp, ecc_uncorrected=ecc, mig_mode=mig, power_w=power)


def node(nid, n_gpus=2, *, site="default", domain=None, age=5.0, taints=(), cpu=64, mem=256.0, cached=(),
         gpus=None, driver="libvirt", balancer=True):
    """A node; a balancer unless told (the routing tests' nodes carry the services, as the lab's do)."""
    return Node(id=nid, address=f"https://{nid}:7443", site=site, failure_domain=domain or nid,
                taints=list(taints), gpus=gpus if gpus is not None else [gpu(i) for i in range(n_gpus)],
                cpu_free=cpu, memory_free_gib=mem, cached_models=list(cached), last_heartbeat=NOW - age,
                vm_driver=driver, balancer=balancer)


def deployment(replicas=1, **kw):
    return InferenceDeployment(name="qwen", model="qwen", profile="p24", replicas=replicas, **kw)


def profile(count=1, vram=24, cpu=8, mem=32, model=None):
    return InferenceProfile(name="p24", gpu=GpuRequest(count=count, vram_gib=vram, model=model), cpu=cpu,
                            memory_gib=mem)


def model(residency=None):
    return ModelArtifact(name="qwen", source="hf://Qwen/Qwen3-8B", residency=residency)


def replica(ordinal, nid="n1", *, ready=True, failures=0, draining=False, deadline=None, phase=None,
            created=NOW - 100, gpus=None, host="10.0.0.9"):
    return Replica(replica_id=f"qwen-{ordinal}-abc", deployment="qwen", ordinal=ordinal, node=nid,
                   gpus=gpus if gpus is not None else [f"0000:{0x10 + ordinal:02x}:00.0"], host=host,
                   ready=ready, health_failures=failures, draining=draining, drain_deadline=deadline,
                   phase=phase or ("Ready" if ready else "Starting"), created_at=created)
