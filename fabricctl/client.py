"""fabricctl's HTTP client for fabricd, configured by flags, environment and context
(fabricctl.contexts).

A non-2xx answer raises ClientError carrying fabricd's status, code, message and, for a
validation refusal, the bad fields; a transport failure raises ClientError "unreachable"; a
setting fabricctl cannot use raises ClientError "config". `exit_code` maps them to fabricctl's
documented exit statuses: 1 refused by fabricd, 2 usage or configuration, 3 unreachable.
The token never appears in an error.
"""

from __future__ import annotations

import re
import ssl

import httpx

from common.pki import client_ssl_context
from fabricctl.contexts import ConfigError, Resolved, load, resolve
from fabricctl.settings import CtlSettings, current

TIMEOUT_S = 30.0
EXIT_REFUSED, EXIT_USAGE, EXIT_UNREACHABLE = 1, 2, 3


class ClientError(Exception):
    def __init__(self, status: int, code: str, message: str, fields: list[dict] | None = None,
                 sent: dict | None = None):
        super().__init__(message)
        self.status, self.code, self.message = status, code, message
        self.fields, self.sent = fields or [], sent or {}

    def in_flags(self, flags: dict[str, str]) -> str:
        """The message with API field paths replaced by the flags that set them
        (`--gpu: must be at most 8, got 9`); unmapped fields keep the API's words."""
        if not flags:
            return self.message
        if not self.fields:  # a refusal that names its field first: "kind: unknown kind ..."
            field, sep, rest = self.message.partition(": ")
            return f"{flags[field]}: {rest}" if sep and field in flags else self.message
        parts = []
        for f in self.fields:
            path = str(f.get("field", ""))
            flag = flags.get(path)
            if flag is None:
                parts.append(f"{path}: {f.get('message', '')}" if path else str(f.get("message", "")))
                continue
            parts.append(f"{flag}: {_problem(f, _sent_value(self.sent, path))}")
        return "; ".join(parts)


def _sent_value(body: dict, dotted: str) -> object:
    cur: object = body
    for part in dotted.split("."):
        if not isinstance(cur, dict) or part not in cur:
            return None
        cur = cur[part]
    return cur


def _problem(f: dict, value: object) -> str:
    ctx = f.get("ctx") or {}
    got = f", got {value}" if value is not None else ""
    kind = f.get("type", "")
    if "ge" in ctx and "le" in ctx:
        return f"must be between {ctx['ge']} and {ctx['le']}{got}"
    words = {"less_than_equal": ("at most", "le"), "greater_than_equal": ("at least", "ge"),
             "less_than": ("less than", "lt"), "greater_than": ("greater than", "gt")}
    if kind in words and words[kind][1] in ctx:
        return f"must be {words[kind][0]} {ctx[words[kind][1]]}{got}"
    if kind in ("literal_error", "enum") and "expected" in ctx:
        return f"must be one of {ctx['expected']}{got}"
    return str(f.get("message", "invalid"))


def exit_code(exc: ClientError) -> int:
    if exc.code == "unreachable":
        return EXIT_UNREACHABLE
    if exc.code == "config":
        return EXIT_USAGE
    return EXIT_REFUSED


def _hint_for_transport(exc: httpx.HTTPError, cfg: Resolved) -> str:
    text = str(exc)
    if "CERTIFICATE_VERIFY_FAILED" in text or isinstance(getattr(exc, "__cause__", None), ssl.SSLError):
        where = f"the CA {cfg.ca}" if cfg.ca else "the system's trust store"
        return (f"cannot verify fabricd's certificate at {cfg.url} with {where} (CERTIFICATE_VERIFY_FAILED): "
                "set FABRIC_CA (or `fabricctl config set-context --ca FILE`) to the cluster CA, "
                "STATE_DIR/pki/ca.crt")
    return f"cannot reach fabricd at {cfg.url}: {text or type(exc).__name__}; is it running, and is FABRIC_URL right?"


class FabricClient:
    def __init__(self, cfg: Resolved):
        self.cfg = cfg
        try:
            verify = client_ssl_context(cfg.ca) if cfg.ca is not None else True
        except (OSError, ssl.SSLError, ValueError) as exc:
            raise ClientError(0, "config", f"cannot load the CA {cfg.ca}: {exc}; it must be a PEM "
                                           "certificate such as STATE_DIR/pki/ca.crt") from None
        headers = {"Authorization": f"Bearer {cfg.token}"} if cfg.token else {}
        self._http = httpx.Client(base_url=cfg.url, verify=verify, headers=headers, timeout=TIMEOUT_S)

    def request(self, method: str, path: str, *, json: dict | None = None, params: dict | None = None,
                timeout: float | None = None, text: bool = False):
        """The answer's JSON (``text``: its text, for an export such as CSV); ClientError when refused."""
        try:
            resp = self._http.request(method, path, json=json, params=params,
                                      timeout=timeout if timeout is not None else TIMEOUT_S)
        except httpx.HTTPError as exc:
            raise ClientError(0, "unreachable", _hint_for_transport(exc, self.cfg)) from None
        if resp.is_success:
            return resp.text if text else resp.json() if resp.content else None
        try:
            err = resp.json()["error"]
            code, message = str(err.get("code", "error")), str(err.get("message", ""))
            fields = err.get("fields") if isinstance(err.get("fields"), list) else None
        except (ValueError, KeyError, TypeError, AttributeError):
            raise ClientError(resp.status_code, "error", f"fabricd answered HTTP {resp.status_code}") from None
        # A refused login says so whatever the context holds: the token hint is for a request
        # that carried (or lacked) a token, not for the login that is asking for one.
        if resp.status_code == 422:  # people read the field's name, not FastAPI's "body." location
            message = re.sub(r"(^|; )body(\.|(?=:))", lambda m: m.group(1) + ("" if m.group(2) else "the request body"),
                             message)
        if resp.status_code == 401 and not path.startswith("/api/auth/"):
            message = self._login_hint(message)
        raise ClientError(resp.status_code, code, message, fields, json)

    def _login_hint(self, message: str) -> str:
        src = self.cfg.token_source
        if src == "none":
            return f"not logged in to {self.cfg.url}: run `fabricctl ai login` (or export FABRIC_TOKEN)"
        if src == "env":
            return (f"{message}: the token comes from FABRIC_TOKEN; unset it, or export a fresh one "
                    "(`fabricctl ai login --print-token`)")
        return f"{message}: log in again with `fabricctl ai login`"

    def get(self, path: str, timeout: float | None = None, **params):
        return self.request("GET", path, params={k: v for k, v in params.items() if v is not None} or None,
                            timeout=timeout)

    def post(self, path: str, body: dict):
        return self.request("POST", path, json=body)

    def put(self, path: str, body: dict):
        return self.request("PUT", path, json=body)

    def delete(self, path: str):
        return self.request("DELETE", path)

    def close(self) -> None:
        self._http.close()


def resolve_config(settings: CtlSettings | None = None) -> Resolved:
    """Where fabricd is and how to reach it, from this run's settings (flags, environment) and
    the contexts file."""
    settings = current() if settings is None else settings
    try:
        return resolve(settings, load(settings.config_path))
    except ConfigError as exc:
        raise ClientError(0, "config", str(exc)) from None


def client_from_context() -> FabricClient:
    return FabricClient(resolve_config())
