"""The pin directory: one writer at a time across processes, versioned pins
(a layout mismatch is refused, stale pins removed by detach), node_ip written only
by attach or an explicit setting, VIPs on the node's own addresses refused."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agent.dataplane.addresses import ip_to_map, port_to_map
from agent.dataplane.cli import maglev_app
from agent.dataplane.pins import LAYOUT_VERSION, read_meta, remove_stale_pins
from common.errors import Conflict, InvalidInput
from tests.support.bpf import TEST_FLOW_ENTRIES, open_dataplane

HERE = Path(__file__).resolve().parent


def test_two_writer_processes_never_collide(pin_dir):
    open_dataplane(pin_dir).close()  # create the maps once (test-sized)
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
    dp = open_dataplane(pin_dir)
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


def test_layout_mismatch_is_refused_and_opening_keeps_the_recorded_sizes(pin_dir):
    open_dataplane(pin_dir, table_size=1021).close()
    meta = read_meta(pin_dir)
    assert (meta.layout_version, meta.table_size, meta.flow_entries) == (LAYOUT_VERSION, 1021, TEST_FLOW_ENTRIES)
    with pytest.raises(Conflict, match="table_size 1021"):
        open_dataplane(pin_dir, table_size=65537)
    with pytest.raises(Conflict, match="flow_entries"):
        open_dataplane(pin_dir, flow_entries=4096)
    dp = open_dataplane(pin_dir, flow_entries=None)  # no sizes named: the recorded ones
    try:
        assert (dp.table_size, dp.flow_entries) == (1021, TEST_FLOW_ENTRIES)
    finally:
        dp.close()
    assert remove_stale_pins(pin_dir) == []  # the current layout stays


def test_pins_of_an_older_layout_are_refused_and_removed_by_detach(pin_dir, tmp_path):
    open_dataplane(pin_dir).close()
    os.unlink(os.path.join(pin_dir, "meta"))  # as an agent before layout records left them
    with pytest.raises(Conflict, match="older fabric-agent"):
        open_dataplane(pin_dir)
    ns = f"fabpin-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        subprocess.run(["ip", "-n", ns, "link", "add", "d0", "type", "veth", "peer", "name", "d1"], check=True)
        result = CliRunner().invoke(maglev_app, ["detach", "--iface", "d0", "--netns", ns, "--pin-dir", pin_dir])
        assert result.exit_code == 0, result.output
        assert "removed stale pins" in result.output
    finally:
        subprocess.run(["ip", "netns", "del", ns], check=False)
    assert os.listdir(pin_dir) == []
    open_dataplane(pin_dir).close()  # a fresh start works


def test_node_ip_is_written_only_by_attach_or_an_explicit_setting(pin_dir):
    dp = open_dataplane(pin_dir, "10.2.0.1")
    try:
        assert dp.live_node_ip() == "10.2.0.1"
        other = open_dataplane(pin_dir, node_ip=None)
        reader = type(other)(pin_dir=pin_dir, node_ip="10.7.7.7")  # an opener naming another node_ip
        try:
            assert other.live_node_ip() == reader.live_node_ip() == "10.2.0.1"
        finally:
            other.close()
            reader.close()
        dp.configure(node_ip="10.2.0.9")
        assert dp.live_node_ip() == "10.2.0.9"
    finally:
        dp.close()


def test_vip_on_an_address_of_the_node_is_refused(pin_dir):
    dp = open_dataplane(pin_dir, "10.2.0.1")
    try:
        for vip in ("127.0.0.1", "10.2.0.1"):
            with pytest.raises(InvalidInput, match="address of this node"):
                dp.put_service(vip, 22, "tcp", {"10.1.0.11:22": 1})
        assert dp.list_services() == []
    finally:
        dp.close()
