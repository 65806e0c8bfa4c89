"""GPU reservations (/fabric/gpu-reservations/<node>/<pci or slice id>): taken with create-if-absent
(the reconciler, for each replica it places) so two replicas never hold one GPU, and read for the
views. A value is JSON {replica_id, deployment, created_at}."""

from __future__ import annotations

import json

from common import keyspace
from common.store.base import Store


def holder(store: Store, node: str, pci: str) -> str | None:
    """The stored value of the GPU reservation of ``pci`` (a whole GPU or a slice id) on ``node``."""
    kv = store.get(keyspace.gpu_reservations(node, pci))
    return None if kv is None else kv.value


def every(store: Store) -> dict[tuple[str, str], str]:
    """(node, pci) -> the stored value of every GPU reservation."""
    prefix = keyspace.gpu_reservations()
    out = {}
    for kv in store.list(prefix):
        node, _, pci = kv.key[len(prefix):].partition("/")
        out[(node, pci)] = kv.value
    return out


def _owner(value: str | None) -> str | None:
    """The replica_id of a reservation's JSON value; None when absent or not a JSON object."""
    if value is None:
        return None
    try:
        return json.loads(value).get("replica_id")
    except (ValueError, AttributeError):
        return None


def reserved_for(store: Store, node: str, pci: str) -> str | None:
    """The replica holding ``pci`` on ``node``, or None."""
    return _owner(holder(store, node, pci))


def reserve(store: Store, node: str, gpus, replica_id: str, deployment: str, now: float) -> bool:
    """Take every GPU of the group with create-if-absent, or none: a lost race undoes the rest.

    A GPU already reserved for this same replica counts as taken (a pass that stopped after
    reserving, e.g. fabricd killed or its lease lost, is finished by the next one)."""
    value = json.dumps({"replica_id": replica_id, "deployment": deployment, "created_at": now})
    taken: list[str] = []
    for pci in gpus:
        if store.create(keyspace.gpu_reservations(node, pci), value):
            taken.append(pci)
            continue
        if reserved_for(store, node, pci) == replica_id:
            continue
        for done in taken:
            release(store, node, done)
        return False
    return True


def release(store: Store, node: str, pci: str, mod_revision: int | None = None) -> bool:
    """Free the reservation (only while unchanged since ``mod_revision``, when given); True if one went."""
    return store.delete(keyspace.gpu_reservations(node, pci), mod_revision=mod_revision)
