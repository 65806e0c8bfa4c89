"""`fabric-agent serve`: build the agent's state from options, serve the API, heartbeat to fabricd.

TLS rules (decided by ``tls_plan``, a pure function):
  - with certificate, key and CA (``--tls-*`` or ``--pki-dir`` holding NODE.crt, NODE.key,
    ca.crt as written by ``fabricctl ai node add NODE --out DIR``) the API serves HTTPS and
    demands a client certificate from that CA whose CN is one of ``--allowed-client-cn``
    (repeatable, default ``fabricd``: the control plane's client certificate), so another
    node's certificate, though from the same CA, gets 403;
  - with none of them it refuses to start, unless ``--insecure``, and then it binds loopback only;
  - a partial set, or TLS files together with --insecure, is refused rather than guessed at.
GPUs: real NVML and /sys by default; ``--fake-gpus N`` runs the same inventory and VFIO code
over the fake NVML module and a fake sysfs tree under the state directory.
"""

from __future__ import annotations

import logging
import shutil
import signal
import socket
import ssl
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer

from agent.service_generations import GENERATIONS_FILE, ServiceGenerations
from agent.state import AgentState
from common.listen import is_loopback
from common.listen import parse_listen as _parse_listen
from common.private_fs import private_dir, restrict_umask

log = logging.getLogger("fabric-agent")

DEFAULT_LISTEN = "127.0.0.1:9443"
VM_DRIVERS = ("libvirt", "lab", "dry-run")


@dataclass(frozen=True)
class TlsPlan:
    cert: Path | None
    key: Path | None
    ca: Path | None
    refusal: str | None = None

    @property
    def enabled(self) -> bool:
        return self.cert is not None


def parse_listen(listen: str) -> tuple[str, int]:
    try:
        return _parse_listen(listen)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None


def tls_plan(node_id: str, listen_host: str, insecure: bool, cert: Path | None, key: Path | None,
             ca: Path | None, pki_dir: Path | None) -> TlsPlan:
    if pki_dir is not None:
        cert = cert or pki_dir / f"{node_id}.crt"
        key = key or pki_dir / f"{node_id}.key"
        ca = ca or pki_dir / "ca.crt"
    given = [p for p in (cert, key, ca) if p is not None]
    if insecure:
        if given:
            return TlsPlan(None, None, None, "--insecure serves plain HTTP; drop the TLS options or --insecure")
        if not is_loopback(listen_host):
            return TlsPlan(None, None, None, f"--insecure binds a loopback address only; {listen_host} is not one")
        return TlsPlan(None, None, None)
    if not given:
        return TlsPlan(None, None, None, "no TLS files: give --pki-dir (or --tls-cert, --tls-key and --tls-ca), "
                       "issued with `fabricctl ai node add NODE --out DIR`; or --insecure on loopback")
    if len(given) != 3:
        return TlsPlan(None, None, None, "mutual TLS needs all of --tls-cert, --tls-key and --tls-ca")
    missing = [str(p) for p in (cert, key, ca) if not p.exists()]
    if missing:
        return TlsPlan(None, None, None, f"TLS files not found: {', '.join(missing)}")
    return TlsPlan(cert, key, ca)


def uvicorn_mtls_kwargs(plan: TlsPlan) -> dict:
    """uvicorn.Config arguments: HTTPS demanding a client certificate from the cluster CA, with
    the protocol that shows the certificate to the app (which checks its CN)."""
    from common.peer_cert import PeerCertH11Protocol

    return {"http": PeerCertH11Protocol, "ssl_certfile": str(plan.cert), "ssl_keyfile": str(plan.key),
            "ssl_ca_certs": str(plan.ca), "ssl_cert_reqs": int(ssl.CERT_REQUIRED)}


def advertised_address(listen_host: str, port: int, tls: bool, advertise: str | None) -> str:
    if advertise:
        return advertise.rstrip("/")
    host = socket.gethostname() if listen_host in ("0.0.0.0", "::") else listen_host
    return f"{'https' if tls else 'http'}://{host}:{port}"


def _inventory_and_binder(state_dir: Path, vm_driver: str, fake_gpus: int, fake_gpu_name: str,
                          fake_gpu_mem_gib: float, sysfs_root: Path, keep_bound: bool = False):
    from agent.hw.gpu_inventory import NvmlInventory
    from agent.hw.host_inventory import HostInventory
    from agent.hw.vfio import VfioBinder

    if fake_gpus <= 0:
        from agent.hw.gpu_holders import NvidiaSmiDaemons

        # FABRIC_VFIO_KEEP_BOUND=1: released GPUs stay on vfio-pci for the next VM (docs/gpu-hosts.md).
        binder = None if vm_driver == "dry-run" else VfioBinder(
            sysfs_root, state_dir=state_dir, daemons=NvidiaSmiDaemons(), keep_bound=keep_bound)
        return HostInventory(NvmlInventory(), sysfs_root, state_file=state_dir / "gpu-inventory.json"), binder
    from agent.hw.nvml_fake import PROFILES, FakeNvml, make_gpus
    from agent.hw.sysfs_fake import FakeSysfs

    profile = fake_gpu_name.lower() if fake_gpu_name.lower() in PROFILES else "h100"
    gpus = make_gpus(fake_gpus, profile)
    for gpu in gpus:
        if fake_gpu_name.lower() not in PROFILES:
            gpu.name = fake_gpu_name
        if fake_gpu_mem_gib > 0:
            gpu.memory_total_mib = int(fake_gpu_mem_gib * 1024)
    inventory = NvmlInventory(nvml_module=FakeNvml(gpus=gpus))
    if vm_driver == "dry-run":
        return inventory, None
    # A fresh simulated /sys each start: the simulated kernel forgets binds like a reboot would.
    root = state_dir / "fake-sysfs"
    shutil.rmtree(root, ignore_errors=True)
    fake = FakeSysfs(root)
    for i, gpu in enumerate(inventory.read().gpus):
        fake.add_gpu(gpu.pci, group=20 + i, audio=True)
    return inventory, VfioBinder(fake.root, kernel=fake.kernel, state_dir=state_dir, daemons=fake.daemons,
                                 proc_root=fake.proc, vfio_ids=frozenset())


def _vm_driver(name: str, state_dir: Path, libvirt_uri: str, lab: dict, libvirt: dict, lab_engine=None):
    if name == "dry-run":
        from agent.vm.dryrun_driver import DryRunDriver

        return DryRunDriver(state_dir / "dry-run")
    if name == "lab":
        from agent.vm.lab_driver import LabDriver, LabNetwork

        missing = [k for k in ("node_netns", "bridge", "subnet", "gateway") if not lab.get(k)]
        if missing:
            raise typer.BadParameter(f"--vm-driver lab needs --lab-{', --lab-'.join(m.replace('_', '-') for m in missing)}")
        return LabDriver(LabNetwork(**lab), state_dir, engine=lab_engine)  # FABRIC_LAB_ENGINE: sim or vllm
    from agent.vm.libvirt_driver import LibvirtDriver

    if libvirt.get("image") is None or libvirt.get("models_dir") is None:
        raise typer.BadParameter("--vm-driver libvirt needs --golden-image and --models-dir")
    if libvirt.get("domain_type") not in ("kvm", "auto"):
        raise typer.BadParameter(f"--domain-type {libvirt.get('domain_type')!r}: expected kvm or auto")
    return LibvirtDriver(libvirt_uri, state_dir=state_dir / "libvirt", kvm=kvm_probe(libvirt_uri, state_dir),
                         **libvirt)


def kvm_probe(libvirt_uri: str, state_dir: Path):
    """This node's KVM verdict, probed once per boot (agent.hw.kvm) and kept in the state dir."""
    from agent.hw.kvm import CachedKvmProbe, LibvirtKvmProbe

    return CachedKvmProbe(LibvirtKvmProbe(libvirt_uri, work_dir=state_dir / "libvirt" / "kvm-probe"),
                          state_dir / "kvm-probe.json", key=libvirt_uri)


def _dataplane(enabled: bool, pin_dir: Path, node_ip: str | None, ifaces: list[str], netns: str | None,
               flow_entries: int | None = None, settings=None):
    if not enabled:
        return None, "started with --no-dataplane"
    try:
        from agent.dataplane import Dataplane

        # settings: FABRIC_UDP_FLOW_SECS / FABRIC_MISS_INSERTS / FABRIC_XDP_FORWARD; attach writes them with node_ip
        dp = Dataplane(str(pin_dir), node_ip, flow_entries=flow_entries, route_netns=netns, settings=settings)
        for iface in ifaces:
            dp.attach(iface, netns)
        return dp, ""
    except Exception as exc:  # noqa: BLE001 - BPF missing or refused: serve the rest, and say why in /v1/health
        log.warning("dataplane not loaded: %s", exc)
        return None, f"dataplane not loaded: {type(exc).__name__}: {exc}"


def _settings(node_ip: str | None):
    """Every variable the agent reads (agent/settings.py); a bad value stops it with exit 2."""
    from agent.settings import AgentSettingsError, load

    try:
        return load(node_ip=node_ip)
    except AgentSettingsError as exc:
        typer.echo(f"error: the agent will not start with these settings: {exc}", err=True)
        raise typer.Exit(2) from None


def _exit_on_term(signum, frame) -> None:
    raise SystemExit(0)


def _bgp_announcer(settings, dp, ifaces: list[str], netns: str | None, state_dir: Path, state: AgentState):
    """The VIP announcer when FABRIC_BGP=1 and the dataplane loaded (nothing to announce without it)."""
    if not settings.enabled:
        return None
    if dp is None:
        log.warning("bgp: FABRIC_BGP=1 but the dataplane is not loaded: announcing nothing")
        return None
    from agent.bgp.announcer import BgpAnnouncer
    from agent.bgp.bird import BirdError

    try:
        bgp = BgpAnnouncer(settings, dp, ifaces, netns, state_dir / "bgp", registry=state.registry)
    except BirdError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    state.bgp = bgp
    bgp.start()
    return bgp


def _resources(cpus: int, memory_gib: float):
    """What the heartbeat reports as free CPU and memory; fixed values for a simulated node."""
    from agent.heartbeat import HostResources, read_host_resources

    if cpus <= 0 and memory_gib <= 0:
        return read_host_resources

    def read() -> HostResources:
        host = read_host_resources()
        return HostResources(cpus or host.cpu_free, memory_gib or host.memory_free_gib)

    return read


def _model_jobs(state_dir: Path, settings):
    """The model cache under {state}/models and its jobs, resumed from their records."""
    from agent.models.cache import ModelCache
    from agent.models.jobs import ModelJobs

    jobs = ModelJobs(ModelCache(state_dir / "models"), settings)
    resumed = jobs.resume_all()
    if resumed:
        log.info("resuming model jobs: %s", ", ".join(resumed))
    return jobs


def _control_plane_client(urls: list[str], plan: TlsPlan, insecure: bool):
    """One client over every fabricd URL, failing over between them (agent.control_plane)."""
    from agent.control_plane import FailoverClient

    verify: ssl.SSLContext | bool = False
    for url in urls:
        if url.startswith("https://"):
            if not plan.enabled:
                raise typer.BadParameter("an https control plane needs this node's certificate (--pki-dir)")
        elif not (url.startswith("http://") and insecure):
            raise typer.BadParameter(f"--control-plane {url!r}: expected https://HOST:PORT (http:// only with --insecure)")
    if plan.enabled:
        from common.pki import client_ssl_context

        verify = client_ssl_context(plan.ca, plan.cert, plan.key)
    return FailoverClient(urls, verify=verify, timeout=10.0)


def _beat_once_listening(server, beat, stop: threading.Event) -> None:
    while not server.started and not stop.is_set():
        time.sleep(0.05)
    if not stop.is_set():
        beat.start(stop)


def serve(
    node_id: str = typer.Option(..., "--node-id", help="this node's id (the CN of its certificate)"),
    listen: str = typer.Option(DEFAULT_LISTEN, "--listen", help="HOST:PORT of the agent API"),
    control_plane: Annotated[list[str] | None, typer.Option(
        "--control-plane", help="fabricd URL, repeatable or comma-separated (every fabricd: the agent fails "
        "over between them); no heartbeat without one")] = None,
    advertise: str = typer.Option(None, "--advertise", help="URL fabricd uses to reach this agent"),
    state_dir: Annotated[Path, typer.Option("--state-dir", help="agent state: records, overlays")] = Path(
        "/var/lib/fabric-agent"),
    pki_dir: Annotated[Path | None,
                       typer.Option("--pki-dir", help="directory with NODE.crt, NODE.key and ca.crt")] = None,
    tls_cert: Annotated[Path | None, typer.Option("--tls-cert")] = None,
    tls_key: Annotated[Path | None, typer.Option("--tls-key")] = None,
    tls_ca: Annotated[Path | None,
                      typer.Option("--tls-ca", help="the cluster CA; callers must present a cert from it")] = None,
    allowed_client_cn: Annotated[list[str] | None, typer.Option(
        "--allowed-client-cn",
        help="CN a caller's certificate must have (repeatable; default: fabricd, the control plane)")] = None,
    kv_index_client_cn: Annotated[list[str] | None, typer.Option(
        "--kv-index-client-cn",
        help="CN that may call /v1/kv-index/* only (repeatable; default: fabric-gateway, the gateways)")] = None,
    insecure: bool = typer.Option(False, "--insecure", help="plain HTTP, loopback only"),
    vm_driver: str = typer.Option("libvirt", "--vm-driver", help="libvirt | lab | dry-run"),
    libvirt_uri: str = typer.Option("qemu:///system", "--libvirt-uri"),
    golden_image: Annotated[Path | None, typer.Option(
        "--golden-image", help="baked qcow2 (scripts/bake-ai-vllm-image.sh); never written")] = None,
    bridge: str = typer.Option("fabric0", "--bridge", help="bridge the guests' taps join"),
    site: str = typer.Option("", "--site", envvar="FABRIC_SITE",
                             help="the site this node is in (docs/sites.md); unset: no site"),
    failure_domain: str = typer.Option("default", "--failure-domain"),
    taint: Annotated[list[str] | None,
                     typer.Option("--taint", help="repeatable; a tainted node takes no replicas")] = None,
    fake_gpus: int = typer.Option(0, "--fake-gpus", help="simulate N GPUs (fake NVML + fake sysfs)"),
    fake_gpu_name: str = typer.Option("h100", "--fake-gpu-name", help="h100, h200, a100, l4 or a name"),
    fake_gpu_mem_gib: float = typer.Option(0, "--fake-gpu-mem-gib", help="override per-GPU memory"),
    models_dir: Annotated[Path | None, typer.Option("--models-dir", help="cached models live under it")] = None,
    pin_dir: Annotated[Path, typer.Option("--pin-dir", help="BPF map pin directory")] = Path("/sys/fs/bpf/fabric"),
    dataplane: bool = typer.Option(True, "--dataplane/--no-dataplane"),
    dataplane_iface: list[str] = typer.Option([], "--dataplane-iface",
                                              help="attach XDP (and the reply-path TC) here; repeatable"),
    dataplane_netns: str = typer.Option(None, "--dataplane-netns",
                                        help="network namespace holding --dataplane-iface (the lab's node)"),
    node_ip: str = typer.Option(None, "--node-ip", help="source NAT address for remote backends"),
    flow_entries: int = typer.Option(None, "--flow-entries", envvar="FABRIC_FLOW_ENTRIES",
                                     help="flows each CPU's list of the flow tables holds, for new maps; "
                                          "default 1048576 up to 2 CPUs, 2Mi / CPUs beyond (kernel memory "
                                          "printed at attach)"),
    sysfs_root: Annotated[Path, typer.Option("--sysfs-root")] = Path("/sys"),
    hugepages: str = typer.Option("auto", "--hugepages",
                                  help="libvirt guests: auto (1G pages if reserved, else 2M, else none) | 1G | 2M | off"),
    numa: str = typer.Option("auto", "--numa", help="libvirt guests: pin vCPUs and memory to the GPUs' NUMA node "
                             "(auto) or not (off)"),
    readonly_share: str = typer.Option("auto", "--readonly-share",
                                       help="model share: auto | virtiofs (<readonly/>, libvirt 11 + virtiofsd "
                                       "1.13) | bind (read-only bind mount)"),
    domain_type: str = typer.Option("kvm", "--domain-type",
                                    help="libvirt guests: kvm (refused where the KVM probe fails) | auto (GPU-less "
                                    "guests under TCG where KVM does not work; GPU guests are always refused then)"),
    heartbeat_secs: float = typer.Option(10.0, "--heartbeat-secs", min=0.1),
    cpus: int = typer.Option(0, "--cpus", help="CPUs offered to replicas (default: what the host reports)"),
    memory_gib: float = typer.Option(0, "--memory-gib", help="memory offered to replicas (default: what the host reports)"),
    lab_netns: str = typer.Option(None, "--lab-netns"),
    lab_bridge: str = typer.Option(None, "--lab-bridge"),
    lab_subnet: str = typer.Option(None, "--lab-subnet"),
    lab_gateway: str = typer.Option(None, "--lab-gateway"),
    log_level: str = typer.Option("info", "--log-level"),
) -> None:
    """Serve the agent API (mutual TLS) and heartbeat to fabricd."""
    import uvicorn

    from agent.api import DEFAULT_ALLOWED_CLIENT_CNS, DEFAULT_KV_INDEX_CNS, create_app
    from agent.heartbeat import Heartbeat
    from common.schemas import check_name

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s")
    from common.health import quiet_probes

    quiet_probes()  # health checks and scrapes log at DEBUG
    try:
        check_name(node_id, "--node-id")
        if site:
            check_name(site, "--site (FABRIC_SITE)")
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    if vm_driver not in VM_DRIVERS:
        raise typer.BadParameter(f"--vm-driver {vm_driver!r}: expected one of {', '.join(VM_DRIVERS)}")
    host, port = parse_listen(listen)
    plan = tls_plan(node_id, host, insecure, tls_cert, tls_key, tls_ca, pki_dir)
    if plan.refusal:
        typer.echo(f"error: {plan.refusal}", err=True)
        raise typer.Exit(2)
    # 0700 and files 0600: the state dir holds the agent's records (and cloud-init seeds). Under
    # libvirt, qemu runs as its own user and must reach its disks, so there the dir is 0711 (no
    # listing) and files keep the usual umask; keys live in --pki-dir (fabricctl writes it 0700).
    if vm_driver == "libvirt":
        private_dir(state_dir, 0o711)
    else:
        restrict_umask()
        private_dir(state_dir)
    settings = _settings(node_ip)
    inventory, binder = _inventory_and_binder(state_dir, vm_driver, fake_gpus, fake_gpu_name,
                                              fake_gpu_mem_gib, sysfs_root, settings.vfio_keep_bound)
    lab = {"node_netns": lab_netns, "bridge": lab_bridge, "subnet": lab_subnet, "gateway": lab_gateway}
    dp, dp_message = _dataplane(dataplane, pin_dir, node_ip, dataplane_iface, dataplane_netns,
                                flow_entries, settings.dataplane)
    models = _model_jobs(state_dir, settings.models)
    state = AgentState(node_id=node_id, models=models, settings=settings, vm_driver=_vm_driver(vm_driver, state_dir, libvirt_uri, lab, {
        "image": golden_image, "models_dir": models_dir, "bridge": bridge, "hugepages": hugepages, "numa": numa,
        "readonly_share": readonly_share, "sysfs_root": sysfs_root, "binder": binder, "domain_type": domain_type,
        "images_dir": settings.images_dir, "secrets": settings.secrets},
        settings.lab_engine),
                       inventory=inventory, binder=binder, dataplane=dp, dataplane_message=dp_message,
                       site=site, failure_domain=failure_domain, taints=list(taint or []), models_dir=models_dir,
                       services=ServiceGenerations(state_dir / GENERATIONS_FILE))
    state.kvm = getattr(state.vm_driver, "kvm", None)
    from agent.kv_index.service import KvIndexService

    state.kv_index = KvIndexService(state.vm_driver, state.registry)  # replicas' KV events (docs/kv-events.md)
    if state.kvm is not None:  # probe now, off the request path (kept per boot: later reads are free)
        threading.Thread(target=state.kvm.state, name="kvm-probe", daemon=True).start()
    bgp = _bgp_announcer(settings.bgp, dp, dataplane_iface, dataplane_netns, state_dir, state)
    from agent.fail_closed import FailClosed

    state.fail_closed = FailClosed(dp, bgp, settings.fail_closed_window_s)
    stop = threading.Event()
    beat = None
    if control_plane:
        smi = None
        if fake_gpus <= 0:
            from agent.hw.nvidia_smi import read_smi as smi
        from agent.control_plane import split_urls

        beat = Heartbeat(state, _control_plane_client(split_urls(control_plane), plan, insecure),
                         advertised_address(host, port, plan.enabled, advertise),
                         interval_s=heartbeat_secs, smi_reader=smi,
                         resources=_resources(cpus, memory_gib))
        if settings.observe_engines:  # this host's engines, scraped here and reported (agent.engine_watch)
            from agent.engine_watch import EngineWatch, TargetBook

            state.engines = EngineWatch(state.node_id, state.vm_driver, TargetBook(state_dir / "engine-targets"),
                                        beat.client, interval_s=settings.observe_secs,
                                        scrape_timeout_s=settings.scrape_timeout_s)
            state.engines.start(stop)
    ssl_args: dict = {}
    if plan.enabled:
        ssl_args = uvicorn_mtls_kwargs(plan)
        from agent.join import export_expiry

        export_expiry(state.registry, plan.cert)  # alerted on in docs/dashboards/fabric-alerts.yml
    allowed = allowed_client_cn or list(DEFAULT_ALLOWED_CLIENT_CNS)
    if bgp is not None:
        # uvicorn re-raises the SIGTERM it shut down for once it restores the handlers it found:
        # with this one the process leaves through the finally below (withdraw, Cease) instead of dying.
        signal.signal(signal.SIGTERM, _exit_on_term)
    try:
        app = create_app(state, allowed_client_cns=allowed,
                         kv_index_cns=kv_index_client_cn or list(DEFAULT_KV_INDEX_CNS))
        server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level=log_level, **ssl_args))
        if beat is not None:
            # fabricd learns of this node only once its API answers: a registered node whose port
            # still refuses (app start, BPF compile) would get VM creates and scrapes that fail.
            threading.Thread(target=_beat_once_listening, args=(server, beat, stop),
                             name="heartbeat-start", daemon=True).start()
        server.run()
    finally:
        stop.set()
        if bgp is not None:
            bgp.stop()  # withdraw every VIP, then close the sessions
