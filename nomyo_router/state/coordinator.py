"""The embedded shared state for `--workers N` on one host: one worker hosts the state.

The workers of one uvicorn master elect a host with an exclusive `flock` on a lock
file; the winner serves a `MemoryStore` (the same exact, FIFO, work-conserving code as a
single worker) on a Unix socket, and every worker (the host too) talks to it through
`WorkerStore`. No extra service runs.

Why this design: a request that finds a free slot takes it in the slot table every
worker maps (`slots.py`: shared memory under `flock`, a few microseconds, no message);
the wait queue needs cross-process wake-ups in FIFO order, which a single owner does
naturally, so only a request that must wait crosses the socket (measured in
`bench/state_ops.py`). While anyone waits, new requests queue behind them here.

Failure: every slot is counted in its worker's row of the table. A worker that dies
(even `kill -9`) drops its connection, and the host zeroes its row at once. If the host
dies, the kernel releases its lock, a survivor takes over, zeroes the rows of processes
that are gone, and every worker re-sends the requests it still has waiting.

Wire format: one JSON object per line. Worker -> host:
  {"op": "hello", "row", "pid"}  first: the worker's row in the slot table
  {"op": "acquire", "id", "model", "cands", "timeout", "order", "pin", "fair"}
      -> {"id", "ep", "queued_s"} | {"id", "err", "order"}
      ("fair": [client, priority, step], its key's share of the queue, queue_order.py)
  {"op": "cancel", "id"}            {"op": "poke", "ep"}  (a slot freed while somebody waits)
  {"op": "endpoints", "eps": [[name, slots]]}  (a reload: names the host may not know yet)
  {"op": "rehome", "changes": {model: [gone names, added names]}}  (a worker's reindex: every
      waiting request of those models changes in place; one left with no endpoint is answered
      {"id", "err": "rehome", "order", "waited"} and its worker places it again)
  {"op": "health", "ep", "ok"}      {"op": "snapshot", "id"} -> {"id", "snap"}
  {"op": "pub", "topic", "data"} -> relayed to the others as {"pub", "data"}
  {"op": "batch", "ops": [...]}     several of the above, written in one loop turn
  {"op": "limit", "id", "client", "limits", "count", "reserve"} -> {"id", "verdict"}  (a limited
      key's request: the host's one count admits it or not, and reserves its tokens, key_limits.py)
  {"op": "spend", "client", "tokens", "limits", "hold", "reserved"}  (its answer ended having used
      that many tokens: its reservation is settled; a worker that is gone has its reservations
      dropped)
(Pins and usage counts need no message: pins.py and slots.py.)
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Sequence
from typing import Any

from ..domain import Endpoint
from .base import Ask, Choose, Lease, NoEndpoint, Picker, QueueFull, QueueTimeout, Rehome
from .key_limits import BudgetSource, Limiter, Limits
from .memory import MemoryStore
from .pins import PinTable
from .slots import SlotTable

log = logging.getLogger("nomyo_router.coordinator")


class TableStore(MemoryStore):
    """The host's queue, with the slot counts, pins and usage in the shared tables: a grant
    is taken there under its lock, in the row of the worker it is for (`owner`)."""

    def __init__(self, table: SlotTable, pins: PinTable, max_queue: int) -> None:
        super().__init__(max_queue)
        self.table = table
        self.pins = pins

    def _pin(self, key: str, endpoint: str) -> None:
        self.pins.set(key, endpoint)

    async def find_pin(self, keys: Sequence[str]) -> tuple[str, str] | None:
        return self.pins.find(keys)

    async def drop_pin(self, key: str) -> None:
        self.pins.drop(key)

    def pin_count(self) -> int:
        return self.pins.count()

    async def snapshot(self) -> dict[str, Any]:
        return {
            "mode": "shared",
            "in_flight": {},
            "queue_length": self._queued,
            "pins": self.pins.count(),
            "usage": self.table.usage(),
        }

    def _free(self, ep: Endpoint) -> bool:
        return ep.name not in self._unhealthy and self.table.in_flight(ep.name) < self.table.limit(ep.slots)

    async def acquire(self, ask: Ask) -> Lease:
        # A worker gives slots back in the table and only then tells us: a slot may be free
        # here while requests wait for it. Those waited first, so they get it first.
        if self._queued:
            for ep in ask.candidates:
                self._dispatch(ep)
        return await super().acquire(ask)

    def _take(self, ep: Endpoint, owner: object = None) -> bool:
        return self.table.try_take(ep.name, ep.slots, owner)  # type: ignore[arg-type]

    def release(self, endpoint: Endpoint, token: object = None) -> None:
        self.table.give_back(endpoint.name, token)  # type: ignore[arg-type]
        self._dispatch(endpoint)

    def in_flight(self, endpoint: Endpoint) -> int:
        return self.table.in_flight(endpoint.name)

    def set_healthy(self, endpoint: Endpoint, healthy: bool) -> None:
        self.table.set_unhealthy(endpoint.name, not healthy)
        super().set_healthy(endpoint, healthy)


class Coordinator:
    """Serves one MemoryStore to every worker over a Unix socket."""

    def __init__(
        self, store: TableStore, endpoints: Sequence[Endpoint], pick: Picker, budgets: BudgetSource | None = None
    ) -> None:
        """`budgets`: what the token budgets had spent before this host (the usage database)."""
        self.store = store
        self.endpoints = {e.name: e for e in endpoints}
        self.pick = pick
        self._server: asyncio.AbstractServer | None = None
        self._closed = False
        self._writers: set[asyncio.StreamWriter] = set()  # for relaying `pub` messages
        self.limiter = Limiter()  # every worker's rate limits, counted once, here
        self._budgets = budgets

    def update_endpoints(self, endpoints: Sequence[Endpoint]) -> None:
        self.endpoints.update((e.name, e) for e in endpoints)
        self.store.update_endpoints(endpoints)

    def choose_for(self, model: str) -> Choose:
        pick, in_flight = self.pick, self.store.in_flight
        return lambda free: pick(model, free, in_flight)

    async def start(self, path: str, takeover: bool = False) -> None:
        """`takeover`: an earlier host died; give back the slots of processes that are gone."""
        if takeover:
            self.store.table.reclaim()
        await self.limiter.seed_from(self._budgets)  # (a restart, or an earlier host that died)
        self._server = await asyncio.start_unix_server(self._connection, path=path)

    def _dispatch_all(self) -> None:
        for ep in self.endpoints.values():
            self.store._dispatch(ep)

    async def close(self) -> None:
        self._closed = True
        if self._server is not None:
            self._server.close()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        pending: dict[int, asyncio.Task[None]] = {}
        holds: dict[int, str] = {}  # the worker's token reservations not settled yet -> client
        who: list[int] = []  # [row, pid] in the slot table, from the worker's hello
        store = self.store

        def send(msg: dict[str, Any]) -> None:
            if not writer.is_closing():
                writer.write(json.dumps(msg).encode() + b"\n")

        async def acquire(msg: dict[str, Any]) -> None:
            rid = msg["id"]
            cands = [self.endpoints[n] for n in msg["cands"] if n in self.endpoints]
            try:
                ask = Ask(
                    model=msg["model"],
                    candidates=cands,
                    choose=self.choose_for(msg["model"]),
                    timeout=msg["timeout"],
                    order=msg.get("order"),
                    pin=msg.get("pin"),
                    fair=tuple(msg["fair"]) if msg.get("fair") else None,
                    owner=who[0],
                )
                lease = await store.acquire(ask)
            except QueueTimeout as waited:
                send({"id": rid, "err": "timeout", "order": waited.order})
            except QueueFull:
                send({"id": rid, "err": "full"})
            except NoEndpoint:
                send({"id": rid, "err": "none"})
            except Rehome as e:
                send({"id": rid, "err": "rehome", "order": e.order, "waited": e.waited})
            else:  # counted in the worker's row; it gives the slot back itself
                send({"id": rid, "ep": lease.endpoint.name, "queued_s": lease.queued_s})
            finally:
                pending.pop(rid, None)

        async def handle(msg: dict[str, Any]) -> None:
            op = msg["op"]
            if op == "acquire":
                pending[msg["id"]] = asyncio.create_task(acquire(msg))
            elif op == "pub":  # relay to every other worker as is
                out = json.dumps({"pub": msg["topic"], "data": msg["data"]}).encode() + b"\n"
                for w in self._writers:
                    if w is not writer and not w.is_closing():
                        w.write(out)
            elif op == "batch":
                for m in msg["ops"]:
                    await handle(m)
            elif op == "poke":
                ep = self.endpoints.get(msg["ep"])
                if ep is not None:
                    store._dispatch(ep)
            elif op == "cancel":
                task = pending.get(msg["id"])
                if task is not None:
                    task.cancel()
            elif op == "rehome":  # after the acquires of this batch have queued (their tasks run first)
                changes = {
                    m: (frozenset(gone), [self.endpoints[n] for n in new if n in self.endpoints])
                    for m, (gone, new) in msg["changes"].items()
                }
                asyncio.get_running_loop().call_soon(store.rehome, changes)
            elif op == "endpoints":
                for name, slots in msg["eps"]:
                    if name not in self.endpoints:  # (the host worker's own reload brings the real one)
                        self.endpoints[name] = Endpoint(name=name, url="", slots=slots)
            elif op == "hello":
                who[:] = [msg["row"], msg["pid"]]
            elif op == "health":
                ep = self.endpoints.get(msg["ep"])
                if ep is not None:
                    store.set_healthy(ep, msg["ok"])
            elif op == "limit":
                verdict = self.limiter.admit(
                    msg["client"],
                    Limits.from_wire(msg["limits"]),
                    time.time(),
                    msg.get("count", True),
                    msg.get("reserve", 0),
                )
                if verdict.hold:
                    holds[verdict.hold] = msg["client"]
                send({"id": msg["id"], "verdict": verdict.wire()})
            elif op == "spend":
                hold = msg.get("hold", 0)
                holds.pop(hold, None)
                self.limiter.spend(
                    msg["client"],
                    msg["tokens"],
                    Limits.from_wire(msg["limits"]),
                    time.time(),
                    hold,
                    msg.get("reserved", 0),
                )
            elif op == "snapshot":
                snap = await store.snapshot()
                snap["in_flight"] = {name: store.table.in_flight(name) for name in self.endpoints}
                send({"id": msg["id"], "snap": snap})

        self._writers.add(writer)
        try:
            while line := await reader.readline():
                await handle(json.loads(line))
                if writer.transport.get_write_buffer_size() > 65536:
                    await writer.drain()
        except (ConnectionError, ValueError, KeyError) as ended:
            log.warning("worker connection ended: %s", ended)
        except asyncio.CancelledError:
            pass  # the host is shutting down
        finally:
            self._writers.discard(writer)
            tasks = list(pending.values())
            for task in tasks:
                task.cancel()
            if tasks:
                await asyncio.gather(*tasks, return_exceptions=True)
            for hold, client in holds.items():  # its requests ended with it: nothing will settle them
                self.limiter.release(client, hold)
            if who and not self._closed:  # the worker is gone: so are its slots and its waits
                store.table.reclaim(who[0], who[1])
                self._dispatch_all()
            writer.close()
