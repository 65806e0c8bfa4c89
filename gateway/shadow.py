"""Shadow mode per limit (issue 37): ``FABRIC_<LIMIT>_SHADOW=1`` (FABRIC_USER_RPM_SHADOW,
FABRIC_PROJECT_TPM_SHADOW, FABRIC_DAILY_TOKENS_SHADOW, FABRIC_TENANT_STREAMS_SHADOW...) makes
that limit count as usual but never refuse: a call it would have refused goes through, is
counted in fabric_gateway_shadow_refusals{limit} and audited with ``would_refuse`` naming the
limit, so an operator can try a limit on live traffic before enforcing it. A key's
``shadow_limits`` does the same for that key's calls only (gateway.limits.key_shadowed). A
stream that passes a shadowed token limit mid-way is not cut (gateway.live_budget); the limit
joins its would_refuse.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

_SHADOW = re.compile(r"^(FABRIC_[A-Z_]+)_SHADOW$")


def shadowed_limits(env: Mapping[str, str]) -> frozenset[str]:
    """The limit names (as gateway.limits.Reservation.what names them) set to shadow in ``env``
    (read once, by gateway.settings.load)."""
    return frozenset(m.group(1) for k, v in env.items() if (m := _SHADOW.match(k)) and v.strip() in ("1", "true"))
