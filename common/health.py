"""One /healthz shape for fabricd, fabric-agent and fabric-gateway, and probe logs at DEBUG.

    GET /healthz -> 200 {"status": "ok", "component": "fabricd", "version": "0.1.0",
                         "checks": {"store": "ok", ...}}
                    503 with "status": "degraded" when a check fails (its value says why)

Probes (health checks and scrapes) arrive every few seconds from several places; logged at INFO
they drown what matters. `quiet_probes()` makes the request logs of uvicorn (access) and httpx
(fabricd's replica probes and scrapes) for probe paths DEBUG: shown only with --log-level debug.
"""

from __future__ import annotations

import logging
from importlib.metadata import PackageNotFoundError, version

PROBE_PATHS = ("/healthz", "/health", "/v1/health", "/metrics", "/ping")
PROBE_LOGGERS = ("uvicorn.access", "httpx")


def component_version() -> str:
    try:
        return version("fabric")
    except PackageNotFoundError:
        return "unknown"


def healthz_body(component: str, checks: dict[str, str] | None = None) -> tuple[int, dict]:
    """(HTTP status, body): ok while every check says "ok[: detail]" or "off[: why]" (not in use)."""
    checks = dict(checks or {})
    ok = all(v.startswith(("ok", "off")) for v in checks.values())
    return (200 if ok else 503), {"status": "ok" if ok else "degraded", "component": component,
                                  "version": component_version(), "checks": checks}


def is_probe(message: str) -> bool:
    """True for a request log line about a probe path ("GET /healthz HTTP/1.1" or a URL)."""
    for path in PROBE_PATHS:
        for end in (" ", '"', "?"):
            if f"{path}{end}" in message or message.endswith(path):
                return True
    return False


class ProbeFilter(logging.Filter):
    """Demote probe request lines to DEBUG: dropped unless the root logger shows DEBUG."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno > logging.DEBUG and is_probe(record.getMessage()):
            if logging.getLogger().getEffectiveLevel() > logging.DEBUG:
                return False
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return True


def quiet_probes() -> None:
    """Install ProbeFilter on the request loggers (idempotent)."""
    for name in PROBE_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, ProbeFilter) for f in logger.filters):
            logger.addFilter(ProbeFilter())
