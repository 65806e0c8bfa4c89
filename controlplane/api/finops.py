"""Chargeback: GET /api/ai/finops[?window=SECONDS] (controlplane.tenancy.finops). Admin only.

Per deployment and per tenant: GPU-seconds reserved and ready over the last ``window`` seconds
(default 3600, at most 31 days), integrated from the replica lifetime ledger; the tokens the
usage ledger holds for the hours the window touches (common.usage_ledger: whole clock hours), per
deployment (summed over its endpoints) and per tenant (summed over its deployments). Budgets and
their alerts: controlplane.api.usage.
"""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import APIRouter, Depends, Query

from common import usage_ledger
from common.records import deployments, endpoints, lifetimes, usage_docs
from common.records import replicas as replica_records
from common.schemas import Replica
from controlplane.api.answers import FinopsReport
from controlplane.auth import require_admin
from controlplane.state import StateDep
from controlplane.tenancy import finops

router = APIRouter(prefix="/api/ai", tags=["finops"], dependencies=[Depends(require_admin)])


@router.get("/finops", response_model=FinopsReport, response_model_exclude_unset=True)
def get_finops(state: StateDep, window: Annotated[float, Query(gt=0, le=finops.MAX_WINDOW_S,
                                                                 description="seconds back from now")] = 3600) -> dict:
    store, now = state.store, time.time()
    tenants = {d["name"]: d.get("tenant") for d in deployments.RECORDS.readable(store) if "name" in d}
    replicas = [Replica.model_validate(r) for r in replica_records.readable(store)]
    first_hour = usage_ledger.hour_of(now - window)
    counted: dict[str, int] = {}
    for doc in usage_docs.docs(store, first_hour, now):
        for row in doc.rows:
            counted[row.endpoint] = counted.get(row.endpoint, 0) + row.tokens
    dep_tokens: dict[str, int] = {}
    for ep in endpoints.RECORDS.readable(store):
        n = counted.get(ep.get("name", ""), 0)
        if n and ep.get("deployment"):
            dep_tokens[ep["deployment"]] = dep_tokens.get(ep["deployment"], 0) + n
    lives = lifetimes.load(store, now, live={r.replica_id for r in replicas})
    return finops.report(lives, replicas, tenants, dep_tokens, now=now,
                         window_s=window, token_window=(first_hour, int(now) - first_hour))
