"""Stream migration: a streamed chat or text completion whose replica dies mid-answer goes on
at another replica, as a continuation of what the client already has (issue 51).

The decision is pure (``read_sent``, ``continuation``, ``Seam``); ``MigratingResponse`` applies
it under gateway.proxy.relay, which reads it like any upstream response.

A replica that fails before its response head (refused, reset, closed, silent past the idle
timeout) has sent the client nothing: ``Migration.open`` re-issues the call whole to another
ready replica, under the same limits (a replica that got the request is charged its prompt; one
never reached, nothing). When an upstream ends a stream before its ``data: [DONE]`` (a reset, an
EOF, a body that stops mid-event, an idle timeout), and the call may move, the gateway re-issues
it to another ready replica:
  chat          messages + an assistant message holding the text sent so far, with vLLM's
                ``continue_final_message: true`` and ``add_generation_prompt: false`` (a call
                that already continued its own assistant message gets the text appended to it);
  completions   prompt + the text sent so far;
and the generation cap it set (``max_completion_tokens`` before ``max_tokens``, as vLLM reads
them) less the tokens already sent (one per content-bearing event, vLLM's streaming unit; an
event that carried two tokens makes the total at most that many tokens longer than asked).
Trailing whitespace of the text is kept out of the prefix (chat templates trim a final message;
a tokenizer splits a trailing space differently) and as much of it as the continuation starts
with is dropped from it, so the client never sees it twice.

The client's stream is one stream: every continuation event carries the first event's ``id``
and ``created``, a second role delta is dropped, only complete events are ever relayed (a cut
leaves no half event), and the one usage event at the end says what the client received: the
prompt (the continuation's prompt less the tokens it was handed back) and every token sent.
What the engines computed (each hop's prompt and generated tokens; a dead hop's are estimated
from what it sent) is charged to the call (``ProxyResult.tokens``) and shown by explain.

Not moved: more than one choice (n, best_of), logprobs, echo, a prompt of token ids or several
prompts, structured output (its grammar would restart at the continuation), a reasoning or
tool-call delta already relayed (the parsers cannot resume mid-way), and an answer already past
``KEEP_MAX`` bytes. A call moves at most ``per_call`` times, and an endpoint's calls at most
``per_endpoint`` times a minute in this process (a dying fleet must not double its load in
retries). A replica that died under calls ``DEATHS`` times within ``DEATH_WINDOW_S`` (cuts within
``SAME_DEATH_S`` of each other are one death) is reported (a warning) and not chosen for a
continuation until that window passes.
"""

from __future__ import annotations

import json
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from common.http1_client import (
    UpstreamConnectError,
    UpstreamError,
    UpstreamPool,
    UpstreamResponse,
    UpstreamTimeoutError,
)
from gateway.request_body import loads
from gateway.usage_inject import complete_events

log = logging.getLogger("fabric.gateway.migration")

ROUTES = ("/v1/chat/completions", "/v1/completions")
KEEP_MAX = 8 * 1024 * 1024  # relayed bytes kept to rebuild the text; a longer answer is not moved
DEATHS = 2
DEATH_WINDOW_S = 120.0
SAME_DEATH_S = 5.0  # cuts of one replica this close together are one death (every stream on it reports it)
DONE_EVENT = b"data: [DONE]\n\n"
STRUCTURED = ("response_format", "guided_json", "guided_regex", "guided_choice", "guided_grammar",
              "structured_outputs")


@dataclass
class Sent:
    """What the client has received so far (read from the relayed events)."""

    id: str | None = None
    created: int | None = None
    model: str | None = None
    text: str = ""
    tokens: int = 0  # content-bearing events
    role_sent: bool = False
    finished: bool = False  # a finish_reason went by
    blocked: str = ""  # why the text cannot be continued (a tool call, reasoning)


def read_sent(events: bytes, chat: bool) -> Sent:
    """Pure: the relayed SSE events (complete ones) -> what the client has."""
    out = Sent()
    parts: list[str] = []
    for line in events.split(b"\n"):
        if not line.startswith(b"data:") or line[5:].strip() == b"[DONE]":
            continue
        try:
            obj = loads(line[5:])
        except ValueError:
            continue
        if not isinstance(obj, dict):
            continue
        if out.id is None and isinstance(obj.get("id"), str):
            out.id, out.created, out.model = obj["id"], obj.get("created"), obj.get("model")
        for choice in obj.get("choices") or ():
            if not isinstance(choice, dict):
                continue
            if choice.get("finish_reason"):
                out.finished = True
            piece = _piece(choice, chat, out)
            if piece:
                parts.append(piece)
                out.tokens += 1
    out.text = "".join(parts)
    return out


def _piece(choice: dict, chat: bool, out: Sent) -> str:
    if not chat:
        text = choice.get("text")
        return text if isinstance(text, str) else ""
    delta = choice.get("delta")
    if not isinstance(delta, dict):
        return ""
    if delta.get("role"):
        out.role_sent = True
    if delta.get("tool_calls"):
        out.blocked = out.blocked or "a tool call was under way"
    if delta.get("reasoning_content") or delta.get("reasoning"):
        out.blocked = out.blocked or "reasoning was under way"
    content = delta.get("content")
    return content if isinstance(content, str) else ""


def refusal(path: str, data: dict | None) -> str | None:
    """Pure: why this call is never moved, or None (it may be)."""
    if path not in ROUTES or not isinstance(data, dict):
        return "not a chat or text completion"
    if (data.get("n") or 1) != 1 or (data.get("best_of") or 1) != 1:
        return "several choices"
    if data.get("logprobs") or data.get("top_logprobs") or data.get("echo"):
        return "logprobs or echo asked"
    if any(data.get(k) for k in STRUCTURED):
        return "structured output"
    if path == "/v1/completions":
        prompt = data.get("prompt")
        if not (isinstance(prompt, str) or (isinstance(prompt, list) and len(prompt) == 1
                                            and isinstance(prompt[0], str))):
            return "a prompt of token ids or several prompts"
    elif not isinstance(data.get("messages"), list) or not data["messages"]:
        return "no messages"
    return None


def cap_field(data: dict) -> str | None:
    """The field that caps generation, read the way vLLM reads it."""
    if data.get("max_completion_tokens") is not None:
        return "max_completion_tokens"
    return "max_tokens" if data.get("max_tokens") is not None else None


@dataclass(frozen=True)
class Continuation:
    body: dict | None  # None: the cap is already reached; the stream just ends
    held: str  # trailing whitespace kept out of the prefix
    generated: int  # tokens the client already has


def continuation(path: str, data: dict, sent: Sent) -> Continuation:
    """Pure: the request that continues ``data`` after what ``sent`` holds."""
    body = dict(data)
    prefix = sent.text.rstrip()
    held = sent.text[len(prefix):]
    name = cap_field(data)
    if name is not None:
        left = int(data[name]) - sent.tokens
        if left < 1:
            return Continuation(None, held, sent.tokens)
        body[name] = left
        if name == "max_completion_tokens" and data.get("max_tokens") is not None:
            body["max_tokens"] = min(int(data["max_tokens"]), left)
    if not prefix:
        return Continuation(body, held, sent.tokens)
    if path == "/v1/completions":
        prompt = data["prompt"]
        body["prompt"] = (prompt if isinstance(prompt, str) else prompt[0]) + prefix
        return Continuation(body, held, sent.tokens)
    messages = list(data["messages"])
    last = messages[-1] if isinstance(messages[-1], dict) else {}
    if data.get("continue_final_message") and last.get("role") == "assistant" and isinstance(last.get("content"), str):
        messages[-1] = {**last, "content": last["content"] + prefix}
    else:
        messages.append({"role": "assistant", "content": prefix})
    body.update(messages=messages, continue_final_message=True, add_generation_prompt=False)
    return Continuation(body, held, sent.tokens)


@dataclass
class Hop:
    """One upstream's share of a moved call."""

    replica: str
    prompt_tokens: int | None = None  # from its usage; None: it died before (estimated at the end)
    completion_tokens: int = 0
    exact: bool = False
    reached: bool = True  # False: it could not be connected to, so it computed nothing


class Seam:
    """Rewrites a continuation's events into the client's stream (complete events in, out)."""

    def __init__(self, sent: Sent, cont: Continuation, chat: bool, hops: list[Hop]):
        self.sent, self.chat, self.hops = sent, chat, hops
        self.held = cont.held
        self.before = cont.generated  # tokens the client had when this hop began

    def feed(self, events: bytes) -> bytes:
        out = []
        for event in events.split(b"\n\n")[:-1]:
            kept = self._event(event)
            if kept is not None:
                out.append(kept + b"\n\n")
        return b"".join(out)

    def _event(self, event: bytes) -> bytes | None:
        data = event.strip()
        if not data.startswith(b"data:") or data[5:].strip() == b"[DONE]":
            return event
        try:
            obj = loads(data[5:])
        except ValueError:
            return event
        if not isinstance(obj, dict) or "error" in obj:
            return event
        if self.sent.id is not None:
            obj["id"], obj["created"] = self.sent.id, self.sent.created
        if isinstance(obj.get("usage"), dict) and not obj.get("choices"):
            obj["usage"] = self._usage(obj["usage"], self.hops[-1])
        for choice in obj.get("choices") or ():
            if isinstance(choice, dict) and not self._choice(choice):
                return None
        return b"data: " + json.dumps(obj, separators=(",", ":")).encode()

    def _usage(self, usage: dict, hop: Hop) -> dict:
        """The client's usage: the original prompt and every token it received."""
        hop.prompt_tokens = int(usage.get("prompt_tokens") or 0)
        hop.completion_tokens = int(usage.get("completion_tokens") or 0)
        hop.exact = True
        prompt = max(0, hop.prompt_tokens - self.before)
        done = self.before + hop.completion_tokens
        return {"prompt_tokens": prompt, "completion_tokens": done, "total_tokens": prompt + done}

    def _choice(self, choice: dict) -> bool:
        """Trim the choice in place; False: nothing of it is left to relay."""
        if self.chat:
            holder = choice.get("delta")
            if not isinstance(holder, dict):
                return True
            if self.sent.role_sent and holder.get("role"):
                del holder["role"]  # the client has its role delta already
            key = "content"
        else:
            holder, key = choice, "text"
        piece = holder.get(key)
        if isinstance(piece, str) and piece and self.held:
            n = 0
            while n < min(len(self.held), len(piece)) and piece[n] == self.held[n]:
                n += 1
            # Whitespace the client has is dropped once; text that differs ends the matching.
            self.held = self.held[n:] if n == len(piece) else ""
            holder[key] = piece = piece[n:]
        if piece or choice.get("finish_reason"):
            return True
        return self.chat and any(k != "content" for k in holder)


@dataclass
class Deaths:
    """Per process: replicas that died under streams, and those dying too often to be chosen."""

    clock: Callable[[], float] = time.monotonic
    _seen: dict[str, deque] = field(default_factory=dict)

    def died(self, replica: str) -> None:
        now = self.clock()
        times = self._seen.setdefault(replica, deque(maxlen=DEATHS))
        if times and now - times[-1] < SAME_DEATH_S:
            return  # the streams it cut report the same death
        times.append(now)
        if len(self._seen) > 4096:
            self._seen.pop(next(iter(self._seen)))
        if replica in self.excluded():
            log.warning("replica %s died under streams %d times in %.0fs; not chosen for continuations",
                        replica, DEATHS, DEATH_WINDOW_S)

    def excluded(self) -> frozenset[str]:
        now = self.clock()
        return frozenset(r for r, t in self._seen.items() if len(t) == DEATHS and now - t[0] < DEATH_WINDOW_S)


@dataclass
class EndpointQuota:
    """At most ``per_minute`` moves per endpoint and minute in this process."""

    per_minute: int
    clock: Callable[[], float] = time.monotonic
    _windows: dict[str, tuple[int, int]] = field(default_factory=dict)  # endpoint -> (minute, moves)

    def take(self, endpoint: str) -> bool:
        minute = int(self.clock() // 60)
        at, n = self._windows.get(endpoint, (minute, 0))
        n = n if at == minute else 0
        if n >= self.per_minute:
            return False
        if len(self._windows) > 4096:
            self._windows.clear()
        self._windows[endpoint] = (minute, n + 1)
        return True


Targets = Callable[[frozenset[str]], Awaitable[list[tuple[str, str]]]]  # excluded ids -> [(url, replica id)]


@dataclass
class Migration:
    """One call's means to move: built by the app for an eligible streamed call."""

    pool: UpstreamPool
    path: str
    method: str
    target: bytes
    headers: list
    body: bytes  # what was sent (the engine's view of the call)
    endpoint: str
    targets: Targets
    per_call: int
    quota: EndpointQuota
    deaths: Deaths
    notes: dict  # the call's explanation (gateway.replica_router), shared
    on_move: Callable[[str, str], None] | None = None  # (endpoint, outcome) for the metric

    def wrap(self, resp: UpstreamResponse, replica: str | None, before: list[Hop] | None = None,
             cut_at: float | None = None) -> MigratingResponse:
        return MigratingResponse(self, resp, replica or "", before or [], cut_at)

    async def open(self, url: str, replica: str | None) -> tuple[UpstreamResponse, str, list[Hop], float | None]:
        """Open the call at ``url``. A replica that fails before its response head (refused,
        reset, closed, silent past the idle timeout) has sent the client nothing: the call goes
        whole to another ready replica, under the same limits as a cut stream. Returns the opened
        response, its replica, the hops that failed first and when the first failed; raises the
        last UpstreamError when the call may not or cannot move."""
        failed: list[Hop] = []
        cut_at = None
        replica = replica or ""
        while True:
            try:
                return await _request(self, url, self.body), replica, failed, cut_at
            except UpstreamError as exc:
                cut_at = time.monotonic() if cut_at is None else cut_at
                reason = _cut(exc) + " before the response head"
                if replica:
                    self.deaths.died(replica)
                unreached = isinstance(exc, UpstreamConnectError)  # nothing was sent to it
                failed.append(Hop(replica, exact=unreached, reached=not unreached))
                why = (f"moved {self.per_call} times already" if len(failed) > self.per_call else
                       None if self.quota.take(self.endpoint) else
                       f"endpoint {self.endpoint!r} reached its moves per minute")
                nxt = [] if why else (await self.targets(frozenset(h.replica for h in failed if h.replica)
                                                         | self.deaths.excluded()))[:1]
                if not nxt:
                    self._note(replica, "not_moved", why or "no other ready replica", reason)
                    raise
                url, replica = nxt[0]
                self._note(failed[-1].replica, "moved", f"to {replica}", reason, after_tokens=0)

    def _note(self, replica: str, outcome: str, what: str, reason: str, **extra) -> None:
        self.notes.setdefault("migrations", []).append(
            {"from": replica or "unknown", "cut": reason, "outcome": outcome, "detail": what, **extra})
        if self.on_move is not None:
            self.on_move(self.endpoint, outcome)


def _cut(exc: UpstreamError) -> str:
    """How an upstream failed, for explain's ``cut`` (a connect error only before the head)."""
    if isinstance(exc, UpstreamConnectError):
        return "connect failed"
    return "idle timeout" if isinstance(exc, UpstreamTimeoutError) else "connection broke"


async def _request(mig: Migration, url: str, body: bytes) -> UpstreamResponse:
    from gateway.proxy import split_target

    scheme, host, port = split_target(url)
    return await mig.pool.request(scheme, host, port, mig.method, mig.target, mig.headers, body)


class MigratingResponse:
    """An upstream response for gateway.proxy.relay whose body goes on at another replica when
    its own is cut. Only complete events are handed out."""

    def __init__(self, mig: Migration, resp: UpstreamResponse, replica: str, before: list[Hop],
                 cut_at: float | None):
        """``before``: the replicas that failed before their response head (Migration.open);
        ``cut_at``: when the first of them failed."""
        self.mig = mig
        self.chat = mig.path == "/v1/chat/completions"
        self._resp = self._first = resp
        self.status, self.headers = resp.status, resp.headers
        # the target's replica id, which the continuation's exclusion and the deaths are matched
        # against; the engine's own x-fabric-replica only when the gateway named no target id
        named = resp.header(b"x-fabric-replica")
        self.hops = [*before, Hop(replica or (named.decode() if named else ""))]
        self._pending = b""
        self._kept = bytearray()
        # A call that moved before its head: the usage still needs the seam's accounting.
        self._seam = Seam(Sent(), Continuation(None, "", 0), self.chat, self.hops) if before else None
        self._queued = b""
        self._done = False
        self._end = False
        self._cut_at = cut_at
        self.seams: list[float] = []  # seconds from each cut to the continuation's first event

    def header(self, name: bytes) -> bytes | None:
        return self._first.header(name)  # the client's head is the first answer's

    @property
    def at_end(self) -> bool:
        return self._end

    def close(self) -> None:
        self._resp.close()

    async def next_chunk(self) -> bytes | None:
        while True:
            if self._queued:
                out, self._queued = self._queued, b""
                self._end = self._done
                return out
            if self._end:
                return None
            try:
                chunk = await self._resp.next_chunk()
            except UpstreamError as exc:
                if await self._move(_cut(exc)):
                    continue
                raise
            if chunk is None:
                if self._done:
                    self._end = True
                    return None
                if await self._move("ended before [DONE]"):
                    continue
                self._end = True
                return None
            ready = self._align(chunk)
            if not ready:
                continue
            if self._seam is not None:
                ready = self._seam.feed(ready)
                if self._cut_at is not None and ready:
                    self.seams.append(time.monotonic() - self._cut_at)
                    self._cut_at = None
            if DONE_EVENT in ready:
                self._done = True
            if len(self._kept) <= KEEP_MAX:
                self._kept += ready
            self._end = self._done and self._resp.at_end and not self._pending
            if ready:
                return ready

    def _align(self, chunk: bytes) -> bytes:
        ready, self._pending = complete_events(self._pending, chunk)
        return ready

    async def _move(self, reason: str) -> bool:
        """Go on at another replica; False when the call may not or cannot move."""
        mig, hop = self.mig, self.hops[-1]
        self._pending = b""
        if hop.replica:
            mig.deaths.died(hop.replica)
        why = self._why_not()
        if why is not None:
            self._note("not_moved", why, reason)
            return False
        sent = read_sent(bytes(self._kept), self.chat)
        if sent.finished:  # the answer was whole; only its end was lost
            self._queued, self._done = DONE_EVENT, True
            self._note("ended", "the answer was complete", reason)
            return True
        if sent.blocked:
            self._note("not_moved", sent.blocked, reason)
            return False
        data = loads(mig.body)
        cont = continuation(mig.path, data, sent)
        if cont.body is None:
            choice: dict = {"index": 0, "finish_reason": "length", **({"delta": {}} if self.chat else {"text": ""})}
            finish = {"id": sent.id, "object": "chat.completion.chunk" if self.chat else "text_completion",
                      "created": sent.created, "model": sent.model, "choices": [choice]}
            self._queued, self._done = b"data: " + json.dumps(finish).encode() + b"\n\n" + DONE_EVENT, True
            self._note("ended", "the token cap was reached", reason)
            return True
        if not mig.quota.take(mig.endpoint):
            self._note("not_moved", f"endpoint {mig.endpoint!r} reached its moves per minute", reason)
            return False
        self._resp.close()
        self._cut_at = time.monotonic()
        body = json.dumps(cont.body).encode()
        dead = frozenset(h.replica for h in self.hops if h.replica) | mig.deaths.excluded()
        for url, replica in (await mig.targets(dead))[:2]:
            opened = await self._open(url, body)
            if opened is None:
                mig.deaths.died(replica)
                continue
            if opened.status != 200 or not (opened.header(b"content-type") or b"").startswith(b"text/event-stream"):
                opened.close()
                self._note("not_moved", f"the continuation was answered {opened.status}", reason)
                return False
            self._resp = opened
            hop.completion_tokens = sent.tokens - sum(h.completion_tokens for h in self.hops[:-1])
            self._note("moved", f"to {replica}", reason, after_tokens=sent.tokens)
            self.hops.append(Hop(replica))
            self._seam = Seam(sent, cont, self.chat, self.hops)
            return True
        self._note("not_moved", "no other ready replica answered", reason)
        return False

    def _why_not(self) -> str | None:
        if len(self.hops) > self.mig.per_call:
            return f"moved {self.mig.per_call} times already"
        if len(self._kept) > KEEP_MAX:
            return "the answer is too long to carry over"
        return None

    async def _open(self, url: str, body: bytes) -> UpstreamResponse | None:
        try:
            return await _request(self.mig, url, body)
        except UpstreamError:
            return None

    def _note(self, outcome: str, what: str, reason: str, **extra) -> None:
        self.mig._note(self.hops[-1].replica, outcome, what, reason, **extra)

    def charged(self, client_tokens: int | None) -> int | None:
        """What the engines computed, once the call moved (None: it did not; the usage stands).
        A hop that died is charged its prompt (the last hop's less what it was handed) and the
        tokens it sent."""
        if len(self.hops) == 1:
            return client_tokens
        last = self.hops[-1]
        if not last.exact or last.prompt_tokens is None:
            return client_tokens
        before = sum(h.completion_tokens for h in self.hops[:-1])
        prompt = max(0, last.prompt_tokens - before)
        total, handed = 0, 0
        for h in self.hops[:-1]:
            h.prompt_tokens = prompt + handed if h.reached else 0
            total += h.prompt_tokens + h.completion_tokens
            handed += h.completion_tokens
        total += last.prompt_tokens + last.completion_tokens
        self.mig.notes["usage_computed"] = [
            {"replica": h.replica, "prompt_tokens": h.prompt_tokens, "completion_tokens": h.completion_tokens,
             "exact": h.exact} for h in self.hops]
        self.mig.notes["usage_received"] = {"prompt_tokens": prompt, "completion_tokens": before + last.completion_tokens}
        if self.seams:
            self.mig.notes["seam_s"] = [round(s, 4) for s in self.seams]
        return total
