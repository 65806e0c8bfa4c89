"""fabricd's operations: every change a caller can ask for, checked once.

Each operation is a function ``op(ctx, caller, request) -> record``: ``ctx`` is the process's
AppState (store, settings, whether controllers run here), ``caller`` the Principal that asks
(None: fabricd itself, e.g. a restore), ``request`` a pydantic model (or a name and a model).
Quota, tenant policy, references, outbound reach and the tenant's admission lock are checked
here and nowhere else; the REST routes (controlplane.api), declarative apply
(controlplane.api.apply through controlplane.api.documents' KINDS) all call these functions. The
console reaches them through the REST API in-process (controlplane.console.backend), so its calls
pass the same auth and route rules as fabricctl's.

Layers (import-linter contracts in pyproject.toml): api -> ops -> records -> store. An operation
reads and writes through common.records and never imports the API or the console.
Errors are common.errors' (Conflict, Forbidden, InvalidInput, NotFound, TransientError); the API
turns them into the same status codes and error codes for every caller.
"""
