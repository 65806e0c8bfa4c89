"""Login floods and password guessing (issue 40): password checks run on the login gate's own
executor with a bounded queue (429 "login_busy" beyond it) while /healthz keeps answering, and
repeated failures for one account or from one address back off (429 "login_backoff")."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from common.errors import LimitExceeded, Unauthorized
from controlplane.tenancy.login_gate import (
    ACCOUNT_FREE_FAILURES,
    FREE_FAILURES,
    MAX_WAITING,
    Failures,
    LoginGate,
)
from tests.controlplane.conftest import start_fabricd

FLOOD = 150


@pytest.fixture
def flood_fabricd(tmp_path):
    """A fabricd of its own per test: failure counts (per source: every test is 127.0.0.1) stay apart."""
    with start_fabricd(tmp_path) as server:
        yield server


def test_a_login_flood_is_answered_429_while_healthz_answers(flood_fabricd):
    """150 concurrent logins for a name that does not exist: beyond the gate's queue they are
    refused at once, and /healthz (a route of the shared thread pool) answers during the flood."""

    async def scenario():
        async with httpx.AsyncClient(base_url=flood_fabricd.url, timeout=60,
                                     limits=httpx.Limits(max_connections=FLOOD + 10)) as client:
            logins = [asyncio.create_task(client.post("/api/auth/login", json={
                "username": f"nobody-{i}", "password": "not-the-password-123"})) for i in range(FLOOD)]
            await asyncio.sleep(0)  # the logins are on their way
            health = []
            while not all(t.done() for t in logins) and len(health) < 5:
                health.append(((await client.get("/healthz")).status_code, sum(not t.done() for t in logins)))
            return [await t for t in logins], health

    answers, health = asyncio.run(scenario())
    codes = [r.status_code for r in answers]
    busy = [r for r in answers if r.status_code == 429]
    assert busy and all(r.json()["error"]["code"] == "login_busy" and r.headers["retry-after"] for r in busy)
    assert set(codes) <= {401, 429} and codes.count(401) >= MAX_WAITING
    assert health and all(status == 200 for status, _ in health)
    assert any(pending > 0 for _, pending in health)  # healthz answered while logins still waited


def test_wrong_passwords_for_one_account_back_off(flood_fabricd):
    with flood_fabricd.client() as c:
        for _ in range(FREE_FAILURES):
            bad = c.post("/api/auth/login", json={"username": "admin", "password": "guess-guess-guess"})
            assert bad.status_code == 401
        refused = c.post("/api/auth/login", json={"username": "admin", "password": flood_fabricd.password})
        assert refused.status_code == 429 and refused.json()["error"]["code"] == "login_backoff"
        assert int(refused.headers["retry-after"]) >= 1
        assert "guess" not in refused.text and flood_fabricd.password not in refused.text


def test_an_attackers_failures_do_not_lock_the_admin_out_from_another_address(flood_fabricd):
    """Issue 50: twelve wrong passwords an hour for admin from one address used to keep admin at
    429 everywhere. The attacker (127.0.0.2) is slowed; the admin (127.0.0.1) logs in."""
    attacker = httpx.Client(base_url=flood_fabricd.url, timeout=30,
                            transport=httpx.HTTPTransport(local_address="127.0.0.2"))
    with attacker:
        codes = [attacker.post("/api/auth/login", json={"username": "admin", "password": f"guess-{i}-guess"})
                 .status_code for i in range(12)]
    assert codes[:FREE_FAILURES] == [401] * FREE_FAILURES and codes[-1] == 429
    with flood_fabricd.client() as c:
        ok = c.post("/api/auth/login", json={"username": "admin", "password": flood_fabricd.password})
    assert ok.status_code == 200, ok.text


# --- the pure parts ------------------------------------------------------------------------------

def test_failures_double_the_delay_and_forget_after_the_window():
    f = Failures(free=2, window_s=100)
    assert f.delay("a", 0) == 0
    f.failed("a", 0)
    f.failed("a", 1)
    assert f.delay("a", 1) == 1.0  # the free ones are used: 1 s from the last failure
    f.failed("a", 2)
    assert f.delay("a", 2) == 2.0 and f.delay("a", 3) == 1.0
    assert f.delay("b", 2) == 0  # another name is not touched
    assert f.delay("a", 200) == 0  # past the window
    f.clear("a")
    assert f.delay("a", 3) == 0


def test_failures_table_is_bounded():
    f = Failures(free=0, limit=3)
    for i in range(10):
        f.failed(f"n{i}", 0)
    assert f.delay("n0", 0) == 0 and f.delay("n9", 0) > 0


def test_gate_counts_failures_per_account_and_source_and_clears_on_success():
    now = [0.0]
    gate = LoginGate(clock=lambda: now[0])

    def wrong():
        raise Unauthorized("wrong username or password", code="bad_credentials")

    async def scenario():
        for _ in range(FREE_FAILURES):
            with pytest.raises(Unauthorized):
                await gate.check("alice", "10.0.0.1", wrong)
        with pytest.raises(LimitExceeded) as exc:
            await gate.check("alice", "10.0.0.1", lambda: "ok")  # the guessing address backs off on alice
        assert exc.value.code == "login_backoff"
        assert await gate.check("alice", "10.0.0.2", lambda: "ok") == "ok"  # alice from elsewhere: not locked
        assert await gate.check("bob", "10.0.0.1", lambda: "ok") == "ok"  # the source is under its own bound
        now[0] += 3600  # past the window
        assert await gate.check("alice", "10.0.0.1", lambda: "ok") == "ok"
        assert gate.pairs.delay("alice\0" + "10.0.0.1", now[0]) == 0

    try:
        asyncio.run(scenario())
    finally:
        gate.close()


def test_gate_refuses_beyond_its_queue_before_any_check():
    gate = LoginGate(workers=1, max_waiting=2)
    ran = []

    async def scenario():
        release = asyncio.Event()
        loop = asyncio.get_running_loop()

        def slow():
            ran.append(1)
            asyncio.run_coroutine_threadsafe(release.wait(), loop).result(10)
            return "ok"

        first = [asyncio.create_task(gate.check(f"u{i}", "s", slow)) for i in range(2)]
        await asyncio.sleep(0)  # each task takes its place in the queue before its first await
        with pytest.raises(LimitExceeded) as exc:
            await gate.check("u3", "s", slow)
        assert exc.value.code == "login_busy"
        release.set()
        assert [await t for t in first] == ["ok", "ok"]

    try:
        asyncio.run(scenario())
    finally:
        gate.close()
    assert len(ran) == 2


def test_guessing_spread_over_many_addresses_slows_new_addresses_but_not_known_ones():
    now = [0.0]
    gate = LoginGate(clock=lambda: now[0])

    def wrong():
        raise Unauthorized("wrong username or password", code="bad_credentials")

    async def scenario():
        assert await gate.check("admin", "10.0.0.1", lambda: "ok") == "ok"  # the admin's usual address
        for i in range(ACCOUNT_FREE_FAILURES):
            with pytest.raises(Unauthorized):
                await gate.check("admin", f"192.0.2.{i}", wrong)  # a fresh address each try
        with pytest.raises(LimitExceeded):
            await gate.check("admin", "198.51.100.7", lambda: "ok")  # a new address: slowed
        assert await gate.check("admin", "10.0.0.1", lambda: "ok") == "ok"  # a known one: never locked out

    try:
        asyncio.run(scenario())
    finally:
        gate.close()
