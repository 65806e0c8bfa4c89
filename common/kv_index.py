"""The block index of what replicas' engines hold in their KV caches, learned from
their KV events (common/kv_events.py), pure (no sockets): the node agent keeps one
(agent/kv_index/subscriber.py feeds it), and scripts/bench-router's simulation another.

Per replica: the set of block hashes it holds (64-bit ints, as events carry them), the last
sequence number applied, and counters. ``apply(replica, seq, batch)`` answers what the feeder must
do next:

  ok        applied (seq == last + 1, or the first batch seen)
  duplicate seq <= last: already applied (a replay overlapping the live stream); ignored
  gap       seq > last + 1: batches were lost; nothing applied -- replay from last + 1
  restart   seq went back to 0 below last: the engine restarted; its blocks were cleared, the
            batch applied from scratch

``resync(replica)`` (a gap the engine's replay buffer no longer covers) forgets the replica's
blocks and its sequence: the next batch starts it again. The engine re-announces a block it
reuses from its prefix cache (BlockStored on every prefix hit), so a resynced replica's index
refills with what is actually used. A replica that has sent no event is ``blind``; the router
scores it with the approximate router instead (gateway/replica_router.py).

``match(hashes)``: per replica, how many leading blocks of this prompt it holds -- a prefix is
cached only as a whole (a block's hash chains over every block before it), so counting stops at
the first miss.

``evicting(replicas, window_s)``: per replica, whether its cache evicted lately -- a GPU
``BlockRemoved`` applied in the last ``window_s`` (EVICT_WINDOW_S; vLLM removes a cached block
only to reuse its slot, so a removal means the cache is full). A resync counts as one (the lost
batches may have held removals); an engine restart clears it (its cache is empty); None for a
blind replica. The router's gate spreads new conversations onto an idle replica that is not
evicting (gateway/router_gate.py).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from common.kv_events import Batch, as_hash

EVICT_WINDOW_S = 10.0  # a replica whose events removed a block this recently is evicting

@dataclass
class ReplicaBlocks:
    replica: str
    blocks: set[int] = field(default_factory=set)
    last_seq: int | None = None
    batches: int = 0
    gaps: int = 0
    resyncs: int = 0
    restarts: int = 0
    bad_events: int = 0
    block_size: int | None = None  # the engine's, from its BlockStored events
    last_event_at: float | None = None  # monotonic
    evicted_at: float | None = None  # monotonic: the last batch that removed a block (or a resync)
    watched_since: float = field(default_factory=time.monotonic)

    def view(self, now: float) -> dict:
        return {"blocks": len(self.blocks), "block_size": self.block_size, "last_seq": self.last_seq, "batches": self.batches,
                "gaps": self.gaps, "resyncs": self.resyncs, "restarts": self.restarts,
                "bad_events": self.bad_events, "events": self.last_event_at is not None,
                "last_event_age_s": None if self.last_event_at is None else round(now - self.last_event_at, 3),
                "last_eviction_age_s": None if self.evicted_at is None else round(now - self.evicted_at, 3)}


@dataclass
class KvIndex:
    max_blocks_per_replica: int = 1_000_000  # beyond any engine's KV; bounds a misbehaving publisher
    replicas: dict[str, ReplicaBlocks] = field(default_factory=dict)

    def watch(self, replica: str) -> ReplicaBlocks:
        rb = self.replicas.get(replica)
        if rb is None:
            rb = self.replicas[replica] = ReplicaBlocks(replica)
        return rb

    def forget(self, replica: str) -> None:
        self.replicas.pop(replica, None)

    def apply(self, replica: str, seq: int, batch: Batch, now: float | None = None) -> str:
        rb = self.watch(replica)
        now = time.monotonic() if now is None else now
        verdict = "ok"
        if rb.last_seq is not None:
            if seq == 0 and rb.last_seq > 0:
                rb.blocks.clear()
                rb.evicted_at = None  # a restarted engine's cache is empty
                rb.restarts += 1
                verdict = "restart"
            elif seq <= rb.last_seq:
                return "duplicate"
            elif seq > rb.last_seq + 1:
                rb.gaps += 1
                return "gap"
        for ev in batch.events:
            try:
                if self._apply_event(rb, ev):
                    rb.evicted_at = now
            except (ValueError, TypeError):
                rb.bad_events += 1
        rb.last_seq = seq
        rb.batches += 1
        rb.last_event_at = now
        return verdict

    def _apply_event(self, rb: ReplicaBlocks, ev: dict) -> bool:
        """Applies one event; True when it removed blocks from the GPU cache (an eviction)."""
        kind = ev.get("type")
        if kind == "BlockStored":
            if ev.get("medium") not in (None, "GPU"):  # an offload tier is not prefill-free here
                return False
            n = ev.get("block_size")
            if isinstance(n, int) and n > 0 and len(ev.get("block_hashes") or ()) > 0 and \
                    len(ev.get("token_ids") or ()) >= n * len(ev["block_hashes"]):
                rb.block_size = n  # a full block's size (a partial block's event is shorter)
            for h in ev.get("block_hashes") or ():
                if len(rb.blocks) < self.max_blocks_per_replica:
                    rb.blocks.add(as_hash(h))
        elif kind == "BlockRemoved":
            if ev.get("medium") not in (None, "GPU"):
                return False
            removed = [as_hash(h) for h in ev.get("block_hashes") or ()]
            for h in removed:
                rb.blocks.discard(h)
            return bool(removed)
        elif kind == "AllBlocksCleared":  # a prefix-cache reset, not pressure: no eviction
            rb.blocks.clear()
        else:
            raise ValueError(f"unknown event type {kind!r}")
        return False

    def resync(self, replica: str, now: float | None = None) -> None:
        rb = self.watch(replica)
        rb.blocks.clear()
        rb.last_seq = None
        rb.resyncs += 1
        if rb.last_event_at is not None:  # the lost batches may have evicted: assume so for a window
            rb.evicted_at = time.monotonic() if now is None else now

    def blind(self, replica: str) -> bool:
        rb = self.replicas.get(replica)
        return rb is None or rb.last_event_at is None

    def match(self, hashes: list[int], replicas: list[str] | None = None) -> dict[str, int | None]:
        """replica -> leading blocks of ``hashes`` it holds; None for a blind (or unknown) replica."""
        out: dict[str, int | None] = {}
        for r in (self.replicas if replicas is None else replicas):
            rb = self.replicas.get(r)
            if rb is None or rb.last_event_at is None:
                out[r] = None
                continue
            n = 0
            for h in hashes:
                if h not in rb.blocks:
                    break
                n += 1
            out[r] = n
        return out

    def evicting(self, replicas: list[str] | None = None, window_s: float = EVICT_WINDOW_S,
                 now: float | None = None) -> dict[str, bool | None]:
        """replica -> whether its cache evicted in the last ``window_s`` (module docstring); None
        for a blind (or unknown) replica."""
        now = time.monotonic() if now is None else now
        out: dict[str, bool | None] = {}
        for r in (self.replicas if replicas is None else replicas):
            rb = self.replicas.get(r)
            if rb is None or rb.last_event_at is None:
                out[r] = None
            else:
                out[r] = rb.evicted_at is not None and now - rb.evicted_at < window_s
        return out

    def status(self, now: float | None = None) -> dict:
        now = time.monotonic() if now is None else now
        return {r: rb.view(now) for r, rb in sorted(self.replicas.items())}
