"""The last guard of every Fabric console script: no traceback for a user mistake or an
unreachable peer, one line `error: ...` instead, with the documented exit status:

    1  refused: the request or the operation was refused (a FabricError, an unexpected failure)
    2  usage or configuration: a bad flag, variable, or a file that cannot be read or written
    3  unreachable: a peer (etcd, fabricd, an agent) did not answer (TransientError)

A click/typer usage error keeps its own message and exit 2. FABRIC_DEBUG=1 re-raises, so a
developer still gets the traceback. Messages never include secrets: an exception's text is
printed, and Fabric's exceptions are written never to hold one.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

from common.errors import FabricError, TransientError

EXIT_REFUSED, EXIT_USAGE, EXIT_UNREACHABLE = 1, 2, 3


def describe(exc: BaseException) -> tuple[str, int]:
    """(one-line message, exit status) for an exception that reached the top."""
    if isinstance(exc, TransientError):
        return f"{exc.message}; is it running and reachable?", EXIT_UNREACHABLE
    if isinstance(exc, FabricError):
        return exc.message, EXIT_REFUSED
    if isinstance(exc, OSError) and exc.filename:
        what = exc.strerror or type(exc).__name__
        target = f"{exc.filename} -> {exc.filename2}" if exc.filename2 else str(exc.filename)
        return f"{target}: {what}; check the path and its permissions", EXIT_USAGE
    if isinstance(exc, (ConnectionError, TimeoutError)):
        return f"{type(exc).__name__}: {exc}", EXIT_UNREACHABLE
    text = str(exc).splitlines()[0] if str(exc) else ""
    return (f"unexpected {type(exc).__name__}{': ' + text if text else ''} "
            "(FABRIC_DEBUG=1 shows the traceback)"), EXIT_REFUSED


def run_guarded(main: Callable[[], object], prog: str) -> None:
    """Run a console script's main; turn anything it raises into one line and an exit status."""
    try:
        main()
    except SystemExit:
        raise
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as exc:
        if os.environ.get("FABRIC_DEBUG"):
            raise
        message, code = describe(exc)
        print(f"error: {prog}: {message}", file=sys.stderr)
        sys.exit(code)
