"""The checks a model directory must pass before it is Ready. Pure functions over a directory.

  digest      SHA-256 of the directory's manifest: one ``relative-path size sha256`` line per
              regular file, sorted by path, each ending in a newline. Every byte of every file
              counts, never only the first file, and renaming or moving a file changes it.
  checksum    ``require_checksum``: refuse without an expected digest, and unless it matches.
  signature   a set ``signature`` must equal HMAC-SHA256(FABRIC_MODEL_SIGNING_KEY, digest) in hex;
              a signed model on a node without the key fails saying so.
  scan        refuses pickle formats (.pkl, .pickle, .pt, .pth; a .bin is not one), more than
              FABRIC_MODEL_MAX_FILES (10000) files, symlinks and special files, and names that
              leave the model directory (absolute, ``..``, backslashes, NUL). Safetensors files are
              counted (the engine prefers them).
The manifest walk never follows a symlink, so a hostile local directory cannot make us read
files outside it while hashing. Each refusal is a ``CheckFailed`` whose message names the file.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import stat
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

PICKLE_SUFFIXES = (".pkl", ".pickle", ".pt", ".pth")
DEFAULT_MAX_FILES = 10000
READ_CHUNK = 4 << 20
# Dot-directories huggingface_hub or we may leave behind; never part of a model.
IGNORED_DIRS = (".cache", ".fabric")


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


def check_relative_name(name: str) -> str:
    """A repository file name that stays inside the model directory, or CheckFailed."""
    bad = (not name or "\\" in name or "\0" in name or name.startswith("/")
           or any(part in ("", ".", "..") for part in name.split("/")))
    if bad or PurePosixPath(name).is_absolute():
        raise CheckFailed("Scanning", f"file name {name!r} leaves the model directory")
    return name


def scan_names(names: Iterable[str], max_files: int = DEFAULT_MAX_FILES) -> None:
    """The name rules of the scan: applied to a repository listing before anything is
    downloaded, and again to the files on disk."""
    names = list(names)
    if len(names) > max_files:
        raise CheckFailed("Scanning", f"{len(names)} files is more than FABRIC_MODEL_MAX_FILES ({max_files})")
    for name in sorted(names):
        check_relative_name(name)
        if name.lower().endswith(PICKLE_SUFFIXES):
            raise CheckFailed("Scanning", f"{name} is a pickle file ({', '.join(PICKLE_SUFFIXES)} are refused: "
                                          "loading one runs code); publish safetensors instead")


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
    with open(path, "rb", buffering=0) as f:
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


def scan(root: Path, max_files: int = DEFAULT_MAX_FILES) -> int:
    """The Scanning stage over the files on disk; returns the number of safetensors files."""
    files = walk_files(root, max_files)
    scan_names(files, max_files)
    return sum(1 for f in files if f.endswith(".safetensors"))


def signature_of(digest: str, key: bytes) -> str:
    return hmac.new(key, digest.encode(), hashlib.sha256).hexdigest()


def check_policy(digest: str, *, expected_digest: str | None, require_checksum: bool,
                 signature: str | None, signing_key: bytes | None) -> None:
    """Checksum and signature rules of the Verifying stage (see the module docstring)."""
    if require_checksum and not expected_digest:
        raise CheckFailed("Verifying", "require_checksum is set but the model has no expected digest")
    if expected_digest and not hmac.compare_digest(expected_digest, digest):
        raise CheckFailed("Verifying", f"checksum mismatch: expected digest {expected_digest}, got {digest}")
    if signature:
        if not signing_key:
            raise CheckFailed("Verifying", "the model is signed but FABRIC_MODEL_SIGNING_KEY is not set on this node")
        if not hmac.compare_digest(signature.lower(), signature_of(digest, signing_key)):
            raise CheckFailed("Verifying", "bad signature: it is not HMAC-SHA256 of the digest under "
                                           "FABRIC_MODEL_SIGNING_KEY")
