"""Chat-template rendering and tokenizing for precise prefix routing, off the event loop: a few
worker processes (gateway/tokenize_worker.py), each with CPU-time and memory limits, and a
deadline per call.

A model's chat template is code its registrant wrote; rendering it in the gateway process would
let one tenant's template (nested loops, huge repetitions) stall every tenant's calls. Here a call
waits at most ``deadline_s`` for a free worker and its answer; a worker that misses the deadline,
dies (SIGXCPU, out of memory) or answers garbage is killed and replaced in the background, and
the model's key is benched for ``bench_s`` (its calls route approximately without asking a
worker, so one hostile model cannot keep every worker busy being killed). ``hashes`` returns
None whenever it has no answer in time: the caller routes with the approximate router.

Loading a model's tokenizer into a worker (once per worker and model) has its own, longer
deadline ``load_deadline_s``: a 30 MB tokenizer.json takes a second or two to parse.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import struct
import sys
import time
from dataclasses import dataclass, field

from common.kv_events import BlockHasher

DEADLINE_S = 1.0
LOAD_DEADLINE_S = 30.0
CPU_S = 5
MEMORY_BYTES = 2 << 30
BENCH_S = 60.0
WORKERS = 2
MAX_ANSWER = 1 << 20  # 4096 hashes as JSON fit in well under this


@dataclass(eq=False)
class _Worker:
    proc: asyncio.subprocess.Process
    loaded: set[str] = field(default_factory=set)


class WorkerFailed(Exception):
    """A worker died, answered an error or a frame that does not parse."""


class TokenizePool:
    def __init__(self, workers: int = WORKERS, deadline_s: float = DEADLINE_S, cpu_s: int = CPU_S,
                 memory_bytes: int = MEMORY_BYTES, bench_s: float = BENCH_S,
                 load_deadline_s: float = LOAD_DEADLINE_S) -> None:
        self.size, self.deadline_s, self.cpu_s = workers, deadline_s, cpu_s
        self.memory_bytes, self.bench_s, self.load_deadline_s = memory_bytes, bench_s, load_deadline_s
        self._idle: asyncio.Queue[_Worker] | None = None
        self._all: set[_Worker] = set()
        self._benched: dict[str, float] = {}  # model key -> monotonic time its bench ends
        self._spawning: set[asyncio.Task] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self.killed = 0  # workers killed for a missed deadline or a failure (tests, metrics)
        self.asked = 0  # hash requests sent to a worker

    def _start(self) -> asyncio.Queue[_Worker]:
        loop = asyncio.get_running_loop()
        if self._loop is not loop:  # workers belong to the loop that started them (tests run several)
            for w in self._all:
                if w.proc.returncode is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(w.proc.pid, signal.SIGKILL)
            self._all.clear()
            self._idle, self._loop = None, loop
        if self._idle is None:
            self._idle = asyncio.Queue()
            for _ in range(self.size):
                self._respawn()
        return self._idle

    def _respawn(self) -> None:
        task = asyncio.get_running_loop().create_task(self._spawn())
        self._spawning.add(task)
        task.add_done_callback(self._spawning.discard)

    async def _spawn(self) -> None:
        # Nothing of the gateway's environment (its key HMAC secret lives there); one tokenizer
        # thread, so the CPU limit is this one call's.
        env = {"TOKENIZERS_PARALLELISM": "false", "LANG": "C.UTF-8", "PATH": os.defpath}
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gateway.tokenize_worker", str(self.cpu_s), str(self.memory_bytes),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
            env=env, cwd=_repo_root())
        w = _Worker(proc)
        self._all.add(w)
        assert self._idle is not None
        self._idle.put_nowait(w)

    def benched(self, key: str) -> bool:
        return self._benched.get(key, 0.0) > time.monotonic()

    async def hashes(self, key: str, files: dict[str, str], hasher: BlockHasher,
                     lora_paths: tuple[tuple[str, str], ...], data: dict) -> list[int] | None:
        """The request's block hashes, or None (no free worker in time, a benched model, a missed
        deadline, an untokenizable request)."""
        if self.benched(key):
            return None
        idle = self._start()
        w = await self._take(idle)
        if w is None:  # every worker busy: this call routes approximately
            return None
        healthy = False
        try:
            if key not in w.loaded:
                await asyncio.wait_for(self._ask(w, {"op": "load", "key": key, "files": files}),
                                       self.load_deadline_s)
                w.loaded.add(key)
            self.asked += 1
            answer = await asyncio.wait_for(self._ask(w, {
                "op": "hash", "key": key, "block_size": hasher.block_size, "algo": hasher.algo, "seed": hasher.seed,
                "lora_paths": [list(p) for p in lora_paths], "data": data}), self.deadline_s)
            healthy = True
            got = answer.get("hashes")
            return got if isinstance(got, list) and all(isinstance(h, int) for h in got) else None
        except (asyncio.TimeoutError, WorkerFailed, OSError):
            self._benched[key] = time.monotonic() + self.bench_s
            return None
        finally:  # a worker in any doubt (a deadline, a cancelled call mid-frame) is replaced
            if healthy:
                idle.put_nowait(w)
            else:
                self._kill(w)
                self._respawn()

    async def _take(self, idle: asyncio.Queue[_Worker]) -> _Worker | None:
        """A free worker within the deadline, or None. Not wait_for(idle.get()): on Python 3.10
        its timeout can drop an item the get had already taken, and the pool would shrink."""
        getter = asyncio.ensure_future(idle.get())
        try:
            await asyncio.wait({getter}, timeout=self.deadline_s)
        except asyncio.CancelledError:  # the call went away: a worker it took goes back
            if getter.done() and not getter.cancelled():
                idle.put_nowait(getter.result())
            else:
                getter.cancel()
            raise
        if not getter.done():
            getter.cancel()  # a pending get leaves the item in the queue
            return None
        return getter.result()

    async def _ask(self, w: _Worker, msg: dict) -> dict:
        body = json.dumps(msg, separators=(",", ":")).encode()
        assert w.proc.stdin is not None and w.proc.stdout is not None
        w.proc.stdin.write(struct.pack(">I", len(body)) + body)
        await w.proc.stdin.drain()
        try:
            head = await w.proc.stdout.readexactly(4)
            (n,) = struct.unpack(">I", head)
            if n > MAX_ANSWER:
                raise WorkerFailed("answer too long")
            answer = json.loads(await w.proc.stdout.readexactly(n))
        except (asyncio.IncompleteReadError, ValueError) as exc:  # died (SIGXCPU, memory) or garbage
            raise WorkerFailed(type(exc).__name__) from None
        if not isinstance(answer, dict):
            raise WorkerFailed("not an object")
        if "error" in answer and msg["op"] == "load":
            raise WorkerFailed("load failed")
        return answer

    def _kill(self, w: _Worker) -> None:
        self._all.discard(w)
        self.killed += 1
        if w.proc.returncode is None:
            w.proc.kill()
        if w.proc.stdin is not None:
            w.proc.stdin.close()
        asyncio.get_running_loop().create_task(w.proc.wait())  # reap it

    async def close(self) -> None:
        await asyncio.gather(*self._spawning, return_exceptions=True)  # then kill what they started
        for w in list(self._all):
            if w.proc.returncode is None:
                w.proc.kill()
            if w.proc.stdin is not None:
                w.proc.stdin.close()
            await w.proc.wait()
        self._all.clear()
        self._idle = None


def _repo_root() -> str:
    """Where ``gateway`` is importable from (the worker runs ``-m gateway.tokenize_worker``)."""
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclass(frozen=True)
class PooledHasher:
    """A model's tokenizer files hashed in the pool: what kv_source hands the router for a real
    engine (``SimTokenizer``'s RequestHasher hashes in process: its rendering is ours)."""

    pool: TokenizePool
    key: str  # the model's verified digest (or the override directory's name)
    files: dict[str, str]
    hasher: BlockHasher = BlockHasher()
    lora_paths: tuple[tuple[str, str], ...] = ()

    async def hash_request(self, data: dict) -> list[int] | None:
        return await self.pool.hashes(self.key, self.files, self.hasher, self.lora_paths, data)
