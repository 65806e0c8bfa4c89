"""Engines for these tests run as real child processes on loopback (EngineProcess)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from enginesim.process import EngineProcess


@pytest.fixture(scope="module")
def fast_engine() -> Iterator[EngineProcess]:
    """No artificial waits: the configuration benchmarks use."""
    with EngineProcess.start(
        ["--model", "sim-m", "--replica-id", "replica-a", "--tokens-per-s", "0", "--prefill-tokens-per-s", "0",
         "--max-model-len", "512", "--embedding-dim", "32"]
    ) as engine:
        yield engine
