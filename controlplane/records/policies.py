"""TenantPolicy records (/fabric/policies/<tenant>): typed reads and validated writes (records.resource)."""

from __future__ import annotations

from common import keyspace
from controlplane.records.resource import Records
from controlplane.tenancy.policies import TenantPolicy

KIND = "policy"
RECORDS = Records(TenantPolicy, keyspace.policies, KIND, name_field="tenant")
(get, require, exists, stored, stored_items, list, create, put, update,  # noqa: A001 - the module's verbs
 upsert, update_at, update_status, delete, discard, versioned, count) = RECORDS.verbs()
