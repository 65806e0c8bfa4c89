"""The gateway's refusals as OpenAI answers them, so the official SDKs raise the same exception
classes they raise against OpenAI (openai-python maps the status alone: 400 BadRequestError,
401 AuthenticationError, 403 PermissionDeniedError, 404 NotFoundError, 409 ConflictError,
413 APIStatusError, 429 RateLimitError, 5xx InternalServerError).

- A request that cannot be served as written (a prompt, max_tokens or context over a cap, a
  request bigger than its minute's token allowance) is 400 ``invalid_request_error`` with a
  stable ``code`` (``context_length_exceeded`` for the context, as OpenAI's): frameworks that
  detect a context overflow look for a BadRequestError with that code. 413 is kept for a body
  over FABRIC_GATEWAY_MAX_BODY only.
- Fabric's own 422 (InvalidInput: a bad header value, a missing model) is 400 at the gateway:
  OpenAI answers every malformed request with 400.
"""

from __future__ import annotations

from common.errors import FabricError, Refused


class RequestTooLarge(Refused):
    """400: prompt/max_tokens/context over a configured cap, or over the key's whole minute."""

    code = "context_length_exceeded"


def openai_status(exc: FabricError) -> int:
    return 400 if exc.status == 422 else exc.status
