"""Run the stages of a ramp against the router (and the mock, with --direct), each
`--repeat` times, with live progress; one summary per stage and target."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import time

from rich.console import Console
from rich.live import Live
from rich.text import Text

from . import machine, noise
from .engine import Progress, Stage, StageRun, run_stage
from .metrics import summarize
from .numbers import sig
from .timeslice import timeslices
from .workload import WorkloadSpec


def merge(runs: list[StageRun]) -> StageRun:
    """The repetitions of a stage as one run: results pooled, windows laid end to end."""
    if len(runs) == 1:
        runs[0].timeline_marks = [(runs[0].window_start - runs[0].t0, runs[0].window_end - runs[0].t0)]
        return runs[0]
    m = StageRun(runs[0].stage, runs[0].target)
    m.window_start, m.window_end = 0.0, sum(r.window_end - r.window_start for r in runs)
    timed = runs[0].completed_in_window is not None
    m.completed_in_window = sum(r.completed_in_window or 0.0 for r in runs) if timed else None
    m.tokens_in_window = sum(r.tokens_in_window for r in runs)
    m.cpu_s, m.wall_s = sum(r.cpu_s for r in runs), sum(r.wall_s for r in runs)
    m.machine = machine.combine([r.machine for r in runs])
    offset = 0.0
    for r in runs:  # the repetitions' timelines one after the other
        m.events.extend((t + offset, lat, ok) for t, lat, ok in r.events)
        m.timeline_marks.append((offset + r.window_start - r.t0, offset + r.window_end - r.t0))
        offset += max(r.wall_s, max((t for t, _, _ in r.events), default=0.0))
        m.results.extend(r.results)
        m.loop_lag.extend(r.loop_lag)
    return m


async def run_one(
    url: str, spec: WorkloadSpec, stage: Stage, timeout: float, target: str, label: str, console: Console, quiet: bool
) -> StageRun:
    prog = Progress()
    task = asyncio.ensure_future(run_stage(url, spec, stage, timeout, target, prog))
    if quiet:
        return await task
    with Live(console=console, refresh_per_second=4, transient=True) as live:
        while not task.done():
            live.update(Text(_progress_line(label, prog)))
            await asyncio.wait({task}, timeout=0.25)
    return task.result()


async def measure(
    args: argparse.Namespace,
    url: str,
    spec: WorkloadSpec,
    stage: Stage,
    target: str,
    label: str,
    console: Console,
    keep: list[StageRun] | None = None,
) -> dict:
    """One stage, `args.repeat` times back to back: the pooled summary, with the
    repetitions' gated metrics and their spread when there are several."""
    runs = []
    for rep in range(args.repeat):
        st = dataclasses.replace(stage, seed=stage.seed + 7919 * rep)
        rl = f"{label} rep {rep + 1}/{args.repeat}" if args.repeat > 1 else label
        runs.append(await run_one(url, spec, st, args.timeout, target, rl, console, args.quiet))
    if keep is not None:
        keep.extend(runs)
    m = summarize(merge(runs), args.slo)
    if getattr(args, "timeslice", None):
        many = len(runs) > 1
        m["timeslice_s"] = args.timeslice
        m["timeslices"] = [
            ts for i, r in enumerate(runs) for ts in timeslices(r, args.timeslice, i + 1 if many else None)
        ]
    if len(runs) > 1:
        m["repetitions"] = [noise.repetition(summarize(r, args.slo)) for r in runs]
        m["spread"] = noise.spread(m["repetitions"])
    good = f", goodput {sig(m['goodput'])} req/s" if "goodput" in m else ""
    spread = m.get("spread", {}).get("request_throughput")
    rs = f" (reps {sig(spread['min'])}..{sig(spread['max'])})" if spread else ""
    console.print(
        f"{label}: {m['completed']} ok, {m['failed']} err, {sig(m['request_throughput'])} req/s{rs}"
        f"{good}, p50 {sig(m['median_e2el_ms'])} ms",
        highlight=False,
    )
    return m


async def drive(
    args: argparse.Namespace,
    spec: WorkloadSpec,
    stages: list[Stage],
    router_url: str,
    direct_url: str | None,
    console: Console,
    keep: list[StageRun] | None = None,
) -> tuple[list[dict], list[dict] | None]:
    """Every stage against each target; `keep` collects the runs themselves (fault reports)."""
    results: list[dict] = []
    direct: list[dict] | None = [] if direct_url else None
    for i, stage in enumerate(stages):
        targets = [("direct", direct_url)] if direct_url else []
        targets.append(("router", router_url))
        for target, url in targets:
            kind = "conc" if stage.mode == "closed" else "rate"
            label = f"stage {i + 1}/{len(stages)} {target} {kind}={stage.load:g}"
            m = await measure(args, url, spec, stage, target, label, console, keep)  # type: ignore[arg-type]
            (direct if target == "direct" else results).append(m)  # type: ignore[union-attr]
    return results, direct


def _progress_line(label: str, prog: Progress) -> str:
    elapsed = time.perf_counter() - prog.t0 if prog.t0 else 0.0
    rate = prog.done / elapsed if elapsed > 0 else 0.0
    phase = "measuring" if prog.measuring else "warming up"
    return f"{label} | {phase} | {elapsed:5.1f}s | {sig(rate):>8} req/s | errors {prog.errors}"
