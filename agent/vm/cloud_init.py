"""The cloud-init NoCloud seed for a replica: meta-data, user-data and the cidata ISO.

user-data mounts the host's model share (virtiofs tag "models") read-only at /models and
writes/enables/starts fabric-engine.service, the unit agent/vm/runtime_units.py renders for
the spec's runtime (common/runtimes.py), serving the model on the spec's port (8000) with
tensor and pipeline parallel sizes chosen from the model's config.json and the GPU count
(agent.vm.parallelism; refused with the reason when no split works). A oneshot unit retries
the share's mount and the engine unit is ordered after it and the GPU daemons. A vLLM replica whose model has LoRA
adapters also mounts their share (tag "adapters") read-only at /adapters, and vLLM starts with
--enable-lora, --max-loras, --max-lora-rank and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True, so the
gateway's runtime load call finds ``/adapters/{name}``.

No secret ever goes into a seed: nothing is read from the environment, engine flags that
carry credentials are refused, and the rendered text is checked against the secret values
present in this process's environment before it is written.
"""

from __future__ import annotations

import ipaddress
import re
import shutil
import subprocess
from importlib import resources
from pathlib import Path

import yaml

from agent.vm import runtime_units
from agent.vm.base import VmSpec
from agent.vm.parallelism import choose_parallel, read_model_config
from common.errors import InvalidInput, Refused
from common.runtimes import OPENAI_INCAPABLE, TRTLLM_CONFIG, TRTLLM_CONFIG_PATH

MODELS_TAG = "models"
ADAPTERS_TAG = "adapters"


def images_dir(override: Path | None = None) -> Path:
    """Where the guest pieces live: ``override`` (AgentSettings.images_dir, FABRIC_IMAGES_DIR), else
    package data of agent.vm (images/: in a checkout a link to the repo's images/, in an installed
    wheel the files)."""
    return override if override else Path(str(resources.files("agent.vm").joinpath("images")))


def guest_model_path(spec: VmSpec, models_dir: Path | None = None) -> str:
    """Where the model is inside the guest: under /models, mirroring the host's model dir.

    With ``spec.model_dir`` (a verified digest directory from the model cache) the share is that
    directory and the model is /models itself. Otherwise hf://ORG/NAME[@REV] is expected at
    MODELS_DIR/ORG/NAME; a host path must be under the shared model dir, or only its last
    component is used.
    """
    source = spec.model_source
    if spec.model_dir is not None:
        return "/models"  # the share is the verified digest directory itself
    if source.startswith("hf://"):
        return "/models/" + source[len("hf://") :].split("@", 1)[0].strip("/")
    path = Path(source.removeprefix("file://"))
    if models_dir is not None:
        try:
            return "/models/" + path.relative_to(models_dir).as_posix()
        except ValueError:
            raise InvalidInput(
                f"model_source {source!r} is not under the shared model directory {models_dir}"
            ) from None
    return "/models/" + path.name


def host_model_dir(spec: VmSpec, models_dir: Path | None) -> Path | None:
    """The model's directory on the host (what the guest sees at its model path), if known."""
    if spec.model_dir is not None:
        return Path(spec.model_dir)
    if models_dir is None:
        return None
    return Path(models_dir) / guest_model_path(spec, models_dir).removeprefix("/models").lstrip("/")


GGUF_MAGIC = b"GGUF"
_SPLIT = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$")


def gguf_file(host_dir: Path | None) -> str:
    """The .gguf file llama-server's -m loads, relative to the model directory: the one model
    file (mmproj projector files aside), or the first part of a split model; checked to start
    with GGUF's magic as llama.cpp checks it."""
    if host_dir is None or not Path(host_dir).is_dir():
        raise InvalidInput("runtime llama.cpp loads one .gguf file: the model's directory is not on this host")
    files = sorted(p for p in Path(host_dir).rglob("*.gguf") if "mmproj" not in p.name.lower())
    firsts = [p for p in files if not _SPLIT.search(p.name) or _SPLIT.search(p.name).group(1) == "00001"]
    if len(firsts) != 1:
        found = ", ".join(p.relative_to(host_dir).as_posix() for p in firsts) or "none"
        raise InvalidInput(f"runtime llama.cpp loads one .gguf file; the model directory has {found}: "
                           "keep one quantization per model")
    with open(firsts[0], "rb") as f:
        if f.read(4) != GGUF_MAGIC:
            raise InvalidInput(f"{firsts[0].name} is not a GGUF file (no GGUF magic)")
    return firsts[0].relative_to(host_dir).as_posix()


def render_engine_unit(spec: VmSpec, models_dir: Path | None = None, images: Path | None = None) -> str:
    if spec.runtime in OPENAI_INCAPABLE:
        raise InvalidInput(f"runtime {spec.runtime}: {OPENAI_INCAPABLE[spec.runtime]}")
    host_dir = host_model_dir(spec, models_dir)
    config = read_model_config(host_dir) if host_dir is not None else None
    plan = choose_parallel(config, len(spec.gpus), pipeline_ok=spec.runtime == "vllm")
    extra = tuple(spec.extra_args)
    if plan.pipeline > 1:
        extra = ("--pipeline-parallel-size", str(plan.pipeline), *extra)
    extra = (*lora_args(spec), *extra)
    model_path = guest_model_path(spec, models_dir)
    if spec.runtime == "llama.cpp":
        model_path = f"{model_path.rstrip('/')}/{gguf_file(host_dir)}"
    return runtime_units.render_unit(
        images_dir(images), spec.runtime, model_path=model_path, served_name=spec.model_name,
        port=spec.port, tensor_parallel=plan.tensor, max_model_len=spec.max_model_len, extra_args=extra,
        environment=LORA_ENV if has_adapters(spec) else None,
        mounts=("/models", "/adapters") if has_adapters(spec) else ("/models",))


# vLLM serves /v1/load_lora_adapter and /v1/unload_lora_adapter only with this set.
LORA_ENV = {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}


def has_adapters(spec: VmSpec) -> bool:
    """Adapters are shared (and LoRA enabled) for vLLM only: the one runtime with a runtime LoRA API."""
    return spec.adapters_dir is not None and spec.runtime == "vllm"


def lora_args(spec: VmSpec) -> tuple[str, ...]:
    """--enable-lora with --max-loras (the model's max_loaded_adapters) and --max-lora-rank (the
    largest rank of its adapters, when their adapter_config.json says)."""
    if not has_adapters(spec):
        return ()
    args = ["--enable-lora", "--max-loras", str(spec.max_loras or 1)]
    if spec.max_lora_rank:
        args += ["--max-lora-rank", str(spec.max_lora_rank)]
    return tuple(args)


# The share can appear after cloud-init's mounts module ran (virtiofsd slow to start, a
# transient error): retry for up to 5 minutes; the engine unit Requires= this one.
MOUNT_STEP = ("ExecStart=/bin/sh -c 'for i in $(seq 1 60); do mountpoint -q {path} && exit 0; "
              "mount {path} && exit 0; sleep 5; done; exit 1'")


def mount_unit(paths: tuple[str, ...] = ("/models",)) -> str:
    """The oneshot unit mounting each share (fstab entries) read-only, retried for 5 minutes and
    then started again every 30 s (Restart=on-failure, no start limit); the engine unit checks
    the mounts at every start and retries, so it never starts without its model (and adapters)."""
    steps = "\n".join(MOUNT_STEP.format(path=p) for p in paths)
    return f"""[Unit]
Description=Mount the host's model share read-only at {' and '.join(paths)} (retried)
After=local-fs.target
Before=fabric-engine.service
StartLimitIntervalSec=0

[Service]
Type=oneshot
RemainAfterExit=yes
Restart=on-failure
RestartSec=30
{steps}

[Install]
WantedBy=multi-user.target
"""



def build_seed(spec: VmSpec, *, hostname: str, models_dir: Path | None = None, instance_id: str | None = None,
               images: Path | None = None, secrets: tuple[tuple[str, str], ...] = ()) -> tuple[str, str]:
    """hostname: a DNS label (agent.vm.domain_xml.guest_hostname); instance_id: the domain name;
    images: AgentSettings.images_dir; secrets: AgentSettings.secrets (a seed holding one is refused)."""
    meta = yaml.safe_dump({"instance-id": instance_id or hostname, "local-hostname": hostname}, sort_keys=False)
    base_text = (images_dir(images) / "cloud-init/user-data.base.yaml").read_text()
    config = yaml.safe_load(base_text) or {}
    config["hostname"] = hostname
    config["mounts"] = [[MODELS_TAG, "/models", "virtiofs", "ro,nofail", "0", "0"]]
    mounts = ("/models",)
    if has_adapters(spec):  # the adapter set's share (agent.models.adapter_sets), read-only too
        config["mounts"].append([ADAPTERS_TAG, "/adapters", "virtiofs", "ro,nofail", "0", "0"])
        mounts = ("/models", "/adapters")
    config["write_files"] = [
        {
            "path": f"/etc/systemd/system/{runtime_units.UNIT_NAME}",
            "owner": "root:root",
            "permissions": "0644",
            "content": render_engine_unit(spec, models_dir, images),
        },
        {"path": "/etc/systemd/system/fabric-models.service", "owner": "root:root", "permissions": "0644",
         "content": mount_unit(mounts)},
    ]
    if spec.runtime == "tensorrt-llm":
        config["write_files"].append({"path": TRTLLM_CONFIG_PATH, "owner": "root:root", "permissions": "0644",
                                      "content": yaml.safe_dump(TRTLLM_CONFIG, sort_keys=True)})
    if spec.dsr_vips:
        config["write_files"] += dsr_files(spec.dsr_vips)
    config["runcmd"] = [
        ["mkdir", "-p", *mounts],
        ["systemctl", "daemon-reload"],
        # Retried until the share is there; the fstab entry says ro (the host side is read-only too).
        ["systemctl", "enable", "--now", "--no-block", "fabric-models.service"],
        ["systemctl", "enable", "--now", "qemu-guest-agent.service"],
        # Starts once the share is mounted (Requires=fabric-models.service).
        ["systemctl", "enable", "--now", runtime_units.UNIT_NAME],
    ]
    if spec.dsr_vips:
        config["runcmd"].insert(1, ["sysctl", "--system"])
        config["runcmd"].append(["systemctl", "enable", "--now", DSR_UNIT])
    user = "#cloud-config\n" + yaml.dump(config, Dumper=_BlockDumper, sort_keys=False, width=1000)
    check_no_secrets(meta + user, secrets)
    return meta, user


DSR_UNIT = "fabric-dsr.service"
# The VIP must not be answered for on the wire (ARP), and the decapsulated packet arrives
# on tunl0 from a client the guest routes through eth0 (no reverse-path check).
DSR_SYSCTLS = """net.ipv4.conf.all.arp_ignore = 1
net.ipv4.conf.all.arp_announce = 2
net.ipv4.conf.all.rp_filter = 0
net.ipv4.conf.default.rp_filter = 0
net.ipv4.conf.tunl0.rp_filter = 0
"""


def dsr_files(vips: tuple[str, ...]) -> list[dict]:
    """dsr-ipip in the guest (docs/dataplane.md): the ipip module's tunl0 decapsulates what the
    node's XDP program encapsulated, the VIPs sit on loopback, replies go straight to clients."""
    checked = [str(ipaddress.IPv4Address(v)) for v in vips]  # nothing but addresses reaches the unit
    lines = ["[Unit]", "Description=Fabric dsr-ipip: tunl0 up, service VIPs on loopback",
             "Before=" + runtime_units.UNIT_NAME, "", "[Service]", "Type=oneshot", "RemainAfterExit=yes",
             "ExecStart=/sbin/modprobe ipip", "ExecStart=/sbin/ip link set tunl0 up",
             "ExecStart=/sbin/sysctl -q -w net.ipv4.conf.tunl0.rp_filter=0"]
    lines += [f"ExecStart=/sbin/ip addr replace {vip}/32 dev lo" for vip in checked]
    lines += ["", "[Install]", "WantedBy=multi-user.target", ""]
    return [
        {"path": "/etc/modules-load.d/fabric-dsr.conf", "owner": "root:root", "permissions": "0644",
         "content": "ipip\n"},
        {"path": "/etc/sysctl.d/60-fabric-dsr.conf", "owner": "root:root", "permissions": "0644",
         "content": DSR_SYSCTLS},
        {"path": f"/etc/systemd/system/{DSR_UNIT}", "owner": "root:root", "permissions": "0644",
         "content": "\n".join(lines)},
    ]


class _BlockDumper(yaml.SafeDumper):
    """Writes multi-line strings (the unit file) as readable `|` blocks."""


def _str_block(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_BlockDumper.add_representer(str, _str_block)


def check_no_secrets(text: str, secrets: tuple[tuple[str, str], ...]) -> None:
    """Refuse text that contains one of ``secrets`` (AgentSettings.secrets: the agent's own, as read
    at start; defence in depth)."""
    for name, value in secrets:
        if len(value) >= 8 and value in text:
            raise Refused(f"refusing to write a seed that contains the value of ${name}")


def write_seed_iso(directory: Path, meta: str, user: str, *, name: str = "seed.iso",
                   secrets: tuple[tuple[str, str], ...] = ()) -> Path:
    """Write a NoCloud ISO (volume label cidata) with meta-data and user-data; returns its path.

    Uses cloud-localds, genisoimage, mkisofs or xorriso when present, else pycdlib (pure Python).
    """
    check_no_secrets(meta + user, secrets)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / name
    staging = directory / f".{name}.d"
    staging.mkdir(exist_ok=True)
    (staging / "meta-data").write_text(meta)
    (staging / "user-data").write_text(user)
    try:
        command = _iso_command(target, staging)
        if command:
            done = subprocess.run(command, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                raise Refused(f"{command[0]} failed to write the seed: {done.stderr.strip()[:300]}")
        else:
            _write_with_pycdlib(target, meta.encode(), user.encode())
    finally:
        for child in staging.iterdir():
            child.unlink()
        staging.rmdir()
    return target


def _iso_command(target: Path, staging: Path) -> list[str] | None:
    files = [str(staging / "user-data"), str(staging / "meta-data")]
    if shutil.which("cloud-localds"):
        return ["cloud-localds", str(target), files[0], files[1]]
    for tool in ("genisoimage", "mkisofs"):
        if shutil.which(tool):
            return [tool, "-quiet", "-output", str(target), "-volid", "cidata", "-joliet", "-rock", *files]
    if shutil.which("xorriso"):
        return [
            "xorriso",
            "-as",
            "mkisofs",
            "-quiet",
            "-output",
            str(target),
            "-volid",
            "cidata",
            "-joliet",
            "-rock",
            *files,
        ]
    return None


def _write_with_pycdlib(target: Path, meta: bytes, user: bytes) -> None:
    import io

    import pycdlib

    iso = pycdlib.PyCdlib()
    iso.new(interchange_level=3, joliet=3, rock_ridge="1.09", vol_ident="cidata")
    for iso_name, long_name, data in (("METADATA.;1", "meta-data", meta), ("USERDATA.;1", "user-data", user)):
        iso.add_fp(
            io.BytesIO(data), len(data), "/" + iso_name, rr_name=long_name, joliet_path="/" + long_name
        )
    iso.write(str(target))
    iso.close()
