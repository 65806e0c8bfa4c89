"""What a replica sees at /adapters: one directory per LoRA adapter of its model, named for the
adapter, holding that adapter's verified files (vLLM's load call names ``/adapters/{name}``).

Built by the agent at VM create from the adapters' digest directories in the model cache:

    {state}/models/adapter-sets/<set-id>/<name>/...   hard links of the adapter's files in
                                                      by-digest/<digest>/ (a copy where no hard
                                                      link can be made: a local source on
                                                      another filesystem)
    {state}/models/adapter-sets/<set-id>.json         its members, name -> digest

``set-id`` is the SHA-256 of the sorted ``name digest`` lines, so replicas whose models carry the
same adapters share one set, and a set is never changed once made: it is built in a staging
directory and renamed into place, so a share never shows half an adapter. Hard links share the
cache's inodes (no second copy of the bytes); the guest gets the set read-only, like /models.
Evicting a digest removes the sets that hold it (``remove_sets_with``).

``max_lora_rank``: the largest ``r`` of the adapters' ``adapter_config.json`` (PEFT's layout),
rounded up to a rank vLLM accepts for ``--max-lora-rank``; None when no adapter says.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import uuid
from collections.abc import Mapping
from pathlib import Path

from agent.models.cache import ModelCache
from agent.vm.baked import baked_vllm_version
from common.errors import Conflict, InvalidInput
from common.model_api import check_adapter_name, check_digest
from common.model_manifest import DEFAULT_MAX_FILES, CheckFailed, walk_files
from common.runtimes import vllm_lora_ranks

# The values the baked vLLM's LoRAConfig accepts for max_lora_rank (they changed across releases).
VLLM_RANKS = vllm_lora_ranks(baked_vllm_version())


class AdapterMissing(Exception):
    """An adapter's digest is not on this node (evicted, or never fetched here)."""


def sets_dir(cache: ModelCache) -> Path:
    return cache.root / "adapter-sets"


def set_id(digests: Mapping[str, str]) -> str:
    lines = "".join(f"{name} {digests[name]}\n" for name in sorted(digests))
    return hashlib.sha256(lines.encode()).hexdigest()


def build(cache: ModelCache, digests: Mapping[str, str], max_files: int = DEFAULT_MAX_FILES,
          tenant: str | None = None) -> Path:
    """The set directory for these adapters (name -> digest) of ``tenant``'s model, made if missing."""
    for name, digest in digests.items():
        check_adapter_name(name)
        check_digest(digest)
    root = sets_dir(cache)
    final = root / set_id(digests)
    if final.is_dir():
        for digest in digests.values():
            cache.touch(digest)
        return final
    sources = {}
    for name, digest in sorted(digests.items()):
        path = cache.ready_path(digest, tenant, max_files)
        if path is None:
            raise AdapterMissing(f"adapter {name}: digest {digest} is not on this node; materialize the model")
        sources[name] = path
    staging = root / f".staging-{uuid.uuid4().hex}"
    staging.mkdir(parents=True)
    try:
        for name, path in sources.items():
            for rel in walk_files(path, max_files):  # refuses symlinks and special files
                target = staging / name / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                try:
                    os.link(path / rel, target)
                except OSError:  # another filesystem (a local source), or links not allowed
                    shutil.copyfile(path / rel, target)
        (root / f"{final.name}.json").write_text(json.dumps(dict(sorted(digests.items()))))
        try:
            os.rename(staging, final)
        except OSError:
            if not final.is_dir():  # not "another create made it meanwhile"
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    for digest in digests.values():
        cache.touch(digest)
    return final


def for_vm(cache: ModelCache, digests: Mapping[str, str], max_files: int = DEFAULT_MAX_FILES,
           tenant: str | None = None) -> tuple[str, int | None]:
    """(the set's directory, its max_lora_rank) for a VM create: 409 when an adapter is not on
    the node, 422 when its files or rank cannot be served."""
    try:
        path = build(cache, digests, max_files, tenant)
        return str(path), max_lora_rank(path)
    except AdapterMissing as exc:
        raise Conflict(str(exc), code="model_not_ready") from None
    except CheckFailed as exc:
        raise InvalidInput(exc.message, code="bad_adapter") from None
    except ValueError as exc:
        raise InvalidInput(str(exc), code="bad_adapter") from None


def remove_sets_with(cache: ModelCache, digest: str) -> list[str]:
    """Delete every set holding this digest (it is being evicted); returns their ids."""
    removed = []
    root = sets_dir(cache)
    for record in sorted(root.glob("*.json")) if root.is_dir() else []:
        try:
            members = json.loads(record.read_text())
        except (OSError, ValueError):
            continue
        if digest in members.values():
            shutil.rmtree(root / record.stem, ignore_errors=True)
            record.unlink(missing_ok=True)
            removed.append(record.stem)
    return removed


def max_lora_rank(set_dir: Path) -> int | None:
    """The rank vLLM must be started with to load every adapter of the set (None: unknown).
    Raises ValueError when an adapter's rank is above what vLLM supports."""
    ranks = {}
    for config in sorted(Path(set_dir).glob("*/adapter_config.json")):
        try:
            r = json.loads(config.read_text()).get("r")
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(r, int) and not isinstance(r, bool) and r > 0:
            ranks[config.parent.name] = r
    if not ranks:
        return None
    name, top = max(ranks.items(), key=lambda kv: kv[1])
    for allowed in VLLM_RANKS:
        if top <= allowed:
            return allowed
    raise ValueError(f"adapter {name} has LoRA rank {top}; vLLM loads ranks up to {VLLM_RANKS[-1]}")
