"""The receiving side of site-to-site model copy: blobs and manifests written under this
fabricd's model directory (FABRIC_MODEL_DIR), checked before anything is kept.

Layout under ``root`` (the model directory):
  replicated/{model}/blobs/{sha256}     one file's bytes, named by their SHA-256
  replicated/{model}/{digest}/...       the assembled model directory (its manifest's digest):
                                        what a model record here names as its local source
  .fabric-staging/{random}              uploads and assemblies in progress

Invariants: a blob is streamed into staging while it is hashed and renamed into place only when
its SHA-256 equals the digest in the URL (else it is deleted and the upload refused); a model
directory appears only by one rename of a complete staging directory, assembled from blobs that
were each checked, following a manifest whose own SHA-256 is its digest and whose every path is
relative and stays inside (common.model_manifest.parse_manifest). Model names and digests are
checked before they become path parts, so no input names a path outside ``root``.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import shutil
import time
from pathlib import Path

from common.errors import Conflict, InvalidInput
from common.model_manifest import CheckFailed, parse_manifest
from common.schemas import check_name

DIGEST = re.compile(r"^[0-9a-f]{64}$")
STAGING = ".fabric-staging"
STALE_S = 86400.0  # an upload or assembly untouched this long is a leftover of a dead process


def check_digest(digest: str) -> str:
    if not DIGEST.match(digest):
        raise InvalidInput(f"digest {digest[:80]!r}: expected 64 lowercase hex characters (SHA-256)",
                           code="bad_digest")
    return digest


def model_root(root: Path, model: str) -> Path:
    try:
        check_name(model, "model")
    except ValueError as exc:
        raise InvalidInput(str(exc), code="bad_name") from None
    return root / "replicated" / model


class BlobUpload:
    """One blob being received: write() the chunks, then finish() (or abort())."""

    def __init__(self, root: Path, model: str, digest: str, max_bytes: int):
        self.final = model_root(root, model) / "blobs" / check_digest(digest)
        self.digest = digest
        self.max_bytes = max_bytes
        staging = root / STAGING
        staging.mkdir(parents=True, exist_ok=True)
        sweep(staging)
        self.path = staging / f"blob-{secrets.token_hex(8)}"
        self._file = open(self.path, "xb")  # noqa: SIM115 (closed in finish/abort)
        self._hash = hashlib.sha256()
        self.size = 0

    def write(self, chunk: bytes) -> None:
        self.size += len(chunk)
        if self.size > self.max_bytes:
            self.abort()
            raise InvalidInput(f"blob is larger than {self.max_bytes} bytes", code="blob_too_large")
        self._hash.update(chunk)
        self._file.write(chunk)

    def finish(self) -> Path:
        self._file.close()
        got = self._hash.hexdigest()
        if got != self.digest:
            self.path.unlink(missing_ok=True)
            raise InvalidInput(f"blob SHA-256 is {got}, not {self.digest}: refused", code="digest_mismatch")
        self.final.parent.mkdir(parents=True, exist_ok=True)
        os.replace(self.path, self.final)
        return self.final

    def abort(self) -> None:
        if not self._file.closed:
            self._file.close()
        self.path.unlink(missing_ok=True)


def sweep(staging: Path, now: float | None = None) -> None:
    """Remove what a fabricd that died mid-upload left in staging (older than STALE_S)."""
    now = time.time() if now is None else now
    for entry in staging.iterdir():
        try:
            if now - entry.lstat().st_mtime > STALE_S:
                shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
        except OSError:
            continue


def assemble(root: Path, model: str, digest: str, manifest_text: str) -> Path:
    """Build replicated/{model}/{digest}/ from the model's blobs as the manifest lists them."""
    check_digest(digest)
    got = hashlib.sha256(manifest_text.encode()).hexdigest()
    if got != digest:
        raise InvalidInput(f"manifest SHA-256 is {got}, not {digest}: refused", code="digest_mismatch")
    try:
        manifest = parse_manifest(manifest_text)
    except CheckFailed as exc:
        raise InvalidInput(exc.message, code="bad_manifest") from None
    base = model_root(root, model)
    final = base / digest
    if final.is_dir():
        return final
    missing = [e.path for e in manifest.entries if not (base / "blobs" / e.sha256).is_file()]
    if missing:
        raise Conflict(f"{len(missing)} file(s) of the manifest have no blob here yet, e.g. {missing[0]}",
                       code="missing_blobs")
    staging = root / STAGING / f"dir-{secrets.token_hex(8)}"
    try:
        staging.mkdir(parents=True)
        for e in manifest.entries:
            target = staging / e.path  # parse_manifest refused absolute paths, '..' and empty parts
            target.parent.mkdir(parents=True, exist_ok=True)
            blob = base / "blobs" / e.sha256
            if blob.stat().st_size != e.size:
                raise InvalidInput(f"{e.path}: the blob holds {blob.stat().st_size} bytes, the manifest says "
                                   f"{e.size}", code="bad_manifest")
            try:
                os.link(blob, target)  # same filesystem: no copy; blobs are never modified in place
            except OSError:
                shutil.copyfile(blob, target)
        final.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.rename(staging, final)
        except OSError:
            if not final.is_dir():  # not a concurrent twin that finished first
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return final
