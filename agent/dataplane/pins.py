"""The pin directory: its layout record (`meta`), its writer lock, stale pins.

BCC re-opens a pinned map by name without checking its type, key, value or
size, so pins made by another layout (an older agent, another table size or
flow-table size) would be silently misread. `meta` (maps.h) records the layout
that made a pin directory; `read_meta` is checked before anything loads, and a
mismatch is refused with a message saying what differs and how to start over.

Every change to the maps, from the agent's API and the `fabric-agent maglev`
CLI alike, runs under `writer_lock`: flock(2) on the pin directory itself
(bpffs holds no regular files), so writers in other processes and other threads
(each opens its own descriptor) are serialised. Readers take no lock.
"""

from __future__ import annotations

import ctypes
import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from common.errors import Conflict

# Bump whenever a map's key, value, type or name changes in dataplane/bpf/maps.h.
LAYOUT_VERSION = 7  # 7: the flow maps hold flow_entries per CPU list (loader.Layout.map_entries)
META_PIN = "meta"


@dataclass(frozen=True)
class Meta:
    layout_version: int
    table_size: int
    flow_entries: int
    max_services: int
    max_backends: int


class _MetaValue(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint32) for name in Meta.__dataclass_fields__]


def _libbpf() -> ctypes.CDLL:
    lib = ctypes.CDLL("libbpf.so.1", use_errno=True)
    lib.bpf_obj_get.argtypes = [ctypes.c_char_p]
    lib.bpf_map_lookup_elem.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
    return lib


def pins(pin_dir: str) -> list[str]:
    try:
        return sorted(os.listdir(pin_dir))
    except FileNotFoundError:
        return []


def read_meta(pin_dir: str) -> Meta | None:
    """The layout record, or None for an empty directory. Pins without a record
    (made before records existed) are refused: nothing can tell what they hold."""
    present = pins(pin_dir)
    if META_PIN not in present:
        if present:
            raise Conflict(f"pins under {pin_dir} ({', '.join(present[:4])}...) carry no layout record: they were "
                           f"made by an older fabric-agent; `fabric-agent maglev detach --iface IFACE --pin-dir "
                           f"{pin_dir}` detaches the programs and removes them")
        return None
    lib = _libbpf()
    fd = lib.bpf_obj_get(os.path.join(pin_dir, META_PIN).encode())
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"open {pin_dir}/{META_PIN}: {os.strerror(err)}")
    try:
        key = ctypes.c_uint32(0)
        value = ctypes.create_string_buffer(256)  # larger than any layout's record
        if lib.bpf_map_lookup_elem(fd, ctypes.byref(key), value) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"read {pin_dir}/{META_PIN}: {os.strerror(err)}")
    finally:
        os.close(fd)
    raw = _MetaValue.from_buffer_copy(value.raw[:ctypes.sizeof(_MetaValue)])
    return Meta(**{name: getattr(raw, name) for name in Meta.__dataclass_fields__})


def check_layout(pin_dir: str, have: Meta, want: Meta) -> None:
    """Refuse pins whose record differs from the layout this agent would load."""
    diffs = [f"{name} {getattr(have, name)} (this agent: {getattr(want, name)})"
             for name in Meta.__dataclass_fields__ if getattr(have, name) != getattr(want, name)]
    if diffs:
        hint = ("remove them with `fabric-agent maglev detach`" if have.layout_version != want.layout_version
                else "start with the same settings, or detach and remove the directory to start over")
        raise Conflict(f"pins under {pin_dir} were made with {', '.join(diffs)}: refusing to reuse them; {hint}")


def remove_stale_pins(pin_dir: str) -> list[str]:
    """Remove the pins when they were made by another layout version (or carry
    no record); pins of the current layout stay (an agent restart keeps flows)."""
    present = pins(pin_dir)
    if not present:
        return []
    try:
        meta = read_meta(pin_dir)
    except Conflict:
        meta = None
    if meta is not None and meta.layout_version == LAYOUT_VERSION:
        return []
    for name in present:
        os.unlink(os.path.join(pin_dir, name))
    return present


@contextmanager
def writer_lock(pin_dir: str) -> Iterator[None]:
    """Exclusive: one writer of the maps at a time, across processes and threads."""
    fd = os.open(pin_dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the last descriptor of the open file releases the lock
