"""Pure decisions for service updates: what to write, and whether anything changed.

`plan_service` compares what the maps hold with what the caller wants and returns
the backends to keep, add and free, the weights the Maglev table is built from
(draining backends count as weight 0) and whether the service must be rewritten
at all; the Dataplane only applies the plan.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class BackendState:
    """One backend of a service as stored (or wanted) in the maps."""

    weight: int
    draining: bool
    snat: bool


FORWARDING_MODES = ("nat", "dsr-ipip")


@dataclass(frozen=True)
class ServiceState:
    service_id: int
    active: int
    no_backends: bool
    backends: dict[str, BackendState]  # "IP:PORT" -> state
    backend_ids: dict[str, int]  # "IP:PORT" -> backend id
    forwarding: str = "nat"  # FORWARDING_MODES


@dataclass
class ServicePlan:
    changed: bool
    table_weights: dict[str, int]  # weights the Maglev table is built from; empty = no backends
    keep: dict[str, int] = field(default_factory=dict)  # key -> existing backend id
    add: list[str] = field(default_factory=list)  # keys that need a new backend id
    free: list[int] = field(default_factory=list)  # backend ids no longer used

    @property
    def no_backends(self) -> bool:
        return not self.table_weights


def plan_service(current: ServiceState | None, wanted: dict[str, BackendState],
                 forwarding: str = "nat") -> ServicePlan:
    table_weights = {k: b.weight for k, b in sorted(wanted.items()) if b.weight > 0 and not b.draining}
    if current is None:
        return ServicePlan(changed=True, table_weights=table_weights, add=sorted(wanted))
    keep = {k: current.backend_ids[k] for k in sorted(wanted) if k in current.backend_ids}
    add = sorted(k for k in wanted if k not in current.backend_ids)
    free = sorted(i for k, i in current.backend_ids.items() if k not in wanted)
    changed = current.backends != wanted or current.forwarding != forwarding
    return ServicePlan(changed=changed, table_weights=table_weights, keep=keep, add=add, free=free)


def allocate_ids(used: set[int], count: int, limit: int) -> list[int]:
    """The `count` lowest ids in [0, limit) not in `used`; ValueError when full."""
    out = []
    candidate = 0
    while len(out) < count:
        if candidate >= limit:
            raise ValueError(f"all {limit} ids are in use")
        if candidate not in used:
            out.append(candidate)
        candidate += 1
    return out
