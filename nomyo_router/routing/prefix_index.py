"""Which prompt prefixes each endpoint has recently served: an approximate view of its KV cache.

A prompt is rendered to text (chat messages as `<role>content\\n`, the way the mock and most
chat templates lay them out) and cut into blocks of `BLOCK_CHARS` characters (~256 tokens).
Block k's key is a running CRC-32 over the whole text up to the end of block k, tagged
with k, so a key names a whole prefix, as vLLM's block hashes do: two prompts share
the keys of exactly their common whole blocks.

Why CRC-32 and not blake2b: a key must be the same in every worker and instance (the
index is shared by publishing what was routed), and a running CRC costs one C call per
block (~100 µs for a 32k-token prompt against ~500 µs for chained blake2b). A false match
needs a 32-bit collision at the same block position and only costs a worse route.

Each endpoint keeps its blocks in LRU order, bounded by its KV cache size
(`kv_cache_tokens`), so the index forgets what the backend has likely evicted, and
counts its shared blocks (sent more than once, or held by another endpoint too: prefixes,
as opposed to requests' own tails): the room left for another prefix without evicting one. A
reverse map (key -> bitmask of endpoints) answers "how long is the cached prefix of this
prompt on every endpoint" in one walk of the prompt's keys, whatever the endpoint count.
"""

from __future__ import annotations

import json
import zlib
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from typing import Any

BLOCK_CHARS = 1024
CHARS_PER_TOKEN = 4
BLOCK_TOKENS = BLOCK_CHARS // CHARS_PER_TOKEN


class Prompt:
    """A request's prompt as the index sees it: its block keys and its estimated size."""

    __slots__ = ("keys", "tokens")

    def __init__(self, keys: list[int], tokens: int) -> None:
        self.keys, self.tokens = keys, tokens


def _text(c: Any) -> str:
    if isinstance(c, str):
        return c
    if isinstance(c, list):  # OpenAI content parts
        return "".join(p.get("text", "") for p in c if isinstance(p, dict) and isinstance(p.get("text"), str))
    return "" if c is None else json.dumps(c, sort_keys=True)


def render(kind: str, body: dict[str, Any]) -> str | None:
    """The prompt text of a generation request, or None when it has none."""
    if kind == "chat":
        messages = body.get("messages")
        if not isinstance(messages, list):
            return None
        return "".join(f"<{m.get('role', '')}>{_text(m.get('content'))}\n" for m in messages if isinstance(m, dict))
    if kind == "generate":
        prompt = body.get("prompt")
        if not isinstance(prompt, str):
            return None
        system = body.get("system")
        return f"{system}\n\n{prompt}" if isinstance(system, str) else prompt
    return None


def prompt_keys(model: str, text: str) -> Prompt:
    data = text.encode()
    view = memoryview(data)
    crc = zlib.crc32(model.encode())
    keys: list[int] = []
    append = keys.append
    end = len(data) - len(data) % BLOCK_CHARS
    for i, start in enumerate(range(0, end, BLOCK_CHARS)):
        crc = zlib.crc32(view[start : start + BLOCK_CHARS], crc)
        append(crc << 16 | (i & 0xFFFF))
    if end < len(data):
        # The partial last block: this request's own tail. It only matches an identical
        # prompt, but it takes cache space like the backend's copy of it does, so the
        # LRU bound forgets shared prefixes about as fast as the backend evicts them.
        append(zlib.crc32(view[end:], crc) << 16 | 0xFFFF)
    return Prompt(keys, (len(data) + CHARS_PER_TOKEN - 1) // CHARS_PER_TOKEN)


def _short_chat(messages: object) -> bool:
    """Whether a chat's rendered prompt is surely shorter than one block, told from the
    lengths of its roles and contents when all are strings, without rendering it (0.3 µs
    against ~1 µs for a one-message chat; most chats are short)."""
    if not isinstance(messages, list):
        return False
    size = 0
    for m in messages:
        if isinstance(m, dict):
            role, content = m.get("role", ""), m.get("content")
            if not (isinstance(role, str) and isinstance(content, str)):
                return False
            size += len(role) + len(content) + 3  # <role>content\n
    return size < BLOCK_CHARS


def request_prompt(kind: str, model: str, body: dict[str, Any]) -> Prompt | None:
    """None for prompts shorter than one block: nothing worth routing for, and no work."""
    if kind == "chat" and _short_chat(body.get("messages")):
        return None
    text = render(kind, body)
    return None if text is None or len(text) < BLOCK_CHARS else prompt_keys(model, text)


class PrefixIndex:
    """Per endpoint, the prompt blocks it has recently served, LRU-bounded by its KV size.

    `publish`, when set, is told every insert as (endpoint, keys) so other processes can
    apply the same insert (`apply`); applying never publishes again."""

    def __init__(self, capacity_tokens: dict[str, int] | None = None, default_tokens: int = 131072) -> None:
        self.default_tokens = default_tokens
        self._capacity = {n: max(t // BLOCK_TOKENS, 0) for n, t in (capacity_tokens or {}).items()}
        self._bit: dict[str, int] = {}
        self._names: list[str] = []
        self._lru: dict[str, OrderedDict[int, bool]] = {}  # key -> served more than once
        self._hot: dict[str, int] = {}  # blocks served more than once, per endpoint
        self._owners: dict[int, int] = {}  # block key -> bitmask of endpoints holding it
        self.publish: Callable[[str, list[int]], None] | None = None

    def _slot(self, endpoint: str) -> int:
        bit = self._bit.get(endpoint)
        if bit is None:
            bit = self._bit[endpoint] = 1 << len(self._names)
            self._names.append(endpoint)
            self._lru[endpoint] = OrderedDict()
            self._hot[endpoint] = 0
        return bit

    def set_capacity(self, endpoint: str, tokens: int) -> None:
        self._capacity[endpoint] = max(tokens // BLOCK_TOKENS, 0)

    def capacity_blocks(self, endpoint: str) -> int:
        cap = self._capacity.get(endpoint)
        return self.default_tokens // BLOCK_TOKENS if cap is None else cap

    def match(self, keys: Sequence[int], endpoints: Iterable[str]) -> dict[str, int]:
        """Cached whole blocks at the start of `keys`, per endpoint in `endpoints`."""
        want = 0
        bits = self._bit
        for name in endpoints:
            want |= bits.get(name, 0)
        out = dict.fromkeys(endpoints, 0)
        live, owners = want, self._owners
        i = 0
        for i, key in enumerate(keys):
            held = owners.get(key, 0) & live
            if held != live:
                self._settle(live & ~held, i, out)
                live = held
                if not live:
                    return out
        if live:
            self._settle(live, len(keys), out)
        return out

    def _settle(self, mask: int, n: int, out: dict[str, int]) -> None:
        names = self._names
        while mask:
            low = mask & -mask
            name = names[low.bit_length() - 1]
            if name in out:
                out[name] = n
            mask ^= low

    def insert(self, endpoint: str, keys: Sequence[int]) -> None:
        """`endpoint` now holds these blocks (most recently used)."""
        if not keys:
            return
        self.apply(endpoint, keys)
        if self.publish is not None:
            self.publish(endpoint, list(keys))

    def apply(self, endpoint: str, keys: Sequence[int]) -> None:
        bit = self._slot(endpoint)
        lru, owners = self._lru[endpoint], self._owners
        cap = self.capacity_blocks(endpoint)
        if cap <= 0:
            return
        reused = 0
        for key in keys:
            seen = lru.get(key)
            if seen is None:
                held = owners.get(key, 0)
                owners[key] = held | bit
                lru[key] = held != 0  # held elsewhere too: a shared prefix, not a tail
                reused += held != 0
            else:
                if not seen:
                    lru[key] = True
                    reused += 1
                lru.move_to_end(key)
        if reused:
            self._hot[endpoint] += reused
        self.evict(endpoint, len(lru) - cap)

    def evict(self, endpoint: str, blocks: int) -> None:
        """Forget the `blocks` least recently used blocks of `endpoint`."""
        lru = self._lru.get(endpoint)
        if not lru or blocks <= 0:
            return
        bit, owners = self._bit[endpoint], self._owners
        hot = 0
        for _ in range(min(blocks, len(lru))):
            key, reused = lru.popitem(last=False)
            hot += reused
            left = owners.get(key, 0) & ~bit
            if left:
                owners[key] = left
            else:
                owners.pop(key, None)
        self._hot[endpoint] -= hot

    def remove(self, endpoint: str, keys: Iterable[int]) -> None:
        lru = self._lru.get(endpoint)
        if not lru:
            return
        bit, owners = self._bit[endpoint], self._owners
        for key in keys:
            reused = lru.pop(key, None)
            if reused is not None:
                self._hot[endpoint] -= reused
                left = owners.get(key, 0) & ~bit
                if left:
                    owners[key] = left
                else:
                    owners.pop(key, None)

    def clear(self, endpoint: str) -> None:
        lru = self._lru.get(endpoint)
        if lru:
            self.evict(endpoint, len(lru))

    def blocks(self, endpoint: str) -> int:
        lru = self._lru.get(endpoint)
        return len(lru) if lru else 0

    def shared_blocks(self, endpoint: str) -> int:
        """Blocks `endpoint` was sent more than once, or that another endpoint holds too:
        shared prefixes, as opposed to one request's own tail, which only takes room until
        the LRU drops it."""
        return self._hot.get(endpoint, 0)
