"""A serve whose port is taken names the holder (common.port_holder), through the real
`fabricd serve` console script against a listener this test holds on loopback."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

from common.port_holder import busy, holders
from lab.rigs.polling import clean_env
from lab.rigs.servers import free_port

BIN = Path(sys.executable).parent


def test_a_free_port_is_not_busy_and_a_held_one_names_its_process():
    assert busy("127.0.0.1", free_port()) is None
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        assert (os.getpid(), " ".join(Path("/proc/self/cmdline").read_bytes().decode().split("\0")).strip()) in \
            holders(port)
        why = busy("127.0.0.1", port)
    assert why is not None and why.startswith(f"127.0.0.1:{port} is already in use by pid {os.getpid()} (")


def test_fabricd_serve_on_a_taken_port_says_who_holds_it(tmp_path):
    env = clean_env({})
    subprocess.run([str(BIN / "fabricd"), "init", "--state-dir", str(tmp_path / "fd")], check=True,
                   capture_output=True, env=env)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        proc = subprocess.run([str(BIN / "fabricd"), "serve", "--state-dir", str(tmp_path / "fd"), "--insecure",
                               "--no-controllers", "--listen", f"127.0.0.1:{port}"], capture_output=True, text=True,
                              env=env, timeout=60)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr and "Errno 98" not in proc.stderr, proc.stderr
    assert f"is already in use by pid {os.getpid()}" in proc.stderr and "pick another with --listen" in proc.stderr
