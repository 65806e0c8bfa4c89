"""The REST API's routers, gathered in one place for controlplane.app.create_app.

Always present: auth (POST /api/auth/login), resources (models, profiles, deployments,
endpoints) and events. Other modules join by existing: `controlplane.api.keys`,
`controlplane.api.nodes`, `controlplane.api.orchestration`, `controlplane.api.rollouts`,
`controlplane.api.scaling` and `controlplane.api.quotas` are included when importable,
each exposing an APIRouter named `router` (and maybe `public_routers`, whose routes
authenticate without a user token: the route table names them PUBLIC). Such a module declares its own auth, normally
`dependencies=[Depends(controlplane.auth.require_admin)]` (node heartbeats, say, may use mTLS
instead). A module that is absent is skipped; one that fails to import for another reason
(a missing dependency, a syntax error) fails fabricd's start loudly rather than hiding routes.
"""

from __future__ import annotations

import importlib

from fastapi import APIRouter

OPTIONAL_MODULES = ("keys", "nodes", "orchestration", "rollouts", "batches", "backup", "mig", "models", "apply",
                    "scaling", "quotas", "replicas", "aliases", "sites", "finops", "tenancy",
                    "model_copy", "model_blobs", "capacity_fit", "node_join", "identity", "tenant_limits", "playground_keys",
                    "node_drain", "usage", "agent_credentials")


def routers() -> list[APIRouter]:
    from controlplane import auth
    from controlplane.api import events, resources

    found = [auth.router, resources.router, events.router]
    for name in OPTIONAL_MODULES:
        qualified = f"controlplane.api.{name}"
        try:
            module = importlib.import_module(qualified)
        except ModuleNotFoundError as exc:
            if exc.name != qualified:
                raise
            continue
        found.append(module.router)
        found.extend(getattr(module, "public_routers", ()))  # routes authenticated otherwise
    return found
