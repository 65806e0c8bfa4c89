"""Reading the agent's long operations in tests that call its HTTP API directly: a bind,
release, VM create or delete answers 202 with an operation (agent/operations.py)."""

from __future__ import annotations

import httpx

from lab.rigs.polling import wait_for


def finished(client: httpx.Client, started: httpx.Response, timeout: float = 30) -> dict:
    """The operation ``started`` (a 202) once it is no longer running, as JSON."""
    assert started.status_code == 202, started.text
    op_id = started.json()["id"]

    def done():
        op = client.get(f"/v1/operations/{op_id}").json()
        return op if op["state"] != "running" else None

    return wait_for(done, timeout, f"operation {op_id}", interval=0.02)
