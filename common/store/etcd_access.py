"""How a process reaches etcd: TLS files and login, read from FABRIC_ETCD_* once at start.

    FABRIC_ETCD_CA             the CA that signed etcd's server certificates (PEM)
    FABRIC_ETCD_CERT/_KEY      this process's client certificate and key, signed by the CA etcd
                               trusts (--trusted-ca-file); no CN (see common.store.etcd_pki)
    FABRIC_ETCD_USER           the etcd user this process logs in as (fabricd, gateway)
    FABRIC_ETCD_PASSWORD_FILE  a file holding that user's password (the password never sits in
                               the environment, a command line or a log)

The three TLS settings go together, as do the two login settings. ``from_env`` checks every
file now (exists, readable, parses, the key matches the certificate) and raises EnvError naming
the variable, so fabricd and the gateway exit 2 at start instead of failing at the first call.

Why a password beside the certificate: etcd3gw speaks etcd's JSON gateway, and etcd's gateway
drops the client certificate's CN (it answers 400 to a certificate with one once auth is on), so
the certificate admits a client to the port and the login picks its role.

``check_plain`` is the one rule for where plain HTTP may go: an ``etcd://`` store without TLS
settings is refused unless every endpoint is a loopback address or the operator passed
``--insecure-store``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from common.envvars import EnvError
from common.listen import is_loopback

TLS_VARS = ("FABRIC_ETCD_CA", "FABRIC_ETCD_CERT", "FABRIC_ETCD_KEY")
LOGIN_VARS = ("FABRIC_ETCD_USER", "FABRIC_ETCD_PASSWORD_FILE")


@dataclass(frozen=True)
class EtcdAccess:
    """TLS files (all or none) and a login (or none) for the etcd store."""

    ca: Path | None = None
    cert: Path | None = None
    key: Path | None = None
    user: str = ""
    password: str = field(default="", repr=False)

    @property
    def tls(self) -> bool:
        return self.ca is not None


def _readable(env: Mapping[str, str], name: str) -> bytes:
    path = Path(env[name].strip())
    try:
        return path.read_bytes()
    except OSError as exc:
        raise EnvError(f"{name}={str(path)!r} cannot be read: {exc.strerror or exc}") from None


def _pem_cert(env: Mapping[str, str], name: str) -> x509.Certificate:
    try:
        return x509.load_pem_x509_certificate(_readable(env, name))
    except ValueError:
        raise EnvError(f"{name}={env[name].strip()!r} is not a PEM certificate") from None


def from_env(env: Mapping[str, str]) -> EtcdAccess | None:
    """The etcd access FABRIC_ETCD_* describe, or None when none is set; EnvError naming the variable."""
    given = {n: (env.get(n) or "").strip() for n in (*TLS_VARS, *LOGIN_VARS)}
    if not any(given.values()):
        return None
    tls_set = [n for n in TLS_VARS if given[n]]
    if tls_set and len(tls_set) != len(TLS_VARS):
        missing = [n for n in TLS_VARS if not given[n]]
        raise EnvError(f"{', '.join(missing)} unset while {', '.join(tls_set)} is set: etcd's TLS needs the CA, "
                       "the client certificate and its key")
    login_set = [n for n in LOGIN_VARS if given[n]]
    if login_set and len(login_set) != len(LOGIN_VARS):
        missing = [n for n in LOGIN_VARS if not given[n]]
        raise EnvError(f"{', '.join(missing)} unset while {', '.join(login_set)} is set: an etcd login needs "
                       "both the user and the password file")
    if login_set and not tls_set:
        raise EnvError("FABRIC_ETCD_USER is set without FABRIC_ETCD_CA/_CERT/_KEY: a password goes to etcd only "
                       "over TLS")
    ca = cert = key = None
    if tls_set:
        _pem_cert(env, "FABRIC_ETCD_CA")
        cert_obj = _pem_cert(env, "FABRIC_ETCD_CERT")
        try:
            key_obj = serialization.load_pem_private_key(_readable(env, "FABRIC_ETCD_KEY"), password=None)
        except (ValueError, TypeError):
            raise EnvError(f"FABRIC_ETCD_KEY={given['FABRIC_ETCD_KEY']!r} is not an unencrypted PEM private key") \
                from None
        if key_obj.public_key() != cert_obj.public_key():
            raise EnvError(f"FABRIC_ETCD_KEY={given['FABRIC_ETCD_KEY']!r} is not the key of FABRIC_ETCD_CERT="
                           f"{given['FABRIC_ETCD_CERT']!r}")
        ca, cert, key = (Path(given[n]) for n in TLS_VARS)
    password = ""
    if login_set:
        password = _readable(env, "FABRIC_ETCD_PASSWORD_FILE").decode("utf-8", "replace").strip()
        if not password:
            raise EnvError(f"FABRIC_ETCD_PASSWORD_FILE={given['FABRIC_ETCD_PASSWORD_FILE']!r} is empty")
    return EtcdAccess(ca=ca, cert=cert, key=key, user=given["FABRIC_ETCD_USER"], password=password)


def check_plain(url: str, hosts: list[str], access: EtcdAccess | None, *, insecure: bool) -> None:
    """Refuse (ValueError saying what to do) an etcd store reached without TLS at an address off
    loopback, which would send the store in clear text off this host, unless `insecure`."""
    if access is not None and access.tls:
        return
    remote = [h for h in hosts if not is_loopback(h.strip("[]"))]
    if remote and not insecure:
        raise ValueError(
            f"store {url}: {', '.join(remote)} is not a loopback address and no FABRIC_ETCD_CA/_CERT/_KEY is set, so "
            "the store (admin token key, join tokens, audit chain) would travel in clear text to anyone on the "
            "path; set the etcd TLS settings (docs/store.md), or pass --insecure-store to accept that")
