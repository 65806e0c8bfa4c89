"""Host networking the agent manages for VMs: the fabric bridge and per-replica taps."""
