#!/usr/bin/env python3
"""The cheapest Python HTTP proxy, for scripts/bench-gateway's tail rounds: what any Python
gateway on this event loop costs per call before it does anything of its own.

uvloop, httptools parsing the request and the response (as the gateway does), one upstream
keep-alive connection per client connection, each message written in one transport.write. No
authentication, limits, audit, metrics or routing; non-streaming responses only (the body is
re-framed with Content-Length). Not part of Fabric: a measuring stick.
Usage: relay_floor.py LISTEN_PORT UPSTREAM_PORT
"""

import asyncio
import sys

import httptools
import uvloop

DROP = (b"content-length", b"connection", b"transfer-encoding", b"authorization", b"host")


def head(first: bytes, headers: list, body: bytes) -> bytes:
    lines = [first]
    for name, value in headers:
        if name.lower() not in DROP:
            lines += (name, b": ", value, b"\r\n")
    lines.append(b"content-length: %d\r\n\r\n" % len(body))
    return b"".join(lines) + body


class Message:
    """httptools callbacks for one message at a time."""

    def on_message_begin(self):
        self.headers, self.body, self.url = [], [], b""

    def on_url(self, url):
        self.url += url

    def on_header(self, name, value):
        self.headers.append((name, value))

    def on_body(self, body):
        self.body.append(body)


class Upstream(Message, asyncio.Protocol):
    def __init__(self, client: asyncio.Transport):
        self.client = client
        self.parser = httptools.HttpResponseParser(self)

    def data_received(self, data):
        self.parser.feed_data(data)

    def on_message_complete(self):
        status = self.parser.get_status_code()
        self.client.write(head(b"HTTP/1.1 %d OK\r\n" % status, self.headers, b"".join(self.body)))


class Client(Message, asyncio.Protocol):
    upstream_port = 0

    def connection_made(self, transport):
        self.transport, self.upstream, self.queued = transport, None, []
        self.parser = httptools.HttpRequestParser(self)
        asyncio.get_running_loop().create_task(self.connect())

    async def connect(self):
        loop = asyncio.get_running_loop()
        self.upstream, _ = await loop.create_connection(lambda: Upstream(self.transport), "127.0.0.1",
                                                        self.upstream_port)
        for data in self.queued:
            self.upstream.write(data)

    def data_received(self, data):
        self.parser.feed_data(data)

    def on_message_complete(self):
        method = self.parser.get_method()
        data = head(method + b" " + self.url + b" HTTP/1.1\r\nhost: upstream\r\n", self.headers, b"".join(self.body))
        if self.upstream is None:
            self.queued.append(data)
        else:
            self.upstream.write(data)

    def connection_lost(self, exc):
        if self.upstream is not None:
            self.upstream.close()


async def main(listen: int, upstream: int) -> None:
    Client.upstream_port = upstream
    server = await asyncio.get_running_loop().create_server(Client, "127.0.0.1", listen)
    await server.serve_forever()


if __name__ == "__main__":
    uvloop.run(main(int(sys.argv[1]), int(sys.argv[2])))
