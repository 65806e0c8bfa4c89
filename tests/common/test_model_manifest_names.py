"""A model directory's digest is unambiguous (issue 40): names with control characters (a
newline could forge a manifest line, letting two different trees share a digest) are refused,
and what the digest ignores (top-level .cache/, .fabric/) is stripped from a cached copy."""

from __future__ import annotations

import pytest

from agent.models.cache import ModelCache
from common.model_manifest import CheckFailed, build_manifest, check_relative_name, parse_manifest

SHA = "0" * 64


def test_a_newline_in_a_file_name_is_refused(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"w")
    # This name would print as two manifest lines, the second one forged.
    (tmp_path / f"a 1 {SHA}\nb").write_bytes(b"x")
    with pytest.raises(CheckFailed, match="control character"):
        build_manifest(tmp_path)


def test_control_characters_in_names_are_refused_everywhere(tmp_path):
    for name in ("a\nb", "tab\there", "bell\x07", "del\x7f", "dir\r/x"):
        with pytest.raises(CheckFailed):
            check_relative_name(name)
    (tmp_path / "sub\x01dir").mkdir()
    (tmp_path / "sub\x01dir" / "f").write_bytes(b"x")
    with pytest.raises(CheckFailed, match="control character"):
        build_manifest(tmp_path)
    assert check_relative_name("org model/with space.bin") == "org model/with space.bin"


def test_a_forged_manifest_line_cannot_parse():
    with pytest.raises(CheckFailed):
        parse_manifest(f"a\nb 1 {SHA}\n")


def test_a_cached_copy_keeps_nothing_the_digest_ignores(tmp_path):
    cache = ModelCache(tmp_path / "cache")
    staging = tmp_path / "staging"
    (staging / ".cache" / "huggingface").mkdir(parents=True)
    (staging / ".cache" / "huggingface" / "planted.py").write_text("import os")
    (staging / ".fabric").mkdir()
    (staging / "config.json").write_text("{}")
    manifest = build_manifest(staging)
    final = cache.publish(staging, manifest.digest, "k", manifest.text())
    assert sorted(p.name for p in final.iterdir()) == ["config.json"]
    assert build_manifest(final).digest == manifest.digest
    assert cache.manifest_text(manifest.digest) == manifest.text()  # what the KV-index tokenizer route serves
