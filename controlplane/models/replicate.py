"""Site-to-site model copy (POST /api/ai/models/{name}/replicate): make a model's bytes present
at a site, and record where it stands at ``/fabric/model-sites/{model}/{site}``.

``decide`` (pure) says what to do:
  Ready    an online node at the site lists the model's digest in its heartbeat: nothing to copy;
  Pending  with the reason, when nothing can be done: the model has no known digest, the site has
           no record or no ``peer_url``;
  Push     send the bytes to the site's fabricd (``peer_url``).
``push`` (the applier) needs FABRIC_REPLICATE_TOKEN and the bytes on this host: a model whose
source is a local directory under FABRIC_MODEL_DIR (an hf:// model's bytes live on the GPU nodes,
never on fabricd). It hashes the directory (common.model_manifest), refuses when the digest differs
from the model's, PUTs each file to ``{peer_url}/api/ai/models/{name}/blobs/{sha256}`` and then the
manifest (x-fabric-manifest: 1), which the peer checks and assembles
(controlplane.models.blob_store). Only a 201 for the manifest makes the record Ready; any failure
(a missing file, peer, token; a refusal such as a hash mismatch) leaves it Pending with the
reason. The token is sent only in its header and never appears in a message: peer answers are
reduced to their error code and message, scrubbed of it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

from common.model_api import local_source_path
from common.model_manifest import CheckFailed, Manifest, build_manifest
from common.schemas import ModelArtifact, Node, Site
from controlplane.placement.scheduler import SchedulerSettings, node_online

CONNECT_TIMEOUT_S = 5.0
READ_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Decision:
    action: str  # ready | pending | push
    message: str
    digest: str | None = None


def decide(model: ModelArtifact, site: str, record: Site | None, nodes: Sequence[Node], now: float) -> Decision:
    digest = model.status.digest or model.digest
    settings = SchedulerSettings()
    if digest:
        holders = sorted(n.id for n in nodes if n.site == site and digest in n.cached_models
                         and node_online(n, now, settings))
        if holders:
            return Decision("ready", f"node {holders[0]} at site {site} holds digest {digest[:12]}", digest)
    if record is None:
        return Decision("pending", f"site {site} has no record (POST /api/ai/sites) and no online node there "
                        "holds the model", digest)
    if not record.peer_url:
        return Decision("pending", f"site {site} has no peer_url and no online node there holds the model", digest)
    return Decision("push", f"pushing to {record.peer_url}", digest)


class PushFailed(Exception):
    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


def local_copy(model: ModelArtifact, model_dir: str) -> Path:
    if model.source.startswith("hf://"):
        raise PushFailed(f"fabricd holds no bytes of {model.source} (hf:// models live on the GPU nodes): "
                         "materialize it on a node at the site instead, or register a local copy")
    try:
        root = Path(local_source_path(model.source, model_dir))
    except ValueError as exc:
        raise PushFailed(str(exc)) from None
    if not root.is_dir():
        raise PushFailed(f"the model's directory {root} is missing on this fabricd")
    return root


def _reason(resp: httpx.Response, token: str) -> str:
    try:
        err = resp.json().get("error", {})
        text = f"{err.get('code', '')}: {err.get('message', '')}"
    except ValueError:
        text = f"HTTP {resp.status_code}"
    return text.replace(token, "***")[:300] if token else text[:300]


def push(model: ModelArtifact, digest: str | None, peer_url: str, token: str, model_dir: str,
         transport: httpx.BaseTransport | None = None) -> str:
    """Copy the model's local directory to the peer; returns its digest, or PushFailed(reason)."""
    if not token:
        raise PushFailed("FABRIC_REPLICATE_TOKEN is not set on this fabricd")
    root = local_copy(model, model_dir)
    try:
        manifest: Manifest = build_manifest(root)
    except (CheckFailed, OSError) as exc:
        raise PushFailed(f"cannot read the model's files: {getattr(exc, 'message', None) or exc}") from None
    if digest and manifest.digest != digest:
        raise PushFailed(f"the local copy's digest {manifest.digest[:12]} is not the model's {digest[:12]}")
    headers = {"x-fabric-replicate-token": token}
    base = f"{peer_url}/api/ai/models/{model.name}/blobs"
    timeout = httpx.Timeout(READ_TIMEOUT_S, connect=CONNECT_TIMEOUT_S)
    try:
        with httpx.Client(timeout=timeout, transport=transport, follow_redirects=False) as client:
            for e in manifest.entries:
                with open(root / e.path, "rb") as f:
                    resp = client.put(f"{base}/{e.sha256}", content=f, headers=headers)
                if resp.status_code != 201:
                    raise PushFailed(f"peer refused {e.path}: {_reason(resp, token)}")
            resp = client.put(f"{base}/{manifest.digest}", content=manifest.text().encode(),
                              headers={**headers, "x-fabric-manifest": "1"})
            if resp.status_code != 201:
                raise PushFailed(f"peer refused the manifest: {_reason(resp, token)}")
    except httpx.HTTPError as exc:
        raise PushFailed(f"peer {peer_url} unreachable: {type(exc).__name__}") from None
    except OSError as exc:
        raise PushFailed(f"cannot read a model file: {exc.strerror or type(exc).__name__}") from None
    return manifest.digest
