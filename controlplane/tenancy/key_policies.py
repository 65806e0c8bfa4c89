"""Per-endpoint API key policies, enforced when a key is created and when it is rotated.

A policy (keyspace.key_policies(endpoint), PUT/GET /api/ai/key-policies/{endpoint}) may cap
``max_ttl_secs`` (a key must expire, within that; ttl 0 "never expires" is then refused), list
``required_scopes`` (``model``: the key must be scoped to a model; ``tenant``: it must carry a
tenant) and cap ``max_request_quota`` (a key must have a lifetime request quota, at most that).
``viewer_playground`` lets the viewer role use the console's playground on the endpoint
(controlplane.api.playground_keys); it judges no key.
Rotation keeps a key's fields, so a key made before a stricter policy cannot be rotated: it is
refused naming what to change, and a new key that meets the policy replaces it. No policy: as
before. ``refusals`` is pure; the keys API calls ``enforce``.
"""

from __future__ import annotations

from dataclasses import dataclass

from common.errors import Forbidden, UnreadableRecord
from common.key_policies import KeyPolicy
from common.records.key_policies import RECORDS
from common.store.base import Store


@dataclass(frozen=True)
class KeyShape:
    """The fields of a key a policy judges (from a create body or a stored record)."""

    ttl_secs: int
    model: str | None
    tenant: str | None
    request_quota: int | None


def refusals(policy: KeyPolicy | None, key: KeyShape) -> list[str]:
    if policy is None:
        return []
    why = []
    if policy.max_ttl_secs is not None and not 0 < key.ttl_secs <= policy.max_ttl_secs:
        got = "never expires (ttl_secs 0)" if key.ttl_secs == 0 else f"ttl_secs is {key.ttl_secs}"
        why.append(f"ttl_secs: endpoint {policy.endpoint!r} keys must expire within {policy.max_ttl_secs} s; "
                   f"this key {got}")
    for scope in policy.required_scopes:
        if getattr(key, scope) is None:
            why.append(f"{scope}: endpoint {policy.endpoint!r} keys must be scoped to a {scope}")
    cap = policy.max_request_quota
    if cap is not None and (key.request_quota is None or key.request_quota > cap):
        got = "no request_quota" if key.request_quota is None else f"request_quota {key.request_quota}"
        why.append(f"request_quota: endpoint {policy.endpoint!r} keys need a request_quota of at most {cap}; "
                   f"this key has {got}")
    return why




def load(store: Store, endpoint: str) -> KeyPolicy | None:
    """The endpoint's policy; None when it has none or its record does not parse."""
    try:
        return RECORDS.get(store, endpoint)
    except UnreadableRecord:
        return None


def enforce(store: Store, endpoint: str, key: KeyShape, *, rotating: bool = False) -> None:
    why = refusals(load(store, endpoint), key)
    if why:
        hint = "; create a new key that meets it and delete this one" if rotating else ""
        raise Forbidden("the endpoint's key policy refuses this key: " + "; ".join(why) + hint, code="key_policy")
