"""The simulated vLLM engine (`fabric-engine-sim`).

A product component: the lab runs one in every replica namespace, the agent's
dry-run driver runs one per replica on loopback, and gateway/routing tests and
benchmarks use it as the upstream. It speaks the OpenAI routes vLLM serves, exports
vLLM's metric names, and behaves like an engine: a bounded set of running sequences,
a FIFO wait queue, prefill time that grows with the prompt, a per-sequence token rate
and a KV-cache usage that follows the tokens held by running sequences.

In-process use:

    from enginesim import EngineSettings, create_app, run
    app = create_app(EngineSettings(model="m", tokens_per_s=0))
"""

from enginesim.app import create_app
from enginesim.server import run
from enginesim.settings import EngineSettings, Faults, SyntheticLoad

__all__ = ["EngineSettings", "Faults", "SyntheticLoad", "create_app", "run"]
