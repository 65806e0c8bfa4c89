"""MIG slices: the catalog and the pure decisions (catalog.py), slices as schedulable GPUs
(inventory.py); controlplane/api/mig.py applies them."""
