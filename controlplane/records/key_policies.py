"""KeyPolicy records (/fabric/key-policies/<endpoint>): typed reads and validated writes (records.resource)."""

from __future__ import annotations

from common import keyspace
from controlplane.records.resource import Records
from controlplane.tenancy.key_policies import KeyPolicy

KIND = "key policy"
RECORDS = Records(KeyPolicy, keyspace.key_policies, KIND, name_field="endpoint")
(get, require, exists, stored, stored_items, list, create, put, update,  # noqa: A001 - the module's verbs
 upsert, update_at, update_status, delete, discard, versioned, count) = RECORDS.verbs()
