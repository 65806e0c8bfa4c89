"""VIP announcements over BGP through BIRD 2 (docs/dataplane.md, "Announcing VIPs").

settings.py: FABRIC_BGP_* read once into a frozen, validated object (off by default).
plan.py:     the pure decision: which /32s this node announces, and why (health-gated).
bird.py:     BIRD's configuration rendered from settings + plan, and the daemon the agent runs.
announcer.py: the thin loop that reads the dataplane, plans, applies, and reports peers.
"""
