"""`fabricctl ai credential ...`: an agent runtime's inference credential for one endpoint.

    credential issue ENDPOINT --runtime NAME [--ttl-secs 900] [--env-file F [--watch]]
    credential revoke ENDPOINT ID

`issue` asks fabricd for a key scoped to ENDPOINT with a short TTL and the gateway URL the
runtime calls (controlplane.api.agent_credentials). With --env-file it writes
FABRIC_INFERENCE_BASE, FABRIC_AI_API_KEY and FABRIC_CREDENTIAL_EXPIRES_AT to F (0600, written to a
temporary file and renamed, so a reader never sees half a file) instead of printing the secret;
--watch then stays and renews the credential at its refresh_after, rewriting F each time, so a
runtime that rereads F before each call is never restarted. The old secret keeps working until
its own expiry, so a reader of the previous file is never refused; the file is rewritten
SETTLE_S after a renewal, once every gateway has refreshed the key's record.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import typer

from fabricctl.client import ClientError, FabricClient
from fabricctl.output import emit_object, session

credential_app = typer.Typer(help="Agent runtime credentials: a short-lived key for one endpoint and its "
                                  "FABRIC_INFERENCE_BASE.", no_args_is_help=True)
JSON_OPT = typer.Option(False, "--json", help="print JSON for scripts")
RETRY_S = 5.0  # between renewal attempts while fabricd does not answer
SETTLE_S = 2.0  # from a renewal to rewriting the file: every gateway has read the new secret by then


def env_text(credential: dict) -> str:
    return (f"FABRIC_INFERENCE_BASE={credential['inference_base']}\n"
            f"FABRIC_AI_API_KEY={credential['key']}\n"
            f"FABRIC_CREDENTIAL_EXPIRES_AT={int(credential['expires_at'])}\n")


def write_env_file(path: Path, credential: dict) -> None:
    """Replace path atomically with the credential's variables, readable by its owner only."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=str(path.parent))
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(env_text(credential))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@credential_app.command("issue")
def issue(
    endpoint: str = typer.Argument(..., metavar="ENDPOINT", help="the one endpoint the credential may call"),
    runtime: str = typer.Option(..., "--runtime", help="the agent runtime's name (one credential per runtime)"),
    ttl_secs: int = typer.Option(900, "--ttl-secs", help="how long each secret lives (60-86400)"),
    env_file: Path = typer.Option(None, "--env-file", help="write the variables here (0600) instead of printing"),
    watch: bool = typer.Option(False, "--watch", help="with --env-file: keep renewing before expiry, rewriting it"),
    as_json: bool = JSON_OPT,
) -> None:
    """Issue a credential; with --env-file --watch, keep it fresh until stopped."""
    if watch and env_file is None:
        raise typer.BadParameter("--watch needs --env-file", param_hint="--watch")
    flags = {"runtime": "--runtime", "ttl_secs": "--ttl-secs"}
    with session(flags) as c:
        cred = c.post(f"/api/ai/endpoints/{endpoint}/credentials", {"runtime": runtime, "ttl_secs": ttl_secs})
        if env_file is None:
            if as_json:
                emit_object(cred, True)
            else:
                typer.echo(f"id: {cred['id']}")
                typer.echo(env_text(cred), nl=False)
                typer.echo("store this key now: it is not shown again", err=True)
            return
        write_env_file(env_file, cred)
        typer.echo(f"credential {cred['id']} for endpoint {endpoint} written to {env_file}; expires at "
                   f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(cred['expires_at']))}", err=True)
        if watch:
            keep_fresh(c, endpoint, env_file, cred)


def keep_fresh(client: FabricClient, endpoint: str, env_file: Path, cred: dict, *,
               clock: Callable[[], float] = time.time, sleep: Callable[[float], None] = time.sleep,
               settle_s: float = SETTLE_S, retry_s: float = RETRY_S) -> None:
    """Renew ``cred`` at each refresh_after and rewrite ``env_file`` with the new secret, until a
    refusal (the credential revoked: 404) or the secret's expiry while fabricd is away ends it
    with that ClientError. ``clock`` and ``sleep`` are the loop's only timing (a test steps them)."""
    while True:
        sleep(max(1.0, cred["refresh_after"] - clock()))
        try:
            cred = client.post(f"/api/ai/endpoints/{endpoint}/credentials/{cred['id']}/refresh", {})
        except ClientError as exc:
            # fabricd away for a moment (unreachable: status 0, or a 5xx): the current secret still
            # works until expires_at; a refusal (the credential revoked, 404) or an expired secret
            # ends the watch.
            if 0 < exc.status < 500 or clock() >= cred["expires_at"]:
                raise
            typer.echo(f"renewal failed ({exc.message}); retrying", err=True)
            cred = {**cred, "refresh_after": clock() + retry_s}
            continue
        # A gateway learns a new secret at its next record refresh (FABRIC_GATEWAY_CACHE_SECS,
        # 1 s by default); the old one works until its expiry, so the file changes after that.
        sleep(settle_s)
        write_env_file(env_file, cred)
        typer.echo(f"credential {cred['id']} renewed; expires at "
                   f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(cred['expires_at']))}", err=True)


@credential_app.command("revoke")
def revoke(endpoint: str = typer.Argument(..., metavar="ENDPOINT", help="the endpoint the credential calls"),
           credential_id: str = typer.Argument(..., metavar="ID", help="the id `issue` printed"),
           as_json: bool = JSON_OPT) -> None:
    """Revoke a credential: the gateway refuses it from then on."""
    with session() as c:
        result = c.delete(f"/api/ai/endpoints/{endpoint}/credentials/{credential_id}")
    if as_json:
        emit_object(result or {}, True)
    else:
        typer.echo(f"credential {credential_id} revoked")
