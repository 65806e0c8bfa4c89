"""A small Hugging Face-compatible mirror on loopback: the endpoints huggingface_hub calls to
resolve a revision and download files, serving repositories from a local directory.

    GET  /api/models/{org}/{name}[/revision/{rev}][?blobs=true]   model info: id, sha, siblings
    HEAD /{org}/{name}/resolve/{rev}/{path}                        ETag, X-Repo-Commit, Content-Length
    GET  /{org}/{name}/resolve/{rev}/{path}                        the bytes; Range: bytes=N- -> 206

A repository is ``{root}/{org}/{name}/`` (its files, any depth). Its one commit is the SHA-1 of
its file listing, so ``main`` and that sha both name it; any other revision is 404
``RevisionNotFound``. A repository listed in ``gated`` answers 401 ``GatedRepo`` unless the
request carries ``Authorization: Bearer {token}``. Errors carry ``X-Error-Code`` the way the
Hub does, so the client raises its own typed errors. ``rate`` (bytes/s per response) slows
downloads for resume tests; ``requests`` records (method, path, Range) of each call.

The lab (`make run`) and the tests run it; `python -m lab.hf_mirror serve
--root DIR --listen 127.0.0.1:PORT` serves one by hand. It is a test double for the Hub's download
protocol only: no uploads, no xet, no auth beyond the gated check.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import socket
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

CHUNK = 1 << 20


@dataclass
class MirrorConfig:
    root: Path
    gated: dict[str, str] = field(default_factory=dict)  # repo -> token that may read it
    rate: float | None = None  # bytes per second per response, None: as fast as possible
    # The last calls (method, path, Range), bounded: a lab mirror runs for hours.
    requests: deque[tuple[str, str, str]] = field(default_factory=lambda: deque(maxlen=10000))


def _files(repo_dir: Path) -> list[Path]:
    return sorted(p for p in repo_dir.rglob("*") if p.is_file() and not p.is_symlink())


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


class _HashCache:
    """SHA-256 per (path, size, mtime): a model info or HEAD must not re-read gigabytes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._known: dict[tuple[str, int, int], str] = {}

    def sha256(self, path: Path) -> str:
        st = path.stat()
        key = (str(path), st.st_size, st.st_mtime_ns)
        with self._lock:
            if key in self._known:
                return self._known[key]
        digest = file_sha256(path)
        with self._lock:
            if len(self._known) > 100_000:
                self._known.clear()
            self._known[key] = digest
        return digest


def commit_of(repo_dir: Path) -> str:
    """The repository's one commit: SHA-1 over its file names, sizes and modification times."""
    h = hashlib.sha1()
    for p in _files(repo_dir):
        st = p.stat()
        h.update(f"{p.relative_to(repo_dir).as_posix()} {st.st_size} {st.st_mtime_ns}\n".encode())
    return h.hexdigest()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, *args) -> None:  # quiet: tests read .requests instead
        pass

    def _error(self, status: int, code: str, message: str) -> None:
        body = json.dumps({"error": message}).encode()
        self.send_response(status)
        self.send_header("X-Error-Code", code)
        # never a CR or LF (or any control character) from a caller's path into a header line
        self.send_header("X-Error-Message", "".join(ch if ch.isprintable() else "?" for ch in message))
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _repo(self, org: str, name: str) -> Path | None:
        cfg = self.server.cfg
        if "/" in org or "/" in name or org.startswith(".") or name.startswith("."):
            return None
        d = cfg.root / org / name
        return d if d.is_dir() else None

    def _allowed(self, repo: str) -> bool:
        token = self.server.cfg.gated.get(repo)
        return token is None or self.headers.get("Authorization", "") == f"Bearer {token}"

    def do_HEAD(self) -> None:
        self._serve()

    def do_GET(self) -> None:
        self._serve()

    def _serve(self) -> None:
        url = urlsplit(self.path)
        parts = [unquote(p) for p in url.path.split("/") if p]
        self.server.cfg.requests.append((self.command, url.path, self.headers.get("Range", "")))
        if any(not part.isprintable() for part in parts):  # %0d%0a and the like: refused, never echoed
            return self._error(400, "BadRequest", "the path holds a control character")
        if parts[:2] == ["api", "models"] and len(parts) >= 4:
            org, name, rest = parts[2], parts[3], parts[4:]
            rev = rest[1] if len(rest) == 2 and rest[0] == "revision" else ("main" if not rest else None)
            return self._info(org, name, rev)
        if len(parts) >= 5 and parts[2] == "resolve":
            return self._resolve(parts[0], parts[1], parts[3], "/".join(parts[4:]))
        self._error(404, "EntryNotFound", "no such route")

    def _checked(self, org: str, name: str, rev: str | None) -> tuple[Path, str] | None:
        repo_dir = self._repo(org, name)
        if repo_dir is None:
            self._error(404, "RepoNotFound", f"repository {org}/{name} not found")
            return None
        if not self._allowed(f"{org}/{name}"):
            self._error(401, "GatedRepo", f"access to {org}/{name} is restricted")
            return None
        commit = commit_of(repo_dir)
        if rev not in ("main", commit):
            self._error(404, "RevisionNotFound", f"revision {rev} not found")
            return None
        return repo_dir, commit

    def _info(self, org: str, name: str, rev: str | None) -> None:
        found = self._checked(org, name, rev)
        if found is None:
            return
        repo_dir, commit = found
        siblings = []
        for p in _files(repo_dir):
            size = p.stat().st_size
            sha = self.server.hashes.sha256(p)
            siblings.append({"rfilename": p.relative_to(repo_dir).as_posix(), "size": size,
                             "blobId": hashlib.sha1(sha.encode()).hexdigest(),
                             "lfs": {"sha256": sha, "size": size, "pointerSize": 134}})
        repo = f"{org}/{name}"
        body = json.dumps({"id": repo, "modelId": repo, "sha": commit, "private": False,
                           "gated": "manual" if repo in self.server.cfg.gated else False,
                           "siblings": siblings}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _resolve(self, org: str, name: str, rev: str, rel: str) -> None:
        found = self._checked(org, name, rev)
        if found is None:
            return
        repo_dir, commit = found
        path = (repo_dir / rel).resolve()
        if repo_dir.resolve() not in path.parents or not path.is_file():
            return self._error(404, "EntryNotFound", f"{rel} not found in {org}/{name}")
        size = path.stat().st_size
        start = 0
        rng = self.headers.get("Range", "")
        if rng.startswith("bytes=") and rng[6:].split("-", 1)[0].isdigit():
            start = int(rng[6:].split("-", 1)[0])
            if start >= size:
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{size}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
        self.send_response(206 if start else 200)
        self.send_header("ETag", f'"{self.server.hashes.sha256(path)}"')
        self.send_header("X-Repo-Commit", commit)
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(size - start))
        if start:
            self.send_header("Content-Range", f"bytes {start}-{size - 1}/{size}")
        self.end_headers()
        if self.command == "HEAD":
            return
        with open(path, "rb") as f:
            rate = self.server.cfg.rate
            if rate is None:
                self.wfile.flush()
                self.connection.sendfile(f, offset=start, count=size - start)
                return
            f.seek(start)
            step = max(1, int(rate / 20))
            began, sent = time.monotonic(), 0
            while chunk := f.read(step):
                try:
                    self.wfile.write(chunk)
                except (BrokenPipeError, ConnectionResetError):
                    return
                sent += len(chunk)
                ahead = sent / rate - (time.monotonic() - began)
                if ahead > 0:
                    time.sleep(ahead)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    cfg: MirrorConfig
    hashes: _HashCache

    def handle_error(self, request, client_address) -> None:
        # A client that goes away mid-answer (a killed agent, a timeout) is routine here.
        import sys

        if not isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            super().handle_error(request, client_address)


class HfMirror:
    """Serve a mirror on ``host:port`` (0: any free port) in a background thread, or on a
    listening socket handed in (``sock``: the lab binds its port itself and passes the socket, so
    nobody else's server can stand in for the mirror)."""

    def __init__(self, cfg: MirrorConfig, host: str = "127.0.0.1", port: int = 0, sock: socket.socket | None = None):
        self.cfg = cfg
        if sock is None:
            self.server = _Server((host, port), _Handler)
        else:
            self.server = _Server(sock.getsockname()[:2], _Handler, bind_and_activate=False)
            self.server.socket.close()
            self.server.socket = sock
            self.server.server_address = sock.getsockname()[:2]
            self.server.server_activate()
        self.server.cfg = cfg
        self.server.hashes = _HashCache()
        self._thread = threading.Thread(target=self.server.serve_forever, name="hf-mirror", daemon=True)

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> HfMirror:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> HfMirror:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="serve a Hugging Face-compatible mirror of a local directory")
    p.add_argument("command", choices=["serve"], help="serve the mirror (the lab finds its processes by it)")
    p.add_argument("--root", type=Path, required=True, help="directory holding ORG/NAME/ repositories")
    p.add_argument("--listen", default="127.0.0.1:0", help="HOST:PORT (loopback)")
    p.add_argument("--listen-fd", type=int, help="serve on this inherited, bound socket (the lab's own port)")
    p.add_argument("--tiny", metavar="ORG/NAME", help="first write a tiny safetensors model there, laid out "
                                                      "like a Llama 3.x repository (original/*.pth, a .bin copy)")
    p.add_argument("--tiny-adapter", metavar="ORG/NAME", action="append", default=[],
                   help="first write a tiny LoRA adapter there (repeatable)")
    args = p.parse_args(argv)
    # Written once: rewriting would change the commit a stored model may already be pinned to.
    from lab.tiny_model import write_tiny_adapter, write_tiny_model

    if args.tiny and not (args.root / args.tiny).is_dir():
        write_tiny_model(args.root / args.tiny, llama_layout=True)
    for repo in args.tiny_adapter:
        if not (args.root / repo).is_dir():
            write_tiny_adapter(args.root / repo, base=args.tiny or "")
    if args.listen_fd is not None:
        mirror = HfMirror(MirrorConfig(args.root), sock=socket.socket(fileno=args.listen_fd))
    else:
        host, _, port = args.listen.rpartition(":")
        mirror = HfMirror(MirrorConfig(args.root), host, int(port))
    print(f"hf mirror of {args.root} at {mirror.url}", flush=True)
    mirror.server.serve_forever()


if __name__ == "__main__":
    main()
