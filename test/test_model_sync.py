"""ModelSync in one process, over an in-memory bus standing in for the store's pub/sub: a
change is applied by every peer before `share` returns, an older list never replaces a
newer one, a silent or dead peer is waited for a bounded time (a dead local one not at all),
lists too big to carry are re-read by the receivers, and one process polls periodically."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from nomyo_router.backends import model_sync
from nomyo_router.backends.model_sync import ModelSync, Snapshot
from nomyo_router.domain import Endpoint


class Bus:
    """Delivers each message to every other subscriber, a loop turn later (like a socket)."""

    def __init__(self) -> None:
        self.subs: list[tuple[object, Callable[[Any], None]]] = []
        self.sent: list[dict[str, Any]] = []

    def store(self) -> BusStore:
        return BusStore(self)


class BusStore:
    def __init__(self, bus: Bus) -> None:
        self.bus = bus
        self.muted = False  # a process that receives but never answers

    def publish(self, topic: str, data: Any) -> None:
        if self.muted:
            return
        self.bus.sent.append(data)
        loop = asyncio.get_running_loop()
        for who, cb in self.bus.subs:
            if who is not self:
                loop.call_soon(cb, data)

    def subscribe(self, topic: str, callback: Callable[[Any], None]) -> None:
        self.bus.subs.append((self, callback))


def snap(at: float, *models: str) -> Snapshot:
    return {"at": at, "type": "ollama", "version": "0.1", "tags": [{"name": m, "model": m} for m in models], "ps": []}


class Worker:
    def __init__(self, bus: Bus) -> None:
        self.ep = Endpoint(name="a", url="http://a", slots=1)
        self.store = bus.store()
        self.reindexed = 0
        self.refetched = 0
        self.backend: list[str] = []
        self.sync = ModelSync(self.store, lambda: [self.ep], self._reindex, self._refetch)  # type: ignore[arg-type]

    def _reindex(self) -> None:
        self.reindexed += 1

    async def _refetch(self, ep: Endpoint) -> Snapshot | None:
        self.refetched += 1
        await asyncio.sleep(0.01)
        s = snap(time.time(), *self.backend)
        self.sync.take(ep, s)
        return s

    def models(self) -> set[str]:
        return set(self.ep.models)


async def workers(n: int, bus: Bus | None = None) -> tuple[Bus, list[Worker]]:
    """`n` workers started on `bus` (a new loss-free one by default)."""
    bus = Bus() if bus is None else bus
    ws = [Worker(bus) for _ in range(n)]
    for w in ws:
        w.sync.start()
    await asyncio.sleep(0.01)  # hello / here
    return bus, ws


async def test_share_returns_once_every_peer_applied_it():
    _, ws = await workers(4)
    assert all(len(w.sync.peers) == 3 for w in ws)
    s = snap(time.time(), "tiny-copy:latest")
    ws[0].sync.take(ws[0].ep, s)
    await ws[0].sync.share({ws[0].ep: s}, wait=True, full=False)
    assert all(w.models() == {"tiny-copy:latest"} for w in ws)  # no await in between: already applied
    assert all(w.reindexed == 1 for w in ws[1:])


async def test_an_older_list_never_replaces_a_newer_one():
    _, ws = await workers(2)
    old, new = snap(100.0, "old:latest"), snap(200.0, "new:latest")
    ws[0].sync.take(ws[0].ep, new)
    await ws[0].sync.share({ws[0].ep: new}, wait=True, full=False)
    await ws[1].sync.share({ws[1].ep: old}, wait=True, full=False)  # a poll that started before
    assert ws[0].models() == {"new:latest"}
    assert not ws[1].sync.take(ws[1].ep, old) and ws[1].models() == {"new:latest"}


async def test_a_silent_peer_is_waited_for_a_bounded_time_then_not_until_heard_from(monkeypatch):
    monkeypatch.setattr(model_sync, "ACK_TIMEOUT_S", 0.2)
    _, ws = await workers(3)
    ws[2].store.muted = True
    t0 = time.monotonic()
    await ws[0].sync.share({ws[0].ep: snap(1.0, "a:latest")}, wait=True, full=False)
    assert 0.15 < time.monotonic() - t0 < 1.0
    assert ws[2].sync.me not in ws[0].sync.peers and ws[1].sync.me in ws[0].sync.peers
    t0 = time.monotonic()
    await ws[0].sync.share({ws[0].ep: snap(2.0, "b:latest")}, wait=True, full=False)
    assert time.monotonic() - t0 < 0.1  # not waited for again
    ws[2].store.muted = False
    ws[2].sync._say({"k": "here"})
    await asyncio.sleep(0.01)
    assert ws[2].sync.me in ws[0].sync.peers  # heard from: waited for again


async def test_a_dead_local_peer_is_not_waited_for():
    _, ws = await workers(1)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    ws[0].sync.peers.add(f"{model_sync._HOST}:{gone.pid}:deadbeef")
    t0 = time.monotonic()
    await ws[0].sync.share({ws[0].ep: snap(1.0, "a:latest")}, wait=True, full=False)
    assert time.monotonic() - t0 < 0.1
    assert not ws[0].sync.peers


async def test_lists_too_big_to_carry_are_read_by_each_receiver_before_it_acknowledges(monkeypatch):
    monkeypatch.setattr(model_sync, "INLINE_MAX", 10)
    bus, ws = await workers(3)
    for w in ws:
        w.backend = ["big:latest"]
    await ws[0].sync.share({ws[0].ep: snap(time.time() - 1, "big:latest")}, wait=True, full=False)
    assert [w.refetched for w in ws] == [0, 1, 1]
    assert all(w.models() == {"big:latest"} for w in ws[1:])
    lists = [m for m in bus.sent if m["k"] == "lists"]
    assert lists[0]["eps"]["a"][2] is None  # a notice, not the lists


async def test_malformed_messages_are_dropped_and_bye_ends_the_wait():
    _, ws = await workers(2)
    for bad in (None, 3, {"from": 5}, {"from": "x:1:y", "k": "lists", "eps": {"a": "nope"}}):
        ws[0].sync._received(bad)  # never raises (it runs in the store's reader)
    waiting = asyncio.ensure_future(ws[0].sync.share({ws[0].ep: snap(1.0, "a:latest")}, wait=True, full=False))
    ws[1].store.muted = True
    await asyncio.sleep(0.02)
    assert not waiting.done()
    ws[1].store.muted = False
    ws[1].sync.stop()  # says bye
    await asyncio.wait_for(waiting, 0.5)


async def test_one_process_polls_periodically_the_others_later():
    _, ws = await workers(4)
    due = sorted((w.sync.next_refresh(10.0) - w.sync.last_full, w.sync.me) for w in ws)
    assert due[0][0] == 10.0 and all(d > 15.0 for d, _ in due[1:])
    assert len({d for d, _ in due}) == 4  # the others take over one at a time
    first = min(ws, key=lambda w: w.sync.me)
    others = [w for w in ws if w is not first]
    before = [w.sync.last_full for w in others]
    await asyncio.sleep(0.01)
    await first.sync.share({first.ep: snap(time.time(), "m:latest")}, wait=False, full=True)
    await asyncio.sleep(0.01)
    assert all(w.sync.last_full > b for w, b in zip(others, before, strict=True))  # their turn moved on
