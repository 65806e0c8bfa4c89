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
from collections.abc import Iterable
from pathlib import Path

from common.model_manifest import (  # noqa: F401  (the agent's modules and tests import them from here)
    DEFAULT_MAX_FILES,
    IGNORED_DIRS,
    CheckFailed,
    Manifest,
    ManifestEntry,
    build_manifest,
    check_relative_name,
    sha256_file,
    walk_files,
)

PICKLE_SUFFIXES = (".pkl", ".pickle", ".pt", ".pth")


def scan_names(names: Iterable[str], max_files: int = DEFAULT_MAX_FILES) -> None:
    """The name rules of the scan: applied to the files selected from a repository listing
    (agent.models.file_selection) before anything is downloaded, and again to the files on disk."""
    names = list(names)
    if len(names) > max_files:
        raise CheckFailed("Scanning", f"{len(names)} files is more than FABRIC_MODEL_MAX_FILES ({max_files})")
    for name in sorted(names):
        check_relative_name(name)
        if name.lower().endswith(PICKLE_SUFFIXES):
            raise CheckFailed("Scanning", f"{name} is a pickle file ({', '.join(PICKLE_SUFFIXES)} are refused: "
                                          "loading one runs code); publish safetensors instead")


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
