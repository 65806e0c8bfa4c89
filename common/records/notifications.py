"""Notification records (/fabric/notifications/<id>, common.notifications.Notification): typed
reads and the delivery bookkeeping's compare-and-swap (records.resource). New notifications are
created with common.notifications.raise_once (create if absent: the de-duplication)."""

from __future__ import annotations

from common import keyspace
from common.notifications import Notification
from common.records.resource import Records

KIND = "notification"
RECORDS = Records(Notification, keyspace.notifications, KIND, name_field="id")
(get, require, exists, stored, stored_items, list, create, put, update,  # noqa: A001 - the module's verbs
 upsert, update_at, update_status, delete, discard, versioned, count) = RECORDS.verbs()
