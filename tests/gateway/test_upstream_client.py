"""common.http1_client against real loopback servers (raw asyncio sockets, so every byte
on the wire is the test's choice): Content-Length and chunked bodies, streaming without
buffering, keep-alive reuse, Connection: close, a stale kept-alive socket, the idle and
connect timeouts, a response closed early (the client left) closing the upstream socket, and
keep_only dropping the idle sockets of other origins. And an upstream that misbehaves: heads over
the header limits, a trickled head, unsolicited bytes on an idle pooled socket, a POST on a
stale socket (never replayed), a connect timeout (tried on the next target)."""

from __future__ import annotations

import asyncio
import socket
import time

import pytest
import uvloop

from common.http1_client import (
    UpstreamClosedError,
    UpstreamConnectError,
    UpstreamPool,
    UpstreamTimeoutError,
)
from lab.rigs.polling import wait_for_async


class RawServer:
    """A loopback TCP server; handler(reader, writer) plays the upstream. Counts connections
    and records when each one closed (EOF seen by the server)."""

    def __init__(self, handler):
        self.handler = handler
        self.connections = 0
        self.closed_at: list[float] = []
        self.requests: list[bytes] = []

    async def __aenter__(self):
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc):
        self.server.close()

    async def _serve(self, reader, writer):
        self.connections += 1
        try:
            await self.handler(self, reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self.closed_at.append(time.monotonic())
            writer.close()

    async def read_request(self, reader) -> bytes:
        head = await reader.readuntil(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":")[1])
        body = await reader.readexactly(length)
        self.requests.append(head + body)
        return head + body


async def read_all(resp) -> list[bytes]:
    chunks = []
    while (c := await resp.next_chunk()) is not None:
        chunks.append(c)
    return chunks


async def keepalive_ok(server, reader, writer):
    while True:
        try:
            req = await server.read_request(reader)
        except asyncio.IncompleteReadError:
            return
        body = b'{"echo":' + str(len(req)).encode() + b"}"
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                     + str(len(body)).encode() + b"\r\nX-Up: 1\r\n\r\n" + body)
        await writer.drain()


def test_content_length_body_and_keep_alive_reuse():
    async def main():
        async with RawServer(keepalive_ok) as srv:
            pool = UpstreamPool()
            for i in range(5):
                resp = await pool.request("http", "127.0.0.1", srv.port, "POST", b"/v1/x?q=1",
                                          [(b"content-type", b"application/json")], b'{"n":%d}' % i)
                assert resp.status == 200
                assert resp.header(b"x-up") == b"1"  # names come lowercased
                assert b"".join(await read_all(resp)).startswith(b'{"echo":')
                resp.close()
            assert srv.connections == 1 and pool.opened == 1
            first = srv.requests[0]
            assert first.startswith(b"POST /v1/x?q=1 HTTP/1.1\r\n")
            assert f"host: 127.0.0.1:{srv.port}\r\n".encode() in first and b"content-length: 7\r\n" in first
            pool.close()

    asyncio.run(main())


def test_keep_only_closes_idle_connections_of_other_origins():
    async def main():
        async with RawServer(keepalive_ok) as a, RawServer(keepalive_ok) as b:
            pool = UpstreamPool()
            for srv in (a, b):
                resp = await pool.request("http", "127.0.0.1", srv.port, "GET", b"/", [], b"")
                await read_all(resp)
                resp.close()
            pool.keep_only({("http", "127.0.0.1", a.port)})
            await asyncio.sleep(0.05)
            assert len(b.closed_at) == 1 and not a.closed_at  # b's idle socket closed, a's kept
            for srv in (a, b):
                resp = await pool.request("http", "127.0.0.1", srv.port, "GET", b"/", [], b"")
                await read_all(resp)
                resp.close()
            assert a.connections == 1 and b.connections == 2
            pool.close()

    asyncio.run(main())


def test_chunked_body_is_decoded_and_streamed_chunk_by_chunk():
    async def main():
        gate = asyncio.Event()

        async def chunked(server, reader, writer):
            await server.read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
            writer.write(b"d\r\ndata: first\n\n\r\n")
            await writer.drain()
            await gate.wait()  # the first event must reach the reader before the rest exists
            writer.write(b"e\r\ndata: second\n\n\r\n6;ext=1\r\nda")
            await writer.drain()
            await asyncio.sleep(0.05)
            writer.write(b"ta:\n\r\n0\r\n\r\n")
            await writer.drain()
            await server.read_request(reader)  # keep-alive: a second request on this socket
            writer.write(b"HTTP/1.1 204 No Content\r\n\r\n")
            await writer.drain()

        async with RawServer(chunked) as srv:
            pool = UpstreamPool(idle_timeout=5)
            resp = await pool.request("http", "127.0.0.1", srv.port, "POST", b"/s", [], b"{}")
            assert resp.header(b"transfer-encoding") == b"chunked"
            assert await resp.next_chunk() == b"data: first\n\n"
            gate.set()
            rest = b"".join(await read_all(resp))
            assert rest == b"data: second\n\ndata:\n"
            resp.close()
            again = await pool.request("http", "127.0.0.1", srv.port, "GET", b"/", [], b"")
            assert again.status == 204 and await again.next_chunk() is None
            again.close()
            assert srv.connections == 1
            pool.close()

    asyncio.run(main())


def test_connection_close_and_read_until_eof_bodies_are_not_reused():
    async def main():
        async def close_each(server, reader, writer):
            await server.read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nuntil-eof")
            await writer.drain()

        async with RawServer(close_each) as srv:
            pool = UpstreamPool()
            for _ in range(2):
                resp = await pool.request("http", "127.0.0.1", srv.port, "GET", b"/", [], b"")
                assert b"".join(await read_all(resp)) == b"until-eof"
                resp.close()
            assert srv.connections == 2
            pool.close()

    asyncio.run(main())


def test_a_stale_kept_alive_socket_is_retried_only_for_idempotent_methods():
    async def main():
        async def one_then_close(server, reader, writer):
            await server.read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            await writer.drain()
            # Keep-alive was promised, but the server closes without answering the next request.
            await reader.read(1)

        async with RawServer(one_then_close) as srv:
            pool = UpstreamPool()
            for _ in range(2):
                resp = await pool.request("http", "127.0.0.1", srv.port, "GET", b"/", [], b"")
                assert b"".join(await read_all(resp)) == b"ok"
                resp.close()
            assert srv.connections == 2
            # A POST may have been acted on: on the (stale) kept-alive socket it fails, and is not
            # replayed on a fresh one.
            with pytest.raises(UpstreamClosedError):
                await pool.request("http", "127.0.0.1", srv.port, "POST", b"/", [], b"x")
            assert srv.connections == 2
            pool.close()

    asyncio.run(main())


@pytest.mark.parametrize("loop_factory", [asyncio.new_event_loop, uvloop.new_event_loop], ids=["asyncio", "uvloop"])
def test_a_pooled_socket_closing_before_its_loss_is_seen_is_never_written(loop_factory):
    """The peer closed a kept-alive socket (an engine SIGKILLed) and its connection_lost is still
    queued: the transport is closing, the pool's record not yet. A request must not be sent on it:
    asyncio drops the write and the POST failed as stale; uvloop, once the handle is closed, raises
    RuntimeError (a gateway audited a stream migration's retry as a 500). It opens a fresh
    connection instead, a POST included, since nothing was sent on the closing one."""
    async def main():
        async with RawServer(keepalive_ok) as srv:
            pool = UpstreamPool()
            resp = await pool.request("http", "127.0.0.1", srv.port, "POST", b"/", [], b"a")
            await read_all(resp)
            resp.close()
            (idle,) = pool._idle[("http", "127.0.0.1", srv.port)]
            idle.transport.close()  # what a peer's close does; connection_lost runs on a later loop turn
            assert idle.transport.is_closing() and not idle.closed
            resp = await pool.request("http", "127.0.0.1", srv.port, "POST", b"/", [], b"b")
            assert resp.status == 200 and b"".join(await read_all(resp)).startswith(b'{"echo":')
            resp.close()
            assert srv.connections == 2 and pool.opened == 2
            pool.close()
            await wait_for_async(lambda: len(srv.closed_at) == 2, 5, "both server connections closed")

    loop = loop_factory()
    try:
        loop.run_until_complete(main())
    finally:
        loop.close()


def test_unsolicited_bytes_on_an_idle_socket_never_answer_the_next_request():
    async def main():
        async def then_stray(server, reader, writer):
            if server.connections > 1:  # a fresh connection answers honestly
                while True:
                    await server.read_request(reader)
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nok2")
                    await writer.drain()
            await server.read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nok1")
            await writer.drain()
            await asyncio.sleep(0.05)
            # Nothing was asked: a whole stray "response" on the idle kept-alive socket.
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nEVIL!")
            await writer.drain()
            while True:
                await server.read_request(reader)
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nok2")
                await writer.drain()

        async with RawServer(then_stray) as srv:
            pool = UpstreamPool()
            resp = await pool.request("http", "127.0.0.1", srv.port, "GET", b"/", [], b"")
            assert b"".join(await read_all(resp)) == b"ok1"
            resp.close()
            await asyncio.sleep(0.3)
            resp = await pool.request("http", "127.0.0.1", srv.port, "GET", b"/", [], b"")
            assert b"".join(await read_all(resp)) == b"ok2"
            resp.close()
            pool.close()

    asyncio.run(main())


@pytest.mark.parametrize("head", [
    b"HTTP/1.1 200 OK\r\n" + b"".join(b"X-H%d: v\r\n" % i for i in range(300)) + b"Content-Length: 0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * 200_000 + b"\r\nContent-Length: 0\r\n\r\n",
])
def test_response_heads_over_the_limits_are_refused(head):
    async def main():
        async def huge(server, reader, writer):
            await server.read_request(reader)
            writer.write(head)
            await writer.drain()
            await reader.read(1)

        async with RawServer(huge) as srv:
            pool = UpstreamPool()
            with pytest.raises(UpstreamClosedError, match="head"):
                await pool.request("http", "127.0.0.1", srv.port, "GET", b"/", [], b"")
            pool.close()

    asyncio.run(main())


def test_a_trickled_response_head_times_out_as_a_whole():
    async def main():
        async def trickle(server, reader, writer):
            await server.read_request(reader)
            for byte in b"HTTP/1.1 200 OK\r\nX-Slow: " + b"s" * 200:
                writer.write(bytes([byte]))
                await writer.drain()
                await asyncio.sleep(0.05)  # always within the idle timeout of one gap

        async with RawServer(trickle) as srv:
            pool = UpstreamPool(idle_timeout=0.5)
            with pytest.raises(UpstreamTimeoutError):
                await pool.request("http", "127.0.0.1", srv.port, "GET", b"/", [], b"")
            pool.close()

    asyncio.run(main())


def test_a_connect_timeout_is_a_connect_failure_and_moves_to_the_next_target():
    from gateway.proxy import open_response

    async def main():
        # A listener that never accepts, its backlog already full: a new SYN is dropped.
        black = socket.socket()
        black.bind(("127.0.0.1", 0))
        black.listen(0)
        fillers = []
        for _ in range(4):
            f = socket.socket()
            f.setblocking(False)
            try:
                f.connect(black.getsockname())
            except BlockingIOError:
                pass
            fillers.append(f)
        async with RawServer(keepalive_ok) as srv:
            pool = UpstreamPool(connect_timeout=0.5)
            with pytest.raises(UpstreamConnectError):
                await pool.request("http", "127.0.0.1", black.getsockname()[1], "GET", b"/", [], b"")
            targets = [f"http://127.0.0.1:{black.getsockname()[1]}", f"http://127.0.0.1:{srv.port}"]
            resp = await open_response(pool, targets, "POST", b"/", [], b"{}", False)
            assert resp.status == 200 and srv.connections == 1
            await read_all(resp)
            resp.close()
            pool.close()
        for f in fillers:
            f.close()
        black.close()

    asyncio.run(main())


def test_closing_a_response_early_closes_the_upstream_socket_at_once():
    async def main():
        async def endless(server, reader, writer):
            await server.read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            while True:
                writer.write(b"5\r\ntick\n\r\n")
                await writer.drain()
                await asyncio.sleep(0.01)

        async with RawServer(endless) as srv:
            pool = UpstreamPool()
            resp = await pool.request("http", "127.0.0.1", srv.port, "POST", b"/", [], b"{}")
            assert await resp.next_chunk()
            t0 = time.monotonic()
            resp.close()  # what forward() does in its finally when the client leaves
            await wait_for_async(lambda: srv.closed_at,
                                 1, "the upstream to see the connection close", interval=0.01)
            assert srv.closed_at[0] - t0 < 0.5
            assert not pool._idle.get(("http", "127.0.0.1", srv.port))
            pool.close()

    asyncio.run(main())


def test_cancelling_the_reader_closes_the_upstream_socket():
    async def main():
        async def silent_after_head(server, reader, writer):
            await server.read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            await writer.drain()
            await reader.read(1)  # returns at EOF, when the client closes

        async with RawServer(silent_after_head) as srv:
            pool = UpstreamPool(idle_timeout=30)

            async def consume():
                resp = await pool.request("http", "127.0.0.1", srv.port, "POST", b"/", [], b"{}")
                try:
                    await read_all(resp)
                finally:
                    resp.close()

            task = asyncio.ensure_future(consume())
            await asyncio.sleep(0.1)
            t0 = time.monotonic()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await wait_for_async(lambda: srv.closed_at,
                                 1, "the upstream to see the connection close", interval=0.01)
            assert srv.closed_at[0] - t0 < 0.5
            pool.close()

    asyncio.run(main())


def test_idle_timeout_between_chunks_and_before_the_head():
    async def main():
        async def stalls(server, reader, writer):
            req = await server.read_request(reader)
            if b"/head" in req.split(b"\r\n")[0]:
                await asyncio.sleep(2)
                return
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n")
            await writer.drain()
            await asyncio.sleep(2)

        async with RawServer(stalls) as srv:
            pool = UpstreamPool(idle_timeout=0.2)
            resp = await pool.request("http", "127.0.0.1", srv.port, "POST", b"/body", [], b"{}")
            assert await resp.next_chunk() == b"abc"
            t0 = time.monotonic()
            with pytest.raises(UpstreamTimeoutError):
                await resp.next_chunk()
            assert 0.15 < time.monotonic() - t0 < 1.0
            resp.close()
            with pytest.raises(UpstreamTimeoutError):
                await pool.request("http", "127.0.0.1", srv.port, "POST", b"/head", [], b"{}")
            pool.close()

    asyncio.run(main())


def test_connect_refused_and_upstream_dying_mid_body():
    async def main():
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            dead_port = s.getsockname()[1]
        pool = UpstreamPool(connect_timeout=1)
        with pytest.raises(UpstreamConnectError):
            await pool.request("http", "127.0.0.1", dead_port, "GET", b"/", [], b"")

        async def dies(server, reader, writer):
            await server.read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly-part")
            await writer.drain()

        async with RawServer(dies) as srv:
            resp = await pool.request("http", "127.0.0.1", srv.port, "GET", b"/", [], b"")
            assert await resp.next_chunk() == b"only-part"
            with pytest.raises(UpstreamClosedError):
                await resp.next_chunk()
            resp.close()
        pool.close()

    asyncio.run(main())


def test_tls_with_client_certificate_as_the_gateway_configures_it(tmp_path):
    from common import pki
    from gateway.assemble import upstream_pool
    from gateway.settings import BackendTls, GatewaySettings

    ca, _ = pki.ensure_ca(tmp_path)
    srv_crt, srv_key = pki.issue_cert(tmp_path, "engine", server=True, client=False, role=None)
    cli_crt, cli_key = pki.issue_cert(tmp_path, "gateway", server=False, client=True, role="gateway")
    server_ctx = pki.server_ssl_context(srv_crt, srv_key, ca, require_client_cert=True)
    seen_cn = []

    async def main():
        async def handler(reader, writer):
            seen_cn.append(pki.peer_common_name(writer.get_extra_info("peercert")))
            try:
                while True:
                    await reader.readuntil(b"\r\n\r\n")
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\ntls")
                    await writer.drain()
            except (asyncio.IncompleteReadError, ConnectionError):
                writer.close()

        server = await asyncio.start_server(handler, "127.0.0.1", 0, ssl=server_ctx)
        port = server.sockets[0].getsockname()[1]
        try:
            settings = GatewaySettings(backend_tls=BackendTls(True, str(cli_crt), str(cli_key), str(ca)))
            pool = upstream_pool(settings)
            for _ in range(2):
                resp = await pool.request("https", "127.0.0.1", port, "GET", b"/", [], b"")
                assert b"".join(await read_all(resp)) == b"tls"
                resp.close()
            assert pool.opened == 1  # the TLS connection was kept alive and reused
            pool.close()
            # Without the client certificate the upstream refuses the handshake.
            bare = UpstreamPool(pki.client_ssl_context(ca))
            with pytest.raises((UpstreamConnectError, UpstreamClosedError)):
                r = await bare.request("https", "127.0.0.1", port, "GET", b"/", [], b"")
                await read_all(r)
            bare.close()
        finally:
            server.close()

    asyncio.run(main())
    assert seen_cn[0] == "gateway"
