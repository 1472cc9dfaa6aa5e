"""`--html`: one self-contained file (inline SVG and CSS, no script, no CDN).

Sections: the verdict (knee, SLO/goodput, the highest rate at the SLO, CLIENT-BOUND and
MACHINE-BUSY flags with their reasons), throughput and latency against load, each stage
over time (throughput, p50/p99, errors; the measured windows shaded, warm-up visible),
latency and TTFT distributions (CDF) per stage, the stage table, the per-endpoint split,
affinity and cache outcomes, the --direct overhead, and the configuration reduced to
what differs from the defaults.
"""

from __future__ import annotations

import html
import json
from typing import Any, Sequence

from .report import COLUMNS, _fmt

COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
          "#bcbd22", "#17becf"]
Series = tuple[str, str, Sequence[float], Sequence[float | None]]  # name, colour, xs, ys


def esc(v: Any) -> str:
    return html.escape(str(v))


def chart(title: str, series: list[Series], xlabel: str, ylabel: str = "", marks: Sequence[float] = (),
          bands: Sequence[Sequence[float]] = (), w: int = 560, h: int = 280,
          xticks: Sequence[float] | None = None) -> str:
    """A line chart; every data point is a <circle class="pt">, so a reader (or a test) can
    count them. `marks`: dashed vertical lines (the knee); `bands`: shaded x ranges."""
    pad_l, pad_r, pad_t, pad_b = 56, 16, 28, 40
    xs = [x for _, _, sx, sy in series for x, y in zip(sx, sy) if y is not None]
    ys = [y for _, _, _, sy in series for y in sy if y is not None]
    xmin, xmax = (min(xs), max(xs)) if xs else (0.0, 1.0)
    for a, b in bands:
        xmin, xmax = min(xmin, a), max(xmax, b)
    span = (xmax - xmin) or 1.0
    ymax = (max(ys) * 1.1 if ys and max(ys) > 0 else 1.0)

    def px(x: float) -> float:
        return pad_l + (x - xmin) / span * (w - pad_l - pad_r)

    def py(y: float) -> float:
        return h - pad_b - y / ymax * (h - pad_t - pad_b)

    out = [f'<svg class="chart" data-title="{esc(title)}" xmlns="http://www.w3.org/2000/svg" width="{w}" '
           f'height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="11">',
           f'<text x="{w / 2}" y="16" text-anchor="middle" font-size="13" font-weight="bold">{esc(title)}</text>']
    for a, b in bands:
        out.append(f'<rect class="band" x="{px(a):.1f}" y="{pad_t}" width="{max(px(b) - px(a), 1):.1f}" '
                   f'height="{h - pad_t - pad_b}" fill="#e8f0fe"/>')
    out += [f'<line x1="{pad_l}" y1="{h - pad_b}" x2="{w - pad_r}" y2="{h - pad_b}" stroke="#333"/>',
            f'<line x1="{pad_l}" y1="{pad_t}" x2="{pad_l}" y2="{h - pad_b}" stroke="#333"/>',
            f'<text x="{(pad_l + w - pad_r) / 2}" y="{h - 6}" text-anchor="middle">{esc(xlabel)}</text>',
            f'<text x="12" y="{(pad_t + h - pad_b) / 2}" text-anchor="middle" '
            f'transform="rotate(-90 12 {(pad_t + h - pad_b) / 2})">{esc(ylabel)}</text>']
    for frac in (0, 0.25, 0.5, 0.75, 1.0):
        y = ymax / 1.1 * frac
        out.append(f'<text x="{pad_l - 4}" y="{py(y) + 4:.1f}" text-anchor="end">{_num(y)}</text>')
        out.append(f'<line x1="{pad_l}" y1="{py(y):.1f}" x2="{w - pad_r}" y2="{py(y):.1f}" stroke="#eee"/>')
    for x in xticks if xticks is not None else [xmin + span * f for f in (0, 0.25, 0.5, 0.75, 1.0)]:
        out.append(f'<text x="{px(x):.1f}" y="{h - pad_b + 14}" text-anchor="middle">{_num(x)}</text>')
    for m in marks:
        out.append(f'<line class="mark" x1="{px(m):.1f}" y1="{pad_t}" x2="{px(m):.1f}" y2="{h - pad_b}" '
                   f'stroke="#d33" stroke-dasharray="4 3"/><text x="{px(m) - 4:.1f}" y="{h - pad_b - 6}" '
                   f'text-anchor="end" fill="#d33">knee</text>')
    for i, (name, color, sx, sy) in enumerate(series):
        pts = [(px(x), py(y)) for x, y in zip(sx, sy) if y is not None]
        if pts:
            out.append(f'<polyline class="line" fill="none" stroke="{color}" stroke-width="1.8" points="'
                       + " ".join(f"{a:.1f},{b:.1f}" for a, b in pts) + '"/>')
            r = 2.5 if len(pts) < 80 else 1.2
            out += [f'<circle class="pt" cx="{a:.1f}" cy="{b:.1f}" r="{r}" fill="{color}"/>' for a, b in pts]
        out.append(f'<text x="{w - pad_r - 4}" y="{pad_t + 12 + 13 * i}" text-anchor="end" fill="{color}">'
                   f'{esc(name)}</text>')
    out.append("</svg>")
    return "".join(out)


def _num(v: float) -> str:
    return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.3g}"


def _table(head: list[str], rows: list[list[Any]]) -> str:
    return ("<table><tr>" + "".join(f"<th>{esc(c)}</th>" for c in head) + "</tr>"
            + "".join("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in r) + "</tr>" for r in rows) + "</table>")


def _notes(s: dict[str, Any], i: int, knee: dict[str, Any]) -> str:
    n = []
    if knee.get("knee_stage") == i:
        n.append("knee")
    if knee.get("max_throughput_load") == s["load"]:
        n.append("max thr")
    if s["client"].get("bottleneck"):
        n.append("CLIENT-BOUND")
    elif s["client"].get("machine_bound"):
        n.append("MACHINE-BUSY")
    if s.get("slo_met_share") is not None:
        n.append(f"SLO met by {s['slo_met_share']:.0%}")
    return ", ".join(n)


def verdict(doc: dict[str, Any], unit: str) -> str:
    knee, stages = doc["knee"], doc["stages"]
    parts = [f"<p class='verdict'>knee: <b>{esc(knee.get('knee_load'))}</b> {unit} &middot; max throughput "
             f"<b>{esc(knee.get('max_request_throughput'))}</b> req/s at {esc(knee.get('max_throughput_load'))} "
             f"&middot; saturates at {esc(knee.get('saturation_load'))}</p>",
             f"<p><small>knee = {esc(knee.get('definition', ''))}</small></p>"]
    slo = doc["config"].get("slo")
    if slo:
        desc = ", ".join(f"{k} &le; {v * 1000:g} ms" for k, v in slo.items())
        parts.append(f"<p class='slo'>SLO: {desc}; a stage meets it when &ge; "
                     f"{doc['config'].get('slo_share', 0.95):.0%} of its requests do. Goodput per stage: "
                     + ", ".join(f"{s['load']:g}: {s.get('goodput')} req/s" for s in stages) + "</p>")
    mr = doc.get("max_rate")
    if mr:
        parts.append(f"<p class='slo'>highest rate at the SLO: <b>{esc(mr['max_rate'])}</b> req/s "
                     f"(limit within {esc(mr['bracket'])}, {mr['stages']} probes)</p>")
    for s in stages + doc.get("direct", []):
        c = s["client"]
        if c.get("verdict"):
            flag = "CLIENT-BOUND" if c["verdict"] == "client" else "MACHINE-BUSY"
            parts.append(f"<p class='flag'><b>{flag}</b> at {esc(s.get('target', 'router'))} load "
                         f"{s['load']:g}: {esc(c['reason'])}</p>")
    return "".join(parts)


def changed_config(doc: dict[str, Any]) -> dict[str, Any]:
    cfg = doc["config"]
    if "changed" in cfg:
        return cfg["changed"]
    return {k: v for k, v in cfg.items() if k not in ("router_config", "stages", "mock_kv_cache")}


def render(doc: dict[str, Any]) -> str:
    stages, knee = doc["stages"], doc["knee"]
    mode = stages[0]["mode"] if stages else "closed"
    xlabel = "concurrency" if mode == "closed" else "offered rate (req/s)"
    unit = "concurrent" if mode == "closed" else "req/s offered"
    xs = [s["load"] for s in stages]
    kx = [knee["knee_load"]] if knee.get("knee_load") is not None else []
    thr: list[Series] = [("router req/s", COLORS[0], xs, [s["request_throughput"] for s in stages])]
    if any("goodput" in s for s in stages):
        thr.append(("goodput", COLORS[2], xs, [s.get("goodput") for s in stages]))
    if doc.get("direct"):
        thr.append(("direct req/s", COLORS[7], xs, [d["request_throughput"] for d in doc["direct"]]))
    lat = [("p50", COLORS[2], xs, [s["median_e2el_ms"] for s in stages]),
           ("p99", COLORS[1], xs, [s["p99_e2el_ms"] for s in stages]),
           ("TTFT p50", COLORS[4], xs, [s["median_ttft_ms"] for s in stages])]
    body = [verdict(doc, unit), "<h2>Against load</h2><div class='row'>",
            chart("Throughput (req/s)", thr, xlabel, "req/s", kx, xticks=xs),
            chart("Latency (ms)", lat, xlabel, "ms", kx, xticks=xs), "</div>"]
    body.append("<h2>Each stage over time</h2><p>Shaded: the measured window(s); before it, the warm-up. "
                "Per time bucket: p50/p99 latency of the requests that ended in it, errors; req/s counts the "
                "completions within a window of at least the median latency around the bucket.</p>"
                "<div class='row'>")
    for s in stages + doc.get("direct", []):
        tl = s.get("timeline") or {}
        if not tl.get("t"):
            continue
        name = f"{s.get('target', 'router')} {'conc' if mode == 'closed' else 'rate'} {s['load']:g}"
        ymax_thr = max([v for v in tl["throughput"] if v] or [1])
        errs = [e * ymax_thr / max(max(tl["errors"]), 1) if any(tl["errors"]) else None for e in tl["errors"]]
        body.append(chart(f"{name}: throughput and errors", [
            ("req/s", COLORS[0], tl["t"], tl["throughput"]),
            (f"errors (max {max(tl['errors'])}/bucket)", COLORS[3], tl["t"], errs)],
            "seconds from the stage's start", "req/s", bands=tl["windows"], w=420, h=220))
        body.append(chart(f"{name}: latency", [("p50 ms", COLORS[2], tl["t"], tl["p50_ms"]),
                                               ("p99 ms", COLORS[1], tl["t"], tl["p99_ms"])],
                          "seconds from the stage's start", "ms", bands=tl["windows"], w=420, h=220))
    body.append("</div><h2>Distributions</h2><div class='row'>")
    for key, title in (("e2el_ms", "Latency CDF (ms)"), ("ttft_ms", "TTFT CDF (ms)")):
        series = [(f"{s['load']:g}", COLORS[i % len(COLORS)], s["cdf"][key],
                   [q / (len(s["cdf"][key]) - 1) for q in range(len(s["cdf"][key]))])
                  for i, s in enumerate(stages) if s.get("cdf", {}).get(key)]
        if series:
            body.append(chart(title, series, "ms", "share of requests"))
    body.append("</div><h2>Stages</h2>")
    good = any("goodput" in s for s in stages)
    head = [h for h, _, _ in COLUMNS] + (["good/s"] if good else []) + ["note"]
    rows = [[_fmt(f, s.get(k)) for _, k, f in COLUMNS] + ([_fmt("rate", s.get("goodput"))] if good else [])
            + [_notes(s, i, knee)] for i, s in enumerate(stages)]
    body.append(_table(head, rows))
    split = [[f"{s['load']:g}", k, v, f"{v * 100 / max(sum(s['endpoints'].values()), 1):.0f}%"]
             for s in stages for k, v in sorted(s.get("endpoints", {}).items())]
    if split:
        body.append("<h2>Per endpoint</h2>" + _table(["load", "endpoint", "requests", "share"], split))
    aff = [[f"{s['load']:g}", json.dumps(s.get("affinity", {})), json.dumps(s.get("affinity_turn2plus", {}))]
           for s in stages if set(s.get("affinity", {})) - {"miss"}]  # single-turn load: all misses
    kv = doc["config"].get("mock_kv_cache", {}) or {}
    if aff or kv.get("hit_rate") is not None:
        body.append("<h2>Affinity and cache</h2>")
        if aff:
            body.append(_table(["load", "affinity outcomes", "turn 2+"], aff))
        if kv.get("hit_rate") is not None:
            body.append(f"<p>mock KV prefix cache: {kv['hit_rate']:.1%} of prompt tokens were cached</p>")
    if doc.get("overhead"):
        body.append("<h2>Router overhead (--direct)</h2>" + _table(
            ["load", "added p50 ms", "added p99 ms", "throughput ratio"],
            [[o["load"], o["added_p50_ms"], o["added_p99_ms"], o["throughput_ratio"]] for o in doc["overhead"]]))
    body.append("<h2>Configuration (what differs from the defaults)</h2><pre>"
                + esc(json.dumps(changed_config(doc), indent=1, default=str)) + "</pre>")
    env = doc["environment"]
    body.append(f"<p><small>{esc(env.get('time'))} &middot; {esc(env.get('platform'))} &middot; "
                f"{esc(env.get('cpu_count'))} CPUs &middot; {esc(json.dumps(env.get('versions')))}</small></p>")
    return ("<!doctype html><html><head><meta charset='utf-8'><title>nomyo loadtest</title><style>"
            "body{font-family:sans-serif;margin:1.5em;color:#222}table{border-collapse:collapse;margin:.5em 0}"
            "td,th{border:1px solid #ccc;padding:2px 7px;text-align:right}.row{display:flex;flex-wrap:wrap;gap:8px}"
            ".flag{color:#a60}.verdict{font-size:1.1em}pre{background:#f6f6f6;padding:.5em}</style></head>"
            "<body><h1>nomyo loadtest</h1>" + "".join(body) + "</body></html>")


def write_html(path: str, doc: dict[str, Any]) -> None:
    with open(path, "w") as f:
        f.write(render(doc))
