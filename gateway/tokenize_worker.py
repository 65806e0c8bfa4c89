"""The process that renders chat templates and tokenizes for precise prefix routing
(``python -m gateway.tokenize_worker CPU_S MEMORY_BYTES``), started and killed by
gateway/tokenize_pool.py; never imported by the gateway's event loop.

It speaks frames on stdin/stdout: a 4-byte big-endian length, then a JSON object.

    {"op": "load", "key": K, "files": {name: text}}     -> {"ok": true} | {"error": "..."}
    {"op": "hash", "key": K, "block_size": n, "algo": a, "seed": s, "lora_paths": [[name, path]],
     "data": {request body}}                             -> {"hashes": [int] | null} | {"error": "..."}

Limits, set here before any tenant's file is read: its address space (RLIMIT_AS, MEMORY_BYTES)
and, for each hash, CPU_S more seconds of CPU than it has used (RLIMIT_CPU's soft limit: the
kernel ends the process with SIGXCPU). The pool's deadline kills it first in the usual case; the
CPU limit is what stops it when the pool itself is gone. A frame longer than MAX_FRAME ends it.
"""

from __future__ import annotations

import json
import resource
import struct
import sys

MAX_FRAME = 256 << 20  # tokenizer files up to the agent's cap (3 x 64 MiB) plus a request


def read_frame(stream) -> dict | None:
    head = stream.read(4)
    if len(head) < 4:
        return None
    (n,) = struct.unpack(">I", head)
    if n > MAX_FRAME:
        return None
    body = stream.read(n)
    return json.loads(body) if len(body) == n else None


def write_frame(stream, obj: dict) -> None:
    body = json.dumps(obj, separators=(",", ":")).encode()
    stream.write(struct.pack(">I", len(body)) + body)
    stream.flush()


def _cpu_budget(cpu_s: int) -> None:
    used = resource.getrusage(resource.RUSAGE_SELF)
    spent = int(used.ru_utime + used.ru_stime) + 1
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    soft = spent + cpu_s
    if hard != resource.RLIM_INFINITY:
        soft = min(soft, hard)
    resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))


def serve(cpu_s: int, memory_bytes: int) -> None:
    from common.kv_events import BlockHasher
    from gateway.engine_hash import EngineTokenizer, RequestHasher

    if memory_bytes > 0:
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    tokenizers: dict[str, EngineTokenizer] = {}
    while True:
        msg = read_frame(stdin)
        if msg is None:
            return
        try:
            if msg.get("op") == "load":
                _cpu_budget(cpu_s)
                tokenizers[msg["key"]] = EngineTokenizer.from_files(msg["files"])
                write_frame(stdout, {"ok": True})
            elif msg.get("op") == "hash":
                tok = tokenizers.get(msg["key"])
                if tok is None:
                    write_frame(stdout, {"error": "not loaded"})
                    continue
                _cpu_budget(cpu_s)
                hasher = RequestHasher(tok, BlockHasher(msg["block_size"], msg["algo"], msg["seed"]),
                                       tuple((n, p) for n, p in msg.get("lora_paths") or ()))
                write_frame(stdout, {"hashes": hasher.request_hashes(msg["data"])})
            else:
                write_frame(stdout, {"error": "unknown op"})
        except MemoryError:
            write_frame(stdout, {"error": "out of memory"})
        except Exception as exc:  # a broken tokenizer file: the pool routes approximately
            write_frame(stdout, {"error": f"{type(exc).__name__}: {str(exc)[:200]}"})


if __name__ == "__main__":  # the pool sets TOKENIZERS_PARALLELISM=false: one thread, its CPU limit
    serve(int(sys.argv[1]), int(sys.argv[2]))
