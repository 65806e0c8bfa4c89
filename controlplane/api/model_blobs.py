"""The receiving end of site-to-site model copy (docs/models.md "Copying a model to another site"):

    PUT /api/ai/models/{name}/blobs/{digest}
        x-fabric-replicate-token: <FABRIC_REPLICATE_TOKEN>
        body: one file's bytes (digest = their SHA-256), or, with x-fabric-manifest: 1, the
        model's manifest (digest = the model's digest), which assembles the model directory

201 when kept, with the path under this fabricd's FABRIC_MODEL_DIR (controlplane.models.blob_store).
The route authenticates the caller itself, from the headers, before it reads a byte of the body:
with no FABRIC_REPLICATE_TOKEN set here it is 404 (the route does not exist for anyone); a
missing or wrong token is 401 (compared in constant time). A SHA-256 that does not match is 422
"digest_mismatch" and nothing is kept. The body bypasses fabricd's FABRIC_MAX_BODY_BYTES (model
files are large): it is streamed to disk, at most FABRIC_MAX_BLOB_BYTES (default 1 TiB).
"""

from __future__ import annotations

import asyncio
import hmac
import re
from pathlib import Path

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from common.errors import FabricError, InvalidInput, NotFound
from controlplane.api.answers import BlobStored
from controlplane.models import blob_store

router = APIRouter(prefix="/api/ai", tags=["models"])
BLOB_PATH = re.compile(r"^/api/ai/models/[^/]+/blobs/[^/]+$")  # the request guard lets these stream
MAX_MANIFEST_BYTES = 16 << 20


class Unauthorized(FabricError):
    status = 401
    code = "unauthorized"


def check_token(sent: str | None, expected: str) -> None:
    """expected: FABRIC_REPLICATE_TOKEN (read at start); none set: this fabricd takes no copies (404)."""
    if not expected:
        raise NotFound("not found")
    if not sent or not hmac.compare_digest(sent.encode(), expected.encode()):
        raise Unauthorized("a valid x-fabric-replicate-token is required", code="bad_replicate_token")


@router.put("/models/{name}/blobs/{digest}", status_code=201, response_model=BlobStored)
async def put_blob(name: str, digest: str, request: Request) -> JSONResponse:
    config = request.app.state.fabric.settings
    check_token(request.headers.get("x-fabric-replicate-token"), config.replicate_token)
    root = Path(config.model_dir)
    if request.headers.get("x-fabric-manifest") == "1":
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > MAX_MANIFEST_BYTES:
                raise InvalidInput(f"manifest is larger than {MAX_MANIFEST_BYTES} bytes",
                                              code="bad_manifest")
        try:
            text = body.decode()
        except UnicodeDecodeError:
            raise InvalidInput("manifest is not UTF-8 text", code="bad_manifest") from None
        path = await asyncio.to_thread(blob_store.assemble, root, name, digest, text)
        return JSONResponse({"model": name, "digest": digest, "path": str(path)}, status_code=201)
    limit = config.max_blob_bytes  # FABRIC_MAX_BLOB_BYTES
    upload = await asyncio.to_thread(blob_store.BlobUpload, root, name, digest, limit)
    try:
        async for chunk in request.stream():
            await asyncio.to_thread(upload.write, chunk)
        path = await asyncio.to_thread(upload.finish)
    except BaseException:
        upload.abort()
        raise
    return JSONResponse({"model": name, "digest": digest, "bytes": upload.size, "path": str(path)},
                        status_code=201)
