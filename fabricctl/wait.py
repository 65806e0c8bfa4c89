"""`--wait [--timeout]` for deploy, scale, expose and delete: follow one record through fabricd's
store watch (GET /api/ai/watch/{family}, a long poll) until a condition holds.

A condition is a pure function of the record (None once deleted) returning (done, why): done
True stops the wait, done None stops it as failed (a Failed phase), False keeps waiting and `why`
says what is still missing (printed when the timeout passes). The timeout exits 1 naming it.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import typer

from fabricctl.client import ClientError, FabricClient

Condition = Callable[[dict | None], tuple[bool | None, str]]
WAIT_OPT = typer.Option(False, "--wait", help="return only when it is done (see --timeout)")
TIMEOUT_OPT = typer.Option(300.0, "--timeout", min=1, help="seconds --wait waits before giving up (exit 1)")
POLL_S = 20.0  # one long poll; the server answers as soon as something changes


def deployment_ready(record: dict | None) -> tuple[bool | None, str]:
    if record is None:
        return None, "the deployment was deleted"
    status = record.get("status") or {}
    want, ready = record.get("replicas", 0), status.get("ready_replicas", 0)
    if status.get("phase") == "Failed":
        return None, f"deployment failed: {status.get('message', '')}"
    if ready == want and status.get("replicas", want) == want:
        return True, f"{ready}/{want} replicas ready"
    return False, f"{ready}/{want} replicas ready ({status.get('phase', '')}: {status.get('message', '')})"


def endpoint_ready(record: dict | None) -> tuple[bool | None, str]:
    if record is None:
        return None, "the endpoint was deleted"
    status = record.get("status") or {}
    if status.get("phase") == "Failed":
        return None, f"endpoint failed: {status.get('message', '')}"
    if status.get("vip"):
        return True, f"VIP {status['vip']}"
    return False, f"no VIP yet ({status.get('message', '')})"


def gone(record: dict | None) -> tuple[bool | None, str]:
    if record is None:
        return True, "deleted"
    status = record.get("status") or {}
    return False, f"still {status.get('phase', 'present')}: {status.get('message', '')}"


def _fetch(client: FabricClient, family: str, name: str) -> dict | None:
    try:
        return client.get(f"/api/ai/{family}/{name}")
    except ClientError as exc:
        if exc.status == 404:
            return None
        raise


def wait_until(client: FabricClient, family: str, name: str, condition: Condition, timeout: float,
               echo=typer.echo) -> dict | None:
    """Block until condition(record) is done; exits 1 on failure or timeout."""
    revision = client.get(f"/api/ai/watch/{family}", revision=0)["revision"]
    record = _fetch(client, family, name)
    deadline = time.monotonic() + timeout
    last = ""
    while True:
        done, why = condition(record)
        if why != last:
            echo(f"{family[:-1]} {name}: {why}", err=True)
            last = why
        if done:
            return record
        if done is None:
            typer.echo(f"error: {why}", err=True)
            raise typer.Exit(1)
        left = deadline - time.monotonic()
        if left <= 0:
            typer.echo(f"error: timed out after {timeout:g}s waiting for {family[:-1]} {name}: {why}", err=True)
            raise typer.Exit(1)
        poll = min(POLL_S, max(1.0, left))
        answer = client.request("GET", f"/api/ai/watch/{family}", params={"revision": revision, "timeout": poll},
                                timeout=poll + 10)
        revision = answer["revision"]
        for change in answer["changes"]:
            if change["name"] == name:
                record = change["value"] if change["type"] == "put" else None
