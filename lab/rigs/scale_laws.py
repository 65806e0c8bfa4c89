"""Growth laws, limits and targets from lab.rigs.scale runs (pure functions of their results).

A growth law is the slope of log(figure) against log(size) fitted by least squares over the runs
of one sweep: about 1 grows with the fleet, 0 stays flat, 2 grows with its square. Figures that
are zero at every size have slope 0 ("never"); a figure zero at some sizes only is fitted over the
others. The limit of a loop is the largest measured fleet whose pass took at most half the loop's
period of one core's CPU (the leader runs every loop on one asyncio thread), and the fleet the fit
predicts would reach that half period.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

# loop -> (its period in seconds, the figure that must fit half of it)
PERIODS = {"routing": 10.0, "reconcile": 15.0, "gateway": 0.5}
LAW_FIGURES: dict[str, Callable[[dict], float]] = {
    "routing_cpu_s": lambda r: r["routing"]["busy"]["cpu_s"],
    "routing_max_stall_s": lambda r: r["routing"]["busy"]["max_stall_s"],
    "routing_store_writes_busy": lambda r: r["routing"]["busy"]["store_writes"],
    "routing_store_writes_change": lambda r: r["routing"]["change"]["store_writes"],
    "routing_store_writes_idle": lambda r: r["routing"]["idle"]["store_writes"],
    "routing_push_services_change": lambda r: r["routing"]["change"]["push_services"],
    "routing_push_requests_change": lambda r: r["routing"]["change"]["push_requests"],
    "routing_push_services_idle": lambda r: r["routing"]["idle"]["push_services"],
    "routing_store_reads_busy": lambda r: r["routing"]["busy"]["store_reads"],
    "routing_engine_connections": lambda r: r["routing"]["busy"]["engine_connections"],
    "routing_engine_requests": lambda r: r["routing"]["busy"]["engine_requests"],
    "reconcile_cpu_s": lambda r: r["reconcile"]["steady"]["cpu_s"],
    "reconcile_max_stall_s": lambda r: r["reconcile"]["steady"]["max_stall_s"],
    "reconcile_engine_connections": lambda r: r["reconcile"]["steady"]["engine_connections"],
    "gateway_refresh_s": lambda r: r["gateway"]["refresh"]["wall_s"],
    "gateway_refresh_cpu_s": lambda r: r["gateway"]["refresh"]["cpu_s"],
    "gateway_store_reads": lambda r: r["gateway"]["refresh"]["store_reads"],
}
LOOP_CPU = {"routing": "routing_cpu_s", "reconcile": "reconcile_cpu_s", "gateway": "gateway_refresh_cpu_s"}


def slope(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Least-squares slope of log y on log x over the points with y > 0; None with fewer than two."""
    pts = [(math.log(x), math.log(y)) for x, y in zip(xs, ys) if x > 0 and y > 0]
    if len({x for x, _ in pts}) < 2:
        return 0.0 if all(y == 0 for y in ys) and len(ys) >= 2 else None
    mx = sum(x for x, _ in pts) / len(pts)
    my = sum(y for _, y in pts) / len(pts)
    den = sum((x - mx) ** 2 for x, _ in pts)
    return sum((x - mx) * (y - my) for x, y in pts) / den


def fit(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float] | None:
    """(a, k) of y = a * x**k over the points with y > 0, or None."""
    k = slope(xs, ys)
    pts = [(x, y) for x, y in zip(xs, ys) if x > 0 and y > 0]
    if k is None or not pts:
        return None
    log_a = sum(math.log(y) - k * math.log(x) for x, y in pts) / len(pts)
    return math.exp(log_a), k


def laws(runs: Sequence[dict], by: str) -> dict[str, float | None]:
    """Each LAW_FIGURES figure's slope over ``runs`` against ``by`` ("replicas" or "endpoints")."""
    runs = sorted(runs, key=lambda r: r[by])
    xs = [float(r[by]) for r in runs]
    return {name: None if s is None else round(s, 2)
            for name, get in LAW_FIGURES.items() for s in [slope(xs, [float(get(r)) for r in runs])]}


def limits(runs: Sequence[dict]) -> dict:
    """Per loop: the largest measured fleet (nodes) within half its period of CPU, and the fleet the
    fit over replicas predicts reaches it (nodes, at the runs' replicas per node and endpoints)."""
    runs = sorted(runs, key=lambda r: r["replicas"])
    out: dict[str, dict] = {}
    per_node = runs[0]["per_node"] if runs else 8
    for loop, figure in LOOP_CPU.items():
        half = PERIODS[loop] / 2
        ys = [float(LAW_FIGURES[figure](r)) for r in runs]
        within = [r["nodes"] for r, y in zip(runs, ys) if y <= half]
        law = fit([float(r["replicas"]) for r in runs], ys)
        predicted: int | None = None
        if law is not None and law[1] > 0:
            predicted = int((half / law[0]) ** (1 / law[1]) / per_node)
        out[loop] = {"half_period_s": half, "largest_measured_nodes": max(within) if within else None,
                     "measured_all_within": len(within) == len(runs), "predicted_nodes": predicted}
    measured = [v["largest_measured_nodes"] for v in out.values()]
    guesses = [v["predicted_nodes"] for v in out.values() if v["predicted_nodes"] is not None]
    out["every_loop"] = {"largest_measured_nodes": None if None in measured else min(measured),
                         "predicted_nodes": min(guesses) if guesses else None}
    return out


def targets(run: dict, balancers: int) -> dict:
    """Issue 49's targets, judged on one run (meant for 1,000 nodes x 8 x 500 endpoints on etcd)."""
    busy, change = run["routing"]["busy"], run["routing"]["change"]
    checks = {
        "routing_cpu_s<=2": (busy["cpu_s"], busy["cpu_s"] <= 2.0),
        "routing_max_stall_s<=0.5": (busy["max_stall_s"], busy["max_stall_s"] <= 0.5),
        "push_services<=balancers*changed_endpoints": (
            change["push_services"], change["push_services"] <= balancers * change["changed_endpoints"]),
        # the change pass follows one replica's queue rising in each changed endpoint
        "store_writes<=observations_changed": (
            change["store_writes"], change["store_writes"] <= change.get("replicas_changed", 0)),
        "reconcile_cpu_s<=3": (run["reconcile"]["steady"]["cpu_s"], run["reconcile"]["steady"]["cpu_s"] <= 3.0),
        # after a period in which every observation changed (the worst case), and after one
        # refresh period of a steady fleet (1/30 of them re-sent)
        "gateway_refresh_s<=0.1": (run["gateway"]["refresh"]["wall_s"], run["gateway"]["refresh"]["wall_s"] <= 0.1),
        "gateway_refresh_steady_s<=0.1": (run["gateway"]["steady"]["wall_s"],
                                          run["gateway"]["steady"]["wall_s"] <= 0.1),
        # the full-churn refresh that also confirms the streamed readings against the store
        # (one refresh in READINGS_CONFIRM_EVERY)
        "gateway_refresh_confirmed_s<=0.1": (run["gateway"]["confirmed"]["wall_s"],
                                             run["gateway"]["confirmed"]["wall_s"] <= 0.1),
        "silent_agent_delays_nobody": (change["waited_silent"], not change["waited_silent"]),
    }
    return {name: {"measured": value, "met": met} for name, (value, met) in checks.items()}
