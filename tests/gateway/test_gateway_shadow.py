"""Shadow mode per limit (issue 37), through a real gateway and engine simulator with the
official openai client: FABRIC_USER_RPM=1 with FABRIC_USER_RPM_SHADOW=1 lets every call through
while counting and auditing those it would have refused; FABRIC_PROJECT_RPM=1, not shadowed,
refuses as before."""

from __future__ import annotations

import httpx
import openai
import pytest

from common import audit_chain
from gateway.shadow import shadowed_limits
from lab.rigs.polling import wait_for
from tests.gateway.gateway_harness import GatewayProcess, make_key, publish_endpoint, sim_engine, sqlite_state

MSG = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    state, url, store = sqlite_state(tmp_path_factory, "shadow")
    engine = sim_engine()
    publish_endpoint(store, "chat", [engine])
    gw = GatewayProcess.start(state, url, {"FABRIC_GATEWAY_CACHE_SECS": "0.2", "FABRIC_USER_RPM": "1",
                                           "FABRIC_USER_RPM_SHADOW": "1", "FABRIC_PROJECT_RPM": "1"})
    yield {"store": store, "gw": gw}
    gw.stop()
    engine.stop()
    store.close()


def _shadow_count(gw) -> float:
    for line in httpx.get(gw.url + "/metrics").text.splitlines():
        if line.startswith('fabric_gateway_shadow_refusals_total{limit="FABRIC_USER_RPM"}'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_a_shadowed_limit_counts_and_audits_without_refusing(env):
    _, key = make_key(env["store"], "chat")
    c = openai.OpenAI(base_url=env["gw"].openai_base("chat"), api_key=key, max_retries=0)
    for _ in range(3):
        assert c.chat.completions.create(model="sim-m", messages=MSG, max_tokens=2,
                                         extra_headers={"x-user-id": "shadowed"}).choices
    assert _shadow_count(env["gw"]) == 2
    rows = wait_for(lambda: rows if len(rows := [r for r in audit_chain.read_rows(env["store"])
                                                 if r.get("would_refuse")]) >= 2 else None,
                    10, "two shadow refusals in the audit", interval=0.1)
    assert len(rows) == 2 and {r["would_refuse"] for r in rows} == {"FABRIC_USER_RPM"}, rows
    # The enforced limit beside it refuses as before.
    c.chat.completions.create(model="sim-m", messages=MSG, max_tokens=2, extra_headers={"x-project-id": "p"})
    with pytest.raises(openai.RateLimitError):
        c.chat.completions.create(model="sim-m", messages=MSG, max_tokens=2, extra_headers={"x-project-id": "p"})


def test_which_limits_are_shadowed():
    env = {"FABRIC_USER_RPM_SHADOW": "1", "FABRIC_DAILY_TOKENS_SHADOW": "true", "FABRIC_PROJECT_TPM_SHADOW": "0",
           "FABRIC_USER_RPM": "5"}
    assert shadowed_limits(env) == {"FABRIC_USER_RPM", "FABRIC_DAILY_TOKENS"}
