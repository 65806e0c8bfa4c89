"""`fabric-gateway serve --state-dir DIR --listen HOST:PORT [--store URL] [--tls-cert C --tls-key K | --insecure] [--insecure-store]`

HTTPS by default, with a certificate issued from the cluster CA in the state directory.
--workers N (default 1 on a machine with <= 2 CPUs, else 2) forks N worker processes, each with its own SO_REUSEPORT
listener on the same port, its own store connection, caches and upstream pool; limits stay
exact because their counters live in the store; metrics are summed over the workers.
Plain HTTP needs --insecure and then binds loopback only. Every FABRIC_* setting and the key
HMAC secret are validated before the socket opens; a bad one exits with its name. An etcd store
is reached with FABRIC_ETCD_* (TLS, the gateway's login); without them an etcd off loopback is
refused unless --insecure-store (also for verify-audit and slots).
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from pathlib import Path

import typer

from common.listen import is_loopback
from common.listen import parse_listen as _parse_listen

app = typer.Typer(no_args_is_help=True, add_completion=False, help="Fabric authenticated OpenAI gateway",
                  rich_markup_mode=None, pretty_exceptions_enable=False,
                  context_settings={"help_option_names": ["-h", "--help"]})


def split_listen(listen: str) -> tuple[str, int]:
    try:
        return _parse_listen(listen)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None


@app.command()
def serve(
    state_dir: Path = typer.Option(..., help="state directory (cluster CA, embedded store)"),
    listen: str = typer.Option("127.0.0.1:8443", help="HOST:PORT to serve on"),
    store: str = typer.Option(None, help="store URL: sqlite:///PATH or etcd://HOST:PORT[,HOST:PORT...] (default: embedded)"),
    tls_cert: Path = typer.Option(None, help="serving certificate (default: issued from the cluster CA)"),
    tls_key: Path = typer.Option(None, help="key of --tls-cert"),
    insecure: bool = typer.Option(False, help="plain HTTP, loopback only"),
    insecure_store: bool = typer.Option(False, help="allow an etcd store off loopback without TLS (FABRIC_ETCD_* unset)"),
    gateway_id: str = typer.Option(None, help="name for FABRIC_GATEWAY_* limits (default: hostname:port)"),
    workers: int = typer.Option(None, min=1, max=64,
                                help="worker processes on one port (SO_REUSEPORT); default 1 on <= 2 CPUs, else 2"),
    log_level: str = typer.Option("info"),
) -> None:
    workers = workers or default_workers()
    if workers > 1:
        # Before prometheus_client is imported: every worker's metrics go to shared files and
        # /metrics (whichever worker answers) reports their sum.
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="fabric-gateway-metrics-")

    import uvicorn

    from common.private_fs import private_dir, restrict_umask
    from common.store.connect import open_store
    from gateway import heap_profile
    from gateway import settings as settings_mod
    from gateway.assemble import create_app

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s")
    from common.health import quiet_probes

    quiet_probes()  # health checks and scrapes log at DEBUG
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per proxied call is noise on the hot path
    host, port = split_listen(listen)
    if insecure and not is_loopback(host):
        raise typer.BadParameter("--insecure serves plain HTTP and only binds a loopback address")
    if (tls_cert is None) != (tls_key is None):
        raise typer.BadParameter("--tls-cert and --tls-key go together")
    for flag, path in (("--tls-cert", tls_cert), ("--tls-key", tls_key)):
        if path is not None and not path.is_file():
            raise typer.BadParameter(f"{flag} {path} does not exist")
    try:
        settings = settings_mod.load()
    except settings_mod.SettingsError as exc:
        typer.echo(f"fabric-gateway: {exc}", err=True)
        raise typer.Exit(2) from None
    hmac_secret = settings.key_hmac_secret
    if hmac_secret is None:
        typer.echo(f"fabric-gateway: {settings.key_hmac_error}", err=True)
        raise typer.Exit(2)
    profiler = heap_profile.start(state_dir, settings.heap_frames)  # FABRIC_GATEWAY_TRACEMALLOC: off unless set
    # The state dir holds the store and the gateway's key: 0700, and every file made from here on 0600.
    restrict_umask()
    private_dir(state_dir)
    try:
        check_store(store, state_dir, settings.store_access, insecure_store)
    except ValueError as exc:
        typer.echo(f"fabric-gateway: {exc}", err=True)
        raise typer.Exit(2) from None
    ssl_args = {}
    if not insecure:
        if tls_cert is None:
            from common import pki

            pki.ensure_ca(state_dir)
            tls_cert, tls_key = pki.issue_cert(state_dir, "gateway", server=True, client=False, role=pki.ROLE_GATEWAY,
                                               hosts=sorted({host, "127.0.0.1", "localhost", socket.gethostname()}))
        ssl_args = {"ssl_certfile": str(tls_cert), "ssl_keyfile": str(tls_key)}
    gid = gateway_id or f"{socket.gethostname()}:{port}"
    from gateway.http_server import GatewayHttpProtocol

    # proxy_headers off: the gateway never reads the client address, and the middleware is a
    # layer on every call. http: the gateway's own HTTP/1.1 protocol (gateway.http_server);
    # FABRIC_GATEWAY_HTTP_SERVER=uvicorn falls back to uvicorn's (side-by-side measurement, a way out).
    http_proto = "httptools" if settings.http_server == "uvicorn" else GatewayHttpProtocol
    uv_args = dict(loop="uvloop", http=http_proto, ws="websockets", access_log=False, log_level=log_level,
                   lifespan="on", proxy_headers=False, **ssl_args)
    logging.getLogger("fabric.gateway").info(
        "HTTP server %s, upstream client %s", "uvicorn (httptools)" if settings.http_server == "uvicorn"
        else "gateway.http_server", settings.upstream_client)
    if workers == 1:
        asgi = create_app(settings, open_store(store, state_dir, access=settings.store_access,
                                               insecure=insecure_store), hmac_secret, gid)
        _profile(profiler, asgi)
        uvicorn.run(asgi, host=host, port=port, **uv_args)
        return

    def run_worker(sock: socket.socket) -> None:
        # Runs in the forked child: the store, its threads and the event loop are made here.
        asgi = create_app(settings, open_store(store, state_dir, access=settings.store_access,
                                               insecure=insecure_store), hmac_secret, gid)
        _profile(profiler, asgi)  # each worker answers SIGUSR2 with its own report
        uvicorn.Server(uvicorn.Config(asgi, **uv_args)).run(sockets=[sock])

    try:
        socks = [reuseport_socket(host, port) for _ in range(workers)]
    except OSError as exc:
        typer.echo(f"fabric-gateway: cannot listen on {listen}: {exc}", err=True)
        raise typer.Exit(1) from None
    if profiler is not None:
        signal.signal(signal.SIGUSR2, signal.SIG_IGN)  # the supervisor has no heap worth reporting
    try:
        supervise(socks, run_worker)
    finally:
        shutil.rmtree(os.environ["PROMETHEUS_MULTIPROC_DIR"], ignore_errors=True)


def check_store(store: str | None, state_dir: Path, access, insecure_store: bool) -> None:
    """Open the store once and close it: the URL, FABRIC_ETCD_* and the plain-HTTP rule are
    refused (ValueError) before any socket opens or worker forks."""
    from common.store.connect import open_store

    open_store(store, state_dir, access=access, insecure=insecure_store).close()


def _tool_store(store: str | None, state_dir: Path, insecure_store: bool):
    """The store for verify-audit and slots: FABRIC_ETCD_* read here (a bad one exits 2 naming it)."""
    from common.envvars import EnvError
    from common.store import etcd_access
    from common.store.connect import open_store

    try:
        return open_store(store, state_dir, access=etcd_access.from_env(os.environ), insecure=insecure_store)
    except (EnvError, ValueError) as exc:
        typer.echo(f"fabric-gateway: {exc}", err=True)
        raise typer.Exit(2) from None


def _profile(profiler, asgi) -> None:
    """FABRIC_GATEWAY_TRACEMALLOC: SIGUSR2 writes a heap report (gateway.heap_profile)."""
    if profiler is not None:
        from gateway.heap_profile import cache_sizes

        profiler.caches = lambda: cache_sizes(asgi)
        profiler.install()


def default_workers() -> int:
    """1 on a machine with 2 CPUs or fewer, else 2. Measured on 2 cores shared with the engine
    and the load generator, a second worker lowered throughput at 64 clients (~2000 vs ~2700
    req/s): the box is already saturated, and two audit writers race for each chain row."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return 1 if cpus <= 2 else 2


def reuseport_socket(host: str, port: int) -> socket.socket:
    """One listening socket per worker on the same port: the kernel spreads new connections
    over them by hash, where one shared socket would let the first worker to wake take most."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def _die_with_parent() -> None:
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def supervise(socks: list[socket.socket], run_worker) -> None:
    """Fork one worker per socket; restart one that dies; SIGTERM/SIGINT stop them all."""
    log = logging.getLogger("fabric.gateway")
    children: dict[int, int] = {}
    stopping = False

    def spawn(i: int) -> None:
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                signal.signal(signal.SIGINT, signal.SIG_DFL)
                _die_with_parent()
                for j, other in enumerate(socks):
                    if j != i:
                        other.close()
                run_worker(socks[i])
            except BaseException:
                log.exception("gateway worker failed")
                code = 1
            finally:
                logging.shutdown()
                os._exit(code)
        children[pid] = i

    def stop(signum, _frame) -> None:
        nonlocal stopping
        stopping = True
        for pid in list(children):
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    for i in range(len(socks)):
        spawn(i)
    from prometheus_client import multiprocess

    while children:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            break
        i = children.pop(pid, None)
        multiprocess.mark_process_dead(pid)
        if i is not None and not stopping:
            log.warning("gateway worker %s exited (status %s); starting another", pid, status)
            time.sleep(0.5)
            if not stopping:
                spawn(i)


@app.command("verify-audit")
def verify_audit(
    state_dir: Path = typer.Option(..., help="state directory"),
    store: str = typer.Option(None, help="store URL"),
    tip_file: Path = typer.Option(None, help="a file outside the store holding the last verified tip "
                                             "(seq and hash): the chain must still hold it; updated after a good run"),
    insecure_store: bool = typer.Option(False, help="allow an etcd store off loopback without TLS"),
) -> None:
    """Recompute the audit hash chain and compare it with the stored tips; exit 1 naming the first bad row."""
    import json

    from common.audit_chain import Tip, read_rows, tip_of, verify

    s = _tool_store(store, state_dir, insecure_store)
    stored = None
    if tip_file is not None and tip_file.exists():
        try:
            data = json.loads(tip_file.read_text())
            stored = Tip(int(data["seq"]), str(data["hash"]))
        except (ValueError, KeyError, TypeError):
            typer.echo(f"fabric-gateway: {tip_file} is not a tip file written by verify-audit", err=True)
            raise typer.Exit(2) from None
    result = verify(s, stored)
    typer.echo(json.dumps({"ok": result.ok, "rows": result.rows, "bad_seq": result.bad_seq, "reason": result.reason}))
    if not result.ok:
        sys.exit(1)
    if tip_file is not None:
        tip = tip_of(read_rows(s))
        tmp = tip_file.with_suffix(tip_file.suffix + ".tmp")
        tmp.write_text(json.dumps({"seq": tip.seq, "hash": tip.hash}))
        tmp.replace(tip_file)


@app.command("slots")
def slots(
    state_dir: Path = typer.Option(..., help="state directory"),
    store: str = typer.Option(None, help="store URL"),
    insecure_store: bool = typer.Option(False, help="allow an etcd store off loopback without TLS"),
) -> None:
    """In-flight slots held in the store: each counter, its live total, and each holder (gateway
    process) with its slots and whether its lease is alive. Prints JSON."""
    import json

    from gateway.slots import slot_view

    typer.echo(json.dumps(slot_view(_tool_store(store, state_dir, insecure_store)), indent=2))


def main() -> None:
    from common.cli_guard import run_guarded

    run_guarded(lambda: app(prog_name="fabric-gateway"), "fabric-gateway")


if __name__ == "__main__":
    main()
