"""Listen addresses, shared by every process's `serve`: HOST:PORT parsing and the loopback rule.

Plain HTTP (`--insecure`) is only ever bound to a loopback address; `is_loopback` is the one
definition of that rule.
"""

from __future__ import annotations

import ipaddress


def parse_listen(listen: str) -> tuple[str, int]:
    """'HOST:PORT' (or '[v6]:PORT') -> (host, port); ValueError naming the bad value."""
    host, sep, port = listen.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"--listen {listen!r}: expected HOST:PORT, e.g. 127.0.0.1:8443")
    return host, int(port)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
