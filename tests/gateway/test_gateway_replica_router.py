"""gateway.replica_router's explanations: bounded by count (MAX_EXPLANATIONS, oldest dropped
first) and by age (explain_ttl, FABRIC_GATEWAY_EXPLAIN_SECS), so a soak's steady state has at most
calls-per-TTL of them."""

from __future__ import annotations

import pytest

from gateway import settings as gs
from gateway.replica_router import EXPLAIN_TTL, MAX_EXPLANATIONS, ReplicaRouter


def test_explanations_are_capped_at_max_explanations_oldest_first():
    r = ReplicaRouter()
    for i in range(MAX_EXPLANATIONS + 25):
        r.remember(f"req-{i}", "key-1", {"i": i}, now=1000.0)
    assert len(r._explained) == MAX_EXPLANATIONS == 10_000
    assert r.explanation("req-24", "key-1", now=1000.0) is None  # the 25 oldest went
    assert r.explanation("req-25", "key-1", now=1000.0) == {"i": 25}
    assert r.explanation(f"req-{MAX_EXPLANATIONS + 24}", "key-1", now=1000.0) == {"i": MAX_EXPLANATIONS + 24}


def test_explanations_expire_after_the_ttl_and_are_dropped_on_the_next_call():
    r = ReplicaRouter(explain_ttl=60.0)
    for i in range(100):  # one call a second for 100 s
        r.remember(f"req-{i}", "key-1", {"i": i}, now=1000.0 + i)
    # at t=1099 the calls made up to t=1039 have expired: exactly 60 are kept
    assert len(r._explained) == 60
    assert r.explanation("req-39", "key-1", now=1099.0) is None
    assert r.explanation("req-40", "key-1", now=1099.0) == {"i": 40}
    assert r.explanation("req-40", "key-2", now=1099.0) is None  # another caller: nothing
    assert r.explanation("req-99", "key-1", now=1000.0 + 99 + 60) is None  # its own TTL passed


def test_explain_secs_setting_defaults_to_the_ttl_and_is_bounded():
    assert gs.load({}).explain_secs == EXPLAIN_TTL == 600.0
    assert gs.load({"FABRIC_GATEWAY_EXPLAIN_SECS": "60"}).explain_secs == 60.0
    for bad in ("0.5", "3601", "nan", "x"):
        with pytest.raises(gs.SettingsError, match="FABRIC_GATEWAY_EXPLAIN_SECS"):
            gs.load({"FABRIC_GATEWAY_EXPLAIN_SECS": bad})


def test_an_explanation_shows_only_the_callers_own_tenants_prefixes():
    """The attack (issue 50, Medium 5): a key holder of tenant B sends a guessed system prompt and
    reads matched_chunks/hits in its routing explanation to learn whether tenant A sent it."""
    from common.schemas import EndpointStatus, InferenceEndpoint, Replica
    from gateway.cache_salt import salt_for
    from gateway.upstreams import EndpointView

    ep = InferenceEndpoint(name="e", deployment="d", routing_l7="prefix", status=EndpointStatus())
    view = EndpointView(ep, tuple(Replica(replica_id=f"r{i}", deployment="d", ordinal=i, node="n",
                                          host=f"10.0.0.{i + 1}", ready=True) for i in range(2)), {})
    secret = b"gateway secret"
    prompt = {"model": "m", "messages": [{"role": "system", "content": "Acme's confidential playbook. " * 20}]}
    a = {**prompt, "cache_salt": salt_for(secret, "acme", "k1")}
    b = {**prompt, "cache_salt": salt_for(secret, "globex", "k2")}
    r = ReplicaRouter()
    for _ in range(3):
        r.pick(view, a, 0.0)
    _, seen_by_b = r.pick(view, b, 0.0)
    assert all(s["matched_chunks"] == 0 and s["hits"] == 0 for s in seen_by_b["scores"])
    assert all("prefix_nodes" not in s for s in seen_by_b["scores"])
    _, seen_by_a = r.pick(view, a, 0.0)  # the caller's own prefixes still route by affinity
    assert max(s["matched_chunks"] for s in seen_by_a["scores"]) == seen_by_a["prompt_chunks"] > 0
