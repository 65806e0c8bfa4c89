"""A replica for the two-balancer lab: answers every line it reads with its name and the line.

    python -m lab.ecmp_replica serve --name n1r1 [--port 80]

One connection is one stream: the client writes a line whenever it wants the next chunk and
reads `NAME LINE` back, so a test can hold a connection idle, move it between balancer nodes
and see which backend answers, and whether the same one still does. Run inside the replica's
namespace (`ip netns exec`); it binds 0.0.0.0 so both the replica's own address (nat) and the
VIP on its loopback (dsr-ipip) reach it.
"""

from __future__ import annotations

import argparse
import socketserver


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="ecmp_replica")
    sub = parser.add_subparsers(dest="cmd", required=True)
    serve = sub.add_parser("serve")
    serve.add_argument("--name", required=True)
    serve.add_argument("--port", type=int, default=80)
    args = parser.parse_args(argv)
    name = args.name.encode()

    class Handler(socketserver.StreamRequestHandler):
        def handle(self) -> None:
            for line in self.rfile:
                self.wfile.write(name + b" " + line)
                self.wfile.flush()

    class Server(socketserver.ThreadingTCPServer):
        allow_reuse_address = True
        daemon_threads = True
        request_queue_size = 256

    with Server(("0.0.0.0", args.port), Handler) as server:
        server.serve_forever()


if __name__ == "__main__":
    main()
