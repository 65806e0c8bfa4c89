"""Published routing plans (/fabric/routing-plans/<endpoint>): one record per endpoint, written by
the routing controller's leader, read by everyone who shows or uses "who gets traffic".

A plan is the exact Maglev service the agents are sent (``service``, with its ``generation``), the
per-replica decision behind it (``entries``: included or not, why, weight), the rollout split that
shaped it, and the replicas of each spillover deployment calls may go to. The routing controller
pushes ``service``; GET /api/ai/explain/routing/{endpoint} and the console show ``entries``; the
gateway routes on ``routed()`` and ``gateway_weights()``: one object, so they cannot drift.

``generation`` only grows: a new decision gets ``max(previous + 1, store revision + 1)``, so it
also grows across a deletion and re-creation of the endpoint (an agent that still holds the old
VIP's generation refuses nothing newer). The record is rewritten only when the decision moves
(``same_decision``): readings that change a reason's figures but no weight publish nothing.
"""

from __future__ import annotations

import builtins
from typing import Literal

from pydantic import BaseModel, Field

from common import keyspace
from common.agent_api import MaglevServiceSpec, service_key
from common.records import cas, reading
from common.schemas import Forwarding
from common.store.base import Store

KIND = "routing plan"


class PlanEntry(BaseModel):
    """One replica's line: routed or not, why, and its weight (0-32)."""

    replica_id: str
    included: bool
    reason: str = ""
    weight: int = Field(0, ge=0, le=32)
    host: str | None = None
    port: int = 8000
    maglev: bool = Field(False, description="a backend of the Maglev service (an IPv4 host on a real node)")
    draining: bool = False


class PlanSplit(BaseModel):
    """A canary or blue/green share as the agents' tables realise it."""

    percent: int
    table_share: float
    slot_error: float


class SpillPool(BaseModel):
    deployment: str
    replicas: list[str] = Field(default_factory=list, description="its replicas calls may go to")


class PublishedPlan(BaseModel):
    endpoint: str
    deployment: str
    generation: int = Field(..., ge=1)
    decided_at: float = 0.0
    strategy: str
    vip: str | None = None
    port: int = 8000
    proto: Literal["tcp", "udp"] = "tcp"
    forwarding: Forwarding = "nat"
    service: MaglevServiceSpec | None = Field(None, description="what the agents hold; None: no IP backends "
                                              "or no VIP (gateway only)")
    entries: list[PlanEntry] = Field(default_factory=list)
    split: PlanSplit | None = None
    spill: list[SpillPool] = Field(default_factory=list)

    @property
    def service_key(self) -> str | None:
        return None if self.vip is None else service_key(self.vip, self.port, self.proto)

    def routed(self) -> dict[str, int]:
        """replica id -> weight of every replica that takes new calls."""
        return {e.replica_id: e.weight for e in self.entries if e.included}

    def gateway_weights(self) -> dict[str, float]:
        """Per-replica weights the gateway hashes sessions by: the split's during a canary or
        blue/green share, else none (every routed replica alike)."""
        if self.split is None:
            return {}
        return {rid: float(w) for rid, w in self.routed().items()}

    def decision(self) -> tuple:
        """What a new generation is for: all but the generation, the time and the reasons' text."""
        return (self.deployment, self.strategy, self.vip, self.port, self.proto, self.forwarding,
                None if self.service is None else self.service.model_dump(exclude={"generation"}),
                [e.model_dump(exclude={"reason"}) for e in self.entries],
                None if self.split is None else self.split.model_dump(), [p.model_dump() for p in self.spill])


def same_decision(a: PublishedPlan | None, b: PublishedPlan) -> bool:
    return a is not None and a.decision() == b.decision()


def next_generation(store: Store, previous: PublishedPlan | None) -> int:
    return max((previous.generation + 1) if previous is not None else 1, store.revision() + 1)


def get(store: Store, endpoint: str) -> PublishedPlan | None:
    kv = store.get(keyspace.routing_plans(endpoint))
    return None if kv is None else reading.one(PublishedPlan, kv, KIND)


def list(store: Store) -> builtins.list[PublishedPlan]:
    """Every readable plan; one that does not parse is skipped and counted (the leader writes it again)."""
    return reading.each(PublishedPlan, store.list(keyspace.routing_plans()), KIND)


def publish(store: Store, plan: PublishedPlan) -> PublishedPlan:
    """Write the plan (the routing leader is its only writer)."""
    publish_all(store, [plan])
    return plan


def publish_all(store: Store, published: builtins.list[PublishedPlan]) -> None:
    """Write plans in one batch (``Store.put_all``: a transaction per MAX_TXN_OPS keys), as the
    routing pass does with the plans it decided."""
    if published:
        store.put_all([(keyspace.routing_plans(p.endpoint), cas.validated(PublishedPlan, p).model_dump_json())
                       for p in published])


def discard(store: Store, endpoint: str) -> bool:
    return store.delete(keyspace.routing_plans(endpoint))
