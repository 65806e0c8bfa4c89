"""`fabricctl config ...`: named contexts in ~/.config/fabric/config, like kubectl's.

    config get-contexts                     every context; `*` marks the current one
    config current-context                  its name
    config use-context NAME                 make NAME current
    config set-context NAME [--url U] [--ca F] [--token-file F] [--use]
                                            create or update NAME (only the given fields change)
    config delete-context NAME
    config view                             the file, tokens shown as REDACTED
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import typer

from fabricctl.contexts import ConfigError, ConfigFile, Context, check_ca, check_url, load, save
from fabricctl.output import col, emit_json, emit_table, fail
from fabricctl.settings import current

config_app = typer.Typer(help="Named contexts (fabricd URL, CA, token) in ~/.config/fabric/config.",
                         no_args_is_help=True)
JSON_OPT = typer.Option(False, "--json", help="print JSON for scripts")


def _load() -> ConfigFile:
    try:
        return load(current().config_path)
    except ConfigError as exc:
        fail(str(exc), 2)


def _rows(cfg: ConfigFile) -> list[dict]:
    return [{"current": "*" if name == cfg.current else "", "name": name, "url": c.url or "", "ca": c.ca or "",
             "token": "yes" if c.token else "no"} for name, c in sorted(cfg.contexts.items())]


@config_app.command("get-contexts")
def get_contexts(as_json: bool = JSON_OPT) -> None:
    """List the contexts; `*` marks the current one."""
    emit_table(_rows(_load()), [col("CURRENT", "current"), col("NAME", "name"), col("URL", "url"),
                                col("CA", "ca"), col("TOKEN", "token")], as_json, kind="context")


@config_app.command("current-context")
def current_context() -> None:
    """Print the current context's name."""
    cfg = _load()
    if not cfg.current:
        fail(f"no current context in {cfg.path}; `fabricctl config use-context NAME`", 1)
    typer.echo(cfg.current)


@config_app.command("use-context")
def use_context(name: str = typer.Argument(..., metavar="NAME", help="a context from `fabricctl config get-contexts`")) -> None:
    """Make NAME the current context."""
    cfg = _load()
    if name not in cfg.contexts:
        fail(f"context {name!r} is not in {cfg.path} (known: {', '.join(sorted(cfg.contexts)) or 'none'}); "
             "create it with `fabricctl config set-context`", 1)
    cfg.current = name
    save(cfg)
    typer.echo(f"switched to context {name}")


@config_app.command("set-context")
def set_context(
    name: str = typer.Argument(..., metavar="NAME", help="context name"),
    url: str = typer.Option(None, "--url", help="fabricd URL, https://HOST:PORT"),
    ca: str = typer.Option(None, "--ca", help="CA file that signed fabricd's certificate"),
    token_file: Path = typer.Option(None, "--token-file", help="store the token read from this file"),
    use: bool = typer.Option(False, "--use", help="also make it the current context"),
) -> None:
    """Create or update a context; only the fields given change."""
    cfg = _load()
    try:
        updates = {"url": check_url(url, "--url") if url else None,
                   "ca": str(check_ca(ca, "--ca").resolve()) if ca else None}
        if token_file is not None:
            updates["token"] = token_file.read_text().strip() or None
    except ConfigError as exc:
        fail(str(exc), 2)
    except OSError as exc:
        fail(f"--token-file {token_file}: {exc.strerror}", 2)
    ctx = cfg.contexts.get(name, Context())
    cfg.contexts[name] = dataclasses.replace(ctx, **{k: v for k, v in updates.items() if v is not None})
    if use or cfg.current is None:
        cfg.current = name
    save(cfg)
    typer.echo(f"context {name} set" + (" (current)" if cfg.current == name else ""))


@config_app.command("delete-context")
def delete_context(name: str = typer.Argument(..., metavar="NAME", help="context name")) -> None:
    """Remove a context (and unset it when it was current)."""
    cfg = _load()
    if cfg.contexts.pop(name, None) is None:
        fail(f"context {name!r} is not in {cfg.path}", 1)
    if cfg.current == name:
        cfg.current = None
    save(cfg)
    typer.echo(f"context {name} deleted")


@config_app.command("view")
def view(as_json: bool = JSON_OPT) -> None:
    """The config file with tokens shown as REDACTED."""
    cfg = _load()
    emit_json({"current-context": cfg.current, "path": str(cfg.path),
               "contexts": {n: {**c.as_dict(), **({"token": "REDACTED"} if c.token else {})}
                            for n, c in sorted(cfg.contexts.items())}})
