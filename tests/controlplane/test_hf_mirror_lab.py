"""The lab's HF mirror (issue 50, Low): a path with CR/LF cannot write a header of its own into
the answer, and the lab serves the mirror on a socket it bound itself, so another local server
on the mirror's port is refused instead of being taken for the mirror."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from lab.cluster import mirror_socket
from lab.hf_mirror import HfMirror, MirrorConfig


def test_a_crlf_in_the_path_is_refused_and_writes_no_header(tmp_path):
    with HfMirror(MirrorConfig(tmp_path)) as m:
        host, port = m.server.server_address[:2]
        with socket.create_connection((host, port)) as s:
            s.sendall(b"GET /api/models/org/x%0d%0aSet-Cookie:%20pwned=1/revision/main HTTP/1.1\r\n"
                      b"Host: x\r\nConnection: close\r\n\r\n")
            answer = b""
            while chunk := s.recv(65536):
                answer += chunk
        head = answer.split(b"\r\n\r\n", 1)[0].decode()
        assert head.startswith("HTTP/1.0 400") or head.startswith("HTTP/1.1 400"), head
        assert "Set-Cookie" not in head and "pwned" not in head


def test_the_lab_refuses_a_mirror_port_someone_else_holds():
    squatter = socket.socket()
    squatter.bind(("127.0.0.1", 0))
    squatter.listen(1)
    port = squatter.getsockname()[1]
    try:
        with pytest.raises(RuntimeError, match="already in use|taken"), mirror_socket(port):
            pass
    finally:
        squatter.close()


def test_the_mirror_serves_on_the_socket_the_lab_bound(tmp_path):
    (tmp_path / "org" / "m").mkdir(parents=True)
    (tmp_path / "org" / "m" / "config.json").write_text("{}")
    with mirror_socket(0) as sock:
        port = sock.getsockname()[1]
        proc = subprocess.Popen([sys.executable, "-m", "lab.hf_mirror", "serve", "--root", str(tmp_path),
                                 "--listen-fd", str(sock.fileno())], pass_fds=(sock.fileno(),),
                                cwd=Path(__file__).resolve().parents[2])
    try:
        r = httpx.get(f"http://127.0.0.1:{port}/api/models/org/m", timeout=30)
        assert r.status_code == 200 and r.json()["id"] == "org/m"
    finally:
        proc.terminate()
        proc.wait(10)
