"""Pure shaping of API answers into what the templates draw (no I/O; unit-tested)."""

from __future__ import annotations

from collections import defaultdict


def _pct(part: float, whole: float) -> int:
    return 0 if whole <= 0 else max(0, min(100, round(100 * part / whole)))


def capacity_strip(capacity: dict) -> list[dict]:
    """Free/total GPUs, CPU and memory over every node, each with the used share in percent."""
    nodes = capacity.get("nodes", [])
    rows = [
        ("GPUs", capacity.get("gpus_free", 0), capacity.get("gpus_total", 0), ""),
        ("CPU", sum(n.get("cpu_free", 0) for n in nodes), sum(n.get("cpu_allocatable", 0) for n in nodes), " cores"),
        ("Memory", round(sum(n.get("memory_free_gib", 0) for n in nodes), 1),
         round(sum(n.get("memory_allocatable_gib", 0) for n in nodes), 1), " GiB"),
    ]
    return [{"label": label, "free": free, "total": total, "unit": unit, "used_pct": _pct(total - free, total)}
            for label, free, total, unit in rows]


def replicas_by_revision(replicas: list[dict]) -> list[dict]:
    """[{revision, replicas, ready}] newest revision first."""
    groups: dict[int, list[dict]] = defaultdict(list)
    for r in replicas:
        groups[int(r.get("revision", 1))].append(r)
    return [{"revision": rev, "replicas": sorted(groups[rev], key=lambda r: r.get("ordinal", 0)),
             "ready": sum(1 for r in groups[rev] if r.get("ready"))}
            for rev in sorted(groups, reverse=True)]


def weight_bars(routing: dict) -> list[dict]:
    """One bar per replica of an explain-routing answer: weight, share of the largest, reason."""
    entries = routing.get("replicas", [])
    top = max((float(e.get("weight") or 0) for e in entries), default=0.0)
    total = sum(float(e.get("weight") or 0) for e in entries if e.get("included"))
    return [{"replica_id": e.get("replica_id", ""), "weight": e.get("weight") or 0,
             "included": bool(e.get("included")), "reason": e.get("reason", ""),
             "maglev": bool(e.get("maglev")), "width_pct": _pct(float(e.get("weight") or 0), top),
             "share_pct": _pct(float(e.get("weight") or 0), total) if e.get("included") else 0}
            for e in entries]


def gateway_path(endpoint: str) -> str:
    return f"/api/ai/openai/{endpoint}"


def rollout_state(ro: dict) -> str:
    """Where a rollout stands, in words: a finished one says how it ended (never "Succeeded,
    step 1 of 2"), a running canary which step of how many it is on (steps count from 1)."""
    phase, steps = ro.get("phase", ""), ro.get("steps") or []
    if phase == "Succeeded":
        return f"Succeeded: rev {ro.get('to_revision')} serves all traffic"
    if phase == "RolledBack":
        return f"RolledBack: rev {ro.get('from_revision')} serves all traffic"
    if steps:
        return f"{phase}, step {min(int(ro.get('step') or 0) + 1, len(steps))} of {len(steps)}"
    return phase
