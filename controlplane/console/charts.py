"""The console's charts over time, drawn server-side as SVG (nothing loaded from outside).

    line_chart(title, series, since, until, ...)  pure: [(label, [(t, v)])] -> what _chart.html draws
    endpoint_charts(settings, name, now)          weight per replica, queue, running, TTFT, tokens/s
    deployment_charts(name, now)                  replicas desired/ready with the scaling decisions marked
    node_charts(ids, now)                         GPUs held by replicas per node

Source: Prometheus when FABRIC_PROMETHEUS_URL is set (query_range over the last hour, for the
series Prometheus has: fabric_routing_weight and the gateway's in-flight, TTFT and token series),
else, and for what Prometheus does not carry (the engines' queue, desired/ready, decisions, node
GPU use), fabricd's own bounded history (controlplane.history).
"""

from __future__ import annotations

import time

import httpx

from controlplane.history import HISTORY

WINDOW_S = 3600
W, H, PAD_L, PAD_R, PAD_T, PAD_B = 640, 200, 48, 12, 12, 28
PALETTE = ["#0b5cad", "#b3261e", "#1e7b34", "#8a4f00", "#6a3d9a", "#00767a", "#a1145f", "#4d4d4d"]
PROM_STEP_S = 15
PROM_TIMEOUT_S = 3


def _nice_max(v: float) -> float:
    if v <= 0:
        return 1.0
    for m in (1, 2, 5, 10, 20, 25, 50, 100, 200, 250, 500, 1000, 2000, 5000, 10000, 100000, 1e6, 1e9):
        if v <= m:
            return float(m)
    return float(v)


def _fmt(v: float) -> str:
    return f"{v:.2f}".rstrip("0").rstrip(".") if v < 10 else f"{v:.0f}"


def line_chart(title: str, series: list[tuple[str, list[tuple[float, float]]]], since: float, until: float,
               *, unit: str = "", marks: list[tuple[float, str]] | None = None, key: str = "",
               source: str = "history", note: str = "") -> dict:
    """Geometry for one chart: a polyline per series (step-free, in view-box units), y ticks at
    0, half and the top, x labels at the window's ends, a vertical line per mark."""
    span = max(1.0, until - since)
    top = _nice_max(max((v for _, pts in series for _, v in pts), default=0.0))
    plot_w, plot_h = W - PAD_L - PAD_R, H - PAD_T - PAD_B

    def x(t: float) -> float:
        return round(PAD_L + plot_w * min(1.0, max(0.0, (t - since) / span)), 1)

    def y(v: float) -> float:
        return round(PAD_T + plot_h * (1 - min(1.0, max(0.0, v / top))), 1)

    lines = []
    for i, (label, pts) in enumerate(series):
        pts = [(t, v) for t, v in pts if since <= t <= until]
        lines.append({"label": label, "color": PALETTE[i % len(PALETTE)], "count": len(pts),
                      "last": _fmt(pts[-1][1]) if pts else "",
                      "points": " ".join(f"{x(t)},{y(v)}" for t, v in pts),
                      "dot": (x(pts[-1][0]), y(pts[-1][1])) if pts else None})
    ticks = [{"y": y(v), "label": _fmt(v)} for v in (0.0, top / 2, top)]
    return {"title": title, "key": key, "unit": unit, "lines": lines, "ticks": ticks, "source": source,
            "note": note, "empty": not any(ln["count"] for ln in lines), "w": W, "h": H,
            "x0": PAD_L, "x1": W - PAD_R, "y0": PAD_T, "y1": H - PAD_B,
            "start": time.strftime("%H:%M", time.gmtime(since)), "end": time.strftime("%H:%M", time.gmtime(until)),
            "marks": [{"x": x(t), "text": text, "at": time.strftime("%H:%M:%S", time.gmtime(t))}
                      for t, text in (marks or []) if since <= t <= until]}


def _history(series: tuple, since: float) -> list[tuple[float, float]]:
    return HISTORY.points(series, since)


async def _prom_range(url: str, query: str, since: float, until: float, by: str | None) -> list | None:
    """[(label, points)] from Prometheus's query_range, or None when it cannot answer."""
    try:
        async with httpx.AsyncClient(timeout=PROM_TIMEOUT_S) as client:
            resp = await client.get(f"{url}/api/v1/query_range", params={
                "query": query, "start": since, "end": until, "step": PROM_STEP_S})
        data = resp.json()
        if resp.status_code != 200 or data.get("status") != "success":
            return None
        out = []
        for item in data["data"]["result"]:
            label = item.get("metric", {}).get(by, "") if by else ""
            out.append((label, [(float(t), float(v)) for t, v in item.get("values", [])]))
        return sorted(out)
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        return None


def _q(name: str) -> str:
    return name.replace("\\", "\\\\").replace('"', '\\"')


async def endpoint_charts(prometheus_url: str, name: str, now: float | None = None) -> list[dict]:
    now = time.time() if now is None else now
    since = now - WINDOW_S
    ep = ("endpoint", name)
    sel = f'endpoint="{_q(name)}"'
    hist = {
        "weight": [(rid, _history((*ep, "weight", rid), since)) for rid in HISTORY.children((*ep, "weight"))],
        "queue": [("queue", _history((*ep, "queue"), since))],
        "running": [("running", _history((*ep, "running"), since))],
        "ttft": [("p50", _history((*ep, "ttft_p50"), since))],
        "tokens": [("tokens/s", _history((*ep, "tokens_per_s"), since))],
    }
    source = {k: "fabricd history" for k in hist}
    notes = {"ttft": "p90 needs Prometheus (FABRIC_PROMETHEUS_URL); the engines report p50"}
    if prometheus_url:
        queries = {
            "weight": ([(f"fabric_routing_weight{{{sel}}}", "replica")], None),
            "running": ([(f"sum(fabric_gateway_in_flight{{{sel}}})", None)], ["in flight"]),
            "ttft": ([(f"histogram_quantile({q}, sum by (le) (rate(fabric_gateway_ttft_seconds_bucket{{{sel}}}[1m])))",
                       None) for q in (0.5, 0.9)], ["p50", "p90"]),
            "tokens": ([(f"sum(rate(fabric_gateway_tokens_total{{{sel}}}[1m]))", None)], ["tokens/s"]),
        }
        for key, (qs, labels) in queries.items():
            got = []
            for i, (query, by) in enumerate(qs):
                res = await _prom_range(prometheus_url, query, since, now, by)
                if res is None:
                    got = None
                    break
                got += [(labels[i] if labels else lbl, pts) for lbl, pts in res]
            if got is not None:
                hist[key], source[key] = got, "Prometheus"
                notes.pop(key, None)
    spec = [("weight", "Maglev weight per replica", ""), ("queue", "Queue (waiting requests)", ""),
            ("running", "Running requests", ""), ("ttft", "Time to first token", " s"),
            ("tokens", "Tokens per second", "")]
    return [line_chart(title, hist[key], since, now, unit=unit, key=f"{name}-{key}", source=source[key],
                       note=notes.get(key, "")) for key, title, unit in spec]


def deployment_charts(name: str, now: float | None = None) -> list[dict]:
    now = time.time() if now is None else now
    since = now - WINDOW_S
    d = ("deployment", name)
    return [line_chart("Replicas desired and ready", [("desired", _history((*d, "desired"), since)),
                                                      ("ready", _history((*d, "ready"), since))],
                       since, now, marks=HISTORY.marks(d, since), key=f"{name}-replicas",
                       source="fabricd history")]


def node_charts(node_ids: list[str], now: float | None = None) -> list[dict]:
    now = time.time() if now is None else now
    since = now - WINDOW_S
    return [line_chart(f"GPUs held on {nid}", [("held", _history(("node", nid, "gpus_used"), since)),
                                               ("total", _history(("node", nid, "gpus_total"), since))],
                       since, now, key=f"node-{nid}", source="fabricd history") for nid in node_ids]
