"""Bounded list answers: `?limit=N&continue=TOKEN` on the resource lists.

A list answers at most `limit` items (default DEFAULT_LIMIT, at most MAX_LIMIT), in key order.
When more remain, the `X-Fabric-Continue` header carries the token to pass as `continue` for the
next page (the last name returned); no header means the list is complete. The body stays a JSON
array, so a client that never pages reads the first page exactly as before.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

from fastapi import Query, Response

DEFAULT_LIMIT = 500
MAX_LIMIT = 1000
CONTINUE_HEADER = "X-Fabric-Continue"

LimitQuery = Annotated[int, Query(ge=1, le=MAX_LIMIT, description=f"items per page (default {DEFAULT_LIMIT})")]
ContinueQuery = Annotated[str | None, Query(alias="continue", max_length=512,
                                            description=f"the {CONTINUE_HEADER} header of the previous page")]


def page(items: list[tuple[str, dict]], response: Response, limit: int = DEFAULT_LIMIT,
         after: str | None = None, keep: Callable[[dict], bool] | None = None) -> list[dict]:
    """One page of ``items`` ((name, record) in key order: a records module's stored_items), names
    after `after`; sets the continue header. `keep` (a tenant's filter) drops records before the
    page is cut, so pages stay full."""
    rows = [(name, value) for name, value in items if after is None or name > after]
    if keep is not None:
        rows = [(name, value) for name, value in rows if keep(value)]
    if len(rows) > limit:
        rows = rows[:limit]
        response.headers[CONTINUE_HEADER] = rows[-1][0]
    return [value for _, value in rows]
