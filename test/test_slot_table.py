"""The shared-memory slot table under the embedded shared store: a free slot is taken
without a message, nobody passes a waiting request, a slot given back wakes a waiter in
another worker, and a dead process's slots come back."""

from __future__ import annotations

import asyncio
import subprocess
import sys

from nomyo_router.domain import Endpoint
from nomyo_router.routing.policies import LeastBusy, picker
from nomyo_router.state import Ask, QueueTimeout, WorkerStore
from nomyo_router.state.slots import SlotTable

EP = Endpoint(name="one", url="http://127.0.0.1:9", slots=2)
first = lambda free: free[0]  # noqa: E731


async def two_workers(tmp_path) -> tuple[WorkerStore, WorkerStore]:
    base = str(tmp_path / "state")
    host = WorkerStore(base, [EP], 100, 600, 1000, picker(LeastBusy()))
    await host.start()
    worker = WorkerStore(base, [EP], 100, 600, 1000, picker(LeastBusy()))
    await worker.start()
    assert host.is_host and not worker.is_host
    return host, worker


async def test_free_slots_are_taken_in_the_table_and_limits_hold_across_workers(tmp_path):
    host, worker = await two_workers(tmp_path)
    try:
        a = await worker.acquire(Ask(model="m", candidates=[EP], choose=first, timeout=1.0))
        b = await host.acquire(Ask(model="m", candidates=[EP], choose=first, timeout=1.0))
        assert worker.in_flight(EP) == host.in_flight(EP) == 2
        with_timeout = asyncio.create_task(worker.acquire(Ask(model="m", candidates=[EP], choose=first, timeout=0.2)))
        try:
            await with_timeout
            raise AssertionError("a third slot was granted on a 2-slot endpoint")
        except QueueTimeout:
            pass
        waiter = asyncio.create_task(worker.acquire(Ask(model="m", candidates=[EP], choose=first, timeout=5.0)))
        await asyncio.sleep(0.05)
        assert not waiter.done()
        b.release()  # given back in the host's row: the worker's waiter gets it
        c = await asyncio.wait_for(waiter, 1.0)
        assert c.endpoint is EP and worker.in_flight(EP) == 2
        for lease in (a, c):
            lease.release()
        assert host.in_flight(EP) == 0
    finally:
        await worker.close()
        await host.close()


async def test_a_new_request_does_not_pass_one_that_waits(tmp_path):
    host, worker = await two_workers(tmp_path)
    try:
        held = [await host.acquire(Ask(model="m", candidates=[EP], choose=first, timeout=1.0)) for _ in range(2)]
        order: list[str] = []

        async def take(store: WorkerStore, name: str) -> None:
            lease = await store.acquire(Ask(model="m", candidates=[EP], choose=first, timeout=5.0))
            order.append(name)
            await asyncio.sleep(0.05)
            lease.release()

        early = asyncio.create_task(take(worker, "early"))
        await asyncio.sleep(0.05)  # it waits at the host now
        held[0].release()  # a slot is free in the table, but "early" waits for it
        late = asyncio.create_task(take(host, "late"))
        await asyncio.gather(early, late)
        held[1].release()
        assert order == ["early", "late"]
    finally:
        await worker.close()
        await host.close()


async def test_slots_of_a_dead_process_come_back(tmp_path):
    path = str(tmp_path / "t.slots")
    code = (
        f"from nomyo_router.state.slots import SlotTable; t = SlotTable({path!r}); "
        f"assert t.try_take('one', 2) and t.try_take('one', 2); import os; os._exit(0)"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=30)
    table = SlotTable(path)  # claims the dead process's row, zeroing it
    try:
        assert table.in_flight("one") == 0
        assert table.try_take("one", 2)
    finally:
        table.close()
    # and a survivor that finds a dead row next to it reclaims it
    subprocess.run([sys.executable, "-c", code], check=True, timeout=30)
    code2 = code.replace("os._exit(0)", "import time; time.sleep(30)")
    holder = subprocess.Popen([sys.executable, "-c", code2])
    try:
        table = SlotTable(path)
        try:
            for _ in range(100):
                if table.in_flight("one") >= 2:
                    break
                await asyncio.sleep(0.05)
            assert table.in_flight("one") == 2  # the live holder's slots count
            holder.kill()
            holder.wait()
            table.reclaim()
            assert table.in_flight("one") == 0
        finally:
            table.close()
    finally:
        holder.kill()


async def test_pins_and_usage_are_shared_without_messages(tmp_path):
    host, worker = await two_workers(tmp_path)
    try:
        lease = await worker.acquire(Ask(model="m", candidates=[EP], choose=first, timeout=1.0, pin="turn-1"))
        lease.release()
        await asyncio.sleep(0)  # a loop turn's pins are written together at its end
        assert await host.find_pin(["nope", "turn-1"]) == ("turn-1", "one")
        await host.drop_pin("turn-1")
        assert await worker.find_pin(["turn-1"]) is None
        for store in (host, worker, worker):
            store.record("one", "llama3:latest")
        host.record("one", "qwen:7b")
        snap = await worker.snapshot()
        assert snap["usage"] == {"one": {"llama3:latest": 3, "qwen:7b": 1}}
    finally:
        await worker.close()
        await host.close()


async def test_pins_expire_and_stay_bounded(tmp_path):
    from nomyo_router.state.pins import PinTable

    names = {"a": 0, "b": 1}
    table = PinTable(str(tmp_path / "p.pins"), 16, 0.2, names.__getitem__, {0: "a", 1: "b"}.__getitem__)
    try:
        for i in range(500):
            table.set(f"k{i}", "a" if i % 2 else "b")
        assert table.count() <= table.entries < 500  # old pins made room for new ones
        assert table.find(["k499"]) == ("k499", "a")  # the newest are there
        table.set("fresh", "b")
        await asyncio.sleep(0.3)
        assert table.find(["fresh"]) is None  # idle longer than the ttl
    finally:
        table.close()


async def test_a_slot_given_back_before_its_wake_up_arrives_goes_to_the_waiter(tmp_path):
    """A worker gives a slot back in the table and then pokes the host; a newer request that
    reaches the host in between must not take it past the request already waiting."""
    host, worker = await two_workers(tmp_path)
    try:
        held = [await worker.acquire(Ask(model="m", candidates=[EP], choose=first, timeout=1.0)) for _ in range(2)]
        waiter = asyncio.create_task(worker.acquire(Ask(model="m", candidates=[EP], choose=first, timeout=5.0)))
        await asyncio.sleep(0.05)  # it waits at the host
        worker._table.give_back("one")  # the slot is free in the table; the poke is not sent yet
        held[0]._released = True
        late = asyncio.create_task(host.acquire(Ask(model="m", candidates=[EP], choose=first, timeout=5.0)))
        done, _ = await asyncio.wait({waiter, late}, timeout=1.0, return_when=asyncio.FIRST_COMPLETED)
        assert done == {waiter}
        (await waiter).release()  # hands the slot on to the late one
        (await asyncio.wait_for(late, 1.0)).release()
        held[1].release()
        assert host.in_flight(EP) == 0
    finally:
        await worker.close()
        await host.close()


def test_a_full_neighbourhood_gives_up_the_pin_idle_longest(tmp_path):
    from nomyo_router.state.pins import PROBE, PinTable

    table = PinTable(str(tmp_path / "p.pins"), 4, 60.0, {"a": 0}.__getitem__, {0: "a"}.__getitem__)
    try:
        assert table.entries == PROBE  # one neighbourhood: every key competes for the same records
        for i in range(PROBE):
            table.set(f"k{i}", "a")
        assert table.count() == PROBE
        assert table.find(["k0"]) == ("k0", "a")  # k0 used again: now k1 is the one idle longest
        table.set("new", "a")
        assert table.count() == PROBE
        assert table.find(["k1"]) is None
        assert [table.find([f"k{i}"]) for i in (0, 2, 7)] == [("k0", "a"), ("k2", "a"), ("k7", "a")]
        assert table.find(["new"]) == ("new", "a")
    finally:
        table.close()
