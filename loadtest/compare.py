"""`nomyo-loadtest compare BASELINE.json CURRENT.json`: gate CI on regressions.

  nomyo-loadtest compare base.json cur.json --max-regression throughput=10%,p50=15%,p99=30%,ttft=15%
  nomyo-loadtest compare base.json cur.json --max-regression 10% --advisory p99,ttft_p99

Stages are matched by target, mode and load; runs whose ramps, models, APIs, endpoints or
streaming differ are not comparable (exit 2). A gated metric regresses when it moves the
wrong way (throughput and goodput down; latency and TTFT up) by more than its threshold
AND by more than the noise: with `nomyo-loadtest --repeat N` on both sides, the 95% bootstrap
interval of the change of the median must lie wholly on the bad side of zero and the
change must exceed the repetitions' own spread ((max - min) / median of each run, the two
added; see loadtest/noise.py); without repetitions only the threshold applies. The error
rate regresses when it rises by more than `--max-error-increase` (absolute).

A stage flagged MACHINE-BUSY or CLIENT-BOUND in either run measured the machine or the load
generator as much as the server: it is "not comparable on this machine" (exit 3) unless
`--strict`, which gates it like any other stage. Exit 0: no regression; 1: a regression (of
a metric that is not advisory, in a stage both runs measured cleanly or with --strict); 2:
not comparable (other stages, model, API...); 3: no regression among the clean stages, but
a stage was flagged in either run.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from . import noise, numbers
from .report import SCHEMA

# name on the command line -> (stage key, +1 when higher is better / -1 when lower is)
METRICS: dict[str, tuple[str, int]] = {
    "throughput": ("request_throughput", +1),
    "goodput": ("goodput", +1),
    "p50": ("median_e2el_ms", -1),
    "p99": ("p99_e2el_ms", -1),
    "ttft": ("median_ttft_ms", -1),
    "ttft_p99": ("p99_ttft_ms", -1),
}
DEFAULT_THRESHOLDS = {"throughput": 0.10, "goodput": 0.10, "p50": 0.15, "p99": 0.30, "ttft": 0.15, "ttft_p99": 0.30}
WORKLOAD_KEYS = ("api", "endpoint", "stream", "model", "dataset", "trace")
EXIT_OK, EXIT_REGRESSED, EXIT_INCOMPARABLE, EXIT_BUSY = 0, 1, 2, 3


def parse_percent(text: str) -> float:
    t = text.strip()
    if not t.endswith("%"):
        raise argparse.ArgumentTypeError(
            f"{t!r}: write thresholds as percentages with a % sign (e.g. {t}% ), so 15 is never read as 1500%"
        )
    try:
        value = float(t[:-1]) / 100
    except ValueError:
        raise argparse.ArgumentTypeError(f"{t!r} is not a percentage") from None
    if value < 0:
        raise argparse.ArgumentTypeError("a threshold must be >= 0%")
    return value


def parse_thresholds(text: str) -> dict[str, float]:
    """`10%` (every metric) and/or `throughput=10%,p99=30%`; later items override earlier ones."""
    out = dict(DEFAULT_THRESHOLDS)
    for item in (i.strip() for i in text.split(",") if i.strip()):
        name, sep, value = item.partition("=")
        if not sep:
            out = {k: parse_percent(item) for k in out}
            continue
        name = name.strip()
        if name not in METRICS:
            raise argparse.ArgumentTypeError(f"unknown metric {name!r}; known: {', '.join(METRICS)}")
        out[name] = parse_percent(value)
    return out


def parse_names(text: str) -> set[str]:
    names = {n.strip() for n in text.split(",") if n.strip()}
    unknown = names - set(METRICS)
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown metric(s) {', '.join(sorted(unknown))}; known: {', '.join(METRICS)}")
    return names


def _load(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: not a JSON file ({e}); expected a `nomyo-loadtest --json` report") from None
    if not isinstance(doc, dict):
        raise ValueError(f"{path}: expected a `nomyo-loadtest --json` report (a JSON object), got {type(doc).__name__}")
    if doc.get("schema") != SCHEMA:
        raise ValueError(f"{path}: schema {doc.get('schema')!r}, expected {SCHEMA!r}")
    return doc


def _key(s: dict[str, Any]) -> tuple[str, str, float]:
    return s.get("target", "router"), s["mode"], float(s["load"])


def _workload(doc: dict[str, Any]) -> dict[str, Any]:
    cfg = doc.get("config", {})
    w = cfg.get("workload") or {k: cfg.get(k) for k in WORKLOAD_KEYS}
    return {k: w.get(k) for k in WORKLOAD_KEYS}


def incomparable(base: dict[str, Any], cur: dict[str, Any]) -> str | None:
    """Why the two runs cannot be compared, or None."""
    bw, cw = _workload(base), _workload(cur)
    for k in WORKLOAD_KEYS:
        if bw[k] is not None and cw[k] is not None and bw[k] != cw[k]:
            return f"different {k}: baseline {bw[k]!r}, current {cw[k]!r}"
    bs = [_key(s) for s in base["stages"] + base.get("direct", [])]
    cs = [_key(s) for s in cur["stages"] + cur.get("direct", [])]
    if sorted(bs) != sorted(cs):

        def ramp(keys: list[tuple[str, str, float]]) -> str:
            return " ".join(f"{t}:{m}:{load:g}" for t, m, load in sorted(keys)) or "no stages"

        return f"different stages: baseline [{ramp(bs)}], current [{ramp(cs)}]"
    return None


def flagged(stage: dict[str, Any]) -> str | None:
    """CLIENT-BOUND or MACHINE-BUSY when the stage's self-check flagged it, else None."""
    c = stage.get("client") or {}
    if c.get("bottleneck"):
        return "CLIENT-BOUND"
    if c.get("machine_bound"):
        return "MACHINE-BUSY"
    return None


def busy_stages(base: dict[str, Any], cur: dict[str, Any]) -> list[str]:
    """'router 32: MACHINE-BUSY in baseline' for each stage flagged in either run."""
    by_key = {_key(s): s for s in base["stages"] + base.get("direct", [])}
    out = []
    for s in cur["stages"] + cur.get("direct", []):
        runs = [(name, flagged(st)) for name, st in (("baseline", by_key.get(_key(s), {})), ("current", s))]
        why = ", ".join(f"{flag} in {name}" for name, flag in runs if flag)
        if why:
            out.append(f"{s.get('target', 'router')} {s['load']:g}: {why}")
    return out


def compare(
    base: dict[str, Any],
    cur: dict[str, Any],
    thresholds: dict[str, float],
    max_error_increase: float,
    advisory: set[str] = frozenset(),
    strict: bool = True,
) -> tuple[list[dict[str, Any]], bool]:
    """One row per stage and metric; True when a non-advisory metric regressed. Without
    `strict`, a stage flagged in either run never regresses: its would-be regressions read
    `busy` (the caller reports the stage as not comparable on this machine)."""
    rows: list[dict[str, Any]] = []
    by_key = {_key(s): s for s in base["stages"] + base.get("direct", [])}
    regressed = False
    for s in cur["stages"] + cur.get("direct", []):
        b = by_key[_key(s)]
        where = f"{s.get('target', 'router')} {s['load']:g}"
        gated = strict or not (flagged(b) or flagged(s))
        for name, (key, sign) in METRICS.items():
            bv, cv = noise.values(b, key), noise.values(s, key)
            got = noise.change_interval(bv, cv)
            if got is None or not cv:
                continue
            change, lo, hi = got
            bad_change = -change * sign  # > 0: the bad direction
            beyond_threshold = bad_change > thresholds[name]
            beyond_noise = (lo > 0 if sign < 0 else hi < 0) if lo != hi else True
            beyond_noise = beyond_noise and bad_change > noise.rel_spread(bv) + noise.rel_spread(cv)
            if beyond_threshold and beyond_noise and not gated:
                verdict = "busy"
            elif beyond_threshold and beyond_noise:
                verdict = "advisory" if name in advisory else "REGRESSED"
            elif beyond_threshold:
                verdict = "noise"
            else:
                verdict = "ok"
            rows.append(
                {
                    "stage": where,
                    "metric": name,
                    "baseline": _median(b, key),
                    "current": _median(s, key),
                    "change": change,
                    "interval": (lo, hi),
                    "threshold": thresholds[name],
                    "reps": (len(noise.values(b, key)), len(noise.values(s, key))),
                    "verdict": verdict,
                }
            )
            regressed |= verdict == "REGRESSED"
        rise = s["error_rate"] - b["error_rate"]
        verdict = ("REGRESSED" if gated else "busy") if rise > max_error_increase else "ok"
        rows.append(
            {
                "stage": where,
                "metric": "error_rate",
                "baseline": b["error_rate"],
                "current": s["error_rate"],
                "change": rise,
                "interval": None,
                "threshold": max_error_increase,
                "reps": None,
                "verdict": verdict,
            }
        )
        regressed |= verdict == "REGRESSED"
    return rows, regressed


def _median(stage: dict[str, Any], key: str) -> float:
    import numpy as np

    return float(np.median(noise.values(stage, key)))


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="nomyo-loadtest compare",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__,
    )
    p.add_argument("baseline")
    p.add_argument("current")
    p.add_argument(
        "--max-regression",
        type=parse_thresholds,
        default=dict(DEFAULT_THRESHOLDS),
        metavar="[METRIC=]PCT%,...",
        help="allowed change in the bad direction per metric (" + ", ".join(METRICS) + "); "
        "a bare PCT%% sets every metric; default: "
        + ",".join(f"{k}={v:.0%}" for k, v in DEFAULT_THRESHOLDS.items()).replace("%", "%%"),
    )
    p.add_argument(
        "--advisory",
        type=parse_names,
        default=set(),
        metavar="METRIC,...",
        help="metrics reported but never failing, e.g. p99,ttft_p99 (default: none)",
    )
    p.add_argument(
        "--max-error-increase",
        type=float,
        default=0.01,
        help="allowed absolute rise of the error rate (default 0.01 = 1 point)",
    )
    p.add_argument(
        "--strict",
        action="store_true",
        help="also gate stages flagged MACHINE-BUSY or CLIENT-BOUND in either run (default: such "
        "a stage is not comparable on this machine, exit 3)",
    )
    args = p.parse_args(argv)
    console = Console(width=160)
    try:
        base, cur = _load(args.baseline), _load(args.current)
    except (OSError, ValueError) as e:
        console.print(f"[red]compare:[/] {escape(str(e))}", highlight=False, soft_wrap=True)
        return EXIT_INCOMPARABLE
    why = incomparable(base, cur)
    if why is None and not cur["stages"]:
        why = "the current run has no stages"
    if why:
        console.print(f"[red]NOT COMPARABLE:[/] {escape(why)}", highlight=False, soft_wrap=True)
        return EXIT_INCOMPARABLE
    busy = [] if args.strict else busy_stages(base, cur)
    rows, regressed = compare(base, cur, args.max_regression, args.max_error_increase, args.advisory, args.strict)
    t = Table(
        title="compare: regressed = beyond the threshold and beyond the noise (95% bootstrap interval "
        "of the change of the median of repetitions)"
    )
    for col in ("stage", "metric", "baseline", "current", "change", "95% interval", "threshold", "reps", "verdict"):
        t.add_column(col, justify="right")
    for r in rows:
        if r["metric"] == "error_rate":
            change, interval, thr = f"{r['change']:+.4f}", "-", f"+{r['threshold']:.4f}"
        else:
            lo, hi = r["interval"]
            change, interval, thr = f"{r['change']:+.1%}", escape(f"[{lo:+.1%}, {hi:+.1%}]"), f"{r['threshold']:.0%}"
        reps = f"{r['reps'][0]}/{r['reps'][1]}" if r["reps"] else "-"
        verdict = {
            "REGRESSED": "[red]REGRESSED[/]",
            "advisory": "[yellow]advisory[/]",
            "noise": "[yellow]within noise[/]",
            "busy": "[yellow]busy: not gated[/]",
        }.get(r["verdict"], "ok")
        t.add_row(
            escape(r["stage"]),
            r["metric"],
            numbers.sig(r["baseline"]),
            numbers.sig(r["current"]),
            change,
            interval,
            thr,
            reps,
            verdict,
        )
    console.print(t)
    if regressed:
        bad = sorted({f"{r['metric']} at {r['stage']}" for r in rows if r["verdict"] == "REGRESSED"})
        console.print("[red]REGRESSION:[/] " + escape("; ".join(bad)), highlight=False, soft_wrap=True)
        return EXIT_REGRESSED
    if busy:
        console.print(
            "[yellow]NOT COMPARABLE ON THIS MACHINE:[/] " + escape("; ".join(busy)) + " (the numbers measure the "
            "machine or the load generator as much as the server; rerun on a quiet machine, or gate "
            "them anyway with --strict)",
            highlight=False,
            soft_wrap=True,
        )
        return EXIT_BUSY
    console.print("[green]no regression[/]")
    return EXIT_OK
