"""Drive one stage of load: closed loop (N virtual users) or open loop (R arrivals/s).

Open-loop latency counts from the *intended* send time, so a stalled server cannot hide
behind a client that slowed down with it (coordinated omission, as wrk2 corrects it).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from . import machine, sessions
from .client import Client, Request, Result, send
from .workload import Conversation, WorkloadSpec


@dataclass
class Stage:
    mode: str  # "closed" | "open" | "trace" (arrivals from spec.trace)
    load: float  # concurrency or rate
    duration: float | None = 10.0
    requests: int | None = None
    warmup: float = 1.0
    arrival: str = "constant"  # open loop: constant | poisson | gamma
    seed: int = 0
    burstiness: float = 1.0  # gamma arrivals' shape: 1 is Poisson, below 1 burstier, above 1 smoother


@dataclass
class Progress:
    started: int = 0
    done: int = 0
    errors: int = 0
    t0: float = 0.0
    measuring: bool = False


@dataclass
class StageRun:
    stage: Stage
    target: str  # "router" | "direct"
    results: list[Result] = field(default_factory=list)
    window_start: float = 0.0
    window_end: float = 0.0
    cpu_s: float = 0.0
    wall_s: float = 0.0
    loop_lag: list[float] = field(default_factory=list)
    machine: dict[str, float] | None = None  # /proc/stat and load average over the stage
    t0: float = 0.0
    # every request of the stage, warm-up included: (end - t0, latency, ok), for the timeline
    events: list[tuple[float, float, bool]] = field(default_factory=list)
    timeline_marks: list[tuple[float, float]] = field(default_factory=list)  # measured windows, from t0
    # Duration-based stages: the requests served inside [window_start, window_end], each
    # counted by the share of its time that fell inside the window (so a 8 s request that
    # straddles the window's edge counts in part, and synchronised waves of long requests
    # do not make the count jump); None for --requests stages.
    completed_in_window: float | None = None
    tokens_in_window: float = 0.0


class LoopMonitor:
    """Samples event-loop lag (how late a 10 ms sleep wakes) and this process's CPU time."""

    def __init__(self, interval: float = 0.01) -> None:
        self.interval = interval
        self.lags: list[float] = []
        self._task: asyncio.Task | None = None

    async def _run(self) -> None:
        while True:
            t = time.perf_counter()
            await asyncio.sleep(self.interval)
            self.lags.append(time.perf_counter() - t - self.interval)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())
        self.cpu0, self.wall0 = time.process_time(), time.perf_counter()
        self.machine0 = machine.snapshot()

    async def stop(self) -> tuple[float, float]:
        if self._task:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        self.machine = machine.delta(self.machine0, machine.snapshot())
        return time.process_time() - self.cpu0, time.perf_counter() - self.wall0


def arrival_gaps(stage: Stage, rng: random.Random) -> Callable[[], float]:
    """The open loop's inter-arrival times, mean 1/rate: constant, exponential (Poisson) or
    gamma with shape `burstiness` (scale 1/(rate*shape), as vllm bench's --burstiness), whose
    coefficient of variation is 1/sqrt(shape)."""
    rate = stage.load
    if stage.arrival == "poisson":
        return lambda: rng.expovariate(rate)
    if stage.arrival == "gamma":
        shape = stage.burstiness
        return lambda: rng.gammavariate(shape, 1.0 / (rate * shape))
    return lambda: 1.0 / rate


async def _sleep_until(t: float) -> None:
    delay = t - time.perf_counter()
    if delay > 0:
        await asyncio.sleep(delay)


async def run_stage(
    base_url: str,
    spec: WorkloadSpec,
    stage: Stage,
    timeout: float,
    target: str = "router",
    progress: Progress | None = None,
    on_result: Callable[[Result], None] | None = None,
) -> StageRun:
    client = Client(base_url)
    try:
        return await _run(client, spec, stage, timeout, target, progress or Progress(), on_result)
    finally:
        client.close()


async def _run(
    client: Client,
    spec: WorkloadSpec,
    stage: Stage,
    timeout: float,
    target: str,
    prog: Progress,
    on_result: Callable[[Result], None] | None,
) -> StageRun:
    run = StageRun(stage, target)
    single = client.build(spec.path, spec.body(), spec.headers)
    monitor = LoopMonitor()
    t0 = run.t0 = time.perf_counter()
    prog.t0 = t0
    timed = stage.requests is None and bool(stage.duration)
    # Closed loop: the warm-up lasts at least until every virtual user has completed one
    # request, so a stage of long requests does not start measuring before the first ones end.
    pending_first = set(range(int(stage.load))) if stage.mode == "closed" else set()
    measure_from = t0 + stage.warmup if not pending_first else float("inf")
    end = measure_from + stage.duration if timed else float("inf")
    measured_started = 0
    if timed:
        run.completed_in_window = 0.0

    def take(r: Result, uid: int | None = None) -> None:
        nonlocal measure_from, end
        prog.done += 1
        if not r.ok:
            prog.errors += 1
        run.events.append((r.end - t0, r.end - r.start, r.ok))
        if r.start >= measure_from:
            run.results.append(r)
        if timed and r.ok:
            inside = min(r.end, end) - max(r.start, measure_from)
            if inside > 0:
                share = inside / max(r.end - r.start, 1e-9)
                run.completed_in_window = (run.completed_in_window or 0.0) + share
                run.tokens_in_window += share * r.out_tokens
        if pending_first and uid is not None:
            pending_first.discard(uid)
            if not pending_first:  # every user has completed one request: measure from now
                measure_from = max(time.perf_counter(), t0 + stage.warmup)
                end = measure_from + stage.duration if timed else float("inf")
        if on_result:
            on_result(r)

    def may_start(now: float) -> bool:
        nonlocal measured_started
        if now >= end:
            return False
        if now >= measure_from:
            prog.measuring = True
            if stage.requests is not None:
                if measured_started >= stage.requests:
                    return False
                measured_started += 1
        prog.started += 1
        return True

    picked = 0

    def next_item() -> int:  # dataset lines are taken in order, cycling
        nonlocal picked
        picked += 1
        return picked - 1

    def new_conv(uid: int, number: int) -> Conversation:
        return Conversation(spec, uid, number, spec.dataset.item(next_item()) if spec.dataset else None)

    def one_body() -> Request:
        if spec.dataset is None:
            return single
        return client.build(spec.path, spec.dataset.body(spec, next_item()), spec.headers)

    async def user(uid: int) -> None:
        number = 0
        conv = new_conv(uid, number) if spec.conversational else None
        while True:
            now = time.perf_counter()
            if not may_start(now):
                return
            if conv is None:
                r = await send(client, one_body(), spec.api, spec.endpoint, spec.stream, timeout, now)
            else:
                data = client.build(spec.path, conv.next_body(), conv.headers())
                r = await send(client, data, spec.api, spec.endpoint, spec.stream, timeout, now, keep_answer=True)
                r.turn, r.session, r.prompt_est = conv.turn + 1, conv.id, conv.prompt_tokens
                if r.ok:
                    conv.record(r.answer)
                if not r.ok or conv.finished:
                    number += 1
                    conv = new_conv(uid, number)
                elif spec.think is not None:  # the user (or the agent's tool) takes its time
                    take(r, uid)
                    await asyncio.sleep(spec.think.seconds())
                    continue
            take(r, uid)

    async def replay(k: int, e: Any, at: float) -> None:
        """One trace arrival: --turns turns of its session, back to back."""
        key = e.session or f"t{k}"
        for turn in range(spec.turns):
            if turn and spec.think is not None:
                await asyncio.sleep(spec.think.seconds())
            messages = spec.trace.messages(e, key)
            headers = {**spec.headers, spec.session_header: key} if spec.session_header else spec.headers
            data = client.build(spec.path, spec.trace.body(spec, e, messages), headers)
            start = at if turn == 0 else time.perf_counter()
            r = await send(client, data, spec.api, spec.endpoint, spec.stream, timeout, start, keep_answer=True)
            r.turn, r.session, r.prompt_est = turn + 1, key, sessions.prompt_tokens(messages)
            take(r)
            if not r.ok:
                return
            spec.trace.record(key, messages, r.answer)

    async def agent_turn(key: str, turn: int, messages: list[Any], out: int | None, start: float) -> Any:
        headers = {**spec.headers, spec.session_header: key} if spec.session_header else spec.headers
        if spec.endpoint == "chat":
            body = spec.body(messages, max_tokens=out)
        else:
            body = spec.body(prompt="\n\n".join(str(m["content"]) for m in messages), max_tokens=out)
        data = client.build(spec.path, body, headers)
        r = await send(client, data, spec.api, spec.endpoint, spec.stream, timeout, start, keep_answer=True)
        r.turn, r.session, r.prompt_est = turn, key, sessions.prompt_tokens(messages)
        take(r)
        return r

    monitor.start()
    if stage.mode == "trace" and isinstance(spec.trace, sessions.SessionTrace):
        await sessions.replay(spec.trace, spec.think, spec.tool_tokens, t0, may_start, agent_turn)
    elif stage.mode == "closed":
        await asyncio.gather(*(user(i) for i in range(int(stage.load))))
    elif stage.mode == "trace":
        tasks: set[asyncio.Task] = set()
        for k, e in enumerate(spec.trace.entries):
            t = t0 + e.at / spec.trace.speed
            await _sleep_until(t)
            if not may_start(t):
                break
            task = asyncio.ensure_future(replay(k, e, t))
            task.add_done_callback(tasks.discard)
            tasks.add(task)
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
    else:
        gap = arrival_gaps(stage, random.Random(stage.seed))
        tasks = set()
        t = t0
        while True:
            t += gap()
            await _sleep_until(t)
            if not may_start(t):
                break
            task = asyncio.ensure_future(send(client, one_body(), spec.api, spec.endpoint, spec.stream, timeout, t))
            task.add_done_callback(lambda f: (tasks.discard(f), take(f.result())))
            tasks.add(task)
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
    run.cpu_s, run.wall_s = await monitor.stop()
    run.loop_lag = monitor.lags
    run.machine = monitor.machine
    if measure_from == float("inf"):  # no user ever completed a request: nothing was measured
        measure_from = end = time.perf_counter()
    run.window_start = measure_from
    run.window_end = end if timed else max((r.end for r in run.results), default=measure_from)
    return run
