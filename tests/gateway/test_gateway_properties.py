"""Property-based tests (hypothesis) of the gateway's request parsing and limit arithmetic: the
gateway has no OpenAPI to fuzz, so its pure parts are fuzzed here instead.

  - parse_route: any raw path is a 400 (BadPath) or a route whose decoded path never escapes
    (no '.', '..' or empty segment, no backslash) and that the upstream sees the same way;
  - parse_body: any bytes under any content type give a BodyInfo or a 4xx FabricError, never
    another exception; a body the gateway rewrote reads, the way the engine reads it, with the
    cap the gateway counted;
  - the default cap never exceeds FABRIC_MAX_GENERATED_TOKENS or what the context leaves, and
    shrinks as the prompt grows; token estimates are monotonic;
  - check_caps lets nothing through that is over a cap; plan_admission reserves exactly the
    estimate; the store counters never pass their limit under any sequence of reserve/release.

Deterministic (derandomize) and bounded (max_examples) so the run is the same every time.
"""

from __future__ import annotations

import json
from urllib.parse import unquote

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from common.errors import FabricError
from common.records import counters
from common.store.sqlite_store import SqliteStore
from gateway.limits import RequestFacts, check_caps, plan_admission
from gateway.request_body import GenerationPolicy, parse_body, with_field
from gateway.routes import ANY_GENERATION_FIELDS, GENERATION_FIELDS, PREFIX_B, Route, parse_route
from gateway.settings import GatewaySettings

FAST = settings(max_examples=60, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])

# Path pieces an attacker would try: escapes of every structural character, dots, unicode.
PIECES = st.sampled_from([
    b"v1", b"chat", b"completions", b"files", b"..", b".", b"", b"%2e", b"%2E%2e", b"%2f", b"%2F", b"%5c",
    b"%3f", b"%23", b"%00", b"%25", b"%252e", b"\\", b"%c3%a9", b"%ff", b"%", b"%g1", b"\xc3\xa9", b"a b",
    b"?", b"#", b";", b"~", b"ep", b"UPPER", b"%41", b"%20", b"//",
])
RAW_PATHS = st.one_of(
    st.lists(PIECES, max_size=8).map(lambda parts: b"/" + b"/".join(parts)),
    st.binary(max_size=64).map(lambda b: b"/" + b),
)


def _check_route(route: Route, raw_sub: bytes) -> None:
    path = route.path
    assert path.startswith("/")
    segments = path.split("/")[1:]
    assert "." not in segments and ".." not in segments, path
    assert "" not in segments[:-1], path  # only a trailing slash may leave an empty segment
    assert "\\" not in path and "\0" not in path and "?" not in path
    # what the upstream gets, decoded once the way Starlette does, is what the gateway decided on
    assert route.target.split(b"?", 1)[0] == raw_sub
    assert unquote(raw_sub.decode("ascii")) == path


@FAST
@given(sub=RAW_PATHS, endpoint=st.sampled_from([b"ep", b"chat-1", b"UPPER", b"%65p", b"", b"e%2fp", b"-x"]),
       method=st.sampled_from(["GET", "POST", "DELETE"]))
def test_decoded_paths_never_escape_and_match_what_the_upstream_reads(sub, endpoint, method):
    sub = sub.split(b"?", 1)[0]  # the HTTP server ends the raw path at the first '?'
    for raw, raw_sub in ((PREFIX_B + endpoint + sub, sub), (sub, sub)):
        try:
            route = parse_route(raw, b"q=1", method)
        except FabricError as exc:
            assert exc.status == 400
            continue
        _check_route(route, raw_sub)
        assert route.kind in ("generate", "json", "upload", "read")
        assert (route.kind == "read") == (method != "POST")


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-2**70, max_value=2**70) | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)
FIELDS = ["model", "stream", "max_tokens", "max_completion_tokens", "max_output_tokens", "n", "best_of",
          "messages", "prompt", "input", "query", "documents"]
CAP_VALUES = st.one_of(st.none(), st.integers(min_value=-5, max_value=10**7), st.booleans(), st.text(max_size=3),
                       st.floats(allow_nan=False, allow_infinity=False))
BODIES = st.dictionaries(st.sampled_from(FIELDS), st.one_of(CAP_VALUES, JSON_VALUES), max_size=8)
CONTENT_TYPES = st.sampled_from(["application/json", "APPLICATION/JSON; charset=utf-8", "text/plain", "",
                                 "application/vnd.x+json", "multipart/form-data"])
ROUTES = st.sampled_from([parse_route(PREFIX_B + b"ep" + p, b"", "POST") for p in
                          (b"/v1/chat/completions", b"/v1/completions", b"/v1/responses", b"/v1/embeddings",
                           b"/v1/unknown/generate")])
POLICY = GenerationPolicy(default_max_tokens=4096, max_generated_tokens=2048, max_context=8192)


def _engine_cap(body: bytes, route: Route) -> int | None:
    """The cap as the engine reads the forwarded body: the last duplicate key wins (json.loads
    and vLLM alike), the first non-empty field of the route's list wins."""
    data = json.loads(body)
    fields = route.generation_fields
    values = [data.get(f) for f in fields if data.get(f)]
    if fields == ANY_GENERATION_FIELDS:
        return max(values, default=None)
    return values[0] if values else None


@FAST
@given(raw=st.one_of(st.binary(max_size=200), BODIES.map(lambda d: json.dumps(d).encode()),
                     JSON_VALUES.map(lambda v: json.dumps(v).encode())),
       content_type=CONTENT_TYPES, route=ROUTES)
def test_any_body_is_parsed_or_refused_with_a_4xx(raw, content_type, route):
    try:
        info = parse_body(raw, content_type, route, POLICY)
    except FabricError as exc:
        assert 400 <= exc.status < 500, exc
        assert exc.message
        return
    assert info.prompt_chars >= 0 and len(info.prompt_head) <= 64
    data = info.data or {}
    asked = [data[f] for f in ("n", "best_of") if route.kind == "generate" and data.get(f) is not None]
    assert info.choices == max([1, *asked])  # the most sequences the engine will generate
    if route.kind == "generate" and raw:
        assert info.max_tokens is not None and info.max_tokens >= 0
        sent = info.body if info.body is not None else raw
        assert _engine_cap(sent, route) == (info.max_tokens or None)


@FAST
@given(data=BODIES, route=ROUTES)
def test_a_rewritten_body_carries_exactly_the_counted_cap(data, route):
    raw = json.dumps(data).encode()
    try:
        info = parse_body(raw, "application/json", route, POLICY)
    except FabricError:
        return
    if info.body is not None:
        assert info.max_tokens is not None
        prompt_tokens = (info.prompt_chars + 3) // 4
        assert info.max_tokens == max(1, min(POLICY.default_max_tokens, POLICY.max_generated_tokens,
                                             POLICY.max_context - prompt_tokens))
        assert info.max_tokens + (info.prompt_chars + 3) // 4 <= POLICY.max_context or info.max_tokens == 1
        assert _engine_cap(info.body, route) == info.max_tokens
        assert {k: v for k, v in json.loads(info.body).items() if k not in ANY_GENERATION_FIELDS} == \
            {k: v for k, v in data.items() if k not in ANY_GENERATION_FIELDS}


@FAST
@given(data=st.dictionaries(st.text(max_size=6), JSON_VALUES, max_size=5),
       name=st.sampled_from(sorted(set(sum(GENERATION_FIELDS.values(), ())))),
       value=st.integers(min_value=0, max_value=10**9), pad=st.sampled_from([b"", b" ", b"\n\t "]))
def test_with_field_sets_exactly_one_field(data, name, value, pad):
    out = json.loads(with_field(pad + json.dumps(data).encode() + pad, data, name, value))
    assert out == {**data, name: value}


@FAST
@given(default=st.integers(1, 10**6), most=st.one_of(st.none(), st.integers(1, 10**6)),
       context=st.integers(1, 10**6), prompt=st.integers(0, 2 * 10**6), more=st.integers(0, 10**6))
def test_default_cap_stays_under_every_limit_and_shrinks_as_the_prompt_grows(default, most, context, prompt, more):
    policy = GenerationPolicy(default, most, context)
    cap = policy.default_for(prompt)
    assert cap == max(1, min(default, most or default, context - prompt))
    if most:
        assert cap <= most
    if prompt < context:
        assert prompt + cap <= context  # the context is never exceeded by the default itself
    assert policy.default_for(prompt + more) <= cap


@FAST
@given(chars=st.integers(0, 10**7), more_chars=st.integers(0, 10**6), tokens=st.one_of(st.none(), st.integers(0, 10**6)),
       more_tokens=st.integers(0, 10**6), choices=st.integers(1, 128))
def test_token_estimate_is_monotonic(chars, more_chars, tokens, more_tokens, choices):
    def facts(c, t, n):
        return RequestFacts("ep", "m", None, None, None, "gw", prompt_chars=c, max_tokens=t, choices=n)

    base = facts(chars, tokens, choices).token_estimate
    assert base >= (chars + 3) // 4 >= chars / 4
    assert facts(chars + more_chars, tokens, choices).token_estimate >= base
    assert facts(chars, (tokens or 0) + more_tokens, choices).token_estimate >= base
    assert facts(chars, tokens, min(128, choices + 1)).token_estimate >= base


CAPS = st.builds(GatewaySettings, max_prompt_tokens=st.one_of(st.none(), st.integers(1, 10**5)),
                 max_generated_tokens=st.one_of(st.none(), st.integers(1, 10**5)),
                 max_context=st.integers(1, 10**5),
                 tpm=st.dictionaries(st.sampled_from(["GLOBAL", "MODEL", "USER"]), st.integers(1, 10**6), max_size=2),
                 rpm=st.dictionaries(st.sampled_from(["GLOBAL", "TENANT"]), st.integers(1, 10**3), max_size=2),
                 streams=st.dictionaries(st.sampled_from(["GLOBAL", "PROJECT"]), st.integers(1, 10), max_size=2),
                 daily_tokens=st.one_of(st.none(), st.integers(1, 10**9)))


@FAST
@given(s=CAPS, chars=st.integers(0, 10**6), tokens=st.one_of(st.none(), st.integers(0, 10**6)),
       user=st.one_of(st.none(), st.text(max_size=200)), choices=st.integers(1, 4))
def test_caps_let_nothing_over_a_limit_through_and_plans_reserve_the_estimate(s, chars, tokens, user, choices):
    facts = RequestFacts("ep", "m", "t", "p", user, "gw", prompt_chars=chars, max_tokens=tokens, choices=choices)
    try:
        check_caps(s, facts)
    except FabricError as exc:
        assert exc.status == 400
    else:
        assert not s.max_prompt_tokens or facts.prompt_tokens <= s.max_prompt_tokens
        assert not s.max_generated_tokens or (tokens or 0) <= s.max_generated_tokens
        assert facts.prompt_tokens + (tokens or 0) <= s.max_context
    for r in plan_admission(s, facts):
        assert r.amount == (facts.token_estimate if r.tokens else 1)
        assert r.limit is not None and r.limit >= 1
        assert "/" not in r.key.rsplit("/", 1)[-1] and len(r.key) < 400  # a caller's name is one safe segment
        assert user is None or len(user) < 3 or user not in r.what


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    s = SqliteStore(tmp_path_factory.mktemp("counters") / "store.db")
    yield s
    s.close()


@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(limit=st.integers(1, 50), ops=st.lists(st.integers(-20, 20), min_size=1, max_size=40))
def test_a_counter_never_passes_its_limit(store, limit, ops):
    key = f"/test/counter/{limit}/{len(ops)}/{hash(tuple(ops)) & 0xffffffff}"
    store.delete(key)
    expected = 0
    for amount in ops:
        outcome = counters.reserve(store, key, amount, limit)
        if amount > 0 and expected + amount > limit:
            assert not outcome.ok and outcome.value == expected
        else:
            assert outcome.ok
            expected = max(0, expected + amount)
        assert 0 <= counters.read(store, key) == expected <= max(limit, expected)
        assert expected <= limit
