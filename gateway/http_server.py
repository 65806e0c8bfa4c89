"""The gateway's HTTP/1.1 server protocol: uvicorn's ``http=`` slot, on httptools (llhttp).

uvicorn keeps what it does well (sockets, TLS, signals, lifespan, graceful shutdown, the
WebSocket protocol an upgrade is handed to); this class replaces its per-request Python layer
(~13% of the gateway's samples at 64 clients; measured: ~11% less CPU per call, docs/gateway.md
"Second pass"). It still calls the app through ASGI (scope, receive, send; gateway.http_cycle),
so every route behaves as before.

What it does differently from uvicorn's HttpToolsProtocol, and why:
- bounds on the request head an attacker controls: at most MAX_HEAD_BYTES of head and
  MAX_HEADERS header lines (431 and close), and the head must arrive within HEAD_TIMEOUT of its
  first byte (slowloris: 408 and close); uvicorn has neither;
- one timer per connection, re-armed lazily from a deadline (not a TimerHandle per request)
  covers both the keep-alive idle timeout and the head timeout;
- one transport.write per Content-Length response, a CR/LF check by counting line ends, no
  Event per request, and a disconnect guard instead of a watcher task (gateway.http_cycle).
Pipelined requests are handled in order (queued, reading paused), as uvicorn does; llhttp itself
refuses a duplicated or conflicting Content-Length and Content-Length with chunked encoding (400).
"""

from __future__ import annotations

import asyncio
from collections import deque
from urllib.parse import unquote

import httptools

from gateway.http_cycle import Cycle, plain_response

MAX_HEAD_BYTES = 32 * 1024  # request line and headers (nginx: 4 x 8 KiB buffers)
MAX_HEADERS = 100
HEAD_TIMEOUT = 10.0  # seconds from a request head's first byte to its end
HIGH_WATER = 64 * 1024  # unread request body buffered before reading pauses


class HeadTooLarge(Exception):
    pass


class UnknownCoding(Exception):
    """A transfer coding other than chunked (RFC 9112 6.1: 501). llhttp would read "gzip,
    chunked" as chunked and hand the app a body still gzip-coded."""


class GatewayHttpProtocol(asyncio.Protocol):
    """uvicorn.Config(http=GatewayHttpProtocol): same constructor as uvicorn's protocols."""

    def __init__(self, config, server_state, app_state, _loop=None) -> None:
        if not config.loaded:
            config.load()
        self.config = config
        self.app = config.loaded_app
        self.loop = _loop or asyncio.get_event_loop()
        self.server_state = server_state
        self.app_state = app_state
        self.keep_alive_secs = config.timeout_keep_alive
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport = None  # type: ignore[assignment]
        self.cycle: Cycle | None = None  # the request whose response is being made
        self.parsing: Cycle | None = None  # the request whose body is being parsed
        self.pipeline: deque[Cycle] = deque()
        self.write_paused: asyncio.Future | None = None
        self.read_paused = False
        self.in_head = False
        self.head_bytes = self.header_count = self.header_bytes = 0  # raw bytes of an unfinished head; parsed
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.expect_continue = False
        self.upgrade: bytes | None = None
        self.deadline = 0.0  # when the timer closes the connection, if nothing moved it
        self.timer: asyncio.TimerHandle | None = None
        self.refusal: bytes | None = None  # the answer to an unparsable request, sent after the ones before it

    @property
    def default_headers(self) -> list[tuple[bytes, bytes]]:
        return self.server_state.default_headers

    # -- connection ---------------------------------------------------------------------------
    def connection_made(self, transport) -> None:
        self.server_state.connections.add(self)
        self.transport = transport
        sockname = transport.get_extra_info("sockname")
        peername = transport.get_extra_info("peername")
        self.server = tuple(sockname[:2]) if isinstance(sockname, tuple) else None
        self.client = tuple(peername[:2]) if isinstance(peername, tuple) else None
        self.scheme = "https" if transport.get_extra_info("sslcontext") else "http"
        self._arm(self.keep_alive_secs)

    def connection_lost(self, exc) -> None:
        self.server_state.connections.discard(self)
        for cycle in (self.cycle, *self.pipeline):
            if cycle is not None and not cycle.complete:
                cycle.lost()
        self.pipeline.clear()
        if self.write_paused is not None and not self.write_paused.done():
            self.write_paused.set_result(None)
        self.write_paused = None
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        # Break the connection's reference cycles (the parser holds this protocol's bound
        # callbacks; the last cycle names this protocol), so a closed connection is freed by
        # refcount, not left for the cyclic GC: clients that open a connection per call left
        # ~10 objects each. Nothing reads either after connection_lost.
        self.parser = None
        self.cycle = self.parsing = None

    def eof_received(self) -> None:
        pass

    def pause_writing(self) -> None:
        if self.write_paused is None:
            self.write_paused = self.loop.create_future()

    def resume_writing(self) -> None:
        if self.write_paused is not None:
            self.write_paused.set_result(None)
            self.write_paused = None

    def resume_reading(self) -> None:
        if self.refusal is not None:
            return  # nothing more is read after a request that could not be parsed
        if self.read_paused and not self.pipeline:
            self.read_paused = False
            self.transport.resume_reading()

    def pause_reading(self) -> None:
        if not self.read_paused:
            self.read_paused = True
            self.transport.pause_reading()

    def write_close(self, data: bytes) -> None:
        if not self.transport.is_closing():
            if data:
                self.transport.write(data)
            self.transport.close()

    def shutdown(self) -> None:
        """uvicorn's graceful shutdown: close when idle, else after the response in progress."""
        if self.cycle is None or self.cycle.complete:
            self.transport.close()
        else:
            self.cycle.keep_alive = False

    # -- timers: one per connection, re-armed only when it fires ------------------------------
    def _arm(self, secs: float) -> None:
        self.deadline = when = self.loop.time() + secs
        timer = self.timer
        if timer is not None and timer.when() > when:
            timer.cancel()
            timer = None
        if timer is None:
            self.timer = self.loop.call_at(when, self._on_timer)

    def _on_timer(self) -> None:
        self.timer = None
        if self.transport.is_closing():
            return
        busy = self.cycle is not None and not self.cycle.complete
        if busy and not self.in_head:
            return  # a request in progress: the app's deadlines apply; re-armed when it ends
        if self.deadline > self.loop.time():
            self.timer = self.loop.call_at(self.deadline, self._on_timer)
        elif self.in_head:
            self.write_close(plain_response(408, "the request head did not arrive in time"))
        else:
            self.transport.close()  # keep-alive idle

    # -- parsing ------------------------------------------------------------------------------
    def data_received(self, data: bytes) -> None:
        if not self.in_head and (self.cycle is None or self.cycle.complete):
            self._arm(self.keep_alive_secs)  # idle: activity moves the idle deadline
        try:
            self.parser.feed_data(data)
        except HeadTooLarge as exc:
            self._refuse(plain_response(431, str(exc)))
            return
        except UnknownCoding as exc:
            self._refuse(plain_response(501, str(exc)))
            return
        except httptools.HttpParserUpgrade:
            self._upgrade(data)
            return
        except httptools.HttpParserError as exc:
            if isinstance(exc.__context__, HeadTooLarge):
                self._refuse(plain_response(431, str(exc.__context__)))
            elif isinstance(exc.__context__, UnknownCoding):
                self._refuse(plain_response(501, str(exc.__context__)))
            else:
                self._refuse(plain_response(400, "invalid HTTP request"))
            return
        if self.in_head:
            self.head_bytes += len(data)
            if self.head_bytes > MAX_HEAD_BYTES:
                self._refuse(plain_response(431, f"the request head is over {MAX_HEAD_BYTES} bytes"))

    def _refuse(self, response: bytes) -> None:
        """Answer a request that cannot be parsed and close, but after the responses to the
        complete requests pipelined before it: those keep their answers, in order. A request
        broken in its body (its own cycle is running) closes at once, as before."""
        earlier = (self.cycle is not None and not self.cycle.complete) or bool(self.pipeline)
        if self.in_head and earlier and self.parsing is not None and not self.parsing.more_body:
            self.refusal = response
            self.in_head = False  # the head is over (refused): the head timer no longer applies
            self.pause_reading()
            return
        self.write_close(response)

    def on_message_begin(self) -> None:
        self.in_head = True
        self.head_bytes = self.header_count = self.header_bytes = 0
        self.url = b""
        self.headers = []
        self.expect_continue = False
        self.upgrade = None
        self._arm(HEAD_TIMEOUT)

    def on_url(self, url: bytes) -> None:
        self.url += url
        if len(self.url) > MAX_HEAD_BYTES:
            raise HeadTooLarge(f"the request target is over {MAX_HEAD_BYTES} bytes")

    def on_header(self, name: bytes, value: bytes) -> None:
        self.header_count += 1
        self.header_bytes += len(name) + len(value) + 4
        if self.header_count > MAX_HEADERS:
            raise HeadTooLarge(f"the request has more than {MAX_HEADERS} headers")
        if self.header_bytes + len(self.url) > MAX_HEAD_BYTES:
            raise HeadTooLarge(f"the request head is over {MAX_HEAD_BYTES} bytes")
        name = name.lower()
        if name == b"expect" and value.lower() == b"100-continue":
            self.expect_continue = True
        elif name == b"upgrade":
            self.upgrade = value.lower()
        elif name == b"transfer-encoding" and value.strip().lower() != b"chunked":
            raise UnknownCoding("the only transfer coding accepted is chunked")
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        self.in_head = False
        parser = self.parser
        version = parser.get_http_version()
        method = parser.get_method().decode("ascii")
        if self.upgrade == b"websocket" and parser.should_upgrade():
            self.parsing = None
            return  # handed to the WebSocket protocol in data_received
        url = httptools.parse_url(self.url)
        raw_path = url.path
        path = raw_path.decode("ascii")
        if "%" in path:
            path = unquote(path)
        scope = {
            "type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": version,
            "server": self.server, "client": self.client, "scheme": self.scheme, "root_path": "",
            "headers": self.headers, "state": self.app_state.copy(), "method": method, "path": path,
            "raw_path": raw_path, "query_string": url.query or b"",
        }
        keep_alive = version != "1.0" and parser.should_keep_alive()
        cycle = Cycle(self, scope, keep_alive, self.expect_continue)
        self.parsing = cycle
        if self.cycle is None or self.cycle.complete:
            self._start(cycle)
        else:  # pipelined: answered in order, after the one in progress
            self.pipeline.append(cycle)
            self.pause_reading()

    def on_body(self, body: bytes) -> None:
        cycle = self.parsing
        if cycle is None or cycle.complete:
            return
        cycle.body += body
        if len(cycle.body) > HIGH_WATER:
            self.pause_reading()
        cycle.wake()

    def on_message_complete(self) -> None:
        cycle = self.parsing
        if cycle is None or cycle.complete:
            return
        cycle.more_body = False
        cycle.wake()

    # -- requests -----------------------------------------------------------------------------
    def _start(self, cycle: Cycle) -> None:
        self.cycle = cycle
        task = cycle.task = self.loop.create_task(cycle.run(self.app))
        tasks = self.server_state.tasks
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    def response_done(self, cycle: Cycle) -> None:
        self.server_state.total_requests += 1
        if self.refusal is not None and not self.pipeline:  # the broken request behind this one
            self.write_close(self.refusal)
            return
        if not cycle.keep_alive:
            self.write_close(b"")
            return
        if self.transport.is_closing():
            return
        if self.pipeline:
            self._start(self.pipeline.popleft())
            if not self.pipeline:
                self.resume_reading()
        else:
            self.resume_reading()
            if not self.in_head:
                self._arm(self.keep_alive_secs)

    def _upgrade(self, data: bytes) -> None:
        """A WebSocket upgrade: the connection goes to uvicorn's WebSocket protocol, fed the
        request head again (as uvicorn's own HTTP protocols do)."""
        ws_class = self.config.ws_protocol_class
        if self.upgrade != b"websocket" or ws_class is None:
            # Another protocol (h2c...): served as a request without a body, then closed.
            if self.parsing is not None:
                self.parsing.more_body, self.parsing.keep_alive = False, False
                self.parsing.wake()
            return
        if self.cycle is not None and not self.cycle.complete:
            self.write_close(plain_response(400, "a WebSocket upgrade pipelined behind a request"))
            return
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.server_state.connections.discard(self)
        method = self.parser.get_method()
        head = [method, b" ", self.url, b" HTTP/1.1\r\n"]
        for name, value in self.headers:
            head += (name, b": ", value, b"\r\n")
        head.append(b"\r\n")
        proto = ws_class(config=self.config, server_state=self.server_state, app_state=self.app_state)
        proto.connection_made(self.transport)
        proto.data_received(b"".join(head))
        self.transport.set_protocol(proto)
