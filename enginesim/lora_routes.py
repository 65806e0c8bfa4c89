"""vLLM's runtime LoRA API, as the simulator serves it (vLLM with --enable-lora and
VLLM_ALLOW_RUNTIME_LORA_UPDATING=True):

  POST /v1/load_lora_adapter    {"lora_name", "lora_path"}  200 text; 400 when already loaded, 404 no such path
  POST /v1/unload_lora_adapter  {"lora_name"}               200 text; 404 when not loaded

A loaded adapter is a model name for the generate and pooling routes and is listed by
GET /v1/models with ``parent`` = the base model. ``--max-loras N`` bounds the adapters loaded
at once (a load past it is refused 400: the gateway must unload one first, which is what it is
tested for); ``loads`` and ``unloads`` count in /sim/state.

Like vLLM, a load reads the adapter's files: ``lora_path`` must be a directory holding
``adapter_config.json``, else 404 NotFoundError "No adapter found" (vLLM 0.32's answer). A lab or dry-run replica has no guest
mount, so ``--lora-root DIR`` says what it sees as /adapters (the agent passes the adapter set,
agent.models.adapter_sets): ``/adapters/NAME`` is read from ``DIR/NAME``, and any other path,
or one with ``..``, is not found. A fetch that never happened therefore fails the load loudly.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from enginesim.http_util import bad_request, openai_error

MAX_NAME = 256
GUEST_ROOT = "/adapters"


@dataclass
class LoraState:
    max_loras: int
    loaded: dict[str, str] = field(default_factory=dict)  # name -> path, in load order
    loads: int = 0
    unloads: int = 0
    root: str | None = None  # what this replica sees as /adapters

    def files(self, lora_path: str) -> Path | None:
        """The adapter directory ``lora_path`` names here, when it holds an adapter_config.json."""
        if self.root is not None:
            rest = lora_path.removeprefix(GUEST_ROOT + "/")
            parts = rest.split("/")
            if rest == lora_path or any(p in ("", ".", "..") for p in parts) or "\x00" in rest:
                return None
            path = Path(self.root, *parts)
        else:
            path = Path(lora_path)
        try:
            return path if (path / "adapter_config.json").is_file() else None
        except (OSError, ValueError):
            return None


async def _body(request: Request) -> dict | None:
    try:
        data = json.loads(await request.body())
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def make_lora_routes(state: LoraState) -> list[Route]:
    async def load(request: Request) -> Response:
        data = await _body(request)
        name, path = (data or {}).get("lora_name"), (data or {}).get("lora_path")
        if not isinstance(name, str) or not name or len(name) > MAX_NAME or not isinstance(path, str) or not path:
            return bad_request("lora_name and lora_path must be non-empty strings", "lora_name")
        if name in state.loaded:
            return openai_error(400, f"The lora adapter '{name}' has already been loaded.", "InvalidUserInput",
                                "invalid_value", "lora_name")
        if state.files(path) is None:
            return openai_error(404, f"Loading lora {name} failed: No adapter found for {path}",
                                "NotFoundError", "model_not_found", "lora_path")
        if len(state.loaded) >= state.max_loras:
            return openai_error(400, f"max_loras ({state.max_loras}) adapters are loaded; unload one first",
                                "BadRequestError", "invalid_value", "lora_name")
        state.loaded[name] = path
        state.loads += 1
        return PlainTextResponse(f"Success: LoRA adapter '{name}' added successfully.")

    async def unload(request: Request) -> Response:
        data = await _body(request)
        name = (data or {}).get("lora_name")
        if not isinstance(name, str) or name not in state.loaded:
            return openai_error(404, f"The lora adapter '{name}' cannot be found.", "NotFoundError",
                                "model_not_found", "lora_name")
        del state.loaded[name]
        state.unloads += 1
        return PlainTextResponse(f"Success: LoRA adapter '{name}' removed successfully.")

    return [Route("/v1/load_lora_adapter", load, methods=["POST"]),
            Route("/v1/unload_lora_adapter", unload, methods=["POST"])]
