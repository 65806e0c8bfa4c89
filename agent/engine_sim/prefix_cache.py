"""The simulator's automatic prefix cache, shaped like vLLM's: the prompt is cut into blocks of
``block_tokens`` tokens (only full blocks are cached), each block named by a hash chained over
every block before it, so a block hits only when the whole prefix up to it was seen. The cache
holds at most ``capacity_blocks`` blocks and drops the least recently used. A lookup counts the
prompt's tokens as queried and the leading cached blocks' tokens as hits (vLLM's
``vllm:prefix_cache_queries`` / ``vllm:prefix_cache_hits``, both in tokens); only the tokens
that missed are prefilled, so TTFT drops on hits.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from common.prompt_chunks import chained_chunk_hashes


@dataclass
class PrefixCache:
    capacity_blocks: int
    block_tokens: int = 16
    chars_per_token: int = 4
    _blocks: OrderedDict[bytes, None] = field(default_factory=OrderedDict)

    def block_hashes(self, text: str) -> list[bytes]:
        return chained_chunk_hashes(text, self.block_tokens * self.chars_per_token)

    def lookup_and_insert(self, text: str, prompt_tokens: int) -> int:
        """Tokens of this prompt already cached (its leading blocks); the prompt's blocks are then
        cached, most recent last."""
        if self.capacity_blocks <= 0:
            return 0
        hashes = self.block_hashes(text)
        hit = 0
        for h in hashes:
            if h not in self._blocks:
                break
            hit += 1
        for h in hashes:
            self._blocks[h] = None
            self._blocks.move_to_end(h)
        while len(self._blocks) > self.capacity_blocks:
            self._blocks.popitem(last=False)
        return min(prompt_tokens, hit * self.block_tokens)

    def __len__(self) -> int:
        return len(self._blocks)
