"""The profiles the suite runs under: hypothesis's, loaded by tests/conftest.py for every property
test, and `full`, whose tests docs/reliability.md must list one by one."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

DRAWN: list[int] = []


def test_property_tests_run_derandomised_without_a_database():
    assert settings.default.derandomize is True
    assert settings.default.database is None


@settings(max_examples=5)
@given(st.integers())
def _draw(n: int) -> None:
    DRAWN.append(n)


def test_a_property_test_draws_the_same_examples_on_every_run():
    DRAWN.clear()
    _draw()
    first = list(DRAWN)
    DRAWN.clear()
    _draw()
    assert DRAWN == first and len(first) == 5
