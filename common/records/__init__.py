"""Typed records: one module per resource (get, list, create, update(name, mutate), delete), every
write validated through the resource's pydantic model, and one compare-and-swap helper (cas.py)."""

from common.store.base import Store  # the type every record function takes; callers annotate with it

__all__ = ["Store"]
