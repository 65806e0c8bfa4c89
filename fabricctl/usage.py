"""`fabricctl ai usage`, `ai prices`, `ai budget`, `ai webhook`, `ai notify` (docs/finops.md).

    usage [--since 24h] [--until T] [--by tenant,model] [--granularity hour|day|total]
          [--tenant T] [--key K] [--endpoint E] [--model M] [--csv]
    prices show | set [--gpu-hour X] [--model NAME=IN:OUT[:CACHED] ...] [--currency USD]
    budget set NAME (--tenant T | --key K) --limit N [--metric tokens|cost] [--period day|month]
                    [--action refuse|notify] [--threshold 80 --threshold 100] | list | delete NAME
    webhook set NAME --url URL --secret-file F|- [--format json|slack] [--kind ...] [--tenant T] | list | delete NAME
    notify test [--webhook NAME] | list
"""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

import typer

from fabricctl.output import (
    col,
    emit_json,
    emit_object,
    emit_table,
    fail,
    format_table,
    session,
    when,
)

JSON_OPT = typer.Option(False, "--json", help="print JSON for scripts")
AGO = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}

prices_app = typer.Typer(help="Prices per model (per million tokens) and per GPU-hour.", no_args_is_help=True)
budget_app = typer.Typer(help="Token or cost budgets per tenant or key, per day or month.", no_args_is_help=True)
webhook_app = typer.Typer(help="Webhooks that receive budget notifications and alerts.", no_args_is_help=True)
notify_app = typer.Typer(help="Notifications: send a test, list what was raised.", no_args_is_help=True)


def moment(text: str | None, now: float) -> float | None:
    """"24h" / "30m" / "7d" ago, or epoch seconds; None when not given."""
    if text is None:
        return None
    m = AGO.match(text.strip())
    if m:
        return now - float(m.group(1)) * UNIT_S[m.group(2)]
    try:
        return float(text)
    except ValueError:
        fail(f"{text!r} is not a time: give an age such as 24h, 30m, 7d, or epoch seconds", 2)
        raise


def usage(
    since: str = typer.Option("24h", "--since", help="an age (24h, 7d) or epoch seconds"),
    until: str = typer.Option(None, "--until", help="an age or epoch seconds (default now)"),
    by: str = typer.Option("tenant", "--by", help="comma-separated: tenant, key, endpoint, model, adapter, status"),
    granularity: str = typer.Option("hour", "--granularity", help="hour, day or total"),
    tenant: str = typer.Option(None, "--tenant", help="only this tenant"),
    key: str = typer.Option(None, "--key", help="only this API key id"),
    endpoint: str = typer.Option(None, "--endpoint", help="only this endpoint"),
    model: str = typer.Option(None, "--model", help="only this model"),
    csv: bool = typer.Option(False, "--csv", help="print the CSV export (GET /api/ai/usage?format=csv)"),
    as_json: bool = JSON_OPT,
) -> None:
    """Calls, tokens, GPU-seconds and cost per hour or day from the usage ledger."""
    now = time.time()
    params = {"since": moment(since, now), "until": moment(until, now), "group_by": by, "granularity": granularity,
              "tenant": tenant, "key": key, "endpoint": endpoint, "model": model}
    params = {k: v for k, v in params.items() if v is not None}
    with session({"group_by": "--by"}) as c:
        if csv:
            typer.echo(c.request("GET", "/api/ai/usage", params={**params, "format": "csv"}, text=True), nl=False)
            return
        data = c.request("GET", "/api/ai/usage", params=params)
    if as_json:
        emit_json(data)
        return
    dims = data["group_by"]
    columns = [("START", lambda r: when(r["start"])), *[col(d.upper(), d) for d in dims],
               col("CALLS", "calls"), col("INPUT", "input_tokens"), col("OUTPUT", "output_tokens"),
               col("CACHED", "cached_tokens"), col("GPU_S", "gpu_seconds"), col("COST", "cost")]
    typer.echo(format_table(data["rows"], columns) if data["rows"] else "(no usage)")
    t = data["totals"]
    typer.echo(f"\ntotal: {t['calls']} calls, {t['tokens']} tokens, {t['gpu_seconds']:g} GPU-s, "
               f"cost {t['cost']:g} {data['currency'] or '(no prices set)'}")


@prices_app.command("show")
def prices_show(as_json: bool = JSON_OPT) -> None:
    """The price sheet."""
    with session() as c:
        sheet = c.get("/api/ai/prices")
    if as_json:
        emit_json(sheet)
        return
    typer.echo(f"currency {sheet['currency']}; GPU-hour {sheet['gpu_hour']:g}")
    rows = [{"model": m, **p} for m, p in sorted(sheet["models"].items())]
    typer.echo(format_table(rows, [col("MODEL", "model"), col("INPUT_PER_MTOK", "input_per_mtok"),
                                   col("OUTPUT_PER_MTOK", "output_per_mtok"), col("CACHED_PER_MTOK", "cached_per_mtok")])
               if rows else "(no model prices)")


def model_price(text: str) -> tuple[str, dict]:
    name, _, rest = text.rpartition("=")
    parts = rest.split(":")
    try:
        nums = [float(p) for p in parts]
    except ValueError:
        nums = []
    if not name or len(nums) not in (2, 3):
        fail(f"--model {text!r}: expected NAME=INPUT:OUTPUT[:CACHED] (prices per million tokens)", 2)
    price = {"input_per_mtok": nums[0], "output_per_mtok": nums[1]}
    if len(nums) == 3:
        price["cached_per_mtok"] = nums[2]
    return name, price


@prices_app.command("set")
def prices_set(
    gpu_hour: float = typer.Option(None, "--gpu-hour", help="one GPU for one hour"),
    model: list[str] = typer.Option(None, "--model", help="NAME=INPUT:OUTPUT[:CACHED] per million tokens (repeat)"),
    currency: str = typer.Option(None, "--currency", help="three capital letters (default: the sheet's, else USD)"),
    replace_models: bool = typer.Option(False, "--replace-models", help="drop model prices not given here"),
    as_json: bool = JSON_OPT,
) -> None:
    """Change the price sheet (admin): the options given replace those fields."""
    with session({"gpu_hour": "--gpu-hour", "currency": "--currency", "models": "--model"}) as c:
        sheet = c.get("/api/ai/prices")
        models = {} if replace_models else dict(sheet.get("models") or {})
        models.update(dict(model_price(m) for m in model or []))
        body = {"currency": currency or sheet["currency"],
                "gpu_hour": sheet["gpu_hour"] if gpu_hour is None else gpu_hour, "models": models}
        emit_object(c.put("/api/ai/prices", body), as_json)


BUDGET_COLUMNS = [col("NAME", "name"), col("TENANT", "tenant"), col("KEY", "key"), col("METRIC", "metric"),
                  col("PERIOD", "period"), col("LIMIT", "limit"), col("SPENT", "spent"), col("PERCENT", "percent"),
                  col("ACTION", "action"), col("REFUSING", "refusing")]


@budget_app.command("set")
def budget_set(
    name: str = typer.Argument(..., metavar="NAME", help="a DNS label"),
    tenant: str = typer.Option(None, "--tenant", help="the tenant whose calls count"),
    key: str = typer.Option(None, "--key", help="the API key id whose calls count"),
    limit: float = typer.Option(..., "--limit", help="tokens, or money in the price sheet's currency"),
    metric: str = typer.Option("tokens", "--metric", help="tokens or cost"),
    period: str = typer.Option("month", "--period", help="day or month (UTC)"),
    action: str = typer.Option("notify", "--action", help="at 100%: refuse (429) or notify"),
    threshold: list[int] = typer.Option(None, "--threshold", help="percent that notifies (repeat; default 80 and 100)"),
    as_json: bool = JSON_OPT,
) -> None:
    """Create or replace a budget (admin); the gateways apply it within their cache TTL."""
    body = {"name": name, "tenant": tenant, "key": key, "limit": limit, "metric": metric, "period": period,
            "action": action}
    if threshold:
        body["thresholds"] = list(threshold)
    with session({k: f"--{k}" for k in body} | {"thresholds": "--threshold", "name": "NAME"}) as c:
        emit_object(c.post("/api/ai/budgets", {k: v for k, v in body.items() if v is not None}), as_json)


@budget_app.command("list")
def budget_list(as_json: bool = JSON_OPT) -> None:
    """Every budget with this period's spend."""
    with session() as c:
        emit_table(c.get("/api/ai/budgets"), BUDGET_COLUMNS, as_json)


@budget_app.command("delete")
def budget_delete(name: str = typer.Argument(..., metavar="NAME", help="the budget to remove"), as_json: bool = JSON_OPT) -> None:
    """Remove a budget and its spend."""
    with session() as c:
        emit_object(c.delete(f"/api/ai/budgets/{name}"), as_json)


WEBHOOK_COLUMNS = [col("NAME", "name"), col("URL", "url"), col("FORMAT", "format"), col("KINDS", "kinds"),
                   col("TENANT", "tenant")]


@webhook_app.command("set")
def webhook_set(
    name: str = typer.Argument(..., metavar="NAME", help="a DNS label"),
    url: str = typer.Option(..., "--url", help="http(s) URL the notifications are POSTed to"),
    secret_file: str = typer.Option(..., "--secret-file", help="file holding the signing secret, 16 characters "
                                    "or more ('-': standard input; never on the command line)"),
    format: str = typer.Option("json", "--format", help="json, or slack ({\"text\": ...})"),  # noqa: A002
    kind: list[str] = typer.Option(None, "--kind", help="budget, alert, test (repeat; default all)"),
    tenant: str = typer.Option(None, "--tenant", help="only this tenant's budget notifications"),
    as_json: bool = JSON_OPT,
) -> None:
    """Create or replace a webhook (admin). The secret signs every body: X-Fabric-Signature."""
    try:
        secret = (sys.stdin.read() if secret_file == "-" else Path(secret_file).read_text()).strip()
    except OSError as exc:
        fail(f"cannot read --secret-file: {exc.strerror}", 2)
    if not secret:
        fail("--secret-file is empty: it holds the signing secret (16 characters or more)", 2)
    body = {"name": name, "url": url, "secret": secret, "format": format, "tenant": tenant}
    if kind:
        body["kinds"] = list(kind)
    with session({"url": "--url", "secret": "--secret-file", "format": "--format", "kinds": "--kind",
                  "tenant": "--tenant", "name": "NAME"}) as c:
        emit_object(c.post("/api/ai/webhooks", {k: v for k, v in body.items() if v is not None}), as_json)


@webhook_app.command("list")
def webhook_list(as_json: bool = JSON_OPT) -> None:
    """Every webhook (never its secret)."""
    with session() as c:
        emit_table(c.get("/api/ai/webhooks"), WEBHOOK_COLUMNS, as_json)


@webhook_app.command("delete")
def webhook_delete(name: str = typer.Argument(..., metavar="NAME", help="the webhook to remove"), as_json: bool = JSON_OPT) -> None:
    """Remove a webhook."""
    with session() as c:
        emit_object(c.delete(f"/api/ai/webhooks/{name}"), as_json)


@notify_app.command("test")
def notify_test(webhook: str = typer.Option(None, "--webhook", help="only this webhook (default: every one)"),
                as_json: bool = JSON_OPT) -> None:
    """Send one signed test notification to each webhook now and say what each receiver did."""
    with session() as c:
        out = c.request("POST", "/api/ai/notify/test", params={"webhook": webhook} if webhook else None)
    if as_json:
        emit_json(out)
        return
    for r in out["results"]:
        typer.echo(f"{r['webhook']}: " + ("delivered" if r["delivered"] else f"NOT delivered ({r['error']})"))
    if not all(r["delivered"] for r in out["results"]):
        raise typer.Exit(1)


@notify_app.command("list")
def notify_list(limit: int = typer.Option(50, "--limit", help="newest first"), as_json: bool = JSON_OPT) -> None:
    """Notifications raised, newest first, with each webhook's delivery state."""
    with session() as c:
        rows = c.get("/api/ai/notifications", limit=limit)
    for r in rows:
        r["delivery"] = ", ".join(f"{w}:{d['state']}/{d['attempts']}" for w, d in r["deliveries"].items()) or "-"
    emit_table(rows, [("RAISED", lambda r: when(r["created_at"])), col("ID", "id"), col("SEVERITY", "severity"),
                      col("TITLE", "title"), col("DELIVERY", "delivery")], as_json)
