"""A small bounded history of what the routing and autoscaling loops observed: the console's
charts over time when no Prometheus is configured (FABRIC_PROMETHEUS_URL, controlplane.console.charts).

    HISTORY.observe_routing(snap, plans, now)   per endpoint: weight per replica, queue, running,
                                                TTFT p50 (mean of its replicas), tokens/s (sum)
    HISTORY.observe_fleet(snap, decisions, now) per deployment: replicas desired and ready, and a
                                                mark per scaling decision that changed; per node:
                                                GPUs held by replicas
    HISTORY.points(series, since)               [(t, value)] oldest first
    HISTORY.marks(series, since)                [(t, text)]

Bounds: at most MAX_SERIES series (the one written least recently is dropped when a new one
comes), each a ring buffer of MAX_POINTS points at least MIN_SPACING_S apart (a closer sample
replaces the newest point), so an hour at 5 s fits; MAX_MARKS marks per series. The history is
in this process's memory, saved to {state_dir}/console-history.json.gz every few seconds and at
exit and loaded at start (controlplane.history_file, attached by controlplane.console.install),
so a restart of the same fabricd keeps it; another leader starts from its own. A series is a tuple
("endpoint", name, "weight", replica) / ("endpoint", name, "queue") / ("deployment", name,
"desired") / ("node", id, "gpus_used") and so on.
"""

from __future__ import annotations

import atexit
import threading
import time
from collections import OrderedDict, deque

MAX_SERIES = 2000
MAX_POINTS = 720
MAX_MARKS = 50
MIN_SPACING_S = 5.0

Series = tuple[str, ...]


class History:
    def __init__(self, max_series: int = MAX_SERIES, max_points: int = MAX_POINTS,
                 min_spacing_s: float = MIN_SPACING_S):
        self.max_series, self.max_points, self.min_spacing_s = max_series, max_points, min_spacing_s
        self._points: OrderedDict[Series, deque] = OrderedDict()
        self._marks: OrderedDict[Series, deque] = OrderedDict()
        self._lock = threading.Lock()
        self.changed_since_save = False
        self._sink = None  # a controlplane.history_file.HistoryFile, or None (memory only)
        self._exit_hook = False

    def attach(self, sink) -> None:
        """Save to ``sink`` (a HistoryFile) from now on: when due after each loop's tick, and at exit."""
        self._sink = sink
        if not self._exit_hook:
            atexit.register(self._save_at_exit)
            self._exit_hook = True

    def _save_at_exit(self) -> None:
        if self._sink is not None and self.changed_since_save:
            self._sink.save(self)

    def _persist(self, now: float) -> None:
        if self._sink is not None:
            self._sink.save_if_due(self, now)

    def snapshot(self) -> tuple[list, list]:
        """Every series' points and marks, oldest first (what HistoryFile saves)."""
        with self._lock:
            self.changed_since_save = False
            return ([(s, list(buf)) for s, buf in self._points.items()],
                    [(s, list(buf)) for s, buf in self._marks.items()])

    def restore(self, points: list, marks: list) -> None:
        """Put saved series back (a series recorded already keeps its newer points after them)."""
        with self._lock:
            for table, saved, maxlen in ((self._points, points, self.max_points), (self._marks, marks, MAX_MARKS)):
                for series, items in saved:
                    if not items:
                        continue
                    current = table.get(series)
                    newer = [p for p in (current or ()) if p[0] > items[-1][0]]
                    table[series] = deque([*items, *newer], maxlen=maxlen)
                    table.move_to_end(series, last=False)  # loaded ones go first when the bound bites
                while len(table) > self.max_series:
                    table.popitem(last=False)

    def add(self, series: Series, value: float, now: float | None = None) -> None:
        now = time.time() if now is None else now
        with self._lock:
            buf = self._points.get(series)
            if buf is None:
                while len(self._points) >= self.max_series:
                    self._points.popitem(last=False)
                buf = self._points[series] = deque(maxlen=self.max_points)
            else:
                self._points.move_to_end(series)
            if buf and now - buf[-1][0] < self.min_spacing_s:
                buf[-1] = (buf[-1][0], float(value))  # keep the spacing: the newest value wins
            else:
                buf.append((now, float(value)))
            self.changed_since_save = True

    def mark(self, series: Series, text: str, now: float | None = None) -> None:
        now = time.time() if now is None else now
        with self._lock:
            buf = self._marks.get(series)
            if buf is None:
                while len(self._marks) >= self.max_series:
                    self._marks.popitem(last=False)
                buf = self._marks[series] = deque(maxlen=MAX_MARKS)
            buf.append((now, str(text)[:200]))
            self.changed_since_save = True

    def points(self, series: Series, since: float = 0.0) -> list[tuple[float, float]]:
        with self._lock:
            return [p for p in self._points.get(series, ()) if p[0] >= since]

    def marks(self, series: Series, since: float = 0.0) -> list[tuple[float, str]]:
        with self._lock:
            return [m for m in self._marks.get(series, ()) if m[0] >= since]

    def children(self, prefix: Series) -> list[str]:
        """The last parts of the series under prefix, e.g. the replicas with a weight series."""
        n = len(prefix)
        with self._lock:
            return sorted({s[n] for s in self._points if len(s) == n + 1 and s[:n] == prefix})

    def observe_routing(self, snap, plans: dict, now: float | None = None) -> None:
        """One routing tick: `plans` is the controller's endpoint -> RoutingPlan."""
        now = time.time() if now is None else now
        for name, plan in plans.items():
            if name not in snap.endpoints:
                continue
            obs = [snap.observations.get(e.replica_id) for e in plan.entries]
            obs = [o for o in obs if o is not None and o.ok]
            for e in plan.entries:
                self.add(("endpoint", name, "weight", e.replica_id), e.weight if e.included else 0, now)
            self.add(("endpoint", name, "queue"), sum(o.queue_depth for o in obs), now)
            self.add(("endpoint", name, "running"), sum(o.running for o in obs), now)
            ttft = [o.ttft_p50_s for o in obs if o.ttft_p50_s is not None]
            if ttft:
                self.add(("endpoint", name, "ttft_p50"), sum(ttft) / len(ttft), now)
            rates = [o.tokens_per_s for o in obs if o.tokens_per_s is not None]
            if rates:
                self.add(("endpoint", name, "tokens_per_s"), sum(rates), now)
        self._persist(now)

    def observe_fleet(self, snap, decisions: dict, now: float | None = None) -> None:
        """One autoscaler tick: every deployment's desired/ready, the decisions that changed
        (deployment -> summary), and per node the GPUs its replicas hold."""
        now = time.time() if now is None else now
        held: dict[str, int] = {}
        for name, dep in snap.deployments.items():
            mine = snap.replicas.get(name, [])
            self.add(("deployment", name, "desired"), dep.replicas, now)
            self.add(("deployment", name, "ready"), sum(1 for r in mine if r.ready), now)
            for r in mine:
                if r.node:
                    held[r.node] = held.get(r.node, 0) + len(getattr(r, "gpus", None) or ())
        for name, summary in decisions.items():
            self.mark(("deployment", name), summary, now)
        for node_id, node in snap.nodes.items():
            self.add(("node", node_id, "gpus_used"), held.get(node_id, 0), now)
            self.add(("node", node_id, "gpus_total"), len(getattr(node, "gpus", None) or ()), now)
        self._persist(now)


# One per fabricd process: the loops write, the console reads (both in the leader's process).
HISTORY = History()
