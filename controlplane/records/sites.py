"""Site records (/fabric/sites/<name>): typed reads and validated writes (records.resource)."""

from __future__ import annotations

from common import keyspace
from common.schemas import Site
from controlplane.records.resource import Records

KIND = "site"
RECORDS = Records(Site, keyspace.sites, KIND)
(get, require, exists, stored, stored_items, list, create, put, update,  # noqa: A001 - the module's verbs
 upsert, update_at, update_status, delete, discard, versioned, count) = RECORDS.verbs()
