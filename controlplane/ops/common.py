"""What several operations share: events, references, the stored form of a new record, the
create / delete / mark-Deleting steps every resource family takes the same way, and the agent
clients of an operation that calls agents."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from pydantic import BaseModel

from common.errors import Conflict, NotFound
from common.records import Store
from common.records.events import record_event
from common.records.kinds import BY_KIND
from controlplane.agent_client import AgentClients
from controlplane.state import AppState
from controlplane.tenancy.principal import ADMIN, Principal, visible


@dataclass(frozen=True)
class Deletion:
    """A delete's outcome: ``record`` is None when the record is gone, else the record marked
    Deleting, which the controllers running in this process remove later (the API answers 202)."""
    record: BaseModel | None = None

    @property
    def pending(self) -> bool:
        return self.record is not None


def event(ctx: AppState, kind: str, name: str, action: str, message: str, *, tenant: str | None = None,
          type: str = "Normal") -> None:
    record_event(ctx.store, kind, name, action, message, tenant=tenant, keep=ctx.settings.events_kept,
                 max_age_s=ctx.settings.events_max_age_s, type=type)


@contextlib.asynccontextmanager
async def agents(ctx: AppState) -> AsyncIterator[AgentClients]:
    """The agent clients an operation calls agents with: AppState.agents when set (tests hand in
    their own), else clients from fabricd's PKI, closed when the operation ends."""
    if ctx.agents is not None:
        yield ctx.agents  # type: ignore[misc]
        return
    clients = AgentClients(ctx.state_dir, insecure=ctx.settings.insecure)
    try:
        yield clients
    finally:
        await clients.aclose()


def acting_admin(caller: Principal | None) -> bool:
    """An admin, or fabricd itself (no caller: its controllers, which act on what was admitted)."""
    return caller is None or caller.role == ADMIN


def fresh(resource, status):
    """The stored form of a new resource: server-side creation time and initial status."""
    return resource.model_copy(update={"created_at": time.time(), "status": status})


def stored(store: Store, kind: str, name: str) -> dict:
    """The record as stored; NotFound naming it."""
    found = BY_KIND[kind].stored(store, name)
    if found is None:
        raise NotFound(f"{kind} {name!r} not found")
    return found


def stored_or_none(store: Store, kind: str, name: str) -> dict | None:
    return BY_KIND[kind].stored(store, name)


def stored_list(store: Store, kind: str) -> list[dict]:
    return [value for _, value in BY_KIND[kind].stored_items(store)]


def reference_missing(store: Store, who: Principal, kind: str, name: str) -> bool:
    """True when `name` is absent, or (for a tenant-bound caller) not its tenant's to see."""
    found = BY_KIND[kind].stored(store, name)
    return found is None or not visible(who, kind, found.get("tenant"))


def users_of(records: list[dict], field: str, name: str) -> list[str]:
    """Names of the records whose `field` refers to `name`."""
    return sorted(r["name"] for r in records if r.get(field) == name)


def refuse_if_used(kind: str, name: str, user_kind: str, users: list[str]) -> None:
    if users:
        listed = ", ".join(users)
        raise Conflict(f"{kind} {name!r} is in use by {user_kind} {listed}; delete {'it' if len(users) == 1 else 'them'} "
                       "first", code="in_use")


def create(ctx: AppState, kind: str, resource, message: str):
    """Create-if-absent (409 already_exists) and its "created" event; the record as written."""
    resource = BY_KIND[kind].create(ctx.store, resource)
    event(ctx, kind, resource.name, "created", message, tenant=resource.tenant)
    return resource


def delete(ctx: AppState, kind: str, name: str, tenant: str | None = None) -> Deletion:
    BY_KIND[kind].delete(ctx.store, name)
    event(ctx, kind, name, "deleted", f"{kind} {name} deleted", tenant=tenant)
    return Deletion()


def mark_deleting(ctx: AppState, kind: str, name: str, status: dict):
    """Compare-and-swap ``status`` (phase Deleting) onto the record: (record, newly marked);
    (None, False) when the record went meanwhile (its controller finished)."""
    marked: list[bool] = []

    def mark(record):
        marked[:] = [record.status.phase != "Deleting"]
        if not marked[0]:
            return None
        record.status = record.status.model_copy(update=status)
        return record

    try:
        record = BY_KIND[kind].update(ctx.store, name, mark,
                                      busy=f"{kind} {name!r} changed too often while deleting; try again")
    except NotFound:
        return None, False
    if marked[0]:
        event(ctx, kind, name, "deleting", f"{kind} {name} deletion requested", tenant=record.tenant)
    return record, marked[0]
