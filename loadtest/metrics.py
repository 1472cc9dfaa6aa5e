"""Per-stage metrics. Names follow `vllm bench serve` where they overlap
(request_throughput, output_throughput, median/p99_ttft_ms, tpot, itl, e2el, completed, failed)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np

from . import machine, session_report
from .engine import StageRun
from .slo import goodput
from .timeline import cdf, timeline


def _dist(prefix: str, values: list[float], scale: float = 1000.0) -> dict[str, float | None]:
    if not values:
        return {
            f"mean_{prefix}_ms": None,
            f"median_{prefix}_ms": None,
            f"p90_{prefix}_ms": None,
            f"p99_{prefix}_ms": None,
            f"max_{prefix}_ms": None,
        }
    a = np.asarray(values, dtype=float) * scale
    p50, p90, p99 = np.percentile(a, [50, 90, 99])
    return {
        f"mean_{prefix}_ms": round(float(a.mean()), 3),
        f"median_{prefix}_ms": round(float(p50), 3),
        f"p90_{prefix}_ms": round(float(p90), 3),
        f"p99_{prefix}_ms": round(float(p99), 3),
        f"max_{prefix}_ms": round(float(a.max()), 3),
    }


LATE_MS = 10.0


def lateness(results: list[Any]) -> dict[str, Any]:
    """Open loop and trace replay: how late requests went out after their intended send
    time (a trace's timestamp); `late_share` is the share later than LATE_MS."""
    lags = [r.send_lag * 1000 for r in results]
    if not lags:
        return {"p50_ms": None, "p99_ms": None, "max_ms": None, "late_share": None, "late_ms": LATE_MS}
    p50, p99 = np.percentile(lags, [50, 99])
    return {
        "p50_ms": round(float(p50), 3),
        "p99_ms": round(float(p99), 3),
        "max_ms": round(max(lags), 3),
        "late_share": round(sum(1 for x in lags if x > LATE_MS) / len(lags), 4),
        "late_ms": LATE_MS,
    }


def summarize(run: StageRun, slo: dict[str, float] | None = None) -> dict[str, Any]:
    results = run.results
    ok = [r for r in results if r.ok]
    duration = max(run.window_end - run.window_start, 1e-9)
    out_tokens = sum(r.out_tokens for r in ok)
    errors = Counter(r.error for r in results if not r.ok)
    tpot = [(r.latency - r.ttft) / (r.out_tokens - 1) for r in ok if r.ttft is not None and r.out_tokens > 1 and r.itl]
    itl = [g for r in ok for g in r.itl]
    lag_ms = np.percentile(np.asarray(run.loop_lag) * 1000, 99) if run.loop_lag else 0.0
    send_lag_ms = np.percentile([r.send_lag * 1000 for r in results], 99) if results else 0.0
    stage = run.stage
    m: dict[str, Any] = {
        "target": run.target,
        "mode": stage.mode,
        "max_concurrency": int(stage.load) if stage.mode == "closed" else None,
        "request_rate": stage.load if stage.mode != "closed" else None,
        "load": stage.load,
        "requests": len(results),
        "completed": len(ok),
        "failed": len(results) - len(ok),
        "error_rate": round((len(results) - len(ok)) / len(results), 5) if results else 0.0,
        "errors": dict(errors),
        "duration_s": round(duration, 3),
        # duration stages: requests completed inside the window / its length (any request
        # length); --requests stages: the requests sent / the time until the last one ended
        "request_throughput": round(
            (run.completed_in_window if run.completed_in_window is not None else len(ok)) / duration, 3
        ),
        "output_throughput": round(
            (run.tokens_in_window if run.completed_in_window is not None else out_tokens) / duration, 3
        ),
        "total_output_tokens": out_tokens,
    }
    if slo:
        m.update(goodput(results, m["request_throughput"], slo))
    m.update(_dist("e2el", [r.latency for r in ok]))
    m.update(_dist("ttft", [r.ttft for r in ok if r.ttft is not None]))
    m.update(_dist("tpot", tpot))
    m.update(_dist("itl", itl))
    overheads = [r.overhead_ms for r in ok if r.overhead_ms is not None]
    m.update(_dist("router_overhead", overheads, scale=1.0))
    m["endpoints"] = dict(Counter(r.endpoint for r in ok if r.endpoint))
    m["affinity"] = dict(Counter(r.affinity for r in ok if r.affinity))
    turns = sorted({r.turn for r in ok if r.turn})
    if len(turns) > 1:
        m["turns"] = {str(t): _dist("ttft", [r.ttft for r in ok if r.turn == t and r.ttft is not None]) for t in turns}
        later = [r.ttft for r in ok if r.turn >= 2 and r.ttft is not None]
        m["affinity_turn2plus"] = dict(Counter(r.affinity for r in ok if r.turn >= 2 and r.affinity))
        m.update({k.replace("ttft", "ttft_turn2plus"): v for k, v in _dist("ttft", later).items()})
    sessions = session_report.figures(results)
    if sessions is not None:
        m["sessions"] = sessions
    if stage.mode != "closed":
        m["lateness"] = lateness(results)
    m["timeline"] = timeline(run)
    m["cdf"] = {"e2el_ms": cdf([r.latency for r in ok]), "ttft_ms": cdf([r.ttft for r in ok if r.ttft is not None])}
    m["client"] = machine.assess(
        run.cpu_s, run.wall_s, float(lag_ms), float(send_lag_ms), stage.mode != "closed", run.machine
    )
    return m
