"""`--sweep RATES`: open-loop stages at each rate, and the Pareto front of throughput against
latency — the figure `vllm bench` sweeps draw.

A stage is a point (throughput, latency) per latency metric (p50 and p99 of the whole
request, TTFT p50 and p99). It is *dominated* when another stage served at least as much at no
more latency, and strictly better in one of the two; the non-dominated stages are the front:
the rates worth running at, each buying throughput with latency. The JSON's `sweep` holds
every point and, per metric, the front's rates in throughput order; the HTML report draws the
points and joins the front.
"""

from __future__ import annotations

from typing import Any

from . import numbers
from .svg import Panel, Series, auto_log, chart

# JSON name -> (stage key, legend label)
METRICS = {
    "p50_ms": ("median_e2el_ms", "p50"),
    "p99_ms": ("p99_e2el_ms", "p99"),
    "ttft_p50_ms": ("median_ttft_ms", "TTFT p50"),
    "ttft_p99_ms": ("p99_ttft_ms", "TTFT p99"),
}
COLORS = {"p50_ms": "#2ca02c", "p99_ms": "#ff7f0e", "ttft_p50_ms": "#9467bd", "ttft_p99_ms": "#e377c2"}
CHART_TITLE = "Sweep: latency against throughput (Pareto fronts joined)"


def pareto(points: list[tuple[float, float]]) -> list[int]:
    """Indexes of the non-dominated (throughput up, latency down) points, by throughput."""
    front = []
    for i, (x, y) in enumerate(points):
        dominated = any((x2 >= x and y2 <= y) and (x2 > x or y2 < y) for j, (x2, y2) in enumerate(points) if j != i)
        if not dominated:
            front.append(i)
    return sorted(front, key=lambda i: (points[i][0], points[i][1]))


def summarize(stages: list[dict[str, Any]]) -> dict[str, Any]:
    """The `sweep` block of the JSON: every stage as a point, the front per metric."""
    points = [
        {"rate": s["load"], "throughput": s["request_throughput"]} | {m: s.get(k) for m, (k, _) in METRICS.items()}
        for s in stages
    ]
    fronts: dict[str, list[float]] = {}
    for m in METRICS:
        usable = [p for p in points if p[m] is not None and p["throughput"]]
        idx = pareto([(p["throughput"], p[m]) for p in usable])
        fronts[m] = [usable[i]["rate"] for i in idx]
    return {
        "definition": "a stage is on the front when no other stage has at least its throughput at no more "
        "latency (strictly better in one)",
        "points": points,
        "pareto": fronts,
    }


def section(sweep: dict[str, Any], table: Any) -> str:
    """The HTML: one chart (every stage a point per metric, the fronts joined) and a table."""
    pts = sweep["points"]
    panel: list[Series] = []
    for m, (_, label) in METRICS.items():
        on = [p for p in pts if p[m] is not None and p["rate"] in sweep["pareto"][m]]
        on.sort(key=lambda p: p["throughput"])
        panel.append((f"{label} front", COLORS[m], [p["throughput"] for p in on], [p[m] for p in on]))
        off = [p for p in pts if p[m] is not None and p["rate"] not in sweep["pareto"][m]]
        if off:
            panel.append((f"{label} dominated", COLORS[m], [p["throughput"] for p in off], [p[m] for p in off]))
    ys = [v for _, _, _, sy in panel for v in sy]
    log = auto_log(ys)
    dots = {name for name, _, _, _ in panel if name.endswith("dominated")}
    svg = chart(
        CHART_TITLE,
        Panel(panel, "ms (log)" if log else "ms", log=log, height=240, points_only=dots),
        "throughput (req/s)",
        xpad=0.06,
    )
    head = ["rate", "req/s"] + [label for _, label in METRICS.values()] + ["on the front of"]
    rows = [
        [numbers.sig(p["rate"], trim=True), numbers.sig(p["throughput"])]
        + [numbers.sig(p[m]) for m in METRICS]
        + [", ".join(label for m, (_, label) in METRICS.items() if p["rate"] in sweep["pareto"][m]) or "-"]
        for p in pts
    ]
    return (
        "<h2>Sweep</h2><p>Each rate's stage is a point per latency; a point is on the front when no other "
        "rate served as much at less latency. Dominated points are drawn unjoined.</p>"
        f"<div class='row'>{svg}</div>" + table(head, rows)
    )


def summary_line(sweep: dict[str, Any]) -> str:
    """sweep: Pareto front (req/s offered) p50 [10, 40] · p99 [10, 40] · ..."""
    fronts = " · ".join(
        f"{label} [{', '.join(numbers.sig(r, trim=True) for r in sweep['pareto'][m])}]"
        for m, (_, label) in METRICS.items()
    )
    return f"sweep: Pareto front by rate (req/s offered): {fronts}"
