"""A stream stops at the budget (issue 37): generated tokens are counted from the chunks while
a stream runs, and the stream ends when its key's or tenant's TPM, or the daily budget, would be
exceeded.

Admission holds prompt + max_tokens in every token counter (gateway.limits.Hold). A stream's
live count is the prompt estimate plus the tokens relayed so far (one per content-bearing delta
event: TokenTally). While the count stays within what the call holds in the current window,
nothing is written. When it would pass it -- the stream outlived its window (a TPM minute, the
daily budget's UTC day: the new window holds nothing for it yet, so its further tokens are
charged there as they come), or it generates more than was held (an upstream that does not
honour max_tokens) -- the hold is extended against the limit, BLOCK tokens at a time (exactly
what is missing when a block no longer fits). An extension the limit refuses ends the stream:
the events that fit are relayed (a read holding several is taken event by event), the first
that does not fit and the rest are not, and the client gets
an OpenAI-shaped error event (``code: rate_limited``) then ``data: [DONE]`` (also when the store
does not answer an extension: a limit that cannot be checked is not passed); the upstream is
closed (gateway.proxy.relay's finally) and the call settles at what was relayed (prompt
estimate plus the tokens in the relayed events), so the counter ends exactly at the limit.

A limit in shadow mode (FABRIC_<LIMIT>_SHADOW, or the key's shadow_limits) is extended without
its limit: the stream goes on, and the limit is added to the call's ``would_refuse`` (metric,
audit row, explanation) when the extension passed it.

Relaying with a budget is event-aligned: only complete events (ending in a blank line) are sent,
a partial one waits for its end, so a cut never leaves half an event at the client. The bytes
and their order are unchanged.
"""

from __future__ import annotations

import json
import re

from common.errors import TransientError
from gateway.limits import Admission, LimitKeeper, window_of

BLOCK = 32  # tokens taken per extension: one store write per BLOCK tokens past the hold
# One match per generated piece, as OpenAI-style streams write them (vLLM's JSON has no spaces; a
# provider's may). An empty string (the role chunk's "content":"") is no token.
_CHAT = re.compile(rb'"(?:content|reasoning_content|reasoning|arguments)":\s?"(?!")')
_TEXT = re.compile(rb'"text":\s?"(?!")')
_RESPONSES = re.compile(rb'"type":\s?"response\.[a-z_.]+\.delta"')
# Per route: (the pattern, the literal that counts the common chunk with one bytes.count, the empty
# value that would be miscounted by it). Counting is per chunk on the hot path: one bytes.count
# and one substring test cost ~0.2 us, the pattern several; a chunk without the literal (a role,
# finish, reasoning or tool-call delta, JSON with spaces) or with an empty value goes to the
# pattern. A chunk that holds content deltas counts those (reasoning or tool-call deltas sent
# in the same read are then not counted; the final usage settles them exactly).
COUNTERS = {
    "/v1/chat/completions": (_CHAT, b'"content":"', b'"content":""'),
    "/v1/completions": (_TEXT, b'"text":"', b'"text":""'),
    "/v1/responses": (_RESPONSES, b'.delta"', b'.delta":""'),
}
LIVE_ROUTES = tuple(COUNTERS)


class LiveBudget:
    """One streamed call's live count against its admission's token holds."""

    def __init__(self, keeper: LimitKeeper, admission: Admission, prompt_tokens: int, path: str):
        self.keeper = keeper
        self.admission = admission
        self.used = prompt_tokens  # the prompt estimate plus the tokens relayed so far
        self.generated = 0
        self.cut_by = ""  # the limit that ended the stream
        self.unchecked = False  # ended because the store did not answer the extension
        self._pattern, self._literal, self._empty = COUNTERS.get(path.rstrip("/"), COUNTERS["/v1/chat/completions"])
        self._clock = keeper.clock
        self._pending = b""
        self._refresh()

    def _refresh(self) -> None:
        """The fast path's bounds: the count every hold covers, until the first window ends."""
        holds = self.admission.holds
        self._room = min(h.base + h.held for h in holds)
        self._until = min(h.window + h.r.window_secs if h.r.window_secs else float("inf") for h in holds)

    def feed(self, chunk: bytes) -> tuple[bytes, int]:
        """(the complete events now ready, the tokens in them); a partial event waits."""
        if self._pending or not chunk.endswith(b"\n\n"):
            data = self._pending + chunk
            end = data.rfind(b"\n\n")
            if end < 0:
                self._pending = data
                return b"", 0
            chunk, self._pending = data[:end + 2], data[end + 2:]
        return chunk, self._count(chunk)

    def _count(self, events: bytes) -> int:
        n = events.count(self._literal)
        if not n or self._empty in events:
            return len(self._pattern.findall(events))
        return n

    def fits(self, n: int) -> bool:
        """The hot path: count n more tokens when the holds cover them (no store write)."""
        want = self.used + n
        if want <= self._room and self._clock() < self._until:
            self.used, self.generated = want, self.generated + n
            return True
        return False

    async def take_events(self, ready: bytes, n: int) -> tuple[bytes, bool]:
        """The slow path for complete events holding n tokens that fits() did not cover: (what of
        them to relay, whether the stream goes on). When the limit refuses them all, they are
        taken event by event, so the stream ends at the last event that fits (to the token)."""
        if await self.take(n):
            return ready, True
        relayed = []
        for event in ready.split(b"\n\n")[:-1]:
            event += b"\n\n"
            k = self._count(event)
            if k and not await self.take(k):
                return b"".join(relayed), False
            relayed.append(event)
        return b"".join(relayed), True

    def flush(self) -> bytes:
        rest, self._pending = self._pending, b""
        return rest

    async def take(self, n: int) -> bool:
        """Count n more tokens; False (nothing counted) when a limit refuses them."""
        if self.fits(n):
            return True
        want = self.used + n
        for h in self.admission.holds:
            now = self.keeper.clock()
            start = window_of(now, h.r.window_secs)
            if start != h.window:  # a new window: what was relayed belongs to the old one
                h.window, h.held, h.base = start, 0, self.used
            need = want - h.base - h.held
            if need <= 0:
                continue
            shadowed = h.r.what in self.admission.shadow
            limit = None if shadowed else h.r.limit
            amount = max(need, BLOCK)
            try:
                outcome = await self.keeper._apply(h.r, amount, limit, now)
                if not outcome.ok and amount > need:  # the last tokens before the limit
                    amount = need
                    outcome = await self.keeper._apply(h.r, amount, limit, now)
            except TransientError:  # a limit that cannot be checked is not passed (fail closed)
                self.cut_by, self.unchecked = h.r.what, True
                self._refresh()
                return False
            if not outcome.ok:
                self.cut_by = h.r.what
                self._refresh()
                return False
            h.held += amount
            if shadowed and h.r.limit is not None and outcome.value - (amount - need) > h.r.limit \
                    and h.r.what not in self.admission.would_refuse:
                self.admission.would_refuse.append(h.r.what)
        self.used, self.generated = want, self.generated + n
        self._refresh()
        return True

    def cut_event(self) -> bytes:
        """The error event and [DONE] that end a stream cut at the budget."""
        limit = next((h.r.limit for h in self.admission.holds if h.r.what == self.cut_by), None)
        why = "could not be checked (the limit store did not answer)" if self.unchecked else "is reached"
        message = (f"{self.cut_by} ({limit}) {why}; the answer was cut after {self.generated} generated "
                   "tokens; try again later")
        event = {"error": {"message": message, "type": "rate_limited", "param": None, "code": "rate_limited"}}
        return b"data: " + json.dumps(event).encode() + b"\n\ndata: [DONE]\n\n"


def live_budget(keeper: LimitKeeper, admission: Admission | None, stream: bool, path: str,
                prompt_tokens: int) -> LiveBudget | None:
    """A LiveBudget for a streamed generation that holds token counters; None otherwise (no
    per-chunk work at all)."""
    if admission is None or not admission.holds or not stream or path.rstrip("/") not in LIVE_ROUTES:
        return None
    return LiveBudget(keeper, admission, prompt_tokens, path)
