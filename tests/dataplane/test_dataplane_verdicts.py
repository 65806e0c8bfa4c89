"""The verdict header and the Python enums agree (verdicts and xmit codes)."""

from agent.dataplane.verdicts import VERDICT_MAX, XMIT_MAX, Verdict, Xmit, parse_verdicts_header


def test_header_and_enum_match():
    parsed = parse_verdicts_header()
    assert parsed.pop("MAX") == VERDICT_MAX
    assert parsed == {v.name: v.value for v in Verdict}
    assert sorted(parsed.values()) == list(range(VERDICT_MAX))


def test_xmit_codes_match():
    parsed = parse_verdicts_header(prefix="XMIT")
    assert parsed.pop("MAX") == XMIT_MAX
    assert parsed == {v.name: v.value for v in Xmit}
    assert sorted(parsed.values()) == list(range(XMIT_MAX))
