"""Reconciler: the pure plan (plan.py), its applier (apply.py) and the per-node agent backoff (backoff.py)."""
