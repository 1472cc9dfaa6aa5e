"""Chaos scenarios: one of two backends gets sick under load; what do clients see?

    python bench/chaos.py [--requests 10000] [--concurrency 32] [--scenarios kill,500,...]

Two mock processes (5 ms TTFT, 24 tokens x 0.5 ms) behind one router worker; a closed loop
of `--concurrency` clients alternating stream and non-stream Ollama chat. Every answer is
checked: status 200, no error chunk, exactly one final chunk, and the text equal to the
text of an uninterrupted answer (so a resumed stream with a broken seam counts as a
failure). Scenarios:

    kill    SIGKILL backend b a third of the way in, start it again at two thirds
    500     b answers 500 to everything          503   b answers 503 (busy) to everything
    drop    b cuts 30% of its answers (streams mid-way, whole answers before the end)
    hang    b accepts requests and never answers
    cancel  50 clients leave mid-stream, 20 rounds (in-flight and queue must return to 0,
            no endpoint ejected)
    redis   `state: redis://`, 40 requests queued for a 1-slot backend (250 ms each); Redis is
            killed and restarted 0.2 s later; the latest finish is compared with a run
            without the outage

Printed per scenario: requests, client-visible failures (before the first byte /
mid-stream), worst latency, detection time (until b left rotation) and time back in
traffic (kill: from b's restart to its first served request).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

import aiohttp

from common import router_process
from mock import MockConfig, MockProcess
from mock.text import output_tokens

CFG = MockConfig(ttft_ms=5.0, tok_ms=0.5, tokens=24, parallel=256)
EXPECTED = "".join(output_tokens(CFG.tokens))
CHAT = {"model": "llama3", "messages": [{"role": "user", "content": "hello"}]}


class Tally:
    def __init__(self) -> None:
        self.requests = 0
        self.before_first_byte = 0
        self.mid_stream = 0
        self.worst = 0.0
        self.b_served: list[float] = []  # when requests served by b finished


async def one(s: aiohttp.ClientSession, url: str, stream: bool, t: Tally) -> None:
    t0 = time.monotonic()
    t.requests += 1
    try:
        async with s.post(url + "/api/chat", json={**CHAT, "stream": stream}) as r:
            if r.status != 200:
                t.before_first_byte += 1
                await r.read()
                return
            raw = await r.read()
            ep = r.headers.get("X-Router-Endpoint")
    except aiohttp.ClientError:
        t.before_first_byte += 1
        return
    finally:
        t.worst = max(t.worst, time.monotonic() - t0)
    recs = [json.loads(x) for x in raw.splitlines() if x.strip()]
    text = "".join(x.get("message", {}).get("content", "") for x in recs)
    if text != EXPECTED or any("error" in x for x in recs) or sum(bool(x.get("done")) for x in recs) != 1:
        t.mid_stream += 1
    elif ep == "b":
        t.b_served.append(time.monotonic())


async def load(url: str, n: int, conc: int, t: Tally, events: list) -> None:
    """Closed loop of `n` requests; `events`: (fraction done, coroutine fn) run once each."""
    done = 0
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as s:

        async def client(i: int) -> None:
            nonlocal done
            while done < n:
                done += 1
                for ev in events:
                    if not ev[2] and done >= ev[0] * n:
                        ev[2] = True
                        asyncio.get_running_loop().create_task(ev[1]())
                await one(s, url, (done + i) % 2 == 0, t)

        await asyncio.gather(*(client(i) for i in range(conc)))


async def health_of(s: aiohttp.ClientSession, url: str) -> dict:
    async with s.get(url + "/health") as r:
        return {e["name"]: e for e in (await r.json())["endpoints"]}


async def watch_ejection(url: str, since: float, out: dict) -> None:
    async with aiohttp.ClientSession() as s:
        while time.monotonic() - since < 60:
            if not (await health_of(s, url))["b"]["healthy"]:
                out["detected_s"] = time.monotonic() - since
                return
            await asyncio.sleep(0.01)


def run(scenario: str, n: int, conc: int) -> dict:
    with MockProcess(CFG) as a, MockProcess(CFG) as b:
        eps = [{"url": a.url, "name": "a", "max_concurrent": 128}, {"url": b.url, "name": "b", "max_concurrent": 128}]
        with router_process(eps, routing="least_busy") as (url, _):
            t, info = Tally(), {}
            if scenario == "cancel":
                return asyncio.run(cancel_storm(url))

            async def go() -> None:
                events: list = []
                if scenario == "kill":

                    async def kill() -> None:
                        b.kill()
                        info["t_fault"] = time.monotonic()
                        asyncio.get_running_loop().create_task(watch_ejection(url, info["t_fault"], info))

                    async def restart() -> None:
                        info["restarted"] = MockProcess(CFG, port=b.port).start()
                        info["t_back"] = time.monotonic()

                    events = [[1 / 3, kill, False], [2 / 3, restart, False]]
                else:
                    knob = {
                        "500": {"fail_rate": 1.0},
                        "503": {"busy_rate": 1.0},
                        "drop": {"drop_rate": 0.3},
                        "hang": {"hang_rate": 1.0},
                    }[scenario]
                    await _configure(b.url, knob)
                    info["t_fault"] = time.monotonic()
                    asyncio.get_running_loop().create_task(watch_ejection(url, info["t_fault"], info))
                await load(url, n, conc, t, events)

            try:
                asyncio.run(go())
            finally:
                if "restarted" in info:
                    info["restarted"].stop()
            back = None
            if "t_back" in info:
                after = [x for x in t.b_served if x >= info["t_back"]]
                back = round(after[0] - info["t_back"], 3) if after else None
            return {
                "scenario": scenario,
                "requests": t.requests,
                "failed_before_first_byte": t.before_first_byte,
                "failed_mid_stream": t.mid_stream,
                "worst_latency_s": round(t.worst, 3),
                "detection_s": round(info["detected_s"], 3) if "detected_s" in info else None,
                "back_in_traffic_s": back,
            }


async def _configure(url: str, knob: dict) -> None:
    async with aiohttp.ClientSession() as s:
        async with s.post(url + "/mock/config", json=knob) as r:
            assert r.status == 200, await r.text()


async def cancel_storm(url: str) -> dict:
    left = 0
    for _ in range(20):
        async with aiohttp.ClientSession() as s:

            async def leave() -> None:
                nonlocal left
                async with s.post(url + "/api/chat", json={**CHAT, "stream": True}) as r:
                    await r.content.readline()
                    left += 1

            await asyncio.gather(*(leave() for _ in range(50)))
    await asyncio.sleep(0.5)
    async with aiohttp.ClientSession() as s:
        h = await health_of(s, url)
        async with s.get(url + "/health") as r:
            queue = (await r.json())["queue_length"]
    return {
        "scenario": "cancel",
        "requests": left,
        "in_flight_after": sum(e["in_flight"] for e in h.values()),
        "queue_after": queue,
        "ejections": sum(e.get("health", {}).get("ejections", 0) for e in h.values()),
    }


def redis_restart() -> dict:
    import shutil
    import subprocess

    from common import free_port

    slow = MockConfig(ttft_ms=0.0, tok_ms=0.0, tokens=2, first_byte_delay_ms=250, parallel=64)
    port = free_port()
    cmd = [
        shutil.which("redis-server") or "redis-server",
        "--port",
        str(port),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
    ]
    out = {"scenario": "redis"}
    with MockProcess(slow) as m:
        for outage in (False, True):
            redis = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
            time.sleep(0.3)
            eps = [{"url": m.url, "name": "a", "max_concurrent": 1}]
            with router_process(eps, state=f"redis://127.0.0.1:{port}/0", queue_timeout=120) as (url, _):

                async def go(outage: bool = outage) -> list[tuple[int, float]]:
                    async with aiohttp.ClientSession() as s:

                        async def one() -> tuple[int, float]:
                            t0 = time.monotonic()
                            async with s.post(url + "/api/chat", json={**CHAT, "stream": False}) as r:
                                await r.read()
                                return r.status, time.monotonic() - t0

                        load = [asyncio.create_task(one()) for _ in range(41)]
                        await asyncio.sleep(0.4)
                        nonlocal redis
                        if outage:
                            redis.kill()
                            redis.wait()
                            await asyncio.sleep(0.2)
                            redis = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
                        return await asyncio.gather(*load)

                res = asyncio.run(go())
            redis.kill()
            redis.wait()
            key = "with_outage" if outage else "without_outage"
            out[key + "_failed"] = sum(st != 200 for st, _ in res)
            out[key + "_latest_s"] = round(max(t for _, t in res), 2)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=10000, help="requests per scenario (default 10000)")
    p.add_argument("--concurrency", type=int, default=32, help="closed-loop clients (default 32)")
    p.add_argument("--scenarios", default="kill,500,503,drop,hang,cancel,redis", help="comma-separated (default: all)")
    p.add_argument("--json", default=None, help="also write the results here")
    args = p.parse_args()
    results = []
    for sc in args.scenarios.split(","):
        res = redis_restart() if sc == "redis" else run(sc, args.requests, args.concurrency)
        print(json.dumps(res), flush=True)
        results.append(res)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
