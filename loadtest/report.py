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

SCHEMA = "nomyo-loadtest/1"

COLUMNS = [  # (header, metric key, format)
    ("conc", "load", "{:g}"),
    ("req", "requests", "{}"),
    ("ok", "completed", "{}"),
    ("err", "failed", "{}"),
    ("req/s", "request_throughput", "rate"),
    ("p50ms", "median_e2el_ms", "{:.1f}"),
    ("p90ms", "p90_e2el_ms", "{:.1f}"),
    ("p99ms", "p99_e2el_ms", "{:.1f}"),
    ("maxms", "max_e2el_ms", "{:.1f}"),
    ("ttftP50", "median_ttft_ms", "{:.1f}"),
    ("ttftP99", "p99_ttft_ms", "{:.1f}"),
    ("tok/s", "output_throughput", "{:.0f}"),
    ("ovhP50", "median_router_overhead_ms", "{:.3f}"),
]


def _fmt(fmt: str, value: Any) -> str:
    if value is None:
        return "-"
    if fmt == "rate":  # req/s: 0.146 from a slow model stays readable, 1513.2 from the mock too
        return f"{value:.1f}" if value >= 100 else f"{value:.3g}"
    return fmt.format(value)


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
        row = [_fmt(fmt, s.get(key)) for _, key, fmt in COLUMNS]
        if slo:
            row.append(_fmt("rate", s.get("goodput")))
        if direct:
            d = direct[i]
            add = (
                (s["median_e2el_ms"] - d["median_e2el_ms"])
                if s["median_e2el_ms"] is not None and d["median_e2el_ms"] is not None
                else None
            )
            ratio = s["request_throughput"] / d["request_throughput"] if d["request_throughput"] else None
            row += [_fmt("{:+.3f}", add), _fmt("{:.2f}", ratio)]
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
    unit = "concurrent" if mode == "closed" else "req/s offered"
    console.print(
        f"knee: {knee['knee_load']} {unit}  |  max throughput: "
        f"{knee['max_request_throughput']} req/s at {knee['max_throughput_load']}  |  "
        f"saturates at: {knee['saturation_load']}"
    )
    for s in stages:
        if s["endpoints"] and len(s["endpoints"]) > 1:
            total = sum(s["endpoints"].values())
            split = ", ".join(f"{k} {v * 100 / total:.0f}%" for k, v in sorted(s["endpoints"].items()))
            console.print(f"  load {s['load']:g}: endpoint split {split}")
        if set(s["affinity"]) - {"miss"}:  # single-turn load is all misses: nothing to say
            console.print(f"  load {s['load']:g}: affinity {s['affinity']}")
        late = s.get("lateness") or {}
        if late.get("p50_ms") is not None:
            console.print(
                f"  load {s['load']:g}: sent late by p50 {late['p50_ms']:.2f} ms, "
                f"p99 {late['p99_ms']:.2f} ms, max {late['max_ms']:.1f} ms; "
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
