"""The agent's model cache on disk, under ``{state}/models/``:

    by-digest/<sha256>/      verified, scanned model directories (what guests see at /models)
    staging/<source-key>/    downloads in progress; ``.fabric/partial/`` holds partial files
    jobs/<job-id>.json       durable job records (agent.models.jobs)
    sources/<source-key>     the digest a source (repo@commit, or a local realpath) produced
    local/<sha256>.json      local sources under FABRIC_MODEL_DIR with these bytes, by tenant
                             ({"paths": {tenant or "": path}}; never copied)
    last-used/<sha256>       touched when a job or a VM uses the digest (LRU for eviction)
    manifests/<sha256>       the verified manifest text of the digest (what the KV-index tokenizer
                             route serves, so a gateway checks the files against the digest)

A directory appears under by-digest/ only by an atomic rename of a finished staging directory,
so nothing there is ever half-written. Eviction renames it out of by-digest/ first, then
deletes it. Local sources are never deleted: they belong to the operator.

Tenants keep apart (issue 50): a local source lives in its tenant's root, which that tenant can
edit after it was hashed, so a local entry serves only its own tenant (``path_for(digest,
tenant)``), never another tenant's replica that happens to want the same digest (say after the
by-digest copy was evicted), and ``ready_path`` hashes a local source again before a replica
starts on it. by-digest/ copies are the agent's own and serve anyone.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from pathlib import Path

from common.model_api import DIGEST, CacheEntry
from common.model_manifest import CheckFailed, build_manifest, strip_ignored


def dir_size(path: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(path, followlinks=False):
        for name in files:
            try:
                total += Path(dirpath, name).lstat().st_size
            except OSError:
                pass
    return total


class ModelCache:
    def __init__(self, root: Path):
        self.root = Path(root)
        self.by_digest = self.root / "by-digest"
        self.staging = self.root / "staging"
        self.jobs = self.root / "jobs"
        self.sources = self.root / "sources"
        self.local = self.root / "local"
        self.last_used = self.root / "last-used"
        self.manifests = self.root / "manifests"
        for d in (self.by_digest, self.staging, self.jobs, self.sources, self.local, self.last_used, self.manifests):
            d.mkdir(parents=True, exist_ok=True)

    # -- lookups ------------------------------------------------------------------------------
    def _local_paths(self, digest: str) -> dict[str, str]:
        record = self.local / f"{digest}.json"
        if not record.exists():
            return {}
        data = json.loads(record.read_text())
        return data.get("paths") or ({"": data["path"]} if "path" in data else {})

    def path_for(self, digest: str, tenant: str | None = None) -> Path | None:
        """The directory holding this digest for ``tenant``'s replicas (None: a model without a
        tenant): the cached copy, else that tenant's own local source; None when neither."""
        if not DIGEST.match(digest):
            return None
        cached = self.by_digest / digest
        if cached.is_dir():
            return cached
        path = self._local_paths(digest).get(tenant or "")
        return Path(path) if path is not None and Path(path).is_dir() else None

    def any_path_for(self, digest: str) -> Path | None:
        """Any directory with this digest, for readers that check the bytes against the digest
        themselves (the KV index's tokenizer files, `fabricd model verify`)."""
        if not DIGEST.match(digest):
            return None
        cached = self.by_digest / digest
        if cached.is_dir():
            return cached
        paths = [Path(p) for p in self._local_paths(digest).values() if Path(p).is_dir()]
        return paths[0] if paths else None

    def ready_path(self, digest: str, tenant: str | None, max_files: int) -> Path | None:
        """path_for, with a local source hashed again first (its tenant may have changed it since):
        CheckFailed when its bytes no longer hash to ``digest``."""
        path = self.path_for(digest, tenant)
        if path is not None and path != self.by_digest / digest:
            now = build_manifest(path, max_files).digest
            if now != digest:
                raise CheckFailed("Verifying", f"the local source {path} now hashes to {now}, not {digest}; "
                                               "materialize the model again")
        return path

    def digest_of_source(self, key: str, tenant: str | None = None) -> str | None:
        f = self.sources / key
        if not f.exists():
            return None
        digest = f.read_text().strip()
        return digest if self.path_for(digest, tenant) is not None else None

    def manifest_text(self, digest: str) -> str | None:
        """The manifest stored when the digest was published (None: none stored, an entry older
        than this file)."""
        f = self.manifests / digest
        if not DIGEST.match(digest) or not f.is_file() or self.any_path_for(digest) is None:
            return None
        return f.read_text()

    def _keep_manifest(self, digest: str, manifest_text: str) -> None:
        tmp = self.manifests / f".{digest}.{uuid.uuid4().hex}"
        tmp.write_text(manifest_text)
        os.replace(tmp, self.manifests / digest)

    def digests(self) -> list[str]:
        found = [d.name for d in self.by_digest.iterdir() if DIGEST.match(d.name)]
        found += [f.stem for f in self.local.glob("*.json") if DIGEST.match(f.stem)]
        return sorted(set(found))

    # -- writes -------------------------------------------------------------------------------
    def touch(self, digest: str) -> None:
        (self.last_used / digest).write_text(str(time.time()))

    def publish(self, staging_dir: Path, digest: str, source_key: str, manifest_text: str) -> Path:
        """Move a finished staging directory to by-digest/<digest> in one rename."""
        strip_ignored(staging_dir)  # .cache/, .fabric/: outside the digest, so never kept
        final = self.by_digest / digest
        if final.is_dir():  # the same bytes arrived by another source: keep the first copy
            shutil.rmtree(staging_dir, ignore_errors=True)
        else:
            os.rename(staging_dir, final)
        self._keep_manifest(digest, manifest_text)
        self.remember_source(source_key, digest)
        self.touch(digest)
        return final

    def publish_local(self, path: Path, digest: str, source_key: str, manifest_text: str,
                      tenant: str | None = None) -> Path:
        self._keep_manifest(digest, manifest_text)
        paths = {**self._local_paths(digest), tenant or "": str(path)}
        tmp = self.local / f".{digest}.{uuid.uuid4().hex}"
        tmp.write_text(json.dumps({"paths": paths}))
        os.replace(tmp, self.local / f"{digest}.json")
        self.remember_source(source_key, digest)
        self.touch(digest)
        return path

    def remember_source(self, key: str, digest: str) -> None:
        tmp = self.sources / f".{key}.{uuid.uuid4().hex}"
        tmp.write_text(digest)
        os.replace(tmp, self.sources / key)

    def entries(self) -> list[CacheEntry]:
        out = []
        for digest in self.digests():
            path = self.any_path_for(digest)
            if path is None:
                continue
            stamp = self.last_used / digest
            used = stamp.stat().st_mtime if stamp.exists() else path.stat().st_mtime
            out.append(CacheEntry(digest=digest, size_bytes=dir_size(path), last_used=used, path=str(path),
                                  local=not (self.by_digest / digest).is_dir()))
        return out

    def evict(self, digest: str) -> bool:
        """Delete a cached digest (never a local source). False when it is not cached here."""
        final = self.by_digest / digest
        if not DIGEST.match(digest) or not final.is_dir():
            return False
        doomed = self.root / f".evicting-{digest}-{uuid.uuid4().hex[:8]}"
        os.rename(final, doomed)  # gone from by-digest/ at once; the delete may take a while
        for f in self.sources.iterdir():
            if f.is_file() and f.read_text().strip() == digest:
                f.unlink(missing_ok=True)
        (self.last_used / digest).unlink(missing_ok=True)
        (self.manifests / digest).unlink(missing_ok=True)
        shutil.rmtree(doomed, ignore_errors=True)
        return True

    def free_bytes(self) -> int:
        return shutil.disk_usage(self.root).free
