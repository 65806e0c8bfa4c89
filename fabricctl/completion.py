"""`fabricctl completion bash|zsh|fish`: print the shell completion script (click's).

    source <(fabricctl completion bash)            # this shell
    fabricctl completion bash > /etc/bash_completion.d/fabricctl
"""

from __future__ import annotations

from enum import Enum

import typer
import typer.completion

COMPLETE_VAR = "_FABRICCTL_COMPLETE"


class Shell(str, Enum):
    bash = "bash"
    zsh = "zsh"
    fish = "fish"


def completion(ctx: typer.Context,
               shell: Shell = typer.Argument(..., metavar="SHELL", help="bash, zsh or fish")) -> None:
    """Print the completion script for SHELL (source it, or save it where the shell looks)."""
    typer.completion.completion_init()
    root = ctx.find_root().command  # the whole fabricctl command this one was reached through
    code = typer.completion.shell_complete(root, {}, "fabricctl", COMPLETE_VAR, f"source_{shell.value}")
    raise typer.Exit(code)
