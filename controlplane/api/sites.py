"""Sites (common.schemas.Site; docs/sites.md). Admin only.

    GET    /api/ai/sites          every site record, with the nodes that report it
    POST   /api/ai/sites          record a site (create, or replace the record of that name)
    GET    /api/ai/sites/{id}     one site, with its nodes
    DELETE /api/ai/sites/{id}     forget a site record

A site exists for scheduling as soon as a node reports it (FABRIC_SITE on the agent); its record
adds what a node cannot say: residency, cost tier, failover sites, peer_url, fail_closed_unix.
Deleting the record leaves the nodes where they are (their site then has no residency, tier 1,
no failover). A record naming an unrecorded failover site is accepted: sites may be recorded in
any order.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, Response

from common.errors import NotFound
from common.records import nodes, sites
from common.schemas import Node, Site
from controlplane.api.answers import Deleted, SiteView
from controlplane.auth import PrincipalDep, require_admin
from controlplane.ops import sites as site_ops
from controlplane.state import AppState, StateDep

router = APIRouter(prefix="/api/ai", tags=["sites"], dependencies=[Depends(require_admin)])


def _nodes_by_site(state: AppState) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for _, record in nodes.stored_items(state.store):
        try:
            node = Node.model_validate(record)
        except ValueError:
            continue
        out.setdefault(node.site, []).append(node.id)
    return {site: sorted(ids) for site, ids in out.items()}


def _view(site: Site, nodes: dict[str, list[str]]) -> dict:
    return {**site.model_dump(mode="json"), "nodes": nodes.get(site.name, [])}


@router.get("/sites", response_model=list[SiteView])
def list_sites(state: StateDep) -> list[dict]:
    by_site = _nodes_by_site(state)
    return [_view(s, by_site) for s in sorted(sites.list(state.store), key=lambda s: s.name)]


@router.post("/sites", status_code=201, response_model=SiteView,
             responses={200: {"description": "the site existed and was replaced"}})
def put_site(body: Site, state: StateDep, response: Response, who: PrincipalDep) -> dict:
    site, existed = site_ops.put_site(state, who, body)
    if existed:
        response.status_code = 200
    return _view(site, _nodes_by_site(state))


@router.get("/sites/{name}", response_model=SiteView)
def get_site(name: str, state: StateDep) -> dict:
    site = sites.get(state.store, name)
    if site is None:
        raise NotFound(f"site {name!r} not found", code="site_not_found")
    return _view(site, _nodes_by_site(state))


@router.delete("/sites/{name}", response_model=Deleted)
def delete_site(name: str, state: StateDep, who: PrincipalDep) -> dict:
    site_ops.delete_site(state, who, name)
    return {"kind": "site", "name": name, "deleted": True}
