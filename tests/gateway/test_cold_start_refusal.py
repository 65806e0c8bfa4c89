"""gateway.cold_start.refusal (pure): "loading" only when a replica is starting or will be."""

import pytest

from common.schemas import AutoscalingSpec, DeploymentStatus, InferenceDeployment, Replica
from gateway.cold_start import refusal


def dep(replicas=1, phase="Progressing", message="", autoscaling=None, **status):
    return InferenceDeployment(name="d", model="m", profile="p", replicas=replicas, autoscaling=autoscaling,
                               status=DeploymentStatus(phase=phase, message=message, **status))


def rep(phase, draining=False):
    return Replica(replica_id=f"d-0-{phase.lower()}", deployment="d", ordinal=0, node="n1", phase=phase,
                   draining=draining)


WAKES = AutoscalingSpec(min_replicas=0, scale_to_zero=True)


@pytest.mark.parametrize("deployment,replicas,code,loading", [
    (dep(), [rep("Starting")], "model_loading", True),
    (dep(), [rep("Pending")], "model_loading", True),  # placed, waiting for its VM or model
    (dep(phase="Pending", message="0/1 replicas ready"), [], "model_loading", True),  # just created
    (dep(phase="Backoff"), [], "model_loading", True),  # a replacement follows the wait
    (dep(0, "Ready", autoscaling=WAKES), [], "model_loading", True),  # this call wakes it
    (dep(0, "Ready"), [], "scaled_to_zero", False),
    (dep(0, "Ready", autoscaling=AutoscalingSpec(enabled=False, min_replicas=0, scale_to_zero=True)), [],
     "scaled_to_zero", False),
    (dep(0, "Ready"), [rep("Draining", draining=True)], "scaled_to_zero", False),  # draining is leaving
    (dep(phase="CrashLoop", failures=5, last_failure="engine exited: boom"), [], "deployment_parked", False),
    (dep(phase="Failed", message="model 'm' does not exist"), [], "deployment_failed", False),
    (dep(phase="Pending", message="0/1 replicas ready; no node can take a replica: n1: tainted"), [],
     "deployment_unplaceable", False),
    (dep(phase="Deleting"), [rep("Draining", draining=True)], "deployment_deleting", False),
    (None, [], "deployment_missing", False),
])
def test_refusal_codes(deployment, replicas, code, loading):
    why = refusal("ep", "d", deployment, replicas)
    assert (why.code, why.loading) == (code, loading)
    assert why.message


def test_parked_message_names_the_last_failure_and_the_way_out():
    why = refusal("ep", "d", dep(phase="CrashLoop", failures=5, last_failure="engine exited: OSError: x"), [])
    assert "OSError: x" in why.message and "deployment restart d" in why.message


def test_a_deleting_endpoint_takes_no_new_call(tmp_path):
    """Its VIP drains the calls in flight; a new call is told the endpoint is going (404)."""
    import asyncio

    from common import keyspace
    from common.errors import NotFound
    from common.schemas import EndpointStatus, InferenceEndpoint
    from common.store.sqlite_store import SqliteStore
    from gateway.upstreams import UpstreamCache

    store = SqliteStore(tmp_path / "f.db")
    ep = InferenceEndpoint(name="ep", deployment="d", status=EndpointStatus(phase="Deleting", vip="10.96.0.1"))
    store.put(keyspace.endpoints("ep"), ep.model_dump_json())
    with pytest.raises(NotFound) as err:
        asyncio.run(UpstreamCache(store).view("ep"))
    assert "being deleted" in err.value.message
    store.close()
