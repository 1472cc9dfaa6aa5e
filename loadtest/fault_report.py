"""What each scheduled fault did: errors, recovery, the router's retries and resumed streams.

Every request of the run (warm-up included) is placed by its send time. Per fault:
  - `level_before`: error share and p99 latency of the requests sent and ended in the 5 s before it
    (a fault within those 5 s of an earlier one inherits the earlier one's level: a restart
    is measured against the level before the kill, not against the outage);
  - `errors`: requests that failed ending between the fault and the next one (or the run's end);
  - the time after the fault is cut into buckets (a twentieth of the time to the next fault,
    0.1 s to 1 s); `error_recovery_s` is when the first of three consecutive buckets (fewer
    at the end) begins whose error share is within 1 point of the level before, and
    `p99_recovery_s` the same for p99 within 1.5x; an empty bucket (nothing sent: users
    waiting) is not recovered. None: not recovered before the next fault or the end;
  - `router_retries` and `router_resumed`: the router's /metrics counters
    (nomyo_router_events_total) from just before the fault to just before the next one (or
    the end); None when the target is no nomyo-router or its /metrics is closed.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import numbers
from .engine import StageRun

BEFORE_S = 5.0
RUN_OF = 3
P99_SLACK = 1.5
ERROR_SLACK = 0.01


def _requests(runs: list[StageRun]) -> np.ndarray:
    """(send, end, latency, ok) of every request of the run, absolute perf_counter seconds."""
    rows = [(r.t0 + end - lat, r.t0 + end, lat, 1.0 if ok else 0.0) for r in runs for end, lat, ok in r.events]
    return np.asarray(rows, dtype=float).reshape(-1, 4)


def _level(req: np.ndarray) -> dict[str, float | None]:
    if not len(req):
        return {"requests": 0, "error_share": None, "p99_ms": None}
    good = req[req[:, 3] == 1.0]
    p99 = float(np.percentile(good[:, 2], 99)) * 1000 if len(good) else None
    return {
        "requests": len(req),
        "error_share": round(1 - len(good) / len(req), 4),
        "p99_ms": None if p99 is None else round(p99, 3),
    }


def _recovery(req: np.ndarray, at: float, until: float, fine: Any) -> float | None:
    width = min(max((until - at) / 20, 0.1), 1.0)
    n = max(int(np.ceil((until - at) / width)), 1)
    ok = []
    for b in range(n):
        sel = req[(req[:, 0] >= at + b * width) & (req[:, 0] < at + (b + 1) * width)]
        ok.append(bool(len(sel)) and fine(sel))
    for b in range(n):
        if all(ok[b : b + RUN_OF]):
            return round(b * width, 3)
    return None


def analyse(done: list[dict[str, Any]], runs: list[StageRun], end_events: dict[str, float] | None) -> list[dict]:
    """One dict per fault done, for the JSON's `faults`."""
    req = _requests(runs)
    t_end = max((r.t0 + r.wall_s for r in runs), default=0.0)
    if len(req):
        t_end = max(t_end, float(req[:, 1].max()))
    start = min((r.t0 for r in runs), default=0.0)
    out: list[dict] = []
    inherited: tuple[float, dict[str, Any]] | None = None
    for k, d in enumerate(done):
        f, at = d["fault"], d["at"]
        until = done[k + 1]["at"] if k + 1 < len(done) else t_end
        if inherited is not None and at - inherited[0] < BEFORE_S:
            level = inherited[1]
        else:
            level = _level(req[(req[:, 0] >= at - BEFORE_S) & (req[:, 1] < at)])
        inherited = (at, level)
        after = req[(req[:, 1] >= at) & (req[:, 1] < until)]
        e0, p0 = level["error_share"], level["p99_ms"]

        def err_fine(sel: np.ndarray, e0: float | None = e0) -> bool:
            return e0 is not None and 1 - sel[:, 3].mean() <= e0 + ERROR_SLACK

        def p99_fine(sel: np.ndarray, p0: float | None = p0) -> bool:
            good = sel[sel[:, 3] == 1.0]
            return p0 is not None and len(good) > 0 and np.percentile(good[:, 2], 99) * 1000 <= P99_SLACK * p0

        err_rec = _recovery(req, at, until, err_fine)
        p99_rec = _recovery(req, at, until, p99_fine)
        nxt = done[k + 1]["events"] if k + 1 < len(done) else end_events
        ev = d["events"]
        out.append(
            {
                "fault": f.text,
                "label": f.label,
                "at_s": round(at - start, 3),
                "took_s": d["took_s"],
                "ok": d["ok"],
                "detail": d["detail"],
                "level_before": level,
                "errors": int((after[:, 3] == 0.0).sum()),
                "requests_after": len(after),
                "error_recovery_s": err_rec,
                "p99_recovery_s": p99_rec,
                "recovered_s": None if err_rec is None or p99_rec is None else max(err_rec, p99_rec),
                "horizon_s": round(until - at, 3),
                "router_retries": None if ev is None or nxt is None else int(nxt["retry"] - ev["retry"]),
                "router_resumed": None if ev is None or nxt is None else int(nxt["resumed"] - ev["resumed"]),
                "_at": at,
            }
        )
    return out


def mark_stages(stages: list[dict[str, Any]], runs: list[StageRun], faults: list[dict[str, Any]]) -> None:
    """Each stage's `faults`: the faults during it, seconds from its start, for its timeline."""
    for s, r in zip(stages, runs, strict=False):
        s["faults"] = [
            {"label": f["label"], "at_s": round(f["_at"] - r.t0, 3)}
            for f in faults
            if r.t0 <= f["_at"] <= r.t0 + r.wall_s
        ]


def public(faults: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in f.items() if not k.startswith("_")} for f in faults]


def _s(v: float | None, horizon: float) -> str:
    return f"not within {numbers.sig(horizon)} s" if v is None else f"{numbers.sig(v)} s"


def lines(faults: list[dict[str, Any]]) -> list[str]:
    """The terminal's line per fault."""
    out = []
    for f in faults:
        lv = f["level_before"]
        router = (
            f"; router retried {f['router_retries']}, resumed {f['router_resumed']}"
            if f["router_retries"] is not None
            else ""
        )
        failed = "" if f["ok"] else f" (FAILED: {f['detail']})"
        out.append(
            f"fault {f['fault']} at {numbers.sig(f['at_s'])} s{failed}: {f['errors']} errors; error rate back "
            f"to {numbers.sig(100 * (lv['error_share'] or 0))}% after {_s(f['error_recovery_s'], f['horizon_s'])}, "
            f"p99 back to 1.5x {numbers.sig(lv['p99_ms'])} ms after {_s(f['p99_recovery_s'], f['horizon_s'])}"
            f"{router}"
        )
    return out


def rows(faults: list[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """The HTML table."""
    head = ["fault", "at s", "done", "errors", "error rate before", "p99 before ms", "error rate back after",
            "p99 back after", "router retries", "resumed"]  # fmt: skip
    body = [
        [
            f["fault"],
            numbers.sig(f["at_s"]),
            "yes" if f["ok"] else f"failed: {f['detail']}",
            numbers.count(f["errors"]),
            f"{numbers.sig(100 * (f['level_before']['error_share'] or 0))}%",
            numbers.sig(f["level_before"]["p99_ms"]),
            _s(f["error_recovery_s"], f["horizon_s"]),
            _s(f["p99_recovery_s"], f["horizon_s"]),
            numbers.count(f["router_retries"]),
            numbers.count(f["router_resumed"]),
        ]
        for f in faults
    ]
    return head, body
