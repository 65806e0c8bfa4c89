"""InferenceDeployment records (/fabric/deployments/<name>): typed reads, validated writes."""

from __future__ import annotations

from common import keyspace
from common.records.resource import Records
from common.schemas import InferenceDeployment

KIND = "deployment"
RECORDS = Records(InferenceDeployment, keyspace.deployments, KIND)
(get, require, exists, stored, stored_items, list, create, put, update,  # noqa: A001 - the module's verbs
 upsert, update_at, update_status, delete, discard, versioned, count) = RECORDS.verbs()
