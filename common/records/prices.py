"""The price sheet record (/fabric/prices, common.prices.PriceSheet): one document, written whole."""

from __future__ import annotations

from common import keyspace
from common.prices import PriceSheet
from common.records import cas, reading
from common.store.base import Store

KIND = "price sheet"


def read(store: Store) -> PriceSheet | None:
    """The sheet, or None when none was set (UnreadableRecord when it does not parse)."""
    kv = store.get(keyspace.prices())
    return None if kv is None else reading.one(PriceSheet, kv, KIND)


def write(store: Store, sheet: PriceSheet) -> PriceSheet:
    sheet = cas.validated(PriceSheet, sheet)
    store.put(keyspace.prices(), sheet.model_dump_json())
    return sheet
