"""The environment an engine process started on the agent's own host gets: never the agent's.

The agent's environment holds its secrets (HF_TOKEN for model fetches, FABRIC_* keys and
tokens); an engine is the tenant's code path, so it gets only what it needs to run: the
search path, locale and Python's own variables (``ENGINE_ENV_KEEP``). The real lab engine has a
stricter list of its own (agent.vm.lab_engine.real_engine_env).
"""

from __future__ import annotations

from collections.abc import Mapping

ENGINE_ENV_KEEP = ("PATH", "LANG", "LC_ALL", "TZ", "HOME", "PYTHONPATH", "VIRTUAL_ENV")


def engine_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """``base`` (default: this process's environment) cut to ENGINE_ENV_KEEP, unbuffered output."""
    if base is None:
        from agent.settings import inherited_env  # the one module that reads the agent's environment

        env = inherited_env(ENGINE_ENV_KEEP)
    else:
        env = {k: base[k] for k in ENGINE_ENV_KEEP if k in base}
    env["PYTHONUNBUFFERED"] = "1"
    return env
