"""Restore: write a backup document's records into this store (controlplane.backup plans it).

Endpoints with an external provider or fallbacks are an admin's to write, here as through
POST /api/ai/endpoints (controlplane.ops.endpoints.refuse_outbound_reach). Records that differ
from this store are written only when the caller says replace (else 409 conflict naming them);
a record that appeared meanwhile is kept. The restore is one event.
"""

from __future__ import annotations

from common.errors import Conflict
from common.schemas import InferenceEndpoint
from controlplane.backup import store_io
from controlplane.backup.document import RestorePlan
from controlplane.ops import common
from controlplane.ops.endpoints import refuse_outbound_reach
from controlplane.state import AppState
from controlplane.tenancy.principal import Principal


def check(caller: Principal, plan: RestorePlan) -> None:
    """What a restore asks of its caller, checked before a dry run answers too."""
    for (section, _name), record in plan.records.items():
        if section == "endpoints":
            refuse_outbound_reach(caller, InferenceEndpoint.model_validate(record))


def restore(ctx: AppState, caller: Principal, plan: RestorePlan, *, replace: bool) -> tuple[list[str], list[str]]:
    """(the records written, those that appeared meanwhile and were kept)."""
    check(caller, plan)
    if plan.conflicts and not replace:
        names = ", ".join(f"{c.section}/{c.name}" for c in plan.conflicts[:20])
        raise Conflict(f"{len(plan.conflicts)} record(s) differ from this store ({names}); nothing was written. "
                       "Pass replace=true to overwrite them", code="conflict")
    store_io.check_key_prefixes(ctx.store, plan)
    written, raced = store_io.write(ctx.store, plan)
    common.event(ctx, "backup", "restore", "restored",
                 f"restore wrote {len(written)} record(s)" + (f"; {len(raced)} appeared meanwhile and were kept: "
                                                               f"{', '.join(raced[:10])}" if raced else ""))
    return written, raced
