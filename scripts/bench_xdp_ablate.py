#!/usr/bin/env python3
"""Ablations of xdp_maglev measured side by side; prints one JSON object.

Each variant is dataplane/bpf/maglev.c with one text substitution, compiled into
its own pin directory (its own maps) and timed in the same interleaved rounds as
the unchanged program (each round in another order), with scripts/bench-xdp's harness: non-VIP (the program
alone, as bench-xdp times it), new flow (SYN, every pass a distinct flow, full
1M-entry table) and established cold (64k flows rotating) through bench.c's
wrapper (dsr-ipip new flows with dataplane/bench/ipip_pop.c in front, as bench-xdp), whose own cost around XDP_PASS is measured in the same round and
subtracted. Medians over ROUNDS. Substitutions that remove something the
product needs (a counter the agent exports) only say what it costs.
docs/dataplane.md ("Tried and discarded") records the outcomes.
BENCH_NODE_IP=10.1.255.254 source-NATs every NAT flow (the source-NAT variants): then
only new flows are timed, into tables that start empty, with equal weights, and
REPEAT small enough (20000) that no backend runs out of its 4523 ports;
BENCH_VARIANTS=a,b runs a subset.
Run under `flock /tmp/fabric-bench.lock`.
"""

# Run under the project's venv (BCC, scapy) whichever python3 started the script.
import os as _os
import sys as _sys
from pathlib import Path as _Path

_VENV_PY = _Path(__file__).resolve().parents[1] / ".venv" / "bin" / "python"
if _VENV_PY.exists() and _Path(_sys.prefix).resolve() != _VENV_PY.parents[1].resolve():
    _os.execv(str(_VENV_PY), [str(_VENV_PY), *_sys.argv])

import argparse
import importlib.machinery
import importlib.util
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from xdp_bench_wrapper import BenchWrapper, enter_netns, load_ipip_pop, packet

from agent.dataplane import Dataplane, loader
from agent.dataplane.testrun import run_xdp
from agent.settings import DataplaneSettings

REPEAT = int(os.environ.get("BENCH_REPEAT", "1000000"))
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "5"))
FLOW_ENTRIES = int(os.environ.get("BENCH_FLOW_ENTRIES", str(loader.FLOW_ENTRIES)))
WORKING_SET = 65536  # bench.c
# node_ip for every plane: all backends (routed, not behind a bridge) are then source-NATed
NODE_IP = os.environ.get("BENCH_NODE_IP") or None
# a subset of VARIANTS (comma separated); as_built always runs
ONLY = [v for v in os.environ.get("BENCH_VARIANTS", "").split(",") if v]
DSR_VIP = "10.9.0.101"
SOURCES = loader.BPF_DIR  # the committed sources (loader.BPF_DIR is pointed at each variant's copy)

NON_VIP_TEST = "!vip_filter_hit(*(__be32 *)(data + ETH_HLEN + offsetof(struct iphdr, daddr))))"
NON_VIP_EXIT = NON_VIP_TEST + """
        return count(VERDICT_PASS_NOT_VIP, XDP_PASS);"""
# name -> (file, old text, new text, what it tells)
VARIANTS: dict[str, tuple[str, str, str, str]] = {
    "nonvip_uncounted": ("maglev.c", NON_VIP_EXIT, NON_VIP_TEST + """
        return XDP_PASS;""", "non-VIP packets not counted at all (what the per-CPU counter costs)"),
    "nonvip_cpu_slot": ("maglev.c", NON_VIP_EXIT, NON_VIP_TEST + """ {
        __u32 cpu = bpf_get_smp_processor_id();
        struct cpu_count *c = nonvip_cpu.lookup(&cpu);
        if (c)
            c->n += 1;
        return XDP_PASS;
    }""", ("non-VIP counted in a plain array slot (one cache line) per CPU, indexed by "
           "bpf_get_smp_processor_id")),
    "nonvip_no_filter_read": ("maglev.c", NON_VIP_TEST,
                              ("*(__be32 *)(data + ETH_HLEN + 16) != bpf_htonl(0x0A090064) && "
                               "*(__be32 *)(data + ETH_HLEN + 16) != bpf_htonl(0x0A090065))"),
                              "the filter read replaced by one compare (what the array read costs)"),
    "syn_clock_tcp": ("maglev.c", "    if (fk->proto == IPPROTO_UDP)  /* only UDP flows expire; a TCP flow never reads its clock */\n",
                      "    if (1)\n",
                      "bpf_ktime_get_ns on every new flow, TCP too (the code before; TCP never reads last_seen)"),
    "snat_syn_search": ("maglev.c", "        out->snat_port = syn ? 0 : snat_find(fk, &reply, hash);\n",
                        "        out->snat_port = snat_find(fk, &reply, hash);\n",
                        "a source-NAT SYN searches its probe sequence for a surviving entry of its own "
                        "(the code before; run with BENCH_NODE_IP)"),
    "nat_reverse_entry": ("maglev.c", """    flows.update(fk, out);  /* its replies find it by their addresses (reply_flow) */""",
                          """    struct reverse_flow rev = {};
    rev_of(&rev, fk);
    rev.snat = 0;
    reply.src = out->backend_ip;
    reply.sport = out->backend_port;
    reply.proto = fk->proto;
    reply.dst = fk->src;
    reply.dport = fk->sport;
    reverse_flows.update(&reply, &rev);
    flows.update(fk, out);""", "a nat new flow also writes a reverse entry for its replies (the design before "
                          "reply_flow: what the second LRU insert costs)"),
    "syn_no_miss_counter": ("maglev.c", """        if (m) {
            if (syn)""", """        if (0) {
            if (syn)""", "the per-service miss counter not kept (what it costs a new flow)"),
}
# name -> (Dataplane options, what it tells): the committed sources, loaded another way
PLANE_VARIANTS: dict[str, tuple[dict, str]] = {
    "common_lru": ({"percpu_lru": False}, "the flow tables with one LRU list shared by all CPUs instead of one per "
                   "CPU: what the per-CPU lists cost an insert on one CPU"),
    "percpu_split": ({"percpu_full": False}, "the flow tables split over the CPUs' lists (the layout before each "
                     "CPU's list held the whole table): what the larger tables cost"),
}
CPU_SLOT_MAP = """
struct cpu_count {
    __u64 n;
    __u64 pad[7];
};
BPF_ARRAY(nonvip_cpu, struct cpu_count, 128);
"""


def variant_dir(name: str) -> Path:
    """A copy of dataplane/bpf with the variant's substitution (checked to apply once)."""
    out = Path(tempfile.mkdtemp(prefix=f"ablate-{name}-"))
    for f in SOURCES.iterdir():
        if f.is_file():
            shutil.copy(f, out / f.name)
    if name == "as_built" or name in PLANE_VARIANTS:
        return out
    fname, old, new, _ = VARIANTS[name]
    text = (out / fname).read_text()
    assert text.count(old) == 1, f"{name}: the text to replace is not in {fname} exactly once"
    text = text.replace(old, new)
    if name == "nonvip_cpu_slot":
        text = text.replace('#include "xmit.h"\n', '#include "xmit.h"\n' + CPU_SLOT_MAP)
    (out / fname).write_text(text)
    return out


def main() -> None:
    argparse.ArgumentParser(prog="bench_xdp_ablate.py", description=__doc__.splitlines()[0],
                            epilog="BENCH_VARIANTS=a,b runs a subset; BENCH_NODE_IP source-NATs").parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a timeout's kill still removes the pins and namespaces
    spec = importlib.util.spec_from_loader("bench_xdp", importlib.machinery.SourceFileLoader(
        "bench_xdp", str(ROOT / "scripts" / "bench-xdp")))
    bench_xdp = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench_xdp)
    os.sched_setaffinity(0, {0})  # bench_seq and the LRU lists are per CPU
    vip_addr = "10.9.0.100"
    # source NAT: equal weights, so no backend runs out of its 4523 ports before the others
    backends = {f"10.1.{i // 250}.{i % 250 + 1}:8080": 1 if NODE_IP else 1 + i % 32 for i in range(100)}
    ns = bench_xdp.bench_netns(backends)
    names = ["as_built", *(ONLY or [*VARIANTS, *PLANE_VARIANTS])]
    planes: dict[str, Dataplane] = {}
    dirs: list[Path] = []
    pins: list[str] = []  # noted before each Dataplane pins its maps there, so a kill midway leaves none
    try:
        for name in names:
            d = variant_dir(name)
            dirs.append(d)
            loader.BPF_DIR = d  # load() compiles BPF_DIR / maglev.c
            pins.append(f"/sys/fs/bpf/fabric-ablate-{uuid.uuid4().hex[:8]}")
            dp = Dataplane(pin_dir=pins[-1], flow_entries=FLOW_ENTRIES, route_netns=ns,
                           **PLANE_VARIANTS.get(name, ({}, ""))[0])
            planes[name] = dp
            dp.configure(node_ip=NODE_IP, settings=DataplaneSettings(xdp_forward=True))
            dp.put_service(vip_addr, 80, "tcp", backends)
            dp.put_service(DSR_VIP, 80, "tcp", {f"{b.split(':')[0]}:80": 1 for b in backends}, forwarding="dsr-ipip")
        enter_netns(ns)
        h = BenchWrapper()
        vip, syn, other = packet(vip_addr), packet(vip_addr, flags="S"), packet("10.5.5.5")
        dsr_syn = packet(DSR_VIP, flags="S")
        shim, shim_fd = load_ipip_pop(h.wrapper.fd)  # pops the outer header each dsr-ipip pass pushed
        for dp in planes.values() if not NODE_IP else ():  # steady state: every table full before timing
            h.wrap(dp.xdp_fd, syn, 1)
            run_xdp(h.wrapper.fd, syn, repeat=2 * FLOW_ENTRIES)
        times: dict[str, dict[str, list[int]]] = {n: {"nonvip": [], "new": [], "cold": [], "dnew": []}
                                                  for n in names}
        base: dict[str, list[int]] = {"bare": [], "wvary": [], "wcold": [], "dwvary": []}
        exhausted: dict[str, int] = {}  # variant -> new flows dropped for want of a port
        current = ["as_built"]

        def run(fd: int, raw: bytes, verdict: str | None, dp: Dataplane | None, repeat: int = REPEAT) -> int:
            before = dp.verdict_counters() if dp else {}
            ns_ = run_xdp(fd, raw, repeat=repeat).duration_ns
            if dp:
                after = dp.verdict_counters()
                seen = {k: after[k] - before[k] for k in after if after[k] != before[k]}
                want = {verdict: repeat} if verdict else {}
                if NODE_IP and "drop_snat_exhausted" in seen:  # counted, reported (snat_exhausted)
                    exhausted[current[0]] = exhausted.get(current[0], 0) + seen["drop_snat_exhausted"]
                    want = {verdict: repeat - seen["drop_snat_exhausted"], "drop_snat_exhausted":
                            seen["drop_snat_exhausted"]}
                if not (verdict == "pass_not_vip" and not seen):  # an uncounted variant counts nothing
                    assert seen == want, (seen, want)
            return ns_

        for r in range(ROUNDS):
            base["bare"].append(run(h.bare.fd, other, None, None))
            h.wrap(h.bare.fd, vip, 1)
            base["wvary"].append(run(h.wrapper.fd, vip, None, None))
            h.wrap(h.bare.fd, vip, 2)
            base["wcold"].append(run(h.wrapper.fd, vip, None, None))
            h.wrap(h.bare.fd, dsr_syn, 1)
            base["dwvary"].append(run(shim_fd, dsr_syn, None, None))
            for name in names[r % len(names):] + names[:r % len(names)]:  # each round another order
                dp = planes[name]
                current[0] = name
                times[name]["nonvip"].append(run(dp.xdp_fd, other, "pass_not_vip", dp))
                h.wrap(dp.xdp_fd, syn, 1)
                times[name]["new"].append(run(h.wrapper.fd, syn, "fwd_new_flow", dp))
                if NODE_IP:  # source NAT: new flows only (a table that fills runs out of ports)
                    times[name]["cold"].append(0)
                    times[name]["dnew"].append(0)
                    continue
                h.wrap(dp.xdp_fd, syn, 2)
                run(h.wrapper.fd, syn, "fwd_new_flow", dp, repeat=WORKING_SET)
                h.wrap(dp.xdp_fd, vip, 2)
                times[name]["cold"].append(run(h.wrapper.fd, vip, "fwd_established", dp))
                h.wrap(dp.xdp_fd, dsr_syn, 1)
                times[name]["dnew"].append(run(shim_fd, dsr_syn, "fwd_new_flow", dp))
        med = {k: int(statistics.median(v)) for k, v in base.items()}
        out: dict = {"repeat": REPEAT, "rounds": ROUNDS, "flow_table_entries": FLOW_ENTRIES, "node_ip": NODE_IP,
                     "snat_exhausted_drops": exhausted,
                     "baseline_pass_ns": med["bare"], "load_average": os.getloadavg()[0], "variants": {}}
        for name in names:
            t = {k: int(statistics.median(v)) for k, v in times[name].items()}
            out["variants"][name] = {
                "non_vip_ns": t["nonvip"], "non_vip_all_rounds": times[name]["nonvip"],
                "vip_new_flow_ns": t["new"] - med["wvary"] + med["bare"],
                "vip_established_cold_ns": t["cold"] - med["wcold"] + med["bare"],
                "dsr_vip_new_flow_ns": t["dnew"] - med["dwvary"] + med["bare"],
                "what": VARIANTS[name][3] if name in VARIANTS else PLANE_VARIANTS[name][1]
                if name in PLANE_VARIANTS else "maglev.c as committed",
            }
        shim.cleanup()
        h.close()
        print(json.dumps(out))
    finally:
        for dp in planes.values():
            dp.close()
        for pin in pins:
            shutil.rmtree(pin, ignore_errors=True)
        for d in dirs:
            shutil.rmtree(d, ignore_errors=True)
        for name in (ns, ns + "p"):
            subprocess.run(["ip", "netns", "del", name], check=False, capture_output=True, timeout=30)


if __name__ == "__main__":
    main()
