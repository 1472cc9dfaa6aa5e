"""`--timeslice S`: a stage's metrics per interval of S seconds, to see warm-up, drift and
stalls that a stage's single summary averages away.

Slices cut the measured window from its start. Each measured request belongs to the slice
in which it was sent (its intended send time in open loop), so every request of the stage
is in exactly one slice and the slices' counts and errors add up to the stage's; a stall
shows as the slow requests sent during it. The last slice may be shorter than S (its
`duration_s` says so) and, in a duration stage, also holds the requests still running when
the window closed.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .engine import StageRun


def _pct(values: list[float], q: float) -> float | None:
    return round(float(np.percentile(np.asarray(values) * 1000, q)), 3) if values else None


def timeslices(run: StageRun, width: float, repetition: int | None = None) -> list[dict[str, Any]]:
    """One dict per slice: start_s (from the window's start), duration_s, count, completed,
    errors, throughput (completed / duration), output_throughput, TTFT and latency p50/p99."""
    if width <= 0:
        raise ValueError("--timeslice must be > 0")
    start = run.window_start
    span = max(run.window_end - start, max((r.start - start for r in run.results), default=0.0), 1e-9)
    n = max(1, math.ceil(span / width - 1e-9))
    groups: list[list[Any]] = [[] for _ in range(n)]
    for r in run.results:
        groups[min(max(int((r.start - start) // width), 0), n - 1)].append(r)
    out = []
    for k, rs in enumerate(groups):
        duration = min(width, span - k * width)
        ok = [r for r in rs if r.ok]
        item: dict[str, Any] = {
            "start_s": round(k * width, 3),
            "duration_s": round(duration, 3),
            "count": len(rs),
            "completed": len(ok),
            "errors": len(rs) - len(ok),
            "throughput": round(len(ok) / duration, 3) if duration > 0 else None,
            "output_throughput": round(sum(r.out_tokens for r in ok) / duration, 3) if duration > 0 else None,
            "ttft_p50_ms": _pct([r.ttft for r in ok if r.ttft is not None], 50),
            "ttft_p99_ms": _pct([r.ttft for r in ok if r.ttft is not None], 99),
            "latency_p50_ms": _pct([r.latency for r in ok], 50),
            "latency_p99_ms": _pct([r.latency for r in ok], 99),
        }
        if repetition is not None:
            item["repetition"] = repetition
        out.append(item)
    return out
