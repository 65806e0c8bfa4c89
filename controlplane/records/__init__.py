"""Typed records: one module per resource (get, list, create, update(name, mutate), delete), every
write validated through the resource's pydantic model, and one compare-and-swap helper (cas.py)."""
