"""The simulator's automatic prefix cache, shaped like vLLM's: the prompt is cut into blocks of
``block_tokens`` tokens (only full blocks are cached), each block named by vLLM's own block hash
(common/kv_events.BlockHasher: sha256 over the parent's hash and the block's token ids, the
default seed), so a block hits only when the whole prefix up to it was seen. The simulator's
tokens are ``common.kv_events.sim_token_ids`` (one id per ``chars_per_token`` characters). The
cache holds at most ``capacity_blocks`` blocks and drops the least recently used. A lookup counts
the prompt's tokens as queried and the leading cached blocks' tokens as hits (vLLM's
``vllm:prefix_cache_queries`` / ``vllm:prefix_cache_hits``, both in tokens); only the tokens
that missed are prefilled, so TTFT drops on hits.

KV events (``--kv-events-config``, vLLM's flag and JSON): every lookup publishes, as vLLM does,
one BlockStored for the prompt's full blocks (the reused ones re-announced too) and one
BlockRemoved for the blocks the LRU bound dropped, in one batch.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from common.kv_events import BlockHasher, block_removed, block_stored, sim_token_ids


@dataclass
class PrefixCache:
    capacity_blocks: int
    block_tokens: int = 16
    chars_per_token: int = 4
    publish: Callable[[list[dict]], None] | None = None  # a ZmqEventPublisher's publish
    _blocks: OrderedDict[int, None] = field(default_factory=OrderedDict)

    def __post_init__(self) -> None:
        self._hasher = BlockHasher(self.block_tokens)

    def token_ids(self, text: str) -> list[int]:
        return sim_token_ids(text, self.chars_per_token)

    def block_hashes(self, text: str) -> list[int]:
        return self._hasher.hashes(self.token_ids(text))

    def lookup_and_insert(self, text: str, prompt_tokens: int) -> int:
        """Tokens of this prompt already cached (its leading blocks); the prompt's blocks are then
        cached, most recent last."""
        if self.capacity_blocks <= 0:
            return 0
        tokens = self.token_ids(text)
        hashes = self._hasher.hashes(tokens)
        hit = 0
        for h in hashes:
            if h not in self._blocks:
                break
            hit += 1
        for h in hashes:
            self._blocks[h] = None
            self._blocks.move_to_end(h)
        dropped = []
        while len(self._blocks) > self.capacity_blocks:
            dropped.append(self._blocks.popitem(last=False)[0])
        if self.publish is not None and hashes:
            n = len(hashes) * self.block_tokens
            events = [block_stored(hashes, None, tokens[:n], self.block_tokens)]
            if dropped:
                events.append(block_removed(dropped))
            self.publish(events)
        return min(prompt_tokens, hit * self.block_tokens)

    def clear(self) -> None:
        self._blocks.clear()

    def __len__(self) -> int:
        return len(self._blocks)
