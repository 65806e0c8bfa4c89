"""Maglev weights (1-32) from replica observations: eligibility, the ten strategies, the plan.

Eligible means Ready, not draining, and scraped successfully within ``max_age_s`` (30 s); a
failed or stale scrape excludes the replica rather than reading its zeros as idle. When the
endpoint sets ``allowed_sites`` or ``residency`` a replica outside them (or with no site) is
excluded for every strategy (common.sites.site_problem, the gateway's rule too). ``site_local``
with a ``preferred_site`` then keeps only the sites common.sites.spill says serve now: the
preferred site while it has room, plus its failover sites once it is saturated.
``cost_optimized`` reads each replica's site's ``cost_tier`` (lower is cheaper; a site without a
record is tier 1).

Each strategy maps a candidate to a score in [0, 1] (1 is best), and the weight is
``1 + round(31 * score)``. Relative strategies (TTFT, throughput, cost, energy) compare each
replica with the best among the candidates, so one faster engine gets 32 and one twice as slow
about 16. A replica with no traffic in the scrape window has no TTFT or failure share and is
scored as best for those (it is idle, not broken); for throughput it scores 0 unless nobody
has traffic.

Maglev backends are the included replicas whose host is an IPv4 address on a node that is not
the dry-run driver; others (hostnames, dry-run engines) are left to the gateway.

A draining replica (scale-in, rollout step, blue/green switch, deletion, failed health, node
drain: every removal goes through the drain) is excluded from new traffic but stays in the pushed
service as a draining backend with weight 0: the dataplane gives it no table slots and keeps its
established flows on it (BACKEND_DRAINING). Leaving it out of the service instead would re-pick
those flows onto another backend, which resets them. It leaves the service only when its record
is deleted (after the engine reported nothing running, or the grace).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from common.engine_metrics import material
from common.engine_metrics.hold import describe
from common.schemas import InferenceEndpoint, Node, Replica, ReplicaObservation, Site
from common.sites import saturated, site_problem, spill

MAX_WEIGHT = 32
MIN_WEIGHT = 1
MAX_SCRAPE_AGE_S = material.MAX_SCRAPE_AGE_S
# Every Ready replica's page failed or is stale (fabricd cut off from them, or all busy): each gets
# this weight, so the VIP keeps taking connections on health alone.
UNREAD_WEIGHT = 16


@dataclass(frozen=True)
class Candidate:
    replica_id: str
    obs: ReplicaObservation
    site: str | None = None
    cost_tier: float = 1.0
    power_w: float | None = None  # the replica's GPUs' draw from the node heartbeat, None = unknown


@dataclass(frozen=True)
class RoutingEntry:
    replica_id: str
    included: bool
    reason: str
    weight: int = 0
    host: str | None = None
    port: int = 8000
    in_maglev: bool = False
    metrics: dict = field(default_factory=dict)
    draining: bool = False  # weight 0, kept in the service for its established flows


@dataclass(frozen=True)
class RoutingPlan:
    endpoint: str
    strategy: str
    entries: tuple[RoutingEntry, ...]

    @property
    def weights(self) -> dict[str, int]:
        return {e.replica_id: e.weight for e in self.entries if e.included}

    @property
    def backends(self) -> tuple[tuple[str, int, int], ...]:
        """(ip, port, weight) for Maglev, draining ones at weight 0, sorted so equal plans compare equal."""
        return tuple(sorted((e.host, e.port, e.weight if e.included else 0) for e in self.entries
                            if e.in_maglev and e.host is not None and (e.included or e.draining)))

    @property
    def draining(self) -> tuple[str, ...]:
        """"ip:port" of the Maglev backends that take no new flows but keep their established ones."""
        return tuple(sorted(f"{e.host}:{e.port}" for e in self.entries if e.in_maglev and e.draining
                            and not e.included))


def to_weight(score: float) -> int:
    score = min(1.0, max(0.0, score))
    return MIN_WEIGHT + round((MAX_WEIGHT - MIN_WEIGHT) * score)


def _relative_low(values: Sequence[float | None]) -> list[float]:
    """Lower is better; None (no data) scores best."""
    known = [v for v in values if v is not None]
    best = min(known) if known else None
    out = []
    for v in values:
        if v is None or best is None or v <= 0:
            out.append(1.0)
        else:
            out.append(best / v if best > 0 else 0.0)
    return out


def _queue(c: Candidate) -> float:
    return 1.0 / (1.0 + max(0.0, c.obs.queue_depth))


def _free_kv(c: Candidate) -> float:
    """Free KV cache; a runtime that does not report KV use is scored by its queue instead
    (an absent gauge is never read as an empty cache)."""
    if "kv_cache" in c.obs.missing:
        return _queue(c)
    return 1.0 - min(1.0, max(0.0, c.obs.kv_cache_usage))


def s_equal(cands: Sequence[Candidate], endpoint: InferenceEndpoint) -> list[float]:
    return [0.0 for _ in cands]  # weight 1 each: Maglev spreads evenly


def s_least_queue(cands, endpoint):
    return [_queue(c) for c in cands]


def s_lowest_ttft(cands, endpoint):
    return _relative_low([c.obs.ttft_p50_s for c in cands])


def s_most_free_vram(cands, endpoint):
    return [_free_kv(c) for c in cands]


def s_weighted_capacity(cands, endpoint):
    return [(_queue(c) + _free_kv(c)) / 2 for c in cands]


def s_site_local(cands, endpoint):
    """Preferred-site replicas get the upper band (8-32 by capacity), the others left serving
    (failover sites, once the preferred one is saturated) 1-8."""
    out = []
    for c in cands:
        cap = (_queue(c) + _free_kv(c)) / 2
        if endpoint.preferred_site is None or c.site == endpoint.preferred_site:
            out.append((7 + 24 * cap) / 31)
        else:
            out.append(7 * cap / 31)
    return out


def s_cost_optimized(cands, endpoint):
    return _relative_low([c.cost_tier for c in cands])


def s_energy_optimized(cands, endpoint):
    """Joules per generated token when every candidate reports power and throughput; else the
    lower KV-cache pressure (a less loaded GPU draws less per extra request)."""
    if cands and all(c.power_w and c.obs.tokens_per_s for c in cands):
        return _relative_low([c.power_w / c.obs.tokens_per_s for c in cands])
    return [_free_kv(c) for c in cands]


def s_highest_throughput(cands, endpoint):
    values = [c.obs.tokens_per_s or 0.0 for c in cands]
    top = max(values, default=0.0)
    if top <= 0:
        return [1.0 for _ in cands]
    return [v / top for v in values]


def s_lowest_failure(cands, endpoint):
    return [1.0 - (c.obs.failure_ratio or 0.0) for c in cands]


STRATEGIES: dict[str, Callable[[Sequence[Candidate], InferenceEndpoint], list[float]]] = {
    "equal": s_equal,
    "least_queue": s_least_queue,
    "lowest_ttft": s_lowest_ttft,
    "most_free_vram": s_most_free_vram,
    "weighted_capacity": s_weighted_capacity,
    "site_local": s_site_local,
    "cost_optimized": s_cost_optimized,
    "energy_optimized": s_energy_optimized,
    "highest_throughput": s_highest_throughput,
    "lowest_failure": s_lowest_failure,
}


def weights(strategy: str, cands: Sequence[Candidate], endpoint: InferenceEndpoint) -> dict[str, int]:
    scores = STRATEGIES[strategy](cands, endpoint)
    return {c.replica_id: to_weight(s) for c, s in zip(cands, scores)}


def is_ipv4(host: str | None) -> bool:
    try:
        return host is not None and ipaddress.ip_address(host).version == 4
    except ValueError:
        return False


def exclusion(
    replica: Replica, obs: ReplicaObservation | None, site: str | None, endpoint: InferenceEndpoint,
    now: float, max_age_s: float = MAX_SCRAPE_AGE_S, sites: Mapping[str, Site] | None = None,
) -> str | None:
    if not replica.ready:
        return f"not ready ({replica.phase})"
    if replica.draining:
        return "draining"
    where = site_problem(site, endpoint.allowed_sites, endpoint.residency, sites or {})
    if where:
        return where
    if obs is None:
        return "never scraped"
    return page_problem(obs, now, max_age_s)


def page_problem(obs: ReplicaObservation, now: float, max_age_s: float = MAX_SCRAPE_AGE_S) -> str | None:
    """Why a replica's last /metrics page cannot be read for routing (failed or stale), or None."""
    if not obs.ok:
        return f"last scrape failed: {obs.error}"
    if now - obs.scraped_at > max_age_s:
        return f"last scrape is {now - obs.scraped_at:.0f}s old"
    return None


def _maglev_backend(endpoint: InferenceEndpoint, r: Replica, node: Node | None, vip: str | None) -> bool:
    return (is_ipv4(r.host) and not (node is not None and node.vm_driver == "dry-run")
            and dsr_problem(endpoint, r, vip) is None)


def draining_entry(endpoint: InferenceEndpoint, r: Replica, obs: ReplicaObservation | None, node: Node | None,
                   vip: str | None, why: str = "") -> RoutingEntry:
    """A draining (or stalled) replica: no new traffic, weight 0, kept in the Maglev service while
    its VM runs (until its record goes) so its established flows keep their backend."""
    keep = r.phase != "Deleting" and _maglev_backend(endpoint, r, node, vip)
    why = why or (f"draining ({r.message})" if r.message else "draining")
    if keep:
        why += ": weight 0 in Maglev, its established flows stay"
    return RoutingEntry(r.replica_id, False, why, 0, r.host, r.port, keep, _metrics(obs), draining=keep)


def _metrics(obs: ReplicaObservation | None) -> dict:
    if obs is None:
        return {}
    return obs.model_dump(exclude={"replica_id"})


SIGNALS = {  # strategy -> (what the weight was computed from, observation field)
    "least_queue": ("queue", "queue_depth"),
    "lowest_ttft": ("TTFT p50 s", "ttft_p50_s"),
    "most_free_vram": ("KV cache used", "kv_cache_usage"),
    "weighted_capacity": ("KV cache used", "kv_cache_usage"),
    "highest_throughput": ("tokens/s", "tokens_per_s"),
    "lowest_failure": ("failure ratio", "failure_ratio"),
}


MISSING_READING = {"queue_depth": "queue", "kv_cache_usage": "kv_cache", "ttft_p50_s": "ttft",
                   "tokens_per_s": "tokens", "failure_ratio": "failures"}
GAP_RULE = {  # what a strategy does when the runtime lacks its reading (docs/runtimes.md)
    "kv_cache": "scored by queue instead",
    "ttft": "no TTFT reading: scored as best, so replicas share equally",
    "tokens": "no token counter: replicas share equally",
    "failures": "no error counter: scored as no failures",
    "queue": "no queue gauge: scored as an empty queue",
}


def _signal(strategy: str, obs: ReplicaObservation | None) -> str:
    """' from queue 40' and the like, so a reason says which reading set the weight; when the
    runtime lacks that reading, says so and how the gap was treated."""
    label, field = SIGNALS.get(strategy, ("", ""))
    gap = MISSING_READING.get(field)
    if obs is not None and gap and gap in obs.missing:
        return f" (runtime reports no {gap.replace('_', ' ')}: {GAP_RULE[gap]})"
    value = getattr(obs, field, None) if obs is not None and field else None
    if obs is None or value is None:
        return ""
    return f" from {label} {value:.3g}" + (describe(obs) if field == "queue_depth" else "")


def _local_sites(cands: list[Candidate], endpoint: InferenceEndpoint, sites: Mapping[str, Site],
                 excluded: list[RoutingEntry], by_id: Mapping[str, Replica]) -> tuple[list[Candidate], str]:
    """site_local: the candidates on sites that serve now (the others join ``excluded``), and why."""
    full: dict[str, bool] = {}
    for c in cands:
        if c.site:
            full[c.site] = full.get(c.site, True) and saturated(c.obs.queue_depth, c.obs.kv_cache_usage)
    decision = spill(endpoint.preferred_site, sites, [c.site for c in cands], full)
    kept = []
    for c in cands:
        why = decision.excludes(c.site)
        if why is None:
            kept.append(c)
            continue
        r = by_id[c.replica_id]
        excluded.append(RoutingEntry(c.replica_id, False, why, 0, r.host, r.port, False, _metrics(c.obs)))
    return kept, decision.reason


def dsr_problem(endpoint: InferenceEndpoint, r: Replica, vip: str | None) -> str | None:
    """Why a replica cannot be a dsr-ipip backend of ``endpoint`` (None: it can, or nat).

    Its VM must hold the VIP (decapsulation and the VIP on loopback are set up when it is
    created, from VmCreateRequest.dsr_vips) and serve on the VIP's port (the agent refuses
    another port)."""
    if endpoint.forwarding != "dsr-ipip":
        return None
    if vip is None or vip not in r.dsr_vips:
        return f"its VM was created without VIP {vip or '(none yet)'} for dsr-ipip; a replacement replica gets it"
    if r.port != endpoint.port:
        return f"dsr-ipip needs the replica on port {endpoint.port}, it serves on {r.port}"
    return None


def plan_routing(
    endpoint: InferenceEndpoint,
    replicas: Sequence[Replica],
    observations: Mapping[str, ReplicaObservation],
    nodes: Mapping[str, Node],
    now: float,
    *,
    sites: Mapping[str, Site] | None = None,
    max_age_s: float = MAX_SCRAPE_AGE_S,
    vip: str | None = None,
) -> RoutingPlan:
    """Weights for one endpoint's replicas, with the reason for each inclusion or exclusion.

    ``sites`` maps site name -> its record (residency, failover sites, cost tier); ``vip`` is
    the endpoint's VIP (default: its status's), which a dsr-ipip backend must have been made with."""
    sites = sites or {}
    vip = vip or endpoint.status.vip
    excluded: list[RoutingEntry] = []
    cands: list[Candidate] = []
    by_id: dict[str, Replica] = {}
    unread: list[tuple[Replica, Node | None, ReplicaObservation, str]] = []
    for r in sorted(replicas, key=lambda r: r.replica_id):
        node = nodes.get(r.node)
        site = node.site if node else None
        obs = observations.get(r.replica_id)
        if r.draining:
            excluded.append(draining_entry(endpoint, r, obs, node, vip))
            continue
        if obs is not None and obs.ok and obs.stalled and r.ready:
            stalled = (f"stalled: {obs.running:g} requests running, no generated tokens since "
                       f"{now - (obs.stalled_since or now):.0f}s ago")
            excluded.append(draining_entry(endpoint, r, obs, node, vip, stalled))
            continue
        why = exclusion(r, obs, site, endpoint, now, max_age_s, sites)
        if why and obs is not None and why == page_problem(obs, now, max_age_s):
            # Ready (its health checks pass) but its page did not come, or not lately: a busy engine
            # answers /metrics late. Never read as idle; below, no new flows while another replica
            # has a fresh page, and its established flows keep their backend either way.
            unread.append((r, node, obs, why))
            continue
        if why:
            excluded.append(RoutingEntry(r.replica_id, False, why, 0, r.host, r.port, False, _metrics(obs)))
            continue
        assert obs is not None  # exclusion() refuses a replica never scraped
        power = None
        if node is not None:
            draws = [g.power_w for g in node.gpus if g.pci in r.gpus and g.power_w > 0]
            power = sum(draws) if draws and len(draws) == len(r.gpus) else None
        tier = sites[site].cost_tier if site and site in sites else 1.0
        cands.append(Candidate(r.replica_id, obs, site, tier, power))
        by_id[r.replica_id] = r
    spill_note = ""
    if endpoint.routing == "site_local":
        cands, why = _local_sites(cands, endpoint, sites, excluded, by_id)
        spill_note = f" ({why})"
    chosen = weights(endpoint.routing, cands, endpoint) if cands else {}
    included = []
    for c in cands:
        r = by_id[c.replica_id]
        node = nodes.get(r.node)
        maglev = is_ipv4(r.host) and not (node is not None and node.vm_driver == "dry-run")
        reason = f"{endpoint.routing}: weight {chosen[c.replica_id]}{_signal(endpoint.routing, c.obs)}{spill_note}"
        if not maglev:
            reason += " (gateway only: dry-run or hostname backend)"
        elif (dsr_why := dsr_problem(endpoint, r, vip)) is not None:
            maglev = False
            reason += f" (gateway only: {dsr_why})"
        included.append(
            RoutingEntry(c.replica_id, True, reason, chosen[c.replica_id], r.host, r.port, maglev, _metrics(c.obs))
        )
    for r, node, obs, why in unread:
        if cands:  # leaving the service would re-pick its flows onto another backend: kept at weight 0
            excluded.append(draining_entry(endpoint, r, obs, node, vip, why))
        else:  # no replica has a fresh page: new flows still go somewhere, evenly
            included.append(RoutingEntry(r.replica_id, True, f"{why}; no replica has a fresh page: equal weight "
                                         f"{UNREAD_WEIGHT}", UNREAD_WEIGHT, r.host, r.port,
                                         _maglev_backend(endpoint, r, node, vip), _metrics(obs)))
    entries = tuple(sorted(included + excluded, key=lambda e: e.replica_id))
    return RoutingPlan(endpoint.name, endpoint.routing, entries)
