"""Shared pieces of the model tests: a loopback HF mirror of tiny models and a job waiter."""

from __future__ import annotations

import contextlib
from pathlib import Path

from agent.models.cache import ModelCache
from agent.models.jobs import ModelJobs, ModelSettings
from common.model_api import AgentJobRequest
from lab.hf_mirror import HfMirror, MirrorConfig
from lab.rigs.polling import wait_for
from lab.tiny_model import write_tiny_model

REPO = "fab/tiny"


@contextlib.contextmanager
def mirror(tmp: Path, *, gated: dict[str, str] | None = None, rate: float | None = None, **tiny):
    root = tmp / "mirror"
    write_tiny_model(root / REPO, **tiny)
    with HfMirror(MirrorConfig(root, gated=gated or {}, rate=rate)) as m:
        yield m


def jobs_for(tmp: Path, endpoint: str, **overrides) -> ModelJobs:
    env = {"HF_ENDPOINT": endpoint, **overrides.pop("env", {})}
    settings = ModelSettings(env=env, retry_base_s=0.01, model_dir=str(tmp / "srv-models"), **overrides)
    return ModelJobs(ModelCache(tmp / "state" / "models"), settings)


def request(source: str = f"hf://{REPO}", job: str = "tiny.node-a", **kw) -> AgentJobRequest:
    return AgentJobRequest(job_id=job, model=job.split(".")[0], source=source, **kw)


def finish(jobs: ModelJobs, job_id: str, timeout: float = 30):
    return wait_for(lambda: (v := jobs.view(job_id)) and v.state in ("Ready", "Failed") and v, timeout,
                    f"job {job_id} to finish")


def states(view) -> list[str]:
    return [t.state for t in view.history]
