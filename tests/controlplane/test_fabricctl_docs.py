"""docs/cli.md is generated from fabricctl's commands; it must match them, and every command,
argument and option must say what it is for."""

from __future__ import annotations

from pathlib import Path

from fabricctl.docgen import missing_help, render_reference

DOC = Path(__file__).parents[2] / "docs" / "cli.md"


def test_docs_cli_md_is_current():
    assert DOC.read_text() == render_reference(), "docs/cli.md is stale: run scripts/gen-cli-docs"


def test_every_command_argument_and_option_has_help():
    assert missing_help() == []
