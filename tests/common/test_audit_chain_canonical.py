"""The audit chain's hashed form is json.dumps(sort_keys, compact, ASCII) whichever encoder
writes it: orjson's fast path must give the same text for every row, or verify-audit breaks."""

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from common.audit_chain import _canonical

values = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False), st.floats(min_value=0, max_value=1e7).map(lambda x: round(x, 3)),
    st.text(), st.text(alphabet=st.characters(max_codepoint=127)),
)
rows = st.dictionaries(st.text(min_size=1, max_size=12), values, max_size=12)


@given(rows)
@settings(max_examples=400)
def test_canonical_is_json_dumps_for_any_row(row):
    assert _canonical(row) == json.dumps(row, sort_keys=True, separators=(",", ":"))


def test_the_rows_a_gateway_writes_take_the_fast_path_and_match():
    row = {"kind": "SUCCESS", "request_id": "ab" * 16, "key_id": "k1", "tenant": None, "endpoint": "chat",
           "model": "m", "status": 200, "tokens": 12, "latency_ms": 12.345, "reason": "success", "seq": 7,
           "prev": "0" * 64, "ts": 1764547200.123}
    assert _canonical(row) == json.dumps(row, sort_keys=True, separators=(",", ":"))
    assert _canonical({"model": "modèle"}) == '{"model":"mod\\u00e8le"}'  # non-ASCII: json's escape
