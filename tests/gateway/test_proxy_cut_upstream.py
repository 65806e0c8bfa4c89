"""A cut upstream is never a clean end (gateway.proxy.relay against raw loopback upstreams).

An SSE answer whose upstream resets or ends its chunked body without ``data: [DONE]`` ends
with an OpenAI-shaped error event and no [DONE], and the result is a cut (outcome
upstream_cut: FAILED in the audit, counted); a non-streaming answer that breaks before it is
complete is a 502 with an error body, never a truncated 200."""

from __future__ import annotations

import asyncio
import json
import socket
import struct

import pytest

from common.http1_client import UpstreamPool
from gateway.proxy import UpstreamFailed, forward
from tests.gateway.test_upstream_client import RawServer

SSE_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def reset(writer) -> None:
    """Close with RST (SO_LINGER 0), as a backend that never knew the flow answers."""
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


async def call(handler, streaming=True):
    sent: list[dict] = []

    async def send(message):
        sent.append(message)

    async with RawServer(handler) as srv:
        pool = UpstreamPool(idle_timeout=5)
        try:
            result = await forward(pool, send, [f"http://127.0.0.1:{srv.port}"], "POST", b"/v1/chat/completions",
                                   [], b"{}", streaming)
        finally:
            await asyncio.sleep(0)
    return result, sent


def body(sent) -> bytes:
    return b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")


def events(sent) -> list[bytes]:
    return [e for e in body(sent).split(b"\n\n") if e]


async def two_events(server, reader, writer):
    await server.read_request(reader)
    writer.write(SSE_HEAD + chunk(b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n')
                 + chunk(b'data: {"choices":[{"delta":{"content":"b"}}]}\n\n'))
    await writer.drain()


@pytest.mark.parametrize("ending", ["clean_end_without_done", "reset", "fin_mid_body"])
def test_a_cut_stream_ends_with_an_error_event_and_no_done(ending):
    async def handler(server, reader, writer):
        await two_events(server, reader, writer)
        await asyncio.sleep(0.05)
        if ending == "clean_end_without_done":
            writer.write(b"0\r\n\r\n")  # a well-formed end of the chunked body, no [DONE]
            await writer.drain()
            await asyncio.sleep(0.2)
        elif ending == "reset":
            reset(writer)
        else:
            writer.write(b"40\r\ndata: {\"choi")  # half a chunk, then FIN
            await writer.drain()

    result, sent = asyncio.run(call(handler))
    last = events(sent)[-1]
    assert last.startswith(b"data: ")
    error = json.loads(last[6:])["error"]
    assert error["code"] == "upstream_broken" and error["type"] == "upstream_error" and error["message"]
    assert b"[DONE]" not in body(sent)
    assert sent[-1]["more_body"] is False  # the client's body ends (after the error event)
    assert result.cut and not result.ok and result.status == 502


def test_a_whole_stream_passes_unchanged():
    async def handler(server, reader, writer):
        await two_events(server, reader, writer)
        writer.write(chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(0.2)

    result, sent = asyncio.run(call(handler))
    assert events(sent)[-1] == b"data: [DONE]" and b"error" not in body(sent)
    assert result.ok and not result.cut and result.status == 200


def test_a_non_streaming_answer_cut_before_its_end_is_a_502_not_a_truncated_200():
    async def handler(server, reader, writer):
        await server.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n"
                     b'{"choices": [')
        await writer.drain()
        await asyncio.sleep(0.05)
        reset(writer)

    with pytest.raises(UpstreamFailed) as err:
        asyncio.run(call(handler, streaming=False))
    assert err.value.status == 502 and "before its answer was complete" in err.value.message


def test_a_whole_json_answer_is_sent_once_with_its_usage():
    payload = json.dumps({"choices": [], "usage": {"completion_tokens": 7, "prompt_tokens": 3,
                                                   "total_tokens": 10}}).encode()

    async def handler(server, reader, writer):
        await server.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                     % len(payload) + payload[:10])
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.write(payload[10:])
        await writer.drain()
        await asyncio.sleep(0.2)

    result, sent = asyncio.run(call(handler, streaming=False))
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]
    assert body(sent) == payload and result.ok and result.tokens is not None


def test_retired_vip_connections_are_never_reused_so_a_drain_reaches_kept_alive_clients():
    """A kept-alive connection through the VIP is one established flow: Maglev keeps it on a
    draining backend. When a replica leaves the routable set the gateway retires its VIP
    connections (idle ones close, busy ones close when their answer ends), so new calls open
    new flows that the remaining backends take."""
    from types import SimpleNamespace

    from gateway.proxy import VipConnections

    async def main():
        async def ok(server, reader, writer):
            while True:
                await server.read_request(reader)
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                await writer.drain()

        async with RawServer(ok) as srv:
            pool = UpstreamPool(idle_timeout=5)
            url = f"http://127.0.0.1:{srv.port}"

            async def get():
                resp = await pool.request("http", "127.0.0.1", srv.port, "GET", b"/", [], b"")
                while await resp.next_chunk() is not None:
                    pass
                resp.close()

            vips = VipConnections()
            a, b = SimpleNamespace(replica_id="a"), SimpleNamespace(replica_id="b")
            both = (a, b)
            vips.note(pool, "ep", url, both)
            await get()
            await get()
            assert srv.connections == 1  # kept alive
            vips.note(pool, "ep", url, (a, b))  # a new view, same replicas: nothing retired
            await get()
            assert srv.connections == 1
            busy = await pool.request("http", "127.0.0.1", srv.port, "GET", b"/", [], b"")
            vips.note(pool, "ep", url, (a,))  # b leaves (drains): every VIP connection retires
            await get()
            assert srv.connections == 2  # a new flow
            while await busy.next_chunk() is not None:
                pass
            busy.close()  # the connection in use when it retired is not kept
            await get()
            await get()
            assert srv.connections == 2  # the new one is kept alive again
            pool.close()

    asyncio.run(main())
