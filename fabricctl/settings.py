"""Every variable fabricctl reads, read once at start; nothing else in fabricctl reads os.environ.

`main` calls `load()` and makes the object this run's (`use`); the root callback adds the global
flags (--context, --server, --ca, --token-file), and a command gets the one handle with `current()`.

    FABRIC_URL, FABRIC_CA, FABRIC_CONTEXT, FABRIC_TOKEN   where fabricd is and how to authenticate
                                                          (flag > these > context: contexts.resolve)
    FABRIC_CONFIG_DIR, XDG_CONFIG_HOME, HOME              where the contexts file is
    FABRIC_PASSWORD                                       `ai login`'s password (else a prompt)
    FABRIC_NEW_PASSWORD                                   `ai user add`'s password (else a prompt)
    FABRIC_DEBUG                                          an unexpected failure shows its traceback

The token and the passwords are kept out of repr (so out of any log or error that prints the
object); they leave this object only in a request body or the Authorization header.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from pathlib import Path


@dataclass(frozen=True)
class Flags:
    """The root command's flags; each beats its variable (contexts.resolve)."""

    context: str | None = None  # --context
    server: str | None = None  # --server
    ca: str | None = None  # --ca
    token_file: str | None = None  # --token-file (a path; the token itself never is a flag)


@dataclass(frozen=True)
class CtlSettings:
    config_path: Path  # the contexts file
    url: str | None = None  # FABRIC_URL
    ca: str | None = None  # FABRIC_CA
    context: str | None = None  # FABRIC_CONTEXT
    token: str | None = field(default=None, repr=False)  # FABRIC_TOKEN
    password: str | None = field(default=None, repr=False)  # FABRIC_PASSWORD
    new_password: str | None = field(default=None, repr=False)  # FABRIC_NEW_PASSWORD
    debug: bool = False  # FABRIC_DEBUG
    flags: Flags = field(default_factory=Flags)

    def with_flags(self, flags: Flags) -> CtlSettings:
        return replace(self, flags=flags)


def config_path(env: Mapping[str, str]) -> Path:
    """$FABRIC_CONFIG_DIR/config, else $XDG_CONFIG_HOME/fabric/config, else ~/.config/fabric/config."""
    if env.get("FABRIC_CONFIG_DIR"):
        return Path(env["FABRIC_CONFIG_DIR"]) / "config"
    if env.get("XDG_CONFIG_HOME"):
        return Path(env["XDG_CONFIG_HOME"]) / "fabric" / "config"
    return Path(env.get("HOME") or "~").expanduser() / ".config" / "fabric" / "config"


def load(env: Mapping[str, str] | None = None) -> CtlSettings:
    """The settings from `env` (the process environment when None). An empty variable is unset.
    Values are checked where their source is weighed against the flags and the context
    (contexts.resolve), so a bad FABRIC_URL under a good --server is no error, as before."""
    env = os.environ if env is None else env
    return CtlSettings(
        config_path=config_path(env),
        url=env.get("FABRIC_URL") or None,
        ca=env.get("FABRIC_CA") or None,
        context=env.get("FABRIC_CONTEXT") or None,
        token=env.get("FABRIC_TOKEN") or None,
        password=env.get("FABRIC_PASSWORD") or None,
        new_password=env.get("FABRIC_NEW_PASSWORD") or None,
        debug=bool(env.get("FABRIC_DEBUG")),
    )


_CURRENT: ContextVar[CtlSettings | None] = ContextVar("fabricctl_settings", default=None)


def use(settings: CtlSettings) -> None:
    """Make `settings` this run's: `main` with what `load` read, the root callback with its flags."""
    _CURRENT.set(settings)


def current() -> CtlSettings:
    """The settings of this run (see `use`)."""
    found = _CURRENT.get()
    if found is None:
        raise RuntimeError("fabricctl's settings are missing: run the commands through fabricctl.main")
    return found
