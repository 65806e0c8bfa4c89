"""Usage, cost, budgets and notifications (docs/finops.md).

    GET    /api/ai/usage              the usage ledger summed per hour/day and per tenant, key, endpoint,
                                      model, adapter or status, with GPU-seconds and cost; ?format=csv
                                      (a tenant-bound caller sees its own tenant's only)
    GET    /api/ai/prices             the price sheet;  PUT /api/ai/prices  replaces it (admin)
    GET    /api/ai/budgets            budgets with this period's spend (a tenant-bound caller: its own)
    POST   /api/ai/budgets            set a budget (create or replace; admin)
    DELETE /api/ai/budgets/{name}     remove it and its spend (admin)
    GET    /api/ai/webhooks           receivers, never their secrets (admin)
    POST   /api/ai/webhooks           set one (admin);  DELETE /api/ai/webhooks/{name}
    POST   /api/ai/notify/test        one signed test notification to each webhook now (admin)
    GET    /api/ai/notifications      raised notifications and each webhook's delivery (admin)
"""

from __future__ import annotations

import time
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Query
from fastapi.responses import PlainTextResponse, Response

from common import budgets as budget_model
from common.budgets import Budget
from common.errors import NotFound
from common.notifications import Webhook
from common.prices import PriceSheet
from common.records import budgets as budget_records
from common.records import notifications as notification_records
from common.records import prices as price_records
from common.records import webhooks
from controlplane.auth import PrincipalDep, require_admin
from controlplane.ops import finops as finops_ops
from controlplane.state import StateDep
from controlplane.tenancy import notifier
from controlplane.tenancy import usage as usage_report

router = APIRouter(prefix="/api/ai", tags=["usage"], dependencies=[Depends(require_admin)])


@router.get("/usage", response_model=None)
def get_usage(
    state: StateDep, who: PrincipalDep,
    since: Annotated[float | None, Query(description="epoch seconds; default 24 hours ago")] = None,
    until: Annotated[float | None, Query(description="epoch seconds; default now")] = None,
    granularity: Literal["hour", "day", "total"] = "hour",
    group_by: Annotated[str, Query(description="comma-separated: tenant, key, endpoint, model, adapter, status")] = "tenant",
    tenant: str | None = None, key: str | None = None, endpoint: str | None = None, model: str | None = None,
    format: Literal["json", "csv"] = "json",  # noqa: A002 - the query parameter's name
) -> dict | Response:
    now = time.time()
    filters = {k: v for k, v in (("tenant", tenant), ("key", key), ("endpoint", endpoint), ("model", model))
               if v is not None}
    if who.tenant is not None and who.bound:
        filters["tenant"] = who.tenant  # a tenant-bound caller reads its own tenant's usage only
    query = usage_report.UsageQuery(
        since=now - 86400 if since is None else since, until=now if until is None else until,
        granularity=granularity, group_by=tuple(g.strip() for g in group_by.split(",") if g.strip()),
        filters=filters)
    report = usage_report.report(state.store, query, now)
    if format == "csv":
        return PlainTextResponse(usage_report.to_csv(report), media_type="text/csv",
                                 headers={"content-disposition": 'attachment; filename="fabric-usage.csv"'})
    return report


@router.get("/prices", response_model=PriceSheet)
def get_prices(state: StateDep) -> dict:
    sheet = price_records.read(state.store)
    return (sheet or PriceSheet(updated_at=0)).model_dump(mode="json")


@router.put("/prices", response_model=PriceSheet)
def put_prices(body: PriceSheet, state: StateDep) -> dict:
    return finops_ops.set_prices(state, body).model_dump(mode="json")


@router.get("/budgets")
def list_budgets(state: StateDep, who: PrincipalDep) -> list[dict]:
    now = time.time()
    spend = budget_records.spends(state.store, now)
    out = []
    for b in budget_records.list(state.store):
        if who.bound and b.tenant != who.tenant:
            continue
        units = spend.get(b.name, 0)
        used = units / budget_model.MICRO if b.metric == "cost" else units
        start, end = budget_model.period_bounds(b.period, now)
        out.append({**b.model_dump(mode="json"), "spent": used, "percent": round(100 * units / b.units(), 2),
                    "period_start": start, "period_end": end,
                    "refusing": b.action == "refuse" and units >= b.units()})
    return out


@router.post("/budgets", status_code=201, response_model=Budget)
def put_budget(body: Budget, state: StateDep) -> dict:
    return finops_ops.put_budget(state, body).model_dump(mode="json")


@router.delete("/budgets/{name}")
def delete_budget(name: str, state: StateDep) -> dict:
    finops_ops.delete_budget(state, name)
    return {"kind": "budget", "name": name, "deleted": True}


@router.get("/webhooks")
def list_webhooks(state: StateDep) -> list[dict]:
    return [w.shown() for w in webhooks.list(state.store)]


@router.post("/webhooks", status_code=201)
def put_webhook(body: Webhook, state: StateDep) -> dict:
    return finops_ops.put_webhook(state, body).shown()


@router.delete("/webhooks/{name}")
def delete_webhook(name: str, state: StateDep) -> dict:
    finops_ops.delete_webhook(state, name)
    return {"kind": "webhook", "name": name, "deleted": True}


@router.post("/notify/test")
async def notify_test(state: StateDep, webhook: str | None = None) -> dict:
    hooks = [w for w in webhooks.list(state.store) if webhook is None or w.name == webhook]
    if not hooks:
        raise NotFound(f"webhook {webhook!r} not found" if webhook else "no webhook is set (POST /api/ai/webhooks)")
    outcomes = await notifier.send_test(state.store, hooks, time.time())
    return {"results": [{"webhook": o.webhook, "delivered": o.ok, "error": o.error or None} for o in outcomes]}


@router.get("/notifications")
def list_notifications(state: StateDep, limit: Annotated[int, Query(ge=1, le=1000)] = 100) -> list[dict]:
    notes = sorted(notification_records.list(state.store), key=lambda n: n.created_at, reverse=True)[:limit]
    return [n.model_dump(mode="json") for n in notes]
