"""GPU-seconds integrated from replica lifetimes, against a timeline computed by hand, and the
ledger built from the replica writes that produce it (common.records.lifetimes/finops)."""

import pytest

from common.records import lifetimes
from common.records.lifetimes import Lifetime, advance
from common.schemas import Replica
from controlplane.tenancy import finops

T = 1_000_000.0  # window: [T, T + 1000]


def life(rid, dep, gpus, created, spans=(), ended=None, tenant=None):
    return Lifetime(replica_id=rid, deployment=dep, tenant=tenant, gpus=gpus, created_at=created,
                    ready_spans=[list(s) for s in spans], ended_at=ended)


def test_integral_matches_the_hand_computed_timeline():
    lives = [
        # a: 2 GPUs, created 100 s before the window, ready from T-50 to T+300 and T+400 until now
        #    reserved: 1000 s x 2 = 2000; ready: (300 + 600) x 2 = 1800
        life("a", "chat", 2, T - 100, [(T - 50, T + 300), (T + 400, None)], tenant="acme"),
        # b: 4 GPUs, created T+200, ready T+260..T+500, deleted T+700
        #    reserved: 500 x 4 = 2000; ready: 240 x 4 = 960
        life("b", "chat", 4, T + 200, [(T + 260, T + 500)], ended=T + 700, tenant="acme"),
        # c: ended before the window: nothing
        life("c", "chat", 8, T - 900, [(T - 800, T - 10)], ended=T - 10, tenant="acme"),
        # d: 1 GPU of another tenant, never ready, alive all window: reserved 1000, ready 0
        life("d", "embed", 1, T - 5000, tenant="beta"),
    ]
    out = finops.report(lives, [], {"chat": "acme", "embed": "beta"}, {"chat": 120},
                        now=T + 1000, window_s=1000, token_window=(0, 3600))
    rows = {r["deployment"]: r for r in out["deployments"]}
    assert (rows["chat"]["gpu_seconds_reserved"], rows["chat"]["gpu_seconds_ready"]) == (4000, 2760)
    assert (rows["embed"]["gpu_seconds_reserved"], rows["embed"]["gpu_seconds_ready"]) == (1000, 0)
    tenants = {r["tenant"]: r for r in out["tenants"]}
    assert tenants["acme"]["gpu_seconds_ready"] == 2760 and tenants["beta"]["gpu_seconds_reserved"] == 1000
    assert rows["chat"]["tokens"] == 120 and tenants["acme"]["tokens"] == 120 and tenants["beta"]["tokens"] == 0


def test_a_tenants_tokens_are_its_deployments_tokens_untenanted_ones_too():
    out = finops.report([], [], {"chat": "acme", "code": "acme", "embed": "beta", "demo": None},
                        {"chat": 100, "code": 20, "demo": 38}, now=T, window_s=1000, token_window=(0, 3600))
    deps = {r["deployment"]: r["tokens"] for r in out["deployments"]}
    tenants = {r["tenant"]: r["tokens"] for r in out["tenants"]}
    assert deps == {"chat": 100, "code": 20, "demo": 38}
    assert tenants == {"acme": 120, None: 38}  # each the sum of its deployments' rows


def test_a_live_replica_without_a_lifetime_counts_from_its_record():
    rep = Replica(replica_id="old", deployment="chat", ordinal=0, node="n", gpus=["a", "b"], ready=True,
                  ready_since=T + 100, created_at=T - 10)
    out = finops.report([], [rep], {"chat": None}, {}, now=T + 1000, window_s=1000, token_window=(0, 3600))
    assert out["deployments"][0]["gpu_seconds_reserved"] == 2000
    assert out["deployments"][0]["gpu_seconds_ready"] == 1800


def rep(ready, since=None, draining=False):
    return Replica(replica_id="r", deployment="d", ordinal=0, node="n", gpus=["g"], ready=ready, ready_since=since,
                   draining=draining, created_at=T)


def test_ledger_opens_and_closes_ready_spans_from_replica_writes():
    lf = life("r", "d", 1, T)
    lf = advance(lf, rep(False), T + 5)  # Pending
    lf = advance(lf, rep(True, since=T + 30), T + 32)  # Ready since T+30 (probed at T+32)
    lf = advance(lf, rep(True, since=T + 30), T + 40)  # nothing changes
    lf = advance(lf, rep(True, since=T + 30, draining=True), T + 90)  # draining takes no new work
    lf = advance(lf, None, T + 120)  # deleted
    assert lf.ready_spans == [[T + 30, T + 90]] and lf.ended_at == T + 120
    assert finops.integrate(lf, T, T + 1000) == finops.GpuSeconds(120, 60)


def test_ledger_spans_are_bounded():
    lf = life("r", "d", 1, T)
    for i in range(lifetimes.MAX_SPANS + 10):
        lf = advance(lf, rep(True, since=T + 10 * i), T + 10 * i)
        lf = advance(lf, rep(False), T + 10 * i + 5)
    assert len(lf.ready_spans) == lifetimes.MAX_SPANS
    assert lf.ready_spans[0][0] == T  # merged spans keep the first start


@pytest.mark.parametrize("window", [1, 500, 2000])
def test_integral_never_exceeds_gpus_times_window(window):
    lf = life("a", "x", 3, T - 100, [(T - 50, None)])
    got = finops.integrate(lf, T + 1000 - window, T + 1000)
    # alive 1100 s before the end, ready for the last 1050: capped by the window either way
    assert got.reserved == pytest.approx(3 * min(window, 1100)) and got.ready == pytest.approx(3 * min(window, 1050))
