"""InferenceProfile records (/fabric/profiles/<name>): typed reads and validated writes (records.resource)."""

from __future__ import annotations

from common import keyspace
from common.schemas import InferenceProfile
from controlplane.records.resource import Records

KIND = "profile"
RECORDS = Records(InferenceProfile, keyspace.profiles, KIND)
get, require, exists, stored, stored_items = (
    RECORDS.get, RECORDS.require, RECORDS.exists, RECORDS.stored, RECORDS.stored_items)
list, create, update, update_status, delete = (  # noqa: A001 - the module's verbs
    RECORDS.list, RECORDS.create, RECORDS.update, RECORDS.update_status, RECORDS.delete)
