"""The profiles the suite runs under: hypothesis's, loaded by tests/conftest.py for every property
test, and `full`, whose tests docs/reliability.md must list one by one."""

from __future__ import annotations

import ast
import re
from pathlib import Path

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


# --- the full profile --------------------------------------------------------------------------

REPO = Path(__file__).resolve().parents[1]
RELIABILITY = REPO / "docs" / "reliability.md"
SECTION = "## The full profile"


def _is_full_mark(node: ast.AST) -> bool:
    """`pytest.mark.full`, called or not."""
    if isinstance(node, ast.Call):
        node = node.func
    return (isinstance(node, ast.Attribute) and node.attr == "full" and isinstance(node.value, ast.Attribute)
            and node.value.attr == "mark")


def _marks_full(node: ast.AST | None) -> bool:
    return node is not None and any(_is_full_mark(n) for n in ast.walk(node))


def full_tests(root: Path) -> set[str]:
    """Every test module (pytestmark) and test (a decorator, on a function or class) marked full,
    as pytest names them: `tests/x.py` or `tests/x.py::test_y` (`::Class` for a class)."""
    found: set[str] = set()
    for path in sorted((root / "tests").rglob("test_*.py")):
        rel = path.relative_to(root).as_posix()
        tree = ast.parse(path.read_text(), filename=rel)
        for stmt in tree.body:
            if isinstance(stmt, ast.Assign | ast.AnnAssign):
                targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
                if any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in targets) and _marks_full(stmt.value):
                    found.add(rel)
            elif isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                if any(_marks_full(d) for d in stmt.decorator_list):
                    found.add(f"{rel}::{stmt.name}")
                for inner in stmt.body if isinstance(stmt, ast.ClassDef) else []:
                    if isinstance(inner, ast.FunctionDef | ast.AsyncFunctionDef) and any(
                            _marks_full(d) for d in inner.decorator_list):
                        found.add(f"{rel}::{stmt.name}::{inner.name}")
    return found


def listed_in_docs(text: str) -> set[str]:
    """The first cell of each row of the section's table: one module or test node id, in backticks."""
    body = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    listed = set()
    for line in body.splitlines():
        cells = line.split("|")
        if len(cells) > 2 and (m := re.fullmatch(r"\s*`(tests/[^`]+)`\s*", cells[1])):
            listed.add(m.group(1))
    return listed


def test_the_scan_finds_module_function_and_class_marks(tmp_path):
    (tmp_path / "tests/sub").mkdir(parents=True)
    (tmp_path / "tests/sub/test_a.py").write_text(
        "import pytest\npytestmark = [pytest.mark.e2e, pytest.mark.full]\ndef test_x(): pass\n")
    (tmp_path / "tests/test_b.py").write_text(
        "import pytest\n@pytest.mark.full  # why\ndef test_long(): pass\ndef test_short(): pass\n"
        "class TestC:\n    @pytest.mark.full\n    def test_m(self): pass\n"
        "@pytest.mark.parametrize('n', [pytest.param(1, marks=pytest.mark.full)])\ndef test_p(n): pass\n")
    assert full_tests(tmp_path) == {"tests/sub/test_a.py", "tests/test_b.py::test_long",
                                    "tests/test_b.py::TestC::test_m", "tests/test_b.py::test_p"}
    doc = (f"# R\n{SECTION}\n| full test | why | instead |\n|---|---|---|\n"
           "| `tests/sub/test_a.py` | slow | `tests/x` |\n| `tests/test_b.py::test_long` | slow | y |\n## Next\n"
           "| `tests/elsewhere.py` | not this section | |\n")
    assert listed_in_docs(doc) == {"tests/sub/test_a.py", "tests/test_b.py::test_long"}


def test_docs_list_exactly_the_full_tests():
    """docs/reliability.md "The full profile" has one row per module or test marked full (its
    first cell the pytest name in backticks), saying why and what covers it in make test."""
    marked, listed = full_tests(REPO), listed_in_docs(RELIABILITY.read_text())
    assert not marked - listed, f"marked full but not listed in {RELIABILITY.name} '{SECTION}': {sorted(marked - listed)}"
    assert not listed - marked, f"listed in {RELIABILITY.name} '{SECTION}' but not marked full: {sorted(listed - marked)}"
