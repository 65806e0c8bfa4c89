"""Site operations: record a site (create, or replace the record of that name) and forget one.

A record naming an unrecorded failover site is accepted: sites may be recorded in any order.
Forgetting a record leaves the nodes that report the site where they are. Each change is an event.
"""

from __future__ import annotations

import time

from common.errors import NotFound
from common.records import sites
from common.schemas import Site
from controlplane.ops import common
from controlplane.state import AppState
from controlplane.tenancy.principal import Principal


def put_site(ctx: AppState, caller: Principal | None, body: Site) -> tuple[Site, bool]:
    """(the site as stored, whether a record of that name existed and was replaced)."""
    site = body.model_copy(update={"created_at": time.time()})
    existed = sites.exists(ctx.store, site.name)
    site = sites.put(ctx.store, site)
    detail = f"residency {site.residency or '-'}, cost tier {site.cost_tier:g}, failover " \
             f"{', '.join(site.failover_sites) or '-'}"
    common.event(ctx, "site", site.name, "updated" if existed else "created", f"site {site.name}: {detail}",
                 tenant=site.tenant)
    return site, existed


def delete_site(ctx: AppState, caller: Principal | None, name: str) -> None:
    if not sites.discard(ctx.store, name):
        raise NotFound(f"site {name!r} not found", code="site_not_found")
    common.event(ctx, "site", name, "deleted", f"site {name} deleted")
