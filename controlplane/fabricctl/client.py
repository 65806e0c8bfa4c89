"""fabricctl's HTTP client for fabricd, configured from the environment.

  FABRIC_URL         fabricd base URL (default https://127.0.0.1:8443)
  FABRIC_TOKEN       admin bearer token; when unset, the token saved by `fabricctl ai login`
  FABRIC_CA          CA bundle that signed fabricd's certificate (the cluster's pki/ca.crt)
  FABRIC_CONFIG_DIR  where `login` saves the token (default ~/.config/fabric)

A non-2xx answer raises ClientError carrying fabricd's error code and message; a transport
failure raises ClientError with code "unreachable". The token never appears in an error.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import httpx

from common.pki import client_ssl_context

DEFAULT_URL = "https://127.0.0.1:8443"
TIMEOUT_S = 30.0


class ClientError(Exception):
    def __init__(self, status: int, code: str, message: str):
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


@dataclass(frozen=True)
class ClientConfig:
    url: str
    token: str | None
    ca: Path | None
    config_dir: Path


def config_dir(env: dict[str, str]) -> Path:
    if env.get("FABRIC_CONFIG_DIR"):
        return Path(env["FABRIC_CONFIG_DIR"])
    return Path(env.get("HOME", "~")).expanduser() / ".config" / "fabric"


def token_path(env: dict[str, str]) -> Path:
    return config_dir(env) / "token"


def config_from_env(env: dict[str, str] | None = None) -> ClientConfig:
    env = dict(os.environ) if env is None else env
    token = env.get("FABRIC_TOKEN") or None
    if token is None and token_path(env).exists():
        token = token_path(env).read_text().strip() or None
    return ClientConfig(
        url=(env.get("FABRIC_URL") or DEFAULT_URL).rstrip("/"),
        token=token,
        ca=Path(env["FABRIC_CA"]) if env.get("FABRIC_CA") else None,
        config_dir=config_dir(env),
    )


def save_token(cfg: ClientConfig, token: str) -> Path:
    cfg.config_dir.mkdir(parents=True, exist_ok=True)
    path = cfg.config_dir / "token"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return path


class FabricClient:
    def __init__(self, cfg: ClientConfig):
        self.cfg = cfg
        verify = client_ssl_context(cfg.ca) if cfg.ca is not None else True
        headers = {"Authorization": f"Bearer {cfg.token}"} if cfg.token else {}
        self._http = httpx.Client(base_url=cfg.url, verify=verify, headers=headers, timeout=TIMEOUT_S)

    def request(self, method: str, path: str, *, json: dict | None = None, params: dict | None = None):
        try:
            resp = self._http.request(method, path, json=json, params=params)
        except httpx.HTTPError as exc:
            raise ClientError(0, "unreachable", f"cannot reach fabricd at {self.cfg.url}: {exc}") from None
        if resp.is_success:
            return resp.json() if resp.content else None
        try:
            err = resp.json()["error"]
            raise ClientError(resp.status_code, str(err.get("code", "error")), str(err.get("message", "")))
        except (ValueError, KeyError, TypeError, AttributeError):
            raise ClientError(resp.status_code, "error", f"fabricd answered HTTP {resp.status_code}") from None

    def get(self, path: str, **params):
        return self.request("GET", path, params={k: v for k, v in params.items() if v is not None} or None)

    def post(self, path: str, body: dict):
        return self.request("POST", path, json=body)

    def delete(self, path: str):
        return self.request("DELETE", path)

    def close(self) -> None:
        self._http.close()


def client_from_env() -> FabricClient:
    return FabricClient(config_from_env())
