"""`fabricd store ...`: the etcd CA, etcd's certificates, and etcd's users and roles.

  fabricd store issue-server --state-dir DIR --out OUT --name MEMBER --host ADDR [--host ...]
      a server certificate for one etcd member (also its peer certificate), from the etcd CA in
      DIR/etcd-pki (made on first use): OUT/MEMBER.crt, OUT/MEMBER.key (0600), OUT/ca.crt.
  fabricd store issue-client --state-dir DIR --out OUT --role fabricd|gateway|root
      a client certificate (no CN) for a process that logs in as ROLE: OUT/etcd-ROLE.crt/.key, OUT/ca.crt.
  fabricd store passwords --passwords DIR
      DIR/USER.password (0600, random) for root, fabricd and gateway where missing (existing files
      kept): made before etcd runs, so every control-plane host is given the same DIR.
  fabricd store init-auth --store URL --passwords DIR [--check]
      with FABRIC_ETCD_CA/_CERT/_KEY set: adds the users root, fabricd and gateway (random
      passwords in DIR/USER.password, 0600; existing files kept), makes the roles fabricd and
      gateway hold exactly what common.store.etcd_auth.ROLES says, and turns etcd's auth on.
      Idempotent: a second run prints "unchanged". --check changes nothing: it prints what a run
      would change and exits 1 when that is anything (scripts/install-host's check).
"""

from __future__ import annotations

import os
from pathlib import Path

import typer

from common.envvars import EnvError
from common.errors import FabricError
from common.store import etcd_access
from common.store.connect import etcd_endpoints
from common.store.etcd_auth import USERS, init_auth, make_passwords
from common.store.etcd_pki import issue_client, issue_server

store_app = typer.Typer(help="etcd for Fabric: its CA, certificates, users and roles.", no_args_is_help=True)


@store_app.command("issue-server")
def store_issue_server(
    state_dir: Path = typer.Option(..., "--state-dir", help="fabricd's state directory (holds etcd-pki/)"),
    out: Path = typer.Option(..., "--out", help="directory for MEMBER.crt, MEMBER.key (0600) and ca.crt"),
    name: str = typer.Option(..., "--name", help="the member's name (etcd --name)"),
    host: list[str] = typer.Option(..., "--host", help="an address or DNS name clients and peers use for it"),
) -> None:
    """Issue an etcd member's server and peer certificate from the etcd CA."""
    try:
        crt, key, ca = issue_server(state_dir, name, host, out)
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    typer.echo(f"certificate: {crt}\nkey:         {key} (0600)\nCA:          {ca}")


@store_app.command("issue-client")
def store_issue_client(
    state_dir: Path = typer.Option(..., "--state-dir", help="fabricd's state directory (holds etcd-pki/)"),
    out: Path = typer.Option(..., "--out", help="directory for etcd-ROLE.crt, etcd-ROLE.key (0600) and ca.crt"),
    role: str = typer.Option(..., "--role", help="who uses it: " + ", ".join(USERS)),
) -> None:
    """Issue a client certificate for etcd (FABRIC_ETCD_CERT/_KEY) from the etcd CA."""
    if role not in USERS:
        typer.echo(f"error: --role {role!r}: expected one of {', '.join(USERS)}", err=True)
        raise typer.Exit(2)
    crt, key, ca = issue_client(state_dir, role, out)
    typer.echo(f"certificate: {crt}\nkey:         {key} (0600)\nCA:          {ca}")
    typer.echo(f"set FABRIC_ETCD_CA={ca} FABRIC_ETCD_CERT={crt} FABRIC_ETCD_KEY={key} FABRIC_ETCD_USER={role} and "
               f"FABRIC_ETCD_PASSWORD_FILE to the {role}.password file `fabricd store init-auth` wrote")


@store_app.command("passwords")
def store_passwords(
    passwords: Path = typer.Option(..., "--passwords", help="directory of USER.password files (0600)"),
) -> None:
    """Make the etcd users' passwords where missing (init-auth reads them from the same directory)."""
    made = make_passwords(passwords)
    for user in USERS:
        typer.echo(f"{passwords / (user + '.password')}: {'made' if user in made else 'kept'}")


@store_app.command("init-auth")
def store_init_auth(
    store: str = typer.Option(..., "--store", help="etcd://HOST:PORT[,HOST:PORT...]"),
    passwords: Path = typer.Option(..., "--passwords", help="directory of USER.password files (0600)"),
    check: bool = typer.Option(False, "--check", help="change nothing; exit 1 when a run would change something"),
) -> None:
    """Create etcd's users and roles for Fabric and turn etcd's auth on (idempotent)."""
    try:
        access = etcd_access.from_env(os.environ)
    except EnvError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    if access is None or not access.tls:
        typer.echo("error: init-auth sends passwords to etcd, so it needs TLS: set FABRIC_ETCD_CA, FABRIC_ETCD_CERT "
                   "and FABRIC_ETCD_KEY", err=True)
        raise typer.Exit(2)
    try:
        endpoints = etcd_endpoints(store)
    except ValueError as exc:
        typer.echo(f"error: --store: {exc}", err=True)
        raise typer.Exit(2) from None
    try:
        changes = init_auth(endpoints, access, passwords, apply=not check)
    except FabricError as exc:
        typer.echo(f"error: {exc.message}", err=True)
        raise typer.Exit(1) from None
    for line in changes:
        typer.echo(f"would change: {line}" if check else line)
    if not changes:
        typer.echo("unchanged: users, roles and auth already as Fabric needs them")
    if check and changes:
        raise typer.Exit(1)
