"""The VMs Fabric created on the agents (/fabric/managed/vms/<node>/<vm id> -> {"deployment"}),
each recorded before it is created, so the sweep removes only Fabric's own leftovers and never a VM
someone else made on an agent. (The Maglev services' records: orchestration_state.MANAGED_SERVICES.)
"""

from __future__ import annotations

import json

from common import keyspace
from common.store.base import Store

MANAGED_VMS = f"{keyspace.ROOT}/managed/vms/"


def managed_vm_key(node: str, vm_id: str) -> str:
    return f"{MANAGED_VMS}{node}/{vm_id}"


def note_vm(store: Store, node: str, vm_id: str, deployment: str) -> None:
    """Fabric is about to create ``vm_id`` on ``node`` for ``deployment``."""
    store.put(managed_vm_key(node, vm_id), json.dumps({"deployment": deployment}))


def forget_vm(store: Store, node: str, vm_id: str, mod_revision: int | None = None) -> bool:
    """The VM is gone (only while unchanged since ``mod_revision``, when given); True if a record went."""
    return store.delete(managed_vm_key(node, vm_id), mod_revision=mod_revision)


def vms(store: Store) -> list[tuple[str, str, int]]:
    """(node, vm id, mod_revision) of every VM Fabric recorded, in key order."""
    out = []
    for kv in store.list(MANAGED_VMS):
        node, _, vm_id = kv.key[len(MANAGED_VMS):].partition("/")
        out.append((node, vm_id, kv.mod_revision))
    return out
