"""Hostile input over real HTTP against a real fabricd (issue 20's "found already" list): each
of these answered 500, or was stored broken, before. Every refusal is 4xx with the error shape
and names what was wrong."""

from __future__ import annotations

import gzip
import json

import pytest

from tests.controlplane.test_api_resources import MODEL, PROFILE, error, make_stack


def test_key_for_an_endpoint_that_is_not_a_dns_label_is_422(api):
    err = error(api.post("/api/ai/keys", json={"endpoint": "UPPER", "name": "k"}), 422)
    assert "endpoint" in err["message"]


@pytest.mark.parametrize("hosts", [["bücher.example"], ["*"], [""], ["a..b"], ["*.example.com"],
                                   [f"h{i}.example" for i in range(17)]])
def test_node_certificate_refuses_bad_or_too_many_hosts(api, hosts):
    err = error(api.post("/api/ai/nodes/node-h/certificate", json={"hosts": hosts}), 422)
    assert "hosts" in err["message"]


def test_node_certificate_takes_ips_and_dns_names(api):
    resp = api.post("/api/ai/nodes/node-ok/certificate", json={"hosts": ["10.0.0.7", "gpu-7.example", "xn--bcher-kva.example"]})
    assert resp.status_code == 200, resp.text


SURROGATE = '"\\ud800"'  # JSON text: a lone high surrogate


@pytest.mark.parametrize("path,body,field", [
    ("models", '{"name": "sur-m", "source": "hf://Qwen/Qwen3-8B", "license": %s}', "body.license"),
    ("models", '{"name": "sur-r", "source": "hf://Qwen/Qwen3-8B", "residency": %s}', "body.residency"),
    ("models", '{"name": "sur-t", "source": "hf://Qwen/Qwen3-8B", "tenant": %s}', "body.tenant"),
    ("deployments", '{"name": "sur-d", "model": "m", "profile": "p", "preferred_site": %s}', "body.preferred_site"),
    ("profiles", '{"name": "sur-p", "runtime": "vllm", "extra_args": ["--x", %s]}', "body.extra_args.1"),
])
def test_a_lone_surrogate_in_any_text_is_422_naming_the_field(api, path, body, field):
    resp = api.post(f"/api/ai/{path}", content=body % SURROGATE, headers={"content-type": "application/json"})
    err = error(resp, 422)
    assert err["message"].startswith(field + ":"), err


def test_a_surrogate_pair_is_text(api):
    body = '{"name": "pair-m", "source": "hf://Qwen/Qwen3-8B", "license": "\\ud83d\\ude00"}'
    resp = api.post("/api/ai/models", content=body, headers={"content-type": "application/json"})
    assert resp.status_code == 201, resp.text
    assert api.get("/api/ai/models/pair-m").json()["license"] == "\U0001F600"


@pytest.mark.parametrize("raw", ["Infinity", "-Infinity", "NaN", "1e400"])
def test_non_finite_numbers_are_refused_not_stored_as_null(api, raw):
    body = '{"name": "inf-p", "runtime": "vllm", "gpu": {"count": 1, "vram_gib": 24}, "cpu": 8, "memory_gib": RAW}'
    body = body.replace("RAW", raw)
    err = error(api.post("/api/ai/profiles", content=body, headers={"content-type": "application/json"}), 422)
    assert "memory_gib" in err["message"]
    error(api.get("/api/ai/profiles/inf-p"), 404)


@pytest.mark.parametrize("value", [False, True, "2"])
def test_booleans_and_strings_are_not_numbers(api, value):
    make_stack(api, f"bool{'s' if isinstance(value, str) else int(value)}")
    name = f"d-bool{'s' if isinstance(value, str) else int(value)}"
    err = error(api.post(f"/api/ai/deployments/{name}/scale", json={"replicas": value}), 422)
    assert "replicas" in err["message"]
    assert api.get(f"/api/ai/deployments/{name}").json()["replicas"] == 1
    err = error(api.post("/api/ai/profiles", json={**PROFILE, "name": "bool-p", "cpu": value}), 422)
    assert "cpu" in err["message"]


@pytest.mark.parametrize("path,body,field", [
    ("profiles", {**PROFILE, "name": "huge-cpu", "cpu": 10**30}, "cpu"),
    ("profiles", {**PROFILE, "name": "huge-mem", "memory_gib": 1e30}, "memory_gib"),
    ("profiles", {**PROFILE, "name": "huge-vram", "gpu": {"count": 1, "vram_gib": 1e30}}, "vram_gib"),
    ("models", {"name": "huge-size", **MODEL, "size_bytes": 10**30}, "size_bytes"),
    ("keys", {"endpoint": "e", "name": "k", "ttl_secs": 10**20}, "ttl_secs"),
    ("keys", {"endpoint": "e", "name": "k", "ttl_secs": 1e20}, "ttl_secs"),
    ("keys", {"endpoint": "e", "name": "k", "request_quota": 10**30}, "request_quota"),
])
def test_absurd_values_are_bounded(api, path, body, field):
    err = error(api.post(f"/api/ai/{path}", json=body), 422)
    assert field in err["message"]


def test_a_body_over_the_limit_is_413_and_nothing_is_stored(api):
    big = {"name": "big-m", **MODEL, "license": "x" * (1024 * 1024 + 1)}
    err = error(api.post("/api/ai/models", json=big), 413)
    assert err["code"] == "payload_too_large" and "FABRIC_MAX_BODY_BYTES" in err["message"]
    error(api.get("/api/ai/models/big-m"), 404)


def test_a_chunked_body_over_the_limit_is_413(api):
    def chunks():
        yield b'{"name": "chunky", "source": "hf://Qwen/Qwen3-8B", "license": "'
        for _ in range(40):
            yield b"y" * 32768
        yield b'"}'

    resp = api.post("/api/ai/models", content=chunks(), headers={"content-type": "application/json"})
    assert error(resp, 413)["code"] == "payload_too_large"


def test_a_gzip_body_is_read_as_its_json_and_one_that_inflates_past_the_limit_is_413(api):
    body = json.dumps({"name": "zipped-m", **MODEL}).encode()
    resp = api.post("/api/ai/models", content=gzip.compress(body),
                    headers={"content-type": "application/json", "content-encoding": "gzip"})
    assert resp.status_code in (200, 201), resp.text
    assert api.get("/api/ai/models/zipped-m").json()["name"] == "zipped-m"
    # 2 MiB of JSON in a ~2 KB body: refused once it inflates past FABRIC_MAX_BODY_BYTES
    bomb = json.dumps({"name": "bomb-m", **MODEL, "license": " " * (2 << 20)}).encode()
    packed = gzip.compress(bomb)
    assert len(packed) < 8192
    err = error(api.post("/api/ai/models", content=packed,
                         headers={"content-type": "application/json", "content-encoding": "gzip"}), 413)
    assert err["code"] == "payload_too_large" and "decompresses" in err["message"]
    error(api.get("/api/ai/models/bomb-m"), 404)


@pytest.mark.parametrize("encoding, content, status, code", [
    pytest.param("gzip", b'{"name": "plain-m"}', 400, "invalid_encoding", id="not-gzip"),
    pytest.param("gzip", gzip.compress(b'{"name": "x"}', mtime=0) + b"trailing", 400, "invalid_encoding",
                 id="trailing-data"),
    pytest.param("gzip", gzip.compress(b'{"name": "x"}', mtime=0)[:-6], 400, "invalid_encoding", id="cut-short"),
    pytest.param("br", b'{"name": "x"}', 415, "unsupported_encoding", id="brotli"),
])
def test_a_body_whose_encoding_cannot_be_read_is_refused_naming_it(api, encoding, content, status, code):
    resp = api.post("/api/ai/models", content=content,
                    headers={"content-type": "application/json", "content-encoding": encoding})
    err = error(resp, status)
    assert err["code"] == code and "Content-Encoding" in err["message"]


@pytest.mark.parametrize("first, second", [("identity", "gzip"), ("gzip", "identity"), ("gzip", "gzip")])
def test_two_content_encoding_headers_are_refused_whatever_their_order(api, first, second):
    body = gzip.compress(json.dumps({"name": "twice-m", **MODEL}).encode(), mtime=0)
    resp = api.post("/api/ai/models", content=body, headers=[
        ("content-type", "application/json"), ("content-encoding", first), ("content-encoding", second)])
    err = error(resp, 400)
    assert err["code"] == "invalid_encoding" and "more than one Content-Encoding" in err["message"]
    error(api.get("/api/ai/models/twice-m"), 404)


def test_lists_are_bounded_and_page_with_continue(api):
    names = [f"page-{i}" for i in range(5)]
    for n in names:
        assert api.post("/api/ai/models", json={"name": n, **MODEL}).status_code == 201
    seen, after = [], "page-"  # every name before "page-" sorts first; start the walk there
    while True:
        resp = api.get("/api/ai/models", params={"limit": 2, "continue": after})
        assert resp.status_code == 200 and len(resp.json()) <= 2
        seen += [m["name"] for m in resp.json()]
        after = resp.headers.get("x-fabric-continue")
        if after is None:
            break
    assert [n for n in seen if n.startswith("page-")] == names
    err = error(api.get("/api/ai/models", params={"limit": 100_000}), 422)
    assert "limit" in err["message"]


def test_openapi_lists_errors_security_and_name_rule(fabricd):
    with fabricd.client() as anon:
        spec = anon.get("/openapi.json").json()
    assert spec["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    create = spec["paths"]["/api/ai/models"]["post"]
    assert create["security"] == [{"bearer": []}]
    assert {"401", "404", "409", "413", "422", "500"} <= set(create["responses"])
    assert create["responses"]["422"]["content"]["application/json"]["schema"]["$ref"] == "#/components/schemas/Error"
    assert "security" not in spec["paths"]["/api/auth/login"]["post"]
    assert spec["paths"]["/api/ai/deployments/{name}"]["delete"]["responses"]["202"]
    model = spec["components"]["schemas"]["ModelArtifact"]
    assert model["properties"]["name"]["pattern"] == "^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer not-a-token"}, {"Authorization": "Basic eDp5"}])
@pytest.mark.parametrize("body", [b"{not json", b'{"name": ""}'])
def test_no_valid_credentials_is_401_before_the_body_is_read(fabricd, headers, body):
    # Found by the schemathesis fuzz (tests/controlplane/test_api_fuzz.py): a malformed body
    # answered 400 and an invalid one 422 to callers without credentials.
    with fabricd.client() as c:
        resp = c.post("/api/ai/profiles", content=body, headers={**headers, "content-type": "application/json"})
    assert resp.status_code == 401, resp.text
    assert resp.json()["error"]["code"] in ("no_token", "invalid_token")
    assert "name" not in resp.text


def test_a_405_allows_every_method_the_path_serves(api):
    # Found by the schemathesis fuzz: the Allow header named only the first matching route's method.
    resp = api.request("OPTIONS", "/api/ai/models")
    assert resp.status_code == 405 and resp.json()["error"]["code"] == "method_not_allowed"
    assert {"GET", "POST"} <= set(resp.headers["allow"].split(", "))
    resp = api.request("PATCH", "/api/ai/models/some-model")
    assert resp.status_code == 405 and {"GET", "DELETE"} <= set(resp.headers["allow"].split(", "))


def test_creates_that_may_replace_document_both_answers(fabricd):
    # Found by scripts/fuzz-api: POST /api/ai/sites answered an undocumented 200 for an existing site.
    with fabricd.client() as anon:
        spec = anon.get("/openapi.json").json()
    assert {"200", "201"} <= set(spec["paths"]["/api/ai/sites"]["post"]["responses"])
    assert {"200", "201"} <= set(spec["paths"]["/api/ai/nodes"]["post"]["responses"])
    links = spec["paths"]["/api/ai/models"]["post"]["responses"]["201"]["links"]
    assert links["GET /api/ai/models/{name}"]["parameters"] == {"name": "$request.body#/name"}
