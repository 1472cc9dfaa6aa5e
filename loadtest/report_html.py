"""`--html`: one self-contained file (inline SVG and CSS, no script, no CDN).

Sections: the verdict (knee, SLO/goodput, the highest rate at the SLO, CLIENT-BOUND and
MACHINE-BUSY flags with their reasons), throughput and latency against load, each stage
over time in one chart each (throughput and errors over latencies; the measured windows
shaded, warm-up visible; with --timeslice, per slice), latency and TTFT distributions
(CDF, log scale) per stage, the stage table, the per-endpoint split,
affinity and cache outcomes, the --direct overhead, and the configuration reduced to
what differs from the defaults.
"""

from __future__ import annotations

import json
from typing import Any

from . import fault_report, numbers, session_report
from . import sweep as sweep_mod
from .report import COLUMNS, _fmt
from .svg import Panel, Series, auto_log, chart, esc

COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"]


def _table(head: list[str], rows: list[list[Any]]) -> str:
    return (
        "<table><tr>"
        + "".join(f"<th>{esc(c)}</th>" for c in head)
        + "</tr>"
        + "".join("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in r) + "</tr>" for r in rows)
        + "</table>"
    )


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
    mode = stages[0]["mode"] if stages else "closed"

    def ld(v: Any) -> str:
        return esc(numbers.load(v, mode))

    parts = [
        f"<p class='verdict'>knee: <b>{ld(knee.get('knee_load'))}</b> {unit} &middot; max throughput "
        f"<b>{esc(numbers.sig(knee.get('max_request_throughput')))}</b> req/s at "
        f"{ld(knee.get('max_throughput_load'))} &middot; saturates at {ld(knee.get('saturation_load'))}</p>",
        f"<p><small>knee = {esc(knee.get('definition', ''))}</small></p>",
    ]
    slo = doc["config"].get("slo")
    if slo:
        desc = ", ".join(f"{k} &le; {v * 1000:g} ms" for k, v in slo.items())
        parts.append(
            f"<p class='slo'>SLO: {desc}; a stage meets it when &ge; "
            f"{doc['config'].get('slo_share', 0.95):.0%} of its requests do. Goodput per stage: "
            + ", ".join(f"{ld(s['load'])}: {numbers.sig(s.get('goodput'))} req/s" for s in stages)
            + "</p>"
        )
    mr = doc.get("max_rate")
    if mr:
        parts.append(
            f"<p class='slo'>highest rate at the SLO: <b>{esc(numbers.sig(mr['max_rate']))}</b> req/s "
            f"(limit within [{', '.join(numbers.sig(b) for b in mr['bracket'])}], {mr['stages']} probes)</p>"
        )
    flagged: dict[tuple[str, str], list[dict[str, Any]]] = {}  # one line per flag and target
    for s in stages + doc.get("direct", []):
        if s["client"].get("verdict"):
            flagged.setdefault((s["client"]["verdict"], s.get("target", "router")), []).append(s)
    for (kind, target), ss in flagged.items():
        flag = "CLIENT-BOUND" if kind == "client" else "MACHINE-BUSY"
        loads = ", ".join(f"{s['load']:g}" for s in ss)
        more = f" (at load {ss[0]['load']:g}; the others alike: see the JSON)" if len(ss) > 1 else ""
        parts.append(
            f"<p class='flag'><b>{flag}</b> at {esc(target)} load{'s' if len(ss) > 1 else ''} "
            f"{loads}: {esc(ss[0]['client']['reason'])}{more}</p>"
        )
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
    lat = [
        ("p50", COLORS[2], xs, [s["median_e2el_ms"] for s in stages]),
        ("p99", COLORS[1], xs, [s["p99_e2el_ms"] for s in stages]),
        ("TTFT p50", COLORS[4], xs, [s["median_ttft_ms"] for s in stages]),
    ]
    xlog = auto_log(xs, 8.0)
    axis = xlabel + (" (log scale)" if xlog else "")
    lat_log = auto_log([v for _, _, _, ys in lat for v in ys])
    body = [
        verdict(doc, unit),
        "<h2>Against load</h2><div class='row'>",
        chart("Throughput (req/s)", Panel(thr, "req/s"), axis, xlog=xlog, marks=kx, xticks=xs),
        chart(
            "Latency (ms)",
            Panel(lat, "ms (log)" if lat_log else "ms", log=lat_log),
            axis,
            xlog=xlog,
            marks=kx,
            xticks=xs,
        ),
        "</div>",
    ]
    if doc.get("sweep"):
        body.append(sweep_mod.section(doc["sweep"], _table))
    body.append(
        "<h2>Each stage over time</h2><p>Shaded: the measured window(s); before it, the warm-up. "
        + (
            "Per slice of --timeslice: the requests sent in it (their completions per second, errors "
            "per second, TTFT and latency p50/p99)."
            if any(s.get("timeslices") for s in stages)
            else "Per time bucket: p50/p99 latency of the requests that ended in it, errors per second; "
            "req/s counts the completions within a window of at least the median latency around "
            "the bucket."
        )
        + "</p><div class='row'>"
    )
    for s in stages + doc.get("direct", []):
        tl = timeline_chart(s, f"{s.get('target', 'router')} {'conc' if mode == 'closed' else 'rate'} {s['load']:g}")
        if tl:
            body.append(tl)
    sessions = session_report.section(
        stages, _table, lambda s: f"{s.get('target', 'router')} {'conc' if mode == 'closed' else 'rate'} {s['load']:g}"
    )
    if sessions:
        body.append("</div>" + sessions + "<div>")
    if doc.get("faults"):
        head, rows = fault_report.rows(doc["faults"])
        body.append(
            "</div><h2>Faults</h2><p>Marked on the timelines above. Errors: requests failed from the fault "
            "to the next one; back after: when the error rate (within 1 point) and p99 (within 1.5x) "
            "of the requests sent returned to their level in the 5 s before the fault; router "
            "retries and resumed streams from its /metrics.</p>" + _table(head, rows) + "<div>"
        )
    body.append("</div><h2>Distributions</h2><div class='row'>")
    for key, title in (("e2el_ms", "Latency CDF (ms)"), ("ttft_ms", "TTFT CDF (ms)")):
        series = [
            (
                f"{'conc' if mode == 'closed' else 'rate'} {s['load']:g}",
                COLORS[i % len(COLORS)],
                s["cdf"][key],
                [q / (len(s["cdf"][key]) - 1) for q in range(len(s["cdf"][key]))],
            )
            for i, s in enumerate(stages)
            if s.get("cdf", {}).get(key)
        ]
        if series:
            body.append(
                chart(title, Panel(series, "share of requests", height=220), "ms (log scale)", xlog=True, xpad=0.02)
            )
    body.append("</div><h2>Stages</h2>")
    good = any("goodput" in s for s in stages)
    head = [h for h, _, _ in COLUMNS] + (["good/s"] if good else []) + ["note"]
    rows = [
        [_fmt(f, s.get(k), mode) for _, k, f in COLUMNS]
        + ([_fmt("sig", s.get("goodput"))] if good else [])
        + [_notes(s, i, knee)]
        for i, s in enumerate(stages)
    ]
    body.append(_table(head, rows))
    split = [
        [f"{s['load']:g}", k, v, f"{v * 100 / max(sum(s['endpoints'].values()), 1):.0f}%"]
        for s in stages
        for k, v in sorted(s.get("endpoints", {}).items())
    ]
    if split:
        body.append("<h2>Per endpoint</h2>" + _table(["load", "endpoint", "requests", "share"], split))
    aff = [
        [f"{s['load']:g}", json.dumps(s.get("affinity", {})), json.dumps(s.get("affinity_turn2plus", {}))]
        for s in stages
        if set(s.get("affinity", {})) - {"miss"}
    ]  # single-turn load: all misses
    kv = doc["config"].get("mock_kv_cache", {}) or {}
    if aff or kv.get("hit_rate") is not None:
        body.append("<h2>Affinity and cache</h2>")
        if aff:
            body.append(_table(["load", "affinity outcomes", "turn 2+"], aff))
        if kv.get("hit_rate") is not None:
            body.append(f"<p>mock KV prefix cache: {kv['hit_rate']:.1%} of prompt tokens were cached</p>")
    if doc.get("overhead"):
        body.append(
            "<h2>Router overhead (--direct)</h2>"
            + _table(
                ["load", "added p50 ms", "added p99 ms", "throughput ratio"],
                [
                    [
                        numbers.load(o["load"], mode),
                        *(numbers.sig(o[k]) for k in ("added_p50_ms", "added_p99_ms")),
                        numbers.sig(o["throughput_ratio"]),
                    ]
                    for o in doc["overhead"]
                ],
            )
        )
    body.append(
        "<h2>Configuration (what differs from the defaults)</h2><pre>"
        + esc(json.dumps(changed_config(doc), indent=1, default=str))
        + "</pre>"
    )
    env = doc["environment"]
    body.append(
        f"<p><small>{esc(env.get('time'))} &middot; {esc(env.get('platform'))} &middot; "
        f"{esc(env.get('cpu_count'))} CPUs &middot; {esc(json.dumps(env.get('versions')))}</small></p>"
    )
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>nomyo loadtest</title><style>"
        "body{font-family:sans-serif;margin:1.5em;color:#222}table{border-collapse:collapse;margin:.5em 0}"
        "td,th{border:1px solid #ccc;padding:2px 7px;text-align:right}.row{display:flex;flex-wrap:wrap;gap:8px}"
        ".flag{color:#a60}.verdict{font-size:1.1em}pre{background:#f6f6f6;padding:.5em}</style></head>"
        "<body><h1>nomyo loadtest</h1>" + "".join(body) + "</body></html>"
    )


def timeline_chart(s: dict[str, Any], name: str) -> str | None:
    """One chart per stage, two panels over the stage's time: throughput and errors, then
    latencies (log scale when they span decades). With --timeslice, its slices; else the
    timeline's buckets. The measured windows are shaded."""
    tl = s.get("timeline") or {}
    windows = tl.get("windows") or []
    slices = s.get("timeslices")
    if slices:

        def at(ts: dict[str, Any]) -> float:
            rep = ts.get("repetition", 1) - 1
            start = windows[rep][0] if rep < len(windows) else 0.0
            return start + ts["start_s"] + ts["duration_s"] / 2

        t = [at(ts) for ts in slices]
        top = [
            ("req/s", COLORS[0], t, [ts["throughput"] for ts in slices]),
            (
                "errors/s",
                COLORS[3],
                t,
                [ts["errors"] / ts["duration_s"] if ts["duration_s"] else None for ts in slices],
            ),
        ]
        low = [
            ("TTFT p50", COLORS[4], t, [ts["ttft_p50_ms"] for ts in slices]),
            ("TTFT p99", COLORS[6], t, [ts["ttft_p99_ms"] for ts in slices]),
            ("latency p50", COLORS[2], t, [ts["latency_p50_ms"] for ts in slices]),
            ("latency p99", COLORS[1], t, [ts["latency_p99_ms"] for ts in slices]),
        ]
        title = f"{name}: over time (per {s.get('timeslice_s', 0):g} s slice)"
    elif tl.get("t"):
        t, width = tl["t"], tl.get("bucket_s") or 1.0
        top = [("req/s", COLORS[0], t, tl["throughput"]), ("errors/s", COLORS[3], t, [e / width for e in tl["errors"]])]
        low = [("latency p50", COLORS[2], t, tl["p50_ms"]), ("latency p99", COLORS[1], t, tl["p99_ms"])]
        title = f"{name}: over time"
    else:
        return None
    log = auto_log([v for _, _, _, ys in low for v in ys])
    faults = s.get("faults") or []
    return chart(
        title,
        [Panel(top, "req/s", height=130), Panel(low, "ms (log)" if log else "ms", log=log, height=130)],
        "seconds from the stage's start",
        marks=[f["at_s"] for f in faults],
        mark_labels=[f["label"] for f in faults],
        bands=windows,
        w=460,
        xpad=0.0,
        xspan=[0.0, *(tl.get("t") or [])[-1:]],
    )


def write_html(path: str, doc: dict[str, Any]) -> None:
    with open(path, "w") as f:
        f.write(render(doc))
