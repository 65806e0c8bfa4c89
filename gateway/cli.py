"""`fabric-gateway serve --state-dir DIR --listen HOST:PORT [--store URL] [--tls-cert C --tls-key K | --insecure]`

HTTPS by default, with a certificate issued from the cluster CA in the state directory.
Plain HTTP needs --insecure and then binds loopback only. Every FABRIC_* setting and the key
HMAC secret are validated before the socket opens; a bad one exits with its name.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
import sys
from pathlib import Path

import typer

app = typer.Typer(no_args_is_help=True, add_completion=False, help="Fabric authenticated OpenAI gateway")


def split_listen(listen: str) -> tuple[str, int]:
    host, _, port = listen.rpartition(":")
    host = host.strip("[]")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise typer.BadParameter(f"--listen {listen!r}: expected HOST:PORT")
    return host, int(port)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@app.command()
def serve(
    state_dir: Path = typer.Option(..., help="state directory (cluster CA, embedded store)"),
    listen: str = typer.Option("127.0.0.1:8443", help="HOST:PORT to serve on"),
    store: str = typer.Option(None, help="store URL: sqlite:///PATH or etcd://HOST:PORT (default: embedded)"),
    tls_cert: Path = typer.Option(None, help="serving certificate (default: issued from the cluster CA)"),
    tls_key: Path = typer.Option(None, help="key of --tls-cert"),
    insecure: bool = typer.Option(False, help="plain HTTP, loopback only"),
    gateway_id: str = typer.Option(None, help="name for FABRIC_GATEWAY_* limits (default: hostname:port)"),
    log_level: str = typer.Option("info"),
) -> None:
    import uvicorn

    from common.apikeys import HmacSecretError, load_hmac_secret
    from common.store.base import open_store
    from gateway import settings as settings_mod
    from gateway.assemble import create_app

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per proxied call is noise on the hot path
    host, port = split_listen(listen)
    if insecure and not is_loopback(host):
        raise typer.BadParameter("--insecure serves plain HTTP and only binds a loopback address")
    if (tls_cert is None) != (tls_key is None):
        raise typer.BadParameter("--tls-cert and --tls-key go together")
    try:
        settings = settings_mod.load()
        hmac_secret = load_hmac_secret()
    except (settings_mod.SettingsError, HmacSecretError) as exc:
        typer.echo(f"fabric-gateway: {exc}", err=True)
        raise typer.Exit(2) from None
    ssl_args = {}
    if not insecure:
        if tls_cert is None:
            from common import pki

            pki.ensure_ca(state_dir)
            tls_cert, tls_key = pki.issue_cert(state_dir, "gateway", server=True, client=False,
                                               hosts=sorted({host, "127.0.0.1", "localhost", socket.gethostname()}))
        ssl_args = {"ssl_certfile": str(tls_cert), "ssl_keyfile": str(tls_key)}
    the_store = open_store(store, state_dir)
    asgi = create_app(settings, the_store, hmac_secret, gateway_id or f"{socket.gethostname()}:{port}")
    uvicorn.run(asgi, host=host, port=port, loop="uvloop", http="httptools", ws="websockets",
                access_log=False, log_level=log_level, lifespan="on", **ssl_args)


@app.command("verify-audit")
def verify_audit(
    state_dir: Path = typer.Option(..., help="state directory"),
    store: str = typer.Option(None, help="store URL"),
) -> None:
    """Recompute the audit hash chain; exit 1 naming the first tampered row."""
    from common.audit_chain import verify
    from common.store.base import open_store

    result = verify(open_store(store, state_dir))
    typer.echo(f'{{"ok": {str(result.ok).lower()}, "rows": {result.rows}, "bad_seq": '
               f'{result.bad_seq if result.bad_seq is not None else "null"}, "reason": "{result.reason}"}}')
    if not result.ok:
        sys.exit(1)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
