"""Output: the live progress line, the final table, the JSON document and the HTML report."""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

from . import numbers, session_report

SCHEMA = "nomyo-loadtest/1"

COLUMNS = [  # (header, metric key, kind: see `_fmt`)
    ("conc", "load", "load"),
    ("req", "requests", "count"),
    ("ok", "completed", "count"),
    ("err", "failed", "count"),
    ("req/s", "request_throughput", "sig"),
    ("p50ms", "median_e2el_ms", "sig"),
    ("p90ms", "p90_e2el_ms", "sig"),
    ("p99ms", "p99_e2el_ms", "sig"),
    ("maxms", "max_e2el_ms", "sig"),
    ("ttftP50", "median_ttft_ms", "sig"),
    ("ttftP99", "p99_ttft_ms", "sig"),
    ("tok/s", "output_throughput", "sig"),
    ("ovhP50", "median_router_overhead_ms", "sig"),
]


def _fmt(kind: str, value: Any, mode: str = "closed") -> str:
    """By kind (loadtest/numbers.py): `count`, `sig` (rates and times), `load`, or a format string."""
    if value is None:
        return "-"
    if kind == "count":
        return numbers.count(value)
    if kind in ("sig", "rate"):
        return numbers.sig(value)
    if kind == "load":
        return numbers.load(value, mode)
    return kind.format(value)


def table(
    stages: Sequence[dict[str, Any]], knee: dict[str, Any], mode: str, direct: Sequence[dict[str, Any]] | None = None
) -> Table:
    t = Table(title="nomyo loadtest", show_lines=False)
    for head, _, _ in COLUMNS:
        t.add_column("rate" if head == "conc" and mode != "closed" else head, justify="right")
    slo = any("goodput" in s for s in stages)
    if slo:
        t.add_column("good/s", justify="right")
    if direct:
        t.add_column("+p50ms", justify="right")
        t.add_column("thr ratio", justify="right")
    t.add_column("note")
    for i, s in enumerate(stages):
        row = [_fmt(fmt, s.get(key), mode) for _, key, fmt in COLUMNS]
        if slo:
            row.append(_fmt("sig", s.get("goodput")))
        if direct:
            d = direct[i]
            add = (
                (s["median_e2el_ms"] - d["median_e2el_ms"])
                if s["median_e2el_ms"] is not None and d["median_e2el_ms"] is not None
                else None
            )
            ratio = s["request_throughput"] / d["request_throughput"] if d["request_throughput"] else None
            row += ["-" if add is None else ("+" if add >= 0 else "") + numbers.sig(add), _fmt("sig", ratio)]
        notes = []
        if knee.get("knee_stage") == i:
            notes.append("knee")
        if knee.get("max_throughput_load") == s["load"]:
            notes.append("max thr")
        if knee.get("saturation_load") == s["load"]:
            notes.append("saturates")
        if s["client"]["bottleneck"]:
            notes.append("CLIENT-BOUND")
        elif s["client"].get("machine_bound"):
            notes.append("MACHINE-BUSY")
        row.append(",".join(notes))
        t.add_row(*row)
    return t


def print_summary(
    console: Console,
    stages: Sequence[dict[str, Any]],
    knee: dict[str, Any],
    mode: str,
    direct: Sequence[dict[str, Any]] | None = None,
) -> None:
    console.print(table(stages, knee, mode, direct))
    console.print(knee_line(knee, mode), highlight=False)
    for s in stages:
        if s["endpoints"] and len(s["endpoints"]) > 1:
            total = sum(s["endpoints"].values())
            split = ", ".join(f"{k} {v * 100 / total:.0f}%" for k, v in sorted(s["endpoints"].items()))
            console.print(f"  load {s['load']:g}: endpoint split {split}")
        if set(s["affinity"]) - {"miss"}:  # single-turn load is all misses: nothing to say
            console.print(f"  load {s['load']:g}: affinity {s['affinity']}")
        if s.get("sessions"):
            console.print(session_report.line(f"{s['load']:g}", s["sessions"]), highlight=False, soft_wrap=True)
        late = s.get("lateness") or {}
        if late.get("p50_ms") is not None:
            console.print(
                f"  load {s['load']:g}: sent late by p50 {numbers.sig(late['p50_ms'])} ms, "
                f"p99 {numbers.sig(late['p99_ms'])} ms, max {numbers.sig(late['max_ms'])} ms; "
                f"{late['late_share']:.1%} later than {late['late_ms']:g} ms",
                highlight=False,
            )
    for s in stages:
        c = s["client"]
        if c["bottleneck"]:
            console.print(
                f"[bold yellow]CLIENT-BOUND[/] at load {s['load']:g}: {c['reason']}; these numbers "
                f"measure the load generator as much as the server. Lower the load or run the client "
                f"on another machine.",
                highlight=False,
            )
        elif c.get("machine_bound"):
            console.print(
                f"[bold yellow]MACHINE-BUSY[/] at load {s['load']:g}: {c['reason']}; the client is "
                f"not the limit, the machine it shares is (latencies include that contention).",
                highlight=False,
            )


def knee_line(knee: dict[str, Any], mode: str) -> str:
    """knee: 64 concurrent  |  max throughput: 1513 req/s at 128  |  saturates at: 128"""
    unit = "concurrent" if mode == "closed" else "req/s offered"
    return (
        f"knee: {numbers.load(knee['knee_load'], mode)} {unit}  |  max throughput: "
        f"{numbers.sig(knee['max_request_throughput'])} req/s at {numbers.load(knee['max_throughput_load'], mode)}"
        f"  |  saturates at: {numbers.load(knee['saturation_load'], mode)}"
    )


def environment() -> dict[str, Any]:
    import aiohttp
    import numpy

    versions = {"python": platform.python_version(), "aiohttp": aiohttp.__version__, "numpy": numpy.__version__}
    try:
        import uvicorn

        versions["uvicorn"] = uvicorn.__version__
    except ImportError:
        pass
    return {
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "versions": versions,
        "argv": sys.argv,
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def document(
    config: dict[str, Any], stages: list[dict[str, Any]], knee: dict[str, Any], direct: list[dict[str, Any]] | None
) -> dict[str, Any]:
    doc = {"schema": SCHEMA, "config": config, "environment": environment(), "stages": stages, "knee": knee}
    if direct:
        doc["direct"] = direct
        doc["overhead"] = [
            {
                "load": s["load"],
                "added_p50_ms": _sub(s["median_e2el_ms"], d["median_e2el_ms"]),
                "added_p99_ms": _sub(s["p99_e2el_ms"], d["p99_e2el_ms"]),
                "throughput_ratio": round(s["request_throughput"] / d["request_throughput"], 4)
                if d["request_throughput"]
                else None,
            }
            for s, d in zip(stages, direct, strict=False)
        ]
    return doc


def _sub(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else round(a - b, 3)


def write_json(path: str, doc: dict[str, Any]) -> None:
    with open(path, "w") as f:
        json.dump(doc, f, indent=2)
