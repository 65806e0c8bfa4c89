"""The shared /healthz body and the probe log filter (plain logging, no server)."""

from __future__ import annotations

import logging

import pytest

from common.health import ProbeFilter, healthz_body, is_probe


def test_body_shape_and_degraded_status():
    status, body = healthz_body("fabricd", {"store": "ok", "controllers": "off"})
    assert status == 200 and set(body) == {"status", "component", "version", "checks"}
    assert body["status"] == "ok" and body["component"] == "fabricd"
    status, body = healthz_body("fabricd", {"store": "failed: TransientError"})
    assert (status, body["status"]) == (503, "degraded")


@pytest.mark.parametrize("line, probe", [
    ('127.0.0.1:5 - "GET /healthz HTTP/1.1" 200', True),
    ('HTTP Request: GET http://10.244.0.5:8000/health "HTTP/1.1 200 OK"', True),
    ('HTTP Request: GET http://10.244.0.5:8000/metrics "HTTP/1.1 200 OK"', True),
    ('127.0.0.1:5 - "POST /api/ai/deployments HTTP/1.1" 201', False),
    ('127.0.0.1:5 - "GET /api/ai/models/healthzilla HTTP/1.1" 200', False),
])
def test_what_counts_as_a_probe(line, probe):
    assert is_probe(line) is probe


def test_probe_lines_are_debug(caplog):
    logger = logging.getLogger("test.probes")
    logger.addFilter(ProbeFilter())
    root = logging.getLogger()
    old = root.level
    try:
        root.setLevel(logging.INFO)
        with caplog.at_level(logging.INFO):
            logger.info('"GET /healthz HTTP/1.1" 200')
            logger.info('"POST /api/ai/models HTTP/1.1" 201')
        assert [r.getMessage() for r in caplog.records] == ['"POST /api/ai/models HTTP/1.1" 201']
        caplog.clear()
        root.setLevel(logging.DEBUG)
        with caplog.at_level(logging.DEBUG):
            logger.info('"GET /healthz HTTP/1.1" 200')
        assert [(r.levelname, r.getMessage()) for r in caplog.records] == [("DEBUG", '"GET /healthz HTTP/1.1" 200')]
    finally:
        root.setLevel(old)
