"""Named contexts, like kubeconfig: where fabricd is, which CA signed it, and the token to use.

The file is YAML at $FABRIC_CONFIG_DIR/config, else $XDG_CONFIG_HOME/fabric/config, else
~/.config/fabric/config (fabricctl.settings), written 0600 (it holds tokens):

    current-context: lab
    contexts:
      lab:
        url: https://127.0.0.1:8443
        ca: /var/lib/fabric/lab/fabricd/pki/ca.crt
        token: ...          # written by `fabricctl ai login`

Each setting is resolved flag > environment > context > default (`resolve`, a pure function of
the run's settings and the file):

    url    --server            FABRIC_URL      context url     https://127.0.0.1:8443
    ca     --ca                FABRIC_CA       context ca      the system's trust store
    token  --token-file        FABRIC_TOKEN    context token   none
    which  --context           FABRIC_CONTEXT  current-context

A bad value (a URL that is not http(s)://HOST[:PORT], a CA file that does not exist, a context
that is not in the file, a file that is not YAML) is a ConfigError naming where it came from.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import yaml

from fabricctl.settings import CtlSettings

DEFAULT_URL = "https://127.0.0.1:8443"
DEFAULT_CONTEXT = "default"


class ConfigError(Exception):
    """A setting fabricctl cannot use; the message names the flag, variable or file."""


@dataclass(frozen=True)
class Context:
    url: str | None = None
    ca: str | None = None
    token: str | None = field(default=None, repr=False)

    def as_dict(self) -> dict:
        return {k: v for k, v in (("url", self.url), ("ca", self.ca), ("token", self.token)) if v}


@dataclass
class ConfigFile:
    path: Path
    current: str | None = None
    contexts: dict[str, Context] = field(default_factory=dict)


@dataclass(frozen=True)
class Resolved:
    url: str
    ca: Path | None
    token: str | None = field(repr=False)
    context: str | None
    token_source: str  # "flag", "env", "context" or "none": decides the hint on a 401
    config_path: Path


def load(path: Path) -> ConfigFile:
    if not path.exists():
        return ConfigFile(path)
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read the fabricctl config {path}: {getattr(exc, 'strerror', None) or exc}; "
                          "fix or remove it") from None
    if not isinstance(data, dict) or not isinstance(data.get("contexts", {}), dict):
        raise ConfigError(f"{path} is not a fabricctl config (expected `contexts:` as a mapping); fix or remove it")
    contexts = {}
    for name, value in (data.get("contexts") or {}).items():
        value = value if isinstance(value, dict) else {}
        contexts[str(name)] = Context(url=value.get("url"), ca=value.get("ca"), token=value.get("token"))
    return ConfigFile(path, data.get("current-context"), contexts)


def save(cfg: ConfigFile) -> None:
    """Write the file 0600 from creation, replacing it in one rename."""
    cfg.path.parent.mkdir(parents=True, exist_ok=True)
    data = {"current-context": cfg.current,
            "contexts": {name: ctx.as_dict() for name, ctx in sorted(cfg.contexts.items())}}
    tmp = cfg.path.with_name(cfg.path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        yaml.safe_dump(data, f, sort_keys=False)
    os.replace(tmp, cfg.path)


def check_url(url: str, source: str) -> str:
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError:
        parts = urlsplit("")
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"{source} {url!r} is not a URL fabricctl can use; expected https://HOST:PORT "
                          f"(e.g. {DEFAULT_URL})")
    return url.rstrip("/")


def check_ca(ca: str, source: str) -> Path:
    path = Path(ca).expanduser()
    if not path.is_file():
        raise ConfigError(f"{source} names {path}, which does not exist; point it at the cluster CA "
                          "(STATE_DIR/pki/ca.crt of `fabricd init`)")
    return path


def _pick(flag: str | None, flag_name: str, env_value: str | None, var: str, ctx_value: str | None,
          ctx_name: str | None, path: Path) -> tuple[str | None, str, str]:
    """(value, source kind, source words) by precedence flag > env > context."""
    if flag:
        return flag, "flag", flag_name
    if env_value:
        return env_value, "env", var
    if ctx_value:
        return ctx_value, "context", f"context {ctx_name!r} in {path}"
    return None, "none", ""


def resolve(settings: CtlSettings, cfg: ConfigFile) -> Resolved:
    """The URL, CA and token to use: each from its flag, else its variable, else the context
    (the flags and variables as `settings` holds them)."""
    flags = settings.flags
    name = flags.context or settings.context or cfg.current
    ctx = cfg.contexts.get(name) if name else None
    if name and ctx is None and (flags.context or settings.context):
        known = ", ".join(sorted(cfg.contexts)) or "none"
        raise ConfigError(f"context {name!r} is not in {cfg.path} (known: {known}); "
                          "see `fabricctl config get-contexts`")
    ctx = ctx or Context()
    url, _, url_src = _pick(flags.server, "--server", settings.url, "FABRIC_URL", ctx.url, name, cfg.path)
    url = check_url(url, url_src) if url else DEFAULT_URL
    ca, _, ca_src = _pick(flags.ca, "--ca", settings.ca, "FABRIC_CA", ctx.ca, name, cfg.path)
    token_flag = None
    if flags.token_file:
        try:
            token_flag = Path(flags.token_file).read_text().strip() or None
        except OSError as exc:
            raise ConfigError(f"--token-file {flags.token_file}: {exc.strerror}") from None
    token, token_src, _ = _pick(token_flag, "--token-file", settings.token, "FABRIC_TOKEN", ctx.token, name,
                                cfg.path)
    return Resolved(url=url, ca=check_ca(ca, ca_src) if ca else None, token=token, context=name,
                    token_source=token_src, config_path=cfg.path)
