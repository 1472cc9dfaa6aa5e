"""`SharedStore`: a worker's view of the embedded coordinator (see coordinator.py)."""

from __future__ import annotations

import asyncio
import fcntl
import itertools
import json
import logging
import os
from collections import Counter
from typing import Any, Callable, Sequence

from ..domain import Endpoint
from ..routing.policies import Policy
from . import private
from .base import Choose, Lease, NoEndpoint, QueueFull, QueueTimeout, StateStore
from .coordinator import Coordinator
from .memory import MemoryStore

log = logging.getLogger("nomyo_router.shared")

CONNECT_TIMEOUT_S = 10.0


class SharedStore(StateStore):
    """State shared by the workers of one host. `base` names the lock file and the socket."""

    def __init__(self, base: str, endpoints: Sequence[Endpoint], max_queue: int, pin_ttl: float,
                 max_pins: int, policy: Policy) -> None:
        self.lock_path, self.sock_path = base + ".lock", base + ".sock"
        self.endpoints = {e.name: e for e in endpoints}
        self._store_args = (max_queue, pin_ttl, max_pins)
        self._policy = policy
        self._lock_fd: int | None = None
        self._coordinator: Coordinator | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task | None = None
        self._connected = asyncio.Event()
        self._ids = itertools.count(1)
        self._replies: dict[int, asyncio.Future] = {}
        self._acquiring: dict[int, dict[str, Any]] = {}
        self._held: Counter[str] = Counter()
        self._unhealthy: set[str] = set()
        self._closing = False
        self._subs: dict[str, Callable[[Any], None]] = {}
        self._global: dict[str, int] = {}  # in-flight over all workers, as the host last told

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
        store = MemoryStore(*self._store_args)
        self._coordinator = Coordinator(store, list(self.endpoints.values()), self._policy)
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
                    raise RuntimeError(f"no shared-state host answered at {self.sock_path}")
                await asyncio.sleep(0.05)  # a host is being elected; only at start or failover
        self._reader = reader
        self._writer = writer
        for name, n in self._held.items():  # a new host learns the slots we still hold
            if n:
                self._send({"op": "reclaim", "ep": name, "n": n})
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
            # else: a grant nobody waits for; the host releases it when our cancel arrives

    def _send(self, msg: dict[str, Any]) -> None:
        if self._writer is not None and not self._writer.is_closing():
            self._writer.write(json.dumps(msg).encode() + b"\n")

    async def _call(self, msg: dict[str, Any]) -> dict[str, Any]:
        await self._connected.wait()
        rid = msg["id"] = next(self._ids)
        fut = asyncio.get_running_loop().create_future()
        self._replies[rid] = fut
        self._send(msg)
        try:
            return await fut
        finally:
            self._replies.pop(rid, None)

    async def acquire(self, model: str, candidates: Sequence[Endpoint], choose: Choose,
                      timeout: float, order: int | None = None, pin: str | None = None) -> Lease:
        await self._connected.wait()
        rid = next(self._ids)
        msg = {"op": "acquire", "id": rid, "model": model, "cands": [e.name for e in candidates],
               "timeout": timeout, "order": order, "pin": pin}
        fut = asyncio.get_running_loop().create_future()
        self._replies[rid] = fut
        self._acquiring[rid] = msg
        self._send(msg)
        try:
            reply = await fut
        except BaseException:
            self._send({"op": "cancel", "id": rid})
            raise
        finally:
            self._replies.pop(rid, None)
            self._acquiring.pop(rid, None)
        err = reply.get("err")
        if err == "timeout":
            raise QueueTimeout(model, reply.get("order"))
        if err == "full":
            raise QueueFull(model)
        if err == "none":
            raise NoEndpoint(model)
        ep = self.endpoints[reply["ep"]]
        self._held[ep.name] += 1
        self._global.update(reply.get("load") or ())
        lease = Lease(self, ep, reply.get("queued_s", 0.0))
        lease.token = rid
        return lease

    def release(self, endpoint: Endpoint, token: int | None = None) -> None:
        if self._held[endpoint.name] > 0:
            self._held[endpoint.name] -= 1
            n = self._global.get(endpoint.name, 0)
            if n > 0:
                self._global[endpoint.name] = n - 1
            self._send({"op": "release", "ep": endpoint.name, "id": token})

    def record(self, endpoint: str, model: str) -> None:
        self._send({"op": "usage", "ep": endpoint, "model": model})

    def in_flight(self, endpoint: Endpoint) -> int:
        # All workers' count as of our last grant from the host (minus our releases since),
        # never below what this worker holds itself; /health asks the host.
        return max(self._held[endpoint.name], self._global.get(endpoint.name, 0))

    def publish(self, topic: str, data: Any) -> None:
        self._send({"op": "pub", "topic": topic, "data": data})

    def subscribe(self, topic: str, callback: Callable[[Any], None]) -> None:
        self._subs[topic] = callback

    def queue_length(self) -> int:
        return len(self._acquiring)

    async def snapshot(self) -> dict[str, Any]:
        snap = (await self._call({"op": "snapshot"}))["snap"]
        snap["mode"] = "shared"
        return snap

    def update_endpoints(self, endpoints: Sequence[Endpoint]) -> None:
        """Every worker reloads; the host's copy decides (it holds the slot counts)."""
        self.endpoints.update((e.name, e) for e in endpoints)
        if self._coordinator is not None:
            self._coordinator.update_endpoints(endpoints)

    def is_healthy(self, endpoint: Endpoint) -> bool:
        return endpoint.name not in self._unhealthy

    def set_healthy(self, endpoint: Endpoint, healthy: bool) -> None:
        was = endpoint.name not in self._unhealthy
        if healthy == was:
            return
        (self._unhealthy.discard if healthy else self._unhealthy.add)(endpoint.name)
        self._send({"op": "health", "ep": endpoint.name, "ok": healthy})

    async def find_pin(self, keys: Sequence[str]) -> tuple[str, str] | None:
        pin = (await self._call({"op": "find_pin", "keys": list(keys)}))["pin"]
        return tuple(pin) if pin else None  # type: ignore[return-value]

    async def set_pin(self, key: str, endpoint: str) -> None:
        self._send({"op": "set_pin", "key": key, "ep": endpoint})

    async def drop_pin(self, key: str) -> None:
        self._send({"op": "drop_pin", "key": key})

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
