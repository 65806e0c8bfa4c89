"""docs/cli.md, generated from the commands themselves: `scripts/gen-cli-docs` writes it and
tests/controlplane/test_fabricctl_docs.py fails when it is stale.

`walk()` yields every command with its path; `missing_help()` names commands, arguments and
options without help text (the same test keeps that list empty).
"""

from __future__ import annotations

from collections.abc import Iterator

import typer

WIDTH = 100
HELP_NAMES = ["-h", "--help"]

HEADER = """# fabricctl reference

Generated from the commands themselves by `scripts/gen-cli-docs`; do not edit by hand
(tests/controlplane/test_fabricctl_docs.py fails when this page is stale).

## Habits

- Where fabricd is and how to trust and reach it: flag (`--server`, `--ca`, `--token-file`,
  `--context`) > environment (`FABRIC_URL`, `FABRIC_CA`, `FABRIC_TOKEN`, `FABRIC_CONTEXT`) >
  the current context of `~/.config/fabric/config` (0600; `$XDG_CONFIG_HOME/fabric/config` or
  `$FABRIC_CONFIG_DIR/config` when set). `fabricctl ai login` saves its token in the current
  context and warns when an exported `FABRIC_TOKEN` overrides it.
- Every read takes `-o json|yaml|wide|name`; `--json` is `-o json`. `-h` on every command.
- Plural, singular and short names: `models`/`mo`, `profiles`/`pr`, `deployments`/`dep`,
  `endpoints`/`ep`, `nodes`/`no`, `replicas`/`rep`, `keys`, `ls` for `list`.
- `--wait [--timeout S]` on deploy, scale, expose and delete; `-w` on `get` and `events`
  follow the store watch (one long poll open, no polling loop).
- Shell completion: `source <(fabricctl completion bash)` (zsh and fish likewise).

## Exit status

| status | meaning |
|---|---|
| 0 | done |
| 1 | refused: fabricd answered with an error (not found, in use, invalid, a wait that timed out) |
| 2 | usage or configuration: a bad flag, variable (`FABRIC_URL`, `FABRIC_CA`, ...) or config file |
| 3 | unreachable: fabricd did not answer, or its certificate could not be verified |

fabricd, fabric-agent and fabric-gateway use the same statuses for their own start-up mistakes.
Nothing prints a Python traceback for a mistake; `FABRIC_DEBUG=1` shows one for a bug.

## Commands
"""


def _ctx(command, name: str, parent=None):
    return typer.Context(command, info_name=name, parent=parent, terminal_width=WIDTH, max_content_width=WIDTH,
                         help_option_names=HELP_NAMES)


def walk(command=None, path: tuple[str, ...] = ("fabricctl",), parent=None) -> Iterator[tuple[str, object, object]]:
    """(command path, command, its context) for every command and group, depth first."""
    from fabricctl import build_command

    command = command if command is not None else build_command()
    ctx = _ctx(command, path[-1], parent)
    yield " ".join(path), command, ctx
    subs = getattr(command, "commands", None)
    if subs:
        for name in command.list_commands(ctx):
            yield from walk(subs[name], (*path, name), ctx)


def render_reference() -> str:
    parts = [HEADER]
    for path, command, ctx in walk():
        parts.append(f"\n### {path}\n\n```text\n{command.get_help(ctx).rstrip()}\n```\n")
    return "".join(parts)


def missing_help() -> list[str]:
    """Commands, arguments and options without help text."""
    missing = []
    for path, command, _ in walk():
        if not (command.help or "").strip() and not (getattr(command, "short_help", None) or "").strip():
            missing.append(f"{path}: no help text")
        for p in command.params:
            if p.name in ("help",) or getattr(p, "hidden", False):
                continue
            if not (getattr(p, "help", None) or "").strip():
                missing.append(f"{path}: {'/'.join(getattr(p, 'opts', [p.name]))} has no help")
    return missing
