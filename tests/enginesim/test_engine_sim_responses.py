"""POST /v1/responses on a real fabric-engine-sim process, through the official openai client:
plain and streamed answers agree, usage is input/output tokens, the stream's typed events run
from response.created to its final event with one delta per token and no [DONE]."""

from __future__ import annotations

import httpx
import openai
import pytest

from enginesim.process import EngineProcess


@pytest.fixture(scope="module")
def client(fast_engine: EngineProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=fast_engine.url + "/v1", api_key="unused", max_retries=0, timeout=10)


def test_a_plain_and_a_streamed_response_agree(client):
    msgs = [{"role": "user", "content": [{"type": "input_text", "text": "tell me"}]}]
    plain = client.responses.create(model="sim-m", input=msgs, instructions="be brief", max_output_tokens=5)
    assert plain.status == "incomplete" and plain.incomplete_details.reason == "max_output_tokens"
    assert len(plain.output_text.split()) == 5 and plain.usage.output_tokens == 5
    assert plain.usage.total_tokens == plain.usage.input_tokens + 5
    events = list(client.responses.create(model="sim-m", input=msgs, instructions="be brief", max_output_tokens=5,
                                          stream=True))
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"] and kinds[-1] == "response.incomplete"
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == plain.output_text
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[-1].response.usage.output_tokens == 5


def test_the_stream_has_no_done_and_bad_input_is_400(fast_engine):
    raw = httpx.post(fast_engine.url + "/v1/responses", json={"model": "sim-m", "input": "hi", "stream": True}).text
    assert "[DONE]" not in raw and raw.rstrip().endswith("}")
    bad = httpx.post(fast_engine.url + "/v1/responses", json={"model": "sim-m"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "input"
    missing = httpx.post(fast_engine.url + "/v1/responses", json={"model": "nope", "input": "hi"})
    assert missing.status_code == 404
