"""What an unauthenticated or hostile caller sends, through a real gateway in front of a real
engine: nothing is read before the credential, the body is read the way the engine will read
it (so no cap can be dodged), and the path is decoded once. Raw sockets where a normal client
cannot express the attack."""

from __future__ import annotations

import json
import socket

import httpx
import pytest

from common import audit_chain
from lab.rigs.polling import wait_for
from tests.gateway.gateway_harness import GatewayProcess, make_key, publish_endpoint, sim_engine, sqlite_state

ENV = {
    "FABRIC_GATEWAY_CACHE_SECS": "0.2",
    "FABRIC_MAX_GENERATED_TOKENS": "50",
    "FABRIC_MAX_PROMPT_TOKENS": "100",
    "FABRIC_DEFAULT_MAX_TOKENS": "7",
    "FABRIC_PROJECT_TPM": "100",
}


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    state, url, store = sqlite_state(tmp_path_factory, "harden")
    engine = sim_engine("--default-max-tokens", "200")
    publish_endpoint(store, "chat", [engine])
    gw = GatewayProcess.start(state, url, ENV)
    _, key = make_key(store, "chat")
    yield {"store": store, "gw": gw, "key": key, "engine": engine}
    gw.stop()
    engine.stop()
    store.close()


def raw_request(gw: GatewayProcess, head: bytes, body: bytes = b"", timeout: float = 10) -> bytes:
    """Send head+body on a raw socket; return what the gateway answered until it closed or paused."""
    with socket.create_connection(("127.0.0.1", gw.port), timeout=timeout) as s:
        s.sendall(head + body)
        out = b""
        while b"\r\n\r\n" not in out or len(out) < out.index(b"\r\n\r\n") + 4 + _length(out):
            chunk = s.recv(65536)
            if not chunk:
                break
            out += chunk
        return out


def _length(resp: bytes) -> int:
    for line in resp.split(b"\r\n\r\n")[0].split(b"\r\n")[1:]:
        k, _, v = line.partition(b":")
        if k.strip().lower() == b"content-length":
            return int(v)
    return 0


def status_of(resp: bytes) -> int:
    return int(resp.split(b" ", 2)[1])


def chat(env, body: bytes, headers: dict | None = None, path: str = "/chat/completions") -> httpx.Response:
    h = {"authorization": f"Bearer {env['key']}", **(headers or {})}
    return httpx.post(env["gw"].openai_base("chat") + path, content=body, headers=h, timeout=30)


# --- nothing before authentication --------------------------------------------------------------


def test_unauthenticated_100_mib_upload_is_refused_after_a_few_kib(env):
    gw = env["gw"]
    head = (b"POST /api/ai/openai/chat/v1/files HTTP/1.1\r\nhost: x\r\n"
            b"content-type: multipart/form-data; boundary=zz\r\ncontent-length: 104857600\r\n\r\n")
    with socket.create_connection(("127.0.0.1", gw.port), timeout=10) as s:
        s.sendall(head + b"x" * 4096)  # 4 KiB of the declared 100 MiB, and then nothing more
        resp = s.recv(65536)
        assert status_of(resp) == 401, resp
        assert b"connection: close" in resp.lower()
        # The gateway closes the connection rather than read the rest.
        s.settimeout(5)
        rest = b""
        while chunk := s.recv(65536):
            rest += chunk
        assert b"HTTP/1.1" not in rest


def test_failed_authentication_is_audited_without_the_secret(env):
    secret = "NotTheRealSecretQ9x"
    bad = f"fvai_0123456789ab_{secret}"
    r = httpx.post(env["gw"].openai_base("chat") + "/chat/completions", headers={"authorization": f"Bearer {bad}"},
                   json={"model": "sim-m", "messages": [{"role": "user", "content": "hi"}]}, timeout=10)
    assert r.status_code == 401
    rows = wait_for(lambda: [row for row in audit_chain.read_rows(env["store"])
                             if row.get("key_id") == "prefix:0123456789ab"], 5, "the refused call's audit row",
                    interval=0.05)
    assert rows[-1]["kind"] == "FAILED" and rows[-1]["status"] == 401 and rows[-1]["reason"]
    text = json.dumps(audit_chain.read_rows(env["store"]))
    assert secret not in text and bad not in text
    assert audit_chain.verify(env["store"]).ok


def test_deeply_nested_json_is_400_not_500(env):
    r = chat(env, b"[" * 100_000 + b"]" * 100_000, {"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
    nested = b'{"model":"sim-m","messages":[{"role":"user","content":"hi"}],"max_tokens":2,"x":' + \
        b"[" * 80 + b"]" * 80 + b"}"
    assert chat(env, nested, {"content-type": "application/json"}).status_code == 400


# --- one path decoding ----------------------------------------------------------------------------


@pytest.mark.parametrize("path", [
    b"/api/ai/openai/chat%2Fv1%2Ffiles/x",  # an encoded slash picking the upload cap
    b"/api/ai/openai/chat/v1%2Ffiles",
    b"/api/ai/openai/chat/v1/chat/completions%3Fx=1",
    b"/api/ai/openai/chat/v1/../v1/files",
    b"/api/ai/openai/chat/v1/%2e%2e/files",
    b"/api/ai/openai/chat//v1/files",
])
def test_ambiguous_paths_are_refused(env, path):
    body = b'{"model":"sim-m"}'
    head = (b"POST " + path + b" HTTP/1.1\r\nhost: x\r\nauthorization: Bearer " + env["key"].encode() +
            b"\r\ncontent-type: application/json\r\ncontent-length: " + str(len(body)).encode() + b"\r\n\r\n")
    resp = raw_request(env["gw"], head, body)
    assert status_of(resp) == 400, resp
    assert b"invalid_path" in resp


# --- caps computed the way the engine reads the body ----------------------------------------------


def body(**fields) -> bytes:
    return json.dumps({"model": "sim-m", "messages": [{"role": "user", "content": "hi"}], **fields}).encode()


@pytest.mark.parametrize("ctype", ["Application/JSON", "application/json; charset=UTF-8", "text/plain", None])
def test_generation_cap_applies_whatever_the_content_type_says(env, ctype):
    headers = {"content-type": ctype} if ctype else {}
    r = chat(env, body(max_tokens=500), headers)
    assert r.status_code == 400 and r.json()["error"]["code"] == "max_tokens_too_large", (ctype, r.text)


def test_missing_content_type_on_a_raw_socket_still_caps(env):
    b = body(max_tokens=500)
    head = (b"POST /api/ai/openai/chat/v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer " +
            env["key"].encode() + b"\r\ncontent-length: " + str(len(b)).encode() + b"\r\n\r\n")
    assert status_of(raw_request(env["gw"], head, b)) == 400


def test_duplicated_content_type_is_refused(env):
    b = body(max_tokens=500)
    head = (b"POST /api/ai/openai/chat/v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer " +
            env["key"].encode() + b"\r\ncontent-type: text/plain\r\ncontent-type: application/json\r\n"
            b"content-length: " + str(len(b)).encode() + b"\r\n\r\n")
    resp = raw_request(env["gw"], head, b)
    assert status_of(resp) == 400 and b"content-type" in resp


def test_a_body_that_is_not_json_is_415(env):
    r = chat(env, b"model=sim-m&max_tokens=500", {"content-type": "application/x-www-form-urlencoded"})
    assert r.status_code == 415
    r = chat(env, b"{not json", {"content-type": "application/json"})
    assert r.status_code == 400


def test_max_completion_tokens_is_read_before_max_tokens(env):
    r = chat(env, body(max_completion_tokens=500, max_tokens=10), {"content-type": "application/json"})
    assert r.status_code == 400
    ok = chat(env, body(max_completion_tokens=5, max_tokens=500), {"content-type": "application/json"})
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 5


def test_an_absent_cap_gets_the_default_in_the_forwarded_body(env):
    # The engine would generate 200 tokens on its own; the gateway writes FABRIC_DEFAULT_MAX_TOKENS.
    r = chat(env, body(), {"content-type": "application/json"})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 7
    # A client's own null does not switch the default off (the later key wins in the engine's parser).
    r = chat(env, body(max_completion_tokens=None), {"content-type": "application/json"})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 7


def test_completions_route_reads_max_tokens_only(env):
    # vLLM's completions route ignores max_completion_tokens: the gateway counts what it will do.
    b = json.dumps({"model": "sim-m", "prompt": "hi", "max_completion_tokens": 3}).encode()
    r = chat(env, b, {"content-type": "application/json"}, path="/completions")
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 7
    b = json.dumps({"model": "sim-m", "prompt": "hi", "max_tokens": 500}).encode()
    assert chat(env, b, {"content-type": "application/json"}, path="/completions").status_code == 400


def test_n_multiplies_the_token_estimate(env):
    # FABRIC_PROJECT_TPM=100: 4 choices of 30 tokens each are 120 tokens, more than the whole
    # minute allows: it can never fit, so a 400 (request_too_large) rather than a 429 to retry.
    r = chat(env, body(max_tokens=30, n=4), {"content-type": "application/json", "x-project-id": "p-n"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "request_too_large", r.text
    assert "FABRIC_PROJECT_TPM" in r.json()["error"]["message"]
    # The refusal names the limit, not the fleet-wide count in its window.
    assert "/100" not in r.json()["error"]["message"]


def test_counter_names_from_headers_are_bounded(env):
    r = chat(env, body(max_tokens=2), {"content-type": "application/json", "x-user-id": "a/" + "x" * 300})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_header"
