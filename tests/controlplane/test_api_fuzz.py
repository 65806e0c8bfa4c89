"""schemathesis against real fabricd (SQLite store, TLS on loopback) and a real agent app (mutual
TLS on loopback): the bounded profile of scripts/fuzz-api (lab/rigs/api_fuzz.py says what
each pass checks). One run of every pass, shared by the assertions below."""

from __future__ import annotations

import json

import pytest

from lab.rigs.api_fuzz import BOUNDED, BOUNDED_REFUSALS, fuzz_all


@pytest.fixture(scope="module")
def summaries(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("api-fuzz")
    out = {s.name: s for s in fuzz_all(tmp, BOUNDED, BOUNDED_REFUSALS)}
    print(json.dumps([s.as_dict() for s in out.values()], indent=1))
    return out


@pytest.mark.parametrize("name", ["fabricd authenticated", "fabricd unauthenticated", "agent authenticated",
                                  "agent other node"])
def test_fuzz_pass_finds_no_5xx_and_no_failed_check(summaries, name):
    s = summaries[name]
    assert s.operations_tested > 0 and s.requests > 0, s.as_dict()
    assert s.server_errors == 0, s.errors
    assert s.failures == [] and s.errors == [], json.dumps(s.as_dict(), indent=1)


def test_unauthenticated_calls_were_refused_not_served(summaries):
    anon = summaries["fabricd unauthenticated"].statuses
    assert anon.get("401", 0) > 0.9 * sum(anon.values()), anon  # the rest: /healthz and the login
    assert not any(s.startswith("2") for s in anon if s != "200") and anon.get("200", 0) <= anon["401"] // 5
    node = summaries["agent other node"].statuses
    assert set(node) == {"403"}, node
