"""vLLM's KV-cache events and block hashes, as Fabric reads and writes them (our own code of the
wire format vLLM 0.32 documents in ``--kv-events-config``; nothing here imports vLLM).

Block hashes. An engine caches a prompt in blocks of ``block_size`` tokens (full blocks only);
block i is named by ``H((parent, tuple(tokens_i), extra_keys_i))`` where ``parent`` is block i-1's
hash (NONE_HASH = H(seed) for block 0) and H is the engine's ``--prefix-caching-hash-algo``:
``sha256`` (the default: SHA-256 of the pickle, highest protocol) or ``sha256_cbor`` (SHA-256 of
canonical CBOR; needs cbor2). The seed is PYTHONHASHSEED when the engine has one set, else
``vllm-none-hash``. ``extra_keys_i``: None, or a tuple of ``("lora", name, path)`` on every
block of a LoRA request and ``("cache_salt", salt)`` on block 0 of a salted one. Events carry a
hash as the low 64 bits of the digest read big-endian (vLLM's default,
VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1), and so does every index in Fabric.

Wire. A ZMQ PUB socket sends multipart ``(topic, seq, payload)``: ``seq`` an 8-byte big-endian
counter from 0, ``payload`` a msgpack array ``[ts, events, data_parallel_rank]``; each event a map
tagged by ``type``: ``BlockStored`` (block_hashes, parent_block_hash, token_ids, block_size,
lora_id, medium, lora_name, and optional extra keys), ``BlockRemoved`` (block_hashes, medium),
``AllBlocksCleared``. A ROUTER replay socket takes ``(b"", start_seq)`` from a DEALER/REQ and
answers each buffered batch with seq >= start_seq as ``(b"", topic, seq, payload)``, then
``(b"", b"", -1 as 8 signed bytes, b"")``. The PUB binds a wildcard endpoint (``tcp://*:5557``)
and connects to a host one (the subscriber binds that); the replay socket always binds.
"""

from __future__ import annotations

import hashlib
import pickle
import threading
import time
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import msgpack

DEFAULT_SEED = "vllm-none-hash"
HASH_ALGOS = ("sha256", "sha256_cbor")
END_SEQ = (-1).to_bytes(8, "big", signed=True)
MASK64 = (1 << 64) - 1


def _digest(algo: str, obj: Any) -> bytes:
    if algo == "sha256":
        return hashlib.sha256(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)).digest()
    if algo == "sha256_cbor":
        import cbor2  # optional: only engines started with sha256_cbor need it

        return hashlib.sha256(cbor2.dumps(obj, canonical=True)).digest()
    raise ValueError(f"hash algorithm must be one of {', '.join(HASH_ALGOS)}, got {algo!r}")


def external(digest: bytes) -> int:
    """A block's hash as events carry it: the digest's low 64 bits, big-endian."""
    return int.from_bytes(digest, "big") & MASK64


@dataclass(frozen=True)
class BlockHasher:
    """The engine's block hashing for one (block size, algorithm, seed)."""

    block_size: int = 16
    algo: str = "sha256"
    seed: str = DEFAULT_SEED

    def __post_init__(self) -> None:
        if self.block_size < 1:
            raise ValueError("block_size must be >= 1")
        if self.algo not in HASH_ALGOS:
            raise ValueError(f"hash algorithm must be one of {', '.join(HASH_ALGOS)}, got {self.algo!r}")

    @classmethod
    def for_engine_env(cls, env: dict[str, str], block_size: int = 16, algo: str = "sha256") -> BlockHasher:
        """The seed the engine resolves: its PYTHONHASHSEED when set, else the fixed default."""
        seed = env.get("PYTHONHASHSEED")
        return cls(block_size, algo, DEFAULT_SEED if seed is None else seed)

    @property
    def none_hash(self) -> bytes:
        return _digest(self.algo, self.seed)

    def digests(self, token_ids: Sequence[int], *, lora: tuple[str, str] | None = None,
                cache_salt: str | None = None, max_blocks: int | None = None) -> list[bytes]:
        """The full digests of the prompt's full blocks, in order."""
        n = len(token_ids) // self.block_size
        if max_blocks is not None:
            n = min(n, max_blocks)
        parent = self.none_hash
        out: list[bytes] = []
        lora_key = [("lora", lora[0], lora[1])] if lora else []
        for i in range(n):
            keys = lora_key + ([("cache_salt", cache_salt)] if i == 0 and cache_salt else [])
            tokens = tuple(token_ids[i * self.block_size:(i + 1) * self.block_size])
            parent = _digest(self.algo, (parent, tokens, tuple(keys) if keys else None))
            out.append(parent)
        return out

    def hashes(self, token_ids: Sequence[int], **kw) -> list[int]:
        """The prompt's block hashes as events carry them (see ``external``)."""
        return [external(d) for d in self.digests(token_ids, **kw)]


# -- events ------------------------------------------------------------------------------------

def block_stored(hashes: list[int], parent: int | None, token_ids: list[int], block_size: int,
                 lora_name: str | None = None, medium: str = "GPU") -> dict:
    return {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent, "token_ids": token_ids,
            "block_size": block_size, "lora_id": None, "medium": medium, "lora_name": lora_name}


def block_removed(hashes: list[int], medium: str = "GPU") -> dict:
    return {"type": "BlockRemoved", "block_hashes": hashes, "medium": medium}


def all_cleared() -> dict:
    return {"type": "AllBlocksCleared"}


def encode_batch(events: list[dict], ts: float | None = None, dp_rank: int = 0) -> bytes:
    return msgpack.packb([time.time() if ts is None else ts, events, dp_rank], use_bin_type=True)


@dataclass(frozen=True)
class Batch:
    ts: float
    events: list[dict]
    dp_rank: int


def decode_batch(payload: bytes) -> Batch:
    """A batch from the wire; ValueError when it is not one."""
    try:
        raw = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises several types
        raise ValueError(f"not a msgpack event batch: {exc}") from None
    if not isinstance(raw, list) or len(raw) < 2 or not isinstance(raw[1], list):
        raise ValueError("an event batch is [ts, events, dp_rank]")
    events = []
    for ev in raw[1]:
        if isinstance(ev, dict) and isinstance(ev.get("type"), str):
            events.append(ev)
        elif isinstance(ev, list) and ev and isinstance(ev[0], str):  # older array-like tagged events
            names = {"BlockStored": ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
                                     "medium", "lora_name"),
                     "BlockRemoved": ("block_hashes", "medium"), "AllBlocksCleared": ()}.get(ev[0], ())
            events.append({"type": ev[0], **dict(zip(names, ev[1:]))})
        else:
            raise ValueError("an event is a map tagged by 'type'")
    return Batch(float(raw[0]), events, int(raw[2]) if len(raw) > 2 and raw[2] is not None else 0)


def as_hash(value: Any) -> int:
    """An event's block hash as an int (ints as sent; bytes, when an engine sends digests, by the
    same low-64-bit rule)."""
    if isinstance(value, int):
        return value & MASK64
    if isinstance(value, (bytes, bytearray)):
        return external(bytes(value))
    raise ValueError(f"a block hash is an int or bytes, got {type(value).__name__}")


def publisher_binds(endpoint: str) -> bool:
    """vLLM's rule: the PUB binds a wildcard (``tcp://*:5557``, ``::``) or an ipc/inproc endpoint
    and connects to any other, which the subscriber then binds (EventSource.bind)."""
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))


class ZmqEventPublisher:
    """vLLM's PUB + ROUTER publisher shape, for the simulator: ``publish(events)`` from any
    thread; one thread sends, keeps the last ``buffer_steps`` batches and answers replays."""

    def __init__(self, endpoint: str, replay_endpoint: str | None = None, topic: str = "",
                 buffer_steps: int = 10_000, hwm: int = 100_000) -> None:
        import zmq

        self._zmq = zmq
        self._ctx: Any = zmq.Context.instance()
        self._topic = topic.encode()
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self._queue: deque[list[dict]] = deque()
        self._wake = threading.Event()
        self._running = True
        self._seq = 0
        self._pub = self._ctx.socket(zmq.PUB)
        self._pub.set_hwm(hwm)
        if publisher_binds(endpoint):
            self._pub.bind(endpoint)
            self.endpoint = self._pub.getsockopt_string(zmq.LAST_ENDPOINT)
        else:  # as vLLM: a host address is the subscriber's, which binds it
            self._pub.connect(endpoint)
            self.endpoint = endpoint
        self._replay: Any = None
        self.replay_endpoint = None
        if replay_endpoint:
            self._replay = self._ctx.socket(zmq.ROUTER)
            self._replay.bind(replay_endpoint)
            self.replay_endpoint = self._replay.getsockopt_string(zmq.LAST_ENDPOINT)
        self._thread = threading.Thread(target=self._run, daemon=True, name="kv-events")
        self._thread.start()

    def publish(self, events: list[dict]) -> None:
        if events and self._running:
            self._queue.append(events)
            self._wake.set()

    def _run(self) -> None:
        zmq = self._zmq
        while self._running or self._queue:
            if self._replay is not None and self._replay.poll(0, zmq.POLLIN):
                self._serve_replay()
            if not self._queue:
                self._wake.wait(0.05)
                self._wake.clear()
                continue
            events = self._queue.popleft()
            payload = encode_batch(events)
            seq = self._seq
            self._seq += 1
            self._pub.send_multipart((self._topic, seq.to_bytes(8, "big"), payload))
            self._buffer.append((seq, payload))

    def _serve_replay(self) -> None:
        frames = self._replay.recv_multipart()
        if len(frames) != 3:
            return
        client, _, start = frames
        start_seq = int.from_bytes(start, "big")
        for seq, buf in list(self._buffer):
            if seq >= start_seq:
                self._replay.send_multipart((client, b"", self._topic, seq.to_bytes(8, "big"), buf))
        self._replay.send_multipart((client, b"", b"", END_SEQ, b""))

    def close(self) -> None:
        self._running = False
        self._wake.set()
        self._thread.join(timeout=2)
        self._pub.close(linger=0)
        if self._replay is not None:
            self._replay.close(linger=0)


def parse_kv_events_config(text: str) -> dict:
    """``--kv-events-config`` JSON as the simulator reads it (vLLM's field names)."""
    import json

    try:
        cfg = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"--kv-events-config is not JSON: {exc}") from None
    if not isinstance(cfg, dict):
        raise ValueError("--kv-events-config is a JSON object")
    unknown = set(cfg) - {"enable_kv_cache_events", "publisher", "endpoint", "replay_endpoint", "buffer_steps",
                          "hwm", "max_queue_size", "topic"}
    if unknown:
        raise ValueError(f"--kv-events-config: unknown fields {sorted(unknown)}")
    return cfg


def kv_events_config(endpoint: str, replay_endpoint: str | None, topic: str = "kv@") -> str:
    """The ``--kv-events-config`` value Fabric starts engines with."""
    import json

    cfg = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": endpoint, "topic": topic}
    if replay_endpoint:
        cfg["replay_endpoint"] = replay_endpoint
    return json.dumps(cfg, separators=(",", ":"))


def iter_hashes(values: Iterable[Any]) -> list[int]:
    return [as_hash(v) for v in values]



def sim_token_ids(text: str, chars_per_token: int = 4) -> list[int]:
    """The engine simulator's tokenizer: one id per ``chars_per_token`` characters (a partial last
    one dropped), from the characters alone, so a gateway computes the simulator's block hashes
    from the prompt text exactly as the simulator does."""
    return [int.from_bytes(hashlib.blake2b(text[i:i + chars_per_token].encode(), digest_size=4).digest(), "big")
            for i in range(0, len(text) - chars_per_token + 1, chars_per_token)]
