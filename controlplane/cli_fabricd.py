"""`fabricd`: the control-plane process.

  fabricd init  --state-dir DIR [--san HOST ...]
      writes {DIR} (0700) with {DIR}/admin-password (0600, random), the cluster CA under {DIR}/pki and a server
      certificate for fabricd (CN fabricd; SANs 127.0.0.1, localhost, this host's name, --san).
      Idempotent: an existing password and CA are kept; the server certificate is reissued only
      when missing or when --san is given.
  fabricd serve --state-dir DIR --listen HOST:PORT [--store URL] [--insecure] [--insecure-store] [--no-controllers]
      serves the REST API over HTTPS with that certificate. --insecure serves plain HTTP and is
      refused unless HOST is a loopback address. --no-controllers runs the API alone (another
      fabricd, or none, reconciles). An etcd store is reached with FABRIC_ETCD_* (TLS, login);
      without them an etcd off loopback is refused unless --insecure-store.
  fabricd store issue-server|issue-client|init-auth ...   the etcd CA, its certificates, etcd's
      users and roles (controlplane.cli_store; docs/store.md).
  fabricd pki issue-client --state-dir DIR --out OUT [--cn fabric-gateway]
      on a fabricd host (it holds the CA key): signs a client certificate (EKU clientAuth only, 825
      days) and writes OUT/CN.crt, OUT/CN.key (0600, in a 0700 OUT) and OUT/ca.crt, for a gateway's
      FABRIC_GATEWAY_KV_CLIENT_CERT/_KEY/_CA (the agents admit CN fabric-gateway on /v1/kv-index*).
      The key is written only there: never printed, never kept under DIR.
  fabricd backup keygen|create|restore
      the encrypted disaster-recovery archive (controlplane/cli_backup.py; docs/install.md).
  The lab is its own program, `fabric-lab` (lab/cli.py).
"""

from __future__ import annotations

import logging
import socket
import sys
from pathlib import Path

import typer

from common.listen import is_loopback
from common.listen import parse_listen as _parse_listen
from common.pki import ROLE_FABRICD, ROLE_GATEWAY, ensure_ca, issue_cert, pki_dir, sign_leaf, write_leaf
from common.private_fs import own_dir, private_dir, restrict_umask
from controlplane.cli_backup import backup_app
from controlplane.cli_store import store_app

SERVER_CERT_NAME = "fabricd"
DEFAULT_LISTEN = "127.0.0.1:8443"

app = typer.Typer(help="Fabric control plane daemon.", no_args_is_help=True, add_completion=False,
                  rich_markup_mode=None, pretty_exceptions_enable=False,
                  context_settings={"help_option_names": ["-h", "--help"]})


def parse_listen(listen: str) -> tuple[str, int]:
    try:
        return _parse_listen(listen)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None


def insecure_refusal(host: str, insecure: bool) -> str | None:
    """Why this listen address is refused, or None when it is fine."""
    if insecure and not is_loopback(host):
        return (f"--insecure serves plain HTTP, so it binds a loopback address only; {host} is not one. "
                "Listen on 127.0.0.1, or drop --insecure to serve HTTPS with the cluster CA.")
    return None


@app.command()
def init(
    state_dir: Path = typer.Option(..., "--state-dir", help="directory for the store, PKI and admin password"),
    san: list[str] = typer.Option([], "--san", help="extra host name or IP for the server certificate"),
) -> None:
    """Create the admin password, the cluster CA and fabricd's server certificate."""
    from controlplane.auth import VIEWER_USER, ensure_admin_password, ensure_password

    restrict_umask()  # everything init writes is secret or sits beside secrets
    private_dir(state_dir)
    password_path, created = ensure_admin_password(state_dir)
    viewer_path, viewer_created = ensure_password(state_dir, VIEWER_USER)
    ca_crt, _ = ensure_ca(state_dir)
    crt = pki_dir(state_dir) / f"{SERVER_CERT_NAME}.crt"
    if san or not crt.exists():
        hosts = ["127.0.0.1", "localhost", socket.gethostname(), *san]
        crt, _ = issue_cert(state_dir, SERVER_CERT_NAME, server=True, client=True, role=ROLE_FABRICD,
                            hosts=list(dict.fromkeys(hosts)))
    typer.echo(f"admin password: {password_path} ({'created' if created else 'kept'})")
    typer.echo(f"viewer password: {viewer_path} ({'created' if viewer_created else 'kept'}; read-only login)")
    typer.echo(f"cluster CA:     {ca_crt}")
    typer.echo(f"server cert:    {crt}")


@app.command()
def serve(
    state_dir: Path = typer.Option(..., "--state-dir", help="directory written by `fabricd init`"),
    listen: str = typer.Option(DEFAULT_LISTEN, "--listen", help="HOST:PORT"),
    store: str = typer.Option(None, "--store", help="sqlite:///PATH or etcd://HOST:PORT[,HOST:PORT...] (one per cluster member; default: SQLite in the state dir)"),
    insecure: bool = typer.Option(False, "--insecure", help="plain HTTP, loopback only"),
    insecure_store: bool = typer.Option(False, "--insecure-store",
                                        help="allow an etcd store off loopback without TLS (FABRIC_ETCD_* unset)"),
    controllers: bool = typer.Option(True, "--controllers/--no-controllers",
                                     help="run the background controllers in this process"),
    log_level: str = typer.Option("info", "--log-level"),
) -> None:
    """Serve the REST API (and run the controllers when they are installed)."""
    import uvicorn

    from common.store.connect import open_store
    from controlplane.app import create_app
    from controlplane.auth import admin_password_path
    from controlplane.settings import SettingsError, load
    from controlplane.state import AppState

    try:
        settings = load(insecure=insecure, run_controllers=controllers)
    except SettingsError as exc:
        typer.echo(f"error: fabricd will not start with these settings: {exc}", err=True)
        raise typer.Exit(2) from None
    host, port = parse_listen(listen)
    refusal = insecure_refusal(host, insecure)
    if refusal:
        typer.echo(f"error: {refusal}", err=True)
        raise typer.Exit(2)
    if not admin_password_path(state_dir).exists():
        typer.echo(f"error: {state_dir} has no admin password; run `fabricd init --state-dir {state_dir}` first",
                   err=True)
        raise typer.Exit(2)
    ssl_args: dict = {}
    if not insecure:
        crt, key = (pki_dir(state_dir) / f"{SERVER_CERT_NAME}.{ext}" for ext in ("crt", "key"))
        if not (crt.exists() and key.exists()):
            typer.echo(f"error: no server certificate in {pki_dir(state_dir)}; run `fabricd init` first", err=True)
            raise typer.Exit(2)
        # Client certificates are optional but, when sent, verified against the cluster CA:
        # operators use bearer tokens, agents prove their node id with their certificate.
        from controlplane.node_identity import uvicorn_tls_kwargs

        ssl_args = uvicorn_tls_kwargs(crt, key, pki_dir(state_dir) / "ca.crt")
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s")
    from common.health import quiet_probes

    quiet_probes()  # health checks and scrapes log at DEBUG
    # The state dir holds the store (and in it the admin-token key), the CA key and passwords:
    # 0700, and every file fabricd makes from here on (SQLite's -wal/-shm included) 0600.
    restrict_umask()
    private_dir(state_dir)
    try:
        the_store = open_store(store, state_dir, access=settings.store_access, insecure=insecure_store)
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    state = AppState(store=the_store, state_dir=state_dir, settings=settings)
    from common.port_holder import busy

    taken = busy(host, port)  # said before uvicorn's bare "[Errno 98] address already in use"
    if taken:
        the_store.close()
        typer.echo(f"error: cannot listen on {listen}: {taken}; pick another with --listen", err=True)
        raise typer.Exit(1)
    try:
        uvicorn.run(create_app(state), host=host, port=port, log_level=log_level, **ssl_args)
    finally:
        the_store.close()


pki_app = typer.Typer(help="Certificates from the cluster CA for Fabric components.", no_args_is_help=True)
app.add_typer(pki_app, name="pki")
app.add_typer(store_app, name="store")

# The client CNs issue-client signs. Only names no node can take (controlplane.api.nodes'
# RESERVED_CERT_NAMES): fabricd takes a certificate's CN as the node it proves, so a client
# certificate named like a node would act as that node.
CLIENT_CNS = ("fabric-gateway",)
GATEWAY_KV_DIR = "/etc/fabric/kv"  # where docs/install.md puts them on a gateway host


def _cluster_ca(state_dir: Path) -> Path:
    """The cluster CA's certificate; exits 2 where the state directory holds no CA key to sign with."""
    ca_crt, ca_key = pki_dir(state_dir) / "ca.crt", pki_dir(state_dir) / "ca.key"
    if not (ca_crt.is_file() and ca_key.is_file()):
        # ensure_ca would make a new CA here, which nobody trusts: refuse instead.
        typer.echo(f"error: {pki_dir(state_dir)} holds no cluster CA (ca.crt and ca.key); run this on a fabricd "
                   "host, with the --state-dir `fabricd init` made", err=True)
        raise typer.Exit(2)
    return ca_crt


@pki_app.command("issue-client")
def pki_issue_client(
    state_dir: Path = typer.Option(..., "--state-dir", help="fabricd's state directory (holds pki/ca.key)"),
    out: Path = typer.Option(..., "--out", help="directory for CN.crt, CN.key (0600) and ca.crt"),
    cn: str = typer.Option(CLIENT_CNS[0], "--cn", help="the certificate's common name: " + ", ".join(CLIENT_CNS)),
) -> None:
    """Issue a client certificate for a gateway to read the agents' KV index (docs/kv-events.md)."""
    if cn not in CLIENT_CNS:
        typer.echo(f"error: --cn {cn!r}: issue-client signs only {', '.join(CLIENT_CNS)} (the agents' "
                   "--kv-index-client-cn default); a client certificate with another name could act as a "
                   "node of that name toward fabricd", err=True)
        raise typer.Exit(2)
    ca_crt = _cluster_ca(state_dir)
    cert_pem, key_pem = sign_leaf(state_dir, cn, server=False, client=True, role=ROLE_GATEWAY, hosts=[])
    try:
        own_dir(out)  # new, or the caller's own that no one else may write: never a prepared one
        crt, key = write_leaf(out, cn, cert_pem, key_pem, ca_crt)
    except ValueError as exc:
        typer.echo(f"error: --out {out}: {exc}", err=True)
        raise typer.Exit(2) from None
    ca = out / "ca.crt"
    typer.echo(f"certificate: {crt}\nkey:         {key} (0600)\nCA:          {ca}")
    typer.echo(f"on each gateway host, install these as {GATEWAY_KV_DIR} (owner fabric, the key 0600) and "
               "add to /etc/default/fabric-gateway:")
    for var, f in (("CLIENT_CERT", crt), ("CLIENT_KEY", key), ("CA", ca)):
        typer.echo(f"  FABRIC_GATEWAY_KV_{var}={GATEWAY_KV_DIR}/{f.name}")


app.add_typer(backup_app, name="backup")


def main() -> None:
    from common.cli_guard import run_guarded

    run_guarded(lambda: app(prog_name="fabricd"), "fabricd")


if __name__ == "__main__":
    sys.exit(main())
