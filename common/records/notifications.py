"""Notification records (/fabric/notifications/<id>, common.notifications.Notification): typed
reads and the delivery bookkeeping's compare-and-swap (records.resource). New notifications are
created with ``raise_once`` (create if absent: the de-duplication)."""

from __future__ import annotations

from common import keyspace
from common.errors import Conflict
from common.notifications import Notification
from common.records.resource import Records
from common.store.base import Store

KIND = "notification"
RECORDS = Records(Notification, keyspace.notifications, KIND, name_field="id")
(get, require, exists, stored, stored_items, list, create, put, update,  # noqa: A001 - the module's verbs
 upsert, update_at, update_status, delete, discard, versioned, count) = RECORDS.verbs()


def raise_once(store: Store, n: Notification) -> bool:
    """Create the notification unless one with its id exists; True when this call created it."""
    try:
        create(store, n)
    except Conflict:
        return False
    return True
