"""Output: the live progress line, the final table, the JSON document and the HTML report."""

from __future__ import annotations

import html
import json
import os
import platform
import sys
import time
from typing import Any, Sequence

from rich.console import Console
from rich.table import Table

SCHEMA = "nomyo-loadtest/1"

COLUMNS = [  # (header, metric key, format)
    ("conc", "load", "{:g}"),
    ("req", "requests", "{}"),
    ("ok", "completed", "{}"),
    ("err", "failed", "{}"),
    ("req/s", "request_throughput", "{:.1f}"),
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
    return "-" if value is None else fmt.format(value)


def table(stages: Sequence[dict[str, Any]], knee: dict[str, Any], mode: str,
          direct: Sequence[dict[str, Any]] | None = None) -> Table:
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
            row.append(_fmt("{:.1f}", s.get("goodput")))
        if direct:
            d = direct[i]
            add = (s["median_e2el_ms"] - d["median_e2el_ms"]) if s["median_e2el_ms"] is not None \
                and d["median_e2el_ms"] is not None else None
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


def print_summary(console: Console, stages: Sequence[dict[str, Any]], knee: dict[str, Any], mode: str,
                  direct: Sequence[dict[str, Any]] | None = None) -> None:
    console.print(table(stages, knee, mode, direct))
    unit = "concurrent" if mode == "closed" else "req/s offered"
    console.print(f"knee: {knee['knee_load']} {unit}  |  max throughput: "
                  f"{knee['max_request_throughput']} req/s at {knee['max_throughput_load']}  |  "
                  f"saturates at: {knee['saturation_load']}")
    for s in stages:
        if s["endpoints"] and len(s["endpoints"]) > 1:
            total = sum(s["endpoints"].values())
            split = ", ".join(f"{k} {v * 100 / total:.0f}%" for k, v in sorted(s["endpoints"].items()))
            console.print(f"  load {s['load']:g}: endpoint split {split}")
        if set(s["affinity"]) - {"miss"}:  # single-turn load is all misses: nothing to say
            console.print(f"  load {s['load']:g}: affinity {s['affinity']}")
    for s in stages:
        c = s["client"]
        if c["bottleneck"]:
            console.print(f"[bold yellow]CLIENT-BOUND[/] at load {s['load']:g}: {c['reason']}; these numbers "
                          f"measure the load generator as much as the server. Lower the load or run the client "
                          f"on another machine.", highlight=False)
        elif c.get("machine_bound"):
            console.print(f"[bold yellow]MACHINE-BUSY[/] at load {s['load']:g}: {c['reason']}; the client is "
                          f"not the limit, the machine it shares is (latencies include that contention).",
                          highlight=False)


def environment() -> dict[str, Any]:
    import aiohttp
    import numpy
    versions = {"python": platform.python_version(), "aiohttp": aiohttp.__version__,
                "numpy": numpy.__version__}
    try:
        import uvicorn
        versions["uvicorn"] = uvicorn.__version__
    except ImportError:
        pass
    return {"cpu_count": os.cpu_count(), "platform": platform.platform(), "machine": platform.machine(),
            "versions": versions, "argv": sys.argv, "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def document(config: dict[str, Any], stages: list[dict[str, Any]], knee: dict[str, Any],
             direct: list[dict[str, Any]] | None) -> dict[str, Any]:
    doc = {"schema": SCHEMA, "config": config, "environment": environment(), "stages": stages, "knee": knee}
    if direct:
        doc["direct"] = direct
        doc["overhead"] = [
            {"load": s["load"],
             "added_p50_ms": _sub(s["median_e2el_ms"], d["median_e2el_ms"]),
             "added_p99_ms": _sub(s["p99_e2el_ms"], d["p99_e2el_ms"]),
             "throughput_ratio": round(s["request_throughput"] / d["request_throughput"], 4)
             if d["request_throughput"] else None}
            for s, d in zip(stages, direct)]
    return doc


def _sub(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else round(a - b, 3)


def write_json(path: str, doc: dict[str, Any]) -> None:
    with open(path, "w") as f:
        json.dump(doc, f, indent=2)


def _svg_chart(title: str, xs: list[float], series: list[tuple[str, str, list[float | None]]],
               knee_x: float | None, xlabel: str) -> str:
    w, h, pad = 560, 300, 48
    vals = [v for _, _, ys in series for v in ys if v is not None]
    ymax = max(vals) * 1.1 if vals else 1.0
    xmin, xmax = min(xs), max(xs)
    span = (xmax - xmin) or 1.0

    def px(x: float) -> float:
        return pad + (x - xmin) / span * (w - 2 * pad)

    def py(y: float) -> float:
        return h - pad - y / ymax * (h - 2 * pad)

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="11">',
             f'<text x="{w / 2}" y="16" text-anchor="middle" font-size="13">{html.escape(title)}</text>',
             f'<line x1="{pad}" y1="{h - pad}" x2="{w - pad}" y2="{h - pad}" stroke="#333"/>',
             f'<line x1="{pad}" y1="{pad}" x2="{pad}" y2="{h - pad}" stroke="#333"/>',
             f'<text x="{w / 2}" y="{h - 10}" text-anchor="middle">{html.escape(xlabel)}</text>']
    for frac in (0, 0.5, 1.0):
        y = ymax / 1.1 * frac
        parts.append(f'<text x="{pad - 4}" y="{py(y) + 4:.1f}" text-anchor="end">{y:.4g}</text>')
    for x in xs:
        parts.append(f'<text x="{px(x):.1f}" y="{h - pad + 14}" text-anchor="middle">{x:g}</text>')
    if knee_x is not None:
        parts.append(f'<line x1="{px(knee_x):.1f}" y1="{pad}" x2="{px(knee_x):.1f}" y2="{h - pad}" '
                     f'stroke="#d33" stroke-dasharray="4 3"/>')
        parts.append(f'<text x="{px(knee_x) + 4:.1f}" y="{pad + 10}" fill="#d33">knee</text>')
    for i, (name, color, ys) in enumerate(series):
        pts = [(px(x), py(y)) for x, y in zip(xs, ys) if y is not None]
        if pts:
            parts.append('<polyline fill="none" stroke="{}" stroke-width="2" points="{}"/>'.format(
                color, " ".join(f"{a:.1f},{b:.1f}" for a, b in pts)))
            parts += [f'<circle cx="{a:.1f}" cy="{b:.1f}" r="3" fill="{color}"/>' for a, b in pts]
        parts.append(f'<text x="{w - pad - 120}" y="{pad + 14 * i}" fill="{color}">{html.escape(name)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def write_html(path: str, doc: dict[str, Any]) -> None:
    stages = doc["stages"]
    knee = doc["knee"]
    mode = stages[0]["mode"] if stages else "closed"
    xs = [s["load"] for s in stages]
    xlabel = "concurrency" if mode == "closed" else "offered rate (req/s)"
    thr = _svg_chart("Throughput (req/s)", xs, [("router", "#1f77b4", [s["request_throughput"] for s in stages])]
                     + ([("direct", "#999", [d["request_throughput"] for d in doc["direct"]])] if doc.get("direct") else []),
                     knee.get("knee_load"), xlabel)
    lat = _svg_chart("Latency (ms)", xs, [("p50", "#2ca02c", [s["median_e2el_ms"] for s in stages]),
                                          ("p99", "#ff7f0e", [s["p99_e2el_ms"] for s in stages]),
                                          ("ttft p50", "#9467bd", [s["median_ttft_ms"] for s in stages])],
                     knee.get("knee_load"), xlabel)
    rows = "".join("<tr>" + "".join(f"<td>{html.escape(_fmt(fmt, s.get(key)))}</td>" for _, key, fmt in COLUMNS)
                   + "</tr>" for s in stages)
    head = "".join(f"<th>{h}</th>" for h, _, _ in COLUMNS)
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>nomyo loadtest</title>
<style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;padding:3px 8px;text-align:right}}</style>
</head><body><h1>nomyo loadtest</h1>
<p>knee: <b>{knee.get('knee_load')}</b> &middot; max throughput {knee.get('max_request_throughput')} req/s at {knee.get('max_throughput_load')} &middot; saturates at {knee.get('saturation_load')}</p>
<p><small>{html.escape(knee.get('definition', ''))}</small></p>
<div>{thr}{lat}</div>
<table><tr>{head}</tr>{rows}</table>
<h2>Config</h2><pre>{html.escape(json.dumps(doc['config'], indent=2))}</pre>
<h2>Environment</h2><pre>{html.escape(json.dumps(doc['environment'], indent=2))}</pre>
</body></html>"""
    with open(path, "w") as f:
        f.write(page)
