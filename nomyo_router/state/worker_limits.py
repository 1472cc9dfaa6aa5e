"""The rate limits of `--workers N` (worker_store.py): counted once, by the shared-state host.

A limited key's request asks the host's one count (key_limits.py): one round trip, only for keys
that have limits; the host worker asks its own count directly. While no host answers (one is
being elected), the worker's own count stands in: its reservations are numbered below zero,
to be settled there. A new host starts from what the usage database says was spent.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from .base import StateStore
from .coordinator import Coordinator
from .key_limits import Limits, Verdict

LIMIT_TIMEOUT_S = 2.0  # how long a limited key's request waits for the host's verdict


class WorkerLimits(StateStore):
    """`WorkerStore`'s admit and spend (it provides the host and the messages)."""

    _coordinator: Coordinator | None = None

    def _send(self, msg: dict[str, Any]) -> None:
        raise NotImplementedError

    async def _call(self, msg: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    async def admit(self, client: str, limits: Limits, count: bool = True, reserve: int = 0) -> Verdict:
        host = self._coordinator
        if host is not None:
            return host.limiter.admit(client, limits, time.time(), count, reserve)
        msg = {"op": "limit", "client": client, "limits": limits.wire(), "count": count, "reserve": reserve}
        try:
            async with asyncio.timeout(LIMIT_TIMEOUT_S):
                reply = await self._call(msg)
        except TimeoutError:
            v = await super().admit(client, limits, count, reserve)
            return v._replace(hold=-v.hold)
        return Verdict.from_wire(reply["verdict"])

    def spend(self, client: str, tokens: int, limits: Limits, hold: int = 0, reserved: int = 0) -> None:
        host = self._coordinator
        if hold < 0:  # (reserved here; the tokens go to the shared count)
            super().spend(client, 0, limits, -hold, reserved)
            hold = 0
        if host is not None:
            host.limiter.spend(client, tokens, limits, time.time(), hold, reserved)
        else:
            msg = {"op": "spend", "client": client, "tokens": tokens, "limits": limits.wire()}
            self._send({**msg, "hold": hold, "reserved": reserved} if hold else msg)
