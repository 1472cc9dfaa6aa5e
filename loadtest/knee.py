"""The knee of a ramp, and where it saturates.

Definition (written down so it can be argued with): a stage is *healthy* when
  - its error rate is at most 1%,
  - its p99 latency is at most 1.5x the first stage's, and
  - its throughput is at least 0.8x linear scaling from the first stage
    (throughput_i >= 0.8 * throughput_0 * load_i / load_0).
The knee is the last stage of the unbroken run of healthy stages that starts at the
first stage: the most load the system takes while still scaling and still fast.
The saturation point is the lowest load whose throughput reaches 90% of the maximum.
Both work for closed loop (load = concurrency) and open loop (load = offered rate).

Example: 2 mocks x 4 slots at 200 ms serve 40 req/s. Concurrency 8 gives 40 req/s at
~200 ms; concurrency 16 still gives 40 req/s (0.5x linear) at ~400 ms, so the knee is 8.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

MAX_ERROR_RATE = 0.01
MAX_P99_GROWTH = 1.5
MIN_SCALING = 0.8
SATURATION_SHARE = 0.9


def healthy(stage: dict[str, Any], first: dict[str, Any]) -> bool:
    if stage["error_rate"] > MAX_ERROR_RATE or not stage["completed"]:
        return False
    p99, p99_0 = stage.get("p99_e2el_ms"), first.get("p99_e2el_ms")
    if p99 is None or p99_0 is None or p99 > MAX_P99_GROWTH * p99_0:
        return False
    linear = first["request_throughput"] * stage["load"] / first["load"]
    return stage["request_throughput"] >= MIN_SCALING * linear


def find_knee(stages: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """`stages` in ramp order (rising load), each a `metrics.summarize` dict."""
    out: dict[str, Any] = {
        "knee_load": None,
        "knee_stage": None,
        "max_request_throughput": None,
        "max_throughput_load": None,
        "saturation_load": None,
        "definition": "last stage of the unbroken healthy run from the first stage; "
        "healthy = errors <= 1%, p99 <= 1.5x first, "
        "throughput >= 0.8x linear scaling",
    }
    if not stages:
        return out
    first = stages[0]
    if healthy(first, first):
        knee = 0
        for i in range(1, len(stages)):
            if not healthy(stages[i], first):
                break
            knee = i
        out["knee_stage"], out["knee_load"] = knee, stages[knee]["load"]
    best = max(range(len(stages)), key=lambda i: stages[i]["request_throughput"])
    top = stages[best]["request_throughput"]
    out["max_request_throughput"] = top
    out["max_throughput_load"] = stages[best]["load"]
    out["saturation_load"] = next(s["load"] for s in stages if s["request_throughput"] >= SATURATION_SHARE * top)
    return out
