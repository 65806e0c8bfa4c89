"""THE table of who may call what: every route of fabricd has exactly one rule here.

HOW TO ADD A RULE (a route without one answers 403 "no_rule", and
tests/controlplane/tenancy/test_route_rules.py walks /openapi.json and fails):
  1. Add ``("METHOD", "/the/route/{template}"): rule`` below, spelled as /openapi.json spells
     the route's path (a converter such as ``{name:path}`` is written ``{name}``), in the
     section of its family.
  2. Pick the rule from the helpers:
       PUBLIC                   no token (login, health, the admission webhook's secret path)
       NODE                     the route authenticates a node itself (mTLS), not a user token
       read(...) / write(...) / admin(...)
                                viewer+operator+admin / operator+admin / admin only
     and how a tenant-bound user (an operator or viewer with a tenant) fares:
       CLUSTER (the default)    refused 403 "cluster_scoped": the route is not tenant-aware
       owned("kind", "param")   the object named by that path parameter must belong to the
                                caller's tenant, else 404 (controlplane.tenancy.owners)
       FILTERED                 a list; its handler keeps the caller's tenant only
       BODY                     a create; its handler gives the body the caller's tenant
  3. A route still reached by a router without ``Depends(require_admin)`` (auth.py, the
     table's enforcer) must be PUBLIC or NODE: the test calls every route with every role.

``decide`` is the pure part of the check; controlplane.auth.require_admin applies it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from controlplane.tenancy.principal import ADMIN, OPERATOR, VIEWER, Principal

CLUSTER, OWNED, FILTERED, BODY = "cluster", "owned", "filtered", "body"
TOKEN_AUTH, PUBLIC_AUTH, NODE_AUTH = "token", "public", "node"


@dataclass(frozen=True)
class Rule:
    roles: frozenset[str] = frozenset()
    auth: str = TOKEN_AUTH
    tenant: str = CLUSTER
    kind: str | None = None  # with OWNED: the object's kind (controlplane.tenancy.owners)
    param: str | None = None  # with OWNED: the path parameter naming it

    @property
    def writes(self) -> bool:
        return VIEWER not in self.roles


@dataclass(frozen=True)
class Refusal:
    code: str
    message: str


def _rule(roles: tuple[str, ...], tenant: str | tuple[str, str]) -> Rule:
    if isinstance(tenant, tuple):
        return Rule(frozenset(roles), tenant=OWNED, kind=tenant[0], param=tenant[1])
    return Rule(frozenset(roles), tenant=tenant)


def read(tenant: str | tuple[str, str] = CLUSTER) -> Rule:
    return _rule((ADMIN, OPERATOR, VIEWER), tenant)


def write(tenant: str | tuple[str, str] = CLUSTER) -> Rule:
    return _rule((ADMIN, OPERATOR), tenant)


def admin() -> Rule:
    return _rule((ADMIN,), CLUSTER)


def owned(kind: str, param: str) -> tuple[str, str]:
    return (kind, param)


PUBLIC = Rule(auth=PUBLIC_AUTH)
NODE = Rule(auth=NODE_AUTH)

RULES: dict[tuple[str, str], Rule] = {
    # -- auth and health -----------------------------------------------------------------------
    ("POST", "/api/auth/login"): PUBLIC,
    ("POST", "/api/auth/oidc"): PUBLIC,  # the identity provider's ID token is the credential
    ("GET", "/api/auth/whoami"): read(FILTERED),
    ("POST", "/api/auth/logout"): read(FILTERED),  # revokes the caller's own token
    ("GET", "/healthz"): PUBLIC,
    # -- models, profiles, deployments, endpoints (controlplane.api.resources) ------------------
    ("GET", "/api/ai/models"): read(FILTERED),
    ("POST", "/api/ai/models"): write(BODY),
    ("GET", "/api/ai/models/{name}"): read(owned("model", "name")),
    ("DELETE", "/api/ai/models/{name}"): write(owned("model", "name")),
    ("GET", "/api/ai/profiles"): read(FILTERED),
    ("POST", "/api/ai/profiles"): write(BODY),
    ("GET", "/api/ai/profiles/{name}"): read(owned("profile", "name")),
    ("DELETE", "/api/ai/profiles/{name}"): write(owned("profile", "name")),
    ("GET", "/api/ai/deployments"): read(FILTERED),
    ("POST", "/api/ai/deployments"): write(BODY),
    ("GET", "/api/ai/deployments/{name}"): read(owned("deployment", "name")),
    ("POST", "/api/ai/deployments/{name}/scale"): write(owned("deployment", "name")),
    ("DELETE", "/api/ai/deployments/{name}"): write(owned("deployment", "name")),
    ("GET", "/api/ai/endpoints"): read(FILTERED),
    ("POST", "/api/ai/endpoints"): write(BODY),
    ("GET", "/api/ai/endpoints/{name}"): read(owned("endpoint", "name")),
    ("DELETE", "/api/ai/endpoints/{name}"): write(owned("endpoint", "name")),
    # -- per-deployment and per-endpoint detail ------------------------------------------------
    ("GET", "/api/ai/explain/placement/{deployment}"): read(owned("deployment", "deployment")),
    ("GET", "/api/ai/explain/routing/{endpoint}"): read(owned("endpoint", "endpoint")),
    ("GET", "/api/ai/deployments/{name}/metrics"): read(owned("deployment", "name")),
    ("POST", "/api/ai/deployments/{name}/drain"): write(owned("deployment", "name")),
    ("POST", "/api/ai/deployments/{name}/restart"): write(owned("deployment", "name")),
    ("GET", "/api/ai/deployments/{name}/revisions"): read(owned("deployment", "name")),
    ("POST", "/api/ai/deployments/{name}/revisions"): write(owned("deployment", "name")),
    ("GET", "/api/ai/deployments/{name}/revisions/{revision}"): read(owned("deployment", "name")),
    ("POST", "/api/ai/deployments/{name}/rollouts"): write(owned("deployment", "name")),
    ("POST", "/api/ai/deployments/{name}/rollout"): write(owned("deployment", "name")),
    ("GET", "/api/ai/deployments/{name}/rollouts"): read(owned("deployment", "name")),
    ("GET", "/api/ai/deployments/{name}/rollouts/{rollout_id}"): read(owned("deployment", "name")),
    ("POST", "/api/ai/deployments/{name}/rollouts/{rollout_id}/{action}"): write(owned("deployment", "name")),
    ("GET", "/api/ai/explain/rollout/{deployment}"): read(owned("deployment", "deployment")),
    ("PUT", "/api/ai/deployments/{name}/autoscaling"): write(owned("deployment", "name")),
    ("GET", "/api/ai/explain/scaling/{name}"): read(owned("deployment", "name")),
    # -- model supply (controlplane.api.models) -------------------------------------------------
    ("GET", "/api/ai/model-jobs"): read(),
    ("GET", "/api/ai/models/{name}/status"): read(owned("model", "name")),
    ("POST", "/api/ai/models/{name}/materialize"): write(owned("model", "name")),
    ("POST", "/api/ai/models/{name}/verify"): write(owned("model", "name")),
    ("POST", "/api/ai/models/cache/evict"): admin(),
    # -- site-to-site model copy (controlplane.api.model_copy, controlplane.api.model_blobs) -------
    ("POST", "/api/ai/models/{name}/replicate"): write(owned("model", "name")),
    ("GET", "/api/ai/models/{name}/sites"): read(owned("model", "name")),
    # the receiving fabricd: authenticated by FABRIC_REPLICATE_TOKEN (404 when unset), not a user token
    ("PUT", "/api/ai/models/{name}/blobs/{digest}"): PUBLIC,
    # -- keys and audit -------------------------------------------------------------------------
    ("POST", "/api/ai/keys"): write(BODY),
    ("GET", "/api/ai/keys"): read(FILTERED),
    ("GET", "/api/ai/keys/{ref}"): read(owned("key", "ref")),
    ("DELETE", "/api/ai/keys/{ref}"): write(owned("key", "ref")),
    ("POST", "/api/ai/keys/{ref}/rotate"): write(owned("key", "ref")),
    # a viewer only where the key policy allows it (controlplane.api.playground_keys)
    ("POST", "/api/ai/endpoints/{name}/playground-key"): read(owned("endpoint", "name")),
    ("DELETE", "/api/ai/endpoints/{name}/playground-key/{key_id}"): read(owned("endpoint", "name")),
    # agent runtime credentials: keys with a TTL, renewed and revoked (controlplane.api.agent_credentials)
    ("POST", "/api/ai/endpoints/{name}/credentials"): write(owned("endpoint", "name")),
    ("POST", "/api/ai/endpoints/{name}/credentials/{key_id}/refresh"): write(owned("endpoint", "name")),
    ("DELETE", "/api/ai/endpoints/{name}/credentials/{key_id}"): write(owned("endpoint", "name")),
    ("GET", "/api/ai/audit/verify"): read(),
    # -- events ---------------------------------------------------------------------------------
    ("GET", "/api/ai/events"): read(FILTERED),
    ("GET", "/api/ai/watch/{family}"): read(),
    ("GET", "/api/ai/explain/failure/{replica}"): read(),
    # -- cluster: nodes, GPUs, MIG, capacity, replicas -----------------------------------------
    ("GET", "/api/ai/nodes"): read(),
    ("GET", "/api/ai/nodes/{node_id}"): read(),
    ("POST", "/api/ai/nodes"): NODE,
    ("POST", "/api/ai/nodes/{node_id}/heartbeat"): NODE,
    ("POST", "/api/ai/nodes/{node_id}/observations"): NODE,  # its engines (agent.engine_watch)
    ("POST", "/api/ai/nodes/{node_id}/certificate"): admin(),
    ("POST", "/api/ai/join-tokens"): admin(),  # node join (controlplane.api.node_join)
    ("GET", "/api/ai/join-tokens"): admin(),
    ("GET", "/api/ai/join/ca"): PUBLIC,
    ("POST", "/api/ai/join"): PUBLIC,  # the join token in the body is the credential
    ("POST", "/api/ai/nodes/{node_id}/renew"): NODE,
    ("PUT", "/api/ai/nodes/{node_id}/identity"): admin(),
    ("PUT", "/api/ai/nodes/{node_id}/role"): admin(),
    ("POST", "/api/ai/nodes/{node_id}/drain"): admin(),
    ("POST", "/api/ai/nodes/{node_id}/uncordon"): admin(),
    ("DELETE", "/api/ai/nodes/{node_id}"): admin(),
    ("GET", "/api/ai/gpus"): read(),
    ("GET", "/api/ai/nodes/{node_id}/mig"): read(),
    ("POST", "/api/ai/nodes/{node_id}/mig"): admin(),
    ("POST", "/api/ai/nodes/{node_id}/gpus/{bdf}/mig"): admin(),
    ("DELETE", "/api/ai/nodes/{node_id}/mig/{slice_id}"): admin(),
    ("GET", "/api/ai/capacity"): read(),
    ("GET", "/api/ai/capacity/fit"): read(),
    ("GET", "/api/ai/replicas"): read(),
    ("GET", "/api/ai/replicas/{replica_id}"): read(),
    ("GET", "/api/ai/replicas/{replica_id}/logs"): read(),
    # -- sites (controlplane.api.sites) -------------------------------------------------------------
    ("GET", "/api/ai/sites"): read(),
    ("POST", "/api/ai/sites"): admin(),
    ("GET", "/api/ai/sites/{name}"): read(),
    ("DELETE", "/api/ai/sites/{name}"): admin(),
    # -- finops (controlplane.api.finops): cluster-wide chargeback ---------------------------------
    ("GET", "/api/ai/finops"): read(),
    # -- usage, cost, budgets, notifications (controlplane.api.usage) ------------------------------
    ("GET", "/api/ai/usage"): read(FILTERED),
    ("GET", "/api/ai/prices"): read(),
    ("PUT", "/api/ai/prices"): admin(),
    ("GET", "/api/ai/budgets"): read(FILTERED),
    ("POST", "/api/ai/budgets"): admin(),
    ("DELETE", "/api/ai/budgets/{name}"): admin(),
    ("GET", "/api/ai/webhooks"): admin(),
    ("POST", "/api/ai/webhooks"): admin(),
    ("DELETE", "/api/ai/webhooks/{name}"): admin(),
    ("POST", "/api/ai/notify/test"): admin(),
    ("GET", "/api/ai/notifications"): admin(),
    # -- batches, aliases -----------------------------------------------------------------------
    ("POST", "/api/ai/batches"): write(),
    ("GET", "/api/ai/batches"): read(),
    ("GET", "/api/ai/batches/{batch_id}"): read(),
    ("POST", "/api/ai/batches/{batch_id}/claim"): write(),
    ("POST", "/api/ai/batches/{batch_id}/finish"): write(),
    ("POST", "/api/ai/batches/{batch_id}/cancel"): write(),
    ("DELETE", "/api/ai/batches/{batch_id}"): write(),
    ("POST", "/api/ai/aliases"): write(),
    ("GET", "/api/ai/aliases"): read(),
    ("GET", "/api/ai/aliases/{name}"): read(),
    ("DELETE", "/api/ai/aliases/{name}"): write(),
    # -- documents (fabricctl ai apply) ---------------------------------------------------------
    ("GET", "/api/ai/kinds"): read(),
    ("GET", "/api/ai/documents/{kind}"): read(),
    ("GET", "/api/ai/documents/{kind}/{name}"): read(),
    ("POST", "/api/ai/apply"): admin(),
    # -- tenancy: quotas, users, policies, key policies, admission -------------------------------
    ("POST", "/api/ai/users"): admin(),
    ("GET", "/api/ai/users"): admin(),
    ("GET", "/api/ai/users/{name}"): admin(),
    ("DELETE", "/api/ai/users/{name}"): admin(),
    ("POST", "/api/ai/policies"): admin(),
    ("GET", "/api/ai/policies"): read(FILTERED),
    ("PUT", "/api/ai/key-policies/{endpoint}"): admin(),
    ("GET", "/api/ai/key-policies/{endpoint}"): read(owned("endpoint", "endpoint")),
    ("POST", "/api/ai/tenant-limits"): admin(),
    ("GET", "/api/ai/tenant-limits"): read(FILTERED),
    ("DELETE", "/api/ai/tenant-limits/{tenant}"): admin(),
    # -- identity mappings for the gateway's OIDC callers (controlplane/api/identity.py) --
    ("POST", "/api/ai/identity-mappings"): admin(),
    ("GET", "/api/ai/identity-mappings"): read(),
    ("GET", "/api/ai/identity-mappings/{name}"): read(),
    ("DELETE", "/api/ai/identity-mappings/{name}"): admin(),
    ("POST", "/api/ai/admit"): read(BODY),  # a check: it changes nothing
    ("POST", "/api/ai/admit/{token}"): PUBLIC,  # the token in the path is the credential
    ("POST", "/api/ai/quotas"): admin(),
    ("GET", "/api/ai/quotas"): read(),
    ("POST", "/api/ai/backup"): admin(),
    ("POST", "/api/ai/restore"): admin(),
}


_CONVERTER = re.compile(r"\{(\w+):\w+\}")


def rule_for(method: str, path: str) -> Rule | None:
    """The rule of a route template (Starlette's ``{name:path}`` read as ``{name}``); HEAD follows GET."""
    return RULES.get(("GET" if method == "HEAD" else method, _CONVERTER.sub(r"{\1}", path)))


def decide(rule: Rule, principal: Principal) -> Refusal | None:
    """Pure: why ``principal`` may not call a route with ``rule`` (None: it may; an OWNED
    rule's object is checked after this, by controlplane.tenancy.owners)."""
    if principal.role not in rule.roles:
        if principal.role == VIEWER and rule.writes:
            return Refusal("read_only", f"the {principal.role} account is read-only; "
                                        "sign in as an operator or admin to change anything")
        return Refusal("forbidden", f"the {principal.role} role may not call this route; it needs "
                                    f"{' or '.join(sorted(rule.roles)) or 'no user token'}")
    if rule.tenant == CLUSTER and principal.bound:
        return Refusal("cluster_scoped", "this route is cluster-wide; a user bound to a tenant may not call it")
    return None
