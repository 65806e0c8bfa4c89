"""How many Maglev table slots each backend gets: shared by the agent (which builds the table)
and fabricd (which picks rollout weights so a replica set's share lands on a target).

Each backend's slot count is its weight share of the table size, rounded by largest remainder
(ties by key), so it is within one slot of the ideal. Weight 0 means no slots.
"""

from __future__ import annotations

from collections.abc import Mapping

MAX_WEIGHT = 32
DEFAULT_SIZE = 65537


def slot_quotas(weights: Mapping[str, int], size: int) -> dict[str, int]:
    """Slots per backend: weight share of `size`, largest remainder, ties by key."""
    active = sorted(k for k, w in weights.items() if w > 0)
    total = sum(weights[k] for k in active)
    quotas = {k: size * weights[k] // total for k in active}
    left = size - sum(quotas.values())
    by_remainder = sorted(active, key=lambda k: (-(size * weights[k] % total), k))
    for key in by_remainder[:left]:
        quotas[key] += 1
    return quotas
