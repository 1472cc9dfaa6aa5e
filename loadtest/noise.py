"""Repetitions (`--repeat N`) and what they say about noise.

A stage run N times back to back gives N values of each gated metric. `spread` reports
them (median, min, max, relative spread). `change_interval` is what `compare` gates on:
the relative change of the median between two runs, with a 95% bootstrap interval —
resample each run's repetitions with replacement, take the ratio of the two medians,
repeat B times, keep the 2.5th and 97.5th percentiles. A change is *beyond the noise*
when that whole interval lies on one side of zero and the change exceeds the relative
spreads of both runs' repetitions added (`rel_spread`): on a shared machine the load drifts
between runs, three repetitions of one run can all sit on one side of three of another,
and each run's spread is how far its median may be off.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

# the per-repetition metrics kept in the JSON (compare's gated metrics and the error rate)
REP_KEYS = (
    "request_throughput",
    "median_e2el_ms",
    "p99_e2el_ms",
    "median_ttft_ms",
    "p99_ttft_ms",
    "error_rate",
    "goodput",
)
BOOTSTRAP = 2000
CONFIDENCE = 0.95


def repetition(m: dict[str, Any]) -> dict[str, Any]:
    """The gated metrics of one repetition's summary."""
    return {k: m[k] for k in REP_KEYS if k in m}


def spread(reps: Sequence[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per metric: median, min, max and (max - min) / median of the repetitions."""
    out: dict[str, dict[str, float]] = {}
    for key in REP_KEYS:
        vals = [r[key] for r in reps if r.get(key) is not None]
        if not vals:
            continue
        med = float(np.median(vals))
        out[key] = {
            "median": round(med, 3),
            "min": round(min(vals), 3),
            "max": round(max(vals), 3),
            "rel_spread": round((max(vals) - min(vals)) / med, 4) if med else 0.0,
        }
    return out


def values(stage: dict[str, Any], key: str) -> list[float]:
    """A stage's repetitions of `key`, or its single value."""
    reps = [r[key] for r in stage.get("repetitions", []) if r.get(key) is not None]
    if reps:
        return reps
    return [stage[key]] if stage.get(key) is not None else []


def rel_spread(vals: Sequence[float]) -> float:
    """(max - min) / median of repetitions; 0 for fewer than two."""
    if len(vals) < 2:
        return 0.0
    med = float(np.median(vals))
    return (max(vals) - min(vals)) / med if med else 0.0


def change_interval(base: Sequence[float], cur: Sequence[float], seed: int = 0) -> tuple[float, float, float] | None:
    """(relative change of the median, low, high of its bootstrap interval); None without a baseline.
    With a single value on both sides the interval is the point itself (no noise information)."""
    b, c = np.asarray(base, dtype=float), np.asarray(cur, dtype=float)
    if not len(b) or not len(c) or np.median(b) == 0:
        return None
    point = float(np.median(c) / np.median(b) - 1)
    if len(b) < 2 and len(c) < 2:
        return point, point, point
    rng = np.random.default_rng(seed)
    bm = np.median(rng.choice(b, size=(BOOTSTRAP, len(b))), axis=1)
    cm = np.median(rng.choice(c, size=(BOOTSTRAP, len(c))), axis=1)
    ok = bm != 0
    ratios = cm[ok] / bm[ok] - 1
    tail = (1 - CONFIDENCE) / 2 * 100
    lo, hi = np.percentile(ratios, [tail, 100 - tail])
    return point, float(lo), float(hi)
