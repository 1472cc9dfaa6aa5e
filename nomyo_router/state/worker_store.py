"""`WorkerStore`: a worker's view of the embedded coordinator (see coordinator.py).

A free slot is taken in the shared slot table (slots.py), a conversation pin is written
and found in the shared pin table (pins.py), a request served is counted in the slot
table's usage counters — none of it sends a message. Only a request that must wait asks
the host. Messages that need no answer (prefix-index inserts, health) are written once
per event-loop turn, together."""

from __future__ import annotations

import asyncio
import fcntl
import itertools
import json
import logging
import os
from collections.abc import Callable, Sequence
from typing import Any

from ..domain import Endpoint
from . import private
from .base import Ask, Changes, Lease, NoEndpoint, Picker, QueueFull, QueueTimeout, Rehome
from .coordinator import Coordinator, TableStore
from .key_limits import BudgetSource
from .pins import PinTable
from .queue_order import Fair
from .slots import SlotTable
from .worker_limits import WorkerLimits

log = logging.getLogger("nomyo_router.shared")

CONNECT_TIMEOUT_S = 10.0
LEARN_TIMEOUT_S = 5.0  # how long a grant on an endpoint this worker's reload has not added yet waits


class WorkerStore(WorkerLimits):
    """State shared by the workers of one host. `base` names the lock file and the socket."""

    def __init__(
        self,
        base: str,
        eps: Sequence[Endpoint],
        max_queue: int,
        pin_ttl: float,
        max_pins: int,
        pick: Picker,
        budgets: BudgetSource | None = None,
    ) -> None:
        """`pick`: how the routing policy chooses among free endpoints (the host grants slots);
        `budgets`: what the token budgets had spent before (read by whichever worker hosts)."""
        self._budgets = budgets
        self.lock_path, self.sock_path = base + ".lock", base + ".sock"
        self.endpoints = {e.name: e for e in eps}
        self._max_queue = max_queue
        self._pick = pick
        self._lock_fd: int | None = None
        self._coordinator: Coordinator | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task[None] | None = None
        self._connected = asyncio.Event()
        self._ids = itertools.count(1)
        self._replies: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._acquiring: dict[int, dict[str, Any]] = {}
        self._unhealthy: set[str] = set()
        self._closing = False
        self._subs: dict[str, Callable[[object], None]] = {}
        self._table = SlotTable(base + ".slots")
        self._out: list[bytes] = []  # messages written at the end of this loop turn
        self._pins = PinTable(base + ".pins", max_pins, pin_ttl, self._table.column, self._table.name_of)
        self._flushing = False
        self._new_pins: list[tuple[str, str]] = []  # written together at the end of this loop turn
        self._reloaded = asyncio.Event()  # set (and replaced) by each reload of this worker

    @property
    def is_host(self) -> bool:
        return self._coordinator is not None

    async def start(self) -> None:
        await self._connect()
        self._reader_task = asyncio.create_task(self._read_loop())

    async def _elect(self) -> None:
        if self._lock_fd is None:
            private.check_file(self.lock_path)
            private.check_file(self.sock_path)
            self._lock_fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return  # another worker hosts the state
        os.ftruncate(self._lock_fd, 0)
        os.pwrite(self._lock_fd, str(os.getpid()).encode(), 0)  # who hosts, for operators
        takeover = os.path.exists(self.sock_path)  # a clean shutdown removes it; a crash does not
        if takeover:
            os.unlink(self.sock_path)
        store = TableStore(self._table, self._pins, self._max_queue)
        self._coordinator = Coordinator(store, list(self.endpoints.values()), self._pick, self._budgets)
        await self._coordinator.start(self.sock_path, takeover)
        os.chmod(self.sock_path, 0o600)  # (the directory is 0700 already; this is the second lock)
        log.warning("worker %d hosts the shared state at %s", os.getpid(), self.sock_path)

    async def _connect(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + CONNECT_TIMEOUT_S
        while True:
            await self._elect()
            try:
                reader, writer = await asyncio.open_unix_connection(self.sock_path)
                break
            except (FileNotFoundError, ConnectionRefusedError):
                if loop.time() > deadline:
                    raise RuntimeError(f"no shared-state host answered at {self.sock_path}") from None
                await asyncio.sleep(0.05)  # a host is being elected; only at start or failover
        self._reader = reader
        self._writer = writer
        self._out.clear()  # (what the old host never got is lost with it)
        self._send({"op": "hello", "row": self._table.row, "pid": os.getpid()})
        for name in self._unhealthy:
            self._send({"op": "health", "ep": name, "ok": False})
        for msg in self._acquiring.values():
            self._send(msg)
        self._connected.set()

    async def _read_loop(self) -> None:
        while not self._closing:
            try:
                line = await self._reader.readline()
            except ConnectionError:
                line = b""
            if not line:
                if self._closing:
                    return
                log.warning("lost the shared-state host; electing a new one")
                self._connected.clear()
                while not self._closing:
                    try:
                        await self._connect()
                        break
                    except (RuntimeError, OSError) as e:  # keep trying; requests wait meanwhile
                        log.error("no shared-state host yet (%s); retrying", e)
                        await asyncio.sleep(1.0)
                continue
            msg = json.loads(line)
            topic = msg.get("pub")
            if topic is not None:
                cb = self._subs.get(topic)
                if cb is not None:
                    cb(msg["data"])
                continue
            fut = self._replies.pop(msg["id"], None)
            if fut is not None and not fut.done():
                fut.set_result(msg)
            elif "ep" in msg:  # granted as we gave up: pass it on
                self.release(self.endpoints.get(msg["ep"]) or Endpoint(name=msg["ep"], url="", slots=0))

    def _send(self, msg: dict[str, Any]) -> None:
        self._out.append(json.dumps(msg).encode() + b"\n")
        self._flush_soon()

    def _flush_soon(self) -> None:
        if not self._flushing:
            self._flushing = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flushing = False
        out = self._out
        if out and self._writer is not None and not self._writer.is_closing():
            if len(out) == 1:
                self._writer.write(out[0])
            else:  # one line for the host to read and parse
                self._writer.write(b'{"op": "batch", "ops": [' + b",".join(m[:-1] for m in out) + b"]}\n")
        out.clear()

    async def _call(self, msg: dict[str, Any]) -> dict[str, Any]:
        await self._connected.wait()
        rid = msg["id"] = next(self._ids)
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._replies[rid] = fut
        self._send(msg)
        try:
            return await fut
        finally:
            self._replies.pop(rid, None)

    async def acquire(self, ask: Ask) -> Lease:
        model, candidates, pin = ask.model, ask.candidates, ask.pin
        table = self._table
        unhealthy = self._unhealthy
        if len(candidates) == 1:  # (the common case: straight to the locked check)
            ep = candidates[0]
            if ep.name not in unhealthy and table.try_take(ep.name, ep.slots, fast=True):
                if pin is not None:
                    self._pin_soon(pin, ep.name)
                return Lease(self, ep)
        elif not table.waiting():  # nobody waits at the host: take a free slot right here
            free = [
                e
                for e in candidates
                if e.name not in unhealthy
                and not table.unhealthy(e.name)
                and table.in_flight(e.name) < table.limit(e.slots)
            ]
            while free:
                ep = free[0] if len(free) == 1 else ask.choose(free)
                if table.try_take(ep.name, ep.slots, fast=True):
                    if pin is not None:
                        self._pin_soon(pin, ep.name)
                    return Lease(self, ep)
                free.remove(ep)
        await self._connected.wait()
        table.wait_begin()  # counted before the host looks, so no release can miss us
        try:
            reply = await self._wait(model, candidates, ask.timeout, ask.order, pin, ask.fair)
        finally:
            table.wait_end()
        err = reply.get("err")
        if err == "timeout":
            raise QueueTimeout(model, reply.get("order"))
        if err == "full":
            raise QueueFull(model)
        if err == "none":
            raise NoEndpoint(model)
        if err == "rehome":
            raise Rehome(model, reply.get("order"), reply.get("waited", 0.0))
        granted = self.endpoints.get(reply["ep"])
        if granted is None:  # added by a reload that another worker applied first
            granted = await self._learn(model, reply["ep"])
        return Lease(self, granted, reply.get("queued_s", 0.0))

    async def _learn(self, model: str, name: str) -> Endpoint:
        """The host granted a slot on `name`, which this worker's own reload of the same file
        brings a moment later: wait for it (bounded), else give the slot back and let the
        scheduler place the request again."""
        try:
            async with asyncio.timeout(LEARN_TIMEOUT_S):
                while name not in self.endpoints:
                    await self._reloaded.wait()
        except BaseException as exc:
            self.release(Endpoint(name=name, url="", slots=0))
            if isinstance(exc, TimeoutError):
                raise Rehome(model, None, LEARN_TIMEOUT_S) from None
            raise
        return self.endpoints[name]

    async def _wait(
        self,
        model: str,
        candidates: Sequence[Endpoint],
        timeout: float,
        order: int | None,
        pin: str | None,
        fair: Fair | None = None,
    ) -> dict[str, Any]:
        rid = next(self._ids)
        msg = {
            "op": "acquire",
            "id": rid,
            "model": model,
            "cands": [e.name for e in candidates],
            "timeout": timeout,
            "order": order,
            "pin": pin,
            "fair": fair,
        }
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._replies[rid] = fut
        self._acquiring[rid] = msg
        self._send(msg)
        try:
            return await fut
        except BaseException:
            self._send({"op": "cancel", "id": rid})
            raise
        finally:
            self._replies.pop(rid, None)
            self._acquiring.pop(rid, None)

    def release(self, endpoint: Endpoint, token: object = None) -> None:
        if self._table.give_back(endpoint.name):  # somebody waits: the host hands it on
            host = self._coordinator
            if host is not None:
                host.store._dispatch(host.endpoints.get(endpoint.name, endpoint))
            else:
                self._send({"op": "poke", "ep": endpoint.name})

    def record(self, endpoint: str, model: str) -> None:
        self._table.record(endpoint, model)

    def in_flight(self, endpoint: Endpoint) -> int:
        return self._table.in_flight(endpoint.name)

    def publish(self, topic: str, data: object) -> None:
        self._send({"op": "pub", "topic": topic, "data": data})

    def subscribe(self, topic: str, callback: Callable[[object], None]) -> None:
        self._subs[topic] = callback

    def queue_length(self) -> int:
        return len(self._acquiring)

    async def snapshot(self) -> dict[str, Any]:
        snap: dict[str, Any] = (await self._call({"op": "snapshot"}))["snap"]
        snap["mode"] = "shared"
        return snap

    def update_endpoints(self, endpoints: Sequence[Endpoint]) -> None:
        """Every worker reloads; the host's copy decides (it holds the slot counts). The host
        learns the names now, so that this worker's requests may wait for an endpoint the
        reload added even before the host worker has applied the same reload."""
        self.endpoints.update((e.name, e) for e in endpoints)
        self._reloaded.set()
        self._reloaded = asyncio.Event()
        if self._coordinator is not None:
            self._coordinator.update_endpoints(endpoints)
        else:
            self._send({"op": "endpoints", "eps": [[e.name, e.slots] for e in endpoints]})

    def rehome(self, changes: Changes) -> None:
        """The host changes every worker's waiting requests at once (the first worker to
        apply a reload moves them all, in one FIFO order; the others' same message then
        changes nothing). A request the host sends back comes back here with Rehome."""
        self._send(
            {
                "op": "rehome",
                "changes": {m: [sorted(gone), [e.name for e in new]] for m, (gone, new) in changes.items()},
            }
        )

    def is_healthy(self, endpoint: Endpoint) -> bool:
        return endpoint.name not in self._unhealthy

    def set_healthy(self, endpoint: Endpoint, healthy: bool) -> None:
        was = endpoint.name not in self._unhealthy
        if healthy == was:
            return
        (self._unhealthy.discard if healthy else self._unhealthy.add)(endpoint.name)
        self._send({"op": "health", "ep": endpoint.name, "ok": healthy})

    def _pin_soon(self, key: str, endpoint: str) -> None:
        """Pins of one loop turn go into the table under one lock, before any other worker
        can have seen the answer they are for."""
        if not self._new_pins:
            asyncio.get_running_loop().call_soon(self._write_pins)
        self._new_pins.append((key, endpoint))

    def _write_pins(self) -> None:
        if self._new_pins:
            self._pins.set_many(self._new_pins)
            self._new_pins.clear()

    async def find_pin(self, keys: Sequence[str]) -> tuple[str, str] | None:
        self._write_pins()
        return self._pins.find(keys)

    async def set_pin(self, key: str, endpoint: str) -> None:
        self._write_pins()
        self._pins.set(key, endpoint)

    async def drop_pin(self, key: str) -> None:
        self._write_pins()
        self._pins.drop(key)

    async def close(self) -> None:
        self._closing = True
        if self._reader_task is not None:
            self._reader_task.cancel()
        if self._writer is not None:
            self._writer.close()
        if self._coordinator is not None:
            await self._coordinator.close()
            if os.path.exists(self.sock_path):
                os.unlink(self.sock_path)
        if self._lock_fd is not None:
            os.close(self._lock_fd)
        self._write_pins()
        self._table.close()
        self._pins.close()
