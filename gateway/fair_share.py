"""Fair shares of a saturated endpoint between tenants inside one priority band: start-time fair
queuing (SFQ) on virtual token counters, so the order calls leave a band's queue follows the
tokens each tenant has been let through, not the number of calls.

Each waiting call costs its estimated tokens (prompt + max_tokens x choices, the same estimate the
limits reserve). Per band, a virtual clock ``V`` and per tenant the virtual finish of its last
call ``F[t]``:
- a call of tenant t arriving with cost c gets the start tag ``S = max(V, F[t])`` and moves
  ``F[t]`` to ``S + c``;
- calls leave in order of start tag, ties by arrival; ``V`` moves to the start tag of the call let go;
- a call that leaves without being let through (displaced, timed out, its client gone) gives its
  tokens back when it was its tenant's latest.

So a tenant sending 10x the tokens per call gets about one call through for every ten of the
other's: its long generations cannot starve another's short ones, and a call arriving from a
tenant with nothing queued waits behind at most one call of each other tenant already in the
band (plus the calls with an equal tag), however many that tenant has queued. Callers without a
tenant share the credential-less account ``""``. Every tenant has weight 1 (equal shares).
Tenants whose finish tag is not ahead of ``V`` hold no state (forgotten when the band empties).
``FairClock`` is pure bookkeeping: no I/O, no time.
"""

from __future__ import annotations

from dataclasses import dataclass, field

MIN_COST = 1  # a call with no estimate still moves its tenant's clock


@dataclass
class FairClock:
    """One band of one endpoint's virtual time and its tenants' finish tags."""

    virtual: float = 0.0
    finish: dict[str, float] = field(default_factory=dict)

    def stamp(self, tenant: str | None, cost: int) -> tuple[float, float]:
        """The call's (start, finish) tags; the tenant's clock moves to finish."""
        key = tenant or ""
        start = max(self.virtual, self.finish.get(key, 0.0))
        end = start + max(MIN_COST, cost)
        self.finish[key] = end
        return start, end

    def released(self, start: float) -> None:
        """A call with this start tag was let through: virtual time reaches it."""
        self.virtual = max(self.virtual, start)

    def withdrawn(self, tenant: str | None, start: float, end: float) -> None:
        """A call left unserved: give its tokens back if it was its tenant's latest."""
        key = tenant or ""
        if self.finish.get(key) == end:
            self.finish[key] = max(start, self.virtual)

    def idle(self) -> None:
        """The band emptied: forget every tenant (none is ahead of anyone any more)."""
        self.finish.clear()
