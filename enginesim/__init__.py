"""The simulated vLLM engine (`fabric-engine-sim`).

A product component: the lab runs one in every replica namespace, the agent's
dry-run driver runs one per replica on loopback, and gateway/routing tests and
benchmarks use it as the upstream. It speaks the OpenAI routes vLLM serves, exports
vLLM's metric names, and behaves like an engine: a bounded set of running sequences,
a FIFO wait queue, prefill time that grows with the prompt, a per-sequence token rate
and a KV-cache usage that follows the tokens held by running sequences.

In-process use:

    from enginesim import EngineConfig, create_app, run
    app = create_app(EngineConfig(model="m", tokens_per_s=0))
"""

from enginesim.app import create_app
from enginesim.config import EngineConfig, Faults, SyntheticLoad
from enginesim.server import run

__all__ = ["EngineConfig", "Faults", "SyntheticLoad", "create_app", "run"]
