"""Site-to-site model copy between two real fabricd processes on loopback, each with its own store
and model directory: the sender pushes a local model to the peer named by the site record, the
peer checks every SHA-256 and assembles the directory under its own FABRIC_MODEL_DIR; a corrupted
blob, a path escape, a wrong token, a missing peer or file leave nothing behind and the record
Pending with the reason (never the token)."""

from __future__ import annotations

import hashlib
from contextlib import ExitStack

import httpx
import pytest

from common.model_manifest import build_manifest
from common.schemas import ModelArtifact, ModelStatus, Node, Site
from controlplane.models import replicate
from lab.rigs.servers import free_port
from tests.controlplane.conftest import login, start_fabricd

TOKEN = "replicate-secret-3f9a"


@pytest.fixture(scope="module")
def sites(tmp_path_factory):
    with ExitStack() as stack:
        out = {}
        for name in ("a", "b"):
            tmp = tmp_path_factory.mktemp(f"site-{name}")
            models = tmp / "models"
            models.mkdir()
            server = stack.enter_context(start_fabricd(tmp, env={"FABRIC_MODEL_DIR": str(models),
                                                                  "FABRIC_REPLICATE_TOKEN": TOKEN}))
            out[name] = (stack.enter_context(server.client(login(server))), models, server.url)
        src = out["a"][1] / "tiny"
        (src / "sub").mkdir(parents=True)
        (src / "config.json").write_text('{"layers": 2}')
        (src / "sub" / "model.safetensors").write_bytes(bytes(range(256)) * 64)
        yield out


def test_replicate_pushes_to_the_peer_which_checks_and_assembles(sites):
    a, a_models, _ = sites["a"]
    _, b_models, b_url = sites["b"]
    digest = build_manifest(a_models / "tiny").digest
    assert a.post("/api/ai/models", json={"name": "tiny", "source": f"file://{a_models}/tiny",
                                          "digest": digest}).status_code == 201
    assert a.post("/api/ai/sites", json={"name": "site-b"}).status_code == 201
    pending = a.post("/api/ai/models/tiny/replicate", json={"site": "site-b"}).json()
    assert pending["phase"] == "Pending" and "no peer_url" in pending["message"]

    a.post("/api/ai/sites", json={"name": "site-b", "peer_url": b_url})
    done = a.post("/api/ai/models/tiny/replicate", json={"site": "site-b"}).json()
    assert done["phase"] == "Ready" and done["via"] == "peer" and done["digest"] == digest, done
    copied = b_models / "replicated" / "tiny" / digest
    assert build_manifest(copied).digest == digest
    assert (copied / "sub" / "model.safetensors").read_bytes() == bytes(range(256)) * 64
    assert [c["site"] for c in a.get("/api/ai/models/tiny/sites").json()] == ["site-b"]
    assert not any((b_models / ".fabric-staging").iterdir())  # nothing half-written left


def test_corrupted_blob_and_path_escape_are_refused(sites):
    _, b_models, b_url = sites["b"]
    good = b"the real bytes"
    digest = hashlib.sha256(good).hexdigest()
    url = f"{b_url}/api/ai/models/evil/blobs/{digest}"
    auth = {"x-fabric-replicate-token": TOKEN}
    r = httpx.put(url, content=b"the real bytez", headers=auth)
    assert r.status_code == 422 and r.json()["error"]["code"] == "digest_mismatch"
    assert not (b_models / "replicated" / "evil" / "blobs" / digest).exists()
    assert httpx.put(url, content=good, headers=auth).status_code == 201
    escape = f"../../escaped {len(good)} {digest}\n"
    r = httpx.put(f"{b_url}/api/ai/models/evil/blobs/{hashlib.sha256(escape.encode()).hexdigest()}",
                  content=escape, headers={**auth, "x-fabric-manifest": "1"})
    assert r.status_code == 422 and "leaves the model directory" in r.json()["error"]["message"]
    assert not (b_models.parent / "escaped").exists() and not (b_models / "escaped").exists()
    for headers, status in (({}, 401), ({"x-fabric-replicate-token": "wrong"}, 401)):
        assert httpx.put(url, content=good, headers=headers).status_code == status
    r = httpx.put(f"{b_url}/api/ai/models/..%2F..%2Fetc/blobs/{digest}", content=good, headers=auth)
    assert r.status_code in (404, 422)
    assert not any((b_models / ".fabric-staging").iterdir())


def test_a_refusal_leaves_it_pending_with_the_reason_never_the_token(sites):
    a, a_models, _ = sites["a"]
    (a_models / "drifted").mkdir()
    (a_models / "drifted" / "w.bin").write_bytes(b"x")
    a.post("/api/ai/models", json={"name": "drifted", "source": f"file://{a_models}/drifted", "digest": "0" * 64})
    rec = a.post("/api/ai/models/drifted/replicate", json={"site": "site-b"}).json()
    assert rec["phase"] == "Pending" and "is not the model's" in rec["message"]
    a.post("/api/ai/models", json={"name": "gone", "source": f"file://{a_models}/gone"})
    rec = a.post("/api/ai/models/gone/replicate", json={"site": "site-b"}).json()
    assert rec["phase"] == "Pending" and "missing" in rec["message"]
    a.post("/api/ai/sites", json={"name": "site-c", "peer_url": f"http://127.0.0.1:{free_port()}"})
    rec = a.post("/api/ai/models/tiny/replicate", json={"site": "site-c"}).json()
    assert rec["phase"] == "Pending" and "unreachable" in rec["message"]
    events = a.get("/api/ai/events", params={"kind": "model"}).text
    assert TOKEN not in events and TOKEN not in str(rec)


def test_pure_decisions_and_a_sender_without_token(tmp_path):
    digest = "a" * 64
    model = ModelArtifact(name="m", source=f"file://{tmp_path}", status=ModelStatus(digest=digest))
    holder = Node(id="n1", address="https://x:1", site="s", cached_models=[digest], last_heartbeat=1000)
    assert replicate.decide(model, "s", None, [holder], 1010).action == "ready"
    assert replicate.decide(model, "s", None, [holder], 2000).action == "pending"  # the holder is offline
    assert replicate.decide(model, "s", Site(name="s", peer_url="http://p:1"), [], 1010).action == "push"
    with pytest.raises(replicate.PushFailed, match="FABRIC_REPLICATE_TOKEN is not set"):
        replicate.push(model, digest, "http://p:1", "", str(tmp_path))
    hf = ModelArtifact(name="m", source="hf://org/m")
    with pytest.raises(replicate.PushFailed, match="hf://"):
        replicate.push(hf, None, "http://p:1", TOKEN, str(tmp_path))


def test_staging_leftovers_of_a_dead_upload_are_swept(tmp_path):
    import os
    import time

    from controlplane.models import blob_store

    staging = tmp_path / blob_store.STAGING
    (staging / "dir-old").mkdir(parents=True)
    old, fresh = staging / "blob-old", staging / "blob-new"
    old.write_bytes(b"x")
    fresh.write_bytes(b"y")
    long_ago = time.time() - blob_store.STALE_S - 60
    for path in (old, staging / "dir-old"):
        os.utime(path, (long_ago, long_ago))
    blob_store.sweep(staging)
    assert sorted(p.name for p in staging.iterdir()) == ["blob-new"]  # an upload in progress stays
