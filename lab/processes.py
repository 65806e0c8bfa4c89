"""Start, find and stop the lab's processes (fabricd, the agent, the gateway).

Each process runs detached in its own session with its log under ``{state}/logs`` and its pid
under ``{state}/pids``. Stopping reads the pid files and also scans /proc for any process whose
command line names this lab's state directory, so a lab whose launcher crashed is still cleaned.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def bin_path(name: str) -> str:
    """Console scripts live next to the interpreter in the venv."""
    return str(Path(sys.executable).parent / name)


def start(state: Path, name: str, cmd: list[str], env: dict[str, str], pass_fds: tuple[int, ...] = ()) -> int:
    (state / "logs").mkdir(parents=True, exist_ok=True)
    (state / "pids").mkdir(parents=True, exist_ok=True)
    with open(state / "logs" / f"{name}.log", "ab") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env={**os.environ, **env}, start_new_session=True, close_fds=True,
                                pass_fds=pass_fds)
    (state / "pids" / f"{name}.pid").write_text(str(proc.pid))
    return proc.pid


def _matching_pids(state: Path) -> set[int]:
    pids = set()
    marker = str(state.resolve())
    for p in (state / "pids").glob("*.pid") if (state / "pids").exists() else []:
        try:
            pids.add(int(p.read_text().strip()))
        except ValueError:
            pass
    mine = ancestors()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) in mine:
            continue
        try:
            args = (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        # Only the lab's own services (`... serve --state-dir STATE/...`), never the shell,
        # `timeout` or `make` that launched this command with the same path in its arguments.
        if "serve" in args and any(a.startswith(marker) for a in args):
            pids.add(int(proc.name))
    return pids


def ancestors() -> set[int]:
    out, pid = set(), os.getpid()
    while pid > 1:
        out.add(pid)
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return out


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        return "Z" not in (Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0])
    except OSError:
        return False


def stop_all(state: Path, grace: float = 5.0) -> list[int]:
    """TERM every lab process, KILL what is left after the grace; returns the pids found."""
    pids = {p for p in _matching_pids(state) if alive(p)}
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.1)
    for pid in pids:
        if alive(pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    for p in (state / "pids").glob("*.pid") if (state / "pids").exists() else []:
        p.unlink(missing_ok=True)
    return sorted(pids)


def running(state: Path) -> list[int]:
    return sorted(p for p in _matching_pids(state) if alive(p))
