"""Per-tenant quotas (GPUs, CPU cores, memory) and the guaranteed GPU share: one check shared by
deployment create, manual scale, a rollout's surge, the autoscaler and admission.

A deployment holds ``replicas x`` its profile's (gpu.count, cpu, memory_gib): its desired count,
not what happens to be running. A scale that was accepted is a promise the reconciler keeps, and
a replica taken by preemption stays counted, so its return (controlplane.reconcile.preempt_apply
restores it) never needs room the tenant does not already hold. A tenant's use is the sum over
its deployments, except those being deleted, plus the surge of each of their active rollouts (the
replicas a rollout runs beside the old set: ``surge_replicas`` at the new revision's profile,
admitted at its start and held until it ends). A deployment without a tenant, or a tenant without
a quota record, is not limited; a quota field left unset (None) does not limit that resource.

``guaranteed_gpus`` is the share preemption may not take: a lower-class replica of the tenant is
no victim while taking it would leave the tenant's running replicas under that many GPUs
(controlplane.placement.preemption). ``check`` and ``room`` are pure; ``usage``/``load_quota``
read the store; ``refuse_over_quota`` turns a refusal into the API's 409.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

from common.errors import Conflict, UnreadableRecord
from common.records import deployments, profiles
from common.records import quotas as quota_records
from common.records import rollouts as rollout_records
from common.schemas import TenantQuota
from common.store.base import Store


@dataclass(frozen=True)
class Amount:
    """What replicas hold: whole GPUs, CPU cores, GiB of memory."""

    gpus: int = 0
    cpu: int = 0
    memory_gib: float = 0.0

    def __add__(self, other: Amount) -> Amount:
        return Amount(self.gpus + other.gpus, self.cpu + other.cpu, round(self.memory_gib + other.memory_gib, 6))

    def times(self, n: int) -> Amount:
        return Amount(self.gpus * n, self.cpu * n, round(self.memory_gib * n, 6))


NONE = Amount()
UNKNOWN_PROFILE = Amount(1, 0, 0.0)  # a deployment never holds less than a GPU per replica
# (field on TenantQuota, Amount attribute, how a message names it)
LIMITS = (("max_gpus", "gpus", "GPU"), ("max_cpu", "cpu", "CPU"), ("max_memory_gib", "memory_gib", "memory (GiB)"))


@dataclass(frozen=True)
class Exceeded:
    field: str  # the TenantQuota field, e.g. max_cpu
    label: str
    limit: float
    used: float
    adding: float


@dataclass(frozen=True)
class QuotaRefusal:
    tenant: str
    exceeded: tuple[Exceeded, ...]

    @property
    def message(self) -> str:
        return "; ".join(f"tenant {self.tenant!r} {e.label} quota is {_n(e.limit)} ({e.field}); it uses "
                         f"{_n(e.used)} and this needs {_n(e.adding)} more ({_n(e.used + e.adding)} > {_n(e.limit)})"
                         for e in self.exceeded)


def _n(x: float) -> str:
    return f"{x:g}" if isinstance(x, float) else str(x)


def check(tenant: str | None, quota: TenantQuota | None, used: Amount, adding: Amount) -> QuotaRefusal | None:
    """Pure: None when adding ``adding`` keeps the tenant within every limit of its quota (or it
    has none). A resource not growing (adding <= 0) is always allowed, even over a quota lowered
    after the fact."""
    if tenant is None or quota is None:
        return None
    over = []
    for field, attr, label in LIMITS:
        limit, have, more = getattr(quota, field), getattr(used, attr), getattr(adding, attr)
        if limit is not None and more > 0 and round(have + more, 6) > limit:
            over.append(Exceeded(field, label, limit, have, more))
    return QuotaRefusal(tenant, tuple(over)) if over else None


def room(quota: TenantQuota, used: Amount) -> dict[str, float | None]:
    """Pure: what the tenant may still add per resource (None: not limited; never below 0)."""
    out: dict[str, float | None] = {}
    for field, attr, _ in LIMITS:
        limit = getattr(quota, field)
        out[attr] = None if limit is None else max(0, round(limit - getattr(used, attr), 6))
    return out


def replicas_within(left: Mapping[str, float | None], one: Amount) -> int | None:
    """Pure: how many more replicas of ``one`` the room ``left`` (room()'s answer) takes; None when
    no limit binds."""
    counts = [int(left[attr] // getattr(one, attr)) for _, attr, _ in LIMITS
              if left.get(attr) is not None and getattr(one, attr) > 0]
    return min(counts) if counts else None


def held_by(record: Mapping, per_replica: Mapping[str, Amount]) -> Amount:
    """What one deployment record holds: desired replicas x its profile's amount."""
    if (record.get("status") or {}).get("phase") == "Deleting":
        return NONE
    return per_replica.get(record.get("profile", ""), UNKNOWN_PROFILE).times(int(record.get("replicas", 0)))


def per_replica(store: Store) -> dict[str, Amount]:
    """profile name -> what one replica holds, read from the stored JSON (a profile whose runtime
    was later denied still counts)."""
    out: dict[str, Amount] = {}
    for rec in profiles.RECORDS.readable(store):
        try:
            out[rec["name"]] = Amount(int(rec["gpu"]["count"]), int(rec["cpu"]), float(rec["memory_gib"]))
        except (ValueError, KeyError, TypeError):
            continue
    return out


def surge_replicas(strategy: str, replicas: int, max_surge: int) -> int:
    """Pure: the most replicas a rollout runs beyond the deployment's count at once: min(max_surge,
    N) for rolling, N for canary (its last step) and blue/green."""
    return min(max_surge, replicas) if strategy == "rolling" else replicas


def rollout_surges(store: Store, amounts: Mapping[str, Amount],
                   among: Collection[str] | None = None) -> dict[str, Amount]:
    """deployment -> what its active rollout holds beyond the deployment's replicas; only the
    deployments in ``among`` when given (one revision read per rollout counted)."""
    out = {}
    for name, (rec, _) in rollout_records.active_rollouts(store).items():
        if among is not None and name not in among:
            continue
        target = rollout_records.get_revision(store, name, rec.to_revision)
        one = amounts.get(target.template.profile, UNKNOWN_PROFILE) if target is not None else UNKNOWN_PROFILE
        out[name] = one.times(surge_replicas(rec.strategy, rec.replicas, rec.max_surge))
    return out


def usage(records: Iterable[Mapping], tenant: str, amounts: Mapping[str, Amount], *,
          exclude: str | None = None, surges: Mapping[str, Amount] | None = None) -> Amount:
    """What the tenant's deployments hold, leaving out the deployment named ``exclude`` (but not
    the surge of its active rollout: a scale does not change that), plus ``surges``
    (rollout_surges' answer) of its deployments not being deleted."""
    total = NONE
    for r in records:
        if r.get("tenant") != tenant:
            continue
        if r.get("name") != exclude:
            total = total + held_by(r, amounts)
        if surges and (r.get("status") or {}).get("phase") != "Deleting":
            total = total + surges.get(str(r.get("name", "")), NONE)
    return total


def load_quota(store: Store, tenant: str | None) -> TenantQuota | None:
    if tenant is None:
        return None
    try:
        return quota_records.get(store, tenant)
    except UnreadableRecord:
        return None


def load_all(store: Store) -> dict[str, TenantQuota]:
    return {q.tenant: q for q in quota_records.RECORDS.list(store)}


def tenant_usage(store: Store, tenant: str, *, exclude: str | None = None,
                 amounts: Mapping[str, Amount] | None = None) -> Amount:
    """What ``tenant`` holds (``usage``) on fresh reads: its deployments and their rollouts' surges."""
    amounts = per_replica(store) if amounts is None else amounts
    records = [rec for _, rec in deployments.stored_items(store) if rec.get("tenant") == tenant]
    surges = rollout_surges(store, amounts, among={str(r.get("name", "")) for r in records})
    return usage(records, tenant, amounts, exclude=exclude, surges=surges)


def check_growth(store: Store, name: str, tenant: str | None, adding: Amount) -> QuotaRefusal | None:
    """The shared check of anything that adds replicas beyond the deployment's own record (a
    rollout's surge): ``adding`` on top of everything the tenant holds."""
    quota = load_quota(store, tenant)
    if quota is None or tenant is None:
        return None
    return check(tenant, quota, tenant_usage(store, tenant), adding)


def check_deployment_change(store: Store, name: str, tenant: str | None, profile: str,
                            replicas_before: int, replicas_after: int) -> QuotaRefusal | None:
    """The shared check as the API runs it: create (before 0), manual scale, the autoscaler."""
    quota = load_quota(store, tenant)
    if quota is None or tenant is None:
        return None
    amounts = per_replica(store)
    one = amounts.get(profile, UNKNOWN_PROFILE)
    used = tenant_usage(store, tenant, exclude=name, amounts=amounts) + one.times(replicas_before)
    return check(tenant, quota, used, one.times(replicas_after - replicas_before))


def refuse_over_quota(refusal: QuotaRefusal | None) -> None:
    if refusal is not None:
        raise Conflict(refusal.message, code="quota_exceeded")
