"""One base URL for every model: which endpoint a root ``/v1/...`` call goes to, from the body's
``model``, and which models a caller may see.

A name resolves, in this order, to: an alias (common.model_aliases: its endpoint, and the model
name to write into the forwarded body -- the alias's model_name, else the endpoint's deployment's
model), else an endpoint whose deployment serves that model (the name the replicas serve). Only
endpoints the caller may call count (Identity.may_call: a key's one endpoint, an OIDC token's
claim), so an unknown name and another tenant's model get the same 404 ``model_not_found``
that names nothing else. The key's model scope then applies to the resolved model as on the
per-endpoint path.

The catalogue (endpoints, deployments, aliases, models) is read through common.records and cached for the
gateway's cache TTL; resolving and listing are pure functions of it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from common.errors import InvalidInput, NotFound
from common.records import aliases, deployments, endpoints, models
from common.store.base import Store
from gateway.key_auth import Identity
from gateway.refresh_cache import RefreshCache


@dataclass(frozen=True)
class ModelTarget:
    endpoint: str
    upstream_model: str  # the body's model as the replicas must receive it


@dataclass(frozen=True)
class Catalogue:
    endpoint_models: dict[str, str]  # endpoint -> the model its deployment serves
    aliases: dict[str, tuple[str, str | None]]  # alias -> (endpoint, model_name)
    adapters: dict[str, str] = field(default_factory=dict)  # LoRA adapter -> its base model
    descriptions: dict[str, str] = field(default_factory=dict)  # model -> its description (set ones only)


def model_not_found(model: str | None) -> NotFound:
    shown = model if isinstance(model, str) and len(model) <= 128 else "(the requested model)"
    return NotFound(f"the model {shown!r} does not exist or this caller may not use it", code="model_not_found")


def resolve(cat: Catalogue, identity: Identity, model: str | None) -> ModelTarget:
    """Pure: where this caller's call for ``model`` goes; model_not_found (404) otherwise."""
    if not isinstance(model, str) or not model:
        raise InvalidInput("the body must name a model: the gateway's /v1 routes by it", code="model_required")
    alias = cat.aliases.get(model)
    if alias is not None and identity.may_call(alias[0]):
        return ModelTarget(alias[0], alias[1] or cat.endpoint_models.get(alias[0]) or model)
    base = cat.adapters.get(model, model)  # an adapter goes where its base model is served, by its own name
    for endpoint in sorted(cat.endpoint_models):
        if cat.endpoint_models[endpoint] == base and identity.may_call(endpoint):
            return ModelTarget(endpoint, model)
    raise model_not_found(model)


def endpoint_without_model(identity: Identity) -> str:
    """Pure: a root call with no model (a file or batch by id): the caller's only endpoint."""
    if identity.record is not None:
        return identity.record.endpoint
    if identity.endpoints and len(identity.endpoints) == 1 and identity.endpoints[0] != "*":
        return identity.endpoints[0]
    raise InvalidInput("this call names no model and the caller may call several endpoints; use "
                       "/api/ai/openai/{endpoint}/v1/...", code="model_required")


def visible_models(cat: Catalogue, identity: Identity) -> list[str]:
    """Pure: exactly the names this caller may use (a model-scoped key: those that resolve to its model)."""
    names = {m for e, m in cat.endpoint_models.items() if identity.may_call(e)}
    names |= {a for a, (e, _) in cat.aliases.items() if identity.may_call(e)}
    names |= {a for a, base in cat.adapters.items() if base in names}
    scoped = identity.record.model if identity.record else None
    if scoped:
        names = {n for n in names if resolve(cat, identity, n).upstream_model == scoped}
    return sorted(names)


def description_of(cat: Catalogue, name: str) -> str:
    """Pure: the description shown for a listed name: the model's own, an alias's target model's, an
    adapter's base model's; "" when none is set."""
    alias = cat.aliases.get(name)
    if alias is not None:
        name = alias[1] or cat.endpoint_models.get(alias[0]) or name
    return cat.descriptions.get(cat.adapters.get(name, name), "")


def models_page(cat: Catalogue, names: list[str], created: int = 0) -> bytes:
    """The OpenAI list of ``names``; an entry carries ``description`` when its model has one."""
    data = []
    for n in names:
        entry: dict = {"id": n, "object": "model", "created": created, "owned_by": "fabric"}
        described = description_of(cat, n)
        if described:
            entry["description"] = described
        data.append(entry)
    return json.dumps({"object": "list", "data": data}).encode()


def read_catalogue(store: Store) -> Catalogue:
    """The catalogue from the typed records (a record that does not parse is skipped and counted)."""
    served = {d.name: d.model for d in deployments.list(store)}
    endpoint_models = {e.name: served[e.deployment] for e in endpoints.list(store) if served.get(e.deployment)}
    alias_targets = {a.name: (a.endpoint, a.model_name) for a in aliases.list(store)}
    adapters: dict[str, str] = {}
    descriptions: dict[str, str] = {}
    for m in models.list(store):
        adapters.update({a.name: m.name for a in m.adapters})
        if m.description:
            descriptions[m.name] = m.description
    return Catalogue(endpoint_models, alias_targets, adapters, descriptions)


@dataclass
class CatalogueCache:
    store: Store
    ttl_secs: float = 1.0

    def __post_init__(self) -> None:
        # gateway.refresh_cache: one store read per TTL, reloaded ahead of expiry
        self._cache: RefreshCache[Catalogue] = RefreshCache(self.ttl_secs, 1)

    async def get(self) -> Catalogue:
        return await self._cache.get("catalogue", lambda: read_catalogue(self.store))
