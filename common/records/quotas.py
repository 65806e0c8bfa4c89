"""TenantQuota records (/fabric/quotas/<tenant>): typed reads and validated writes (records.resource)."""

from __future__ import annotations

from common import keyspace
from common.records.resource import Records
from common.schemas import TenantQuota

KIND = "quota"
RECORDS = Records(TenantQuota, keyspace.quotas, KIND, name_field="tenant")
(get, require, exists, stored, stored_items, list, create, put, update,  # noqa: A001 - the module's verbs
 upsert, update_at, update_status, delete, discard, versioned, count) = RECORDS.verbs()
