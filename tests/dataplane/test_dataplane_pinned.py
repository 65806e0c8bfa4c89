"""Opening the pinned maps without a compile (pinned.py): the types rebuilt from
the kernel's BTF are the ones BCC compiles, and both handles see each other's writes."""

from __future__ import annotations

import ctypes
import os
import shutil
import struct

import pytest

from agent.dataplane import Dataplane
from agent.dataplane.dataplane import MAP_NAMES
from agent.dataplane.pinned import Btf, Unsupported, open_pinned
from common.errors import Conflict


def _shape(t) -> object:
    """A ctypes type as (name, offset, shape) of its members, arrays as (element, length)."""
    if hasattr(t, "_fields_"):
        return [(name, getattr(t, name).offset, _shape(ft)) for name, ft in t._fields_ if not name.startswith("__pad")]
    if hasattr(t, "_length_"):
        return (_shape(t._type_), t._length_)
    return (ctypes.sizeof(t), t.__name__)


def test_maps_only_handle_has_the_compiled_types_and_shares_the_maps(plain_plane):
    maps_only = Dataplane(pin_dir=plain_plane.pin_dir, programs=False)
    try:
        assert maps_only._prog is None  # nothing compiled
        assert (maps_only.table_size, maps_only.flow_entries) == (plain_plane.table_size, plain_plane.flow_entries)
        for name in MAP_NAMES:
            compiled, pinned = plain_plane._maps[name.encode()], maps_only._maps[name.encode()]
            assert type(pinned).__name__ == "Pinned" + type(compiled).__name__, name
            assert (_shape(pinned.Key), _shape(pinned.Leaf)) == (_shape(compiled.Key), _shape(compiled.Leaf)), name
            assert (pinned.max_entries, pinned.flags) == (compiled.max_entries, compiled.flags), name

        assert maps_only.put_service("10.9.77.1", 80, "tcp", {"10.1.77.10:8080": 1, "10.1.77.11:8080": 3})
        [seen] = [s for s in plain_plane.list_services() if s.vip == "10.9.77.1"]
        assert {b.address: b.weight for b in seen.backends} == {"10.1.77.10:8080": 1, "10.1.77.11:8080": 3}
        assert maps_only.list_services() == plain_plane.list_services()
        assert maps_only.verdict_counters() == plain_plane.verdict_counters()
        assert plain_plane.delete_service("10.9.77.1", 80, "tcp")
        assert all(s.vip != "10.9.77.1" for s in maps_only.list_services())
        with pytest.raises(Conflict, match="maps only"):
            maps_only.attach("lo")
    finally:
        maps_only.close()


def test_a_missing_pin_means_compile(plain_plane, pin_dir):
    os.makedirs(pin_dir)
    for name in MAP_NAMES:
        if name != "rings":
            os.link(os.path.join(plain_plane.pin_dir, name), os.path.join(pin_dir, name))
    assert open_pinned(pin_dir, MAP_NAMES) is None
    shutil.rmtree(pin_dir)
    assert open_pinned(pin_dir, MAP_NAMES) is None


def _btf(types: bytes, strings: bytes) -> bytes:
    return struct.pack("<HBBIIIII", 0xEB9F, 1, 0, 24, 0, len(types), len(types), len(strings)) + types + strings


def test_btf_bitfields_are_refused_and_structs_padded():
    strings = b"\0u32\0s\0a\0b\0"
    u32 = struct.pack("<III", 1, 1 << 24, 4) + struct.pack("<I", 32)  # [1] INT u32
    # [2] struct s { u32 a; (4 bytes of padding) u32 b; } size 12
    padded = struct.pack("<III", 5, (4 << 24) | 2, 12) + struct.pack("<III", 7, 1, 0) + struct.pack("<III", 9, 1, 64)
    # [3] struct s { u32 a:3; } with kind_flag: a bitfield
    bitfield = struct.pack("<III", 5, (1 << 31) | (4 << 24) | 1, 4) + struct.pack("<III", 7, 1, 3 << 24)
    btf = Btf(_btf(u32 + padded + bitfield, strings))
    assert btf.ctype(1) is ctypes.c_uint
    s = btf.ctype(2)
    assert (ctypes.sizeof(s), s.a.offset, s.b.offset) == (12, 0, 8)
    with pytest.raises(Unsupported, match="bitfield"):
        btf.ctype(3)
    with pytest.raises(Unsupported, match="out of range"):
        btf.ctype(9)
