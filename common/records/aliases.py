"""ModelAlias records (/fabric/model-aliases/<name>): typed reads and validated writes (records.resource)."""

from __future__ import annotations

from common import keyspace
from common.model_aliases import ModelAlias
from common.records.resource import Records

KIND = "alias"
RECORDS = Records(ModelAlias, keyspace.model_aliases, KIND)
(get, require, exists, stored, stored_items, list, create, put, update,  # noqa: A001 - the module's verbs
 upsert, update_at, update_status, delete, discard, versioned, count) = RECORDS.verbs()
