"""Webhook records (/fabric/webhooks/<name>, common.notifications.Webhook): typed reads and
validated writes (records.resource). A webhook's secret is stored here and never answered."""

from __future__ import annotations

from common import keyspace
from common.notifications import Webhook
from common.records.resource import Records

KIND = "webhook"
RECORDS = Records(Webhook, keyspace.webhooks, KIND)
(get, require, exists, stored, stored_items, list, create, put, update,  # noqa: A001 - the module's verbs
 upsert, update_at, update_status, delete, discard, versioned, count) = RECORDS.verbs()
