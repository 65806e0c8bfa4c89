"""ModelArtifact records (/fabric/models/<name>): typed reads and validated writes (records.resource)."""

from __future__ import annotations

from common import keyspace
from common.records.resource import Records
from common.schemas import ModelArtifact

KIND = "model"
RECORDS = Records(ModelArtifact, keyspace.models, KIND)
(get, require, exists, stored, stored_items, list, create, put, update,  # noqa: A001 - the module's verbs
 upsert, update_at, update_status, delete, discard, versioned, count) = RECORDS.verbs()
