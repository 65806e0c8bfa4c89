"""The agent's subscriber to its replicas' KV events: one thread, one ZMQ poller over a SUB socket
per replica, feeding common/kv_index.py.

On watch (a replica started, or the agent restarted) it subscribes and asks the replica's replay
socket for every batch from seq 0 that the engine still buffers (vLLM keeps ``buffer_steps``,
10,000 by default): the snapshot an index starts from. A gap in the live stream asks for a replay
from the missing seq; when the replay does not reach back that far (the engine's buffer moved
on), the replica is resynced (its blocks forgotten, rebuilt from the next batches -- the engine
re-announces the blocks it reuses). A replica without a replay socket is resynced on a gap at once.

Everything an engine sends is bounded, since a compromised replica's engine is on the other end:
a message over ``max_message_bytes`` (ZMQ_MAXMSGSIZE) drops that peer's connection instead of
being read, and one replay reads at most ``max_replay_frames`` batches for at most
``replay_deadline_s`` seconds (an engine that never sends its end marker cannot hold the
subscriber's thread); a gap repair that was cut short resyncs the replica.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass

from common.kv_events import END_SEQ, decode_batch
from common.kv_index import KvIndex

log = logging.getLogger(__name__)
REPLAY_TIMEOUT_MS = 1000  # the longest wait for the next replayed batch
MAX_MESSAGE_BYTES = 16 << 20  # one batch (a 100k-token prefill is well under 1 MiB of events)
MAX_REPLAY_FRAMES = 20_000  # twice vLLM's default buffer_steps
REPLAY_DEADLINE_S = 10.0


@dataclass(frozen=True)
class EventSource:
    replica: str
    endpoint: str  # the engine's PUB, e.g. tcp://10.0.0.5:5557
    replay_endpoint: str | None = None
    topic: str = ""
    bind: bool = False  # the engine's endpoint names this host (vLLM then connects to it): bind it


class KvEventSubscriber:
    def __init__(self, index: KvIndex, *, max_message_bytes: int = MAX_MESSAGE_BYTES,
                 max_replay_frames: int = MAX_REPLAY_FRAMES, replay_deadline_s: float = REPLAY_DEADLINE_S) -> None:
        import zmq

        self.max_message_bytes, self.max_replay_frames = max_message_bytes, max_replay_frames
        self.replay_deadline_s = replay_deadline_s
        self.replays_cut = 0  # replays that ended without the end marker (a bound, or no answer)

        self._zmq = zmq
        self.index = index
        self._ctx = zmq.Context.instance()
        self._lock = threading.Lock()  # the index is read by the API's threads
        self._commands: deque[tuple[str, EventSource | str]] = deque()
        self._subs: dict[str, tuple[EventSource, object]] = {}
        self._running = True
        self._thread = threading.Thread(target=self._run, daemon=True, name="kv-index")
        self._thread.start()

    # -- called from any thread --
    def watch(self, source: EventSource) -> None:
        with self._lock:
            self.index.watch(source.replica)
        self._commands.append(("watch", source))

    def forget(self, replica: str) -> None:
        self._commands.append(("forget", replica))

    def match(self, hashes: list[int], replicas: list[str] | None = None) -> dict[str, int | None]:
        with self._lock:
            return self.index.match(hashes, replicas)

    def block_sizes(self, replicas: list[str] | None = None) -> dict[str, int | None]:
        with self._lock:
            return {r: (self.index.replicas[r].block_size if r in self.index.replicas else None)
                    for r in (self.index.replicas if replicas is None else replicas)}

    def evicting(self, replicas: list[str], window_s: float, now: float | None = None) -> dict[str, bool | None]:
        """replica -> whether its engine evicted a block in the last ``window_s`` (KvIndex.evicting)."""
        with self._lock:
            return self.index.evicting(replicas, window_s, now)

    def status(self) -> dict:
        with self._lock:
            return self.index.status()

    def states(self, replicas: list[str], blind_after_s: float, now: float | None = None) -> dict[str, str]:
        """replica -> live (it sent events), warming (watched for less than ``blind_after_s``
        without one: a fresh engine stores nothing until its first call), blind (watched longer
        without one: an engine without --kv-events-config) or unwatched (not a running replica
        of this node, or not picked up yet)."""
        now = time.monotonic() if now is None else now
        out = {}
        with self._lock:
            for r in replicas:
                rb = self.index.replicas.get(r)
                if rb is None:
                    out[r] = "unwatched"
                elif rb.last_event_at is not None:
                    out[r] = "live"
                else:
                    out[r] = "blind" if now - rb.watched_since >= blind_after_s else "warming"
        return out

    def close(self) -> None:
        self._running = False
        self._thread.join(timeout=3)
        for _, sock in self._subs.values():
            sock.close(linger=0)

    # -- the thread --
    def _run(self) -> None:
        zmq = self._zmq
        poller = zmq.Poller()
        by_sock: dict[object, str] = {}
        while self._running:
            while self._commands:
                op, arg = self._commands.popleft()
                if op == "watch":
                    src = arg
                    old = self._subs.pop(src.replica, None)
                    if old is not None:
                        poller.unregister(old[1])
                        by_sock.pop(old[1], None)
                        old[1].close(linger=0)
                    sock = self._ctx.socket(zmq.SUB)
                    sock.setsockopt(zmq.MAXMSGSIZE, self.max_message_bytes)
                    sock.setsockopt(zmq.SUBSCRIBE, src.topic.encode())
                    if src.bind:
                        sock.bind(src.endpoint)
                    else:
                        sock.connect(src.endpoint)
                    self._subs[src.replica] = (src, sock)
                    by_sock[sock] = src.replica
                    poller.register(sock, zmq.POLLIN)
                    self._replay(src, 0)
                else:
                    old = self._subs.pop(arg, None)
                    if old is not None:
                        poller.unregister(old[1])
                        by_sock.pop(old[1], None)
                        old[1].close(linger=0)
                    with self._lock:
                        self.index.forget(arg)
            for sock, _ in poller.poll(100):
                replica = by_sock.get(sock)
                if replica is None:
                    continue
                for _ in range(1000):  # drain what is queued, bounded per turn
                    try:
                        frames = sock.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    self._feed(self._subs[replica][0], frames)

    def _feed(self, src: EventSource, frames: list[bytes]) -> None:
        if len(frames) != 3:
            return
        _, seq_b, payload = frames
        try:
            batch = decode_batch(payload)
        except ValueError:
            with self._lock:
                self.index.watch(src.replica).bad_events += 1
            return
        seq = int.from_bytes(seq_b, "big")
        with self._lock:
            fresh = self.index.watch(src.replica).last_seq is None
        if fresh and seq > 0:  # the first live batch is not the engine's first: fetch what came before
            self._replay(src, 0)
        with self._lock:
            verdict = self.index.apply(src.replica, seq, batch)
            last = self.index.watch(src.replica).last_seq
        if verdict == "gap":
            self._replay(src, (last or 0) + 1, until=seq)
            with self._lock:
                self.index.apply(src.replica, seq, batch)

    def _replay(self, src: EventSource, start: int, until: int | None = None) -> None:
        """Apply the engine's buffered batches from ``start``; resync when they do not reach back."""
        zmq = self._zmq
        if src.replay_endpoint is None:
            if until is not None:
                with self._lock:
                    self.index.resync(src.replica)
            return
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.MAXMSGSIZE, self.max_message_bytes)
        first: int | None = None
        ended = False
        deadline = time.monotonic() + self.replay_deadline_s
        try:
            sock.connect(src.replay_endpoint)
            sock.send_multipart((b"", start.to_bytes(8, "big")))
            for _ in range(self.max_replay_frames):
                left_ms = int((deadline - time.monotonic()) * 1000)
                if left_ms <= 0 or not sock.poll(min(REPLAY_TIMEOUT_MS, left_ms), zmq.POLLIN):
                    break
                frames = sock.recv_multipart()
                if len(frames) != 4:
                    continue
                _, _, seq_b, payload = frames
                if seq_b == END_SEQ:
                    ended = True
                    break
                seq = int.from_bytes(seq_b, "big")
                first = seq if first is None else first
                try:
                    batch = decode_batch(payload)
                except ValueError:
                    continue
                with self._lock:
                    self.index.apply(src.replica, seq, batch)
        finally:
            sock.close(linger=0)
        if not ended:
            self.replays_cut += 1
        if until is not None and (first is None or first > start or not ended):
            with self._lock:  # the engine's buffer no longer holds what was lost
                self.index.resync(src.replica)
