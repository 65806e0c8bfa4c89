"""GPU reservations (/fabric/gpu-reservations/<node>/<pci or slice id>), read for the views: the
scheduler takes them with create-if-absent (controlplane.reconcile) so two replicas never hold one."""

from __future__ import annotations

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
