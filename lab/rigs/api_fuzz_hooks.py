"""schemathesis hooks for lab/rigs/api_fuzz.py (loaded through SCHEMATHESIS_HOOKS).

``expected_refusal``: in a pass without credentials (FABRIC_FUZZ_EXPECT=401) every call of a
secured operation with its documented method answers 401 with the error shape
{"error": {"code", "message"}}; in a pass with a certificate the agent does not admit
(FABRIC_FUZZ_EXPECT=403) every call answers 403 ``caller_not_allowed``. Calls that change the
method (the coverage phase's TRACE, PATCH...) are left to the method checks.
"""

from __future__ import annotations

import json
import os

import schemathesis


@schemathesis.check
def expected_refusal(ctx, response, case):
    expect = os.environ.get("FABRIC_FUZZ_EXPECT", "")
    if not expect or case.method.upper() != case.operation.method.upper():
        return
    secured = bool(case.operation.definition.raw.get("security")) if expect == "401" else True
    if not secured:
        return
    if str(response.status_code) != expect:
        raise AssertionError(f"expected {expect} for a call without admitted credentials, got "
                             f"{response.status_code}: {response.text[:200]}")
    body = json.loads(response.text)
    error = body["error"]
    assert isinstance(error["code"], str) and isinstance(error["message"], str), body
    if expect == "403":
        assert error["code"] == "caller_not_allowed", body
    return
