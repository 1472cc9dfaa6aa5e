"""What the HTML report draws per stage: the stage over time (warm-up included) and the
latency and TTFT distributions, reduced to a few hundred numbers for the JSON."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .engine import StageRun

BUCKETS = 60
CDF_POINTS = 41  # quantiles 0, 2.5, ..., 100 %


def _nice(x: float) -> float:
    """The bucket width: 0.1, 0.2, 0.25, 0.5, 1, 2, 2.5, 5, 10, ... seconds."""
    base = 10 ** math.floor(math.log10(x))
    return next(base * m for m in (1, 2, 2.5, 5, 10) if base * m >= x)


def timeline(run: StageRun) -> dict[str, Any]:
    """Per time bucket from the stage's start: completed req/s, errors, p50 and p99 latency
    of the requests that ended in it; `windows` are the measured windows (after warm-up)."""
    marks = run.timeline_marks or [(run.window_start - run.t0, run.window_end - run.t0)]
    if not run.events:
        return {
            "bucket_s": None,
            "t": [],
            "throughput": [],
            "errors": [],
            "p50_ms": [],
            "p99_ms": [],
            "windows": [[round(a, 3), round(b, 3)] for a, b in marks],
        }
    ends = np.asarray([e[0] for e in run.events])
    lat = np.asarray([e[1] for e in run.events]) * 1000
    ok = np.asarray([e[2] for e in run.events])
    width = _nice(max(float(ends.max()) / BUCKETS, 0.1))
    idx = np.floor(ends / width).astype(int)
    n = int(idx.max()) + 1
    out: dict[str, Any] = {
        "bucket_s": width,
        "throughput_window_s": None,
        "t": [],
        "throughput": [],
        "errors": [],
        "p50_ms": [],
        "p99_ms": [],
    }
    # throughput: completions in a window of at least the median latency around each bucket,
    # so requests of many seconds give a rate, not a comb of single completions
    span = max(width, float(np.median(lat[ok])) / 1000 if ok.any() else width)
    good_ends = ends[ok]
    for b in range(n):
        sel = idx == b
        good = lat[sel & ok]
        mid = (b + 0.5) * width
        lo, hi = max(mid - span / 2, 0.0), min(mid + span / 2, float(ends.max()))
        inside = int(((good_ends >= lo) & (good_ends < hi)).sum()) if hi > lo else good.size
        out["t"].append(round(mid, 3))
        out["throughput"].append(round(float(inside) / max(hi - lo, width), 3))
        out["errors"].append(int((sel & ~ok).sum()))
        p50, p99 = np.percentile(good, [50, 99]) if good.size else (None, None)
        out["p50_ms"].append(None if p50 is None else round(float(p50), 3))
        out["p99_ms"].append(None if p99 is None else round(float(p99), 3))
    out["windows"] = [[round(a, 3), round(b, 3)] for a, b in marks]
    out["throughput_window_s"] = round(span, 3)
    return out


def cdf(values_s: list[float]) -> list[float]:
    """The values (ms) at quantiles 0, 2.5, ..., 100 %; empty without values."""
    if not values_s:
        return []
    q = np.percentile(np.asarray(values_s) * 1000, np.linspace(0, 100, CDF_POINTS))
    return [round(float(v), 3) for v in q]
