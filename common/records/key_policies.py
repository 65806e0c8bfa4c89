"""KeyPolicy records (/fabric/key-policies/<endpoint>): typed reads, validated writes."""

from __future__ import annotations

from common import keyspace
from common.key_policies import KeyPolicy
from common.records.resource import Records

RECORDS = Records(KeyPolicy, keyspace.key_policies, "key policy", name_field="endpoint")
(get, require, exists, stored, stored_items, list, create, put, update,  # noqa: A001 - the module's verbs
 upsert, update_at, update_status, delete, discard, versioned, count) = RECORDS.verbs()
