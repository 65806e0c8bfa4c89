"""Which sites may serve or hold an endpoint's or deployment's replicas: one rule for the
scheduler, the routing planner and the gateway (each passes in what it knows).

Site eligibility (``site_problem``), when a deployment or endpoint sets ``allowed_sites`` or a
``residency``:
  - a replica whose node reports no site ('' or unknown node) is excluded;
  - ``allowed_sites``: the site must be one of them;
  - ``residency`` R: the site's record (POST /api/ai/sites) must have residency R, or the site
    itself be named R (a site that is its own residency needs no record).
With neither set every site, and no site, is eligible.

Site-local spill (``spill``), for endpoints whose strategy is ``site_local`` and that name a
``preferred_site``: the preferred site serves alone while it has room; when every one of its
eligible replicas is saturated (``saturated``), its ``failover_sites`` (from its site record)
serve too, never another site. Only when neither the preferred site nor any failover site has an
eligible replica do the other eligible sites serve, so an endpoint does not go dark because its
preferred site is down; ``allowed_sites``/``residency`` remain the hard limit (docs/sites.md).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from common.schemas import Site

# A replica is saturated when its engine has this many requests waiting, or its KV cache is this
# full: new work would queue there rather than run.
SATURATED_QUEUE = 4.0
SATURATED_KV = 0.9


def residency_of(site: str, sites: Mapping[str, Site]) -> str | None:
    record = sites.get(site)
    return record.residency if record is not None and record.residency else None


def site_problem(site: str | None, allowed_sites: Iterable[str], residency: str | None,
                 sites: Mapping[str, Site]) -> str | None:
    """Why a replica on ``site`` may not serve (or be placed) under these limits, or None."""
    allowed = list(allowed_sites)
    if not allowed and not residency:
        return None
    if not site:
        return "no site (its node reports none: set FABRIC_SITE on the agent) and sites are restricted"
    if allowed and site not in allowed:
        return f"site {site!r} is not in allowed sites {', '.join(allowed)}"
    if residency and site != residency:
        own = residency_of(site, sites)
        if own != residency:
            has = f"its residency is {own!r}" if own else "it has no residency"
            return f"site {site!r} is outside residency {residency!r} ({has})"
    return None


def saturated(queue_depth: float | None, kv_cache_usage: float | None = None) -> bool:
    return (queue_depth or 0.0) >= SATURATED_QUEUE or (kv_cache_usage or 0.0) >= SATURATED_KV


@dataclass(frozen=True)
class Spill:
    """The sites that take new calls now, and why (the same text in every explanation)."""

    serving: frozenset[str] | None  # None: every eligible site
    reason: str
    failover: frozenset[str] = frozenset()

    def excludes(self, site: str | None) -> str | None:
        if self.serving is None or site in self.serving:
            return None
        return f"site_local: site {site!r} does not serve now ({self.reason})"


def spill(preferred: str | None, sites: Mapping[str, Site], candidate_sites: Iterable[str | None],
          saturated_by_site: Mapping[str, bool]) -> Spill:
    """Pure: which sites serve a site_local endpoint.

    ``candidate_sites``: the site of each eligible replica; ``saturated_by_site``: site -> every
    eligible replica there is saturated."""
    if not preferred:
        return Spill(None, "no preferred site: every eligible site serves")
    present = {s for s in candidate_sites if s}
    record = sites.get(preferred)
    failover = frozenset(record.failover_sites) if record is not None else frozenset()
    standby = sorted(failover & present)
    if preferred in present:
        if not saturated_by_site.get(preferred, False):
            return Spill(frozenset({preferred}), f"preferred site {preferred!r} has room", failover)
        if not standby:
            return Spill(frozenset({preferred}), f"preferred site {preferred!r} is saturated and no failover site "
                         "has an eligible replica", failover)
        return Spill(frozenset({preferred, *standby}), f"preferred site {preferred!r} is saturated: spilling to "
                     f"failover site(s) {', '.join(standby)}", failover)
    if standby:
        return Spill(frozenset(standby), f"preferred site {preferred!r} has no eligible replica: failover site(s) "
                     f"{', '.join(standby)} serve", failover)
    return Spill(None, f"neither preferred site {preferred!r} nor its failover sites have an eligible replica: "
                 "every eligible site serves", failover)
