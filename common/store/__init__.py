"""The state store: one interface (`Store`), two implementations.

`open_store(url, state_dir)` picks one:
  - ``sqlite:///ABS/PATH.db`` or ``None`` (default ``{state_dir}/fabric.db``): embedded SQLite, WAL.
  - ``etcd://HOST:PORT[,HOST:PORT...]``: etcd v3 through etcd3gw (its JSON gateway), with
    failover between the members listed.
"""

from common.store.base import KV, Event, Lease, Store
from common.store.connect import open_store

__all__ = ["KV", "Event", "Lease", "Store", "open_store"]
