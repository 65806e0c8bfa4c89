"""InferenceDeployment records (/fabric/deployments/<name>): typed reads and validated writes (records.resource)."""

from __future__ import annotations

from common import keyspace
from common.schemas import InferenceDeployment
from controlplane.records.resource import Records

KIND = "deployment"
RECORDS = Records(InferenceDeployment, keyspace.deployments, KIND)
get, require, exists, stored, stored_items = (
    RECORDS.get, RECORDS.require, RECORDS.exists, RECORDS.stored, RECORDS.stored_items)
list, create, update, update_status, delete = (  # noqa: A001 - the module's verbs
    RECORDS.list, RECORDS.create, RECORDS.update, RECORDS.update_status, RECORDS.delete)
