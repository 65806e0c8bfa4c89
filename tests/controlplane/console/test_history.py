"""controlplane.history: bounded series, spacing, marks, and the loops' observations."""

from __future__ import annotations

import gzip
from types import SimpleNamespace as NS

from controlplane.history import History


def test_series_and_points_are_bounded_and_spaced():
    h = History(max_series=3, max_points=4, min_spacing_s=5)
    for i in range(10):
        h.add(("s",), i, now=100 + 10 * i)
    assert [v for _, v in h.points(("s",))] == [6, 7, 8, 9]  # a ring of 4
    h.add(("s",), 42, now=192)  # closer than 5 s to the newest: replaces it
    assert h.points(("s",))[-1] == (190, 42)
    for name in ("a", "b", "c"):
        h.add((name,), 1, now=1)
    assert h.points(("s",)) == []  # the least recently written series went first
    assert h.points(("a",), since=2) == []


def test_observations_become_endpoint_deployment_and_node_series():
    h = History()
    entries = [NS(replica_id="r1", weight=32, included=True), NS(replica_id="r2", weight=5, included=False)]
    obs = {"r1": NS(ok=True, queue_depth=3, running=2, ttft_p50_s=0.2, tokens_per_s=50.0),
           "r2": NS(ok=True, queue_depth=1, running=0, ttft_p50_s=0.4, tokens_per_s=None)}
    snap = NS(endpoints={"ep": object()}, observations=obs,
              deployments={"d": NS(replicas=2)}, nodes={"n1": NS(gpus=[1, 2])},
              replicas={"d": [NS(ready=True, node="n1", gpus=["a"]), NS(ready=False, node="n1", gpus=["b"])]})
    h.observe_routing(snap, {"ep": NS(entries=entries), "gone": NS(entries=entries)}, now=10)
    assert h.points(("endpoint", "ep", "weight", "r1")) == [(10, 32)]
    assert h.points(("endpoint", "ep", "weight", "r2")) == [(10, 0)]  # not routed: weight 0
    assert h.points(("endpoint", "ep", "queue")) == [(10, 4)]
    assert abs(h.points(("endpoint", "ep", "ttft_p50"))[0][1] - 0.3) < 1e-9
    assert h.points(("endpoint", "ep", "tokens_per_s")) == [(10, 50)]
    assert h.children(("endpoint", "ep", "weight")) == ["r1", "r2"]
    assert h.points(("endpoint", "gone", "queue")) == []
    h.observe_fleet(snap, {"d": "scale out to 2: queue 9 > 5 for 2s"}, now=20)
    assert h.points(("deployment", "d", "desired")) == [(20, 2)]
    assert h.points(("deployment", "d", "ready")) == [(20, 1)]
    assert h.marks(("deployment", "d")) == [(20, "scale out to 2: queue 9 > 5 for 2s")]
    assert h.points(("node", "n1", "gpus_used")) == [(20, 2)]
    assert h.points(("node", "n1", "gpus_total")) == [(20, 2)]


def test_the_history_file_keeps_series_and_marks_across_a_restart(tmp_path):
    from controlplane.history_file import HistoryFile

    now = 10_000.0
    h = History(min_spacing_s=5)
    for i in range(6):
        h.add(("endpoint", "e", "weight", "r0"), 32 - i, now=now - 60 + 10 * i)
    h.add(("old",), 1, now=now - 4000)  # past the charts' hour: not loaded back
    h.mark(("deployment", "d"), "scale 1 -> 2", now=now - 30)
    sink = HistoryFile(tmp_path / "h.json.gz", every_s=10)
    assert sink.save_if_due(h, now) is True
    assert (tmp_path / "h.json.gz").stat().st_mode & 0o777 == 0o600  # as every file of the state dir
    assert sink.save_if_due(h, now + 1) is False  # not due yet (and nothing new)
    h.add(("endpoint", "e", "weight", "r0"), 2, now=now + 20)
    assert sink.save_if_due(h, now + 20) is True
    fresh = History(min_spacing_s=5)
    fresh.add(("endpoint", "e", "weight", "r0"), 7, now=now + 40)  # recorded after the restart
    assert HistoryFile(tmp_path / "h.json.gz").load_into(fresh, now=now + 40) == 2  # series saved
    assert [v for _, v in fresh.points(("endpoint", "e", "weight", "r0"))] == [32, 31, 30, 29, 28, 27, 2, 7]
    assert fresh.points(("old",)) == []
    assert fresh.marks(("deployment", "d")) == [(now - 30, "scale 1 -> 2")]
    assert fresh.children(("endpoint", "e", "weight")) == ["r0"]


def test_a_broken_history_file_starts_empty(tmp_path):
    from controlplane.history_file import HistoryFile

    path = tmp_path / "h.json.gz"
    for raw in (b"not gzip", gzip.compress(b'{"version": 99}'), gzip.compress(b"[1]")):
        path.write_bytes(raw)
        h = History()
        assert HistoryFile(path).load_into(h) == 0 and h.children(()) == []
    assert HistoryFile(tmp_path / "absent.json.gz").load_into(History()) == 0
