"""bench-scale's small profile: the growth laws' shape at three tiny fleets, never a time.

lab.rigs.scale drives the real routing controller, reconcile loop and a gateway's view refresh
on SQLite with simulated engines (50 KB vLLM pages) and agents (one of them silent) on loopback,
at 2, 4 and 8 nodes x 8 replicas behind 4 endpoints, 2 of the nodes balancers (the silent agent
is one of them), with fabricd scraping and probing every engine (``runs``) and with every agent
observing its own (``agent_runs``). Each test states one law over all three sizes. A law today's code breaks is marked xfail(strict=True) with the issue item that fixes it,
so the mark fails the suite the day the law holds and must then go.
"""

from __future__ import annotations

import pytest

from lab.rigs.scale import Size, run_size
from lab.rigs.scale_laws import laws

NODES = (2, 4, 8)
ENDPOINTS = 4
BALANCERS = 2


@pytest.fixture(scope="module")
def runs() -> list[dict]:
    # A short push deadline: the silent agent is waited for once, in each fleet's first pass.
    return [run_size(Size(nodes=n, endpoints=ENDPOINTS, balancers=BALANCERS, silent_agent=True), "sqlite",
                     push_deadline_s=0.5) for n in NODES]


@pytest.fixture(scope="module")
def agent_runs() -> list[dict]:
    return [run_size(Size(nodes=n, endpoints=ENDPOINTS, balancers=BALANCERS, silent_agent=True,
                          agents_observe=True), "sqlite", push_deadline_s=0.5) for n in NODES]


def test_an_idle_pass_pushes_nothing_and_writes_nothing(runs):
    for run in runs:
        idle = run["routing"]["idle"]
        assert (idle["push_requests"], idle["push_services"]) == (0, 0), run["nodes"]
        assert idle["changed_endpoints"] == 0
        assert idle["store_writes"] == 0, idle["writes_by_kind"]


def test_pushes_follow_changed_endpoints_times_answering_balancers_in_one_batch_each(runs):
    for run in runs:
        change = run["routing"]["change"]
        answering = BALANCERS - 1  # the silent one still holds its first request: not sent more
        assert change["changed_endpoints"] == Size(nodes=run["nodes"], endpoints=ENDPOINTS).changed_endpoints
        assert change["push_services"] == answering * change["changed_endpoints"]
        assert change["push_requests"] == answering  # one request per agent per pass
        assert change["agents_pushed"] == answering
    assert laws(runs, "replicas")["routing_push_services_change"] == 0.0  # the same at every fleet size


def test_only_balancers_get_services(runs):
    for run in runs:
        first = run["routing"]["first"]  # every endpoint new: each balancer gets all, in one request
        assert first["push_requests"] == BALANCERS
        assert first["push_services"] == (BALANCERS - 1) * ENDPOINTS  # the silent one's were never taken


def test_a_silent_agent_is_waited_for_once_and_delays_no_other_agent(runs):
    for run in runs:
        assert run["routing"]["first"]["waited_silent"]
        assert not run["routing"]["change"]["waited_silent"]
        assert run["routing"]["change"]["agents_pushed"] == BALANCERS - 1


def test_observations_are_written_when_they_change_materially(runs):
    for run in runs:
        change, busy = run["routing"]["change"], run["routing"]["busy"]
        assert change["observations_written"] == change["changed_endpoints"]  # one replica each moved
        assert busy["observations_written"] == run["replicas"]  # every engine moved


def test_the_routing_pass_reads_the_store_a_fixed_number_of_times(runs):
    # Its mirror's revision, then one read per prefix its stream has not yet brought to it (the
    # rig lets the stream catch up first, as a period between passes does): whatever the fleet.
    assert all(1 <= run["routing"]["busy"]["store_reads"] <= 1 + run["routing"]["mirror_prefixes"] for run in runs), \
        [run["routing"]["busy"]["store_reads"] for run in runs]


def test_store_writes_are_batched(runs):
    for run in runs:
        busy = run["routing"]["busy"]
        assert busy["store_writes"] < busy["observations_written"]
        assert busy["writes_by_kind"].get("observations", 0) == 0  # none alone: all in the pass's put_all


def test_the_routing_leader_opens_no_connection_per_replica(agent_runs):
    for run in agent_runs:
        for label in ("first", "change", "busy"):
            assert run["routing"][label]["engine_requests"] == 0, label
            assert run["routing"][label]["engine_connections"] == 0, label


def test_the_reconcile_leader_opens_no_connection_per_replica(agent_runs):
    for run in agent_runs:
        for label in ("first", "steady"):
            assert run["reconcile"][label]["engine_requests"] == 0, label
            assert run["reconcile"][label]["engine_connections"] == 0, label
            # the reported health keeps every replica Ready: none rewritten, no agent asked for a VM
            assert "replicas" not in run["reconcile"][label]["writes_by_kind"] and not run["reconcile"][label][
                "agent_calls"], label


def test_agent_reports_carry_material_changes_and_the_leader_rewrites_none(agent_runs):
    for run in agent_runs:
        routing = run["routing"]
        assert routing["first"]["reported_observations"] == run["replicas"]  # first sight of every engine
        assert routing["idle"]["reported_observations"] == 0
        assert routing["change"]["reported_observations"] == routing["change"]["changed_endpoints"]
        assert routing["busy"]["reported_observations"] == run["replicas"]
        for label in ("first", "idle", "change", "busy"):
            assert routing[label]["observations_written"] == 0, label
        # what the reports carry grows with what changed, not with the fleet: nothing when idle
        assert routing["idle"]["report_bytes"] == 0
        assert 0 < routing["change"]["report_bytes"] < routing["busy"]["report_bytes"]
        # the reported weights still move the plans: the change pass's queues reached them
        assert routing["change"]["changed_endpoints"] == Size(nodes=run["nodes"], endpoints=ENDPOINTS).changed_endpoints
        # and the pass's writes do not grow with them: one batch of plans, one of weight events, at
        # most one event-log trim
        assert routing["change"]["replicas_changed"] == routing["change"]["changed_endpoints"]
        assert 0 < routing["change"]["store_writes"] <= 3


def test_with_fabricd_scraping_the_leader_connects_to_every_engine(runs):
    """The fallback (no agent observes): one scrape per replica, one /health per replica."""
    for run in runs:
        assert run["routing"]["busy"]["engine_requests"] == run["replicas"]
        assert run["reconcile"]["steady"]["engine_requests"] == run["replicas"]


def test_a_gateway_refresh_reads_do_not_grow_with_replicas(runs):
    assert laws(runs, "replicas")["gateway_store_reads"] == 0.0
    for run in runs:  # the first refresh lists and builds every view
        assert run["gateway"]["first"]["views_built"] == ENDPOINTS
        # observations alone changed: no view built (their readings are looked up when used)
        steady = run["gateway"]["steady"]
        assert steady["views_built"] == 0 and run["gateway"]["refresh"]["views_built"] == 0
        # the readings come from the gateway's stream; the store is asked for them only once their
        # trust ran out: one read more than the refresh that took them from the stream alone
        refresh, confirmed = run["gateway"]["refresh"], run["gateway"]["confirmed"]
        assert confirmed["store_reads"] == refresh["store_reads"] + 1
