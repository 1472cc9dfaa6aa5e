"""A simulated KV prefix cache: chained block hashes with LRU eviction, per mock instance.

A prompt is cut into blocks of `block_tokens` tokens; block k's key hashes block k
together with the key of block k-1, so a key names a whole prefix (as in vLLM's
automatic prefix caching). A lookup walks the blocks from the start and stops at
the first one not cached.
"""

from __future__ import annotations

from collections import OrderedDict

from .text import CHARS_PER_TOKEN


class PrefixCache:
    def __init__(self, capacity_tokens: int, block_tokens: int = 64) -> None:
        self.capacity_blocks = capacity_tokens // block_tokens
        self.block_tokens = block_tokens
        self._blocks: OrderedDict[int, None] = OrderedDict()
        self.events = None  # a kv_events.KVEventPublisher: tell what is stored, evicted, cleared

    def _keys(self, text: str) -> list[int]:
        step = self.block_tokens * CHARS_PER_TOKEN
        keys: list[int] = []
        prev = 0
        for start in range(0, len(text) - step + 1, step):
            prev = hash((prev, text[start : start + step]))
            keys.append(prev)
        return keys

    def lookup(self, text: str) -> int:
        """Tokens of `text` already cached (whole blocks from the start)."""
        hit = 0
        for key in self._keys(text):
            if key not in self._blocks:
                break
            self._blocks.move_to_end(key)
            hit += 1
        return hit * self.block_tokens

    def insert(self, text: str) -> None:
        if self.capacity_blocks <= 0:
            return
        keys = self._keys(text)
        new: list[int] = []
        parent: int | None = None
        for i, key in enumerate(keys):
            if not new and key not in self._blocks:
                parent = keys[i - 1] if i else None  # the chain this run of new blocks extends
            if key not in self._blocks:
                new.append(key)
            self._blocks[key] = None
            self._blocks.move_to_end(key)
        evicted = []
        while len(self._blocks) > self.capacity_blocks:
            evicted.append(self._blocks.popitem(last=False)[0])
        if self.events is not None:
            self.events.stored(new, parent, len(new) * self.block_tokens)
            self.events.removed(evicted)

    @property
    def cached_tokens(self) -> int:
        return len(self._blocks) * self.block_tokens

    def clear(self) -> None:
        self._blocks.clear()
        if self.events is not None:
            self.events.cleared()
