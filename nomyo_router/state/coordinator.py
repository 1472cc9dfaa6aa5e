"""The embedded shared state for `--workers N` on one host: one worker hosts the state.

The workers of one uvicorn master elect a host with an exclusive `flock` on a lock
file; the winner serves a `MemoryStore` (the same exact, FIFO, work-conserving code as a
single worker) on a Unix socket, and every worker (the host too) talks to it through
`SharedStore`. No extra service runs.

Why this design: a lock-guarded shared-memory table or SQLite file could count slots,
but the wait queue also needs cross-process wake-ups in FIFO order, which a single
owner does naturally. The cost is one Unix-socket round trip per acquire (measured in
`bench/state_ops.py`), paid only when several workers run.

Failure: leases belong to a connection. A worker that dies (even `kill -9`) drops its
connection and its slots come back at once. If the host dies, the kernel releases its
lock, a survivor takes over, and every worker reconnects and re-declares the slots it
still holds before the new host grants new ones (a short grace period).

Wire format: one JSON object per line. Worker -> host:
  {"op": "acquire", "id", "model", "cands", "timeout", "order", "pin"}  -> {"id", "ep", "queued_s", "load"} | {"id", "err", "order"}
  {"op": "cancel", "id"}            {"op": "release", "ep"}        {"op": "reclaim", "ep", "n"}
  {"op": "health", "ep", "ok"}      {"op": "find_pin", "id", "keys"} -> {"id", "pin"}
  {"op": "usage", "ep", "model"}     {"op": "pub", "topic", "data"} -> relayed to the others as {"pub", "data"}
  {"op": "set_pin", "key", "ep"}    {"op": "drop_pin", "key"}      {"op": "snapshot", "id"} -> {"id", "snap"}
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import Counter
from typing import Any, Sequence

from ..domain import Endpoint
from ..routing.policies import Policy, RouteContext
from .base import Choose, NoEndpoint, QueueFull, QueueTimeout
from .memory import MemoryStore

log = logging.getLogger("nomyo_router.coordinator")

GRACE_S = 0.3  # a new host waits this long for survivors to re-declare their slots


class Coordinator:
    """Serves one MemoryStore to every worker over a Unix socket."""

    def __init__(self, store: MemoryStore, endpoints: Sequence[Endpoint], policy: Policy) -> None:
        self.store = store
        self.endpoints = {e.name: e for e in endpoints}
        self.policy = policy
        self._server: asyncio.AbstractServer | None = None
        self._ready = asyncio.Event()
        self._writers: set[asyncio.StreamWriter] = set()  # for relaying `pub` messages

    def update_endpoints(self, endpoints: Sequence[Endpoint]) -> None:
        self.endpoints.update((e.name, e) for e in endpoints)
        self.store.update_endpoints(endpoints)

    def choose_for(self, model: str) -> Choose:
        ctx = RouteContext(model=model, api="", kind="")
        policy, in_flight = self.policy, self.store.in_flight
        return lambda free: policy.choose(ctx, free, in_flight)

    async def start(self, path: str, takeover: bool = False) -> None:
        """`takeover`: an earlier host died; wait for survivors to re-declare their slots."""
        self._server = await asyncio.start_unix_server(self._connection, path=path)
        if takeover:
            asyncio.get_running_loop().call_later(GRACE_S, self._ready.set)
        else:
            self._ready.set()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held: Counter[str] = Counter()  # slots this worker holds, released if it vanishes
        pending: dict[int, asyncio.Task] = {}
        granted: dict[int, str] = {}  # acquire id -> endpoint, until its release or cancel

        def send(msg: dict[str, Any]) -> None:
            if not writer.is_closing():
                writer.write(json.dumps(msg).encode() + b"\n")

        async def acquire(msg: dict[str, Any]) -> None:
            rid = msg["id"]
            cands = [self.endpoints[n] for n in msg["cands"] if n in self.endpoints]
            try:
                await self._ready.wait()
                lease = await self.store.acquire(msg["model"], cands, self.choose_for(msg["model"]),
                                                 msg["timeout"], msg.get("order"), msg.get("pin"))
            except QueueTimeout as e:
                send({"id": rid, "err": "timeout", "order": e.order})
            except QueueFull:
                send({"id": rid, "err": "full"})
            except NoEndpoint:
                send({"id": rid, "err": "none"})
            else:
                held[lease.endpoint.name] += 1
                granted[rid] = lease.endpoint.name
                in_flight = self.store.in_flight
                send({"id": rid, "ep": lease.endpoint.name, "queued_s": lease.queued_s,
                      "load": {e.name: in_flight(e) for e in cands}})
            finally:
                pending.pop(rid, None)

        def release(name: str) -> None:
            if held[name] > 0 and name in self.endpoints:
                held[name] -= 1
                self.store.release(self.endpoints[name])

        self._writers.add(writer)
        try:
            while line := await reader.readline():
                msg = json.loads(line)
                op = msg["op"]
                if op == "pub":  # relay to every other worker as is
                    out = json.dumps({"pub": msg["topic"], "data": msg["data"]}).encode() + b"\n"
                    for w in self._writers:
                        if w is not writer and not w.is_closing():
                            w.write(out)
                    continue
                if op == "acquire":
                    pending[msg["id"]] = asyncio.create_task(acquire(msg))
                elif op == "release":
                    granted.pop(msg.get("id"), None)
                    release(msg["ep"])
                elif op == "cancel":
                    task = pending.get(msg["id"])
                    if task is not None:
                        task.cancel()
                    elif msg["id"] in granted:  # granted just as the worker gave up
                        release(granted.pop(msg["id"]))
                elif op == "reclaim":
                    ep = self.endpoints.get(msg["ep"])
                    if ep is not None:
                        for _ in range(msg["n"]):
                            self.store._take(ep)
                            held[ep.name] += 1
                elif op == "health":
                    ep = self.endpoints.get(msg["ep"])
                    if ep is not None:
                        self.store.set_healthy(ep, msg["ok"])
                elif op == "find_pin":
                    send({"id": msg["id"], "pin": await self.store.find_pin(msg["keys"])})
                elif op == "set_pin":
                    await self.store.set_pin(msg["key"], msg["ep"])
                elif op == "drop_pin":
                    await self.store.drop_pin(msg["key"])
                elif op == "usage":
                    self.store.record(msg["ep"], msg["model"])
                elif op == "snapshot":
                    send({"id": msg["id"], "snap": await self.store.snapshot()})
                await writer.drain()
        except (ConnectionError, ValueError, KeyError) as e:
            log.warning("worker connection ended: %s", e)
        finally:
            self._writers.discard(writer)
            for task in list(pending.values()):
                task.cancel()
            for name, n in held.items():
                for _ in range(n):
                    self.store.release(self.endpoints[name])
            held.clear()
            writer.close()
