"""Budget records (/fabric/budgets/<name>, common.budgets): typed reads and validated writes
(records.resource); the gateway reads the same records through common.budgets.read_all."""

from __future__ import annotations

from common import keyspace
from common.budgets import Budget
from common.records.resource import Records

KIND = "budget"
RECORDS = Records(Budget, keyspace.budgets, KIND)
(get, require, exists, stored, stored_items, list, create, put, update,  # noqa: A001 - the module's verbs
 upsert, update_at, update_status, delete, discard, versioned, count) = RECORDS.verbs()
