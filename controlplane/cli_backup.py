"""`fabricd backup keygen|create|restore`: the disaster-recovery archive (controlplane.backup.archive).

  fabricd backup keygen --key-file PATH
      writes a new Fernet key (0600); refuses to overwrite one. Keep a copy away from the archives.
  fabricd backup create --state-dir DIR --key-file PATH [--store URL] [--out DIR] [--keep N] [--insecure-store]
      writes OUT/fabric-backup-YYYYmmddTHHMMSSZ.tar (0600; OUT defaults to DIR/backups), keeps the
      newest N (14), and records the time in the store for fabric_backup_last_success_timestamp_seconds.
      The gateway HMAC secret comes from fabricd's own setting (FABRIC_KEY_HMAC_SECRET or _FILE);
      without one the command refuses (exit 2): a restore without it leaves every API key invalid.
  fabricd backup restore ARCHIVE --state-dir DIR --key-file PATH [--store URL]
      into an empty store and a state directory without a CA: the store's keys, the state files and
      DIR/key-hmac-secret (0600) for FABRIC_KEY_HMAC_SECRET_FILE on fabricd and every gateway.
An etcd store is reached as fabricd reaches it (FABRIC_ETCD_*: TLS and the fabricd login).
Bad input exits 2 with one line naming what is wrong; no secret is ever printed.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import typer

from common.private_fs import private_dir, restrict_umask, write_private

ARCHIVE_GLOB = "fabric-backup-*.tar"

backup_app = typer.Typer(help="Encrypted disaster-recovery archives of the whole cluster.", no_args_is_help=True)


def _fail(message: str, code: int = 2) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code)


def _open_store(url: str | None, state_dir: Path, insecure_store: bool, config=None):
    """The store fabricd serves with, reached with fabricd's FABRIC_ETCD_* (TLS, its login)."""
    from common.store.connect import open_store
    from controlplane.settings import SettingsError, load

    try:
        config = config or load()
        return open_store(url, state_dir, access=config.store_access, insecure=insecure_store)
    except SettingsError as exc:
        raise _fail(f"fabricd's settings: {exc}") from None
    except ValueError as exc:
        raise _fail(str(exc)) from None


@backup_app.command("keygen")
def keygen(key_file: Path = typer.Option(..., "--key-file", help="where to write the new key (0600)")) -> None:
    """Make the key that encrypts and opens archives."""
    from controlplane.backup.archive import key_id, new_key

    if key_file.exists():
        raise _fail(f"{key_file} exists; a new key would not open the archives made with it")
    restrict_umask()
    key = new_key()
    write_private(key_file, key + b"\n")
    typer.echo(f"backup key: {key_file} (id {key_id(key)}); keep a copy where the archives are not")


@backup_app.command("create")
def create(
    state_dir: Path = typer.Option(..., "--state-dir", help="fabricd's state directory"),
    key_file: Path = typer.Option(..., "--key-file", help="the Fernet key from `fabricd backup keygen`"),
    store: str = typer.Option(None, "--store", help="the store URL fabricd serves with (default: SQLite in the state dir)"),
    out: Path = typer.Option(None, "--out", help="directory for archives (default STATE_DIR/backups)"),
    keep: int = typer.Option(14, "--keep", min=1, help="archives to keep in --out, newest first"),
    insecure_store: bool = typer.Option(False, "--insecure-store", help="allow an etcd off loopback without TLS"),
) -> None:
    """Write one encrypted archive with everything a restore needs."""
    from common.records.backup_status import BackupStatus, record_success
    from controlplane.backup.archive import ArchiveError, load_key, pack, snapshot
    from controlplane.settings import SettingsError, load

    restrict_umask()
    try:
        config = load()
    except SettingsError as exc:
        raise _fail(f"fabricd's settings: {exc}") from None
    secret = config.key_hmac_secret
    if secret is None:
        raise _fail("no gateway HMAC secret (FABRIC_KEY_HMAC_SECRET or FABRIC_KEY_HMAC_SECRET_FILE, as fabricd has "
                    "it): an archive without it restores no working API key")
    if not (state_dir / "pki" / "ca.key").is_file():
        raise _fail(f"{state_dir} holds no cluster CA (pki/ca.key); give the --state-dir `fabricd init` made")
    try:
        key = load_key(key_file)
    except ArchiveError as exc:
        raise _fail(str(exc)) from None
    the_store = _open_store(store, state_dir, insecure_store, config)
    try:
        contents = snapshot(the_store, state_dir, secret)
        data = pack(contents, key)
        out_dir = private_dir(out or state_dir / "backups")
        name = time.strftime("fabric-backup-%Y%m%dT%H%M%SZ.tar", time.gmtime(contents.created_at))
        partial = out_dir / f".{name}.partial"
        write_private(partial, data)
        os.replace(partial, out_dir / name)
        record_success(the_store, BackupStatus(at=time.time(), archive=name, bytes=len(data),
                                               host=socket.gethostname(), store_keys=len(contents.store)))
    finally:
        the_store.close()
    for old in sorted(out_dir.glob(ARCHIVE_GLOB))[:-keep]:
        old.unlink()
    typer.echo(f"archive: {out_dir / name} ({len(data)} bytes, {len(contents.store)} store keys, "
               f"{len(contents.files)} state files)")


@backup_app.command("restore")
def restore(
    archive: Path = typer.Argument(..., help="an archive written by `fabricd backup create`"),
    state_dir: Path = typer.Option(..., "--state-dir", help="a new state directory for this fabricd"),
    key_file: Path = typer.Option(..., "--key-file", help="the key the archive was made with"),
    store: str = typer.Option(None, "--store", help="an empty store (default: SQLite in the state dir)"),
    insecure_store: bool = typer.Option(False, "--insecure-store", help="allow an etcd off loopback without TLS"),
) -> None:
    """Restore an archive into an empty store and a new state directory."""
    from controlplane.backup.archive import ArchiveError, load_key, restore_into, unpack

    restrict_umask()
    try:
        key = load_key(key_file)
        contents = unpack(archive.read_bytes(), key)
    except OSError as exc:
        raise _fail(f"{archive}: {exc.strerror or exc}") from None
    except ArchiveError as exc:
        raise _fail(f"{archive}: {exc}") from None
    private_dir(state_dir)
    the_store = _open_store(store, state_dir, insecure_store)
    try:
        secret_file = restore_into(contents, the_store, state_dir)
    except ArchiveError as exc:
        raise _fail(str(exc)) from None
    finally:
        the_store.close()
    made = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(contents.created_at))
    typer.echo(f"restored the archive of {made}: {len(contents.store)} store keys, {len(contents.files)} files "
               f"into {state_dir}")
    typer.echo(f"gateway HMAC secret: {secret_file} (0600); set FABRIC_KEY_HMAC_SECRET_FILE={secret_file} for "
               "fabricd and copy it to every gateway")
