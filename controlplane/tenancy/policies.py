"""Per-tenant deploy policies: which models and sources a tenant may deploy, and when (UTC hours).

A policy (keyspace.policies(tenant)) holds ``allowed_models`` (model names; absent: any),
``allowed_source_prefixes`` (a model's source must lie under one, whole path segments: ``hf://team-a``
admits ``hf://team-a/m`` but not ``hf://team-a-evil/m``, ``source_under``; absent: any),
``allow_pr_revisions`` (whether its tenant-bound callers may name ``@refs/pr/N`` revisions of
``hf://`` repositories: a pull request anyone may open on the Hub; off unless an admin sets it),
``allowed_capacity_classes`` (the capacity classes its deployments may use; absent: standard and
opportunistic, since ``critical`` needs an admin or this list naming it), ``preempt_other_tenants``
(its deployments may take other tenants' lower-class replicas; off unless an admin sets it: a
tenant's replicas otherwise preempt only its own) and an optional
``deploy_hour_start``/``deploy_hour_end`` window in whole UTC hours, start included, end
excluded: both absent means always; start after end wraps past midnight (22 -> 6 is 22:00-05:59);
start equal to end is refused (say "always" by leaving both out). A tenant without a policy, and
a deployment without a tenant, deploy as before, except that ``critical`` takes an admin. A policy
record that does not parse refuses every deploy of its tenant (403 "policy_unreadable": fail
closed, never "no policy"). ``refusals`` is the pure planner; deployment create, scale-up, a class
change and POST /api/ai/admit run it (scaling down is always allowed).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from common.errors import Forbidden, UnreadableRecord
from common.records import models
from common.records.policies import RECORDS
from common.store.base import Store
from common.tenant_policies import TenantPolicy


def source_under(source: str, prefix: str) -> bool:
    """Pure: ``source`` is ``prefix`` or lies below it by whole path segments (the next character
    is ``/``, or ``@`` starting an hf:// revision; a prefix ending in ``/`` is a segment already)."""
    if not prefix or not source.startswith(prefix):
        return False
    if len(source) == len(prefix) or prefix.endswith("/"):
        return True
    after = source[len(prefix)]
    return after == "/" or (after == "@" and source.startswith("hf://"))


def hour_allowed(start: int | None, end: int | None, hour: int) -> bool:
    """Pure: is UTC ``hour`` inside [start, end)? A window with start > end wraps past midnight."""
    if start is None or end is None:
        return True
    if start < end:
        return start <= hour < end
    return hour >= start or hour < end


@dataclass(frozen=True)
class Deploy:
    """What a policy judges: the model's name and source, and the UTC hour of the change."""

    tenant: str | None
    model: str
    source: str | None
    hour: int
    capacity_class: str = "standard"


def refusals(policy: TenantPolicy | None, deploy: Deploy, *, admin: bool = False) -> list[str]:
    """Pure: why the policy refuses this deploy (empty: allowed). ``admin``: an admin asks."""
    why = []
    listed = policy is not None and policy.allowed_capacity_classes is not None  # judged by the list below
    if deploy.capacity_class == "critical" and not admin and not listed:
        why.append(f"capacity_class 'critical' needs an admin, or {'tenant ' + repr(deploy.tenant) if deploy.tenant else 'a tenant'}"
                   "'s policy naming it in allowed_capacity_classes")
    if policy is None or deploy.tenant is None:
        return why
    if policy.allowed_models is not None and deploy.model not in policy.allowed_models:
        why.append(f"model {deploy.model!r} is not in tenant {deploy.tenant!r}'s allowed_models")
    prefixes = policy.allowed_source_prefixes
    if prefixes is not None and not any(source_under(deploy.source or "", p) for p in prefixes):
        origin = f"comes from {deploy.source!r}" if deploy.source else "has no known source"
        why.append(f"model {deploy.model!r} {origin}, outside tenant {deploy.tenant!r}'s "
                   f"allowed_source_prefixes ({', '.join(prefixes) or 'none'})")
    classes = policy.allowed_capacity_classes
    if classes is not None and deploy.capacity_class not in classes:
        why.append(f"capacity_class {deploy.capacity_class!r} is not in tenant {deploy.tenant!r}'s "
                   f"allowed_capacity_classes ({', '.join(classes) or 'none'})")
    if not hour_allowed(policy.deploy_hour_start, policy.deploy_hour_end, deploy.hour):
        why.append(f"tenant {deploy.tenant!r} deploys only from {policy.deploy_hour_start:02d}:00 to "
                   f"{policy.deploy_hour_end:02d}:00 UTC; it is {deploy.hour:02d}:xx UTC")
    return why




def load(store: Store, tenant: str | None) -> TenantPolicy | None:
    """The tenant's policy (None: it has none); 403 "policy_unreadable" when its record does not
    parse, so a broken policy refuses instead of counting as no policy."""
    if tenant is None:
        return None
    try:
        return RECORDS.get(store, tenant)
    except UnreadableRecord:
        raise Forbidden(f"tenant {tenant!r}'s policy record cannot be read; nothing is deployed for it until an "
                        "admin writes it again (POST /api/ai/policies)", code="policy_unreadable") from None


def list_all(store: Store) -> list[TenantPolicy]:
    """Every policy whose record parses (one that does not is skipped and counted)."""
    return RECORDS.list(store)


def deploy_of(store: Store, tenant: str | None, model: str, now: float | None = None,
              capacity_class: str = "standard") -> Deploy:
    """The Deploy a policy judges, with the model's source read from the store."""
    record = models.stored(store, model)
    source = record.get("source") if record is not None else None
    hour = time.gmtime(time.time() if now is None else now).tm_hour
    return Deploy(tenant, model, source, hour, capacity_class)


def enforce(store: Store, tenant: str | None, model: str, capacity_class: str = "standard", *,
            admin: bool) -> None:
    """403 "policy_refused" naming every reason, for create, scale-up and a class change."""
    why = refusals(load(store, tenant), deploy_of(store, tenant, model, capacity_class=capacity_class), admin=admin)
    if why:
        raise Forbidden("; ".join(why), code="policy_refused")
