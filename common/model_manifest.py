"""A model directory's manifest and digest: shared by the agent (which verifies what it
downloads) and fabricd (which pushes a local model to another site, controlplane.models.replicate)
and the receiving fabricd (controlplane.api.model_blobs).

The manifest is one ``relative-path size sha256`` line per regular file, sorted by path, each
ending in a newline; the directory's digest is the SHA-256 of that text. The walk never follows a
symlink and refuses special files, so a hostile directory cannot make us read outside it; names
that leave the directory (absolute, ``..``, empty parts, backslashes, NUL) are refused, and so
are names holding any control character (a newline in a name could forge a manifest line, so
two different trees could share a digest): with them refused, a line's path is everything before
its last two spaces, one way only. The top-level IGNORED_DIRS are outside the digest; a cached
copy never keeps them (``strip_ignored``), so what is served is what was hashed.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

DEFAULT_MAX_FILES = 10000
READ_CHUNK = 4 << 20
# Dot-directories huggingface_hub or we may leave behind; never part of a model.
IGNORED_DIRS = (".cache", ".fabric")
# The files a gateway hashes prompts with (agent/kv_index/routes.py serves them, gateway/kv_source.py checks them).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


class CheckFailed(Exception):
    """A model failed a check; the message names what and which file (never a secret)."""

    def __init__(self, stage: str, message: str):
        super().__init__(message)
        self.stage = stage
        self.message = message


@dataclass(frozen=True)
class ManifestEntry:
    path: str  # relative, POSIX separators
    size: int
    sha256: str


@dataclass(frozen=True)
class Manifest:
    entries: tuple[ManifestEntry, ...]

    def text(self) -> str:
        return "".join(f"{e.path} {e.size} {e.sha256}\n" for e in sorted(self.entries, key=lambda e: e.path))

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.text().encode()).hexdigest()

    @property
    def size(self) -> int:
        return sum(e.size for e in self.entries)

    @property
    def safetensors(self) -> int:
        return sum(1 for e in self.entries if e.path.endswith(".safetensors"))


def has_control(name: str) -> bool:
    return any(ord(c) < 0x20 or ord(c) == 0x7F for c in name)


def check_relative_name(name: str) -> str:
    """A repository file name that stays inside the model directory, or CheckFailed."""
    bad = (not name or "\\" in name or "\0" in name or name.startswith("/")
           or any(part in ("", ".", "..") for part in name.split("/")))
    if bad or PurePosixPath(name).is_absolute():
        raise CheckFailed("Scanning", f"file name {name!r} leaves the model directory")
    if has_control(name):
        raise CheckFailed("Scanning", f"file name {name!r} holds a control character")
    return name


def strip_ignored(root: Path) -> None:
    """Remove the top-level IGNORED_DIRS from a directory about to be cached (they are not in its
    digest, so they must not be served with it); a symlink by such a name is removed, not followed."""
    for name in IGNORED_DIRS:
        p = root / name
        if p.is_symlink() or p.is_file():
            p.unlink()
        elif p.is_dir():
            shutil.rmtree(p)


def walk_files(root: Path, max_files: int = DEFAULT_MAX_FILES) -> list[str]:
    """Relative paths of the regular files under root, refusing symlinks and special files.
    Stops as soon as there are more than max_files (a hostile directory may hold millions)."""
    out: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        rel_dir = Path(dirpath).relative_to(root)
        if rel_dir == Path("."):
            dirnames[:] = [d for d in dirnames if d not in IGNORED_DIRS]
        for d in dirnames:
            if Path(dirpath, d).is_symlink():
                raise CheckFailed("Scanning", f"{(rel_dir / d).as_posix()} is a symlink; symlinks are refused")
        for name in (*dirnames, *filenames):
            if has_control(name):
                raise CheckFailed("Scanning", f"file name {(rel_dir / name).as_posix()!r} holds a control character")
        for name in filenames:
            full = Path(dirpath, name)
            rel = (rel_dir / name).as_posix()
            mode = full.lstat().st_mode
            if stat.S_ISLNK(mode):
                raise CheckFailed("Scanning", f"{rel} is a symlink; symlinks are refused")
            if not stat.S_ISREG(mode):
                raise CheckFailed("Scanning", f"{rel} is not a regular file")
            out.append(rel)
            if len(out) > max_files:
                raise CheckFailed("Scanning", f"more than FABRIC_MODEL_MAX_FILES ({max_files}) files")
    return sorted(out)


def sha256_file(path: Path, on_bytes: Callable[[int], None] | None = None) -> str:
    h = hashlib.sha256()
    buf = bytearray(READ_CHUNK)
    view = memoryview(buf)
    # O_NOFOLLOW: a file swapped for a symlink after the walk is refused, not followed
    with open(os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)), "rb", buffering=0) as f:
        while n := f.readinto(buf):
            h.update(view[:n])
            if on_bytes is not None:
                on_bytes(n)
    return h.hexdigest()


def build_manifest(root: Path, max_files: int = DEFAULT_MAX_FILES,
                   on_bytes: Callable[[int], None] | None = None) -> Manifest:
    """Hash every regular file under root (no symlink followed) into a manifest."""
    entries = []
    for rel in walk_files(root, max_files):
        full = root / rel
        entries.append(ManifestEntry(rel, full.stat().st_size, sha256_file(full, on_bytes)))
    return Manifest(tuple(entries))


def parse_manifest(text: str, max_files: int = DEFAULT_MAX_FILES) -> Manifest:
    """A manifest's text back into entries, refusing any line that is not ``path size sha256``
    with a safe relative path, a duplicate path, or more than max_files lines (CheckFailed)."""
    entries = []
    seen: set[str] = set()
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if len(lines) > max_files:
        raise CheckFailed("Verifying", f"manifest lists more than {max_files} files")
    for line in lines:
        path, _, rest = line.rpartition(" ")
        path, _, size = path.rpartition(" ")
        sha = rest
        if not path or not size.isdigit() or len(sha) != 64 or any(c not in "0123456789abcdef" for c in sha):
            raise CheckFailed("Verifying", f"manifest line {line[:80]!r} is not 'path size sha256'")
        check_relative_name(path)
        if path in seen:
            raise CheckFailed("Verifying", f"manifest lists {path!r} twice")
        seen.add(path)
        entries.append(ManifestEntry(path, int(size), sha))
    manifest = Manifest(tuple(entries))
    if manifest.text() != text:
        raise CheckFailed("Verifying", "manifest is not in canonical form (sorted, one newline per line)")
    return manifest


def verify_served_files(digest: str, manifest_text: str, files: dict[str, bytes], required: tuple[str, ...],
                        max_files: int = DEFAULT_MAX_FILES) -> None:
    """Check files a peer served as part of the model ``digest``: the manifest must hash to the
    digest, every served file must match its line (size and SHA-256), and every name of
    ``required`` the manifest lists must be served (leaving out a config that changes behaviour
    is tampering too). CheckFailed names the first mismatch."""
    if hashlib.sha256(manifest_text.encode()).hexdigest() != digest:
        raise CheckFailed("Verifying", "the manifest does not hash to the model's digest")
    listed = {e.path: e for e in parse_manifest(manifest_text, max_files).entries}
    for name, data in files.items():
        entry = listed.get(name)
        if entry is None:
            raise CheckFailed("Verifying", f"{name} is not in the model's manifest")
        if len(data) != entry.size or hashlib.sha256(data).hexdigest() != entry.sha256:
            raise CheckFailed("Verifying", f"{name} does not match the model's manifest")
    missing = sorted(n for n in required if n in listed and n not in files)
    if missing:
        raise CheckFailed("Verifying", f"{', '.join(missing)} listed in the manifest but not served")
