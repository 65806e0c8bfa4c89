"""etcd's users and roles for Fabric, and the idempotent setup behind `fabricd store init-auth`.

One etcd user per process kind, each with the role of the same name:
  - ``fabricd``: read and write on all of ``/fabric/`` (it owns every record);
  - ``gateway``: read on what a gateway routes and authenticates with (endpoints, deployments,
    models, profiles, replicas, nodes, sites, observations, revisions, rollouts, the published
    routing plans, model aliases, identity mappings, tenant limits, API key records and their
    prefix index, budgets, the price sheet), read and write on
    what it counts and records (counters: limits, slots, usage; demand: cold starts; events; the
    audit chain; the usage ledger; budget notifications). It cannot read ``/fabric/auth/`` (the admin-token key), ``/fabric/users/`` or join
    tokens, and cannot write a deployment, a key or a node;
  - ``root``: etcd's administrator, used only by init-auth itself (and operators' etcdctl).

``plan_role`` is the pure step (the permissions to grant and revoke so a role holds exactly what
ROLES says); ``init_auth`` reads etcd, applies the plans, adds missing users (a random password
written 0600 to the password directory on first run, or earlier by ``make_passwords``; an existing
file is kept) and turns auth on. A second run changes nothing.
"""

from __future__ import annotations

import base64
import secrets
from dataclasses import dataclass
from pathlib import Path

from common.errors import StoreAccessDenied
from common.keyspace import ROOT
from common.private_fs import private_dir, write_private
from common.store.etcd_access import EtcdAccess
from common.store.etcd_store import EtcdStore

READ, WRITE, READWRITE = "READ", "WRITE", "READWRITE"
USERS = ("root", "fabricd", "gateway")

GATEWAY_READS = ("endpoints/", "deployments/", "models/", "profiles/", "replicas/", "nodes/", "sites/",
                 "observations/", "revisions/", "rollouts/", "routing-plans/", "model-aliases/", "identity-mappings/",
                 "tenant-limits/", "keys/", "key-prefixes/", "budgets/", "prices")
GATEWAY_WRITES = ("counters/", "demand/", "events/", "audit/", "usage/", "notifications/")
REVISION_PROBE = f"{ROOT}/.revision-probe"  # EtcdStore.revision() reads it


@dataclass(frozen=True, order=True)
class Perm:
    """A permission on the keys from `key` up to `range_end` ("" = that one key)."""

    key: str
    range_end: str
    type: str


def prefix_end(prefix: str) -> str:
    """etcd's range end for a prefix: its last byte plus one (the prefixes here are ASCII)."""
    return prefix[:-1] + chr(ord(prefix[-1]) + 1)


def _prefix(p: str, kind: str) -> Perm:
    return Perm(p, prefix_end(p), kind)


ROLES: dict[str, frozenset[Perm]] = {
    "fabricd": frozenset({_prefix(f"{ROOT}/", READWRITE)}),
    "gateway": frozenset({*(_prefix(f"{ROOT}/{p}", READ) for p in GATEWAY_READS),
                          *(_prefix(f"{ROOT}/{p}", READWRITE) for p in GATEWAY_WRITES),
                          Perm(REVISION_PROBE, "", READ)}),
}


def plan_role(current: frozenset[Perm], wanted: frozenset[Perm]) -> tuple[list[Perm], list[Perm]]:
    """(grant, revoke) turning `current` into `wanted`. etcd revokes by key range whatever its
    type, so a range held with another type is revoked and granted again."""
    return sorted(wanted - current), sorted(current - wanted)


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _unb64(data: str | None) -> str:
    return base64.b64decode(data or "").decode()


def _perms(role: dict) -> frozenset[Perm]:
    # the JSON gateway omits fields at their zero value: permType READ, an empty range_end
    return frozenset(Perm(_unb64(p.get("key")), _unb64(p.get("range_end")), p.get("permType", READ))
                     for p in role.get("perm") or [])


def _password(password_dir: Path, user: str, *, write: bool = True) -> tuple[str, bool]:
    """(USER's password, whether it is new): read from USER.password, else made (and written 0600
    when `write`)."""
    path = password_dir / f"{user}.password"
    if path.exists():
        return path.read_text().strip(), False
    value = secrets.token_urlsafe(24)
    if write:
        write_private(path, value.encode() + b"\n")
    return value, True


def make_passwords(password_dir: Path) -> list[str]:
    """USER.password (0600) for every user in USERS that has none, before etcd runs (`fabricd
    store passwords`), so every control-plane host can be given the same ones; returns the users
    whose password was made."""
    private_dir(password_dir)
    return [user for user in USERS if _password(password_dir, user)[1]]


def init_auth(url_endpoints: list[tuple[str, int]], tls: EtcdAccess, password_dir: Path, *,
              apply: bool = True) -> list[str]:
    """Make etcd's users and roles match USERS/ROLES and turn auth on; returns what changed.

    `tls` carries the CA and a client certificate (its login fields are ignored). Passwords live
    in `password_dir` as USER.password (0600); root's must be there once auth is on. With
    `apply=False` nothing is written (to etcd or to `password_dir`): the list says what a run
    would change (`fabricd store init-auth --check`)."""
    if apply:
        private_dir(password_dir)
    changes: list[str] = []
    anonymous = EtcdAccess(ca=tls.ca, cert=tls.cert, key=tls.key)
    store = EtcdStore(*url_endpoints[0], endpoints=url_endpoints, access=anonymous)
    try:
        store.auth_call("/auth/user/list", {})
        enabled = False
    except StoreAccessDenied as exc:
        if "has authentication on" not in exc.message:
            raise
        enabled = True
    finally:
        store.close()
    root_pw, root_new = _password(password_dir, "root", write=False)
    if enabled and root_new:
        raise StoreAccessDenied(f"etcd has authentication on and {password_dir}/root.password is missing: "
                                "put root's password there to change users and roles")
    if root_new and apply:
        write_private(password_dir / "root.password", root_pw.encode() + b"\n")
    admin = EtcdAccess(ca=tls.ca, cert=tls.cert, key=tls.key, user="root" if enabled else "", password=root_pw)
    store = EtcdStore(*url_endpoints[0], endpoints=url_endpoints, access=admin)

    def call(path: str, body: dict, change: str) -> None:
        changes.append(change)
        if apply:
            store.auth_call(path, body)

    try:
        users = set(store.auth_call("/auth/user/list", {}).get("users") or [])
        roles = set(store.auth_call("/auth/role/list", {}).get("roles") or [])
        for user in USERS:
            password, new = (root_pw, root_new) if user == "root" else _password(password_dir, user, write=apply)
            if user not in users:
                call("/auth/user/add", {"name": user, "password": password}, f"user {user} added")
            elif new:
                call("/auth/user/changepw", {"name": user, "password": password},
                     f"user {user}: password set from a new {user}.password")
        for role, wanted in ROLES.items():
            current: frozenset[Perm] = frozenset()
            if role not in roles:
                call("/auth/role/add", {"name": role}, f"role {role} added")
            else:
                current = _perms(store.auth_call("/auth/role/get", {"role": role}))
            grant, revoke = plan_role(current, wanted)
            for p in revoke:
                call("/auth/role/revoke", {"role": role, "key": _b64(p.key), "range_end": _b64(p.range_end)},
                     f"role {role}: revoked {p.type} {p.key}")
            for p in grant:
                call("/auth/role/grant", {"name": role, "perm": {
                    "permType": p.type, "key": _b64(p.key), "range_end": _b64(p.range_end)}},
                    f"role {role}: granted {p.type} {p.key}" + ("*" if p.range_end else ""))
        for user in USERS:
            held = set(store.auth_call("/auth/user/get", {"name": user}).get("roles") or []) if user in users else set()
            if user not in held:
                call("/auth/user/grant", {"user": user, "role": user}, f"user {user}: role {user} granted")
        if not enabled:
            call("/auth/enable", {}, "authentication enabled")
    finally:
        store.close()
    return changes
