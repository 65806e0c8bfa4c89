"""The verdict header and the Python enum agree."""

from agent.dataplane.verdicts import VERDICT_MAX, Verdict, parse_verdicts_header


def test_header_and_enum_match():
    parsed = parse_verdicts_header()
    assert parsed.pop("MAX") == VERDICT_MAX
    assert parsed == {v.name: v.value for v in Verdict}
    assert sorted(parsed.values()) == list(range(VERDICT_MAX))
