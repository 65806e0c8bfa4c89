"""Who is calling: a ``Principal`` (subject, role, tenant) and what it may see, decided purely.

Roles, weakest to strongest: ``viewer`` (reads), ``operator`` (reads and changes), ``admin``
(everything, every tenant, and the cluster-wide routes: users, policies, nodes, backup...).
A principal with a ``tenant`` is bound to it: it sees and changes only that tenant's objects.
An operator or viewer without a tenant is cluster-wide (today's viewer login is one); an admin
is always cluster-wide, whatever tenant its user record names.

Objects a tenant-bound principal may see (``visible``):
  - an object of its own tenant;
  - a model or profile with no tenant: the shared catalog, readable and usable by reference,
    changeable only by a cluster-wide principal (``writable``);
  - nothing else: another tenant's object, and a tenant-less deployment, endpoint, key or
    event, are as absent (404, never 403, so a name's existence does not leak).
"""

from __future__ import annotations

from dataclasses import dataclass

from common.errors import Forbidden

ADMIN, OPERATOR, VIEWER = "admin", "operator", "viewer"
ROLES = (ADMIN, OPERATOR, VIEWER)
SHARED_KINDS = frozenset({"model", "profile"})  # tenant-less ones form a catalog every tenant reads


@dataclass(frozen=True)
class Principal:
    subject: str
    role: str
    tenant: str | None = None

    @property
    def bound(self) -> bool:
        """True when the principal is limited to one tenant's objects."""
        return self.role != ADMIN and self.tenant is not None

    @property
    def tenant_filter(self) -> str | None:
        return self.tenant if self.bound else None


def visible(principal: Principal, kind: str, tenant: str | None) -> bool:
    """May the principal learn that an object of ``kind`` owned by ``tenant`` exists?"""
    if not principal.bound:
        return True
    if tenant is None:
        return kind in SHARED_KINDS
    return tenant == principal.tenant


def writable(principal: Principal, tenant: str | None) -> bool:
    """May the principal change (or delete) a visible object owned by ``tenant``?"""
    return not principal.bound or tenant == principal.tenant


def claimed_tenant(principal: Principal | None, asked: str | None) -> str | None:
    """The tenant a new object (or an admission check) gets: a bound principal's own when it asks
    for none or the same; another tenant is 403 "tenant_mismatch". None: no user (a webhook)."""
    if principal is None or not principal.bound:
        return asked
    if asked not in (None, principal.tenant):
        raise Forbidden(f"tenant: you act for tenant {principal.tenant!r} and cannot create objects of "
                        f"tenant {asked!r}", code="tenant_mismatch")
    return principal.tenant


def claimed(body, principal: Principal):
    """A create's body (any pydantic model with ``tenant``) with its claimed tenant."""
    tenant = claimed_tenant(principal, body.tenant)
    return body if tenant == body.tenant else body.model_copy(update={"tenant": tenant})
