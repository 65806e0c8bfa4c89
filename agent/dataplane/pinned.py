"""Open the pinned maps without compiling the program (the CLI's show/set/delete).

BCC learns a map's key and value types by compiling maglev.c with clang, 5-20 s
of CPU on every process that opens the maps. The kernel already holds those
types: BCC creates every map with BTF, so each pin carries the ids of its key
and value types in the program's BTF. `open_pinned` reads that BTF back,
builds the same ctypes types BCC would (packed structures, arrays, integers)
and puts BCC's own table classes (HashTable, Array, PerCpuArray, LruHash) on
the pinned descriptors: the maps read and write exactly as after a compile, in
milliseconds.

Anything it does not expect (a pin missing, a map without BTF, a bitfield, a
size that does not add up) makes it return None; the caller then compiles as
before. Attaching needs the programs and always compiles.
"""

from __future__ import annotations

import ctypes
import os
import struct
from dataclasses import dataclass

# map types BCC's table classes cover here (linux/bpf.h)
_HASH, _ARRAY, _PERCPU_HASH, _PERCPU_ARRAY, _LRU_HASH, _LRU_PERCPU_HASH = 1, 2, 5, 6, 9, 10
_BTF_MAGIC = 0xEB9F
# BTF kinds (linux/btf.h)
_INT, _PTR, _ARRAY_KIND, _STRUCT, _UNION, _ENUM, _FWD, _TYPEDEF, _VOLATILE, _CONST, _RESTRICT = range(1, 12)
_TYPE_TAG, _ENUM64 = 18, 19
# bytes after the common 12-byte header: fixed, or per member (times vlen)
_EXTRA_FIXED = {_INT: 4, _ARRAY_KIND: 12, 14: 4, 17: 4}
_EXTRA_PER_MEMBER = {_STRUCT: 12, _UNION: 12, _ENUM: 8, 13: 8, 15: 12, _ENUM64: 12}
_INT_TYPES = {(1, False): ctypes.c_ubyte, (2, False): ctypes.c_ushort, (4, False): ctypes.c_uint,
              (8, False): ctypes.c_ulonglong, (1, True): ctypes.c_byte, (2, True): ctypes.c_short,
              (4, True): ctypes.c_int, (8, True): ctypes.c_longlong}


class Unsupported(Exception):
    """The pins hold something this reader does not decode: compile instead."""


class _MapInfo(ctypes.Structure):  # struct bpf_map_info
    _fields_ = [("type", ctypes.c_uint32), ("id", ctypes.c_uint32), ("key_size", ctypes.c_uint32),
                ("value_size", ctypes.c_uint32), ("max_entries", ctypes.c_uint32), ("map_flags", ctypes.c_uint32),
                ("name", ctypes.c_char * 16), ("ifindex", ctypes.c_uint32),
                ("btf_vmlinux_value_type_id", ctypes.c_uint32), ("netns_dev", ctypes.c_uint64),
                ("netns_ino", ctypes.c_uint64), ("btf_id", ctypes.c_uint32), ("btf_key_type_id", ctypes.c_uint32),
                ("btf_value_type_id", ctypes.c_uint32), ("pad", ctypes.c_uint32), ("map_extra", ctypes.c_uint64)]


def _libbpf() -> ctypes.CDLL:
    lib = ctypes.CDLL("libbpf.so.1", use_errno=True)
    lib.bpf_obj_get.argtypes = [ctypes.c_char_p]
    lib.bpf_obj_get_info_by_fd.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint32)]
    lib.btf__load_from_kernel_by_id.argtypes = [ctypes.c_uint32]
    lib.btf__load_from_kernel_by_id.restype = ctypes.c_void_p
    lib.btf__raw_data.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint32)]
    lib.btf__raw_data.restype = ctypes.c_void_p
    lib.btf__free.argtypes = [ctypes.c_void_p]
    return lib


class Btf:
    """The types of one BTF blob, as ctypes (what BCC's _decode_table_type makes)."""

    def __init__(self, raw: bytes):
        magic, _version, _flags, hdr_len, type_off, type_len, str_off, str_len = struct.unpack_from("<HBBIIIII", raw)
        if magic != _BTF_MAGIC:
            raise Unsupported("not BTF (or another byte order)")
        self._strings = raw[hdr_len + str_off:hdr_len + str_off + str_len]
        self._types: list[tuple | None] = [None]  # ids start at 1
        pos, end = hdr_len + type_off, hdr_len + type_off + type_len
        while pos < end:
            name_off, info, size_or_type = struct.unpack_from("<III", raw, pos)
            kind, vlen, kind_flag = (info >> 24) & 0x1F, info & 0xFFFF, info >> 31
            extra = _EXTRA_FIXED.get(kind, 0) + _EXTRA_PER_MEMBER.get(kind, 0) * vlen
            self._types.append((kind, self._name(name_off), size_or_type, kind_flag, vlen, raw[pos + 12:pos + 12 + extra]))
            pos += 12 + extra
        self._built: dict[int, type] = {}

    def _name(self, off: int) -> str:
        return self._strings[off:self._strings.index(b"\0", off)].decode()

    def ctype(self, type_id: int) -> type:
        if type_id not in self._built:
            self._built[type_id] = self._build(type_id)
        return self._built[type_id]

    def _build(self, type_id: int) -> type:
        if not 0 < type_id < len(self._types):
            raise Unsupported(f"BTF type id {type_id} out of range")
        kind, name, size_or_type, kind_flag, vlen, extra = self._types[type_id]
        if kind in (_TYPEDEF, _VOLATILE, _CONST, _RESTRICT, _TYPE_TAG):
            return self.ctype(size_or_type)
        if kind == _INT:
            (enc,) = struct.unpack_from("<I", extra)
            encoding, offset, bits = (enc >> 24) & 0xF, (enc >> 16) & 0xFF, enc & 0xFF
            if offset or bits != size_or_type * 8 or (size_or_type, bool(encoding & 1)) not in _INT_TYPES:
                raise Unsupported(f"integer {name!r} of {bits} bits at offset {offset}")
            if name == "char":
                return ctypes.c_char
            return _INT_TYPES[(size_or_type, bool(encoding & 1))]
        if kind in (_ENUM, _ENUM64):
            return _INT_TYPES[(size_or_type, False)]
        if kind == _ARRAY_KIND:
            elem, _index, nelems = struct.unpack_from("<III", extra)
            return self.ctype(elem) * nelems
        if kind in (_STRUCT, _UNION):
            return self._record(name or f"anon{type_id}", kind, size_or_type, kind_flag, vlen, extra)
        raise Unsupported(f"BTF kind {kind} ({name!r})")

    def _record(self, name: str, kind: int, size: int, kind_flag: int, vlen: int, extra: bytes) -> type:
        fields, anonymous, at = [], [], 0
        for i in range(vlen):
            name_off, member_type, offset = struct.unpack_from("<III", extra, i * 12)
            if kind_flag and offset >> 24:
                raise Unsupported(f"bitfield in {name}")
            bit_offset = offset & 0xFFFFFF if kind_flag else offset
            if bit_offset % 8:
                raise Unsupported(f"member of {name} off a byte boundary")
            ctype = self.ctype(member_type)
            field = self._name(name_off)
            if not field:
                field = f"__anon{len(anonymous)}"
                anonymous.append(field)
            if kind == _STRUCT:
                if bit_offset // 8 < at:
                    raise Unsupported(f"overlapping members in {name}")
                if bit_offset // 8 > at:
                    fields.append((f"__pad{len(fields)}", ctypes.c_ubyte * (bit_offset // 8 - at)))
                at = bit_offset // 8 + ctypes.sizeof(ctype)
            fields.append((field, ctype))
        if kind == _STRUCT and at < size:
            fields.append((f"__pad{len(fields)}", ctypes.c_ubyte * (size - at)))
        base = ctypes.Structure if kind == _STRUCT else ctypes.Union
        cls = type(name, (base,), {"_pack_": 1, "_anonymous_": anonymous, "_fields_": fields})
        if ctypes.sizeof(cls) != size:
            raise Unsupported(f"{name}: {ctypes.sizeof(cls)} bytes built, BTF says {size}")
        return cls


def _table_classes() -> dict[int, type]:
    """BCC's table classes, each with an __init__ that takes the kernel's map info
    instead of asking a compiled module (BCC's asks bpf.module)."""
    from bcc import table  # Debian python3-bpfcc; imported late so this module loads anywhere

    class _Pinned(table.TableBase):
        def __init__(self, bpf, map_id, map_fd, keytype, leaftype, name=None, *, info: _MapInfo):
            self.bpf, self.map_id, self.map_fd = bpf, map_id, map_fd
            self.Key, self.Leaf = keytype, leaftype
            self.ttype, self.flags, self.max_entries = info.type, info.map_flags, info.max_entries
            self._cbs, self._name = {}, name

    kinds = {_HASH: table.HashTable, _ARRAY: table.Array, _PERCPU_HASH: table.PerCpuHash,
             _PERCPU_ARRAY: table.PerCpuArray, _LRU_HASH: table.LruHash, _LRU_PERCPU_HASH: table.LruPerCpuHash}
    return {t: type(f"Pinned{cls.__name__}", (cls, _Pinned), {}) for t, cls in kinds.items()}


@dataclass
class PinnedMaps:
    """The tables by name (bytes, as BCC's BPF object is indexed); `cleanup` closes them."""

    tables: dict[bytes, object]

    def __getitem__(self, name: bytes):
        return self.tables[name]

    def cleanup(self) -> None:
        for t in self.tables.values():
            os.close(t.map_fd)
        self.tables = {}


def open_pinned(pin_dir: str, names: list[str]) -> PinnedMaps | None:
    """The named pins of pin_dir as BCC tables, or None when any cannot be opened
    that way (the caller compiles)."""
    lib = _libbpf()
    classes = _table_classes()
    tables: dict[bytes, object] = {}
    btfs: dict[int, Btf] = {}
    try:
        for name in names:
            fd = lib.bpf_obj_get(os.path.join(pin_dir, name).encode())
            if fd < 0:
                raise Unsupported(f"no pin {name}")
            info = _MapInfo()
            size = ctypes.c_uint32(ctypes.sizeof(info))
            if lib.bpf_obj_get_info_by_fd(fd, ctypes.byref(info), ctypes.byref(size)) != 0:
                os.close(fd)
                raise Unsupported(f"no info on {name}")
            cls = classes.get(info.type)
            if cls is None or not info.btf_id or not info.btf_value_type_id or not info.btf_key_type_id:
                os.close(fd)
                raise Unsupported(f"{name}: map type {info.type}, BTF id {info.btf_id}")
            try:
                btf = btfs.get(info.btf_id) or btfs.setdefault(info.btf_id, _load_btf(lib, info.btf_id))
                key, value = btf.ctype(info.btf_key_type_id), btf.ctype(info.btf_value_type_id)
                if (ctypes.sizeof(key), ctypes.sizeof(value)) != (info.key_size, info.value_size):
                    raise Unsupported(f"{name}: BTF sizes differ from the map's")
            except Unsupported:
                os.close(fd)
                raise
            tables[name.encode()] = cls(None, info.id, fd, key, value, name.encode(), info=info)
    except Unsupported:
        PinnedMaps(tables).cleanup()
        return None
    return PinnedMaps(tables)


def _load_btf(lib: ctypes.CDLL, btf_id: int) -> Btf:
    handle = lib.btf__load_from_kernel_by_id(btf_id)
    if not handle:
        raise Unsupported(f"BTF {btf_id}: {os.strerror(ctypes.get_errno())}")
    try:
        size = ctypes.c_uint32(0)
        data = lib.btf__raw_data(handle, ctypes.byref(size))
        return Btf(ctypes.string_at(data, size.value))
    finally:
        lib.btf__free(handle)
