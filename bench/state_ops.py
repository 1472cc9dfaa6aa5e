"""Cost and exactness of the state stores.

    python bench/state_ops.py [--ops 5000] [--seconds 4]

1. Per-request cost of state operations (acquire + release, and the affinity pin lookup
   and pin write) for the in-memory, embedded (shared memory; the host in-process and a
   second worker) and Redis stores, measured in one process with no contention; and for
   the embedded store, the cost of a request that must wait (host and worker CPU).
2. Router req/s with 1 and with 2 workers (wrk, zero-delay mock, non-stream, c=32).
3. The maximum in-flight a backend with 2 slots sees under 20x oversubscription (40
   concurrent clients), with 4 workers (embedded store) and with 2 instances (Redis).
Needs wrk and redis-server.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

from common import cpu_of, free_port, mock_process, router_process, wrk
from mock import MockConfig
from nomyo_router.config import parse_config
from nomyo_router.domain import Endpoint
from nomyo_router.routing.policies import LeastBusy, picker
from nomyo_router.state import Ask, MemoryStore, WorkerStore
from nomyo_router.state.redis import RedisStore

BODY = json.dumps({"model": "llama3", "stream": False, "messages": [{"role": "user", "content": "hi"}]})


def start_redis() -> tuple[subprocess.Popen, str]:
    if shutil.which("redis-server") is None:
        raise SystemExit("redis-server not found: apt-get install redis-server")
    port = free_port()
    proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    time.sleep(0.3)
    return proc, f"redis://127.0.0.1:{port}/0"


async def op_cost(store, ep: Endpoint, n: int) -> tuple[float, float]:
    """(µs per acquire+release, µs per find_pin+set_pin)."""
    choose = lambda free: free[0]  # noqa: E731
    for _ in range(50):  # warm up connections
        (await store.acquire(Ask(model="m:latest", candidates=[ep], choose=choose, timeout=5.0))).release()
    await asyncio.sleep(0.05)
    t0 = time.perf_counter()
    for _ in range(n):
        lease = await store.acquire(Ask(model="m:latest", candidates=[ep], choose=choose, timeout=5.0))
        lease.release()
        await asyncio.sleep(0)  # let a background release run, as a request would
    slot = (time.perf_counter() - t0) / n * 1e6
    t0 = time.perf_counter()
    for i in range(n):
        await store.find_pin([f"k{i}"])
        await store.set_pin(f"k{i}", ep.name)
    pin = (time.perf_counter() - t0) / n * 1e6
    return slot, pin


HOST = """
import asyncio, sys
from nomyo_router.domain import Endpoint
from nomyo_router.routing.policies import LeastBusy, picker
from nomyo_router.state import Ask, WorkerStore
async def main():
    s = WorkerStore(sys.argv[1], [Endpoint(name="e", url="http://127.0.0.1:1", slots=1)], 1000, 600, 1000,
                    picker(LeastBusy()))
    await s.start()
    await asyncio.sleep(3600)
asyncio.run(main())
"""


async def waits_cost(n: int) -> None:
    """A request that must wait: the host's CPU per wait (it queues the request, takes the
    slot when the holder gives it back, answers) and the round trip, with the host in its
    own process and a 1-slot endpoint that two tasks of one worker take turns on."""
    base = os.path.join(tempfile.mkdtemp(), "bench")
    host = subprocess.Popen([sys.executable, "-c", HOST, base])
    try:
        await asyncio.sleep(1.0)
        ep = Endpoint(name="e", url="http://127.0.0.1:1", slots=1)
        worker = WorkerStore(base, [ep], 1000, 600, 1000, picker(LeastBusy()))
        await worker.start()
        choose = lambda free: free[0]  # noqa: E731
        lease = await worker.acquire(Ask(model="m", candidates=[ep], choose=choose, timeout=5.0))

        async def other() -> None:
            nonlocal lease
            for _ in range(n):
                nxt = asyncio.create_task(worker.acquire(Ask(model="m", candidates=[ep], choose=choose, timeout=5.0)))
                await asyncio.sleep(0)  # it finds the slot taken and asks the host
                lease.release()
                lease = await nxt

        c0, w0, t0 = cpu_of(host.pid), time.process_time(), time.perf_counter()
        await other()
        wall = (time.perf_counter() - t0) / n * 1e6
        print(
            f"  a request that waits (embedded): host CPU {(cpu_of(host.pid) - c0) / n * 1e6:.1f} µs, "
            f"worker CPU {(time.process_time() - w0) / n * 1e6:.1f} µs, {wall:.0f} µs from release to grant"
        )
        lease.release()
        await worker.close()
    finally:
        host.kill()


async def costs(n: int, redis_url: str) -> None:
    cfg = parse_config(
        {"endpoints": [{"url": "http://127.0.0.1:1", "name": "e", "max_concurrent": 4}], "state": redis_url}
    )
    ep = Endpoint.from_config(cfg.endpoints[0])
    base = os.path.join(tempfile.mkdtemp(), "bench")
    host = WorkerStore(base, [ep], 1000, 600, 1000, picker(LeastBusy()))
    await host.start()
    stores = {
        "memory": MemoryStore(1000),
        "embedded, host": host,
        "embedded, worker": WorkerStore(base, [ep], 1000, 600, 1000, picker(LeastBusy())),
        "redis": RedisStore(redis_url, [ep], cfg),
    }
    print("per-request state cost (one process, no contention; the shared store's worker takes a")
    print("free slot, writes and finds pins in shared-memory tables: no message to the host):")
    for name, store in stores.items():
        if store is not host:
            await store.start()
        slot, pin = await op_cost(store, ep, n)
        print(f"  {name:18} acquire+release {slot:8.1f} µs   find_pin+set_pin {pin:8.1f} µs")
    for store in reversed(stores.values()):
        await store.close()


def max_in_flight(mock_url: str) -> int:
    with urllib.request.urlopen(mock_url + "/mock/stats") as r:
        return json.load(r)["max_in_flight"]


def reset(mock_url: str) -> None:
    urllib.request.urlopen(urllib.request.Request(mock_url + "/mock/reset", data=b"{}", method="POST")).read()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--ops", type=int, default=5000)
    p.add_argument("--seconds", type=float, default=4.0)
    args = p.parse_args()
    redis_proc, redis_url = start_redis()
    try:
        asyncio.run(costs(args.ops, redis_url))
        asyncio.run(waits_cost(args.ops))
        print("router req/s, zero-delay mock, non-stream, c=32 (wrk):")
        with mock_process() as m:
            for workers in (1, 2):
                with router_process([{"url": m.url, "name": "m", "max_concurrent": 4096}], workers=workers) as (url, _):
                    time.sleep(0.5)
                    r = wrk(url + "/api/chat", BODY, 32, args.seconds)
                    d = wrk(m.url + "/api/chat", BODY, 32, args.seconds)
                    print(
                        f"  {workers} worker(s): {r['rps']:7.0f} req/s (direct to the mock {d['rps']:7.0f}, "
                        f"ratio {r['rps'] / d['rps']:.2f})"
                    )
        print("max in flight at a 2-slot backend, 40 concurrent clients (20x oversubscribed):")
        with mock_process(MockConfig(ttft_ms=20.0, tok_ms=0.0, tokens=1, parallel=1000)) as m:
            eps = [{"url": m.url, "name": "m", "max_concurrent": 2}]
            with router_process(eps, workers=4) as (url, _):
                time.sleep(0.5)
                reset(m.url)
                r = wrk(url + "/api/chat", BODY, 40, args.seconds)
                print(
                    f"  4 workers, embedded store: max in flight {max_in_flight(m.url)} "
                    f"({r['rps']:.0f} req/s, {r['non2xx']} non-2xx)"
                )
            with router_process(eps, state=redis_url) as (u1, _), router_process(eps, state=redis_url) as (u2, _):
                time.sleep(0.5)
                reset(m.url)
                out: dict[str, dict] = {}
                threads = [
                    threading.Thread(
                        target=lambda u=u: out.__setitem__(u, wrk(u + "/api/chat", BODY, 20, args.seconds))
                    )
                    for u in (u1, u2)
                ]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                rps = sum(v["rps"] for v in out.values())
                print(
                    f"  2 instances, Redis store: max in flight {max_in_flight(m.url)} ({rps:.0f} req/s, "
                    f"{sum(v['non2xx'] for v in out.values())} non-2xx)"
                )
    finally:
        redis_proc.terminate()


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    main()
