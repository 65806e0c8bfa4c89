"""BatchJob records (/fabric/batches/<id>): typed reads and validated writes (records.resource)."""

from __future__ import annotations

from common import keyspace
from common.batch_jobs import BatchJob
from common.records.resource import Records

KIND = "batch"
RECORDS = Records(BatchJob, keyspace.batches, KIND, name_field="id")
(get, require, exists, stored, stored_items, list, create, put, update,  # noqa: A001 - the module's verbs
 upsert, update_at, update_status, delete, discard, versioned, count) = RECORDS.verbs()
