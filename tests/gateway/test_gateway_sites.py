"""The gateway's own replica choice is the published routing plan, so it keeps the planner's site
rules (common.sites): residency by site record, no-site replicas out, site_local spill only to
failover sites once the preferred site's replicas are saturated -- read from a real SQLite store
as the gateway does, after the planner published."""

from __future__ import annotations

import time

import pytest

from common import keyspace
from common.schemas import InferenceEndpoint, Node, Replica, ReplicaObservation, Site
from common.sites import SATURATED_QUEUE
from common.store import open_store
from gateway.upstreams import read_view
from lab.rigs.routing_plans import publish_plans

NODES = {"n-eu1": "eu-1", "n-eu2": "eu-2", "n-us": "us-1", "n-none": ""}


@pytest.fixture
def store(tmp_path):
    s = open_store(f"sqlite://{tmp_path}/fabric.db")
    for name, residency, failover in (("eu-1", "europe", ["eu-2"]), ("eu-2", "europe", []), ("us-1", "usa", [])):
        s.put(keyspace.sites(name), Site(name=name, residency=residency, failover_sites=failover).model_dump_json())
    for i, (node, site) in enumerate(NODES.items()):
        s.put(keyspace.nodes(node), Node(id=node, address="https://127.0.0.1:1", site=site).model_dump_json())
        rep = Replica(replica_id=f"r-{site or 'none'}", deployment="d", ordinal=i, node=node, host="127.0.0.1",
                      port=9000 + i, phase="Ready", ready=True)
        s.put(keyspace.replicas("d", rep.replica_id), rep.model_dump_json())
        queue(s, rep.replica_id, 0)
    yield s
    s.close()


def queue(store, replica_id, depth):
    obs = ReplicaObservation(replica_id=replica_id, scraped_at=time.time(), ok=True, queue_depth=depth)
    store.put(keyspace.observations(replica_id), obs.model_dump_json())


def targets(store, **kw):
    store.put(keyspace.endpoints("e"), InferenceEndpoint(name="e", deployment="d", **kw).model_dump_json())
    publish_plans(store)
    return {r.replica_id for r in read_view(store, "e").replicas}


def test_residency_by_site_record_and_no_site_excluded(store):
    assert targets(store) == {"r-eu-1", "r-eu-2", "r-us-1", "r-none"}
    assert targets(store, residency="europe") == {"r-eu-1", "r-eu-2"}
    assert targets(store, allowed_sites=["us-1"]) == {"r-us-1"}


def test_site_local_spills_to_failover_only_when_saturated(store):
    local = {"routing": "site_local", "preferred_site": "eu-1"}
    assert targets(store, **local) == {"r-eu-1"}
    queue(store, "r-eu-1", SATURATED_QUEUE)
    assert targets(store, **local) == {"r-eu-1", "r-eu-2"}  # never us-1 or the site-less replica
    assert targets(store, **local, allowed_sites=["eu-1"]) == {"r-eu-1"}  # failover outside allowed: no
    store.delete(keyspace.replicas("d", "r-eu-1"))
    assert targets(store, **local) == {"r-eu-2"}
