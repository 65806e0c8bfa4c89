"""The reconciler's question before it creates a replica's VM: is the model Ready on that node?

A node whose agent runs model jobs (``Node.model_jobs``, reported in its heartbeat) gets a VM
only once the model's job there is Ready, and the VM mounts that job's digest directory. Until
then the first look records the job (Registered; the model worker drives it) and the replica
waits, Pending, with the job's state and progress as its message. A node whose agent does not
report model jobs (an older agent) is not gated: its VM expects the weights to be there.
"""

from __future__ import annotations

from common.records.model_jobs import create_job, get_job, restart_job
from common.schemas import ModelArtifact, Node
from common.store.base import Store
from controlplane.models import plan


def model_gate(store: Store, model: ModelArtifact, node: Node) -> plan.Gate:
    if not node.model_jobs:
        return plan.Gate(True, f"node {node.id} does not run model jobs", None)
    found = get_job(store, model.name, node.id)
    decision = plan.gate(model, found[0] if found else None, node)
    if decision.record_job:
        create_job(store, model.name, node.id)
    if decision.restart_job:
        reason = ("the model's adapters changed; fetching them" if "adapters changed" in decision.message
                  else "the node no longer holds the digest; fetching again")
        restart_job(store, model.name, node.id, ("Ready",), reason)
    return decision
