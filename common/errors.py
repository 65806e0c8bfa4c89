"""The Fabric exception tree, shared by every process.

    FabricError                 base; carries an HTTP status and a stable code
    ├── InvalidInput   (422)    the caller sent something wrong; message names the field
    ├── NotFound       (404)    a named thing does not exist
    ├── Conflict       (409)    exists already, or is still in use by something named
    ├── Unauthorized   (401)    no or bad credentials
    ├── Forbidden      (403)    credentials fine, scope or policy says no
    ├── LimitExceeded  (429)    a quota or rate limit; carries retry_after seconds
    ├── PayloadTooLarge(413)
    ├── Refused        (400)    a request that is well-formed but cannot be done as asked
    ├── UnreadableRecord (500)  a stored record that does not parse as its kind; the message
    │                           names the kind and the key (an operator fixes or deletes it)
    └── TransientError (503)    try again later (store or agent unreachable, timeouts);
        │                       loops retry these with backoff, never permanent errors
        ├── Contended           another writer changed a record on every try of the one
        │                       read-modify-write loop (common.records.cas), or holds its lock;
        │                       code "contended", answered 503 with Retry-After
        └── StoreAccessDenied   the store refused this process: its TLS certificate, its login
                                or its role (a setting the operator fixes; loops keep retrying so
                                they recover when it is fixed; API callers see 503)

Messages are for people and never contain secrets (keys, tokens, prompts).
"""

from __future__ import annotations


class FabricError(Exception):
    status = 500
    code = "internal"

    def __init__(self, message: str, *, code: str | None = None):
        super().__init__(message)
        self.message = message
        if code:
            self.code = code

    def to_body(self) -> dict:
        return {"error": {"code": self.code, "message": self.message}}


class InvalidInput(FabricError):
    status = 422
    code = "invalid"


class NotFound(FabricError):
    status = 404
    code = "not_found"


class Conflict(FabricError):
    status = 409
    code = "conflict"


class Unauthorized(FabricError):
    status = 401
    code = "unauthorized"


class Forbidden(FabricError):
    status = 403
    code = "forbidden"


class LimitExceeded(FabricError):
    status = 429
    code = "rate_limited"

    def __init__(self, message: str, *, retry_after: float = 1.0, code: str | None = None):
        super().__init__(message, code=code)
        self.retry_after = retry_after


class PayloadTooLarge(FabricError):
    status = 413
    code = "payload_too_large"


class Refused(FabricError):
    status = 400
    code = "refused"


class UnreadableRecord(FabricError):
    code = "unreadable_record"


class TransientError(FabricError):
    status = 503
    code = "unavailable"

    def __init__(self, message: str, *, delay: float = 1.0, code: str | None = None):
        super().__init__(message, code=code)
        self.delay = delay


class Contended(TransientError):
    code = "contended"

    def __init__(self, message: str, *, retry_after: float = 1.0, code: str | None = None):
        super().__init__(message, delay=retry_after, code=code)
        self.retry_after = retry_after


class StoreAccessDenied(TransientError):
    code = "store_access_denied"


def error_for_status(status: int) -> type[FabricError]:
    """The FabricError subclass answering with HTTP `status`: TransientError for any 5xx,
    Refused for a 4xx without a class of its own."""
    if status >= 500:
        return TransientError
    return _BY_STATUS.get(status, Refused)


_BY_STATUS: dict[int, type[FabricError]] = {cls.status: cls for cls in FabricError.__subclasses__()}
