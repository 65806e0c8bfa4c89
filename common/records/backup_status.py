"""The last backup that succeeded (/fabric/backups/last-success), one record every fabricd reads.

`fabricd backup create` writes it after the archive is safely on disk; each fabricd's /metrics
turns it into fabric_backup_last_success_timestamp_seconds (controlplane.cluster_metrics), and
FabricBackupTooOld fires when it is older than 26 hours. The store is the place because the
timer runs on any one control-plane host while Prometheus scrapes every fabricd: each of them
reports the same time, whichever host made the archive.
"""

from __future__ import annotations

from pydantic import BaseModel

from common import keyspace
from common.records import reading
from common.store.base import Store

KEY = keyspace.backups("last-success")
KIND = "backup status"


class BackupStatus(BaseModel):
    at: float  # epoch seconds the archive was complete
    archive: str  # its file name
    bytes: int
    host: str  # the host that wrote it
    store_keys: int


def record_success(store: Store, status: BackupStatus) -> None:
    store.put(KEY, status.model_dump_json())


def last_success(store: Store) -> BackupStatus | None:
    """The last success; None when there is none, or (skipped and counted) when the record does not
    parse: it then reads as no backup, so the alert speaks up rather than the metrics failing."""
    kv = store.get(KEY)
    found = [] if kv is None else reading.each(BackupStatus, [kv], KIND)
    return found[0] if found else None
