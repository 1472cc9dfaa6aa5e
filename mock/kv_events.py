"""vLLM-style KV-cache events from the mock's prefix cache, over ZeroMQ PUB (msgpack).

vLLM started with `--kv-events-config '{"enable_kv_cache_events": true, "publisher": "zmq",
"endpoint": "tcp://*:5557"}'` publishes, per scheduler step, a multipart message
(topic, 8-byte big-endian sequence number, msgpack payload). The payload is a
`KVEventBatch` (vllm/distributed/kv_events.py, msgspec structs, tagged union):

    {"ts": float, "events": [event, ...], "data_parallel_rank": int}
    BlockStored:      {"type": "BlockStored", "block_hashes": [...], "parent_block_hash": h|None,
                       "token_ids": [...], "block_size": n, "lora_id": None, "medium": "GPU",
                       "lora_name": None}
    BlockRemoved:     {"type": "BlockRemoved", "block_hashes": [...], "medium": "GPU"}
    AllBlocksCleared: {"type": "AllBlocksCleared"}

(vLLM before 0.11 encoded the same structs `array_like`: lists with the tag first; the
router's consumer reads both.) The mock publishes one batch per cache change, from its
event loop; `--kv-events tcp://127.0.0.1:PORT` binds the PUB socket.
"""

from __future__ import annotations

import time
from typing import Any

TOPIC = b"kv-events"


class KVEventPublisher:
    def __init__(self, address: str, block_size: int) -> None:
        import msgpack
        import zmq  # optional dependencies: only when events are asked for

        self._pack = msgpack.packb
        self._ctx = zmq.Context.instance()
        self._pub = self._ctx.socket(zmq.PUB)
        self._pub.setsockopt(zmq.LINGER, 0)
        self._pub.bind(address)
        self._zmq = zmq
        self.block_size = block_size
        self._seq = 0
        self.published = 0

    def _send(self, events: list[dict[str, Any]]) -> None:
        payload = self._pack({"ts": time.time(), "events": events, "data_parallel_rank": 0})
        try:
            self._pub.send_multipart((TOPIC, self._seq.to_bytes(8, "big"), payload), flags=self._zmq.NOBLOCK)
        except self._zmq.Again:  # no room at the high-water mark: dropped, as PUB does
            return
        self._seq += 1
        self.published += 1

    def stored(self, hashes: list[int], parent: int | None, tokens: int) -> None:
        if hashes:
            self._send(
                [
                    {
                        "type": "BlockStored",
                        "block_hashes": hashes,
                        "parent_block_hash": parent,
                        "token_ids": [0] * tokens,
                        "block_size": self.block_size,
                        "lora_id": None,
                        "medium": "GPU",
                        "lora_name": None,
                    }
                ]
            )

    def removed(self, hashes: list[int]) -> None:
        if hashes:
            self._send([{"type": "BlockRemoved", "block_hashes": hashes, "medium": "GPU"}])

    def cleared(self) -> None:
        self._send([{"type": "AllBlocksCleared"}])

    def close(self) -> None:
        self._pub.close(0)
