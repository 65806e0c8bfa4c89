"""Model copies by site (/fabric/model-sites/<model>/<site>): where a model's bytes are, written by
POST /api/ai/models/{name}/replicate (controlplane.models.replicate decides and pushes). Each
write is validated through ``SiteCopy``; the writer owns the record whole (put)."""

from __future__ import annotations

import time

from pydantic import BaseModel

from common import keyspace
from common.records import cas, reading
from common.store.base import Store


class SiteCopy(BaseModel):
    model: str
    site: str
    phase: str  # Ready | Pending
    message: str
    digest: str | None = None
    via: str | None = None  # node | peer
    updated_at: float = 0.0


def record(store: Store, copy: SiteCopy, now: float | None = None) -> SiteCopy:
    """Write the copy's record, stamped ``updated_at`` (now)."""
    copy = cas.validated(SiteCopy, copy.model_copy(update={"updated_at": time.time() if now is None else now}))
    store.put(keyspace.model_sites(copy.model, copy.site), copy.model_dump_json())
    return copy


def list_copies(store: Store, model: str) -> list[SiteCopy]:
    """The model's copies, by site."""
    return sorted(reading.each(SiteCopy, store.list(keyspace.model_sites(model, "")), "model site copy"),
                  key=lambda c: c.site)
