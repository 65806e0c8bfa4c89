"""Per-tenant GPU quotas: one check shared by deployment create, manual scale and the autoscaler.

A deployment holds ``replicas x profile.gpu.count`` GPUs (its desired count, not what happens to
be running: a scale that was accepted is a promise the reconciler keeps). A tenant's use is the
sum over its deployments, except those being deleted. A deployment without a tenant, or a tenant
without a quota record, is not limited. ``check`` is pure; ``usage``/``load_quota`` read the
store; ``refuse_over_quota`` turns a refusal into the API's 409.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from pydantic import ValidationError

from common.errors import Conflict
from common.schemas import TenantQuota
from common.store.base import Store
from controlplane.records import deployments, profiles
from controlplane.records import quotas as quota_records


@dataclass(frozen=True)
class QuotaRefusal:
    tenant: str
    max_gpus: int
    used_gpus: int
    adding_gpus: int

    @property
    def message(self) -> str:
        return (f"tenant {self.tenant!r} GPU quota is {self.max_gpus} (max_gpus); it uses {self.used_gpus} "
                f"and this needs {self.adding_gpus} more ({self.used_gpus + self.adding_gpus} > {self.max_gpus})")


def check(tenant: str | None, max_gpus: int | None, used_gpus: int, adding_gpus: int) -> QuotaRefusal | None:
    """Pure: None when adding ``adding_gpus`` keeps the tenant within its quota (or it has none).
    Shrinking (adding <= 0) is always allowed, even over a quota lowered after the fact."""
    if tenant is None or max_gpus is None or adding_gpus <= 0:
        return None
    if used_gpus + adding_gpus <= max_gpus:
        return None
    return QuotaRefusal(tenant, max_gpus, used_gpus, adding_gpus)


def gpus_of(record: Mapping, gpu_counts: Mapping[str, int]) -> int:
    """GPUs one deployment record holds: desired replicas x its profile's gpu.count (1 when the
    profile is missing or unreadable: a deployment never holds less than a GPU per replica)."""
    if (record.get("status") or {}).get("phase") == "Deleting":
        return 0
    return int(record.get("replicas", 0)) * gpu_counts.get(record.get("profile", ""), 1)


def gpu_counts(store: Store) -> dict[str, int]:
    """profile name -> gpu.count, read from the stored JSON (a profile whose runtime was later
    denied still counts)."""
    out: dict[str, int] = {}
    for rec in profiles.RECORDS.readable(store):
        try:
            out[rec["name"]] = int(rec["gpu"]["count"])
        except (ValueError, KeyError, TypeError):
            continue
    return out


def usage(records: Iterable[Mapping], tenant: str, counts: Mapping[str, int], *, exclude: str | None = None) -> int:
    """GPUs the tenant's deployments hold, leaving out the deployment named ``exclude``."""
    return sum(gpus_of(r, counts) for r in records if r.get("tenant") == tenant and r.get("name") != exclude)


def load_quota(store: Store, tenant: str | None) -> TenantQuota | None:
    if tenant is None:
        return None
    try:
        return quota_records.get(store, tenant)
    except ValidationError:
        return None


def load_all(store: Store) -> dict[str, TenantQuota]:
    out = {}
    for rec in quota_records.RECORDS.readable(store):
        try:
            q = TenantQuota.model_validate(rec)
        except ValidationError:
            continue
        out[q.tenant] = q
    return out


def check_deployment_change(store: Store, name: str, tenant: str | None, profile: str,
                            replicas_before: int, replicas_after: int) -> QuotaRefusal | None:
    """The shared check as the API runs it: create (before 0) and manual scale."""
    quota = load_quota(store, tenant)
    if quota is None:
        return None
    counts = gpu_counts(store)
    records = [rec for _, rec in deployments.stored_items(store)]
    per_replica = counts.get(profile, 1)
    used = usage(records, tenant, counts, exclude=name) + replicas_before * per_replica
    return check(tenant, quota.max_gpus, used, (replicas_after - replicas_before) * per_replica)


def refuse_over_quota(refusal: QuotaRefusal | None) -> None:
    if refusal is not None:
        raise Conflict(refusal.message, code="quota_exceeded")
