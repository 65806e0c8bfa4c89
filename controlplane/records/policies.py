"""TenantPolicy records (/fabric/policies/<tenant>): typed reads and validated writes (records.resource)."""

from __future__ import annotations

from controlplane.tenancy.policies import (
 RECORDS,  # defined beside its model: the tenancy module reads through it
)

(get, require, exists, stored, stored_items, list, create, put, update,  # noqa: A001 - the module's verbs
 upsert, update_at, update_status, delete, discard, versioned, count) = RECORDS.verbs()
