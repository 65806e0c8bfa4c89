"""The environment an engine process started on the agent's own host gets: never the agent's.

The agent's environment holds its secrets (HF_TOKEN for model fetches, FABRIC_* keys and
tokens); an engine is the tenant's code path, so it gets only what it needs to run: the
search path, locale and Python's own variables (``ENGINE_ENV_KEEP``). The real lab engine has a
stricter list of its own (agent.vm.lab_engine.real_engine_env).

The one read of the agent's own environment outside agent/settings.py: a child's environment
passed through, cut to ENGINE_ENV_KEEP where the child starts (tests/common/test_settings_only_read_env.py).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

ENGINE_ENV_KEEP = ("PATH", "LANG", "LC_ALL", "TZ", "HOME", "PYTHONPATH", "VIRTUAL_ENV")


def engine_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """``base`` (default: this process's environment) cut to ENGINE_ENV_KEEP, unbuffered output."""
    base = os.environ if base is None else base
    env = {k: base[k] for k in ENGINE_ENV_KEEP if k in base}
    env["PYTHONUNBUFFERED"] = "1"
    return env
