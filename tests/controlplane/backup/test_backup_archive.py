"""`fabricd backup create|restore`: one encrypted archive restores a cluster into an empty store and
a new state directory, where every API key still verifies, the admin password still logs in and
the cluster CA is the same; the archive is 0600 and holds no secret in the clear; a wrong key, a
non-empty store or a missing HMAC secret is refused with exit 2 and nothing written.

Real SQLite stores and a real fabricd (in-process) on each side; the CLI is fabricd's own.
"""

from __future__ import annotations

import stat
import time

from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

from common import keyspace
from common.apikeys import parse_key, secret_matches
from common.records.api_keys import find_by_prefix
from common.store.connect import open_store
from controlplane.backup.archive import HMAC_SECRET_FILE, read_manifest
from controlplane.cli_fabricd import app
from tests.controlplane.backup.test_backup_restore_api import HMAC, populate
from tests.support.inprocess_fabricd import serve_fabricd

runner = CliRunner()


def fabricd(*args: str, env: dict[str, str] | None = None):
    # Only the variables a test names: fabricd reads its settings from the environment.
    base = {"FABRIC_KEY_HMAC_SECRET": "", "FABRIC_KEY_HMAC_SECRET_FILE": ""}
    return runner.invoke(app, list(args), env={**base, **(env or {})})


def make_cluster(tmp_path):
    """A cluster with two API keys, its archive and the key that opens it."""
    s1 = tmp_path / "s1"
    assert fabricd("init", "--state-dir", str(s1)).exit_code == 0
    key_file = tmp_path / "backup.key"
    assert fabricd("backup", "keygen", "--key-file", str(key_file)).exit_code == 0
    store = open_store(None, s1)
    try:
        with serve_fabricd(store, s1, env={"FABRIC_KEY_HMAC_SECRET": HMAC}) as (api, _):
            keys = [populate(api)]
            made = api.post("/api/ai/keys", json={"name": "batch", "endpoint": "qwen-openai"})
            assert made.status_code == 201, made.text
            keys.append(made.json()["key"])
            done = fabricd("backup", "create", "--state-dir", str(s1), "--key-file", str(key_file),
                           env={"FABRIC_KEY_HMAC_SECRET": HMAC})
            assert done.exit_code == 0, done.output
            # Every fabricd exports the time the backup recorded in the store.
            text = api.get("/metrics").text
    finally:
        store.close()
    [archive] = list((s1 / "backups").glob("fabric-backup-*.tar"))
    return s1, archive, key_file, keys, text


def test_an_archive_restores_into_an_empty_cluster_with_every_key_still_valid(tmp_path):
    s1, archive, key_file, keys, metrics = make_cluster(tmp_path)
    assert stat.S_IMODE(archive.stat().st_mode) == 0o600
    data = archive.read_bytes()
    admin_password = (s1 / "admin-password").read_text().strip()
    for secret in (HMAC.encode(), admin_password.encode(), b"PRIVATE KEY", (s1 / "pki" / "ca.key").read_bytes()):
        assert secret not in data
    manifest = read_manifest(data)
    assert {"pki/ca.crt", "pki/ca.key", "admin-password", "viewer-password"} <= set(manifest["files"])
    stamp = {s.name: s.value for f in text_string_to_metric_families(metrics) for s in f.samples}
    assert stamp["fabric_backup_last_success_timestamp_seconds"] >= manifest["created_at"] > 0

    s2 = tmp_path / "s2"
    done = fabricd("backup", "restore", str(archive), "--state-dir", str(s2), "--key-file", str(key_file))
    assert done.exit_code == 0, done.output
    assert HMAC not in done.output and admin_password not in done.output
    secret_file = s2 / HMAC_SECRET_FILE
    assert stat.S_IMODE(secret_file.stat().st_mode) == 0o600 and secret_file.read_bytes() == HMAC.encode()
    assert (s2 / "pki" / "ca.key").read_bytes() == (s1 / "pki" / "ca.key").read_bytes()

    store = open_store(None, s2)
    try:
        for key in keys:
            record = find_by_prefix(store, parse_key(key))
            assert record is not None and secret_matches(record, key, secret_file.read_bytes(), time.time())
        assert store.list(keyspace.auth())  # the admin-token signing secret came back
        # A fabricd on the restored state: the old admin password logs in, the records are there.
        with serve_fabricd(store, s2, env={"FABRIC_KEY_HMAC_SECRET_FILE": str(secret_file)}) as (api, _):
            listed = api.get("/api/ai/keys")
            assert listed.status_code == 200, listed.text
            assert sorted(k["name"] for k in listed.json()) == ["batch", "ci"]
            assert api.get("/api/ai/deployments/qwen").status_code == 200
    finally:
        store.close()


def test_a_wrong_key_a_used_store_or_no_hmac_secret_is_refused_and_writes_nothing(tmp_path):
    s1, archive, key_file, _, _ = make_cluster(tmp_path)
    other = tmp_path / "other.key"
    assert fabricd("backup", "keygen", "--key-file", str(other)).exit_code == 0
    assert fabricd("backup", "keygen", "--key-file", str(other)).exit_code == 2  # never overwritten

    s3 = tmp_path / "s3"
    done = fabricd("backup", "restore", str(archive), "--state-dir", str(s3), "--key-file", str(other))
    assert done.exit_code == 2 and "does not open this archive" in done.output
    assert not s3.exists()

    # The source cluster's own store is not empty: a restore never mixes two clusters.
    done = fabricd("backup", "restore", str(archive), "--state-dir", str(tmp_path / "s4"), "--key-file",
                   str(key_file), "--store", f"sqlite://{s1 / 'fabric.db'}")
    assert done.exit_code == 2 and "already holds" in done.output
    assert not (tmp_path / "s4" / "pki").exists()

    done = fabricd("backup", "create", "--state-dir", str(s1), "--key-file", str(key_file))
    assert done.exit_code == 2 and "HMAC secret" in done.output
    assert len(list((s1 / "backups").glob("fabric-backup-*.tar"))) == 1
