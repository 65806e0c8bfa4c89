"""The pin directory: one writer at a time across processes, versioned pins
(a layout mismatch is refused, stale pins removed by detach), node_ip written only
by attach or an explicit setting, VIPs on the node's own addresses refused, and the
plan generations an agent held outliving its process as the pinned maps do."""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agent.dataplane import Dataplane
from agent.dataplane.addresses import ip_to_map, port_to_map
from agent.dataplane.cli import maglev_app
from agent.dataplane.pins import LAYOUT_VERSION, read_meta, remove_stale_pins
from agent.service_generations import GENERATIONS_FILE, ServiceGenerations, StaleGeneration
from common.agent_api import MaglevServiceSpec
from common.errors import Conflict, InvalidInput
from lab.rigs.bpf import TEST_FLOW_ENTRIES, open_dataplane

HERE = Path(__file__).resolve().parent


def test_two_writer_processes_never_collide(pin_dir):
    # both create-or-open the same (absent) pins, then write at the same moment
    env = dict(os.environ, PYTHONPATH=str(HERE.parents[1]))
    procs = [subprocess.Popen([sys.executable, str(HERE / "writer_proc.py"), pin_dir, str(first), "8"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
             for first in (20, 40)]
    try:
        for p in procs:
            assert p.stdout.readline().strip() == "ready"
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        for p in procs:
            assert p.stdout.readline().strip() == "done"
            assert p.wait(timeout=120) == 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    dp = open_dataplane(pin_dir, programs=False)  # reads only: no compile
    try:
        services = dp._read_services()
        assert len(services) == 16
        ids = [svc.id for svc in services.values()]
        assert len(set(ids)) == 16  # unlocked, two processes picked the same free id
        for addr, svc in services.items():
            slot = dp._service_slots[ctypes.c_uint32(svc.id)]
            assert (slot.vip, slot.pad) == (dp._service_key(addr).vip, 1)
        backends = dp._read_backends()
        assert len(backends) == 32  # every service has its own two backend ids
        assert dp._filter_words() == list(dp._vip_filter[ctypes.c_uint32(0)].words)
        # the backend all 16 share belongs to every one of them (no lost mask update)
        key = dp._backend_addrs.Key()
        key.ip, key.port = ip_to_map("10.1.0.99"), port_to_map(8080)
        assert dp._backend_addrs[key].value == sum(1 << i for i in ids)
    finally:
        dp.close()


def test_a_restarted_writer_keeps_the_maps_and_refuses_an_older_generation(pin_dir, tmp_path):
    """Generation 6 written through the real maps, the process gone (its handle closed), a new
    one on the same pins and state file: generation 5 arriving late is refused and writes
    nothing; the new process reports 6 for the service its maps hold."""
    path = tmp_path / GENERATIONS_FILE
    spec = MaglevServiceSpec(generation=6, backends={"10.1.0.11:8080": 20, "10.1.0.12:8080": 1})
    dp = open_dataplane(pin_dir)
    try:
        assert ServiceGenerations(path).put(dp, "10.9.3.1", 80, "tcp", spec)
    finally:
        dp.close()
    dp = open_dataplane(pin_dir, programs=False)
    try:
        restarted = ServiceGenerations(path)
        late = spec.model_copy(update={"generation": 5, "backends": {"10.1.0.11:8080": 1}})
        with pytest.raises(StaleGeneration) as refused:
            restarted.put(dp, "10.9.3.1", 80, "tcp", late)
        assert refused.value.held == 6
        view = dp.get_service("10.9.3.1", 80, "tcp")
        assert {b.address: b.weight for b in view.backends} == {"10.1.0.11:8080": 20, "10.1.0.12:8080": 1}
        assert restarted.report(dp) == {"10.9.3.1:80/tcp": 6}
    finally:
        dp.close()


def test_layout_mismatch_is_refused_and_opening_keeps_the_recorded_sizes(pin_dir):
    open_dataplane(pin_dir, table_size=1021).close()
    meta = read_meta(pin_dir)
    assert (meta.layout_version, meta.table_size, meta.flow_entries) == (LAYOUT_VERSION, 1021, TEST_FLOW_ENTRIES)
    with pytest.raises(Conflict, match="table_size 1021"):
        open_dataplane(pin_dir, table_size=65537)
    with pytest.raises(Conflict, match="flow_entries"):
        open_dataplane(pin_dir, flow_entries=4096)
    dp = open_dataplane(pin_dir, flow_entries=None, programs=False)  # no sizes named: the recorded ones
    try:
        assert (dp.table_size, dp.flow_entries) == (1021, TEST_FLOW_ENTRIES)
    finally:
        dp.close()
    assert remove_stale_pins(pin_dir) == []  # the current layout stays


def tc_filter_ids(iface: str, netns: str) -> list[tuple[int, int]]:
    """(pref, BPF program id) of the bpf filters on the device's egress (pyroute2 does not decode the id)."""
    out = subprocess.run(["tc", "-n", netns, "-j", "filter", "show", "dev", iface, "egress"],
                         check=True, capture_output=True, text=True).stdout
    return [(f["pref"], f["options"]["prog"]["id"]) for f in json.loads(out)
            if f.get("kind") == "bpf" and "options" in f]


@pytest.mark.full  # 17 s; make test keeps the refusal of a mismatched layout (the test above)
def test_pins_of_an_older_layout_are_refused_and_removed_by_detach(pin_dir, tmp_path, plain_plane):
    # pins without a layout record, as an agent before records left them: the session's maps
    # linked into pin_dir without their meta (no compile of their own; detach unlinks only these)
    os.makedirs(pin_dir)
    for name in os.listdir(plain_plane.pin_dir):
        if name != "meta":
            os.link(os.path.join(plain_plane.pin_dir, name), os.path.join(pin_dir, name))
    with pytest.raises(Conflict, match="older fabric-agent"):
        open_dataplane(pin_dir)
    ns = f"fabpin-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        subprocess.run(["ip", "-n", ns, "link", "add", "d0", "type", "veth", "peer", "name", "d1"], check=True)
        result = CliRunner().invoke(maglev_app, ["detach", "--iface", "d0", "--netns", ns, "--pin-dir", pin_dir])
        assert result.exit_code == 0, result.output
        assert "removed stale pins" in result.output
        assert os.listdir(pin_dir) == []
        # a fresh start works; a second agent's attach replaces the TC filter in place
        first, second = open_dataplane(pin_dir), None
        try:
            first.attach("d0", ns)
            [(prio, first_id)] = tc_filter_ids("d0", ns)
            second = open_dataplane(pin_dir)
            second.attach("d0", ns)
            [(prio_after, second_id)] = tc_filter_ids("d0", ns)  # one filter: replaced, not added
            assert prio_after == prio and second_id != first_id
        finally:
            first.close()
            if second is not None:
                second.close()
    finally:
        subprocess.run(["ip", "netns", "del", ns], check=False)


def test_node_ip_is_written_only_by_attach_or_an_explicit_setting_and_vips_avoid_node_addresses(pin_dir):
    dp = open_dataplane(pin_dir, "10.2.0.1")
    try:
        assert dp.live_node_ip() == "10.2.0.1"
        opener = Dataplane(pin_dir=pin_dir, node_ip="10.7.7.7", programs=False)  # opening (the CLI) writes no node_ip
        try:
            assert opener.live_node_ip() == dp.live_node_ip() == "10.2.0.1"
        finally:
            opener.close()
        # a VIP on an address of the node would take the node's own traffic (SSH)
        for vip in ("127.0.0.1", "10.2.0.1"):
            with pytest.raises(InvalidInput, match="address of this node"):
                dp.put_service(vip, 22, "tcp", {"10.1.0.11:22": 1})
        assert dp.list_services() == []
        dp.configure(node_ip="10.2.0.9")  # the explicit setting
        assert dp.live_node_ip() == "10.2.0.9"
    finally:
        dp.close()
