"""Chargeback (GET /api/ai/finops): GPU-seconds reserved and ready per deployment and tenant over
a window, integrated from the replica lifetime ledger (common.records.lifetimes), and the
tokens the usage ledger holds for the hours the window touches (common.usage_ledger), per
deployment; a tenant's tokens are the sum of its deployments' (one figure, computed once, so the
two tables always agree, untenanted deployments included). Usage per tenant, key and model over
time, with prices and budgets, is GET /api/ai/usage (controlplane.tenancy.usage).

Pure: ``report`` takes lifetimes, the living replicas (a replica from before the ledger, with no
lifetime, counts from its record: created_at, and ready since ready_since), the deployments'
tenants and the token counts, and returns the rows. GPU-seconds are exact integrals:
each replica contributes gpus x the length of [created_at, ended_at or now] (reserved) and of
each ready span (ready) that falls inside [now - window, now]; nothing is sampled.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from common.records.lifetimes import Lifetime
from common.schemas import Replica

MAX_WINDOW_S = 31 * 86400


def overlap(a: float, b: float, start: float, end: float) -> float:
    return max(0.0, min(b, end) - max(a, start))


@dataclass(frozen=True)
class GpuSeconds:
    reserved: float = 0.0
    ready: float = 0.0

    def plus(self, other: GpuSeconds) -> GpuSeconds:
        return GpuSeconds(self.reserved + other.reserved, self.ready + other.ready)


def integrate(life: Lifetime, start: float, end: float) -> GpuSeconds:
    """GPU-seconds one replica held and served inside [start, end]."""
    stop = life.ended_at if life.ended_at is not None else end
    reserved = overlap(life.created_at, stop, start, end)
    ready = sum(overlap(s, e if e is not None else stop, start, end) for s, e in life.ready_spans)
    return GpuSeconds(life.gpus * reserved, life.gpus * ready)


def from_record(replica: Replica, tenant: str | None) -> Lifetime:
    """A lifetime for a living replica the ledger has not seen (written before it existed)."""
    spans = [[max(replica.ready_since or replica.created_at, replica.created_at), None]] if replica.ready else []
    return Lifetime(replica_id=replica.replica_id, deployment=replica.deployment, tenant=tenant,
                    gpus=len(replica.gpus), created_at=replica.created_at, ready_spans=spans)


def _row(name_field: str, name: str | None, gpu: GpuSeconds, tokens: int) -> dict:
    return {name_field: name, "gpu_seconds_reserved": round(gpu.reserved, 3), "gpu_seconds_ready": round(gpu.ready, 3),
            "tokens": tokens}


def report(
    lifetimes: Iterable[Lifetime],
    replicas: Iterable[Replica],
    tenants: Mapping[str, str | None],
    deployment_tokens: Mapping[str, int],
    *,
    now: float,
    window_s: float,
    token_window: tuple[int, int],
) -> dict:
    """``tenants``: deployment -> its tenant now (a deleted one's comes from its lifetimes)."""
    start = now - window_s
    lives = {life.replica_id: life for life in lifetimes}
    for r in replicas:
        if r.replica_id not in lives:
            lives[r.replica_id] = from_record(r, tenants.get(r.deployment))
    per_dep: dict[str, GpuSeconds] = {}
    dep_tenant: dict[str, str | None] = dict(tenants)
    for life in lives.values():
        per_dep[life.deployment] = per_dep.get(life.deployment, GpuSeconds()).plus(integrate(life, start, now))
        dep_tenant.setdefault(life.deployment, life.tenant)
    for name in deployment_tokens:
        per_dep.setdefault(name, GpuSeconds())
    per_tenant: dict[str | None, GpuSeconds] = {}
    tenant_tokens: dict[str | None, int] = {}
    for dep, gpu in per_dep.items():
        t = dep_tenant.get(dep)
        per_tenant[t] = per_tenant.get(t, GpuSeconds()).plus(gpu)
        tenant_tokens[t] = tenant_tokens.get(t, 0) + deployment_tokens.get(dep, 0)
    deployments = [{**_row("deployment", d, per_dep[d], deployment_tokens.get(d, 0)),
                    "tenant": dep_tenant.get(d)} for d in sorted(per_dep)]
    tenants_out = [_row("tenant", t, per_tenant[t], tenant_tokens.get(t, 0))
                   for t in sorted(per_tenant, key=lambda t: (t is not None, t or ""))]
    return {
        "window": {"start": start, "end": now, "seconds": window_s},
        "token_window": {"start": token_window[0], "seconds": token_window[1]},
        "deployments": deployments,
        "tenants": tenants_out,
    }
