"""The disaster-recovery archive: everything a restore needs, in one private file.

`fabricd backup create` (run daily by fabric-backup.timer) writes one tar file, 0600 from
creation, holding two members:

    MANIFEST.json    plain: format, version, created_at, how many store keys and which state files
                     it holds, and the id (SHA-256 prefix) of the key that opens it; no secret
    payload.fernet   Fernet (AES-128-CBC + HMAC-SHA256) over gzip(JSON): every store key under
                     /fabric/ with its value (users, API key digests, the admin-token secret, join
                     tokens, desired and observed state), fabricd's state directory files (the
                     cluster CA certificate and key, fabricd's certificate, the admin and viewer
                     passwords) and the gateway HMAC secret (FABRIC_KEY_HMAC_SECRET)

The Fernet key lives in a file the operator keeps apart from the archives (`fabricd backup
keygen`); without it the archive is opaque. Keys held under a lease (the leader lock, in-flight
slots) are left out: their holders are gone in a restored cluster, and a copy without its lease
would never expire. The store's SQLite file is not copied (its keys are), so one archive restores
onto either store kind. Invariant: a restore writes only into an empty store and a state
directory without a CA (restore_into refuses otherwise), so it never mixes two clusters.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import io
import json
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path

from cryptography.fernet import Fernet, InvalidToken

from common import keyspace
from common.records import raw
from common.store.base import Store

FORMAT = "fabric-archive"
VERSION = 1
MANIFEST = "MANIFEST.json"
PAYLOAD = "payload.fernet"
HMAC_SECRET_FILE = "key-hmac-secret"  # where a restore puts the secret (FABRIC_KEY_HMAC_SECRET_FILE)
# Never copied from the state directory: the SQLite store (its keys are in the payload), its
# journal, and archives a --out inside the state directory holds.
SKIPPED = ("fabric.db", "fabric.db-wal", "fabric.db-shm", "fabric.db-journal", "backups")


class ArchiveError(ValueError):
    """The archive or its key cannot be used (a wrong key, a damaged or foreign file)."""


@dataclass(frozen=True)
class Contents:
    store: list[tuple[str, str]]
    files: dict[str, bytes]  # path relative to the state directory -> bytes
    hmac_secret: bytes
    created_at: float


def new_key() -> bytes:
    return Fernet.generate_key()


def key_id(key: bytes) -> str:
    return hashlib.sha256(key.strip()).hexdigest()[:16]


def load_key(path: Path) -> bytes:
    try:
        key = path.read_bytes().strip()
    except OSError as exc:
        raise ArchiveError(f"backup key file {path}: {exc.strerror or exc}") from None
    try:
        Fernet(key)
    except ValueError:
        raise ArchiveError(f"backup key file {path} holds no Fernet key (make one with `fabricd backup keygen`)") \
            from None
    return key


def state_files(state_dir: Path) -> dict[str, bytes]:
    out = {}
    for path in sorted(state_dir.rglob("*")):
        rel = path.relative_to(state_dir)
        if rel.parts[0] in SKIPPED or not path.is_file() or path.is_symlink():
            continue
        out[rel.as_posix()] = path.read_bytes()
    return out


def snapshot(store: Store, state_dir: Path, hmac_secret: bytes, now: float | None = None) -> Contents:
    return Contents(store=raw.snapshot(store), files=state_files(state_dir),
                    hmac_secret=hmac_secret, created_at=time.time() if now is None else now)


def pack(contents: Contents, key: bytes) -> bytes:
    body = {"store": contents.store, "hmac_secret": base64.b64encode(contents.hmac_secret).decode(),
            "files": {name: base64.b64encode(data).decode() for name, data in contents.files.items()}}
    payload = Fernet(key).encrypt(gzip.compress(json.dumps(body).encode(), mtime=0))
    manifest = {"format": FORMAT, "version": VERSION, "created_at": contents.created_at,
                "store_keys": len(contents.store), "files": sorted(contents.files), "encryption": "fernet",
                "key_id": key_id(key)}
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for name, data in ((MANIFEST, json.dumps(manifest, indent=1).encode()), (PAYLOAD, payload)):
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o600, int(contents.created_at)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def read_manifest(archive: bytes) -> dict:
    return json.loads(_members(archive)[MANIFEST])


def unpack(archive: bytes, key: bytes) -> Contents:
    members = _members(archive)
    manifest = json.loads(members[MANIFEST])
    if manifest.get("format") != FORMAT or manifest.get("version") != VERSION:
        raise ArchiveError(f"not a {FORMAT} version {VERSION} archive "
                           f"(format {manifest.get('format')!r}, version {manifest.get('version')!r})")
    try:
        body = json.loads(gzip.decompress(Fernet(key).decrypt(members[PAYLOAD])))
    except InvalidToken:
        raise ArchiveError(f"the backup key (id {key_id(key)}) does not open this archive, made with key id "
                           f"{manifest.get('key_id')}") from None
    return Contents(store=[(k, v) for k, v in body["store"]],
                    files={n: base64.b64decode(d) for n, d in body["files"].items()},
                    hmac_secret=base64.b64decode(body["hmac_secret"]), created_at=manifest["created_at"])


def _members(archive: bytes) -> dict[str, bytes]:
    try:
        with tarfile.open(fileobj=io.BytesIO(archive), mode="r:") as tar:
            got = {}
            for member in tar.getmembers():
                if member.name in (MANIFEST, PAYLOAD) and member.isfile():
                    f = tar.extractfile(member)
                    got[member.name] = f.read() if f is not None else b""
    except tarfile.TarError as exc:
        raise ArchiveError(f"not a Fabric backup archive: {exc}") from None
    if set(got) != {MANIFEST, PAYLOAD}:
        raise ArchiveError(f"not a Fabric backup archive: it lacks {sorted({MANIFEST, PAYLOAD} - set(got))}")
    return got


def restore_into(contents: Contents, store: Store, state_dir: Path) -> Path:
    """Write the archive's keys into an empty store and its files into a state directory without a
    CA; returns the HMAC secret's file (0600). Raises ArchiveError before writing anything when
    either already holds a cluster."""
    from common.private_fs import private_dir, write_private

    held = raw.held(store)
    if held:
        raise ArchiveError(f"the store already holds {held} keys under {keyspace.ROOT}/: a restore writes "
                           "only into an empty store (a new etcd cluster, or a new SQLite file)")
    if (state_dir / "pki" / "ca.key").exists():
        raise ArchiveError(f"{state_dir} already holds a cluster CA (pki/ca.key): restore into a new state directory")
    for name in contents.files:
        if ".." in Path(name).parts or Path(name).is_absolute():
            raise ArchiveError(f"archive file name {name!r} leaves the state directory")
    clash = raw.load_empty(store, contents.store)
    if clash is not None:
        raise ArchiveError(f"a key of {clash[0]}..{clash[1]} appeared in the store during the restore")
    private_dir(state_dir)
    for name, data in contents.files.items():
        target = state_dir / name
        private_dir(target.parent)
        write_private(target, data)
    secret = state_dir / HMAC_SECRET_FILE
    write_private(secret, contents.hmac_secret)
    return secret
