"""ModelSync when a message is lost: a peer whose subscription is not yet (or no longer) in
place misses the lists, or its acknowledgement is dropped (its store was away for a moment).
The sender sends the lists again to the peers that have not answered, so the management call
answers as soon as they have, not after `ACK_TIMEOUT_S`; the others neither apply nor
acknowledge it twice. Over the same in-memory bus as test_model_sync.py, losing the chosen
messages on the way to one process."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from nomyo_router.backends import model_sync
from test.test_model_sync import Bus, BusStore, Worker, snap, workers

Lost = Callable[[dict[str, Any]], bool]


class LossyBus(Bus):
    """A Bus that loses, once each, the messages chosen for a recipient."""

    def __init__(self) -> None:
        super().__init__()
        self.losses: list[tuple[BusStore, Lost]] = []
        self.lost: list[dict[str, Any]] = []

    def store(self) -> BusStore:
        return LossyStore(self)

    def lose(self, to: Worker, which: Lost) -> None:
        self.losses.append((to.store, which))

    def delivered(self, to: object, data: dict[str, Any]) -> bool:
        for i, (who, which) in enumerate(self.losses):
            if who is to and which(data):
                del self.losses[i]
                self.lost.append(data)
                return False
        return True


class LossyStore(BusStore):
    bus: LossyBus

    def publish(self, topic: str, data: Any) -> None:
        if self.muted:
            return
        self.bus.sent.append(data)
        loop = asyncio.get_running_loop()
        for who, cb in self.bus.subs:
            if who is not self and self.bus.delivered(who, data):
                loop.call_soon(cb, data)


async def lossy_workers(n: int) -> tuple[LossyBus, list[Worker]]:
    bus = LossyBus()
    _, ws = await workers(n, bus)
    return bus, ws


def lists(m: dict[str, Any]) -> bool:
    return m.get("k") == "lists"


async def share(w: Worker, *models: str) -> float:
    """`w` shares a list of `models` and waits for the others; how long that took (at most 2 s,
    well under ACK_TIMEOUT_S: a lost message must not cost the whole timeout)."""
    s = snap(time.time(), *models)
    w.sync.take(w.ep, s)
    t0 = time.monotonic()
    await asyncio.wait_for(w.sync.share({w.ep: s}, wait=True, full=False), 2.0)
    return time.monotonic() - t0


async def test_lists_lost_on_the_way_to_one_peer_are_sent_again_to_it_only():
    bus, ws = await lossy_workers(4)
    bus.lose(ws[2], lists)  # its subscription was not in place yet
    took = await share(ws[0], "copy:latest")
    assert bus.lost and took < 1.0, took
    assert all(w.models() == {"copy:latest"} for w in ws)
    assert [w.reindexed for w in ws[1:]] == [1, 1, 1]  # the others did not apply it twice
    again = [m for m in bus.sent if lists(m) and "only" in m]
    assert [m["only"] for m in again] == [[ws[2].sync.me]]
    acks = [m for m in bus.sent if m.get("k") == "ack"]
    assert sorted(m["from"] for m in acks) == sorted(w.sync.me for w in ws[1:])  # one each
    assert ws[2].sync.me in ws[0].sync.peers  # still waited for next time


async def test_a_lost_acknowledgement_is_given_again_without_applying_twice():
    bus, ws = await lossy_workers(3)
    bus.lose(ws[0], lambda m: m.get("k") == "ack" and m["from"] == ws[1].sync.me)
    took = await share(ws[0], "copy:latest")
    assert bus.lost and took < 1.0, took
    assert ws[1].models() == {"copy:latest"} and ws[1].reindexed == 1
    acks = [m["from"] for m in bus.sent if m.get("k") == "ack"]
    assert sorted(acks) == sorted([ws[1].sync.me, ws[1].sync.me, ws[2].sync.me])


async def test_lists_sent_again_while_a_peer_still_reads_them_are_read_once(monkeypatch):
    monkeypatch.setattr(model_sync, "INLINE_MAX", 10)  # a notice: each receiver re-reads
    monkeypatch.setattr(model_sync, "RESEND_S", 0.002)  # (re-reading takes 10 ms)
    bus, ws = await lossy_workers(3)
    for w in ws:
        w.backend = ["big:latest"]
    bus.lose(ws[2], lists)
    await share(ws[0], "big:latest")
    assert [w.refetched for w in ws] == [0, 1, 1]
    assert all(w.models() == {"big:latest"} for w in ws)
    assert len([m for m in bus.sent if lists(m) and "only" in m]) >= 2


async def test_a_peer_that_never_answers_is_still_given_up_after_the_timeout(monkeypatch):
    monkeypatch.setattr(model_sync, "ACK_TIMEOUT_S", 0.5)
    monkeypatch.setattr(model_sync, "RESEND_S", 0.05)
    bus, ws = await lossy_workers(2)
    ws[1].store.muted = True  # receives, never answers
    t0 = time.monotonic()
    await ws[0].sync.share({ws[0].ep: snap(1.0, "a:latest")}, wait=True, full=False)
    assert 0.45 < time.monotonic() - t0 < 1.0
    assert ws[1].sync.me not in ws[0].sync.peers
    again = [m for m in bus.sent if lists(m) and "only" in m]
    assert len(again) == 3  # at 0.05, 0.15 and 0.35 s (each gap twice the one before); the next at 0.75
    assert ws[1].reindexed == 1  # the resent lists were not applied again
