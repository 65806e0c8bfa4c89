"""Usage-and-cost writes: the price sheet, budgets and webhooks (every write an event).

A budget's spend counter is the gateways' (common.budgets); replacing a budget keeps it, so a
raised limit lets a refused tenant call again within the gateways' cache TTL. Deleting a budget
deletes its counter.
"""

from __future__ import annotations

import time

from common.budgets import Budget
from common.notifications import Webhook
from common.prices import PriceSheet
from common.records import budgets as budget_records
from common.records import prices as price_records
from common.records import webhooks as webhook_records
from controlplane.ops import common
from controlplane.state import AppState


def set_prices(ctx: AppState, sheet: PriceSheet) -> PriceSheet:
    sheet = price_records.write(ctx.store, sheet.model_copy(update={"updated_at": time.time()}))
    common.event(ctx, "prices", "prices", "PricesSet",
                 f"gpu_hour {sheet.gpu_hour:g} {sheet.currency}, {len(sheet.models)} model prices")
    return sheet


def put_budget(ctx: AppState, body: Budget) -> Budget:
    b = budget_records.put(ctx.store, body.model_copy(update={"updated_at": time.time()}))
    scope = f"key {b.key}" if b.key else f"tenant {b.tenant}"
    common.event(ctx, "budget", b.name, "BudgetSet",
                 f"budget {b.name}: {scope} {b.limit:g} {b.metric} per {b.period}, at 100% {b.action}",
                 tenant=b.tenant)
    return b


def delete_budget(ctx: AppState, name: str) -> None:
    b = budget_records.require(ctx.store, name)
    budget_records.delete(ctx.store, name)
    budget_records.forget(ctx.store, name)
    common.event(ctx, "budget", name, "BudgetDeleted", f"budget {name} removed", tenant=b.tenant)


def put_webhook(ctx: AppState, body: Webhook) -> Webhook:
    w = webhook_records.put(ctx.store, body.model_copy(update={"updated_at": time.time()}))
    common.event(ctx, "webhook", w.name, "WebhookSet", f"webhook {w.name} ({w.format}) for {', '.join(w.kinds)}",
                 tenant=w.tenant)
    return w


def delete_webhook(ctx: AppState, name: str) -> None:
    w = webhook_records.require(ctx.store, name)
    webhook_records.delete(ctx.store, name)
    common.event(ctx, "webhook", name, "WebhookDeleted", f"webhook {name} removed", tenant=w.tenant)
