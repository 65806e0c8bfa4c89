"""Local users of the control plane: name, role, tenant and an Argon2id password hash.

Stored at keyspace.users(name) with create-if-absent (two creates of one name: one wins, 409).
The password is hashed with argon2-cffi's defaults (Argon2id, a random salt per hash) and never
stored, logged, echoed or put in an event; a user record shown by the API drops the hash.
``admin`` and ``viewer`` are the file-backed logins of `fabricd init` (controlplane.auth) and
cannot be user names. A login for a name with no record still runs one hash verification
(against a fixed dummy hash), so the answer's timing does not say which names exist.
Each hash takes 64 MiB (Argon2id's memory cost, the library default); at most HASH_SLOTS run at
once per process, so a flood of logins queues instead of taking the thread pool's worth of memory.
"""

from __future__ import annotations

import threading
import time

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError, VerifyMismatchError
from pydantic import BaseModel, Field, field_validator

from common import keyspace
from common.errors import InvalidInput
from common.records.resource import Records
from common.schemas import DNS_LABEL, Spec, tenant_name
from common.store.base import Store
from controlplane.tenancy.principal import ADMIN, ROLES, Principal

RESERVED = frozenset({"admin", "viewer"})
MIN_PASSWORD, MAX_PASSWORD = 12, 1024
HASH_SLOTS = 4
_HASHER = PasswordHasher()
_DUMMY_HASH = _HASHER.hash("fabric-no-such-user-dummy")
_SLOTS = threading.BoundedSemaphore(HASH_SLOTS)


def _hash(password: str) -> str:
    with _SLOTS:
        return _HASHER.hash(password)


class UserCreate(Spec):
    name: str = Field(..., description="a DNS label; not admin or viewer")
    role: str = Field(..., description="admin, operator or viewer")
    tenant: str | None = Field(None, description="the tenant this user is bound to (none: cluster-wide)")
    password: str = Field(..., min_length=MIN_PASSWORD, max_length=MAX_PASSWORD, repr=False)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not DNS_LABEL.match(v):
            raise ValueError("a DNS label: 1-63 lowercase letters, digits or '-'")
        if v in RESERVED:
            raise ValueError(f"{v!r} is fabricd's own login (`fabricd init`); pick another name")
        return v

    @field_validator("role")
    @classmethod
    def _role(cls, v: str) -> str:
        if v not in ROLES:
            raise ValueError(f"role {v!r}: one of {', '.join(ROLES)}")
        return v

    @field_validator("tenant")
    @classmethod
    def _tenant(cls, v: str | None) -> str | None:
        return None if v is None else tenant_name(v)


class UserRecord(BaseModel):
    name: str
    role: str
    tenant: str | None = None
    password_hash: str = Field(..., repr=False)
    created_at: float = Field(default_factory=time.time)

    def public(self) -> dict:
        return self.model_dump(exclude={"password_hash"})

    def principal(self) -> Principal:
        return Principal(self.name, self.role, None if self.role == ADMIN else self.tenant)


# The user records (/fabric/users/<name>), through the record layer's one typed door.
RECORDS = Records(UserRecord, keyspace.users, "user")


def create(store: Store, body: UserCreate) -> UserRecord:
    if body.role == ADMIN and body.tenant is not None:
        raise InvalidInput("tenant: an admin sees every tenant; leave tenant out or pick operator or viewer",
                           code="admin_with_tenant")
    record = UserRecord(name=body.name, role=body.role, tenant=body.tenant, password_hash=_hash(body.password))
    return RECORDS.create(store, record)  # Conflict "already_exists" when the name is taken


def get(store: Store, name: str) -> UserRecord | None:
    return RECORDS.get(store, name)


def list_all(store: Store) -> list[UserRecord]:
    return RECORDS.list(store)


def delete(store: Store, name: str) -> None:
    RECORDS.delete(store, name)  # NotFound "user 'NAME' not found"


def verify(store: Store, name: str, password: str) -> Principal | None:
    """The user's principal when the password is right; None otherwise (same work either way)."""
    record = get(store, name) if DNS_LABEL.match(name) else None
    try:
        with _SLOTS:
            _HASHER.verify(record.password_hash if record else _DUMMY_HASH, password)
    except (VerifyMismatchError, VerificationError, InvalidHashError):
        return None
    return record.principal() if record else None
