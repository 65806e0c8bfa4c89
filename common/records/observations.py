"""ReplicaObservation records (/fabric/observations/<replica id>: the last scrape of a replica's
engine): typed reads and validated writes (records.resource)."""

from __future__ import annotations

import builtins

from common import keyspace
from common.records.resource import Records
from common.schemas import ReplicaObservation
from common.store.base import Store

KIND = "observation"
RECORDS = Records(ReplicaObservation, keyspace.observations, KIND, name_field="replica_id")
(get, require, exists, stored, stored_items, list, create, put, update,  # noqa: A001 - the module's verbs
 upsert, update_at, update_status, delete, discard, versioned, count) = RECORDS.verbs()


def put_all(store: Store, batch: builtins.list[ReplicaObservation]) -> None:
    """Store a pass's changed observations in one batch (Store.put_all), not one write each."""
    store.put_all([(keyspace.observations(o.replica_id), o.model_dump_json()) for o in batch])
