"""Operator alerts through the notification channel, for installs without Prometheus
(FABRIC_NOTIFY_ALERTS=1). The same conditions as the paging rules in
docs/dashboards/fabric-alerts.yml, evaluated by fabricd's notify pass from the store:

  node not heartbeating   a node holding replicas whose last heartbeat is over NODE_SILENT_S old
                          (FabricNodeNotHeartbeating); one notification per silence: its id names
                          the node and the heartbeat it stopped at
  backup too old          the last successful backup is over BACKUP_MAX_AGE_S old, or there was
                          none (FabricBackupTooOld); one per last backup

``raised`` is pure; each notification is created if absent (common.records.notifications.raise_once),
so a condition that stays true is sent once, and a new incident gets a new id.
"""

from __future__ import annotations

from collections.abc import Iterable

from common.notifications import Notification
from common.schemas import Node

NODE_SILENT_S = 120 + 180  # the rule's 2 minutes, held for its 3 minutes
BACKUP_MAX_AGE_S = 26 * 3600 + 300  # 26 hours, held for 5 minutes


def raised(nodes: Iterable[Node], replicas_per_node: dict[str, int], last_backup_at: float | None,
           now: float) -> list[Notification]:
    out = []
    for node in nodes:
        stranded = replicas_per_node.get(node.id, 0)
        silent = now - node.last_heartbeat
        if stranded and silent > NODE_SILENT_S:
            out.append(Notification(
                id=f"alert-node-silent-{node.id}-{int(node.last_heartbeat)}", kind="alert", severity="page",
                title=f"node {node.id} stopped heartbeating",
                message=(f"no heartbeat for {int(silent)} s; it strands {stranded} replicas, replaced elsewhere "
                         f"where capacity allows. Check the host, systemctl status fabric-agent and "
                         f"fabricctl ai node get {node.id}"),
                data={"alert": "FabricNodeNotHeartbeating", "node": node.id, "replicas": stranded,
                      "last_heartbeat": node.last_heartbeat}, created_at=now))
    at = last_backup_at or 0.0
    if now - at > BACKUP_MAX_AGE_S:
        age = "no backup ever succeeded" if not at else f"the last backup is {(now - at) / 3600:.1f} hours old"
        out.append(Notification(
            id=f"alert-backup-old-{int(at)}", kind="alert", severity="page", title="backup too old",
            message=f"{age}; fabric-backup.timer runs fabricd backup create daily (journalctl -u fabric-backup.service)",
            data={"alert": "FabricBackupTooOld", "last_success": at or None}, created_at=now))
    return out
