"""A per-tenant ``cache_salt`` in every generating call sent to a replica (issue 37): vLLM
shares prefix-cache blocks only between requests with the same salt, so one tenant cannot time
another's cached prompts. The salt is derived from the tenant (a credential without one: its own
subject), the same on every gateway, and always overrides a salt the client sent (a client
naming another tenant's salt would share that tenant's cache). The parsed body carries it too,
so the routing hash (gateway.engine_hash) folds it in as vLLM does. External providers get the
body unsalted (cache_salt is vLLM's field).
"""

from __future__ import annotations

import hashlib
from dataclasses import replace

from gateway.request_body import BodyInfo, with_field

SALTED_ROUTES = ("/v1/chat/completions", "/v1/completions")


def salt_for(tenant: str | None, subject: str) -> str:
    who = f"t:{tenant}" if tenant else f"c:{subject}"
    return hashlib.blake2b(who.encode(), digest_size=16, person=b"fabric-salt").hexdigest()


def salted(info: BodyInfo, body: bytes, path: str, tenant: str | None, subject: str) -> BodyInfo:
    """``info`` with the forwarded body (and its parsed data) carrying the caller's salt."""
    data = info.data
    if data is None or path.rstrip("/") not in SALTED_ROUTES:
        return info
    salt = salt_for(tenant, subject)
    if data.get("cache_salt") == salt:
        return info
    sent = info.body if info.body is not None else body
    return replace(info, body=with_field(sent, data, "cache_salt", salt), data={**data, "cache_salt": salt})
