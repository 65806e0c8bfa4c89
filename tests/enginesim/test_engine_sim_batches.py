"""Files + Batches on the engine sim: the pure pieces, then the official openai client against a
real fabric-engine-sim process (uploads, every batchable endpoint, validation, per-line errors,
the engine's queue and metrics during a batch, cancellation, listing)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import openai
import pytest
from starlette.testclient import TestClient

from enginesim import EngineSettings, create_app
from enginesim import batch_routes as br
from enginesim.multipart import parse_multipart
from enginesim.process import EngineProcess
from lab.rigs.polling import wait_for

DONE = ("completed", "failed", "cancelled")


def jsonl(rows: list[dict]) -> bytes:
    return b"".join(json.dumps(r).encode() + b"\n" for r in rows)


def chat_line(cid: str, content: str = "hello", max_tokens: int = 3, model: str = "sim-m") -> dict:
    return {"custom_id": cid, "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens}}


def wait_batch(client: openai.OpenAI, batch_id: str, until=DONE, timeout: float = 15.0):
    def reached():
        batch = client.batches.retrieve(batch_id)
        return batch if batch.status in until else None

    return wait_for(reached, timeout, f"batch {batch_id} to be {' or '.join(sorted(until))}", interval=0.02)


def rows_of(client: openai.OpenAI, file_id: str) -> list[dict]:
    return [json.loads(line) for line in client.files.content(file_id).text.splitlines() if line]


def metric(engine: EngineProcess, name: str) -> float:
    total = 0.0
    for line in httpx.get(engine.url + "/metrics", timeout=5).text.splitlines():
        if line.startswith((name + "{", name + " ")):
            total += float(line.rsplit(" ", 1)[1])
    return total


# ---- pure pieces -------------------------------------------------------------------------------

def test_parse_jsonl_skips_blank_lines_and_names_the_bad_line():
    assert br.parse_jsonl(b'{"a":1}\n\n{"b":2}\n') == [{"a": 1}, {"b": 2}]
    with pytest.raises(br.BadJsonl, match="line 3 is not valid JSON"):
        br.parse_jsonl(b'{"a":1}\n{"b":2}\n{"c":\n')
    with pytest.raises(br.BadJsonl, match="line 2 is not a JSON object"):
        br.parse_jsonl(b'{"a":1}\n[1,2]\n')
    with pytest.raises(br.BadJsonl, match="line 2 is not valid UTF-8"):
        br.parse_jsonl(b'{"a":1}\n"\xff"\n')


def test_parse_multipart_reads_what_httpx_sends():
    payload = b'{"x": "a\\r\\n--not-a-boundary"}\r\n{"y": 2}\n'
    req = httpx.Request("POST", "http://e/v1/files", data={"purpose": "batch"},
                        files={"file": ("in.jsonl", payload, "application/jsonl")})
    fields = parse_multipart(req.read(), req.headers["content-type"])
    assert fields["purpose"] == (None, b"batch")
    assert fields["file"] == ("in.jsonl", payload)
    with pytest.raises(ValueError, match="truncated"):
        parse_multipart(req.content[:-10], req.headers["content-type"])
    with pytest.raises(ValueError, match="multipart/form-data"):
        parse_multipart(b"{}", "application/json")


def test_validate_lines_reports_each_problem_with_its_line():
    good = chat_line("a")
    errors = br.validate_lines(
        [good, chat_line("a"), {**chat_line("c"), "url": "/v1/embeddings"}, {**chat_line("d"), "method": "GET"},
         {"custom_id": "e", "method": "POST", "url": "/v1/chat/completions", "body": [1]},
         {**chat_line("f"), "body": {**good["body"], "stream": True}}, {**chat_line("g"), "custom_id": 7}],
        "/v1/chat/completions",
    )
    assert [(e["line"], e["param"]) for e in errors] == [
        (2, "custom_id"), (3, "url"), (4, "method"), (5, "body"), (6, "body.stream"), (7, "custom_id")]
    assert br.validate_lines([good], "/v1/chat/completions") == []
    assert br.validate_lines([], "/v1/chat/completions")[0]["message"] == "the input file has no requests"


def test_upload_caps_per_file_and_in_total(monkeypatch):
    monkeypatch.setattr(br, "MAX_FILE_BYTES", 100)
    monkeypatch.setattr(br, "_MULTIPART_SLACK", 1000)
    monkeypatch.setattr(br, "MAX_STORED_BYTES", 150)
    line = json.dumps({"pad": "x" * 60}).encode() + b"\n"  # 73 bytes
    with TestClient(create_app(EngineSettings(model="m", replica_id="r"))) as http:
        def up(data: bytes):
            return http.post("/v1/files", data={"purpose": "batch"}, files={"file": ("f.jsonl", data)})

        big = up(line * 2)
        assert big.status_code == 413 and big.json()["error"]["code"] == "file_too_large"
        first = up(line)
        assert first.status_code == 200 and first.json()["bytes"] == len(line)
        up(line).raise_for_status()
        full = up(line)
        assert full.status_code == 413 and full.json()["error"]["code"] == "storage_full"
        assert http.delete(f"/v1/files/{first.json()['id']}").json()["deleted"] is True
        assert up(line).status_code == 200
        huge = http.post("/v1/files", content=b"x" * 2000,
                         headers={"content-type": "multipart/form-data; boundary=b"})
        assert huge.status_code == 413


# ---- the openai client against a real engine -----------------------------------------------------

@pytest.fixture(scope="module")
def client(fast_engine: EngineProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=fast_engine.url + "/v1", api_key="unused", max_retries=0, timeout=10)


def run_batch(client: openai.OpenAI, rows: list[dict], endpoint: str = "/v1/chat/completions"):
    f = client.files.create(file=("in.jsonl", jsonl(rows)), purpose="batch")
    batch = client.batches.create(input_file_id=f.id, endpoint=endpoint, completion_window="24h",
                                  metadata={"job": "test"})
    assert batch.status == "validating" and batch.input_file_id == f.id and batch.metadata == {"job": "test"}
    return wait_batch(client, batch.id)


def test_chat_batch_completes_with_one_result_per_line_and_counts_in_engine_metrics(client, fast_engine):
    before = metric(fast_engine, "vllm:request_success_total")
    rows = [chat_line(f"req-{i}", content=f"question {i}", max_tokens=2 + i % 3) for i in range(12)]
    batch = run_batch(client, rows)
    assert batch.status == "completed" and batch.error_file_id is None and batch.errors is None
    assert (batch.request_counts.total, batch.request_counts.completed, batch.request_counts.failed) == (12, 12, 0)
    assert batch.created_at <= batch.in_progress_at <= batch.finalizing_at <= batch.completed_at
    out = rows_of(client, batch.output_file_id)
    assert sorted(r["custom_id"] for r in out) == sorted(r["custom_id"] for r in rows)
    for r in out:
        assert r["error"] is None and r["id"].startswith("batch_req_")
        assert r["response"]["status_code"] == 200 and r["response"]["request_id"]
        i = int(r["custom_id"].split("-")[1])
        body = r["response"]["body"]
        assert body["object"] == "chat.completion" and body["usage"]["completion_tokens"] == 2 + i % 3
    # Same prompt as an online request, same words: the line really went through the chat handler.
    online = client.chat.completions.create(model="sim-m", messages=[{"role": "user", "content": "question 0"}],
                                            max_tokens=2)
    first = next(r for r in out if r["custom_id"] == "req-0")
    assert first["response"]["body"]["choices"][0]["message"]["content"] == online.choices[0].message.content
    assert metric(fast_engine, "vllm:request_success_total") == before + 13
    out_file = client.files.retrieve(batch.output_file_id)
    assert out_file.purpose == "batch_output" and out_file.filename == f"{batch.id}_output.jsonl"
    assert out_file.bytes == len(client.files.content(batch.output_file_id).content)


def test_completions_and_embeddings_batches(client):
    comp = run_batch(client, [{"custom_id": f"c{i}", "method": "POST", "url": "/v1/completions",
                               "body": {"model": "sim-m", "prompt": f"once upon {i}", "max_tokens": 4}}
                              for i in range(3)], "/v1/completions")
    assert comp.status == "completed" and comp.request_counts.completed == 3
    assert {r["response"]["body"]["object"] for r in rows_of(client, comp.output_file_id)} == {"text_completion"}
    emb = run_batch(client, [{"custom_id": f"e{i}", "method": "POST", "url": "/v1/embeddings",
                              "body": {"model": "sim-m", "input": ["a", f"b{i}"]}} for i in range(3)],
                    "/v1/embeddings")
    assert emb.status == "completed" and emb.request_counts.completed == 3
    for r in rows_of(client, emb.output_file_id):
        assert len(r["response"]["body"]["data"]) == 2 and len(r["response"]["body"]["data"][0]["embedding"]) == 32


def test_failing_lines_go_to_the_error_file_and_the_batch_still_completes(client):
    rows = [chat_line("ok-1"), chat_line("wrong-model", model="nope"), chat_line("too-long", max_tokens=10_000),
            chat_line("ok-2")]
    batch = run_batch(client, rows)
    assert batch.status == "completed"
    assert (batch.request_counts.total, batch.request_counts.completed, batch.request_counts.failed) == (4, 2, 2)
    assert sorted(r["custom_id"] for r in rows_of(client, batch.output_file_id)) == ["ok-1", "ok-2"]
    errs = {r["custom_id"]: r["response"] for r in rows_of(client, batch.error_file_id)}
    assert errs["wrong-model"]["status_code"] == 404
    assert errs["wrong-model"]["body"]["error"]["code"] == "model_not_found"
    assert errs["too-long"]["status_code"] == 400


def test_invalid_lines_fail_the_batch_with_errors_naming_the_lines(client):
    rows = [chat_line("a"), chat_line("a"), {**chat_line("c"), "url": "/v1/completions"}]
    batch = run_batch(client, rows)
    assert batch.status == "failed" and batch.failed_at and batch.output_file_id is None
    assert [(e.line, e.param) for e in batch.errors.data] == [(2, "custom_id"), (3, "url")]
    assert batch.request_counts.total == 0


def test_bad_uploads_and_bad_batch_requests_are_refused_clearly(client):
    with pytest.raises(openai.BadRequestError) as bad:
        client.files.create(file=("x.jsonl", b'{"ok": 1}\n{"ok": 2}\n{not json}\n'), purpose="batch")
    err = bad.value.body
    assert "line 3 is not valid JSON" in err["message"] and "x.jsonl" in err["message"] and err["param"] == "file"
    with pytest.raises(openai.BadRequestError, match="purpose"):
        client.files.create(file=("x.jsonl", b"{}\n"), purpose="fine-tune")
    with pytest.raises(openai.NotFoundError):
        client.batches.create(input_file_id="file-missing", endpoint="/v1/chat/completions",
                              completion_window="24h")
    f = client.files.create(file=("ok.jsonl", jsonl([chat_line("a")])), purpose="batch")
    with pytest.raises(openai.BadRequestError, match="endpoint"):
        client.batches.create(input_file_id=f.id, endpoint="/v1/moderations", completion_window="24h")
    with pytest.raises(openai.BadRequestError, match="completion_window"):
        client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="1h")
    with pytest.raises(openai.NotFoundError):
        client.batches.retrieve("batch_missing")
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve("file-missing")
    with pytest.raises(openai.NotFoundError):
        client.files.content("file-missing")
    assert client.files.retrieve(f.id).filename == "ok.jsonl"
    assert client.files.content(f.id).content == jsonl([chat_line("a")])
    assert f.id in [x.id for x in client.files.list(purpose="batch")]
    assert client.files.delete(f.id).deleted is True
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(f.id)


def test_list_batches_newest_first_and_pages(client):
    ids = [run_batch(client, [chat_line("x")]).id for _ in range(3)]
    first_page = client.batches.list(limit=2)
    assert len(first_page.data) == 2 and first_page.has_more
    listed = [b.id for b in client.batches.list(limit=2)]  # auto-paging follows `after`
    assert listed[:3] == ids[::-1]
    with pytest.raises(openai.ConflictError):
        client.batches.cancel(ids[0])


@pytest.fixture
def slow_engine() -> Iterator[EngineProcess]:
    """One running slot and 20 tokens/s: a line of 200 tokens holds the slot for 10 s."""
    with EngineProcess.start(["--model", "sim-m", "--max-num-seqs", "1", "--tokens-per-s", "20",
                              "--prefill-tokens-per-s", "0"]) as engine:
        yield engine


def test_batch_fills_the_queue_and_cancel_stops_it_keeping_finished_lines(slow_engine):
    client = openai.OpenAI(base_url=slow_engine.url + "/v1", api_key="unused", max_retries=0, timeout=10)
    rows = [chat_line("quick", max_tokens=1)] + [chat_line(f"long-{i}", max_tokens=200) for i in range(5)]
    f = client.files.create(file=("in.jsonl", jsonl(rows)), purpose="batch")
    batch = client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
    def one_done_one_running_one_waiting():
        b = client.batches.retrieve(batch.id)
        gauges = (metric(slow_engine, "vllm:num_requests_running"), metric(slow_engine, "vllm:num_requests_waiting"))
        return b if b.request_counts.completed == 1 and gauges == (1, 1) else None

    # 2 x max-num-seqs lines at a time: one runs, one waits in the engine's FIFO queue.
    b = wait_for(one_done_one_running_one_waiting, 10, "one line done, one running, one waiting", interval=0.02)
    assert b.status == "in_progress" and b.request_counts.total == 6
    cancelling = client.batches.cancel(batch.id)
    assert cancelling.status in ("cancelling", "cancelled") and cancelling.cancelling_at
    done = wait_batch(client, batch.id, timeout=5)
    assert done.status == "cancelled" and done.cancelled_at and done.completed_at is None
    assert (done.request_counts.completed, done.request_counts.failed) == (1, 0)
    assert [r["custom_id"] for r in rows_of(client, done.output_file_id)] == ["quick"]
    # The cancelled lines left the engine at once.
    assert metric(slow_engine, "vllm:num_requests_running") == 0
    assert metric(slow_engine, "vllm:num_requests_waiting") == 0
    assert client.batches.cancel(batch.id).status == "cancelled"  # idempotent
