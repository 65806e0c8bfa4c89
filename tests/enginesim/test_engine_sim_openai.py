"""The official openai client against a real fabric-engine-sim process."""

from __future__ import annotations

import httpx
import openai
import pytest

from enginesim.process import EngineProcess


@pytest.fixture(scope="module")
def client(fast_engine: EngineProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=fast_engine.url + "/v1", api_key="unused", max_retries=0, timeout=10)


def test_models_lists_the_served_model(client):
    ids = [m.id for m in client.models.list()]
    assert ids == ["sim-m"]


def test_chat_non_stream_has_usage_and_length_finish(client):
    resp = client.chat.completions.create(
        model="sim-m", messages=[{"role": "user", "content": "Say hello to the cluster"}], max_tokens=5
    )
    assert resp.choices[0].finish_reason == "length"
    assert resp.choices[0].message.role == "assistant"
    assert len(resp.choices[0].message.content.split()) == 5
    assert resp.usage.completion_tokens == 5
    assert resp.usage.prompt_tokens > 0
    assert resp.usage.total_tokens == resp.usage.prompt_tokens + 5


def test_chat_stream_with_include_usage(client):
    stream = client.chat.completions.create(
        model="sim-m", messages=[{"role": "user", "content": "stream please"}], max_tokens=4,
        stream=True, stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(text.split()) == 4
    assert finishes == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 4
    # Same prompt, same words: the non-stream answer matches the streamed one.
    full = client.chat.completions.create(
        model="sim-m", messages=[{"role": "user", "content": "stream please"}], max_tokens=4
    )
    assert full.choices[0].message.content == text


def test_chat_stream_without_include_usage_sends_no_usage(client):
    chunks = list(client.chat.completions.create(
        model="sim-m", messages=[{"role": "user", "content": "x"}], max_tokens=2, stream=True
    ))
    assert chunks and all(c.usage is None for c in chunks)


def test_chat_without_max_tokens_stops_naturally(client):
    resp = client.chat.completions.create(model="sim-m", messages=[{"role": "user", "content": "hi"}])
    assert resp.choices[0].finish_reason == "stop"
    assert resp.usage.completion_tokens == 16


def test_completions_stream_and_not(client):
    resp = client.completions.create(model="sim-m", prompt="Once upon a time", max_tokens=3)
    assert resp.usage.completion_tokens == 3 and resp.choices[0].finish_reason == "length"
    chunks = list(client.completions.create(
        model="sim-m", prompt="Once upon a time", max_tokens=3, stream=True,
        stream_options={"include_usage": True},
    ))
    streamed = "".join(c.choices[0].text for c in chunks if c.choices)
    assert streamed == resp.choices[0].text
    assert chunks[-1].usage.total_tokens == resp.usage.total_tokens


def test_embeddings_deterministic_for_lists_and_formats(client):
    one = client.embeddings.create(model="sim-m", input=["alpha", "beta"])
    assert [d.index for d in one.data] == [0, 1]
    assert len(one.data[0].embedding) == 32
    assert one.data[0].embedding != one.data[1].embedding
    again = client.embeddings.create(model="sim-m", input="alpha", encoding_format="float")
    assert again.data[0].embedding == pytest.approx(one.data[0].embedding, abs=1e-6)
    assert one.usage.prompt_tokens >= 2


def test_rerank_orders_by_relevance(fast_engine):
    body = {"model": "sim-m", "query": "gpu virtual machine",
            "documents": ["a banana split", "a gpu virtual machine host", "the gpu"]}
    resp = httpx.post(fast_engine.url + "/v1/rerank", json=body)
    assert resp.status_code == 200
    results = resp.json()["results"]
    assert results[0]["index"] == 1
    scores = [r["relevance_score"] for r in results]
    assert scores == sorted(scores, reverse=True)
    top = httpx.post(fast_engine.url + "/v1/rerank", json={**body, "top_n": 1}).json()["results"]
    assert len(top) == 1 and top[0]["document"]["text"] == "a gpu virtual machine host"


def test_bad_input_is_openai_400_naming_the_field(client, fast_engine):
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="sim-m", messages=[], max_tokens=2)
    assert "messages" in err.value.message
    raw = httpx.post(fast_engine.url + "/v1/chat/completions", json={"model": "sim-m"})
    assert raw.status_code == 400
    error = raw.json()["error"]
    assert {"message", "type", "code"} <= error.keys() and "messages" in error["message"]
    garbage = httpx.post(fast_engine.url + "/v1/completions", content=b"{not json")
    assert garbage.status_code == 400 and "JSON" in garbage.json()["error"]["message"]


def test_context_overflow_and_unknown_model(client):
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model="sim-m", prompt="x" * 4000, max_tokens=10)
    assert "maximum context length is 512" in err.value.message
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])


def test_every_response_names_the_replica(fast_engine):
    assert httpx.get(fast_engine.url + "/v1/models").headers["x-fabric-replica"] == "replica-a"
    assert httpx.get(fast_engine.url + "/health").headers["x-fabric-replica"] == "replica-a"
    bad = httpx.post(fast_engine.url + "/v1/chat/completions", json={})
    assert bad.headers["x-fabric-replica"] == "replica-a"


def test_realtime_websocket_echoes_text_and_bytes(fast_engine):
    from websockets.sync.client import connect

    with connect(fast_engine.url.replace("http://", "ws://") + "/v1/realtime?model=sim-m") as ws:
        ws.send("hello")
        assert ws.recv(timeout=5) == "hello"
        ws.send(b"\x00\xff")
        assert ws.recv(timeout=5) == b"\x00\xff"


def test_a_continued_assistant_message_goes_on_where_its_output_stopped(fast_engine: EngineProcess):
    """Greedy decoding's promise, as vLLM keeps it with continue_final_message: an assistant
    message holding the start of the answer continues that answer; a completions prompt
    extended by its output continues it too (gateway.stream_migration relies on both)."""
    url = fast_engine.url
    ask = {"model": "sim-m", "messages": [{"role": "user", "content": "continue me"}], "max_tokens": 9}
    whole = httpx.post(url + "/v1/chat/completions", json=ask).json()["choices"][0]["message"]["content"]
    head = " ".join(whole.split()[:4])
    rest = httpx.post(url + "/v1/chat/completions", json={
        **ask, "max_tokens": 5, "continue_final_message": True, "add_generation_prompt": False,
        "messages": [*ask["messages"], {"role": "assistant", "content": head}]}).json()
    assert head + rest["choices"][0]["message"]["content"] == whole
    assert rest["usage"]["completion_tokens"] == 5
    # vLLM 0.32 refuses the pair (ChatCompletionRequest.check_generation_prompt)
    both = httpx.post(url + "/v1/chat/completions", json={**ask, "continue_final_message": True,
                                                          "add_generation_prompt": True})
    assert both.status_code == 400 and "Cannot set both" in both.json()["error"]["message"]
    prompt = {"model": "sim-m", "prompt": "Once upon", "max_tokens": 7}
    text = httpx.post(url + "/v1/completions", json=prompt).json()["choices"][0]["text"]
    cut = text[:text.index(" ", 3)]
    more = httpx.post(url + "/v1/completions", json={**prompt, "prompt": "Once upon" + cut,
                                                     "max_tokens": 7 - len(cut.split())}).json()
    assert cut + more["choices"][0]["text"] == text
