"""The committed console screenshots (docs/console/screenshots/) are real pictures, not blank:
each PNG decodes (zlib over its IDAT chunks) and its rows are not all one colour."""

from __future__ import annotations

import re
import struct
import zlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
SHOTS = ROOT / "docs" / "console" / "screenshots"
NEW_PAGES = ["model-new-dry-run", "deployment-new", "playground", "playground-viewer", "endpoint-charts",
             "endpoint-charts-live-load", "deployment-detail", "models-jobs"]


def _distinct_rows(path: Path) -> int:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path.name} is not a PNG"
    pos, idat, width = 8, b"", 0
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        chunk = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width = struct.unpack(">I", chunk[:4])[0]
        elif kind == b"IDAT":
            idat += chunk
        pos += 12 + length
    raw = zlib.decompress(idat)
    assert width > 0 and raw
    return len(set(raw[i:i + 200] for i in range(0, min(len(raw), 4_000_000), max(1, len(raw) // 400))))


def test_every_new_page_has_a_screenshot_linked_from_the_docs():
    doc = (ROOT / "docs" / "console.md").read_text()
    linked = set(re.findall(r"console/screenshots/([\w-]+)\.png", doc))
    assert set(NEW_PAGES) <= linked


@pytest.mark.parametrize("name", NEW_PAGES)
def test_screenshot_is_not_blank(name):
    path = SHOTS / f"{name}.png"
    assert path.exists(), f"{path} missing: run tests/integration/test_console_playground.py with " \
                          "FABRIC_CONSOLE_SCREENSHOTS=docs/console/screenshots"
    assert _distinct_rows(path) > 20, f"{name}.png looks blank"
