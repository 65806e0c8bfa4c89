"""A GPU-less fabricd (FABRIC_DRY_RUN=1): synthetic replicas instead of agents (plan.py, worker.py)."""
