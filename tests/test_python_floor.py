"""Python 3.10 is the oldest Python Fabric runs on (Ubuntu 22.04's): nothing uses what it lacks.

Only 3.11 runs here, so the floor is held three ways: ruff parses for target-version py310 (and
refuses newer syntax), mypy checks its files with python_version 3.10 (typeshed's version
guards), and this test reads every Python file of the project for the standard-library names
and statements that arrived in 3.11 or 3.12, wherever mypy does not look. A try around
``asyncio.wait_for`` must catch ``asyncio.TimeoutError``: on 3.10 it is not the builtin one.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TOPS = ("common", "controlplane", "agent", "gateway", "tests", "scripts", "images")

# module -> names it gained after 3.10 (attribute access or `from module import name`)
NEWER = {
    "asyncio": {"timeout", "timeout_at", "Timeout", "TaskGroup", "Runner", "Barrier", "BrokenBarrierError",
                "eager_task_factory"},
    "datetime": {"UTC"},
    "typing": {"Self", "Never", "LiteralString", "assert_never", "assert_type", "reveal_type", "TypeVarTuple",
               "Unpack", "Required", "NotRequired", "dataclass_transform", "get_overloads", "override"},
    "enum": {"StrEnum", "verify", "ReprEnum", "member", "nonmember", "global_enum", "EnumCheck", "FlagBoundary"},
    "hashlib": {"file_digest"},
    "contextlib": {"chdir"},
    "itertools": {"batched"},
    "operator": {"call"},
    "math": {"cbrt", "exp2"},
    "sys": {"exception"},
    "os": {"setns", "unshare"},
    "logging": {"getLevelNamesMapping"},
}
NEW_MODULES = {"tomllib", "wsgiref.types"}
NEW_BUILTINS = {"ExceptionGroup", "BaseExceptionGroup"}
NEW_METHODS = {"uncancel", "cancelling", "add_note"}  # Task's (3.11), BaseException's (3.11)
ALLOWED_METHOD_FILES = {"common/task_cancel.py"}  # the one place that calls them, behind a version check


def python_files() -> list[Path]:
    out = []
    for top in TOPS:
        for path in sorted((REPO / top).rglob("*")):
            if not path.is_file() or ".venv" in path.parts:
                continue
            if path.suffix == ".py":
                out.append(path)
            elif not path.suffix:
                head = path.read_bytes()[:64]
                if head.startswith(b"#!") and b"python" in head.split(b"\n")[0]:
                    out.append(path)
    return out


def _catches_asyncio_timeout(handler: ast.ExceptHandler) -> bool:
    names = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    return any(ast.unparse(n) in ("asyncio.TimeoutError", "asyncio.exceptions.TimeoutError") for n in names if n)


def problems(source: str, rel: str = "<test>") -> list[str]:
    tree = ast.parse(source)
    found = []
    for node in ast.walk(tree):
        where = f"{rel}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Import):
            found += [f"{where}: import {a.name}" for a in node.names if a.name in NEW_MODULES]
        elif isinstance(node, ast.ImportFrom) and node.module:
            if node.module in NEW_MODULES:
                found.append(f"{where}: from {node.module} import")
            found += [f"{where}: from {node.module} import {a.name}" for a in node.names
                      if a.name in NEWER.get(node.module, ())]
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            if node.attr in NEWER.get(node.value.id, ()):
                found.append(f"{where}: {node.value.id}.{node.attr}")
        elif isinstance(node, ast.Name) and node.id in NEW_BUILTINS:
            found.append(f"{where}: {node.id}")
        elif getattr(ast, "TryStar", None) is not None and isinstance(node, ast.TryStar):
            found.append(f"{where}: except*")
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in NEW_METHODS
                and rel not in ALLOWED_METHOD_FILES):
            found.append(f"{where}: .{node.func.attr}() (common.task_cancel has the 3.10 stand-in)")
        if isinstance(node, ast.Try):
            waits = any(isinstance(n, ast.Call) and ast.unparse(n.func) == "asyncio.wait_for"
                        for stmt in node.body for n in ast.walk(stmt))
            bare = [h for h in node.handlers if h.type is not None
                    and "TimeoutError" in {ast.unparse(n) for n in
                                           (h.type.elts if isinstance(h.type, ast.Tuple) else [h.type])}]
            if waits and bare and not any(_catches_asyncio_timeout(h) for h in node.handlers):
                found.append(f"{where}: `except TimeoutError` around asyncio.wait_for (3.10 raises "
                             "asyncio.TimeoutError, not the builtin)")
    return found


def test_no_project_file_uses_what_python_3_10_lacks():
    files = python_files()
    assert len(files) > 300  # the walk found the project
    found = [p for f in files for p in problems(f.read_text(), str(f.relative_to(REPO)))]
    assert not found, "\n".join(found)


def test_the_check_catches_each_kind_of_newer_use():
    bad = {
        "import tomllib": "import tomllib",
        "from typing import Self": "from typing import Self",
        "import datetime\nx = datetime.UTC": "datetime.UTC",
        "import asyncio\nasync def f():\n    async with asyncio.timeout(1):\n        pass": "asyncio.timeout",
        "from enum import StrEnum": "from enum import StrEnum",
        "try:\n    pass\nexcept* ValueError:\n    pass": "except*",
        "raise ExceptionGroup('x', [])": "ExceptionGroup",
        "t.uncancel()": ".uncancel()",
        "import hashlib\nhashlib.file_digest(f, 'sha256')": "hashlib.file_digest",
        ("import asyncio\nasync def f(c):\n    try:\n        await asyncio.wait_for(c, 1)\n"
         "    except TimeoutError:\n        pass"): "around asyncio.wait_for",
    }
    for source, what in bad.items():
        got = problems(source)
        assert len(got) == 1 and what in got[0], (source, got)
    fine = ("import asyncio, datetime\nasync def f(c):\n    try:\n        await asyncio.wait_for(c, 1)\n"
            "    except asyncio.TimeoutError:\n        pass\nx = datetime.timezone.utc")
    assert problems(fine) == []


def test_requires_python_ruff_and_mypy_name_the_same_floor():
    text = (REPO / "pyproject.toml").read_text()
    assert re.search(r'^requires-python = ">=3\.10,<3\.13"', text, re.M)
    assert re.search(r'^target-version = "py310"', text, re.M)
    assert re.search(r'^python_version = "3\.10"', text, re.M)
