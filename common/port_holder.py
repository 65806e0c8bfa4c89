"""Who holds a TCP port: for a `serve` whose --listen port is taken, so the refusal names the
process (pid and command line) instead of uvicorn's bare `[Errno 98] address already in use`.

``busy(host, port)`` tries the bind the server would make (SO_REUSEADDR, like uvicorn) and
returns None when it would succeed; otherwise a sentence naming the listener, found through
/proc/net/tcp{,6} (the socket's inode) and /proc/PID/fd (which process has that inode). A
holder in another user's process or another network namespace may not be found: the sentence
then says only that the port is taken.
"""

from __future__ import annotations

import errno
import socket
from pathlib import Path

LISTEN_STATE = "0A"


def _listening_inodes(port: int, proc: Path) -> set[str]:
    inodes = set()
    for table in ("tcp", "tcp6"):
        try:
            lines = (proc / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            parts = line.split()
            if len(parts) > 9 and parts[3] == LISTEN_STATE and int(parts[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(parts[9])
    return inodes


def holders(port: int, proc: Path = Path("/proc")) -> list[tuple[int, str]]:
    """(pid, command line) of each process with a socket listening on port."""
    wanted = {f"socket:[{i}]" for i in _listening_inodes(port, proc)}
    found: list[tuple[int, str]] = []
    if not wanted:
        return found
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fds = list((entry / "fd").iterdir())
            if any(_link(fd) in wanted for fd in fds):
                cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
                found.append((int(entry.name), cmd))
        except OSError:
            continue
    return sorted(found)


def _link(fd: Path) -> str:
    try:
        return str(fd.readlink())
    except OSError:
        return ""


def busy(host: str, port: int) -> str | None:
    """None if host:port can be bound now, else why not (naming the holder when it can)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
            return None
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                return None  # not ours to explain: the server's own bind reports it
    found = holders(port)
    if not found:
        return f"{host}:{port} is already in use (by a process this user cannot see)"
    pid, cmd = found[0]
    text = f"{host}:{port} is already in use by pid {pid} ({cmd[:200]})"
    if "lab" in cmd and ("fabricd" in cmd or "fabric-gateway" in cmd or "fabric-agent" in cmd):
        text += "; it is the lab's: `fabric-lab status` shows it, `fabric-lab down` stops it"
    return text
