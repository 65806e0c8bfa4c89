"""gateway.hold in-process: one wake per endpoint however many calls wait, places given back by
cancelled calls, the hold settings validated at start."""

from __future__ import annotations

import asyncio
import time

import pytest

from gateway.hold import HeldStream, HoldPolicy, HoldRoom, Wake
from gateway.settings import SettingsError, load


def test_many_held_calls_share_one_poller_and_a_cancelled_call_gives_its_place_back():
    async def main():
        polls, refreshes = [], []
        ready = asyncio.Event()

        async def poll():
            polls.append(1)
            return "view" if ready.is_set() else None

        async def refresh():
            refreshes.append(1)

        room = HoldRoom(HoldPolicy(per_endpoint=50, per_tenant=30))

        async def held(tenant: str):
            wake = room.enter("ep", tenant, lambda: Wake(poll, refresh, 0.01))
            try:
                return await wake.wait(time.monotonic() + 30, None, 1.0)
            finally:
                room.leave("ep", tenant, wake)

        calls = [asyncio.create_task(held(f"t{i % 2}")) for i in range(40)]
        await asyncio.sleep(0.1)
        assert len(room.wakes) == 1 and room.wakes["ep"].held == 40 and room.tenants == {"t0": 20, "t1": 20}
        assert len(polls) <= 15  # one poller every 10 ms, not forty
        assert room.full("ep", "t0") is None
        calls[0].cancel()  # a client leaves: its place is free at once
        await asyncio.sleep(0)
        assert room.wakes["ep"].held == 39 and room.tenants["t0"] == 19
        ready.set()
        answers = await asyncio.gather(*calls[1:])
        assert answers == ["view"] * 39 and room.wakes == {} and room.tenants == {}

    asyncio.run(main())


def test_the_room_refuses_past_its_bounds_and_a_timed_out_wait_answers_none():
    async def main():
        async def never():
            return None

        async def nothing():
            return None

        room = HoldRoom(HoldPolicy(per_endpoint=2, per_tenant=1))
        a = room.enter("ep", "x", lambda: Wake(never, nothing, 0.01))
        assert "your calls" in room.full("ep", "x")
        b = room.enter("ep", "y", lambda: Wake(never, nothing, 0.01))
        assert a is b and "this endpoint" in room.full("ep", "z")
        assert await a.wait(time.monotonic() + 0.05, None, 1.0) is None
        room.leave("ep", "x", a)
        room.leave("ep", "y", b)
        assert room.wakes == {} and room.full("ep", "x") is None

    asyncio.run(main())


def test_a_held_stream_turns_a_later_error_answer_into_its_last_event():
    sent: list[dict] = []

    async def send(message):
        sent.append(message)

    async def main():
        held = HeldStream(send, [(b"x-fabric-request-id", b"r1")])
        await held.open()
        await held.open()  # a keep-alive
        await held({"type": "http.response.start", "status": 503, "headers": []})
        await held({"type": "http.response.body", "body": b'{"error":{"code":"model_loading","message":"m"}}'})

    asyncio.run(main())
    assert [m["type"] for m in sent] == ["http.response.start"] + ["http.response.body"] * 3
    assert (b"x-fabric-request-id", b"r1") in sent[0]["headers"] and sent[0]["status"] == 200
    assert sent[1]["body"] == sent[2]["body"] == b": keep-alive\n\n"
    assert sent[3]["body"] == b'data: {"error": {"code": "model_loading", "message": "m"}}\n\n'
    assert sent[3]["more_body"] is False


@pytest.mark.parametrize("env,message", [
    ({"FABRIC_GATEWAY_HOLD_SECS": "7200"}, "FABRIC_GATEWAY_HOLD_SECS=7200"),
    ({"FABRIC_GATEWAY_HOLD_SECS": "soon"}, "FABRIC_GATEWAY_HOLD_SECS='soon'"),
    ({"FABRIC_GATEWAY_HOLD_PER_TENANT": "0"}, "FABRIC_GATEWAY_HOLD_PER_TENANT=0"),
    ({"FABRIC_GATEWAY_MIGRATIONS_PER_CALL": "99"}, "FABRIC_GATEWAY_MIGRATIONS_PER_CALL=99"),
    ({"FABRIC_GATEWAY_MIGRATIONS_PER_ENDPOINT": "x"}, "FABRIC_GATEWAY_MIGRATIONS_PER_ENDPOINT='x'"),
])
def test_hold_and_migration_settings_are_checked_at_start(env, message):
    with pytest.raises(SettingsError, match=message.replace("?", r"\?")):
        load({"FABRIC_KEY_HMAC_SECRET": "s" * 32, **env})


def test_hold_and_migration_defaults():
    s = load({"FABRIC_KEY_HMAC_SECRET": "s" * 32})
    assert s.hold == HoldPolicy() and s.hold.secs is None and s.migrations_per_call == 2  # None: the runtime's budget
    off = load({"FABRIC_KEY_HMAC_SECRET": "s" * 32, "FABRIC_GATEWAY_HOLD_SECS": "0",
                "FABRIC_GATEWAY_MIGRATIONS_PER_CALL": "0"})
    assert off.hold.secs == 0 and off.migrations_per_call == 0
