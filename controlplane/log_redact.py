"""Secrets that travel in a URL never reach fabricd's access log.

The admission webhook (POST /api/ai/admit/{token}) carries FABRIC_ADMIT_TOKEN in its path,
because a Kubernetes webhook configuration can name a URL but no header. uvicorn's access log
writes every path; ``SecretPathFilter`` (installed on the "uvicorn.access" logger when the app
starts) rewrites such paths to ``/api/ai/admit/<redacted>`` before any handler sees them.
"""

from __future__ import annotations

import logging
import re

ACCESS_LOGGER = "uvicorn.access"
_SECRET_PATHS = re.compile(r"(/api/ai/admit/)[^?\s\"]*")


def redact(text: str) -> str:
    return _SECRET_PATHS.sub(r"\1<redacted>", text)


class SecretPathFilter(logging.Filter):
    """Redacts secret path segments in a record's message arguments (uvicorn passes the path as
    an argument) and in its message."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(redact(a) if isinstance(a, str) else a for a in record.args)
        if isinstance(record.msg, str):
            record.msg = redact(record.msg)
        return True


def install() -> None:
    logger = logging.getLogger(ACCESS_LOGGER)
    if not any(isinstance(f, SecretPathFilter) for f in logger.filters):
        logger.addFilter(SecretPathFilter())
