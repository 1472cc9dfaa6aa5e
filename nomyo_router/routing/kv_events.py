"""Precise mode: keep the prefix index honest with a vLLM backend's own KV-cache events.

vLLM (`--kv-events-config '{"enable_kv_cache_events": true, "publisher": "zmq",
"endpoint": "tcp://*:5557"}'`) publishes multipart ZMQ messages (topic, 8-byte sequence,
msgpack `KVEventBatch`): BlockStored, BlockRemoved, AllBlocksCleared (see
mock/kv_events.py for the exact shape; both vLLM's map encoding and its older array_like
encoding are read).

What the router can and cannot learn from them: vLLM's block hashes are over token ids,
and the router has no tokenizer, so it cannot map a backend block to a prompt block. It
can learn exactly *how much* the backend holds and *when* it evicts or clears:

- AllBlocksCleared (restart, cache reset): the index forgets the endpoint at once.
- BlockRemoved: the backend evicted; the index trims its own LRU for that endpoint down to
  what the backend still holds (live blocks x block size), oldest first — the backend's
  eviction is LRU too, so the same prefixes go.

So the index never believes in more cache than the backend has (a smaller or busier KV
cache than configured, a restart), which is what the approximate index gets wrong.
One subscriber per worker process; ZMQ PUB fans out to all of them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Hashable, Iterable
from typing import Any

from ..config import EndpointConfig
from .prefix_index import BLOCK_TOKENS, PrefixIndex

log = logging.getLogger("nomyo_router.kv_events")


def _event(ev: Any) -> tuple[str, dict[str, Any]]:
    """(type, fields) from either encoding."""
    if isinstance(ev, dict):
        return str(ev.get("type", "")), ev
    if isinstance(ev, (list, tuple)) and ev:
        kind = ev[0]
        if kind == "BlockStored":
            return kind, {"block_hashes": ev[1], "block_size": ev[4] if len(ev) > 4 else 0}
        if kind == "BlockRemoved":
            return kind, {"block_hashes": ev[1]}
        return str(kind), {}
    return "", {}


class KVEventState:
    """One endpoint's backend cache as its events tell it, applied to the index."""

    def __init__(self, endpoint: str, index: PrefixIndex) -> None:
        self.endpoint = endpoint
        self.index = index
        self.live: set[Hashable] = set()  # the backend's block hashes (ints, or bytes)
        self.block_size = 16  # vLLM's default until a BlockStored says otherwise
        self.batches = 0

    @property
    def backend_tokens(self) -> int:
        return len(self.live) * self.block_size

    def apply(self, batch: object) -> None:
        """One decoded batch: vLLM's `[timestamp, events, ...]`, or a map with `events`. A batch
        of another shape raises TypeError, KeyError or IndexError (the subscriber logs it)."""
        if isinstance(batch, dict):
            events = batch.get("events", [])
        elif isinstance(batch, (list, tuple)):
            events = batch[1]
        else:
            raise TypeError(f"a KV event batch is an array or a map, not {type(batch).__name__}")
        removed = False
        for ev in events:
            kind, f = _event(ev)
            if kind == "BlockStored":
                self.block_size = int(f.get("block_size") or self.block_size)
                self.live.update(_hashable(h) for h in f.get("block_hashes", ()))
            elif kind == "BlockRemoved":
                self.live.difference_update(_hashable(h) for h in f.get("block_hashes", ()))
                removed = True
            elif kind == "AllBlocksCleared":
                self.live.clear()
                self.index.clear(self.endpoint)
        if removed:
            excess = self.index.blocks(self.endpoint) - self.backend_tokens // BLOCK_TOKENS
            self.index.evict(self.endpoint, excess)
        self.batches += 1


def _hashable(h: Any) -> Any:
    return bytes(h) if isinstance(h, (bytearray, list)) else h


def start(
    endpoints: Iterable[EndpointConfig], policy: object
) -> tuple[list[asyncio.Task[None]], dict[str, KVEventState]]:
    """A subscriber task per endpoint configured with `kv_events`, when the policy has an index."""
    index = getattr(policy, "index", None)
    tasks: list[asyncio.Task[None]] = []
    states: dict[str, KVEventState] = {}
    for e in endpoints:
        if e.kv_events and index is not None:
            states[e.name] = KVEventState(e.name, index)
            tasks.append(asyncio.create_task(subscribe(states[e.name], e.kv_events)))
    return tasks, states


async def subscribe(state: KVEventState, address: str) -> None:
    """Run until cancelled: SUB to `address`, apply every batch to the index."""
    endpoint = state.endpoint
    try:
        import msgpack
        import zmq
        import zmq.asyncio
    except ImportError:
        log.error(
            "endpoint %s: kv_events needs pyzmq and msgpack (pip install 'nomyo-router[kv-events]'); "
            "using the approximate index",
            endpoint,
        )
        return
    ctx = zmq.asyncio.Context.instance()
    sock = ctx.socket(zmq.SUB)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SUBSCRIBE, b"")
    sock.connect(address)  # ZMQ reconnects by itself when the backend restarts
    log.info("endpoint %s: following KV events at %s", endpoint, address)
    try:
        while True:
            frames = await sock.recv_multipart()
            try:
                state.apply(msgpack.unpackb(frames[-1], raw=False, strict_map_key=False))
            except (ValueError, TypeError, KeyError, IndexError, msgpack.UnpackException) as e:
                log.warning("endpoint %s: unreadable KV event batch (%s)", endpoint, e)
    except asyncio.CancelledError:
        raise
    finally:
        sock.close(0)
