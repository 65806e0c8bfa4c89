"""The guest's engine unit for any runtime, rendered from common.runtimes' table.

cloud_init decides the model path inside the guest and the tensor-parallel size; this module
only turns (runtime, model path, served name, port, TP, context length, extra flags) into the
systemd unit text. Every value is shell-quoted into ExecStart, and a flag that carries a
credential, or any newline, is refused: a guest image never holds a secret.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from common.errors import InvalidInput
from common.runtimes import runtime

SECRET_FLAGS = ("--api-key", "--hf-token", "--token")
UNIT_NAME = "fabric-engine.service"
TEMPLATE = "guest/engine.service.in"
_PLACEHOLDER = re.compile(r"@[A-Z_]+@")


def check_extra_args(extra_args: tuple[str, ...] | list[str]) -> None:
    for arg in extra_args:
        if "\n" in arg or any(arg == f or arg.startswith(f + "=") for f in SECRET_FLAGS):
            raise InvalidInput(
                f"extra_args: {arg.split('=', 1)[0]!r} is not allowed in a guest image "
                "(no credentials or newlines in engine flags)"
            )


def exec_start(runtime_name: str, *, model_path: str, served_name: str, port: int, tensor_parallel: int,
               max_model_len: int | None = None, extra_args: tuple[str, ...] = ()) -> str:
    check_extra_args(extra_args)
    try:
        argv = runtime(runtime_name).command_line(
            model_path=model_path, served_name=served_name, port=port, tensor_parallel=tensor_parallel,
            max_model_len=max_model_len, extra_args=tuple(extra_args))
    except ValueError as exc:
        raise InvalidInput(str(exc)) from None
    return " ".join(shlex.quote(a) for a in argv)


def render_unit(images_dir: Path, runtime_name: str, *, model_path: str, served_name: str, port: int,
                tensor_parallel: int, max_model_len: int | None = None,
                extra_args: tuple[str, ...] = (), environment: dict[str, str] | None = None,
                mounts: tuple[str, ...] = ("/models",)) -> str:
    """``environment``: extra Environment= lines (names and values we write, never the caller's).
    ``mounts``: the shares each start checks first (ExecStartPre=mountpoint -q)."""
    rt = runtime(runtime_name)
    env_lines = "\n".join(f"Environment={shlex.quote(f'{k}={v}')}" for k, v in sorted((environment or {}).items()))
    values = {
        "@DESCRIPTION@": rt.description,
        "@RUNTIME@": rt.name,
        "@USER@": rt.service_user,
        # systemd does its own word splitting; the quotes shlex adds are the ones it honours.
        "@EXEC_START@": exec_start(runtime_name, model_path=model_path, served_name=served_name, port=port,
                                   tensor_parallel=tensor_parallel, max_model_len=max_model_len,
                                   extra_args=extra_args),
        "@SERVED_NAME@": served_name.replace("\n", " "),
        "@ENVIRONMENT@": env_lines,
        "@MOUNT_CHECKS@": "\n".join(f"ExecStartPre=/usr/bin/mountpoint -q {shlex.quote(m)}" for m in mounts),
    }
    text = (images_dir / TEMPLATE).read_text()
    # One pass, so a value that happens to contain "@USER@" is left as written.
    return _PLACEHOLDER.sub(lambda m: values.get(m.group(0), m.group(0)), text)
