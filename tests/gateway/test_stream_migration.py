"""Stream migration (gateway.stream_migration): the pure continuation and seam, then a stream
through gateway.proxy.forward whose engine simulator is SIGKILLed mid-answer and goes on at a
second simulator, ending with [DONE] and exactly the undisturbed text."""

from __future__ import annotations

import asyncio
import json
import signal

import httpx
import pytest

from common.http1_client import UpstreamPool
from enginesim.process import EngineProcess
from gateway.proxy import forward
from gateway.stream_migration import (
    Continuation,
    Deaths,
    EndpointQuota,
    Hop,
    Migration,
    Seam,
    Sent,
    continuation,
    read_sent,
    refusal,
)


def sse(*objs) -> bytes:
    return b"".join(b"data: " + json.dumps(o).encode() + b"\n\n" for o in objs)


def chat_chunk(content=None, role=None, finish=None, cid="chatcmpl-1", created=100):
    delta = {**({"role": role} if role else {}), **({"content": content} if content is not None else {})}
    return {"id": cid, "object": "chat.completion.chunk", "created": created, "model": "m",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 10, "stream": True}


def test_read_sent_rebuilds_the_text_the_client_has():
    sent = read_sent(sse(chat_chunk("", role="assistant"), chat_chunk("Hello"), chat_chunk(" world ")), chat=True)
    assert (sent.id, sent.created, sent.text, sent.tokens, sent.role_sent) == ("chatcmpl-1", 100, "Hello world ", 2, True)
    assert not sent.finished and not sent.blocked
    tool = {**chat_chunk(), "choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0}]}}]}
    assert read_sent(sse(tool), chat=True).blocked == "a tool call was under way"
    done = read_sent(sse(chat_chunk("a", finish="stop")) + b"data: [DONE]\n\n", chat=True)
    assert done.finished and done.text == "a"
    text = read_sent(sse({"id": "cmpl-1", "created": 5, "choices": [{"index": 0, "text": "ab"}]}), chat=False)
    assert (text.text, text.tokens) == ("ab", 1)


def test_a_chat_continues_its_assistant_message_with_the_cap_shrunk_and_trailing_space_held():
    cont = continuation("/v1/chat/completions", CHAT, Sent(text="Hello world ", tokens=3))
    assert cont.body is not None and cont.held == " " and cont.generated == 3
    assert cont.body["messages"][-1] == {"role": "assistant", "content": "Hello world"}
    assert cont.body["continue_final_message"] is True and cont.body["add_generation_prompt"] is False
    assert cont.body["max_tokens"] == 7 and CHAT["max_tokens"] == 10  # the original is untouched
    # vLLM reads max_completion_tokens before max_tokens: that one shrinks, max_tokens never exceeds it
    both = continuation("/v1/chat/completions", {**CHAT, "max_completion_tokens": 5, "max_tokens": 50},
                        Sent(text="x", tokens=2))
    assert both.body is not None and both.body["max_completion_tokens"] == 3 and both.body["max_tokens"] == 3
    # a call that continued its own assistant message gets the text appended to that message
    own = {**CHAT, "continue_final_message": True, "add_generation_prompt": False,
           "messages": [*CHAT["messages"], {"role": "assistant", "content": "Sure:"}]}
    appended = continuation("/v1/chat/completions", own, Sent(text=" yes", tokens=1))
    assert appended.body is not None and appended.body["messages"][-1]["content"] == "Sure: yes"
    assert len(appended.body["messages"]) == 2
    assert continuation("/v1/chat/completions", CHAT, Sent(text="t", tokens=10)).body is None  # cap reached
    nothing = continuation("/v1/chat/completions", CHAT, Sent())
    assert nothing.body is not None and nothing.body["messages"] == CHAT["messages"]  # a plain retry


def test_a_completion_continues_its_prompt():
    cont = continuation("/v1/completions", {"prompt": ["Once"], "max_tokens": 4}, Sent(text=" upon", tokens=1))
    assert cont.body == {"prompt": "Once upon", "max_tokens": 3}


@pytest.mark.parametrize("path,data,why", [
    ("/v1/embeddings", {"input": "x"}, "not a chat or text completion"),
    ("/v1/chat/completions", {**CHAT, "n": 2}, "several choices"),
    ("/v1/chat/completions", {**CHAT, "logprobs": True}, "logprobs or echo asked"),
    ("/v1/chat/completions", {**CHAT, "response_format": {"type": "json_object"}}, "structured output"),
    ("/v1/completions", {"prompt": [1, 2, 3]}, "a prompt of token ids or several prompts"),
    ("/v1/completions", {"prompt": ["a", "b"]}, "a prompt of token ids or several prompts"),
])
def test_calls_that_never_move(path, data, why):
    assert refusal(path, data) == why
    assert refusal("/v1/chat/completions", CHAT) is None


def test_the_seam_keeps_one_stream_id_one_role_no_repeated_space_and_the_whole_usage():
    sent = Sent(id="chatcmpl-1", created=100, text="Hello ", tokens=2, role_sent=True)
    hops = [Hop("a", completion_tokens=2), Hop("b")]
    seam = Seam(sent, Continuation({}, " ", 2), True, hops)
    out = seam.feed(sse(chat_chunk("", role="assistant", cid="chatcmpl-2", created=200),
                        chat_chunk(" world", cid="chatcmpl-2", created=200),
                        chat_chunk("!", finish="stop", cid="chatcmpl-2", created=200),
                        {"id": "chatcmpl-2", "created": 200, "choices": [],
                         "usage": {"prompt_tokens": 12, "completion_tokens": 2, "total_tokens": 14}})
                    + b"data: [DONE]\n\n")
    events = [e for e in out.split(b"\n\n") if e]
    assert events[-1] == b"data: [DONE]"
    objs = [json.loads(e[6:]) for e in events[:-1]]
    assert {(o["id"], o["created"]) for o in objs} == {("chatcmpl-1", 100)}
    assert [o["choices"][0]["delta"] for o in objs[:-1]] == [{"content": "world"}, {"content": "!"}]
    assert objs[-1]["usage"] == {"prompt_tokens": 10, "completion_tokens": 4, "total_tokens": 14}
    assert hops[1].exact and (hops[1].prompt_tokens, hops[1].completion_tokens) == (12, 2)


def test_a_replica_that_keeps_dying_is_left_out_for_a_while():
    now = [0.0]
    deaths = Deaths(clock=lambda: now[0])
    deaths.died("r1")
    deaths.died("r1")  # another stream the same death cut
    assert deaths.excluded() == frozenset()
    now[0] = 6
    deaths.died("r1")
    assert deaths.excluded() == {"r1"}
    now[0] = 500
    assert deaths.excluded() == frozenset()
    quota = EndpointQuota(2, clock=lambda: now[0])
    assert quota.take("ep") and quota.take("ep") and not quota.take("ep") and quota.take("other")
    now[0] = 560
    assert quota.take("ep")


# --- a real cut: two engine simulators, one SIGKILLed mid-stream ---------------------------------

SIM = ["--tokens-per-s", "40", "--natural-length", "0", "--replica-id"]


@pytest.fixture
def sims():
    a = EngineProcess.start([*SIM, "sim-a"])
    b = EngineProcess.start([*SIM, "sim-b"])
    try:
        yield a, b
    finally:
        a.stop()
        b.stop()


def test_a_cut_stream_is_named_by_the_gateways_replica_id_and_never_continues_there(sims):
    """The engines call themselves sim-a and sim-b (their x-fabric-replica), the gateway's
    targets rep-a and rep-b. The dead hop is named rep-a, so the continuation's exclusion holds
    it and the stream goes straight to rep-b (an engine's own name used to leave rep-a in the
    list, and the continuation tried the dead engine first)."""
    a, b = sims
    request = {"model": "sim-model", "messages": [{"role": "user", "content": "tell me more"}], "max_tokens": 30,
               "stream": True, "stream_options": {"include_usage": True}}
    body = json.dumps(request).encode()
    got: list[bytes] = []
    notes: dict = {}
    asked: list[frozenset] = []

    async def main():
        pool = UpstreamPool(idle_timeout=10)

        async def targets(excluded):
            asked.append(excluded)
            return [(u, n) for u, n in ((a.url, "rep-a"), (b.url, "rep-b")) if n not in excluded]

        async def send(message):
            if message["type"] == "http.response.body":
                got.append(message.get("body", b""))
                if sum(x.count(b'"content":"') for x in got) >= 8 and a.proc.poll() is None:
                    a.proc.send_signal(signal.SIGKILL)

        mig = Migration(pool, "/v1/chat/completions", "POST", b"/v1/chat/completions",
                        [(b"content-type", b"application/json")], body, "ep", targets, 2, EndpointQuota(100),
                        Deaths(), notes)
        result = await forward(pool, send, [a.url], "POST", b"/v1/chat/completions",
                               [(b"content-type", b"application/json")], body, True, migration=mig,
                               names={a.url: "rep-a", b.url: "rep-b"})
        pool.close()
        return result

    result = asyncio.run(main())
    assert result.ok and result.migrated == 1
    assert asked and all("rep-a" in ex for ex in asked)
    assert [(m["from"], m["outcome"], m["detail"]) for m in notes["migrations"]] == [("rep-a", "moved", "to rep-b")]
    assert [h["replica"] for h in notes["usage_computed"]] == ["rep-a", "rep-b"]


def _text(events: list[dict], chat: bool) -> str:
    key = "content"
    if chat:
        return "".join(c["delta"].get(key) or "" for e in events for c in e["choices"])
    return "".join(c.get("text") or "" for e in events for c in e["choices"])


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_a_stream_whose_engine_is_killed_goes_on_at_the_other_with_the_same_text(sims, path):
    a, b = sims
    chat = path.endswith("chat/completions")
    request = ({"model": "sim-model", "messages": [{"role": "user", "content": f"tell me {path}"}]} if chat
               else {"model": "sim-model", "prompt": f"tell me {path}"})
    request.update(max_tokens=30, stream=True, stream_options={"include_usage": True})
    # The undisturbed answer, from the replica that will finish the moved stream.
    with httpx.stream("POST", b.url + path, json=request, timeout=30) as r:
        whole = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    expected = _text(whole, chat)
    assert expected and whole[-1]["usage"]["completion_tokens"] == 30

    body = json.dumps(request).encode()
    got: list[bytes] = []
    notes: dict = {}

    async def main():
        pool = UpstreamPool(idle_timeout=10)

        async def targets(excluded):
            return [(u, n) for u, n in ((a.url, "sim-a"), (b.url, "sim-b")) if n not in excluded]

        async def send(message):
            if message["type"] == "http.response.body":
                got.append(message.get("body", b""))
                if sum(x.count(b'"content":"') + x.count(b'"text":"') for x in got) >= 8 and a.proc.poll() is None:
                    a.proc.send_signal(signal.SIGKILL)  # the engine dies mid-answer

        mig = Migration(pool, path, "POST", path.encode(), [(b"content-type", b"application/json")], body, "ep",
                        targets, 2, EndpointQuota(100), Deaths(), notes)
        result = await forward(pool, send, [a.url], "POST", path.encode(),
                               [(b"content-type", b"application/json")], body, True, migration=mig)
        pool.close()
        return result

    result = asyncio.run(main())
    assert a.proc.wait(10) == -signal.SIGKILL
    stream = b"".join(got)
    events = [e for e in stream.split(b"\n\n") if e]
    assert events[-1] == b"data: [DONE]" and b'"error"' not in stream
    objs = [json.loads(e[6:]) for e in events[:-1]]
    assert _text(objs, chat) == expected  # nothing missing, nothing twice
    assert len({o["id"] for o in objs}) == 1 and len({o["created"] for o in objs}) == 1
    if chat:
        assert sum(1 for o in objs for c in o["choices"] if c["delta"].get("role")) == 1
    usage = [o["usage"] for o in objs if o.get("usage")]
    assert len(usage) == 1 and usage[0]["completion_tokens"] == 30
    assert result.ok and result.migrated == 1
    assert notes["migrations"][0]["outcome"] == "moved" and notes["migrations"][0]["from"] == "sim-a"
    computed = notes["usage_computed"]
    assert [h["replica"] for h in computed] == ["sim-a", "sim-b"]
    assert sum(h["completion_tokens"] for h in computed) == 30
    # charged: what both engines computed, more than what the client received
    assert result.tokens == sum(h["prompt_tokens"] + h["completion_tokens"] for h in computed)
    assert result.tokens > usage[0]["total_tokens"]


# --- a replica that dies before its response head -----------------------------------------------

DIES_ON_REQUEST = r"""
import os, signal, socket, sys
s = socket.socket()
s.bind(("127.0.0.1", 0))
s.listen(8)
print(s.getsockname()[1], flush=True)
conn, _ = s.accept()
data = b""
while b"\r\n\r\n" not in data:
    data += conn.recv(65536)
os.kill(os.getpid(), signal.SIGKILL)  # the request is in; the engine dies before any answer
"""


@pytest.fixture
def dies_on_request():
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", DIES_ON_REQUEST], stdout=subprocess.PIPE, text=True)
    try:
        yield proc, f"http://127.0.0.1:{int(proc.stdout.readline())}"
    finally:
        proc.kill()
        proc.wait(10)


def _free_port_url() -> str:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"  # closed again: nothing listens there


def _through(first: str, others: list[tuple[str, str]], request: dict, per_call: int = 2,
             notes: dict | None = None):
    """forward() of a streamed call whose first target is ``first`` ("dead" by name)."""
    path = "/v1/chat/completions"
    body = json.dumps(request).encode()
    got: list[bytes] = []
    notes = {} if notes is None else notes

    async def main():
        pool = UpstreamPool(idle_timeout=10)

        async def targets(excluded):
            return [(u, n) for u, n in others if n not in excluded]

        async def send(message):
            if message["type"] == "http.response.body":
                got.append(message.get("body", b""))

        mig = Migration(pool, path, "POST", path.encode(), [(b"content-type", b"application/json")], body, "ep",
                        targets, per_call, EndpointQuota(100), Deaths(), notes)
        try:
            return await forward(pool, send, [first], "POST", path.encode(),
                                 [(b"content-type", b"application/json")], body, True,
                                 names={first: "dead"}, migration=mig)
        finally:
            pool.close()

    return asyncio.run(main()), b"".join(got), notes


HEADLESS = {"model": "sim-model", "messages": [{"role": "user", "content": "tell me before the head"}],
        "max_tokens": 12, "stream": True, "stream_options": {"include_usage": True}}


@pytest.mark.parametrize("how", ["killed after the request", "refused"])
def test_a_replica_failing_before_its_response_head_hands_the_whole_call_to_another(sims, dies_on_request, how):
    _, b = sims
    with httpx.stream("POST", b.url + "/v1/chat/completions", json=HEADLESS, timeout=30) as r:
        expected = _text([json.loads(x[6:]) for x in r.iter_lines() if x.startswith("data: {")], True)
    proc, dying = dies_on_request
    first = dying if how == "killed after the request" else _free_port_url()
    result, stream, notes = _through(first, [(b.url, "sim-b")], HEADLESS)
    if how == "killed after the request":
        assert proc.wait(10) == -signal.SIGKILL
    events = [e for e in stream.split(b"\n\n") if e]
    assert events[-1] == b"data: [DONE]" and b'"error"' not in stream
    objs = [json.loads(e[6:]) for e in events[:-1]]
    assert _text(objs, True) == expected
    assert sum(1 for o in objs for c in o["choices"] if c["delta"].get("role")) == 1
    usage = [o["usage"] for o in objs if o.get("usage")]
    assert len(usage) == 1 and usage[0]["completion_tokens"] == 12
    assert result.ok and result.migrated == 1
    move = notes["migrations"][0]
    assert move["outcome"] == "moved" and move["from"] == "dead" and move["detail"] == "to sim-b"
    assert "before the response head" in move["cut"]
    computed = notes["usage_computed"]
    assert [h["replica"] for h in computed] == ["dead", "sim-b"]
    dead_prompt = computed[0]["prompt_tokens"]
    # A replica that got the request may have computed its prompt: charged it. One that was never
    # reached computed nothing.
    assert dead_prompt == (usage[0]["prompt_tokens"] if how == "killed after the request" else 0)
    assert result.tokens == dead_prompt + usage[0]["total_tokens"]


def test_a_call_with_no_other_replica_fails_before_its_head_as_a_502(dies_on_request):
    from gateway.proxy import UpstreamFailed

    _, dying = dies_on_request
    notes: dict = {}
    with pytest.raises(UpstreamFailed):
        _through(dying, [], HEADLESS, notes=notes)
    assert [(m["from"], m["outcome"], m["detail"]) for m in notes["migrations"]] == [
        ("dead", "not_moved", "no other ready replica")]


def test_a_call_moves_before_its_head_only_within_its_limit(sims, dies_on_request):
    """per_call 1: the first dead replica moves the call; the second failure ends it."""
    from gateway.proxy import UpstreamFailed

    _, dying = dies_on_request
    never = _free_port_url()
    notes: dict = {}
    with pytest.raises(UpstreamFailed):
        _through(dying, [(never, "gone")], HEADLESS, per_call=1, notes=notes)
    assert [(m["from"], m["outcome"], m["detail"]) for m in notes["migrations"]] == [
        ("dead", "moved", "to gone"), ("gone", "not_moved", "moved 1 times already")]
    assert notes["migrations"][1]["cut"] == "connect failed before the response head"
