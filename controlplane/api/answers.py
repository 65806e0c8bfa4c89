"""Small answer shapes shared by several routes, declared as ``response_model`` so the OpenAPI
document says what each route answers (and the schema fuzzing checks the bodies against it)."""

from __future__ import annotations

from pydantic import BaseModel


class Deleted(BaseModel):
    """A record deleted (``deleted`` false: marked Deleting, its controller removes it)."""
    kind: str
    name: str
    deleted: bool = True


class NameDeleted(BaseModel):
    name: str
    deleted: bool = True


class KeyDeleted(BaseModel):
    id: str
    name: str
    deleted: bool = True


class Drained(BaseModel):
    deployment: str
    drained: list[str]
    delete_after: float


class Restarted(BaseModel):
    deployment: str
    previous_phase: str | None
    previous_failures: int
    last_failure: str


class AuditCheck(BaseModel):
    ok: bool
    rows: int
    bad_seq: int | None
    reason: str
